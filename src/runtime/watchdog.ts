/**
 * The progress watchdog (spec runtime.watchdog, RUN-011) and the termination log a worker leaves behind.
 *
 * The task loop checks its {@link ProgressDeadline} between messages, which misses the one failure the
 * deadline exists for: a `process()` that never returns never gets back to the loop. The watchdog re-checks
 * the same deadline on its own timer every `intervalSeconds`; a node that is slow keeps recording progress
 * and is never touched, a node stuck with work pending trips the deadline within timeout + interval, and the
 * watchdog hands the error to `onStall` exactly once, then stops.
 *
 * What `onStall` does is the caller's choice, which keeps this testable on a FakeClock; the worker passes
 * {@link exitOnStall}: write the reason to the termination log, then end the process with the error's exit
 * code (ProgressStalled: 5). The un-acked inputs go back to the broker for the replacement.
 *
 * The timer runs on the worker's event loop, so a `process()` that awaits forever (a lost reply, a lock, a
 * stream that never ends) is caught; one that blocks the thread itself (a synchronous FFI call that never
 * returns) also stops the timer, and is left to the engine, which sees the worker's heartbeat stop.
 *
 * @example
 * ```ts
 * const deadline = new ProgressDeadline({ timeoutSeconds: 300, pendingProbe: () => messenger.pendingObservation() });
 * const watchdog = buildWatchdog(deadline, watchdogIntervalFromEnv(), deadline.timeoutSeconds, "detect");
 * watchdog?.start(); // ... run the loop ...
 * watchdog?.stop();
 * ```
 *
 * @module
 */

import { type Clock, systemClock } from "../backends/clock.ts";
import type { Logger } from "../core/context.ts";
import {
  BrokerUnavailable,
  ConfigError,
  errorToDict,
  exitCodeOf,
  ProgressStalled,
  type VideoflowError,
} from "../core/errors.ts";
import { isRecord } from "../core/checks.ts";
import { secondsFromText } from "../core/variables.ts";
import type { ProgressDeadline, TerminationReason } from "../core/supervision.ts";

/** Seconds between deadline checks: small next to the 300 s default timeout, so the added tolerance is negligible. */
export const DEFAULT_WATCHDOG_INTERVAL_SECONDS = 5;

/** The environment variable that sets the interval (0: no watchdog, the loop's own check only). */
export const WATCHDOG_INTERVAL_ENV = "VF_WATCHDOG_INTERVAL_SECONDS";

/** Where the termination reason goes by default: Kubernetes surfaces it in the pod's containerStatuses. */
export const DEFAULT_TERMINATION_LOG = "/dev/termination-log";

/** The environment variable that overrides {@link DEFAULT_TERMINATION_LOG}. */
export const TERMINATION_LOG_ENV = "VF_TERMINATION_LOG";

/** The most bytes Kubernetes reads back from a termination log; a longer record is shortened to fit. */
export const TERMINATION_MESSAGE_LIMIT_BYTES = 4096;

/** Where environment variables are read from: `Deno.env`, or a Map in tests. */
type EnvSource = Pick<Deno.Env, "get">;

/** What a watchdog does with the stall it found: the ProgressStalled or BrokerUnavailable the deadline raised. */
export type StallHandler = (error: VideoflowError) => void;

/** Options of a {@link ProgressWatchdog}. */
export interface ProgressWatchdogOptions {
  /** Names the watchdog in its log lines, so an operator knows which node it belongs to. */
  readonly name?: string;
  /** The timer source; the system clock by default. */
  readonly clock?: Clock;
  /** Where a probe failure is reported (a flaky observation is logged, never a stall). */
  readonly logger?: Logger | null;
}

/**
 * Re-checks a {@link ProgressDeadline} every `intervalSeconds` and reports the first stall to `onStall`,
 * exactly once. `deadline` must be the instance the task loop records progress on, or the watchdog would
 * measure a silence nobody resets.
 */
export class ProgressWatchdog {
  /** Seconds between checks. */
  readonly intervalSeconds: number;
  /** Names the watchdog in log lines. */
  readonly name: string;
  readonly #deadline: ProgressDeadline;
  readonly #onStall: StallHandler;
  readonly #clock: Clock;
  readonly #logger: Logger | null;
  #timer: { cancel(): boolean } | null = null;
  #running = false;
  #stall: VideoflowError | null = null;
  #ticking: Promise<boolean> | null = null;

  /** Throws {@link ConfigError} unless `intervalSeconds` is a positive finite number. */
  constructor(
    deadline: ProgressDeadline,
    intervalSeconds: number,
    onStall: StallHandler,
    options: ProgressWatchdogOptions = {},
  ) {
    if (!Number.isFinite(intervalSeconds) || intervalSeconds <= 0) {
      throw new ConfigError(
        `the watchdog interval must be a positive number of seconds, got ${intervalSeconds}`,
        `set ${WATCHDOG_INTERVAL_ENV} to a positive number, or to 0 to run without a watchdog`,
        { interval_seconds: intervalSeconds },
      );
    }
    this.intervalSeconds = intervalSeconds;
    this.name = options.name ?? "";
    this.#deadline = deadline;
    this.#onStall = onStall;
    this.#clock = options.clock ?? systemClock;
    this.#logger = options.logger ?? null;
  }

  /** Whether a stall was detected (and `onStall` called). */
  get fired(): boolean {
    return this.#stall !== null;
  }

  /** Whether the timer is armed: started, and neither stopped nor fired. */
  get running(): boolean {
    return this.#running;
  }

  /** The error the watchdog fired with, or `null` while nothing has stalled. */
  get stall(): VideoflowError | null {
    return this.#stall;
  }

  /** Arms the periodic check. A second call while running, or after firing, does nothing. */
  start(): void {
    if (this.#running || this.fired) return;
    this.#running = true;
    this.#schedule();
  }

  /** Disarms the check. Idempotent, and safe from `onStall` itself. */
  stop(): void {
    this.#running = false;
    this.#timer?.cancel();
    this.#timer = null;
  }

  /**
   * One deadline check, without the timer. Resolves with whether the watchdog has fired, on this tick or an
   * earlier one; `onStall` is never called twice. A tick while another is in flight shares its result. A
   * probe failure the deadline does not classify is logged and ignored: a flaky observation is not
   * evidence that the node stopped.
   */
  tick(): Promise<boolean> {
    if (this.fired) return Promise.resolve(true);
    this.#ticking ??= this.#check().finally(() => this.#ticking = null);
    return this.#ticking;
  }

  async #check(): Promise<boolean> {
    try {
      await this.#deadline.check();
    } catch (error) {
      if (error instanceof ProgressStalled || error instanceof BrokerUnavailable) {
        this.#fire(error);
      } else {
        const record = errorToDict(error);
        this.#logger?.warn("watchdog: the pending-work probe failed; not treated as a stall", {
          watchdog: this.name,
          error_code: record.code,
          error: record.message,
        });
      }
    }
    return this.fired;
  }

  #fire(error: VideoflowError): void {
    this.#stall = error;
    this.stop();
    try {
      this.#onStall(error);
    } catch (failure) {
      this.#logger?.error("watchdog: the stall handler failed", {
        watchdog: this.name,
        stall: error.code,
        error: errorToDict(failure).message,
      });
    }
  }

  #schedule(): void {
    this.#timer = this.#clock.setTimer(this.intervalSeconds, () => {
      this.#timer = null;
      void this.tick().then(() => {
        if (this.#running) this.#schedule();
      });
    });
  }
}

/**
 * The watchdog for a node, or `null` when either knob turns it off: an interval of 0 means no watchdog, and
 * a progress timeout of 0 means the deadline never trips, so a watchdog would re-check nothing.
 */
export function buildWatchdog(
  deadline: ProgressDeadline,
  intervalSeconds: number,
  progressTimeoutSeconds: number,
  nodeName: string,
  onStall: StallHandler = (error) => exitOnStall(error),
  options: Omit<ProgressWatchdogOptions, "name"> = {},
): ProgressWatchdog | null {
  if (intervalSeconds === 0 || progressTimeoutSeconds === 0) return null;
  return new ProgressWatchdog(deadline, intervalSeconds, onStall, { ...options, name: nodeName });
}

/**
 * `VF_WATCHDOG_INTERVAL_SECONDS` as a number: the default when unset or empty, 0 for "no watchdog".
 * Throws {@link ConfigError} for a value that is not a number, or is negative.
 */
export function watchdogIntervalFromEnv(env: EnvSource = Deno.env): number {
  const raw = env.get(WATCHDOG_INTERVAL_ENV)?.trim();
  if (raw === undefined || raw === "") return DEFAULT_WATCHDOG_INTERVAL_SECONDS;
  return secondsFromText(WATCHDOG_INTERVAL_ENV, raw, true, "5", "or 0 to run without a watchdog");
}

function terminationLogPath(path: string | null | undefined, env: EnvSource): string {
  if (path) return path;
  try {
    return env.get(TERMINATION_LOG_ENV) || DEFAULT_TERMINATION_LOG;
  } catch {
    return DEFAULT_TERMINATION_LOG;
  }
}

const encoder = new TextEncoder();

/**
 * The termination log's text for `error`: its {@link errorToDict} record as one JSON document, at most
 * {@link TERMINATION_MESSAGE_LIMIT_BYTES} bytes. A longer record loses its context first, then the tail of
 * its message and remedy, and says so (`"truncated": true`); it stays parseable JSON either way.
 */
export function terminationRecordText(error: unknown): string {
  const record = errorToDict(error);
  const full = JSON.stringify(record);
  if (encoder.encode(full).length <= TERMINATION_MESSAGE_LIMIT_BYTES) return full;
  const { diagnostics: _dropped, ...rest } = record;
  for (const budget of [1024, 128]) {
    const text = JSON.stringify({
      ...rest,
      message: record.message.slice(0, budget),
      remedy: record.remedy === null ? null : record.remedy.slice(0, budget),
      context: {},
      truncated: true,
    });
    if (encoder.encode(text).length <= TERMINATION_MESSAGE_LIMIT_BYTES) return text;
  }
  return JSON.stringify({
    code: record.code.slice(0, 128),
    exit_code: record.exit_code,
    disposition: record.disposition,
    truncated: true,
  });
}

/**
 * Records why this worker is exiting, for the engine (local: it reads the file back; Kubernetes: the pod's
 * `terminated.message`). The path is `path`, else `VF_TERMINATION_LOG`, else {@link DEFAULT_TERMINATION_LOG}.
 * Best-effort and silent on failure: a worker that cannot explain its death must still die of the original
 * cause. Synchronous, so the record is on disk before an exit that follows.
 */
export function writeTerminationReason(
  error: unknown,
  path?: string | null,
  env: EnvSource = Deno.env,
): void {
  try {
    Deno.writeTextFileSync(terminationLogPath(path, env), terminationRecordText(error));
  } catch {
    // Best-effort by contract: the file may not exist outside Kubernetes, or be unwritable here.
  }
}

/**
 * What a dead worker wrote to its termination log: the JSON record, or `null` when the file is missing,
 * empty, unreadable or not a JSON object (a worker killed before it could write one).
 */
export async function readTerminationReason(path: string): Promise<TerminationReason | null> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch {
    return null;
  }
  try {
    const parsed: unknown = JSON.parse(text);
    return isRecord(parsed) ? parsed as TerminationReason : null;
  } catch {
    return null;
  }
}

/** Options of {@link exitOnStall}. */
export interface ExitOnStallOptions {
  /** Ends the process with a status; `Deno.exit` by default (in a Deno Worker it ends that worker only). */
  readonly exit?: (code: number) => void;
  /** The termination log path; `VF_TERMINATION_LOG` or the default when absent. */
  readonly terminationLog?: string | null;
  /** Where `VF_TERMINATION_LOG` is read from. */
  readonly env?: EnvSource;
}

/**
 * What the worker's watchdog does with a stall: write the reason to the termination log, then end the
 * process with the error's exit code (ProgressStalled: 5, BrokerUnavailable: 3). Exiting is the only
 * recovery: the wedged frame belongs to a `process()` that nothing can unwind.
 */
export function exitOnStall(error: VideoflowError, options: ExitOnStallOptions = {}): void {
  writeTerminationReason(error, options.terminationLog, options.env);
  const exit = options.exit ?? ((code: number) => Deno.exit(code));
  exit(exitCodeOf(error));
}
