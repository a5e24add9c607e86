import assert from "node:assert/strict";
import { deliveredGrantToDict, deviceIdentity, GrantHost } from "../../../src/backends/allocation.ts";
import { ProfileRequest } from "../../../src/backends/capabilities.ts";
import { Barrier } from "../../../src/backends/faults.ts";
import { compileFlow, NodeSpec } from "../../../src/core/compiler.ts";
import { ConfigError } from "../../../src/core/errors.ts";
import { Flow } from "../../../src/core/flow.ts";
import { FlowType } from "../../../src/core/flow_type.ts";
import { JoinPolicy } from "../../../src/core/join_policy.ts";
import { ModuleIndex } from "../../../src/core/node_class.ts";
import { ConsumerNode, END, type JsonObject, ProcessorNode, ProducerNode } from "../../../src/core/node.ts";
import { EMBEDDED_BROKER_ENV, EMBEDDED_BROKER_SECRET_ENV } from "../../../src/embedded/rpc.ts";
import { LogFormat, LogLevel } from "../../../src/runtime/logging.ts";
import {
  type BrokerAddress,
  defaultWorkerSettings,
  deliveryPolicyOf,
  EMBEDDED_BROKER_MESSAGE_PORT,
  FLOW_SPECS_PATH_ENV,
  MAX_ENV_ENTRY_BYTES,
  paramsBySpecsFile,
  paramsFromSpecsFile,
  parentReplicasFromEnv,
  parseWorkerConfig,
  type WorkerConfig,
  workerConfigFor,
  workerConfigToEnv,
  type WorkerEnv,
  workerEnvFor,
  WorkerEnvVar,
  type WorkerSettings,
} from "../../../src/runtime/worker_config.ts";
import { processorEnv } from "../../support/worker_env.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

export class Camera extends ProducerNode {
  next(): unknown {
    return END;
  }
}
export class Detect extends ProcessorNode {
  process(x: unknown): unknown {
    return x;
  }
}
export class Sink extends ConsumerNode {
  consume(): void {}
}

const MODULES = new ModuleIndex().add(import.meta.url, { Camera, Detect, Sink });
const SECRET = "0123456789abcdef0123456789abcdef";
/** A fault schedule document (what `FaultSchedule.toEnv` writes): crash before process(). */
const CRASH_SCHEDULE = JSON.stringify({
  version: 1,
  actions: { [Barrier.nodeProcessBefore]: { kind: "crash", exit_code: 137 } },
});

/** A flow with a partitioned GPU node, a join with a policy, delivery overrides and two sinks. */
function compiledFlow(flowType: FlowType): NodeSpec[] {
  const cam = new Camera({ name: "cam" });
  const mic = new Camera({ name: "mic", isFinite: false });
  const detect = new Detect({
    name: "detect",
    nbTasks: 3,
    partitionBy: "trace_id",
    deviceType: "gpu",
    gpuCount: 2,
  }).from(cam);
  const fuse = new Detect({
    name: "fuse",
    joinPolicy: new JoinPolicy({ missing: "drop", timeoutSeconds: 2 }),
    delivery: "at-least-once",
    onError: "poison",
  }).from(detect, mic);
  const sinks = [
    new Sink({ name: "rows", idempotent: true }).from(fuse),
    new Sink({ name: "meta", metadata: true, onError: "worker_fatal" }).from(fuse, detect),
  ];
  return compileFlow(new Flow(sinks, { flowType, flowId: "traffic" }), { modules: MODULES });
}

/** The required variables of a processor, and nothing else. */
function minimalEnv(): Record<string, string> {
  return processorEnv(`${import.meta.url}#Detect`, { VF_NATS_URL: "nats://nats.videoflow:4222" });
}

function configError(env: WorkerEnv): ConfigError {
  try {
    parseWorkerConfig(env);
  } catch (error) {
    assert.ok(error instanceof ConfigError, `expected a ConfigError, got ${error}`);
    return error;
  }
  throw new assert.AssertionError({ message: `parsed without error: ${JSON.stringify(env)}` });
}

const GRANT = {
  workloadId: "traffic/detect/0",
  devices: [
    deviceIdentity({
      node: "gpu-1",
      ordinal: 0,
      uuid: "GPU-1",
      migUuid: null,
      product: "H200",
      memoryBytes: 1024,
      migProfile: null,
    }),
  ],
  exclusive: true,
  requested: 1,
  policy: "whole",
  host: GrantHost.observed,
};

/** A value other than the default for every setting. */
function everySetting(): WorkerSettings {
  return {
    replicaSlots: 8,
    runtimeStoreUrl: "file:///var/lib/videoflow",
    partitionLeaseSeconds: 4.5,
    reconcileIntervalSeconds: 0,
    ackWaitSeconds: 30,
    maxRetries: 7,
    eosQuiescenceMs: 250,
    prefetchBytes: 1 << 20,
    outputBufferBytes: 1 << 22,
    envelopeVersion: 4,
    blobStoreUrl: "redis://:pw@redis:6379/0",
    blobTtlSeconds: 120,
    maxInlinePayloadBytes: 1024,
    gpuGrant: GRANT,
    breakerThreshold: 0,
    progressTimeoutSeconds: 0,
    watchdogIntervalSeconds: 0,
    terminationLog: "/tmp/termination",
    profileRequests: [new ProfileRequest("detect", "reliable_work")],
    admissionTimeoutSeconds: 5,
    maxStreams: 100,
    maxConsumers: 400,
    logging: { format: LogFormat.json, level: LogLevel.debug },
    healthPort: null,
    faultScheduleJson: CRASH_SCHEDULE,
    faultMarkerDir: "/tmp/markers",
  };
}

Deno.test("the required variables alone give every default the spec names", () => {
  const config = parseWorkerConfig(minimalEnv());
  assert.deepEqual(config, {
    ...defaultWorkerSettings(FlowType.realtime),
    nodeClass: `${import.meta.url}#Detect`,
    nodeParams: { name: "detect" },
    nodeKind: "processor",
    nodeName: "detect",
    parentNames: ["cam"],
    hasChildren: true,
    nbTasks: 1,
    partitionBy: null,
    joinPolicy: null,
    delivery: null,
    onError: null,
    flowId: "traffic",
    flowType: "realtime",
    runId: "r-1",
    replicaId: null,
    broker: { kind: "nats", url: "nats://nats.videoflow:4222" },
    parentReplicas: {},
    blobReaders: null,
    blobReaderIds: [],
    gpuCount: null,
    gpuResourceName: null,
  });
  assert.deepEqual(defaultWorkerSettings(FlowType.realtime), {
    replicaSlots: null,
    runtimeStoreUrl: "memory://",
    partitionLeaseSeconds: 10,
    reconcileIntervalSeconds: 60,
    ackWaitSeconds: 60,
    maxRetries: 3,
    eosQuiescenceMs: 500,
    prefetchBytes: null,
    outputBufferBytes: null,
    envelopeVersion: 4,
    blobStoreUrl: null,
    blobTtlSeconds: 3600,
    maxInlinePayloadBytes: 512 * 1024,
    gpuGrant: null,
    breakerThreshold: 10,
    progressTimeoutSeconds: 300,
    watchdogIntervalSeconds: 5,
    terminationLog: "/dev/termination-log",
    profileRequests: [],
    admissionTimeoutSeconds: 60,
    maxStreams: null,
    maxConsumers: null,
    logging: { format: "human", level: "info" },
    healthPort: 8080,
    faultScheduleJson: null,
    faultMarkerDir: null,
  });
  assert.equal(parseWorkerConfig({ ...minimalEnv(), VF_FLOW_TYPE: "batch" }).blobTtlSeconds, 86400);
});

Deno.test("every variable the spec lists is read into its field", () => {
  const env: Record<string, string> = {
    ...minimalEnv(),
    VF_PARENT_NAMES: "cam,mic",
    VF_HAS_CHILDREN: "0",
    VF_REPLICA_ID: "2",
    VF_REPLICA_SLOTS: "6",
    VF_ACK_WAIT_SECONDS: "12.5",
    VF_MAX_RETRIES: "0",
    VF_EOS_QUIESCENCE_MS: "0",
    VF_NB_TASKS: "3",
    VF_PARTITION_BY: "camera_id",
    VF_JOIN_POLICY_JSON: JSON.stringify(new JoinPolicy({ missing: "wait" }).toDict()),
    VF_BLOB_REDIS_URL: "redis://redis:6379",
    VF_PREFETCH_BYTES: "65536",
    VF_RUNTIME_STORE_URL: "file:///state",
    VF_PARENT_REPLICAS: "3,1",
    VF_BLOB_READER_IDS: "sink,fuse/p0",
    VF_BLOB_READERS: "2",
    VF_BLOB_TTL_SECONDS: "90",
    VF_GPU_COUNT: "2",
    VF_GPU_RESOURCE_NAME: "nvidia.com/mig-1g.18gb",
    VF_GPU_GRANT_JSON: JSON.stringify(deliveredGrantToDict(GRANT)),
    VF_DELIVERY: "best-effort",
    VF_ON_ERROR: "worker_fatal",
    VF_BREAKER_THRESHOLD: "0",
    VF_PROGRESS_TIMEOUT_SECONDS: "0",
    VF_PROFILE_REQUESTS_JSON: '[{"channel":"cam","profile":"live_latest"}]',
    VF_ADMISSION_TIMEOUT_SECONDS: "7",
    VF_WATCHDOG_INTERVAL_SECONDS: "0.5",
    VF_TERMINATION_LOG: "/tmp/why",
    VF_PARTITION_LEASE_SECONDS: "3",
    VF_RECONCILE_INTERVAL_SECONDS: "0",
    VF_MAX_STREAMS: "50",
    VF_MAX_CONSUMERS: "60",
    VF_STRUCTURED_LOGS: "1",
    VF_LOG_LEVEL: "warn",
    VF_HEALTH_PORT: "0",
    VF_FAULT_SCHEDULE_JSON: CRASH_SCHEDULE,
    VF_FAULT_MARKER_DIR: "/tmp/m",
    VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES: "2048",
  };
  const config = parseWorkerConfig(env);
  assert.deepEqual(config.parentNames, ["cam", "mic"]);
  assert.equal(config.hasChildren, false);
  assert.equal(config.replicaId, 2);
  assert.equal(config.replicaSlots, 6);
  assert.equal(config.ackWaitSeconds, 12.5);
  assert.equal(config.maxRetries, 0);
  assert.equal(config.eosQuiescenceMs, 0);
  assert.equal(config.nbTasks, 3);
  assert.equal(config.partitionBy, "camera_id");
  assert.deepEqual(config.joinPolicy, new JoinPolicy({ missing: "wait" }));
  assert.equal(config.blobStoreUrl, "redis://redis:6379");
  assert.equal(config.prefetchBytes, 65536);
  assert.equal(config.runtimeStoreUrl, "file:///state");
  assert.deepEqual(config.parentReplicas, { cam: 3, mic: 1 });
  assert.deepEqual(config.blobReaderIds, ["sink", "fuse/p0"]);
  assert.equal(config.blobReaders, 2);
  assert.equal(config.blobTtlSeconds, 90);
  assert.equal(config.gpuCount, 2);
  assert.equal(config.gpuResourceName, "nvidia.com/mig-1g.18gb");
  assert.deepEqual(config.gpuGrant, GRANT);
  assert.equal(config.envelopeVersion, 4);
  assert.equal(config.delivery, "best-effort");
  assert.equal(config.onError, "worker_fatal");
  assert.equal(config.breakerThreshold, 0);
  assert.equal(config.progressTimeoutSeconds, 0);
  assert.deepEqual(config.profileRequests, [new ProfileRequest("cam", "live_latest")]);
  assert.equal(config.admissionTimeoutSeconds, 7);
  assert.equal(config.watchdogIntervalSeconds, 0.5);
  assert.equal(config.terminationLog, "/tmp/why");
  assert.equal(config.partitionLeaseSeconds, 3);
  assert.equal(config.reconcileIntervalSeconds, 0);
  assert.equal(config.maxStreams, 50);
  assert.equal(config.maxConsumers, 60);
  assert.deepEqual(config.logging, { format: "json", level: "warn" });
  assert.equal(config.healthPort, null);
  assert.equal(config.faultScheduleJson, env.VF_FAULT_SCHEDULE_JSON);
  assert.equal(config.faultMarkerDir, "/tmp/m");
  assert.equal(config.maxInlinePayloadBytes, 2048);
  assert.deepEqual(workerConfigToEnv(config), env, "written back, the environment is the same");
});

Deno.test("each missing required variable is named, with its remedy, all in one error", () => {
  const required = [
    "VF_NODE_CLASS",
    "VF_NODE_PARAMS_JSON",
    "VF_NODE_KIND",
    "VF_NODE_NAME",
    "VF_HAS_CHILDREN",
    "VF_FLOW_ID",
    "VF_FLOW_TYPE",
    "VF_RUN_ID",
  ];
  for (const name of required) {
    for (const value of [undefined, ""]) {
      const env: Record<string, string | undefined> = { ...minimalEnv(), [name]: value };
      const error = configError(env);
      assert.match(error.message, new RegExp(`^${name} is not set`), name);
      assert.equal(error.context.variable, name);
      assert.ok(error.remedy !== null && error.remedy.length > 0, name);
    }
  }
  const error = configError({ VF_NATS_URL: "nats://n:4222" });
  assert.match(error.message, /has 8 problems/);
  for (const name of required) assert.ok(error.message.includes(name), name);
  assert.deepEqual(error.context.variables, required, "listed in the order they are read");
});

Deno.test("a malformed value is a ConfigError that names its variable", () => {
  const cases: Array<[string, string]> = [
    ["VF_NODE_CLASS", "Detect"],
    ["VF_NODE_PARAMS_JSON", "[1, 2]"],
    ["VF_NODE_PARAMS_JSON", "{name"],
    ["VF_NODE_KIND", "sink"],
    ["VF_PARENT_NAMES", "cam,,mic"],
    ["VF_PARENT_NAMES", "cam, mic"],
    ["VF_HAS_CHILDREN", "yes"],
    ["VF_FLOW_TYPE", "streaming"],
    ["VF_REPLICA_ID", "-1"],
    ["VF_REPLICA_ID", "one"],
    ["VF_REPLICA_SLOTS", "0"],
    ["VF_ACK_WAIT_SECONDS", "0"],
    ["VF_ACK_WAIT_SECONDS", "1m"],
    ["VF_MAX_RETRIES", "2.5"],
    ["VF_EOS_QUIESCENCE_MS", "-3"],
    ["VF_NB_TASKS", "0"],
    ["VF_JOIN_POLICY_JSON", '{"missing":"sometimes"}'],
    ["VF_BLOB_REDIS_URL", "redis-host"],
    ["VF_PREFETCH_BYTES", "0"],
    ["VF_RUNTIME_STORE_URL", "state"],
    ["VF_PARENT_REPLICAS", "2,2"],
    ["VF_PARENT_REPLICAS", "x"],
    ["VF_BLOB_READER_IDS", "sink,sink"],
    ["VF_BLOB_READERS", "-1"],
    ["VF_BLOB_TTL_SECONDS", "0"],
    ["VF_GPU_COUNT", "0"],
    ["VF_GPU_GRANT_JSON", '{"workload_id":1}'],
    ["VF_ENVELOPE_VERSION", "3"],
    ["VF_DELIVERY", "exactly-once"],
    ["VF_ON_ERROR", "ignore"],
    ["VF_BREAKER_THRESHOLD", "-1"],
    ["VF_PROGRESS_TIMEOUT_SECONDS", "-5"],
    ["VF_PROFILE_REQUESTS_JSON", "{}"],
    ["VF_ADMISSION_TIMEOUT_SECONDS", "0"],
    ["VF_WATCHDOG_INTERVAL_SECONDS", "-1"],
    ["VF_PARTITION_LEASE_SECONDS", "0"],
    ["VF_RECONCILE_INTERVAL_SECONDS", "-1"],
    ["VF_MAX_STREAMS", "0"],
    ["VF_MAX_CONSUMERS", "many"],
    ["VF_STRUCTURED_LOGS", "maybe"],
    ["VF_HEALTH_PORT", "70000"],
    ["VF_FAULT_SCHEDULE_JSON", '{"version":1,"actions":{"no.such.barrier":{"kind":"crash"}}}'],
    ["VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES", "1.5"],
    ["VF_NATS_URL", "http://nats:4222"],
  ];
  for (const [name, value] of cases) {
    const error = configError({ ...minimalEnv(), [name]: value });
    assert.equal(error.context.variable, name, `${name}=${value}: ${error.message}`);
  }
});

Deno.test("VF_PARENT_REPLICAS aligns with VF_PARENT_NAMES and refuses a count mismatch", () => {
  assert.deepEqual(parentReplicasFromEnv(["a", "b"], undefined), {});
  assert.deepEqual(parentReplicasFromEnv(["a", "b"], ""), {});
  assert.deepEqual(parentReplicasFromEnv(["a", "b"], "3,0"), { a: 3, b: 0 });
  assert.throws(() => parentReplicasFromEnv(["a", "b"], "3"), ConfigError);
  assert.throws(() => parentReplicasFromEnv([], "1"), ConfigError);
  assert.throws(() => parentReplicasFromEnv(["a"], "1.5"), ConfigError);
  assert.throws(() => parentReplicasFromEnv(["a"], " 1"), ConfigError);
});

Deno.test("the broker is NATS or the embedded one, never both, never neither", () => {
  const { VF_NATS_URL: _nats, ...noBroker } = minimalEnv();
  assert.deepEqual(parseWorkerConfig({ ...minimalEnv(), VF_NATS_URL: "nats://a:4222,tls://b:4222" }).broker, {
    kind: "nats",
    url: "nats://a:4222,tls://b:4222",
  });
  assert.deepEqual(
    parseWorkerConfig({
      ...noBroker,
      VF_EMBEDDED_BROKER: "tcp://127.0.0.1:40123",
      VF_EMBEDDED_BROKER_SECRET: SECRET,
    }).broker,
    { kind: "embedded-tcp", hostname: "127.0.0.1", port: 40123, secret: SECRET },
  );
  assert.deepEqual(
    parseWorkerConfig({ ...noBroker, VF_EMBEDDED_BROKER: EMBEDDED_BROKER_MESSAGE_PORT }).broker,
    {
      kind: "embedded-port",
    },
  );
  assert.match(configError(noBroker).message, /VF_NATS_URL or VF_EMBEDDED_BROKER is not set/);
  assert.match(
    configError({ ...minimalEnv(), VF_EMBEDDED_BROKER: EMBEDDED_BROKER_MESSAGE_PORT }).message,
    /both VF_NATS_URL and VF_EMBEDDED_BROKER/,
  );
  const short = configError({
    ...noBroker,
    VF_EMBEDDED_BROKER: "tcp://127.0.0.1:1",
    VF_EMBEDDED_BROKER_SECRET: "abc",
  });
  assert.equal(short.context.variable, EMBEDDED_BROKER_SECRET_ENV);
  assert.ok(!short.render().includes("abc"), "a secret never reaches an error");
  for (
    const address of ["tcp://10.0.0.5:4000", "tcp://127.0.0.1:0", "tcp://127.0.0.1", "udp://127.0.0.1:9"]
  ) {
    const error = configError({
      ...noBroker,
      VF_EMBEDDED_BROKER: address,
      VF_EMBEDDED_BROKER_SECRET: SECRET,
    });
    assert.equal(error.context.variable, EMBEDDED_BROKER_ENV, address);
  }
  const leaked = configError({ ...minimalEnv(), VF_NATS_URL: "http://user:hunter2@nats:4222" });
  assert.ok(!leaked.render().includes("hunter2"), "a URL's credential never reaches an error");
});

Deno.test("the node's kind, parents, name and replica id must agree", () => {
  const producer = { ...minimalEnv(), VF_NODE_KIND: "producer" };
  assert.match(configError(producer).message, /is a producer, but VF_PARENT_NAMES names parents/);
  assert.equal(parseWorkerConfig({ ...producer, VF_PARENT_NAMES: "" }).parentNames.length, 0);
  assert.match(configError({ ...minimalEnv(), VF_PARENT_NAMES: "" }).message, /names no parent/);
  assert.match(
    configError({ ...minimalEnv(), VF_NODE_PARAMS_JSON: '{"name":"other"}' }).message,
    /names the node other/,
  );
  assert.match(
    configError({ ...minimalEnv(), VF_REPLICA_ID: "1" }).message,
    /beyond the node's 1 replica slot/,
  );
  assert.equal(
    parseWorkerConfig({ ...minimalEnv(), VF_REPLICA_ID: "4", VF_REPLICA_SLOTS: "5" }).replicaId,
    4,
  );
});

Deno.test("workerEnvFor round-trips through parseWorkerConfig for every spec of a compiled flow", () => {
  const brokers: BrokerAddress[] = [
    { kind: "nats", url: "nats://nats:4222" },
    { kind: "embedded-tcp", hostname: "127.0.0.1", port: 41000, secret: SECRET },
    { kind: "embedded-port" },
  ];
  for (const flowType of [FlowType.realtime, FlowType.batch]) {
    const specs = compiledFlow(flowType);
    for (const spec of specs) {
      for (const replica of [null, ...Array.from({ length: spec.nbTasks }, (_, i) => i)]) {
        for (const [i, broker] of brokers.entries()) {
          const extra = i === 0 ? {} : everySetting();
          const args = [
            spec,
            specs,
            { flowId: "traffic", flowType },
            { runId: "r-9", broker },
            replica,
            extra,
          ] as const;
          const expected = workerConfigFor(...args);
          const where = `${flowType} ${spec.name} replica ${replica} broker ${broker.kind}`;
          assert.deepEqual(parseWorkerConfig(workerEnvFor(...args)), expected, where);
        }
      }
    }
  }
});

Deno.test("workerEnvFor writes the spec's wiring: parents, replicas, reader ids, GPU and overrides", () => {
  const specs = compiledFlow(FlowType.batch);
  const byName = new Map(specs.map((spec) => [spec.name, spec]));
  const flow = { flowId: "traffic", flowType: FlowType.batch };
  const run = { runId: "r-1", broker: { kind: "nats", url: "nats://n:4222" } as const };
  const cam = workerEnvFor(byName.get("cam")!, specs, flow, run, 0);
  assert.equal(cam.VF_NODE_KIND, "producer");
  assert.equal(cam.VF_PARENT_NAMES, undefined);
  assert.equal(cam.VF_BLOB_READER_IDS, "detect/p0,detect/p1,detect/p2");
  assert.equal(cam.VF_BLOB_READERS, "3");
  assert.equal(cam.VF_HAS_CHILDREN, "1");
  assert.equal(cam.VF_REPLICA_ID, "0");
  const detect = workerEnvFor(byName.get("detect")!, specs, flow, run, 2);
  assert.equal(detect.VF_NB_TASKS, "3");
  assert.equal(detect.VF_PARTITION_BY, "trace_id");
  assert.equal(detect.VF_GPU_COUNT, "2");
  assert.equal(detect.VF_PARENT_REPLICAS, "1");
  assert.equal(detect.VF_BLOB_READER_IDS, "fuse,meta");
  const fuse = workerEnvFor(byName.get("fuse")!, specs, flow, run, null);
  assert.equal(fuse.VF_PARENT_NAMES, "detect,mic");
  assert.equal(fuse.VF_PARENT_REPLICAS, "3,1");
  assert.equal(fuse.VF_GPU_COUNT, undefined);
  assert.equal(fuse.VF_REPLICA_ID, undefined, "no replica id: the replica claims a slot");
  assert.deepEqual(
    JSON.parse(fuse.VF_JOIN_POLICY_JSON),
    new JoinPolicy({ missing: "drop", timeoutSeconds: 2 }).toDict(),
  );
  assert.equal(fuse.VF_DELIVERY, "at-least-once");
  assert.equal(fuse.VF_ON_ERROR, "poison");
  const meta = workerEnvFor(byName.get("meta")!, specs, flow, run, 0);
  assert.equal(meta.VF_ON_ERROR, "worker_fatal");
  assert.equal(meta.VF_DELIVERY, undefined);
  assert.equal(meta.VF_HAS_CHILDREN, "0");
  assert.equal(meta.VF_BLOB_READER_IDS, undefined);
  assert.deepEqual(JSON.parse(meta.VF_NODE_PARAMS_JSON), byName.get("meta")!.params);
  assert.equal(meta.VF_NODE_CLASS, `${import.meta.url}#Sink`);
});

Deno.test("every worker variable of the spec is written for a config that sets it", () => {
  const specs = compiledFlow(FlowType.realtime);
  const detect = specs.find((spec) => spec.name === "detect")!;
  detect.gpuResourceName = "nvidia.com/gpu";
  const config: WorkerConfig = {
    ...workerConfigFor(
      detect,
      specs,
      { flowId: "traffic", flowType: FlowType.realtime },
      { runId: "r-1", broker: { kind: "nats", url: "nats://n:4222" } },
      1,
      everySetting(),
    ),
    joinPolicy: new JoinPolicy({ missing: "wait" }),
    delivery: "best-effort",
    onError: "transient",
  };
  const env = workerConfigToEnv(config);
  const specVariables = [
    "VF_NODE_CLASS",
    "VF_NODE_PARAMS_JSON",
    "VF_NODE_KIND",
    "VF_NODE_NAME",
    "VF_PARENT_NAMES",
    "VF_HAS_CHILDREN",
    "VF_NATS_URL",
    "VF_FLOW_ID",
    "VF_FLOW_TYPE",
    "VF_RUN_ID",
    "VF_REPLICA_ID",
    "VF_REPLICA_SLOTS",
    "VF_ACK_WAIT_SECONDS",
    "VF_MAX_RETRIES",
    "VF_EOS_QUIESCENCE_MS",
    "VF_NB_TASKS",
    "VF_PARTITION_BY",
    "VF_JOIN_POLICY_JSON",
    "VF_BLOB_REDIS_URL",
    "VF_FAULT_SCHEDULE_JSON",
    "VF_FAULT_MARKER_DIR",
    "VF_PREFETCH_BYTES",
    "VF_RUNTIME_STORE_URL",
    "VF_PARENT_REPLICAS",
    "VF_BLOB_READER_IDS",
    "VF_BLOB_READERS",
    "VF_BLOB_TTL_SECONDS",
    "VF_GPU_COUNT",
    "VF_GPU_RESOURCE_NAME",
    "VF_GPU_GRANT_JSON",
    "VF_DELIVERY",
    "VF_ON_ERROR",
    "VF_BREAKER_THRESHOLD",
    "VF_PROGRESS_TIMEOUT_SECONDS",
    "VF_PROFILE_REQUESTS_JSON",
    "VF_ADMISSION_TIMEOUT_SECONDS",
    "VF_WATCHDOG_INTERVAL_SECONDS",
    "VF_TERMINATION_LOG",
    "VF_PARTITION_LEASE_SECONDS",
    "VF_RECONCILE_INTERVAL_SECONDS",
    "VF_MAX_STREAMS",
    "VF_MAX_CONSUMERS",
    "VF_STRUCTURED_LOGS",
  ];
  for (const name of Object.values(WorkerEnvVar)) {
    assert.ok(
      [...specVariables, "VF_ENVELOPE_VERSION"].includes(name),
      `${name} is not a worker variable of the spec`,
    );
  }
  const absent = specVariables.filter((name) => env[name] === undefined);
  assert.deepEqual(absent, [], "a variable the spec lists was not written");
  assert.deepEqual(parseWorkerConfig(env), config);
  assert.equal(workerConfigToEnv({ ...config, envelopeVersion: 4 }).VF_ENVELOPE_VERSION, undefined);
});

Deno.test("randomized: any valid config survives workerConfigToEnv and parseWorkerConfig", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const name = () => random.pick(["cam", "mic", "lidar", "radar", "det"]) + random.int(0, 99);
  for (let round = 0; round < 200; round++) {
    const flowType = random.pick([FlowType.realtime, FlowType.batch]);
    const kind = random.pick(["producer", "processor", "consumer"] as const);
    const parents = kind === "producer" ? [] : [...new Set(Array.from({ length: random.int(1, 3) }, name))];
    const nbTasks = random.int(1, 4);
    const slots = random.chance(0.5) ? null : nbTasks + random.int(0, 3);
    const defaults = defaultWorkerSettings(flowType);
    const maybe = <T>(value: T, otherwise: T): T => random.chance(0.5) ? value : otherwise;
    const config: WorkerConfig = {
      ...defaults,
      nodeClass: `file:///app/flow.ts#N${random.int(0, 9)}`,
      nodeParams: maybe<JsonObject>({ name: "node", threshold: random.int(0, 9) }, {}),
      nodeKind: kind,
      nodeName: "node",
      parentNames: parents,
      hasChildren: kind !== "consumer" && random.chance(0.8),
      nbTasks,
      partitionBy: maybe("trace_id", null),
      joinPolicy: maybe(new JoinPolicy({ missing: random.pick(["drop", "wait", "error"] as const) }), null),
      delivery: maybe(random.pick(["at-least-once", "best-effort"] as const), null),
      onError: maybe(random.pick(["poison", "transient", "worker_fatal"] as const), null),
      flowId: `flow-${random.int(0, 9)}`,
      flowType,
      runId: `run-${random.int(0, 9)}`,
      replicaId: maybe(random.int(0, (slots ?? nbTasks) - 1), null),
      replicaSlots: slots,
      broker: random.pick<BrokerAddress>([
        { kind: "nats", url: `nats://n${random.int(0, 9)}:4222` },
        { kind: "embedded-tcp", hostname: "127.0.0.1", port: random.int(1, 65535), secret: SECRET },
        { kind: "embedded-port" },
      ]),
      parentReplicas: maybe(Object.fromEntries(parents.map((p) => [p, random.int(0, 4)])), {}),
      ackWaitSeconds: maybe(random.int(1, 600) / 4, defaults.ackWaitSeconds),
      maxRetries: random.int(0, 9),
      eosQuiescenceMs: random.int(0, 2000),
      prefetchBytes: maybe(random.int(1, 1 << 24), null),
      outputBufferBytes: maybe(random.int(1, 1 << 26), null),
      blobReaders: maybe(random.int(0, 5), null),
      blobReaderIds: maybe([name(), `${name()}/p${random.int(0, 3)}`], []),
      blobTtlSeconds: maybe(random.int(1, 100000), defaults.blobTtlSeconds),
      gpuCount: maybe(random.int(1, 8), null),
      gpuResourceName: maybe("nvidia.com/gpu", null),
      breakerThreshold: random.int(0, 20),
      progressTimeoutSeconds: random.int(0, 600),
      watchdogIntervalSeconds: random.int(0, 10),
      healthPort: maybe(random.int(1, 65535), null),
      logging: {
        format: random.pick([LogFormat.human, LogFormat.json]),
        level: random.pick([LogLevel.debug, LogLevel.info, LogLevel.warn, LogLevel.error]),
      },
    };
    const env = workerConfigToEnv(config);
    assert.deepEqual(parseWorkerConfig(env), config, `seed ${seed}, round ${round}: ${JSON.stringify(env)}`);
  }
});

Deno.test("workerConfigFor refuses what a worker's environment cannot carry", () => {
  const specs = compiledFlow(FlowType.realtime);
  const flow = { flowId: "traffic", flowType: FlowType.realtime };
  const run = { runId: "r", broker: { kind: "embedded-port" } as const };
  const fuse = specs.find((spec) => spec.name === "fuse")!;
  fuse.delivery = { delivery: "at-least-once", max_retries: 9 };
  assert.throws(
    () => workerConfigFor(fuse, specs, flow, run, 0),
    /max_retries, which only the deployment decides/,
  );
  const cam = specs.find((spec) => spec.name === "cam")!;
  cam.nodeClass = null;
  assert.throws(() => workerConfigFor(cam, specs, flow, run, 0), /native component/);
  const detect = specs.find((spec) => spec.name === "detect")!;
  assert.throws(() => workerConfigFor(detect, specs, flow, run, 3), /beyond the node's 3 replica slot/);
  assert.throws(() => workerConfigFor(detect, [detect], flow, run, 0), /not in the specs/);
  const config = parseWorkerConfig({ ...minimalEnv(), VF_PARENT_NAMES: "cam,mic" });
  assert.throws(() => workerConfigToEnv({ ...config, parentReplicas: { cam: 1 } }), /every parent or none/);
  assert.throws(
    () => workerConfigToEnv({ ...config, parentReplicas: { cam: 1, mic: 1, x: 2 } }),
    /every parent or none/,
  );
  assert.throws(
    () => workerConfigToEnv({ ...config, parentNames: ["a,b"] }),
    /cannot be listed in VF_PARENT_NAMES/,
  );
});

Deno.test("deliveryPolicyOf combines the flow preset, the node's overrides and VF_MAX_RETRIES", () => {
  const realtime = parseWorkerConfig(minimalEnv());
  assert.deepEqual(deliveryPolicyOf(realtime).toDict(), {
    delivery: "best-effort",
    max_retries: 0,
    dlq: "sampled",
    on_error: null,
    sample_per_minute: 5,
  });
  const sink = parseWorkerConfig({
    ...minimalEnv(),
    VF_DELIVERY: "at-least-once",
    VF_ON_ERROR: "poison",
    VF_MAX_RETRIES: "5",
  });
  assert.deepEqual(deliveryPolicyOf(sink).toDict(), {
    delivery: "at-least-once",
    max_retries: 5,
    dlq: "full",
    on_error: "poison",
    sample_per_minute: 5,
  });
});

Deno.test("params too long for one environment entry move to the specs document and come back from it as they were", async () => {
  const specs = compiledFlow(FlowType.batch);
  const detect = specs.find((spec) => spec.name === "detect")!;
  const big = NodeSpec.fromDict({
    ...detect.toDict(),
    params: { ...detect.params, table: "t".repeat(MAX_ENV_ENTRY_BYTES) },
  });
  const all = specs.map((spec) => spec === detect ? big : spec);
  const dir = await Deno.makeTempDir();
  try {
    const path = `${dir}/specs.json`;
    await Deno.writeTextFile(path, JSON.stringify(all.map((spec) => spec.toDict())));
    const run = { runId: "r", broker: { kind: "embedded-port" as const } };
    const env = workerEnvFor(big, all, { flowId: "traffic", flowType: FlowType.batch }, run, 0);
    const moved = paramsBySpecsFile(env, path);
    assert.equal(moved[WorkerEnvVar.nodeParams], undefined);
    assert.equal(moved[FLOW_SPECS_PATH_ENV], path);
    assert.ok(
      Object.entries(moved).every(([name, value]) => name.length + value.length + 2 <= MAX_ENV_ENTRY_BYTES),
    );
    assert.deepEqual(parseWorkerConfig(await paramsFromSpecsFile(moved)), parseWorkerConfig(env));
    const small = workerEnvFor(detect, specs, { flowId: "traffic", flowType: FlowType.batch }, run, 0);
    assert.deepEqual(paramsBySpecsFile(small, path), small, "params that fit stay in the environment");
    assert.equal(await paramsFromSpecsFile(small), small);
    await assert.rejects(
      paramsFromSpecsFile({ ...moved, [WorkerEnvVar.nodeName]: "nobody" }),
      (error: unknown) => error instanceof ConfigError && /has no node "nobody"/.test(error.message),
    );
    await assert.rejects(
      paramsFromSpecsFile({ ...moved, [FLOW_SPECS_PATH_ENV]: `${dir}/missing.json` }),
      (error: unknown) => (error as { code?: string }).code === "VF_RESOURCE_UNAVAILABLE",
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
