/**
 * Where time comes from (spec backends.memory.clock, DESIGN "Time comes from an injected Clock"). Every
 * component that reads the time, sleeps or arms a timer takes a {@link Clock}; production passes
 * {@link systemClock}, tests pass a `FakeClock` (`./memory/clock.ts`) that moves only when told to.
 *
 * @example
 * ```ts
 * import { systemClock } from "./clock.ts";
 * const deadline = systemClock.monotonic() + 2;
 * await systemClock.sleep(0.5);
 * console.log(deadline - systemClock.monotonic()); // about 1.5
 * ```
 *
 * @module
 */

import { ConfigError } from "../core/errors.ts";

/** A timer armed with {@link Clock.setTimer}. */
export interface TimerHandle {
  /** Disarms the timer; true when it was still armed (it had neither fired nor been cancelled). */
  cancel(): boolean;
}

/** The source of time every backend, ledger and watchdog reads. All durations are in seconds. */
export interface Clock {
  /** Wall time in epoch seconds (what a ledger stores in `lease_until`); may jump when the host's clock does. */
  now(): number;
  /** Monotonic seconds for deadlines and ordering; never decreases on one clock. */
  monotonic(): number;
  /**
   * Resolves once `seconds` of this clock's time have passed (0 or less: on the next timer turn). With a
   * `signal`, an abort disarms the timer and rejects with the signal's reason.
   */
  sleep(seconds: number, signal?: AbortSignal): Promise<void>;
  /** Calls `callback` once, after `seconds` of this clock's time (0 or less: as soon as possible). */
  setTimer(seconds: number, callback: () => void): TimerHandle;
}

/**
 * Throws {@link ConfigError} unless `seconds` is a finite number; returns it with a negative value raised
 * to 0, the way `setTimeout` treats a past deadline.
 */
export function checkedDelay(seconds: number, what: string): number {
  if (!Number.isFinite(seconds)) {
    throw new ConfigError(
      `${what} must be a finite number of seconds, got ${seconds}`,
      "pass seconds as a finite number; a wait that never ends is not a timer",
    );
  }
  return seconds < 0 ? 0 : seconds;
}

/**
 * A promise that resolves when a timer armed by `arm` fires, rejecting with the signal's reason on abort.
 * Shared by every Clock so that sleep's abort handling is written once.
 */
export function sleepOn(
  arm: (callback: () => void) => TimerHandle,
  signal: AbortSignal | undefined,
): Promise<void> {
  if (signal?.aborted) return Promise.reject(signal.reason);
  return new Promise<void>((resolve, reject) => {
    const onAbort = () => {
      timer.cancel();
      reject(signal?.reason);
    };
    const timer = arm(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    });
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * The host's clocks. `monotonic()` is `performance.timeOrigin + performance.now()` in seconds: it never
 * decreases within a process, and because it is anchored at the wall time the process started, readings
 * from different processes on one host line up (within the wall clock's accuracy at their start), which is
 * what lets observation logs from several workers merge into one order.
 */
export class SystemClock implements Clock {
  /** `Date.now()` in seconds. */
  now(): number {
    return Date.now() / 1000;
  }

  /** Process-monotonic seconds anchored at the process's start (see the class comment). */
  monotonic(): number {
    return (performance.timeOrigin + performance.now()) / 1000;
  }

  /** A real `setTimeout` sleep. */
  sleep(seconds: number, signal?: AbortSignal): Promise<void> {
    const delay = checkedDelay(seconds, "sleep");
    return sleepOn((callback) => this.setTimer(delay, callback), signal);
  }

  /** A real `setTimeout`; the handle's `cancel` is `clearTimeout`. */
  setTimer(seconds: number, callback: () => void): TimerHandle {
    let armed = true;
    const id = setTimeout(() => {
      armed = false;
      callback();
    }, checkedDelay(seconds, "timer delay") * 1000);
    return {
      cancel(): boolean {
        if (!armed) return false;
        armed = false;
        clearTimeout(id);
        return true;
      },
    };
  }
}

/** The one system clock production code passes where a {@link Clock} is required. */
export const systemClock: Clock = new SystemClock();
