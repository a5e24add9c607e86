/**
 * Collision-resistant logical identities over the physical names of `names.ts` (spec
 * backends.identity).
 *
 * Every broker subject, stream, durable and Kubernetes resource is derived from user-chosen strings
 * through two lossy encoders, so distinct logical identities can meet on one physical name: `a.b` and
 * `a_b` share a stream, `Node` and `node` share a Deployment, two long names truncate onto each other, and
 * hyphen-joined tuples collide across positions (`vf-f-r-x-n` is node `x-n` of run `r` and node `n` of
 * run `r-x`). This module enumerates every physical name a compiled flow uses, finds the names two
 * distinct identities share (a flow with one is rejected at compile time, `IdentityCollision`), and writes
 * and reads the owner labels that let teardown match a run exactly instead of by name prefix.
 *
 * @module
 */

import { IdentityCollision } from "../core/errors.ts";
import { compareCodePoints } from "../wire/identities.ts";
import {
  controlSubjectFor,
  dlqStreamName,
  dlqSubjectFor,
  durableNameFor,
  eosAnchorDurableNameFor,
  eosDurableNameFor,
  eosSubjectFor,
  KUBERNETES_NAME_MAX_LENGTH,
  KubernetesFlowResource,
  kubernetesFlowResourceName,
  KubernetesNodeResource,
  kubernetesNodeResourceName,
  kubernetesWorkloadName,
  partitionedDurableNameFor,
  sanitize,
  streamNameFor,
  streamPrefixFor,
  subjectFor,
} from "./names.ts";

/** The metadata keys of exact ownership (RFC 0006), written on streams and consumers, compared verbatim. */
export const OwnerLabel = {
  flow: "videoflow.io/flow-id",
  run: "videoflow.io/run-id",
  node: "videoflow.io/node",
  kind: "videoflow.io/kind",
  generation: "videoflow.io/generation",
} as const;
/** An ownership metadata key. */
export type OwnerLabel = typeof OwnerLabel[keyof typeof OwnerLabel];

/** The kinds of physical name {@link derivedNames} reports (besides `k8s_<resource suffix>`). */
export const IdentityKind = {
  controlSubject: "control_subject",
  dlqStream: "dlq_stream",
  streamPrefix: "stream_prefix",
  subject: "subject",
  stream: "stream",
  eosSubject: "eos_subject",
  eosAnchor: "eos_anchor",
  dlqSubject: "dlq_subject",
  durable: "durable",
  partitionedDurable: "partitioned_durable",
  eosDurable: "eos_durable",
  k8sWorkload: "k8s_workload",
  /** A node name under the broker encoder ({@link nodeNameCollisions}). */
  broker: "broker",
  /** A node name under the Kubernetes encoder ({@link nodeNameCollisions}). */
  kubernetes: "kubernetes",
} as const;

/**
 * What the identity checks read of a compiled node: the NodeSpec satisfies it. Only the name, the edges
 * and the partitioning decide which physical names a node brings.
 */
export interface NamedSpec {
  readonly name: string;
  readonly parents: readonly string[];
  readonly nbTasks: number;
  readonly partitionBy: string | null;
}

/** Ownership metadata: label key to value. */
export type OwnerMetadata = Readonly<Record<string, string>>;

function quote(value: string): string {
  return JSON.stringify(value);
}

function compareParts(a: readonly string[], b: readonly string[]): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    const order = compareCodePoints(a[i], b[i]);
    if (order !== 0) return order;
  }
  return a.length - b.length;
}

/** What a physical name means: its kind and the exact logical parts it encodes. Immutable. */
export class LogicalIdentity {
  readonly kind: string;
  readonly parts: readonly string[];

  constructor(kind: string, parts: readonly string[]) {
    this.kind = kind;
    this.parts = Object.freeze([...parts]);
    Object.freeze(this);
  }

  /** A string equal for two identities exactly when kind and parts are equal. */
  get key(): string {
    return JSON.stringify([this.kind, ...this.parts]);
  }

  /** `kind("part", ...)`, as a collision report prints it. */
  render(): string {
    return `${this.kind}(${this.parts.map(quote).join(", ")})`;
  }
}

/** Distinct logical identities that map to one physical name. Immutable. */
export class Collision {
  readonly physical: string;
  readonly identities: readonly LogicalIdentity[];

  constructor(physical: string, identities: readonly LogicalIdentity[]) {
    this.physical = physical;
    this.identities = Object.freeze([...identities]);
    Object.freeze(this);
  }

  /** `"physical" <- kind("a") and kind("b")`. */
  render(): string {
    return `${quote(this.physical)} <- ${this.identities.map((i) => i.render()).join(" and ")}`;
  }
}

function distinctSorted(identities: readonly LogicalIdentity[]): LogicalIdentity[] {
  const byKey = new Map(identities.map((i) => [i.key, i]));
  return [...byKey.values()].sort((a, b) =>
    compareCodePoints(a.kind, b.kind) || compareParts(a.parts, b.parts)
  );
}

function sameKindCollisions(names: ReadonlyMap<string, readonly LogicalIdentity[]>): Collision[] {
  const found: Collision[] = [];
  for (const [physical, identities] of names) {
    const byKind = new Map<string, LogicalIdentity[]>();
    for (const identity of identities) {
      const group = byKind.get(identity.kind) ?? [];
      group.push(identity);
      byKind.set(identity.kind, group);
    }
    for (const group of byKind.values()) {
      const distinct = distinctSorted(group);
      if (distinct.length > 1) found.push(new Collision(physical, distinct));
    }
  }
  return found;
}

function instancesOf(
  instanceIds:
    | ReadonlyMap<string, readonly string[]>
    | Readonly<Record<string, readonly string[]>>
    | undefined,
  node: string,
): readonly string[] {
  if (instanceIds === undefined) return [];
  if (instanceIds instanceof Map) return instanceIds.get(node) ?? [];
  const record = instanceIds as Readonly<Record<string, readonly string[]>>;
  return Object.hasOwn(record, node) ? record[node] : [];
}

/**
 * Every physical name a compiled flow will create or bind, mapped to the logical identities that produce
 * it, in a stable order. The exact set — not a prefix — that a teardown may delete, and the corpus the
 * collision check runs over. A parent that is not one of `specs` brings no durable.
 *
 * @param instanceIds per-node EOS instance ids when known (they are minted at worker start, so
 *   provisioning cannot enumerate them; pass what a test or a running flow knows).
 */
export function derivedNames(
  specs: readonly NamedSpec[],
  flowId: string,
  runId: string,
  instanceIds?: ReadonlyMap<string, readonly string[]> | Readonly<Record<string, readonly string[]>>,
): Map<string, LogicalIdentity[]> {
  const names = new Map<string, LogicalIdentity[]>();
  const add = (physical: string, kind: string, ...parts: string[]): void => {
    const identities = names.get(physical) ?? [];
    identities.push(new LogicalIdentity(kind, parts));
    names.set(physical, identities);
  };
  add(controlSubjectFor(flowId, runId), IdentityKind.controlSubject, flowId, runId);
  add(dlqStreamName(flowId), IdentityKind.dlqStream, flowId);
  add(streamPrefixFor(flowId, runId), IdentityKind.streamPrefix, flowId, runId);
  for (const resource of Object.values(KubernetesFlowResource)) {
    add(kubernetesFlowResourceName(flowId, resource), `k8s_${resource}`, flowId);
  }
  const known = new Set(specs.map((spec) => spec.name));
  for (const spec of specs) {
    const n = spec.name;
    add(subjectFor(flowId, runId, n), IdentityKind.subject, flowId, runId, n);
    add(streamNameFor(flowId, runId, n), IdentityKind.stream, flowId, runId, n);
    add(eosSubjectFor(flowId, runId, n), IdentityKind.eosSubject, flowId, runId, n);
    add(eosAnchorDurableNameFor(n), IdentityKind.eosAnchor, n);
    add(dlqSubjectFor(flowId, runId, n), IdentityKind.dlqSubject, flowId, runId, n);
    add(kubernetesWorkloadName(flowId, n), IdentityKind.k8sWorkload, flowId, n);
    for (const resource of Object.values(KubernetesNodeResource)) {
      add(kubernetesNodeResourceName(flowId, n, resource), `k8s_${resource}`, flowId, n);
    }
    const partitioned = Boolean(spec.partitionBy) && spec.nbTasks > 1;
    for (const parent of spec.parents) {
      if (!known.has(parent)) continue;
      if (partitioned) {
        for (let replica = 0; replica < spec.nbTasks; replica++) {
          add(
            partitionedDurableNameFor(n, parent, replica),
            IdentityKind.partitionedDurable,
            n,
            parent,
            String(replica),
          );
        }
      } else {
        add(durableNameFor(n, parent), IdentityKind.durable, n, parent);
      }
      for (const instance of instancesOf(instanceIds, n)) {
        add(eosDurableNameFor(n, parent, instance), IdentityKind.eosDurable, n, parent, instance);
      }
    }
  }
  return names;
}

/**
 * Physical names that two distinct logical identities of the same kind map to within one run. Different
 * kinds may legitimately share a string (a subject and a stream never occupy the same namespace), so only
 * same-kind clashes count. Empty means the flow's names are unambiguous.
 */
export function collisions(specs: readonly NamedSpec[], flowId: string, runId: string): Collision[] {
  return sameKindCollisions(derivedNames(specs, flowId, runId));
}

/**
 * Same-kind collisions between the names of several runs of one flow (`r` vs `r-x`), for teardown safety
 * checks. Flow-scoped names (the DLQ stream, flow-level Kubernetes resources) are one identity in every
 * run, so they never count.
 */
export function collisionsAcrossRuns(
  specs: readonly NamedSpec[],
  flowId: string,
  runIds: Iterable<string>,
): Collision[] {
  const merged = new Map<string, LogicalIdentity[]>();
  for (const runId of runIds) {
    for (const [physical, identities] of derivedNames(specs, flowId, runId)) {
      merged.set(physical, [...(merged.get(physical) ?? []), ...identities]);
    }
  }
  return sameKindCollisions(merged);
}

/**
 * Node names that encode to one physical name under either encoder — the check the graph validator runs
 * before a flow is compiled. Under the broker encoder the physical name is `sanitize(name)`; under the
 * Kubernetes encoder it is the workload name `vf-f-{name}` (a stand-in flow id; the compile-time check
 * with the real one is {@link collisions}). Repeated identical names are not a collision here.
 */
export function nodeNameCollisions(names: readonly string[]): Collision[] {
  const encoders: ReadonlyArray<readonly [string, (name: string) => string]> = [
    [IdentityKind.broker, sanitize],
    [IdentityKind.kubernetes, (name) => kubernetesWorkloadName("f", name)],
  ];
  const found: Collision[] = [];
  for (const [kind, encode] of encoders) {
    const groups = new Map<string, Set<string>>();
    for (const name of names) {
      const physical = encode(name);
      groups.set(physical, (groups.get(physical) ?? new Set()).add(name));
    }
    for (const [physical, members] of groups) {
      if (members.size < 2) continue;
      const sorted = [...members].sort(compareCodePoints);
      found.push(new Collision(physical, sorted.map((m) => new LogicalIdentity(kind, [m]))));
    }
  }
  return found;
}

/** One line per collision, `  - "physical" <- kind(...) and kind(...)`, joined by newlines. */
export function renderCollisions(found: readonly Collision[]): string {
  return found.map((c) => `  - ${c.render()}`).join("\n");
}

/**
 * Rejects a flow whose names collide: throws {@link IdentityCollision} listing every collision found, with
 * the remedy. Returns normally when `found` is empty.
 */
export function raiseForCollisions(found: readonly Collision[]): void {
  if (found.length === 0) return;
  throw new IdentityCollision(
    `${found.length} physical name(s) would be shared by distinct logical identities:\n${
      renderCollisions(found)
    }`,
    "rename the nodes (or the flow/run ids) so their names differ in more than case, punctuation or " +
      `characters beyond the first ${KUBERNETES_NAME_MAX_LENGTH} of a Kubernetes name`,
    { collisions: found.map((c) => c.physical) },
  );
}

/**
 * Exact-ownership metadata for a broker resource: flow and run always, node, kind and generation when
 * given. Written as JetStream stream/consumer metadata and compared verbatim by teardown, which is what
 * makes runs `r` and `r-x` distinguishable when their names share a prefix.
 */
export function ownerLabels(
  flowId: string,
  runId: string,
  node?: string | null,
  kind?: string | null,
  generation?: string | null,
): Record<string, string> {
  const labels: Record<string, string> = { [OwnerLabel.flow]: flowId, [OwnerLabel.run]: runId };
  if (node != null) labels[OwnerLabel.node] = node;
  if (kind != null) labels[OwnerLabel.kind] = kind;
  if (generation != null) labels[OwnerLabel.generation] = generation;
  return labels;
}

/**
 * Ownership metadata for a flow-scoped resource — the dead-letter stream, which outlives every run. It
 * carries no run label on purpose: {@link owns} is false for it under every run id.
 */
export function flowLabels(flowId: string, kind: string): Record<string, string> {
  return { [OwnerLabel.flow]: flowId, [OwnerLabel.kind]: kind };
}

/** Whether a resource carries videoflow ownership metadata at all (labelled, RFC 0006, versus legacy). */
export function hasOwnerLabels(metadata: OwnerMetadata | null | undefined): boolean {
  if (!metadata) return false;
  return Object.hasOwn(metadata, OwnerLabel.flow) || Object.hasOwn(metadata, OwnerLabel.run);
}

/**
 * Whether `metadata` names exactly this run — both labels present and equal, compared verbatim — and, when
 * `generation` is given, this provisioning generation too.
 */
export function owns(
  metadata: OwnerMetadata | null | undefined,
  flowId: string,
  runId: string,
  generation?: string | null,
): boolean {
  if (!metadata) return false;
  const label = (key: OwnerLabel): string | undefined =>
    Object.hasOwn(metadata, key) ? metadata[key] : undefined;
  if (label(OwnerLabel.flow) !== flowId || label(OwnerLabel.run) !== runId) return false;
  return generation == null || label(OwnerLabel.generation) === generation;
}
