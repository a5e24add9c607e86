import assert from "node:assert/strict";
import { ConfigError } from "../../../src/core/errors.ts";
import { SystemClock, systemClock } from "../../../src/backends/clock.ts";
import { FAKE_MONOTONIC_START, FAKE_WALL_START, FakeClock } from "../../../src/backends/memory/clock.ts";
import { SeededRandom } from "../../support/random.ts";

Deno.test("the system clock reads epoch seconds and a monotonic time that never decreases", () => {
  const before = Date.now() / 1000;
  const now = systemClock.now();
  assert.ok(Math.abs(now - before) < 1, `now() ${now} is not epoch seconds near ${before}`);
  let last = systemClock.monotonic();
  for (let i = 0; i < 1000; i++) {
    const reading = systemClock.monotonic();
    assert.ok(reading >= last);
    last = reading;
  }
  assert.ok(Math.abs(systemClock.monotonic() - now) < 60, "monotonic time is anchored at the process start");
});

Deno.test("the system clock's sleep waits at least the time asked", async () => {
  const clock = new SystemClock();
  const start = performance.now();
  await clock.sleep(0.03);
  assert.ok(performance.now() - start >= 25, "slept less than asked");
});

Deno.test("a cancelled system timer never fires, and cancel says whether it was still armed", async () => {
  const clock = new SystemClock();
  let calls = 0;
  const cancelled = clock.setTimer(0.01, () => calls++);
  assert.equal(cancelled.cancel(), true);
  assert.equal(cancelled.cancel(), false);
  const kept = clock.setTimer(0, () => calls++);
  await clock.sleep(0.03);
  assert.equal(calls, 1);
  assert.equal(kept.cancel(), false, "a fired timer is no longer armed");
});

Deno.test("an aborted sleep rejects with the abort reason, on either clock", async () => {
  for (const clock of [new SystemClock(), new FakeClock()]) {
    const controller = new AbortController();
    const sleeping = clock.sleep(10, controller.signal);
    controller.abort(new Error("stop"));
    await assert.rejects(sleeping, /stop/);
    const already = AbortSignal.abort(new Error("early"));
    await assert.rejects(clock.sleep(1, already), /early/);
  }
});

Deno.test("a delay that is not a finite number is a ConfigError", () => {
  assert.throws(() => systemClock.setTimer(Number.NaN, () => {}), ConfigError);
  assert.throws(() => new FakeClock().setTimer(Infinity, () => {}), ConfigError);
  assert.throws(() => new FakeClock().advance(-1), ConfigError);
  assert.throws(() => new FakeClock(Number.NaN), ConfigError);
});

Deno.test("a fake clock starts at the spec's readings and moves both clocks only on advance", () => {
  const clock = new FakeClock();
  assert.equal(clock.monotonic(), FAKE_MONOTONIC_START);
  assert.equal(clock.now(), FAKE_WALL_START);
  clock.advance(2.5);
  assert.equal(clock.monotonic(), 1002.5);
  assert.equal(clock.now(), 1_700_000_002.5);
  const custom = new FakeClock(5, 100);
  custom.advance(1);
  assert.deepEqual([custom.monotonic(), custom.now()], [6, 101]);
});

Deno.test("fake timers fire in due order, ties in arming order, each at exactly its due time", () => {
  const clock = new FakeClock();
  const seen: Array<[string, number]> = [];
  const at = (label: string) => () => seen.push([label, clock.monotonic()]);
  clock.setTimer(3, at("c"));
  clock.setTimer(1, at("a1"));
  clock.setTimer(1, at("a2"));
  clock.setTimer(2, at("b"));
  clock.setTimer(9, at("late"));
  clock.advance(3);
  assert.deepEqual(seen, [["a1", 1001], ["a2", 1001], ["b", 1002], ["c", 1003]]);
  assert.equal(clock.pendingTimers(), 1);
  assert.equal(clock.nextTimerIn(), 6);
});

Deno.test("a timer armed by a callback fires in the same advance when it falls due inside it", () => {
  const clock = new FakeClock();
  const seen: number[] = [];
  clock.setTimer(1, () => {
    seen.push(clock.monotonic());
    clock.setTimer(1, () => seen.push(clock.monotonic()));
    clock.setTimer(5, () => seen.push(clock.monotonic()));
  });
  clock.advance(3);
  assert.deepEqual(seen, [1001, 1002]);
  assert.equal(clock.monotonic(), 1003);
  clock.advance(3);
  assert.deepEqual(seen, [1001, 1002, 1006]);
});

Deno.test("decimal delays add up exactly on the fake clock", () => {
  const clock = new FakeClock();
  clock.advance(0.1);
  let fired = false;
  clock.setTimer(0.2, () => fired = true);
  clock.advance(0.2);
  assert.equal(fired, true, "0.1 + 0.2 reached a timer due at 0.3");
});

Deno.test("a fake sleep resolves only once time is advanced past it", async () => {
  const clock = new FakeClock();
  let woke = false;
  const sleeping = clock.sleep(5).then(() => woke = true);
  clock.advance(4.999);
  await Promise.resolve();
  assert.equal(woke, false);
  clock.advance(0.001);
  await sleeping;
  assert.equal(woke, true);
});

Deno.test("advanceAsync drives a loop of sleeps through every iteration inside the window", async () => {
  const clock = new FakeClock();
  const ticks: number[] = [];
  const loop = (async () => {
    for (let i = 0; i < 5; i++) {
      await clock.sleep(1);
      ticks.push(clock.monotonic());
    }
  })();
  await clock.advanceAsync(3.5);
  assert.deepEqual(ticks, [1001, 1002, 1003]);
  assert.equal(clock.monotonic(), 1003.5);
  clock.advance(10);
  await clock.advanceAsync(0);
  assert.deepEqual(ticks, [1001, 1002, 1003, 1013.5], "a sync advance resumes the sleeper after it returns");
  await clock.advanceAsync(100);
  await loop;
  assert.deepEqual(ticks, [1001, 1002, 1003, 1013.5, 1014.5]);
});

Deno.test("a throwing callback stops the advance at its time and leaves later timers armed", () => {
  const clock = new FakeClock();
  let later = 0;
  clock.setTimer(1, () => {
    throw new Error("boom");
  });
  clock.setTimer(2, () => later++);
  assert.throws(() => clock.advance(5), /boom/);
  assert.equal(clock.monotonic(), 1001);
  clock.advance(1);
  assert.equal(later, 1);
});

/** A deliberately naive clock: a flat list, sorted on every step. The reference the heap must match. */
class ReferenceClock {
  #now = 0;
  #seq = 0;
  readonly #timers: Array<{ due: number; seq: number; callback: () => void; live: boolean }> = [];

  monotonic(): number {
    return this.#now;
  }

  setTimer(seconds: number, callback: () => void): { cancel(): boolean } {
    const timer = { due: this.#now + Math.max(0, seconds), seq: this.#seq++, callback, live: true };
    this.#timers.push(timer);
    return {
      cancel: () => {
        const was = timer.live;
        timer.live = false;
        return was;
      },
    };
  }

  advance(seconds: number): void {
    const target = this.#now + seconds;
    for (;;) {
      const due = this.#timers.filter((t) => t.live && t.due <= target).sort((a, b) =>
        a.due - b.due || a.seq - b.seq
      );
      if (due.length === 0) break;
      due[0].live = false;
      this.#now = Math.max(this.#now, due[0].due);
      due[0].callback();
    }
    this.#now = target;
  }

  pendingTimers(): number {
    return this.#timers.filter((t) => t.live).length;
  }
}

type TimerOp =
  | { readonly kind: "arm"; readonly delay: number; readonly childDelay: number | null }
  | { readonly kind: "cancel"; readonly index: number }
  | { readonly kind: "advance"; readonly by: number };

function randomOps(random: SeededRandom): TimerOp[] {
  const ops: TimerOp[] = [];
  for (let i = 0; i < 80; i++) {
    const roll = random.next();
    if (roll < 0.5) {
      const childDelay = random.chance(0.3) ? random.int(0, 3) : null;
      ops.push({ kind: "arm", delay: random.int(0, 5), childDelay });
    } else if (roll < 0.65) ops.push({ kind: "cancel", index: random.int(0, 39) });
    else ops.push({ kind: "advance", by: random.int(0, 4) });
  }
  return ops;
}

/** Runs `ops` on `clock`; returns every observable: firings with their times, cancel results, pending counts. */
function execute(clock: FakeClock | ReferenceClock, ops: readonly TimerOp[]): unknown[] {
  const trace: unknown[] = [];
  const handles: Array<{ cancel(): boolean }> = [];
  const arm = (delay: number, childDelay: number | null): void => {
    const id = handles.length;
    handles.push(clock.setTimer(delay, () => {
      trace.push(["fire", id, clock.monotonic()]);
      if (childDelay !== null) arm(childDelay, null);
    }));
  };
  for (const op of ops) {
    if (op.kind === "arm") arm(op.delay, op.childDelay);
    else if (op.kind === "cancel") trace.push(["cancel", op.index, handles[op.index]?.cancel() ?? null]);
    else {
      clock.advance(op.by);
      trace.push(["pending", clock.monotonic(), clock.pendingTimers()]);
    }
  }
  return trace;
}

Deno.test("randomized timer sets fire exactly like a naive sorted reference (seeded)", () => {
  for (let seed = 1; seed <= 300; seed++) {
    const ops = randomOps(new SeededRandom(seed));
    try {
      const actual = execute(new FakeClock(0, 0), ops);
      assert.deepEqual(actual, execute(new ReferenceClock(), ops));
      assert.ok(actual.some((entry) => (entry as unknown[])[0] === "fire"), "the case fired something");
    } catch (error) {
      console.error(`randomized FakeClock case failed with seed ${seed}`);
      throw error;
    }
  }
});
