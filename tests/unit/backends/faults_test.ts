import assert from "node:assert/strict";
import {
  ConfigError,
  OwnershipConflict,
  StaleAuthority,
  TRANSIENT,
  TransientFailure,
  WORKER_FATAL,
} from "../../../src/core/errors.ts";
import {
  Barrier,
  barrier,
  BARRIERS,
  barrierSync,
  crash,
  CRASH_EXIT_CODE,
  delay,
  dropResponse,
  FAULT_MARKER_DIR_ENV,
  FAULT_SCHEDULE_ENV,
  type FaultAction,
  FaultSchedule,
  faultsInstalled,
  type Hit,
  InjectedFault,
  installed,
  installFromEnv,
  InvalidTest,
  NOT_FIRED,
  nth,
  pause,
  PauseTimeout,
  raiseError,
  raiseTyped,
  SimulatedCrash,
  throwSimulatedCrash,
  UnknownBarrier,
} from "../../../src/backends/faults.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { loadMerged, ObservationLog } from "../../../src/backends/observation.ts";
import type { FaultWorkerRequest } from "../../support/fault_worker.ts";

const PUBLISH = Barrier.messagePublishBefore;
const SETTLED = Barrier.messageSettleAfter;
const WORKER = new URL("../../support/fault_worker.ts", import.meta.url);

/** A schedule that throws SimulatedCrash instead of exiting, installed for the scope of `using`. */
function inProcess(actions: Record<string, FaultAction>, markerDir: string | null = null): FaultSchedule {
  return new FaultSchedule(actions, { onCrash: throwSimulatedCrash, markerDir }).install();
}

Deno.test("every barrier name is <subject>.<operation>.<before|mid|after> and unique", () => {
  const names = Object.values(Barrier);
  assert.equal(BARRIERS.size, names.length);
  for (const name of names) assert.match(name, /^[a-z]+\.[a-z]+\.(before|mid|after)$/);
  for (
    const spec of [
      "payload.write.after",
      "obligation.acquire.after",
      "owner.read.after",
      "owner.update.before",
    ]
  ) {
    assert.ok(BARRIERS.has(spec), `the spec's barrier ${spec} is in the set`);
  }
});

Deno.test("with nothing installed a barrier returns one shared resolved promise and allocates nothing", async () => {
  assert.equal(installed(), null);
  assert.equal(faultsInstalled(), false);
  const first = barrier(PUBLISH);
  assert.equal(barrier(SETTLED, { key: "x" }), first, "the same promise object every call");
  assert.equal(await first, NOT_FIRED);
  assert.equal(barrierSync(PUBLISH), NOT_FIRED);
});

Deno.test("an unknown barrier name is refused by the schedule and by an installed-path call", async () => {
  assert.throws(() => new FaultSchedule({ "payload.write.sideways": crash() }), UnknownBarrier);
  using _schedule = inProcess({});
  await assert.rejects(barrier("no.such.barrier" as Barrier), UnknownBarrier);
  assert.throws(() => barrierSync("no.such.barrier" as Barrier), UnknownBarrier);
});

Deno.test("Crash runs the crash handler with its exit code after counting the hit", async () => {
  using schedule = inProcess({ [PUBLISH]: crash(), [SETTLED]: crash(3) });
  const error = await barrier(PUBLISH).catch((e) => e);
  assert.ok(error instanceof SimulatedCrash);
  assert.equal(error.exitCode, CRASH_EXIT_CODE);
  assert.equal(error.barrier, PUBLISH);
  assert.throws(() => barrierSync(SETTLED), (e) => e instanceof SimulatedCrash && e.exitCode === 3);
  assert.deepEqual(schedule.fired(), { [PUBLISH]: 1, [SETTLED]: 1 });
});

Deno.test("RaiseError throws what its factory or its class and message make", async () => {
  using _schedule = inProcess({
    [PUBLISH]: raiseError(() => new RangeError("from a factory")),
    [SETTLED]: raiseError(TypeError, "from a class"),
  });
  await assert.rejects(barrier(PUBLISH), (e) => e instanceof RangeError && e.message === "from a factory");
  assert.throws(() => barrierSync(SETTLED), (e) => e instanceof TypeError && e.message === "from a class");
});

Deno.test("raiseTyped builds the taxonomy's class for a code, with the disposition asked for", async () => {
  const thrown = async (action: FaultAction) => {
    using _schedule = inProcess({ [PUBLISH]: action });
    return await barrier(PUBLISH).catch((e) => e);
  };
  const stale = await thrown(raiseTyped("VF_STALE_AUTHORITY", "superseded", TRANSIENT));
  assert.ok(stale instanceof StaleAuthority);
  assert.equal(stale.message, "superseded");
  assert.equal(stale.disposition, TRANSIENT);
  const transient = await thrown(raiseTyped("VF_TRANSIENT", "blip"));
  assert.ok(transient instanceof TransientFailure);
  assert.ok(await thrown(raiseTyped("VF_OWNERSHIP_CONFLICT", "lost")) instanceof OwnershipConflict);
  const injected = await thrown(raiseTyped("VF_SOMETHING_ELSE", "odd", WORKER_FATAL));
  assert.ok(injected instanceof InjectedFault);
  assert.equal(injected.code, "VF_SOMETHING_ELSE");
  assert.equal(injected.disposition, WORKER_FATAL);
  assert.throws(() => raiseTyped("VF_TRANSIENT", "x", "sometimes"), ConfigError);
});

Deno.test("Delay holds the call on the schedule's clock until the clock reaches it", async () => {
  const clock = new FakeClock();
  using _schedule = new FaultSchedule({ [PUBLISH]: delay(2) }, { clock }).install();
  let hit: Hit | null = null;
  const pending = barrier(PUBLISH).then((h) => hit = h);
  await clock.advanceAsync(1.9);
  assert.equal(hit, null, "still delayed before 2 s");
  await clock.advanceAsync(0.1);
  await pending;
  assert.deepEqual(hit, { fired: true, dropResponse: false });
});

Deno.test("DropResponse lets the call continue and tells the call site to report Unknown", async () => {
  using schedule = inProcess({ [SETTLED]: dropResponse() });
  assert.deepEqual(await barrier(SETTLED), { fired: true, dropResponse: true });
  assert.deepEqual(barrierSync(SETTLED), { fired: true, dropResponse: true });
  assert.deepEqual(await barrier(PUBLISH), NOT_FIRED, "an unscheduled barrier passes untouched");
  assert.deepEqual(schedule.fired(), { [SETTLED]: 2 });
});

Deno.test("Pause blocks the barrier until release, and a release is sticky", async () => {
  using schedule = inProcess({ [Barrier.ownerReadAfter]: pause("reader") });
  let passed = 0;
  const first = barrier(Barrier.ownerReadAfter).then(() => passed++);
  const second = barrier(Barrier.ownerReadAfter).then(() => passed++);
  await schedule.untilFired(Barrier.ownerReadAfter, 2);
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(passed, 0, "both hits are held");
  schedule.release("reader");
  await Promise.all([first, second]);
  assert.equal(passed, 2);
  assert.deepEqual(await barrier(Barrier.ownerReadAfter), { fired: true, dropResponse: false });
});

Deno.test("a Pause nobody releases fails with PauseTimeout instead of hanging", async () => {
  using _schedule = inProcess({ [PUBLISH]: pause("forgotten", 0.05) });
  await assert.rejects(barrier(PUBLISH), PauseTimeout);
});

Deno.test("a Pause is released by the marker file another process writes", async () => {
  const markerDir = await Deno.makeTempDir();
  {
    using _schedule = inProcess({ [PUBLISH]: pause("gate") }, markerDir);
    let passed = false;
    const held = barrier(PUBLISH).then(() => passed = true);
    await new Promise((resolve) => setTimeout(resolve, 30));
    assert.equal(passed, false);
    await Deno.writeFile(`${markerDir}/gate.release`, new Uint8Array());
    await held;
    assert.equal(passed, true);
  }
  await Deno.remove(markerDir, { recursive: true });
});

Deno.test("a synchronous barrier cannot wait: Delay or Pause there is a ConfigError", () => {
  using _schedule = inProcess({ [PUBLISH]: delay(1), [SETTLED]: nth(2, pause("p")) });
  assert.throws(() => barrierSync(PUBLISH), ConfigError);
  assert.deepEqual(barrierSync(SETTLED), NOT_FIRED);
  assert.throws(() => barrierSync(SETTLED), ConfigError);
});

Deno.test("Nth applies its action on the n-th hit only", async () => {
  for (const n of [1, 2, 5]) {
    using schedule = inProcess({ [SETTLED]: nth(n, dropResponse()) });
    const hits: boolean[] = [];
    for (let i = 0; i < 7; i++) hits.push((await barrier(SETTLED)).dropResponse);
    assert.deepEqual(hits, Array.from({ length: 7 }, (_, i) => i + 1 === n), `Nth(${n})`);
    assert.deepEqual(schedule.fired(), { [SETTLED]: 7 });
  }
  assert.throws(() => nth(0, crash()), ConfigError);
  assert.throws(() => nth(2, nth(1, crash()) as never), ConfigError);
});

Deno.test("unfired() names each scheduled fault that never applied, and assertAllFired fails the test", async () => {
  using schedule = inProcess({
    [PUBLISH]: dropResponse(),
    [SETTLED]: nth(3, dropResponse()),
    [Barrier.payloadWriteAfter]: dropResponse(),
  });
  await barrier(PUBLISH);
  await barrier(SETTLED);
  await barrier(SETTLED);
  assert.deepEqual(schedule.unfired(), [SETTLED, Barrier.payloadWriteAfter].sort());
  assert.throws(
    () => schedule.assertAllFired(),
    (e) => e instanceof InvalidTest && e.unfired.length === 2 && e.message.includes(SETTLED),
  );
  await barrier(SETTLED);
  await barrier(Barrier.payloadWriteAfter);
  assert.deepEqual(schedule.unfired(), []);
  schedule.assertAllFired();
});

Deno.test("untilFired reports a barrier that is never reached as an invalid test", async () => {
  const schedule = inProcess({ [PUBLISH]: crash() });
  await assert.rejects(schedule.untilFired(PUBLISH, 1, 0.03), InvalidTest);
  schedule.uninstall();
});

Deno.test("leaving the scope of a schedule whose fault never fired fails it with InvalidTest, uninstalled", () => {
  const schedule = inProcess({ [PUBLISH]: crash(), [SETTLED]: dropResponse() });
  assert.equal(barrierSync(SETTLED).dropResponse, true);
  assert.throws(
    () => {
      using _scope = schedule;
    },
    (e) => e instanceof InvalidTest && e.unfired.join() === PUBLISH,
  );
  assert.equal(installed(), null);
  {
    using fired = inProcess({ [SETTLED]: dropResponse() });
    barrierSync(SETTLED);
    assert.deepEqual(fired.unfired(), []);
  }
  assert.equal(installed(), null, "a schedule whose faults all fired leaves its scope quietly");
});

Deno.test("one schedule at a time: a second install is refused until the first is uninstalled", () => {
  const first = inProcess({ [PUBLISH]: crash() });
  assert.equal(installed(), first);
  assert.equal(faultsInstalled(), true);
  assert.throws(() => new FaultSchedule({}).install(), ConfigError);
  {
    first.uninstall();
    using second = new FaultSchedule({}).install();
    assert.equal(installed(), second);
  }
  assert.equal(installed(), null, "`using` uninstalled it");
});

Deno.test("a schedule survives the trip through the environment unchanged", () => {
  const markerDir = Deno.makeTempDirSync();
  const original = new FaultSchedule({
    [PUBLISH]: crash(9),
    [SETTLED]: nth(2, dropResponse()),
    [Barrier.payloadReadBefore]: raiseTyped("VF_TRANSIENT", "read failed", TRANSIENT),
    [Barrier.ownerReadAfter]: pause("owner", 5),
    [Barrier.messageRenewBefore]: delay(0.25),
  }, { markerDir });
  const env = original.toEnv();
  assert.equal(env[FAULT_MARKER_DIR_ENV], markerDir);
  const restored = FaultSchedule.fromEnv(env);
  assert.ok(restored !== null);
  assert.equal(restored.markerDir, markerDir);
  assert.deepEqual(restored.toEnv(), env);
  const raise = restored.actions.get(Barrier.payloadReadBefore);
  assert.ok(raise?.kind === "raise" && raise.factory() instanceof TransientFailure);
  Deno.removeSync(markerDir, { recursive: true });
});

Deno.test("a schedule that cannot travel, or a document that is not one, is a ConfigError", () => {
  assert.throws(() => new FaultSchedule({ [PUBLISH]: crash() }).toEnv(), ConfigError, "no marker dir");
  const markerDir = Deno.makeTempDirSync();
  const local = new FaultSchedule({ [PUBLISH]: raiseError(() => new Error("x")) }, { markerDir });
  assert.throws(() => local.toEnv(), ConfigError, "an in-process factory");
  assert.equal(FaultSchedule.fromEnv({}), null);
  assert.equal(FaultSchedule.fromEnv({ [FAULT_SCHEDULE_ENV]: "" }), null);
  assert.equal(installFromEnv({}), null);
  for (
    const text of [
      "{",
      "[]",
      JSON.stringify({ version: 99, actions: {} }),
      JSON.stringify({ version: 1, actions: { [PUBLISH]: { kind: "explode" } } }),
      JSON.stringify({ version: 1, actions: { [PUBLISH]: { kind: "delay", seconds: "soon" } } }),
    ]
  ) {
    assert.throws(() => FaultSchedule.fromEnv({ [FAULT_SCHEDULE_ENV]: text }), ConfigError, text);
  }
  assert.throws(
    () =>
      FaultSchedule.fromEnv({
        [FAULT_SCHEDULE_ENV]: JSON.stringify({ version: 1, actions: { "a.b.c": {} } }),
      }),
    ConfigError,
  );
  Deno.removeSync(markerDir, { recursive: true });
});

Deno.test("hits through a shared marker dir are numbered across schedules, so Nth counts them all", async () => {
  const markerDir = await Deno.makeTempDir();
  const actions = { [SETTLED]: nth(3, dropResponse()) };
  const elsewhere = new FaultSchedule(actions, { markerDir });
  assert.deepEqual(elsewhere.hitSync(SETTLED), NOT_FIRED);
  assert.deepEqual(elsewhere.hitSync(SETTLED), NOT_FIRED);
  {
    using here = inProcess(actions, markerDir);
    assert.deepEqual(await barrier(SETTLED), { fired: true, dropResponse: true }, "the third hit overall");
    assert.deepEqual(here.fired(), { [SETTLED]: 3 });
    assert.deepEqual(elsewhere.fired(), { [SETTLED]: 3 });
    assert.deepEqual(here.unfired(), []);
  }
  await Deno.remove(markerDir, { recursive: true });
});

interface WorkerRun {
  readonly code: number;
  readonly signal: string | null;
  readonly reports: Record<string, unknown>[];
}

async function runWorkerProcess(
  schedule: FaultSchedule,
  barriers: Barrier[],
  log?: string,
): Promise<WorkerRun> {
  const dir = schedule.markerDir as string;
  const args = [
    "run",
    `--allow-read=${dir}`,
    `--allow-write=${dir}`,
    `--allow-env=${FAULT_SCHEDULE_ENV},${FAULT_MARKER_DIR_ENV}`,
    WORKER.pathname,
    ...(log === undefined ? [] : [`--log=${log}`]),
    ...barriers,
  ];
  const output = await new Deno.Command(Deno.execPath(), {
    args,
    env: schedule.toEnv(),
    stdout: "piped",
    stderr: "piped",
  }).output();
  const reports = new TextDecoder().decode(output.stdout).split("\n").filter((l) => l !== "").map((l) =>
    JSON.parse(l)
  );
  return { code: output.code, signal: output.signal, reports };
}

Deno.test("a Crash in a subprocess ends it with the documented status, and its hits are counted back", async () => {
  const markerDir = await Deno.makeTempDir();
  const schedule = new FaultSchedule({
    [SETTLED]: dropResponse(),
    [PUBLISH]: nth(2, crash()),
  }, { markerDir });
  const log = `${markerDir}/child.jsonl`;
  const parentLog = new ObservationLog({ path: `${markerDir}/parent.jsonl` });
  parentLog.emit("spawn");
  const run = await runWorkerProcess(schedule, [SETTLED, PUBLISH, PUBLISH, SETTLED], log);
  parentLog.emit("reaped", { status: String(run.code) });
  parentLog.close();
  assert.equal(run.code, CRASH_EXIT_CODE);
  assert.deepEqual(run.reports, [
    { step: 0, barrier: SETTLED, hit: { fired: true, dropResponse: true } },
    { step: 1, barrier: PUBLISH, hit: { fired: false, dropResponse: false } },
  ], "no report after the crash, and no finally block ran");
  assert.deepEqual(schedule.fired(), { [SETTLED]: 1, [PUBLISH]: 2 });
  assert.deepEqual(schedule.unfired(), []);
  const merged = loadMerged([log, parentLog.path as string]).map((e) => `${e.kind}:${e.fields.op_id ?? "-"}`);
  assert.deepEqual(merged, [
    "spawn:-",
    "barrier_reached:step-0",
    "barrier_passed:step-0",
    "barrier_reached:step-1",
    "barrier_passed:step-1",
    "barrier_reached:step-2",
    "reaped:-",
  ], "both processes' logs merge in time order; the child logged up to its death");
  await Deno.remove(markerDir, { recursive: true });
});

Deno.test("a Crash with another exit code, and a typed error, reach the parent from a subprocess", async () => {
  const markerDir = await Deno.makeTempDir();
  const crashing = new FaultSchedule({ [PUBLISH]: crash(7) }, { markerDir });
  const crashed = await runWorkerProcess(crashing, [PUBLISH]);
  assert.equal(crashed.code, 7);
  assert.deepEqual(crashed.reports, []);
  await Deno.remove(markerDir, { recursive: true });
  await Deno.mkdir(markerDir);
  const raising = new FaultSchedule({ [SETTLED]: raiseTyped("VF_STALE_AUTHORITY", "old epoch") }, {
    markerDir,
  });
  const raised = await runWorkerProcess(raising, [SETTLED]);
  assert.equal(raised.code, 1);
  assert.deepEqual(raised.reports, [{ error: "VF_STALE_AUTHORITY" }, { finally: true }]);
  assert.deepEqual(raising.fired(), { [SETTLED]: 1 });
  await Deno.remove(markerDir, { recursive: true });
});

Deno.test("a Pause in a subprocess holds it until the parent releases it", async () => {
  const markerDir = await Deno.makeTempDir();
  const schedule = new FaultSchedule({ [Barrier.ownerUpdateBefore]: pause("update") }, { markerDir });
  const child = runWorkerProcess(schedule, [Barrier.ownerUpdateBefore]);
  await schedule.untilFired(Barrier.ownerUpdateBefore, 1, 30);
  schedule.release("update");
  const run = await child;
  assert.equal(run.code, 0);
  assert.deepEqual(run.reports.at(-2), { done: true });
  await Deno.remove(markerDir, { recursive: true });
});

Deno.test("across a Deno Worker: hits are counted back and a Crash ends the worker, not the process", async () => {
  const markerDir = await Deno.makeTempDir();
  const schedule = new FaultSchedule({
    [SETTLED]: dropResponse(),
    [PUBLISH]: crash(),
  }, { markerDir });
  const worker = new Worker(WORKER.href, { type: "module" });
  const reports: unknown[] = [];
  worker.onmessage = (event) => reports.push(event.data);
  const request: FaultWorkerRequest = {
    env: schedule.toEnv(),
    barriers: [SETTLED, PUBLISH, SETTLED],
    log: null,
  };
  worker.postMessage(request);
  try {
    await schedule.untilFired(PUBLISH, 1, 30);
    await new Promise((resolve) => setTimeout(resolve, 100));
    assert.deepEqual(reports, [{ step: 0, barrier: SETTLED, hit: { fired: true, dropResponse: true } }]);
    assert.deepEqual(schedule.fired(), { [SETTLED]: 1, [PUBLISH]: 1 });
  } finally {
    worker.terminate();
    await Deno.remove(markerDir, { recursive: true });
  }
});
