/**
 * A GPU cluster on the test Kubernetes API server, for the allocation stories: the nodes of a scenario
 * as Node objects labelled the way GPU Feature Discovery labels them, their devices published in the
 * annotation a node agent writes (GPU UUIDs, memory, MIG geometry), foreign workloads as running pods
 * that request `nvidia.com/gpu`, and the story hooks ({@link AllocationHooks}) played on the server:
 * refused reads, pods scheduled and gone, and every write the backend made read back from the server's
 * log.
 *
 * A small MIG manager plays NVIDIA's: before every request the server serves (and on
 * {@link KubeGpuCluster.applyPendingGeometry}), a node whose `nvidia.com/mig.config.state` is `pending`
 * and whose configuration has been pending for `migApplySeconds` on the test's clock gets the layout the
 * mig-parted ConfigMap names for it: its devices republished with new MIG UUIDs (the node agent's part)
 * and the state `success`, or `failed` for a name the document lacks. MIG-capable products publish their
 * geometry (NVML's profiles and placements, from the card tables of the memory model) and start at
 * `all-disabled`, state `success`: the stale success a new write must not be taken for.
 *
 * @module
 */

import type { Clock } from "../../src/backends/clock.ts";
import type { NodeFixture } from "../../src/backends/memory/allocation.ts";
import { familyFor, type MigFamily } from "../../src/backends/memory/mig_geometry.ts";
import type { UnknownReason } from "../../src/backends/outcomes.ts";
import {
  CLAIM_POD_LABEL,
  CLAIM_WORKLOAD_LABEL,
  GfdDeviceLabel,
  MIG_CONFIG_MAP,
  NodeAnnotation,
  OWNER_LABEL,
  type PublishedDevice,
} from "../../src/deploy/allocation_kubernetes.ts";
import { GpuNodeLabel } from "../../src/deploy/gpu_strategy.ts";
import {
  MIG_DISABLED,
  MIG_PARTED_KEY,
  MigLabel,
  MigState,
  type NodeMigGeometry,
  parseMigParted,
} from "../../src/deploy/mig_parted.ts";
import type { AllocationHooks } from "../conformance/allocation/scenarios.ts";
import type { KeptWrite, KubeApiServer, StoredObject } from "./kube_api_server.ts";

const GIB = 2 ** 30;
/** The namespace foreign and claim pods run in. */
const PODS_NAMESPACE = "default";

/** The status a refused read answers with, by the reason the story names. */
function statusFor(reason: UnknownReason): number {
  if (reason === "auth") return 403;
  if (reason === "timeout") return 504;
  return 503;
}

/** The operation a kept write names in its `videoflow.io/last-operation` annotation; "" when none. */
function operationOf(write: KeptWrite): string {
  let body: unknown;
  try {
    body = JSON.parse(write.body);
  } catch {
    return "";
  }
  const escaped = `/metadata/annotations/${NodeAnnotation.lastOperation.replaceAll("/", "~1")}`;
  if (Array.isArray(body)) {
    for (const op of body as { path?: string; value?: unknown }[]) {
      if (op.path === escaped && typeof op.value === "string") return op.value;
      if (op.path === "/metadata/annotations" && typeof op.value === "object" && op.value !== null) {
        const value = (op.value as Record<string, unknown>)[NodeAnnotation.lastOperation];
        if (typeof value === "string") return value;
      }
    }
    return "";
  }
  const annotations = (body as { metadata?: { annotations?: Record<string, unknown> } }).metadata
    ?.annotations;
  const value = annotations?.[NodeAnnotation.lastOperation];
  return typeof value === "string" ? value : "";
}

/** A card family as NVML would report its GPU-instance profiles and placements. */
export function nvmlGeometry(family: MigFamily): NodeMigGeometry {
  return {
    computeSlices: family.computeSlices,
    memorySlices: family.memorySlices,
    profiles: Object.values(family.profiles).map((p, id) => ({
      id,
      name: p.name,
      sliceCount: p.computeSlices,
      instanceCount: p.maxInstances,
      memorySizeMB: p.memoryGib * 1024,
      placements: p.starts.map((start) => ({ start, size: p.memorySlices })),
    })),
  };
}

interface GrantRecord {
  readonly workload_id: string;
  readonly devices: readonly { readonly node: string; readonly mig_profile?: string | null }[];
}

function grantsOf(record: StoredObject): GrantRecord[] {
  return JSON.parse((record.data as Record<string, string>)["claim.json"]).grants;
}

function labelsOf(object: StoredObject): Record<string, string> {
  return (object.metadata.labels ?? {}) as Record<string, string>;
}

/** How the cluster's MIG manager behaves. */
export interface KubeGpuClusterOptions {
  readonly clock: Clock;
  /** How long a configuration stays pending before the manager applies it (0: at the next request). */
  readonly migApplySeconds?: number;
}

/** The scenario's nodes on `server`, and the hooks the stories drive them with. */
export class KubeGpuCluster implements AllocationHooks {
  readonly #server: KubeApiServer;
  readonly #failing = new Map<"nodes" | "pods" | "config", UnknownReason>();
  readonly #clock: Clock;
  readonly #applySeconds: number;
  /** Node → the pending configuration the manager saw, and since when. */
  readonly #seen = new Map<string, { readonly config: string; readonly since: number }>();

  /** Seeds `nodes` (and their foreign workloads) on `server`, and answers its refusals from now on. */
  constructor(server: KubeApiServer, nodes: readonly NodeFixture[], options: KubeGpuClusterOptions) {
    this.#server = server;
    this.#clock = options.clock;
    this.#applySeconds = options.migApplySeconds ?? 0;
    for (const fixture of nodes) {
      const family = familyFor(fixture.product);
      const devices: PublishedDevice[] = Array.from({ length: fixture.gpuCount }, (_, ordinal) => ({
        ordinal,
        uuid: `GPU-${fixture.name}-${ordinal}`,
        memory_bytes: Math.round(fixture.memoryGib * GIB),
        ...(family === null ? {} : { mig_geometry: nvmlGeometry(family) }),
      }));
      server.seed({
        apiVersion: "v1",
        kind: "Node",
        metadata: {
          name: fixture.name,
          labels: {
            [GpuNodeLabel.present]: "true",
            [GfdDeviceLabel.count]: String(fixture.gpuCount),
            [GfdDeviceLabel.product]: fixture.product,
            [GpuNodeLabel.memoryMib]: String(Math.round(fixture.memoryGib * 1024)),
            ...(family === null
              ? {}
              : { [MigLabel.config]: MIG_DISABLED, [MigLabel.state]: MigState.success }),
            ...(fixture.labels ?? {}),
          },
          annotations: { [NodeAnnotation.devices]: JSON.stringify(devices) },
        },
      });
      for (const [id, units] of Object.entries(fixture.workloads ?? {})) {
        this.bindWorkload(fixture.name, id, units);
      }
    }
    server.refuse = (request) => {
      if (request.method !== "GET") return null;
      for (const [kind, reason] of this.#failing) {
        const path = kind === "nodes"
          ? "/api/v1/nodes"
          : kind === "pods"
          ? "/api/v1/pods"
          : `/api/v1/namespaces/${PODS_NAMESPACE}/configmaps`;
        if (request.path.startsWith(path)) return statusFor(reason);
      }
      return null;
    };
    server.beforeRequest = () => this.#manage();
  }

  /** Refuses GETs of nodes, of pods, or of the claim records (`config`) with `reason`; null restores them. */
  failReads(kind: "nodes" | "pods" | "config", reason: UnknownReason | null = "timeout"): void {
    if (reason === null) this.#failing.delete(kind);
    else this.#failing.set(kind, reason);
  }

  /**
   * A pod now runs on `node`: the claim's pod for `workloadId` when a claim's record grants it devices
   * there, else a foreign pod requesting `units` of `nvidia.com/gpu`. Throws RangeError when a foreign
   * pod does not fit beside the claims' holds and the other foreign pods.
   */
  bindWorkload(node: string, workloadId: string, units: number): void {
    const claim = this.#claimOf(node, workloadId);
    if (claim === undefined) {
      const count = Number(labelsOf(this.#node(node))[GfdDeviceLabel.count] ?? "0");
      const free = count - Object.keys(this.#holds(node)).length - this.#foreignUnits(node);
      if (!Number.isSafeInteger(units) || units < 1 || units > free) {
        throw new RangeError(
          `workload ${workloadId} cannot take ${units} device(s) on ${node}: ${free} free`,
        );
      }
    }
    this.#runPod(node, workloadId, units, claim, false);
  }

  /** The pod of `workloadId` is gone. */
  unbindWorkload(_node: string, workloadId: string): void {
    this.#server.remove("v1", "Pod", PODS_NAMESPACE, workloadId);
  }

  /** Lets the MIG manager apply every configuration pending for long enough now. */
  applyPendingGeometry(): void {
    this.#manage();
  }

  /** Every workload of the claim runs in a pod reporting Ready (started where none runs yet). */
  markWorkloadReady(claimId: string): void {
    const record = this.#server.get("v1", "ConfigMap", PODS_NAMESPACE, claimId);
    if (record === undefined) throw new Error(`no claim ${claimId}`);
    for (const grant of grantsOf(record)) {
      const pod = this.#server.get("v1", "Pod", PODS_NAMESPACE, grant.workload_id);
      if (pod === undefined) {
        this.#runPod(grant.devices[0].node, grant.workload_id, grant.devices.length, claimId, true);
        continue;
      }
      this.#server.overwrite({
        ...pod,
        status: { phase: "Running", conditions: [{ type: "Ready", status: "True" }] },
      });
    }
  }

  /** Every write the server kept, with the operation it names. */
  mutations(): readonly { readonly operation: string }[] {
    return this.#server.writes.map((write) => ({ operation: operationOf(write) }));
  }

  /** The node as stored: the claim owning its geometry, its MIG config label, its version. */
  node(
    name: string,
  ): { readonly owner: string | null; readonly migConfig: string; readonly resourceVersion: number } {
    const node = this.#node(name);
    return {
      owner: labelsOf(node)[OWNER_LABEL] ?? null,
      migConfig: labelsOf(node)[MigLabel.config] ?? MIG_DISABLED,
      resourceVersion: Number(node.metadata.resourceVersion),
    };
  }

  #runPod(node: string, workloadId: string, units: number, claim: string | undefined, ready: boolean): void {
    const profile = claim === undefined
      ? null
      : grantsOf(this.#server.get("v1", "ConfigMap", PODS_NAMESPACE, claim)!)
        .find((g) => g.workload_id === workloadId)?.devices[0]?.mig_profile ?? null;
    const resource = profile === null ? "nvidia.com/gpu" : `nvidia.com/mig-${profile}`;
    this.#server.seed({
      apiVersion: "v1",
      kind: "Pod",
      metadata: {
        name: workloadId,
        namespace: PODS_NAMESPACE,
        labels: claim === undefined ? {} : { [CLAIM_POD_LABEL]: claim, [CLAIM_WORKLOAD_LABEL]: workloadId },
      },
      spec: {
        nodeName: node,
        containers: [{ name: "main", resources: { limits: { [resource]: String(units) } } }],
      },
      status: { phase: "Running", conditions: [{ type: "Ready", status: ready ? "True" : "False" }] },
    });
  }

  /** The claim whose record grants `workloadId` devices on `node`, if any. */
  #claimOf(node: string, workloadId: string): string | undefined {
    return this.#server.all("v1", "ConfigMap")
      .filter((c) => labelsOf(c)[CLAIM_POD_LABEL] === "record")
      .find((c) =>
        grantsOf(c).some((g) => g.workload_id === workloadId && g.devices.some((d) => d.node === node))
      )?.metadata.name;
  }

  /** The MIG manager's turn: applies every configuration pending for `migApplySeconds`. */
  #manage(): void {
    const now = this.#clock.monotonic();
    for (const node of this.#server.all("v1", "Node")) {
      const labels = labelsOf(node);
      const name = node.metadata.name;
      if (labels[MigLabel.state] !== MigState.pending) continue;
      const config = labels[MigLabel.config] ?? MIG_DISABLED;
      if (this.#seen.get(name)?.config !== config) this.#seen.set(name, { config, since: now });
      if (now < this.#seen.get(name)!.since + this.#applySeconds) continue;
      this.#seen.delete(name);
      const map = this.#server.get("v1", "ConfigMap", PODS_NAMESPACE, MIG_CONFIG_MAP);
      const configs = map === undefined
        ? {}
        : parseMigParted((map.data as Record<string, string>)[MIG_PARTED_KEY]);
      const layout = config === MIG_DISABLED ? {} : configs[config];
      if (layout === undefined) {
        this.#server.overwrite({
          ...node,
          metadata: { ...node.metadata, labels: { ...labels, [MigLabel.state]: MigState.failed } },
        });
        continue;
      }
      const annotations = (node.metadata.annotations ?? {}) as Record<string, string>;
      const devices = (JSON.parse(annotations[NodeAnnotation.devices]) as PublishedDevice[]).map((d) => {
        const slices = Object.entries(layout).flatMap(([profile, count]) =>
          Array.from({ length: count }, (_, k) => ({
            uuid: `MIG-${name}-${d.ordinal}-${config}-${profile}-${k}`,
            profile,
            memory_bytes: (d.mig_geometry?.profiles.find((p) => p.name === profile)?.memorySizeMB ?? 0) *
              2 ** 20,
          }))
        );
        const { mig: _previous, ...whole } = d;
        return slices.length === 0 ? whole : { ...whole, mig: slices };
      });
      this.#server.overwrite({
        ...node,
        metadata: {
          ...node.metadata,
          labels: { ...labels, [MigLabel.state]: MigState.success },
          annotations: { ...annotations, [NodeAnnotation.devices]: JSON.stringify(devices) },
        },
      });
    }
  }

  #node(name: string): StoredObject {
    const node = this.#server.get("v1", "Node", null, name);
    if (node === undefined) throw new RangeError(`no node ${name}`);
    return node;
  }

  #holds(node: string): Record<string, string[]> {
    const annotations = (this.#node(node).metadata.annotations ?? {}) as Record<string, string>;
    const text = annotations[NodeAnnotation.holds];
    return text === undefined ? {} : JSON.parse(text);
  }

  #foreignUnits(node: string): number {
    return this.#server.all("v1", "Pod")
      .filter((p) =>
        (p.spec as { nodeName?: string }).nodeName === node && labelsOf(p)[CLAIM_POD_LABEL] === undefined
      )
      .reduce((sum, p) => {
        const containers =
          (p.spec as { containers: { resources: { limits: Record<string, string> } }[] }).containers;
        return sum + containers.reduce((n, c) => n + Number(c.resources.limits["nvidia.com/gpu"] ?? "0"), 0);
      }, 0);
  }
}
