/**
 * Tearing down one run on a cluster (`vf deploy --teardown`): exactly the objects the run owns, found by
 * its owner labels (`videoflow.io/flow-id` and `videoflow.io/run-id`, both equal, compared exactly, never
 * by a name prefix), of every kind the renderer emits ({@link RENDERED_KINDS}), scalers first. An object
 * of another run (r1 and r10 share every name prefix) or an unlabelled one is never touched: each object
 * is deleted with its uid and resourceVersion as preconditions, so one that changed since it was listed
 * is listed again and deleted only if it is still the run's. The teardown lists and deletes until nothing
 * of the run is left; what is still there at the deadline (an object whose finalizers hold it) is
 * a {@link ClusterError}, never reported as removed. A kind the cluster does not serve (KEDA absent) holds
 * nothing of the run and is skipped; a listing that fails is an error, not "nothing to remove".
 *
 * @module
 */

import { type Clock, systemClock } from "../backends/clock.ts";
import { OwnerLabel } from "../backends/identity.ts";
import { ClusterError } from "../core/errors.ts";
import type { ClusterClient, LiveObject } from "./cluster_client.ts";
import { type KindRef, RENDERED_KINDS } from "./manifests.ts";

/** The run to tear down. */
export interface TeardownOptions {
  /** The flow whose run it is. */
  readonly flowId: string;
  /** The run whose objects are deleted. */
  readonly runId: string;
  /** The namespace searched. */
  readonly namespace: string;
  /** Seconds to wait for deleted objects to be gone. */
  readonly timeoutSeconds: number;
  /** Seconds between two listings while waiting (1 unless told). */
  readonly pollSeconds?: number;
  /** The clock the deadline is read on (the system clock). */
  readonly clock?: Clock;
}

/** What {@link teardownRun} removed. */
export interface TeardownReport {
  /** `Kind name` of every object deleted, in deletion order. */
  readonly deleted: readonly string[];
}

function owned(object: LiveObject, options: TeardownOptions): boolean {
  const labels = object.metadata.labels;
  return labels[OwnerLabel.flow] === options.flowId && labels[OwnerLabel.run] === options.runId;
}

async function servedKinds(cluster: ClusterClient): Promise<KindRef[]> {
  const served: KindRef[] = [];
  for (const kind of RENDERED_KINDS) {
    if (await cluster.serves(kind.apiVersion, kind.kind)) served.push(kind);
  }
  return served;
}

async function ownedObjects(
  cluster: ClusterClient,
  kinds: readonly KindRef[],
  options: TeardownOptions,
): Promise<LiveObject[]> {
  const selector = `${OwnerLabel.flow}=${options.flowId},${OwnerLabel.run}=${options.runId}`;
  const found: LiveObject[] = [];
  for (const { apiVersion, kind } of kinds) {
    const listed = await cluster.list(apiVersion, kind, options.namespace, selector);
    found.push(...listed.filter((object) => owned(object, options)));
  }
  return found;
}

/** Deletes what the run owns and waits until it is gone (see the module doc). */
export async function teardownRun(cluster: ClusterClient, options: TeardownOptions): Promise<TeardownReport> {
  const clock = options.clock ?? systemClock;
  const kinds = await servedKinds(cluster);
  const deleted: string[] = [];
  const deadline = clock.monotonic() + options.timeoutSeconds;
  for (let pass = 0;; pass++) {
    const left = await ownedObjects(cluster, kinds, options);
    if (left.length === 0) return { deleted };
    if (pass > 0 && clock.monotonic() >= deadline) {
      throw new ClusterError(
        `run ${options.runId} of flow ${options.flowId} is not torn down: ${
          left.map((o) => `${o.kind} ${o.metadata.name}`).join(", ")
        } still in namespace ${options.namespace} after ${options.timeoutSeconds} s`,
        "see what holds them (finalizers, a controller recreating them), then run the teardown again",
        { namespace: options.namespace, remaining: left.map((o) => `${o.kind}/${o.metadata.name}`) },
      );
    }
    for (const object of left) {
      // Already being deleted (its finalizers still run): the next listing shows when it is gone.
      if (object.metadata.deletionTimestamp !== undefined) continue;
      // "changed": it was written since it was listed; the next listing reads it again, still owned or not.
      if (await cluster.delete(object) === "deleted") deleted.push(`${object.kind} ${object.metadata.name}`);
    }
    // The first listing after the deletes is at once; later ones are paced.
    if (pass > 0) {
      await clock.sleep(Math.min(options.pollSeconds ?? 1, Math.max(0, deadline - clock.monotonic())));
    }
  }
}
