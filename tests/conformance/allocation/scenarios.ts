/**
 * The AcceleratorAllocationBackend stories (SPEC-MAP section 5: 3, 33, 34, 35, 48, and ALLOC-023), written
 * once against the contract and run against every provider: the memory model here, the Kubernetes
 * adapter against its fake API server later. The spec numbers no requirement for stories 3 and 33–35, so
 * their tests carry the label ALLOC and the story number. Faults come from the fault barriers
 * (owner.read.after, owner.update.before/after) and the FakeClock; a scheduled fault that never fired
 * fails its test.
 */
import assert from "node:assert/strict";
import {
  ConfigError,
  OwnershipConflict,
  ResourceUnavailable,
  UnobservableState,
} from "../../../src/core/errors.ts";
import {
  type AcceleratorAllocationBackend,
  type ClaimObservation,
  constraint,
  deliveredGrantFromDict,
  deviceKey,
  type FeasiblePlan,
  GPU_GRANT_ENV,
  type InventorySnapshot,
  parseLayoutText,
  type PlanOutcome,
  type WorkloadRequest,
  workloadRequest,
  type WorkloadRequestInit,
} from "../../../src/backends/allocation.ts";
import { Barrier, dropResponse, FaultSchedule, pause } from "../../../src/backends/faults.ts";
import { type NodeFixture, packWholeDevices } from "../../../src/backends/memory/allocation.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { checkLayout } from "../../../src/backends/memory/mig_geometry.ts";
import { type Observation, requireKnown, type UnknownReason } from "../../../src/backends/outcomes.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

/** How a scenario changes the world under the backend and reads what the backend wrote. */
export interface AllocationHooks {
  failReads(kind: "nodes" | "pods" | "config", reason?: UnknownReason | null): void;
  bindWorkload(node: string, workloadId: string, units: number): void;
  unbindWorkload(node: string, workloadId: string): void;
  applyPendingGeometry(): void;
  markWorkloadReady(claimId: string): void;
  /** Every write the backend issued, with the operation that issued it. */
  mutations(): readonly { readonly operation: string }[];
  node(
    name: string,
  ): { readonly owner: string | null; readonly migConfig: string; readonly resourceVersion: number };
}

/** One backend under test, its hooks, and the clock it reads. */
export interface AllocationInstance {
  readonly backend: AcceleratorAllocationBackend;
  readonly hooks: AllocationHooks;
  /** Stops what the instance started (a server); called when its test ends. */
  close?(): Promise<void>;
}

/** Options a scenario creates a provider instance with. */
export interface AllocationOptions {
  readonly nodes: readonly NodeFixture[];
  readonly clock: FakeClock;
  /** Stand in for an authority that may change MIG geometry (managed MIG). */
  readonly geometry?: boolean;
  /** Clock delay before a geometry write is applied. */
  readonly migApplySeconds?: number;
}

/** A provider of allocation backends for the scenarios. */
export interface AllocationProvider {
  readonly name: string;
  /** Whether the provider can stand in for an authority that changes MIG geometry. */
  readonly geometry: boolean;
  create(options: AllocationOptions): Promise<AllocationInstance>;
}

const A100 = "NVIDIA-A100-SXM4-80GB";
const H100 = "NVIDIA-H100-80GB-HBM3";
const GIB = 2 ** 30;

function gpuNode(
  name: string,
  gpuCount: number,
  product = A100,
  labels: Record<string, string> = {},
): NodeFixture {
  return { name, product, gpuCount, memoryGib: 80, labels: { "nvidia.com/gpu.product": product, ...labels } };
}

function request(
  workloadId: string,
  deviceCount: number,
  more: Partial<WorkloadRequestInit> = {},
): WorkloadRequest {
  return workloadRequest({ flowId: "f", runId: "r", workloadId, deviceCount, sharing: "exclusive", ...more });
}

function slice(workloadId: string, gib: number): WorkloadRequest {
  return request(workloadId, 1, { sharing: "mig", minimumUsableMemoryBytes: gib * GIB });
}

async function snapshotOf(backend: AcceleratorAllocationBackend): Promise<InventorySnapshot> {
  return requireKnown(await backend.inventory(), "the inventory");
}

function feasible(outcome: PlanOutcome): FeasiblePlan {
  if (outcome.kind !== "feasible") {
    assert.fail(`expected a feasible plan, got: ${outcome.reasons.join("; ")}`);
  }
  return outcome;
}

function claimOf(observation: Observation<ClaimObservation>): ClaimObservation {
  return requireKnown(observation, "the claim");
}

async function planAndReserve(
  backend: AcceleratorAllocationBackend,
  requests: readonly WorkloadRequest[],
  operation: string,
): Promise<ClaimObservation> {
  const plan = feasible(await backend.plan(requests, await snapshotOf(backend)));
  return await backend.reserve(plan, operation, null);
}

/** Registers every scenario for `provider`. */
export function allocationScenarios(provider: AllocationProvider): void {
  const opened: AllocationInstance[] = [];
  const test = (name: string, fn: () => Promise<void>, needsGeometry = false) =>
    Deno.test({
      name: `${provider.name} ${name}`,
      ignore: needsGeometry && !provider.geometry,
      fn: async () => {
        try {
          await fn();
        } finally {
          for (const instance of opened.splice(0)) await instance.close?.();
        }
      },
    });
  const create = (nodes: readonly NodeFixture[], extra: Partial<AllocationOptions> = {}) => {
    const clock = new FakeClock();
    return provider.create({ nodes, clock, ...extra }).then((instance) => {
      opened.push(instance);
      return { ...instance, clock };
    });
  };

  test("ALLOC 3: two reservers paused at owner.read.after and owner.update.before: one CAS wins, the loser mutated nothing", async () => {
    const { backend, hooks } = await create([gpuNode("n1", 4)]);
    const snapshot = await snapshotOf(backend);
    const planA = feasible(await backend.plan([request("a", 2)], snapshot));
    const planB = feasible(await backend.plan([request("b", 2)], snapshot));
    using schedule = new FaultSchedule({
      [Barrier.ownerReadAfter]: pause("both-read"),
      [Barrier.ownerUpdateBefore]: pause("both-write"),
    }).install();
    const racing = [backend.reserve(planA, "op-a", null), backend.reserve(planB, "op-b", null)];
    await schedule.untilFired(Barrier.ownerReadAfter, 2);
    schedule.release("both-read");
    await schedule.untilFired(Barrier.ownerUpdateBefore, 2);
    schedule.release("both-write");
    const [a, b] = await Promise.allSettled(racing);
    schedule.assertAllFired();
    const outcomes = [a.status, b.status].sort();
    assert.deepEqual(outcomes, ["fulfilled", "rejected"], "exactly one reservation wins");
    const loser = a.status === "rejected" ? a : b as PromiseRejectedResult;
    assert.ok(
      loser.reason instanceof OwnershipConflict,
      `the loser gets OwnershipConflict, got ${loser.reason}`,
    );
    const loserOp = a.status === "rejected" ? "op-a" : "op-b";
    const winnerOp = loserOp === "op-a" ? "op-b" : "op-a";
    assert.equal(
      hooks.mutations().filter((m) => m.operation === loserOp).length,
      0,
      "zero mutations by the loser",
    );
    assert.ok(hooks.mutations().some((m) => m.operation === winnerOp));
    const after = await snapshotOf(backend);
    assert.equal(
      Object.values(after.occupancy).reduce((x, y) => x + y, 0),
      2,
      "only the winner's two devices are held",
    );
  });

  test("ALLOC 33: a failed pod listing leaves the inventory partial and the plan Infeasible('occupancy unknown')", async () => {
    const { backend, hooks } = await create([{ ...gpuNode("n1", 4), workloads: { "foreign-train": 4 } }]);
    hooks.failReads("pods", "auth");
    const partial = await snapshotOf(backend);
    assert.equal(partial.completeness, "partial");
    assert.deepEqual(partial.occupancy, {}, "no occupancy is reported, and none is invented");
    assert.equal(partial.devices.length, 4, "devices are still listed");
    const outcome = await backend.plan([request("w", 1)], partial);
    assert.equal(outcome.kind, "infeasible");
    assert.deepEqual(outcome.kind === "infeasible" ? outcome.reasons : [], ["occupancy unknown"]);
    hooks.failReads("pods", null);
    const complete = await snapshotOf(backend);
    assert.equal(complete.completeness, "complete");
    assert.equal(
      Object.values(complete.occupancy).reduce((x, y) => x + y, 0),
      4,
      "the devices were never idle",
    );
    assert.equal((await backend.plan([request("w", 1)], complete)).kind, "infeasible");
  });

  test("ALLOC 33: a failed node listing makes the inventory Unknown and every write refuse before it starts", async () => {
    const { backend, hooks } = await create([gpuNode("n1", 2)]);
    const plan = feasible(await backend.plan([request("w", 1)], await snapshotOf(backend)));
    const held = await planAndReserve(backend, [request("held", 1)], "op-held");
    hooks.failReads("nodes", "timeout");
    const inventory = await backend.inventory();
    assert.equal(inventory.kind, "unknown");
    assert.equal(inventory.kind === "unknown" ? inventory.reason : null, "timeout");
    const before = hooks.mutations().length;
    await assert.rejects(backend.reserve(plan, "op-w", null), UnobservableState);
    assert.equal((await backend.observe(held.claimId)).kind, "unknown");
    const release = await backend.release(held.claimId, "op-held", held.desiredGeneration);
    assert.equal(release.status, "unknown");
    assert.equal(hooks.mutations().length, before, "nothing was written while the nodes could not be read");
    hooks.failReads("nodes", null);
    assert.equal(claimOf(await backend.observe(held.claimId)).status, "prepared", "the held claim is intact");
  });

  test("ALLOC 34: a stale MIG success for an earlier generation does not complete a new write", async () => {
    const { backend, hooks, clock } = await create([gpuNode("n1", 1, H100)], {
      geometry: true,
      migApplySeconds: 30,
    });
    const plan = feasible(await backend.plan([slice("w", 10)], await snapshotOf(backend)));
    assert.deepEqual(plan.geometry, { n1: "1g.10gb=1" });
    const reserved = await backend.reserve(plan, "op-1", null);
    assert.equal(reserved.status, "allocated");
    assert.equal(reserved.grant, null);
    const pending = claimOf(await backend.observe(reserved.claimId));
    assert.equal(pending.status, "preparing", "the node's success is for generation 0, not this write");
    assert.equal(pending.observedGeneration, null);
    assert.equal(pending.grant, null);
    await assert.rejects(
      backend.bindings(reserved.claimId, "w"),
      ResourceUnavailable,
      "no grant to bind yet",
    );
    clock.advance(30);
    hooks.applyPendingGeometry();
    const prepared = claimOf(await backend.observe(reserved.claimId));
    assert.equal(prepared.status, "prepared");
    assert.equal(prepared.observedGeneration, "1");
    assert.equal(prepared.grant?.length, 1);
    assert.equal(prepared.grant?.[0].migProfile, "1g.10gb");
    assert.match(prepared.grant?.[0].migUuid ?? "", /^MIG-/);
    const rewritten = await backend.reconcile(reserved.claimId, "1g.10gb=1,3g.40gb=1", "1");
    assert.equal(rewritten.desiredGeneration, "2");
    const stale = claimOf(await backend.observe(reserved.claimId));
    assert.equal(stale.status, "preparing", "success for generation 1 says nothing about generation 2");
    assert.equal(stale.observedGeneration, "1");
    clock.advance(30);
    hooks.applyPendingGeometry();
    const current = claimOf(await backend.observe(reserved.claimId));
    assert.equal(current.status, "prepared");
    assert.equal(current.observedGeneration, "2");
    hooks.markWorkloadReady(reserved.claimId);
    assert.equal(claimOf(await backend.observe(reserved.claimId)).status, "ready");
    await assert.rejects(
      backend.reconcile(reserved.claimId, "1g.10gb=1", "1"),
      OwnershipConflict,
      "generation-fenced",
    );
  }, true);

  test(
    "ALLOC 34: geometry is untouched while a foreign workload, or the claim's own running one, uses the node",
    async () => {
      const { backend, hooks } = await create([gpuNode("n1", 1, H100)], { geometry: true });
      const claim = await planAndReserve(backend, [slice("w", 10)], "op-1");
      assert.equal(claimOf(await backend.observe(claim.claimId)).status, "prepared");
      const configBefore = hooks.node("n1").migConfig;
      hooks.bindWorkload("n1", "foreign-notebook", 1);
      const before = hooks.mutations().length;
      const refused = await backend.reconcile(claim.claimId, "1g.10gb=1,4g.40gb=1", claim.desiredGeneration);
      assert.match(JSON.stringify(refused.evidence.refused), /foreign-notebook/);
      assert.equal(refused.desiredGeneration, claim.desiredGeneration, "no new generation was written");
      assert.equal(hooks.mutations().length, before, "zero mutations");
      assert.equal(hooks.node("n1").migConfig, configBefore);
      hooks.unbindWorkload("n1", "foreign-notebook");
      hooks.bindWorkload("n1", "w", 1);
      const ownRunning = await backend.reconcile(
        claim.claimId,
        "1g.10gb=1,3g.40gb=1",
        claim.desiredGeneration,
      );
      assert.match(JSON.stringify(ownRunning.evidence.refused), /#w/);
      assert.equal(hooks.mutations().length, before);
      const release = await backend.release(claim.claimId, "op-1", claim.desiredGeneration);
      assert.equal(release.status, "released");
      assert.match(release.remaining.join(";"), /n1: geometry kept/);
      assert.equal(hooks.node("n1").migConfig, configBefore, "the running workload keeps its geometry");
    },
    true,
  );

  test(
    "ALLOC 34: a retained workload keeps its devices and geometry until an explicit later release",
    async () => {
      const { backend, hooks } = await create([gpuNode("n1", 1, H100)], { geometry: true });
      const claim = await planAndReserve(backend, [slice("w", 10)], "op-1");
      const retained = await backend.release(claim.claimId, "op-1", claim.desiredGeneration, true);
      assert.equal(retained.status, "retained");
      assert.deepEqual(retained.remaining, ["w"]);
      assert.equal(hooks.node("n1").owner, claim.claimId);
      assert.equal(claimOf(await backend.observe(claim.claimId)).status, "retained");
      const other = await backend.plan([slice("x", 10)], await snapshotOf(backend));
      assert.equal(other.kind, "infeasible", "the retained node is not free for another claim");
      const released = await backend.release(claim.claimId, "op-1", claim.desiredGeneration);
      assert.equal(released.status, "released");
      assert.equal(hooks.node("n1").owner, null);
      hooks.applyPendingGeometry();
      assert.equal(
        hooks.node("n1").migConfig,
        "all-disabled",
        "the node's original configuration is restored",
      );
      assert.equal(
        feasible(await backend.plan([slice("x", 10)], await snapshotOf(backend))).kind,
        "feasible",
      );
      const again = await backend.release(claim.claimId, "op-1", claim.desiredGeneration);
      assert.equal(again.status, "released", "release is idempotent");
    },
    true,
  );

  test("ALLOC 35: two hosts with three free GPUs cannot host three 2-GPU requests; three hosts with two can", async () => {
    const requests = [request("a", 2), request("b", 2), request("c", 2)];
    const pairs = requests.map((r) => [r.workloadId, r.deviceCount] as const);
    const two = await create([gpuNode("h1", 3), gpuNode("h2", 3)]);
    const outcome = await two.backend.plan(requests, await snapshotOf(two.backend));
    assert.equal(outcome.kind, "infeasible", "six free GPUs in aggregate hide the fragmentation");
    assert.match(outcome.kind === "infeasible" ? outcome.reasons.join(";") : "", /fragmentation/);
    assert.equal(packWholeDevices(pairs, { h1: 3, h2: 3 }), null, "the oracle agrees");
    const three = await create([gpuNode("h1", 2), gpuNode("h2", 2), gpuNode("h3", 2)]);
    const plan = feasible(await three.backend.plan(requests, await snapshotOf(three.backend)));
    assert.notEqual(packWholeDevices(pairs, { h1: 2, h2: 2, h3: 2 }), null);
    const keys = Object.values(plan.assignments).flat().map(deviceKey);
    assert.equal(new Set(keys).size, 6, "six distinct devices");
    for (const devices of Object.values(plan.assignments)) {
      assert.equal(new Set(devices.map((d) => d.node)).size, 1, "every request on one host");
    }
    const tooBig = await two.backend.plan([request("big", 4)], await snapshotOf(two.backend));
    assert.match(
      tooBig.kind === "infeasible" ? tooBig.reasons.join(";") : "",
      /needs 4 .* most free .* is 3/,
    );
  });

  test(
    "ALLOC 35: a geometry that fits by slice count without legal starts is refused; every planned geometry is legal",
    async () => {
      const { backend, hooks } = await create([gpuNode("n1", 1, H100), gpuNode("n2", 2, H100)], {
        geometry: true,
      });
      const claim = await planAndReserve(backend, [slice("w", 10)], "op-1");
      const before = hooks.mutations().length;
      const crowded = "1g.10gb=1,3g.40gb=2";
      assert.ok(
        checkLayout(H100, parseLayoutText(crowded)).length > 0,
        "the oracle refuses it: 9 memory slices",
      );
      await assert.rejects(backend.reconcile(claim.claimId, crowded, claim.desiredGeneration), ConfigError);
      assert.equal(hooks.mutations().length, before);
      const seed = testSeed();
      const random = new SeededRandom(seed);
      for (let round = 0; round < 20; round++) {
        const asks = Array.from(
          { length: random.int(1, 6) },
          (_, i) => slice(`r${round}-${i}`, random.pick([5, 10, 15, 30, 60])),
        );
        const outcome = await backend.plan(asks, await snapshotOf(backend));
        if (outcome.kind === "infeasible") continue;
        for (const [node, layout] of Object.entries(outcome.geometry)) {
          assert.deepEqual(
            checkLayout(H100, parseLayoutText(layout)),
            [],
            `seed ${seed} round ${round}: ${node} ${layout}`,
          );
        }
      }
    },
    true,
  );

  test("ALLOC-023: a feature the version matrix lacks is refused by name before anything is written", async () => {
    const { backend, hooks } = await create([gpuNode("n1", 2)]);
    const features = backend.capabilities().versionMatrix.features as string[];
    const outcome = await backend.plan(
      [request("w", 1, { features: ["gpu-teleport"] })],
      await snapshotOf(backend),
    );
    assert.equal(outcome.kind, "infeasible");
    const reasons = outcome.kind === "infeasible" ? outcome.reasons.join(";") : "";
    assert.match(reasons, /request w needs feature gpu-teleport/);
    assert.ok(reasons.includes(`offers [${features.join(", ")}]`), reasons);
    const pair = await backend.plan(
      [request("m", 1, { sharing: "mps", features: ["dynamic-mig"] })],
      await snapshotOf(backend),
    );
    assert.match(pair.kind === "infeasible" ? pair.reasons.join(";") : "", /combines mps and dynamic-mig/);
    assert.equal(hooks.mutations().length, 0);
  });

  test("ALLOC 48: the grant a claim delivers reads back with its UUIDs, never as a count of integers", async () => {
    const { backend } = await create([gpuNode("n1", 4, A100, { zone: "a" })]);
    const claim = await planAndReserve(
      backend,
      [request("w", 2, { constraints: [constraint("zone", "In", ["a"])] })],
      "op-1",
    );
    assert.equal(claimOf(await backend.observe(claim.claimId)).status, "prepared");
    const bindings = await backend.bindings(claim.claimId, "w");
    const visible = bindings.env.CUDA_VISIBLE_DEVICES.split(",");
    assert.equal(visible.length, 2);
    for (const id of visible) assert.match(id, /^GPU-/);
    const grant = deliveredGrantFromDict(JSON.parse(bindings.env[GPU_GRANT_ENV]));
    assert.equal(grant.host, "observed");
    assert.equal(grant.requested, 2);
    assert.deepEqual(grant.devices.map((d) => d.uuid), visible);
  });

  test("ALLOC release: generation-fenced and idempotent; a lost reply reads unknown and the retry is safe", async () => {
    const { backend, hooks } = await create([gpuNode("n1", 2)]);
    const claim = await planAndReserve(backend, [request("w", 2)], "op-1");
    const before = hooks.mutations().length;
    const stale = await backend.release(claim.claimId, "op-1", "0");
    assert.equal(stale.status, "stale");
    assert.equal(hooks.mutations().length, before, "a stale release touches nothing");
    assert.equal((await backend.release("claim-nobody", "op-1", "1")).status, "absent");
    {
      using schedule = new FaultSchedule({ [Barrier.ownerUpdateAfter]: dropResponse() }).install();
      const lost = await backend.release(claim.claimId, "op-1", claim.desiredGeneration);
      schedule.assertAllFired();
      assert.equal(lost.status, "unknown");
    }
    const retry = await backend.release(claim.claimId, "op-1", claim.desiredGeneration);
    assert.equal(retry.status, "released");
    const free = await snapshotOf(backend);
    assert.equal(Object.values(free.occupancy).reduce((x, y) => x + y, 0), 0);
    assert.equal(claimOf(await backend.observe(claim.claimId)).status, "released");
  });

  test("ALLOC 3 (randomized): random reservation interleavings never double-book a device", async () => {
    const seed = testSeed();
    const random = new SeededRandom(seed);
    const { backend, hooks } = await create([gpuNode("n1", 4), gpuNode("n2", 4), gpuNode("n3", 2)]);
    const active = new Map<string, ClaimObservation>();
    let foreign = 0;
    const yieldRandomly = async () => {
      for (let i = random.int(0, 4); i > 0; i--) await Promise.resolve();
    };
    for (let round = 0; round < 40; round++) {
      const attempts = Array.from({ length: random.int(2, 5) }, async (_, i) => {
        await yieldRandomly();
        const snapshot = await snapshotOf(backend);
        await yieldRandomly();
        const outcome = await backend.plan([request(`w${round}-${i}`, random.int(1, 3))], snapshot);
        if (outcome.kind === "infeasible") return;
        await yieldRandomly();
        try {
          const claim = await backend.reserve(outcome, `op-${round}-${i}`, null);
          active.set(claim.claimId, claim);
        } catch (error) {
          if (!(error instanceof OwnershipConflict)) throw error;
        }
      });
      if (random.chance(0.3)) {
        const node = random.pick(["n1", "n2", "n3"]);
        try {
          hooks.bindWorkload(node, `foreign-${++foreign}`, 1);
        } catch (error) {
          if (!(error instanceof RangeError)) throw error;
        }
      }
      await Promise.all(attempts);
      const where = `seed ${seed} round ${round}`;
      const owners = new Map<string, string>();
      for (const [claimId] of active) {
        const observed = claimOf(await backend.observe(claimId));
        for (const device of observed.grant ?? []) {
          const key = deviceKey(device);
          assert.ok(!owners.has(key), `${where}: ${key} granted to ${owners.get(key)} and ${claimId}`);
          owners.set(key, claimId);
        }
      }
      const occupancy = (await snapshotOf(backend)).occupancy;
      for (const [key, units] of Object.entries(occupancy)) {
        assert.ok(units <= 1, `${where}: ${key} holds ${units}`);
      }
      for (const key of owners.keys()) {
        assert.equal(occupancy[key], 1, `${where}: ${key} is held in the inventory`);
      }
      for (const [claimId, claim] of active) {
        if (!random.chance(0.4)) continue;
        const released = await backend.release(claimId, claim.owner, claim.desiredGeneration);
        assert.equal(released.status, "released", where);
        active.delete(claimId);
      }
    }
  });
}
