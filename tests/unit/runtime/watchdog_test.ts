import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import {
  buildWatchdog,
  DEFAULT_TERMINATION_LOG,
  DEFAULT_WATCHDOG_INTERVAL_SECONDS,
  exitOnStall,
  ProgressWatchdog,
  readTerminationReason,
  TERMINATION_LOG_ENV,
  TERMINATION_MESSAGE_LIMIT_BYTES,
  terminationRecordText,
  watchdogIntervalFromEnv,
  writeTerminationReason,
} from "../../../src/runtime/watchdog.ts";
import { type PendingProbe, ProgressDeadline } from "../../../src/core/supervision.ts";
import type { Logger } from "../../../src/core/context.ts";
import {
  BrokerUnavailable,
  ConfigError,
  EXIT_STALLED,
  ProgressStalled,
  type VideoflowError,
} from "../../../src/core/errors.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { known, unknown } from "../../../src/backends/outcomes.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

function stallRecorder() {
  const stalls: Array<{ error: VideoflowError; at: number }> = [];
  return {
    stalls,
    handler: (clock: FakeClock) => (error: VideoflowError) => stalls.push({ error, at: clock.monotonic() }),
  };
}

function recordingLogger() {
  const lines: Array<{ level: string; message: string; fields?: Record<string, unknown> }> = [];
  const at = (level: string) => (message: string, fields?: Record<string, unknown>) =>
    lines.push({ level, message, fields });
  const logger: Logger = { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
  return { lines, logger };
}

Deno.test("watchdog: a node hung with pending work is reported once, within timeout + interval (RUN-011)", async () => {
  const clock = new FakeClock();
  const deadline = new ProgressDeadline({ timeoutSeconds: 30, pendingProbe: () => known(4, clock), clock });
  const recorder = stallRecorder();
  const watchdog = new ProgressWatchdog(deadline, 5, recorder.handler(clock), { clock, name: "detect" });
  const started = clock.monotonic();
  watchdog.start();
  assert.equal(watchdog.running, true);
  for (let i = 0; i < 60; i++) await clock.advanceAsync(1);
  assert.equal(recorder.stalls.length, 1);
  const elapsed = recorder.stalls[0].at - started;
  assert.ok(elapsed >= 30 && elapsed <= 35, `fired after ${elapsed} s`);
  assert.ok(recorder.stalls[0].error instanceof ProgressStalled);
  assert.equal(watchdog.fired, true);
  assert.equal(watchdog.stall, recorder.stalls[0].error);
  assert.equal(watchdog.running, false);
  assert.equal(clock.pendingTimers(), 0, "a fired watchdog arms nothing more");
  assert.equal(await watchdog.tick(), true);
  assert.equal(recorder.stalls.length, 1, "on_stall is never called twice");
});

Deno.test("watchdog: a slow node that keeps acking is never touched, and stop() disarms the timer", async () => {
  const clock = new FakeClock();
  const deadline = new ProgressDeadline({ timeoutSeconds: 10, pendingProbe: () => known(50, clock), clock });
  const recorder = stallRecorder();
  const watchdog = new ProgressWatchdog(deadline, 2, recorder.handler(clock), { clock });
  watchdog.start();
  watchdog.start();
  assert.equal(clock.pendingTimers(), 1, "a second start is a no-op");
  for (let i = 0; i < 50; i++) {
    await clock.advanceAsync(9);
    deadline.recordProgress();
  }
  assert.equal(recorder.stalls.length, 0);
  watchdog.stop();
  watchdog.stop();
  assert.equal(watchdog.running, false);
  assert.equal(clock.pendingTimers(), 0);
  await clock.advanceAsync(1000);
  assert.equal(recorder.stalls.length, 0, "a stopped watchdog checks nothing");
});

Deno.test("watchdog: over random timeouts and intervals it fires between timeout and timeout + interval", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let trial = 0; trial < 25; trial++) {
    const clock = new FakeClock();
    const timeout = random.int(1, 120);
    const interval = random.int(1, 20) / 2;
    const deadline = new ProgressDeadline({
      timeoutSeconds: timeout,
      pendingProbe: () => known(1, clock),
      clock,
    });
    const recorder = stallRecorder();
    const watchdog = new ProgressWatchdog(deadline, interval, recorder.handler(clock), { clock });
    const started = clock.monotonic();
    watchdog.start();
    await clock.advanceAsync(timeout + interval);
    assert.equal(recorder.stalls.length, 1, `seed ${seed} trial ${trial}`);
    const elapsed = recorder.stalls[0].at - started;
    assert.ok(
      elapsed >= timeout && elapsed <= timeout + interval,
      `seed ${seed} trial ${trial}: timeout ${timeout} interval ${interval} fired after ${elapsed}`,
    );
  }
});

Deno.test("watchdog: an Unknown pending count past its grace fires with BrokerUnavailable", async () => {
  const clock = new FakeClock();
  const deadline = new ProgressDeadline({
    timeoutSeconds: 10,
    pendingProbe: () => unknown("unreachable", clock),
    clock,
  });
  const recorder = stallRecorder();
  const watchdog = new ProgressWatchdog(deadline, 1, recorder.handler(clock), { clock });
  watchdog.start();
  await clock.advanceAsync(29);
  assert.equal(recorder.stalls.length, 0, "Unknown within its grace neither trips nor resets");
  await clock.advanceAsync(2);
  assert.equal(recorder.stalls.length, 1);
  assert.ok(recorder.stalls[0].error instanceof BrokerUnavailable);
});

Deno.test("watchdog: tick() checks once without a timer; a probe that fails is logged, never a stall", async () => {
  const clock = new FakeClock();
  let failing = true;
  const probe: PendingProbe = () => {
    if (failing) throw new TypeError("socket closed");
    return known(1, clock);
  };
  const deadline = new ProgressDeadline({ timeoutSeconds: 1, pendingProbe: probe, clock });
  const recorder = stallRecorder();
  const log = recordingLogger();
  const watchdog = new ProgressWatchdog(deadline, 1, recorder.handler(clock), {
    clock,
    logger: log.logger,
    name: "sink",
  });
  assert.equal(await watchdog.tick(), false);
  clock.advance(1);
  assert.equal(await watchdog.tick(), false);
  assert.equal(log.lines.length, 1);
  assert.equal(log.lines[0].level, "warn");
  assert.equal(log.lines[0].fields?.watchdog, "sink");
  assert.equal(log.lines[0].fields?.error, "socket closed");
  failing = false;
  const [first, second] = await Promise.all([watchdog.tick(), watchdog.tick()]);
  assert.deepEqual([first, second], [true, true]);
  assert.equal(recorder.stalls.length, 1, "concurrent ticks share one check");
});

Deno.test("watchdog: a stall handler that throws is logged and the watchdog still counts as fired", async () => {
  const clock = new FakeClock();
  const deadline = new ProgressDeadline({ timeoutSeconds: 1, pendingProbe: () => known(1, clock), clock });
  const log = recordingLogger();
  const watchdog = new ProgressWatchdog(deadline, 1, () => {
    throw new Error("handler bug");
  }, { clock, logger: log.logger });
  clock.advance(1);
  assert.equal(await watchdog.tick(), true);
  assert.equal(log.lines[0].level, "error");
  assert.equal(log.lines[0].fields?.stall, "VF_PROGRESS_STALLED");
});

Deno.test("watchdog: a non-positive interval is a ConfigError; buildWatchdog returns null when either knob is 0", () => {
  const deadline = new ProgressDeadline({ clock: new FakeClock() });
  for (const interval of [0, -1, Number.NaN, Infinity]) {
    assert.throws(() => new ProgressWatchdog(deadline, interval, () => {}), ConfigError);
  }
  assert.equal(buildWatchdog(deadline, 0, 300, "a"), null);
  assert.equal(buildWatchdog(deadline, 5, 0, "a"), null);
  const built = buildWatchdog(deadline, 5, 300, "a", () => {});
  assert.ok(built instanceof ProgressWatchdog);
  assert.equal(built.name, "a");
  assert.equal(built.intervalSeconds, 5);
});

Deno.test("watchdog interval from env: default 5, 0 turns it off, garbage and negatives are ConfigErrors", () => {
  const env = (value?: string) =>
    new Map(value === undefined ? [] : [["VF_WATCHDOG_INTERVAL_SECONDS", value]]);
  assert.equal(watchdogIntervalFromEnv(env()), DEFAULT_WATCHDOG_INTERVAL_SECONDS);
  assert.equal(watchdogIntervalFromEnv(env("")), DEFAULT_WATCHDOG_INTERVAL_SECONDS);
  assert.equal(watchdogIntervalFromEnv(env("0")), 0);
  assert.equal(watchdogIntervalFromEnv(env(" 2.5 ")), 2.5);
  assert.throws(() => watchdogIntervalFromEnv(env("-1")), ConfigError);
  assert.throws(() => watchdogIntervalFromEnv(env("five")), ConfigError);
});

Deno.test("exitOnStall writes the termination record, then exits with the error's code (5 for a stall)", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const path = join(dir, "termination-log");
    const exits: number[] = [];
    const stall = new ProgressStalled("node detect acked nothing", "raise the timeout", { node: "detect" });
    exitOnStall(stall, { terminationLog: path, exit: (code) => exits.push(code) });
    assert.deepEqual(exits, [EXIT_STALLED]);
    const record = await readTerminationReason(path);
    assert.equal(record?.code, "VF_PROGRESS_STALLED");
    assert.equal(record?.exit_code, 5);
    assert.equal(record?.disposition, "worker_fatal");
    assert.deepEqual(record?.context, { node: "detect" });

    const viaEnv = join(dir, "from-env");
    exitOnStall(new BrokerUnavailable("broker gone"), {
      env: new Map([[TERMINATION_LOG_ENV, viaEnv]]),
      exit: (code) => exits.push(code),
    });
    assert.deepEqual(exits, [EXIT_STALLED, 3]);
    assert.equal((await readTerminationReason(viaEnv))?.code, "VF_BROKER_UNAVAILABLE");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("termination log: writing is silent when it cannot write; reading a missing or malformed log is null", async () => {
  const dir = await Deno.makeTempDir();
  try {
    writeTerminationReason(new Error("x"), join(dir, "no", "such", "dir", "log"));
    writeTerminationReason(new Error("x"), dir);
    assert.equal(DEFAULT_TERMINATION_LOG, "/dev/termination-log");
    assert.equal(await readTerminationReason(join(dir, "missing")), null);
    for (
      const [name, text] of [["empty", ""], ["garbage", "{not json"], ["array", "[1]"], ["null", "null"]]
    ) {
      await Deno.writeTextFile(join(dir, name), text);
      assert.equal(await readTerminationReason(join(dir, name)), null, name);
    }
    writeTerminationReason(new RangeError("bare"), join(dir, "bare"));
    const bare = await readTerminationReason(join(dir, "bare"));
    assert.equal(bare?.code, "VF_EXC_RANGE_ERROR");
    assert.equal(bare?.message, "bare");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("termination log: a record longer than Kubernetes reads is shortened to valid JSON that says so", () => {
  const huge = new ProgressStalled("m".repeat(10_000), "r".repeat(10_000), { blob: "x".repeat(10_000) });
  const text = terminationRecordText(huge);
  assert.ok(new TextEncoder().encode(text).length <= TERMINATION_MESSAGE_LIMIT_BYTES);
  const record = JSON.parse(text);
  assert.equal(record.code, "VF_PROGRESS_STALLED");
  assert.equal(record.exit_code, 5);
  assert.equal(record.truncated, true);
  assert.deepEqual(record.context, {});
  assert.ok(record.message.startsWith("mmm"));
  const small = new ProgressStalled("short");
  assert.deepEqual(JSON.parse(terminationRecordText(small)), small.toDict());
});

const SUPERVISION_URL = new URL("../../../src/core/supervision.ts", import.meta.url).href;
const WATCHDOG_URL = new URL("../../../src/runtime/watchdog.ts", import.meta.url).href;
const OUTCOMES_URL = new URL("../../../src/backends/outcomes.ts", import.meta.url).href;

Deno.test("watchdog in a real process: process() hangs with work pending, the worker exits 5 with its termination log written", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const script = join(dir, "hanging_worker.ts");
    const log = join(dir, "termination-log");
    await Deno.writeTextFile(
      script,
      `import { ProgressDeadline } from ${JSON.stringify(SUPERVISION_URL)};
import { exitOnStall, ProgressWatchdog } from ${JSON.stringify(WATCHDOG_URL)};
import { known } from ${JSON.stringify(OUTCOMES_URL)};
const deadline = new ProgressDeadline({ timeoutSeconds: 0.5, pendingProbe: () => known(3), nodeName: "hang" });
new ProgressWatchdog(deadline, 0.1, (error) => exitOnStall(error), { name: "hang" }).start();
console.log("hanging");
await new Promise(() => {}); // process() never returns
console.log("unreachable");
`,
    );
    const child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--no-lock",
        "--allow-env",
        `--allow-write=${dir}`,
        `--allow-read=${fileURLToPath(new URL("../../../", import.meta.url))}`,
        script,
      ],
      env: { [TERMINATION_LOG_ENV]: log, NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const started = performance.now();
    const output = await child.output();
    const wall = (performance.now() - started) / 1000;
    const stdout = new TextDecoder().decode(output.stdout);
    assert.equal(
      output.code,
      EXIT_STALLED,
      `stdout: ${stdout}\nstderr: ${new TextDecoder().decode(output.stderr)}`,
    );
    assert.equal(stdout.trim(), "hanging");
    const record = await readTerminationReason(log);
    assert.equal(record?.code, "VF_PROGRESS_STALLED");
    assert.equal(record?.exit_code, 5);
    const context = record?.context as Record<string, unknown>;
    assert.equal(context.node, "hang");
    assert.equal(context.pending, 3);
    const silent = context.silent_for_seconds as number;
    assert.ok(
      silent >= 0.5 && silent < 0.6 + 0.25,
      `fired after ${silent} s of silence (timeout 0.5 + interval 0.1)`,
    );
    assert.ok(wall < 30, `the hung worker took ${wall} s to end`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
