import assert from "node:assert/strict";
import {
  ConsecutiveFailureBreaker,
  DEFAULT_BREAKER_THRESHOLD,
  DEFAULT_PROGRESS_TIMEOUT_SECONDS,
  EventLog,
  flowStalled,
  nodeExited,
  nodeGaveUp,
  nodeRestarted,
  nodeStarted,
  type PendingProbe,
  ProgressDeadline,
  renderEvent,
  restartCanMend,
  SupervisionPolicy,
} from "../../../src/core/supervision.ts";
import {
  BrokerUnavailable,
  ConfigError,
  DecodeError,
  diskFailure,
  EXIT_STALLED,
  LASTING_FAILURE_KEY,
  ProgressStalled,
  ResourceUnavailable,
  TransientFailure,
  WorkerFatal,
  WorkerUnhealthy,
} from "../../../src/core/errors.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { known, type Observation, unknown } from "../../../src/backends/outcomes.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

Deno.test("breaker: nine failures in a row pass, the tenth trips it with WorkerUnhealthy (story 25)", () => {
  const breaker = new ConsecutiveFailureBreaker(DEFAULT_BREAKER_THRESHOLD, "detect");
  for (let i = 0; i < 9; i++) {
    breaker.recordFailure(new Error(`boom ${i}`));
    breaker.check();
  }
  assert.equal(breaker.tripped, false);
  breaker.recordFailure(new TypeError("cuda context lost"));
  assert.equal(breaker.tripped, true);
  assert.equal(breaker.consecutiveFailures, 10);
  assert.throws(() => breaker.check(), (error: unknown) => {
    assert.ok(error instanceof WorkerUnhealthy);
    assert.equal(error.code, "VF_WORKER_UNHEALTHY");
    assert.equal(error.disposition, "worker_fatal");
    assert.equal(error.context.node, "detect");
    assert.equal(error.context.consecutive_failures, 10);
    assert.equal(error.context.last_error_code, "VF_EXC_TYPE_ERROR");
    assert.match(
      error.message,
      /detect failed 10 attempts in a row \(a redelivery counts again\); the last: .*cuda context lost/,
    );
    assert.ok(error.remedy);
    return true;
  });
});

Deno.test("breaker: an interleaved success resets the run, so nine-fail-one-succeed never trips (story 25)", () => {
  const breaker = new ConsecutiveFailureBreaker(10, "sink");
  for (let round = 0; round < 5; round++) {
    for (let i = 0; i < 9; i++) breaker.recordFailure(new DecodeError("bad frame"));
    breaker.check();
    breaker.recordSuccess();
    assert.equal(breaker.consecutiveFailures, 0);
  }
  assert.equal(breaker.tripped, false);
});

Deno.test("breaker: counts failures whatever their disposition, and threshold 0 disables it", () => {
  const counting = new ConsecutiveFailureBreaker(3);
  counting.recordFailure(new DecodeError("poison"));
  counting.recordFailure(new WorkerFatal("fatal"));
  counting.recordFailure("a string");
  assert.throws(() => counting.check(), WorkerUnhealthy);

  const disabled = new ConsecutiveFailureBreaker(0);
  for (let i = 0; i < 1000; i++) disabled.recordFailure(new Error("x"));
  assert.equal(disabled.tripped, false);
  disabled.check();
});

Deno.test("breaker: a run of failures that are all being retried never trips it, however long; the first one given up does", () => {
  const breaker = new ConsecutiveFailureBreaker(10, "model");
  for (let i = 0; i < 50; i++) breaker.recordFailure(new TransientFailure(`frame ${i}: try again`), false);
  breaker.check();
  assert.equal(breaker.tripped, false);
  assert.equal(breaker.consecutiveFailures, 50);
  breaker.recordFailure(new TransientFailure("frame 0: out of attempts"), true);
  assert.throws(() => breaker.check(), WorkerUnhealthy);
  breaker.recordSuccess();
  for (let i = 0; i < 9; i++) breaker.recordFailure(new TransientFailure(`frame ${i}`), i === 0);
  assert.equal(breaker.tripped, false, "a success starts the run over, what was given up included");
  breaker.recordFailure(new TransientFailure("frame 9"), false);
  assert.equal(breaker.tripped, true, "a give-up anywhere in the run counts");
});

Deno.test("breaker: a negative or fractional threshold is a ConfigError", () => {
  assert.throws(() => new ConsecutiveFailureBreaker(-1), ConfigError);
  assert.throws(() => new ConsecutiveFailureBreaker(2.5), ConfigError);
  assert.throws(() => new ConsecutiveFailureBreaker(Number.NaN), ConfigError);
});

Deno.test("breaker: random success/failure sequences trip exactly when the trailing run reaches the threshold", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let trial = 0; trial < 200; trial++) {
    const threshold = random.int(0, 6);
    const breaker = new ConsecutiveFailureBreaker(threshold);
    let run = 0;
    for (let step = 0; step < 40; step++) {
      if (random.chance(0.7)) {
        breaker.recordFailure(new Error("x"));
        run++;
      } else {
        breaker.recordSuccess();
        run = 0;
      }
      const expected = threshold > 0 && run >= threshold;
      assert.equal(breaker.tripped, expected, `seed ${seed} trial ${trial} step ${step}`);
      assert.equal(breaker.consecutiveFailures, run, `seed ${seed} trial ${trial} step ${step}`);
    }
  }
});

/** A probe that answers from a queue (the last answer repeats) and counts its calls. */
function scriptedProbe(...answers: Array<(clock: FakeClock) => Observation<number>>) {
  const state = { calls: 0 };
  return {
    state,
    probe(clock: FakeClock): PendingProbe {
      return () => {
        const answer = answers[Math.min(state.calls, answers.length - 1)];
        state.calls++;
        return answer(clock);
      };
    },
  };
}

const pending = (count: number) => (clock: FakeClock) => known(count, clock);
const unobservable = (clock: FakeClock) => unknown("timeout", clock, "broker silent");

Deno.test("deadline: before the timeout the probe is never consulted; after it, pending work trips ProgressStalled", async () => {
  const clock = new FakeClock();
  const script = scriptedProbe(pending(3));
  const deadline = new ProgressDeadline({
    timeoutSeconds: 30,
    pendingProbe: script.probe(clock),
    nodeName: "detect",
    clock,
  });
  clock.advance(29.9);
  await deadline.check();
  assert.equal(script.state.calls, 0);
  clock.advance(0.1);
  await assert.rejects(deadline.check(), (error: unknown) => {
    assert.ok(error instanceof ProgressStalled);
    assert.equal(error.exitCode, EXIT_STALLED);
    assert.equal(error.disposition, "worker_fatal");
    assert.equal(error.context.node, "detect");
    assert.equal(error.context.pending, 3);
    assert.equal(error.context.silent_for_seconds, 30);
    assert.match(error.message, /node detect acked nothing for 30\.0 s while 3 message\(s\) were pending/);
    return true;
  });
  assert.equal(script.state.calls, 1);
});

Deno.test("deadline: progress restarts the silence, so a slow node that keeps acking is never stalled", async () => {
  const clock = new FakeClock();
  const deadline = new ProgressDeadline({ timeoutSeconds: 10, pendingProbe: () => known(100, clock), clock });
  for (let i = 0; i < 50; i++) {
    clock.advance(9.5);
    deadline.recordProgress();
    await deadline.check();
  }
  assert.equal(deadline.silentFor(), 0);
  clock.advance(10);
  await assert.rejects(deadline.check(), ProgressStalled);
});

Deno.test("deadline: an idle node (nothing pending) is not stalled, and its silence window restarts at the idle reading", async () => {
  const clock = new FakeClock();
  const script = scriptedProbe(pending(0), pending(4));
  const deadline = new ProgressDeadline({ timeoutSeconds: 60, pendingProbe: script.probe(clock), clock });
  clock.advance(600);
  await deadline.check();
  assert.equal(deadline.silentFor(), 0);
  clock.advance(59);
  await deadline.check();
  assert.equal(script.state.calls, 1, "the window restarted: no probe before another 60 s");
  clock.advance(1);
  await assert.rejects(deadline.check(), ProgressStalled);
});

Deno.test("deadline: Unknown pending neither resets nor trips; after twice the timeout of Unknown it is BrokerUnavailable (story 7)", async () => {
  const clock = new FakeClock();
  const script = scriptedProbe(unobservable);
  const deadline = new ProgressDeadline({
    timeoutSeconds: 100,
    pendingProbe: script.probe(clock),
    nodeName: "sink",
    clock,
  });
  assert.equal(deadline.unknownGraceSeconds, 200);
  clock.advance(100);
  await deadline.check();
  assert.equal(deadline.silentFor(), 100, "Unknown must not reset the window");
  for (let t = 0; t < 199; t += 1) {
    clock.advance(1);
    await deadline.check();
  }
  assert.equal(deadline.silentFor(), 299);
  clock.advance(1);
  await assert.rejects(deadline.check(), (error: unknown) => {
    assert.ok(error instanceof BrokerUnavailable);
    assert.equal(error.exitCode, 3);
    assert.equal(error.context.node, "sink");
    assert.equal(error.context.reason, "timeout");
    assert.equal(error.context.unknown_for_seconds, 200);
    assert.match(error.message, /node sink could not be observed for 200\.0 s \(timeout: broker silent\)/);
    return true;
  });
});

Deno.test("deadline: after a run of Unknown, a Known pending count trips at once (the window was never reset)", async () => {
  const clock = new FakeClock();
  const script = scriptedProbe(unobservable, unobservable, pending(2));
  const deadline = new ProgressDeadline({ timeoutSeconds: 10, pendingProbe: script.probe(clock), clock });
  clock.advance(10);
  await deadline.check();
  clock.advance(5);
  await deadline.check();
  clock.advance(1);
  await assert.rejects(deadline.check(), ProgressStalled);
  assert.equal(script.state.calls, 3);
});

Deno.test("deadline: a Known answer ends a run of Unknown, so the grace starts over at the next Unknown", async () => {
  const clock = new FakeClock();
  const script = scriptedProbe(unobservable, pending(0), unobservable);
  const deadline = new ProgressDeadline({
    timeoutSeconds: 10,
    unknownGraceSeconds: 15,
    pendingProbe: script.probe(clock),
    clock,
  });
  clock.advance(10);
  await deadline.check(); // Unknown from t=10
  clock.advance(14);
  await deadline.check(); // Known(0) at t=24: idle, window restarts
  clock.advance(10);
  await deadline.check(); // Unknown from t=34
  clock.advance(14);
  await deadline.check(); // 14 s of Unknown: within grace
  clock.advance(1);
  await assert.rejects(deadline.check(), BrokerUnavailable);
});

Deno.test("deadline: progress recorded while the probe is in flight wins over the stale pending count", async () => {
  const clock = new FakeClock();
  let answer: (value: Observation<number>) => void = () => {};
  const deadline = new ProgressDeadline({
    timeoutSeconds: 5,
    pendingProbe: () => new Promise((resolve) => answer = resolve),
    clock,
  });
  clock.advance(6);
  const check = deadline.check();
  await Promise.resolve();
  deadline.recordProgress();
  answer(known(7, clock));
  await check;
});

Deno.test("deadline: timeout 0 or no probe never trips; a probe that throws rejects with its own error", async () => {
  const clock = new FakeClock();
  const calls: number[] = [];
  const off = new ProgressDeadline({
    timeoutSeconds: 0,
    pendingProbe: () => {
      calls.push(1);
      return known(1, clock);
    },
    clock,
  });
  const blind = new ProgressDeadline({ timeoutSeconds: 1, clock });
  clock.advance(10_000);
  await off.check();
  await blind.check();
  assert.equal(off.enabled, false);
  assert.deepEqual(calls, []);
  const failing = new ProgressDeadline({
    timeoutSeconds: 1,
    pendingProbe: () => {
      throw new RangeError("probe bug");
    },
    clock,
  });
  clock.advance(1);
  await assert.rejects(failing.check(), RangeError);
});

Deno.test("deadline: defaults are 300 s and a grace of twice the timeout; bad numbers are ConfigErrors", () => {
  const deadline = new ProgressDeadline({ clock: new FakeClock() });
  assert.equal(deadline.timeoutSeconds, DEFAULT_PROGRESS_TIMEOUT_SECONDS);
  assert.equal(deadline.unknownGraceSeconds, 600);
  assert.throws(() => new ProgressDeadline({ timeoutSeconds: -1 }), ConfigError);
  assert.throws(() => new ProgressDeadline({ timeoutSeconds: Infinity }), ConfigError);
  assert.throws(() => new ProgressDeadline({ unknownGraceSeconds: -0.5 }), ConfigError);
});

Deno.test("policy: defaults mirror a Job (3 restarts, 10/20/40 s, transient and worker_fatal)", () => {
  const policy = new SupervisionPolicy();
  assert.equal(policy.maxRestarts, 3);
  assert.deepEqual(policy.backoffSeconds, [10, 20, 40]);
  assert.deepEqual([...policy.restartOn].sort(), ["transient", "worker_fatal"]);
  assert.deepEqual([0, 1, 2, 3, 7].map((n) => policy.delayFor(n)), [10, 20, 40, 40, 40]);
});

Deno.test("policy: poison is never restarted, an unexplained death is, and the budget ends restarts", () => {
  const policy = new SupervisionPolicy();
  assert.equal(policy.shouldRestart(0, "poison"), false);
  assert.equal(policy.shouldRestart(0, null), true);
  assert.equal(policy.shouldRestart(2, "transient"), true);
  assert.equal(policy.shouldRestart(2, "worker_fatal"), true);
  assert.equal(policy.shouldRestart(3, "transient"), false);
  assert.equal(policy.shouldRestart(3, null), false);
  assert.equal(SupervisionPolicy.disabled().shouldRestart(0, "transient"), false);
});

Deno.test("policy: local() keeps the restart count and compresses the backoff", () => {
  const local = SupervisionPolicy.local();
  assert.equal(local.maxRestarts, new SupervisionPolicy().maxRestarts);
  assert.deepEqual(local.backoffSeconds, [1, 2, 4]);
  assert.ok(local.backoffSeconds.reduce((a, b) => a + b) < 10);
});

Deno.test("policy: a supervisor loop restarts a transient crasher three times with backoff, then gives up", () => {
  const policy = new SupervisionPolicy();
  const log = new EventLog();
  const reason = { code: "VF_TRANSIENT", message: "model server down", disposition: "transient" };
  let spent = 0;
  let waited = 0;
  log.emit(nodeStarted("detect", 1));
  for (;;) {
    const exited = nodeExited("detect", 1, 4, reason);
    log.emit(exited);
    const decision = policy.decide(exited, spent);
    if (decision.kind === "finished") assert.fail("a crash is not finished");
    log.emit(decision.event);
    if (decision.kind === "give_up") break;
    waited += decision.delaySeconds;
    spent++;
    log.emit(nodeStarted("detect", 1, spent));
  }
  assert.equal(waited, 70);
  assert.equal(log.restartCount("detect"), 3);
  assert.equal(log.restartCount("other"), 0);
  assert.deepEqual(log.failedNodes(), ["detect"]);
  const gaveUp = log.events.at(-1);
  assert.deepEqual(gaveUp, nodeGaveUp("detect", 1, 3, reason));
  assert.deepEqual(log.lines(), [
    "detect[1] exited with code 4 (VF_TRANSIENT: model server down)",
    "detect[1] restarting in 10s (restart 1)",
    "detect[1] started (restart 1)",
    "detect[1] exited with code 4 (VF_TRANSIENT: model server down)",
    "detect[1] restarting in 20s (restart 2)",
    "detect[1] started (restart 2)",
    "detect[1] exited with code 4 (VF_TRANSIENT: model server down)",
    "detect[1] restarting in 40s (restart 3)",
    "detect[1] started (restart 3)",
    "detect[1] exited with code 4 (VF_TRANSIENT: model server down)",
    "detect[1] gave up after 3 restart(s): VF_TRANSIENT: model server down",
  ]);
});

Deno.test("policy: decide finishes a clean exit and gives up at once on a poison death", () => {
  const policy = SupervisionPolicy.local();
  assert.deepEqual(policy.decide(nodeExited("a", 0, 0), 0), { kind: "finished" });
  const poison = nodeExited("a", 0, 4, { code: "VF_POISON", message: "bad", disposition: "poison" });
  assert.deepEqual(policy.decide(poison, 0), {
    kind: "give_up",
    event: nodeGaveUp("a", 0, 0, poison.reason),
  });
  const silent = policy.decide(nodeExited("a", 0, 137), 0);
  assert.equal(silent.kind, "restart");
  assert.deepEqual(silent.kind === "restart" && silent.event, nodeRestarted("a", 0, 1, 1));
});

Deno.test("policy: bad options are ConfigErrors naming the fix", () => {
  assert.throws(() => new SupervisionPolicy({ maxRestarts: -1 }), ConfigError);
  assert.throws(() => new SupervisionPolicy({ backoffSeconds: [] }), ConfigError);
  assert.throws(() => new SupervisionPolicy({ backoffSeconds: [1, -2] }), ConfigError);
  assert.throws(() => new SupervisionPolicy({ restartOn: ["transient", "sometimes"] }), ConfigError);
  assert.throws(() => new SupervisionPolicy().delayFor(-1), ConfigError);
});

Deno.test("events: nodeExited reads clean and disposition; renderEvent prints each kind in one line", () => {
  const clean = nodeExited("sink", 2, 0);
  assert.equal(clean.clean, true);
  assert.equal(clean.disposition, null);
  assert.equal(nodeExited("sink", 2, 4, { disposition: "sometimes" }).disposition, null);
  assert.equal(
    nodeExited("sink", 2, 5, { code: "VF_PROGRESS_STALLED", disposition: "worker_fatal" }).disposition,
    "worker_fatal",
  );
  assert.equal(renderEvent(nodeStarted("sink", 2)), null);
  assert.equal(renderEvent(clean), null);
  assert.equal(renderEvent(nodeExited("sink", 2, 137)), "sink[2] exited with code 137 (no reason reported)");
  assert.equal(
    renderEvent(nodeExited("sink", 2, 5, { code: "VF_PROGRESS_STALLED" })),
    "sink[2] exited with code 5 (VF_PROGRESS_STALLED)",
  );
  assert.equal(renderEvent(nodeRestarted("sink", 2, 1, 0.25)), "sink[2] restarting in 0.25s (restart 1)");
  assert.equal(
    renderEvent(nodeGaveUp("sink", 2, 0)),
    "sink[2] gave up after 0 restart(s): no reason reported",
  );
  assert.equal(
    renderEvent(flowStalled("pod detect-0 unschedulable")),
    "flow stalled: pod detect-0 unschedulable",
  );
  for (const event of [nodeStarted("a", 0, 1), nodeRestarted("a", 0, 1, 1), flowStalled("x")]) {
    assert.ok(!renderEvent(event)?.includes("\n"));
    assert.ok(Object.isFrozen(event));
  }
});

Deno.test("event log: failedNodes lists each node that gave up once, in first-seen order", () => {
  const log = new EventLog();
  log.emit(nodeGaveUp("b", 0, 3));
  log.emit(nodeGaveUp("a", 1, 3));
  log.emit(nodeGaveUp("b", 1, 3));
  log.emit(flowStalled("stuck"));
  assert.deepEqual(log.failedNodes(), ["b", "a"]);
  assert.equal(log.restartCount(), 0);
  assert.equal(log.events.length, 4);
  assert.deepEqual(log.lines().at(-1), "flow stalled: stuck");
});

Deno.test("a restart cannot mend the author's mistake (exit 2) or a parent's abort: the policy gives up at once", () => {
  const policy = SupervisionPolicy.local();
  const userError = policy.decide(nodeExited("n", 0, 2, { code: "VF_CONFIG", disposition: null }), 0);
  assert.equal(userError.kind, "give_up");
  const aborted = policy.decide(
    nodeExited("n", 0, 4, { code: "VF_UPSTREAM_ABORTED", disposition: "worker_fatal" }),
    0,
  );
  assert.equal(aborted.kind, "give_up");
  const crashed = policy.decide(
    nodeExited("n", 0, 4, { code: "VF_WORKER_FATAL", disposition: "worker_fatal" }),
    0,
  );
  assert.equal(crashed.kind, "restart");
  assert.ok(restartCanMend(nodeExited("n", 0, 137)));
});

Deno.test("a restart cannot mend a disk that is full or read-only: the policy gives up at once, but restarts a lost broker", () => {
  const policy = SupervisionPolicy.local();
  const full = diskFailure(
    Object.assign(new Error("No space left on device (os error 28)"), { code: "ENOSPC" }),
    "x",
    "/x",
  );
  assert.ok(full !== null);
  assert.equal(
    policy.decide(nodeExited("sink", 0, 3, { ...full.toDict(), disposition: "worker_fatal" }), 0).kind,
    "give_up",
  );
  const lost = new BrokerUnavailable("the connection to the embedded broker ended").toDict();
  assert.equal(policy.decide(nodeExited("sink", 0, 3, { ...lost }), 0).kind, "restart");
});

Deno.test("a refused GPU grant (a lasting failure) is not restarted; the same ResourceUnavailable without the mark is", () => {
  const policy = SupervisionPolicy.local();
  const refused = new ResourceUnavailable("node detect refuses to open", null, {
    [LASTING_FAILURE_KEY]: true,
  });
  assert.equal(policy.decide(nodeExited("detect", 0, 3, { ...refused.toDict() }), 0).kind, "give_up");
  const passing = new ResourceUnavailable("a device was busy").toDict();
  assert.equal(policy.decide(nodeExited("detect", 0, 3, { ...passing }), 0).kind, "restart");
});

Deno.test("a replica given up on is rendered with its reason's remedy, when the reason has one", () => {
  const reason = { code: "VF_NODE_CONTRACT", message: "node src needs env permission", remedy: "declare it" };
  assert.equal(
    renderEvent(nodeGaveUp("src", 0, 0, reason)),
    "src[0] gave up after 0 restart(s): VF_NODE_CONTRACT: node src needs env permission (remedy: declare it)",
  );
});
