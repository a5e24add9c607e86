/**
 * `vf deploy FLOW.ts` (`deno task deploy FLOW.ts`): prints the Kubernetes objects of one run of the flow,
 * YAML documents by default or a JSON list with `-o json`, after admitting the flow onto a Kubernetes
 * target with NATS JetStream and Redis (`deploy/admission.ts`): a refusal names every unmet requirement
 * and exits with its code, nothing printed on stdout. What only the live services can show is a warning on
 * stderr; the provision Job decides it. Every object is validated against the Kubernetes schemas before
 * any is printed or applied.
 *
 * With `--apply` (and `--server URL [--token T]`, or a kubeconfig), the same admitted, validated objects
 * are applied instead of printed (`deploy/apply.ts`: server-side apply, RUN-047 under `--single-run`,
 * the provision Job waited for) and one line per object says what changed. With `--teardown --run-id ID`,
 * what that run owns in the namespace is deleted (`deploy/teardown.ts`); nothing is rendered or admitted.
 *
 * @module
 */

import { stringify } from "yaml";
import {
  batchingPolicies,
  compileFlow,
  executionGroups,
  nodePermissions,
  nodePreloads,
} from "../core/compiler.ts";
import { ConfigError } from "../core/errors.ts";
import { checkFlowType } from "../core/flow_type.ts";
import { wholeNumberFromText } from "../core/variables.ts";
import { admitKubernetesDeployment } from "../deploy/admission.ts";
import { applyRun } from "../deploy/apply.ts";
import { ClusterClient, type ClusterConnection } from "../deploy/cluster_client.ts";
import { checkGpuMode } from "../deploy/gpu_strategy.ts";
import type { MigDeviceGeometry } from "../deploy/mig.ts";
import { renderManifests } from "../deploy/manifests.ts";
import { validateManifests } from "../deploy/manifest_schema.ts";
import { teardownRun } from "../deploy/teardown.ts";
import { checkRunNames } from "../engines/run_directory.ts";
import type { CommandOutput } from "./command_output.ts";
import { loadFlow } from "./load_flow.ts";
import { generateRunId } from "./run_local.ts";

/** The options `deploy` takes; each names its flag. */
export interface DeployCommandOptions {
  /** `--namespace` (`default`). */
  readonly namespace?: string;
  /** `--image`: the worker image of every node that declares none. */
  readonly image?: string;
  /** `-o` / `--output`: `yaml` (the default) or `json`. */
  readonly output?: string;
  /** `--run-id` (a fresh one by default). */
  readonly runId?: string;
  /** `--single-run`: a one-off batch run. */
  readonly singleRun?: boolean;
  /** `--flow-type` (the flow's own by default). */
  readonly flowType?: string;
  /** `--nats` (`nats://nats:4222`, the NATS chart's Service in the namespace). */
  readonly nats?: string;
  /** `--redis` (`redis://redis:6379`). */
  readonly redis?: string;
  /** `--project`: the directory the image holds (the working directory). */
  readonly project?: string;
  /** `--image-root`: where the image holds it (`/app`). */
  readonly imageRoot?: string;
  /** `--autoscaling`, `--gpu-autoscaling`, `--max-replicas N`. */
  readonly autoscaling?: boolean;
  readonly gpuAutoscaling?: boolean;
  readonly maxReplicas?: string;
  /** `--gpu-mode whole|mig-single|mig-mixed`, `--gpu-resource-name`, `--mig-geometry FILE`. */
  readonly gpuMode?: string;
  readonly gpuResourceName?: string;
  readonly migGeometry?: string;
  /** `--cpu`, `--memory`: what every worker requests (Kubernetes quantities: `500m`, `1Gi`). */
  readonly cpu?: string;
  readonly memory?: string;
  /** `--nats-monitoring HOST:PORT`: where KEDA reads consumer lag (the NATS host, port 8222). */
  readonly natsMonitoring?: string;
  /** `--apply`: apply the objects to the cluster and wait for the provision Job, instead of printing them. */
  readonly apply?: boolean;
  /** `--teardown`: delete what the run (`--run-id`) owns in the namespace. */
  readonly teardown?: boolean;
  /** `--server URL`, `--token TOKEN`: the cluster's API server and a bearer token for it. */
  readonly server?: string;
  readonly token?: string;
  /** `--kubeconfig FILE` (else `KUBECONFIG`): the cluster of its current context, without `--server`. */
  readonly kubeconfig?: string;
  /** `--wait-timeout SECONDS`: how long the provision Job, or a teardown, is waited for (300). */
  readonly waitTimeout?: string;
}

/** The NATS server a deploy points at unless told: the NATS Helm chart's Service in the same namespace. */
export const DEFAULT_DEPLOY_NATS_URL = "nats://nats:4222";
/** The Redis server a deploy points at unless told. */
export const DEFAULT_DEPLOY_REDIS_URL = "redis://redis:6379";

async function readGeometry(path: string): Promise<MigDeviceGeometry[]> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (error) {
    throw new ConfigError(
      `the MIG geometry file ${path} cannot be read: ${(error as Error).message}`,
      "pass --mig-geometry with a readable JSON file",
      { path },
    );
  }
  try {
    const devices = JSON.parse(text);
    if (Array.isArray(devices)) return devices as MigDeviceGeometry[];
  } catch {
    // reported below
  }
  throw new ConfigError(
    `the MIG geometry file ${path} is not a JSON list of devices`,
    "write one entry per MIG device: device, computeSlices, memorySlices, profiles, instances",
    { path },
  );
}

function directoryUrl(path: string): string {
  return new URL(`${path.replace(/\/+$/, "")}/`, `file://${Deno.cwd()}/`).href;
}

/** Seconds `--apply` waits for the provision Job, and `--teardown` for the run's objects to be gone. */
export const DEFAULT_DEPLOY_WAIT_SECONDS = 300;

function waitSeconds(options: DeployCommandOptions): number {
  return options.waitTimeout === undefined
    ? DEFAULT_DEPLOY_WAIT_SECONDS
    : wholeNumberFromText("--wait-timeout", options.waitTimeout, 1);
}

function connection(options: DeployCommandOptions): ClusterConnection {
  return {
    server: options.server,
    token: options.token,
    kubeconfig: options.kubeconfig,
  };
}

/** `--teardown`: deletes what the run owns; needs `--run-id` (a fresh id owns nothing). */
async function teardownCommand(
  path: string,
  options: DeployCommandOptions,
  io: CommandOutput,
): Promise<number> {
  if (options.runId === undefined) {
    throw new ConfigError(
      "--teardown needs the run to tear down",
      "pass --run-id ID, the id the run was applied with",
    );
  }
  const { flow } = await loadFlow(path);
  checkRunNames(flow.flowId, options.runId);
  const namespace = options.namespace ?? "default";
  const cluster = ClusterClient.connect(connection(options));
  const report = await teardownRun(cluster, {
    flowId: flow.flowId,
    runId: options.runId,
    namespace,
    timeoutSeconds: waitSeconds(options),
  });
  if (options.output === "json") io.write(`${JSON.stringify(report, null, 2)}\n`);
  else for (const object of report.deleted) io.out(`deleted ${object}`);
  io.err(
    `flow ${flow.flowId} run ${options.runId}: ${report.deleted.length} objects deleted from namespace ${namespace}`,
  );
  return 0;
}

/**
 * Renders and checks the manifests of the flow file at `path`, then prints them, or with `--apply` applies
 * them and waits for the provision Job, or with `--teardown` deletes what the run owns; resolves with the
 * exit code.
 */
export async function deployCommand(
  path: string,
  options: DeployCommandOptions,
  io: CommandOutput,
): Promise<number> {
  const output = options.output ?? "yaml";
  if (output !== "yaml" && output !== "json") {
    throw new ConfigError(`unknown output format ${JSON.stringify(output)}`, "pass -o yaml or -o json");
  }
  if (options.apply && options.teardown) {
    throw new ConfigError("--apply and --teardown are two commands", "pass one of them");
  }
  if (
    !options.apply && !options.teardown &&
    (options.server ?? options.token ?? options.kubeconfig) !== undefined
  ) {
    throw new ConfigError(
      "--server, --token and --kubeconfig name the cluster of --apply or --teardown, and neither was given",
      "pass --apply (or --teardown), or leave the cluster out to print the manifests",
    );
  }
  if (options.teardown) return await teardownCommand(path, options, io);
  const { flow, url, modules } = await loadFlow(path);
  const runId = options.runId ?? generateRunId();
  checkRunNames(flow.flowId, runId);
  const flowType = options.flowType === undefined ? flow.flowType : checkFlowType(options.flowType);
  const specs = compileFlow(flow, { modules, onWarning: (warning) => io.err(warning.render()) });
  const autoscaling = options.autoscaling ?? false;
  const warnings = admitKubernetesDeployment(flowType, specs, {
    executionGroups: executionGroups(flow),
    batching: batchingPolicies(flow),
  }, autoscaling);
  const namespace = options.namespace ?? "default";
  const rendered = renderManifests({
    flowId: flow.flowId,
    flowType,
    runId,
    specs,
    flowUrl: url,
    permissions: nodePermissions(flow),
    preloads: nodePreloads(flow),
  }, {
    namespace,
    image: options.image ?? null,
    natsUrl: options.nats ?? DEFAULT_DEPLOY_NATS_URL,
    redisUrl: options.redis ?? DEFAULT_DEPLOY_REDIS_URL,
    projectRoot: directoryUrl(options.project ?? Deno.cwd()),
    imageRoot: options.imageRoot,
    autoscaling,
    gpuAutoscaling: options.gpuAutoscaling ?? false,
    maxReplicas: options.maxReplicas === undefined
      ? undefined
      : wholeNumberFromText("--max-replicas", options.maxReplicas, 1),
    gpu: {
      mode: checkGpuMode(options.gpuMode ?? "whole"),
      resourceName: options.gpuResourceName,
      migDevices: options.migGeometry === undefined ? undefined : await readGeometry(options.migGeometry),
    },
    singleRun: options.singleRun ?? false,
    resources: { cpu: options.cpu, memory: options.memory },
    natsMonitoringEndpoint: options.natsMonitoring,
  });
  validateManifests(rendered.objects);
  for (const warning of warnings) io.err(`WARNING: ${warning}`);
  for (const note of rendered.notes) io.err(`note: ${note}`);
  if (options.apply) {
    const cluster = ClusterClient.connect(connection(options));
    const report = await applyRun(cluster, rendered.objects, {
      flowId: flow.flowId,
      runId,
      namespace,
      singleRun: options.singleRun ?? false,
      wait: { timeoutSeconds: waitSeconds(options) },
    });
    if (output === "json") io.write(`${JSON.stringify(report, null, 2)}\n`);
    else {
      for (const object of report.objects) {
        io.out(`${object.change} ${object.kind} ${object.name} (resourceVersion ${object.resourceVersion})`);
      }
    }
    io.err(
      `flow ${flow.flowId} run ${runId}: ${report.objects.length} objects applied to namespace ${namespace} ` +
        `at ${cluster.server}; provision Job ${report.provisionJob} complete`,
    );
    return 0;
  }
  if (output === "json") io.write(`${JSON.stringify(rendered.objects, null, 2)}\n`);
  else {io.write(
      rendered.objects.map((object) => `---\n${stringify(object, { aliasDuplicateObjects: false })}`).join(
        "",
      ),
    );}
  io.err(`flow ${flow.flowId} run ${runId}: ${rendered.objects.length} objects for namespace ${namespace}`);
  return 0;
}
