/**
 * Waiting for a Kubernetes Job to finish, bounded: the Job's `Complete` condition is success, its `Failed`
 * condition is {@link FlowFailed} (exit 4: the run's work ran and failed), and a Job that is neither when
 * the time is up is {@link ClusterError} (exit 3: the cluster did not run it in time: unschedulable, an
 * image it cannot pull, a service its pods cannot reach). A Job that disappears while waited on is a
 * ClusterError too; a status that cannot be read is never taken as "still running" past the deadline.
 *
 * @module
 */

import { type Clock, systemClock } from "../backends/clock.ts";
import { ClusterError, FlowFailed } from "../core/errors.ts";
import type { ClusterClient, LiveObject, ObjectRef } from "./cluster_client.ts";

/** How long to wait and how often to look. */
export interface JobWaitOptions {
  /** Seconds before giving up. */
  readonly timeoutSeconds: number;
  /** Seconds between two reads of the Job's status (1 unless told). */
  readonly pollSeconds?: number;
  /** The clock the deadline and the pauses are read on ({@link systemClock}). */
  readonly clock?: Clock;
}

interface JobCondition {
  readonly type?: string;
  readonly status?: string;
  readonly reason?: string;
  readonly message?: string;
}

function conditionOf(job: LiveObject, type: string): JobCondition | undefined {
  const status = job.status as { conditions?: JobCondition[] } | undefined;
  return status?.conditions?.find((c) => c.type === type && c.status === "True");
}

/** Resolves with the Job once it is `Complete`; throws as the module doc says otherwise. */
export async function waitForJob(
  cluster: ClusterClient,
  ref: ObjectRef,
  options: JobWaitOptions,
): Promise<LiveObject> {
  const clock = options.clock ?? systemClock;
  const deadline = clock.monotonic() + options.timeoutSeconds;
  const where = `Job ${ref.namespace}/${ref.name}`;
  const logs = `kubectl logs -n ${ref.namespace} job/${ref.name}`;
  for (;;) {
    const job = await cluster.read(ref);
    if (job === null) {
      throw new ClusterError(
        `${where} disappeared while it was waited on`,
        "see who deleted it (another teardown?), then apply again",
        { job: ref.name, namespace: ref.namespace },
      );
    }
    if (conditionOf(job, "Complete") !== undefined) return job;
    const failed = conditionOf(job, "Failed");
    if (failed !== undefined) {
      throw new FlowFailed(
        `${where} failed (${failed.reason ?? "no reason given"}${
          failed.message ? `: ${failed.message}` : ""
        })`,
        `read what it printed (${logs}), fix it, tear the run down and apply again`,
        { job: ref.name, namespace: ref.namespace, reason: failed.reason ?? null },
      );
    }
    const left = deadline - clock.monotonic();
    if (left <= 0) {
      throw new ClusterError(
        `${where} did not finish within ${options.timeoutSeconds} s`,
        `see why its pod does not run or finish (kubectl describe -n ${ref.namespace} job/${ref.name}; ${logs}); ` +
          "a longer --wait-timeout waits longer",
        { job: ref.name, namespace: ref.namespace, timeout_s: options.timeoutSeconds },
      );
    }
    await clock.sleep(Math.min(options.pollSeconds ?? 1, left));
  }
}
