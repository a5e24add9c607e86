/**
 * The scaling decisions (src/runtime/scaling.ts): demand is the maximum over every parent and canonical
 * under any order, an Unknown parent is never a zero, a lopsided join is starved, and every fixed-scale
 * rule names its reason (the Job one as an error, RUN-027).
 */
import assert from "node:assert/strict";
import type { SubscriptionObservation } from "../../../src/backends/messaging.ts";
import { known, unknown } from "../../../src/backends/outcomes.ts";
import { CapabilityError, ConfigError } from "../../../src/core/errors.ts";
import {
  admitAutoscaling,
  Diagnosis,
  GPU_REJECTION,
  JOB_REJECTION,
  JOIN_REJECTION,
  KIND_REJECTION,
  MISSING_OBSERVATION,
  NO_PARENT_REJECTION,
  observeDemand,
  parentLag,
  PARTITION_INTENT_REJECTION,
  PARTITIONED_REJECTION,
  replicasForLag,
  type ScalingCandidate,
  scalingRejections,
  validateScalingRule,
} from "../../../src/runtime/scaling.ts";

function sub(available: number, leased = 0, unresolved = 0): SubscriptionObservation {
  return { available, leased, unresolved, dropped: 0, rejectedPublications: 0 };
}

const PROCESSOR: ScalingCandidate = {
  kind: "processor",
  isPartitioned: false,
  isJob: false,
  hasParents: true,
  deviceType: "cpu",
  gpuAutoscaling: false,
  isJoin: false,
  declaresPartition: false,
};

Deno.test("a parent's lag is available plus leased, never what the broker can no longer deliver", () => {
  assert.equal(parentLag(sub(7, 3, 100)), 10);
});

Deno.test("replicas for a lag are ceil(lag / target), clamped to the rule's range", () => {
  assert.equal(replicasForLag(0, 10, 1, 10), 1);
  assert.equal(replicasForLag(11, 10, 1, 10), 2);
  assert.equal(replicasForLag(500, 10, 1, 10), 10);
  assert.throws(() => replicasForLag(5, 0, 1, 10), ConfigError);
  assert.throws(() => validateScalingRule(10, 0, 10), /minimum 0/);
  assert.throws(() => validateScalingRule(10, 3, 2), /maximum 2/);
});

Deno.test("demand is the maximum over every parent, the same in any order", () => {
  const a = { left: known(sub(5)), right: known(sub(38, 2)) };
  const b = { right: known(sub(38, 2)), left: known(sub(5)) };
  const decision = observeDemand(a);
  assert.equal(decision.replicas, 4);
  assert.equal(decision.diagnosis, Diagnosis.backlog);
  assert.deepEqual(decision.parents.map((p) => p.parent), ["left", "right"]);
  assert.deepEqual(observeDemand(b), decision);
});

Deno.test("an Unknown or missing parent makes the demand unknown, never a zero", () => {
  const decision = observeDemand({ a: known(sub(0)), b: unknown("timeout") }, ["a", "b", "c"]);
  assert.equal(decision.replicas, null);
  assert.equal(decision.diagnosis, Diagnosis.unknown);
  assert.deepEqual(decision.unknownParents, ["b", "c"]);
  assert.deepEqual(decision.parents.map((p) => p.unknownReason), ["", "timeout", MISSING_OBSERVATION]);
  assert.throws(() => observeDemand({}), ConfigError);
});

Deno.test("a join with one parent empty and another backed up is starved; nothing waiting is idle", () => {
  const starved = observeDemand({ a: known(sub(0)), b: known(sub(90)) });
  assert.equal(starved.diagnosis, Diagnosis.starved);
  assert.deepEqual(starved.starvedParents, ["a"]);
  assert.equal(starved.replicas, 9);
  assert.equal(observeDemand({ a: known(sub(0)) }).diagnosis, Diagnosis.idle);
});

Deno.test("every fixed-scale rule names its reason; an ordinary processor has none", () => {
  assert.deepEqual(scalingRejections(PROCESSOR), []);
  assert.deepEqual(scalingRejections({ ...PROCESSOR, kind: "consumer" }), [KIND_REJECTION]);
  assert.deepEqual(scalingRejections({ ...PROCESSOR, kind: "producer", hasParents: false }), [
    KIND_REJECTION,
    NO_PARENT_REJECTION,
  ]);
  assert.deepEqual(
    scalingRejections({ ...PROCESSOR, isPartitioned: true, declaresPartition: true, isJoin: true }),
    [
      PARTITIONED_REJECTION,
    ],
  );
  assert.deepEqual(scalingRejections({ ...PROCESSOR, declaresPartition: true }), [
    PARTITION_INTENT_REJECTION,
  ]);
  assert.deepEqual(scalingRejections({ ...PROCESSOR, isJoin: true }), [JOIN_REJECTION]);
  assert.deepEqual(scalingRejections({ ...PROCESSOR, deviceType: "gpu" }), [GPU_REJECTION]);
  assert.deepEqual(scalingRejections({ ...PROCESSOR, deviceType: "gpu", gpuAutoscaling: true }), []);
});

Deno.test("autoscaling a processor rendered as a Job is an error; a Job consumer is only kept at scale", () => {
  assert.throws(
    () => admitAutoscaling("square", "batch", { ...PROCESSOR, isJob: true }),
    (error: unknown) =>
      error instanceof CapabilityError && /processor square of this batch flow/.test(error.message),
  );
  assert.deepEqual(admitAutoscaling("print", "batch", { ...PROCESSOR, kind: "consumer", isJob: true }), [
    JOB_REJECTION,
    KIND_REJECTION,
  ]);
});
