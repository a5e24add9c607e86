/**
 * The AcceleratorAllocationBackend contract (spec backends.allocation): which accelerator resources a
 * workload may use, and under what guarantees.
 *
 * Named for what it decides, not for one mechanism: a Kubernetes DRA driver, the device plugin,
 * videoflow's managed MIG geometry and a local NVML walk are all implementations. What every one of them
 * guarantees (the conformance scenarios in tests/conformance/allocation run the same stories against
 * each):
 * - Inventory and plans are advisory. A {@link FeasiblePlan} is a snapshot, never a reservation; only
 *   {@link AcceleratorAllocationBackend.reserve} takes devices, and it re-checks them.
 * - Reservation is a compare-and-swap: ownership is written under a server-enforced precondition, the
 *   loser of a race gets OwnershipConflict with nothing mutated, and a stale rollback cannot remove a
 *   newer owner.
 * - Readiness is observed, not inferred: allocated, prepared and application-ready are different states,
 *   and a success recorded for an earlier generation is no evidence for a newer write.
 * - Reads that failed are Unknown: a refused occupancy listing does not prove a device idle (a
 *   {@link InventorySnapshot} is then `partial`, which may plan but never admits).
 * - Release is idempotent and generation-fenced; a retained workload keeps its allocation until an
 *   explicit later release.
 *
 * Memory is four separate byte quantities on a {@link WorkloadRequest} (usable minimum, reserved, hard
 * limit, declared peak), because one `gpu_memory_gb` with three meanings is how a scheduler reservation
 * got mistaken for isolation.
 *
 * @module
 */

import { ConfigError, OwnershipConflict } from "../core/errors.ts";
import type { Observation } from "./outcomes.ts";

/** How a node's GPUs are shared, as read from its labels (InventorySnapshot.sharing). */
export const NodeSharing = {
  physical: "physical",
  mig: "mig",
  timeSliced: "time-sliced",
  mps: "mps",
  unknown: "unknown",
} as const;
/** One of {@link NodeSharing}. */
export type NodeSharing = typeof NodeSharing[keyof typeof NodeSharing];

/** The GPU Feature Discovery labels {@link classifyNode} reads. */
export const GfdLabel = {
  sharingStrategy: "nvidia.com/gpu.sharing-strategy",
  replicas: "nvidia.com/gpu.replicas",
} as const;

/**
 * The per-node rule every cluster reader (and the memory model) applies to GFD labels: `mps` or
 * `time-sliced` by the sharing strategy (or more than one replica), `mig` when MIG geometry is applied,
 * `physical` when the node has GPUs and shares none, `unknown` otherwise.
 */
export function classifyNode(
  labels: Readonly<Record<string, string>>,
  gpuCount: number,
  migApplied: boolean,
): NodeSharing {
  const strategy = labels[GfdLabel.sharingStrategy];
  if (strategy === "mps") return NodeSharing.mps;
  if (strategy === "time-slicing" || Number(labels[GfdLabel.replicas] ?? "1") > 1) {
    return NodeSharing.timeSliced;
  }
  if (migApplied) return NodeSharing.mig;
  return gpuCount > 0 ? NodeSharing.physical : NodeSharing.unknown;
}

/** What a request asks for: whole devices, one isolated MIG slice, or a cooperative share. */
export const RequestSharing = {
  exclusive: "exclusive",
  mig: "mig",
  timeSliced: "time-sliced",
  mps: "mps",
} as const;
/** One of {@link RequestSharing}. */
export type RequestSharing = typeof RequestSharing[keyof typeof RequestSharing];
/** Every request sharing kind. */
export const REQUEST_SHARINGS: readonly RequestSharing[] = Object.values(RequestSharing);

/**
 * The mechanism behind a memory bound, strongest first: hardware (MIG), a runtime cap (MPS pinned
 * memory), scheduler accounting only (a consumable capacity or a whole-device count), or nothing.
 */
export const MemoryEnforcement = {
  hardware: "hardware",
  runtime: "runtime",
  scheduler: "scheduler",
  none: "none",
} as const;
/** One of {@link MemoryEnforcement}. */
export type MemoryEnforcement = typeof MemoryEnforcement[keyof typeof MemoryEnforcement];

/** Every enforcement, strongest first. */
export const MEMORY_ENFORCEMENTS: readonly MemoryEnforcement[] = Object.values(MemoryEnforcement);

/** Whether a bound enforced by `offered` is at least as strong as `required` asks. */
export function enforcementSatisfies(offered: MemoryEnforcement, required: MemoryEnforcement): boolean {
  return MEMORY_ENFORCEMENTS.indexOf(offered) <= MEMORY_ENFORCEMENTS.indexOf(required);
}

/**
 * What an accelerator allocator can guarantee, naming the mechanism behind each promise:
 * `memoryEnforcement` says whether a memory bound is enforced by hardware (MIG), a runtime cap (MPS), by
 * scheduler accounting only, or not at all.
 */
export interface AllocationCapabilities {
  readonly adapter: string;
  /** Which authority decides: `device-plugin`, `managed-mig`, `dra`, `local`. */
  readonly authority: string;
  readonly exclusiveDevice: boolean;
  readonly isolatedMig: boolean;
  readonly cooperativeSharing: boolean;
  readonly memoryEnforcement: MemoryEnforcement;
  readonly multiDevice: boolean;
  /** Peer access between granted devices can be verified (P2P topology read). */
  readonly topologyVerification: boolean;
  readonly elastic: boolean;
  /** The allocator refuses a workload it cannot serve before the workload starts. */
  readonly admissionBoundary: boolean;
  /** `version` (string), `features` (the FEATURE_* names available) and whatever else the adapter records. */
  readonly versionMatrix: Readonly<Record<string, unknown>>;
}

/** Constructs a frozen {@link AllocationCapabilities}. */
export function allocationCapabilities(init: AllocationCapabilities): AllocationCapabilities {
  return Object.freeze({ ...init, versionMatrix: Object.freeze({ ...init.versionMatrix }) });
}

/** Whether a snapshot saw everything (`complete`) or some read failed (`partial`: may plan, never admit). */
export const Completeness = { complete: "complete", partial: "partial" } as const;
/** One of {@link Completeness}. */
export type Completeness = typeof Completeness[keyof typeof Completeness];

/** Whether a workload's device set is fixed for its life or may grow and shrink. */
export const Elasticity = { fixed: "fixed", elastic: "elastic" } as const;
/** One of {@link Elasticity}. */
export type Elasticity = typeof Elasticity[keyof typeof Elasticity];

/** Feature: re-partitioning MIG geometry on demand. */
export const FEATURE_DYNAMIC_MIG = "dynamic-mig";
/** Feature: CUDA MPS sharing with a per-client memory cap. */
export const FEATURE_MPS = "mps";
/** Feature: consumable capacity (a device carved into accounted shares). */
export const FEATURE_CONSUMABLE_CAPACITY = "consumable-capacity";

/**
 * Feature combinations no backend can serve at once: MPS shares a device between clients while dynamic
 * MIG re-partitions it, and consumable shares already carve it.
 */
export const EXCLUSIVE_FEATURE_PAIRS: readonly (readonly [string, string])[] = Object.freeze([
  Object.freeze([FEATURE_MPS, FEATURE_DYNAMIC_MIG] as const),
  Object.freeze([FEATURE_MPS, FEATURE_CONSUMABLE_CAPACITY] as const),
]);

/**
 * One accelerator in three identifier spaces that are not interchangeable: a host ordinal, a physical
 * GPU UUID and, for a slice, a MIG UUID. A worker maps whatever it was granted onto CUDA-local ordinals
 * itself.
 */
export interface DeviceIdentity {
  /** The host (Kubernetes node) the device is on; null when not known. */
  readonly node: string | null;
  /** The host's ordinal for the physical device; null when not known. */
  readonly ordinal: number | null;
  /** The physical GPU UUID (`GPU-…`); null when not known. */
  readonly uuid: string | null;
  /** The MIG device UUID (`MIG-…`) for a slice; null for a whole device or a slice not created yet. */
  readonly migUuid: string | null;
  /** The product name. */
  readonly product: string;
  /** Usable memory of the device or slice; null when not known. */
  readonly memoryBytes: number | null;
  /** The slice's MIG profile (`3g.40gb`); null for a whole device. */
  readonly migProfile: string | null;
}

/** Constructs a frozen {@link DeviceIdentity}. */
export function deviceIdentity(
  fields: Omit<DeviceIdentity, "migProfile"> & { readonly migProfile?: string | null },
): DeviceIdentity {
  return Object.freeze({ ...fields, migProfile: fields.migProfile ?? null });
}

/**
 * The key a device is counted under (occupancy, holds): its MIG UUID, else its GPU UUID, else
 * `node/ordinal`; throws {@link ConfigError} for a device with no identity at all.
 */
export function deviceKey(device: DeviceIdentity): string {
  if (device.migUuid !== null) return device.migUuid;
  if (device.uuid !== null) return device.uuid;
  if (device.node !== null && device.ordinal !== null) return `${device.node}/${device.ordinal}`;
  throw new ConfigError("a device without a MIG UUID, a GPU UUID or a node ordinal cannot be counted", null, {
    product: device.product,
  });
}

/** The operators a {@link Constraint} may use (Kubernetes node-selector semantics). */
export const ConstraintOperator = {
  in: "In",
  notIn: "NotIn",
  exists: "Exists",
  doesNotExist: "DoesNotExist",
} as const;
/** One of {@link ConstraintOperator}. */
export type ConstraintOperator = typeof ConstraintOperator[keyof typeof ConstraintOperator];
const CONSTRAINT_OPERATORS: readonly string[] = Object.values(ConstraintOperator);

/** A hard requirement or a soft preference on device or node attributes (labels). */
export interface Constraint {
  readonly key: string;
  readonly operator: ConstraintOperator;
  readonly values: readonly string[];
  /** Hard: a host that fails it is ineligible. Soft: a host that meets it is preferred. */
  readonly hard: boolean;
}

/**
 * Constructs a {@link Constraint}; throws {@link ConfigError} for an unknown operator, or values that do
 * not fit it (In/NotIn need at least one, Exists/DoesNotExist take none).
 */
export function constraint(
  key: string,
  operator: string,
  values: readonly string[] = [],
  hard = true,
): Constraint {
  if (!CONSTRAINT_OPERATORS.includes(operator)) {
    throw new ConfigError(
      `constraint ${key}: unknown operator ${JSON.stringify(operator)}`,
      `use one of ${CONSTRAINT_OPERATORS.join(", ")}`,
    );
  }
  const takesValues = operator === ConstraintOperator.in || operator === ConstraintOperator.notIn;
  if (takesValues !== values.length > 0) {
    throw new ConfigError(
      `constraint ${key}: ${operator} ${takesValues ? "needs at least one value" : "takes no values"}`,
      null,
      { key, operator },
    );
  }
  return Object.freeze({
    key,
    operator: operator as ConstraintOperator,
    values: Object.freeze([...values]),
    hard,
  });
}

/** Whether `attributes` (a host's labels) satisfy `c`. */
export function constraintHolds(c: Constraint, attributes: Readonly<Record<string, string>>): boolean {
  const value = Object.hasOwn(attributes, c.key) ? attributes[c.key] : undefined;
  switch (c.operator) {
    case ConstraintOperator.in:
      return value !== undefined && c.values.includes(value);
    case ConstraintOperator.notIn:
      return value === undefined || !c.values.includes(value);
    case ConstraintOperator.exists:
      return value !== undefined;
    case ConstraintOperator.doesNotExist:
      return value === undefined;
  }
}

/** Whether `labels` meet every hard constraint of `constraints` (soft ones never exclude a host). */
export function hardConstraintsHold(
  constraints: readonly Constraint[],
  labels: Readonly<Record<string, string>>,
): boolean {
  return constraints.every((c) => !c.hard || constraintHolds(c, labels));
}

/** Whether `constraints` have soft ones and `labels` meet all of them (a host to try first). */
export function softlyPreferred(
  constraints: readonly Constraint[],
  labels: Readonly<Record<string, string>>,
): boolean {
  const soft = constraints.filter((c) => !c.hard);
  return soft.length > 0 && soft.every((c) => constraintHolds(c, labels));
}

/** What one workload asks of the allocator. */
export interface WorkloadRequest {
  readonly flowId: string;
  readonly runId: string;
  /** Unique within a planning call: the key of {@link FeasiblePlan.assignments}. */
  readonly workloadId: string;
  /** Devices (or, for `mig`, slices) on one host. */
  readonly deviceCount: number;
  readonly sharing: RequestSharing;
  /** The least usable memory a granted device must have. */
  readonly minimumUsableMemoryBytes: number | null;
  /** Memory the scheduler must set aside for the workload. */
  readonly reservedMemoryBytes: number | null;
  /** A bound the workload must not be able to exceed (needs hardware or runtime enforcement). */
  readonly hardMemoryLimitBytes: number | null;
  /** What the workload says it will peak at (informational, for packing and explain). */
  readonly declaredPeakMemoryBytes: number | null;
  /** Feature names (FEATURE_*) the request needs; each must be in the backend's version matrix. */
  readonly features: readonly string[];
  readonly constraints: readonly Constraint[];
  readonly elasticity: Elasticity;
  readonly hostCpu: string | null;
  readonly hostMemory: string | null;
  /** Where each value came from (field → source), for explain. */
  readonly provenance: Readonly<Record<string, string>>;
}

/** The fields of {@link workloadRequest}: the first five are required. */
export type WorkloadRequestInit =
  & Pick<WorkloadRequest, "flowId" | "runId" | "workloadId" | "deviceCount">
  & { readonly sharing: string }
  & Partial<Omit<WorkloadRequest, "flowId" | "runId" | "workloadId" | "deviceCount" | "sharing">>;

const MEMORY_FIELDS = [
  ["minimumUsableMemoryBytes", "minimum_usable_memory_bytes"],
  ["reservedMemoryBytes", "reserved_memory_bytes"],
  ["hardMemoryLimitBytes", "hard_memory_limit_bytes"],
  ["declaredPeakMemoryBytes", "declared_peak_memory_bytes"],
] as const;

/**
 * Constructs a {@link WorkloadRequest}. Throws one {@link ConfigError} listing every problem: a device
 * count that is not a positive integer, an unknown sharing kind or elasticity, a memory quantity that is
 * not a positive integer of bytes, and a hard limit below the reserved or the declared peak memory.
 */
export function workloadRequest(init: WorkloadRequestInit): WorkloadRequest {
  const problems: string[] = [];
  if (!Number.isSafeInteger(init.deviceCount) || init.deviceCount < 1) {
    problems.push(`device_count must be a positive integer, got ${init.deviceCount}`);
  }
  if (!(REQUEST_SHARINGS as readonly string[]).includes(init.sharing)) {
    problems.push(
      `sharing must be one of ${REQUEST_SHARINGS.join(", ")}, got ${JSON.stringify(init.sharing)}`,
    );
  }
  const elasticity = init.elasticity ?? Elasticity.fixed;
  if (!(Object.values(Elasticity) as string[]).includes(elasticity)) {
    problems.push(`elasticity must be fixed or elastic, got ${JSON.stringify(elasticity)}`);
  }
  for (const [prop, key] of MEMORY_FIELDS) {
    const value = init[prop];
    if (value !== undefined && value !== null && (!Number.isSafeInteger(value) || value < 1)) {
      problems.push(`${key} must be a positive integer of bytes, got ${value}`);
    }
  }
  const limit = init.hardMemoryLimitBytes ?? null;
  for (const [prop, key] of [MEMORY_FIELDS[1], MEMORY_FIELDS[3]]) {
    const value = init[prop] ?? null;
    if (limit !== null && value !== null && value > limit) {
      problems.push(`${key} (${value}) exceeds hard_memory_limit_bytes (${limit})`);
    }
  }
  if (problems.length > 0) {
    throw new ConfigError(
      `workload request ${init.workloadId}: ${problems.join("; ")}`,
      "fix the request's GPU declarations",
      { workload_id: init.workloadId },
    );
  }
  return Object.freeze({
    flowId: init.flowId,
    runId: init.runId,
    workloadId: init.workloadId,
    deviceCount: init.deviceCount,
    sharing: init.sharing as RequestSharing,
    minimumUsableMemoryBytes: init.minimumUsableMemoryBytes ?? null,
    reservedMemoryBytes: init.reservedMemoryBytes ?? null,
    hardMemoryLimitBytes: limit,
    declaredPeakMemoryBytes: init.declaredPeakMemoryBytes ?? null,
    features: Object.freeze([...new Set(init.features ?? [])].sort()),
    constraints: Object.freeze([...(init.constraints ?? [])]),
    elasticity: elasticity as Elasticity,
    hostCpu: init.hostCpu ?? null,
    hostMemory: init.hostMemory ?? null,
    provenance: Object.freeze({ ...(init.provenance ?? {}) }),
  });
}

/** What the inventory reads saw. */
export interface InventorySnapshot {
  readonly devices: readonly DeviceIdentity[];
  /** Device key ({@link deviceKey}) → units in use, as far as the reads could see. */
  readonly occupancy: Readonly<Record<string, number>>;
  /** Node → how its GPUs are shared. */
  readonly sharing: Readonly<Record<string, NodeSharing>>;
  /** Node → the owner videoflow stamped on it, for nodes that carry one. */
  readonly owners: Readonly<Record<string, string>>;
  /** `partial` when some read failed: the snapshot may plan but may not admit. */
  readonly completeness: Completeness;
  /** Monotonic seconds of the reads. */
  readonly observedAt: number;
  /** The provider's version of the state read, tying a plan to what it was planned on. */
  readonly generation: string;
}

/** Which hosts an inventory reads: named nodes, nodes carrying every label, or (empty) all. */
export interface InventoryScope {
  readonly nodes?: readonly string[];
  readonly labels?: Readonly<Record<string, string>>;
}

/** An advisory placement of every request; `planId` and `snapshotGeneration` tie a reservation to it. */
export interface FeasiblePlan {
  readonly kind: "feasible";
  /** Workload → the devices it would get (a slice not created yet has no MIG UUID). */
  readonly assignments: Readonly<Record<string, readonly DeviceIdentity[]>>;
  /** Node → the MIG layout the plan would apply there (see the memory backend's layout text). */
  readonly geometry: Readonly<Record<string, string>>;
  readonly snapshotGeneration: string;
  readonly planId: string;
  readonly notes: readonly string[];
}

/** No placement exists for the requests, and why (one reason per obstacle). */
export interface Infeasible {
  readonly kind: "infeasible";
  readonly reasons: readonly string[];
}

/** What {@link AcceleratorAllocationBackend.plan} answers. */
export type PlanOutcome = FeasiblePlan | Infeasible;

/** Constructs an {@link Infeasible}; throws RangeError without a reason (an unexplained refusal). */
export function infeasible(reasons: readonly string[]): Infeasible {
  if (reasons.length === 0) throw new RangeError("an infeasible plan must say why");
  return Object.freeze({ kind: "infeasible", reasons: Object.freeze([...reasons]) });
}

/**
 * The OwnershipConflict every backend throws when a write lost a compare-and-swap race: nothing of the
 * call was kept, and the caller re-reads and plans again.
 */
export function ownershipConflict(message: string, context: Record<string, unknown>): OwnershipConflict {
  return new OwnershipConflict(
    message,
    "re-read the inventory and plan again; nothing of this call was kept",
    context,
  );
}

/** How a claim's workload is named among a device's holders (`<claim>#<workload>`). */
export function claimHolder(claimId: string, workloadId: string): string {
  return `${claimId}#${workloadId}`;
}

/** A frozen {@link FeasiblePlan} (its assignments' device lists frozen too). */
export function feasiblePlan(plan: Omit<FeasiblePlan, "kind">): FeasiblePlan {
  return Object.freeze<FeasiblePlan>({
    kind: "feasible",
    assignments: Object.freeze(
      Object.fromEntries(Object.entries(plan.assignments).map(([w, d]) => [w, Object.freeze(d)])),
    ),
    geometry: Object.freeze(plan.geometry),
    snapshotGeneration: plan.snapshotGeneration,
    planId: plan.planId,
    notes: Object.freeze(plan.notes),
  });
}

/**
 * What every backend answers before it places anything: {@link allocationRejections} of `requests` against
 * `capabilities`, or "occupancy unknown" on a snapshot that is not complete (a partial one never admits);
 * null when planning may go on.
 *
 * @throws ConfigError when one workload is requested twice.
 */
export function refusalBeforePlanning(
  requests: readonly WorkloadRequest[],
  capabilities: AllocationCapabilities,
  snapshot: InventorySnapshot,
): Infeasible | null {
  const ids = requests.map((r) => r.workloadId);
  const duplicate = ids.find((id, i) => ids.indexOf(id) !== i);
  if (duplicate !== undefined) {
    throw new ConfigError(`workload ${duplicate} is requested twice in one plan`);
  }
  const rejections = allocationRejections(requests, capabilities);
  if (rejections.length > 0) return infeasible(rejections);
  if (snapshot.completeness !== Completeness.complete) return infeasible(["occupancy unknown"]);
  return null;
}

/** The states a claim moves through; each is observed, never inferred from an earlier one. */
export const ClaimStatus = {
  /** Devices are owned by the claim; nothing is prepared yet. */
  allocated: "allocated",
  /** A geometry write is on its way; the cluster has not reported it applied for this generation. */
  preparing: "preparing",
  /** Everything the grant needs exists and was observed for this generation. */
  prepared: "prepared",
  /** The workload reported itself ready on the grant. */
  ready: "ready",
  /** Preparation failed for this generation. */
  failed: "failed",
  /** Released with its workloads kept: the devices stay held until an explicit later release. */
  retained: "retained",
  released: "released",
  /** The write was sent, its reply lost: observe before deciding anything. */
  unknown: "unknown",
} as const;
/** One of {@link ClaimStatus}. */
export type ClaimStatus = typeof ClaimStatus[keyof typeof ClaimStatus];

/** What a claim is, as observed. */
export interface ClaimObservation {
  readonly claimId: string;
  readonly owner: string;
  /** The generation the claim's last accepted write asked for. */
  readonly desiredGeneration: string;
  /** The generation the cluster's readiness answers for; null when nothing answered yet. */
  readonly observedGeneration: string | null;
  readonly status: ClaimStatus;
  /** The devices granted, only once prepared; null before. */
  readonly grant: readonly DeviceIdentity[] | null;
  /** What the observation rests on (states read, refusals), for explain and tests. */
  readonly evidence: Readonly<Record<string, unknown>>;
}

/** What a release did. */
export const ReleaseStatus = {
  released: "released",
  /** Workloads were kept: their devices stay held until a later release. */
  retained: "retained",
  /** The expected generation is not the claim's: nothing was touched. */
  stale: "stale",
  /** No such claim was ever reserved here. */
  absent: "absent",
  /** A read or write failed: the release may or may not have happened. */
  unknown: "unknown",
} as const;
/** One of {@link ReleaseStatus}. */
export type ReleaseStatus = typeof ReleaseStatus[keyof typeof ReleaseStatus];

/** What {@link AcceleratorAllocationBackend.release} observed. */
export interface ReleaseObservation {
  readonly claimId: string;
  readonly status: ReleaseStatus;
  /** What is still held (workload ids kept, nodes whose rollback was refused). */
  readonly remaining: readonly string[];
  readonly reason: string;
}

/**
 * How a granted claim reaches a workload: environment for a process, and Kubernetes fragments (plain
 * objects in the external API's schema) for a pod.
 */
export interface WorkloadBindings {
  readonly env: Readonly<Record<string, string>>;
  readonly podFragment: Readonly<Record<string, unknown>>;
  readonly containerFragment: Readonly<Record<string, unknown>>;
  readonly claimManifests: readonly Readonly<Record<string, unknown>>[];
  readonly nodeConstraints: Readonly<Record<string, unknown>>;
}

/** Whether a grant reflects a host read (`observed`) or the launcher went ahead without one. */
export const GrantHost = { observed: "observed", unobserved: "unobserved" } as const;
/** One of {@link GrantHost}. */
export type GrantHost = typeof GrantHost[keyof typeof GrantHost];

/** The environment variable carrying a launcher's {@link DeliveredGrant} to a worker. */
export const GPU_GRANT_ENV = "VF_GPU_GRANT_JSON";

/**
 * What a workload actually received, distinct from what it requested. With `host: unobserved` an empty
 * device list means "could not tell", never "a zero-GPU machine".
 */
export interface DeliveredGrant {
  readonly workloadId: string;
  readonly devices: readonly DeviceIdentity[];
  readonly exclusive: boolean;
  readonly requested: number;
  readonly policy: string;
  readonly host: GrantHost;
}

/** The wire form of a {@link DeviceIdentity} (snake_case, as `VF_GPU_GRANT_JSON` carries it). */
export interface DeviceIdentityDict {
  node: string | null;
  ordinal: number | null;
  uuid: string | null;
  mig_uuid: string | null;
  product: string;
  memory_bytes: number | null;
  mig_profile: string | null;
}

/** The wire form of a {@link DeliveredGrant}. */
export interface DeliveredGrantDict {
  workload_id: string;
  devices: DeviceIdentityDict[];
  exclusive: boolean;
  requested: number;
  policy: string;
  host: GrantHost;
}

/** The snake_case document of a grant. */
export function deliveredGrantToDict(grant: DeliveredGrant): DeliveredGrantDict {
  return {
    workload_id: grant.workloadId,
    devices: grant.devices.map((d) => ({
      node: d.node,
      ordinal: d.ordinal,
      uuid: d.uuid,
      mig_uuid: d.migUuid,
      product: d.product,
      memory_bytes: d.memoryBytes,
      mig_profile: d.migProfile,
    })),
    exclusive: grant.exclusive,
    requested: grant.requested,
    policy: grant.policy,
    host: grant.host,
  };
}

type Check = (value: unknown) => boolean;
const isString: Check = (v) => typeof v === "string";
const nullableString: Check = (v) => v === null || typeof v === "string";
const nullableCount: Check = (v) => v === null || (Number.isSafeInteger(v) && (v as number) >= 0);

function readFields(
  what: string,
  d: unknown,
  fields: Readonly<Record<string, Check>>,
  optional: ReadonlySet<string> = new Set(),
): Record<string, unknown> {
  if (typeof d !== "object" || d === null || Array.isArray(d)) {
    throw new ConfigError(`${what} is not an object`, `write it with deliveredGrantToDict`);
  }
  const record = d as Record<string, unknown>;
  const unknownKeys = Object.keys(record).filter((key) => !Object.hasOwn(fields, key));
  const bad = Object.entries(fields)
    .filter(([key, check]) => !(optional.has(key) && !Object.hasOwn(record, key)) && !check(record[key]))
    .map(([key]) => key);
  if (unknownKeys.length > 0 || bad.length > 0) {
    throw new ConfigError(
      `${what} is malformed: ${
        [...unknownKeys.map((k) => `unknown key ${k}`), ...bad.map((k) => `bad ${k}`)].join(", ")
      }`,
      "write it with deliveredGrantToDict of the same videoflow version",
    );
  }
  return record;
}

const DEVICE_FIELDS: Readonly<Record<string, Check>> = {
  node: nullableString,
  ordinal: nullableCount,
  uuid: nullableString,
  mig_uuid: nullableString,
  product: isString,
  memory_bytes: nullableCount,
  mig_profile: nullableString,
};

const GRANT_FIELDS: Readonly<Record<string, Check>> = {
  workload_id: isString,
  devices: Array.isArray,
  exclusive: (v) => typeof v === "boolean",
  requested: (v) => Number.isSafeInteger(v) && (v as number) >= 0,
  policy: isString,
  host: (v) => v === GrantHost.observed || v === GrantHost.unobserved,
};

/**
 * Reads a grant document ({@link deliveredGrantToDict}'s output, or `VF_GPU_GRANT_JSON` parsed); a
 * missing `host` reads as `observed`. Throws {@link ConfigError} naming every unknown or malformed key.
 */
export function deliveredGrantFromDict(d: unknown): DeliveredGrant {
  const record = readFields("a delivered grant", d, GRANT_FIELDS, new Set(["host"]));
  const devices = (record.devices as unknown[]).map((raw, i) => {
    const dev = readFields(`device ${i} of a delivered grant`, raw, DEVICE_FIELDS, new Set(["mig_profile"]));
    return deviceIdentity({
      node: dev.node as string | null,
      ordinal: dev.ordinal as number | null,
      uuid: dev.uuid as string | null,
      migUuid: dev.mig_uuid as string | null,
      product: dev.product as string,
      memoryBytes: dev.memory_bytes as number | null,
      migProfile: (dev.mig_profile ?? null) as string | null,
    });
  });
  return Object.freeze({
    workloadId: record.workload_id as string,
    devices: Object.freeze(devices),
    exclusive: record.exclusive as boolean,
    requested: record.requested as number,
    policy: record.policy as string,
    host: (record.host ?? GrantHost.observed) as GrantHost,
  });
}

/**
 * The contract. Every I/O method returns a Promise; a read that fails is Unknown (inventory, observe) or
 * an `unknown` status (reserve, release), never a guess. `reserve` and `reconcile` throw OwnershipConflict
 * when a compare-and-swap loses (nothing mutated on the losing side) and UnobservableState when a read
 * they depend on fails before any write.
 */
export interface AcceleratorAllocationBackend {
  /** What this backend, as configured for `environment`, can guarantee. */
  capabilities(environment?: Readonly<Record<string, unknown>>): AllocationCapabilities;
  /** Devices, occupancy, sharing and owners of the hosts in `scope`; Unknown when the hosts cannot be read. */
  inventory(scope?: InventoryScope): Promise<Observation<InventorySnapshot>>;
  /** An advisory placement of every request on `snapshot`, or every reason none exists. */
  plan(requests: readonly WorkloadRequest[], snapshot: InventorySnapshot): Promise<PlanOutcome>;
  /**
   * Takes the plan's devices under compare-and-swap. `expectedGeneration` null: the claim must not exist
   * yet; a reservation repeated by the same operation answers the existing claim.
   */
  reserve(
    plan: FeasiblePlan,
    operationId: string,
    expectedGeneration: string | null,
  ): Promise<ClaimObservation>;
  /** The claim as the cluster shows it now; Unknown when it cannot be read or was never reserved. */
  observe(claimId: string): Promise<Observation<ClaimObservation>>;
  /** Moves the claim toward `desired` (a geometry), fenced by `expectedGeneration`. */
  reconcile(claimId: string, desired: string, expectedGeneration: string): Promise<ClaimObservation>;
  /** Releases the claim if it is still at `expectedGeneration`; idempotent. */
  release(
    claimId: string,
    operationId: string,
    expectedGeneration: string,
    keepWorkloads?: boolean,
  ): Promise<ReleaseObservation>;
  /** How a prepared claim's grant reaches `workloadId`. */
  bindings(claimId: string, workloadId: string): Promise<WorkloadBindings>;
}

function needs(
  request: WorkloadRequest,
  what: string,
  capabilities: AllocationCapabilities,
  offered: string,
): string {
  return `request ${request.workloadId} needs ${what}; adapter ${capabilities.adapter} (authority ` +
    `${capabilities.authority}) ${offered}`;
}

function offeredFeatures(capabilities: AllocationCapabilities): string[] {
  const features = capabilities.versionMatrix.features;
  return Array.isArray(features) ? features.filter((f): f is string => typeof f === "string") : [];
}

/**
 * Why the backend cannot serve `requests`, before anything is planned or written (the
 * validation-before-write boundary); empty means admitted. Each reason names the request, what it needs
 * (a sharing kind, a feature, an enforcement) and what the adapter and authority actually offer, so
 * "this driver version lacks the gate" reads differently from "this hardware cannot do it" (ALLOC-023).
 */
export function allocationRejections(
  requests: readonly WorkloadRequest[],
  capabilities: AllocationCapabilities,
): string[] {
  const reasons: string[] = [];
  const features = offeredFeatures(capabilities);
  const version = String(capabilities.versionMatrix.version ?? "unversioned");
  const sharingOffered: Readonly<Record<RequestSharing, boolean>> = {
    exclusive: capabilities.exclusiveDevice,
    mig: capabilities.isolatedMig,
    "time-sliced": capabilities.cooperativeSharing,
    mps: capabilities.cooperativeSharing,
  };
  for (const request of requests) {
    if (!sharingOffered[request.sharing]) {
      reasons.push(
        needs(request, `${request.sharing} devices`, capabilities, "does not offer that sharing kind"),
      );
    }
    if (request.sharing === RequestSharing.mig && request.deviceCount !== 1) {
      reasons.push(
        `request ${request.workloadId} asks for ${request.deviceCount} MIG slices; a MIG request takes one`,
      );
    }
    if (request.deviceCount > 1 && !capabilities.multiDevice) {
      reasons.push(needs(request, `${request.deviceCount} devices on one host`, capabilities, "grants one"));
    }
    if (request.elasticity === Elasticity.elastic && !capabilities.elastic) {
      reasons.push(needs(request, "an elastic device set", capabilities, "grants fixed sets only"));
    }
    for (const feature of request.features) {
      if (!features.includes(feature)) {
        reasons.push(
          needs(
            request,
            `feature ${feature}`,
            capabilities,
            `version ${version} offers [${features.join(", ")}]`,
          ),
        );
      }
    }
    const named = new Set([
      ...request.features,
      ...(request.sharing === RequestSharing.mps ? [FEATURE_MPS] : []),
    ]);
    for (const [a, b] of EXCLUSIVE_FEATURE_PAIRS) {
      if (named.has(a) && named.has(b)) {
        reasons.push(`request ${request.workloadId} combines ${a} and ${b}, which no backend serves at once`);
      }
    }
    const enforcement = capabilities.memoryEnforcement;
    if (
      request.hardMemoryLimitBytes !== null && !enforcementSatisfies(enforcement, MemoryEnforcement.runtime)
    ) {
      reasons.push(
        needs(request, "an enforced hard memory limit", capabilities, `enforces memory by ${enforcement}`),
      );
    }
    if (
      request.reservedMemoryBytes !== null && !enforcementSatisfies(enforcement, MemoryEnforcement.scheduler)
    ) {
      reasons.push(needs(request, "reserved memory", capabilities, "accounts for no memory"));
    }
  }
  return reasons;
}

/**
 * Why whole-device `requests` found no per-host packing, for a planner whose packing failed: per
 * request, no eligible host at all or fewer free devices on its best eligible host than it needs; when
 * every request fits some host alone, one reason naming the fragmentation (the free devices fit in
 * aggregate, not per host). `free` is host → free whole devices; `eligible` is workload → the hosts it
 * may take. Never empty.
 */
export function packingShortfalls(
  requests: readonly WorkloadRequest[],
  free: Readonly<Record<string, number>>,
  eligible: Readonly<Record<string, ReadonlySet<string>>>,
): string[] {
  const reasons: string[] = [];
  for (const r of requests) {
    const best = Math.max(0, ...[...eligible[r.workloadId]].map((h) => free[h]));
    if (eligible[r.workloadId].size === 0) {
      reasons.push(
        `request ${r.workloadId}: no eligible host (physical, unowned, constraints and memory met)`,
      );
    } else if (best < r.deviceCount) {
      reasons.push(
        `request ${r.workloadId} needs ${r.deviceCount} free whole devices on one host; the most free on an eligible host is ${best}`,
      );
    }
  }
  if (reasons.length === 0) {
    const total = Object.values(free).reduce((a, b) => a + b, 0);
    const hosts = Object.entries(free).map(([h, n]) => `${h}=${n}`).join(", ");
    reasons.push(
      `requests ${
        requests.map((r) => `${r.workloadId}(${r.deviceCount})`).join(", ")
      } fit the ${total} free devices in aggregate but not per host (free: ${hosts}): fragmentation`,
    );
  }
  return reasons;
}

/** The canonical text of a layout (`1g.10gb=2,3g.40gb=1`; empty for none), as plans carry it. */
export function layoutText(layout: Readonly<Record<string, number>>): string {
  return Object.keys(layout).filter((name) => layout[name] > 0).sort().map((name) =>
    `${name}=${layout[name]}`
  )
    .join(",");
}

/** Reads {@link layoutText}; throws {@link ConfigError} for anything else. */
export function parseLayoutText(text: string): Record<string, number> {
  const layout: Record<string, number> = {};
  for (const part of text === "" ? [] : text.split(",")) {
    const match = /^([0-9a-z.+]+)=([1-9][0-9]*)$/.exec(part);
    if (match === null || Object.hasOwn(layout, match[1])) {
      throw new ConfigError(
        `not a MIG layout: ${JSON.stringify(text)}`,
        "write it as profile=count,profile=count",
      );
    }
    layout[match[1]] = Number(match[2]);
  }
  return layout;
}
