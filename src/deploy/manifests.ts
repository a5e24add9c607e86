/**
 * A compiled flow as Kubernetes objects (spec `deploy.manifests`; SPEC-MAP sections I, L, M): one pure
 * function, {@link renderManifests}, from the specs of one run to a list of plain, namespace-scoped objects
 * that an operator prints (`deno task deploy`) or an applier sends as they are. Every object carries the
 * run's owner labels (`videoflow.io/flow-id`, `videoflow.io/run-id`, the kind of object, and its node),
 * which is what a teardown selects on.
 *
 * - A ConfigMap holds the specs document (a JSON list of node specs), mounted in every worker at
 *   `VF_FLOW_SPECS_PATH`; a replica whose params are too long for one environment entry reads them there.
 * - A provision Job runs `vf provision` (admission against the live services, then every stream and durable
 *   of the run) in the worker image. Each worker pod runs the same idempotent provisioning as its init
 *   container, so no worker starts before its run's streams and durables exist, whichever pod or Job made
 *   them first.
 * - A worker container runs one node replica in the project's directory with exactly its node's declared
 *   permissions and what the replica itself needs there, as a process replica of `vf run-local` does
 *   (`workerCommand`); the image's ENTRYPOINT (every permission) is for manual use only.
 * - Per node, its workload: a Job for every node of a batch flow and for a finite producer of a realtime one
 *   (indexed: completion index = replica id; no probes; `backoffLimit` the supervision policy's restarts,
 *   a user error failing the Job at once); a StatefulSet for a partitioned node, whose replicas need stable
 *   ordinals (the pod index is `VF_REPLICA_ID`, `POD_NAME` is set; a headless Service names the pods);
 *   a Deployment otherwise (one replica: replica 0; more, or scaled: each pod claims a slot through the Redis
 *   ledger; replaced by recreating unless scaled, since its replicas hold every slot). Deployments and StatefulSets probe the health server (`/readyz`, `/healthz` on
 *   `VF_HEALTH_PORT`). The worker's environment is exactly `workerEnvFor`'s.
 * - GPU nodes request their strategy's resource (`gpu_strategy.ts`), with node affinity and the GPU taint's
 *   toleration.
 * - With autoscaling, a KEDA ScaledObject per scalable node (`runtime/scaling.ts` decides which), with one
 *   `nats-jetstream` trigger per parent durable; the HPA takes the highest count over the triggers, the
 *   maximum over parents `observeDemand` computes.
 *
 * A node class is a module URL on this machine; in the image the project sits under
 * {@link ManifestOptions.imageRoot}, so every module URL under {@link ManifestOptions.projectRoot} is
 * rewritten there (in the specs document and the environment alike), and a file outside it is refused.
 *
 * @module
 */

import { channelId } from "../backends/messaging.ts";
import { OwnerLabel, ownerLabels } from "../backends/identity.ts";
import {
  KubernetesFlowResource,
  kubernetesFlowResourceName,
  KubernetesNodeResource,
  kubernetesNodeResourceName,
  kubernetesWorkloadName,
  streamNameFor,
} from "../backends/names.ts";
import { NodeSpec, type NodeSpecDict } from "../core/compiler.ts";
import { ConfigError, EXIT_USER } from "../core/errors.ts";
import { FlowType } from "../core/flow_type.ts";
import { SupervisionPolicy } from "../core/supervision.ts";
import { dataSubscriptionId, durableNameOf } from "../messaging/topology.ts";
import { DeviceType } from "../core/node.ts";
import {
  DEFAULT_HEALTH_HOSTNAME,
  DEFAULT_HEALTH_PORT,
  HEALTH_PORT_ENV,
  HealthPath,
} from "../runtime/health.ts";
import {
  checkFlagPermissions,
  type GrantedPermissions,
  mergePermissions,
  replicaProcessFlags,
  serverAddresses,
} from "../runtime/permissions.ts";
import { ProcessLauncher, replicaEntryUrl } from "../runtime/replica_entry.ts";
import { V8_HEAP_FLAGS } from "../runtime/v8_heap_flags.ts";
import { DEFAULT_TERMINATION_LOG, TERMINATION_LOG_ENV } from "../runtime/watchdog.ts";
import {
  admitAutoscaling,
  DEFAULT_MAX_REPLICAS,
  DEFAULT_MIN_REPLICAS,
  DEFAULT_TARGET_LAG_PER_REPLICA,
  jobAutoscalingError,
  type ScalingCandidate,
  validateScalingRule,
} from "../runtime/scaling.ts";
import {
  DEFAULT_FLOW_SPECS_PATH,
  FLOW_SPECS_PATH_ENV,
  paramsBySpecsFile,
  workerEnvFor,
  WorkerEnvVar,
  type WorkerSettings,
} from "../runtime/worker_config.ts";
import { assignGpus, type GpuPlacement, type GpuStrategyOptions } from "./gpu_strategy.ts";

/** A Kubernetes object as plain JSON: what an applier sends and a schema validates. */
export interface KubernetesObject {
  readonly apiVersion: string;
  readonly kind: string;
  readonly metadata: {
    readonly name: string;
    readonly namespace: string;
    readonly labels: Readonly<Record<string, string>>;
    readonly annotations?: Readonly<Record<string, string>>;
  };
  readonly [field: string]: unknown;
}

/** How a node's replicas run on the cluster. */
export const Workload = { job: "Job", deployment: "Deployment", statefulSet: "StatefulSet" } as const;
/** One of {@link Workload}. */
export type Workload = typeof Workload[keyof typeof Workload];

/** The label every rendered object carries besides the owner labels. */
export const MANAGED_BY_LABEL = "app.kubernetes.io/managed-by";
/** Its value. */
export const MANAGED_BY = "videoflow";
/** The annotation a `--single-run` deploy marks its objects with (RFC 0006 §10, RUN-047). */
export const SINGLE_RUN_ANNOTATION = "videoflow.io/single-run";
/** The container name of a worker and of the provision Job. */
export const WORKER_CONTAINER = "worker";
/** The key of the specs document in its ConfigMap. */
export const SPECS_KEY = "specs.json";
/** The KEDA account of a NATS server without accounts (the global account). */
export const NATS_GLOBAL_ACCOUNT = "$G";
/** The NATS monitoring port the KEDA trigger reads consumer lag from, unless told otherwise. */
export const NATS_MONITORING_PORT = 8222;

/** An API version and kind. */
export interface KindRef {
  readonly apiVersion: string;
  readonly kind: string;
}

/**
 * Every kind {@link renderManifests} emits, in the order a teardown deletes them: scalers first (nothing
 * scales what is going), then the workloads, then what they read.
 */
export const RENDERED_KINDS: readonly KindRef[] = [
  { apiVersion: "keda.sh/v1alpha1", kind: "ScaledObject" },
  { apiVersion: "apps/v1", kind: "Deployment" },
  { apiVersion: "apps/v1", kind: "StatefulSet" },
  { apiVersion: "batch/v1", kind: "Job" },
  { apiVersion: "v1", kind: "Service" },
  { apiVersion: "v1", kind: "ConfigMap" },
];

/** Owner-label `kind` values of the rendered objects. */
export const ObjectRole = {
  specs: "specs",
  provision: "provision",
  worker: "worker",
  service: "service",
  scaler: "scaler",
} as const;

/** One run of a compiled flow: what is rendered. */
export interface ManifestInput {
  readonly flowId: string;
  readonly flowType: FlowType;
  readonly runId: string;
  /** `compileFlow(flow)`: every node, in topological order. */
  readonly specs: readonly NodeSpec[];
  /** The flow file's URL on this machine: the provision Job compiles it again in the image. */
  readonly flowUrl: string;
  /** Node name to its declared Deno permissions (`nodePermissions(flow)`): all its pods are granted. */
  readonly permissions: Readonly<Record<string, GrantedPermissions>>;
  /** Node name to the modules its replicas load with its module (`nodePreloads(flow)`). */
  readonly preloads: Readonly<Record<string, readonly string[]>>;
}

/** Where and how the run is deployed. */
export interface ManifestOptions {
  /** The namespace every object is created in. */
  readonly namespace: string;
  /** The image of a node that declares none (`--image`); a node's own image wins. */
  readonly image?: string | null;
  /** The NATS JetStream server the workers and the provisioning reach (`VF_NATS_URL`). */
  readonly natsUrl: string;
  /** The Redis server: payload store (`VF_BLOB_REDIS_URL`) and run ledger (`VF_RUNTIME_STORE_URL`). */
  readonly redisUrl: string;
  /** The project's root directory on this machine, as a `file:` URL ending in `/`. */
  readonly projectRoot: string;
  /** The project's directory in the image ({@link DEFAULT_IMAGE_ROOT}). */
  readonly imageRoot?: string;
  /** The GPU strategy and its settings. */
  readonly gpu?: GpuStrategyOptions;
  /** Render a KEDA ScaledObject for every scalable node (`--autoscaling`). */
  readonly autoscaling?: boolean;
  /** GPU nodes may be scaled too (`--gpu-autoscaling`). */
  readonly gpuAutoscaling?: boolean;
  /** A scaler's most replicas ({@link DEFAULT_MAX_REPLICAS}). */
  readonly maxReplicas?: number;
  /** `host:port` of the NATS monitoring endpoint KEDA reads lag from (the NATS host, port 8222). */
  readonly natsMonitoringEndpoint?: string;
  /** `VF_HEALTH_PORT` of every worker, and the probes' port ({@link DEFAULT_HEALTH_PORT}). */
  readonly healthPort?: number;
  /** CPU and memory every worker requests (Kubernetes quantities), when given. */
  readonly resources?: { readonly cpu?: string; readonly memory?: string };
  /** The restarts a Job's pods get (`backoffLimit`): the supervision policy's, default 3. */
  readonly supervision?: SupervisionPolicy;
  /** Mark every object as the flow's single run (`--single-run`): batch flows only. */
  readonly singleRun?: boolean;
}

/** What {@link renderManifests} produced. */
export interface RenderedManifests {
  /** Every object, in apply order: specs, provisioning, then per node its Service, workload and scaler. */
  readonly objects: readonly KubernetesObject[];
  /** One line per node autoscaling leaves at its declared scale, with the reasons. */
  readonly notes: readonly string[];
}

/** Where the project is in the image, unless told otherwise. */
export const DEFAULT_IMAGE_ROOT = "/app";

const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;

function checkLabelValue(what: string, value: string): string {
  if (value.length <= 63 && LABEL_VALUE.test(value)) return value;
  throw new ConfigError(
    `${what} ${JSON.stringify(value)} cannot be a Kubernetes label value (at most 63 characters: letters, ` +
      "digits, '-', '_' and '.', starting and ending with a letter or digit)",
    `rename the ${what} so it can label the objects its run owns`,
    { [what.replace(" ", "_")]: value },
  );
}

/** How `spec` runs in a flow of `flowType` (see the module doc). */
export function workloadOf(spec: NodeSpec, flowType: FlowType): Workload {
  if (flowType === FlowType.batch || (spec.kind === "producer" && spec.isFinite)) return Workload.job;
  return spec.isPartitioned ? Workload.statefulSet : Workload.deployment;
}

/** The owner labels of one object of the run; `node` for a node's objects. */
export function objectLabels(
  flowId: string,
  runId: string,
  role: string,
  node: string | null = null,
): Record<string, string> {
  const labels = ownerLabels(flowId, runId, node, role);
  for (const [key, value] of Object.entries(labels)) checkLabelValue(key.slice(key.indexOf("/") + 1), value);
  return { ...labels, [MANAGED_BY_LABEL]: MANAGED_BY };
}

/** The labels selecting one node's pods: flow, run, node. */
function selectorLabels(flowId: string, runId: string, node: string): Record<string, string> {
  return { [OwnerLabel.flow]: flowId, [OwnerLabel.run]: runId, [OwnerLabel.node]: node };
}

/** `url` as the image names it: under `imageRoot` when under `projectRoot`; a non-file URL unchanged. */
function imageUrl(url: string, projectRoot: string, imageRoot: string): string {
  if (!url.startsWith("file:")) return url;
  if (!url.startsWith(projectRoot)) {
    throw new ConfigError(
      `${url} is outside the project (${projectRoot}) the image holds, so no pod can load it`,
      "keep the flow and its node modules inside the project directory, or pass --project with the " +
        "directory the image holds",
      { module: url, project: projectRoot },
    );
  }
  return new URL(url.slice(projectRoot.length), `file://${imageRoot.replace(/\/*$/, "/")}`).href;
}

function inImage(spec: NodeSpec, projectRoot: string, imageRoot: string): NodeSpec {
  if (spec.nodeClass === null) return spec;
  const hash = spec.nodeClass.lastIndexOf("#");
  const dict: NodeSpecDict = {
    ...spec.toDict(),
    node_class: `${imageUrl(spec.nodeClass.slice(0, hash), projectRoot, imageRoot)}${
      spec.nodeClass.slice(hash)
    }`,
  };
  return NodeSpec.fromDict(dict);
}

/** The project's modules the image holds that a pod's entry names: the process runtime and NVML's inventory. */
const NODE_PROCESS_MODULE = "workers/node_process.ts";
const NVML_INVENTORY_MODULE = "nvml/inventory.ts";

/** Whether `spec`'s replicas check their GPU grant against NVML (`verifyNodeGrant`, `readHostGpus`). */
function checksGpuGrant(spec: NodeSpec): boolean {
  return spec.kind === "processor" && spec.deviceType === DeviceType.gpu;
}

/**
 * The main module of a pod's worker container: the generated entry a process replica of `vf run-local`
 * starts from ({@link replicaEntryUrl}), naming the image's modules under `imageRoot`. It imports the
 * node's module, its `preloads` (image URLs) and, for a node that checks its GPU grant, NVML's inventory
 * (which `readHostGpus` imports on use) statically, so they load before the sandbox applies and the
 * container needs no read permission for code. The other way, `workers/node_process.ts` as the main
 * module, would leave the worker to dynamic-import the node's module, which Deno checks against the
 * sandbox: the container would need read permission on the whole project (every node's code and data the
 * image holds) for every node, which is not what the node declared.
 */
export function podEntryUrl(spec: NodeSpec, preloads: readonly string[], imageRoot: string): string {
  const root = `file://${imageRoot.replace(/\/*$/, "/")}`;
  const node = spec.nodeClass === null ? [] : [spec.nodeClass.slice(0, spec.nodeClass.lastIndexOf("#"))];
  const nvml = checksGpuGrant(spec) ? [new URL(NVML_INVENTORY_MODULE, root).href] : [];
  return replicaEntryUrl(
    { kind: "process", url: new URL(NODE_PROCESS_MODULE, root).href, launcher: ProcessLauncher.pod },
    [...node, ...preloads, ...nvml],
  );
}

/**
 * The command of a node's worker container: `deno run` of its {@link podEntryUrl} with
 * {@link replicaProcessFlags} of its node's declared permissions plus what the replica needs in the pod,
 * and nothing else: net to the NATS and Redis servers and its health server's listen address, read of the
 * specs document, write of its termination log, env for the settings its container is given (named as
 * arguments, hidden from the node once read, as a process replica of `vf run-local` does) and the node's
 * declared variables, and for a node that checks its GPU grant ffi on the image's `node_modules` (the
 * NVML binding's native module; native code is bound by no permission, so no other node gets it). Throws
 * {@link ConfigError} for a declared entry no flag can carry.
 */
function workerCommand(run: RunContext, spec: NodeSpec, settings: readonly string[]): string[] {
  const declared = run.input.permissions[spec.name] ?? {};
  checkFlagPermissions(spec.name, declared, "rename the path without a comma");
  const { natsUrl, redisUrl, projectRoot } = run.options;
  const granted = mergePermissions(declared, {
    net: [
      ...serverAddresses(natsUrl),
      ...serverAddresses(redisUrl),
      `${DEFAULT_HEALTH_HOSTNAME}:${run.healthPort}`,
    ],
    ...(checksGpuGrant(spec) ? { ffi: [`${run.imageRoot}/node_modules`] } : {}),
  });
  const preloads = (run.input.preloads[spec.name] ?? []).map((url) =>
    imageUrl(url, projectRoot, run.imageRoot)
  );
  return [
    "deno",
    "run",
    "--no-prompt",
    // The image cached every module when it was built: a pod fetches nothing.
    "--cached-only",
    // The entry is a data: URL, from which Deno would find no configuration: the project's is named.
    `--config=${run.imageRoot}/deno.json`,
    `--v8-flags=${V8_HEAP_FLAGS.join(",")}`,
    ...replicaProcessFlags(granted, {
      settings,
      terminationLog: DEFAULT_TERMINATION_LOG,
      specsPath: DEFAULT_FLOW_SPECS_PATH,
    }),
    podEntryUrl(spec, preloads, run.imageRoot),
    ...settings,
  ];
}

function imageOf(spec: NodeSpec, options: ManifestOptions): string {
  const image = spec.image ?? options.image ?? null;
  if (image === null || image === "") {
    throw new ConfigError(
      `node ${spec.name} declares no image, and no default image was given`,
      "pass --image IMG (the worker image), or declare the node's image",
      { node: spec.name },
    );
  }
  return image;
}

function metadata(
  name: string,
  options: ManifestOptions,
  labels: Record<string, string>,
): KubernetesObject["metadata"] {
  return {
    name,
    namespace: options.namespace,
    labels,
    ...(options.singleRun ? { annotations: { [SINGLE_RUN_ANNOTATION]: "true" } } : {}),
  };
}

/** Everything the renderer derives once per run. */
interface RunContext {
  readonly input: ManifestInput;
  readonly options: ManifestOptions;
  readonly specs: readonly NodeSpec[];
  readonly placements: ReadonlyMap<string, GpuPlacement>;
  readonly imageRoot: string;
  readonly healthPort: number;
  readonly maxReplicas: number;
  readonly specsName: string;
}

function provisionCommand(run: RunContext): string[] {
  const { input, options } = run;
  return [
    "deno",
    "run",
    "-A",
    // The image cached every module when it was built: a pod fetches nothing.
    "--cached-only",
    `${run.imageRoot}/mod.ts`,
    "provision",
    new URL(imageUrl(input.flowUrl, options.projectRoot, run.imageRoot)).pathname,
    "--run-id",
    input.runId,
    "--nats",
    options.natsUrl,
    "--redis",
    options.redisUrl,
    "--flow-type",
    input.flowType,
  ];
}

function provisionContainer(run: RunContext, image: string): Record<string, unknown> {
  return { name: "provision", image, workingDir: run.imageRoot, command: provisionCommand(run) };
}

function provisionJob(run: RunContext): KubernetesObject {
  const { input, options } = run;
  const image = options.image ?? run.specs.find((spec) => spec.image !== null)?.image ?? null;
  if (image === null) {
    throw new ConfigError(
      "the provision Job needs an image holding the project, and no default image was given",
      "pass --image IMG (the worker image)",
    );
  }
  const labels = objectLabels(input.flowId, input.runId, ObjectRole.provision);
  return {
    apiVersion: "batch/v1",
    kind: "Job",
    metadata: metadata(
      kubernetesFlowResourceName(input.flowId, KubernetesFlowResource.provision),
      options,
      labels,
    ),
    spec: {
      backoffLimit: (options.supervision ?? new SupervisionPolicy()).maxRestarts,
      template: {
        metadata: { labels },
        spec: {
          restartPolicy: "Never",
          containers: [{ ...provisionContainer(run, image), name: WORKER_CONTAINER }],
        },
      },
    },
  };
}

/** The most bytes a ConfigMap's data may hold (the API server's limit, 1 MiB). */
export const CONFIGMAP_MAX_BYTES = 1024 * 1024;

function specsConfigMap(run: RunContext): KubernetesObject {
  const { input, options } = run;
  const document = JSON.stringify(run.specs.map((spec) => spec.toDict()));
  const bytes = new TextEncoder().encode(document).length;
  if (bytes > CONFIGMAP_MAX_BYTES) {
    throw new ConfigError(
      `the specs document of flow ${input.flowId} is ${bytes} bytes, more than the ${CONFIGMAP_MAX_BYTES} a ` +
        "ConfigMap holds",
      "move large node params (weights, tables) into files the image or a volume holds, and pass their paths",
      { bytes },
    );
  }
  return {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: metadata(run.specsName, options, objectLabels(input.flowId, input.runId, ObjectRole.specs)),
    data: { [SPECS_KEY]: document },
  };
}

/**
 * The autoscaling candidate `spec` is in a `flowType` flow deployed to Kubernetes (`vf deploy`, and what
 * `vf explain` shows), GPU nodes counting as scalable only with `gpuAutoscaling`.
 */
export function scalingCandidateOf(
  spec: NodeSpec,
  flowType: FlowType,
  gpuAutoscaling = false,
): ScalingCandidate {
  return {
    kind: spec.kind,
    isPartitioned: spec.isPartitioned,
    isJob: workloadOf(spec, flowType) === Workload.job,
    hasParents: spec.parents.length > 0,
    deviceType: spec.deviceType,
    gpuAutoscaling,
    isJoin: spec.parents.length > 1,
    declaresPartition: spec.partitionBy !== null,
  };
}

/**
 * The nodes that get a scaler, and a note for each that keeps its scale. Throws one CapabilityError
 * naming every processor rendered as a Job (RUN-027).
 */
function scaledNodes(run: RunContext, notes: string[]): Set<string> {
  const scaled = new Set<string>();
  if (!run.options.autoscaling) return scaled;
  const jobs: string[] = [];
  for (const spec of run.specs) {
    const node = scalingCandidateOf(spec, run.input.flowType, run.options.gpuAutoscaling ?? false);
    if (node.kind === "processor" && node.isJob) {
      jobs.push(spec.name);
      continue;
    }
    const reasons = admitAutoscaling(spec.name, run.input.flowType, node);
    if (reasons.length > 0) notes.push(`${spec.name} keeps ${spec.nbTasks} replica(s): ${reasons.join(" ")}`);
    else scaled.add(spec.name);
  }
  if (jobs.length > 0) throw jobAutoscalingError(jobs, run.input.flowType);
  return scaled;
}

function fieldEnv(name: string, fieldPath: string): Record<string, unknown> {
  return { name, valueFrom: { fieldRef: { fieldPath } } };
}

/** The container's environment: `workerEnvFor`'s, the specs path, and the replica id where a pod carries it. */
function workerEnv(run: RunContext, spec: NodeSpec, workload: Workload, isScaled: boolean) {
  const { input, options } = run;
  const fixedReplica = workload === Workload.deployment && !isScaled && spec.nbTasks === 1 ? 0 : null;
  const extra: Partial<WorkerSettings> = {
    runtimeStoreUrl: options.redisUrl,
    blobStoreUrl: options.redisUrl,
    healthPort: run.healthPort,
    ...(isScaled ? { replicaSlots: run.maxReplicas } : {}),
  };
  const env = paramsBySpecsFile(
    workerEnvFor(
      spec,
      run.specs,
      { flowId: input.flowId, flowType: input.flowType },
      { runId: input.runId, broker: { kind: "nats", url: options.natsUrl } },
      fixedReplica,
      extra,
    ),
    DEFAULT_FLOW_SPECS_PATH,
  );
  env[FLOW_SPECS_PATH_ENV] = DEFAULT_FLOW_SPECS_PATH;
  // The health port is the probes' port: written even at its default, so the two cannot drift apart.
  env[HEALTH_PORT_ENV] = String(run.healthPort);
  // Likewise the termination log: the container's write permission and its terminationMessagePath name it.
  env[TERMINATION_LOG_ENV] = DEFAULT_TERMINATION_LOG;
  const list: Record<string, unknown>[] = Object.entries(env).map(([name, value]) => ({ name, value }));
  if (workload === Workload.job) {
    list.push(
      fieldEnv(WorkerEnvVar.replicaId, "metadata.annotations['batch.kubernetes.io/job-completion-index']"),
    );
  } else if (workload === Workload.statefulSet) {
    list.push(fieldEnv("POD_NAME", "metadata.name"));
    list.push(fieldEnv(WorkerEnvVar.replicaId, "metadata.labels['apps.kubernetes.io/pod-index']"));
  }
  return list;
}

/** A Kubernetes quantity, as the API server's own pattern accepts it (`500m`, `1.5`, `2Gi`, `1e3`). */
const QUANTITY = /^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$/;

function checkQuantity(resource: string, value: string | undefined): void {
  if (value === undefined || QUANTITY.test(value)) return;
  throw new ConfigError(
    `${JSON.stringify(value)} is not a Kubernetes quantity for the workers' ${resource} request`,
    `pass --${resource} as a quantity such as ${resource === "cpu" ? "500m or 2" : "512Mi or 2Gi"}`,
    { [resource]: value },
  );
}

function resourcesOf(run: RunContext, spec: NodeSpec): Record<string, unknown> {
  const requests: Record<string, string> = {};
  const { cpu, memory } = run.options.resources ?? {};
  if (cpu !== undefined) requests.cpu = cpu;
  if (memory !== undefined) requests.memory = memory;
  const gpu = run.placements.get(spec.name);
  return {
    ...(Object.keys(requests).length > 0 ? { requests } : {}),
    ...(gpu === undefined ? {} : { limits: { [gpu.resource]: String(gpu.count) } }),
  };
}

function probe(path: string, port: number, periodSeconds: number): Record<string, unknown> {
  return { httpGet: { path, port }, periodSeconds, failureThreshold: 3 };
}

function podSpec(run: RunContext, spec: NodeSpec, workload: Workload, isScaled: boolean) {
  const image = imageOf(spec, run.options);
  const gpu = run.placements.get(spec.name);
  const env = workerEnv(run, spec, workload, isScaled);
  const container: Record<string, unknown> = {
    name: WORKER_CONTAINER,
    image,
    command: workerCommand(run, spec, env.map((entry) => String(entry.name))),
    workingDir: run.imageRoot,
    env,
    // Where the replica writes why it ended (VF_TERMINATION_LOG), for the pod's status to show.
    terminationMessagePath: DEFAULT_TERMINATION_LOG,
    ports: [{ name: "health", containerPort: run.healthPort }],
    resources: resourcesOf(run, spec),
    volumeMounts: [{ name: "specs", mountPath: DEFAULT_FLOW_SPECS_PATH, subPath: SPECS_KEY, readOnly: true }],
    ...(workload === Workload.job ? {} : {
      readinessProbe: probe(HealthPath.ready, run.healthPort, 5),
      livenessProbe: probe(HealthPath.live, run.healthPort, 10),
    }),
  };
  return {
    ...(workload === Workload.job ? { restartPolicy: "Never" } : {}),
    initContainers: [provisionContainer(run, image)],
    containers: [container],
    volumes: [{ name: "specs", configMap: { name: run.specsName } }],
    ...(gpu === undefined ? {} : {
      affinity: {
        nodeAffinity: {
          requiredDuringSchedulingIgnoredDuringExecution: {
            nodeSelectorTerms: [{
              matchExpressions: gpu.nodeRequirements.map((r) => ({ ...r, values: [...r.values] })),
            }],
          },
        },
      },
      tolerations: gpu.tolerations.map((t) => ({ ...t })),
    }),
  };
}

function workloadObject(
  run: RunContext,
  spec: NodeSpec,
  workload: Workload,
  isScaled: boolean,
): KubernetesObject {
  const { input, options } = run;
  const name = kubernetesWorkloadName(input.flowId, spec.name);
  const labels = objectLabels(input.flowId, input.runId, ObjectRole.worker, spec.name);
  const template = { metadata: { labels }, spec: podSpec(run, spec, workload, isScaled) };
  const selector = { matchLabels: selectorLabels(input.flowId, input.runId, spec.name) };
  switch (workload) {
    case Workload.job:
      return {
        apiVersion: "batch/v1",
        kind: Workload.job,
        metadata: metadata(name, options, labels),
        spec: {
          completionMode: "Indexed",
          completions: spec.nbTasks,
          parallelism: spec.nbTasks,
          backoffLimit: (options.supervision ?? new SupervisionPolicy()).maxRestarts,
          // A user error (exit 2) is one no restart mends; a pod evicted by the cluster is not the node's.
          podFailurePolicy: {
            rules: [
              {
                action: "FailJob",
                onExitCodes: { containerName: WORKER_CONTAINER, operator: "In", values: [EXIT_USER] },
              },
              { action: "Ignore", onPodConditions: [{ type: "DisruptionTarget" }] },
            ],
          },
          template,
        },
      };
    case Workload.statefulSet:
      return {
        apiVersion: "apps/v1",
        kind: Workload.statefulSet,
        metadata: metadata(name, options, labels),
        spec: {
          serviceName: kubernetesNodeResourceName(
            input.flowId,
            spec.name,
            KubernetesNodeResource.headlessService,
          ),
          replicas: spec.nbTasks,
          podManagementPolicy: "Parallel",
          selector,
          template,
        },
      };
    case Workload.deployment:
      return {
        apiVersion: "apps/v1",
        kind: Workload.deployment,
        metadata: metadata(name, options, labels),
        spec: {
          // A scaled Deployment leaves its replica count to the scaler: applied, a count would be taken back
          // from the HPA on every re-apply (and conflict with its field manager under server-side apply).
          ...(isScaled ? {} : { replicas: spec.nbTasks }),
          // Unscaled, its replicas hold every slot: a surge pod would find none (or share replica 0).
          ...(isScaled ? {} : { strategy: { type: "Recreate" } }),
          selector,
          template,
        },
      };
  }
}

function headlessService(run: RunContext, spec: NodeSpec): KubernetesObject {
  const { input, options } = run;
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: metadata(
      kubernetesNodeResourceName(input.flowId, spec.name, KubernetesNodeResource.headlessService),
      options,
      objectLabels(input.flowId, input.runId, ObjectRole.service, spec.name),
    ),
    spec: {
      clusterIP: "None",
      selector: selectorLabels(input.flowId, input.runId, spec.name),
      ports: [{ name: "health", port: run.healthPort }],
    },
  };
}

function monitoringEndpoint(options: ManifestOptions): string {
  if (options.natsMonitoringEndpoint !== undefined) return options.natsMonitoringEndpoint;
  const first = options.natsUrl.split(",")[0];
  return `${new URL(first).hostname}:${NATS_MONITORING_PORT}`;
}

function scaledObject(run: RunContext, spec: NodeSpec, workload: Workload): KubernetesObject {
  const { input, options } = run;
  const endpoint = monitoringEndpoint(options);
  return {
    apiVersion: "keda.sh/v1alpha1",
    kind: "ScaledObject",
    metadata: metadata(
      kubernetesNodeResourceName(input.flowId, spec.name, KubernetesNodeResource.scaler),
      options,
      objectLabels(input.flowId, input.runId, ObjectRole.scaler, spec.name),
    ),
    spec: {
      scaleTargetRef: {
        apiVersion: "apps/v1",
        kind: workload,
        name: kubernetesWorkloadName(input.flowId, spec.name),
      },
      minReplicaCount: DEFAULT_MIN_REPLICAS,
      maxReplicaCount: run.maxReplicas,
      triggers: spec.parents.map((parent) => ({
        type: "nats-jetstream",
        metadata: {
          natsServerMonitoringEndpoint: endpoint,
          account: NATS_GLOBAL_ACCOUNT,
          stream: streamNameFor(input.flowId, input.runId, parent),
          consumer: durableNameOf(
            dataSubscriptionId(channelId(input.flowId, input.runId, parent), spec.name),
          ),
          lagThreshold: String(DEFAULT_TARGET_LAG_PER_REPLICA),
        },
      })),
    },
  };
}

/**
 * Renders one run of a compiled flow as Kubernetes objects (see the module doc). Pure: the same input
 * gives the same objects. Throws {@link ConfigError} for an id or node name no label can carry, a module
 * outside the project, a node without an image, a specs document larger than a ConfigMap holds, a CPU or
 * memory request that is no quantity, a scaling rule out of range, or `singleRun` on a realtime flow;
 * `CapabilityError` for autoscaling processors rendered as Jobs (RUN-027, every one named); the GPU
 * strategy's errors for GPU nodes it cannot place.
 */
export function renderManifests(input: ManifestInput, options: ManifestOptions): RenderedManifests {
  checkLabelValue("flow id", input.flowId);
  checkLabelValue("run id", input.runId);
  if (options.singleRun && input.flowType !== FlowType.batch) {
    throw new ConfigError(
      `--single-run is a one-off batch run, and flow ${input.flowId} is ${input.flowType}`,
      "deploy the realtime flow without --single-run",
      { flow_type: input.flowType },
    );
  }
  checkQuantity("cpu", options.resources?.cpu);
  checkQuantity("memory", options.resources?.memory);
  const maxReplicas = options.maxReplicas ?? DEFAULT_MAX_REPLICAS;
  if (options.autoscaling) {
    validateScalingRule(DEFAULT_TARGET_LAG_PER_REPLICA, DEFAULT_MIN_REPLICAS, maxReplicas);
  }
  const imageRoot = (options.imageRoot ?? DEFAULT_IMAGE_ROOT).replace(/\/+$/, "");
  const gpus = assignGpus(
    input.specs.map((spec) => inImage(spec, options.projectRoot, imageRoot)),
    options.gpu,
  );
  const run: RunContext = {
    input,
    options,
    specs: gpus.specs,
    placements: gpus.placements,
    imageRoot,
    healthPort: options.healthPort ?? DEFAULT_HEALTH_PORT,
    maxReplicas,
    specsName: kubernetesFlowResourceName(input.flowId, KubernetesFlowResource.specs),
  };
  const notes: string[] = [];
  const scaled = scaledNodes(run, notes);
  const objects: KubernetesObject[] = [specsConfigMap(run), provisionJob(run)];
  for (const spec of run.specs) {
    const workload = workloadOf(spec, input.flowType);
    const isScaled = scaled.has(spec.name);
    if (isScaled && spec.nbTasks > maxReplicas) {
      throw new ConfigError(
        `${spec.name} declares ${spec.nbTasks} replicas, more than the scaler's maximum of ${maxReplicas}`,
        `pass --max-replicas ${spec.nbTasks} or more`,
        { node: spec.name },
      );
    }
    if (workload === Workload.statefulSet) objects.push(headlessService(run, spec));
    objects.push(workloadObject(run, spec, workload, isScaled));
    if (isScaled) objects.push(scaledObject(run, spec, workload));
  }
  return { objects, notes };
}
