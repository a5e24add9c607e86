/**
 * The allocation contract's records and validation (src/backends/allocation.ts) and the in-memory
 * cluster's own behaviour (src/backends/memory/allocation.ts) beyond the conformance stories.
 */
import assert from "node:assert/strict";
import {
  ConfigError,
  OwnershipConflict,
  ResourceUnavailable,
  UnobservableState,
} from "../../../src/core/errors.ts";
import {
  type AllocationCapabilities,
  allocationCapabilities,
  allocationRejections,
  classifyNode,
  constraint,
  constraintHolds,
  deliveredGrantFromDict,
  deliveredGrantToDict,
  deviceIdentity,
  deviceKey,
  enforcementSatisfies,
  type FeasiblePlan,
  GPU_GRANT_ENV,
  infeasible,
  type InventorySnapshot,
  layoutText,
  parseLayoutText,
  type PlanOutcome,
  type WorkloadRequest,
  workloadRequest,
  type WorkloadRequestInit,
} from "../../../src/backends/allocation.ts";
import { Barrier, FaultSchedule, nth, pause } from "../../../src/backends/faults.ts";
import {
  AllocationAuthority,
  DEFAULT_POINTER,
  MemoryAllocationBackend,
  type NodeFixture,
  packWholeDevices,
  SHARED_CONFIG_NAME,
} from "../../../src/backends/memory/allocation.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { checkLayout } from "../../../src/backends/memory/mig_geometry.ts";
import { ObservationLog } from "../../../src/backends/observation.ts";
import { requireKnown } from "../../../src/backends/outcomes.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const GIB = 2 ** 30;
const A100 = "NVIDIA-A100-SXM4-80GB";
const H100 = "NVIDIA-H100-80GB-HBM3";

function request(
  workloadId: string,
  deviceCount: number,
  more: Partial<WorkloadRequestInit> = {},
): WorkloadRequest {
  return workloadRequest({ flowId: "f", runId: "r", workloadId, deviceCount, sharing: "exclusive", ...more });
}

/** The device-plugin stand-in's capabilities, with `overrides`. */
function caps(overrides: Partial<AllocationCapabilities> = {}): AllocationCapabilities {
  const base = new MemoryAllocationBackend([]).capabilities({ version: "1.31", features: ["dynamic-mig"] });
  return allocationCapabilities({ ...base, ...overrides });
}

function node(name: string, gpuCount: number, more: Partial<NodeFixture> = {}): NodeFixture {
  return { name, product: A100, gpuCount, memoryGib: 80, ...more };
}

async function snapshotOf(backend: MemoryAllocationBackend): Promise<InventorySnapshot> {
  return requireKnown(await backend.inventory(), "the inventory");
}

function feasible(outcome: PlanOutcome): FeasiblePlan {
  if (outcome.kind !== "feasible") assert.fail(`expected a feasible plan: ${outcome.reasons.join("; ")}`);
  return outcome;
}

function reasonsOf(outcome: PlanOutcome): string {
  return outcome.kind === "infeasible"
    ? outcome.reasons.join("; ")
    : assert.fail("expected an infeasible plan");
}

Deno.test("a workload request keeps four memory quantities apart and reports every problem at once", () => {
  const r = request("w", 2, {
    minimumUsableMemoryBytes: 10 * GIB,
    reservedMemoryBytes: 12 * GIB,
    hardMemoryLimitBytes: 16 * GIB,
    declaredPeakMemoryBytes: 14 * GIB,
    features: ["mps", "dynamic-mig", "mps"],
  });
  assert.deepEqual(r.features, ["dynamic-mig", "mps"]);
  assert.equal(r.elasticity, "fixed");
  assert.deepEqual([r.hostCpu, r.hostMemory], [null, null]);
  try {
    workloadRequest({
      flowId: "f",
      runId: "r",
      workloadId: "bad",
      deviceCount: 0,
      sharing: "half",
      reservedMemoryBytes: 20 * GIB,
      hardMemoryLimitBytes: 16 * GIB,
      declaredPeakMemoryBytes: 1.5,
    });
    assert.fail("accepted an invalid request");
  } catch (error) {
    assert.ok(error instanceof ConfigError);
    for (
      const part of [
        "device_count",
        "sharing",
        "declared_peak_memory_bytes",
        "reserved_memory_bytes (21474836480) exceeds",
      ]
    ) {
      assert.ok(error.message.includes(part), `${part} missing: ${error.message}`);
    }
  }
});

Deno.test("constraints follow node-selector semantics, and refuse values their operator cannot take", () => {
  const labels = { zone: "a", "nvidia.com/gpu.product": A100 };
  assert.equal(constraintHolds(constraint("zone", "In", ["a", "b"]), labels), true);
  assert.equal(constraintHolds(constraint("zone", "In", ["c"]), labels), false);
  assert.equal(constraintHolds(constraint("zone", "NotIn", ["c"]), labels), true);
  assert.equal(constraintHolds(constraint("rack", "NotIn", ["c"]), labels), true);
  assert.equal(constraintHolds(constraint("zone", "Exists"), labels), true);
  assert.equal(constraintHolds(constraint("rack", "DoesNotExist"), labels), true);
  assert.equal(constraintHolds(constraint("toString", "Exists"), labels), false, "no inherited keys");
  assert.throws(() => constraint("zone", "Near", ["a"]), ConfigError);
  assert.throws(() => constraint("zone", "In", []), ConfigError);
  assert.throws(() => constraint("zone", "Exists", ["a"]), ConfigError);
});

Deno.test("device keys prefer the MIG UUID, then the GPU UUID, then node/ordinal; enforcement has an order", () => {
  const base = { node: "n1", ordinal: 0, product: A100, memoryBytes: null };
  assert.equal(deviceKey(deviceIdentity({ ...base, uuid: "GPU-1", migUuid: "MIG-1" })), "MIG-1");
  assert.equal(deviceKey(deviceIdentity({ ...base, uuid: "GPU-1", migUuid: null })), "GPU-1");
  assert.equal(deviceKey(deviceIdentity({ ...base, uuid: null, migUuid: null })), "n1/0");
  assert.throws(
    () => deviceKey(deviceIdentity({ ...base, node: null, uuid: null, migUuid: null })),
    ConfigError,
  );
  assert.equal(enforcementSatisfies("hardware", "runtime"), true);
  assert.equal(enforcementSatisfies("scheduler", "runtime"), false);
  assert.equal(enforcementSatisfies("none", "none"), true);
  assert.throws(() => infeasible([]), RangeError);
});

Deno.test("story 48: a grant document round-trips, and an unobserved empty grant never reads as zero GPUs", () => {
  const devices = [deviceIdentity({
    node: "n1",
    ordinal: 3,
    uuid: "GPU-a",
    migUuid: "MIG-b",
    product: A100,
    memoryBytes: 10 * GIB,
    migProfile: "1g.10gb",
  })];
  const grant = {
    workloadId: "w",
    devices,
    exclusive: true,
    requested: 1,
    policy: "mig",
    host: "observed" as const,
  };
  assert.deepEqual(deliveredGrantFromDict(JSON.parse(JSON.stringify(deliveredGrantToDict(grant)))), grant);
  const unobserved = deliveredGrantFromDict({
    workload_id: "w",
    devices: [],
    exclusive: true,
    requested: 2,
    policy: "exclusive",
    host: "unobserved",
  });
  assert.equal(unobserved.host, "unobserved", "empty means could not tell");
  const legacy = deliveredGrantFromDict({
    workload_id: "w",
    devices: [],
    exclusive: false,
    requested: 0,
    policy: "x",
  });
  assert.equal(legacy.host, "observed");
  assert.throws(
    () =>
      deliveredGrantFromDict({
        workload_id: "w",
        devices: [{ product: 1 }],
        exclusive: 1,
        requested: 1,
        policy: "x",
      }),
    /bad exclusive/,
  );
  assert.throws(
    () => deliveredGrantFromDict({ ...deliveredGrantToDict(grant), extra: 1 }),
    /unknown key extra/,
  );
  assert.throws(() => deliveredGrantFromDict([]), ConfigError);
});

Deno.test("ALLOC-023: rejections name the request, what it needs and what adapter and version offer", () => {
  const requests = [
    request("shared", 1, { sharing: "time-sliced" }),
    request("twoslices", 2, { sharing: "mig" }),
    request("elastic", 1, { elasticity: "elastic" }),
    request("gate", 1, { features: ["consumable-capacity"] }),
    request("mpsmig", 1, { sharing: "mps", features: ["dynamic-mig"] }),
    request("capped", 1, { hardMemoryLimitBytes: GIB }),
  ];
  const reasons = allocationRejections(requests, caps()).join("\n");
  for (
    const pattern of [
      /request shared needs time-sliced devices; adapter memory \(authority device-plugin\) does not offer/,
      /request twoslices asks for 2 MIG slices; a MIG request takes one/,
      /request elastic needs an elastic device set/,
      /request gate needs feature consumable-capacity; .* version 1\.31 offers \[dynamic-mig\]/,
      /request mpsmig combines mps and dynamic-mig/,
      /request capped needs an enforced hard memory limit; .* enforces memory by scheduler/,
    ]
  ) assert.match(reasons, pattern);
  assert.deepEqual(allocationRejections([request("ok", 4)], caps()), []);
  assert.match(
    allocationRejections([request("two", 2)], caps({ multiDevice: false })).join(),
    /2 devices on one host/,
  );
  assert.match(
    allocationRejections([request("x", 1)], caps({ exclusiveDevice: false })).join(),
    /exclusive devices/,
  );
  assert.match(
    allocationRejections([request("r", 1, { reservedMemoryBytes: GIB })], caps({ memoryEnforcement: "none" }))
      .join(),
    /accounts for no memory/,
  );
});

Deno.test("nodes are classified by their GFD labels and applied geometry", () => {
  assert.equal(classifyNode({}, 4, false), "physical");
  assert.equal(classifyNode({}, 0, false), "unknown");
  assert.equal(classifyNode({}, 4, true), "mig");
  assert.equal(classifyNode({ "nvidia.com/gpu.sharing-strategy": "mps" }, 4, false), "mps");
  assert.equal(classifyNode({ "nvidia.com/gpu.sharing-strategy": "time-slicing" }, 4, true), "time-sliced");
  assert.equal(classifyNode({ "nvidia.com/gpu.replicas": "4" }, 4, false), "time-sliced");
});

Deno.test("layout text is canonical and reads back; anything else is a ConfigError", () => {
  assert.equal(layoutText({ "3g.40gb": 1, "1g.10gb": 2, "2g.20gb": 0 }), "1g.10gb=2,3g.40gb=1");
  assert.deepEqual(parseLayoutText("1g.10gb=2,3g.40gb=1"), { "1g.10gb": 2, "3g.40gb": 1 });
  assert.deepEqual(parseLayoutText(""), {});
  for (const bad of ["1g.10gb", "1g.10gb=0", "1g.10gb=1,1g.10gb=2", "=3", "1g.10gb=1,"]) {
    assert.throws(() => parseLayoutText(bad), ConfigError, bad);
  }
});

Deno.test("packWholeDevices honours eligibility and tries preferred hosts first", () => {
  assert.deepEqual(packWholeDevices([["a", 2]], { h1: 2, h2: 2 }, { a: new Set(["h2"]) }), { a: "h2" });
  assert.equal(packWholeDevices([["a", 2]], { h1: 2, h2: 1 }, { a: new Set(["h2"]) }), null);
  assert.deepEqual(packWholeDevices([["a", 1]], { h1: 2, h2: 2 }, undefined, { a: new Set(["h2"]) }), {
    a: "h2",
  });
  assert.deepEqual(packWholeDevices([], { h1: 1 }), {});
});

Deno.test("random packings: packWholeDevices finds an assignment exactly when brute force does, and a valid one", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let round = 0; round < 300; round++) {
    const hosts = Array.from({ length: random.int(1, 4) }, (_, i) => `h${i}`);
    const free = Object.fromEntries(hosts.map((h) => [h, random.int(0, 4)]));
    const requests = Array.from({ length: random.int(1, 5) }, (_, i) => [`w${i}`, random.int(1, 3)] as const);
    const eligible = Object.fromEntries(
      requests.filter(() => random.chance(0.3)).map((
        [w],
      ) => [w, new Set(hosts.filter(() => random.chance(0.6)))]),
    );
    let exists = false;
    const tryAll = (index: number, left: Record<string, number>) => {
      if (exists) return;
      if (index === requests.length) {
        exists = true;
        return;
      }
      const [w, count] = requests[index];
      for (const h of hosts) {
        if ((eligible[w]?.has(h) ?? true) && left[h] >= count) {
          tryAll(index + 1, { ...left, [h]: left[h] - count });
        }
      }
    };
    tryAll(0, free);
    const packing = packWholeDevices(requests, free, eligible);
    const where = `seed ${seed} round ${round}: ${JSON.stringify({ free, requests })}`;
    assert.equal(packing !== null, exists, where);
    if (packing === null) continue;
    const used: Record<string, number> = {};
    for (const [w, count] of requests) {
      const h: string = packing[w];
      assert.ok(eligible[w]?.has(h) ?? true, `${where}: ${w} on ineligible ${h}`);
      used[h] = (used[h] ?? 0) + count;
    }
    for (const [h, n] of Object.entries(used)) assert.ok(n <= free[h], `${where}: ${h} overbooked`);
  }
});

Deno.test("the inventory lists whole devices and slices, foreign occupancy, sharing and owners, in scope", async () => {
  const backend = new MemoryAllocationBackend([
    node("n1", 2, { labels: { zone: "a" }, workloads: { "foreign-1": 1 } }),
    node("n2", 1, { product: H100, migConfig: "all-1g.10gb", migLayout: { "1g.10gb": 7 }, owner: "claim-x" }),
    node("n3", 2, {
      labels: { "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4" },
    }),
  ], { clock: new FakeClock() });
  const snapshot = await snapshotOf(backend);
  const n1 = snapshot.devices.filter((d) => d.node === "n1");
  assert.deepEqual(n1.map((d) => [d.ordinal, d.uuid, d.memoryBytes]), [[0, "GPU-n1-0", 80 * GIB], [
    1,
    "GPU-n1-1",
    80 * GIB,
  ]]);
  assert.equal(snapshot.devices.filter((d) => d.node === "n2").length, 7);
  assert.ok(
    snapshot.devices.filter((d) => d.node === "n2").every((d) => d.migProfile === "1g.10gb" && d.migUuid),
  );
  assert.deepEqual(snapshot.occupancy, { "GPU-n1-0": 1 });
  assert.deepEqual(snapshot.sharing, { n1: "physical", n2: "mig", n3: "time-sliced" });
  assert.deepEqual(snapshot.owners, { n2: "claim-x" });
  assert.equal(
    (await snapshotOf(backend)).generation,
    snapshot.generation,
    "nothing changed, same generation",
  );
  const onlyA = requireKnown(await backend.inventory({ labels: { zone: "a" } }), "scoped");
  assert.deepEqual(Object.keys(onlyA.sharing), ["n1"]);
  assert.deepEqual(Object.keys(requireKnown(await backend.inventory({ nodes: ["n3"] }), "n3").sharing), [
    "n3",
  ]);
  backend.bindWorkload("n1", "foreign-2", 1);
  assert.notEqual((await snapshotOf(backend)).generation, snapshot.generation);
  assert.throws(() => backend.bindWorkload("n1", "foreign-3", 1), RangeError, "no device left");
  assert.throws(() => new MemoryAllocationBackend([node("a", 1), node("a", 1)]), ConfigError);
});

Deno.test("plans honour hard constraints, soft preferences and the usable-memory minimum", async () => {
  const backend = new MemoryAllocationBackend([
    node("small", 2, { memoryGib: 16, labels: { zone: "a" } }),
    node("big-a", 2, { labels: { zone: "a" } }),
    node("big-b", 2, { labels: { zone: "b" } }),
  ]);
  const snapshot = await snapshotOf(backend);
  const hostOf = (plan: FeasiblePlan, w: string) => plan.assignments[w][0].node;
  const hard = feasible(
    await backend.plan([request("w", 1, { constraints: [constraint("zone", "In", ["b"])] })], snapshot),
  );
  assert.equal(hostOf(hard, "w"), "big-b");
  const soft = feasible(
    await backend.plan(
      [request("w", 1, { constraints: [constraint("zone", "In", ["a"], false)] })],
      snapshot,
    ),
  );
  assert.equal(hostOf(soft, "w"), "big-a", "the preferred host first; 'small' also matches, it sorts later");
  const roomy = feasible(
    await backend.plan([request("w", 2, { minimumUsableMemoryBytes: 40 * GIB })], snapshot),
  );
  assert.notEqual(hostOf(roomy, "w"), "small");
  assert.match(
    reasonsOf(
      await backend.plan([request("w", 1, { constraints: [constraint("zone", "In", ["z"])] })], snapshot),
    ),
    /no eligible host/,
  );
  await assert.rejects(backend.plan([request("w", 1), request("w", 1)], snapshot), ConfigError);
  assert.match(
    reasonsOf(await backend.plan([request("c", 1, { hardMemoryLimitBytes: GIB })], snapshot)),
    /hard memory limit/,
  );
});

Deno.test("a whole-device claim: allocated on reserve, prepared when observed, ready when the workload says so", async () => {
  const log = new ObservationLog();
  const backend = new MemoryAllocationBackend([node("n1", 4)], { log });
  const plan = feasible(await backend.plan([request("w", 2)], await snapshotOf(backend)));
  const reserved = await backend.reserve(plan, "op-1", null);
  assert.deepEqual([reserved.status, reserved.owner, reserved.desiredGeneration, reserved.grant], [
    "allocated",
    "op-1",
    "1",
    null,
  ]);
  const retried = await backend.reserve(plan, "op-1", null);
  assert.deepEqual(
    [retried.claimId, retried.owner],
    [reserved.claimId, "op-1"],
    "a retry answers the same claim",
  );
  await assert.rejects(backend.reserve(plan, "op-2", null), OwnershipConflict);
  await assert.rejects(
    backend.reserve({ ...plan, planId: "plan-elsewhere" }, "op-1", null),
    ConfigError,
    "a plan this backend never made",
  );
  const prepared = requireKnown(await backend.observe(reserved.claimId), "claim");
  assert.equal(prepared.status, "prepared");
  assert.deepEqual(prepared.grant?.map(deviceKey), plan.assignments.w.map(deviceKey));
  backend.markWorkloadReady(reserved.claimId);
  assert.equal(requireKnown(await backend.observe(reserved.claimId), "claim").status, "ready");
  const bindings = await backend.bindings(reserved.claimId, "w");
  assert.deepEqual(bindings.podFragment, { nodeSelector: { "kubernetes.io/hostname": "n1" } });
  assert.deepEqual(bindings.containerFragment, { resources: { limits: { "nvidia.com/gpu": "2" } } });
  assert.deepEqual(bindings.claimManifests, []);
  assert.equal(deliveredGrantFromDict(JSON.parse(bindings.env[GPU_GRANT_ENV])).policy, "exclusive");
  await assert.rejects(backend.bindings(reserved.claimId, "nobody"), ConfigError);
  const missing = await backend.observe("claim-none");
  assert.equal(missing.kind === "unknown" ? missing.reason : null, "missing");
  assert.deepEqual(log.events("claim").map((e) => e.fields.status), ["reserved"]);
});

Deno.test("a reservation whose plan went stale is refused before any write", async () => {
  const backend = new MemoryAllocationBackend([node("n1", 2)]);
  const plan = feasible(await backend.plan([request("w", 2)], await snapshotOf(backend)));
  backend.bindWorkload("n1", "foreign", 1);
  await assert.rejects(backend.reserve(plan, "op-1", null), /no longer free/);
  assert.deepEqual(backend.mutations(), []);
});

Deno.test("a lost race on a later node rolls back only this call's writes, never a newer writer's", async () => {
  const backend = new MemoryAllocationBackend([node("n1", 3), node("n2", 2)]);
  const plan = feasible(await backend.plan([request("a", 2), request("b", 2)], await snapshotOf(backend)));
  assert.deepEqual([plan.assignments.a[0].node, plan.assignments.b[0].node], ["n1", "n2"]);
  using schedule = new FaultSchedule({ [Barrier.ownerUpdateBefore]: nth(2, pause("second-write")) })
    .install();
  const reserving = backend.reserve(plan, "op-1", null);
  await schedule.untilFired(Barrier.ownerUpdateBefore, 2);
  backend.bindWorkload("n1", "newer-on-n1", 1);
  backend.bindWorkload("n2", "newer-on-n2", 1);
  schedule.release("second-write");
  await assert.rejects(reserving, OwnershipConflict);
  schedule.assertAllFired();
  const snapshot = await snapshotOf(backend);
  assert.equal(
    Object.values(snapshot.occupancy).reduce((x, y) => x + y, 0),
    2,
    "only the two newer workloads hold devices",
  );
  assert.ok(backend.mutations().some((m) => m.field === "rollback" && m.target === "n1"));
  assert.deepEqual(
    backend.node("n1").workloads,
    { "newer-on-n1": 1 },
    "the newer writer's workload survived",
  );
});

Deno.test("shared devices are handed out by replica units; MIG slices in place are taken without geometry", async () => {
  const backend = new MemoryAllocationBackend([
    node("ts", 1, {
      labels: { "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "2" },
    }),
    node("mig", 1, { product: H100, migConfig: "all-1g.10gb", migLayout: { "1g.10gb": 7 } }),
  ], { authority: AllocationAuthority.dra });
  const snapshot = await snapshotOf(backend);
  const shares = feasible(
    await backend.plan([
      request("s1", 1, { sharing: "time-sliced" }),
      request("s2", 1, { sharing: "time-sliced" }),
    ], snapshot),
  );
  assert.equal(
    deviceKey(shares.assignments.s1[0]),
    deviceKey(shares.assignments.s2[0]),
    "two shares of one device",
  );
  assert.match(
    reasonsOf(
      await backend.plan([1, 2, 3].map((i) => request(`s${i}`, 1, { sharing: "time-sliced" })), snapshot),
    ),
    /no time-sliced host has 1 device\(s\) with a free share/,
  );
  const slicePlan = feasible(
    await backend.plan([request("m", 1, { sharing: "mig", minimumUsableMemoryBytes: 5 * GIB })], snapshot),
  );
  assert.deepEqual(slicePlan.geometry, {});
  const claim = await backend.reserve(slicePlan, "op-1", null);
  const bindings = await backend.bindings(claim.claimId, "m");
  assert.deepEqual(bindings.containerFragment, { resources: { limits: { "nvidia.com/mig-1g.10gb": "1" } } });
  assert.match(bindings.env.CUDA_VISIBLE_DEVICES, /^MIG-/);
  assert.equal(bindings.claimManifests.length, 1, "a DRA authority hands out a ResourceClaim");
  const device = new MemoryAllocationBackend([node("n", 1)]);
  assert.match(
    reasonsOf(await device.plan([request("m", 1, { sharing: "mig" })], await snapshotOf(device))),
    /authority device-plugin cannot change geometry/,
  );
});

Deno.test("managed MIG: the cluster pointer and shared map are written under CAS; the last owner out restores them", async () => {
  const clock = new FakeClock();
  const backend = new MemoryAllocationBackend(
    [node("n1", 2, { product: H100 }), node("n2", 1, { product: H100 })],
    { clock, authority: AllocationAuthority.managedMig, migApplySeconds: 5 },
  );
  const snapshot = await snapshotOf(backend);
  const plan = feasible(
    await backend.plan(
      [1, 2, 3].map((i) => request(`m${i}`, 1, { sharing: "mig", minimumUsableMemoryBytes: 10 * GIB })),
      snapshot,
    ),
  );
  for (const [host, layout] of Object.entries(plan.geometry)) {
    assert.deepEqual(checkLayout(H100, parseLayoutText(layout)), [], `${host}: ${layout}`);
  }
  assert.equal(backend.pointer(), DEFAULT_POINTER);
  const claim = await backend.reserve(plan, "op-1", null);
  assert.equal(backend.pointer(), SHARED_CONFIG_NAME);
  const config = backend.sharedConfig();
  assert.equal(config.tombstoned, false);
  assert.equal(Object.keys(config.entries).length, Object.keys(plan.geometry).length);
  const [host] = Object.keys(plan.geometry);
  assert.equal(backend.node(host).owner, claim.claimId);
  assert.equal(backend.node(host).restoreRecord, "all-disabled");
  clock.advance(5);
  const prepared = requireKnown(await backend.observe(claim.claimId), "claim");
  assert.equal(prepared.status, "prepared");
  assert.equal(prepared.grant?.length, 3);
  assert.equal(new Set(prepared.grant?.map(deviceKey)).size, 3, "three distinct slices");
  const released = await backend.release(claim.claimId, "op-1", "1");
  assert.equal(released.status, "released");
  clock.advance(5);
  backend.applyPendingGeometry();
  assert.equal(backend.node(host).migConfig, "all-disabled");
  assert.deepEqual(backend.node(host).migLayout, {});
  const after = backend.sharedConfig();
  assert.deepEqual(after.entries, {});
  assert.equal(after.tombstoned, true, "the map is tombstoned, never deleted");
  assert.equal(backend.pointer(), DEFAULT_POINTER);
  assert.ok(backend.mutations(["pointer"]).length === 2 && backend.mutations(["config"]).length >= 3);
});

Deno.test("managed MIG: a failed preparation is reported for its generation, and reads that fail refuse writes", async () => {
  const clock = new FakeClock();
  const backend = new MemoryAllocationBackend([node("n1", 1, { product: H100 })], {
    clock,
    authority: AllocationAuthority.managedMig,
  });
  const ask = [request("m", 1, { sharing: "mig", minimumUsableMemoryBytes: 20 * GIB })];
  const plan = feasible(await backend.plan(ask, await snapshotOf(backend)));
  backend.failReads("config", "auth");
  await assert.rejects(backend.reserve(plan, "op-1", null), UnobservableState);
  assert.deepEqual(backend.mutations(), [], "nothing written when the shared map cannot be read");
  backend.failReads("config", null);
  backend.bindWorkload("n1", "arrived-since-the-plan", 1);
  await assert.rejects(backend.reserve(plan, "op-1", null), /its geometry cannot change/);
  assert.deepEqual(backend.mutations(), [], "geometry is never changed under a workload");
  backend.unbindWorkload("n1", "arrived-since-the-plan");
  backend.failGeometry("n1");
  const claim = await backend.reserve(plan, "op-1", null);
  const failed = requireKnown(await backend.observe(claim.claimId), "claim");
  assert.equal(failed.status, "failed");
  assert.equal(failed.grant, null);
  await assert.rejects(backend.bindings(claim.claimId, "m"), ResourceUnavailable);
  await assert.rejects(backend.reconcile(claim.claimId, "nonsense", "1"), ConfigError);
  const whole = new MemoryAllocationBackend([node("n", 1)]);
  const wholeClaim = await whole.reserve(
    feasible(await whole.plan([request("w", 1)], await snapshotOf(whole))),
    "op",
    null,
  );
  await assert.rejects(whole.reconcile(wholeClaim.claimId, "1g.10gb=1", "1"), /manages no MIG geometry/);
});

Deno.test("a retained claim keeps its devices held in the inventory until a later release", async () => {
  const backend = new MemoryAllocationBackend([node("n1", 2)]);
  const plan = feasible(await backend.plan([request("w", 2)], await snapshotOf(backend)));
  const claim = await backend.reserve(plan, "op-1", null);
  assert.equal((await backend.release(claim.claimId, "op-1", "1", true)).status, "retained");
  assert.equal(Object.keys((await snapshotOf(backend)).occupancy).length, 2);
  assert.equal((await backend.plan([request("x", 1)], await snapshotOf(backend))).kind, "infeasible");
  assert.equal((await backend.release(claim.claimId, "op-1", "1")).status, "released");
  assert.deepEqual((await snapshotOf(backend)).occupancy, {});
  assert.deepEqual(
    backend.mutations(["claim"]).map((m) => [m.target, m.value]),
    [[claim.claimId, "retained"]],
  );
});
