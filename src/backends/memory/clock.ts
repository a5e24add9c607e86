/**
 * A controllable clock for the deterministic memory models (spec backends.memory.clock): monotonic and
 * wall time advance together, and only when a test asks; timers and sleeps fire on `advance`, in the
 * order of their due time, ties in the order they were armed.
 *
 * @example
 * ```ts
 * import { FakeClock } from "./clock.ts";
 * const clock = new FakeClock();
 * const fired: number[] = [];
 * clock.setTimer(2, () => fired.push(clock.monotonic()));
 * clock.setTimer(1, () => fired.push(clock.monotonic()));
 * clock.advance(5);
 * console.log(fired); // [1001, 1002]
 * ```
 *
 * @module
 */

import { ConfigError } from "../../core/errors.ts";
import { checkedDelay, type Clock, sleepOn, type TimerHandle } from "../clock.ts";

/** The monotonic reading a new FakeClock starts at (the spec's default). */
export const FAKE_MONOTONIC_START = 1000;
/** The wall reading, in epoch seconds, a new FakeClock starts at (the spec's default). */
export const FAKE_WALL_START = 1_700_000_000;

/** Time is kept in whole microseconds so that sums of decimal seconds compare exactly. */
const TICKS_PER_SECOND = 1_000_000;

function toTicks(seconds: number): number {
  return Math.round(seconds * TICKS_PER_SECOND);
}

interface FakeTimer {
  /** Elapsed ticks since the clock's start at which the timer is due. */
  readonly due: number;
  /** Arming order: breaks ties between timers due at the same instant. */
  readonly seq: number;
  readonly callback: () => void;
  armed: boolean;
}

function earlier(a: FakeTimer, b: FakeTimer): boolean {
  return a.due < b.due || (a.due === b.due && a.seq < b.seq);
}

/** Lets every pending promise continuation run: one real macrotask turn drains the microtask queue. */
function drainMicrotasks(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 0));
}

/**
 * A {@link Clock} that stands still until {@link FakeClock.advance}. Deterministic: the same sequence of
 * `setTimer`/`sleep`/`advance` calls fires the same callbacks in the same order at the same readings.
 * A callback runs with the clock reading exactly its due time.
 */
export class FakeClock implements Clock {
  readonly #start: number;
  readonly #wallStart: number;
  /** Ticks advanced so far. */
  #elapsed = 0;
  #seq = 0;
  #armed = 0;
  /** Binary min-heap on (due, seq); cancelled timers stay in it, disarmed, until they reach the top. */
  readonly #heap: FakeTimer[] = [];

  constructor(start: number = FAKE_MONOTONIC_START, wallStart: number = FAKE_WALL_START) {
    if (!Number.isFinite(start) || !Number.isFinite(wallStart)) {
      throw new ConfigError(
        `FakeClock readings must be finite, got start=${start} wallStart=${wallStart}`,
        "pass finite numbers of seconds, or nothing for the defaults",
      );
    }
    this.#start = start;
    this.#wallStart = wallStart;
  }

  /** Wall time in epoch seconds: the wall start plus the time advanced so far. */
  now(): number {
    return this.#wallStart + this.#elapsed / TICKS_PER_SECOND;
  }

  /** Monotonic seconds: the start plus the time advanced so far. */
  monotonic(): number {
    return this.#start + this.#elapsed / TICKS_PER_SECOND;
  }

  /** Resolves when an `advance` reaches `seconds` from now (a zero sleep: on the next `advance`, even by 0). */
  sleep(seconds: number, signal?: AbortSignal): Promise<void> {
    const delay = checkedDelay(seconds, "sleep");
    return sleepOn((callback) => this.setTimer(delay, callback), signal);
  }

  /** Arms a timer due `seconds` from now; it fires during the `advance` that reaches it. */
  setTimer(seconds: number, callback: () => void): TimerHandle {
    const timer: FakeTimer = {
      due: this.#elapsed + toTicks(checkedDelay(seconds, "timer delay")),
      seq: this.#seq++,
      callback,
      armed: true,
    };
    this.#push(timer);
    this.#armed++;
    return {
      cancel: (): boolean => {
        if (!timer.armed) return false;
        timer.armed = false;
        this.#armed--;
        return true;
      },
    };
  }

  /** How many timers are armed (neither fired nor cancelled). */
  pendingTimers(): number {
    return this.#armed;
  }

  /** Seconds from now until the earliest armed timer is due; `null` when none is armed. */
  nextTimerIn(): number | null {
    const next = this.#peek();
    return next === null ? null : (next.due - this.#elapsed) / TICKS_PER_SECOND;
  }

  /**
   * Moves time forward by `seconds`, firing every timer due on the way in (due, arming) order, including
   * timers that callbacks arm inside the window. Synchronous: code awaiting a `sleep` resumes after this
   * returns, so a sleep it arms next is not fired by this call (use {@link advanceAsync} for that). A
   * callback that throws stops the advance at its due time, with the rest still armed, and the error
   * propagates.
   */
  advance(seconds: number): void {
    const target = this.#elapsed + this.#stepTicks(seconds);
    for (let timer = this.#takeDue(target); timer !== null; timer = this.#takeDue(target)) {
      timer.callback();
    }
    this.#elapsed = target;
  }

  /**
   * Like {@link advance}, but lets promise continuations run after each timer fires (one macrotask turn),
   * so code that sleeps in a loop is driven through every iteration that falls due inside the window.
   * Resolves once time has reached the target and the continuations of the last firing have run.
   */
  async advanceAsync(seconds: number): Promise<void> {
    const target = this.#elapsed + this.#stepTicks(seconds);
    await drainMicrotasks();
    for (let timer = this.#takeDue(target); timer !== null; timer = this.#takeDue(target)) {
      timer.callback();
      await drainMicrotasks();
    }
    this.#elapsed = target;
    await drainMicrotasks();
  }

  #stepTicks(seconds: number): number {
    if (!Number.isFinite(seconds) || seconds < 0) {
      throw new ConfigError(
        `FakeClock.advance needs a finite, non-negative number of seconds, got ${seconds}`,
        "time only moves forward: pass 0 or more seconds",
      );
    }
    return toTicks(seconds);
  }

  /** Removes and disarms the earliest armed timer due at or before `target`, moving time to its due. */
  #takeDue(target: number): FakeTimer | null {
    const next = this.#peek();
    if (next === null || next.due > target) return null;
    this.#pop();
    next.armed = false;
    this.#armed--;
    if (next.due > this.#elapsed) this.#elapsed = next.due;
    return next;
  }

  /** The earliest armed timer, after discarding cancelled ones from the top of the heap. */
  #peek(): FakeTimer | null {
    while (this.#heap.length > 0 && !this.#heap[0].armed) this.#pop();
    return this.#heap.length > 0 ? this.#heap[0] : null;
  }

  #push(timer: FakeTimer): void {
    const heap = this.#heap;
    heap.push(timer);
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!earlier(heap[i], heap[parent])) break;
      [heap[i], heap[parent]] = [heap[parent], heap[i]];
      i = parent;
    }
  }

  #pop(): void {
    const heap = this.#heap;
    const last = heap.pop() as FakeTimer;
    if (heap.length === 0) return;
    heap[0] = last;
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      const right = left + 1;
      let least = i;
      if (left < heap.length && earlier(heap[left], heap[least])) least = left;
      if (right < heap.length && earlier(heap[right], heap[least])) least = right;
      if (least === i) return;
      [heap[i], heap[least]] = [heap[least], heap[i]];
      i = least;
    }
  }
}
