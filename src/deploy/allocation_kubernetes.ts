/**
 * The AcceleratorAllocationBackend over the Kubernetes API (spec backends.allocation; issue 17), for the
 * NVIDIA device plugin's authority: whole devices, and the MIG slices a node already has, on nodes as
 * GPU Feature Discovery labels them. Every state it decides on is read from the API server and every
 * ownership write is a compare-and-swap the server enforces.
 *
 * What it reads:
 * - Nodes. GFD's `nvidia.com/gpu.count`, `nvidia.com/gpu.product` and `nvidia.com/gpu.memory` (MiB)
 *   give a node's devices, and `nvidia.com/gpu.sharing-strategy` / `nvidia.com/gpu.replicas` how they
 *   are shared ({@link classifyNode}). GFD names no device UUID: where a node agent publishes the
 *   devices NVML shows in the {@link NodeAnnotation.devices} annotation (ordinal, GPU UUID, memory and
 *   the MIG slices that exist), those identities are used; without it a device has no UUID (null,
 *   counted by `node/ordinal`), never an invented one. A node listing that fails makes the inventory
 *   Unknown, and every write refuses before it starts.
 * - Pods, for occupancy. A running pod that requests `nvidia.com/gpu` (or `nvidia.com/mig-<profile>`) on
 *   a node and is not one of a claim's ({@link CLAIM_POD_LABEL}) holds that many units there. The device
 *   plugin does not publish which devices a pod got, so foreign units are counted against the devices
 *   no claim holds, lowest ordinal first. A pod listing that fails leaves the snapshot `partial` with no
 *   occupancy at all, which may plan but never admits (`occupancy unknown`).
 *
 * What it writes:
 * - The claim's holds on each node it takes devices on, in the {@link NodeAnnotation.holds} annotation
 *   (device key → holders, `<claim>#<workload>`), by a JSON patch that carries the `resourceVersion` it
 *   read: the API server refuses it with 409 when anything wrote the node since, and the loser of a race
 *   gets OwnershipConflict having written nothing that stays (what it wrote on other nodes is taken
 *   back, removing only its own holders, so a stale rollback never removes a newer owner). Every write
 *   names its operation in {@link NodeAnnotation.lastOperation}.
 * - The claim record, a ConfigMap named by the claim in the claims namespace: owner (the operation),
 *   generation, phase and each workload's grant. It is created after the holds landed (a claim that
 *   exists already is a conflict), and replaced under its own `resourceVersion`.
 *
 * Readiness is observed: a claim is `prepared` only while every hold it wrote is still on its node, read
 * now; `ready` once a pod of the claim reports Ready. The grant reaches a pod through
 * {@link KubernetesAllocationBackend.bindings}: the device plugin's resource (`nvidia.com/gpu`, or the
 * slice's `nvidia.com/mig-<profile>`) as the container's limit, the node as a node selector, the claim's
 * pod label, and `CUDA_VISIBLE_DEVICES` / `VF_GPU_GRANT_JSON` naming the held devices. The kubelet's
 * device plugin, not this adapter, picks which devices the container gets, so the grant says what the
 * claim holds and the worker's GPU check compares it with what it sees.
 *
 * What it does not do: change MIG geometry (`reconcile` refuses: no claim here manages any, and a plan
 * that needs a new layout is never made), share devices cooperatively (time-slicing, MPS), or stop a
 * foreign pod from being scheduled onto devices a claim holds (the device plugin does not read claims):
 * its capabilities say so (`admissionBoundary` false, memory enforced by scheduler accounting only).
 *
 * @example
 * ```ts
 * import { ClusterClient } from "./cluster_client.ts";
 * const backend = new KubernetesAllocationBackend(ClusterClient.connect({ server: "https://10.0.0.1:6443", token: "…" }));
 * const inventory = await backend.inventory({ labels: { "nvidia.com/gpu.present": "true" } });
 * if (inventory.kind === "unknown") console.log(`cannot plan: ${inventory.reason}`);
 * ```
 *
 * @module
 */

import {
  type AcceleratorAllocationBackend,
  type AllocationCapabilities,
  allocationCapabilities,
  allocationRejections,
  type ClaimObservation,
  ClaimStatus,
  classifyNode,
  Completeness,
  type DeliveredGrant,
  deliveredGrantFromDict,
  deliveredGrantToDict,
  type DeviceIdentity,
  deviceIdentity,
  deviceKey,
  type FeasiblePlan,
  GfdLabel,
  GPU_GRANT_ENV,
  GrantHost,
  hardConstraintsHold,
  infeasible,
  type InventoryScope,
  type InventorySnapshot,
  MemoryEnforcement,
  NodeSharing,
  packingShortfalls,
  type PlanOutcome,
  type ReleaseObservation,
  ReleaseStatus,
  RequestSharing,
  softlyPreferred,
  type WorkloadBindings,
  type WorkloadRequest,
} from "../backends/allocation.ts";
import { type Clock, systemClock } from "../backends/clock.ts";
import { Barrier, barrier } from "../backends/faults.ts";
import { known, type Observation, requireKnown, unknown, type UnknownReason } from "../backends/outcomes.ts";
import {
  ClusterError,
  ConfigError,
  OwnershipConflict,
  ResourceUnavailable,
  UnobservableState,
} from "../core/errors.ts";
import type { ClusterClient, JsonPatchOperation, LiveObject } from "./cluster_client.ts";
import { DEFAULT_GPU_RESOURCE, GpuNodeLabel, MIG_RESOURCE_PREFIX } from "./gpu_strategy.ts";
import type { KubernetesObject } from "./manifests.ts";

const MIB = 2 ** 20;

/** The GFD labels of a node's devices, beside {@link GpuNodeLabel} and {@link GfdLabel}. */
export const GfdDeviceLabel = {
  count: "nvidia.com/gpu.count",
  product: "nvidia.com/gpu.product",
} as const;

/** The node annotations this adapter reads and writes. */
export const NodeAnnotation = {
  /** The devices NVML shows on the node, as a node agent publishes them (read only). */
  devices: "videoflow.io/gpu-devices",
  /** Device key → the holders (`<claim>#<workload>`) of its units: the claims' ownership record. */
  holds: "videoflow.io/gpu-holds",
  /** The operation id of the last videoflow write to the object. */
  lastOperation: "videoflow.io/last-operation",
} as const;

/** The label a claim's pods carry (value: the claim id), and its claim records (value: `record`). */
export const CLAIM_POD_LABEL = "videoflow.io/gpu-claim";
/** The label naming the workload of a claim's pod. */
export const CLAIM_WORKLOAD_LABEL = "videoflow.io/gpu-workload";
/** The key of a claim record's document in its ConfigMap. */
const CLAIM_KEY = "claim.json";
/** How often a release re-reads a node an unrelated writer changed under it. */
const RELEASE_ATTEMPTS = 5;

/** One device as a node agent publishes it in {@link NodeAnnotation.devices}. */
export interface PublishedDevice {
  readonly ordinal: number;
  readonly uuid: string;
  readonly memory_bytes: number;
  /** The MIG slices that exist on it; absent or empty for a whole device. */
  readonly mig?: readonly {
    readonly uuid: string;
    readonly profile: string;
    readonly memory_bytes: number;
  }[];
}

/** Options of a {@link KubernetesAllocationBackend}. */
export interface KubernetesAllocationOptions {
  /** Where claim records live (`default` unless told). */
  readonly namespace?: string;
  readonly clock?: Clock;
}

/** A node as one read saw it. */
interface NodeView {
  readonly name: string;
  readonly version: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly hasAnnotations: boolean;
  readonly devices: readonly DeviceIdentity[];
  readonly sharing: NodeSharing;
  /** Units one device offers (time-slicing replicas; 1 otherwise). */
  readonly capacity: number;
  readonly holds: ReadonlyMap<string, readonly string[]>;
}

/** A running pod's GPU units on a node. */
interface PodUse {
  readonly node: string;
  readonly claim: string | null;
  readonly ready: boolean;
  /** Resource name → units. */
  readonly units: Readonly<Record<string, number>>;
}

type Phase = "active" | "retained" | "released";

/** A claim record as read back. */
interface ClaimRecord {
  readonly claimId: string;
  readonly owner: string;
  readonly generation: number;
  readonly phase: Phase;
  readonly grants: readonly DeliveredGrant[];
  readonly version: string;
}

function conflict(message: string, context: Record<string, unknown>): OwnershipConflict {
  return new OwnershipConflict(
    message,
    "re-read the inventory and plan again; nothing of this call was kept",
    context,
  );
}

/** The HTTP status of a refused request; null when the server did not answer. */
function statusOf(error: ClusterError): number | null {
  const status = error.context.status;
  return typeof status === "number" ? status : null;
}

/** What a failed read means, as an Unknown's reason. */
function reasonOf(error: ClusterError): UnknownReason {
  const status = statusOf(error);
  if (status === null) return "unreachable";
  if (status === 401 || status === 403) return "auth";
  if (status === 404) return "missing";
  if (status === 408 || status === 504) return "timeout";
  return "api";
}

function pointerKey(key: string): string {
  return key.replaceAll("~", "~0").replaceAll("/", "~1");
}

function holderOf(claimId: string, workloadId: string): string {
  return `${claimId}#${workloadId}`;
}

/** The resource a device is requested as. */
function resourceOf(device: DeviceIdentity): string {
  return device.migProfile === null ? DEFAULT_GPU_RESOURCE : `${MIG_RESOURCE_PREFIX}${device.migProfile}`;
}

function malformed(node: string, what: string): UnobservableState {
  return new UnobservableState(
    `node ${node}: the ${what} cannot be read`,
    `fix or remove the node's ${what}; nothing is decided on a record that cannot be read`,
    { node },
  );
}

function parseDevices(node: string, labels: Readonly<Record<string, string>>, text: string | undefined) {
  const product = labels[GfdDeviceLabel.product] ?? "unknown";
  if (text === undefined) {
    const count = Number(labels[GfdDeviceLabel.count] ?? "0");
    const mib = Number(labels[GpuNodeLabel.memoryMib]);
    const memoryBytes = Number.isSafeInteger(mib) && mib > 0 ? mib * MIB : null;
    if (!Number.isSafeInteger(count) || count < 0) throw malformed(node, `label ${GfdDeviceLabel.count}`);
    return Array.from(
      { length: count },
      (_, ordinal) => deviceIdentity({ node, ordinal, uuid: null, migUuid: null, product, memoryBytes }),
    );
  }
  let published: unknown;
  try {
    published = JSON.parse(text);
  } catch {
    throw malformed(node, `annotation ${NodeAnnotation.devices}`);
  }
  if (!Array.isArray(published)) throw malformed(node, `annotation ${NodeAnnotation.devices}`);
  const devices: DeviceIdentity[] = [];
  for (const raw of published as PublishedDevice[]) {
    const sound = typeof raw === "object" && raw !== null && Number.isSafeInteger(raw.ordinal) &&
      typeof raw.uuid === "string" && Number.isSafeInteger(raw.memory_bytes);
    if (!sound) throw malformed(node, `annotation ${NodeAnnotation.devices}`);
    const base = { node, ordinal: raw.ordinal, uuid: raw.uuid, product };
    if ((raw.mig ?? []).length === 0) {
      devices.push(deviceIdentity({ ...base, migUuid: null, memoryBytes: raw.memory_bytes }));
      continue;
    }
    for (const slice of raw.mig ?? []) {
      if (typeof slice.uuid !== "string" || typeof slice.profile !== "string") {
        throw malformed(node, `annotation ${NodeAnnotation.devices}`);
      }
      devices.push(deviceIdentity({
        ...base,
        migUuid: slice.uuid,
        memoryBytes: slice.memory_bytes,
        migProfile: slice.profile,
      }));
    }
  }
  return devices;
}

function parseHolds(node: string, text: string | undefined): Map<string, readonly string[]> {
  if (text === undefined) return new Map();
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw malformed(node, `annotation ${NodeAnnotation.holds}`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw malformed(node, `annotation ${NodeAnnotation.holds}`);
  }
  const holds = new Map<string, readonly string[]>();
  for (const [key, holders] of Object.entries(value)) {
    if (!Array.isArray(holders) || !holders.every((h) => typeof h === "string")) {
      throw malformed(node, `annotation ${NodeAnnotation.holds}`);
    }
    holds.set(key, Object.freeze([...holders]));
  }
  return holds;
}

function viewOf(node: LiveObject): NodeView {
  const { name, labels, annotations, resourceVersion } = node.metadata;
  const devices = parseDevices(name, labels, annotations[NodeAnnotation.devices]);
  const sharing = classifyNode(labels, devices.length, devices.some((d) => d.migProfile !== null));
  const shared = sharing === NodeSharing.timeSliced || sharing === NodeSharing.mps;
  const replicas = Number(labels[GfdLabel.replicas] ?? "1");
  return Object.freeze({
    name,
    version: resourceVersion,
    labels,
    hasAnnotations: Object.keys(annotations).length > 0,
    devices: Object.freeze(devices),
    sharing,
    capacity: shared && Number.isSafeInteger(replicas) && replicas > 1 ? replicas : 1,
    holds: parseHolds(name, annotations[NodeAnnotation.holds]),
  });
}

function podUseOf(pod: LiveObject): PodUse | null {
  const spec = (pod.spec ?? {}) as {
    nodeName?: string;
    containers?: { resources?: { limits?: Record<string, unknown>; requests?: Record<string, unknown> } }[];
  };
  const status = (pod.status ?? {}) as { phase?: string; conditions?: { type?: string; status?: string }[] };
  if (spec.nodeName === undefined || status.phase === "Succeeded" || status.phase === "Failed") return null;
  const units: Record<string, number> = {};
  for (const container of spec.containers ?? []) {
    const amounts = { ...(container.resources?.requests ?? {}), ...(container.resources?.limits ?? {}) };
    for (const [resource, amount] of Object.entries(amounts)) {
      if (resource !== DEFAULT_GPU_RESOURCE && !resource.startsWith(MIG_RESOURCE_PREFIX)) continue;
      units[resource] = (units[resource] ?? 0) + Number(amount);
    }
  }
  if (Object.keys(units).length === 0) return null;
  return {
    node: spec.nodeName,
    claim: pod.metadata.labels[CLAIM_POD_LABEL] ?? null,
    ready: (status.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True"),
    units,
  };
}

/** Device key → units in use on `view`: its holds, and foreign pods' units on the devices no claim holds. */
function occupancyOf(view: NodeView, pods: readonly PodUse[]): Record<string, number> {
  const occupancy: Record<string, number> = {};
  for (const [key, holders] of view.holds) if (holders.length > 0) occupancy[key] = holders.length;
  for (const pod of pods) {
    if (pod.node !== view.name || pod.claim !== null) continue;
    for (const [resource, amount] of Object.entries(pod.units)) {
      const pool = view.devices.filter((d) =>
        resourceOf(d) === resource || resource === DEFAULT_GPU_RESOURCE
      );
      let left = amount;
      for (const device of pool) {
        const key = deviceKey(device);
        while (left > 0 && (occupancy[key] ?? 0) < view.capacity) {
          occupancy[key] = (occupancy[key] ?? 0) + 1;
          left--;
        }
      }
      // More units than the node has: shown on its first device, never dropped.
      if (left > 0 && pool.length > 0) {
        const key = deviceKey(pool[0]);
        occupancy[key] = (occupancy[key] ?? 0) + left;
      }
    }
  }
  return occupancy;
}

/**
 * Per-host placement of whole-device requests: workload → host, or null when none exists. Exhaustive
 * backtracking, the largest requests first; each request tries its preferred hosts first, and among
 * them the tightest fit.
 */
function packRequests(
  requests: readonly WorkloadRequest[],
  free: Readonly<Record<string, number>>,
  eligible: Readonly<Record<string, readonly string[]>>,
  preferred: Readonly<Record<string, ReadonlySet<string>>>,
): Record<string, string> | null {
  const order = [...requests].sort((a, b) =>
    b.deviceCount - a.deviceCount || a.workloadId.localeCompare(b.workloadId)
  );
  const left = { ...free };
  const chosen: Record<string, string> = {};
  const place = (index: number): boolean => {
    if (index === order.length) return true;
    const r = order[index];
    const hosts = eligible[r.workloadId]
      .filter((h) => left[h] >= r.deviceCount)
      .sort((a, b) =>
        Number(preferred[r.workloadId].has(b)) - Number(preferred[r.workloadId].has(a)) ||
        left[a] - left[b] || a.localeCompare(b)
      );
    for (const host of hosts) {
      left[host] -= r.deviceCount;
      chosen[r.workloadId] = host;
      if (place(index + 1)) return true;
      left[host] += r.deviceCount;
      delete chosen[r.workloadId];
    }
    return false;
  };
  return place(0) ? chosen : null;
}

function randomId(): string {
  return crypto.randomUUID().replaceAll("-", "").slice(0, 16);
}

/** The AcceleratorAllocationBackend over a Kubernetes cluster's nodes and pods (see the module doc). */
export class KubernetesAllocationBackend implements AcceleratorAllocationBackend {
  readonly #cluster: ClusterClient;
  readonly #namespace: string;
  readonly #clock: Clock;
  /** Plan id → its requests: a plan is reserved by the backend that made it. */
  readonly #plans = new Map<string, ReadonlyMap<string, WorkloadRequest>>();
  /** Node → its labels as last read: a snapshot carries none, and constraints are checked against these. */
  readonly #labels = new Map<string, Readonly<Record<string, string>>>();

  /** A backend on `cluster`, its claim records in `options.namespace` (`default`). */
  constructor(cluster: ClusterClient, options: KubernetesAllocationOptions = {}) {
    this.#cluster = cluster;
    this.#namespace = options.namespace ?? "default";
    this.#clock = options.clock ?? systemClock;
  }

  /**
   * The device plugin's guarantees: exclusive whole devices and existing MIG slices, several devices on
   * one host, memory accounted by the scheduler only, no admission boundary and no feature of the
   * matrix. `environment.version` / `environment.features` override the version matrix.
   */
  capabilities(environment: Readonly<Record<string, unknown>> = {}): AllocationCapabilities {
    return allocationCapabilities({
      adapter: "kubernetes",
      authority: "device-plugin",
      exclusiveDevice: true,
      isolatedMig: true,
      cooperativeSharing: false,
      memoryEnforcement: MemoryEnforcement.scheduler,
      multiDevice: true,
      topologyVerification: false,
      elastic: false,
      admissionBoundary: false,
      versionMatrix: {
        version: typeof environment.version === "string" ? environment.version : "kubernetes-device-plugin/1",
        features: Array.isArray(environment.features) ? [...environment.features] : [],
        api_server: this.#cluster.server,
      },
    });
  }

  async inventory(scope: InventoryScope = {}): Promise<Observation<InventorySnapshot>> {
    let views: NodeView[];
    try {
      views = await this.#listNodes(scope);
    } catch (error) {
      if (error instanceof ClusterError) return unknown(reasonOf(error), this.#clock, error.message);
      if (error instanceof UnobservableState) return unknown("malformed", this.#clock, error.message);
      throw error;
    }
    let pods: PodUse[] | null = null;
    try {
      pods = await this.#listPods();
    } catch (error) {
      if (!(error instanceof ClusterError)) throw error;
    }
    const occupancy: Record<string, number> = {};
    const sharing: Record<string, NodeSharing> = {};
    for (const view of views) {
      sharing[view.name] = view.sharing;
      if (pods !== null) Object.assign(occupancy, occupancyOf(view, pods));
    }
    const generation = views.map((v) => `${v.name}@${v.version}`).join(",");
    return known<InventorySnapshot>(
      Object.freeze({
        devices: Object.freeze(views.flatMap((v) => v.devices)),
        occupancy: Object.freeze(occupancy),
        sharing: Object.freeze(sharing),
        owners: Object.freeze({}),
        completeness: pods === null ? Completeness.partial : Completeness.complete,
        observedAt: this.#clock.monotonic(),
        generation,
      }),
      this.#clock,
      generation,
    );
  }

  plan(requests: readonly WorkloadRequest[], snapshot: InventorySnapshot): Promise<PlanOutcome> {
    return Promise.try(() => {
      const ids = requests.map((r) => r.workloadId);
      const duplicate = ids.find((id, i) => ids.indexOf(id) !== i);
      if (duplicate !== undefined) {
        throw new ConfigError(`workload ${duplicate} is requested twice in one plan`);
      }
      const rejections = allocationRejections(requests, this.capabilities());
      if (rejections.length > 0) return infeasible(rejections);
      if (snapshot.completeness !== Completeness.complete) return infeasible(["occupancy unknown"]);
      const taken = new Set<string>();
      const isFree = (d: DeviceIdentity) =>
        !taken.has(deviceKey(d)) && (snapshot.occupancy[deviceKey(d)] ?? 0) === 0;
      const reasons: string[] = [];
      const assignments: Record<string, DeviceIdentity[]> = {};
      const labelsOf = (node: string) => this.#labels.get(node) ?? {};
      const whole = requests.filter((r) => r.sharing === RequestSharing.exclusive);
      if (whole.length > 0) {
        const hosts = Object.keys(snapshot.sharing).filter((h) =>
          snapshot.sharing[h] === NodeSharing.physical
        );
        const freeOn = (host: string) =>
          snapshot.devices.filter((d) => d.node === host && d.migProfile === null && isFree(d));
        const free = Object.fromEntries(hosts.map((h) => [h, freeOn(h).length]));
        const eligible: Record<string, string[]> = {};
        const preferred: Record<string, Set<string>> = {};
        for (const r of whole) {
          const min = r.minimumUsableMemoryBytes ?? 0;
          eligible[r.workloadId] = hosts.filter((h) =>
            hardConstraintsHold(r.constraints, labelsOf(h)) &&
            snapshot.devices.filter((d) => d.node === h).every((d) =>
              d.memoryBytes !== null && d.memoryBytes >= min
            )
          );
          preferred[r.workloadId] = new Set(hosts.filter((h) => softlyPreferred(r.constraints, labelsOf(h))));
        }
        const packing = packRequests(whole, free, eligible, preferred);
        if (packing === null) {
          const sets = Object.fromEntries(Object.entries(eligible).map(([w, h]) => [w, new Set(h)]));
          reasons.push(...packingShortfalls(whole, free, sets));
        } else {
          for (const r of whole) {
            const devices = freeOn(packing[r.workloadId]).slice(0, r.deviceCount);
            for (const d of devices) taken.add(deviceKey(d));
            assignments[r.workloadId] = devices;
          }
        }
      }
      for (const r of requests.filter((r) => r.sharing === RequestSharing.mig)) {
        const min = r.minimumUsableMemoryBytes ?? 0;
        const slice = snapshot.devices
          .filter((d) =>
            d.migProfile !== null && d.memoryBytes !== null && d.memoryBytes >= min && isFree(d) &&
            hardConstraintsHold(r.constraints, labelsOf(d.node ?? ""))
          )
          .sort((a, b) => (a.memoryBytes ?? 0) - (b.memoryBytes ?? 0))[0];
        if (slice === undefined) {
          reasons.push(
            `request ${r.workloadId}: no free MIG slice of at least ${(min / 2 ** 30).toFixed(1)} GiB, and ` +
              "authority device-plugin cannot change geometry",
          );
          continue;
        }
        taken.add(deviceKey(slice));
        assignments[r.workloadId] = [slice];
      }
      if (reasons.length > 0) return infeasible(reasons);
      const planId = `plan-${randomId()}`;
      this.#plans.set(planId, new Map(requests.map((r) => [r.workloadId, r])));
      return Object.freeze<FeasiblePlan>({
        kind: "feasible",
        assignments: Object.freeze(
          Object.fromEntries(Object.entries(assignments).map(([w, d]) => [w, Object.freeze(d)])),
        ),
        geometry: Object.freeze({}),
        snapshotGeneration: snapshot.generation,
        planId,
        notes: Object.freeze([]),
      });
    });
  }

  async reserve(
    plan: FeasiblePlan,
    operationId: string,
    expectedGeneration: string | null,
  ): Promise<ClaimObservation> {
    const requests = this.#plans.get(plan.planId);
    if (requests === undefined) {
      throw new ConfigError(
        `plan ${plan.planId} was not made by this backend`,
        "plan on this backend's inventory",
      );
    }
    if (Object.keys(plan.geometry).length > 0) {
      throw new ConfigError(
        `plan ${plan.planId} changes MIG geometry, which the device plugin's authority cannot`,
        "plan on this backend: it grants the slices that exist",
      );
    }
    const claimId = `claim-${plan.planId.slice("plan-".length)}`;
    const existing = await this.#readClaimOrThrow(claimId);
    if (existing !== null) {
      const same = existing.owner === operationId && existing.phase === "active" &&
        (expectedGeneration === null || expectedGeneration === String(existing.generation));
      if (!same) {
        throw conflict(
          `claim ${claimId} already exists, owned by ${existing.owner} at generation ${existing.generation}`,
          { claim_id: claimId },
        );
      }
      return requireKnown(await this.#observeRecord(existing), `claim ${claimId}`);
    }
    if (expectedGeneration !== null) {
      throw conflict(`claim ${claimId} does not exist at generation ${expectedGeneration}`, {
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
    const pods = await this.#readOrThrow(() => this.#listPods(), "the pod listing");
    const reads: NodeView[] = [];
    for (const name of [...byNode.keys()].sort()) {
      reads.push(await this.#readOrThrow(() => this.#readNode(name), `node ${name}`));
      await barrier(Barrier.ownerReadAfter, { node: name, op_id: operationId });
    }
    for (const view of reads) this.#checkFree(view, byNode.get(view.name)!, pods);
    const done: NodeView[] = [];
    let lost = false;
    for (const view of reads) {
      const holds = new Map(view.holds);
      for (const { workload, device } of byNode.get(view.name)!) {
        const key = deviceKey(device);
        holds.set(key, [...(holds.get(key) ?? []), holderOf(claimId, workload)]);
      }
      await barrier(Barrier.ownerUpdateBefore, { node: view.name, op_id: operationId });
      try {
        await this.#cluster.patchNode(view.name, this.#holdsPatch(view, holds, operationId));
      } catch (error) {
        await this.#rollback(claimId, operationId, done);
        if (error instanceof ClusterError && statusOf(error) === 409) {
          throw conflict(`node ${view.name} changed since it was read; the write was refused`, {
            node: view.name,
            op_id: operationId,
          });
        }
        throw error;
      }
      done.push(view);
      const hit = await barrier(Barrier.ownerUpdateAfter, { node: view.name, op_id: operationId });
      lost ||= hit.dropResponse;
    }
    const grants = Object.entries(plan.assignments).map(([workload, devices]) => {
      const request = requests.get(workload)!;
      return {
        workloadId: workload,
        devices,
        exclusive: true,
        requested: request.deviceCount,
        policy: request.sharing,
        host: GrantHost.observed,
      } satisfies DeliveredGrant;
    });
    try {
      await this.#cluster.create(this.#claimObject(claimId, operationId, 1, "active", grants, operationId));
    } catch (error) {
      await this.#rollback(claimId, operationId, done);
      if (error instanceof ClusterError && statusOf(error) === 409) {
        throw conflict(`claim ${claimId} was created by another writer`, { claim_id: claimId });
      }
      throw error;
    }
    const observation: ClaimObservation = Object.freeze({
      claimId,
      owner: operationId,
      desiredGeneration: "1",
      observedGeneration: null,
      status: lost ? ClaimStatus.unknown : ClaimStatus.allocated,
      grant: null,
      evidence: Object.freeze(
        lost
          ? { reason: "the write's reply was lost; observe the claim" }
          : { nodes: reads.map((v) => v.name) },
      ),
    });
    return observation;
  }

  async observe(claimId: string): Promise<Observation<ClaimObservation>> {
    let record: ClaimRecord | null;
    try {
      record = await this.#readClaim(claimId);
    } catch (error) {
      if (error instanceof ClusterError) return unknown(reasonOf(error), this.#clock, error.message);
      if (error instanceof UnobservableState) return unknown("malformed", this.#clock, error.message);
      throw error;
    }
    if (record === null) return unknown("missing", this.#clock, `no claim ${claimId} was reserved here`);
    return await this.#observeRecord(record);
  }

  async reconcile(claimId: string, desired: string, expectedGeneration: string): Promise<ClaimObservation> {
    const record = await this.#readClaimOrThrow(claimId);
    if (record === null) throw new ConfigError(`no claim ${claimId} was reserved here`);
    if (String(record.generation) !== expectedGeneration || record.phase !== "active") {
      throw conflict(
        `claim ${claimId} is at generation ${record.generation} (${record.phase}), not ${expectedGeneration}`,
        { claim_id: claimId },
      );
    }
    throw new ConfigError(
      `claim ${claimId} manages no MIG geometry, so it cannot move to ${JSON.stringify(desired)}`,
      "reconcile only claims whose plan changed geometry: the device plugin's authority grants existing slices",
      { claim_id: claimId },
    );
  }

  async release(
    claimId: string,
    operationId: string,
    expectedGeneration: string,
    keepWorkloads = false,
  ): Promise<ReleaseObservation> {
    const answer = (status: ReleaseStatus, reason: string, remaining: readonly string[] = []) =>
      Object.freeze({ claimId, status, remaining: Object.freeze([...remaining]), reason });
    let record: ClaimRecord | null;
    try {
      record = await this.#readClaim(claimId);
    } catch (error) {
      if (!(error instanceof ClusterError || error instanceof UnobservableState)) throw error;
      return answer(ReleaseStatus.unknown, `the claim could not be read: ${error.message}`);
    }
    if (record === null) return answer(ReleaseStatus.absent, `no claim ${claimId} was reserved here`);
    if (record.phase === "released") return answer(ReleaseStatus.released, "already released");
    if (String(record.generation) !== expectedGeneration) {
      return answer(
        ReleaseStatus.stale,
        `claim is at generation ${record.generation}, not ${expectedGeneration}`,
      );
    }
    const held = record.grants.map((g) => g.workloadId).sort();
    if (keepWorkloads) {
      const kept = await this.#writePhase(record, "retained", operationId);
      return kept === null
        ? answer(
          ReleaseStatus.retained,
          "workloads kept: their devices stay held until a later release",
          held,
        )
        : answer(ReleaseStatus.unknown, kept);
    }
    const nodes = [...new Set(record.grants.flatMap((g) => g.devices.map((d) => d.node ?? "")))].sort();
    const views: NodeView[] = [];
    try {
      for (const name of nodes) views.push(await this.#readNode(name));
    } catch (error) {
      if (!(error instanceof ClusterError || error instanceof UnobservableState)) throw error;
      return answer(ReleaseStatus.unknown, `a read failed (${error.message}); nothing was released`);
    }
    for (let view of views) {
      for (let attempt = 1;; attempt++) {
        const holds = withoutHolders(view.holds, claimId);
        if (holds === null) break;
        await barrier(Barrier.ownerUpdateBefore, { node: view.name, op_id: operationId });
        try {
          await this.#cluster.patchNode(view.name, this.#holdsPatch(view, holds, operationId));
        } catch (error) {
          if (!(error instanceof ClusterError)) throw error;
          if (statusOf(error) !== 409 || attempt === RELEASE_ATTEMPTS) {
            return answer(ReleaseStatus.unknown, `releasing on ${view.name} failed: ${error.message}`);
          }
          try {
            view = await this.#readNode(view.name);
          } catch (reread) {
            if (!(reread instanceof ClusterError || reread instanceof UnobservableState)) throw reread;
            return answer(
              ReleaseStatus.unknown,
              `node ${view.name} could not be read again: ${reread.message}`,
            );
          }
          continue;
        }
        const hit = await barrier(Barrier.ownerUpdateAfter, { node: view.name, op_id: operationId });
        if (hit.dropResponse) {
          return answer(ReleaseStatus.unknown, "the release reply was lost; observe to confirm");
        }
        break;
      }
    }
    const failed = await this.#writePhase(record, "released", operationId);
    return failed === null ? answer(ReleaseStatus.released, "") : answer(ReleaseStatus.unknown, failed);
  }

  async bindings(claimId: string, workloadId: string): Promise<WorkloadBindings> {
    const record = await this.#readClaimOrThrow(claimId);
    if (record === null) throw new ConfigError(`no claim ${claimId} was reserved here`);
    const grant = record.grants.find((g) => g.workloadId === workloadId);
    if (grant === undefined) throw new ConfigError(`claim ${claimId} has no workload ${workloadId}`);
    const observation = requireKnown(await this.#observeRecord(record), `claim ${claimId}`);
    if (observation.grant === null) {
      throw new ResourceUnavailable(
        `claim ${claimId} is ${observation.status}: no grant to bind ${workloadId} to yet`,
        "observe the claim until it is prepared",
        { claim_id: claimId },
      );
    }
    const devices = grant.devices;
    const selector = { "kubernetes.io/hostname": devices[0]?.node ?? "" };
    const resource = devices[0] === undefined ? DEFAULT_GPU_RESOURCE : resourceOf(devices[0]);
    return Object.freeze({
      env: Object.freeze({
        CUDA_VISIBLE_DEVICES: devices.map((d) => d.migUuid ?? d.uuid ?? String(d.ordinal)).join(","),
        [GPU_GRANT_ENV]: JSON.stringify(deliveredGrantToDict(grant)),
      }),
      podFragment: Object.freeze({
        metadata: { labels: { [CLAIM_POD_LABEL]: claimId, [CLAIM_WORKLOAD_LABEL]: workloadId } },
        spec: { nodeSelector: selector },
      }),
      containerFragment: Object.freeze({ resources: { limits: { [resource]: String(devices.length) } } }),
      claimManifests: Object.freeze([]),
      nodeConstraints: Object.freeze({ nodeSelector: selector }),
    });
  }

  // ----- internals -----

  async #listNodes(scope: InventoryScope): Promise<NodeView[]> {
    const selector = Object.entries(scope.labels ?? {}).map(([k, v]) => `${k}=${v}`).join(",");
    const nodes = await this.#cluster.list("v1", "Node", "", selector);
    const views = nodes
      .filter((n) => scope.nodes === undefined || scope.nodes.includes(n.metadata.name))
      .map(viewOf)
      .sort((a, b) => a.name.localeCompare(b.name));
    for (const view of views) this.#labels.set(view.name, view.labels);
    return views;
  }

  async #listPods(): Promise<PodUse[]> {
    const pods = await this.#cluster.list("v1", "Pod", "", "");
    return pods.map(podUseOf).filter((p): p is PodUse => p !== null);
  }

  async #readNode(name: string): Promise<NodeView> {
    const node = await this.#cluster.read({ apiVersion: "v1", kind: "Node", namespace: "", name });
    if (node === null) throw malformed(name, "node object (it no longer exists)");
    const view = viewOf(node);
    this.#labels.set(view.name, view.labels);
    return view;
  }

  /** `read()`, a failure as {@link UnobservableState} (a write depended on it and nothing was written). */
  async #readOrThrow<T>(read: () => Promise<T>, what: string): Promise<T> {
    try {
      return await read();
    } catch (error) {
      if (!(error instanceof ClusterError)) throw error;
      throw new UnobservableState(
        `${what} could not be read: ${error.message}`,
        "retry once the API answers",
        {
          reason: reasonOf(error),
        },
      );
    }
  }

  /** Throws OwnershipConflict unless every planned device of `view` is still free for the claim. */
  #checkFree(view: NodeView, placed: readonly { device: DeviceIdentity }[], pods: readonly PodUse[]): void {
    const foreign: Record<string, number> = {};
    for (const pod of pods) {
      if (pod.node !== view.name || pod.claim !== null) continue;
      for (const [resource, amount] of Object.entries(pod.units)) {
        foreign[resource] = (foreign[resource] ?? 0) + amount;
      }
    }
    const counts = new Map<string, number>();
    for (const { device } of placed) {
      const key = deviceKey(device);
      counts.set(key, (counts.get(key) ?? 0) + 1);
      const held = (view.holds.get(key)?.length ?? 0) + counts.get(key)!;
      if (!view.devices.some((d) => deviceKey(d) === key) || held > view.capacity) {
        throw conflict(`device ${key} on ${view.name} is no longer free`, { node: view.name, device: key });
      }
    }
    for (const [resource, amount] of Object.entries(foreign)) {
      const pool = view.devices.filter((d) =>
        resourceOf(d) === resource || resource === DEFAULT_GPU_RESOURCE
      );
      const held = pool.reduce((sum, d) => sum + (view.holds.get(deviceKey(d))?.length ?? 0), 0) +
        placed.filter(({ device }) => pool.some((d) => deviceKey(d) === deviceKey(device))).length;
      if (held + amount > pool.length * view.capacity) {
        throw conflict(
          `node ${view.name}: foreign pods now use ${amount} ${resource}, too many to add the claim`,
          {
            node: view.name,
          },
        );
      }
    }
  }

  /** The JSON patch that writes `holds` on `view`'s node while it is still at the version read. */
  #holdsPatch(
    view: NodeView,
    holds: ReadonlyMap<string, readonly string[]>,
    operationId: string,
  ): JsonPatchOperation[] {
    const record = JSON.stringify(Object.fromEntries([...holds].filter(([, h]) => h.length > 0).sort()));
    const annotations = { [NodeAnnotation.holds]: record, [NodeAnnotation.lastOperation]: operationId };
    return [
      { op: "replace", path: "/metadata/resourceVersion", value: view.version },
      ...(view.hasAnnotations
        ? Object.entries(annotations).map(([key, value]) => ({
          op: "add" as const,
          path: `/metadata/annotations/${pointerKey(key)}`,
          value,
        }))
        : [{ op: "add" as const, path: "/metadata/annotations", value: annotations }]),
    ];
  }

  /** Takes this claim's holders off the nodes it wrote, re-reading each; never anyone else's. */
  async #rollback(claimId: string, operationId: string, done: readonly NodeView[]): Promise<void> {
    for (const written of done.toReversed()) {
      for (let attempt = 1; attempt <= RELEASE_ATTEMPTS; attempt++) {
        const view = await this.#readNode(written.name);
        const holds = withoutHolders(view.holds, claimId);
        if (holds === null) break;
        try {
          await this.#cluster.patchNode(view.name, this.#holdsPatch(view, holds, operationId));
          break;
        } catch (error) {
          if (!(error instanceof ClusterError) || statusOf(error) !== 409 || attempt === RELEASE_ATTEMPTS) {
            throw error;
          }
        }
      }
    }
  }

  #claimObject(
    claimId: string,
    owner: string,
    generation: number,
    phase: Phase,
    grants: readonly DeliveredGrant[],
    operationId: string,
  ): KubernetesObject {
    return {
      apiVersion: "v1",
      kind: "ConfigMap",
      metadata: {
        name: claimId,
        namespace: this.#namespace,
        labels: { [CLAIM_POD_LABEL]: "record" },
        annotations: { [NodeAnnotation.lastOperation]: operationId },
      },
      data: {
        [CLAIM_KEY]: JSON.stringify({ owner, generation, phase, grants: grants.map(deliveredGrantToDict) }),
      },
    };
  }

  async #readClaim(claimId: string): Promise<ClaimRecord | null> {
    const object = await this.#cluster.read({
      apiVersion: "v1",
      kind: "ConfigMap",
      namespace: this.#namespace,
      name: claimId,
    });
    if (object === null) return null;
    const text = (object.data as Record<string, string> | undefined)?.[CLAIM_KEY];
    let document: { owner?: unknown; generation?: unknown; phase?: unknown; grants?: unknown };
    try {
      document = JSON.parse(text ?? "");
    } catch {
      throw new UnobservableState(
        `the record of claim ${claimId} cannot be read`,
        "fix or remove its ConfigMap",
      );
    }
    const phases: readonly unknown[] = ["active", "retained", "released"];
    if (
      typeof document.owner !== "string" || !Number.isSafeInteger(document.generation) ||
      !phases.includes(document.phase) || !Array.isArray(document.grants)
    ) {
      throw new UnobservableState(
        `the record of claim ${claimId} is malformed`,
        "fix or remove its ConfigMap",
      );
    }
    return Object.freeze({
      claimId,
      owner: document.owner,
      generation: document.generation as number,
      phase: document.phase as Phase,
      grants: Object.freeze(document.grants.map(deliveredGrantFromDict)),
      version: object.metadata.resourceVersion,
    });
  }

  async #readClaimOrThrow(claimId: string): Promise<ClaimRecord | null> {
    return await this.#readOrThrow(() => this.#readClaim(claimId), `claim ${claimId}`);
  }

  /** Replaces the record's phase under its version; null when written, else why not (re-read, retried). */
  async #writePhase(record: ClaimRecord, phase: Phase, operationId: string): Promise<string | null> {
    let current = record;
    for (let attempt = 1;; attempt++) {
      try {
        await this.#cluster.replace(
          this.#claimObject(
            current.claimId,
            current.owner,
            current.generation,
            phase,
            current.grants,
            operationId,
          ),
          current.version,
        );
        return null;
      } catch (error) {
        if (!(error instanceof ClusterError)) throw error;
        if (statusOf(error) !== 409 || attempt === RELEASE_ATTEMPTS) {
          return `the claim record could not be written: ${error.message}`;
        }
      }
      const again = await this.#readClaim(current.claimId).catch((error) => {
        if (error instanceof ClusterError || error instanceof UnobservableState) return null;
        throw error;
      });
      if (again === null || again.generation !== record.generation) {
        return "the claim record changed under the write";
      }
      current = again;
    }
  }

  async #observeRecord(record: ClaimRecord): Promise<Observation<ClaimObservation>> {
    const nodes = [...new Set(record.grants.flatMap((g) => g.devices.map((d) => d.node ?? "")))].sort();
    const views: NodeView[] = [];
    try {
      for (const name of nodes) views.push(await this.#readNode(name));
    } catch (error) {
      if (error instanceof ClusterError) return unknown(reasonOf(error), this.#clock, error.message);
      if (error instanceof UnobservableState) return unknown("malformed", this.#clock, error.message);
      throw error;
    }
    const missing: string[] = [];
    for (const grant of record.grants) {
      for (const device of grant.devices) {
        const view = views.find((v) => v.name === device.node);
        const holder = holderOf(record.claimId, grant.workloadId);
        if (!(view?.holds.get(deviceKey(device)) ?? []).includes(holder)) {
          missing.push(`${holder}@${deviceKey(device)}`);
        }
      }
    }
    let status: ClaimStatus;
    const evidence: Record<string, unknown> = {
      nodes: Object.fromEntries(views.map((v) => [v.name, v.version])),
    };
    if (record.phase === "released") status = ClaimStatus.released;
    else if (record.phase === "retained") status = ClaimStatus.retained;
    else if (missing.length > 0) {
      status = ClaimStatus.failed;
      evidence.missing_holds = missing;
    } else {
      status = ClaimStatus.prepared;
      try {
        const pods = (await this.#listPods()).filter((p) => p.claim === record.claimId);
        if (pods.length > 0 && pods.every((p) => p.ready)) status = ClaimStatus.ready;
      } catch (error) {
        if (!(error instanceof ClusterError)) throw error;
        evidence.readiness = `unread: ${error.message}`;
      }
    }
    const granted = status === ClaimStatus.prepared || status === ClaimStatus.ready ||
      status === ClaimStatus.retained;
    return known(
      Object.freeze({
        claimId: record.claimId,
        owner: record.owner,
        desiredGeneration: String(record.generation),
        observedGeneration: missing.length === 0 ? String(record.generation) : null,
        status,
        grant: granted ? Object.freeze(record.grants.flatMap((g) => g.devices)) : null,
        evidence: Object.freeze(evidence),
      }),
      this.#clock,
      record.version,
    );
  }
}

/** `holds` without any holder of `claimId`; null when it held nothing there. */
function withoutHolders(
  holds: ReadonlyMap<string, readonly string[]>,
  claimId: string,
): Map<string, readonly string[]> | null {
  let changed = false;
  const kept = new Map<string, readonly string[]>();
  for (const [key, holders] of holds) {
    const left = holders.filter((h) => !h.startsWith(`${claimId}#`));
    changed ||= left.length !== holders.length;
    if (left.length > 0) kept.set(key, left);
  }
  return changed ? kept : null;
}
