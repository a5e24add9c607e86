/**
 * Autoscaling decisions (spec runtime.scaling), pure: how many replicas a node's backlog asks for, taken
 * over every parent it reads, and every reason a node must stay at its declared scale. The KEDA rendering
 * (`deploy/manifests.ts`) renders a scaler only where {@link scalingRejections} is empty, with one trigger
 * per parent durable and {@link DEFAULT_TARGET_LAG_PER_REPLICA} as each trigger's lag threshold: the HPA
 * takes the highest replica count over the triggers, which is {@link observeDemand}'s maximum over parents,
 * so the rendered scaler and this function agree by construction.
 *
 * A parent whose observation is Unknown makes the whole demand unknown (`replicas: null`, the parent
 * named), never a zero that would scale a busy node down. A join whose parents are lopsided (some empty,
 * some backed up) is diagnosed starved: its backlog waits for counterparts no replica count brings.
 *
 * @example
 * ```ts
 * const decision = observeDemand({ a: known(sub(40)), b: known(sub(3)) });
 * decision.replicas; // 4: the maximum over parents, ceil(40 / 10)
 * ```
 *
 * @module
 */

import type { SubscriptionObservation } from "../backends/messaging.ts";
import type { Observation } from "../backends/outcomes.ts";
import { CapabilityError, ConfigError } from "../core/errors.ts";
import { compareCodePoints } from "../wire/identities.ts";

/** Messages one replica should carry at most: the rendered trigger's `lagThreshold`. */
export const DEFAULT_TARGET_LAG_PER_REPLICA = 10;
/** The fewest replicas a scaler leaves a processor: at zero it would never observe its end of stream. */
export const DEFAULT_MIN_REPLICAS = 1;
/** The most replicas a scaler gives a node unless the deploy says otherwise (`--max-replicas`). */
export const DEFAULT_MAX_REPLICAS = 10;

/** Diagnoses a {@link DemandDecision} carries beside its recommendation. */
export const Diagnosis = {
  /** Some parent could not be observed: no recommendation. */
  unknown: "unknown",
  /** Nothing is waiting on any parent. */
  idle: "idle",
  /** Every parent with work waiting: a capacity shortfall replicas repair (or none at all, for one parent). */
  backlog: "backlog",
  /** A join whose backed-up parents wait for parents that have nothing: no replica count repairs it. */
  starved: "starved",
} as const;
/** One of the {@link Diagnosis} values. */
export type Diagnosis = typeof Diagnosis[keyof typeof Diagnosis];

/** `ParentDemand.unknownReason` for a required parent nobody observed at all. */
export const MISSING_OBSERVATION = "missing";

/** A Job's parallelism is fixed at creation: nothing scales it (RUN-027); an error, never a silent skip. */
export const JOB_REJECTION = "the node renders as a Kubernetes Job, whose parallelism is fixed when it is " +
  "created and is not what a scaler scales: KEDA's ScaledObject and the HPA drive the /scale subresource " +
  "of a Deployment or StatefulSet, and a Job has none.";
/** Only processors are scaled. */
export const KIND_REJECTION = "only processors are autoscaled: a producer's or a consumer's replica " +
  "count is part of what the flow means.";
/** Nothing to measure. */
export const NO_PARENT_REJECTION = "the node reads no parent, so there is no backlog to scale on.";
/** Key ownership would rehash. */
export const PARTITIONED_REJECTION = "the node is partitioned: every replica owns the keys that hash " +
  "to it, and changing the replica count would rehash key ownership under running state.";
/** A singleton join must not become competing multi-worker joins (RUN-018). */
export const JOIN_REJECTION = "the node joins several parents at a single replica: a scaler would turn " +
  "that singleton join into competing multi-worker joins, delivering the halves of one group to " +
  "different replicas where neither can assemble it.";
/** Partition intent at one replica is intent, not an accident of the count (RUN-019). */
export const PARTITION_INTENT_REJECTION = "the node declares partition_by: a replica count of 1 does not " +
  "erase that intent, and scaling it from 1 would bind every new replica to the same competing durable, " +
  "splitting one key's history among independent, unfenced states.";
/** GPU nodes are scaled only on explicit opt-in. */
export const GPU_REJECTION = "the node runs on a GPU, which is scaled only with --gpu-autoscaling: " +
  "every replica claims a device.";

/** What {@link scalingRejections} reads of a node. */
export interface ScalingCandidate {
  /** `NodeSpec.kind`. */
  readonly kind: string;
  /** `partitionBy` set with more than one replica. */
  readonly isPartitioned: boolean;
  /** Whether the node renders as a Kubernetes Job (every node of a batch flow, a finite realtime producer). */
  readonly isJob: boolean;
  /** Whether the node reads any parent. */
  readonly hasParents: boolean;
  /** `NodeSpec.deviceType`. */
  readonly deviceType: string;
  /** The deploy's `--gpu-autoscaling` opt-in. */
  readonly gpuAutoscaling: boolean;
  /** More than one parent. */
  readonly isJoin: boolean;
  /** `partitionBy` set, whatever the replica count. */
  readonly declaresPartition: boolean;
}

/**
 * Every reason the node stays at a fixed scale, each a sentence naming the rule; empty means a scaler may
 * be rendered. {@link JOB_REJECTION} is among them for a Job: {@link admitAutoscaling} raises for it.
 */
export function scalingRejections(node: ScalingCandidate): string[] {
  const reasons: string[] = [];
  if (node.isJob) reasons.push(JOB_REJECTION);
  if (node.kind !== "processor") reasons.push(KIND_REJECTION);
  if (!node.hasParents) reasons.push(NO_PARENT_REJECTION);
  if (node.isPartitioned) reasons.push(PARTITIONED_REJECTION);
  else if (node.declaresPartition) reasons.push(PARTITION_INTENT_REJECTION);
  if (node.isJoin && !node.isPartitioned) reasons.push(JOIN_REJECTION);
  if (node.deviceType === "gpu" && !node.gpuAutoscaling) reasons.push(GPU_REJECTION);
  return reasons;
}

/**
 * The RUN-027 refusal, built in one place so the renderer and an admission check say the same words:
 * autoscaling was asked for processors that render as Jobs (every one named, in the order given).
 */
export function jobAutoscalingError(
  nodeNames: string | readonly string[],
  flowType: string,
): CapabilityError {
  const nodes = typeof nodeNames === "string" ? [nodeNames] : [...nodeNames];
  const which = nodes.length === 1 ? `processor ${nodes[0]}` : `processors ${nodes.join(", ")}`;
  return new CapabilityError(
    `autoscaling was requested, and ${which} of this ${flowType} flow ${
      JOB_REJECTION.replace("the node renders", nodes.length === 1 ? "renders" : "render each")
    }`,
    "deploy without --autoscaling, or run the flow as realtime (a Deployment) to scale it",
    { nodes, flow_type: flowType },
  );
}

/**
 * The render-time admission of one node under `--autoscaling`: its fixed-scale reasons (empty: render a
 * scaler). Throws {@link CapabilityError} ({@link jobAutoscalingError}) for a processor rendered as a Job.
 */
export function admitAutoscaling(nodeName: string, flowType: string, node: ScalingCandidate): string[] {
  const reasons = scalingRejections(node);
  if (node.kind === "processor" && reasons.includes(JOB_REJECTION)) {
    throw jobAutoscalingError(nodeName, flowType);
  }
  return reasons;
}

/**
 * Throws {@link ConfigError} for a rule a scaler cannot follow: a target below 1, a minimum below 1 (a
 * processor at zero never observes its end of stream), or a maximum below the minimum.
 */
export function validateScalingRule(target: number, minReplicas: number, maxReplicas: number): void {
  const problems: string[] = [];
  if (!Number.isSafeInteger(target) || target < 1) problems.push(`target lag ${target} is below 1`);
  if (!Number.isSafeInteger(minReplicas) || minReplicas < 1) {
    problems.push(`minimum ${minReplicas} replicas is below 1`);
  }
  if (!Number.isSafeInteger(maxReplicas) || maxReplicas < minReplicas) {
    problems.push(`maximum ${maxReplicas} replicas is below the minimum ${minReplicas}`);
  }
  if (problems.length > 0) {
    throw new ConfigError(
      `invalid scaling rule: ${problems.join("; ")}`,
      "give a whole target of 1 or more and 1 <= minimum <= maximum replicas (--max-replicas)",
      { target, min_replicas: minReplicas, max_replicas: maxReplicas },
    );
  }
}

/**
 * What a node still owes one parent: available plus leased, the sum the KEDA nats-jetstream trigger reads
 * (`num_pending + num_ack_pending`). `unresolved` is excluded: work the broker can no longer deliver is
 * not work another replica could take.
 */
export function parentLag(observation: SubscriptionObservation): number {
  return observation.available + observation.leased;
}

/** `ceil(lag / target)` (the HPA's AverageValue arithmetic), clamped to `[minReplicas, maxReplicas]`. */
export function replicasForLag(
  lag: number,
  target: number,
  minReplicas: number,
  maxReplicas: number,
): number {
  validateScalingRule(target, minReplicas, maxReplicas);
  return Math.min(maxReplicas, Math.max(minReplicas, Math.ceil(lag / target)));
}

/** One parent's part of a {@link DemandDecision}. */
export interface ParentDemand {
  readonly parent: string;
  /** What the node owes this parent, or `null` when it could not be observed. */
  readonly lag: number | null;
  /** What this parent alone asks for, or `null` when unknown. */
  readonly replicas: number | null;
  /** The Unknown's reason (or {@link MISSING_OBSERVATION}); empty when observed. */
  readonly unknownReason: string;
}

/** The outcome of {@link observeDemand}: canonical (parents sorted), whatever order they came in. */
export interface DemandDecision {
  /** The maximum over parents, clamped; `null` exactly when the diagnosis is unknown. */
  readonly replicas: number | null;
  readonly diagnosis: Diagnosis;
  /** Every evaluated parent, sorted by name. */
  readonly parents: readonly ParentDemand[];
  /** The parents that could not be observed, sorted. */
  readonly unknownParents: readonly string[];
  /** The parents with nothing waiting while another has a backlog (a starved join), sorted. */
  readonly starvedParents: readonly string[];
}

/** The rule {@link observeDemand} sizes with; each field defaults to the rendered scaler's. */
export interface ScalingRule {
  readonly targetLagPerReplica?: number;
  readonly minReplicas?: number;
  readonly maxReplicas?: number;
}

/**
 * Sizes and diagnoses a node's demand from every parent's subscription observation. `requiredParents`
 * (default: the observed ones) are evaluated, one without an observation as Unknown
 * ({@link MISSING_OBSERVATION}): nobody asking is not no work. Throws {@link ConfigError} for an invalid
 * rule or no parent at all.
 */
export function observeDemand(
  observations: Readonly<Record<string, Observation<SubscriptionObservation>>>,
  requiredParents: Iterable<string> | null = null,
  rule: ScalingRule = {},
): DemandDecision {
  const target = rule.targetLagPerReplica ?? DEFAULT_TARGET_LAG_PER_REPLICA;
  const min = rule.minReplicas ?? DEFAULT_MIN_REPLICAS;
  const max = rule.maxReplicas ?? DEFAULT_MAX_REPLICAS;
  validateScalingRule(target, min, max);
  const names = [...new Set([...(requiredParents ?? Object.keys(observations))])].sort(compareCodePoints);
  if (names.length === 0) {
    throw new ConfigError("a demand decision needs at least one parent", "pass the node's parents");
  }
  const parents = names.map((parent): ParentDemand => {
    const observation = Object.hasOwn(observations, parent) ? observations[parent] : null;
    if (observation === null || observation.kind === "unknown") {
      return {
        parent,
        lag: null,
        replicas: null,
        unknownReason: observation?.reason ?? MISSING_OBSERVATION,
      };
    }
    const lag = parentLag(observation.value);
    return { parent, lag, replicas: replicasForLag(lag, target, min, max), unknownReason: "" };
  });
  const unknownParents = parents.filter((p) => p.lag === null).map((p) => p.parent);
  if (unknownParents.length > 0) {
    return { replicas: null, diagnosis: Diagnosis.unknown, parents, unknownParents, starvedParents: [] };
  }
  const replicas = Math.max(...parents.map((p) => p.replicas!));
  const backedUp = parents.filter((p) => p.lag! > 0);
  const starvedParents = backedUp.length > 0 ? parents.filter((p) => p.lag === 0).map((p) => p.parent) : [];
  const diagnosis = backedUp.length === 0
    ? Diagnosis.idle
    : starvedParents.length > 0
    ? Diagnosis.starved
    : Diagnosis.backlog;
  return { replicas, diagnosis, parents, unknownParents, starvedParents };
}
