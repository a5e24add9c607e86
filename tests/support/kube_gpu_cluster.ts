/**
 * A GPU cluster on the test Kubernetes API server, for the allocation stories: the nodes of a scenario
 * as Node objects labelled the way GPU Feature Discovery labels them, their devices published in the
 * annotation a node agent writes (GPU UUIDs, memory), foreign workloads as running pods that request
 * `nvidia.com/gpu`, and the story hooks ({@link AllocationHooks}) played on the server: refused reads,
 * pods scheduled and gone, and every write the backend made read back from the server's log.
 *
 * No MIG manager runs here: nothing answers a `nvidia.com/mig.config` write, so a node's geometry never
 * changes ({@link KubeGpuCluster.applyPendingGeometry} refuses).
 *
 * @module
 */

import type { NodeFixture } from "../../src/backends/memory/allocation.ts";
import type { UnknownReason } from "../../src/backends/outcomes.ts";
import {
  CLAIM_POD_LABEL,
  CLAIM_WORKLOAD_LABEL,
  GfdDeviceLabel,
  NodeAnnotation,
  type PublishedDevice,
} from "../../src/deploy/allocation_kubernetes.ts";
import { GpuNodeLabel } from "../../src/deploy/gpu_strategy.ts";
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

/** The scenario's nodes on `server`, and the hooks the stories drive them with. */
export class KubeGpuCluster implements AllocationHooks {
  readonly #server: KubeApiServer;
  readonly #failing = new Map<"nodes" | "pods" | "config", UnknownReason>();

  /** Seeds `nodes` (and their foreign workloads) on `server`, and answers its refusals from now on. */
  constructor(server: KubeApiServer, nodes: readonly NodeFixture[]) {
    this.#server = server;
    for (const fixture of nodes) {
      const devices: PublishedDevice[] = Array.from({ length: fixture.gpuCount }, (_, ordinal) => ({
        ordinal,
        uuid: `GPU-${fixture.name}-${ordinal}`,
        memory_bytes: Math.round(fixture.memoryGib * GIB),
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
  }

  /** Refuses GETs of nodes, of pods, or of the claim records (`config`) with `reason`; null restores them. */
  failReads(kind: "nodes" | "pods" | "config", reason: UnknownReason | null = "timeout"): void {
    if (reason === null) this.#failing.delete(kind);
    else this.#failing.set(kind, reason);
  }

  /**
   * A pod now runs on `node`: the claim's pod for `workloadId` when a claim holds devices for it there,
   * else a foreign pod requesting `units` of `nvidia.com/gpu`. Throws RangeError when a foreign pod does
   * not fit beside the claims' holds and the other foreign pods.
   */
  bindWorkload(node: string, workloadId: string, units: number): void {
    const holders = this.#holds(node);
    const own = [...new Set(Object.values(holders).flat())].find((h) => h.endsWith(`#${workloadId}`));
    if (own === undefined) {
      const count = Number(this.#node(node).metadata.labels?.[GfdDeviceLabel.count] ?? "0");
      const free = count - Object.keys(holders).length - this.#foreignUnits(node);
      if (!Number.isSafeInteger(units) || units < 1 || units > free) {
        throw new RangeError(
          `workload ${workloadId} cannot take ${units} device(s) on ${node}: ${free} free`,
        );
      }
    }
    const claim = own?.split("#")[0];
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
        containers: [{ name: "main", resources: { limits: { "nvidia.com/gpu": String(units) } } }],
      },
      status: { phase: "Running", conditions: [{ type: "Ready", status: "False" }] },
    });
  }

  /** The pod of `workloadId` is gone. */
  unbindWorkload(_node: string, workloadId: string): void {
    this.#server.remove("v1", "Pod", PODS_NAMESPACE, workloadId);
  }

  /** Refuses: no MIG manager runs on this cluster, so no geometry write is ever pending. */
  applyPendingGeometry(): void {
    throw new Error("this cluster runs no MIG manager: no geometry write can be applied");
  }

  /** Every pod of the claim reports Ready; throws when the claim has none. */
  markWorkloadReady(claimId: string): void {
    const pods = this.#server.all("v1", "Pod").filter((p) =>
      (p.metadata.labels as Record<string, string> | undefined)?.[CLAIM_POD_LABEL] === claimId
    );
    if (pods.length === 0) throw new Error(`claim ${claimId} has no pod to mark ready`);
    for (const pod of pods) {
      this.#server.remove("v1", "Pod", PODS_NAMESPACE, pod.metadata.name);
      const { resourceVersion: _version, uid: _uid, ...metadata } = pod.metadata;
      this.#server.seed({
        ...pod,
        metadata,
        status: { phase: "Running", conditions: [{ type: "Ready", status: "True" }] },
      });
    }
  }

  /** Every write the server kept, with the operation it names. */
  mutations(): readonly { readonly operation: string }[] {
    return this.#server.writes.map((write) => ({ operation: operationOf(write) }));
  }

  /** The node as stored: videoflow stamps no node owner here; its MIG config label; its version. */
  node(
    name: string,
  ): { readonly owner: string | null; readonly migConfig: string; readonly resourceVersion: number } {
    const node = this.#node(name);
    return {
      owner: null,
      migConfig: (node.metadata.labels as Record<string, string> | undefined)?.["nvidia.com/mig.config"] ??
        "all-disabled",
      resourceVersion: Number(node.metadata.resourceVersion),
    };
  }

  #node(name: string): StoredObject & { metadata: { labels?: Record<string, string> } } {
    const node = this.#server.get("v1", "Node", null, name);
    if (node === undefined) throw new RangeError(`no node ${name}`);
    return node as StoredObject & { metadata: { labels?: Record<string, string> } };
  }

  #holds(node: string): Record<string, string[]> {
    const annotations = (this.#node(node).metadata.annotations ?? {}) as Record<string, string>;
    const text = annotations[NodeAnnotation.holds];
    return text === undefined ? {} : JSON.parse(text);
  }

  #foreignUnits(node: string): number {
    return this.#server.all("v1", "Pod")
      .filter((p) =>
        (p.spec as { nodeName?: string }).nodeName === node &&
        (p.metadata.labels as Record<string, string> | undefined)?.[CLAIM_POD_LABEL] === undefined
      )
      .reduce((sum, p) => {
        const containers =
          (p.spec as { containers: { resources: { limits: Record<string, string> } }[] }).containers;
        return sum + containers.reduce((n, c) => n + Number(c.resources.limits["nvidia.com/gpu"] ?? "0"), 0);
      }, 0);
  }
}
