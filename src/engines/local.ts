/**
 * The local engine: runs every replica of a compiled flow on this machine, each with exactly the Deno
 * permissions its node declares, over the embedded broker (the reference messaging model and payload
 * store, served to workers by the supervisor) with the run ledger in a file store under the state
 * directory (`.videoflow/<flow>/<run>/ledger`). Replicas are Deno Workers by default (frame bytes cross
 * as transferred buffers), or `deno run` subprocesses with matching `--allow-*` flags. The supervisor
 * restarts replicas per {@link SupervisionPolicy.local}, counts a replica's death as a delivery of the
 * inputs inside its node (its `in_node` reports say which) in the run ledger, shows a live view, stops the
 * flow the spec's way on SIGINT/SIGTERM (a second signal forces), and resolves with the run's exit status.
 *
 * @module
 */

import { DropReason } from "../core/metrics.ts";
import { CoalescedRun } from "../core/coalesced_run.ts";
import type { NodeSpec } from "../core/compiler.ts";
import {
  ConfigError,
  EXIT_ENVIRONMENT,
  EXIT_FLOW_FAILED,
  EXIT_STALLED,
  EXIT_USER,
  FlowFailed,
  isDiskFailure,
  ProgressStalled,
  ReplicaDeath,
  ResourceUnavailable,
  UpstreamAborted,
  type VideoflowError,
} from "../core/errors.ts";
import { writeAll } from "../core/bytes.ts";
import { undeclaredPermissionOnLoad } from "../core/undeclared_permission.ts";
import { AT_LEAST_ONCE, DeliveryPolicy } from "../core/delivery_policy.ts";
import { FlowType } from "../core/flow_type.ts";
import { NodeKind } from "../core/node.ts";
import { SIGTERM_EXIT_CODE } from "../core/task.ts";
import {
  describeReason,
  describeReasonAndRemedy,
  type NodeExited,
  nodeExited,
  nodeGaveUp,
  nodeRestarted,
  nodeStarted,
  renderEvent,
  restartCanMend,
  type SupervisionDecision,
  type SupervisionEvent,
  SupervisionPolicy,
  type TerminationReason,
} from "../core/supervision.ts";
import { channelId, type Envelope } from "../backends/messaging.ts";
import {
  dataSubscriptionId,
  DEDUP_WINDOW_BYTES,
  defaultPrefetch,
  flowTopology,
  OUTPUT_BUFFER_ENV,
  replicaOutputBufferBytes,
  type TopologyNode,
} from "../messaging/topology.ts";
import { envelopeOwner } from "../messaging/messenger.ts";
import {
  FlowRuntime,
  forgetBrokerCounts,
  forgetReplayPositions,
  storeSharedAndDurable,
} from "../backends/runtime.ts";
import { FileRuntimeStore } from "../runtime/file_store.ts";
import { InNodeBoard } from "../runtime/in_node_board.ts";
import { systemClock } from "../backends/clock.ts";
import { EndMarker, QUIESCE_LINE, REPORT_LINE_PREFIX, type WorkerReport } from "../runtime/worker.ts";
import { HealthServer } from "../runtime/health.ts";
import { RunMetrics } from "./run_metrics.ts";
import {
  FLOW_SPECS_PATH_ENV,
  paramsBySpecsFile,
  parseWorkerSettings,
  workerEnvFor,
  WorkerEnvVar,
  type WorkerSettings,
} from "../runtime/worker_config.ts";
import { LOG_LEVEL_ENV, STRUCTURED_LOGS_ENV } from "../runtime/logging.ts";
import { WATCHDOG_INTERVAL_ENV } from "../runtime/watchdog.ts";
import { FAULT_MARKER_DIR_ENV, FAULT_SCHEDULE_ENV } from "../backends/faults.ts";
import { PARTITION_LEASE_ENV, RECONCILE_INTERVAL_ENV } from "../backends/runtime.ts";
import {
  deadLetterError,
  type DeadLetterRecord,
  deadLetterRecord,
  dropsBesideDeadLetters,
  keepOffloadedPayloads,
  mergeDeadLetters,
  readDeadLettersIfAny,
  type SharedFailure,
  sharedFailures,
  writeDeadLetters,
} from "./dead_letters.ts";
import { EmbeddedBroker } from "./embedded_broker.ts";
import { EmbeddedRunBroker, Isolation, type RunBroker } from "./run_broker.ts";
import { openRuntimeStore } from "../runtime/runtime_stores.ts";
import type { RuntimeStore } from "../backends/runtime_store.ts";
import { STOP_REQUESTED, type StopRequester, StopSignals } from "./stop_signals.ts";
import { subprocessResolutionArgs, subprocessV8Args, workerOptionsEnabled } from "./deno_config.ts";
import {
  clearRunEnd,
  lockRun,
  readRunEnd,
  runDirectory,
  RunEnd,
  type RunEndRecord,
  SPECS_FILE,
  writeRunEnd,
  writeSpecsDocument,
} from "./run_directory.ts";
import { MemoryMessagingBackend } from "../backends/memory/messaging.ts";
import { type LocalGpuPlan, ReplicaExecution, replicaGpuEnv } from "../deploy/allocation_local.ts";
import { maskEntryOf } from "../runtime/gpucheck.ts";
import { MAX_INLINE_PAYLOAD_ENV } from "../backends/payload_bridge.ts";
import { LiveView, type NodeSnapshot, NodeState, renderSummary, type ViewOutput } from "./live_view.ts";
import {
  checkFlagPermissions,
  type GrantedPermissions,
  mergePermissions,
  replicaProcessFlags,
  workerPermissions,
} from "../runtime/permissions.ts";
import { ProcessLauncher, replicaEntryUrl, type ReplicaRuntime } from "../runtime/replica_entry.ts";

export { Isolation } from "./run_broker.ts";

/** What a local run needs: the compiled specs and how to run them. */
export interface LocalRunOptions {
  readonly flowId: string;
  readonly flowType: FlowType;
  readonly specs: readonly NodeSpec[];
  /** Node name to the permissions its replicas get (the compiled document's `permissions`). */
  readonly permissions: Readonly<Record<string, GrantedPermissions>>;
  /** Node name to the modules its replicas load before their sandbox applies (`nodePreloads`); none by default. */
  readonly preloads?: Readonly<Record<string, readonly string[]>>;
  readonly runId: string;
  /** The state directory; the run's ledger lives in `<stateDir>/<flow>/<run>/`. */
  readonly stateDir: string;
  readonly isolation: Isolation;
  /**
   * Real servers the replicas use instead of the embedded broker: NATS JetStream carries the messages,
   * Redis holds the payloads and the run ledger (`vf run-local --nats URL --redis URL`); none by default.
   */
  readonly servers?: RunServers | null;
  /** Restart failed replicas (the local supervision policy); false: the first failure is final. */
  readonly restart: boolean;
  /**
   * Where the whole run's health endpoint listens while it runs (`vf run-local --metrics`): every
   * replica's metrics labelled `node` and `replica` ({@link RunMetrics}); none by default.
   */
  readonly metrics?: MetricsAddress | null;
  /** Where the live view and events are written. */
  readonly output: ViewOutput;
  /**
   * Extra `VF_*` settings every replica gets (timeouts, a test's fault schedule: see
   * {@link forwardedSettings}); a fault marker directory named here is readable and writable by every
   * replica.
   */
  readonly extraEnv?: Readonly<Record<string, string>>;
  /**
   * The most bytes of one node's unsettled output, at the embedded broker and in its replicas' own output
   * buffers, which get half of it ({@link DEFAULT_CHANNEL_MAX_BYTES}); at least
   * {@link EMBEDDED_MAX_ENVELOPE_BYTES}.
   */
  readonly channelMaxBytes?: number;
  /**
   * The GPU replicas' grants (`src/deploy/allocation_local.ts`): each gets its `CUDA_VISIBLE_DEVICES` and
   * `VF_GPU_GRANT_JSON`, and the plan's notes are told as events before any replica starts; none by default.
   */
  readonly gpus?: LocalGpuPlan | null;
  /** How often the live view refreshes, seconds (1). */
  readonly refreshSeconds?: number;
  /**
   * Stops the flow the clean way when it aborts, as a first SIGINT or SIGTERM does (the summary says
   * "stopped on request"); the run can then go on with the same run id.
   */
  readonly signal?: AbortSignal;
  /**
   * Where SIGINT and SIGTERM come from: a listener the caller started before the run (the CLI, as it
   * starts), so that one arriving while the flow loads already stops the run cleanly. By default the
   * engine listens from the moment {@link LocalEngine.run} is called until it returns.
   */
  readonly stopSignals?: StopSignals;
  /**
   * Seconds without any report after which a replica counts as stalled: by default the progress timeout
   * its workers get (`VF_PROGRESS_TIMEOUT_SECONDS` in {@link extraEnv}, else 300), at least
   * {@link MIN_SILENCE_SECONDS}; none when that timeout is 0 (the watchdog disabled).
   */
  readonly silenceSeconds?: number;
  /**
   * Called once, when the run is sure to start: its lock is held (no other vf runs it) and it had not
   * finished already. Nothing is called for a run refused or with nothing to do.
   */
  readonly onStart?: () => void;
}

/** Where a local run's health endpoint listens (see {@link LocalRunOptions.metrics}). */
export interface MetricsAddress {
  /** The interface to bind: `127.0.0.1` for this host only, `0.0.0.0` for every interface. */
  readonly hostname: string;
  /** The port; 0 picks a free one, which the run's events name. */
  readonly port: number;
}

/** The servers a local run uses instead of the embedded broker (see {@link LocalRunOptions.servers}). */
export interface RunServers {
  /** `nats://host:port` of a JetStream server. */
  readonly natsUrl: string;
  /** `redis://host:port` of the Redis server holding payloads and the run ledger. */
  readonly redisUrl: string;
}

/** How a local run ended. */
export interface LocalRunResult {
  /**
   * 0 every replica finished (or the run had finished before: nothing ran); 2, 3, 4 or 5 by the worst
   * failure; 130 when forced by a second signal.
   */
  readonly exitCode: number;
  /** The outcome line the summary ends with (finished, stopped, failed, forced, and why). */
  readonly outcome: string;
  /** Each node's counters at the end of the run. */
  readonly snapshots: readonly NodeSnapshot[];
  /** Where the run's ledger and termination logs are. */
  readonly runDir: string;
}

/** Bytes in a mebibyte. */
export const MIB = 1024 * 1024;

/**
 * The largest envelope the embedded broker takes: it holds messages in the supervisor's memory, like its
 * payload store, so it needs no NATS-sized limit; this one only bounds what one message may pin.
 */
export const EMBEDDED_MAX_ENVELOPE_BYTES = 64 * MIB;

/**
 * How many bytes of one node's unsettled output, at the embedded broker and in its replicas' own output
 * buffers, a run allows unless told otherwise: the broker's messages live in the supervisor's memory, so a
 * producer faster than its consumers (a decoder ahead of slow inference) is held back here, by the broker
 * refusing and the producer backing off, instead of filling the host's memory. 256 MiB is about 97 720p
 * BGR frames, or 4 of the largest envelopes.
 */
export const DEFAULT_CHANNEL_MAX_BYTES = 256 * MIB;

/**
 * How many messages the embedded broker keeps for one batch node's output (a JetStream stream keeps
 * 10,000), which is also the credit its publishers share: they are sent only within it, so a smaller
 * limit costs no refused publications, and by Little's law it is what an item queues behind when the
 * consumer is the slower. 10,000 small items through producer → relay → sink (`deno task bench
 * --sections items`, a loaded 2-core host): at 2,000, p50 916 ms at 2,243 items/s; at 512, p50 146 ms at
 * 3,818 items/s; at 256 the relay's prefetch (256) holds the whole channel and the rate halves.
 */
export const LOCAL_BATCH_MAX_MSGS = 512;

/**
 * Refuses, with a {@link ConfigError} before anything starts, what would make every replica fail or the
 * broker refuse every envelope: a channel byte limit that is not a whole number of bytes or that one
 * largest envelope would overflow, a malformed worker setting in {@link LocalRunOptions.extraEnv}, and
 * under process isolation a permission its flags cannot express ({@link checkFlagPermissions}).
 * Returns the settings every replica will read from it.
 */
export function checkLocalRunOptions(
  options: Pick<LocalRunOptions, "channelMaxBytes" | "extraEnv" | "flowType" | "isolation" | "permissions">,
): WorkerSettings {
  if (options.isolation === Isolation.process && Deno.build.standalone) {
    throw new ConfigError(
      "a compiled vf runs replicas as Deno Workers only: a subprocess replica is a `deno run` with its own " +
        "permission flags, which a compiled binary cannot start",
      "run the flow without --isolation process, or with deno (`deno task run-local FLOW.ts --isolation process`)",
    );
  }
  if (options.isolation === Isolation.process) {
    for (const [node, granted] of Object.entries(options.permissions)) checkFlagPermissions(node, granted);
  } else if (workerOptionsEnabled() === false) {
    throw new ConfigError(
      "worker isolation gives each replica a Deno Worker with its own permissions, which Deno allows only " +
        "with --unstable-worker-options, and this process was started without it",
      'run deno with --unstable-worker-options (or put "unstable": ["worker-options"] in your deno.json), ' +
        "or pass --isolation process",
    );
  }
  const value = options.channelMaxBytes;
  if (value !== undefined && !(Number.isSafeInteger(value) && value >= EMBEDDED_MAX_ENVELOPE_BYTES)) {
    throw new ConfigError(
      `a channel's byte limit must be a whole number of at least ${EMBEDDED_MAX_ENVELOPE_BYTES} bytes ` +
        `(the largest envelope), got ${value}`,
      `pass at least ${EMBEDDED_MAX_ENVELOPE_BYTES / MIB} MiB`,
    );
  }
  return parseWorkerSettings(options.extraEnv ?? {}, options.flowType);
}

/**
 * The inline payload threshold a local run's replicas get unless `VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES` is
 * forwarded: a frame rides inside its envelope (one message, no payload-store round trips, no outbox
 * ledger writes), with room left for the envelope's own fields. Larger payloads still go to the
 * embedded payload store.
 */
export const EMBEDDED_MAX_INLINE_PAYLOAD_BYTES = EMBEDDED_MAX_ENVELOPE_BYTES - MIB;

/**
 * What a replica of a node with `nbTasks` replicas gets of its node's byte limit `channelMaxBytes`: its
 * own output buffer's share ({@link replicaOutputBufferBytes}), and an inline payload threshold (at most
 * `maxInline`) that leaves room in that share for an envelope's other fields, so an inline output always
 * fits it; a larger payload goes to the payload store.
 */
function outputBufferSettings(
  channelMaxBytes: number,
  nbTasks: number,
  maxInline: number,
): Record<string, string> {
  const buffer = replicaOutputBufferBytes(channelMaxBytes, nbTasks);
  const inline = Math.min(maxInline, buffer - Math.min(MIB, Math.floor(buffer / 2)));
  return { [OUTPUT_BUFFER_ENV]: String(buffer), [MAX_INLINE_PAYLOAD_ENV]: String(inline) };
}

/**
 * The run-wide worker settings `vf run-local` passes on from its own environment to every replica: the
 * timeouts and budgets of the task loop and the messenger, logging, and a test's fault schedule. Everything
 * else a replica's environment holds is the engine's to decide.
 */
export const FORWARDED_SETTINGS: readonly string[] = Object.freeze([
  WorkerEnvVar.ackWaitSeconds,
  WorkerEnvVar.maxRetries,
  WorkerEnvVar.eosQuiescenceMs,
  WorkerEnvVar.prefetchBytes,
  MAX_INLINE_PAYLOAD_ENV,
  WorkerEnvVar.breakerThreshold,
  WorkerEnvVar.progressTimeoutSeconds,
  WATCHDOG_INTERVAL_ENV,
  PARTITION_LEASE_ENV,
  RECONCILE_INTERVAL_ENV,
  LOG_LEVEL_ENV,
  STRUCTURED_LOGS_ENV,
  FAULT_SCHEDULE_ENV,
  FAULT_MARKER_DIR_ENV,
]);

/**
 * The fewest seconds of silence that count a replica as stalled, whatever its progress timeout: a
 * subprocess replica's start-up (a `deno run` and its module graph) sends no report either.
 */
export const MIN_SILENCE_SECONDS = 10;

/**
 * How long a replica may send no report before it counts as stalled (see
 * {@link LocalRunOptions.silenceSeconds}); null for never. A report stops only when the replica's event
 * loop is blocked (a synchronous call that never returns), where its own watchdog cannot run either.
 */
function silenceLimit(options: LocalRunOptions, settings: WorkerSettings): number | null {
  if (options.silenceSeconds !== undefined) return options.silenceSeconds;
  const timeout = settings.progressTimeoutSeconds;
  return timeout === 0 ? null : Math.max(MIN_SILENCE_SECONDS, timeout);
}

/**
 * The {@link FORWARDED_SETTINGS} that `env` sets, for {@link LocalRunOptions.extraEnv}: e.g. a test runs
 * `VF_PROGRESS_TIMEOUT_SECONDS=2 vf run-local flow.ts` to see a wedged node tripped in seconds. A malformed
 * value is reported by every replica as the ConfigError of its variable.
 */
export function forwardedSettings(env: Readonly<Record<string, string | undefined>>): Record<string, string> {
  return Object.fromEntries(
    FORWARDED_SETTINGS.flatMap((name) => env[name] === undefined ? [] : [[name, env[name] as string]]),
  );
}

/** How long a realtime flow's producers wait before the live view names the replicas they wait for. */
const HELD_NOTICE_SECONDS = 5;
/**
 * How long after a stop a replica still inside `open()` is waited for before the run is ended without it.
 * It holds no input yet (a replica receives only once open), so ending it loses nothing; without a bound a
 * stop would wait for an `open()` that never returns as long as it hangs.
 */
export const STOP_OPENING_GRACE_SECONDS = 10;

/** How long a forced stop waits for the replicas it killed to be reported gone. */
const FORCED_EXIT_WAIT_SECONDS = 3;

/** The exit status of a run stopped by a second interrupt. */
export const EXIT_FORCED = 130;

/**
 * A stop signal this soon after the previous one is the same request arriving twice (a terminal's Ctrl-C
 * reaches vf itself and, forwarded, through a launcher such as `deno task`), not a second Ctrl-C to force.
 */
export const SIGNAL_ECHO_SECONDS = 0.25;

/** A replica's counters report. */
type StatsReport = Extract<WorkerReport, { kind: "stats" }>;
/** What a replica counted: inputs processed and failed, drops by reason. */
type Counters = Pick<StatsReport, "processed" | "failed" | "drops">;

const NO_COUNTS: Counters = { processed: 0, failed: 0, drops: {} };

function addCounts(a: Counters, b: Counters | null): Counters {
  if (b === null) return a;
  const drops: Record<string, number> = { ...a.drops };
  for (const [reason, n] of Object.entries(b.drops)) drops[reason] = (drops[reason] ?? 0) + n;
  return { processed: a.processed + b.processed, failed: a.failed + b.failed, drops };
}

/** One running (or finished) replica, as the supervisor tracks it. */
interface Replica {
  readonly spec: NodeSpec;
  readonly index: number;
  restarts: number;
  state: NodeState;
  exitCode: number | null;
  reason: TerminationReason | null;
  /** The end marker its last exit report says it published to its children (null: none, or no report). */
  endMarker: EndMarker | null;
  /** Its last exit report says its stream had ended cleanly before it failed (in `close()`). */
  streamEnded: boolean;
  /** The supervisor ended it because the run could not go on: its status is not the run's. */
  endedBySupervisor: boolean;
  lastReportAt: number;
  /** When its current (or last) launch began (seconds, `performance.now()`). */
  launchedAt: number;
  /** Its node opened in some launch (its first report said so): it takes (or makes) items. */
  ready: boolean;
  /** The current launch sent its exit report: it ended through its task, not by `Deno.exit` in node code. */
  exitReported: boolean;
  /** The running (or last) launch's counters. */
  stats: StatsReport | null;
  /** The message ids its current launch last reported inside its node (`in_node`): none between calls. */
  inNode: readonly string[];
  /** Where its current launch records the inputs inside its node instead (a Worker replica's board). */
  inNodeBoard: InNodeBoard | null;
  /** Of its restarts, those after a death that used up the budget of an input inside its node. */
  restartsForInputs: number;
  /**
   * Settled once the current launch's exit was handled and its death counted against the inputs inside
   * its node: what the broker's release of the deliveries its connection held waits for.
   */
  deathCounted: PromiseWithResolvers<void>;
  /** The counters of its earlier launches, so a restart does not reset what the view shows. */
  earlier: Counters;
  kill: (() => void) | null;
  /** Asks the running launch to stop taking input and end once what it holds is settled (no end marker). */
  quiesce: (() => void) | null;
  /** The supervisor quiesced the current launch: its SIGTERM status is a clean stop. */
  quiesced: boolean;
}

/** Whether a replica is over for this run: done, or failed for good. */
function hasEnded(replica: Replica): boolean {
  return replica.state === NodeState.done || replica.state === NodeState.failed;
}

/**
 * How long the deliveries a replica's connection held wait, once it ended, for the supervisor to count that
 * replica's death (milliseconds, once its exit is seen) before they go back to the broker anyway.
 */
const RELEASE_WAIT_SECONDS = 10;

const DENO_ENV_PASSTHROUGH = ["PATH", "HOME", "DENO_DIR", "TMPDIR", "NO_COLOR", "XDG_CACHE_HOME", "LANG"];

/** How much of a subprocess replica's stderr is kept to read why it died. */
const STDERR_TAIL_CHARS = 8192;

/** Copies a subprocess replica's stderr to this process's as it comes; resolves with its last few KiB. */
async function passStderr(stderr: ReadableStream<Uint8Array>): Promise<string> {
  let tail = "";
  for await (const chunk of stderr) {
    await writeAll(Deno.stderr, chunk);
    tail = (tail + new TextDecoder().decode(chunk)).slice(-STDERR_TAIL_CHARS);
  }
  return tail;
}

/**
 * Makes the run's ledger fit a broker that starts empty, as this engine's does: what it counted through
 * the earlier broker restarts from nothing (`forgetBrokerCounts`), and unless the earlier supervisor
 * stopped on a signal after every item taken was finished, replayable sources start again from their
 * beginning (`forgetReplayPositions`): what that broker had accepted and not delivered died with it.
 */
async function forgetEarlierBroker(
  ledger: RuntimeStore,
  options: LocalRunOptions,
  previous: RunEndRecord | null,
): Promise<void> {
  const { flowId, runId, specs } = options;
  await forgetBrokerCounts(ledger, flowId, runId, specs.map((spec) => spec.name));
  if (previous?.end === RunEnd.stopped) return;
  const producers = specs.filter((spec) => spec.kind === "producer").map((spec) => spec.name);
  await forgetReplayPositions(ledger, flowId, runId, producers);
}

/**
 * Whether `name` is a setting of the runtime's own (`VF_*`, `VIDEOFLOW_*`): a replica gets those from the
 * engine alone, never from the host through a node's env permission, as a Worker replica does.
 */
function isEngineSetting(name: string): boolean {
  return name.startsWith("VF_") || name.startsWith("VIDEOFLOW_");
}

/** Whether env permission `declared` (a name, or a prefix ending in `*`, as Deno reads it) covers `name`. */
function envNameMatches(declared: string, name: string): boolean {
  return declared.endsWith("*") ? name.startsWith(declared.slice(0, -1)) : declared === name;
}

const nodeWorkerUrl = new URL("../../workers/node_worker.ts", import.meta.url).href;
const nodeProcessUrl = new URL("../../workers/node_process.ts", import.meta.url).href;

/**
 * The modules a replica's generated entry loads by URL at run time, which no static import reaches: what a
 * compiled `vf` must embed besides its own module graph (`deno task compile` includes them).
 */
export const RUNTIME_LOADED_MODULES: readonly string[] = Object.freeze([nodeWorkerUrl, nodeProcessUrl]);

function moduleOf(nodeClass: string): string {
  return nodeClass.slice(0, nodeClass.lastIndexOf("#"));
}

/**
 * The generated entry module of a replica ({@link replicaEntryUrl}): imports the node's module, the modules
 * it loads when it opens (`preloads`) and the worker runtime statically, so all load before the sandbox
 * applies, then serves. A `data:` URL, so nothing is written for it.
 */
export function bootstrapUrl(spec: NodeSpec, isolation: Isolation, preloads: readonly string[] = []): string {
  const runtime: ReplicaRuntime = isolation === Isolation.worker
    ? { kind: "worker", url: nodeWorkerUrl }
    : { kind: "process", url: nodeProcessUrl, launcher: ProcessLauncher.localEngine };
  return replicaEntryUrl(runtime, [moduleOf(spec.nodeClass ?? ""), ...preloads]);
}

function topologyNodes(specs: readonly NodeSpec[]): TopologyNode[] {
  return specs.map((spec) => ({
    name: spec.name,
    parents: spec.parents,
    nbTasks: spec.nbTasks,
    partitionBy: spec.partitionBy,
    joinPolicy: spec.joinPolicy,
    delivery: spec.delivery,
    prefetch: spec.prefetch,
  }));
}

/**
 * A summary line for each node that processed nothing while every dead letter it made carries one code:
 * the whole stream failed for one reason (a `partitionBy` no item carries), which its exit status alone
 * does not say.
 */
function failedEverything(
  snapshots: readonly NodeSnapshot[],
  shared: ReadonlyMap<string, SharedFailure>,
): string[] {
  return snapshots.flatMap((snapshot) => {
    const failure = shared.get(snapshot.node);
    if (snapshot.processed > 0 || failure === undefined) return [];
    return [
      `no item passed ${snapshot.node}: all ${failure.count} of its dead letters are ${failure.code} ` +
      `(${failure.error})`,
    ];
  });
}

/** The run's exit status from its replicas' statuses: the worst failure wins (stalled over failed over user). */
export function runExitCode(codes: readonly number[]): number {
  if (codes.every((code) => code === 0)) return 0;
  if (codes.includes(EXIT_STALLED)) return EXIT_STALLED;
  if (codes.some((code) => code !== 0 && code !== EXIT_USER && code !== 3)) return EXIT_FLOW_FAILED;
  return codes.includes(3) ? 3 : EXIT_USER;
}

/** Runs a compiled flow on this machine until it ends; see the module comment. */
export class LocalEngine {
  readonly #options: LocalRunOptions;
  readonly #replicas: Replica[] = [];
  readonly #view: LiveView;
  readonly #policy: SupervisionPolicy;
  readonly #broker: RunBroker;
  readonly #runDir: string;
  /** Dead letters an earlier supervisor of this run wrote (a re-run with the same run id). */
  readonly #earlierDeadLetters: readonly DeadLetterRecord[];
  readonly #started = performance.now() / 1000;
  #stopping = false;
  /** Whether the ledger keeps the retry budget (durable and shared): replica deaths are counted there. */
  #ledgerBudget = false;
  /** `VF_MAX_RETRIES` as the replicas read it: with each node's delivery mode, its inputs' budget. */
  readonly #maxRetries: number;
  /** The dead-letter file's writes, one after another: each writes the letters there are when it starts. */
  readonly #deadLetterWrites = new CoalescedRun(async () => {
    const records = await keepOffloadedPayloads(
      this.#runDir,
      this.#deadLetters(),
      (key) => this.#broker.payloadBytes(key),
    );
    await writeDeadLetters(this.#runDir, records);
  });
  /** What asked the flow to stop (a signal, or the caller's {@link LocalRunOptions.signal}), if anything did. */
  #stoppedBy: StopRequester | null = null;
  /** When the first stop came (seconds, `performance.now()`), or null. */
  #stoppedAt: number | null = null;
  /**
   * Every producer replica had ended its stream on its own when the stop came: the stop cut nothing short,
   * the rest of the flow finished what it held, and the run is finished (a re-run would make it all again).
   */
  #sourcesEndedBeforeStop = false;
  /** When the latest stop signal arrived (seconds, `performance.now()`), if one did. */
  #signalledAt: number | null = null;
  #forced = false;
  readonly #stopSignals: StopSignals;
  #ending = false;
  /**
   * The first disk failure of the run's state (its ledger, dead letters or end record): the run ended at it,
   * with exit status 3.
   */
  #stateUnwritable: ResourceUnavailable | null = null;
  /** Every replica has ended; the run's records are being written, and no stop changes them. */
  #settled = false;
  #wake: (() => void) | null = null;
  /** Seconds of silence after which a replica counts as stalled; null for never. */
  readonly #silence: number | null;
  /** Producers of a realtime flow not launched yet: they wait until every non-producer replica is ready. */
  readonly #held: Replica[] = [];
  /** Whether the replicas the held producers wait for were named (once). */
  #heldNoticed = false;
  /** The module-resolution flags a process replica is started with: this process's own. */
  readonly #resolutionArgs: readonly string[];
  /** The V8 flags a process replica is started with: the project's heap bounds, then this process's own. */
  readonly #v8Args: readonly string[];
  /** The inline payload threshold asked for: a forwarded `VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES`, or the local one. */
  readonly #maxInline: number;
  /**
   * Where the run's compiled specs document is, written before any subprocess replica starts (never for
   * Workers, which are handed their params whole): a replica whose params no environment entry holds
   * reads them there.
   */
  readonly #specsFile: string;

  private constructor(
    options: LocalRunOptions,
    settings: WorkerSettings,
    ledger: RuntimeStore,
    runDir: string,
    earlierDeadLetters: readonly DeadLetterRecord[],
    specsFile: string,
    stopSignals: StopSignals,
    servers: RunBroker | null,
  ) {
    this.#options = options;
    this.#specsFile = specsFile;
    this.#stopSignals = stopSignals;
    this.#silence = silenceLimit(options, settings);
    this.#maxInline = options.extraEnv?.[MAX_INLINE_PAYLOAD_ENV] === undefined && servers === null
      ? EMBEDDED_MAX_INLINE_PAYLOAD_BYTES
      : settings.maxInlinePayloadBytes;
    this.#maxRetries = settings.maxRetries;
    this.#resolutionArgs = options.isolation === Isolation.process ? subprocessResolutionArgs() : [];
    this.#v8Args = options.isolation === Isolation.process ? subprocessV8Args() : [];
    this.#runDir = runDir;
    this.#earlierDeadLetters = earlierDeadLetters;
    this.#broker = servers ?? new EmbeddedRunBroker(
      new EmbeddedBroker({
        runtimeStore: ledger,
        messaging: new MemoryMessagingBackend({
          maxPayloadBytes: EMBEDDED_MAX_ENVELOPE_BYTES,
          dedupWindowBytes: DEDUP_WINDOW_BYTES,
        }),
        releaseAfter: (label) => this.#deathCountedOf(label),
        onDeadLetter: () => this.#deadLetterStored(),
      }),
      ledger,
      { flowId: options.flowId, runId: options.runId, nodes: options.specs.map((spec) => spec.name) },
    );
    this.#view = new LiveView(options.output, this.#started);
    this.#policy = options.restart ? SupervisionPolicy.local() : SupervisionPolicy.disabled();
  }

  /**
   * Writes the dead letters once one more is stored. A dead letter that cannot be kept fails its
   * publication (on the embedded broker), so its input is not acked: the run ends.
   */
  #deadLetterStored(): Promise<void> {
    return this.#writeDeadLetters().catch((error) => {
      if (!isDiskFailure(error)) {
        this.#view.event(`the dead letters could not be written (again at the next one): ${error.message}`);
        return;
      }
      this.#endOnUnwritableState(error);
      throw error;
    });
  }

  /** Runs the flow and resolves with how it ended. */
  static async run(options: LocalRunOptions): Promise<LocalRunResult> {
    const settings = checkLocalRunOptions(options);
    // Listened for before anything of the run exists, so no signal ends this process half way.
    const stopSignals = options.stopSignals ?? StopSignals.listen();
    try {
      return await LocalEngine.#runListening(options, settings, stopSignals);
    } finally {
      if (options.stopSignals === undefined) stopSignals.close();
    }
  }

  /** {@link run}, with the stop signals listened for. */
  static async #runListening(
    options: LocalRunOptions,
    settings: WorkerSettings,
    stopSignals: StopSignals,
  ): Promise<LocalRunResult> {
    const runDir = runDirectory(options.stateDir, options.flowId, options.runId);
    try {
      await Deno.mkdir(`${runDir}/termination`, { recursive: true });
    } catch (error) {
      throw new ResourceUnavailable(
        `the run's state directory ${runDir} cannot be created: ${(error as Error).message}`,
        "point --state at a writable directory on a local disk (default .videoflow)",
        { state_dir: options.stateDir },
      );
    }
    const lock = await lockRun(runDir, options.flowId, options.runId);
    try {
      const previous = await readRunEnd(runDir);
      if (previous?.end === RunEnd.finished) {
        const outcome = `flow ${options.flowId} run ${options.runId} already finished at ${previous.at}: ` +
          "nothing to do (pass another --run-id to run the flow again)";
        options.output.write(`${outcome}\n`);
        return { exitCode: 0, outcome, snapshots: [], runDir };
      }
      options.onStart?.();
      let engine: LocalEngine | null = null;
      const servers = options.servers ?? null;
      const ledger = servers !== null
        ? await openRuntimeStore(servers.redisUrl)
        : await FileRuntimeStore.open(`${runDir}/ledger`, systemClock, {
          onDiskFailure: (error) => {
            if (engine !== null) engine.#endOnUnwritableState(error);
          },
        });
      let broker: RunBroker | null = null;
      try {
        // Loaded on use: the NATS and Redis clients are no embedded run's to load.
        broker = servers === null ? null : await (await import("./server_broker.ts")).ServerRunBroker.open({
          ...servers,
          ledger,
          flowId: options.flowId,
          runId: options.runId,
          flowType: options.flowType,
          specs: options.specs,
          onDeadLetter: () => {
            if (engine !== null) engine.#deadLetterStored().catch(() => {});
          },
          onWarning: (line) => options.output.write(`WARNING: ${line}\n`),
        });
      } catch (error) {
        await ledger.close();
        throw error;
      }
      // The embedded broker starts empty; a server's streams keep what an earlier supervisor left.
      if (broker === null) await forgetEarlierBroker(ledger, options, previous);
      await clearRunEnd(runDir);
      const earlier = await readDeadLettersIfAny(runDir) ?? [];
      const specsFile = `${runDir}/${SPECS_FILE}`;
      if (options.isolation === Isolation.process) await writeSpecsDocument(specsFile, options.specs);
      engine = new LocalEngine(options, settings, ledger, runDir, earlier, specsFile, stopSignals, broker);
      try {
        return await engine.#run();
      } finally {
        await engine.#broker.close();
        await ledger.close();
      }
    } finally {
      lock.close();
    }
  }

  /**
   * Asks the flow to stop the spec's way (producers end with EOS, workers drain); a second call forces.
   * `signal` names what asked (the summary then says the run was stopped, not finished); a signal within
   * {@link SIGNAL_ECHO_SECONDS} of the previous one is that one again and changes nothing, and so does any
   * stop once every replica has ended.
   */
  stop(signal: StopRequester | null = null): void {
    if (this.#settled) return;
    const now = performance.now() / 1000;
    if (signal !== null) {
      // One Ctrl-C can arrive twice at once: from the terminal, and forwarded by a launcher (deno task).
      const echo = this.#signalledAt !== null && now - this.#signalledAt < SIGNAL_ECHO_SECONDS;
      this.#signalledAt = now;
      if (echo) return;
    }
    if (this.#stopping) {
      this.#forced = true;
      const forced = new FlowFailed("killed by a forced stop", "let a stop drain, or re-run to go on")
        .toDict();
      for (const replica of this.#replicas) {
        if (replica.kill === null) continue;
        replica.reason ??= { ...forced };
        replica.kill();
      }
      this.#wake?.();
      return;
    }
    this.#stopping = true;
    this.#stoppedBy = signal;
    this.#stoppedAt = now;
    const producers = this.#replicas.filter((r) => r.spec.kind === NodeKind.producer);
    this.#sourcesEndedBeforeStop = producers.length > 0 && producers.every((r) => r.state === NodeState.done);
    const kept = this.#broker.outlivesSupervisor;
    const ending = this.#sourcesEndedBeforeStop
      ? "every producer had already ended its stream, the rest finishes what it holds"
      : kept
      ? "every replica finishes what it holds, the streams keep the rest for a re-run"
      : "producers end their streams";
    this.#view.event(
      signal === null
        ? `stopping flow ${this.#options.flowId}: ${ending}`
        : `stopping flow ${this.#options.flowId} on ${signal}: ${ending}` +
          (signal === STOP_REQUESTED ? "" : " (again to force)"),
    );
    if (this.#broker.stopFlow()) {
      // A held producer starts now only to see the stop and end its stream, so its children can finish.
      this.#releaseHeld();
      return;
    }
    // The broker keeps its streams as they are: nothing ends them, each replica is quiesced instead, and
    // one not running now (held, or waiting for its restart) is not started again this run.
    for (const replica of this.#held.splice(0)) this.#endQuietly(replica);
    for (const replica of this.#replicas) {
      if (replica.state === NodeState.restarting && replica.exitCode !== null) this.#endQuietly(replica);
      else if (replica.exitCode === null && replica.quiesce !== null) {
        replica.quiesced = true;
        replica.quiesce();
      }
    }
    this.#wake?.();
  }

  /** Ends a replica that is not running at a stop that keeps the streams: it stopped with nothing to do. */
  #endQuietly(replica: Replica): void {
    replica.state = NodeState.done;
    replica.exitCode = 0;
    replica.reason = null;
  }

  /**
   * Launches the held producers once every other replica is ready (or has ended), or once the flow
   * stops; never while the run is being ended.
   */
  #releaseHeld(): void {
    if (this.#held.length === 0 || this.#ending) return;
    if (!this.#stopping && this.#openingReplicas().length > 0) return;
    for (const replica of this.#held.splice(0)) {
      replica.state = NodeState.starting;
      this.#launch(replica);
    }
  }

  /** The replicas held producers wait for: not opened yet, and not ended. */
  #openingReplicas(): Replica[] {
    return this.#replicas.filter((r) => !this.#held.includes(r) && !r.ready && !hasEnded(r));
  }

  /**
   * Ends the run once replicas are still opening {@link STOP_OPENING_GRACE_SECONDS} after the stop (or after
   * their launch, when that came later), naming them: they hold no input, and what the others hold goes
   * back to the streams for a re-run.
   */
  #endStillOpening(now: number): void {
    const stoppedAt = this.#stoppedAt;
    if (stoppedAt === null || this.#ending) return;
    const opening = this.#openingReplicas().filter((r) =>
      r.kill !== null && now - Math.max(stoppedAt, r.launchedAt) >= STOP_OPENING_GRACE_SECONDS
    );
    if (opening.length === 0) return;
    const names = opening.map((r) => `${r.spec.name}[${r.index}]`).join(", ");
    const { flowId, runId } = this.#options;
    this.#killTheRest(
      `stopping flow ${flowId}: ${names} still opening ${STOP_OPENING_GRACE_SECONDS} s after the stop (open() ` +
        `has not returned), so the run ends without waiting for it; run it again with --run-id ${runId} to go on`,
      new FlowFailed(
        `stopped while ${names} was still opening`,
        "find why open() does not return (a model that never loads, a device that never answers)",
        { flow: flowId, run: runId },
      ),
      null,
    );
  }

  /** Says once, after {@link HELD_NOTICE_SECONDS}, which replicas the held producers are waiting for. */
  #noticeHeld(now: number): void {
    if (this.#heldNoticed || this.#held.length === 0 || now - this.#started < HELD_NOTICE_SECONDS) return;
    this.#heldNoticed = true;
    const opening = this.#openingReplicas().map((r) => `${r.spec.name}[${r.index}]`).join(", ");
    this.#view.event(
      `the producers wait for ${opening} to open (a realtime flow starts once every receiving replica opened)`,
    );
  }

  async #run(): Promise<LocalRunResult> {
    const { flowId, flowType, runId, specs } = this.#options;
    const ledgerBudget = await storeSharedAndDurable(this.#broker.ledger);
    this.#ledgerBudget = ledgerBudget;
    const topology = flowTopology(topologyNodes(specs), {
      flowId,
      runId,
      flowType,
      ledgerBudget,
      // A server's streams and durables take WIRE.md's shape: no byte limit unless one is asked for, 10,000
      // messages, the spec's prefetch for a node that sets none (the durables a reference worker derives).
      ...(this.#broker.outlivesSupervisor
        ? {
          channelMaxBytes: this.#options.channelMaxBytes ?? null,
          prefetch: defaultPrefetch(flowType, true),
        }
        : {
          channelMaxBytes: this.#options.channelMaxBytes ?? DEFAULT_CHANNEL_MAX_BYTES,
          batchMaxMsgs: LOCAL_BATCH_MAX_MSGS,
          perSubjectLimits: true,
        }),
    });
    await this.#broker.provision(topology, `run-local/${runId}`);
    this.#ownPartitionDrops();
    await this.#broker.serve(this.#options.isolation);
    const metrics = this.#serveMetrics();
    // A signal that came while the run was being set up is handed over now, before any replica starts.
    const detachSignals = this.#stopSignals.attach((signal) => this.stop(signal));
    const onAbort = () => this.stop(STOP_REQUESTED);
    this.#options.signal?.addEventListener("abort", onAbort, { once: true });
    if (this.#options.signal?.aborted) onAbort();
    try {
      this.#tellGpus();
      for (const spec of specs) {
        // A realtime channel keeps only its freshest items: its producers wait until every receiving replica
        // opened, so that nothing they make is evicted while the rest of the flow is still starting.
        const held = flowType === FlowType.realtime && spec.kind === NodeKind.producer;
        for (let index = 0; index < spec.nbTasks; index++) {
          const replica: Replica = {
            spec,
            index,
            restarts: 0,
            state: held ? NodeState.waiting : NodeState.starting,
            exitCode: null,
            reason: null,
            endMarker: null,
            streamEnded: false,
            endedBySupervisor: false,
            lastReportAt: performance.now() / 1000,
            launchedAt: performance.now() / 1000,
            ready: false,
            exitReported: false,
            stats: null,
            inNode: [],
            inNodeBoard: null,
            restartsForInputs: 0,
            deathCounted: Promise.withResolvers(),
            earlier: NO_COUNTS,
            kill: null,
            quiesce: null,
            quiesced: false,
          };
          this.#replicas.push(replica);
          if (held) this.#held.push(replica);
          else this.#launch(replica);
        }
      }
      this.#releaseHeld();
      await this.#supervise();
      // Every replica has ended: a signal now changes nothing, and is caught so that it cannot cut the
      // run's dead letters, its run-end record or its summary short.
      this.#settled = true;
      await this.#keepingState(() => this.#writeDeadLetters());
      await this.#broker.readAgain();
      const snapshots = this.#snapshots();
      let exitCode = this.#forced
        ? EXIT_FORCED
        : this.#stateUnwritable !== null
        ? EXIT_ENVIRONMENT
        : runExitCode(this.#statuses());
      const cutShort = this.#stoppedBy !== null && !this.#sourcesEndedBeforeStop;
      if (exitCode === 0) {
        const end = cutShort ? RunEnd.stopped : RunEnd.finished;
        if (!await this.#keepingState(() => writeRunEnd(this.#runDir, end))) exitCode = EXIT_ENVIRONMENT;
      }
      // A stop ends every producer's stream where it is, so a join of sources at different points gives up
      // the groups the stopped ones never completed: those are join evictions, and the outcome says so.
      const givenUp = snapshots.reduce((n, s) => n + (s.drops[DropReason.joinEvicted] ?? 0), 0);
      const taken = givenUp === 0
        ? "every item taken was finished"
        : `every item taken was finished or given up (${givenUp} join members, ${DropReason.joinEvicted} in the ` +
          "drops column)";
      const unwritable = this.#stateUnwritable;
      const mend = `once that is mended, run it again with --run-id ${runId} to go on`;
      const outcome = exitCode === 0
        ? !cutShort
          ? `flow ${flowId} finished (run ${runId})` +
            (this.#stoppedBy === null
              ? ""
              : `: every producer had ended its stream before the stop on ${this.#stoppedBy}, so nothing was left`)
          : `flow ${flowId} stopped on ${this.#stoppedBy} (run ${runId}): ${taken}; ` +
            `run it again with --run-id ${runId} to go on (replayable sources resume, others start over)`
        : `flow ${flowId} ${this.#forced ? "was forced to stop" : "failed"} with exit code ${exitCode} ` +
          `(run ${runId})${unwritable === null ? "" : `: ${describeFailure(unwritable)}; ${mend}`}`;
      const elapsed = performance.now() / 1000 - this.#started;
      const notes = failedEverything(snapshots, sharedFailures(this.#currentDeadLetters()));
      for (const line of renderSummary(elapsed, snapshots, outcome, notes, this.#view.columns)) {
        this.#options.output.write(`${line}\n`);
      }
      return { exitCode, outcome, snapshots, runDir: this.#runDir };
    } finally {
      detachSignals();
      this.#options.signal?.removeEventListener("abort", onAbort);
      await metrics?.stop();
    }
  }

  /** Starts the run's health endpoint when one was asked for, and says where it listens. */
  #serveMetrics(): HealthServer | null {
    const address = this.#options.metrics ?? null;
    if (address === null) return null;
    const server = new HealthServer(
      new RunMetrics(() =>
        this.#replicas.map((r) => ({
          node: r.spec.name,
          replica: r.index,
          ready: r.ready,
          ended: r.exitCode !== null,
          snapshot: r.stats?.metrics ?? null,
        }))
      ),
      address,
    );
    let port: number;
    try {
      port = server.start();
    } catch (error) {
      throw new ResourceUnavailable(
        `the run's metrics endpoint cannot listen on ${address.hostname}:${address.port}: ${
          (error as Error).message
        }`,
        "pass --metrics another port (0 picks a free one), or stop what holds that one",
      );
    }
    const host = address.hostname.includes(":") ? `[${address.hostname}]` : address.hostname;
    this.#view.event(`metrics at http://${host}:${port}/metrics (also /readyz and /healthz)`);
    return server;
  }

  /**
   * The statuses the run's status comes from: the replicas that ended on their own account. A relayed
   * ABORT or a replica the supervisor ended counts only when no replica failed on its own.
   */
  #statuses(): number[] {
    const status = (r: Replica) => r.exitCode ?? EXIT_FLOW_FAILED;
    const own = this.#replicas.filter((r) => !r.endedBySupervisor && r.reason?.code !== UpstreamAborted.code);
    return (own.some((r) => status(r) !== 0) ? own : this.#replicas).map(status);
  }

  #event(event: SupervisionEvent): void {
    const line = renderEvent(event);
    if (line !== null) this.#view.event(line);
  }

  /** Says, before any replica starts, what the GPU plan decided and what Worker isolation cannot keep apart. */
  #tellGpus(): void {
    const plan = this.#options.gpus;
    if (!plan) return;
    for (const note of plan.notes) this.#view.event(note);
    const onGpus = Object.values(plan.replicas).flat().filter((r) => r.execution === ReplicaExecution.gpu);
    for (const { node, replica, grant } of onGpus) {
      const devices = grant.devices.map((d) => `${maskEntryOf(d)} (${d.migProfile ?? d.product})`);
      this.#view.event(`${node}[${replica}] gets ${devices.join(", ")}`);
    }
    if (onGpus.length > 0 && this.#options.isolation === Isolation.worker) {
      this.#view.event(
        "the GPU replicas run as Deno Workers of this process, whose one environment a CUDA library reads: " +
          "each worker checks its own grant, but only --isolation process gives each its own " +
          "CUDA_VISIBLE_DEVICES",
      );
    }
  }

  #envFor(replica: Replica): Record<string, string> {
    const { flowId, flowType, runId, specs } = this.#options;
    const { broker, runtimeStoreUrl, blobStoreUrl } = this.#broker.replicaConnection(this.#options.isolation);
    return {
      ...workerEnvFor(replica.spec, specs, { flowId, flowType }, { runId, broker }, replica.index, {
        runtimeStoreUrl,
        blobStoreUrl,
        terminationLog: this.#terminationLog(replica),
        healthPort: null,
      }),
      ...this.#options.extraEnv,
      ...(this.#options.gpus ? replicaGpuEnv(this.#options.gpus, replica.spec.name, replica.index) : {}),
      ...outputBufferSettings(
        this.#options.channelMaxBytes ?? DEFAULT_CHANNEL_MAX_BYTES,
        replica.spec.nbTasks,
        this.#maxInline,
      ),
    };
  }

  #onReport(replica: Replica, report: WorkerReport): void {
    replica.lastReportAt = performance.now() / 1000;
    if (report.kind === "in_node") {
      replica.inNode = report.messageIds;
    } else if (report.kind === "stats") {
      replica.stats = report;
      // A replica runs once its node opened: until then (a model loading) it is still starting.
      if (report.ready && (replica.state === NodeState.starting || replica.state === NodeState.restarting)) {
        replica.state = NodeState.running;
      }
      if (report.ready && !replica.ready) {
        replica.ready = true;
        this.#releaseHeld();
      }
    } else {
      replica.reason = report.reason as TerminationReason | null;
      replica.endMarker = report.endMarker;
      replica.streamEnded = report.streamEnded;
      replica.exitReported = true;
    }
  }

  /** The replica's termination log: the one file of the run directory a subprocess replica may write. */
  #terminationLog(replica: Replica): string {
    return `${this.#runDir}/termination/${replica.spec.name}-${replica.index}.json`;
  }

  #launch(replica: Replica): void {
    replica.lastReportAt = performance.now() / 1000;
    replica.launchedAt = replica.lastReportAt;
    replica.exitCode = null;
    replica.reason = null;
    replica.endMarker = null;
    replica.streamEnded = false;
    replica.exitReported = false;
    replica.earlier = addCounts(replica.earlier, replica.stats);
    replica.stats = null;
    replica.inNode = [];
    replica.inNodeBoard = null;
    replica.deathCounted = Promise.withResolvers();
    replica.quiesced = false;
    this.#event(nodeStarted(replica.spec.name, replica.index, replica.restarts));
    if (this.#options.isolation === Isolation.worker) this.#launchWorker(replica);
    else this.#launchProcess(replica);
  }

  /**
   * The node's declared permissions, plus the addresses its replicas connect to when isolated as
   * `isolation`, and the fault marker directory when a test's schedule names one.
   */
  #granted(spec: NodeSpec, isolation: Isolation): GrantedPermissions {
    const declared = this.#options.permissions[spec.name] ?? {};
    const { net } = this.#broker.replicaConnection(isolation);
    const markers = this.#options.extraEnv?.[FAULT_MARKER_DIR_ENV];
    return mergePermissions(declared, {
      ...(net.length === 0 ? {} : { net: [...net] }),
      ...(markers === undefined ? {} : { read: [markers], write: [markers] }),
    });
  }

  #launchWorker(replica: Replica): void {
    const { spec, index } = replica;
    const worker = new Worker(bootstrapUrl(spec, Isolation.worker, this.#options.preloads?.[spec.name]), {
      type: "module",
      name: `${spec.name}/${index}`,
      deno: { permissions: workerPermissions(this.#granted(spec, Isolation.worker)) },
    } as WorkerOptions);
    const { port1, port2 } = new MessageChannel();
    const disconnect = this.#broker.connectWorker(port1, `${spec.name}/${index}`);
    let ended = false;
    const end = (code: number) => {
      if (ended) return;
      ended = true;
      worker.terminate();
      disconnect(`${spec.name}[${index}] ended`);
      // No signal reaches a Worker: a status past 128 is a kill the fault schedule simulates (137).
      this.#exited(replica, code, code >= 128);
    };
    worker.onmessage = (event: MessageEvent<WorkerReport | { kind: "done"; code: number }>) => {
      const message = event.data;
      if (message.kind === "done") end(message.code);
      else this.#onReport(replica, message);
    };
    worker.onerror = (event: ErrorEvent) => {
      event.preventDefault();
      this.#view.event(`${spec.name}[${index}] crashed: ${event.message}`);
      const refused = this.#refusedOnLoad(replica, event.message);
      if (refused !== null) return end(refused);
      replica.reason = { code: "VF_WORKER_FATAL", message: event.message, disposition: "worker_fatal" };
      end(EXIT_FLOW_FAILED);
    };
    const board = replica.inNodeBoard = InNodeBoard.create();
    worker.postMessage({ env: this.#envFor(replica), port: port2, inNodeBoard: board.buffer }, [port2]);
    replica.kill = () => end(EXIT_FLOW_FAILED);
    replica.quiesce = () => worker.postMessage({ type: "quiesce" });
  }

  /**
   * Launches a replica as a `deno run` subprocess. Its environment is cleared and holds only what Deno
   * needs, the variables its node declared env permission for (as a Worker replica reads them from this
   * process) and its settings, whose names it is given as arguments: it may read exactly those and the
   * declared ones, and it hides its settings from the node once read (`serveNodeProcess`).
   */
  #launchProcess(replica: Replica): void {
    const { spec } = replica;
    const settings = paramsBySpecsFile(this.#envFor(replica), this.#specsFile);
    const specsPath = settings[FLOW_SPECS_PATH_ENV];
    const declaredEnv = this.#options.permissions[spec.name]?.env ?? [];
    const flags = replicaProcessFlags(this.#granted(spec, Isolation.process), {
      settings: Object.keys(settings),
      terminationLog: this.#terminationLog(replica),
      ...(specsPath === undefined ? {} : { specsPath }),
    });
    const hostEnv = Deno.env.toObject();
    const inherited = Object.fromEntries(
      Object.entries(hostEnv).filter(([name]) =>
        DENO_ENV_PASSTHROUGH.includes(name) ||
        !isEngineSetting(name) && declaredEnv.some((declared) => envNameMatches(declared, name))
      ),
    );
    const child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--no-prompt",
        ...this.#resolutionArgs,
        ...this.#v8Args,
        ...flags,
        bootstrapUrl(spec, Isolation.process, this.#options.preloads?.[spec.name]),
        ...Object.keys(settings),
      ],
      clearEnv: true,
      env: { ...inherited, ...settings },
      // Its stdin is the quiesce request's way in (QUIESCE_LINE); it ends, asking the same, when vf does.
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
      // A session of its own from before it runs: a terminal's Ctrl-C or a service manager's SIGTERM to
      // vf's process group then reaches vf alone, which stops the flow the spec's way, and never a replica
      // still starting (the session is made in the forked child, which has vf's stop listeners until it
      // runs deno; a `setsid` program in between would take the signal's default action).
      detached: true,
    }).spawn();
    replica.kill = () => {
      try {
        child.kill("SIGKILL");
      } catch {
        // already gone
      }
    };
    const control = child.stdin.getWriter();
    replica.quiesce = () => {
      control.write(new TextEncoder().encode(QUIESCE_LINE)).catch(() => {
        // already gone: its exit is handled as any other
      });
    };
    // Its exit is handled once its stdout is read to the end, so its exit report is in hand by then.
    const reports = this.#readReports(replica, child.stdout).catch((error) => {
      this.#view.event(`${spec.name}[${replica.index}] sent an unreadable report: ${error.message}`);
    });
    const stderrTail = passStderr(child.stderr);
    Promise.all([child.status, stderrTail, reports]).then(([status, tail]) => {
      control.close().catch(() => {});
      const code = status.signal === null ? status.code : signalStatus(status.signal);
      // A replica that dies loading its module reports nothing; Deno's refusal of a permission is on stderr.
      const refused = replica.reason === null && code !== 0 ? this.#refusedOnLoad(replica, tail) : null;
      this.#exited(replica, refused ?? code, status.signal !== null);
    });
  }

  /**
   * When `text` (an uncaught error, a replica's stderr) holds Deno's refusal of a permission to the code a
   * replica's module runs as it loads: records that as the replica's reason and returns its exit status.
   */
  #refusedOnLoad(replica: Replica, text: string): number | null {
    const undeclared = undeclaredPermissionOnLoad(text, replica.spec.name);
    if (undeclared === null) return null;
    replica.reason = { ...undeclared.toDict() };
    return undeclared.exitCode;
  }

  async #readReports(replica: Replica, stdout: ReadableStream<Uint8Array>): Promise<void> {
    let buffered = "";
    for await (const chunk of stdout.pipeThrough(new TextDecoderStream())) {
      buffered += chunk;
      let newline = buffered.indexOf("\n");
      while (newline >= 0) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        if (line.startsWith(REPORT_LINE_PREFIX)) {
          this.#onReport(replica, JSON.parse(line.slice(REPORT_LINE_PREFIX.length)));
        } else {
          this.#options.output.write(`${line}\n`);
        }
        newline = buffered.indexOf("\n");
      }
    }
  }

  #exited(replica: Replica, exitStatus: number, bySignal = false): void {
    if (replica.exitCode !== null) return;
    // A replica the supervisor quiesced ends as SIGTERM does (143): that is the clean stop it was asked for.
    const status = replica.quiesced && exitStatus === SIGTERM_EXIT_CODE ? 0 : exitStatus;
    // A status means what the task said only when it sent its exit report: node code that calls
    // `Deno.exit(n)` ends the replica with its stream unfinished and its inputs unacked, whatever `n` says
    // (0 is no clean end, 2 no author's mistake, 143 no SIGTERM). A signal's status, or a reason found
    // otherwise (a refusal while its module loaded), stands.
    const unreported = !replica.exitReported && replica.reason === null && !bySignal;
    if (unreported) {
      // Its end marker at the broker says what its missing report would have: a stream already ended
      // (node code exiting in close()) must not be made again.
      const marker = this.#publishedEndMarker(replica);
      replica.endMarker = marker;
      replica.streamEnded = marker === EndMarker.eos;
      replica.reason = {
        code: "VF_WORKER_FATAL",
        message: `the replica exited with status ${status} before its task ended, with no exit report ` +
          "(node code called Deno.exit, or its module failed to load)",
        disposition: "worker_fatal",
      };
    }
    const code = unreported ? EXIT_FLOW_FAILED : status;
    replica.exitCode = code;
    replica.kill = null;
    replica.quiesce = null;
    const exited = nodeExited(replica.spec.name, replica.index, code, replica.reason);
    this.#event(exited);
    const charge = this.#chargeDeath(replica, code);
    const counted = replica.deathCounted;
    if (charge === null) {
      counted.resolve();
      this.#settleExit(replica, exited, false);
      return;
    }
    void charge.finally(() => counted.resolve());
    // What becomes of the replica waits for the ledger's count of its death (milliseconds), which also
    // comes before any replacement takes the inputs again.
    replica.state = NodeState.restarting;
    void charge.then((inputSpent) => {
      if (replica.state === NodeState.restarting) this.#settleExit(replica, exited, inputSpent);
    });
  }

  /**
   * Finishes, restarts or gives up on a replica that exited; `inputSpent`: its death used up the delivery
   * budget of an input inside its node (see {@link #decide}).
   */
  #settleExit(replica: Replica, exited: NodeExited, inputSpent: boolean): void {
    const decision = this.#decide(replica, exited, inputSpent);
    if (decision.kind === "finished") {
      replica.state = NodeState.done;
    } else if (decision.kind === "restart") {
      replica.state = NodeState.restarting;
      replica.restarts++;
      if (inputSpent) replica.restartsForInputs++;
      this.#event(decision.event);
      setTimeout(() => {
        if (replica.state === NodeState.restarting && !this.#forced) this.#launch(replica);
      }, decision.delaySeconds * 1000);
    } else {
      replica.state = NodeState.failed;
      if (decision.event !== null) this.#event(decision.event);
      // A replica that failed after its stream ended cleanly left nothing undone: the flow goes on, and
      // the failure is the run's exit status.
      if (replica.streamEnded) {
        this.#view.event(
          `${replica.spec.name}[${replica.index}] had ended its stream: not run again, the flow goes on`,
        );
      } else if (replica.spec.hasChildren && replica.endMarker === null && !this.#forced) {
        this.#endRun(replica);
      } else if (!this.#stopping) this.#abortFlow(replica);
      this.#abandonInputsOf(replica);
    }
    this.#wake?.();
  }

  /**
   * Counts a replica's death as one delivery of each input it held inside its node (what its board says,
   * or its last `in_node` report), as a broker counts an expired ack wait, so that an input that kills or
   * wedges its replica on every delivery is dead-lettered once its budget is spent (`ReplicaDeath`: a
   * stall when it exited as stalled, else a crash). Inputs prefetched but never handed to the node lose
   * nothing. A death the supervisor caused (ending the run, a forced stop) charges nothing; neither does a
   * ledger that does not keep the retry budget. A best-effort node's death is charged too, so the input it killed is given up
   * (sampled into the DLQ as the poison it is) instead of lost unseen; having one delivery, it never spends
   * a budget that would take the restart from the replica's own. Resolves whether the death used up the
   * budget of an at-least-once input it held; null when it charged nothing.
   */
  #chargeDeath(replica: Replica, code: number): Promise<boolean> | null {
    const messageIds = replica.inNodeBoard?.read() ?? replica.inNode;
    replica.inNode = [];
    replica.inNodeBoard = null;
    const ledger = this.#broker.ledger;
    const budget = this.#deliveryBudget(replica.spec);
    if (messageIds.length === 0 || !this.#ledgerBudget) return null;
    if (replica.endedBySupervisor || this.#forced) return null;
    const { flowId, runId } = this.#options;
    const runtime = new FlowRuntime({
      store: ledger,
      flowId,
      runId,
      node: replica.spec.name,
      replicaId: replica.index,
    });
    const death = code === EXIT_STALLED ? ReplicaDeath.stalled : ReplicaDeath.crashed;
    const cause = describeReason(replica.reason);
    return Promise.all(messageIds.map((id) => runtime.recordReplicaDeath(id, death, cause))).then(
      (counts) => budget !== null && counts.some((count) => count >= budget),
      (error) => {
        this.#view.event(
          `${replica.spec.name}[${replica.index}]'s death could not be counted against its inputs: ` +
            `${(error as Error).message}`,
        );
        return false;
      },
    );
  }

  /**
   * What the release of the deliveries held by the connection labelled `label` (`<node>/<index>`, as a
   * replica's connection is) waits for: that replica's death counted against the inputs inside its node,
   * so a sibling that takes one at once sees the count; at most {@link RELEASE_WAIT_SECONDS}, for a
   * connection that ended while its replica lives on. Null for a connection of no replica.
   */
  #deathCountedOf(label: string): Promise<void> | null {
    const replica = this.#replicas.find((r) => `${r.spec.name}/${r.index}` === label);
    if (replica === undefined) return null;
    const counted = replica.deathCounted.promise;
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, RELEASE_WAIT_SECONDS * 1000);
      void counted.then(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  /** How many deliveries the ledger allows an input of an at-least-once node; null for best-effort. */
  #deliveryBudget(spec: NodeSpec): number | null {
    const policy = DeliveryPolicy.resolve(this.#options.flowType, spec.delivery, this.#maxRetries);
    return policy.delivery === AT_LEAST_ONCE ? policy.maxDeliver : null;
  }

  /** The end marker (EOS or ABORT) the broker holds from `replica`, if it published one. */
  #publishedEndMarker(replica: Replica): EndMarker | null {
    return this.#broker.endMarkerOf(replica.spec.name, replica.index);
  }

  /**
   * What to do about a replica that exited: the supervision policy's decision on the restarts it spent
   * itself, except that a replica that published ABORT is not restarted (its children have ended already,
   * which no restart undoes), nor one whose stream had ended cleanly before it failed (a restart would make
   * or take its stream again), and nothing is restarted while the flow stops. A death that used up the
   * delivery budget of an input inside the node (`inputSpent`) is that input's: the input is dead-lettered
   * now, so a restart mends it, and it spends none of the replica's restarts (where restarts are allowed).
   * Restarts are numbered among all of the replica's.
   */
  #decide(
    replica: Replica,
    exited: NodeExited,
    inputSpent: boolean,
  ): SupervisionDecision | { kind: "give_up"; event: null } {
    if (this.#forced || this.#ending || this.#stopping && exited.code !== 0) {
      return { kind: "give_up", event: null };
    }
    const own = replica.restarts - replica.restartsForInputs;
    const mended = inputSpent && restartCanMend(exited) && this.#policy.shouldRestart(0, exited.disposition);
    const decision = mended
      ? { kind: "restart" as const, delaySeconds: this.#policy.delayFor(own) }
      : this.#policy.decide(exited, own);
    const over = replica.endMarker === EndMarker.abort || replica.streamEnded;
    switch (decision.kind) {
      case "finished":
        return decision;
      case "restart":
        if (!over) {
          const { delaySeconds } = decision;
          const event = nodeRestarted(exited.node, exited.replica, replica.restarts + 1, delaySeconds);
          return { kind: "restart", delaySeconds, event };
        }
    }
    return {
      kind: "give_up",
      event: nodeGaveUp(exited.node, exited.replica, replica.restarts, exited.reason),
    };
  }

  /**
   * A replica the supervisor gave up on, whose ABORT ends its children: the flow cannot finish, so the
   * producers are stopped and everything else drains or aborts.
   */
  #abortFlow(failed: Replica): void {
    this.#view.event(`giving up on ${failed.spec.name}[${failed.index}]: stopping the flow`);
    this.stop();
  }

  /**
   * A replica the supervisor gave up on that ended without an end marker (killed, wedged, or a worker-fatal
   * failure): its children would wait for it forever, so the run ends here ({@link #killTheRest}).
   */
  #endRun(failed: Replica): void {
    this.#killTheRest(
      `giving up on ${failed.spec.name}[${failed.index}], which ended without telling its children: ` +
        "ending the run",
      new FlowFailed(
        `stopped by the supervisor: ${failed.spec.name}[${failed.index}] was given up on without ending ` +
          "its stream, so the run ends",
        `see why ${failed.spec.name}[${failed.index}] failed above`,
      ),
      failed,
    );
  }

  /**
   * The run's state cannot be written (its ledger, its dead letters: a disk read-only, full or failing):
   * nothing more can be recorded, so the run ends at once, with exit status 3 and `error` as its outcome
   * ({@link #killTheRest}). What the ledger holds is whole, and a re-run once the disk is mended goes on
   * from there.
   */
  #endOnUnwritableState(error: ResourceUnavailable): void {
    if (this.#stateUnwritable !== null) return;
    this.#stateUnwritable = error;
    if (this.#settled) return;
    this.#killTheRest(`${describeFailure(error)}: ending the run`, error, null);
  }

  /**
   * Runs `write`, a write of the run's state after every replica ended; a disk failure ends the run as
   * {@link #endOnUnwritableState} says and resolves with false. Anything else is thrown.
   */
  async #keepingState(write: () => Promise<void>): Promise<boolean> {
    try {
      await write();
      return true;
    } catch (error) {
      if (!isDiskFailure(error)) throw error;
      this.#endOnUnwritableState(error as ResourceUnavailable);
      return false;
    }
  }

  /**
   * Ends the run here, saying `announcement`: every replica but `spared` is killed with `reason`; their
   * statuses do not count toward the run's, whose ledger keeps what was done for a re-run.
   */
  #killTheRest(announcement: string, reason: VideoflowError, spared: Replica | null): void {
    if (this.#ending) return;
    this.#ending = true;
    this.#stopping = true;
    this.#view.event(announcement);
    for (const replica of this.#held.splice(0)) replica.state = NodeState.failed;
    for (const replica of this.#replicas) {
      if (replica === spared) continue;
      if (replica.state === NodeState.restarting) replica.state = NodeState.failed;
      if (replica.exitCode !== null) continue;
      replica.endedBySupervisor = true;
      replica.reason = { ...reason.toDict() };
      replica.kill?.();
    }
  }

  /**
   * Writes the run's dead letters to its file, after any write still running. Each dead letter the broker
   * stores is written before its publication is answered, so its failed input is acked only once the
   * letter is on disk.
   */
  #writeDeadLetters(): Promise<void> {
    return this.#deadLetterWrites.request();
  }

  /** The run's dead letters: an earlier supervisor's (a re-run), then this broker's. */
  #deadLetters(): DeadLetterRecord[] {
    return mergeDeadLetters(this.#earlierDeadLetters, this.#currentDeadLetters());
  }

  /** The dead letters this broker holds: this supervisor's part of the run. */
  #currentDeadLetters(): DeadLetterRecord[] {
    return this.#options.specs.flatMap((spec) => this.#lettersOf(spec).map(deadLetterRecord));
  }

  /** The dead letters this broker holds of `spec`'s node, as envelopes. */
  #lettersOf(spec: NodeSpec): Envelope[] {
    return this.#broker.deadLettersOf(spec.name);
  }

  /**
   * The inputs of a replica given up on for good that no other replica will take: its partition's, or,
   * for replicas that share one subscription, theirs once none of them is left. Its parents' channels no
   * longer keep messages for it (each released one is a `consumer_gone` drop), so a producer it held back
   * at the channel limit can take the flow's stop and end its stream.
   */
  #abandonInputsOf(replica: Replica): void {
    // A forced or ended run keeps its broker's work for nothing: it is not counted as dropped.
    if (this.#forced || this.#ending) return;
    const { spec } = replica;
    if (!spec.isPartitioned && this.#replicas.some((r) => r.spec === spec && !hasEnded(r))) return;
    const { flowId, runId } = this.#options;
    for (const parent of spec.parents) {
      const channel = channelId(flowId, runId, parent);
      this.#broker.abandon(dataSubscriptionId(channel, spec.name, spec.isPartitioned ? replica.index : null));
    }
  }

  /**
   * Tells the broker which messages each partitioned replica's subscription owns, so that what a realtime
   * channel evicts counts as a drop for the one replica that would have processed it, not for each.
   */
  #ownPartitionDrops(): void {
    const { flowId, runId, specs } = this.#options;
    for (const spec of specs) {
      const partitionBy = spec.partitionBy;
      if (partitionBy === null || !spec.isPartitioned) continue;
      for (const parent of spec.parents) {
        for (let partition = 0; partition < spec.nbTasks; partition++) {
          this.#broker.setDropOwnership(
            dataSubscriptionId(channelId(flowId, runId, parent), spec.name, partition),
            (envelope) => envelopeOwner(envelope.body, partitionBy, spec.nbTasks) === partition,
          );
        }
      }
    }
  }

  #snapshots(): NodeSnapshot[] {
    return this.#options.specs.map((spec) => {
      const replicas = this.#replicas.filter((r) => r.spec === spec);
      const states = replicas.map((r) => r.state);
      const state = states.includes(NodeState.failed)
        ? NodeState.failed
        : states.every((s) => s === NodeState.done)
        ? NodeState.done
        : states.includes(NodeState.restarting)
        ? NodeState.restarting
        : states.includes(NodeState.running)
        ? NodeState.running
        : states.every((s) => s === NodeState.waiting)
        ? NodeState.waiting
        : NodeState.starting;
      const unseen = this.#broker.unseenDrops(spec);
      const counts = replicas.reduce(
        (sum, r) => addCounts(addCounts(sum, r.earlier), r.stats),
        { ...NO_COUNTS, drops: unseen ?? {} },
      );
      const letters = this.#lettersOf(spec);
      return {
        node: spec.name,
        state,
        replicasRunning: replicas.filter((r) =>
          r.exitCode === null && r.state !== NodeState.restarting
        ).length,
        replicas: replicas.length,
        processed: counts.processed,
        failed: counts.failed,
        inFlight: this.#broker.unsettledOutputs(spec.name),
        drops: dropsBesideDeadLetters(counts.drops, letters.map((letter) => deadLetterError(letter).code)),
        dropsUncounted: unseen === null,
        deadLetters: letters.length,
        restarts: replicas.reduce((sum, r) => sum + r.restarts, 0),
      };
    });
  }

  async #supervise(): Promise<void> {
    const refresh = (this.#options.refreshSeconds ?? 1) * 1000;
    const silence = this.#silence;
    let shownAt = -Infinity;
    let forcedAt: number | null = null;
    while (!this.#replicas.every(hasEnded)) {
      // A forced stop kills every replica: their exits are awaited briefly, so the summary shows them ended.
      if (this.#forced) {
        forcedAt ??= performance.now() / 1000;
        const killed = this.#replicas.every((r) => r.exitCode !== null || r.kill === null);
        if (killed || performance.now() / 1000 - forcedAt > FORCED_EXIT_WAIT_SECONDS) break;
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, refresh);
        this.#wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.#wake = null;
      const now = performance.now() / 1000;
      for (const replica of this.#replicas) {
        if (
          silence !== null && replica.exitCode === null && replica.state !== NodeState.restarting &&
          replica.state !== NodeState.waiting && now - replica.lastReportAt > silence
        ) {
          const stalled = new ProgressStalled(
            `node ${replica.spec.name} replica ${replica.index} went silent for ${silence} s: its event loop ` +
              "is blocked (a synchronous call that never returns), where its own watchdog cannot run",
            "find the node's call that never yields; the replica is stopped and its inputs are redelivered. " +
              "If one call is legitimately this long, raise VF_PROGRESS_TIMEOUT_SECONDS",
            { node: replica.spec.name, replica: replica.index, silent_for_seconds: silence },
          );
          replica.reason = { ...stalled.toDict() };
          const kill = replica.kill;
          this.#exited(replica, EXIT_STALLED);
          kill?.();
        }
      }
      this.#noticeHeld(now);
      this.#endStillOpening(now);
      if (now - shownAt >= refresh / 1000) {
        shownAt = now;
        const snapshots = this.#snapshots();
        this.#view.update(now, snapshots);
      }
    }
  }
}

/** One line for a failure that ends a run: its code, message and remedy. */
function describeFailure(error: VideoflowError): string {
  return describeReasonAndRemedy({ ...error.toDict() });
}

/** Linux's number of each signal, as a shell reports a process it ended (128 + the number). */
const SIGNAL_NUMBERS: Readonly<Partial<Record<Deno.Signal, number>>> = {
  SIGHUP: 1,
  SIGINT: 2,
  SIGQUIT: 3,
  SIGILL: 4,
  SIGTRAP: 5,
  SIGABRT: 6,
  SIGBUS: 7,
  SIGFPE: 8,
  SIGKILL: 9,
  SIGUSR1: 10,
  SIGSEGV: 11,
  SIGUSR2: 12,
  SIGPIPE: 13,
  SIGALRM: 14,
  SIGTERM: 15,
  SIGSTKFLT: 16,
  SIGCHLD: 17,
  SIGCONT: 18,
  SIGSTOP: 19,
  SIGTSTP: 20,
  SIGTTIN: 21,
  SIGTTOU: 22,
  SIGURG: 23,
  SIGXCPU: 24,
  SIGXFSZ: 25,
  SIGVTALRM: 26,
  SIGPROF: 27,
  SIGWINCH: 28,
  SIGIO: 29,
  SIGPOLL: 29,
  SIGPWR: 30,
  SIGSYS: 31,
};

/** The status of a replica a signal ended: 128 + the signal's number (4, a failure, for one Linux lacks). */
function signalStatus(signal: Deno.Signal): number {
  const number = SIGNAL_NUMBERS[signal];
  return number === undefined ? EXIT_FLOW_FAILED : 128 + number;
}
