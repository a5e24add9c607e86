/**
 * The one entry that runs exactly one replica of one node (spec runtime.worker), configured only by its
 * `VF_*` environment, whether it lives in a Deno Worker of the local engine, a `deno run` subprocess, or
 * (later) a Kubernetes pod. It rebuilds the node from its spec, verifies the node's assets and GPU grant,
 * builds the ledger, the broker clients and the messenger, opens the node, runs its task loop and closes
 * it in every case; it resolves with the process exit status the outcome maps to (0, 2, 3, 4, 5, or 143
 * after a quiesce), writing the termination reason for any failure.
 *
 * @module
 */

import { RuntimeContext } from "../core/context.ts";
import { DeliveryPolicy } from "../core/delivery_policy.ts";
import { asRuntimeError, ConfigError, exitCodeOf, VideoflowError } from "../core/errors.ts";
import { Metric } from "../core/metrics.ts";
import { pendingObservationOf } from "../core/messenger.ts";
import { ConsumerNode, type Node, ProducerNode, ReceiverNode } from "../core/node.ts";
import { rebuildNode } from "../core/node_class.ts";
import { PartitionKeyPolicy } from "../core/partition_key_policy.ts";
import { ConsecutiveFailureBreaker, ProgressDeadline } from "../core/supervision.ts";
import { createTask, type InputCallWatch, type TaskOutcome } from "../core/task.ts";
import { installFromEnv } from "../backends/faults.ts";
import { PROFILE_REQUESTS_ENV, RUNTIME_STORE_ENV } from "../backends/capabilities.ts";
import type { MessagingBackend } from "../backends/messaging.ts";
import type { PayloadStore } from "../backends/payload.ts";
import { claimReplicaSlot, FlowRuntime } from "../backends/runtime.ts";
import type { RuntimeStore } from "../backends/runtime_store.ts";
import { EmbeddedMessagingBackend } from "../embedded/messaging_backend.ts";
import { BrokerMessenger } from "../messaging/messenger.ts";
import { RuntimeObligationLedger } from "../messaging/obligations.ts";
import { defaultPrefetch } from "../messaging/topology.ts";
import { type EffectiveStream, verifyChannelProfiles } from "../messaging/stream_profiles.ts";
import type { Observation } from "../backends/outcomes.ts";
import { PayloadReconciler } from "./payload_reconciler.ts";
import { systemClock } from "../backends/clock.ts";
import { verifyNodeAssets } from "./assetcheck.ts";
import { EmbeddedConnection } from "../embedded/rpc.ts";
import { verifyNodeGrant } from "./gpucheck.ts";
import { EmbeddedPayloadStore } from "../embedded/payload_store.ts";
import { EmbeddedRuntimeStore } from "../embedded/runtime_store.ts";
import { HealthServer, type HealthSnapshot, HealthState } from "./health.ts";
import { InNodeBoard } from "./in_node_board.ts";
import { LedgerIdempotencyStore } from "./idempotency.ts";
import { configureLogging, type LogSink, type NodeLogger } from "./logging.ts";
import { openRuntimeStore } from "./runtime_stores.ts";
import type { RedisPayloadStore } from "./redis_payload.ts";
import { loadRedisModule } from "./redis_module.ts";
import { undeclaredPermission } from "../core/undeclared_permission.ts";
import { buildWatchdog, exitOnStall, writeTerminationReason } from "./watchdog.ts";
import { paramsFromSpecsFile, parseWorkerConfig, type WorkerConfig, WorkerEnvVar } from "./worker_config.ts";

/**
 * The run ledger URL that names the ledger the embedded broker serves: the local engine's file store, which
 * the supervisor owns and a sandboxed worker reaches only through its broker connection.
 */
export const EMBEDDED_RUNTIME_STORE_URL = "embedded://";

/** What a worker tells whoever started it, besides its exit status. */
export type WorkerReport =
  /**
   * Counters: every {@link REPORT_INTERVAL_SECONDS}, {@link REPORT_SOON_SECONDS} after they grow, once as
   * soon as the node opened, and once at the end.
   */
  | {
    readonly kind: "stats";
    readonly node: string;
    readonly replica: number;
    readonly processed: number;
    readonly failed: number;
    readonly published: number;
    readonly drops: Readonly<Record<string, number>>;
    /** Whether the node's `open()` returned: it takes (or makes) its first item now. */
    readonly ready: boolean;
    /** Everything its `/metrics` would export (`vf run-local --metrics` serves it for the whole run). */
    readonly metrics: HealthSnapshot;
  }
  /**
   * The deliveries inside the node now, by message id: sent as the node is handed an input group, and
   * (with none) as its call ends. A replica that dies with some inside has died of them (or with them): its
   * supervisor counts that death as a delivery of each.
   */
  | {
    readonly kind: "in_node";
    readonly messageIds: readonly string[];
  }
  /**
   * The replica ended: its exit status, for a failure the error record, and the end marker it published
   * (or relayed) to its children. A replica with children that ends with no marker leaves them waiting:
   * its supervisor must restart it or end the run; one that published ABORT has ended them already.
   * `streamEnded`: its stream had ended cleanly before it failed (in `close()`), so a restart would make
   * or take it all again.
   */
  | {
    readonly kind: "exit";
    readonly node: string;
    readonly replica: number;
    readonly code: number;
    readonly reason: unknown;
    readonly endMarker: EndMarker | null;
    readonly streamEnded: boolean;
  };

/** The end of stream a replica told its children about: a clean EOS or an ABORT. */
export const EndMarker = { eos: "eos", abort: "abort" } as const;
/** The end of stream a replica told its children about. */
export type EndMarker = typeof EndMarker[keyof typeof EndMarker];

/** Marks a subprocess's stdout line as a report (JSON follows); every other line is the node's own output. */
export const REPORT_LINE_PREFIX = "\u001evf-report ";

/**
 * The line the local engine writes to a process replica's stdin to quiesce it (its clean stop over
 * servers, where the broker keeps the streams); the end of stdin (the supervisor gone) asks the same.
 */
export const QUIESCE_LINE = "quiesce\n";

/** How often a running worker reports its counters, whether or not they changed. */
export const REPORT_INTERVAL_SECONDS = 0.5;
/** How soon after its counters grow a running worker reports them (one report for all that grew meanwhile). */
export const REPORT_SOON_SECONDS = 0.05;

/** Where a worker runs: how it reaches the broker and how it reports. */
export interface WorkerHost {
  /** The worker's environment (`VF_*`). */
  readonly env: Readonly<Record<string, string | undefined>>;
  /** The broker's MessagePort when the host is a Deno Worker of the local engine; else the env's address. */
  readonly port?: MessagePort;
  /** Receives the worker's reports; nothing by default. */
  readonly report?: (report: WorkerReport) => void;
  /**
   * Where the replica records the input group inside its node (an {@link InNodeBoard}'s buffer), when the
   * host reads it from shared memory; else `in_node` reports say it.
   */
  readonly inNodeBoard?: SharedArrayBuffer;
  /** Where log lines go (stderr by default). */
  readonly logSink?: LogSink;
  /**
   * Receives the replica's quiesce (RUN-030) once it can take one: it stops admitting input, hands back
   * at once what it holds outside the node, and keeps settling the group in hand; the promise resolves
   * once the hand-back landed. The host calls it on the supervisor's request or on SIGTERM.
   */
  readonly onQuiesce?: (quiesce: () => Promise<void>) => void;
  /**
   * Ends the replica at once with a status, after its exit report: the watchdog's way out of a `process()`
   * that never returns. `Deno.exit` by default (in a Deno Worker that ends the worker silently, so a
   * Worker host passes its own).
   */
  readonly exit?: (code: number) => void;
}

interface Services {
  readonly backend: MessagingBackend;
  readonly payloadStore: PayloadStore | null;
  readonly runtimeStore: RuntimeStore;
  close(): Promise<void>;
}

/**
 * Binds the operator's explicit channel profiles (`VF_PROFILE_REQUESTS_JSON`) to the streams this node
 * touches, its parents' and its own output's, before it opens (spec runtime.worker
 * `verify_explicit_profiles`, story 42): they are read back over a connection of their own, so nothing
 * reaches into the messenger; requests for other channels are other workers' to judge, and none at all
 * reads nothing.
 *
 * @throws IncompatibleProfile (exit 2) for a stream that contradicts its profile; BrokerUnavailable or
 * UnobservableState (exit 3) for one that does not exist or could not be read; ConfigError for requests
 * on the embedded broker, whose channels take the flow type's presets.
 */
async function verifyExplicitProfiles(config: WorkerConfig): Promise<void> {
  if (config.profileRequests.length === 0) return;
  if (config.broker.kind !== "nats") {
    throw new ConfigError(
      `${PROFILE_REQUESTS_ENV} is verified against NATS JetStream streams, and this worker's broker is the ` +
        "local engine's embedded one",
      `run the flow over --nats to require channel profiles, or leave ${PROFILE_REQUESTS_ENV} unset`,
      { variables: [PROFILE_REQUESTS_ENV] },
    );
  }
  const touched = new Set([...config.parentNames, ...(config.hasChildren ? [config.nodeName] : [])]);
  const requests = config.profileRequests.filter((request) => touched.has(request.channel));
  if (requests.length === 0) return;
  const { JetStreamMessagingBackend } = await import("../messaging/jetstream_backend.ts");
  const backend = await JetStreamMessagingBackend.connect({
    url: config.broker.url,
    connectTimeoutSeconds: config.admissionTimeoutSeconds,
  });
  const readBack = new Map<string, Observation<EffectiveStream>>();
  try {
    for (const channel of new Set(requests.map((request) => request.channel))) {
      readBack.set(
        channel,
        await backend.observeStreamConfig({ flowId: config.flowId, runId: config.runId, node: channel }),
      );
    }
  } finally {
    await backend.shutdown();
  }
  verifyChannelProfiles(readBack, requests, `worker ${config.nodeName}`);
}

/**
 * The payload store `VF_BLOB_REDIS_URL` names, whatever the broker: a Redis server shared by every
 * worker of the run.
 */
async function blobStoreOf(config: WorkerConfig): Promise<RedisPayloadStore | null> {
  if (config.blobStoreUrl === null) return null;
  const { RedisPayloadStore } = await loadRedisModule(() => import("./redis_payload.ts"));
  return RedisPayloadStore.open(config.blobStoreUrl);
}

/**
 * The services of a worker on a NATS JetStream broker: the broker itself, the payload store of
 * `VF_BLOB_REDIS_URL` (none: every payload rides inline) and the ledger `VF_RUNTIME_STORE_URL` names,
 * which must be one this process can open itself.
 */
async function connectNatsServices(config: WorkerConfig, url: string): Promise<Services> {
  if (config.runtimeStoreUrl === EMBEDDED_RUNTIME_STORE_URL) {
    throw new ConfigError(
      `${RUNTIME_STORE_ENV}=${EMBEDDED_RUNTIME_STORE_URL} names the local engine's ledger, which ` +
        `a worker on ${WorkerEnvVar.natsUrl} cannot reach`,
      `set ${RUNTIME_STORE_ENV} to redis://host:6379 (or file://DIR on one host)`,
      { variable: RUNTIME_STORE_ENV },
    );
  }
  const { JetStreamMessagingBackend } = await import("../messaging/jetstream_backend.ts");
  const runtimeStore = await openRuntimeStore(config.runtimeStoreUrl);
  const payloadStore = await blobStoreOf(config);
  let backend: MessagingBackend;
  try {
    backend = await JetStreamMessagingBackend.connect({
      url,
      run: { flowId: config.flowId, runId: config.runId },
      byteBudget: config.prefetchBytes,
    });
  } catch (error) {
    await payloadStore?.close();
    await runtimeStore.close();
    throw error;
  }
  return {
    backend,
    payloadStore,
    runtimeStore,
    close: async () => {
      await backend.shutdown();
      await payloadStore?.close();
      await runtimeStore.close();
    },
  };
}

async function connectServices(config: WorkerConfig, host: WorkerHost): Promise<Services> {
  if (config.broker.kind === "nats") return await connectNatsServices(config, config.broker.url);
  const connection = host.port !== undefined
    ? await EmbeddedConnection.connect(host.port, { label: `${config.nodeName}/${config.replicaId ?? "?"}` })
    : await EmbeddedConnection.fromEnv(host.env, `${config.nodeName}/${config.replicaId ?? "?"}`);
  const runtimeStore = config.runtimeStoreUrl === EMBEDDED_RUNTIME_STORE_URL
    ? new EmbeddedRuntimeStore(connection)
    : await openRuntimeStore(config.runtimeStoreUrl);
  const blobStore = await blobStoreOf(config);
  const payloadStore = blobStore ??
    new EmbeddedPayloadStore(connection, { transferPuts: host.port !== undefined });
  return {
    backend: new EmbeddedMessagingBackend(connection),
    payloadStore,
    runtimeStore,
    close: async () => {
      await blobStore?.close();
      if (config.runtimeStoreUrl !== EMBEDDED_RUNTIME_STORE_URL) await runtimeStore.close();
      await connection.close();
    },
  };
}

function runtimeFor(config: WorkerConfig, store: RuntimeStore): Promise<FlowRuntime> {
  const options = {
    store,
    flowId: config.flowId,
    runId: config.runId,
    node: config.nodeName,
    nbTasks: config.nbTasks,
    partitionBy: config.partitionBy,
    parentReplicas: config.parentReplicas,
    leaseSeconds: config.partitionLeaseSeconds,
  };
  return config.replicaId === null
    ? claimReplicaSlot({ ...options, slots: config.replicaSlots ?? config.nbTasks })
    : Promise.resolve(new FlowRuntime({ ...options, replicaId: config.replicaId }));
}

function partitionKeyPolicyOf(node: Node): PartitionKeyPolicy | null {
  const declared = node instanceof ReceiverNode ? node.partitionKeyPolicy : null;
  return declared === null ? null : PartitionKeyPolicy.fromDict(declared);
}

/** The end marker the task published to the replica's children, if it has any (see {@link WorkerReport}). */
function endMarkerOf(outcome: TaskOutcome, hasChildren: boolean): EndMarker | null {
  if (!hasChildren) return null;
  switch (outcome.kind) {
    case "finished":
      return EndMarker.eos;
    case "upstream_aborted":
      return EndMarker.abort;
    case "stopped":
      return null;
    case "failed":
      return outcome.abortPublished ? EndMarker.abort : outcome.streamEnded ? EndMarker.eos : null;
  }
}

function reasonOf(outcome: TaskOutcome): unknown {
  switch (outcome.kind) {
    case "finished":
    case "stopped":
      return null;
    case "upstream_aborted":
    case "failed":
      return outcome.error.toDict();
  }
}

/** A running replica's pieces, for reporting and the final exit. */
interface Running {
  readonly node: Node;
  readonly replica: number;
  readonly health: HealthState;
  readonly messenger: BrokerMessenger;
}

/**
 * How the replica tells its host which inputs are inside its node: on the host's board when it gave one,
 * else by `in_node` reports; not at all to a host that takes no reports.
 */
function inputCallWatch(host: WorkerHost, messenger: BrokerMessenger): InputCallWatch | null {
  if (host.inNodeBoard !== undefined) {
    const board = InNodeBoard.over(host.inNodeBoard);
    return { entered: () => board.write(messenger.currentMessageIds()), left: () => board.write([]) };
  }
  const report = host.report;
  if (report === undefined) return null;
  return {
    entered: () => report({ kind: "in_node", messageIds: messenger.currentMessageIds() }),
    left: () => report({ kind: "in_node", messageIds: [] }),
  };
}

function statsOf(running: Running): WorkerReport {
  const { health } = running;
  return {
    kind: "stats",
    node: running.node.name,
    replica: running.replica,
    processed: health.counter(Metric.processed),
    failed: health.counter(Metric.failed),
    published: health.counter(Metric.published),
    drops: health.dropsByReason(),
    ready: health.isReady(),
    metrics: health.snapshot(),
  };
}

async function runNode(config: WorkerConfig, host: WorkerHost, logger: NodeLogger): Promise<number> {
  await verifyExplicitProfiles(config);
  const node = await rebuildNode(config.nodeClass, config.nodeParams, config.nodeKind);
  await verifyNodeAssets(node);
  const grant = await verifyNodeGrant(node, { environ: host.env, grant: config.gpuGrant });
  if (grant !== null && grant.problems.length > 0) {
    const opens = grant.execution === "gpu" ? "opens on its GPUs" : 'opens under gpuFallback "cpu"';
    logger.warn(`node ${node.name} ${opens}: ${grant.problems.join("; ")}`, {
      execution: grant.execution,
      source: grant.source,
    });
  }
  const services = await connectServices(config, host);
  try {
    const runtime = await runtimeFor(config, services.runtimeStore);
    const replica = runtime.replicaId;
    const messenger = await BrokerMessenger.open({
      backend: services.backend,
      flowId: config.flowId,
      runId: config.runId,
      flowType: config.flowType,
      node: config.nodeName,
      parentNames: config.parentNames,
      replicaId: replica,
      nbTasks: config.nbTasks,
      partitionBy: config.partitionBy,
      partitionKeyPolicy: partitionKeyPolicyOf(node),
      joinPolicy: config.joinPolicy,
      orderingPolicy: node instanceof ReceiverNode ? node.orderingPolicy : null,
      deliveryPolicy: DeliveryPolicy.resolve(
        config.flowType,
        DeliveryPolicy.nodeOverride(config.delivery, config.onError),
        config.maxRetries,
      ),
      ackWaitSeconds: config.ackWaitSeconds,
      eosQuiescenceMs: config.eosQuiescenceMs,
      parentReplicas: config.parentReplicas,
      runtime,
      payloadStore: services.payloadStore,
      blobReaderIds: config.blobReaderIds,
      blobTtlSeconds: config.blobTtlSeconds,
      maxInlinePayloadBytes: config.maxInlinePayloadBytes,
      prefetch: (node instanceof ReceiverNode ? node.prefetch : null) ??
        defaultPrefetch(config.flowType, config.broker.kind === "nats"),
      prefetchBytes: config.prefetchBytes,
      inFlightBytes: config.outputBufferBytes ?? undefined,
      replayable: node instanceof ProducerNode && (node.constructor as typeof ProducerNode).replayable,
      analysisVersion: node instanceof ProducerNode
        ? (node.constructor as typeof ProducerNode).analysisVersion
        : null,
      logger,
    });
    const reconciler = services.payloadStore === null ? null : new PayloadReconciler({
      store: services.payloadStore,
      ledger: new RuntimeObligationLedger(runtime, services.backend, [
        ...config.parentNames,
        config.nodeName,
      ]),
      clock: systemClock,
      intervalSeconds: config.reconcileIntervalSeconds,
      operationPrefix: `reconcile:${config.nodeName}:${replica}:${crypto.randomUUID()}`,
      onPass: (pass) =>
        logger.info("payload reconcile pass", {
          reclaimed: pass.reclaimed.length,
          unknown: pass.unknown.length,
        }),
      onError: (error) => logger.warn(`a payload reconcile pass failed: ${String(error)}`),
    });
    reconciler?.start();
    // A replica says at once that its node opened (the local engine starts a realtime flow's producers
    // then), and reports its counts soon after they grow, so a replica killed mid-run leaves little uncounted.
    let soon: ReturnType<typeof setTimeout> | null = null;
    const reportSoon = () => {
      soon ??= setTimeout(() => {
        soon = null;
        report();
      }, REPORT_SOON_SECONDS * 1000);
    };
    const health = new HealthState(config.nodeName, { onReady: () => report(), onCount: reportSoon });
    const server = config.healthPort === null ? null : new HealthServer(health, { port: config.healthPort });
    server?.start();
    const running: Running = { node, replica, health, messenger };
    // The task moves the messenger's drops into `health` between inputs; a report moves what came since.
    const report = () => {
      for (const [reason, count] of Object.entries(messenger.takeDrops())) {
        if (count > 0) health.recordDrop(reason, count);
      }
      host.report?.(statsOf(running));
    };
    const reporter = setInterval(report, REPORT_INTERVAL_SECONDS * 1000);
    host.onQuiesce?.(() => messenger.quiesce());
    try {
      const deadline = new ProgressDeadline({
        timeoutSeconds: config.progressTimeoutSeconds,
        pendingProbe: () => pendingObservationOf(messenger),
        nodeName: config.nodeName,
      });
      const onStall = (error: VideoflowError) => {
        logger.error(error.render());
        report();
        host.report?.({
          kind: "exit",
          node: config.nodeName,
          replica,
          code: exitCodeOf(error),
          reason: error.toDict(),
          endMarker: null,
          streamEnded: false,
        });
        exitOnStall(error, { terminationLog: config.terminationLog, exit: host.exit });
      };
      const watchdog = buildWatchdog(
        deadline,
        config.watchdogIntervalSeconds,
        config.progressTimeoutSeconds,
        config.nodeName,
        onStall,
        { logger },
      );
      const ctx = new RuntimeContext(
        { flowId: config.flowId, runId: config.runId, nodeName: config.nodeName, replicaId: replica },
        logger,
        messenger,
      );
      const task = createTask(node, {
        resumeOffset: node instanceof ProducerNode ? await messenger.resumeOffset() : 0,
        effectMarkers: node instanceof ConsumerNode && node.idempotent
          ? new LedgerIdempotencyStore(services.runtimeStore)
          : null,
        messenger,
        ctx,
        hasChildren: config.hasChildren,
        parentNames: config.parentNames,
        breaker: new ConsecutiveFailureBreaker(config.breakerThreshold, config.nodeName),
        deadline,
        watchdog,
        onError: config.onError ?? undefined,
        delivery: config.delivery ?? undefined,
        health,
        inputCalls: inputCallWatch(host, messenger),
      });
      const outcome = await task.run();
      const reason = reasonOf(outcome);
      if (reason !== null) {
        writeTerminationReason(outcome.kind === "failed" ? outcome.error : reason, config.terminationLog);
      }
      if (outcome.kind === "failed") logger.error(outcome.error.render());
      report();
      host.report?.({
        kind: "exit",
        node: config.nodeName,
        replica,
        code: outcome.exitCode,
        reason,
        endMarker: endMarkerOf(outcome, config.hasChildren),
        streamEnded: outcome.kind === "finished" || outcome.kind === "failed" && outcome.streamEnded,
      });
      return outcome.exitCode;
    } finally {
      clearInterval(reporter);
      if (soon !== null) clearTimeout(soon);
      await server?.stop();
      await reconciler?.stop();
      await messenger.close();
    }
  } finally {
    await services.close();
  }
}

/**
 * Runs one replica from `host.env` and resolves with its exit status; never throws. A configuration the
 * worker cannot start from is reported and exits with its class's code (2 for a bad environment).
 */
export async function runWorker(host: WorkerHost): Promise<number> {
  let config: WorkerConfig | null = null;
  let logger: NodeLogger | null = null;
  try {
    config = parseWorkerConfig(await paramsFromSpecsFile(host.env));
    logger = configureLogging(
      {
        flowId: config.flowId,
        runId: config.runId,
        node: config.nodeName,
        replica: config.replicaId ?? undefined,
      },
      { get: (name: string) => host.env[name] },
      host.logSink === undefined ? {} : { sink: host.logSink },
    );
    if (config.faultScheduleJson !== null) installFromEnv(host.env);
    return await runNode(config, host, logger);
  } catch (error) {
    const failure = error instanceof VideoflowError
      ? error
      : undeclaredPermission(error, config?.nodeName ?? "?") ?? asRuntimeError(error, "worker_fatal");
    const line = failure.render();
    if (logger !== null) logger.error(line);
    else console.error(line);
    if (config !== null) writeTerminationReason(failure, config.terminationLog);
    const code = exitCodeOf(failure);
    host.report?.({
      kind: "exit",
      node: config?.nodeName ?? "?",
      replica: config?.replicaId ?? 0,
      code,
      reason: failure.toDict(),
      endMarker: null,
      streamEnded: false,
    });
    return code;
  }
}
