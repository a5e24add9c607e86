/**
 * When to give up: on a worker, on a node, on a whole flow (spec core.supervision). Everything here is
 * pure (no I/O; time comes from an injected {@link Clock}), so the task loop, the local engine and the
 * Kubernetes renderer hold the same objects and agree by construction.
 *
 * - {@link ConsecutiveFailureBreaker}: worker-scoped; a run of failures in a row that the delivery policy
 *   gave up on at least once is a sick worker, not bad data (story 25).
 * - {@link ProgressDeadline}: node-scoped; "wedged" is work pending and nothing acked, read from the broker
 *   as an {@link Observation} so a failed read is never mistaken for an idle node (story 7).
 * - {@link SupervisionPolicy}: engine-scoped; how a dead worker is restarted, and when the engine gives up.
 * - The lifecycle events ({@link NodeStarted}, {@link NodeExited}, {@link NodeRestarted}, {@link NodeGaveUp},
 *   {@link FlowStalledEvent}) and {@link EventLog}: both engines emit the same records, and
 *   {@link renderEvent} prints them.
 *
 * @example
 * ```ts
 * const policy = SupervisionPolicy.local();
 * const exited = nodeExited("detect", 0, 4, { code: "VF_TRANSIENT", message: "model server down", disposition: "transient" });
 * const decision = policy.decide(exited, 0);
 * if (decision.kind === "restart") console.log(renderEvent(decision.event)); // detect[0] restarting in 1s (restart 1)
 * ```
 *
 * @module
 */

import { requireCount, requireSeconds } from "./checks.ts";
import { type Clock, systemClock } from "../backends/clock.ts";
import type { Observation } from "../backends/outcomes.ts";
import {
  BrokerUnavailable,
  ConfigError,
  type Disposition,
  DISPOSITIONS,
  errorToDict,
  EXIT_USER,
  isDisposition,
  isLastingFailure,
  ProgressStalled,
  TRANSIENT,
  UpstreamAborted,
  WORKER_FATAL,
  WorkerUnhealthy,
} from "./errors.ts";

/** Consecutive failures before a worker declares itself sick (`VF_BREAKER_THRESHOLD`; 0 disables). */
export const DEFAULT_BREAKER_THRESHOLD = 10;

/** Seconds a node may ack nothing while work is pending before it is stalled (`VF_PROGRESS_TIMEOUT_SECONDS`). */
export const DEFAULT_PROGRESS_TIMEOUT_SECONDS = 300;

/**
 * Trips when a worker fails `threshold` messages in a row and the delivery policy gave up on (dead-lettered
 * or dropped) at least one of them. Any success resets the count, so poison messages interleaved with good
 * ones never trip it. It counts every failure whatever its disposition: its value is catching the illness
 * the taxonomy did not label. A run of failures that are all being retried does not trip it, however long
 * the prefetch makes it: whether an item deserves another attempt is the delivery policy's to judge, and an
 * item that succeeds within its retry budget is no sign of a sick worker. A worker that fails everything
 * still trips it, at the first item whose budget runs out.
 */
export class ConsecutiveFailureBreaker {
  /** Consecutive failures that trip it; 0 disables the breaker. */
  readonly threshold: number;
  /** Named in the raised error, since that is what an operator reads. */
  readonly nodeName: string;
  #failures = 0;
  #givenUp = false;
  #lastFailure: unknown = undefined;

  /** Throws ConfigError unless `threshold` is a whole number of 0 or more. */
  constructor(threshold: number = DEFAULT_BREAKER_THRESHOLD, nodeName = "") {
    this.threshold = requireCount(
      threshold,
      "threshold",
      0,
      "set VF_BREAKER_THRESHOLD to 0 (off) or a count",
    );
    this.nodeName = nodeName;
  }

  /** Failures since the last success. */
  get consecutiveFailures(): number {
    return this.#failures;
  }

  /**
   * Whether the run of failures reached the threshold and the delivery policy gave up on one of them
   * (never, when disabled).
   */
  get tripped(): boolean {
    return this.threshold > 0 && this.#failures >= this.threshold && this.#givenUp;
  }

  /**
   * A message failed; counts toward the trip regardless of its disposition. `givenUp` says whether the
   * delivery policy gave the message up (dead-lettered or dropped it) rather than retrying it.
   */
  recordFailure(error: unknown, givenUp = true): void {
    this.#failures++;
    this.#givenUp ||= givenUp;
    this.#lastFailure = error;
  }

  /** A message was processed and acked: the worker is demonstrably alive, so the run starts over. */
  recordSuccess(): void {
    this.#failures = 0;
    this.#givenUp = false;
    this.#lastFailure = undefined;
  }

  /**
   * Throws {@link WorkerUnhealthy} (worker_fatal) once tripped; the caller lets it out of the run loop so the
   * un-acked inputs return to the broker for a healthy replica.
   */
  check(): void {
    if (!this.tripped) return;
    const last = errorToDict(this.#lastFailure);
    throw new WorkerUnhealthy(
      `${
        this.nodeName || "the node"
      } failed ${this.#failures} attempts in a row (a redelivery counts again); the last: ${last.code}: ${last.message}`,
      "this worker is stopping so its inputs go to a healthy replica; if every replica trips, the cause is " +
        "shared (a dependency, the device, the node's code): fix it, or raise VF_BREAKER_THRESHOLD if such runs " +
        "of failures are expected",
      {
        node: this.nodeName,
        consecutive_failures: this.#failures,
        threshold: this.threshold,
        last_error_code: last.code,
      },
    );
  }
}

/** How many messages wait for a node, as the broker answered: Known(count) or Unknown(why). */
export type PendingProbe = () => Observation<number> | Promise<Observation<number>>;

/** Options of a {@link ProgressDeadline}. */
export interface ProgressDeadlineOptions {
  /** Allowed silence while work is pending; 0 disables the deadline. Default 300. */
  readonly timeoutSeconds?: number;
  /** How many messages wait for this node. Without one, pending reads as 0 (idle) and it never trips. */
  readonly pendingProbe?: PendingProbe | null;
  /** Named in the raised errors. */
  readonly nodeName?: string;
  /** Monotonic time source; the system clock by default. */
  readonly clock?: Clock;
  /** How long the probe may keep answering Unknown before that is BrokerUnavailable. Default 2 × timeout. */
  readonly unknownGraceSeconds?: number | null;
}

/**
 * Trips when a node has acked nothing for `timeoutSeconds` while the broker reports work pending: work is
 * available and none is being done. A slow node keeps acking and is never touched; an idle one (nothing
 * pending) is not stalled.
 *
 * How a probe answer counts:
 * - Known(n > 0) after the silence threshold: {@link ProgressStalled} (exit 5).
 * - Known(0): the node is idle. Work that arrives later has been pending only since this reading, so the
 *   silence window restarts here.
 * - Unknown: neither resets the window (that would hide a stall) nor trips it (that would blame the node
 *   for the broker). Once the probe has answered only Unknown for `unknownGraceSeconds`, the broker itself
 *   is the problem: {@link BrokerUnavailable}.
 *
 * The probe is consulted only after the silence threshold is crossed, so the common path costs nothing. A
 * progress recorded while a probe is in flight wins: that check raises nothing.
 */
export class ProgressDeadline {
  /** Allowed silence while work is pending; 0 disables it. */
  readonly timeoutSeconds: number;
  /** How long a run of Unknown answers is tolerated. */
  readonly unknownGraceSeconds: number;
  /** Named in the raised errors. */
  readonly nodeName: string;
  readonly #probe: PendingProbe | null;
  readonly #clock: Clock;
  #windowStart: number;
  #progressCount = 0;
  #unknownSince: number | null = null;

  /** Throws ConfigError for a negative or non-finite timeout or grace. */
  constructor(options: ProgressDeadlineOptions = {}) {
    this.timeoutSeconds = requireSeconds(
      options.timeoutSeconds ?? DEFAULT_PROGRESS_TIMEOUT_SECONDS,
      "timeoutSeconds",
    );
    this.unknownGraceSeconds = requireSeconds(
      options.unknownGraceSeconds ?? 2 * this.timeoutSeconds,
      "unknownGraceSeconds",
    );
    this.nodeName = options.nodeName ?? "";
    this.#probe = options.pendingProbe ?? null;
    this.#clock = options.clock ?? systemClock;
    this.#windowStart = this.#clock.monotonic();
  }

  /** Whether the deadline can ever trip (a timeout above 0). */
  get enabled(): boolean {
    return this.timeoutSeconds > 0;
  }

  /** Called on every ack and every failure (a failure is still work being done): the silence restarts. */
  recordProgress(): void {
    this.#windowStart = this.#clock.monotonic();
    this.#progressCount++;
    this.#unknownSince = null;
  }

  /** Seconds since the silence window started (the last progress, or the last idle reading). */
  silentFor(): number {
    return this.#clock.monotonic() - this.#windowStart;
  }

  /**
   * One check. Resolves when the node is progressing, idle, or the pending count is unknown within its
   * grace; rejects with {@link ProgressStalled} or {@link BrokerUnavailable} as the class comment says.
   * A probe that throws rejects with what it threw.
   */
  async check(): Promise<void> {
    if (!this.enabled || this.#probe === null) return;
    const silent = this.silentFor();
    if (silent < this.timeoutSeconds) return;
    const progressBefore = this.#progressCount;
    const pending = await this.#probe();
    if (this.#progressCount !== progressBefore) return;
    const now = this.#clock.monotonic();
    if (pending.kind === "unknown") {
      this.#unknownSince ??= now;
      const unknownFor = now - this.#unknownSince;
      if (unknownFor < this.unknownGraceSeconds) return;
      throw new BrokerUnavailable(
        `the pending work of ${this.#who()} could not be observed for ${unknownFor.toFixed(1)} s ` +
          `(${pending.reason}${pending.detail ? `: ${pending.detail}` : ""})`,
        "check that the broker is reachable from this worker; the node was not blamed, and its un-acked " +
          "inputs return to the broker",
        { node: this.nodeName, reason: pending.reason, unknown_for_seconds: unknownFor },
      );
    }
    this.#unknownSince = null;
    if (pending.value <= 0) {
      this.#windowStart = now;
      return;
    }
    throw new ProgressStalled(
      `${this.#who()} acked nothing for ${
        silent.toFixed(1)
      } s while ${pending.value} message(s) were pending`,
      "the node is wedged (a call that never returns, a deadlock, a dead device): the worker is replaced and " +
        "the inputs are redelivered; if the node is legitimately this slow, raise VF_PROGRESS_TIMEOUT_SECONDS",
      {
        node: this.nodeName,
        silent_for_seconds: silent,
        pending: pending.value,
        timeout_seconds: this.timeoutSeconds,
      },
    );
  }

  #who(): string {
    return this.nodeName ? `node ${this.nodeName}` : "the node";
  }
}

/** The structured cause a dead worker reported in its termination log (an {@link errorToDict} record). */
export type TerminationReason = Readonly<Record<string, unknown>>;

/**
 * Whether restarting could change how a replica ends: not for the author's mistake (exit 2: the same
 * configuration fails the same way), nor for a replica that stopped because a parent aborted (its input
 * stream is over), nor for a lasting environment failure (`isLastingFailure`: a disk that is full or
 * read-only fails the same write the same way until an operator mends it; a refused GPU grant is refused
 * again on the same host).
 */
export function restartCanMend(exited: NodeExited): boolean {
  return exited.code !== EXIT_USER && exited.reason?.code !== UpstreamAborted.code &&
    !isLastingFailure(exited.reason);
}

/** A worker was launched; `attempt` is 0 for the first launch, n for the n-th restart. */
export interface NodeStarted {
  readonly kind: "node_started";
  readonly node: string;
  readonly replica: number;
  readonly attempt: number;
}

/**
 * A worker exited with process status `code`; `reason` is what it reported in its termination log, when it
 * managed to. `clean` is an exit status of 0; `disposition` is the reason's, when it names one.
 */
export interface NodeExited {
  readonly kind: "node_exited";
  readonly node: string;
  readonly replica: number;
  readonly code: number;
  readonly reason: TerminationReason | null;
  readonly clean: boolean;
  readonly disposition: Disposition | null;
}

/** A worker is being restarted after `delay` seconds; `attempt` is the restart's number, from 1. */
export interface NodeRestarted {
  readonly kind: "node_restarted";
  readonly node: string;
  readonly replica: number;
  readonly attempt: number;
  readonly delay: number;
}

/**
 * A worker will not be restarted again after `attempts` restarts: the flow cannot complete on its own, so
 * this is what triggers the supervisor's control-abort.
 */
export interface NodeGaveUp {
  readonly kind: "node_gave_up";
  readonly node: string;
  readonly replica: number;
  readonly attempts: number;
  readonly reason: TerminationReason | null;
}

/** The flow can never finish: unschedulable work, or a node that stopped progressing. */
export interface FlowStalledEvent {
  readonly kind: "flow_stalled";
  readonly detail: string;
}

/** A lifecycle event, the same record from either engine. */
export type SupervisionEvent = NodeStarted | NodeExited | NodeRestarted | NodeGaveUp | FlowStalledEvent;

/** Constructs a {@link NodeStarted}. */
export function nodeStarted(node: string, replica: number, attempt = 0): NodeStarted {
  return Object.freeze({ kind: "node_started", node, replica, attempt });
}

/** Constructs a {@link NodeExited}, reading `clean` from the code and `disposition` from the reason. */
export function nodeExited(
  node: string,
  replica: number,
  code: number,
  reason: TerminationReason | null = null,
): NodeExited {
  const reported = reason?.disposition;
  const disposition = isDisposition(reported) ? reported : null;
  return Object.freeze({ kind: "node_exited", node, replica, code, reason, clean: code === 0, disposition });
}

/** Constructs a {@link NodeRestarted}. */
export function nodeRestarted(node: string, replica: number, attempt: number, delay: number): NodeRestarted {
  return Object.freeze({ kind: "node_restarted", node, replica, attempt, delay });
}

/** Constructs a {@link NodeGaveUp}. */
export function nodeGaveUp(
  node: string,
  replica: number,
  attempts: number,
  reason: TerminationReason | null = null,
): NodeGaveUp {
  return Object.freeze({ kind: "node_gave_up", node, replica, attempts, reason });
}

/** Constructs a {@link FlowStalledEvent}. */
export function flowStalled(detail: string): FlowStalledEvent {
  return Object.freeze({ kind: "flow_stalled", detail });
}

/** {@link describeReason}, then ` (remedy: …)` when the reason has a remedy. */
export function describeReasonAndRemedy(reason: TerminationReason | null): string {
  const remedy = reason?.remedy;
  return describeReason(reason) + (typeof remedy === "string" && remedy !== "" ? ` (remedy: ${remedy})` : "");
}

/** A termination reason as one line: `CODE: message`, the code alone, or "no reason reported". */
export function describeReason(reason: TerminationReason | null): string {
  if (reason === null) return "no reason reported";
  const code = typeof reason.code === "string" ? reason.code : "VF_UNKNOWN";
  return typeof reason.message === "string" ? `${code}: ${reason.message}` : code;
}

function seconds(value: number): string {
  return `${Number(value.toFixed(3))}s`;
}

/**
 * One human line per event, or `null` for the events not worth printing: a first launch and a clean exit
 * (the engine's progress display shows those).
 */
export function renderEvent(event: SupervisionEvent): string | null {
  switch (event.kind) {
    case "node_started":
      return event.attempt === 0
        ? null
        : `${event.node}[${event.replica}] started (restart ${event.attempt})`;
    case "node_exited":
      return event.clean
        ? null
        : `${event.node}[${event.replica}] exited with code ${event.code} (${describeReason(event.reason)})`;
    case "node_restarted":
      return `${event.node}[${event.replica}] restarting in ${
        seconds(event.delay)
      } (restart ${event.attempt})`;
    case "node_gave_up":
      return `${event.node}[${event.replica}] gave up after ${event.attempts} restart(s): ` +
        describeReasonAndRemedy(event.reason);
    case "flow_stalled":
      return `flow stalled: ${event.detail}`;
  }
}

/**
 * Collects lifecycle events for rendering and for the end-of-run report: a plain list, since the CLI is
 * its one consumer.
 */
export class EventLog {
  readonly #events: SupervisionEvent[] = [];

  /** Every event, in emission order. */
  get events(): readonly SupervisionEvent[] {
    return this.#events;
  }

  /** Appends an event. */
  emit(event: SupervisionEvent): void {
    this.#events.push(event);
  }

  /** Names of the nodes that gave up, in first-seen order, each once. */
  failedNodes(): string[] {
    const names = this.#events.flatMap((event) => event.kind === "node_gave_up" ? [event.node] : []);
    return [...new Set(names)];
  }

  /** How many restarts were made, of every node or of `node` only. */
  restartCount(node?: string): number {
    return this.#events.filter((event) =>
      event.kind === "node_restarted" && (node === undefined || event.node === node)
    ).length;
  }

  /** The printable lines of the events so far ({@link renderEvent}), in order. */
  lines(): string[] {
    return this.#events.flatMap((event) => renderEvent(event) ?? []);
  }
}

/** What an engine does about a worker that exited: nothing, restart it after a delay, or give up on it. */
export type SupervisionDecision =
  | { readonly kind: "finished" }
  | { readonly kind: "restart"; readonly delaySeconds: number; readonly event: NodeRestarted }
  | { readonly kind: "give_up"; readonly event: NodeGaveUp };

/** Options of a {@link SupervisionPolicy}; each defaults to the Kubernetes Job semantics. */
export interface SupervisionPolicyOptions {
  /** Restarts after the first launch; 0 disables restarts. Default 3 (a Job's backoffLimit). */
  readonly maxRestarts?: number;
  /** Delay before each restart, in seconds; the last value repeats. Default 10, 20, 40. */
  readonly backoffSeconds?: readonly number[];
  /** Dispositions worth restarting for. Default transient and worker_fatal; poison never helps. */
  readonly restartOn?: Iterable<string>;
}

/** The default backoff, as the Kubernetes manifests encode it. */
export const DEFAULT_BACKOFF_SECONDS: readonly number[] = Object.freeze([10, 20, 40]);

/** The local engine's compressed backoff: the same restarts, without a minute's wait at a terminal. */
export const LOCAL_BACKOFF_SECONDS: readonly number[] = Object.freeze([1, 2, 4]);

/**
 * How an engine responds to a worker exiting non-zero. The defaults mirror the Job semantics the manifests
 * encode (backoffLimit 3), so the local engine and the cluster agree; only {@link SupervisionPolicy.local}'s
 * backoff differs.
 */
export class SupervisionPolicy {
  /** Restarts after the first launch. */
  readonly maxRestarts: number;
  /** Delay before each restart; the last value repeats. */
  readonly backoffSeconds: readonly number[];
  /** Dispositions worth restarting for. */
  readonly restartOn: ReadonlySet<Disposition>;

  /** Throws ConfigError for a negative count, an empty or negative backoff, or an unknown disposition. */
  constructor(options: SupervisionPolicyOptions = {}) {
    this.maxRestarts = requireCount(
      options.maxRestarts ?? 3,
      "maxRestarts",
      0,
      "pass 0 to disable restarts, or how many restarts to allow",
    );
    const backoff = options.backoffSeconds ?? DEFAULT_BACKOFF_SECONDS;
    if (backoff.length === 0) {
      throw new ConfigError("backoffSeconds must name at least one delay", "pass e.g. [10, 20, 40]");
    }
    this.backoffSeconds = Object.freeze(backoff.map((delay) => requireSeconds(delay, "backoffSeconds")));
    const restartOn = [...(options.restartOn ?? [TRANSIENT, WORKER_FATAL])];
    for (const disposition of restartOn) {
      if (!isDisposition(disposition)) {
        throw new ConfigError(
          `restartOn names an unknown disposition ${JSON.stringify(disposition)}`,
          `use some of ${DISPOSITIONS.join(", ")}`,
          { disposition },
        );
      }
    }
    this.restartOn = new Set(restartOn as Disposition[]);
  }

  /** Same restart count as the cluster, compressed backoff (1, 2, 4 s). */
  static local(): SupervisionPolicy {
    return new SupervisionPolicy({ backoffSeconds: LOCAL_BACKOFF_SECONDS });
  }

  /** No restarts: `run-local --no-restart`, for a tight debug loop. */
  static disabled(): SupervisionPolicy {
    return new SupervisionPolicy({ maxRestarts: 0 });
  }

  /** Backoff before restart number `attempt` (0-based); the last value repeats. */
  delayFor(attempt: number): number {
    const index = Math.min(
      requireCount(attempt, "attempt", 0, "count restarts from 0"),
      this.backoffSeconds.length - 1,
    );
    return this.backoffSeconds[index];
  }

  /**
   * Whether to restart after a death, with `attempt` restarts already spent (0 on the first failure) and the
   * classified cause when the worker reported one. `null` (it died without saying why) is restarted: an
   * unexplained death is far more often a crash worth retrying than a poison message.
   */
  shouldRestart(attempt: number, disposition: Disposition | null = null): boolean {
    if (requireCount(attempt, "attempt", 0, "count restarts from 0") >= this.maxRestarts) return false;
    return disposition === null || this.restartOn.has(disposition);
  }

  /**
   * The decision for one exit, with `restartsSpent` restarts of this replica already made: a clean exit is
   * finished; otherwise a restart (with its delay and the {@link NodeRestarted} to emit) or giving up (with
   * the {@link NodeGaveUp} to emit).
   */
  decide(exited: NodeExited, restartsSpent: number): SupervisionDecision {
    if (exited.clean) return { kind: "finished" };
    if (!restartCanMend(exited)) {
      return {
        kind: "give_up",
        event: nodeGaveUp(exited.node, exited.replica, restartsSpent, exited.reason),
      };
    }
    if (this.shouldRestart(restartsSpent, exited.disposition)) {
      const delaySeconds = this.delayFor(restartsSpent);
      return {
        kind: "restart",
        delaySeconds,
        event: nodeRestarted(exited.node, exited.replica, restartsSpent + 1, delaySeconds),
      };
    }
    return { kind: "give_up", event: nodeGaveUp(exited.node, exited.replica, restartsSpent, exited.reason) };
  }
}
