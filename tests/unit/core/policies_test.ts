import assert from "node:assert/strict";
import { ConfigError, DISPOSITIONS } from "../../../src/core/errors.ts";
import {
  ACTION_DLQ,
  ACTION_DLQ_SAMPLED,
  ACTION_NAK,
  ACTION_TERM,
  type DeliveryAction,
  DeliveryPolicy,
  type DeliveryPolicyInit,
  drawRetryJitter,
  JoinPolicy,
  type JoinPolicyInit,
  OrderingPolicy,
  PartitionKeyPolicy,
  ReorderBuffer,
  type ReorderRelease,
} from "../../../src/core/policies.ts";
import { SeededRandom } from "../../support/random.ts";

/** Runs `body` once per seed, naming the seed in any failure. */
function forSeeds(count: number, body: (random: SeededRandom, seed: number) => void): void {
  for (let seed = 1; seed <= count; seed++) {
    try {
      body(new SeededRandom(seed), seed);
    } catch (error) {
      console.error(`failing seed: ${seed}`);
      throw error;
    }
  }
}

/** 1..count in a uniformly random order. */
function shuffled(count: number, random: SeededRandom): number[] {
  return random.shuffle(Array.from({ length: count }, (_, i) => i + 1));
}

/** Asserts `build` throws a ConfigError whose message mentions every one of `mentions` and has a remedy. */
function assertConfigError(build: () => unknown, ...mentions: string[]): ConfigError {
  let caught: unknown;
  try {
    build();
  } catch (error) {
    caught = error;
  }
  assert.ok(caught instanceof ConfigError, `expected a ConfigError, got ${caught}`);
  assert.equal(caught.code, "VF_CONFIG");
  assert.ok(caught.remedy && caught.remedy.length > 0, "a ConfigError names its fix");
  for (const mention of mentions) {
    assert.ok(caught.message.includes(mention), `${JSON.stringify(caught.message)} mentions ${mention}`);
  }
  return caught;
}

// ---------------------------------------------------------------------------------------------- JoinPolicy

Deno.test("a bare JoinPolicy joins by trace, waits forever, drops on timeout and holds 256 groups", () => {
  assert.deepEqual(new JoinPolicy().toDict(), {
    timeout_seconds: null,
    missing: "drop",
    max_pending: 256,
    mode: "trace",
    tolerance_ms: null,
    quorum: null,
    collect: {},
  });
});

Deno.test("JoinPolicy.defaultFor: batch waits forever, realtime times out after 10 s and drops", () => {
  const batch = JoinPolicy.defaultFor("batch");
  assert.equal(batch.missing, "wait");
  assert.equal(batch.timeoutSeconds, null);
  assert.equal(batch.maxPending, 256);
  const realtime = JoinPolicy.defaultFor("realtime");
  assert.equal(realtime.missing, "drop");
  assert.equal(realtime.timeoutSeconds, 10);
  assert.equal(realtime.mode, "trace");
  assertConfigError(() => JoinPolicy.defaultFor("batchh"), "batchh");
});

Deno.test("missing 'wait' never times out, whatever timeout was given", () => {
  assert.equal(new JoinPolicy({ missing: "wait", timeoutSeconds: 5 }).timeoutSeconds, null);
});

const invalidJoins: ReadonlyArray<readonly [string, Record<string, unknown>, string]> = [
  ["an unknown missing policy", { missing: "sometimes" }, "missing"],
  ["an unknown mode", { mode: "lineage" }, "mode"],
  ["max_pending 0", { maxPending: 0 }, "maxPending"],
  ["a fractional max_pending", { maxPending: 1.5 }, "maxPending"],
  ["a string max_pending", { maxPending: "256" }, "maxPending"],
  ["a zero timeout", { timeoutSeconds: 0 }, "timeoutSeconds"],
  ["a negative timeout", { timeoutSeconds: -1 }, "timeoutSeconds"],
  ["a NaN timeout", { timeoutSeconds: NaN }, "timeoutSeconds"],
  ["a string timeout", { timeoutSeconds: "10" }, "timeoutSeconds"],
  ["time mode without tolerance", { mode: "time" }, "toleranceMs"],
  ["time mode with a zero tolerance", { mode: "time", toleranceMs: 0 }, "toleranceMs"],
  ["time mode with a negative tolerance", { mode: "time", toleranceMs: -5 }, "toleranceMs"],
  ["a tolerance in trace mode", { toleranceMs: 10 }, "toleranceMs"],
  ["a quorum in trace mode", { quorum: 2, timeoutSeconds: 1 }, "quorum"],
  ["collect in trace mode", { collect: { imu: 20 } }, "collect"],
  ["quorum 0", { mode: "time", toleranceMs: 10, timeoutSeconds: 1, quorum: 0 }, "quorum"],
  ["a fractional quorum", { mode: "time", toleranceMs: 10, timeoutSeconds: 1, quorum: 1.5 }, "quorum"],
  ["quorum without a timeout", { mode: "time", toleranceMs: 10, quorum: 2 }, "timeoutSeconds"],
  [
    "quorum under missing 'wait'",
    { mode: "time", toleranceMs: 10, timeoutSeconds: 3, missing: "wait", quorum: 2 },
    "quorum",
  ],
  ["a zero collect window", { mode: "time", toleranceMs: 10, collect: { imu: 0 } }, "imu"],
  ["a negative collect window", { mode: "time", toleranceMs: 10, collect: { imu: -2 } }, "imu"],
  ["a string collect window", { mode: "time", toleranceMs: 10, collect: { imu: "5" } }, "imu"],
  ["collect that is a list", { mode: "time", toleranceMs: 10, collect: ["imu"] }, "collect"],
  ["a collect parent with no name", { mode: "time", toleranceMs: 10, collect: { "": 5 } }, "empty parent"],
];

for (const [what, init, mention] of invalidJoins) {
  Deno.test(`JoinPolicy refuses ${what} with a ConfigError`, () => {
    assertConfigError(() => new JoinPolicy(init as JoinPolicyInit), mention);
  });
}

Deno.test("JoinPolicy reports every invalid field of one policy in one error", () => {
  const error = assertConfigError(
    () => new JoinPolicy({ missing: "x", mode: "y", maxPending: 0, timeoutSeconds: -1 } as never),
    "missing",
    "mode",
    "maxPending",
    "timeoutSeconds",
  );
  assert.deepEqual(error.context.fields, ["missing", "mode", "maxPending", "timeoutSeconds"]);
  assert.equal((error.context.problems as string[]).length, 4);
  assert.equal(error.remedy?.split("; ").length, 4);
});

Deno.test("JoinPolicy.fromDict names fields by their dict keys; the constructor by its options", () => {
  assertConfigError(() => JoinPolicy.fromDict({ max_pending: 0 }), "max_pending");
  const fromInit = assertConfigError(() => new JoinPolicy({ maxPending: 0 }), "maxPending");
  assert.ok(!fromInit.message.includes("max_pending"));
});

Deno.test("JoinPolicy.fromDict refuses a non-object and unknown keys, together with bad values", () => {
  for (const bad of [null, [], "trace", 3]) assertConfigError(() => JoinPolicy.fromDict(bad), "JoinPolicy");
  const error = assertConfigError(
    () => JoinPolicy.fromDict({ timeout: 5, missing: "x" }),
    "timeout",
    "missing",
  );
  assert.deepEqual(error.context.fields, ["timeout", "missing"]);
});

Deno.test("JoinPolicy.fromDict fills absent and null keys with defaults", () => {
  assert.deepEqual(JoinPolicy.fromDict({}).toDict(), new JoinPolicy().toDict());
  assert.deepEqual(JoinPolicy.fromDict({ missing: null, collect: null }).toDict(), new JoinPolicy().toDict());
  assert.equal(JoinPolicy.fromDict({ mode: "time", tolerance_ms: 15 }).toleranceMs, 15);
});

Deno.test("JoinPolicy round-trips through its dict and JSON with the spec's exact keys", () => {
  const policies = [
    new JoinPolicy(),
    JoinPolicy.defaultFor("batch"),
    JoinPolicy.defaultFor("realtime"),
    new JoinPolicy({ missing: "error", timeoutSeconds: 2.5, maxPending: 7 }),
    new JoinPolicy({ mode: "time", toleranceMs: 15, timeoutSeconds: 2, quorum: 2, collect: { imu: 40 } }),
  ];
  for (const policy of policies) {
    const dict = policy.toDict();
    assert.deepEqual(Object.keys(dict), [
      "timeout_seconds",
      "missing",
      "max_pending",
      "mode",
      "tolerance_ms",
      "quorum",
      "collect",
    ]);
    assert.deepEqual(JoinPolicy.fromDict(dict).toDict(), dict);
    assert.deepEqual(JoinPolicy.fromDict(JSON.parse(JSON.stringify(dict))), policy);
  }
});

Deno.test("a JoinPolicy's collect cannot be changed through its dict or directly", () => {
  const policy = new JoinPolicy({ mode: "time", toleranceMs: 10, collect: { imu: 40 } });
  (policy.toDict().collect as Record<string, number>).imu = 1;
  assert.equal(policy.collect.imu, 40);
  assert.throws(() => {
    (policy.collect as Record<string, number>).imu = 1;
  }, TypeError);
});

Deno.test("JoinPolicy.workingSet is max_pending halves per extra parent plus the group being assembled", () => {
  const policy = new JoinPolicy();
  assert.equal(policy.workingSet(2), 257);
  assert.equal(policy.workingSet(3), 513);
  assert.equal(policy.workingSet(1), 257);
  assert.equal(new JoinPolicy({ maxPending: 1 }).workingSet(2), 2);
  assert.equal(new JoinPolicy({ maxPending: 10 }).workingSet(5), 41);
});

Deno.test("a collect parent's buffer holds max(1024, max_pending × 16) samples", () => {
  assert.equal(new JoinPolicy().collectBufferCapacity, 4096);
  assert.equal(new JoinPolicy({ maxPending: 10 }).collectBufferCapacity, 1024);
  assert.equal(new JoinPolicy({ maxPending: 64 }).collectBufferCapacity, 1024);
  assert.equal(new JoinPolicy({ maxPending: 65 }).collectBufferCapacity, 1040);
});

Deno.test("an unclaimed collect sample is kept for the timeout (30 s without one) plus the settle window", () => {
  const collect = { imu: 40, gps: 250 };
  const untimed = new JoinPolicy({ mode: "time", toleranceMs: 10, collect });
  assert.equal(untimed.settleSeconds, 0.25);
  assert.equal(untimed.collectRetentionSeconds, 30.25);
  const timed = new JoinPolicy({ mode: "time", toleranceMs: 10, timeoutSeconds: 2, collect });
  assert.equal(timed.collectRetentionSeconds, 2.25);
  const plain = new JoinPolicy({ mode: "time", toleranceMs: 10, timeoutSeconds: 2 });
  assert.equal(plain.settleSeconds, 0);
  assert.equal(plain.collectRetentionSeconds, 2);
});

Deno.test("collect parents do not gate completeness: syncParents leaves them out", () => {
  const policy = new JoinPolicy({ mode: "time", toleranceMs: 10, collect: { imu: 40 } });
  assert.deepEqual(policy.syncParents(["cam1", "imu", "cam2"]), ["cam1", "cam2"]);
  assert.deepEqual(new JoinPolicy().syncParents(["a", "toString"]), ["a", "toString"]);
});

// ------------------------------------------------------------------------------------------ DeliveryPolicy

Deno.test("DeliveryPolicy.defaultFor: batch is at-least-once with 3 retries and a full DLQ", () => {
  assert.deepEqual(DeliveryPolicy.defaultFor("batch").toDict(), {
    delivery: "at-least-once",
    max_retries: 3,
    dlq: "full",
    on_error: null,
    sample_per_minute: 5,
  });
  assert.deepEqual(new DeliveryPolicy().toDict(), DeliveryPolicy.defaultFor("batch").toDict());
});

Deno.test("DeliveryPolicy.defaultFor: realtime is best-effort with no retries and a sampled DLQ", () => {
  assert.deepEqual(DeliveryPolicy.defaultFor("realtime").toDict(), {
    delivery: "best-effort",
    max_retries: 0,
    dlq: "sampled",
    on_error: null,
    sample_per_minute: 5,
  });
  assertConfigError(() => DeliveryPolicy.defaultFor("stream"), "stream");
});

const invalidDeliveries: ReadonlyArray<readonly [string, Record<string, unknown>, string]> = [
  ["an unknown delivery mode", { delivery: "exactly-once" }, "delivery"],
  ["negative max_retries", { maxRetries: -1 }, "maxRetries"],
  ["fractional max_retries", { maxRetries: 1.5 }, "maxRetries"],
  ["an unknown dlq mode", { dlq: "some" }, "dlq"],
  ["an unknown on_error disposition", { onError: "fatal" }, "onError"],
  ["a negative sample_per_minute", { samplePerMinute: -1 }, "samplePerMinute"],
  ["a string sample_per_minute", { samplePerMinute: "5" }, "samplePerMinute"],
];

for (const [what, init, mention] of invalidDeliveries) {
  Deno.test(`DeliveryPolicy refuses ${what} with a ConfigError`, () => {
    assertConfigError(() => new DeliveryPolicy(init as DeliveryPolicyInit), mention);
  });
}

Deno.test("DeliveryPolicy reports every invalid field in one error and accepts every disposition", () => {
  const error = assertConfigError(
    () => DeliveryPolicy.fromDict({ delivery: "x", dlq: "y", max_retries: -2, retries: 1 }),
    "delivery",
    "dlq",
    "max_retries",
    "retries",
  );
  assert.equal((error.context.problems as string[]).length, 4);
  for (const disposition of DISPOSITIONS) {
    assert.equal(new DeliveryPolicy({ onError: disposition }).onError, disposition);
  }
});

Deno.test("maxDeliver is 1 for best-effort and max_retries + 1 for at-least-once", () => {
  assert.equal(DeliveryPolicy.defaultFor("realtime").maxDeliver, 1);
  assert.equal(DeliveryPolicy.defaultFor("batch").maxDeliver, 4);
  assert.equal(new DeliveryPolicy({ maxRetries: 0 }).maxDeliver, 1);
  assert.equal(new DeliveryPolicy({ maxRetries: 7 }).maxDeliver, 8);
  assert.equal(new DeliveryPolicy({ delivery: "best-effort", maxRetries: 5 }).maxDeliver, 1);
});

/** The spec's action table, written out case by case: [delivery, dlq, disposition, attempt, action]. */
const actionTable: ReadonlyArray<readonly [string, string, string, number, DeliveryAction]> = [
  ["at-least-once", "full", "poison", 1, ACTION_DLQ],
  ["at-least-once", "full", "transient", 1, ACTION_NAK],
  ["at-least-once", "full", "transient", 3, ACTION_NAK],
  ["at-least-once", "full", "transient", 4, ACTION_DLQ],
  ["at-least-once", "full", "transient", 9, ACTION_DLQ],
  ["at-least-once", "full", "worker_fatal", 1, ACTION_NAK],
  ["at-least-once", "full", "worker_fatal", 4, ACTION_NAK],
  ["at-least-once", "full", "worker_fatal", 50, ACTION_NAK],
  ["at-least-once", "sampled", "poison", 1, ACTION_DLQ_SAMPLED],
  ["at-least-once", "sampled", "transient", 3, ACTION_NAK],
  ["at-least-once", "sampled", "transient", 4, ACTION_DLQ_SAMPLED],
  ["at-least-once", "off", "poison", 1, ACTION_TERM],
  ["at-least-once", "off", "transient", 4, ACTION_TERM],
  ["at-least-once", "off", "worker_fatal", 4, ACTION_NAK],
  ["best-effort", "sampled", "poison", 1, ACTION_DLQ_SAMPLED],
  ["best-effort", "sampled", "transient", 1, ACTION_TERM],
  ["best-effort", "sampled", "worker_fatal", 1, ACTION_NAK],
  ["best-effort", "full", "poison", 1, ACTION_DLQ],
  ["best-effort", "full", "transient", 1, ACTION_TERM],
  ["best-effort", "full", "worker_fatal", 1, ACTION_NAK],
  ["best-effort", "off", "poison", 1, ACTION_TERM],
  ["best-effort", "off", "transient", 1, ACTION_TERM],
  ["best-effort", "off", "worker_fatal", 2, ACTION_NAK],
];

Deno.test("actionFor follows the disposition × delivery table in every DLQ mode", () => {
  for (const [delivery, dlq, disposition, attempt, expected] of actionTable) {
    const policy = new DeliveryPolicy({ delivery, dlq } as DeliveryPolicyInit);
    assert.equal(
      policy.actionFor(disposition, attempt),
      expected,
      `${delivery}/${dlq}/${disposition}#${attempt}`,
    );
  }
});

Deno.test("actionFor: poison is dead-lettered on its first failure and worker_fatal never is", () => {
  for (const flowType of ["realtime", "batch"]) {
    const policy = DeliveryPolicy.defaultFor(flowType);
    assert.notEqual(policy.actionFor("poison", 1), ACTION_NAK);
    for (let attempt = 1; attempt <= 10; attempt++) {
      assert.equal(policy.actionFor("worker_fatal", attempt), ACTION_NAK);
    }
  }
});

Deno.test("actionFor refuses an unknown disposition, naming the known ones, and a bad delivery count", () => {
  const policy = new DeliveryPolicy();
  assertConfigError(() => policy.actionFor("fatal", 1), "fatal", "poison", "transient", "worker_fatal");
  for (const bad of [0, -1, 1.5, NaN]) assert.throws(() => policy.actionFor("transient", bad), RangeError);
});

Deno.test("retryDelay doubles from 2 s and caps at 30 s before jitter", () => {
  const policy = new DeliveryPolicy();
  assert.deepEqual([1, 2, 3, 4, 5, 6, 40, 2000].map((n) => policy.retryDelay(n)), [
    2,
    4,
    8,
    16,
    30,
    30,
    30,
    30,
  ]);
  assert.equal(policy.retryDelay(3, 0.5), 4);
  assert.equal(policy.retryDelay(3, 1.5), 12);
  for (const bad of [0.49, 1.51, NaN]) assert.throws(() => policy.retryDelay(1, bad), RangeError);
  assert.throws(() => policy.retryDelay(0), RangeError);
});

Deno.test("jittered retry delays stay within [0.5, 1.5] × the base delay and vary (seeded)", () => {
  const policy = new DeliveryPolicy();
  forSeeds(20, (random) => {
    const seen = new Set<number>();
    for (let i = 0; i < 200; i++) {
      const attempt = random.int(1, 8);
      const base = Math.min(2 ** attempt, 30);
      const jitter = drawRetryJitter(random.source);
      assert.ok(jitter >= 0.5 && jitter < 1.5, `jitter ${jitter}`);
      const delay = policy.retryDelay(attempt, jitter);
      assert.ok(delay >= base * 0.5 && delay < base * 1.5, `delay ${delay} for attempt ${attempt}`);
      seen.add(delay);
    }
    assert.ok(seen.size > 100, "jitter spreads replicas out");
  });
  assert.equal(drawRetryJitter(() => 0), 0.5);
  assert.equal(drawRetryJitter(() => 0.5), 1);
});

Deno.test("resolve: a node's delivery override moves the DLQ mode and the retry budget with it", () => {
  const sink = DeliveryPolicy.resolve("realtime", { delivery: "at-least-once" });
  assert.deepEqual(sink.toDict(), DeliveryPolicy.defaultFor("batch").toDict());
  assert.equal(sink.maxDeliver, 4);
  const lossy = DeliveryPolicy.resolve("batch", { delivery: "best-effort" });
  assert.deepEqual(lossy.toDict(), DeliveryPolicy.defaultFor("realtime").toDict());
  assert.equal(lossy.maxDeliver, 1);
});

Deno.test("resolve: preset, then the node's other overrides, then VF_MAX_RETRIES for at-least-once only", () => {
  assert.deepEqual(DeliveryPolicy.resolve("batch").toDict(), DeliveryPolicy.defaultFor("batch").toDict());
  assert.deepEqual(
    DeliveryPolicy.resolve("realtime", null).toDict(),
    DeliveryPolicy.defaultFor("realtime").toDict(),
  );
  const own = DeliveryPolicy.resolve("batch", {
    on_error: "poison",
    dlq: "off",
    max_retries: 1,
    delivery: null,
  });
  assert.deepEqual(own.toDict(), {
    delivery: "at-least-once",
    max_retries: 1,
    dlq: "off",
    on_error: "poison",
    sample_per_minute: 5,
  });
  assert.equal(DeliveryPolicy.resolve("batch", { max_retries: 1 }, 6).maxRetries, 6);
  assert.equal(DeliveryPolicy.resolve("realtime", {}, 6).maxRetries, 0);
  assert.equal(DeliveryPolicy.resolve("realtime", { delivery: "at-least-once" }, 0).maxDeliver, 1);
});

Deno.test("resolve refuses an invalid override or retry count with a ConfigError", () => {
  assertConfigError(() => DeliveryPolicy.resolve("batch", { delivery: "exactly-once" }), "delivery");
  assertConfigError(() => DeliveryPolicy.resolve("batch", { on_error: "oops" }), "on_error");
  assertConfigError(() => DeliveryPolicy.resolve("batch", { deliver: "best-effort" }), "deliver");
  assertConfigError(() => DeliveryPolicy.resolve("batch", "best-effort"), "object");
  assertConfigError(() => DeliveryPolicy.resolve("batch", {}, -1), "max_retries");
  assertConfigError(() => DeliveryPolicy.resolve("bulk"), "bulk");
});

Deno.test("nodeOverride: a node's delivery/on_error as NodeSpec.delivery, or null when it overrides nothing", () => {
  assert.equal(DeliveryPolicy.nodeOverride(), null);
  assert.equal(DeliveryPolicy.nodeOverride(null, null), null);
  assert.deepEqual(DeliveryPolicy.nodeOverride("best-effort"), { delivery: "best-effort" });
  assert.deepEqual(DeliveryPolicy.nodeOverride(null, "poison"), { on_error: "poison" });
  assert.deepEqual(DeliveryPolicy.nodeOverride("at-least-once", "worker_fatal"), {
    delivery: "at-least-once",
    on_error: "worker_fatal",
  });
  assertConfigError(() => DeliveryPolicy.nodeOverride("exactly-once", "fatal"), "delivery", "onError");
  const override = DeliveryPolicy.nodeOverride("at-least-once");
  assert.equal(DeliveryPolicy.resolve("realtime", override).maxDeliver, 4);
});

Deno.test("DeliveryPolicy round-trips through its dict and JSON with the spec's exact keys", () => {
  const policies = [
    new DeliveryPolicy(),
    DeliveryPolicy.defaultFor("realtime"),
    new DeliveryPolicy({
      delivery: "best-effort",
      maxRetries: 2,
      dlq: "off",
      onError: "poison",
      samplePerMinute: 0,
    }),
  ];
  for (const policy of policies) {
    const dict = policy.toDict();
    assert.deepEqual(Object.keys(dict), ["delivery", "max_retries", "dlq", "on_error", "sample_per_minute"]);
    assert.deepEqual(DeliveryPolicy.fromDict(JSON.parse(JSON.stringify(dict))), policy);
  }
  assert.deepEqual(DeliveryPolicy.fromDict({}).toDict(), new DeliveryPolicy().toDict());
  assertConfigError(() => DeliveryPolicy.fromDict(null), "DeliveryPolicy");
});

// ----------------------------------------------------------------------------------- PartitionKeyPolicy

Deno.test("PartitionKeyPolicy defaults to reject with fallback partition 0 and round-trips", () => {
  assert.deepEqual(new PartitionKeyPolicy().toDict(), { invalid: "reject", fallback_partition: 0 });
  assert.deepEqual(PartitionKeyPolicy.fromDict(null).toDict(), { invalid: "reject", fallback_partition: 0 });
  assert.deepEqual(PartitionKeyPolicy.fromDict({}).toDict(), { invalid: "reject", fallback_partition: 0 });
  const fallback = { invalid: "fallback", fallback_partition: 3 };
  assert.deepEqual(PartitionKeyPolicy.fromDict(fallback).toDict(), fallback);
  assert.equal(PartitionKeyPolicy.fromDict(fallback).fallbackPartition, 3);
});

Deno.test("PartitionKeyPolicy refuses an unknown mode, a bad fallback partition and unknown keys", () => {
  assertConfigError(() => new PartitionKeyPolicy({ invalid: "hash" as never }), "invalid");
  assertConfigError(() => new PartitionKeyPolicy({ fallbackPartition: -1 }), "fallbackPartition");
  assertConfigError(() => new PartitionKeyPolicy({ fallbackPartition: 0.5 }), "fallbackPartition");
  assertConfigError(
    () => PartitionKeyPolicy.fromDict({ invalid: "none", fallback: 1 }),
    "invalid",
    "fallback",
  );
});

Deno.test("a fallback partition must name one of the node's replicas when bound", () => {
  const policy = new PartitionKeyPolicy({ invalid: "fallback", fallbackPartition: 2 });
  policy.checkBound(3);
  assertConfigError(() => policy.checkBound(2), "fallback_partition", "nb_tasks");
  new PartitionKeyPolicy({ fallbackPartition: 9 }).checkBound(1);
});

Deno.test("a usable partition key is a non-empty string, an integer or a boolean, never None or a container", () => {
  for (const good of ["cam-1", "None", "0", 0, 7, -3, true, false, 12n]) {
    assert.ok(PartitionKeyPolicy.isValidKey(good), `${String(good)} is usable`);
  }
  for (
    const bad of [undefined, null, "", 1.5, NaN, Infinity, [], ["a"], {}, { k: 1 }, () => 1, Symbol("s")]
  ) {
    assert.ok(!PartitionKeyPolicy.isValidKey(bad), `${String(bad)} is unusable`);
  }
});

// ------------------------------------------------------------------------- OrderingPolicy / ReorderBuffer

Deno.test("OrderingPolicy defaults to arrival order, horizon 8, late records dropped, and round-trips", () => {
  assert.deepEqual(new OrderingPolicy().toDict(), { mode: "arrival", horizon: 8, late: "drop" });
  assert.deepEqual(OrderingPolicy.fromDict(null).toDict(), new OrderingPolicy().toDict());
  const dict = { mode: "sequence", horizon: 0, late: "mark" };
  assert.deepEqual(OrderingPolicy.fromDict(dict).toDict(), dict);
});

Deno.test("OrderingPolicy refuses an unknown mode or late policy, a bad horizon and unknown keys", () => {
  assertConfigError(() => new OrderingPolicy({ mode: "time" as never }), "mode");
  assertConfigError(() => new OrderingPolicy({ late: "keep" as never }), "late");
  assertConfigError(() => new OrderingPolicy({ horizon: -1 }), "horizon");
  assertConfigError(() => new OrderingPolicy({ horizon: 2.5 }), "horizon");
  assertConfigError(() => OrderingPolicy.fromDict({ mode: "x", window: 3 }), "mode", "window");
});

const seqs = (released: ReorderRelease<unknown>[]) => released.map((r) => r.seq);

Deno.test("under arrival order every record is applied at once, but never twice", () => {
  const buffer = new ReorderBuffer<string>(new OrderingPolicy());
  assert.deepEqual(buffer.offer(3, "c"), [{ seq: 3, record: "c", late: false }]);
  assert.deepEqual(buffer.offer(1, "a"), [{ seq: 1, record: "a", late: false }]);
  assert.deepEqual(buffer.offer(3, "c"), []);
  assert.deepEqual(buffer.flush(), []);
});

Deno.test("under sequence order a gap holds later records until it fills", () => {
  const buffer = new ReorderBuffer<string>(new OrderingPolicy({ mode: "sequence", horizon: 3 }));
  assert.deepEqual(buffer.offer(2, "b"), []);
  assert.deepEqual(buffer.offer(3, "c"), []);
  assert.equal(buffer.expected, 1);
  assert.deepEqual(buffer.offer(1, "a"), [
    { seq: 1, record: "a", late: false },
    { seq: 2, record: "b", late: false },
    { seq: 3, record: "c", late: false },
  ]);
  assert.equal(buffer.expected, 4);
  assert.deepEqual(buffer.offer(2, "b"), []);
});

Deno.test("a gap is given up once more than horizon records wait behind it; its record is then late", () => {
  const drop = new ReorderBuffer<string>(new OrderingPolicy({ mode: "sequence", horizon: 2 }));
  assert.deepEqual(seqs(drop.offer(2, "b")), []);
  assert.deepEqual(seqs(drop.offer(3, "c")), []);
  assert.deepEqual(seqs(drop.offer(4, "d")), [2, 3, 4]);
  assert.deepEqual(drop.offer(1, "a"), []);
  assert.equal(drop.dropped, 1);
  assert.deepEqual(drop.offer(1, "a"), [], "a dropped late record is not counted twice");
  assert.equal(drop.dropped, 1);

  const mark = new ReorderBuffer<string>(new OrderingPolicy({ mode: "sequence", horizon: 2, late: "mark" }));
  for (const seq of [2, 3, 4]) mark.offer(seq, String(seq));
  assert.deepEqual(mark.offer(1, "a"), [{ seq: 1, record: "a", late: true }]);
  assert.deepEqual(mark.offer(1, "a"), []);
  assert.equal(mark.dropped, 0);
});

Deno.test("horizon 0 gives a gap up at once; start sets the first expected sequence", () => {
  const buffer = new ReorderBuffer<string>(new OrderingPolicy({ mode: "sequence", horizon: 0 }), 10);
  assert.equal(buffer.expected, 10);
  assert.deepEqual(seqs(buffer.offer(12, "x")), [12]);
  assert.equal(buffer.expected, 13);
  assert.deepEqual(buffer.offer(11, "y"), []);
  assert.equal(buffer.dropped, 1);
});

Deno.test("flush releases everything held in order, marking a record that follows a gap", () => {
  const buffer = new ReorderBuffer<string>(new OrderingPolicy({ mode: "sequence", horizon: 8 }));
  for (const seq of [5, 3, 4, 8]) buffer.offer(seq, `r${seq}`);
  assert.deepEqual(buffer.flush(), [
    { seq: 3, record: "r3", late: true },
    { seq: 4, record: "r4", late: false },
    { seq: 5, record: "r5", late: false },
    { seq: 8, record: "r8", late: true },
  ]);
  assert.equal(buffer.expected, 9);
  assert.deepEqual(buffer.flush(), []);
  assert.deepEqual(buffer.offer(4, "again"), []);
});

/**
 * Arrival order where no gap ever has more than `horizon` records waiting behind it: consecutive blocks of
 * at most horizon + 1 records, each shuffled or reversed (a reversed full block is the tight case).
 */
function withinHorizon(count: number, horizon: number, random: SeededRandom): number[] {
  const order: number[] = [];
  for (let start = 1; start <= count;) {
    const size = Math.min(count - start + 1, random.int(1, horizon + 1));
    const block = shuffled(size, random).map((i) => start + i - 1);
    order.push(...(random.chance(0.5) ? block.sort((a, b) => b - a) : block));
    start += size;
  }
  return order;
}

Deno.test("random permutations within the horizon come out in sequence order, each once (seeded)", () => {
  forSeeds(200, (random) => {
    const horizon = random.int(0, 9);
    const count = random.int(1, 60);
    const late = random.chance(0.5) ? "drop" : "mark";
    const buffer = new ReorderBuffer<number>(new OrderingPolicy({ mode: "sequence", horizon, late }));
    const released: ReorderRelease<number>[] = [];
    for (const seq of withinHorizon(count, horizon, random)) {
      released.push(...buffer.offer(seq, seq * 10));
      if (random.chance(0.2)) released.push(...buffer.offer(seq, -1));
    }
    assert.deepEqual(seqs(released), Array.from({ length: count }, (_, i) => i + 1));
    assert.ok(released.every((r) => !r.late && r.record === r.seq * 10));
    assert.equal(buffer.dropped, 0);
    assert.deepEqual(buffer.flush(), []);
  });
});

Deno.test("any arrival order: each record is applied at most once, on-time ones ascending (seeded)", () => {
  forSeeds(200, (random) => {
    const horizon = random.int(0, 5);
    const count = random.int(1, 40);
    const late = random.chance(0.5) ? "drop" : "mark";
    const order = shuffled(count, random);
    const buffer = new ReorderBuffer<number>(new OrderingPolicy({ mode: "sequence", horizon, late }));
    const released: ReorderRelease<number>[] = [];
    for (const seq of [...order, ...order.slice(0, count >> 1)]) {
      const expectedBefore = buffer.expected;
      const out = buffer.offer(seq, seq);
      for (const r of out.filter((r) => r.late)) {
        assert.ok(r.seq < expectedBefore, "only a given-up slot is late");
      }
      released.push(...out);
    }
    released.push(...buffer.flush());
    const applied = seqs(released);
    assert.equal(new Set(applied).size, applied.length, "never applied twice");
    const onTime = seqs(released.filter((r) => !r.late));
    assert.deepEqual(onTime, [...onTime].sort((a, b) => a - b));
    if (late === "mark") assert.equal(applied.length, count);
    else assert.equal(applied.length + buffer.dropped, count);
  });
});

Deno.test("a restored snapshot resumes exactly where the buffer left off (seeded)", () => {
  forSeeds(100, (random) => {
    const policy = new OrderingPolicy({
      mode: "sequence",
      horizon: random.int(0, 4),
      late: random.chance(0.5) ? "drop" : "mark",
    });
    const order = shuffled(30, random);
    const cut = random.int(0, order.length - 1);
    const whole = new ReorderBuffer<string>(policy);
    const first = new ReorderBuffer<string>(policy);
    const expected = order.flatMap((seq) => whole.offer(seq, `r${seq}`));
    const before = order.slice(0, cut).flatMap((seq) => first.offer(seq, `r${seq}`));
    const restored = ReorderBuffer.restore<string>(policy, JSON.parse(JSON.stringify(first.snapshot())));
    assert.deepEqual(restored.snapshot(), first.snapshot());
    const after = order.slice(cut).flatMap((seq) => restored.offer(seq, `r${seq}`));
    assert.deepEqual([...before, ...after], expected);
    assert.deepEqual(restored.flush(), whole.flush());
    assert.equal(restored.dropped, whole.dropped);
  });
});

Deno.test("ReorderBuffer refuses a malformed snapshot and a non-integer sequence", () => {
  const policy = new OrderingPolicy({ mode: "sequence" });
  assertConfigError(() => ReorderBuffer.restore(policy, { next: 1.5, applied: ["x"] }), "next", "applied");
  assertConfigError(() => ReorderBuffer.restore(policy, { held: { one: 1 } }), "held");
  assertConfigError(() => ReorderBuffer.restore(policy, null), "object");
  assert.throws(() => new ReorderBuffer(policy).offer(1.5, "x"), RangeError);
  assert.throws(() => new ReorderBuffer(policy, NaN), RangeError);
});
