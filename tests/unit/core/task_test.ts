import { Metric } from "../../../src/core/metrics.ts";
import assert from "node:assert/strict";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { MemoryRuntimeStore } from "../../../src/backends/memory/runtime_store.ts";
import {
  Barrier,
  crash,
  FaultSchedule,
  raiseTyped,
  SimulatedCrash,
  throwSimulatedCrash,
} from "../../../src/backends/faults.ts";
import { known, type Observation } from "../../../src/backends/outcomes.ts";
import {
  ACTUAL_PROCTIME_METADATA_KEY,
  CHECKPOINT_METADATA_KEY,
  type Logger,
  PROCTIME_METADATA_KEY,
  RuntimeContext,
} from "../../../src/core/context.ts";
import {
  BrokerUnavailable,
  ConfigError,
  DeviceError,
  type ErrorRecord,
  PoisonMessage,
  ProgressStalled,
  SchemaError,
  UpstreamAborted,
  VideoflowRuntimeError,
  WorkerUnhealthy,
} from "../../../src/core/errors.ts";
import {
  type InputEntry,
  type InputGroup,
  type InputInfo,
  type Messenger,
  pendingObservationOf,
  StopReason,
} from "../../../src/core/messenger.ts";
import { ConsumerNode, END, type Node, ProcessorNode, ProducerNode } from "../../../src/core/node.ts";
import { ConsecutiveFailureBreaker, ProgressDeadline } from "../../../src/core/supervision.ts";
import {
  type AnyTaskOptions,
  ConsumerTask,
  createTask,
  invokeNode,
  ProcessorTask,
  ProducerTask,
  SIGTERM_EXIT_CODE,
  TaskEnd,
  type TaskOutcome,
  type TaskWatchdog,
} from "../../../src/core/task.ts";
import { HealthState } from "../../../src/runtime/health.ts";
import { idempotencyKey, LedgerIdempotencyStore } from "../../../src/runtime/idempotency.ts";
import { WireDouble } from "../../../src/wire/value.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

// ---------------------------------------------------------------------------------------------------------
// A scripted messenger: it hands out the groups it was given, in order, and records every call.

type Call = readonly [string, ...unknown[]];

interface Script {
  readonly groups?: InputGroup[];
  /** The stop `checkForTermination` reports once `stopAfter` items were published (producers). */
  readonly stop?: StopReason | null;
  readonly stopAfter?: number;
  readonly drops?: Record<string, number>;
  readonly pending?: Observation<number>;
  /** What `awaitInFlight` rejects with: a publication that failed in the background. */
  readonly inFlightFailure?: Error;
  /** The publications (1-based) the broker takes as duplicates: their `onAccepted` never runs. */
  readonly duplicates?: readonly number[];
  /** The acks (1-based) whose confirmation never comes back: their `onAcked` never runs. */
  readonly unconfirmedAcks?: readonly number[];
  /** The failures (1-based) the delivery policy retries; every other failure is given up (dead-lettered). */
  readonly retriedFailures?: readonly number[];
}

class ScriptedMessenger implements Messenger {
  readonly calls: Call[] = [];
  /** The `proctime` and `actual_proctime` metadata of each published output, in order. */
  readonly timings: (readonly [unknown, unknown])[] = [];
  readonly #groups: InputGroup[];
  readonly #stop: StopReason | null;
  readonly #stopAfter: number;
  #drops: Record<string, number>;
  readonly #pending: Observation<number> | undefined;
  readonly #inFlightFailure: Error | undefined;
  readonly #duplicates: readonly number[];
  readonly #unconfirmedAcks: readonly number[];
  readonly #retriedFailures: readonly number[];
  #received = 0;
  #last: InputGroup | null = null;

  constructor(script: Script = {}) {
    this.#groups = [...(script.groups ?? [])];
    this.#stop = script.stop ?? null;
    this.#stopAfter = script.stopAfter ?? 0;
    this.#drops = { ...(script.drops ?? {}) };
    this.#pending = script.pending;
    this.#inFlightFailure = script.inFlightFailure;
    this.#duplicates = script.duplicates ?? [];
    this.#unconfirmedAcks = script.unconfirmedAcks ?? [];
    this.#retriedFailures = script.retriedFailures ?? [];
  }

  #record(...call: Call): Promise<void> {
    this.calls.push(call);
    return Promise.resolve();
  }

  named(name: string): Call[] {
    return this.calls.filter((call) => call[0] === name);
  }

  names(): string[] {
    return this.calls.map((call) => call[0]);
  }

  receiveMessage(): Promise<InputGroup> {
    const group = this.#groups.shift();
    if (group === undefined) throw new Error("the script has no more groups");
    this.#received++;
    this.#last = group;
    this.calls.push(["receiveMessage"]);
    return Promise.resolve(group);
  }
  /** Records the output, and its metadata when it carries more than the timing every output carries. */
  /** The script's broker takes every output as new but its {@link Script.duplicates}. */
  publishMessage(
    message: unknown,
    metadata: Record<string, unknown> = {},
    onAccepted?: () => void,
  ): Promise<void> {
    const { [PROCTIME_METADATA_KEY]: proctime, [ACTUAL_PROCTIME_METADATA_KEY]: actual, ...rest } = metadata;
    this.timings.push([proctime, actual]);
    if (!this.#duplicates.includes(this.timings.length)) onAccepted?.();
    return Object.keys(rest).length === 0
      ? this.#record("publishMessage", message)
      : this.#record("publishMessage", message, rest);
  }
  publishStopSignal(): Promise<void> {
    return this.#record("publishStopSignal");
  }
  publishAbort(error: unknown): Promise<void> {
    return this.#record("publishAbort", error);
  }
  /** The script's broker confirms every acknowledgement but its {@link Script.unconfirmedAcks}. */
  ackInputs(onAcked?: () => void): Promise<void> {
    if (!this.#unconfirmedAcks.includes(this.named("ackInputs").length + 1)) onAcked?.();
    return this.#record("ackInputs");
  }
  awaitInFlight(): Promise<void> {
    this.calls.push(["awaitInFlight"]);
    return this.#inFlightFailure === undefined ? Promise.resolve() : Promise.reject(this.#inFlightFailure);
  }
  /** The script's delivery policy gives every failure up but its {@link Script.retriedFailures}. */
  failInputs(error: unknown): Promise<boolean> {
    const retried = this.#retriedFailures.includes(this.named("failInputs").length + 1);
    return this.#record("failInputs", error).then(() => !retried);
  }
  checkForTermination(): boolean {
    return this.stopReason() !== null;
  }
  stopReason(): StopReason | null {
    return this.named("publishMessage").length >= this.#stopAfter ? this.#stop : null;
  }
  quiesce(): Promise<void> {
    return this.#record("quiesce");
  }
  checkpoint(state: Uint8Array): Promise<void> {
    return this.#record("checkpoint", state);
  }
  restoreCheckpoint(): Promise<Uint8Array | null> {
    return Promise.resolve(null);
  }
  resumeOffset(): Promise<number> {
    return Promise.resolve(0);
  }
  setOutputEventTimestamp(value: number): void {
    this.calls.push(["setOutputEventTimestamp", value]);
  }
  setOutputPartitionKey(value: unknown): void {
    this.calls.push(["setOutputPartitionKey", value]);
  }
  lastInputInfo(): Readonly<Record<string, InputInfo | InputInfo[] | null>> | null {
    if (this.#last === null) return null;
    const seq = this.#received;
    return Object.fromEntries(
      Object.entries(this.#last).map(([parent, entry]) => [
        parent,
        entry === null ? null : { eventTs: entry.eventTs, metadata: entry.metadata, traceId: `t${seq}`, seq },
      ]),
    );
  }
  lastInputKey(): string | null {
    return this.#last === null ? null : `key-${this.#received}`;
  }
  takeDrops(): Record<string, number> {
    const drops = this.#drops;
    this.#drops = {};
    return drops;
  }
  pendingObservation(): Promise<Observation<number>> {
    return Promise.resolve(this.#pending ?? known(0));
  }
  close(): Promise<void> {
    return this.#record("close");
  }
}

function data(message: unknown, metadata: Record<string, unknown> | null = null): InputEntry {
  return { message, metadata, eventTs: null, isStopSignal: false, isAbort: false };
}

function eos(): InputEntry {
  return { message: null, metadata: null, eventTs: null, isStopSignal: true, isAbort: false };
}

function abort(origin: string, error: ErrorRecord): InputEntry {
  return {
    message: null,
    metadata: null,
    eventTs: null,
    isStopSignal: false,
    isAbort: true,
    abortOrigin: origin,
    abortError: error,
  };
}

/** One group per value from parent `src`, then its EOS. */
function stream(...values: unknown[]): InputGroup[] {
  return [...values.map((value) => ({ src: data(value) })), { src: eos() }];
}

const silent: Logger = { debug() {}, info() {}, warn() {}, error() {} };

function contextFor(messenger: Messenger, nodeName: string): RuntimeContext {
  return new RuntimeContext({ flowId: "flow", runId: "run", nodeName, replicaId: 1 }, silent, messenger);
}

const ORIGIN_ERROR: ErrorRecord = {
  code: "VF_DEVICE",
  type: "DeviceError",
  message: "the GPU fell off the bus",
  remedy: null,
  exit_code: 4,
  disposition: "worker_fatal",
  context: { node: "cam" },
};

// ---------------------------------------------------------------------------------------------------------
// Small nodes.

/** Every lifecycle call a test node saw, with whether its last argument was the context. */
type Lifecycle = string[];

class Count extends ProducerNode<{ n: number; failAt?: number; misconfiguredAt?: number }> {
  readonly seen: Lifecycle = [];
  #i = 0;
  override open(ctx: RuntimeContext): void {
    this.seen.push(`open:${ctx instanceof RuntimeContext}`);
  }
  override close(): void {
    this.seen.push("close");
  }
  override seek(offset: number, ctx: RuntimeContext): void {
    this.seen.push(`seek:${offset}:${ctx instanceof RuntimeContext}`);
    this.#i = offset;
  }
  next(ctx: RuntimeContext): unknown {
    if (!(ctx instanceof RuntimeContext)) throw new Error("next() got no context");
    if (this.#i === this.params.failAt) throw new TypeError("the camera hung up");
    if (this.#i === this.params.misconfiguredAt) {
      throw new ConfigError("no such camera", "name one that exists");
    }
    return this.#i < this.params.n ? ++this.#i : END;
  }
}

class Square extends ProcessorNode {
  readonly seen: Lifecycle = [];
  override close(): void {
    this.seen.push("close");
  }
  process(x: number): Promise<number> {
    return Promise.resolve(x * x);
  }
}

/** Fails on the values its params name: `poison`, `plain` (unclassified) or `fatal`. */
class Picky extends ProcessorNode<
  { poison?: number[]; plain?: number[]; fatal?: number[]; misconfigured?: number[] }
> {
  readonly seen: Lifecycle = [];
  override close(): void {
    this.seen.push("close");
  }
  process(x: number): number {
    if (this.params.poison?.includes(x)) throw new PoisonMessage(`${x} is not a frame`);
    if (this.params.plain?.includes(x)) throw new RangeError(`${x} is out of range`);
    if (this.params.fatal?.includes(x)) throw new DeviceError("CUDA out of memory");
    if (this.params.misconfigured?.includes(x)) {
      throw new ConfigError("no such model", "name one that exists");
    }
    return x;
  }
}

class Join extends ProcessorNode {
  process(inputs: unknown): unknown {
    return inputs;
  }
}

class Checkpointing extends ProcessorNode {
  async process(x: number, ctx: RuntimeContext): Promise<number> {
    await ctx.checkpoint(new Uint8Array([x]));
    return x + 1;
  }
}

class Collect extends ConsumerNode {
  readonly consumed: unknown[] = [];
  readonly seen: Lifecycle = [];
  override close(): void {
    this.seen.push("close");
  }
  async consume(input: unknown, ctx: RuntimeContext): Promise<void> {
    await ctx.checkpoint(new Uint8Array([this.consumed.length]));
    this.consumed.push(input);
  }
}

class OpenFails extends ProcessorNode {
  readonly seen: Lifecycle = [];
  override open(): void {
    throw new Error("the model file is missing");
  }
  override close(): void {
    this.seen.push("close");
  }
  process(x: unknown): unknown {
    return x;
  }
}

class CloseFails extends ConsumerNode {
  override close(): void {
    throw new Error("the file system is read-only");
  }
  consume(): void {}
}

function outcomeOf<K extends TaskOutcome["kind"]>(
  outcome: TaskOutcome,
  kind: K,
): Extract<TaskOutcome, { kind: K }> {
  assert.equal(outcome.kind, kind, `expected ${kind}, got ${JSON.stringify(outcome)}`);
  return outcome as Extract<TaskOutcome, { kind: K }>;
}

// ---------------------------------------------------------------------------------------------------------
// invokeNode

Deno.test("invokeNode passes the context last, awaits the result and lets END through", async () => {
  const messenger = new ScriptedMessenger();
  const ctx = contextFor(messenger, "n");
  const seen: unknown[][] = [];
  const result = await invokeNode(
    (a: number, b: string, c: RuntimeContext) => {
      seen.push([a, b, c]);
      return Promise.resolve(END);
    },
    [1, "two"],
    { node: "n", replica: 0, ctx },
  );
  assert.equal(result, END);
  assert.deepEqual(seen, [[1, "two", ctx]]);
});

Deno.test("invokeNode classifies what a node threw and stamps the message identity", async () => {
  const ctx = contextFor(new ScriptedMessenger(), "n");
  const options = { node: "n", replica: 3, traceId: "cam:7", seq: 7n, ctx, onError: "poison" };
  const error = await invokeNode(
    () => {
      throw new RangeError("bad width");
    },
    [],
    options,
  ).then(() => null, (e) => e);
  assert.ok(error instanceof VideoflowRuntimeError);
  assert.equal(error.disposition, "poison");
  assert.equal(error.message, "bad width");
  assert.deepEqual(error.context, {
    node: "n",
    replica: 3,
    trace_id: "cam:7",
    seq: 7n,
    error_type: "RangeError",
  });
  assert.ok((error as { cause?: unknown }).cause instanceof RangeError);

  const ours = new DeviceError("no device", null, { node: "kept" });
  const enriched = await invokeNode(() => Promise.reject(ours), [], options).then(() => null, (e) => e);
  assert.equal(enriched, ours, "one of ours is enriched in place, never re-wrapped");
  assert.deepEqual(ours.context, { node: "kept", replica: 3, trace_id: "cam:7", seq: 7n });
  assert.equal(ours.disposition, "worker_fatal");
});

Deno.test("invokeNode lets a simulated crash through untouched", async () => {
  const ctx = contextFor(new ScriptedMessenger(), "n");
  const crashed = new SimulatedCrash(137, Barrier.nodeProcessBefore);
  await assert.rejects(
    invokeNode(
      () => {
        throw crashed;
      },
      [],
      { node: "n", replica: 0, ctx },
    ),
    (e) => e === crashed,
  );
});

// ---------------------------------------------------------------------------------------------------------
// A harness: one node, one scripted messenger, the task its kind runs under.

interface Ran {
  readonly messenger: ScriptedMessenger;
  readonly outcome: TaskOutcome;
}

/** The options a test task gets: a sink has no children, a receiver one parent `src` unless told. */
function optionsFor(
  node: Node,
  messenger: ScriptedMessenger,
  extra: Partial<AnyTaskOptions>,
): AnyTaskOptions {
  return {
    messenger,
    ctx: contextFor(messenger, node.name),
    hasChildren: !(node instanceof ConsumerNode),
    parentNames: node instanceof ProducerNode ? [] : ["src"],
    ...extra,
  };
}

async function runNode(node: Node, script: Script = {}, extra: Partial<AnyTaskOptions> = {}): Promise<Ran> {
  const messenger = new ScriptedMessenger(script);
  return { messenger, outcome: await createTask(node, optionsFor(node, messenger, extra)).run() };
}

// ---------------------------------------------------------------------------------------------------------
// Producer

Deno.test("a producer publishes every item, then EOS exactly once when next() returns END", async () => {
  const node = new Count({ name: "count", n: 3 });
  const { messenger, outcome } = await runNode(node);
  assert.deepEqual(outcome, { kind: TaskEnd.finished, exitCode: 0 });
  assert.deepEqual(messenger.calls, [
    ["publishMessage", 1],
    ["publishMessage", 2],
    ["publishMessage", 3],
    ["publishStopSignal"],
  ]);
  assert.deepEqual(node.seen, ["open:true", "close"]);
});

Deno.test("a producer's control stop ends the stream with EOS; quiesce and a lost authority publish none", async () => {
  const cases = [
    { stop: StopReason.control, eos: 1, outcome: { kind: TaskEnd.finished, exitCode: 0 } },
    {
      stop: StopReason.quiesce,
      eos: 0,
      outcome: { kind: TaskEnd.stopped, reason: StopReason.quiesce, exitCode: SIGTERM_EXIT_CODE },
    },
    {
      stop: StopReason.authorityLost,
      eos: 0,
      outcome: { kind: TaskEnd.stopped, reason: StopReason.authorityLost, exitCode: 0 },
    },
  ];
  for (const { stop, eos: expectedEos, outcome: expected } of cases) {
    const node = new Count({ name: "live", n: 1000, isFinite: false });
    const { messenger, outcome } = await runNode(node, { stop, stopAfter: 2 });
    assert.deepEqual(outcome, expected, stop);
    assert.equal(messenger.named("publishMessage").length, 2, stop);
    assert.equal(messenger.named("publishStopSignal").length, expectedEos, stop);
    assert.deepEqual(node.seen, ["open:true", "close"], stop);
  }
});

Deno.test("story 22: a producer whose next() throws publishes ABORT with the classified error and fails", async () => {
  const node = new Count({ name: "cam", n: 10, failAt: 2 });
  const { messenger, outcome } = await runNode(node);
  const failure = outcomeOf(outcome, TaskEnd.failed);
  assert.equal(failure.exitCode, 4);
  assert.equal(failure.abortPublished, true);
  assert.ok(failure.error instanceof VideoflowRuntimeError);
  assert.equal(failure.error.message, "the camera hung up");
  assert.deepEqual(failure.error.context, { node: "cam", replica: 1, error_type: "TypeError" });
  assert.deepEqual(messenger.names(), ["publishMessage", "publishMessage", "awaitInFlight", "publishAbort"]);
  assert.equal(messenger.named("publishAbort")[0][1], failure.error);
  assert.deepEqual(node.seen, ["open:true", "close"]);
});

Deno.test("a replayable producer is positioned past its resume offset before the first next()", async () => {
  const node = new Count({ name: "file", n: 5 });
  const { messenger, outcome } = await runNode(node, {}, { resumeOffset: 3 });
  assert.equal(outcome.kind, TaskEnd.finished);
  assert.deepEqual(node.seen, ["open:true", "seek:3:true", "close"]);
  assert.deepEqual(messenger.named("publishMessage").map((call) => call[1]), [4, 5]);
  const messenger2 = new ScriptedMessenger();
  assert.throws(
    () => new ProducerTask(node, optionsFor(node, messenger2, { resumeOffset: -1 })),
    ConfigError,
  );
});

// ---------------------------------------------------------------------------------------------------------
// Processor

Deno.test("a processor publishes each output before acking its input, then forwards EOS", async () => {
  const node = new Square({ name: "square" });
  const { messenger, outcome } = await runNode(node, { groups: stream(2, 3) });
  assert.deepEqual(outcome, { kind: TaskEnd.finished, exitCode: 0 });
  assert.deepEqual(messenger.calls, [
    ["receiveMessage"],
    ["publishMessage", 4],
    ["ackInputs"],
    ["receiveMessage"],
    ["publishMessage", 9],
    ["ackInputs"],
    ["receiveMessage"],
    ["publishStopSignal"],
  ]);
  assert.deepEqual(node.seen, ["close"]);
});

Deno.test("a processor without children publishes nothing, not even EOS, acks, and ends once its acks landed", async () => {
  const { messenger, outcome } = await runNode(new Square({ name: "leaf" }), { groups: stream(2) }, {
    hasChildren: false,
  });
  assert.equal(outcome.kind, TaskEnd.finished);
  assert.deepEqual(messenger.names(), ["receiveMessage", "ackInputs", "receiveMessage", "awaitInFlight"]);
});

/** Takes `0.25 × x` seconds of the given clock per input. */
class Slow extends ProcessorNode<{ readonly clock: FakeClock }> {
  process(x: number): number {
    this.params.clock.advance(0.25 * x);
    return x;
  }
}

Deno.test("every output carries its proctime and actual_proctime as doubles, the reference's metadata", async () => {
  const clock = new FakeClock();
  const slow = new Slow({ name: "slow", clock });
  const { messenger } = await runNode(slow, { groups: stream(1, 2, 4) }, { clock });
  const seconds = messenger.timings.map((timing) =>
    timing.map((value) => {
      assert.ok(value instanceof WireDouble, `a double on the wire, not an integer: ${value}`);
      return value.value;
    })
  );
  assert.deepEqual(seconds, [[0.25, 0.25], [0.5, 0.5], [1, 1]]);
  let at = 0;
  const count = new (class extends ProducerNode {
    next(): number | typeof END {
      clock.advance(0.5);
      return ++at <= 2 ? at : END;
    }
  })({ name: "count" });
  const produced = await runNode(count, {}, { clock });
  assert.deepEqual(
    produced.messenger.timings.map(([p, a]) => [(p as WireDouble).value, (a as WireDouble).value]),
    [
      [0.5, 0.5],
      [0.5, 0.5],
    ],
  );
});

/** A messenger whose broker-side encoding refuses the output `4`, as a value the wire cannot carry. */
class UnwiredFour extends ScriptedMessenger {
  override publishMessage(message: unknown, metadata?: Record<string, unknown>): Promise<void> {
    if (message === 4) return Promise.reject(new SchemaError("payload: a function cannot cross the wire"));
    return super.publishMessage(message, metadata);
  }
}

Deno.test("an output the wire cannot carry fails its input as poison, and the loop goes on", async () => {
  const messenger = new UnwiredFour({ groups: stream(1, 2, 3) });
  const node = new Square({ name: "square" });
  const outcome = await createTask(node, optionsFor(node, messenger, {})).run();
  assert.equal(outcome.kind, TaskEnd.finished);
  const failures = messenger.named("failInputs");
  assert.equal(failures.length, 1);
  const error = failures[0][1] as SchemaError;
  assert.ok(error instanceof SchemaError);
  assert.equal(error.disposition, "poison");
  assert.deepEqual(error.context, { node: "square", replica: 1, trace_id: "t2", seq: 2 });
  assert.deepEqual(messenger.named("publishMessage").map((call) => call[1]), [1, 9]);
  assert.equal(messenger.named("ackInputs").length, 2);
});

Deno.test("a poison input goes to failInputs as poison, counts as a drop, and the loop goes on", async () => {
  const health = new HealthState("picky");
  const node = new Picky({ name: "picky", poison: [2] });
  const { messenger, outcome } = await runNode(node, { groups: stream(1, 2, 3) }, { health });
  assert.equal(outcome.kind, TaskEnd.finished);
  const failures = messenger.named("failInputs");
  assert.equal(failures.length, 1);
  const error = failures[0][1] as PoisonMessage;
  assert.ok(error instanceof PoisonMessage);
  assert.equal(error.disposition, "poison");
  assert.deepEqual(error.context, { node: "picky", replica: 1, trace_id: "t2", seq: 2 });
  assert.deepEqual(messenger.named("publishMessage").map((call) => call[1]), [1, 3]);
  assert.equal(messenger.named("ackInputs").length, 2);
  assert.equal(health.counter(Metric.processed), 2);
  assert.equal(health.counter(Metric.failed), 1);
  assert.equal(health.counter(Metric.offered), 3);
  assert.equal(health.counter(Metric.received), 4);
  assert.match(health.renderMetrics(), /videoflow_messages_dropped_total\{node="picky",reason="poison"\} 1/);
  assert.match(health.renderMetrics(), /videoflow_errors_total\{[^}]*code="VF_POISON"[^}]*\} 1/);
});

Deno.test("processed counts a producer's outputs taken as new and a receiver's confirmed acks, nothing twice", async () => {
  const made = new HealthState("count");
  await runNode(new Count({ name: "count", n: 3 }), { duplicates: [2] }, { health: made });
  assert.equal(made.counter(Metric.processed), 2, "a replayed output the broker already had is not counted");
  assert.equal(made.counter(Metric.published), 3);
  const taken = new HealthState("picky");
  const { messenger } = await runNode(new Picky({ name: "picky" }), {
    groups: stream(1, 2, 3),
    unconfirmedAcks: [1],
  }, { health: taken });
  assert.equal(messenger.named("ackInputs").length, 3);
  assert.equal(taken.counter(Metric.processed), 2, "an ack never confirmed is not counted");
});

Deno.test("under best-effort delivery an unclassified failure counts as a best_effort drop", async () => {
  const health = new HealthState("picky");
  const { messenger, outcome } = await runNode(
    new Picky({ name: "picky", plain: [1] }),
    { groups: stream(1), drops: { join_evicted: 2 } },
    { health, delivery: "best-effort" },
  );
  assert.equal(outcome.kind, TaskEnd.finished);
  const text = health.renderMetrics();
  assert.match(text, /reason="best_effort"\} 1/);
  assert.match(text, /reason="join_evicted"\} 2/, "the messenger's own drops are reported too");
  assert.equal((messenger.named("failInputs")[0][1] as VideoflowRuntimeError).disposition, "transient");
});

Deno.test("the author's mistake (exit 2) is never restarted, so it publishes ABORT, in a producer and in a processor", async () => {
  const producer = await runNode(new Count({ name: "cam", n: 10, misconfiguredAt: 2 }));
  const failed = outcomeOf(producer.outcome, TaskEnd.failed);
  assert.equal(failed.exitCode, 2);
  assert.equal(failed.error.code, "VF_CONFIG");
  assert.equal(failed.abortPublished, true);
  assert.deepEqual(producer.messenger.names(), [
    "publishMessage",
    "publishMessage",
    "awaitInFlight",
    "publishAbort",
  ]);
  const node = new Picky({ name: "detect", misconfigured: [2] });
  const processor = await runNode(node, { groups: stream(1, 2, 3) });
  const failure = outcomeOf(processor.outcome, TaskEnd.failed);
  assert.equal(failure.exitCode, 2);
  assert.equal(failure.abortPublished, true);
  assert.equal(
    (processor.messenger.named("failInputs")[0][1] as VideoflowRuntimeError).disposition,
    "worker_fatal",
    "its input is handed back, not dead-lettered",
  );
  assert.equal(processor.messenger.named("publishAbort").length, 1);
});

Deno.test("story 25: ten consecutive unclassified failures trip the breaker; no ABORT is published", async () => {
  const values = Array.from({ length: 12 }, (_, i) => i + 1);
  const node = new Picky({ name: "sick", plain: values });
  const { messenger, outcome } = await runNode(node, { groups: stream(...values) }, {
    breaker: new ConsecutiveFailureBreaker(10, "sick"),
  });
  const failure = outcomeOf(outcome, TaskEnd.failed);
  assert.ok(failure.error instanceof WorkerUnhealthy);
  assert.equal(failure.abortPublished, false);
  assert.equal(messenger.named("failInputs").length, 10);
  assert.equal(messenger.named("publishAbort").length, 0);
  assert.equal(messenger.named("publishStopSignal").length, 0);
  assert.deepEqual(node.seen, ["close"]);
});

Deno.test("story 25: failures the delivery policy retries never trip the breaker; the first it gives up does", async () => {
  const values = Array.from({ length: 30 }, (_, i) => i + 1);
  const node = new Picky({ name: "flaky", plain: values });
  const retried = values.slice(0, 25);
  const { messenger, outcome } = await runNode(
    node,
    { groups: stream(...values), retriedFailures: retried },
    {
      breaker: new ConsecutiveFailureBreaker(10, "flaky"),
    },
  );
  const failure = outcomeOf(outcome, TaskEnd.failed);
  assert.ok(failure.error instanceof WorkerUnhealthy);
  assert.equal(messenger.named("failInputs").length, 26, "25 retried failures in a row, then one given up");
});

Deno.test("the input-call watch is told around each call of the node only: not for EOS, and left even when the node throws", async () => {
  const node = new Picky({ name: "watched", poison: [2] });
  const told: string[] = [];
  const inputCalls = {
    entered: () => told.push(`entered ${messenger.names().length}`),
    left: () => told.push(`left ${messenger.names().length}`),
  };
  const messenger = new ScriptedMessenger({ groups: stream(1, 2) });
  const outcome = await createTask(node, optionsFor(node, messenger, { inputCalls })).run();
  assert.equal(outcome.kind, TaskEnd.finished);
  assert.deepEqual(told, ["entered 1", "left 1", "entered 4", "left 4"], messenger.names().join(", "));
});

Deno.test("story 25: an interleaved success resets the breaker's count", async () => {
  const failing = Array.from({ length: 9 }, (_, i) => i + 1);
  const later = failing.map((v) => v + 10);
  const node = new Picky({ name: "flaky", plain: [...failing, ...later] });
  const { messenger, outcome } = await runNode(node, { groups: stream(...failing, 100, ...later) }, {
    breaker: new ConsecutiveFailureBreaker(10, "flaky"),
  });
  assert.equal(outcome.kind, TaskEnd.finished);
  assert.equal(messenger.named("failInputs").length, 18);
  assert.deepEqual(messenger.named("publishMessage").map((call) => call[1]), [100]);
});

Deno.test("randomized: the breaker trips exactly at the first run of `threshold` failures in a row", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let round = 0; round < 40; round++) {
    const threshold = random.int(1, 6);
    const length = random.int(1, 30);
    const failing = Array.from({ length }, () => random.chance(0.7));
    const values = failing.map((_, i) => i);
    let run = 0;
    let tripAt = -1;
    for (let i = 0; i < length && tripAt < 0; i++) {
      run = failing[i] ? run + 1 : 0;
      if (run === threshold) tripAt = i;
    }
    const node = new Picky({ name: "p", plain: values.filter((i) => failing[i]) });
    const { messenger, outcome } = await runNode(node, { groups: stream(...values) }, {
      breaker: new ConsecutiveFailureBreaker(threshold, "p"),
    });
    const handled = failing.slice(0, tripAt < 0 ? length : tripAt + 1);
    const where = `seed ${seed}, round ${round}, threshold ${threshold}, failing ${JSON.stringify(failing)}`;
    assert.equal(outcome.kind, tripAt < 0 ? TaskEnd.finished : TaskEnd.failed, where);
    assert.equal(messenger.named("failInputs").length, handled.filter(Boolean).length, where);
    assert.equal(messenger.named("ackInputs").length, handled.filter((f) => !f).length, where);
  }
});

Deno.test("story 24: a worker_fatal failure is handed back, never ABORTed, and stops the loop", async () => {
  const node = new Picky({ name: "gpu", fatal: [2] });
  const { messenger, outcome } = await runNode(node, { groups: stream(1, 2, 3) });
  const failure = outcomeOf(outcome, TaskEnd.failed);
  assert.ok(failure.error instanceof DeviceError);
  assert.equal(failure.error.disposition, "worker_fatal");
  assert.equal(failure.exitCode, 4);
  assert.equal(failure.abortPublished, false);
  assert.deepEqual(messenger.names(), [
    "receiveMessage",
    "publishMessage",
    "ackInputs",
    "receiveMessage",
    "failInputs",
    "awaitInFlight",
  ]);
  assert.equal(messenger.named("failInputs")[0][1], failure.error);
  assert.deepEqual(node.seen, ["close"]);
});

Deno.test("story 24 through the barrier: a worker_fatal fault before process() is the node's failure", async () => {
  using schedule = new FaultSchedule({
    [Barrier.nodeProcessBefore]: raiseTyped("VF_WORKER_FATAL", "injected", "worker_fatal"),
  }).install();
  const { messenger, outcome } = await runNode(new Square({ name: "sq" }), { groups: stream(1) });
  schedule.assertAllFired();
  assert.equal(outcomeOf(outcome, TaskEnd.failed).error.code, "VF_WORKER_FATAL");
  assert.deepEqual(messenger.names(), ["receiveMessage", "failInputs", "awaitInFlight"]);
});

Deno.test("a crash at a barrier ends the task like a death: no failInputs, no ABORT, no close", async () => {
  using schedule = new FaultSchedule({ [Barrier.nodeProcessAfter]: crash() }, {
    onCrash: throwSimulatedCrash,
  })
    .install();
  const node = new Square({ name: "sq" });
  const messenger = new ScriptedMessenger({ groups: stream(1) });
  await assert.rejects(createTask(node, optionsFor(node, messenger, {})).run(), SimulatedCrash);
  schedule.assertAllFired();
  assert.deepEqual(messenger.names(), ["receiveMessage"]);
  assert.deepEqual(node.seen, []);
});

Deno.test("story 21: a parent's ABORT outranks a sibling's EOS and is relayed with the origin's record", async () => {
  const groups = [{ left: data(1), right: data(2) }, { left: eos(), right: abort("cam", ORIGIN_ERROR) }];
  const { messenger, outcome } = await runNode(new Join({ name: "fuse" }), { groups }, {
    parentNames: ["left", "right"],
  });
  const aborted = outcomeOf(outcome, TaskEnd.upstreamAborted);
  assert.equal(aborted.exitCode, 4);
  assert.equal(aborted.parent, "right");
  assert.equal(aborted.origin, "cam");
  assert.ok(aborted.error instanceof UpstreamAborted);
  assert.deepEqual(aborted.error.context.origin_error, ORIGIN_ERROR);
  assert.deepEqual(messenger.names(), [
    "receiveMessage",
    "publishMessage",
    "ackInputs",
    "receiveMessage",
    "publishAbort",
    "awaitInFlight",
  ]);
  assert.equal(messenger.named("publishAbort")[0][1], ORIGIN_ERROR, "relayed unchanged");
});

Deno.test("a sink that sees an ABORT stops with exit 4 and relays nothing (it has no children)", async () => {
  const node = new Collect({ name: "sink" });
  const { messenger, outcome } = await runNode(node, { groups: [{ src: abort("cam", ORIGIN_ERROR) }] });
  assert.equal(outcome.kind, TaskEnd.upstreamAborted);
  assert.equal(outcome.exitCode, 4);
  assert.deepEqual(messenger.names(), ["receiveMessage", "awaitInFlight"]);
  assert.deepEqual(node.seen, ["close"]);
});

Deno.test("a join receives its inputs in parent order, null for a parent a quorum left out", async () => {
  const groups = [
    { a: data("from a"), b: data("from b") },
    { a: data("a only"), b: null },
    { a: eos(), b: eos() },
  ];
  const { messenger, outcome } = await runNode(new Join({ name: "join" }), { groups }, {
    parentNames: ["b", "a"],
  });
  assert.equal(outcome.kind, TaskEnd.finished);
  assert.deepEqual(messenger.named("publishMessage").map((call) => call[1]), [
    ["from b", "from a"],
    [null, "a only"],
  ]);
});

Deno.test("a processor's checkpoint rides with its output; a sink's is written at once", async () => {
  const processed = await runNode(new Checkpointing({ name: "cp" }), { groups: stream(5) });
  assert.equal(processed.outcome.kind, TaskEnd.finished);
  assert.deepEqual(processed.messenger.named("publishMessage"), [
    ["publishMessage", 6, { [CHECKPOINT_METADATA_KEY]: new Uint8Array([5]) }],
  ]);
  assert.equal(processed.messenger.named("checkpoint").length, 0);

  const consumed = await runNode(new Collect({ name: "sink" }), { groups: stream("x") });
  assert.equal(consumed.outcome.kind, TaskEnd.finished);
  assert.deepEqual(consumed.messenger.names(), [
    "receiveMessage",
    "checkpoint",
    "ackInputs",
    "receiveMessage",
    "awaitInFlight",
  ]);
});

Deno.test("a processor's undefined output is published as null", async () => {
  class Nothing extends ProcessorNode {
    process(): void {}
  }
  const { messenger, outcome } = await runNode(new Nothing({ name: "nothing" }), { groups: stream(1) });
  assert.equal(outcome.kind, TaskEnd.finished);
  assert.deepEqual(messenger.named("publishMessage"), [["publishMessage", null]]);
});

Deno.test("a quiesced receiver stops without EOS once its work in flight landed, before receiving or on a terminating group", async () => {
  const early = await runNode(new Square({ name: "sq" }), { groups: stream(1), stop: StopReason.quiesce });
  assert.deepEqual(early.outcome, {
    kind: TaskEnd.stopped,
    reason: StopReason.quiesce,
    exitCode: SIGTERM_EXIT_CODE,
  });
  assert.deepEqual(early.messenger.names(), ["awaitInFlight"]);

  const late = await runNode(new Square({ name: "sq" }), {
    groups: stream(1),
    stop: StopReason.authorityLost,
    stopAfter: 1,
  });
  assert.equal(late.outcome.kind, TaskEnd.stopped);
  assert.deepEqual(late.messenger.names(), ["receiveMessage", "publishMessage", "ackInputs"]);
});

Deno.test("a quiesce whose work in flight failed ends the task failed, not as a clean stop", async () => {
  const refused = new BrokerUnavailable("the broker refused an output", "restart the worker");
  const producer = await runNode(new Count({ name: "live", n: 1000, isFinite: false }), {
    stop: StopReason.quiesce,
    stopAfter: 2,
    inFlightFailure: refused,
  });
  assert.equal(producer.outcome.kind, TaskEnd.failed);
  const receiver = await runNode(new Square({ name: "sq" }), {
    groups: stream(1),
    stop: StopReason.quiesce,
    inFlightFailure: refused,
  });
  assert.equal(receiver.outcome.kind, TaskEnd.failed);
  assert.equal(receiver.outcome.kind === TaskEnd.failed && receiver.outcome.error, refused);
});

Deno.test("a control stop does not end a receiver: it drains until its parents' EOS", async () => {
  const { messenger, outcome } = await runNode(new Square({ name: "sq" }), {
    groups: stream(1, 2),
    stop: StopReason.control,
  });
  assert.equal(outcome.kind, TaskEnd.finished);
  assert.equal(messenger.named("publishMessage").length, 2);
  assert.equal(messenger.named("publishStopSignal").length, 1);
});

Deno.test("the progress deadline is checked between messages: a stall ends the task with exit 5, no ABORT", async () => {
  const clock = new FakeClock();
  const messenger = new ScriptedMessenger({ groups: stream(1), pending: known(4, clock) });
  const deadline = new ProgressDeadline({
    timeoutSeconds: 10,
    pendingProbe: () => pendingObservationOf(messenger),
    clock,
    nodeName: "slow",
  });
  const seen: string[] = [];
  class SlowOpen extends ProcessorNode {
    override open(): void {
      clock.advance(11);
    }
    override close(): void {
      seen.push("close");
    }
    process(x: number): number {
      return x;
    }
  }
  const node = new SlowOpen({ name: "slow" });
  const outcome = await createTask(node, optionsFor(node, messenger, { deadline, clock })).run();
  const failure = outcomeOf(outcome, TaskEnd.failed);
  assert.ok(failure.error instanceof ProgressStalled);
  assert.equal(failure.exitCode, 5);
  assert.equal(failure.abortPublished, false);
  assert.deepEqual(messenger.names(), ["awaitInFlight"], "the stall is found before the first receive");
  assert.deepEqual(seen, ["close"]);
});

Deno.test("acks and failures record progress on the deadline, so a working node never stalls", async () => {
  const clock = new FakeClock();
  const messenger = new ScriptedMessenger({ groups: stream(1, 2, 3, 4), pending: known(4, clock) });
  const deadline = new ProgressDeadline({
    timeoutSeconds: 10,
    pendingProbe: () => messenger.pendingObservation(),
    clock,
  });
  class Slow extends ProcessorNode {
    process(x: number): number {
      clock.advance(9);
      if (x % 2 === 0) throw new PoisonMessage("even");
      return x;
    }
  }
  const node = new Slow({ name: "slow" });
  const outcome = await createTask(node, optionsFor(node, messenger, { deadline, clock })).run();
  assert.equal(outcome.kind, TaskEnd.finished);
  assert.equal(messenger.named("failInputs").length, 2);
});

Deno.test("pendingObservationOf reads a messenger without the method as idle", async () => {
  const bare: Messenger = new ScriptedMessenger();
  const withoutIt = { ...bare, pendingObservation: undefined } as Messenger;
  const observed = await pendingObservationOf(withoutIt);
  assert.equal(observed.kind, "known");
  assert.equal(observed.kind === "known" ? observed.value : -1, 0);
});

// ---------------------------------------------------------------------------------------------------------
// Consumer

Deno.test("a sink consumes each group, acks after consume, and finishes on EOS without publishing", async () => {
  const node = new Collect({ name: "sink" });
  const { messenger, outcome } = await runNode(node, { groups: stream("a", "b") });
  assert.deepEqual(outcome, { kind: TaskEnd.finished, exitCode: 0 });
  assert.deepEqual(node.consumed, ["a", "b"]);
  assert.equal(messenger.named("ackInputs").length, 2);
  assert.equal(messenger.named("publishMessage").length + messenger.named("publishStopSignal").length, 0);
  assert.deepEqual(node.seen, ["close"]);
});

Deno.test("a metadata sink receives its parents' metadata instead of their messages", async () => {
  const node = new Collect({ name: "meta", metadata: true });
  const groups = [{ a: data(1, { fps: 30 }), b: data(2, { fps: 25 }) }, { a: eos(), b: eos() }];
  await runNode(node, { groups }, { parentNames: ["a", "b"] });
  assert.deepEqual(node.consumed, [[{ fps: 30 }, { fps: 25 }]]);
});

Deno.test("an idempotent sink skips a group whose effect is marked and marks the ones it consumed", async () => {
  const store = new LedgerIdempotencyStore(new MemoryRuntimeStore());
  await store.mark(idempotencyKey("flow", "sink", "key-2"));
  const node = new Collect({ name: "sink", idempotent: true });
  const { messenger } = await runNode(node, { groups: stream("a", "b", "c") }, { effectMarkers: store });
  assert.deepEqual(node.consumed, ["a", "c"]);
  assert.equal(messenger.named("ackInputs").length, 3, "a skipped group is still acked");
  assert.equal(await store.seen(idempotencyKey("flow", "sink", "key-1")), true);
  assert.equal(await store.seen(idempotencyKey("flow", "sink", "key-3")), true);

  const notIdempotent = new Collect({ name: "sink" });
  await runNode(notIdempotent, { groups: stream("a", "b") }, { effectMarkers: store });
  assert.deepEqual(notIdempotent.consumed, ["a", "b"], "markers apply to idempotent sinks only");
});

// ---------------------------------------------------------------------------------------------------------
// run(): open, close, watchdog, health

Deno.test("a failing open() publishes ABORT, never starts the loop, and close() is still called", async () => {
  const node = new OpenFails({ name: "model" });
  const { messenger, outcome } = await runNode(node, { groups: stream(1) });
  const failure = outcomeOf(outcome, TaskEnd.failed);
  assert.equal(failure.abortPublished, true);
  assert.equal(failure.streamEnded, false);
  assert.equal(failure.error.message, "the model file is missing");
  assert.deepEqual(messenger.names(), ["awaitInFlight", "publishAbort"]);
  assert.deepEqual(node.seen, ["close"]);
});

Deno.test("a close() that fails after a clean loop turns the outcome into that failure", async () => {
  const { outcome } = await runNode(new CloseFails({ name: "writer" }), { groups: stream(1) });
  const failure = outcomeOf(outcome, TaskEnd.failed);
  assert.equal(failure.error.message, "the file system is read-only");
  assert.equal(failure.abortPublished, false);
  assert.equal(failure.streamEnded, true, "its stream had ended cleanly: a restart would take it again");
});

Deno.test("the watchdog runs from after open() to the end; readiness and metrics follow the loop", async () => {
  const events: string[] = [];
  const watchdog: TaskWatchdog = { start: () => events.push("start"), stop: () => events.push("stop") };
  const health = new HealthState("sq");
  class Watched extends ProcessorNode {
    override open(): void {
      events.push(`open ready=${health.isReady()}`);
    }
    override close(): void {
      events.push("close");
    }
    process(x: number): number {
      events.push(`process ready=${health.isReady()}`);
      return x;
    }
  }
  await runNode(new Watched({ name: "sq" }), { groups: stream(1, 2) }, { watchdog, health });
  assert.deepEqual(events, [
    "open ready=false",
    "start",
    "process ready=true",
    "process ready=true",
    "stop",
    "close",
  ]);
  assert.ok(health.isLive());
  assert.equal(health.counter(Metric.published), 2);
  assert.equal(health.histogram(Metric.proctime)?.at(-1), 2);
  assert.equal(health.histogram(Metric.actualProctime)?.at(-1), 2);
});

Deno.test("createTask picks the task of the node's kind and refuses a receiver without parents", () => {
  const messenger = new ScriptedMessenger();
  const options = { messenger, ctx: contextFor(messenger, "n"), hasChildren: true };
  assert.ok(createTask(new Count({ name: "c", n: 1 }), options) instanceof ProducerTask);
  assert.ok(
    createTask(new Square({ name: "s" }), { ...options, parentNames: ["c"] }) instanceof ProcessorTask,
  );
  assert.ok(
    createTask(new Collect({ name: "k" }), { ...options, parentNames: ["s"] }) instanceof ConsumerTask,
  );
  assert.throws(() => createTask(new Square({ name: "s" }), options), ConfigError);
  assert.equal(options.ctx.emitsOutput, true, "the task sets the context's emitsOutput from hasChildren");
});
