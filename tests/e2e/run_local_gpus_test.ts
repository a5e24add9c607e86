/**
 * `vf run-local` on flows with GPU nodes, against the fake NVML (VF_NVML_LIBRARY): each replica gets its
 * own card, named by UUID in its CUDA_VISIBLE_DEVICES and its VF_GPU_GRANT_JSON, and its worker checks
 * it before the node opens; a host without GPUs runs GPU nodes on their CPU fallback and says so, and
 * refuses a `gpuFallback: "none"` node before anything starts (exit 3).
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { FIXTURES, h100, useFakeNvml } from "../support/fake_nvml.ts";
import { inTempDir, pipeline, sinkLines, summaryRow, vf, writeFlow } from "../support/vf_cli.ts";

const TWO_CARDS = { driver: "550.54.15", devices: [h100(0), h100(1)] };
const twoCardUuids = TWO_CARDS.devices.map((card) => card.uuid as string);

Deno.test("two cards, two replicas under process isolation: each replica's process sees its own card's UUID, and its worker accepts the grant", async () => {
  const env = await useFakeNvml(TWO_CARDS);
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "MaskEcho"],
      pipeline(
        "gpu-two-cards",
        `new Count({ name: "count", n: 8 })`,
        `new MaskEcho({ name: "detect", deviceType: "gpu", nbTasks: 2, dir: ${JSON.stringify(dir)} })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--isolation", "process", "--state", join(dir, "state")], {
      cwd: dir,
      env,
    });
    assert.equal(run.code, 0, run.text);
    assert.equal((await sinkLines(join(dir, "out.jsonl"))).length, 8);
    const masks: string[] = [];
    for await (const entry of Deno.readDir(dir)) {
      if (entry.name.endsWith(".mask")) masks.push(await Deno.readTextFile(join(dir, entry.name)));
    }
    assert.deepEqual(masks.sort(), [...twoCardUuids].sort(), "each replica opened on a distinct card");
    assert.doesNotMatch(run.text, /CPU fallback|opens under gpuFallback/);
    for (const replica of [0, 1]) {
      assert.match(
        run.text,
        new RegExp(`detect\\[${replica}\\] gets GPU-[0-9a-f-]+ \\(NVIDIA H100 80GB HBM3\\)`),
      );
    }
    assert.equal(summaryRow(run, "detect").restarts, 0);
  });
});

Deno.test("under Worker isolation the grants are checked in each worker, and vf says a CUDA library would share one mask", async () => {
  const env = await useFakeNvml(TWO_CARDS);
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "GpuOnlyPass"],
      pipeline(
        "gpu-workers",
        `new Count({ name: "count", n: 4 })`,
        `new GpuOnlyPass({ name: "detect", deviceType: "gpu", nbTasks: 2 })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir, env });
    assert.equal(run.code, 0, run.text);
    assert.match(run.text, /only --isolation process gives each its own CUDA_VISIBLE_DEVICES/);
    assert.equal((await sinkLines(join(dir, "out.jsonl"))).length, 4);
  });
});

Deno.test("a third replica finds no card: it runs on its CPU fallback, and vf says so before it starts", async () => {
  const env = await useFakeNvml(TWO_CARDS);
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "SlowPass"],
      pipeline(
        "gpu-third-replica",
        `new Count({ name: "count", n: 6 })`,
        `new SlowPass({ name: "detect", deviceType: "gpu", nbTasks: 3, delayMs: 0 })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir, env });
    assert.equal(run.code, 0, run.text);
    assert.match(
      run.text,
      /node detect replica 2 runs on its CPU fallback: it needs 1 whole card\(s\) with MIG off, and 0 are free/,
    );
    assert.match(run.text, /node detect opens under gpuFallback "cpu": it was granted 0 of the 1 GPU/);
    assert.equal((await sinkLines(join(dir, "out.jsonl"))).length, 6);
  });
});

Deno.test("no GPU on this host: a cpu-fallback GPU node runs on CPU and vf says so; NVML that cannot load is said as such", async () => {
  const env = await useFakeNvml(FIXTURES.noGpu);
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "SlowPass"],
      pipeline(
        "gpu-cpu-story",
        `new Count({ name: "count", n: 5 })`,
        `new SlowPass({ name: "detect", deviceType: "gpu", delayMs: 0 })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir, env });
    assert.equal(run.code, 0, run.text);
    assert.match(
      run.text,
      /node detect runs its 1 replica\(s\) on its CPU fallback: this host has no GPU \(NVML counts none\)/,
    );
    assert.equal((await sinkLines(join(dir, "out.jsonl"))).length, 5);
    const blind = await vf(["run-local", flow, "--state", join(dir, "state2")], {
      cwd: dir,
      env: { VF_NVML_LIBRARY: join(dir, "no-such-libnvidia-ml.so.1") },
    });
    assert.equal(blind.code, 0, blind.text);
    assert.match(
      blind.text,
      /node detect runs its 1 replica\(s\) on its CPU fallback: this host's GPUs cannot be read/,
    );
    assert.match(
      blind.text,
      /node detect opens under gpuFallback "cpu": its grant of 1 GPU\(s\) cannot be verified/,
    );
  });
});

Deno.test('no GPU on this host: a gpuFallback "none" node is refused before anything starts, ResourceUnavailable naming it, exit 3', async () => {
  const env = await useFakeNvml(FIXTURES.noGpu);
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count", "GpuOnlyPass"],
      pipeline(
        "gpu-none-story",
        `new Count({ name: "count", n: 5 })`,
        `new GpuOnlyPass({ name: "detect", deviceType: "gpu" })`,
        dir,
      ),
    );
    const run = await vf(["run-local", flow, "--state", join(dir, "state")], { cwd: dir, env });
    assert.equal(run.code, 3, run.text);
    assert.match(
      run.text,
      /VF_RESOURCE_UNAVAILABLE: the flow's GPU nodes do not fit this host: node detect \(gpuFallback "none"\): this host has no GPU/,
    );
    assert.doesNotMatch(run.text, /running flow/, "nothing started");
    assert.deepEqual(await sinkLines(join(dir, "out.jsonl")), []);
  });
});
