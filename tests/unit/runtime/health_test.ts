import { DropReason, Metric } from "../../../src/core/metrics.ts";
import assert from "node:assert/strict";
import {
  DEFAULT_HEALTH_PORT,
  healthPortFromEnv,
  HealthServer,
  HealthState,
  LATENCY_BUCKETS_SECONDS,
  parseHistogram,
  quantileBounds,
} from "../../../src/runtime/health.ts";
import { ConfigError } from "../../../src/core/errors.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

async function get(
  port: number,
  path: string,
  method = "GET",
): Promise<{ status: number; type: string; body: string }> {
  const response = await fetch(`http://127.0.0.1:${port}${path}`, { method });
  return {
    status: response.status,
    type: response.headers.get("content-type") ?? "",
    body: await response.text(),
  };
}

Deno.test("health server on a loopback port: /readyz, /healthz and /metrics answer as the node's state says; anything else is 404", async () => {
  const clock = new FakeClock();
  const state = new HealthState("detect", { clock });
  const server = new HealthServer(state, { port: 0, hostname: "127.0.0.1" });
  const port = server.start();
  try {
    assert.ok(port > 0);
    assert.equal(server.port, port);
    assert.equal(server.start(), port, "a second start keeps the same server");

    assert.equal((await get(port, "/readyz")).status, 503, "not ready while the node opens");
    assert.equal((await get(port, "/healthz")).status, 200, "live before the loop's first beat");
    state.markReady();
    state.beat();
    assert.deepEqual(await get(port, "/readyz"), {
      status: 200,
      type: "text/plain; charset=utf-8",
      body: "ready\n",
    });

    clock.advance(59.9);
    assert.equal((await get(port, "/healthz")).status, 200);
    clock.advance(0.1);
    const stalled = await get(port, "/healthz");
    assert.equal(stalled.status, 503, "60 s without a loop beat");
    assert.equal(stalled.body, "stalled: no loop beat for 60 s\n");
    state.beat();
    assert.equal((await get(port, "/healthz")).status, 200, "a beat revives it");

    state.incr(Metric.processed, 3);
    const metrics = await get(port, "/metrics");
    assert.equal(metrics.status, 200);
    assert.equal(metrics.type, "text/plain; version=0.0.4; charset=utf-8");
    assert.match(metrics.body, /^videoflow_messages_processed_total\{node="detect"\} 3$/m);

    for (const path of ["/", "/metrics/", "/health", "/readyz/x"]) {
      assert.equal((await get(port, path)).status, 404, path);
    }
    assert.equal((await get(port, "/metrics", "POST")).status, 405);
    assert.equal((await get(port, "/readyz", "HEAD")).status, 200);
  } finally {
    await server.stop();
  }
  assert.equal(server.port, null);
  await server.stop();
  await assert.rejects(fetch(`http://127.0.0.1:${port}/readyz`));
});

Deno.test("metrics exposition: histograms, the WIRE counters, drops and errors, each sample labelled node", () => {
  const state = new HealthState('cam "A"', { buckets: [0.1, 1] });
  state.observe(Metric.proctime, 0.05);
  state.observe(Metric.proctime, 0.1);
  state.observe(Metric.proctime, 2);
  state.observe(Metric.actualProctime, null);
  state.incr(Metric.published);
  state.incr(Metric.received, 4);
  state.incr(Metric.processed, 2);
  state.incr(Metric.failed);
  state.recordOffered();
  state.recordDrop(DropReason.poison);
  state.recordDrop("evicted", 2);
  state.recordError("VF_POISON_DECODE", "poison");
  state.recordError("VF_POISON_DECODE", "poison");
  state.incr("frames_skipped_total", 7);
  const node = 'node="cam \\"A\\""';
  assert.equal(
    state.renderMetrics(),
    [
      "# HELP videoflow_proctime_seconds Seconds from an input group's receipt to its ack.",
      "# TYPE videoflow_proctime_seconds histogram",
      `videoflow_proctime_seconds_bucket{${node},le="0.1"} 2`,
      `videoflow_proctime_seconds_bucket{${node},le="1.0"} 2`,
      `videoflow_proctime_seconds_bucket{${node},le="+Inf"} 3`,
      `videoflow_proctime_seconds_sum{${node}} 2.15`,
      `videoflow_proctime_seconds_count{${node}} 3`,
      "# HELP videoflow_actual_proctime_seconds Seconds the node's own callback took.",
      "# TYPE videoflow_actual_proctime_seconds histogram",
      `videoflow_actual_proctime_seconds_bucket{${node},le="0.1"} 0`,
      `videoflow_actual_proctime_seconds_bucket{${node},le="1.0"} 0`,
      `videoflow_actual_proctime_seconds_bucket{${node},le="+Inf"} 0`,
      `videoflow_actual_proctime_seconds_sum{${node}} 0.0`,
      `videoflow_actual_proctime_seconds_count{${node}} 0`,
      "# HELP videoflow_messages_published_total Messages this node published.",
      "# TYPE videoflow_messages_published_total counter",
      `videoflow_messages_published_total{${node}} 1`,
      "# HELP videoflow_messages_received_total Input messages this node received.",
      "# TYPE videoflow_messages_received_total counter",
      `videoflow_messages_received_total{${node}} 4`,
      "# HELP videoflow_messages_processed_total Input groups processed and acked.",
      "# TYPE videoflow_messages_processed_total counter",
      `videoflow_messages_processed_total{${node}} 2`,
      "# HELP videoflow_messages_failed_total Input groups the node failed on.",
      "# TYPE videoflow_messages_failed_total counter",
      `videoflow_messages_failed_total{${node}} 1`,
      "# HELP videoflow_messages_offered_total Input groups of real work handed to the node.",
      "# TYPE videoflow_messages_offered_total counter",
      `videoflow_messages_offered_total{${node}} 1`,
      "# HELP videoflow_messages_dropped_total Input groups given up on by policy, never to be redelivered.",
      "# TYPE videoflow_messages_dropped_total counter",
      `videoflow_messages_dropped_total{${node},reason="poison"} 1`,
      `videoflow_messages_dropped_total{${node},reason="evicted"} 2`,
      "# HELP videoflow_errors_total Failures by stable error code and disposition.",
      "# TYPE videoflow_errors_total counter",
      `videoflow_errors_total{${node},code="VF_POISON_DECODE",disposition="poison"} 2`,
      "# TYPE videoflow_frames_skipped_total counter",
      `videoflow_frames_skipped_total{${node}} 7`,
      "",
    ].join("\n"),
  );
});

Deno.test("metrics: a fresh worker exports every WIRE family at zero, with the default latency buckets", () => {
  const text = new HealthState("sink").renderMetrics();
  for (const family of ["published", "received", "processed", "failed"]) {
    assert.match(text, new RegExp(`^videoflow_messages_${family}_total\\{node="sink"\\} 0$`, "m"));
  }
  const parsed = parseHistogram(text, "proctime_seconds");
  assert.deepEqual(parsed.bounds, LATENCY_BUCKETS_SECONDS);
  assert.deepEqual(parsed.cumulative, new Array(LATENCY_BUCKETS_SECONDS.length + 1).fill(0));
  assert.match(text, /le="0\.005"/);
  assert.match(text, /le="60\.0"/);
});

Deno.test("histogram: a value equal to a bound falls in that bucket; counts are cumulative with +Inf last", () => {
  const state = new HealthState("n", { buckets: [1, 2, 3] });
  assert.equal(state.histogram(Metric.proctime), null);
  for (const value of [0, 1, 1.5, 2, 3, 3.0001, 100]) state.observe(Metric.proctime, value);
  assert.deepEqual(state.histogram(Metric.proctime), [2, 4, 5, 7]);
  assert.equal(state.histogram("never_observed_seconds"), null);
});

Deno.test("quantileBounds: the bracket of the nearest-rank quantile, open on the overflow side", () => {
  const bounds = [1, 2, 3];
  const counts = [2, 4, 5, 7];
  assert.deepEqual(quantileBounds(counts, 0.1, bounds), [-Infinity, 1]);
  assert.deepEqual(quantileBounds(counts, 2 / 7, bounds), [-Infinity, 1]);
  assert.deepEqual(quantileBounds(counts, 0.5, bounds), [1, 2]);
  assert.deepEqual(quantileBounds(counts, 5 / 7, bounds), [2, 3]);
  assert.deepEqual(quantileBounds(counts, 0.99, bounds), [3, Infinity]);
  assert.deepEqual(quantileBounds(counts, 1, bounds), [3, Infinity]);
  assert.equal(quantileBounds([0, 0, 0, 0], 0.5, bounds), null, "a percentile of nothing is unavailable");
  assert.throws(() => quantileBounds(counts, 0, bounds), RangeError);
  assert.throws(() => quantileBounds(counts, 1.01, bounds), RangeError);
  assert.throws(() => quantileBounds(counts, Number.NaN, bounds), RangeError);
  assert.throws(() => quantileBounds([1, 2], 0.5, bounds), RangeError);
});

Deno.test("histogram round trip: random latencies scraped back give the same buckets, and each quantile's bracket holds the true value", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let trial = 0; trial < 50; trial++) {
    const state = new HealthState("n");
    const values = Array.from(
      { length: random.int(1, 400) },
      () => random.next() ** 3 * random.pick([0.1, 5, 120]),
    );
    for (const value of values) state.observe(Metric.actualProctime, value);
    const counts = state.histogram(Metric.actualProctime);
    const scraped = parseHistogram(state.renderMetrics(), Metric.actualProctime);
    assert.deepEqual(scraped.cumulative, counts, `seed ${seed} trial ${trial}`);
    assert.deepEqual(scraped.bounds, LATENCY_BUCKETS_SECONDS, `seed ${seed} trial ${trial}`);
    const sorted = [...values].sort((a, b) => a - b);
    for (const q of [0.5, 0.9, 0.95, 0.99, 1, random.next() || 1]) {
      const truth = sorted[Math.ceil(q * sorted.length) - 1];
      const bracket = quantileBounds(scraped.cumulative, q);
      assert.ok(bracket, `seed ${seed} trial ${trial}`);
      assert.ok(
        truth > bracket[0] && truth <= bracket[1],
        `seed ${seed} trial ${trial} q ${q}: ${truth} not in ${bracket}`,
      );
    }
  }
});

Deno.test("parseHistogram: a family without bucket lines gives empty lists, and other families are ignored", () => {
  const text = [
    'videoflow_proctime_seconds_sum{node="a"} 1.0',
    'videoflow_proctime_seconds_count{node="a"} 1',
    'videoflow_other_seconds_bucket{node="a",le="1.0"} 9',
  ].join("\n");
  assert.deepEqual(parseHistogram(text, "proctime_seconds"), { bounds: [], cumulative: [] });
  assert.deepEqual(parseHistogram(text, "other_seconds"), { bounds: [1], cumulative: [9] });
});

Deno.test("throughput: offered, processed and dropped (summed over reasons) read at one instant", () => {
  const clock = new FakeClock();
  const state = new HealthState("n", { clock });
  for (let i = 0; i < 10; i++) state.recordOffered();
  state.incr(Metric.processed, 6);
  state.recordDrop(DropReason.poison, 1);
  state.recordDrop(DropReason.bestEffort, 2);
  assert.deepEqual(state.throughput(), { offered: 10, processed: 6, dropped: 3, at: clock.now() });
  assert.equal(state.throughput(42).at, 42);
});

Deno.test("health state refuses what would corrupt the exposition", () => {
  const state = new HealthState("n");
  assert.throws(() => state.observe(Metric.proctime, -1), RangeError);
  assert.throws(() => state.observe(Metric.proctime, Infinity), RangeError);
  assert.throws(() => state.observe("Bad Name", 1), ConfigError);
  assert.throws(
    () => state.observe("videoflow_proctime_seconds", 1),
    ConfigError,
    "the prefix is added, not given",
  );
  assert.throws(() => state.incr(Metric.processed, -1), RangeError);
  assert.throws(() => state.incr(Metric.processed, 0.5), RangeError);
  assert.throws(() => state.incr(Metric.dropped), ConfigError);
  assert.throws(() => state.incr(Metric.errors), ConfigError);
  assert.throws(() => state.recordDrop("Not A Word"), ConfigError);
  assert.throws(() => state.recordDrop("poison", -2), RangeError);
  assert.throws(() => new HealthState("n", { buckets: [] }), ConfigError);
  assert.throws(() => new HealthState("n", { buckets: [1, 1] }), ConfigError);
  assert.throws(() => new HealthState("n", { buckets: [0, 1] }), ConfigError);
  assert.equal(state.counter(Metric.processed), 0);
});

Deno.test("VF_HEALTH_PORT: unset is 8080, 0 disables, anything but a port is a ConfigError", () => {
  const env = (value?: string) => new Map(value === undefined ? [] : [["VF_HEALTH_PORT", value]]);
  assert.equal(healthPortFromEnv(env()), DEFAULT_HEALTH_PORT);
  assert.equal(healthPortFromEnv(env("")), DEFAULT_HEALTH_PORT);
  assert.equal(healthPortFromEnv(env("0")), null);
  assert.equal(healthPortFromEnv(env("9090")), 9090);
  for (const bad of ["-1", "80.5", "http", "65536", "1e3"]) {
    assert.throws(() => healthPortFromEnv(env(bad)), ConfigError, bad);
  }
});

Deno.test("HealthState tells onReady once, when the node first becomes ready", () => {
  let told = 0;
  const state = new HealthState("detect", { onReady: () => told++ });
  assert.equal(told, 0);
  state.markReady();
  state.markReady();
  assert.equal(told, 1);
  assert.ok(state.isReady());
});

Deno.test("HealthState tells onCount after every counter that grows", () => {
  let told = 0;
  const state = new HealthState("detect", { onCount: () => told++ });
  state.incr(Metric.processed);
  state.incr(Metric.published, 3);
  assert.equal(told, 2);
  assert.equal(state.counter(Metric.processed), 1);
});
