import assert from "node:assert/strict";
import { deliveredGrantFromDict, deviceKey, GPU_GRANT_ENV } from "../../../src/backends/allocation.ts";
import { ResourceUnavailable } from "../../../src/core/errors.ts";
import { Flow } from "../../../src/core/flow.ts";
import { ConsumerNode, GpuFallback, ProcessorNode, ProducerNode } from "../../../src/core/node.ts";
import {
  type GpuDemand,
  gpuDemandsOf,
  LocalGrantPolicy,
  planLocalGpus,
  ReplicaExecution,
  replicaGpuEnv,
} from "../../../src/deploy/allocation_local.ts";
import { verifyGrant } from "../../../src/runtime/gpucheck.ts";
import { fakeHost } from "../../support/fake_host.ts";
import { eightH100, type FakeFixture, FIXTURES, h100 } from "../../support/fake_nvml.ts";

const demand = (node: string, fields: Partial<GpuDemand> = {}): GpuDemand => ({
  node,
  replicas: 1,
  gpuCount: 1,
  gpuMemoryGib: null,
  fallback: GpuFallback.cpu,
  requiresPeerAccess: false,
  ...fields,
});

function refusal(body: () => unknown): string {
  let message = "";
  assert.throws(body, (error) => {
    assert.ok(error instanceof ResourceUnavailable, String(error));
    assert.equal(error.exitCode, 3);
    message = error.message;
    return true;
  });
  return message;
}

const twoCards = { driver: "550.54.15", devices: [h100(0), h100(1)] };
const two = await fakeHost(twoCards);
const eight = await fakeHost(FIXTURES.eightH100);
const a100 = await fakeHost(FIXTURES.a100Mig);
const none = await fakeHost(FIXTURES.noGpu);
const unread = await fakeHost(FIXTURES.initFails);

Deno.test("two cards, two replicas: each gets a card of its own, named by UUID in its mask and its grant", () => {
  const plan = planLocalGpus([demand("detect", { replicas: 2 })], two);
  const [r0, r1] = plan.replicas.detect;
  assert.deepEqual(plan.notes, []);
  const masks = [r0, r1].map((r) => r.env.CUDA_VISIBLE_DEVICES);
  for (const mask of masks) assert.match(mask, /^GPU-[0-9a-f-]+$/);
  assert.notEqual(masks[0], masks[1]);
  for (const replica of [r0, r1]) {
    const grant = deliveredGrantFromDict(JSON.parse(replica.env[GPU_GRANT_ENV]));
    assert.equal(grant.host, "observed");
    assert.equal(grant.exclusive, true);
    assert.equal(grant.policy, LocalGrantPolicy.exclusive);
    assert.deepEqual(grant.devices.map((d) => d.uuid), [replica.env.CUDA_VISIBLE_DEVICES]);
    // What the worker then checks accepts it.
    const report = verifyGrant(
      { node: "detect", requested: 1, fallback: GpuFallback.none, requiresPeerAccess: false },
      { environ: replica.env, grant, host: two },
    );
    assert.deepEqual([report.execution, report.problems], ["gpu", []]);
  }
  assert.deepEqual(replicaGpuEnv(plan, "other", 0), {});
});

Deno.test("a replica that finds no card left runs on its CPU fallback, said in a note; a 'none' one refuses the flow naming every reason", () => {
  const plan = planLocalGpus([demand("detect", { replicas: 3 })], two);
  assert.deepEqual(plan.replicas.detect.map((r) => r.execution), ["gpu", "gpu", "cpu"]);
  assert.equal(plan.replicas.detect[2].env.CUDA_VISIBLE_DEVICES, "");
  assert.deepEqual(plan.notes, [
    "node detect replica 2 runs on its CPU fallback: it needs 1 whole card(s) with MIG off, and 0 are free",
  ]);
  const message = refusal(() =>
    planLocalGpus([
      demand("detect", { replicas: 2, fallback: GpuFallback.none }),
      demand("track", { replicas: 1, gpuCount: 2, fallback: GpuFallback.none }),
    ], two)
  );
  // The larger demand is served first: track takes both cards, and each detect replica is named.
  assert.match(
    message,
    /node detect replica 0 \(gpuFallback "none"\): it needs 1 whole card\(s\) with MIG off, and 0/,
  );
  assert.match(message, /node detect replica 1 /);
  assert.doesNotMatch(message, /node track/);
  const both = refusal(() =>
    planLocalGpus([
      demand("a", { replicas: 3, fallback: GpuFallback.none }),
      demand("b", { fallback: "none" }),
    ], two)
  );
  assert.match(both, /node a replica 2 .*; node b replica 0/);
});

Deno.test("hard demands are served first, so a cpu-fallback node never takes the card a 'none' node needs", () => {
  const plan = planLocalGpus([demand("soft", { replicas: 2 }), demand("hard", { fallback: "none" })], two);
  assert.equal(plan.replicas.hard[0].execution, ReplicaExecution.gpu);
  assert.deepEqual(plan.replicas.soft.map((r) => r.execution), ["gpu", "cpu"]);
  const keys = [plan.replicas.hard[0], ...plan.replicas.soft].flatMap((r) => r.grant.devices.map(deviceKey));
  assert.equal(new Set(keys).size, keys.length, "no device is granted twice");
});

Deno.test("gpuMemoryGib takes the smallest existing MIG device that holds it, never a slice twice", () => {
  const plan = planLocalGpus([
    demand("ocr", { gpuMemoryGib: 4 }),
    demand("detect", { gpuMemoryGib: 9 }),
    demand("big", { gpuMemoryGib: 19 }),
  ], a100);
  const profile = (node: string) => plan.replicas[node][0].grant.devices[0].migProfile;
  assert.deepEqual([profile("ocr"), profile("detect"), profile("big")], ["1g.5gb", "2g.10gb", "3g.20gb"]);
  for (const node of ["ocr", "detect", "big"]) {
    assert.match(plan.replicas[node][0].env.CUDA_VISIBLE_DEVICES, /^MIG-/);
    assert.equal(plan.replicas[node][0].grant.policy, LocalGrantPolicy.mig);
  }
  const message = refusal(() =>
    planLocalGpus([demand("huge", { gpuMemoryGib: 30, fallback: "none" })], a100)
  );
  assert.match(message, /it needs one device with 30 GiB, and the largest free one has 19\.5 GiB/);
  const whole = planLocalGpus([demand("count", { gpuCount: 1 })], a100);
  assert.match(
    whole.notes.join(),
    /needs 1 whole card\(s\) with MIG off, and 0 are free/,
    "a MIG card is not whole",
  );
});

Deno.test("gpuMemoryGib on cards without MIG takes a whole card with that much memory", () => {
  const plan = planLocalGpus([demand("detect", { gpuMemoryGib: 40 })], two);
  assert.equal(plan.replicas.detect[0].grant.devices[0].migUuid, null);
  assert.match(
    refusal(() => planLocalGpus([demand("detect", { gpuMemoryGib: 96, fallback: "none" })], two)),
    /with 96 GiB, and the largest free one has 79\.6 GiB/,
  );
});

Deno.test("requiresPeerAccess takes cards whose every pair NVML reports P2P OK, and refuses an unread matrix", async () => {
  const board = eightH100() as { p2p: { read: number[][] } } & FakeFixture;
  const read = board.p2p.read.map((row) => [...row]);
  for (const other of [1, 2, 3, 4, 5, 6, 7]) read[0][other] = read[other][0] = 5;
  const isolated = await fakeHost({ ...board, p2p: { ...board.p2p, read } });
  const plan = planLocalGpus(
    [demand("train", { gpuCount: 2, requiresPeerAccess: true, fallback: "none" })],
    isolated,
  );
  const ordinals = plan.replicas.train[0].grant.devices.map((d) => d.ordinal);
  assert.equal(ordinals.length, 2);
  assert.ok(!ordinals.includes(0), `GPU 0 reaches no peer: ${ordinals}`);
  const failing = await fakeHost({ ...eightH100(), returns: { nvmlDeviceGetP2PStatus: 999 } });
  const message = refusal(() =>
    planLocalGpus([demand("train", { gpuCount: 2, requiresPeerAccess: true, fallback: "none" })], failing)
  );
  assert.match(
    message,
    /needs 2 peer cards: no 2 free cards are all P2P peers \(the first set tried: P2P from GPU 0 to 1 is unknown/,
  );
  const eightPlan = planLocalGpus(
    [demand("train", { replicas: 2, gpuCount: 4, requiresPeerAccess: true })],
    eight,
  );
  const sets = eightPlan.replicas.train.map((r) => r.grant.devices.map((d) => d.ordinal));
  assert.deepEqual(sets.flat().sort(), [0, 1, 2, 3, 4, 5, 6, 7]);
});

Deno.test("no GPU here: cpu-fallback nodes run on CPU and say so; 'none' nodes are refused; Unknown is not zero cards", () => {
  const demands = [demand("detect", { replicas: 2 }), demand("strict", { fallback: "none" })];
  const zero = refusal(() => planLocalGpus(demands, none));
  assert.match(zero, /node strict \(gpuFallback "none"\): this host has no GPU \(NVML counts none\)/);
  const cpu = planLocalGpus([demands[0]], none);
  assert.deepEqual(cpu.notes, [
    "node detect runs its 2 replica(s) on its CPU fallback: this host has no GPU (NVML counts none)",
  ]);
  assert.equal(cpu.replicas.detect[1].grant.host, "observed");
  const blind = planLocalGpus([demands[0]], unread);
  assert.match(blind.notes[0], /this host's GPUs cannot be read \(NVML at .* did not start/);
  const grant = deliveredGrantFromDict(JSON.parse(blind.replicas.detect[0].env[GPU_GRANT_ENV]));
  assert.deepEqual([grant.host, grant.devices, grant.policy], [
    "unobserved",
    [],
    LocalGrantPolicy.cpuFallback,
  ]);
  assert.match(refusal(() => planLocalGpus(demands, unread)), /node strict .*cannot be read/);
  const peers = demand("train", { gpuCount: 2, requiresPeerAccess: true });
  assert.match(
    refusal(() => planLocalGpus([peers], none)),
    /node train \(requiresPeerAccess\): this host has no GPU/,
    "a node needing peers is not run on fewer devices: its worker would refuse it",
  );
});

Deno.test("a card whose identity NVML cannot read is left out, with its reason, not granted", async () => {
  const host = await fakeHost({
    driver: "550.54.15",
    devices: [h100(0), { ...h100(1), unterminated: ["uuid"] }],
  });
  const plan = planLocalGpus([demand("detect", { replicas: 2 })], host);
  assert.match(plan.notes[0], /^GPU 1 is left out: /);
  assert.deepEqual(plan.replicas.detect.map((r) => r.execution), ["gpu", "cpu"]);
  const migParentUnread = await fakeHost(FIXTURES.migParentFails);
  const slices = planLocalGpus([demand("a", { gpuMemoryGib: 1, replicas: 3 })], migParentUnread);
  assert.match(slices.notes.join(";"), /MIG device 1 of GPU 0 is left out/);
  assert.deepEqual(slices.replicas.a.map((r) => r.execution), ["gpu", "gpu", "cpu"]);
});

class Count extends ProducerNode {
  next() {
    return null;
  }
}
class Detect extends ProcessorNode {
  static override requiresPeerAccess = true;
  process(x: unknown) {
    return x;
  }
}
class Strict extends ProcessorNode {
  static override gpuFallback = "none" as const;
  process(x: unknown) {
    return x;
  }
}
class Print extends ConsumerNode {
  consume() {}
}

Deno.test("a flow's GPU demands are its GPU processors, with their replicas and class declarations", () => {
  const count = new Count({ name: "count" });
  const detect = new Detect({ name: "detect", deviceType: "gpu", gpuCount: 2, nbTasks: 3 }).from(count);
  const strict = new Strict({ name: "strict", deviceType: "gpu", gpuMemoryGib: 10 }).from(detect);
  const cpu = new Strict({ name: "cpu" }).from(strict);
  const flow = new Flow([new Print({ name: "print" }).from(cpu)], { flowId: "f" });
  assert.deepEqual(gpuDemandsOf(flow), [
    demand("detect", { replicas: 3, gpuCount: 2, requiresPeerAccess: true }),
    demand("strict", { gpuMemoryGib: 10, fallback: "none" }),
  ]);
});
