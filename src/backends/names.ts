/**
 * Every physical name a flow uses — broker subjects, streams, durables, dead-letter names and Kubernetes
 * resource names — derived from the user's flow id, run id and node names (WIRE.md "Names", spec
 * messaging.topology). This file is the one source of truth for them: the messenger, provisioning,
 * teardown, the manifests and the identity checks all call these functions, never format a name
 * themselves.
 *
 * Two lossy encoders underlie them: {@link sanitize} for the broker and {@link kubernetesName} for the
 * cluster. `backends/identity.ts` enumerates what they produce and rejects collisions.
 *
 * @module
 */

import { ConfigError } from "../core/errors.ts";

const UNSAFE_RUN = /[^A-Za-z0-9_-]+/g;
const NON_DNS_RUN = /[^a-z0-9-]+/g;
const EDGE_HYPHENS = /^-+|-+$/g;
const SUBJECT_TOKEN = /^[A-Za-z0-9_-]+$/;

/** The longest name Kubernetes accepts for the resources a flow creates (a DNS-1123 label). */
export const KUBERNETES_NAME_MAX_LENGTH = 63;

/**
 * The broker encoder: each maximal run of characters outside `[A-Za-z0-9_-]` becomes one `_`. The result
 * never contains a dot, a wildcard or a space, and `sanitize(sanitize(x)) === sanitize(x)`.
 *
 * @example sanitize("a.b c") === "a_b_c"
 */
export function sanitize(value: string): string {
  return value.replace(UNSAFE_RUN, "_");
}

/**
 * The Kubernetes encoder: the parts joined by `-`, lower-cased, each run of characters outside
 * `[a-z0-9-]` turned into one `-`, leading and trailing hyphens stripped, then cut to 63 characters and
 * stripped again. The result is a valid DNS-1123 label (or empty when nothing survives).
 *
 * @example kubernetesName("vf", "Flow_1", "cam.0") === "vf-flow-1-cam-0"
 */
export function kubernetesName(...parts: readonly string[]): string {
  const name = parts.join("-").toLowerCase().replace(NON_DNS_RUN, "-").replace(EDGE_HYPHENS, "");
  return name.slice(0, KUBERNETES_NAME_MAX_LENGTH).replace(EDGE_HYPHENS, "");
}

function replicaIndex(replica: number): string {
  if (!Number.isSafeInteger(replica) || replica < 0) {
    throw new ConfigError(
      `a replica id is a non-negative integer, got ${replica}`,
      "pass the replica's index",
    );
  }
  return String(replica);
}

/** The data subject of a node's output: `vf.{flow}.{run}.{node}`. */
export function subjectFor(flowId: string, runId: string, node: string): string {
  return `vf.${sanitize(flowId)}.${sanitize(runId)}.${sanitize(node)}`;
}

/** The end-of-stream subject of a node, on the same stream as its data: `vf.{flow}.{run}.{node}._eos`. */
export function eosSubjectFor(flowId: string, runId: string, node: string): string {
  return `${subjectFor(flowId, runId, node)}._eos`;
}

/** The stream holding a node's output: `vf-{flow}-{run}-{node}`. */
export function streamNameFor(flowId: string, runId: string, node: string): string {
  return `${streamPrefixFor(flowId, runId)}${sanitize(node)}`;
}

/**
 * The prefix every stream of one run shares: `vf-{flow}-{run}-`. Diagnostic only: it is also the prefix of
 * every stream of run `{run}-x`, so teardown never selects on it.
 */
export function streamPrefixFor(flowId: string, runId: string): string {
  return `vf-${sanitize(flowId)}-${sanitize(runId)}-`;
}

/** The flow-wide stop subject (core NATS, payload `stop`): `vf.{flow}.{run}._control.stop`. */
export function controlSubjectFor(flowId: string, runId: string): string {
  return `vf.${sanitize(flowId)}.${sanitize(runId)}._control.stop`;
}

/**
 * The shared data durable of the edge child ← parent: `{child}--from--{parent}`. Replicas of the child
 * compete on it; distinct children of one parent get distinct durables.
 */
export function durableNameFor(child: string, parent: string): string {
  return `${sanitize(child)}--from--${sanitize(parent)}`;
}

/** The per-replica data durable of a partitioned child: `{child}--from--{parent}--p{replica}`. */
export function partitionedDurableNameFor(child: string, parent: string, replica: number): string {
  return `${durableNameFor(child, parent)}--p${replicaIndex(replica)}`;
}

/**
 * The per-replica EOS durable, so every running replica of the child observes the parent's end:
 * `{child}--eos--{parent}--{instance}` (instance unique per running replica).
 */
export function eosDurableNameFor(child: string, parent: string, instance: string): string {
  return `${sanitize(child)}--eos--${sanitize(parent)}--${sanitize(instance)}`;
}

/** The provision-time durable on a node's EOS subject that retains an early EOS: `{node}--eos--anchor`. */
export function eosAnchorDurableNameFor(node: string): string {
  return `${sanitize(node)}--eos--anchor`;
}

/** The dead-letter stream, scoped to the flow so it outlives every run's teardown: `vf-{flow}-dlq`. */
export function dlqStreamName(flowId: string): string {
  return `vf-${sanitize(flowId)}-dlq`;
}

/** A node's dead-letter subject in one run: `vf.{flow}._dlq.{run}.{node}`. */
export function dlqSubjectFor(flowId: string, runId: string, node: string): string {
  return `vf.${sanitize(flowId)}._dlq.${sanitize(runId)}.${sanitize(node)}`;
}

/**
 * A wildcard over dead letters: the whole flow (`vf.{flow}._dlq.>`, also the DLQ stream's subject), or one
 * run and/or one node of it, `*` standing for the part not given.
 */
export function dlqSubjectFilter(flowId: string, runId?: string | null, node?: string | null): string {
  if (runId == null && node == null) return `vf.${sanitize(flowId)}._dlq.>`;
  const run = runId ? sanitize(runId) : "*";
  const name = node ? sanitize(node) : "*";
  return `vf.${sanitize(flowId)}._dlq.${run}.${name}`;
}

/** The sanitized tokens a data or EOS subject encodes. */
export interface SubjectOwner {
  readonly flow: string;
  readonly run: string;
  readonly node: string;
}

/**
 * The `(flow, run, node)` tokens of a data or EOS subject — sanitized, as {@link subjectFor} wrote them —
 * or `null` for any other subject (control, DLQ, wildcards, foreign). Subject tokens are dot-delimited and
 * sanitize never lets a dot through, so `vf.f.r.x-n` (run `r`) and `vf.f.r-x.n` (run `r-x`) stay apart
 * although both streams are `vf-f-r-x-n`.
 */
export function subjectOwner(subject: string): SubjectOwner | null {
  const tokens = subject.split(".");
  const data = tokens.length === 5 && tokens[4] === "_eos" ? tokens.slice(0, 4) : tokens;
  if (data.length !== 4 || data[0] !== "vf" || !data.slice(1).every((t) => SUBJECT_TOKEN.test(t))) {
    return null;
  }
  return { flow: data[1], run: data[2], node: data[3] };
}

/** The per-node Kubernetes resources besides the workload, by the suffix their names end with. */
export const KubernetesNodeResource = {
  env: "env",
  headlessService: "hl",
  disruptionBudget: "pdb",
  scaler: "scaler",
} as const;
/** A per-node Kubernetes resource suffix. */
export type KubernetesNodeResource = typeof KubernetesNodeResource[keyof typeof KubernetesNodeResource];

/** The flow-level Kubernetes resources, by the suffix their names end with. */
export const KubernetesFlowResource = {
  broker: "broker",
  specs: "specs",
  networkPolicy: "netpol",
  provision: "provision",
} as const;
/** A flow-level Kubernetes resource suffix. */
export type KubernetesFlowResource = typeof KubernetesFlowResource[keyof typeof KubernetesFlowResource];

/** The Deployment or Job running a node: `vf-{flow}-{node}` through {@link kubernetesName}. */
export function kubernetesWorkloadName(flowId: string, node: string): string {
  return kubernetesName("vf", flowId, node);
}

/** A per-node resource (env ConfigMap, headless Service, PDB, scaler): `vf-{flow}-{node}-{suffix}`. */
export function kubernetesNodeResourceName(
  flowId: string,
  node: string,
  resource: KubernetesNodeResource,
): string {
  return kubernetesName("vf", flowId, node, resource);
}

/** A flow-level resource (broker, specs ConfigMap, NetworkPolicy, provision Job): `vf-{flow}-{suffix}`. */
export function kubernetesFlowResourceName(flowId: string, resource: KubernetesFlowResource): string {
  return kubernetesName("vf", flowId, resource);
}
