/**
 * The AcceleratorAllocationBackend over the Kubernetes API (spec backends.allocation; issue 17), as one
 * of two authorities: the NVIDIA device plugin's (whole devices, and the MIG slices a node already has)
 * or managed MIG (the same, and new slices carved by asking the NVIDIA MIG manager for a node's
 * geometry). Every state it decides on is read from the API server and every ownership write is a
 * compare-and-swap the server enforces.
 *
 * What it reads:
 * - Nodes. GFD's `nvidia.com/gpu.count`, `nvidia.com/gpu.product` and `nvidia.com/gpu.memory` (MiB)
 *   give a node's devices, and `nvidia.com/gpu.sharing-strategy` / `nvidia.com/gpu.replicas` how they
 *   are shared ({@link classifyNode}). GFD names no device UUID: where a node agent publishes the
 *   devices NVML shows in the {@link NodeAnnotation.devices} annotation (ordinal, GPU UUID, memory, the
 *   MIG slices that exist and the GPU's MIG geometry), those are used; without it a device has no UUID
 *   (null, counted by `node/ordinal`), never an invented one, and no geometry can be planned. A node
 *   listing that fails makes the inventory Unknown, and every write refuses before it starts.
 * - Pods, for occupancy. A running pod that requests `nvidia.com/gpu` (or `nvidia.com/mig-<profile>`) on
 *   a node and is not one of a claim's ({@link CLAIM_POD_LABEL}) holds that many units there. The device
 *   plugin does not publish which devices a pod got, so foreign units are counted against the devices
 *   no claim holds, lowest ordinal first. A pod listing that fails leaves the snapshot `partial` with no
 *   occupancy at all, which may plan but never admits (`occupancy unknown`).
 *
 * What it writes, each node write a JSON patch that carries the `resourceVersion` it read (the API
 * server refuses it with 409 when anything wrote the node since: the loser of a race gets
 * OwnershipConflict, and what it wrote on other nodes is taken back, removing only its own holders or
 * geometry, so a stale rollback never removes a newer owner), naming its operation in
 * {@link NodeAnnotation.lastOperation}:
 * - Holds: device key → holders (`<claim>#<workload>`) in the {@link NodeAnnotation.holds} annotation,
 *   for devices and slices that exist.
 * - Geometry (managed MIG): the node's owner label ({@link OWNER_LABEL}), `nvidia.com/mig.config` naming
 *   the claim's configuration (one per claim, node and generation, added under CAS to the mig-parted
 *   document in {@link MIG_CONFIG_MAP}), `nvidia.com/mig.config.state` set to `pending` in the same
 *   patch, and the generation the write is for ({@link NodeAnnotation.migGeneration}). Geometry changes
 *   only on an idle node: never while any pod (foreign, or the claim's own) uses it. Release restores
 *   the configuration the node had ({@link NodeAnnotation.migRestore}) unless pods still run there, and
 *   drops the claim's configurations no node names; `all-disabled` always stays in the document.
 * - The claim record, a ConfigMap named by the claim in the claims namespace: owner (the operation),
 *   generation, phase, each workload's grant as planned and the geometry per node. It is created after
 *   the node writes landed (a claim that exists already is a conflict) and replaced under its own
 *   `resourceVersion`.
 *
 * Readiness is observed, and correlated with the generation it answers: a claim's holds count only while
 * they are on their node now; its geometry is `prepared` only when the node is still its own, names the
 * configuration of the claim's current generation, reports `success`, and publishes exactly that layout:
 * since the write itself set the state to `pending`, a `success` left from an earlier geometry is never
 * taken for this one, and the last generation a writer saw answered ({@link NodeAnnotation.migAnswered})
 * is what `observedGeneration` says meanwhile. `ready` once every pod of the claim reports Ready. The
 * grant reaches a pod through {@link KubernetesAllocationBackend.bindings}: the device plugin's resource
 * (`nvidia.com/gpu`, or the slice's `nvidia.com/mig-<profile>`) as the container's limit, the node as a
 * node selector, the claim's pod labels, and `CUDA_VISIBLE_DEVICES` / `VF_GPU_GRANT_JSON` naming the
 * granted devices (a carved slice by the MIG UUID the node agent published). The kubelet's device
 * plugin, not this adapter, picks which devices the container gets, so the grant says what the claim
 * holds and the worker's GPU check compares it with what it sees.
 *
 * What it does not do: share devices cooperatively (time-slicing, MPS), point the GPU operator's
 * ClusterPolicy at {@link MIG_CONFIG_MAP} (the MIG manager is installed reading it), or stop a foreign
 * pod from being scheduled onto devices a claim holds (the device plugin does not read claims): its
 * capabilities say so (`admissionBoundary` false; memory enforced by scheduler accounting under the
 * device plugin, by hardware for managed MIG).
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
  claimHolder,
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
  feasiblePlan,
  FEATURE_DYNAMIC_MIG,
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
import {
  type ClusterClient,
  type JsonPatchOperation,
  jsonPointerKey,
  type LiveObject,
} from "./cluster_client.ts";
import { DEFAULT_GPU_RESOURCE, GpuNodeLabel, MIG_RESOURCE_PREFIX } from "./gpu_strategy.ts";
import type { KubernetesObject } from "./manifests.ts";
import {
  layoutFits,
  MIG_DISABLED,
  MIG_PARTED_KEY,
  MigLabel,
  migPartedDocument,
  MigState,
  type NodeMigGeometry,
  parseMigParted,
  profileFor,
} from "./mig_parted.ts";

const MIB = 2 ** 20;
const GIB = 2 ** 30;

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
  /** The claim generation the node's `nvidia.com/mig.config` was written for. */
  migGeneration: "videoflow.io/mig-generation",
  /** The newest claim generation whose geometry the MIG manager was seen to apply on the node. */
  migAnswered: "videoflow.io/mig-answered",
  /** The `nvidia.com/mig.config` the node had before its geometry owner took it: restored on release. */
  migRestore: "videoflow.io/mig-restore",
} as const;

/** The node label naming the claim that owns the node's geometry (managed MIG). */
export const OWNER_LABEL = "videoflow.io/gpu-owner";
/** The ConfigMap (in the claims namespace) holding the mig-parted document the MIG manager reads. */
export const MIG_CONFIG_MAP = "videoflow-mig-config";

/** Which authority the backend acts as: the device plugin, or the owner of MIG geometry through the MIG manager. */
export const KubernetesAuthority = { devicePlugin: "device-plugin", managedMig: "managed-mig" } as const;
/** One of {@link KubernetesAuthority}. */
export type KubernetesAuthority = typeof KubernetesAuthority[keyof typeof KubernetesAuthority];

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
  /** The GPU's MIG geometry (NVML's profiles and placements), on a MIG-capable GPU. */
  readonly mig_geometry?: NodeMigGeometry;
}

/** Options of a {@link KubernetesAllocationBackend}. */
export interface KubernetesAllocationOptions {
  /** Where claim records live (`default` unless told). */
  readonly namespace?: string;
  readonly clock?: Clock;
  /** `device-plugin` (the default) or `managed-mig`, which changes geometry through the MIG manager. */
  readonly authority?: KubernetesAuthority;
}

/** A node as one read saw it. */
interface NodeView {
  readonly name: string;
  readonly version: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly annotations: Readonly<Record<string, string>>;
  readonly devices: readonly DeviceIdentity[];
  readonly sharing: NodeSharing;
  /** Units one device offers (time-slicing replicas; 1 otherwise). */
  readonly capacity: number;
  readonly holds: ReadonlyMap<string, readonly string[]>;
  /** The claim owning the node's geometry, or null. */
  readonly owner: string | null;
  readonly migConfig: string;
  readonly migState: string | null;
  readonly migGeneration: number | null;
  readonly migAnswered: number | null;
  readonly restore: string | null;
  /** The MIG geometry of its GPUs (the first published), or null when none was published. */
  readonly geometry: NodeMigGeometry | null;
  /** Its physical GPUs. */
  readonly gpus: readonly { readonly ordinal: number; readonly uuid: string | null }[];
}

/** A running pod's GPU units on a node. */
interface PodUse {
  readonly name: string;
  readonly node: string;
  readonly claim: string | null;
  readonly workload: string | null;
  readonly ready: boolean;
  /** Resource name → units. */
  readonly units: Readonly<Record<string, number>>;
}

type Phase = "active" | "retained" | "released";

/** What a claim record says. */
interface ClaimDocument {
  /** The operation that reserved it. */
  readonly owner: string;
  readonly generation: number;
  readonly phase: Phase;
  /** Each workload's grant as planned (a slice not created yet has no MIG UUID). */
  readonly grants: readonly DeliveredGrant[];
  /** Node → the layout text each GPU of it gets, for nodes whose geometry the claim owns. */
  readonly geometry: Readonly<Record<string, string>>;
}

/** A claim record as read back. */
interface ClaimRecord extends ClaimDocument {
  readonly claimId: string;
  readonly version: string;
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
    annotations,
    devices: Object.freeze(devices),
    sharing,
    capacity: shared && Number.isSafeInteger(replicas) && replicas > 1 ? replicas : 1,
    holds: parseHolds(name, annotations[NodeAnnotation.holds]),
    owner: labels[OWNER_LABEL] ?? null,
    migConfig: labels[MigLabel.config] ?? MIG_DISABLED,
    migState: labels[MigLabel.state] ?? null,
    migGeneration: countOf(annotations[NodeAnnotation.migGeneration]),
    migAnswered: countOf(annotations[NodeAnnotation.migAnswered]),
    restore: annotations[NodeAnnotation.migRestore] ?? null,
    geometry: publishedGeometry(annotations[NodeAnnotation.devices]),
    gpus: Object.freeze(
      [...new Map(devices.map((d) => [d.ordinal ?? 0, { ordinal: d.ordinal ?? 0, uuid: d.uuid }])).values()],
    ),
  });
}

function countOf(text: string | undefined): number | null {
  const value = Number(text);
  return text !== undefined && Number.isSafeInteger(value) ? value : null;
}

function publishedGeometry(text: string | undefined): NodeMigGeometry | null {
  if (text === undefined) return null;
  const first = (JSON.parse(text) as PublishedDevice[])[0];
  return first?.mig_geometry ?? null;
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
    name: pod.metadata.name,
    node: spec.nodeName,
    claim: pod.metadata.labels[CLAIM_POD_LABEL] ?? null,
    workload: pod.metadata.labels[CLAIM_WORKLOAD_LABEL] ?? null,
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

/** What each of `gpus` GPUs takes for a node's slice demand (profile → slices) spread over them. */
function perGpu(demand: Readonly<Record<string, number>>, gpus: number): Record<string, number> {
  return Object.fromEntries(Object.entries(demand).map(([p, n]) => [p, Math.ceil(n / gpus)]));
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
  /** Node → its view as last read: a snapshot carries no labels or geometry, and plans read these. */
  readonly #views = new Map<string, NodeView>();
  readonly #authority: KubernetesAuthority;

  /** A backend on `cluster`, its claim records in `options.namespace` (`default`). */
  constructor(cluster: ClusterClient, options: KubernetesAllocationOptions = {}) {
    this.#cluster = cluster;
    this.#namespace = options.namespace ?? "default";
    this.#clock = options.clock ?? systemClock;
    this.#authority = options.authority ?? KubernetesAuthority.devicePlugin;
  }

  /**
   * The device plugin's guarantees: exclusive whole devices and existing MIG slices, several devices on
   * one host, memory accounted by the scheduler only, no admission boundary and no feature of the
   * matrix. Managed MIG adds `dynamic-mig` and hardware-enforced memory (a slice is its own memory).
   * `environment.version` / `environment.features` override the version matrix.
   */
  capabilities(environment: Readonly<Record<string, unknown>> = {}): AllocationCapabilities {
    const managed = this.#authority === KubernetesAuthority.managedMig;
    return allocationCapabilities({
      adapter: "kubernetes",
      authority: this.#authority,
      exclusiveDevice: true,
      isolatedMig: true,
      cooperativeSharing: false,
      memoryEnforcement: managed ? MemoryEnforcement.hardware : MemoryEnforcement.scheduler,
      multiDevice: true,
      topologyVerification: false,
      elastic: false,
      admissionBoundary: false,
      versionMatrix: {
        version: typeof environment.version === "string"
          ? environment.version
          : `kubernetes-${this.#authority}/1`,
        features: Array.isArray(environment.features)
          ? [...environment.features]
          : managed
          ? [FEATURE_DYNAMIC_MIG]
          : [],
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
        owners: Object.freeze(
          Object.fromEntries(views.filter((v) => v.owner !== null).map((v) => [v.name, v.owner!])),
        ),
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
      const refused = refusalBeforePlanning(requests, this.capabilities(), snapshot);
      if (refused !== null) return refused;
      const taken = new Set<string>();
      const isFree = (d: DeviceIdentity) =>
        !taken.has(deviceKey(d)) && (snapshot.occupancy[deviceKey(d)] ?? 0) === 0;
      const reasons: string[] = [];
      const assignments: Record<string, DeviceIdentity[]> = {};
      const labelsOf = (node: string) => this.#views.get(node)?.labels ?? {};
      const whole = requests.filter((r) => r.sharing === RequestSharing.exclusive);
      if (whole.length > 0) {
        const hosts = Object.keys(snapshot.sharing).filter((h) =>
          snapshot.sharing[h] === NodeSharing.physical && snapshot.owners[h] === undefined
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
      const wholeNodes = new Set(Object.values(assignments).flat().map((d) => d.node ?? ""));
      const demands = new Map<string, Record<string, number>>();
      for (const r of requests.filter((r) => r.sharing === RequestSharing.mig)) {
        const min = r.minimumUsableMemoryBytes ?? 0;
        const slice = snapshot.devices
          .filter((d) =>
            d.migProfile !== null && d.memoryBytes !== null && d.memoryBytes >= min && isFree(d) &&
            snapshot.owners[d.node ?? ""] === undefined &&
            hardConstraintsHold(r.constraints, labelsOf(d.node ?? ""))
          )
          .sort((a, b) => (a.memoryBytes ?? 0) - (b.memoryBytes ?? 0))[0];
        if (slice !== undefined) {
          taken.add(deviceKey(slice));
          assignments[r.workloadId] = [slice];
          continue;
        }
        const carved = this.#authority === KubernetesAuthority.managedMig
          ? this.#carve(r, snapshot, demands, wholeNodes, isFree)
          : null;
        if (carved !== null) {
          assignments[r.workloadId] = [carved];
          continue;
        }
        reasons.push(
          `request ${r.workloadId}: no free MIG slice of at least ${(min / GIB).toFixed(1)} GiB, and ` +
            (this.#authority === KubernetesAuthority.managedMig
              ? "no idle, unowned MIG-capable node whose geometry may change"
              : "authority device-plugin cannot change geometry"),
        );
      }
      if (reasons.length > 0) return infeasible(reasons);
      const geometry: Record<string, string> = {};
      const notes: string[] = [];
      for (const [node, demand] of demands) {
        geometry[node] = layoutText(perGpu(demand, this.#views.get(node)!.gpus.length));
        notes.push(
          `node ${node}: MIG geometry ${geometry[node]} would replace ${this.#views.get(node)!.migConfig}`,
        );
      }
      const planId = `plan-${randomId()}`;
      this.#plans.set(planId, new Map(requests.map((r) => [r.workloadId, r])));
      return feasiblePlan({ assignments, geometry, snapshotGeneration: snapshot.generation, planId, notes });
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
    const geometryNodes = Object.keys(plan.geometry).sort();
    if (geometryNodes.length > 0 && this.#authority !== KubernetesAuthority.managedMig) {
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
        throw ownershipConflict(
          `claim ${claimId} already exists, owned by ${existing.owner} at generation ${existing.generation}`,
          { claim_id: claimId },
        );
      }
      return requireKnown(await this.#inspect(existing), `claim ${claimId}`).observation;
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
        if (plan.geometry[node] !== undefined) continue;
        byNode.set(node, [...(byNode.get(node) ?? []), { workload, device }]);
      }
    }
    const pods = await this.#readOrThrow(() => this.#listPods(), "the pod listing");
    const config = geometryNodes.length > 0
      ? await this.#readOrThrow(() => this.#readMigConfig(), "the MIG configuration")
      : null;
    const reads: NodeView[] = [];
    for (const name of [...new Set([...byNode.keys(), ...geometryNodes])].sort()) {
      reads.push(await this.#readOrThrow(() => this.#readNode(name), `node ${name}`));
      await barrier(Barrier.ownerReadAfter, { node: name, op_id: operationId });
    }
    for (const view of reads) {
      if (plan.geometry[view.name] === undefined) this.#checkFree(view, byNode.get(view.name)!, pods);
      else {
        const users = [...view.holds.values()].flat().concat(usersOn(view.name, pods, claimId));
        if (view.owner !== null) {
          throw ownershipConflict(`node ${view.name} is owned by ${view.owner}`, { node: view.name });
        }
        if (users.length > 0) {
          throw ownershipConflict(
            `node ${view.name} is in use by ${users.join(", ")}: its geometry cannot change`,
            {
              node: view.name,
            },
          );
        }
      }
    }
    if (config !== null) {
      const added = Object.fromEntries(
        geometryNodes.map((node, i) => [configName(claimId, i, 1), parseLayoutText(plan.geometry[node])]),
      );
      await this.#writeMigConfig(config, { ...config.configs, ...added }, operationId);
    }
    const done: NodeView[] = [];
    let lost = false;
    for (const view of reads) {
      const index = geometryNodes.indexOf(view.name);
      let operations: JsonPatchOperation[];
      if (index >= 0) {
        operations = nodePatch(view, {
          labels: {
            [MigLabel.config]: configName(claimId, index, 1),
            [MigLabel.state]: MigState.pending,
            [OWNER_LABEL]: claimId,
          },
          annotations: {
            [NodeAnnotation.migGeneration]: "1",
            [NodeAnnotation.migAnswered]: null,
            [NodeAnnotation.migRestore]: view.migConfig,
          },
        }, operationId);
      } else {
        const holds = new Map(view.holds);
        for (const { workload, device } of byNode.get(view.name)!) {
          const key = deviceKey(device);
          holds.set(key, [...(holds.get(key) ?? []), claimHolder(claimId, workload)]);
        }
        operations = nodePatch(
          view,
          { annotations: { [NodeAnnotation.holds]: holdsText(holds) } },
          operationId,
        );
      }
      await barrier(Barrier.ownerUpdateBefore, { node: view.name, op_id: operationId });
      try {
        await this.#cluster.patchNode(view.name, operations);
      } catch (error) {
        await this.#rollback(claimId, operationId, done);
        if (error instanceof ClusterError && statusOf(error) === 409) {
          throw ownershipConflict(`node ${view.name} changed since it was read; the write was refused`, {
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
    const document: ClaimDocument = {
      owner: operationId,
      generation: 1,
      phase: "active",
      grants,
      geometry: plan.geometry,
    };
    try {
      await this.#cluster.create(this.#claimObject(claimId, document, operationId));
    } catch (error) {
      await this.#rollback(claimId, operationId, done);
      if (error instanceof ClusterError && statusOf(error) === 409) {
        throw ownershipConflict(`claim ${claimId} was created by another writer`, { claim_id: claimId });
      }
      throw error;
    }
    return Object.freeze({
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
    const inspected = await this.#inspect(record);
    return inspected.kind === "known"
      ? known(inspected.value.observation, this.#clock, inspected.generation)
      : inspected;
  }

  async reconcile(claimId: string, desired: string, expectedGeneration: string): Promise<ClaimObservation> {
    const record = await this.#readClaimOrThrow(claimId);
    if (record === null) throw new ConfigError(`no claim ${claimId} was reserved here`);
    if (String(record.generation) !== expectedGeneration || record.phase !== "active") {
      throw ownershipConflict(
        `claim ${claimId} is at generation ${record.generation} (${record.phase}), not ${expectedGeneration}`,
        { claim_id: claimId },
      );
    }
    const nodes = Object.keys(record.geometry).sort();
    if (nodes.length === 0) {
      throw new ConfigError(
        `claim ${claimId} manages no MIG geometry, so it cannot move to ${JSON.stringify(desired)}`,
        "reconcile only claims whose plan changed geometry",
        { claim_id: claimId },
      );
    }
    const layout = parseLayoutText(desired);
    const views: NodeView[] = [];
    for (const name of nodes) views.push(await this.#readOrThrow(() => this.#readNode(name), `node ${name}`));
    const problems: string[] = [];
    for (const view of views) {
      if (view.geometry === null || !layoutFits(view.geometry, layout)) {
        problems.push(`${view.name}: ${desired} does not fit its GPUs`);
      }
      const held = perGpu(sliceDemand(record, view.name), view.gpus.length);
      for (const [profile, count] of Object.entries(held)) {
        if ((layout[profile] ?? 0) < count) {
          problems.push(`${view.name}: the claim holds ${profile} slices the layout drops`);
        }
      }
    }
    if (problems.length > 0) {
      throw new ConfigError(
        `desired geometry ${desired} is not legal: ${problems.join("; ")}`,
        "fix the layout",
      );
    }
    const pods = await this.#readOrThrow(() => this.#listPods(), "the pod listing");
    const refused: string[] = [];
    for (const view of views) {
      await barrier(Barrier.ownerReadAfter, { node: view.name, op_id: record.owner });
      if (view.owner !== claimId) {
        throw ownershipConflict(`node ${view.name} is no longer owned by ${claimId}`, { node: view.name });
      }
      const users = usersOn(view.name, pods, claimId);
      if (users.length > 0) refused.push(`node ${view.name}: geometry kept, in use by ${users.join(", ")}`);
    }
    if (refused.length > 0) {
      const current = requireKnown(await this.#inspect(record), `claim ${claimId}`).observation;
      return Object.freeze({
        ...current,
        evidence: Object.freeze({ ...current.evidence, refused: Object.freeze(refused) }),
      });
    }
    const generation = record.generation + 1;
    const config = await this.#readOrThrow(() => this.#readMigConfig(), "the MIG configuration");
    const added = Object.fromEntries(nodes.map((_, i) => [configName(claimId, i, generation), layout]));
    await this.#writeMigConfig(config, { ...config.configs, ...added }, record.owner);
    for (const [i, view] of views.entries()) {
      const answered = this.#answered(record, view, i) ? record.generation : view.migAnswered;
      await barrier(Barrier.ownerUpdateBefore, { node: view.name, op_id: record.owner });
      try {
        await this.#cluster.patchNode(
          view.name,
          nodePatch(view, {
            labels: {
              [MigLabel.config]: configName(claimId, i, generation),
              [MigLabel.state]: MigState.pending,
            },
            annotations: {
              [NodeAnnotation.migGeneration]: String(generation),
              [NodeAnnotation.migAnswered]: answered === null ? null : String(answered),
            },
          }, record.owner),
        );
      } catch (error) {
        if (error instanceof ClusterError && statusOf(error) === 409) {
          throw ownershipConflict(`node ${view.name} changed since it was read; the write was refused`, {
            node: view.name,
          });
        }
        throw error;
      }
      await barrier(Barrier.ownerUpdateAfter, { node: view.name, op_id: record.owner });
    }
    const next: ClaimDocument = {
      ...record,
      generation,
      geometry: Object.fromEntries(nodes.map((node) => [node, layoutText(layout)])),
    };
    await this.#cluster.replace(this.#claimObject(claimId, next, record.owner), record.version);
    const written = await this.#readClaimOrThrow(claimId);
    return requireKnown(await this.#inspect(written!), `claim ${claimId}`).observation;
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
    const nodes = claimNodes(record);
    const views: NodeView[] = [];
    let pods: PodUse[];
    try {
      for (const name of nodes) views.push(await this.#readNode(name));
      pods = await this.#listPods();
    } catch (error) {
      if (!(error instanceof ClusterError || error instanceof UnobservableState)) throw error;
      return answer(ReleaseStatus.unknown, `a read failed (${error.message}); nothing was released`);
    }
    const remaining: string[] = [];
    for (let view of views) {
      for (let attempt = 1;; attempt++) {
        const { change, note } = this.#releaseChange(record, view, pods);
        if (change === null) {
          if (note !== null) remaining.push(note);
          break;
        }
        await barrier(Barrier.ownerUpdateBefore, { node: view.name, op_id: operationId });
        try {
          await this.#cluster.patchNode(view.name, nodePatch(view, change, operationId));
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
        if (note !== null) remaining.push(note);
        break;
      }
    }
    if (Object.keys(record.geometry).length > 0) {
      const dropped = await this.#dropMigConfigs(record, operationId);
      if (dropped !== null) return answer(ReleaseStatus.unknown, dropped, remaining);
    }
    const failed = await this.#writePhase(record, "released", operationId);
    if (failed !== null) return answer(ReleaseStatus.unknown, failed, remaining);
    return answer(
      ReleaseStatus.released,
      remaining.length > 0 ? "released; some geometry was kept" : "",
      remaining,
    );
  }

  async bindings(claimId: string, workloadId: string): Promise<WorkloadBindings> {
    const record = await this.#readClaimOrThrow(claimId);
    if (record === null) throw new ConfigError(`no claim ${claimId} was reserved here`);
    const planned = record.grants.find((g) => g.workloadId === workloadId);
    if (planned === undefined) throw new ConfigError(`claim ${claimId} has no workload ${workloadId}`);
    const { observation, grants } = requireKnown(await this.#inspect(record), `claim ${claimId}`);
    const granted = grants.get(workloadId) ?? null;
    if (observation.grant === null || granted === null) {
      throw new ResourceUnavailable(
        `claim ${claimId} is ${observation.status}: no grant to bind ${workloadId} to yet`,
        "observe the claim until it is prepared",
        { claim_id: claimId },
      );
    }
    const devices = granted;
    const grant: DeliveredGrant = { ...planned, devices };
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

  /**
   * A slice `request` would get on an idle, unowned MIG-capable node once the node takes a new layout
   * (every GPU the same, the demand spread over them), recorded in `demands`; null when no node can.
   */
  #carve(
    request: WorkloadRequest,
    snapshot: InventorySnapshot,
    demands: Map<string, Record<string, number>>,
    wholeNodes: ReadonlySet<string>,
    isFree: (d: DeviceIdentity) => boolean,
  ): DeviceIdentity | null {
    const min = request.minimumUsableMemoryBytes ?? 0;
    for (const host of Object.keys(snapshot.sharing).sort()) {
      const view = this.#views.get(host);
      const sharing = snapshot.sharing[host];
      if (view === undefined || view.geometry === null || view.gpus.length === 0) continue;
      if (sharing !== NodeSharing.physical && sharing !== NodeSharing.mig) continue;
      if (snapshot.owners[host] !== undefined || wholeNodes.has(host)) continue;
      if (!hardConstraintsHold(request.constraints, view.labels)) continue;
      if (!snapshot.devices.filter((d) => d.node === host).every(isFree)) continue;
      const profile = profileFor(view.geometry, min / GIB);
      if (profile === null) continue;
      const demand = { ...(demands.get(host) ?? {}) };
      demand[profile.name] = (demand[profile.name] ?? 0) + 1;
      if (!layoutFits(view.geometry, perGpu(demand, view.gpus.length))) continue;
      demands.set(host, demand);
      const gpu = view.gpus[(demand[profile.name] - 1) % view.gpus.length];
      return deviceIdentity({
        node: host,
        ordinal: gpu.ordinal,
        uuid: gpu.uuid,
        migUuid: null,
        product: view.devices[0]?.product ?? "unknown",
        memoryBytes: profile.memorySizeMB * MIB,
        migProfile: profile.name,
      });
    }
    return null;
  }

  async #listNodes(scope: InventoryScope): Promise<NodeView[]> {
    const selector = Object.entries(scope.labels ?? {}).map(([k, v]) => `${k}=${v}`).join(",");
    const nodes = await this.#cluster.list("v1", "Node", "", selector);
    const views = nodes
      .filter((n) => scope.nodes === undefined || scope.nodes.includes(n.metadata.name))
      .map(viewOf)
      .sort((a, b) => a.name.localeCompare(b.name));
    for (const view of views) this.#views.set(view.name, view);
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
    this.#views.set(view.name, view);
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
        throw ownershipConflict(`device ${key} on ${view.name} is no longer free`, {
          node: view.name,
          device: key,
        });
      }
    }
    for (const [resource, amount] of Object.entries(foreign)) {
      const pool = view.devices.filter((d) =>
        resourceOf(d) === resource || resource === DEFAULT_GPU_RESOURCE
      );
      const held = pool.reduce((sum, d) => sum + (view.holds.get(deviceKey(d))?.length ?? 0), 0) +
        placed.filter(({ device }) => pool.some((d) => deviceKey(d) === deviceKey(device))).length;
      if (held + amount > pool.length * view.capacity) {
        throw ownershipConflict(
          `node ${view.name}: foreign pods now use ${amount} ${resource}, too many to add the claim`,
          {
            node: view.name,
          },
        );
      }
    }
  }

  /** Takes this claim's holds and geometry off the nodes it wrote, re-reading each; never anyone else's. */
  async #rollback(claimId: string, operationId: string, done: readonly NodeView[]): Promise<void> {
    for (const written of done.toReversed()) {
      for (let attempt = 1; attempt <= RELEASE_ATTEMPTS; attempt++) {
        const view = await this.#readNode(written.name);
        const holds = withoutHolders(view.holds, claimId);
        const change: NodeChange = {
          ...(view.owner === claimId ? restoreChange(view) : {}),
          ...(holds === null ? {} : { annotations: { [NodeAnnotation.holds]: holdsText(holds) } }),
        };
        if (view.owner !== claimId && holds === null) break;
        try {
          await this.#cluster.patchNode(view.name, nodePatch(view, change, operationId));
          break;
        } catch (error) {
          if (!(error instanceof ClusterError) || statusOf(error) !== 409 || attempt === RELEASE_ATTEMPTS) {
            throw error;
          }
        }
      }
    }
  }

  /** What releasing `record` changes on `view` (null: nothing of it there), and what is kept and why. */
  #releaseChange(
    record: ClaimRecord,
    view: NodeView,
    pods: readonly PodUse[],
  ): { readonly change: NodeChange | null; readonly note: string | null } {
    if (record.geometry[view.name] === undefined) {
      const holds = withoutHolders(view.holds, record.claimId);
      return {
        change: holds === null ? null : { annotations: { [NodeAnnotation.holds]: holdsText(holds) } },
        note: null,
      };
    }
    if (view.owner !== record.claimId) {
      return { change: null, note: view.owner === null ? null : `${view.name}: owned by ${view.owner}` };
    }
    if (usersOn(view.name, pods, record.claimId).length > 0) {
      return {
        change: {
          labels: { [OWNER_LABEL]: null },
          annotations: {
            [NodeAnnotation.migGeneration]: null,
            [NodeAnnotation.migAnswered]: null,
            [NodeAnnotation.migRestore]: null,
          },
        },
        note: `${view.name}: geometry kept, workloads still run`,
      };
    }
    return { change: restoreChange(view), note: null };
  }

  /** The mig-parted configurations and the version of their ConfigMap (null: it does not exist yet). */
  async #readMigConfig(): Promise<
    { configs: Record<string, Record<string, number>>; version: string | null }
  > {
    const object = await this.#cluster.read({
      apiVersion: "v1",
      kind: "ConfigMap",
      namespace: this.#namespace,
      name: MIG_CONFIG_MAP,
    });
    if (object === null) return { configs: {}, version: null };
    const text = (object.data as Record<string, string> | undefined)?.[MIG_PARTED_KEY] ?? "";
    return { configs: parseMigParted(text), version: object.metadata.resourceVersion };
  }

  /** Writes `configs` over what `read` saw, under its version (OwnershipConflict when another writer won). */
  async #writeMigConfig(
    read: { readonly version: string | null },
    configs: MigConfigsWritable,
    operationId: string,
  ): Promise<void> {
    const object: KubernetesObject = {
      apiVersion: "v1",
      kind: "ConfigMap",
      metadata: {
        name: MIG_CONFIG_MAP,
        namespace: this.#namespace,
        labels: {},
        annotations: { [NodeAnnotation.lastOperation]: operationId },
      },
      data: { [MIG_PARTED_KEY]: migPartedDocument(configs) },
    };
    await barrier(Barrier.ownerUpdateBefore, { target: MIG_CONFIG_MAP, op_id: operationId });
    try {
      if (read.version === null) await this.#cluster.create(object);
      else await this.#cluster.replace(object, read.version);
    } catch (error) {
      if (error instanceof ClusterError && statusOf(error) === 409) {
        throw ownershipConflict("the MIG configuration changed before the write landed", {
          op_id: operationId,
        });
      }
      throw error;
    }
  }

  /** Drops the claim's configurations no node names any more; null when done, else why not. */
  async #dropMigConfigs(record: ClaimRecord, operationId: string): Promise<string | null> {
    for (let attempt = 1; attempt <= RELEASE_ATTEMPTS; attempt++) {
      try {
        const inUse = new Set<string>();
        for (const node of Object.keys(record.geometry)) inUse.add((await this.#readNode(node)).migConfig);
        const read = await this.#readMigConfig();
        const kept = Object.fromEntries(
          Object.entries(read.configs).filter(([name]) =>
            !name.startsWith(`${record.claimId}-`) || inUse.has(name)
          ),
        );
        if (Object.keys(kept).length === Object.keys(read.configs).length) return null;
        await this.#writeMigConfig(read, kept, operationId);
        return null;
      } catch (error) {
        if (error instanceof OwnershipConflict && attempt < RELEASE_ATTEMPTS) continue;
        if (
          error instanceof ClusterError || error instanceof UnobservableState ||
          error instanceof OwnershipConflict
        ) {
          return `the MIG configuration could not be cleaned: ${error.message}`;
        }
        throw error;
      }
    }
    return "the MIG configuration kept changing under the write";
  }

  /** Whether the MIG manager was seen to apply the claim's current geometry on `view` (its `index`-th node). */
  #answered(record: ClaimRecord, view: NodeView, index: number): boolean {
    return view.owner === record.claimId && view.migGeneration === record.generation &&
      view.migConfig === configName(record.claimId, index, record.generation) &&
      view.migState === MigState.success &&
      appliedMatches(view, parseLayoutText(record.geometry[view.name]));
  }

  #claimObject(claimId: string, document: ClaimDocument, operationId: string): KubernetesObject {
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
        [CLAIM_KEY]: JSON.stringify({
          owner: document.owner,
          generation: document.generation,
          phase: document.phase,
          grants: document.grants.map(deliveredGrantToDict),
          geometry: document.geometry,
        }),
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
    let document: {
      owner?: unknown;
      generation?: unknown;
      phase?: unknown;
      grants?: unknown;
      geometry?: unknown;
    };
    try {
      document = JSON.parse(text ?? "");
    } catch {
      throw new UnobservableState(
        `the record of claim ${claimId} cannot be read`,
        "fix or remove its ConfigMap",
      );
    }
    const phases: readonly unknown[] = ["active", "retained", "released"];
    const geometry = document.geometry ?? {};
    if (
      typeof document.owner !== "string" || !Number.isSafeInteger(document.generation) ||
      !phases.includes(document.phase) || !Array.isArray(document.grants) ||
      typeof geometry !== "object" || geometry === null ||
      !Object.values(geometry).every((v) => typeof v === "string")
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
      geometry: Object.freeze({ ...(geometry as Record<string, string>) }),
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
          this.#claimObject(current.claimId, { ...current, phase }, operationId),
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

  /**
   * The claim as its nodes show it now, and each workload's grant (a carved slice by its MIG UUID once the
   * manager created it; null before).
   */
  async #inspect(
    record: ClaimRecord,
  ): Promise<Observation<{ observation: ClaimObservation; grants: Map<string, DeviceIdentity[] | null> }>> {
    const views = new Map<string, NodeView>();
    try {
      for (const name of claimNodes(record)) views.set(name, await this.#readNode(name));
    } catch (error) {
      if (error instanceof ClusterError) return unknown(reasonOf(error), this.#clock, error.message);
      if (error instanceof UnobservableState) return unknown("malformed", this.#clock, error.message);
      throw error;
    }
    const missing: string[] = [];
    const failed: string[] = [];
    const preparing: string[] = [];
    const nodes: Record<string, unknown> = {};
    const geometryNodes = Object.keys(record.geometry).sort();
    for (const grant of record.grants) {
      for (const device of grant.devices) {
        if (record.geometry[device.node ?? ""] !== undefined) continue;
        const holder = claimHolder(record.claimId, grant.workloadId);
        if (!(views.get(device.node ?? "")?.holds.get(deviceKey(device)) ?? []).includes(holder)) {
          missing.push(`${holder}@${deviceKey(device)}`);
        }
      }
    }
    for (const [i, node] of geometryNodes.entries()) {
      const view = views.get(node)!;
      nodes[node] = {
        state: view.migState,
        config: view.migConfig,
        state_generation: view.migGeneration,
        write_generation: record.generation,
      };
      if (record.phase !== "active") continue;
      const ours = view.owner === record.claimId && view.migGeneration === record.generation &&
        view.migConfig === configName(record.claimId, i, record.generation);
      if (!ours) failed.push(`${node}: its geometry is no longer this claim's`);
      else if (view.migState === MigState.failed) failed.push(`${node}: the MIG manager reports failed`);
      else if (!this.#answered(record, view, i)) preparing.push(node);
    }
    for (const view of views.values()) nodes[view.name] ??= { version: view.version };
    const taken = new Set<string>();
    const grants = new Map<string, DeviceIdentity[] | null>();
    for (const grant of record.grants) {
      const devices: DeviceIdentity[] = [];
      for (const planned of grant.devices) {
        if (
          planned.migUuid !== null || planned.migProfile === null ||
          record.geometry[planned.node ?? ""] === undefined
        ) {
          devices.push(planned);
          continue;
        }
        const slice = views.get(planned.node ?? "")?.devices.find((d) =>
          d.ordinal === planned.ordinal && d.migProfile === planned.migProfile && d.migUuid !== null &&
          !taken.has(d.migUuid)
        );
        if (slice === undefined) break;
        taken.add(slice.migUuid!);
        devices.push(slice);
      }
      grants.set(grant.workloadId, devices.length === grant.devices.length ? devices : null);
    }
    const evidence: Record<string, unknown> = { nodes };
    let status: ClaimStatus;
    if (record.phase === "released") status = ClaimStatus.released;
    else if (record.phase === "retained") status = ClaimStatus.retained;
    else if (missing.length > 0 || failed.length > 0) {
      status = ClaimStatus.failed;
      if (missing.length > 0) evidence.missing_holds = missing;
      if (failed.length > 0) evidence.failed = failed;
    } else if (preparing.length > 0) status = ClaimStatus.preparing;
    else {
      status = ClaimStatus.prepared;
      try {
        const pods = (await this.#listPods()).filter((p) => p.claim === record.claimId);
        if (pods.length > 0 && pods.every((p) => p.ready)) status = ClaimStatus.ready;
      } catch (error) {
        if (!(error instanceof ClusterError)) throw error;
        evidence.readiness = `unread: ${error.message}`;
      }
    }
    let observed: string | null;
    if (missing.length > 0) observed = null;
    else if (preparing.length === 0) observed = String(record.generation);
    else {
      const answered = geometryNodes.map((n) => views.get(n)!.migAnswered);
      observed = answered.every((a) => a !== null) ? String(Math.min(...(answered as number[]))) : null;
    }
    const granted = (status === ClaimStatus.prepared || status === ClaimStatus.ready ||
      status === ClaimStatus.retained) && [...grants.values()].every((g) => g !== null);
    const observation: ClaimObservation = Object.freeze({
      claimId: record.claimId,
      owner: record.owner,
      desiredGeneration: String(record.generation),
      observedGeneration: observed,
      status,
      grant: granted ? Object.freeze([...grants.values()].flatMap((g) => g ?? [])) : null,
      evidence: Object.freeze(evidence),
    });
    return known({ observation, grants }, this.#clock, record.version);
  }
}

/** Label and annotation changes to a node: a value sets the key, null removes it. */
interface NodeChange {
  readonly labels?: Readonly<Record<string, string | null>>;
  readonly annotations?: Readonly<Record<string, string | null>>;
}

/** The configs a mig-parted document is written from. */
type MigConfigsWritable = Readonly<Record<string, Readonly<Record<string, number>>>>;

/**
 * The JSON patch making `change` on `view`'s node while it is still at the version read (the patched
 * object carries that `resourceVersion`: the API server answers 409 once anything wrote the node since),
 * naming `operationId` as the last operation.
 */
function nodePatch(view: NodeView, change: NodeChange, operationId: string): JsonPatchOperation[] {
  const operations: JsonPatchOperation[] = [
    { op: "replace", path: "/metadata/resourceVersion", value: view.version },
  ];
  const section = (
    field: "labels" | "annotations",
    present: Readonly<Record<string, string>>,
    wanted: Readonly<Record<string, string | null>>,
  ) => {
    const sets = Object.entries(wanted).filter((e): e is [string, string] => e[1] !== null);
    if (Object.keys(present).length === 0) {
      if (sets.length > 0) {
        operations.push({ op: "add", path: `/metadata/${field}`, value: Object.fromEntries(sets) });
      }
      return;
    }
    for (const [key, value] of sets) {
      operations.push({ op: "add", path: `/metadata/${field}/${jsonPointerKey(key)}`, value });
    }
    for (const [key, value] of Object.entries(wanted)) {
      if (value === null && Object.hasOwn(present, key)) {
        operations.push({ op: "remove", path: `/metadata/${field}/${jsonPointerKey(key)}` });
      }
    }
  };
  section("labels", view.labels, change.labels ?? {});
  section("annotations", view.annotations, {
    ...change.annotations,
    [NodeAnnotation.lastOperation]: operationId,
  });
  return operations;
}

/** What puts a node's geometry back as its owner found it, and frees the node. */
function restoreChange(view: NodeView): NodeChange {
  return {
    labels: {
      [MigLabel.config]: view.restore ?? MIG_DISABLED,
      [MigLabel.state]: MigState.pending,
      [OWNER_LABEL]: null,
    },
    annotations: {
      [NodeAnnotation.migGeneration]: null,
      [NodeAnnotation.migAnswered]: null,
      [NodeAnnotation.migRestore]: null,
    },
  };
}

function holdsText(holds: ReadonlyMap<string, readonly string[]>): string {
  return JSON.stringify(Object.fromEntries([...holds].filter(([, h]) => h.length > 0).sort()));
}

/** The name of a claim's configuration for its `index`-th geometry node at `generation`. */
function configName(claimId: string, index: number, generation: number): string {
  return `${claimId}-n${index}-g${generation}`;
}

/** Who uses GPUs on `node`: a claim's pods as `<claim>#<workload>`, others by pod name. */
function usersOn(node: string, pods: readonly PodUse[], claimId: string): string[] {
  return pods.filter((p) => p.node === node)
    .map((p) => p.claim === claimId ? claimHolder(claimId, p.workload ?? p.name) : p.name)
    .sort();
}

/** The slices (profile → count) the claim's workloads take on `node`. */
function sliceDemand(record: ClaimRecord, node: string): Record<string, number> {
  const demand: Record<string, number> = {};
  for (const grant of record.grants) {
    for (const d of grant.devices) {
      if (d.node === node && d.migProfile !== null) demand[d.migProfile] = (demand[d.migProfile] ?? 0) + 1;
    }
  }
  return demand;
}

/** Every node a claim touches: its devices' and its geometry's. */
function claimNodes(record: ClaimRecord): string[] {
  return [
    ...new Set([
      ...record.grants.flatMap((g) => g.devices.map((d) => d.node ?? "")),
      ...Object.keys(record.geometry),
    ]),
  ].sort();
}

/** Whether every GPU of `view` shows exactly `layout`'s slices (profile → count) as its node agent published them. */
function appliedMatches(view: NodeView, layout: Readonly<Record<string, number>>): boolean {
  return view.gpus.every((gpu) => {
    const counts: Record<string, number> = {};
    for (const d of view.devices) {
      if (d.ordinal === gpu.ordinal && d.migProfile !== null) {
        counts[d.migProfile] = (counts[d.migProfile] ?? 0) + 1;
      }
    }
    return layoutText(counts) === layoutText(layout);
  });
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
