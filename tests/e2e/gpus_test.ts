import assert from "node:assert/strict";
import { fakeNvmlLibrary, FIXTURES, writeFixture } from "../support/fake_nvml.ts";
import { root, vf } from "../support/vf_cli.ts";

/** `vf gpus ARGS` as a user runs it, with `env` added (NVML pointed at the fake). */
function gpus(env: Record<string, string>, ...args: string[]) {
  return vf(["gpus", ...args], { cwd: root.pathname, env });
}

async function fake(fixture: Record<string, unknown>) {
  return { VF_NVML_LIBRARY: await fakeNvmlLibrary(), FAKE_NVML_FIXTURE: await writeFixture(fixture) };
}

Deno.test("vf gpus prints the A100's MIG devices and its profiles and exits 0", async () => {
  const run = await gpus(await fake(FIXTURES.a100Mig));
  assert.equal(run.code, 0, run.stderr);
  assert.match(run.stdout, /^0 +NVIDIA A100-SXM4-40GB +GPU-a1b2c3d4-\S+ +40\.0 GiB +00000000:18:00\.0 +on$/m);
  assert.match(run.stdout, /^0:0 +MIG-\S+ +19\.5 GiB +slice +3g\.20gb +1$/m);
  assert.match(run.stdout, /^0:1 +MIG-\S+ +9\.8 GiB +slice +2g\.10gb +5$/m);
  assert.match(run.stdout, /^0:2 +MIG-\S+ +4\.8 GiB +slice +1g\.5gb +13$/m);
  assert.match(run.stdout, /GPU 0 profiles: 1g\.5gb×7 2g\.10gb×3 3g\.20gb×2/);
  assert.doesNotMatch(run.stdout, /unknown/);
});

Deno.test("vf gpus shows eight H100s' P2P matrices and a failed memory read as unknown with its reason", async () => {
  const board = await gpus(await fake(FIXTURES.eightH100));
  assert.equal(board.code, 0, board.stderr);
  const nvlink = board.stdout.split("P2P nvlink\n")[1].split("\n\n")[0].split("\n");
  assert.equal(nvlink.length, 9);
  assert.match(nvlink[1], /^GPU0 +X +OK +OK +OK +OK +OK +OK +OK$/);

  const lost = await gpus(await fake(FIXTURES.memoryFails));
  assert.equal(lost.code, 0, lost.stderr);
  assert.match(lost.stdout, /^0 +NVIDIA H100 80GB HBM3 +GPU-\S+ +unknown\[1\] +00000000:18:00\.0/m);
  assert.match(
    lost.stdout,
    /\[1\] unreachable: nvmlDeviceGetMemoryInfo returned NVML_ERROR_GPU_IS_LOST \(15\)/,
  );
});

Deno.test("vf gpus without NVML says the GPUs are unknown and why, exits 0, and --json keeps the Unknown", async () => {
  const env = { VF_NVML_LIBRARY: "/nonexistent/libnvidia-ml.so.1" };
  const run = await gpus(env);
  assert.equal(run.code, 0, run.stderr);
  assert.match(run.stdout, /^GPUs: unknown\[1\]$/m);
  assert.match(run.stdout, /\[1\] missing: NVML could not be loaded: .*\/nonexistent\/libnvidia-ml\.so\.1/);
  const json = await gpus(env, "--json");
  assert.equal(json.code, 0, json.stderr);
  const inventory = JSON.parse(json.stdout);
  assert.equal(inventory.devices.kind, "unknown");
  assert.equal(inventory.devices.reason, "missing");
  assert.equal("value" in inventory.devices, false, "no made-up device list");
});

Deno.test("vf gpus DEVICE narrows to one MIG device, and a device that is not there exits 3", async () => {
  const env = await fake(FIXTURES.a100Mig);
  const all = JSON.parse((await gpus(env, "--json")).stdout);
  const migUuid = all.devices.value[0].migDevices.value[1].uuid.value;
  const one = await gpus(env, migUuid);
  assert.equal(one.code, 0, one.stderr);
  assert.match(one.stdout, /2g\.10gb/);
  assert.doesNotMatch(one.stdout, /3g\.20gb|P2P/);
  const missing = await gpus(env, "GPU-00000000-0000-0000-0000-000000000000");
  assert.equal(missing.code, 3);
  assert.match(
    missing.stderr,
    /VF_RESOURCE_UNAVAILABLE: GPU "GPU-0{8}-0{4}-0{4}-0{4}-0{12}" is not on this host/,
  );
  assert.doesNotMatch(missing.stderr, /^\s+at /m);
});
