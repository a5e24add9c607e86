/**
 * The worker's environment (spec runtime.worker, SPEC-MAP section 3): every `VF_*` variable a node replica
 * is started with, read into one typed, validated {@link WorkerConfig}, and the way back.
 *
 * - {@link parseWorkerConfig} reads an environment record. A required variable that is missing, or any
 *   value that is malformed, is a {@link ConfigError} naming the variable and the fix; several problems
 *   are reported in one error. Optional variables take the spec's defaults.
 * - {@link workerConfigFor} is what an engine gives one replica of a compiled {@link NodeSpec}: the spec's
 *   fields, the flow's and the run's identity, the replica id, and deployment settings;
 *   {@link workerEnvFor} writes it as the environment the local engine (subprocess) and Kubernetes (pod)
 *   start the replica with. `parseWorkerConfig(workerEnvFor(...))` gives back `workerConfigFor(...)`.
 *
 * The node class is read here as a reference only; whether the class really is of `VF_NODE_KIND` is
 * checked when the worker rebuilds it (`rebuildNode`). The fault schedule is validated here and installed
 * by the worker (`installFromEnv`). `VF_FLOW_SPECS_JSON` and `VF_STREAM_REPLICAS` belong to the
 * provisioning job, not to a worker, and are not read. `VF_FLOW_SPECS_PATH` is read by a worker only in
 * place of a missing `VF_NODE_PARAMS_JSON`, for params too long for one environment entry
 * ({@link paramsBySpecsFile}, {@link paramsFromSpecsFile}); parsing itself reads no file.
 *
 * This project's additions, for local runs: `VF_EMBEDDED_BROKER` names the local engine's embedded broker
 * instead of `VF_NATS_URL`: `tcp://127.0.0.1:PORT` for a subprocess, which must also present the run's
 * secret `VF_EMBEDDED_BROKER_SECRET`, or `messageport` for a Deno Worker, which reaches the supervisor over
 * the MessagePort it was started with. `VF_HEALTH_PORT`, `VF_LOG_LEVEL` and
 * `VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES` are read where their modules define them.
 *
 * @example
 * ```ts
 * const config = parseWorkerConfig(Deno.env.toObject());
 * console.log(config.nodeName, config.parentNames, config.breakerThreshold); // "detect" ["cam"] 10
 * ```
 *
 * @module
 */

import { DEFAULT_EOS_QUIESCENCE_MS } from "../messaging/messenger.ts";
import { DEFAULT_ACK_WAIT_SECONDS, OUTPUT_BUFFER_ENV } from "../messaging/topology.ts";
import type { DeliveredGrant } from "../backends/allocation.ts";
import { deliveredGrantFromDict, deliveredGrantToDict, GPU_GRANT_ENV } from "../backends/allocation.ts";
import {
  ADMISSION_TIMEOUT_ENV,
  admissionTimeoutFromEnv,
  DEFAULT_ADMISSION_TIMEOUT_SECONDS,
  MAX_CONSUMERS_ENV,
  MAX_STREAMS_ENV,
  PARENT_REPLICAS_ENV,
  PROFILE_REQUESTS_ENV,
  type ProfileRequest,
  requestsEnv,
  requestsFromEnv,
  RUNTIME_STORE_ENV,
} from "../backends/capabilities.ts";
import { FAULT_MARKER_DIR_ENV, FAULT_SCHEDULE_ENV, FaultSchedule } from "../backends/faults.ts";
import { checkObligationIds } from "../backends/payload.ts";
import {
  BATCH_BLOB_TTL_SECONDS,
  DEFAULT_MAX_INLINE_PAYLOAD_BYTES,
  MAX_INLINE_PAYLOAD_ENV,
  maxInlinePayloadBytes,
  REALTIME_BLOB_TTL_SECONDS,
} from "../backends/payload_bridge.ts";
import {
  DEFAULT_PARTITION_LEASE_SECONDS,
  DEFAULT_RECONCILE_INTERVAL_SECONDS,
  PARTITION_LEASE_ENV,
  partitionLeaseFromEnv,
  RECONCILE_INTERVAL_ENV,
  reconcileIntervalFromEnv,
} from "../backends/runtime.ts";
import { blobReaderIds, type NodeSpec, parentReplicas, specsFromDicts } from "../core/compiler.ts";
import {
  checkNodeOverride,
  DEFAULT_MAX_RETRIES,
  DELIVERY_MODES,
  type DeliveryMode,
  DeliveryPolicy,
} from "../core/delivery_policy.ts";
import { redactedUrl } from "../core/checks.ts";
import { ConfigError, type Disposition, DISPOSITIONS, ResourceUnavailable } from "../core/errors.ts";
import { checkFlowType, FLOW_TYPES, FlowType } from "../core/flow_type.ts";
import { JoinPolicy } from "../core/join_policy.ts";
import { type JsonObject, NODE_KINDS, NodeKind, parseExportRef } from "../core/node.ts";
import { DEFAULT_BREAKER_THRESHOLD, DEFAULT_PROGRESS_TIMEOUT_SECONDS } from "../core/supervision.ts";
import { malformedVariable, secondsFromText, wholeNumberFromText } from "../core/variables.ts";
import { ENVELOPE_VERSION } from "../wire/codec.ts";
import { EMBEDDED_BROKER_ENV, EMBEDDED_BROKER_SECRET_ENV, parseBrokerAddress } from "../embedded/rpc.ts";
import { DEFAULT_HEALTH_PORT, HEALTH_PORT_ENV, healthPortFromEnv } from "./health.ts";
import {
  LOG_LEVEL_ENV,
  LogFormat,
  type LoggingConfig,
  loggingConfigFromEnv,
  LogLevel,
  STRUCTURED_LOGS_ENV,
} from "./logging.ts";
import { DEFAULT_RUNTIME_STORE_URL } from "./runtime_stores.ts";
import {
  DEFAULT_TERMINATION_LOG,
  DEFAULT_WATCHDOG_INTERVAL_SECONDS,
  TERMINATION_LOG_ENV,
  WATCHDOG_INTERVAL_ENV,
  watchdogIntervalFromEnv,
} from "./watchdog.ts";

/** An environment record: `Deno.env.toObject()`, or what an engine hands a worker. */
export type WorkerEnv = Readonly<Record<string, string | undefined>>;

/** The names of the variables this module reads that no other module names. */
export const WorkerEnvVar = {
  nodeClass: "VF_NODE_CLASS",
  nodeParams: "VF_NODE_PARAMS_JSON",
  nodeKind: "VF_NODE_KIND",
  nodeName: "VF_NODE_NAME",
  parentNames: "VF_PARENT_NAMES",
  hasChildren: "VF_HAS_CHILDREN",
  natsUrl: "VF_NATS_URL",
  flowId: "VF_FLOW_ID",
  flowType: "VF_FLOW_TYPE",
  runId: "VF_RUN_ID",
  replicaId: "VF_REPLICA_ID",
  replicaSlots: "VF_REPLICA_SLOTS",
  ackWaitSeconds: "VF_ACK_WAIT_SECONDS",
  maxRetries: "VF_MAX_RETRIES",
  eosQuiescenceMs: "VF_EOS_QUIESCENCE_MS",
  nbTasks: "VF_NB_TASKS",
  partitionBy: "VF_PARTITION_BY",
  joinPolicy: "VF_JOIN_POLICY_JSON",
  blobStoreUrl: "VF_BLOB_REDIS_URL",
  prefetchBytes: "VF_PREFETCH_BYTES",
  blobReaderIds: "VF_BLOB_READER_IDS",
  blobReaders: "VF_BLOB_READERS",
  blobTtlSeconds: "VF_BLOB_TTL_SECONDS",
  gpuCount: "VF_GPU_COUNT",
  gpuResourceName: "VF_GPU_RESOURCE_NAME",
  envelopeVersion: "VF_ENVELOPE_VERSION",
  delivery: "VF_DELIVERY",
  onError: "VF_ON_ERROR",
  breakerThreshold: "VF_BREAKER_THRESHOLD",
  progressTimeoutSeconds: "VF_PROGRESS_TIMEOUT_SECONDS",
} as const;
/** One of the {@link WorkerEnvVar} names. */
export type WorkerEnvVar = typeof WorkerEnvVar[keyof typeof WorkerEnvVar];

/** The `VF_EMBEDDED_BROKER` value of a Deno Worker: it reaches the broker over its MessagePort. */
export const EMBEDDED_BROKER_MESSAGE_PORT = "messageport";
/** The fewest characters an embedded broker secret has (the local engine draws 32 random bytes). */
export const MIN_BROKER_SECRET_LENGTH = 16;

/** Where a worker's broker is. */
export type BrokerAddress =
  /** A NATS JetStream server (`VF_NATS_URL`): one URL, or several separated by commas. */
  | { readonly kind: "nats"; readonly url: string }
  /** The local engine's embedded broker on a loopback port, with the run's secret (a subprocess). */
  | {
    readonly kind: "embedded-tcp";
    readonly hostname: string;
    readonly port: number;
    readonly secret: string;
  }
  /** The local engine's embedded broker over the MessagePort the Deno Worker was started with. */
  | { readonly kind: "embedded-port" };

/** Everything a worker is configured with; each field says its variable and its default. */
export interface WorkerConfig {
  /** `VF_NODE_CLASS` (required): `<module URL>#<export name>` of the node's class. */
  readonly nodeClass: string;
  /** `VF_NODE_PARAMS_JSON` (required): the JSON object the class is constructed with. */
  readonly nodeParams: JsonObject;
  /** `VF_NODE_KIND` (required): producer, processor or consumer. */
  readonly nodeKind: NodeKind;
  /** `VF_NODE_NAME` (required): the node's stable name. */
  readonly nodeName: string;
  /** `VF_PARENT_NAMES` (comma-separated; empty or unset: none, as for a producer), in `.from()` order. */
  readonly parentNames: readonly string[];
  /** `VF_HAS_CHILDREN` (required, `1` or `0`). */
  readonly hasChildren: boolean;
  /** `VF_NB_TASKS` (1): the node's replica count. */
  readonly nbTasks: number;
  /** `VF_PARTITION_BY` (none): `trace_id` or a metadata field. */
  readonly partitionBy: string | null;
  /** `VF_JOIN_POLICY_JSON` (none: the flow type's default). */
  readonly joinPolicy: JoinPolicy | null;
  /** `VF_DELIVERY` (none: the flow type's preset): `at-least-once` or `best-effort`. */
  readonly delivery: DeliveryMode | null;
  /** `VF_ON_ERROR` (none: transient): the disposition of an error nothing classifies. */
  readonly onError: Disposition | null;
  /** `VF_FLOW_ID` (required). */
  readonly flowId: string;
  /** `VF_FLOW_TYPE` (required): realtime or batch. */
  readonly flowType: FlowType;
  /** `VF_RUN_ID` (required). */
  readonly runId: string;
  /** `VF_REPLICA_ID` (none: claim the lowest free slot through the run ledger). */
  readonly replicaId: number | null;
  /** `VF_REPLICA_SLOTS` (none: `nbTasks`): the slot ceiling when a scaler drives the node. */
  readonly replicaSlots: number | null;
  /** `VF_NATS_URL`, or `VF_EMBEDDED_BROKER` (+ `VF_EMBEDDED_BROKER_SECRET`): exactly one is required. */
  readonly broker: BrokerAddress;
  /** `VF_RUNTIME_STORE_URL` (`memory://`): the run ledger. */
  readonly runtimeStoreUrl: string;
  /** `VF_PARENT_REPLICAS` (none: the EOS-3 drain): each parent's replica count. */
  readonly parentReplicas: Readonly<Record<string, number>>;
  /** `VF_PARTITION_LEASE_SECONDS` (10). */
  readonly partitionLeaseSeconds: number;
  /** `VF_RECONCILE_INTERVAL_SECONDS` (60; 0: the start pass only). */
  readonly reconcileIntervalSeconds: number;
  /** `VF_ACK_WAIT_SECONDS` (60). */
  readonly ackWaitSeconds: number;
  /** `VF_MAX_RETRIES` (3): redeliveries of an at-least-once node before the DLQ. */
  readonly maxRetries: number;
  /** `VF_EOS_QUIESCENCE_MS` (500). */
  readonly eosQuiescenceMs: number;
  /** `VF_PREFETCH_BYTES` (none: bounded by the prefetch count only). */
  readonly prefetchBytes: number | null;
  /**
   * `VF_OUTPUT_BUFFER_BYTES` (none: the messenger's 64 MiB): the bytes of outputs the broker has not taken
   * yet that the replica may hold, the share of its node's byte limit an engine that sets one gives it.
   */
  readonly outputBufferBytes: number | null;
  /** `VF_ENVELOPE_VERSION` (4, the only one). */
  readonly envelopeVersion: number;
  /** `VF_BLOB_REDIS_URL` (none): the payload store, chosen by the URL's scheme. */
  readonly blobStoreUrl: string | null;
  /** `VF_BLOB_READERS` (none: TTL-only reclamation). */
  readonly blobReaders: number | null;
  /** `VF_BLOB_READER_IDS` (none): the reader obligations each put acquires. */
  readonly blobReaderIds: readonly string[];
  /** `VF_BLOB_TTL_SECONDS` (3600 realtime, 86400 batch). */
  readonly blobTtlSeconds: number;
  /** `VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES` (512 KiB): larger payloads are offloaded. */
  readonly maxInlinePayloadBytes: number;
  /** `VF_GPU_COUNT` (none): whole GPUs granted (informational). */
  readonly gpuCount: number | null;
  /** `VF_GPU_RESOURCE_NAME` (none): the extended resource or MIG profile requested. */
  readonly gpuResourceName: string | null;
  /** `VF_GPU_GRANT_JSON` (none: enumerate the visible devices): the launcher's delivered grant. */
  readonly gpuGrant: DeliveredGrant | null;
  /** `VF_BREAKER_THRESHOLD` (10; 0 disables). */
  readonly breakerThreshold: number;
  /** `VF_PROGRESS_TIMEOUT_SECONDS` (300; 0 disables). */
  readonly progressTimeoutSeconds: number;
  /** `VF_WATCHDOG_INTERVAL_SECONDS` (5; 0: no watchdog). */
  readonly watchdogIntervalSeconds: number;
  /** `VF_TERMINATION_LOG` (`/dev/termination-log`). */
  readonly terminationLog: string;
  /** `VF_PROFILE_REQUESTS_JSON` (none): the operator's explicit channel profiles. */
  readonly profileRequests: readonly ProfileRequest[];
  /** `VF_ADMISSION_TIMEOUT_SECONDS` (60). */
  readonly admissionTimeoutSeconds: number;
  /** `VF_MAX_STREAMS` (none): the declared supported number of streams. */
  readonly maxStreams: number | null;
  /** `VF_MAX_CONSUMERS` (none): the declared supported number of consumers. */
  readonly maxConsumers: number | null;
  /** `VF_STRUCTURED_LOGS` (human) and `VF_LOG_LEVEL` (info). */
  readonly logging: LoggingConfig;
  /** `VF_HEALTH_PORT` (8080; 0, stored as `null`: no health server). */
  readonly healthPort: number | null;
  /** `VF_FAULT_SCHEDULE_JSON` (none): a conformance test's fault schedule, validated. */
  readonly faultScheduleJson: string | null;
  /** `VF_FAULT_MARKER_DIR` (none). */
  readonly faultMarkerDir: string | null;
}

/** The fields {@link workerConfigFor} takes from the node's spec. */
type SpecField =
  | "nodeClass"
  | "nodeParams"
  | "nodeKind"
  | "nodeName"
  | "parentNames"
  | "hasChildren"
  | "nbTasks"
  | "partitionBy"
  | "joinPolicy"
  | "delivery"
  | "onError"
  | "parentReplicas"
  | "blobReaders"
  | "blobReaderIds"
  | "gpuCount"
  | "gpuResourceName";

/** The deployment settings of a worker: everything neither its spec nor its flow and run identity fix. */
export type WorkerSettings = Omit<
  WorkerConfig,
  SpecField | "flowId" | "flowType" | "runId" | "broker" | "replicaId"
>;

/** The flow a worker belongs to. */
export interface FlowInfo {
  readonly flowId: string;
  readonly flowType: FlowType;
}

/** The run a worker belongs to. */
export interface RunInfo {
  readonly runId: string;
  readonly broker: BrokerAddress;
}

// ---------------------------------------------------------------------------------------------------------
// Reading values

function oneOf<T extends string>(name: string, raw: string, values: readonly T[]): T {
  if ((values as readonly string[]).includes(raw)) return raw as T;
  throw malformedVariable(name, raw, `one of ${values.join(", ")}`, values[0]);
}

function jsonIn(name: string, raw: string): unknown {
  try {
    return JSON.parse(raw);
  } catch (error) {
    throw new ConfigError(
      `${name} is not JSON: ${error instanceof Error ? error.message : String(error)}`,
      `set ${name} to the JSON document the engine writes`,
      { variable: name },
    );
  }
}

/** A comma-separated list of non-empty names; `""` is the empty list. */
function namesIn(name: string, raw: string): string[] {
  if (raw === "") return [];
  const names = raw.split(",");
  if (names.some((item) => item.trim() === "" || item.trim() !== item)) {
    throw malformedVariable(name, raw, "comma-separated names without blanks", "cam,mic");
  }
  return names;
}

function listText(name: string, names: readonly string[]): string {
  for (const item of names) {
    if (item === "" || item.includes(",") || item.trim() !== item) {
      throw new ConfigError(
        `${JSON.stringify(item)} cannot be listed in ${name}`,
        "give every listed name as a non-empty string without commas or surrounding blanks",
        { variable: name },
      );
    }
  }
  return names.join(",");
}

function urlIn(name: string, raw: string, schemes: readonly string[] | null): string {
  let scheme: string | null = null;
  try {
    scheme = new URL(raw).protocol.slice(0, -1).toLowerCase();
  } catch {
    scheme = null;
  }
  if (scheme === null || (schemes !== null && !schemes.includes(scheme))) {
    const wanted = schemes === null ? "a URL" : `a ${schemes.map((s) => `${s}://`).join(" or ")} URL`;
    throw new ConfigError(
      `${name} must be ${wanted}, got ${JSON.stringify(redactedUrl(raw))}`,
      `set ${name} to ${wanted}`,
      { variable: name },
    );
  }
  return raw;
}

const NATS_SCHEMES = ["nats", "tls", "ws", "wss"];
const LOOPBACK = new Set(["127.0.0.1", "localhost"]);

function natsUrlIn(raw: string): string {
  for (const server of raw.split(",")) urlIn(WorkerEnvVar.natsUrl, server, NATS_SCHEMES);
  return raw;
}

function embeddedBrokerIn(raw: string, secret: string | undefined): BrokerAddress {
  if (raw === EMBEDDED_BROKER_MESSAGE_PORT) return { kind: "embedded-port" };
  let address: { readonly hostname: string; readonly port: number } | null;
  try {
    address = parseBrokerAddress(raw);
  } catch {
    address = null;
  }
  if (address === null || !LOOPBACK.has(address.hostname) || address.port < 1) {
    throw malformedVariable(
      EMBEDDED_BROKER_ENV,
      raw,
      `tcp://127.0.0.1:PORT (loopback only) or ${EMBEDDED_BROKER_MESSAGE_PORT}`,
      "tcp://127.0.0.1:4222",
    );
  }
  if (secret === undefined || secret.length < MIN_BROKER_SECRET_LENGTH || /\s/.test(secret)) {
    throw new ConfigError(
      `an embedded broker on ${raw} needs ${EMBEDDED_BROKER_SECRET_ENV}: ` +
        `${MIN_BROKER_SECRET_LENGTH} or more characters without blanks`,
      `set ${EMBEDDED_BROKER_SECRET_ENV} to the run's secret, as the local engine does`,
      { variable: EMBEDDED_BROKER_SECRET_ENV },
    );
  }
  return { kind: "embedded-tcp", hostname: address.hostname, port: address.port, secret };
}

function brokerIn(env: WorkerEnv): BrokerAddress {
  const nats = present(env, WorkerEnvVar.natsUrl);
  const embedded = present(env, EMBEDDED_BROKER_ENV);
  if (nats !== undefined && embedded !== undefined) {
    throw new ConfigError(
      `both ${WorkerEnvVar.natsUrl} and ${EMBEDDED_BROKER_ENV} are set`,
      `set ${WorkerEnvVar.natsUrl} for a NATS broker, or ${EMBEDDED_BROKER_ENV} for the local engine's ` +
        "embedded one, not both",
      { variable: WorkerEnvVar.natsUrl },
    );
  }
  if (nats !== undefined) return { kind: "nats", url: natsUrlIn(nats) };
  if (embedded !== undefined) return embeddedBrokerIn(embedded, env[EMBEDDED_BROKER_SECRET_ENV]);
  throw missing(
    `${WorkerEnvVar.natsUrl} or ${EMBEDDED_BROKER_ENV}`,
    `set ${WorkerEnvVar.natsUrl} (nats://host:4222), or run the node under the local engine`,
  );
}

function brokerText(broker: BrokerAddress): Record<string, string> {
  switch (broker.kind) {
    case "nats":
      return { [WorkerEnvVar.natsUrl]: broker.url };
    case "embedded-tcp":
      return {
        [EMBEDDED_BROKER_ENV]: `tcp://${broker.hostname}:${broker.port}`,
        [EMBEDDED_BROKER_SECRET_ENV]: broker.secret,
      };
    case "embedded-port":
      return { [EMBEDDED_BROKER_ENV]: EMBEDDED_BROKER_MESSAGE_PORT };
  }
}

function missing(name: string, remedy: string): ConfigError {
  return new ConfigError(`${name} is not set; a worker cannot start without it`, remedy, { variable: name });
}

/** The variable's value, or `undefined` when it is unset or empty. */
function present(env: WorkerEnv, name: string): string | undefined {
  const value = env[name];
  return value === undefined || value === "" ? undefined : value;
}

/** A `get`-style environment holding one variable, for the modules that read theirs through `get`. */
function single(name: string, raw: string): Pick<Deno.Env, "get"> {
  return { get: (key: string) => key === name ? raw : undefined };
}

/**
 * `VF_PARENT_REPLICAS` (ENV-11): comma-separated replica counts aligned with `VF_PARENT_NAMES`, as parent →
 * count. Unset or empty: `{}` (no EOS-7 barrier; the EOS-3 drain). Throws {@link ConfigError} when the
 * number of counts differs from the number of parents, or a count is not a whole number of 0 or more.
 */
export function parentReplicasFromEnv(
  parentNames: readonly string[],
  raw: string | null | undefined,
): Record<string, number> {
  if (raw === null || raw === undefined || raw === "") return {};
  const counts = raw.split(",");
  if (counts.length !== parentNames.length) {
    throw new ConfigError(
      `${PARENT_REPLICAS_ENV} lists ${counts.length} replica count(s) for ${parentNames.length} parent(s) ` +
        `(${parentNames.join(",") || "none"})`,
      `give one count per name of VF_PARENT_NAMES, in the same order, or unset ${PARENT_REPLICAS_ENV}`,
      { variable: PARENT_REPLICAS_ENV },
    );
  }
  return Object.fromEntries(
    parentNames.map((name, i) => [name, wholeNumberFromText(PARENT_REPLICAS_ENV, counts[i], 0)]),
  );
}

// ---------------------------------------------------------------------------------------------------------
// The variables

/** One variable: how its text becomes a field, its value when absent, and its text again. */
interface Variable<K extends keyof WorkerConfig> {
  readonly name: string;
  readonly key: K;
  /** Reads the variable's non-empty text (`name` is the variable's, for the error). */
  readonly parse: (raw: string, name: string) => WorkerConfig[K];
  /** The field's value when the variable is unset or empty; `undefined`: the variable is required. */
  readonly absent?: (flowType: FlowType) => WorkerConfig[K];
  /** The variable's text for a value; `undefined`: leave the variable unset. */
  readonly text: (value: WorkerConfig[K]) => string | undefined;
}

type AnyVariable = { [K in keyof WorkerConfig]: Variable<K> }[keyof WorkerConfig];

const fromEngine =
  "the engine sets it from the compiled spec; start the node through `vf run-local` or `vf deploy`";

const asText = (value: string): string => value;
const nullable = <T>(text: (value: T) => string) => (value: T | null): string | undefined =>
  value === null ? undefined : text(value);
const never = () => null;
const constant = <T>(value: T) => (): T => value;
const integer = (min: number) => (raw: string, name: string): number => wholeNumberFromText(name, raw, min);
const seconds = (allowZero: boolean) => (raw: string, name: string): number =>
  secondsFromText(name, raw, allowZero);
const url = (raw: string, name: string): string => urlIn(name, raw, null);
const choice = <T extends string>(values: readonly T[]) => (raw: string, name: string): T =>
  oneOf(name, raw, values);
const json = <T>(read: (document: unknown) => T) => (raw: string, name: string): T => read(jsonIn(name, raw));

/** A variable that must be set. */
function required<K extends keyof WorkerConfig>(
  name: string,
  key: K,
  parse: (raw: string, name: string) => WorkerConfig[K],
  text: (value: WorkerConfig[K]) => string,
): Variable<K> {
  return { name, key, parse, text };
}

/** A variable with a value when unset; a setting left at its default is not written (workerConfigToEnv). */
function setting<K extends keyof WorkerConfig>(
  name: string,
  key: K,
  parse: (raw: string, name: string) => WorkerConfig[K],
  fallback: (flowType: FlowType) => WorkerConfig[K],
  text: (value: WorkerConfig[K]) => string | undefined = (value) =>
    value === null ? undefined : String(value),
): Variable<K> {
  return { name, key, parse, absent: fallback, text };
}

const requiredText = <K extends "nodeName" | "flowId" | "runId">(name: string, key: K) =>
  required(name, key, asText, asText);

/** A comma-separated list of names, empty when unset. */
const namesSetting = <K extends "parentNames" | "blobReaderIds">(
  name: string,
  key: K,
  check = (_: string[]) => {},
) =>
  setting(
    name,
    key,
    (raw) => {
      const names = namesIn(name, raw);
      check(names);
      return names;
    },
    constant([]),
    (names) => names.length === 0 ? undefined : listText(name, names),
  );

const NODE_VARIABLES: readonly AnyVariable[] = [
  required(WorkerEnvVar.nodeClass, "nodeClass", (raw, name) => {
    try {
      parseExportRef(raw);
    } catch {
      throw malformedVariable(name, raw, "`<module URL>#<export name>`", "file:///app/flow.ts#Detect");
    }
    return raw;
  }, asText),
  required(WorkerEnvVar.nodeParams, "nodeParams", (raw, name) => {
    const params = jsonIn(name, raw);
    if (typeof params !== "object" || params === null || Array.isArray(params)) {
      throw malformedVariable(name, raw, "a JSON object", '{"name":"detect"}');
    }
    return params as JsonObject;
  }, (params) => JSON.stringify(params)),
  required(WorkerEnvVar.nodeKind, "nodeKind", choice(NODE_KINDS), asText),
  requiredText(WorkerEnvVar.nodeName, "nodeName"),
  namesSetting(WorkerEnvVar.parentNames, "parentNames"),
  required(
    WorkerEnvVar.hasChildren,
    "hasChildren",
    (raw, name) => oneOf(name, raw, ["1", "0"]) === "1",
    (value) => value ? "1" : "0",
  ),
  setting(WorkerEnvVar.nbTasks, "nbTasks", integer(1), constant(1)),
  setting(WorkerEnvVar.partitionBy, "partitionBy", asText, never),
  setting(
    WorkerEnvVar.joinPolicy,
    "joinPolicy",
    json(JoinPolicy.fromDict),
    never,
    nullable((policy: JoinPolicy) => JSON.stringify(policy.toDict())),
  ),
  setting(
    WorkerEnvVar.delivery,
    "delivery",
    choice(DELIVERY_MODES),
    never,
  ),
  setting(WorkerEnvVar.onError, "onError", choice(DISPOSITIONS), never),
  requiredText(WorkerEnvVar.flowId, "flowId"),
  required(WorkerEnvVar.flowType, "flowType", choice(FLOW_TYPES), asText),
  requiredText(WorkerEnvVar.runId, "runId"),
  setting(WorkerEnvVar.replicaId, "replicaId", integer(0), never),
];

const SETTING_VARIABLES: readonly AnyVariable[] = [
  setting(
    WorkerEnvVar.replicaSlots,
    "replicaSlots",
    integer(1),
    never,
  ),
  setting(
    RUNTIME_STORE_ENV,
    "runtimeStoreUrl",
    url,
    constant(DEFAULT_RUNTIME_STORE_URL),
  ),
  setting(
    PARTITION_LEASE_ENV,
    "partitionLeaseSeconds",
    partitionLeaseFromEnv,
    constant(DEFAULT_PARTITION_LEASE_SECONDS),
  ),
  setting(
    RECONCILE_INTERVAL_ENV,
    "reconcileIntervalSeconds",
    reconcileIntervalFromEnv,
    constant(DEFAULT_RECONCILE_INTERVAL_SECONDS),
  ),
  setting(
    WorkerEnvVar.ackWaitSeconds,
    "ackWaitSeconds",
    seconds(false),
    constant(DEFAULT_ACK_WAIT_SECONDS),
  ),
  setting(
    WorkerEnvVar.maxRetries,
    "maxRetries",
    integer(0),
    constant(DEFAULT_MAX_RETRIES),
  ),
  setting(
    WorkerEnvVar.eosQuiescenceMs,
    "eosQuiescenceMs",
    integer(0),
    constant(DEFAULT_EOS_QUIESCENCE_MS),
  ),
  setting(
    WorkerEnvVar.prefetchBytes,
    "prefetchBytes",
    integer(1),
    never,
  ),
  setting(
    OUTPUT_BUFFER_ENV,
    "outputBufferBytes",
    integer(1),
    never,
  ),
  setting(
    WorkerEnvVar.envelopeVersion,
    "envelopeVersion",
    (raw, name) => Number(oneOf(name, raw, [String(ENVELOPE_VERSION)])),
    constant(ENVELOPE_VERSION),
  ),
  setting(
    WorkerEnvVar.blobStoreUrl,
    "blobStoreUrl",
    url,
    never,
  ),
  setting(
    WorkerEnvVar.blobTtlSeconds,
    "blobTtlSeconds",
    seconds(false),
    (flowType) => flowType === FlowType.batch ? BATCH_BLOB_TTL_SECONDS : REALTIME_BLOB_TTL_SECONDS,
  ),
  setting(
    MAX_INLINE_PAYLOAD_ENV,
    "maxInlinePayloadBytes",
    (raw, name) => maxInlinePayloadBytes({ [name]: raw }),
    constant(DEFAULT_MAX_INLINE_PAYLOAD_BYTES),
  ),
  setting(
    GPU_GRANT_ENV,
    "gpuGrant",
    json(deliveredGrantFromDict),
    never,
    nullable((grant: DeliveredGrant) => JSON.stringify(deliveredGrantToDict(grant))),
  ),
  setting(
    WorkerEnvVar.breakerThreshold,
    "breakerThreshold",
    integer(0),
    constant(DEFAULT_BREAKER_THRESHOLD),
  ),
  setting(
    WorkerEnvVar.progressTimeoutSeconds,
    "progressTimeoutSeconds",
    seconds(true),
    constant(DEFAULT_PROGRESS_TIMEOUT_SECONDS),
  ),
  setting(
    WATCHDOG_INTERVAL_ENV,
    "watchdogIntervalSeconds",
    (raw, name) => watchdogIntervalFromEnv(single(name, raw)),
    constant(DEFAULT_WATCHDOG_INTERVAL_SECONDS),
  ),
  setting(TERMINATION_LOG_ENV, "terminationLog", asText, constant(DEFAULT_TERMINATION_LOG)),
  setting(
    PROFILE_REQUESTS_ENV,
    "profileRequests",
    requestsFromEnv,
    constant([]),
    (requests) => requestsEnv(requests)[PROFILE_REQUESTS_ENV],
  ),
  setting(
    ADMISSION_TIMEOUT_ENV,
    "admissionTimeoutSeconds",
    admissionTimeoutFromEnv,
    constant(DEFAULT_ADMISSION_TIMEOUT_SECONDS),
  ),
  setting(MAX_STREAMS_ENV, "maxStreams", integer(1), never),
  setting(MAX_CONSUMERS_ENV, "maxConsumers", integer(1), never),
  setting(
    HEALTH_PORT_ENV,
    "healthPort",
    (raw, name) => healthPortFromEnv(single(name, raw)),
    constant(DEFAULT_HEALTH_PORT),
    (port) => port === null ? "0" : String(port),
  ),
  setting(
    FAULT_SCHEDULE_ENV,
    "faultScheduleJson",
    (raw, name) => {
      FaultSchedule.fromEnv({ [name]: raw });
      return raw;
    },
    never,
  ),
  setting(FAULT_MARKER_DIR_ENV, "faultMarkerDir", asText, never),
];

/** The spec-derived variables that are written only for the nodes they apply to. */
const SPEC_VARIABLES: readonly AnyVariable[] = [
  setting(
    WorkerEnvVar.blobReaders,
    "blobReaders",
    integer(0),
    never,
  ),
  namesSetting(WorkerEnvVar.blobReaderIds, "blobReaderIds", checkObligationIds),
  setting(WorkerEnvVar.gpuCount, "gpuCount", integer(1), never),
  setting(WorkerEnvVar.gpuResourceName, "gpuResourceName", asText, never),
];

const VARIABLES: readonly AnyVariable[] = [...NODE_VARIABLES, ...SETTING_VARIABLES, ...SPEC_VARIABLES];

/** The settings a worker gets when its environment names none: the spec's defaults for `flowType`. */
export function defaultWorkerSettings(flowType: FlowType): WorkerSettings {
  const settings: Record<string, unknown> = {};
  for (const variable of SETTING_VARIABLES) settings[variable.key] = variable.absent!(flowType);
  settings.logging = { format: LogFormat.human, level: LogLevel.info };
  return settings as unknown as WorkerSettings;
}

// ---------------------------------------------------------------------------------------------------------
// Reading and writing the environment

function checkConsistency(config: WorkerConfig): void {
  const { nodeKind, nodeName, parentNames, nodeParams, replicaId } = config;
  if (nodeKind === NodeKind.producer && parentNames.length > 0) {
    throw new ConfigError(
      `${nodeName} is a producer, but ${WorkerEnvVar.parentNames} names parents (${parentNames.join(",")})`,
      `leave ${WorkerEnvVar.parentNames} empty for a producer, or fix ${WorkerEnvVar.nodeKind}`,
      { variable: WorkerEnvVar.parentNames },
    );
  }
  if (nodeKind !== NodeKind.producer && parentNames.length === 0) {
    throw new ConfigError(
      `${nodeName} is a ${nodeKind}, but ${WorkerEnvVar.parentNames} names no parent`,
      `set ${WorkerEnvVar.parentNames} to its parents, in .from() order`,
      { variable: WorkerEnvVar.parentNames },
    );
  }
  if (typeof nodeParams.name === "string" && nodeParams.name !== nodeName) {
    throw new ConfigError(
      `${WorkerEnvVar.nodeParams} names the node ${nodeParams.name}, but ${WorkerEnvVar.nodeName} is ${nodeName}`,
      "set both from the same compiled spec",
      { variable: WorkerEnvVar.nodeName },
    );
  }
  const slots = config.replicaSlots ?? config.nbTasks;
  if (replicaId !== null && replicaId >= slots) {
    throw new ConfigError(
      `${WorkerEnvVar.replicaId} ${replicaId} is beyond the node's ${slots} replica slot(s)`,
      `give a replica id below ${WorkerEnvVar.replicaSlots} (or ${WorkerEnvVar.nbTasks}), or unset it to claim a slot`,
      { variable: WorkerEnvVar.replicaId },
    );
  }
}

function oneError(problems: readonly ConfigError[]): ConfigError {
  if (problems.length === 1) return problems[0];
  const variables = problems.map((problem) => problem.context.variable).filter((v) => v !== undefined);
  return new ConfigError(
    `the worker environment has ${problems.length} problems: ${problems.map((p) => p.message).join("; ")}`,
    [...new Set(problems.map((p) => p.remedy).filter((r) => r !== null))].join("; "),
    { variables },
  );
}

function asConfigError(error: unknown, name: string): ConfigError {
  if (error instanceof ConfigError) {
    if (!("variable" in error.context)) error.context.variable = name;
    return error;
  }
  const message = error instanceof Error ? error.message : String(error);
  return new ConfigError(`${name} is invalid: ${message}`, `set ${name} as the engine writes it`, {
    variable: name,
  });
}

/**
 * Reads a worker's environment into its {@link WorkerConfig}: every variable of the spec, with its default
 * when unset (an empty value counts as unset). Throws one {@link ConfigError} for everything wrong at once:
 * a required variable missing (naming it and the remedy), a malformed value, a producer with parents or a
 * receiver without, a params name that is not `VF_NODE_NAME`, a replica id beyond the slots, a parent
 * replica count that does not match the parents.
 */
export function parseWorkerConfig(env: WorkerEnv): WorkerConfig {
  const rawType = env[WorkerEnvVar.flowType];
  const flowType = FLOW_TYPES.find((type) => type === rawType) ?? FlowType.realtime;
  const { fields, problems, attempt } = readVariables(env, VARIABLES, flowType);
  attempt(WorkerEnvVar.natsUrl, () => fields.broker = brokerIn(env));
  attempt(PARENT_REPLICAS_ENV, () => {
    fields.parentReplicas = parentReplicasFromEnv(
      (fields.parentNames ?? []) as string[],
      env[PARENT_REPLICAS_ENV],
    );
  });
  if (problems.length === 0) {
    attempt(WorkerEnvVar.nodeKind, () => checkConsistency(fields as unknown as WorkerConfig));
  }
  if (problems.length > 0) throw oneError(problems);
  return fields as unknown as WorkerConfig;
}

/**
 * The settings `env` gives a worker of a `flowType` flow, each unset one at its default, read exactly as
 * {@link parseWorkerConfig} reads them: a supervisor checks the settings it passes on before any replica
 * starts. Throws one {@link ConfigError} naming every malformed variable.
 */
export function parseWorkerSettings(env: WorkerEnv, flowType: FlowType): WorkerSettings {
  const { fields, problems } = readVariables(env, SETTING_VARIABLES, flowType);
  if (problems.length > 0) throw oneError(problems);
  return fields as unknown as WorkerSettings;
}

/** Reads `variables` and the logging settings from `env`, collecting every problem instead of stopping. */
function readVariables(env: WorkerEnv, variables: readonly AnyVariable[], flowType: FlowType) {
  const problems: ConfigError[] = [];
  const fields: Record<string, unknown> = {};
  const attempt = (name: string, read: () => void): void => {
    try {
      read();
    } catch (error) {
      problems.push(asConfigError(error, name));
    }
  };
  for (const variable of variables) {
    attempt(variable.name, () => {
      const raw = present(env, variable.name);
      if (raw !== undefined) fields[variable.key] = variable.parse(raw, variable.name);
      else if (variable.absent !== undefined) fields[variable.key] = variable.absent(flowType);
      else throw missing(variable.name, fromEngine);
    });
  }
  attempt(STRUCTURED_LOGS_ENV, () => fields.logging = loggingConfigFromEnv({ get: (key) => env[key] }));
  return { fields, problems, attempt };
}

/**
 * The environment that {@link parseWorkerConfig} reads back as `config`: every required variable, and every
 * optional one whose value is not its default. Throws {@link ConfigError} for a name that cannot be listed
 * (a comma in a parent name or reader id), or parent replica counts that name some parents but not all.
 */
export function workerConfigToEnv(config: WorkerConfig): Record<string, string> {
  const env: Record<string, string> = {};
  const defaults = defaultWorkerSettings(config.flowType) as unknown as Record<string, unknown>;
  for (const variable of VARIABLES) {
    const value = config[variable.key];
    const fallback = defaults[variable.key];
    if (fallback !== undefined && sameValue(value, fallback)) continue;
    const text = (variable.text as (value: unknown) => string | undefined)(value);
    if (text !== undefined) env[variable.name] = text;
  }
  Object.assign(env, brokerText(config.broker));
  const counted = Object.keys(config.parentReplicas);
  if (counted.length > 0) {
    if (
      counted.length !== config.parentNames.length ||
      !config.parentNames.every((p) => p in config.parentReplicas)
    ) {
      throw new ConfigError(
        `the parent replica counts of ${config.nodeName} (${counted.join(",")}) name every parent or none ` +
          `(${config.parentNames.join(",")})`,
        "give one replica count per parent, or none for the EOS-3 drain",
        { variable: PARENT_REPLICAS_ENV },
      );
    }
    env[PARENT_REPLICAS_ENV] = config.parentNames.map((name) => config.parentReplicas[name]).join(",");
  }
  if (config.logging.format === LogFormat.json) env[STRUCTURED_LOGS_ENV] = "1";
  if (config.logging.level !== LogLevel.info) env[LOG_LEVEL_ENV] = config.logging.level;
  return env;
}

function sameValue(a: unknown, b: unknown): boolean {
  return a === b || (Array.isArray(a) && Array.isArray(b) && a.length === 0 && b.length === 0);
}

function specDelivery(spec: NodeSpec): Pick<WorkerConfig, "delivery" | "onError"> {
  const override = spec.delivery ?? {};
  checkNodeOverride(spec.name, override);
  const checked = DeliveryPolicy.nodeOverride(
    override.delivery as string | null | undefined,
    override.on_error as string | null | undefined,
  );
  return { delivery: checked?.delivery ?? null, onError: checked?.on_error ?? null };
}

/**
 * What one replica of `spec` is configured with: the spec's node, wiring and GPU fields, its parents'
 * replica counts and its children's reader ids (from `specs`, the whole compiled flow), the flow and the
 * run, the replica id (`null`: the replica claims a slot), and the deployment settings in `extra` over
 * {@link defaultWorkerSettings}. Throws {@link ConfigError} for a native component (no node class), a
 * delivery override the environment cannot carry, a parent missing from `specs`, or a replica id beyond
 * the node's slots.
 */
export function workerConfigFor(
  spec: NodeSpec,
  specs: readonly NodeSpec[],
  flow: FlowInfo,
  run: RunInfo,
  replica: number | null,
  extra: Partial<WorkerSettings> = {},
): WorkerConfig {
  if (spec.nodeClass === null) {
    throw new ConfigError(
      `${spec.name} is a native component: it runs its own entrypoint, not a videoflow worker`,
      "start native components with their own command",
      { node: spec.name },
    );
  }
  const counts = parentReplicas(spec, specs);
  const config: WorkerConfig = {
    ...defaultWorkerSettings(flow.flowType),
    ...extra,
    nodeClass: spec.nodeClass,
    nodeParams: spec.params,
    nodeKind: spec.kind,
    nodeName: spec.name,
    parentNames: [...spec.parents],
    hasChildren: spec.hasChildren,
    nbTasks: spec.nbTasks,
    partitionBy: spec.partitionBy,
    joinPolicy: spec.joinPolicy === null ? null : JoinPolicy.fromDict(spec.joinPolicy),
    ...specDelivery(spec),
    flowId: flow.flowId,
    flowType: checkFlowType(flow.flowType),
    runId: run.runId,
    replicaId: replica,
    broker: run.broker,
    parentReplicas: Object.fromEntries(spec.parents.map((name, i) => [name, counts[i]])),
    blobReaders: spec.blobReaders,
    blobReaderIds: blobReaderIds(spec, specs),
    gpuCount: spec.deviceType === "gpu" ? spec.gpuCount : null,
    gpuResourceName: spec.gpuResourceName,
  };
  checkConsistency(config);
  return config;
}

/**
 * The `VF_*` environment an engine starts one replica of a spec with, given {@link workerConfigFor}'s
 * arguments `(spec, specs, flow, run, replica, extra?)`: that config written by {@link workerConfigToEnv},
 * so `parseWorkerConfig(workerEnvFor(...))` equals `workerConfigFor(...)`.
 */
export function workerEnvFor(...args: Parameters<typeof workerConfigFor>): Record<string, string> {
  return workerConfigToEnv(workerConfigFor(...args));
}

/**
 * The node's effective delivery policy: the flow type's preset, the node's `VF_DELIVERY`/`VF_ON_ERROR`
 * overrides, then `VF_MAX_RETRIES` for an at-least-once node.
 */
export function deliveryPolicyOf(config: WorkerConfig): DeliveryPolicy {
  return DeliveryPolicy.resolve(
    config.flowType,
    DeliveryPolicy.nodeOverride(config.delivery, config.onError),
    config.maxRetries,
  );
}

/** The variable naming the file of the compiled specs document (a JSON list of NodeSpecs; spec runtime.provision). */
export const FLOW_SPECS_PATH_ENV = "VF_FLOW_SPECS_PATH";

/** Where a pod finds the compiled specs document (`VF_FLOW_SPECS_PATH`): the specs ConfigMap's mount. */
export const DEFAULT_FLOW_SPECS_PATH = "/etc/videoflow/specs.json";

/**
 * The most bytes one environment entry may take on Linux, `NAME=value` and its terminating NUL together
 * (MAX_ARG_STRLEN, 32 pages of 4 KiB): a longer one makes the exec of a subprocess or a container fail
 * with E2BIG ("Argument list too long").
 */
export const MAX_ENV_ENTRY_BYTES = 128 * 1024;

const utf8 = new TextEncoder();

/** Whether `NAME=value` fits one environment entry ({@link MAX_ENV_ENTRY_BYTES}). */
export function fitsEnvEntry(name: string, value: string): boolean {
  return utf8.encode(name).length + utf8.encode(value).length + 2 <= MAX_ENV_ENTRY_BYTES;
}

/**
 * A replica's environment as a process can be started with: `env` itself when its node params fit one
 * environment entry, else `env` without `VF_NODE_PARAMS_JSON` and with `VF_FLOW_SPECS_PATH` = `specsPath`,
 * the compiled specs document (a JSON list of NodeSpecs) the replica then takes its params from
 * ({@link paramsFromSpecsFile}).
 */
export function paramsBySpecsFile(
  env: Readonly<Record<string, string>>,
  specsPath: string,
): Record<string, string> {
  const params = env[WorkerEnvVar.nodeParams];
  if (params === undefined || fitsEnvEntry(WorkerEnvVar.nodeParams, params)) return { ...env };
  const { [WorkerEnvVar.nodeParams]: _moved, ...rest } = env;
  return { ...rest, [FLOW_SPECS_PATH_ENV]: specsPath };
}

/**
 * The worker's side of {@link paramsBySpecsFile}: `env` itself when it has `VF_NODE_PARAMS_JSON` or no
 * `VF_FLOW_SPECS_PATH`, else `env` with `VF_NODE_PARAMS_JSON` set to the params of the node
 * `VF_NODE_NAME` names in the specs document at that path, for {@link parseWorkerConfig}.
 *
 * @throws ResourceUnavailable when the document cannot be read; ConfigError when it is not a specs
 * document, or holds no node of that name.
 */
export async function paramsFromSpecsFile(env: WorkerEnv): Promise<WorkerEnv> {
  const path = env[FLOW_SPECS_PATH_ENV];
  if (env[WorkerEnvVar.nodeParams] !== undefined || path === undefined) return env;
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (error) {
    throw new ResourceUnavailable(
      `the specs document ${path} (${FLOW_SPECS_PATH_ENV}) cannot be read: ${(error as Error).message}`,
      "mount or copy the compiled specs document there, readable by the worker",
      { path, variable: FLOW_SPECS_PATH_ENV },
    );
  }
  let list: unknown;
  try {
    list = JSON.parse(text);
  } catch {
    throw new ConfigError(
      `the specs document ${path} (${FLOW_SPECS_PATH_ENV}) is not JSON`,
      "write it as a JSON list of compiled node specs",
      { path, variable: FLOW_SPECS_PATH_ENV },
    );
  }
  const name = env[WorkerEnvVar.nodeName];
  const spec = specsFromDicts(list).find((candidate) => candidate.name === name);
  if (spec === undefined) {
    throw new ConfigError(
      `the specs document ${path} (${FLOW_SPECS_PATH_ENV}) has no node ${JSON.stringify(name ?? null)} ` +
        `(${WorkerEnvVar.nodeName})`,
      "give the worker the specs document of its own flow",
      { path, node: name ?? null },
    );
  }
  return { ...env, [WorkerEnvVar.nodeParams]: JSON.stringify(spec.params) };
}
