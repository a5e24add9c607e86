/**
 * The task loops that drive one node inside its worker (spec core.task). A node computes; its task runs
 * the loop around it: it receives input through the {@link Messenger}, calls the node, publishes what the
 * node returned, acknowledges the input only after that (ack-after-process), and ends the node's stream
 * with EOS, or with ABORT when the node cannot go on.
 *
 * - {@link ProducerTask}: termination check → `next()` → publish, until {@link END} or a stop. END and the
 *   flow-wide control stop publish EOS; a quiesce or a lost authority publishes nothing (a replacement
 *   continues the stream). An error from `next()` ends the producer (it has no per-message failure path).
 * - {@link ProcessorTask} and {@link ConsumerTask}: receive a group → ABORT from any parent is relayed and
 *   ends the node (it outranks a sibling's EOS, ABORT-3) → EOS from every parent is forwarded and ends it →
 *   otherwise the node gets its input, the output is published (a processor's deferred checkpoint rides
 *   with it) and the inputs are acked. A failure goes to `failInputs` (the delivery policy decides its
 *   cost), counts toward the breaker (which trips only on a run the policy gave up on once), and the loop
 *   goes on, unless the failure is worker_fatal: then the loop ends so the inputs go to a healthy replica
 *   (story 24).
 * - {@link NodeTask.run}: `open()` → loop → `close()`, `close()` in every case. A failure in `open()` or in
 *   the loop publishes ABORT before the task ends, so the graph downstream terminates instead of waiting
 *   for an EOS that never comes; a worker_fatal failure publishes none, since the node is not ending, only
 *   this worker (a restart or another replica takes its inputs over), unless it is the author's mistake
 *   (exit 2), which no restart mends. It resolves with a
 *   {@link TaskOutcome} the worker turns into its exit status.
 *
 * Between two messages the loop beats the health state, checks the breaker and the progress deadline;
 * the watchdog, started once `open()` returned, re-checks the same deadline while the node is inside a
 * call. Every node method gets the {@link RuntimeContext} as its last argument.
 *
 * Core imports no runtime module: the watchdog, the health state and the idempotency store are taken as
 * the narrow interfaces below, which `ProgressWatchdog`, `HealthState` and `LedgerIdempotencyStore`
 * satisfy.
 *
 * @example
 * ```ts
 * const task = new ProcessorTask(node, { messenger, ctx, hasChildren: true, parentNames: ["cam"] });
 * const outcome = await task.run();
 * Deno.exit(outcome.exitCode);
 * ```
 *
 * @module
 */

import { undeclaredPermission } from "./undeclared_permission.ts";
import { type Clock, systemClock } from "../backends/clock.ts";
import {
  Barrier,
  barrier,
  type BarrierContext,
  faultsInstalled,
  SimulatedCrash,
} from "../backends/faults.ts";
import { sinkIdempotencyKey } from "../wire/identities.ts";
import { WireDouble } from "../wire/value.ts";
import {
  ACTUAL_PROCTIME_METADATA_KEY,
  CHECKPOINT_METADATA_KEY,
  PROCTIME_METADATA_KEY,
  type RuntimeContext,
} from "./context.ts";
import { BEST_EFFORT, type DeliveryMode } from "./delivery_policy.ts";
import { DropReason, Metric } from "./metrics.ts";
import {
  asRuntimeError,
  ConfigError,
  DEFAULT_DISPOSITION,
  type Disposition,
  errorToDict,
  EXIT_USER,
  POISON,
  SchemaError,
  TRANSIENT,
  UpstreamAborted,
  VideoflowError,
  type VideoflowRuntimeError,
  WORKER_FATAL,
} from "./errors.ts";
import type { InputEntry, InputGroup, InputInfo, Messenger } from "./messenger.ts";
import { StopReason } from "./messenger.ts";
import { ConsumerNode, END, type Node, ProcessorNode, ProducerNode, type ReceiverNode } from "./node.ts";
import type { ConsecutiveFailureBreaker, ProgressDeadline } from "./supervision.ts";

/** How a task ended. */
export const TaskEnd = {
  /** The stream ended cleanly: EOS published (a sink: every parent's EOS received). Exit 0. */
  finished: "finished",
  /** A parent aborted; the ABORT was relayed downstream. Exit 4. */
  upstreamAborted: "upstream_aborted",
  /** A quiesce or a lost authority stopped the task; no EOS, a replacement continues the stream. */
  stopped: "stopped",
  /** The node or the loop failed; the error says why and carries the exit status. */
  failed: "failed",
} as const;
/** How a task ended. */
export type TaskEnd = typeof TaskEnd[keyof typeof TaskEnd];

/** Exit status of a worker ended by SIGTERM (128 + 15): what a quiesced task reports (story 39). */
export const SIGTERM_EXIT_CODE = 143;

/** The stream ended cleanly. */
export interface TaskFinished {
  readonly kind: typeof TaskEnd.finished;
  readonly exitCode: 0;
}

/** A parent aborted: this task relayed the ABORT and stopped. */
export interface TaskUpstreamAborted {
  readonly kind: typeof TaskEnd.upstreamAborted;
  /** Names the parent and carries the origin's error record (`context.origin_error`). */
  readonly error: UpstreamAborted;
  /** The parent whose entry carried the ABORT. */
  readonly parent: string;
  /** The node where the failure began. */
  readonly origin: string;
  readonly exitCode: number;
}

/** A stop that is not the end of the stream: no EOS was published. */
export interface TaskStopped {
  readonly kind: typeof TaskEnd.stopped;
  readonly reason: typeof StopReason.quiesce | typeof StopReason.authorityLost;
  /** {@link SIGTERM_EXIT_CODE} after a quiesce; 0 after a lost authority (the replacement owns the work). */
  readonly exitCode: number;
}

/** The node or the loop failed. */
export interface TaskFailed {
  readonly kind: typeof TaskEnd.failed;
  readonly error: VideoflowError;
  /** Whether an ABORT marker carrying `error` was published. */
  readonly abortPublished: boolean;
  /**
   * Whether the node's stream had ended cleanly before `error` (it failed in `close()` after its loop
   * finished: EOS went out, or a sink consumed every input): running it again would make it all again.
   */
  readonly streamEnded: boolean;
  /** The error's exit status (2 user, 3 environment, 4 runtime, 5 stalled). */
  readonly exitCode: number;
}

/** How a task ended, with the exit status the worker should end with. */
export type TaskOutcome = TaskFinished | TaskUpstreamAborted | TaskStopped | TaskFailed;

/** What the task feeds the worker's health probes and metrics; `HealthState` satisfies it. */
export interface TaskHealth {
  /** The loop is alive. */
  beat(): void;
  /** `open()` returned: the node is ready. */
  markReady(): void;
  /** One observation of a histogram family. */
  observe(metric: string, value: number | null): void;
  /** Adds to a counter family. */
  incr(counter: string, amount?: number): void;
  /** One input group of real work handed to the node (markers excluded). */
  recordOffered(): void;
  /** Input groups given up on by policy, by reason. */
  recordDrop(reason: string, count?: number): void;
  /** One failure, by its stable code and disposition. */
  recordError(code: string, disposition: string): void;
}

/** The watchdog the task arms once `open()` returned and disarms when the loop ends; `ProgressWatchdog` fits. */
export interface TaskWatchdog {
  start(): void;
  stop(): void;
}

/**
 * Told when a receiving node is handed an input group and when that call ended, so that a replica that
 * dies inside the call (a crash, a stall) can be charged to the inputs it held, and only to those.
 */
export interface InputCallWatch {
  /** The node is being handed the input group last received. */
  entered(): void;
  /** The node's call on it returned or threw. */
  left(): void;
}

/** The effect markers an idempotent sink's task checks and sets; `IdempotencyStore` fits. */
export interface EffectMarkers {
  /** Whether the effect keyed `key` was already applied. */
  seen(key: string): Promise<boolean>;
  /** Marks it applied. */
  mark(key: string): Promise<boolean>;
}

/** What every task is built with. */
export interface NodeTaskOptions {
  /** The node's messenger, bound to it. */
  readonly messenger: Messenger;
  /** The context handed to every node method; the task sets its `emitsOutput` from `hasChildren`. */
  readonly ctx: RuntimeContext;
  /** Whether anything consumes this node's output; without children nothing is published. */
  readonly hasChildren: boolean;
  /** Trips after too many failures in a row (`VF_BREAKER_THRESHOLD`); none: never. */
  readonly breaker?: ConsecutiveFailureBreaker | null;
  /**
   * Trips when the node acks nothing while work is pending; the watchdog must hold the same instance. Its
   * silence runs from its construction, so an `open()` that outlasts the timeout while work is pending is
   * a stall at the first check.
   */
  readonly deadline?: ProgressDeadline | null;
  /** Re-checks the deadline while the node is inside a call; started after `open()`, stopped at the end. */
  readonly watchdog?: TaskWatchdog | null;
  /** Disposition of an error nothing classifies (`VF_ON_ERROR`); transient by default. */
  readonly onError?: Disposition;
  /** The node's delivery mode, which decides which failures count as drops; at-least-once by default. */
  readonly delivery?: DeliveryMode;
  /** Where the loop reports liveness, readiness and metrics; none: nothing is reported. */
  readonly health?: TaskHealth | null;
  /** Told around each call of a receiving node on an input group; none: nobody is told. */
  readonly inputCalls?: InputCallWatch | null;
  /** Times the node's calls (monotonic seconds); the system clock by default. */
  readonly clock?: Clock;
}

/** What a producer's task is built with. */
export interface ProducerTaskOptions extends NodeTaskOptions {
  /** A replayable source's last accepted offset (`Messenger.resumeOffset`): `seek` is called when above 0. */
  readonly resumeOffset?: number;
}

/** What a processor's or a consumer's task is built with. */
export interface ReceiverTaskOptions extends NodeTaskOptions {
  /** The parents, in `.from()` order: the order a join's input array follows. */
  readonly parentNames: readonly string[];
}

/** What a consumer's task is built with. */
export interface ConsumerTaskOptions extends ReceiverTaskOptions {
  /** Effect markers for an idempotent sink (`idempotent: true`); none: every delivery is consumed. */
  readonly effectMarkers?: EffectMarkers | null;
}

/** The message identity stamped into a node failure's context. */
export interface NodeCallIdentity {
  readonly node: string;
  readonly replica: number;
  readonly traceId?: string | null;
  readonly seq?: bigint | number | null;
  /** Disposition of an error nothing classifies; transient by default. */
  readonly onError?: string;
}

/** What {@link invokeNode} needs beside the method and its arguments. */
export interface InvokeOptions extends NodeCallIdentity {
  /** Passed as the method's last argument, always. */
  readonly ctx: RuntimeContext;
}

/**
 * What a node threw, as a classified {@link VideoflowRuntimeError} carrying the message identity (one of
 * ours is enriched in place, never re-wrapped). A {@link SimulatedCrash} is rethrown untouched: a death is
 * not a message failure.
 */
export function nodeFailure(error: unknown, identity: NodeCallIdentity): VideoflowRuntimeError {
  if (error instanceof SimulatedCrash) throw error;
  const context: Record<string, unknown> = { node: identity.node, replica: identity.replica };
  if (identity.traceId !== undefined && identity.traceId !== null) context.trace_id = identity.traceId;
  if (identity.seq !== undefined && identity.seq !== null) context.seq = identity.seq;
  return asRuntimeError(
    undeclaredPermission(error, identity.node) ?? error,
    identity.onError ?? DEFAULT_DISPOSITION,
    context,
  );
}

/**
 * The one seam where user code becomes framework-legible: calls `method(...args, ctx)`, awaits its
 * result, and rejects with whatever it threw converted by {@link nodeFailure}. A returned {@link END}
 * passes through like any other value.
 */
export async function invokeNode<const A extends readonly unknown[]>(
  method: (...args: [...A, RuntimeContext]) => unknown,
  args: A,
  options: InvokeOptions,
): Promise<unknown> {
  try {
    return await method(...args, options.ctx);
  } catch (error) {
    throw nodeFailure(error, options);
  }
}

/**
 * Ends a receiving node when any parent's entry is an ABORT (checked first, so an ABORT outranks a
 * sibling's EOS, ABORT-3): relays the parent's error record downstream unchanged (when the node has
 * children), then throws {@link UpstreamAborted} naming the parent and the origin and carrying the
 * origin's record. Returns when no entry aborted.
 */
export async function raiseIfAborted(
  group: InputGroup,
  parentNames: readonly string[],
  messenger: Messenger,
  hasChildren: boolean,
  node: string,
): Promise<void> {
  const parent = parentNames.find((name) => group[name]?.isAbort === true);
  if (parent === undefined) return;
  const entry = group[parent] as InputEntry;
  const origin = entry.abortOrigin ?? parent;
  const record = entry.abortError ?? errorToDict(
    new UpstreamAborted(`${origin} aborted without saying why`, null, { node: origin }),
  );
  const error = new UpstreamAborted(
    `${node} stopped: its parent ${parent} aborted (origin ${origin}: ${record.code}: ${record.message})`,
    "fix the failure at the origin node and run the flow again; this node only relayed it",
    { node, parent, origin, origin_error: record },
  );
  if (hasChildren) await messenger.publishAbort(record);
  throw error;
}

/** The per-parent facts of the group, first parent first, as a trace id and seq for a failure's context. */
function groupIdentity(
  info: Readonly<Record<string, InputInfo | InputInfo[] | null>> | null,
  parentNames: readonly string[],
): Pick<NodeCallIdentity, "traceId" | "seq"> {
  for (const name of parentNames) {
    const facts = info?.[name];
    const first = Array.isArray(facts) ? facts[0] : facts;
    if (first) return { traceId: first.traceId, seq: first.seq };
  }
  return {};
}

function elapsedSince(clock: Clock, start: number): number {
  return Math.max(0, clock.monotonic() - start);
}

/**
 * A node's task: `run()` opens the node, runs its loop, closes it in every case and resolves with how it
 * ended. Subclasses supply the loop.
 */
export abstract class NodeTask<N extends Node = Node> {
  /** The messenger the loop talks through. */
  protected readonly messenger: Messenger;
  /** The context every node method receives. */
  protected readonly ctx: RuntimeContext;
  /** Whether anything consumes this node's output. */
  protected readonly hasChildren: boolean;
  /** Disposition of an error nothing classifies. */
  protected readonly onError: Disposition;
  /** Where liveness and metrics go, or `null`. */
  protected readonly health: TaskHealth | null;
  /** The clock the node's calls are timed on. */
  protected readonly clock: Clock;
  readonly #node: N;
  readonly #breaker: ConsecutiveFailureBreaker | null;
  readonly #deadline: ProgressDeadline | null;
  readonly #watchdog: TaskWatchdog | null;
  readonly #delivery: DeliveryMode | null;

  constructor(node: N, options: NodeTaskOptions) {
    this.#node = node;
    this.messenger = options.messenger;
    this.ctx = options.ctx;
    this.hasChildren = options.hasChildren;
    this.onError = options.onError ?? DEFAULT_DISPOSITION;
    this.health = options.health ?? null;
    this.clock = options.clock ?? systemClock;
    this.#breaker = options.breaker ?? null;
    this.#deadline = options.deadline ?? null;
    this.#watchdog = options.watchdog ?? null;
    this.#delivery = options.delivery ?? null;
    this.ctx.emitsOutput = options.hasChildren;
  }

  /** The node this task drives. */
  get computationNode(): N {
    return this.#node;
  }

  /**
   * Opens the node, runs the loop and closes the node, whatever happened (a close that fails after a clean
   * loop turns the outcome into that failure). A failure in `open()` or in the loop publishes ABORT unless
   * a restart would go on with the stream (worker_fatal, and not the author's mistake, exit 2). Rejects
   * only with a {@link SimulatedCrash}, which, like a real death, skips everything after it.
   */
  async run(): Promise<TaskOutcome> {
    let outcome: TaskOutcome;
    try {
      await invokeNode((ctx) => this.#node.open(ctx), [], this.invokeOptions(this.callIdentity()));
      this.health?.markReady();
      this.#watchdog?.start();
      outcome = await this.loop();
    } catch (error) {
      if (error instanceof SimulatedCrash) throw error;
      // The groups the node finished before it stopped are acked (and counted) before the task ends; a
      // failure among them changes nothing about how it ends.
      await this.messenger.awaitInFlight().catch(() => {});
      outcome = error instanceof UpstreamAborted ? upstreamAborted(error) : await this.#failed(error);
    } finally {
      this.#watchdog?.stop();
    }
    try {
      await invokeNode((ctx) => this.#node.close(ctx), [], this.invokeOptions(this.callIdentity()));
    } catch (error) {
      if (error instanceof SimulatedCrash) throw error;
      const failure = nodeFailure(error, this.callIdentity());
      this.ctx.logger.error("close() failed", { code: failure.code, error: failure.message });
      if (outcome.kind !== TaskEnd.failed) {
        outcome = failed(failure, false, outcome.kind === TaskEnd.finished);
      }
    }
    return outcome;
  }

  /** The node's loop: resolves with a clean end, rejects with what stopped it. */
  protected abstract loop(): Promise<TaskFinished | TaskStopped>;

  /** The identity stamped into a failure of a node call, plus the trace of the group being processed. */
  protected callIdentity(trace: Pick<NodeCallIdentity, "traceId" | "seq"> = {}): NodeCallIdentity {
    return { node: this.#node.name, replica: this.ctx.replicaId, onError: this.onError, ...trace };
  }

  /** The context a node call runs with, for {@link invokeNode}. */
  protected invokeOptions(identity: NodeCallIdentity): InvokeOptions {
    return { ...identity, ctx: this.ctx };
  }

  /** Beats, reports the messenger's drops, and checks the breaker and the progress deadline. */
  protected async betweenMessages(): Promise<void> {
    this.health?.beat();
    if (this.health !== null) {
      for (const [reason, count] of Object.entries(this.messenger.takeDrops())) {
        if (count > 0) this.health.recordDrop(reason, count);
      }
    }
    this.#breaker?.check();
    await this.#deadline?.check();
  }

  /** The stop the messenger reports when it is one that ends the task without EOS, else `null`. */
  protected quietStop(): TaskStopped | null {
    if (!this.messenger.checkForTermination()) return null;
    const reason = this.messenger.stopReason() ?? StopReason.control;
    if (reason === StopReason.control) return null;
    return {
      kind: TaskEnd.stopped,
      reason,
      exitCode: reason === StopReason.quiesce ? SIGTERM_EXIT_CODE : 0,
    };
  }

  /**
   * Ends the loop on a stop or the end of the stream: a quiet stop (after a quiesce, once the work in flight
   * landed: a refused output then fails the task instead of vanishing), or a clean {@link finish}.
   */
  protected async end(): Promise<TaskFinished | TaskStopped> {
    const stop = this.quietStop();
    if (stop === null) return await this.finish();
    if (stop.reason === StopReason.quiesce) await this.messenger.awaitInFlight();
    return stop;
  }

  /** Ends the stream cleanly: EOS downstream (when there is a downstream) once everything in flight landed. */
  protected async finish(): Promise<TaskFinished> {
    if (this.hasChildren) await this.messenger.publishStopSignal();
    else await this.messenger.awaitInFlight();
    return { kind: TaskEnd.finished, exitCode: 0 };
  }

  /**
   * Publishes one output (when there is a downstream) stamped with its timing (`proctime` from `startedAt`
   * to now, `actual_proctime` the node's call), with the node's deferred checkpoint, if any. `onAccepted`
   * runs once the broker took it as new (at once without a downstream).
   */
  protected async publish(
    output: unknown,
    startedAt: number,
    callbackSeconds: number,
    onAccepted?: () => void,
  ): Promise<void> {
    const checkpoint = this.ctx.takePendingCheckpoint();
    if (!this.hasChildren) {
      onAccepted?.();
      return;
    }
    const value = output === undefined ? null : output;
    const metadata: Record<string, unknown> = {
      [PROCTIME_METADATA_KEY]: new WireDouble(elapsedSince(this.clock, startedAt)),
      [ACTUAL_PROCTIME_METADATA_KEY]: new WireDouble(callbackSeconds),
    };
    if (checkpoint !== null) metadata[CHECKPOINT_METADATA_KEY] = checkpoint;
    await this.messenger.publishMessage(value, metadata, onAccepted);
    this.health?.incr(Metric.published);
  }

  /**
   * Counts one item as processed: a producer's output the broker took as new, a receiver's input group
   * whose acknowledgement the broker confirmed. So a restart that makes or processes an item again does
   * not count it twice.
   */
  protected readonly countProcessed = (): void => this.health?.incr(Metric.processed);

  /**
   * Records one unit of work done: resets the breaker and the deadline's silence, and times it (`proctime`
   * the whole iteration, receipt to ack; `actual_proctime` the node's call).
   */
  protected recordSuccess(callbackSeconds: number, iterationSeconds: number): void {
    this.#breaker?.recordSuccess();
    this.#deadline?.recordProgress();
    this.health?.observe(Metric.proctime, iterationSeconds);
    this.health?.observe(Metric.actualProctime, callbackSeconds);
  }

  /**
   * Hands a failed input group to the delivery policy (`failInputs`), counts it toward the breaker (with
   * whether the policy gave it up), the metrics and the drops; throws the failure back when it is
   * worker_fatal, which ends the loop.
   */
  protected async failInputs(failure: VideoflowRuntimeError): Promise<void> {
    const givenUp = await this.messenger.failInputs(failure);
    this.#breaker?.recordFailure(failure, givenUp);
    this.#deadline?.recordProgress();
    const disposition = failure.disposition;
    this.health?.incr(Metric.failed);
    this.health?.recordError(failure.code, disposition);
    if (disposition === POISON) this.health?.recordDrop(DropReason.poison);
    else if (disposition === TRANSIENT && this.#delivery === BEST_EFFORT) {
      this.health?.recordDrop(DropReason.bestEffort);
    }
    this.ctx.logger.warn("the node failed on an input group", {
      code: failure.code,
      disposition,
      error: failure.message,
      ...failure.context,
    });
    if (disposition === WORKER_FATAL) throw failure;
  }

  async #failed(error: unknown): Promise<TaskFailed> {
    const failure = error instanceof VideoflowError ? error : nodeFailure(error, this.callIdentity());
    let abortPublished = false;
    // A worker-fatal failure is left to a restart, which goes on with the stream; the author's mistake
    // (exit 2) is never restarted (`restartCanMend`), so the children are told now, not left waiting.
    const restartable = failure.disposition === WORKER_FATAL && failure.exitCode !== EXIT_USER;
    if (!restartable && this.hasChildren) {
      try {
        await this.messenger.publishAbort(failure);
        abortPublished = true;
      } catch (publishError) {
        this.ctx.logger.error("the ABORT marker could not be published", {
          code: failure.code,
          error: errorToDict(publishError).message,
        });
      }
    }
    this.ctx.logger.error("the node failed", {
      code: failure.code,
      error: failure.message,
      ...failure.context,
    });
    return failed(failure, abortPublished);
  }
}

function failed(error: VideoflowError, abortPublished: boolean, streamEnded = false): TaskFailed {
  return { kind: TaskEnd.failed, error, abortPublished, streamEnded, exitCode: error.exitCode };
}

function upstreamAborted(error: UpstreamAborted): TaskUpstreamAborted {
  const parent = String(error.context.parent ?? "");
  return {
    kind: TaskEnd.upstreamAborted,
    error,
    parent,
    origin: String(error.context.origin ?? parent),
    exitCode: error.exitCode,
  };
}

/**
 * Calls `next()` until the source ends (END: EOS) or the messenger reports a stop (the control stop: EOS;
 * a quiesce or a lost authority: nothing). A replayable source is first positioned past `resumeOffset`.
 */
export class ProducerTask extends NodeTask<ProducerNode> {
  readonly #resumeOffset: number;

  /** Throws {@link ConfigError} for a resume offset that is not a whole number of 0 or more. */
  constructor(producer: ProducerNode, options: ProducerTaskOptions) {
    super(producer, options);
    const offset = options.resumeOffset ?? 0;
    if (!Number.isSafeInteger(offset) || offset < 0) {
      throw new ConfigError(
        `the resume offset of ${producer.name} must be a whole number of 0 or more, got ${offset}`,
        "pass the offset the messenger's resumeOffset() returned",
        { node: producer.name, resume_offset: offset },
      );
    }
    this.#resumeOffset = offset;
  }

  protected async loop(): Promise<TaskFinished | TaskStopped> {
    const producer = this.computationNode;
    const options = this.invokeOptions(this.callIdentity());
    if (this.#resumeOffset > 0) {
      await invokeNode((offset, ctx) => producer.seek(offset, ctx), [this.#resumeOffset], options);
    }
    for (;;) {
      await this.betweenMessages();
      if (this.messenger.checkForTermination()) return await this.end();
      const started = this.clock.monotonic();
      if (faultsInstalled()) await barrier(Barrier.producerNextBefore, { node: producer.name });
      const item = await invokeNode((ctx) => producer.next(ctx), [], options);
      const callbackSeconds = elapsedSince(this.clock, started);
      // An END that came with a stop (a source ending its wait at the context's stop signal) is that stop.
      if (item === END) return this.messenger.checkForTermination() ? await this.end() : await this.finish();
      await this.publish(item, started, callbackSeconds, this.countProcessed);
      this.recordSuccess(callbackSeconds, elapsedSince(this.clock, started));
    }
  }
}

/**
 * The loop of a node that receives input: a group at a time, ABORT and EOS handled, the node called, the
 * inputs acked after the output is out. Subclasses say how a group becomes the node's input and what the
 * node's call is.
 */
export abstract class ReceiverTask<N extends ReceiverNode = ReceiverNode> extends NodeTask<N> {
  /** The parents, in `.from()` order. */
  protected readonly parentNames: readonly string[];
  readonly #inputCalls: InputCallWatch | null;

  constructor(node: N, options: ReceiverTaskOptions) {
    super(node, options);
    this.#inputCalls = options.inputCalls ?? null;
    if (options.parentNames.length === 0) {
      throw new ConfigError(
        `${node.name} is a ${node.kind} with no parents`,
        "give the task the node's parent names (VF_PARENT_NAMES), in .from() order",
        { node: node.name },
      );
    }
    this.parentNames = [...options.parentNames];
  }

  /** The value one parent contributes to the node's input. */
  protected abstract inputOf(entry: InputEntry): unknown;

  /** Calls the node on one input; resolves with the node's result. */
  protected abstract apply(input: unknown, options: InvokeOptions): Promise<unknown>;

  /**
   * What follows a successful call, before the ack: a processor publishes its result (timed from
   * `receivedAt`, its call `callbackSeconds` long); a sink nothing.
   */
  protected deliver(_result: unknown, _receivedAt: number, _callbackSeconds: number): Promise<void> {
    return Promise.resolve();
  }

  protected async loop(): Promise<TaskFinished | TaskStopped> {
    for (;;) {
      await this.betweenMessages();
      if (this.quietStop() !== null) return await this.end();
      const group = await this.messenger.receiveMessage();
      const receivedAt = this.clock.monotonic();
      const present = this.parentNames.map((name) => group[name] ?? null);
      this.health?.incr(Metric.received, present.filter((entry) => entry !== null).length);
      await raiseIfAborted(
        group,
        this.parentNames,
        this.messenger,
        this.hasChildren,
        this.computationNode.name,
      );
      const stopped = present.some((entry) => entry?.isStopSignal === true) &&
        present.every((entry) => entry === null || entry.isStopSignal);
      if (stopped) return await this.end();
      this.health?.recordOffered();
      await this.#handle(present, receivedAt);
    }
  }

  /** The node's input: the single parent's value, or an array in parent order (`null` for a left-out parent). */
  #input(present: readonly (InputEntry | null)[]): unknown {
    const values = present.map((entry) => entry === null ? null : this.inputOf(entry));
    return values.length === 1 ? values[0] : values;
  }

  async #handle(present: readonly (InputEntry | null)[], receivedAt: number): Promise<void> {
    const identity = this.callIdentity(groupIdentity(this.messenger.lastInputInfo(), this.parentNames));
    const context: BarrierContext = { node: identity.node, trace_id: identity.traceId ?? null };
    let result: unknown;
    let callbackSeconds: number;
    try {
      if (faultsInstalled()) await barrier(Barrier.nodeProcessBefore, context);
      const started = this.clock.monotonic();
      this.#inputCalls?.entered();
      try {
        result = await this.apply(this.#input(present), this.invokeOptions(identity));
      } finally {
        this.#inputCalls?.left();
      }
      callbackSeconds = elapsedSince(this.clock, started);
      if (faultsInstalled()) await barrier(Barrier.nodeProcessAfter, context);
    } catch (error) {
      await this.failInputs(nodeFailure(error, identity));
      return;
    }
    try {
      await this.deliver(result, receivedAt, callbackSeconds);
    } catch (error) {
      // An output the wire cannot carry is the input's poison, like a throw from the node: nothing was sent.
      if (!(error instanceof SchemaError)) throw error;
      await this.failInputs(nodeFailure(error, identity));
      return;
    }
    await this.messenger.ackInputs(this.countProcessed);
    this.recordSuccess(callbackSeconds, elapsedSince(this.clock, receivedAt));
  }
}

/**
 * Receives each input group, passes it to `process()` (one parent: its message; a join: an array in
 * parent order) and publishes the output, `undefined` as `null`, so a downstream join never waits for a
 * trace this node skipped. Every parent's EOS is forwarded as this node's EOS.
 */
export class ProcessorTask extends ReceiverTask<ProcessorNode> {
  protected inputOf(entry: InputEntry): unknown {
    return entry.message;
  }

  protected apply(input: unknown, options: InvokeOptions): Promise<unknown> {
    const processor = this.computationNode;
    return invokeNode((value, ctx) => processor.process(value, ctx), [input], options);
  }

  protected override deliver(result: unknown, receivedAt: number, callbackSeconds: number): Promise<void> {
    return this.publish(result, receivedAt, callbackSeconds);
  }
}

/**
 * Receives each input group and passes it to `consume()`: the parents' messages, or their metadata for a
 * consumer built with `metadata: true`. An idempotent sink (`idempotent: true`) with effect markers skips
 * a group whose effect is already marked (keyed by the flow, the node and `ctx.inputKey`) and marks it
 * after `consume()` succeeded; either way the group is acked.
 */
export class ConsumerTask extends ReceiverTask<ConsumerNode> {
  readonly #markers: EffectMarkers | null;

  constructor(consumer: ConsumerNode, options: ConsumerTaskOptions) {
    super(consumer, options);
    this.#markers = consumer.idempotent ? options.effectMarkers ?? null : null;
  }

  protected inputOf(entry: InputEntry): unknown {
    return this.computationNode.metadata ? entry.metadata : entry.message;
  }

  protected async apply(input: unknown, options: InvokeOptions): Promise<unknown> {
    const consumer = this.computationNode;
    const markers = this.#markers;
    const inputKey = this.ctx.inputKey;
    if (markers === null || inputKey === null) {
      return await invokeNode((value, ctx) => consumer.consume(value, ctx), [input], options);
    }
    const key = sinkIdempotencyKey(this.ctx.flowId, consumer.name, inputKey);
    if (await markers.seen(key)) return null;
    const result = await invokeNode((value, ctx) => consumer.consume(value, ctx), [input], options);
    await markers.mark(key);
    return result;
  }
}

/** Everything any task takes: the options of the task the node's kind needs. */
export interface AnyTaskOptions extends NodeTaskOptions {
  readonly parentNames?: readonly string[];
  readonly resumeOffset?: number;
  readonly effectMarkers?: EffectMarkers | null;
}

/**
 * The task a node's kind runs under: {@link ProducerTask}, {@link ProcessorTask} or {@link ConsumerTask}.
 * Throws {@link ConfigError} for a receiving node without parent names, or a node of none of the three
 * kinds.
 */
export function createTask(node: Node, options: AnyTaskOptions): NodeTask {
  const parentNames = options.parentNames ?? [];
  if (node instanceof ProducerNode) return new ProducerTask(node, options);
  if (node instanceof ProcessorNode) return new ProcessorTask(node, { ...options, parentNames });
  if (node instanceof ConsumerNode) return new ConsumerTask(node, { ...options, parentNames });
  throw new ConfigError(
    `${node.name} is neither a producer, a processor nor a consumer`,
    "extend ProducerNode, ProcessorNode or ConsumerNode",
    { node: node.name },
  );
}
