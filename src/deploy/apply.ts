/**
 * Applying one run's rendered objects to a cluster (`vf deploy --apply`), then waiting for its provision
 * Job. Nothing is written until every check has passed, so a refusal leaves the cluster as it was:
 *
 * - every kind the objects need is served (a ScaledObject needs KEDA installed);
 * - with `singleRun` (RUN-047), no workload (Job, Deployment, StatefulSet) of another run of the same flow
 *   is in the namespace: {@link ActiveRunConflict};
 * - no object of the run's names exists that the run does not own: one labelled for another run of the
 *   flow is {@link ActiveRunConflict} (the names are per flow, so applying would reconfigure that run),
 *   one that is not the flow's (unlabelled, or another flow's) {@link OwnershipConflict}; every such
 *   object is named in the one error.
 *
 * Then each object is server-side applied as the `videoflow` field manager, in render order; an object
 * that existed is applied at the `resourceVersion` just read, so a concurrent writer makes the apply fail
 * (409) instead of being overwritten. Applying the same run again changes nothing: every object is
 * reported `unchanged` with the version it had. Last, the provision Job is waited for (`job_wait.ts`).
 *
 * @module
 */

import { OwnerLabel } from "../backends/identity.ts";
import { ActiveRunConflict, ClusterError, ConfigError, OwnershipConflict } from "../core/errors.ts";
import type { ClusterClient, LiveObject, ObjectRef } from "./cluster_client.ts";
import { type JobWaitOptions, waitForJob } from "./job_wait.ts";
import { type KindRef, type KubernetesObject, ObjectRole, Workload } from "./manifests.ts";

/** The run being applied. */
export interface ApplyRunOptions {
  /** The flow id the objects are labelled with. */
  readonly flowId: string;
  /** The run id the objects are labelled with. */
  readonly runId: string;
  /** The namespace every object is in. */
  readonly namespace: string;
  /** `--single-run`: refuse when another run of the flow holds workloads in the namespace. */
  readonly singleRun: boolean;
  /** How long the provision Job is waited for. */
  readonly wait: JobWaitOptions;
}

/** What applying did to one object. */
export type ObjectChange = "created" | "configured" | "unchanged";

/** One applied object, as the cluster holds it now. */
export interface AppliedObject {
  /** Its kind. */
  readonly kind: string;
  /** Its name. */
  readonly name: string;
  /** Its resourceVersion after the apply. */
  readonly resourceVersion: string;
  /** What the apply did to it. */
  readonly change: ObjectChange;
}

/** What {@link applyRun} did. */
export interface ApplyReport {
  /** Every object, in apply order. */
  readonly objects: readonly AppliedObject[];
  /** The provision Job, complete. */
  readonly provisionJob: string;
}

/** The workload kinds RUN-047 looks for. */
const WORKLOAD_KINDS: readonly KindRef[] = [
  { apiVersion: "batch/v1", kind: Workload.job },
  { apiVersion: "apps/v1", kind: Workload.deployment },
  { apiVersion: "apps/v1", kind: Workload.statefulSet },
];

function refOf(object: KubernetesObject): ObjectRef {
  return {
    apiVersion: object.apiVersion,
    kind: object.kind,
    namespace: object.metadata.namespace,
    name: object.metadata.name,
  };
}

async function checkKindsServed(cluster: ClusterClient, objects: readonly KubernetesObject[]): Promise<void> {
  const kinds = new Map(objects.map((o) => [`${o.apiVersion} ${o.kind}`, o] as const));
  const missing: string[] = [];
  for (const [key, object] of kinds) {
    if (!(await cluster.serves(object.apiVersion, object.kind))) missing.push(key);
  }
  if (missing.length === 0) return;
  throw new ClusterError(
    `the cluster at ${cluster.server} does not serve ${missing.join(", ")}, which the run needs`,
    missing.some((k) => k.startsWith("keda.sh/"))
      ? "install KEDA in the cluster, or deploy without --autoscaling"
      : "deploy to a cluster that serves these APIs",
    { missing },
  );
}

/** RUN-047: the workloads of other runs of the flow in the namespace, refused when there are any. */
async function refuseActiveRun(cluster: ClusterClient, options: ApplyRunOptions): Promise<void> {
  const selector =
    `${OwnerLabel.flow}=${options.flowId},${OwnerLabel.run},${OwnerLabel.run}!=${options.runId}`;
  const held: LiveObject[] = [];
  for (const { apiVersion, kind } of WORKLOAD_KINDS) {
    held.push(...await cluster.list(apiVersion, kind, options.namespace, selector));
  }
  if (held.length === 0) return;
  const runs = [...new Set(held.map((o) => o.metadata.labels[OwnerLabel.run]))].sort();
  throw new ActiveRunConflict(
    `--single-run: run(s) ${runs.join(", ")} of flow ${options.flowId} already hold workloads in namespace ` +
      `${options.namespace}: ${held.map((o) => `${o.kind} ${o.metadata.name}`).join(", ")}`,
    `let run ${runs[0]} finish, then tear it down (vf deploy FLOW --teardown --run-id ${
      runs[0]
    }) and apply again`,
    { flow_id: options.flowId, namespace: options.namespace, active_runs: runs },
  );
}

/** Reads what exists under the run's names; refuses every object the run does not own. */
async function readOwned(
  cluster: ClusterClient,
  objects: readonly KubernetesObject[],
  options: ApplyRunOptions,
): Promise<(LiveObject | null)[]> {
  const existing = await Promise.all(objects.map((object) => cluster.read(refOf(object))));
  const otherRuns: string[] = [];
  const foreign: string[] = [];
  existing.forEach((live) => {
    if (live === null) return;
    const labels = live.metadata.labels;
    const name = `${live.kind} ${live.metadata.name}`;
    if (labels[OwnerLabel.flow] !== options.flowId) foreign.push(name);
    else if (labels[OwnerLabel.run] !== options.runId) {
      otherRuns.push(`${name} (run ${labels[OwnerLabel.run] ?? "unlabelled"})`);
    }
  });
  if (foreign.length > 0) {
    throw new OwnershipConflict(
      `namespace ${options.namespace} holds objects under the names of flow ${options.flowId} that are not ` +
        `the flow's: ${foreign.join(", ")}${
          otherRuns.length > 0 ? `; and of other runs: ${otherRuns.join(", ")}` : ""
        }`,
      "deploy into another namespace, or remove those objects if they are leftovers nobody owns",
      { namespace: options.namespace, objects: foreign },
    );
  }
  if (otherRuns.length > 0) {
    throw new ActiveRunConflict(
      `applying run ${options.runId} of flow ${options.flowId} would reconfigure another run's objects: ` +
        otherRuns.join(", "),
      "tear that run down first (vf deploy FLOW --teardown --run-id RUN), or deploy into another namespace",
      { flow_id: options.flowId, namespace: options.namespace, objects: otherRuns },
    );
  }
  return existing;
}

function provisionJobOf(objects: readonly KubernetesObject[], options: ApplyRunOptions): KubernetesObject {
  const job = objects.find((o) =>
    o.kind === Workload.job && o.metadata.labels[OwnerLabel.kind] === ObjectRole.provision
  );
  if (job === undefined) {
    throw new ConfigError(
      `the objects of run ${options.runId} hold no provision Job`,
      "apply the objects renderManifests rendered for the run, unchanged",
    );
  }
  return job;
}

/**
 * Applies `objects` (one run's, as {@link renderManifests} rendered them) and waits for its provision
 * Job (see the module doc). Throws {@link ActiveRunConflict} / {@link OwnershipConflict} before writing
 * anything, {@link ClusterError} for what the API server refuses or a Job that does not finish in time,
 * `FlowFailed` for a provision Job that failed.
 */
export async function applyRun(
  cluster: ClusterClient,
  objects: readonly KubernetesObject[],
  options: ApplyRunOptions,
): Promise<ApplyReport> {
  const provision = provisionJobOf(objects, options);
  const strays = objects.filter((o) =>
    o.metadata.namespace !== options.namespace || o.metadata.labels[OwnerLabel.run] !== options.runId ||
    o.metadata.labels[OwnerLabel.flow] !== options.flowId
  );
  if (strays.length > 0) {
    throw new ConfigError(
      `${strays.length} object(s) are not run ${options.runId}'s in namespace ${options.namespace}: ` +
        strays.map((o) => `${o.kind} ${o.metadata.name}`).join(", "),
      "apply the objects renderManifests rendered for the run, unchanged",
    );
  }
  await checkKindsServed(cluster, objects);
  if (options.singleRun) await refuseActiveRun(cluster, options);
  const existing = await readOwned(cluster, objects, options);
  const applied: AppliedObject[] = [];
  for (const [i, object] of objects.entries()) {
    const before = existing[i];
    const live = await cluster.apply(object, before?.metadata.resourceVersion);
    applied.push({
      kind: object.kind,
      name: object.metadata.name,
      resourceVersion: live.metadata.resourceVersion,
      change: before === null
        ? "created"
        : before.metadata.resourceVersion === live.metadata.resourceVersion
        ? "unchanged"
        : "configured",
    });
  }
  await waitForJob(cluster, refOf(provision), options.wait);
  return { objects: applied, provisionJob: provision.metadata.name };
}
