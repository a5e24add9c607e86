/**
 * The in-memory AcceleratorAllocationBackend (spec backends.memory.allocation): a cluster of GPU nodes as
 * data, with the concurrency protocol every real adapter must honour. Modelled deliberately:
 *
 * - Reads can fail. `failReads("pods")` makes occupancy unreadable: the inventory is then `partial` with
 *   no occupancy, and a plan is `Infeasible("occupancy unknown")`, never "idle". `failReads("nodes")`
 *   makes the inventory itself Unknown, and every write refuses before it starts.
 * - Ownership is a server-side compare-and-swap. Every node carries a resource version; a write names the
 *   version it read and loses when a concurrent writer bumped it. Writers hit `owner.read.after`,
 *   `owner.update.before` and `owner.update.after`, so two reservers paused between read and write race
 *   exactly as two API clients would: one wins, the other gets OwnershipConflict with nothing mutated.
 * - Readiness is correlated with the operation. A node's MIG state carries the generation of the write
 *   it answers; a success recorded for an earlier geometry does not complete a newer write.
 * - Foreign and retained workloads hold devices, and geometry is never changed while any workload the
 *   model knows about uses the node.
 * - The shared MIG configuration is never deleted: the last owner out restores the cluster pointer and
 *   leaves a tombstoned, entry-less map, under compare-and-swap.
 * - Every write the backend issues is audited ({@link MemoryAllocationBackend.mutations}), so "the loser
 *   mutated nothing" is a list check.
 *
 * @example
 * ```ts
 * import { workloadRequest } from "../allocation.ts";
 * const cluster = new MemoryAllocationBackend([{ name: "n1", product: "NVIDIA-A100-SXM4-80GB", gpuCount: 2, memoryGib: 80 }]);
 * const snapshot = await cluster.inventory();
 * if (snapshot.kind === "known") {
 *   const request = workloadRequest({ flowId: "f", runId: "r", workloadId: "w", deviceCount: 2, sharing: "exclusive" });
 *   const plan = await cluster.plan([request], snapshot.value);
 *   if (plan.kind === "feasible") console.log((await cluster.reserve(plan, "op-1", null)).status); // "allocated"
 * }
 * ```
 *
 * @module
 */

import { ConfigError, OwnershipConflict, ResourceUnavailable, UnobservableState } from "../../core/errors.ts";
import {
  type AcceleratorAllocationBackend,
  type AllocationCapabilities,
  allocationCapabilities,
  claimHolder,
  type ClaimObservation,
  ClaimStatus,
  classifyNode,
  Completeness,
  deliveredGrantToDict,
  type DeviceIdentity,
  deviceIdentity,
  deviceKey,
  type FeasiblePlan,
  feasiblePlan,
  GfdLabel,
  GPU_GRANT_ENV,
  GrantHost,
  hardConstraintsHold,
  infeasible,
  type InventoryScope,
  type InventorySnapshot,
  layoutText,
  MemoryEnforcement,
  NodeSharing,
  ownershipConflict,
  packingShortfalls,
  parseLayoutText,
  type PlanOutcome,
  refusalBeforePlanning,
  type ReleaseObservation,
  ReleaseStatus,
  RequestSharing,
  softlyPreferred,
  type WorkloadBindings,
  type WorkloadRequest,
} from "../allocation.ts";
import { type Clock, systemClock } from "../clock.ts";
import { Barrier, barrier } from "../faults.ts";
import type { ObservationLog } from "../observation.ts";
import { known, type Observation, unknown, type UnknownReason } from "../outcomes.ts";
import { checkLayout, familyFor, type MigLayout, placeLayout, smallestProfile } from "./mig_geometry.ts";

const GIB = 2 ** 30;

/** Which real adapter a memory backend stands in for: it decides the capabilities and whether geometry can change. */
export const AllocationAuthority = {
  devicePlugin: "device-plugin",
  managedMig: "managed-mig",
  dra: "dra",
  local: "local",
} as const;
/** One of {@link AllocationAuthority}. */
export type AllocationAuthority = typeof AllocationAuthority[keyof typeof AllocationAuthority];

/** What the MIG manager reports on a node (`nvidia.com/mig.config.state`). */
export const MigState = { success: "success", pending: "pending", failed: "failed" } as const;
/** One of {@link MigState}. */
export type MigState = typeof MigState[keyof typeof MigState];

/** The reads {@link MemoryAllocationBackend.failReads} can make fail. */
export const ReadKind = { nodes: "nodes", pods: "pods", config: "config" } as const;
/** One of {@link ReadKind}. */
export type ReadKind = typeof ReadKind[keyof typeof ReadKind];

/** The MIG config name meaning "MIG off". */
export const MIG_DISABLED = "all-disabled";
/** The shared MIG configuration map videoflow writes its entries into. */
export const SHARED_CONFIG_NAME = "videoflow-mig-config";
/** The cluster pointer's value before videoflow ever pointed it at {@link SHARED_CONFIG_NAME}. */
export const DEFAULT_POINTER = "default-mig-parted-config";

/** One GPU node as a test describes it; only the first four fields are required. */
export interface NodeFixture {
  readonly name: string;
  readonly product: string;
  readonly gpuCount: number;
  /** Memory of one whole GPU, in GiB. */
  readonly memoryGib: number;
  /** GPU Feature Discovery labels. */
  readonly labels?: Readonly<Record<string, string>>;
  /** The claim videoflow stamped on the node, if any. */
  readonly owner?: string | null;
  readonly ownerEpoch?: string | null;
  readonly resourceVersion?: number;
  /** The MIG config the node's label asks for (applied, for a fixture). */
  readonly migConfig?: string;
  readonly migState?: MigState;
  /** The geometry write generation `migState` answers. */
  readonly migStateGeneration?: number;
  /** The applied layout of every GPU on the node (profile → instances per GPU). */
  readonly migLayout?: MigLayout;
  /** Foreign workloads: id → devices they hold. */
  readonly workloads?: Readonly<Record<string, number>>;
  /** The MIG config to restore when videoflow's owner leaves. */
  readonly restoreRecord?: string | null;
}

/** One audited write: what kind of object, which one, which field, the new value and who wrote it. */
export interface AllocationMutation {
  readonly kind: "node" | "config" | "pointer" | "claim";
  readonly target: string;
  readonly field: string;
  readonly value: string;
  readonly operation: string;
}

/** The shared MIG configuration map as read back. */
export interface SharedMigConfig {
  readonly entries: Readonly<Record<string, MigLayout>>;
  readonly version: number;
  readonly tombstoned: boolean;
}

/** Options of a {@link MemoryAllocationBackend}. */
export interface MemoryAllocationOptions {
  readonly clock?: Clock;
  readonly authority?: AllocationAuthority;
  /** Clock delay before a geometry write is applied (0: on the next inventory or observe). */
  readonly migApplySeconds?: number;
  readonly log?: ObservationLog | null;
}

/**
 * Exhaustive per-host packing for small inventories, the independent oracle for "aggregate capacity
 * hides per-host fragmentation": each request needs `count` whole devices on one host. Returns workload
 * → host, or null when no assignment exists. `eligible` narrows the hosts a workload may take (absent:
 * any); `preferred` hosts are tried first.
 */
export function packWholeDevices(
  requests: readonly (readonly [string, number])[],
  free: Readonly<Record<string, number>>,
  eligible?: Readonly<Record<string, ReadonlySet<string>>>,
  preferred?: Readonly<Record<string, ReadonlySet<string>>>,
): Record<string, string> | null {
  const hosts = Object.keys(free).sort();
  const order = [...requests].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
  const left: Record<string, number> = { ...free };
  const chosen: Record<string, string> = {};
  const search = (index: number): boolean => {
    if (index === order.length) return true;
    const [workload, count] = order[index];
    const allowed = hosts.filter((h) => eligible?.[workload]?.has(h) ?? true);
    const first = preferred?.[workload];
    const tries = first
      ? [...allowed.filter((h) => first.has(h)), ...allowed.filter((h) => !first.has(h))]
      : allowed;
    for (const host of tries) {
      if (left[host] < count) continue;
      left[host] -= count;
      chosen[workload] = host;
      if (search(index + 1)) return true;
      left[host] += count;
      delete chosen[workload];
    }
    return false;
  };
  return search(0) ? chosen : null;
}

interface Workload {
  readonly units: number;
  readonly foreign: boolean;
  running: boolean;
}

interface GeometryWrite {
  readonly generation: number;
  readonly config: string;
  readonly layout: MigLayout;
  readonly dueAt: number;
}

interface NodeState {
  readonly name: string;
  readonly product: string;
  readonly gpuCount: number;
  readonly memoryGib: number;
  readonly labels: Readonly<Record<string, string>>;
  owner: string | null;
  ownerEpoch: string | null;
  resourceVersion: number;
  migConfig: string;
  migState: MigState;
  migStateGeneration: number;
  applied: { readonly config: string; readonly layout: MigLayout; readonly generation: number };
  lastWrite: number;
  pending: GeometryWrite | null;
  geometryFails: boolean;
  restoreRecord: string | null;
  /** Holder id → workload; a claim's holders are `<claim>#<workload>`. */
  readonly workloads: Map<string, Workload>;
  /** Device key → holder ids, one unit each. */
  readonly holds: Map<string, string[]>;
}

/** The node fields a geometry write changes, as a rollback puts them back. */
type GeometryFields = Pick<NodeState, "owner" | "ownerEpoch" | "migConfig" | "pending" | "restoreRecord">;

function geometryFields(n: NodeState): GeometryFields {
  return {
    owner: n.owner,
    ownerEpoch: n.ownerEpoch,
    migConfig: n.migConfig,
    pending: n.pending,
    restoreRecord: n.restoreRecord,
  };
}

/** What a writer read of a node: the version its write will name, and the state it decides on. */
interface NodeRead {
  readonly name: string;
  readonly version: number;
  readonly owner: string | null;
  readonly devices: readonly DeviceIdentity[];
  readonly holds: ReadonlyMap<string, readonly string[]>;
  readonly workloads: ReadonlyMap<string, Readonly<Workload>>;
}

/** One node write of a transaction: what it changes, and how to take it back. */
interface NodeWrite {
  readonly changes: readonly (readonly [field: string, value: string])[];
  readonly apply: (node: NodeState) => void;
  /**
   * Takes back this write's own effects on the node as it is now, touching nothing a newer writer owns;
   * false when nothing of it was left to take back.
   */
  readonly undo: (node: NodeState) => boolean;
}

interface Claim {
  readonly claimId: string;
  readonly owner: string;
  readonly requests: ReadonlyMap<string, WorkloadRequest>;
  readonly assignments: Readonly<Record<string, readonly DeviceIdentity[]>>;
  generation: number;
  /** Node → the layout text the claim wants there. */
  geometry: Record<string, string>;
  /** Node → the geometry write generation the claim made there. */
  writes: Record<string, number>;
  /** The newest claim generation whose writes were all answered. */
  answered: number | null;
  phase: "active" | "retained" | "released";
  ready: boolean;
}

interface PlanRecord {
  readonly requests: ReadonlyMap<string, WorkloadRequest>;
}

const CAPABILITIES: Readonly<
  Record<AllocationAuthority, Omit<AllocationCapabilities, "adapter" | "authority">>
> = {
  "device-plugin": {
    exclusiveDevice: true,
    isolatedMig: true,
    cooperativeSharing: false,
    memoryEnforcement: MemoryEnforcement.scheduler,
    multiDevice: true,
    topologyVerification: false,
    elastic: false,
    admissionBoundary: false,
    versionMatrix: { version: "memory-device-plugin/1", features: [] },
  },
  "managed-mig": {
    exclusiveDevice: true,
    isolatedMig: true,
    cooperativeSharing: false,
    memoryEnforcement: MemoryEnforcement.hardware,
    multiDevice: true,
    topologyVerification: false,
    elastic: false,
    admissionBoundary: true,
    versionMatrix: { version: "memory-managed-mig/1", features: ["dynamic-mig"] },
  },
  dra: {
    exclusiveDevice: true,
    isolatedMig: true,
    cooperativeSharing: true,
    memoryEnforcement: MemoryEnforcement.scheduler,
    multiDevice: true,
    topologyVerification: true,
    elastic: false,
    admissionBoundary: true,
    versionMatrix: { version: "memory-dra/1", features: ["consumable-capacity"] },
  },
  local: {
    exclusiveDevice: true,
    isolatedMig: false,
    cooperativeSharing: false,
    memoryEnforcement: MemoryEnforcement.scheduler,
    multiDevice: true,
    topologyVerification: true,
    elastic: false,
    admissionBoundary: false,
    versionMatrix: { version: "memory-local/1", features: [] },
  },
};

function gpuUuid(node: string, ordinal: number): string {
  return `GPU-${node}-${ordinal}`;
}

function devicesOf(n: NodeState): DeviceIdentity[] {
  const out: DeviceIdentity[] = [];
  const mig = n.applied.config !== MIG_DISABLED;
  const placements = mig ? placeLayout(n.product, n.applied.layout) ?? [] : [];
  const profiles = familyFor(n.product)?.profiles ?? {};
  for (let ordinal = 0; ordinal < n.gpuCount; ordinal++) {
    const base = { node: n.name, ordinal, uuid: gpuUuid(n.name, ordinal), product: n.product };
    if (!mig) {
      out.push(deviceIdentity({ ...base, migUuid: null, memoryBytes: Math.round(n.memoryGib * GIB) }));
      continue;
    }
    for (const placement of placements) {
      out.push(deviceIdentity({
        ...base,
        migUuid: `MIG-${n.name}-${ordinal}-g${n.applied.generation}-s${placement.start}`,
        memoryBytes: Math.round(profiles[placement.profile].memoryGib * GIB),
        migProfile: placement.profile,
      }));
    }
  }
  return out;
}

function capacityOf(n: NodeState): number {
  const sharing = classifyNode(n.labels, n.gpuCount, n.applied.config !== MIG_DISABLED);
  const shared = sharing === NodeSharing.timeSliced || sharing === NodeSharing.mps;
  return shared ? Math.max(1, Number(n.labels[GfdLabel.replicas] ?? "1") || 1) : 1;
}

/** The shared-config entry name of a claim's geometry on one node at its current generation. */
function configName(claim: { readonly claimId: string; readonly generation: number }, node: string): string {
  return `vf-${claim.claimId}-${node}-g${claim.generation}`;
}

/** Per-plan bookkeeping of free units, so one plan never hands a unit out twice. */
class PlanPool {
  readonly used = new Map<string, number>();
  readonly geometryNodes = new Map<string, Record<string, number>>();
  readonly wholeNodes = new Set<string>();

  constructor(
    readonly snapshot: InventorySnapshot,
    readonly capacity: (node: string) => number,
  ) {}

  freeUnits(device: DeviceIdentity): number {
    const key = deviceKey(device);
    return this.capacity(device.node ?? "") - (this.snapshot.occupancy[key] ?? 0) - (this.used.get(key) ?? 0);
  }

  take(device: DeviceIdentity): void {
    const key = deviceKey(device);
    this.used.set(key, (this.used.get(key) ?? 0) + 1);
  }

  nodeIdle(node: string): boolean {
    return this.snapshot.devices.every((d) =>
      d.node !== node || (this.snapshot.occupancy[deviceKey(d)] ?? 0) === 0
    );
  }
}

/** A cluster of GPU nodes as data; see the module documentation for what it models. */
export class MemoryAllocationBackend implements AcceleratorAllocationBackend {
  readonly #clock: Clock;
  readonly #authority: AllocationAuthority;
  readonly #migApplySeconds: number;
  readonly #log: ObservationLog | null;
  readonly #nodes = new Map<string, NodeState>();
  readonly #claims = new Map<string, Claim>();
  readonly #plans = new Map<string, PlanRecord>();
  readonly #failing = new Map<ReadKind, UnknownReason>();
  readonly #mutations: AllocationMutation[] = [];
  readonly #config = { entries: new Map<string, MigLayout>(), version: 1, tombstoned: false };
  readonly #pointer = { value: DEFAULT_POINTER, version: 1, original: null as string | null };
  #version = 1;
  #planCounter = 0;

  /** Throws {@link ConfigError} for duplicate node names or foreign workloads that do not fit their node. */
  constructor(nodes: readonly NodeFixture[], options: MemoryAllocationOptions = {}) {
    this.#clock = options.clock ?? systemClock;
    this.#authority = options.authority ?? AllocationAuthority.devicePlugin;
    this.#migApplySeconds = options.migApplySeconds ?? 0;
    this.#log = options.log ?? null;
    for (const fixture of nodes) {
      if (this.#nodes.has(fixture.name)) throw new ConfigError(`duplicate node ${fixture.name}`);
      const migConfig = fixture.migConfig ?? MIG_DISABLED;
      const generation = fixture.migStateGeneration ?? 0;
      const state: NodeState = {
        name: fixture.name,
        product: fixture.product,
        gpuCount: fixture.gpuCount,
        memoryGib: fixture.memoryGib,
        labels: Object.freeze({ ...(fixture.labels ?? {}) }),
        owner: fixture.owner ?? null,
        ownerEpoch: fixture.ownerEpoch ?? null,
        resourceVersion: fixture.resourceVersion ?? 1,
        migConfig,
        migState: fixture.migState ?? MigState.success,
        migStateGeneration: generation,
        applied: { config: migConfig, layout: Object.freeze({ ...(fixture.migLayout ?? {}) }), generation },
        lastWrite: generation,
        pending: null,
        geometryFails: false,
        restoreRecord: fixture.restoreRecord ?? null,
        workloads: new Map(),
        holds: new Map(),
      };
      this.#nodes.set(fixture.name, state);
      for (const [id, units] of Object.entries(fixture.workloads ?? {}).sort()) {
        this.#holdForeign(state, id, units);
      }
    }
  }

  // ----- the contract -----

  capabilities(environment: Readonly<Record<string, unknown>> = {}): AllocationCapabilities {
    const base = CAPABILITIES[this.#authority];
    const matrix: Record<string, unknown> = { ...base.versionMatrix };
    if (typeof environment.version === "string") matrix.version = environment.version;
    if (Array.isArray(environment.features)) matrix.features = [...environment.features];
    return allocationCapabilities({
      ...base,
      adapter: "memory",
      authority: this.#authority,
      versionMatrix: matrix,
    });
  }

  inventory(scope: InventoryScope = {}): Promise<Observation<InventorySnapshot>> {
    return Promise.try(() => {
      const nodesFailed = this.#failing.get(ReadKind.nodes);
      if (nodesFailed !== undefined) {
        return unknown(nodesFailed, this.#clock, "the node listing failed");
      }
      this.#applyDue();
      const chosen = [...this.#nodes.values()].filter((n) =>
        (scope.nodes === undefined || scope.nodes.includes(n.name)) &&
        Object.entries(scope.labels ?? {}).every(([k, v]) => n.labels[k] === v)
      );
      const podsReadable = !this.#failing.has(ReadKind.pods);
      const devices: DeviceIdentity[] = [];
      const occupancy: Record<string, number> = {};
      const sharing: Record<string, NodeSharing> = {};
      const owners: Record<string, string> = {};
      for (const n of chosen) {
        devices.push(...devicesOf(n));
        sharing[n.name] = classifyNode(n.labels, n.gpuCount, n.applied.config !== MIG_DISABLED);
        if (n.owner !== null) owners[n.name] = n.owner;
        if (podsReadable) { for (const [key, holders] of n.holds) occupancy[key] = holders.length; }
      }
      return known<InventorySnapshot>(
        Object.freeze({
          devices: Object.freeze(devices),
          occupancy: Object.freeze(occupancy),
          sharing: Object.freeze(sharing),
          owners: Object.freeze(owners),
          completeness: podsReadable ? Completeness.complete : Completeness.partial,
          observedAt: this.#clock.monotonic(),
          generation: String(this.#version),
        }),
        this.#clock,
        String(this.#version),
      );
    });
  }

  plan(requests: readonly WorkloadRequest[], snapshot: InventorySnapshot): Promise<PlanOutcome> {
    return Promise.try(() => {
      const refused = refusalBeforePlanning(requests, this.capabilities(), snapshot);
      if (refused !== null) return refused;
      const pool = new PlanPool(
        snapshot,
        (node) => this.#nodes.get(node) ? capacityOf(this.#nodes.get(node)!) : 1,
      );
      const reasons: string[] = [];
      const assignments: Record<string, DeviceIdentity[]> = {};
      const notes: string[] = [];
      this.#planWhole(
        requests.filter((r) => r.sharing === RequestSharing.exclusive),
        pool,
        assignments,
        reasons,
      );
      for (const request of requests.filter((r) => r.sharing === RequestSharing.mig)) {
        this.#planSlice(request, pool, assignments, reasons);
      }
      for (const request of requests) {
        if (request.sharing === RequestSharing.timeSliced || request.sharing === RequestSharing.mps) {
          this.#planShare(request, pool, assignments, reasons);
        }
      }
      if (reasons.length > 0) return infeasible(reasons);
      const geometry: Record<string, string> = {};
      for (const [node, demand] of pool.geometryNodes) {
        const layout = this.#perGpuLayout(this.#nodes.get(node)!, demand);
        geometry[node] = layoutText(layout);
        notes.push(
          `node ${node}: MIG geometry ${geometry[node]} would replace ${this.#nodes.get(node)!.migConfig}`,
        );
      }
      const planId = `plan-${++this.#planCounter}`;
      this.#plans.set(planId, { requests: new Map(requests.map((r) => [r.workloadId, r])) });
      return feasiblePlan({ assignments, geometry, snapshotGeneration: snapshot.generation, planId, notes });
    });
  }

  async reserve(
    plan: FeasiblePlan,
    operationId: string,
    expectedGeneration: string | null,
  ): Promise<ClaimObservation> {
    const record = this.#plans.get(plan.planId);
    if (record === undefined) {
      throw new ConfigError(
        `plan ${plan.planId} was not made by this backend`,
        "plan on this backend's inventory",
      );
    }
    const claimId = `claim-${plan.planId}`;
    const existing = this.#claims.get(claimId);
    if (existing !== undefined) {
      const same = existing.owner === operationId && existing.phase === "active" &&
        (expectedGeneration === null || expectedGeneration === String(existing.generation));
      if (!same) {
        throw ownershipConflict(
          `claim ${claimId} already exists, owned by ${existing.owner} at generation ${existing.generation}`,
          {
            claim_id: claimId,
          },
        );
      }
      return this.#observation(existing);
    }
    if (expectedGeneration !== null) {
      throw ownershipConflict(`claim ${claimId} does not exist at generation ${expectedGeneration}`, {
        claim_id: claimId,
      });
    }
    const byNode = new Map<string, { workload: string; device: DeviceIdentity }[]>();
    for (const [workload, devices] of Object.entries(plan.assignments)) {
      for (const device of devices) {
        const node = device.node ?? "";
        byNode.set(node, [...(byNode.get(node) ?? []), { workload, device }]);
      }
    }
    const geometryNodes = Object.keys(plan.geometry);
    const configRead = geometryNodes.length > 0 ? this.#readConfig() : null;
    const claim: Claim = {
      claimId,
      owner: operationId,
      requests: record.requests,
      assignments: plan.assignments,
      generation: 1,
      geometry: { ...plan.geometry },
      writes: {},
      answered: null,
      phase: "active",
      ready: false,
    };
    const nodes = [...new Set([...byNode.keys(), ...geometryNodes])].sort();
    const lost = await this.#transact(
      operationId,
      nodes,
      (reads) => {
        const writes = new Map<string, NodeWrite>();
        for (const read of reads) {
          const geometry = plan.geometry[read.name];
          const placed = byNode.get(read.name) ?? [];
          if (read.owner !== null) {
            throw ownershipConflict(`node ${read.name} is owned by ${read.owner}`, { node: read.name });
          }
          if (geometry !== undefined) {
            const users = this.#usersBlockingGeometry(read, claimId);
            if (users.length > 0) {
              throw ownershipConflict(
                `node ${read.name} is in use by ${users.join(", ")}: its geometry cannot change`,
                {
                  node: read.name,
                },
              );
            }
            writes.set(read.name, this.#geometryWrite(read, claim, geometry, true));
            continue;
          }
          const capacity = capacityOf(this.#nodes.get(read.name)!);
          const keys = placed.map(({ device }) => deviceKey(device));
          for (const [i, key] of keys.entries()) {
            const taken = (read.holds.get(key)?.length ?? 0) +
              keys.slice(0, i).filter((k) => k === key).length;
            if (!read.devices.some((d) => deviceKey(d) === key) || taken >= capacity) {
              throw ownershipConflict(`device ${key} on ${read.name} is no longer free`, {
                node: read.name,
                device: key,
              });
            }
          }
          writes.set(read.name, this.#holdWrite(claimId, placed));
        }
        return writes;
      },
      () =>
        configRead === null ? Promise.resolve() : this.#writeConfig(operationId, configRead, claim, nodes),
    );
    this.#claims.set(claimId, claim);
    this.#log?.emit("claim", { op_id: operationId, claim_uid: claimId, status: "reserved" });
    return lost ? this.#lostReply(claim) : this.#allocated(claim);
  }

  observe(claimId: string): Promise<Observation<ClaimObservation>> {
    return Promise.try(() => {
      const failed = this.#failing.get(ReadKind.nodes);
      if (failed !== undefined) return unknown(failed, this.#clock, "the node listing failed");
      const claim = this.#claims.get(claimId);
      if (claim === undefined) {
        return unknown("missing", this.#clock, `no claim ${claimId} was reserved here`);
      }
      this.#applyDue();
      return known(this.#observation(claim), this.#clock, String(claim.generation));
    });
  }

  async reconcile(claimId: string, desired: string, expectedGeneration: string): Promise<ClaimObservation> {
    const claim = this.#requireClaim(claimId);
    if (String(claim.generation) !== expectedGeneration || claim.phase !== "active") {
      throw ownershipConflict(
        `claim ${claimId} is at generation ${claim.generation} (${claim.phase}), not ${expectedGeneration}`,
        { claim_id: claimId },
      );
    }
    const nodes = Object.keys(claim.geometry).sort();
    if (nodes.length === 0) {
      throw new ConfigError(
        `claim ${claimId} manages no MIG geometry`,
        "reconcile only claims whose plan changed geometry",
      );
    }
    const layout = parseLayoutText(desired);
    const problems = nodes.flatMap((node) => this.#geometryProblems(claim, node, layout));
    if (problems.length > 0) {
      throw new ConfigError(
        `desired geometry ${desired} is not legal: ${problems.join("; ")}`,
        "fix the layout",
      );
    }
    const configRead = this.#readConfig();
    const refused: string[] = [];
    const next: Claim = {
      ...claim,
      generation: claim.generation + 1,
      writes: { ...claim.writes },
      geometry: Object.fromEntries(nodes.map((node) => [node, desired])),
    };
    const lost = await this.#transact(
      claim.owner,
      nodes,
      (reads) => {
        const writes = new Map<string, NodeWrite>();
        for (const read of reads) {
          if (read.owner !== claimId) {
            throw ownershipConflict(`node ${read.name} is no longer owned by ${claimId}`, {
              node: read.name,
            });
          }
          const users = this.#usersBlockingGeometry(read, claimId);
          if (users.length > 0) {
            refused.push(`node ${read.name}: geometry kept, in use by ${users.join(", ")}`);
          } else writes.set(read.name, this.#geometryWrite(read, next, desired, false));
        }
        return refused.length > 0 ? new Map() : writes;
      },
      () => refused.length > 0 ? Promise.resolve() : this.#writeConfig(claim.owner, configRead, next, nodes),
    );
    if (refused.length > 0) {
      return Object.freeze({
        ...this.#observation(claim),
        evidence: Object.freeze({ ...this.#evidence(claim), refused: Object.freeze(refused) }),
      });
    }
    claim.generation = next.generation;
    claim.writes = next.writes;
    claim.geometry = next.geometry;
    return lost ? this.#lostReply(claim) : this.#observation(claim);
  }

  async release(
    claimId: string,
    operationId: string,
    expectedGeneration: string,
    keepWorkloads = false,
  ): Promise<ReleaseObservation> {
    const claim = this.#claims.get(claimId);
    const answer = (
      status: ReleaseObservation["status"],
      reason: string,
      remaining: readonly string[] = [],
    ) => Object.freeze({ claimId, status, remaining: Object.freeze([...remaining]), reason });
    if (claim === undefined) return answer(ReleaseStatus.absent, `no claim ${claimId} was reserved here`);
    if (claim.phase === "released") return answer(ReleaseStatus.released, "already released");
    if (String(claim.generation) !== expectedGeneration) {
      return answer(
        ReleaseStatus.stale,
        `claim is at generation ${claim.generation}, not ${expectedGeneration}`,
      );
    }
    const held = Object.keys(claim.assignments).sort();
    if (keepWorkloads) {
      claim.phase = "retained";
      this.#audit("claim", claimId, "phase", "retained", operationId);
      return answer(
        ReleaseStatus.retained,
        "workloads kept: their devices stay held until a later release",
        held,
      );
    }
    const failed = this.#failing.get(ReadKind.nodes) ??
      (Object.keys(claim.geometry).length > 0 ? this.#failing.get(ReadKind.config) : undefined);
    if (failed !== undefined) {
      return answer(ReleaseStatus.unknown, `a read failed (${failed}); nothing was released`);
    }
    const remaining: string[] = [];
    const nodes = this.#claimNodes(claim);
    let lost: boolean;
    try {
      lost = await this.#transact(operationId, nodes, (reads) => {
        const writes = new Map<string, NodeWrite>();
        for (const read of reads) {
          const ownsGeometry = claim.geometry[read.name] !== undefined && read.owner === claimId;
          const blocked = ownsGeometry && this.#usersBlockingGeometry(read, claimId).length > 0;
          if (claim.geometry[read.name] !== undefined && !ownsGeometry) {
            remaining.push(`${read.name}: owned by ${read.owner}`);
          }
          if (blocked) remaining.push(`${read.name}: geometry kept, workloads still run`);
          writes.set(read.name, this.#releaseWrite(read, claim, ownsGeometry && !blocked));
        }
        return writes;
      });
    } catch (error) {
      if (error instanceof OwnershipConflict) return answer(ReleaseStatus.unknown, error.message);
      throw error;
    }
    await this.#dropConfigEntries(operationId, claim);
    claim.phase = "released";
    this.#log?.emit("claim", { op_id: operationId, claim_uid: claimId, status: "released" });
    if (lost) {
      return answer(ReleaseStatus.unknown, "the release reply was lost; observe to confirm", remaining);
    }
    return answer(
      ReleaseStatus.released,
      remaining.length > 0 ? "released; some geometry was kept" : "",
      remaining,
    );
  }

  bindings(claimId: string, workloadId: string): Promise<WorkloadBindings> {
    return Promise.try(() => {
      const claim = this.#requireClaim(claimId);
      const request = claim.requests.get(workloadId);
      if (request === undefined) throw new ConfigError(`claim ${claimId} has no workload ${workloadId}`);
      this.#applyDue();
      const observation = this.#observation(claim);
      if (observation.grant === null) {
        throw new ResourceUnavailable(
          `claim ${claimId} is ${observation.status}: no grant to bind ${workloadId} to yet`,
          "observe the claim until it is prepared",
          { claim_id: claimId },
        );
      }
      const devices = this.#grantOf(claim, workloadId) ?? [];
      const node = devices[0]?.node ?? "";
      const grant = deliveredGrantToDict({
        workloadId,
        devices,
        exclusive: request.sharing === RequestSharing.exclusive || request.sharing === RequestSharing.mig,
        requested: request.deviceCount,
        policy: request.sharing,
        host: GrantHost.observed,
      });
      const resource = devices[0]?.migProfile ? `nvidia.com/mig-${devices[0].migProfile}` : "nvidia.com/gpu";
      const selector = { "kubernetes.io/hostname": node };
      const claimManifests = this.#authority === AllocationAuthority.dra
        ? [{
          apiVersion: "resource.k8s.io/v1beta1",
          kind: "ResourceClaim",
          metadata: { name: `${claimId}-${workloadId}` },
          spec: {
            devices: {
              requests: [{ name: workloadId, deviceClassName: "gpu.nvidia.com", count: devices.length }],
            },
          },
        }]
        : [];
      return Object.freeze({
        env: Object.freeze({
          CUDA_VISIBLE_DEVICES: devices.map((d) => d.migUuid ?? d.uuid ?? String(d.ordinal)).join(","),
          [GPU_GRANT_ENV]: JSON.stringify(grant),
        }),
        podFragment: Object.freeze({ nodeSelector: selector }),
        containerFragment: Object.freeze({ resources: { limits: { [resource]: String(devices.length) } } }),
        claimManifests: Object.freeze(claimManifests),
        nodeConstraints: Object.freeze({ nodeSelector: selector }),
      });
    });
  }

  // ----- test hooks: the world changing under the backend -----

  /** Makes reads of `kind` fail with `reason` until called again with `null`. */
  failReads(kind: ReadKind, reason: UnknownReason | null = "timeout"): void {
    if (reason === null) this.#failing.delete(kind);
    else this.#failing.set(kind, reason);
  }

  /** Makes every geometry write on `node` end in `failed` (a permanent preparation failure). */
  failGeometry(node: string): void {
    this.#node(node).geometryFails = true;
  }

  /** Applies every geometry write whose clock delay has elapsed (what the MIG manager does). */
  applyPendingGeometry(): void {
    this.#applyDue();
  }

  /**
   * A workload now runs on `node`: one of a claim's workloads (its held devices are now in use), or a
   * foreign one taking `units` free devices. Either bumps the node's version, as a scheduled pod does.
   * Throws RangeError when a foreign workload does not fit.
   */
  bindWorkload(node: string, workloadId: string, units: number): void {
    const n = this.#node(node);
    const own = [...n.workloads.keys()].find((holder) => holder.endsWith(`#${workloadId}`));
    if (own !== undefined) n.workloads.get(own)!.running = true;
    else this.#holdForeign(n, workloadId, units);
    this.#touch(n);
  }

  /** The workload stopped: a claim's workload keeps its devices held; a foreign one frees them. */
  unbindWorkload(node: string, workloadId: string): void {
    const n = this.#node(node);
    const own = [...n.workloads.keys()].find((holder) => holder.endsWith(`#${workloadId}`));
    if (own !== undefined) n.workloads.get(own)!.running = false;
    else if (n.workloads.delete(workloadId)) this.#dropHolder(n, workloadId);
    this.#touch(n);
  }

  /** The claim's workload reported itself application-ready. */
  markWorkloadReady(claimId: string): void {
    this.#requireClaim(claimId).ready = true;
  }

  /** Every audited write, oldest first; only those of `kinds` when given. */
  mutations(kinds?: readonly AllocationMutation["kind"][]): AllocationMutation[] {
    return this.#mutations.filter((m) => kinds === undefined || kinds.includes(m.kind));
  }

  /** The node's current state, in fixture form. */
  node(name: string): Required<NodeFixture> {
    const n = this.#node(name);
    const foreign = [...n.workloads].filter(([, w]) => w.foreign).map(([id, w]) => [id, w.units]);
    return Object.freeze({
      name: n.name,
      product: n.product,
      gpuCount: n.gpuCount,
      memoryGib: n.memoryGib,
      labels: n.labels,
      owner: n.owner,
      ownerEpoch: n.ownerEpoch,
      resourceVersion: n.resourceVersion,
      migConfig: n.migConfig,
      migState: n.migState,
      migStateGeneration: n.migStateGeneration,
      migLayout: n.applied.layout,
      workloads: Object.freeze(Object.fromEntries(foreign)),
      restoreRecord: n.restoreRecord,
    });
  }

  /** Where the cluster's MIG manager is pointed. */
  pointer(): string {
    return this.#pointer.value;
  }

  /** The shared MIG configuration map as it stands. */
  sharedConfig(): SharedMigConfig {
    return Object.freeze({
      entries: Object.freeze(Object.fromEntries(this.#config.entries)),
      version: this.#config.version,
      tombstoned: this.#config.tombstoned,
    });
  }

  // ----- internals -----

  #node(name: string): NodeState {
    const n = this.#nodes.get(name);
    if (n === undefined) throw new ConfigError(`no node ${name} in this cluster`);
    return n;
  }

  #requireClaim(claimId: string): Claim {
    const claim = this.#claims.get(claimId);
    if (claim === undefined) throw new ConfigError(`no claim ${claimId} was reserved here`);
    return claim;
  }

  #touch(n: NodeState): void {
    n.resourceVersion++;
    this.#version++;
  }

  #audit(
    kind: AllocationMutation["kind"],
    target: string,
    field: string,
    value: string,
    operation: string,
  ): void {
    this.#mutations.push(Object.freeze({ kind, target, field, value, operation }));
  }

  #holdForeign(n: NodeState, id: string, units: number): void {
    const capacity = capacityOf(n);
    const free = devicesOf(n).map(deviceKey).filter((key) => (n.holds.get(key)?.length ?? 0) < capacity);
    if (!Number.isSafeInteger(units) || units < 1 || free.length < units || n.workloads.has(id)) {
      throw new RangeError(`workload ${id} cannot take ${units} device(s) on ${n.name}: ${free.length} free`);
    }
    for (const key of free.slice(0, units)) n.holds.set(key, [...(n.holds.get(key) ?? []), id]);
    n.workloads.set(id, { units, foreign: true, running: true });
  }

  #dropHolder(n: NodeState, holder: string): void {
    for (const [key, holders] of n.holds) {
      const kept = holders.filter((h) => h !== holder);
      if (kept.length > 0) n.holds.set(key, kept);
      else n.holds.delete(key);
    }
  }

  #readNode(name: string): NodeRead {
    const failed = this.#failing.get(ReadKind.nodes);
    if (failed !== undefined) {
      throw new UnobservableState(
        `node ${name} could not be read (${failed})`,
        "retry once the API answers",
        {
          node: name,
        },
      );
    }
    const n = this.#node(name);
    return Object.freeze({
      name,
      version: n.resourceVersion,
      owner: n.owner,
      devices: devicesOf(n),
      holds: new Map([...n.holds].map(([k, v]) => [k, [...v]])),
      workloads: new Map([...n.workloads].map(([k, v]) => [k, { ...v }])),
    });
  }

  #readConfig(): { readonly version: number; readonly pointerVersion: number } {
    const failed = this.#failing.get(ReadKind.config);
    if (failed !== undefined) {
      throw new UnobservableState(
        `the shared MIG configuration could not be read (${failed})`,
        "retry once it can be read",
      );
    }
    return { version: this.#config.version, pointerVersion: this.#pointer.version };
  }

  /**
   * Reads every node (hitting owner.read.after), lets `decide` validate and build the writes, then writes
   * node by node under compare-and-swap (owner.update.before / .after), then runs `finish` (the shared
   * configuration's own CAS). A lost race rolls back what this call wrote, never what a newer writer
   * did, and throws OwnershipConflict. Returns whether any write's reply was dropped.
   */
  async #transact(
    operationId: string,
    nodes: readonly string[],
    decide: (reads: readonly NodeRead[]) => Map<string, NodeWrite>,
    finish: () => Promise<void> = () => Promise.resolve(),
  ): Promise<boolean> {
    const reads: NodeRead[] = [];
    for (const name of nodes) {
      reads.push(this.#readNode(name));
      await barrier(Barrier.ownerReadAfter, { node: name, op_id: operationId });
    }
    const writes = decide(reads);
    const done: { name: string; write: NodeWrite }[] = [];
    let lost = false;
    for (const read of reads) {
      const write = writes.get(read.name);
      if (write === undefined) continue;
      await barrier(Barrier.ownerUpdateBefore, { node: read.name, op_id: operationId });
      const n = this.#node(read.name);
      if (n.resourceVersion !== read.version) {
        this.#rollback(operationId, done);
        throw ownershipConflict(
          `node ${read.name} changed (version ${read.version} → ${n.resourceVersion}) before the write landed`,
          { node: read.name, op_id: operationId },
        );
      }
      write.apply(n);
      this.#touch(n);
      for (const [field, value] of write.changes) this.#audit("node", read.name, field, value, operationId);
      done.push({ name: read.name, write });
      const hit = await barrier(Barrier.ownerUpdateAfter, { node: read.name, op_id: operationId });
      lost ||= hit.dropResponse;
    }
    try {
      await finish();
    } catch (error) {
      if (error instanceof OwnershipConflict) this.#rollback(operationId, done);
      throw error;
    }
    return lost;
  }

  #rollback(operationId: string, done: readonly { name: string; write: NodeWrite }[]): void {
    for (const { name, write } of done.toReversed()) {
      const n = this.#node(name);
      if (!write.undo(n)) continue;
      this.#touch(n);
      this.#audit("node", name, "rollback", write.changes.map(([field]) => field).join(","), operationId);
    }
  }

  #holdWrite(claimId: string, placed: readonly { workload: string; device: DeviceIdentity }[]): NodeWrite {
    const entries = placed.map(({ workload, device }) =>
      [claimHolder(claimId, workload), deviceKey(device)] as const
    );
    const holders = [...new Set(entries.map(([holder]) => holder))];
    return {
      changes: entries.map(([holder, key]) => ["hold", `${key}=${holder}`] as const),
      apply: (n) => {
        for (const [holder, key] of entries) n.holds.set(key, [...(n.holds.get(key) ?? []), holder]);
        for (const holder of holders) {
          n.workloads.set(holder, {
            units: entries.filter(([h]) => h === holder).length,
            foreign: false,
            running: false,
          });
        }
      },
      undo: (n) => {
        const mine = holders.filter((holder) => n.workloads.delete(holder));
        for (const holder of mine) this.#dropHolder(n, holder);
        return mine.length > 0;
      },
    };
  }

  /** Stamps the claim as owner (on reserve) and asks the MIG manager for `layout` under a new write generation. */
  #geometryWrite(read: NodeRead, claim: Claim, layout: string, stampOwner: boolean): NodeWrite {
    const n = this.#node(read.name);
    const generation = n.lastWrite + 1;
    const config = configName(claim, read.name);
    const before = geometryFields(n);
    const holders = Object.entries(claim.assignments)
      .filter(([, devices]) => devices.some((d) => d.node === read.name))
      .map(([workload, devices]) => [claimHolder(claim.claimId, workload), devices.length] as const);
    claim.writes[read.name] = generation;
    return {
      changes: [
        ...(stampOwner ? [["owner", claim.claimId] as const] : []),
        ["mig.config", `${config}@${generation}`],
      ],
      apply: (node) => {
        if (stampOwner) {
          node.owner = claim.claimId;
          node.restoreRecord = node.migConfig;
          for (const [holder, units] of holders) {
            node.workloads.set(holder, { units, foreign: false, running: false });
          }
        }
        node.ownerEpoch = String(claim.generation);
        node.migConfig = config;
        node.lastWrite = generation;
        node.pending = this.#pendingWrite(generation, config, parseLayoutText(layout));
      },
      undo: (node) => {
        const stillMine = node.migConfig === config && node.lastWrite === generation &&
          (!stampOwner || node.owner === claim.claimId);
        if (!stillMine) return false;
        Object.assign(node, before);
        for (const [holder] of holders) node.workloads.delete(holder);
        return true;
      },
    };
  }

  #releaseWrite(read: NodeRead, claim: Claim, restoreGeometry: boolean): NodeWrite {
    const n = this.#node(read.name);
    const holders = [...read.workloads.keys()].filter((h) => h.startsWith(`${claim.claimId}#`));
    const generation = n.lastWrite + 1;
    const restore = n.restoreRecord ?? MIG_DISABLED;
    const saved = new Map(holders.map((h) => [h, read.workloads.get(h)!]));
    const savedHolds = [...read.holds].flatMap(([key, ids]) =>
      ids.filter((id) => saved.has(id)).map((id) => [key, id] as const)
    );
    const before = geometryFields(n);
    return {
      changes: [
        ...holders.map((h) => ["release", h] as const),
        ...(restoreGeometry
          ? [["owner", ""] as const, ["mig.config", `${restore}@${generation}`] as const]
          : []),
      ],
      apply: (node) => {
        for (const holder of holders) {
          node.workloads.delete(holder);
          this.#dropHolder(node, holder);
        }
        if (!restoreGeometry) return;
        node.owner = null;
        node.ownerEpoch = null;
        node.migConfig = restore;
        node.restoreRecord = null;
        node.lastWrite = generation;
        node.pending = this.#pendingWrite(generation, restore, this.#layoutOfConfig(restore));
      },
      undo: (node) => {
        const absent = [...saved.keys()].filter((holder) => !node.workloads.has(holder));
        for (const holder of absent) node.workloads.set(holder, { ...saved.get(holder)! });
        for (const [key, holder] of savedHolds) {
          if (absent.includes(holder)) node.holds.set(key, [...(node.holds.get(key) ?? []), holder]);
        }
        const geometryMine = restoreGeometry && node.owner === null && node.lastWrite === generation;
        if (geometryMine) Object.assign(node, before);
        return absent.length > 0 || geometryMine;
      },
    };
  }

  /** A geometry write for the MIG manager, due after the configured delay. */
  #pendingWrite(generation: number, config: string, layout: MigLayout): GeometryWrite {
    return { generation, config, layout, dueAt: this.#clock.monotonic() + this.#migApplySeconds };
  }

  #layoutOfConfig(config: string): MigLayout {
    return config === MIG_DISABLED ? {} : this.#config.entries.get(config) ?? {};
  }

  /** Adds the claim's config entries for `nodes` under CAS and points the cluster at the shared map. */
  async #writeConfig(
    operationId: string,
    read: { readonly version: number; readonly pointerVersion: number },
    claim: Claim,
    nodes: readonly string[],
  ): Promise<void> {
    await barrier(Barrier.ownerUpdateBefore, { target: SHARED_CONFIG_NAME, op_id: operationId });
    if (this.#config.version !== read.version || this.#pointer.version !== read.pointerVersion) {
      throw ownershipConflict("the shared MIG configuration changed before the write landed", {
        op_id: operationId,
      });
    }
    for (const node of nodes) {
      const config = configName(claim, node);
      if (claim.geometry[node] === undefined || this.#config.entries.has(config)) continue;
      this.#config.entries.set(config, Object.freeze(parseLayoutText(claim.geometry[node])));
      this.#audit("config", SHARED_CONFIG_NAME, "entry", config, operationId);
    }
    this.#config.tombstoned = false;
    this.#config.version++;
    if (this.#pointer.value !== SHARED_CONFIG_NAME) {
      this.#pointer.original = this.#pointer.value;
      this.#pointer.value = SHARED_CONFIG_NAME;
      this.#pointer.version++;
      this.#audit("pointer", "cluster-policy", "mig.config", SHARED_CONFIG_NAME, operationId);
    }
    this.#version++;
  }

  /** Removes the claim's entries; the last owner out tombstones the map and restores the pointer. */
  async #dropConfigEntries(operationId: string, claim: Claim): Promise<void> {
    const prefix = `vf-${claim.claimId}-`;
    const mine = [...this.#config.entries.keys()].filter((name) => name.startsWith(prefix));
    if (mine.length === 0) return;
    await barrier(Barrier.ownerUpdateBefore, { target: SHARED_CONFIG_NAME, op_id: operationId });
    const stillUsed = new Set(
      [...this.#nodes.values()].flatMap((n) => [n.migConfig, n.pending?.config ?? ""]),
    );
    for (const name of mine.filter((entry) => !stillUsed.has(entry))) {
      this.#config.entries.delete(name);
      this.#audit("config", SHARED_CONFIG_NAME, "remove", name, operationId);
    }
    if (this.#config.entries.size === 0) {
      this.#config.tombstoned = true;
      this.#audit("config", SHARED_CONFIG_NAME, "tombstone", "true", operationId);
      if (this.#pointer.value === SHARED_CONFIG_NAME) {
        this.#pointer.value = this.#pointer.original ?? DEFAULT_POINTER;
        this.#pointer.version++;
        this.#audit("pointer", "cluster-policy", "mig.config", this.#pointer.value, operationId);
      }
    }
    this.#config.version++;
    this.#version++;
  }

  /** Workloads that forbid a geometry change on the node: anything running, or held by anyone but the claim. */
  #usersBlockingGeometry(read: NodeRead, claimId: string): string[] {
    return [...read.workloads].filter(([holder, w]) => w.running || !holder.startsWith(`${claimId}#`))
      .map(([holder]) => holder).sort();
  }

  #geometryProblems(claim: Claim, node: string, layout: MigLayout): string[] {
    const n = this.#node(node);
    const problems = checkLayout(n.product, layout).map((p) => `${node}: ${p}`);
    const needed = this.#sliceDemand(claim, node);
    const perGpu = this.#perGpuLayout(n, needed);
    for (const [profile, count] of Object.entries(perGpu)) {
      if ((layout[profile] ?? 0) < count) {
        problems.push(`${node}: the claim holds ${profile} slices the layout drops`);
      }
    }
    return problems;
  }

  #sliceDemand(claim: Claim, node: string): Record<string, number> {
    const demand: Record<string, number> = {};
    for (const devices of Object.values(claim.assignments)) {
      for (const d of devices) {
        if (d.node === node && d.migProfile !== null) demand[d.migProfile] = (demand[d.migProfile] ?? 0) + 1;
      }
    }
    return demand;
  }

  #perGpuLayout(n: NodeState, demand: Readonly<Record<string, number>>): Record<string, number> {
    return Object.fromEntries(
      Object.entries(demand).map(([profile, count]) => [profile, Math.ceil(count / n.gpuCount)]),
    );
  }

  #claimNodes(claim: Claim): string[] {
    const nodes = new Set(Object.keys(claim.geometry));
    for (const devices of Object.values(claim.assignments)) for (const d of devices) nodes.add(d.node ?? "");
    return [...nodes].sort();
  }

  #applyDue(): void {
    const now = this.#clock.monotonic();
    for (const n of this.#nodes.values()) {
      const write = n.pending;
      if (write === null || write.dueAt > now) continue;
      n.pending = null;
      n.migStateGeneration = write.generation;
      if (n.geometryFails) {
        n.migState = MigState.failed;
      } else {
        n.migState = MigState.success;
        n.applied = {
          config: write.config,
          layout: Object.freeze({ ...write.layout }),
          generation: write.generation,
        };
      }
      this.#touch(n);
    }
  }

  /** Node → what its MIG manager reports, against the write the claim made there. */
  #evidence(claim: Claim): Record<string, unknown> {
    const nodes: Record<string, unknown> = {};
    for (const [node, write] of Object.entries(claim.writes)) {
      const n = this.#node(node);
      nodes[node] = { state: n.migState, state_generation: n.migStateGeneration, write_generation: write };
    }
    return { nodes };
  }

  #geometryStatus(claim: Claim): ClaimStatus {
    let status: ClaimStatus = ClaimStatus.prepared;
    for (const [node, write] of Object.entries(claim.writes)) {
      const n = this.#node(node);
      if (n.migStateGeneration !== write) {
        status = status === ClaimStatus.failed ? status : ClaimStatus.preparing;
      } else if (n.migState === MigState.failed) status = ClaimStatus.failed;
    }
    return status;
  }

  /** The devices a workload holds now: planned whole devices, or the applied slices its plan asked for. */
  #grantOf(claim: Claim, workloadId: string): DeviceIdentity[] | null {
    const taken = new Set<string>();
    for (const [workload, devices] of Object.entries(claim.assignments)) {
      const granted: DeviceIdentity[] = [];
      for (const planned of devices) {
        if (planned.migUuid !== null || planned.migProfile === null) {
          granted.push(planned);
          continue;
        }
        const slice = devicesOf(this.#node(planned.node ?? "")).find((d) =>
          d.ordinal === planned.ordinal && d.migProfile === planned.migProfile && !taken.has(d.migUuid ?? "")
        );
        if (slice === undefined) return null;
        taken.add(slice.migUuid ?? "");
        granted.push(slice);
      }
      if (workload === workloadId) return granted;
    }
    return null;
  }

  #observation(claim: Claim): ClaimObservation {
    let status: ClaimStatus;
    if (claim.phase === "released") status = ClaimStatus.released;
    else if (claim.phase === "retained") status = ClaimStatus.retained;
    else {
      status = this.#geometryStatus(claim);
      if (status === ClaimStatus.prepared && claim.ready) status = ClaimStatus.ready;
    }
    const answered = this.#geometryStatus(claim) !== ClaimStatus.preparing;
    if (answered) claim.answered = claim.generation;
    const granted = status === ClaimStatus.prepared || status === ClaimStatus.ready ||
      status === ClaimStatus.retained;
    const grant = granted
      ? Object.keys(claim.assignments).flatMap((w) => this.#grantOf(claim, w) ?? [])
      : null;
    return Object.freeze({
      claimId: claim.claimId,
      owner: claim.owner,
      desiredGeneration: String(claim.generation),
      observedGeneration: claim.answered === null ? null : String(claim.answered),
      status,
      grant: grant === null ? null : Object.freeze(grant),
      evidence: Object.freeze(this.#evidence(claim)),
    });
  }

  /** What a reservation answers when its writes landed: devices owned, readiness not yet observed. */
  #allocated(claim: Claim): ClaimObservation {
    return Object.freeze({ ...this.#observation(claim), status: ClaimStatus.allocated, grant: null });
  }

  /** What a write answers when its reply was dropped: the caller must observe before deciding. */
  #lostReply(claim: Claim): ClaimObservation {
    return Object.freeze({
      ...this.#observation(claim),
      status: ClaimStatus.unknown,
      grant: null,
      evidence: Object.freeze({ reason: "the write's reply was lost; observe the claim" }),
    });
  }

  #planWhole(
    requests: readonly WorkloadRequest[],
    pool: PlanPool,
    assignments: Record<string, DeviceIdentity[]>,
    reasons: string[],
  ): void {
    if (requests.length === 0) return;
    const { snapshot } = pool;
    const hosts = Object.keys(snapshot.sharing).filter((h) =>
      snapshot.sharing[h] === NodeSharing.physical && snapshot.owners[h] === undefined
    );
    const freeDevices = (host: string) =>
      snapshot.devices.filter((d) =>
        d.node === host && d.migProfile === null && pool.freeUnits(d) >= pool.capacity(host)
      );
    const free = Object.fromEntries(hosts.map((h) => [h, freeDevices(h).length]));
    const eligible: Record<string, Set<string>> = {};
    const preferred: Record<string, Set<string>> = {};
    for (const r of requests) {
      eligible[r.workloadId] = new Set(hosts.filter((h) => {
        const labels = this.#nodes.get(h)?.labels ?? {};
        const min = r.minimumUsableMemoryBytes ?? 0;
        const devices = snapshot.devices.filter((d) => d.node === h);
        return hardConstraintsHold(r.constraints, labels) &&
          devices.every((d) => (d.memoryBytes ?? 0) >= min);
      }));
      preferred[r.workloadId] = new Set(
        hosts.filter((h) => softlyPreferred(r.constraints, this.#nodes.get(h)?.labels ?? {})),
      );
    }
    const packing = packWholeDevices(
      requests.map((r) => [r.workloadId, r.deviceCount]),
      free,
      eligible,
      preferred,
    );
    if (packing === null) {
      reasons.push(...packingShortfalls(requests, free, eligible));
      return;
    }
    for (const r of requests) {
      const host = packing[r.workloadId];
      const devices = freeDevices(host).slice(0, r.deviceCount);
      for (const d of devices) pool.take(d);
      pool.wholeNodes.add(host);
      assignments[r.workloadId] = devices;
    }
  }

  #planSlice(
    request: WorkloadRequest,
    pool: PlanPool,
    assignments: Record<string, DeviceIdentity[]>,
    reasons: string[],
  ): void {
    const { snapshot } = pool;
    const min = request.minimumUsableMemoryBytes ?? 0;
    const fits = (host: string) =>
      snapshot.owners[host] === undefined &&
      hardConstraintsHold(request.constraints, this.#nodes.get(host)?.labels ?? {});
    const slices = snapshot.devices
      .filter((d) =>
        d.migProfile !== null && fits(d.node ?? "") && (d.memoryBytes ?? 0) >= min && pool.freeUnits(d) > 0
      )
      .sort((a, b) => (a.memoryBytes ?? 0) - (b.memoryBytes ?? 0));
    if (slices.length > 0) {
      pool.take(slices[0]);
      assignments[request.workloadId] = [slices[0]];
      return;
    }
    if (this.#authority !== AllocationAuthority.managedMig) {
      reasons.push(
        `request ${request.workloadId}: no free MIG slice of at least ${
          (min / GIB).toFixed(1)
        } GiB, and authority ` +
          `${this.#authority} cannot change geometry`,
      );
      return;
    }
    for (const host of Object.keys(snapshot.sharing).sort()) {
      const n = this.#nodes.get(host);
      const sharing = snapshot.sharing[host];
      if (n === undefined || !fits(host) || pool.wholeNodes.has(host) || !pool.nodeIdle(host)) continue;
      if (sharing !== NodeSharing.physical && sharing !== NodeSharing.mig) continue;
      const profile = smallestProfile(n.product, min / GIB);
      if (profile === null) continue;
      const demand = { ...(pool.geometryNodes.get(host) ?? {}) };
      demand[profile.name] = (demand[profile.name] ?? 0) + 1;
      if (checkLayout(n.product, this.#perGpuLayout(n, demand)).length > 0) continue;
      pool.geometryNodes.set(host, demand);
      const index = demand[profile.name] - 1;
      assignments[request.workloadId] = [deviceIdentity({
        node: host,
        ordinal: index % n.gpuCount,
        uuid: gpuUuid(host, index % n.gpuCount),
        migUuid: null,
        product: n.product,
        memoryBytes: Math.round(profile.memoryGib * GIB),
        migProfile: profile.name,
      })];
      return;
    }
    reasons.push(
      `request ${request.workloadId}: no free MIG slice of at least ${
        (min / GIB).toFixed(1)
      } GiB and no idle, ` +
        `unowned MIG-capable node whose geometry may change`,
    );
  }

  #planShare(
    request: WorkloadRequest,
    pool: PlanPool,
    assignments: Record<string, DeviceIdentity[]>,
    reasons: string[],
  ): void {
    const { snapshot } = pool;
    const kind = request.sharing === RequestSharing.mps ? NodeSharing.mps : NodeSharing.timeSliced;
    for (const host of Object.keys(snapshot.sharing).sort()) {
      const labels = this.#nodes.get(host)?.labels ?? {};
      if (snapshot.sharing[host] !== kind || snapshot.owners[host] !== undefined) continue;
      if (!hardConstraintsHold(request.constraints, labels)) continue;
      const devices = snapshot.devices.filter((d) => d.node === host && pool.freeUnits(d) > 0);
      if (devices.length < request.deviceCount) continue;
      const chosen = devices.slice(0, request.deviceCount);
      for (const d of chosen) pool.take(d);
      assignments[request.workloadId] = chosen;
      return;
    }
    reasons.push(
      `request ${request.workloadId}: no ${kind} host has ${request.deviceCount} device(s) with a free share`,
    );
  }
}
