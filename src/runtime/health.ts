/**
 * A worker's health probes and Prometheus metrics (spec runtime.health, WIRE.md "Payload offload and
 * health"): {@link HealthState} is fed by the run loop, {@link HealthServer} serves it over HTTP.
 *
 * Endpoints (`VF_HEALTH_PORT`, 0 disables; 8080 on Kubernetes):
 * - `/readyz`: 200 once the node began processing (marked after `open()` returned), else 503.
 * - `/healthz`: 200 while the run loop beats, 503 after {@link LIVENESS_TIMEOUT_SECONDS} without a beat.
 * - `/metrics`: the Prometheus text exposition (format 0.0.4), every sample labelled `node`.
 * - anything else: 404.
 *
 * What `/metrics` exports, in this order (the renderer only ever appends families, so a scrape config
 * written against an older worker keeps working):
 * - `videoflow_proctime_seconds` and `videoflow_actual_proctime_seconds`: histograms over
 *   {@link LATENCY_BUCKETS_SECONDS} plus `+Inf`, with `_sum` and `_count`. Bounds are one constant, so
 *   histograms from different workers add bucket by bucket; {@link quantileBounds} turns buckets into the
 *   honest bracket a percentile lies in.
 * - counters `videoflow_messages_{published,received,processed,failed,offered}_total`;
 *   `videoflow_messages_dropped_total{reason}` (given up on by policy, never redelivered), and
 *   `videoflow_errors_total{code,disposition}`. `offered - processed - dropped` is the node's outstanding
 *   work ({@link HealthState.throughput}).
 * - any other family a caller observed or counted, in first-use order.
 *
 * @example
 * ```ts
 * const state = new HealthState("detect");
 * const server = new HealthServer(state, { port: 0, hostname: "127.0.0.1" });
 * const port = server.start();
 * state.markReady();
 * state.observe(Metric.proctime, 0.012);
 * console.log((await fetch(`http://127.0.0.1:${port}/readyz`)).status); // 200
 * await server.stop();
 * ```
 *
 * @module
 */

import { type Clock, systemClock } from "../backends/clock.ts";
import { ConfigError } from "../core/errors.ts";
import { Metric, METRIC_PREFIX } from "../core/metrics.ts";
import { malformedVariable } from "../core/variables.ts";

/** Where environment variables are read from: `Deno.env`, or a Map in tests. */
type EnvSource = Pick<Deno.Env, "get">;

/**
 * Upper bounds, in seconds, of the latency histogram buckets: dense from 5 ms to 1 s (a 30 fps budget is
 * 33 ms), sparse up to a minute. A `+Inf` bucket is always appended. Changing the set changes the `le`
 * label values dashboards key on.
 */
export const LATENCY_BUCKETS_SECONDS: readonly number[] = Object.freeze([
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1.0,
  2.5,
  5.0,
  10.0,
  30.0,
  60.0,
]);

/** The port a worker serves health on when `VF_HEALTH_PORT` is unset (the Kubernetes probes' port). */
export const DEFAULT_HEALTH_PORT = 8080;

/** The address a worker's health server listens on unless told otherwise: every interface. */
export const DEFAULT_HEALTH_HOSTNAME = "0.0.0.0";

/** The environment variable that sets the health port; `0` disables the server. */
export const HEALTH_PORT_ENV = "VF_HEALTH_PORT";

/** Seconds without a loop beat after which `/healthz` answers 503. */
export const LIVENESS_TIMEOUT_SECONDS = 60;

/** The paths a {@link HealthServer} answers: what a Kubernetes probe or a Prometheus scrape asks for. */
export const HealthPath = {
  /** 200 once the node began processing, else 503: the readiness probe's path. */
  ready: "/readyz",
  /** 200 while the run loop beats, 503 after {@link LIVENESS_TIMEOUT_SECONDS} without: the liveness probe's. */
  live: "/healthz",
  /** The Prometheus text exposition. */
  metrics: "/metrics",
} as const;
/** One of the {@link HealthPath} paths. */
export type HealthPath = typeof HealthPath[keyof typeof HealthPath];
const HEALTH_PATHS: ReadonlySet<string> = new Set(Object.values(HealthPath));

const HISTOGRAMS: readonly string[] = [Metric.proctime, Metric.actualProctime];
const COUNTERS: readonly string[] = [
  Metric.published,
  Metric.received,
  Metric.processed,
  Metric.failed,
  Metric.offered,
];
const HELP: Readonly<Record<string, string>> = {
  [Metric.proctime]: "Seconds from an input group's receipt to its ack.",
  [Metric.actualProctime]: "Seconds the node's own callback took.",
  [Metric.published]: "Messages this node published.",
  [Metric.received]: "Input messages this node received.",
  [Metric.processed]: "Input groups processed and acked.",
  [Metric.failed]: "Input groups the node failed on.",
  [Metric.offered]: "Input groups of real work handed to the node.",
  [Metric.dropped]: "Input groups given up on by policy, never to be redelivered.",
  [Metric.errors]: "Failures by stable error code and disposition.",
};
const FAMILY_NAME = /^[a-z_][a-z0-9_]*$/;
const LABEL_WORD = /^[a-z0-9_]+$/;

function requireFamily(name: string): string {
  if (!FAMILY_NAME.test(name) || name.startsWith(METRIC_PREFIX)) {
    throw new ConfigError(
      `${JSON.stringify(name)} is not a metric family name`,
      `name it in lowercase snake_case without the ${METRIC_PREFIX} prefix, e.g. ${Metric.proctime}`,
      { metric: name },
    );
  }
  return name;
}

/** One reading of the throughput counters, taken at one instant (`at`, epoch seconds). */
export interface ThroughputSnapshot {
  readonly offered: number;
  readonly processed: number;
  readonly dropped: number;
  readonly at: number;
}

interface Histogram {
  /** Per-bucket (not cumulative) counts; the last is the +Inf bucket. */
  readonly counts: number[];
  sum: number;
  count: number;
}

/** One histogram of a {@link HealthSnapshot}. */
export interface HistogramSnapshot {
  /** Per-bucket (not cumulative) counts, one per bound and then the `+Inf` bucket. */
  readonly counts: readonly number[];
  /** The sum of every observation, in seconds. */
  readonly sum: number;
  /** How many observations. */
  readonly count: number;
}

/**
 * Everything `/metrics` exports of one node, as plain JSON (what a local run's replicas send their
 * supervisor), each family in the order it was first used.
 */
export interface HealthSnapshot {
  /** Histogram family → its buckets, over {@link LATENCY_BUCKETS_SECONDS} unless a state was given others. */
  readonly histograms: Readonly<Record<string, HistogramSnapshot>>;
  /** Counter family → value. */
  readonly counters: Readonly<Record<string, number>>;
  /** Drop reason → inputs given up on. */
  readonly drops: Readonly<Record<string, number>>;
  /** Failures by code and disposition. */
  readonly errors: readonly { readonly code: string; readonly disposition: string; readonly count: number }[];
}

/** One source of samples in an exposition: its labels (`node`, and more) and its snapshot. */
export interface LabelledSnapshot {
  /** Label name → value, on every sample of this source, in this order. */
  readonly labels: Readonly<Record<string, string>>;
  readonly snapshot: HealthSnapshot;
}

/**
 * The Prometheus text exposition (format 0.0.4) of `sources`: each family once, under one `# HELP` and
 * `# TYPE`, with every source's samples, in the order the module comment gives (histograms, the standard
 * counters, drops, errors, any other counter), families in first-use order across the sources.
 */
export function renderExposition(
  sources: readonly LabelledSnapshot[],
  buckets: readonly number[] = LATENCY_BUCKETS_SECONDS,
): string {
  const lines: string[] = [];
  const header = (family: string, type: string) => {
    const help = HELP[family];
    if (help) lines.push(`# HELP ${METRIC_PREFIX}${family} ${help}`);
    lines.push(`# TYPE ${METRIC_PREFIX}${family} ${type}`);
  };
  const labelled = sources.map(({ labels, snapshot }) => ({
    labels: Object.entries(labels).map(([name, value]) => `${name}="${escapeLabel(value)}"`).join(","),
    snapshot,
  }));
  const families = (pick: (snapshot: HealthSnapshot) => Readonly<Record<string, unknown>>) => [
    ...new Set(labelled.flatMap(({ snapshot }) => Object.keys(pick(snapshot)))),
  ];
  const bounds = [...buckets.map(formatFloat), "+Inf"];
  for (const family of families((s) => s.histograms)) {
    header(family, "histogram");
    for (const { labels, snapshot } of labelled) {
      const histogram = snapshot.histograms[family];
      if (histogram === undefined) continue;
      const counts = cumulative(histogram.counts);
      bounds.forEach((le, i) =>
        lines.push(`${METRIC_PREFIX}${family}_bucket{${labels},le="${le}"} ${counts[i]}`)
      );
      lines.push(`${METRIC_PREFIX}${family}_sum{${labels}} ${formatFloat(histogram.sum)}`);
      lines.push(`${METRIC_PREFIX}${family}_count{${labels}} ${histogram.count}`);
    }
  }
  const counters = families((s) => s.counters);
  const counterFamily = (family: string) => {
    header(family, "counter");
    for (const { labels, snapshot } of labelled) {
      const value = snapshot.counters[family];
      if (value !== undefined) lines.push(`${METRIC_PREFIX}${family}{${labels}} ${value}`);
    }
  };
  counters.filter((family) => COUNTERS.includes(family)).forEach(counterFamily);
  header(Metric.dropped, "counter");
  for (const { labels, snapshot } of labelled) {
    for (const [reason, value] of Object.entries(snapshot.drops)) {
      lines.push(`${METRIC_PREFIX}${Metric.dropped}{${labels},reason="${escapeLabel(reason)}"} ${value}`);
    }
  }
  header(Metric.errors, "counter");
  for (const { labels, snapshot } of labelled) {
    for (const { code, disposition, count } of snapshot.errors) {
      const all = `${labels},code="${escapeLabel(code)}",disposition="${escapeLabel(disposition)}"`;
      lines.push(`${METRIC_PREFIX}${Metric.errors}{${all}} ${count}`);
    }
  }
  counters.filter((family) => !COUNTERS.includes(family)).forEach(counterFamily);
  return lines.join("\n") + "\n";
}

/** What a {@link HealthServer} serves: readiness, liveness and the metrics exposition. */
export interface HealthSource {
  /** `/readyz` answers 200 while this holds. */
  isReady(): boolean;
  /** `/healthz` answers 200 while this holds. */
  isLive(): boolean;
  /** Why `/healthz` answers 503, for its body. */
  notLiveBecause(): string;
  /** Why `/readyz` answers 503, for its body. */
  notReadyBecause(): string;
  /** The `/metrics` body. */
  renderMetrics(): string;
}

/** Options of a {@link HealthState}. */
export interface HealthStateOptions {
  /** Finite, strictly ascending, positive bucket bounds; {@link LATENCY_BUCKETS_SECONDS} by default. */
  readonly buckets?: readonly number[];
  /** Time source for liveness and snapshots; the system clock by default. */
  readonly clock?: Clock;
  /** Seconds without a beat before the node is not live; {@link LIVENESS_TIMEOUT_SECONDS} by default. */
  readonly livenessTimeoutSeconds?: number;
  /** Called once, when the node becomes ready ({@link HealthState.markReady}); nothing by default. */
  readonly onReady?: () => void;
  /** Called after a counter grows ({@link HealthState.incr}); nothing by default. */
  readonly onCount?: () => void;
}

/**
 * Readiness, liveness and metrics of one node, shared by the run loop (which feeds it) and the HTTP
 * handler (which reads it). All updates are synchronous, so a render never sees half an update.
 */
export class HealthState implements HealthSource {
  /** The `node` label on every sample. */
  readonly nodeName: string;
  /** The finite bucket bounds of every histogram. */
  readonly buckets: readonly number[];
  /** Seconds without a beat before {@link isLive} turns false. */
  readonly livenessTimeoutSeconds: number;
  readonly #clock: Clock;
  #ready = false;
  readonly #onReady: (() => void) | null;
  readonly #onCount: (() => void) | null;
  #lastBeat: number | null = null;
  readonly #histograms = new Map<string, Histogram>();
  readonly #counters = new Map<string, number>();
  readonly #drops = new Map<string, number>();
  readonly #errors = new Map<string, { code: string; disposition: string; count: number }>();

  /** Throws ConfigError for bucket bounds that are not finite, positive and strictly ascending. */
  constructor(nodeName: string, options: HealthStateOptions = {}) {
    const buckets = options.buckets ?? LATENCY_BUCKETS_SECONDS;
    const ascending = buckets.every((b, i) => Number.isFinite(b) && b > 0 && (i === 0 || b > buckets[i - 1]));
    if (buckets.length === 0 || !ascending) {
      throw new ConfigError(
        `histogram bucket bounds must be finite, positive and strictly ascending, got [${
          buckets.join(", ")
        }]`,
        "pass ascending upper bounds in seconds, or omit them for LATENCY_BUCKETS_SECONDS",
      );
    }
    this.nodeName = nodeName;
    this.buckets = Object.freeze([...buckets]);
    this.livenessTimeoutSeconds = options.livenessTimeoutSeconds ?? LIVENESS_TIMEOUT_SECONDS;
    this.#clock = options.clock ?? systemClock;
    this.#onReady = options.onReady ?? null;
    this.#onCount = options.onCount ?? null;
    for (const name of HISTOGRAMS) this.#histogramOf(name);
    for (const name of COUNTERS) this.#counters.set(name, 0);
  }

  /** The run loop is alive: called on every loop iteration. */
  beat(): void {
    this.#lastBeat = this.#clock.monotonic();
  }

  /** The node began processing (its `open()` returned): `/readyz` answers 200 from now on. */
  markReady(): void {
    if (this.#ready) return;
    this.#ready = true;
    this.#onReady?.();
  }

  /** Whether {@link markReady} was called. */
  isReady(): boolean {
    return this.#ready;
  }

  /**
   * Whether the loop beat within the liveness timeout. Before the first beat the loop has not started (the
   * node is still opening, which readiness reports), so the worker counts as live.
   */
  isLive(): boolean {
    return this.#lastBeat === null || this.#clock.monotonic() - this.#lastBeat < this.livenessTimeoutSeconds;
  }

  /** Seconds since the last beat, or `null` before the first. */
  silentFor(): number | null {
    return this.#lastBeat === null ? null : this.#clock.monotonic() - this.#lastBeat;
  }

  /**
   * Records one latency observation, in seconds, into histogram `metric` (a family name without the
   * prefix). `null` (nothing was measured) is ignored. Throws RangeError for a negative or non-finite value.
   */
  observe(metric: string, value: number | null): void {
    if (value === null) return;
    if (!Number.isFinite(value) || value < 0) {
      throw new RangeError(`a latency is a finite number of seconds, 0 or more; got ${value} for ${metric}`);
    }
    const histogram = this.#histogramOf(metric);
    const index = this.buckets.findIndex((bound) => value <= bound);
    histogram.counts[index < 0 ? this.buckets.length : index]++;
    histogram.sum += value;
    histogram.count++;
  }

  /** Adds `amount` (a whole number, 0 or more) to counter `counter` (a family name without the prefix). */
  incr(counter: string, amount = 1): void {
    if (!Number.isSafeInteger(amount) || amount < 0) {
      throw new RangeError(`a counter only grows by a whole number; got ${amount} for ${counter}`);
    }
    requireFamily(counter);
    if (counter === Metric.dropped || counter === Metric.errors) {
      throw new ConfigError(
        `${counter} is labelled; it has its own recorder`,
        "use recordDrop(reason) or recordError(code, disposition)",
      );
    }
    this.#counters.set(counter, (this.#counters.get(counter) ?? 0) + amount);
    this.#onCount?.();
  }

  /** One input group of real work handed to the node (markers are not work). */
  recordOffered(): void {
    this.incr(Metric.offered);
  }

  /**
   * The node gave up on `count` input groups for `reason` (a `DropReason` of `core/metrics.ts`, or another
   * short stable word: lowercase letters, digits, `_`).
   */
  recordDrop(reason: string, count = 1): void {
    if (!LABEL_WORD.test(reason)) {
      throw new ConfigError(
        `drop reason ${JSON.stringify(reason)} is not a short stable word`,
        "use [a-z0-9_]+",
      );
    }
    if (!Number.isSafeInteger(count) || count < 0) {
      throw new RangeError(`a drop count is whole; got ${count}`);
    }
    this.#drops.set(reason, (this.#drops.get(reason) ?? 0) + count);
  }
  /** Inputs given up on so far, by reason (a copy). */
  dropsByReason(): Record<string, number> {
    return Object.fromEntries(this.#drops);
  }

  /** Counts one failure under its stable code and disposition, so an alert can say what is failing. */
  recordError(code: string, disposition: string): void {
    const key = JSON.stringify([code, disposition]);
    const entry = this.#errors.get(key) ?? { code, disposition, count: 0 };
    entry.count++;
    this.#errors.set(key, entry);
  }

  /** A counter's value (0 for one never incremented). */
  counter(counter: string): number {
    return this.#counters.get(counter) ?? 0;
  }

  /**
   * The cumulative bucket counts of histogram `metric`: one per bound plus the `+Inf` bucket, so the last
   * equals the observation count. `null` before the first observation. Feed it to {@link quantileBounds}.
   */
  histogram(metric: string): readonly number[] | null {
    const histogram = this.#histograms.get(metric);
    return histogram === undefined || histogram.count === 0 ? null : cumulative(histogram.counts);
  }

  /** The throughput counters as one reading at `at` (epoch seconds; the clock's wall time by default). */
  throughput(at: number = this.#clock.now()): ThroughputSnapshot {
    const dropped = [...this.#drops.values()].reduce((sum, n) => sum + n, 0);
    return Object.freeze({
      offered: this.counter(Metric.offered),
      processed: this.counter(Metric.processed),
      dropped,
      at,
    });
  }

  /** Everything `/metrics` exports, as plain JSON (a copy). */
  snapshot(): HealthSnapshot {
    return {
      histograms: Object.fromEntries(
        [...this.#histograms].map((
          [family, h],
        ) => [family, { counts: [...h.counts], sum: h.sum, count: h.count }]),
      ),
      counters: Object.fromEntries(this.#counters),
      drops: Object.fromEntries(this.#drops),
      errors: [...this.#errors.values()].map((entry) => ({ ...entry })),
    };
  }

  /** The Prometheus text exposition of every family, in the order the module comment gives. */
  renderMetrics(): string {
    return renderExposition([{ labels: { node: this.nodeName }, snapshot: this.snapshot() }], this.buckets);
  }

  /** Why `/healthz` answers 503. */
  notLiveBecause(): string {
    return `stalled: no loop beat for ${Math.floor(this.silentFor() ?? 0)} s`;
  }

  /** Why `/readyz` answers 503. */
  notReadyBecause(): string {
    return "not ready: the node is opening";
  }

  #histogramOf(metric: string): Histogram {
    let histogram = this.#histograms.get(metric);
    if (histogram === undefined) {
      histogram = { counts: new Array(this.buckets.length + 1).fill(0), sum: 0, count: 0 };
      this.#histograms.set(requireFamily(metric), histogram);
    }
    return histogram;
  }
}

function cumulative(counts: readonly number[]): number[] {
  let running = 0;
  return counts.map((n) => running += n);
}

/** A number as Python's `repr(float)` writes it (`1.0`, `0.005`), the form `le` values take. */
function formatFloat(value: number): string {
  return Number.isInteger(value) && Math.abs(value) < 1e16 ? value.toFixed(1) : String(value);
}

function escapeLabel(value: string): string {
  return value.replaceAll("\\", "\\\\").replaceAll("\n", "\\n").replaceAll('"', '\\"');
}

/**
 * The bracket `(lower, upper]` that a nearest-rank quantile `q` of a histogram lies in: the bucket holding
 * the `ceil(q * count)`-th observation. `upper` is Infinity when it falls in the `+Inf` bucket, `lower` is
 * -Infinity for the first bucket; `null` when there are no observations (a percentile of nothing is
 * unavailable, not zero). An objective "p95 <= 50 ms" is met when `upper <= 0.05`, violated when
 * `lower >= 0.05`, undecidable otherwise.
 *
 * @throws RangeError for `q` outside (0, 1], or counts that are not one per bound plus `+Inf`.
 */
export function quantileBounds(
  cumulativeCounts: readonly number[],
  q: number,
  bounds: readonly number[] = LATENCY_BUCKETS_SECONDS,
): readonly [number, number] | null {
  if (!(q > 0 && q <= 1)) throw new RangeError(`a quantile lies in (0, 1], got ${q}`);
  if (cumulativeCounts.length !== bounds.length + 1) {
    throw new RangeError(
      `expected ${
        bounds.length + 1
      } cumulative counts (one per bound plus +Inf), got ${cumulativeCounts.length}`,
    );
  }
  const total = cumulativeCounts[cumulativeCounts.length - 1];
  if (total <= 0) return null;
  const rank = Math.ceil(q * total);
  const index = cumulativeCounts.findIndex((count) => count >= rank);
  return [index === 0 ? -Infinity : bounds[index - 1], index === bounds.length ? Infinity : bounds[index]];
}

/** One histogram family read back out of an exposition: finite bounds (ascending) and cumulative counts. */
export interface ParsedHistogram {
  readonly bounds: readonly number[];
  /** One per bound, then the `+Inf` bucket: the shape {@link quantileBounds} takes. */
  readonly cumulative: readonly number[];
}

/**
 * Reads histogram family `metric` (without the prefix and `_bucket`, e.g. `proctime_seconds`) back out of a
 * `/metrics` body of one worker, as a scraper sees it. Both lists are empty when the family has no
 * `_bucket` lines: a count/sum-only exposition has no percentile to offer.
 */
export function parseHistogram(text: string, metric: string): ParsedHistogram {
  const pattern = new RegExp(`^${METRIC_PREFIX}${metric}_bucket\\{(.*)\\}\\s+(\\S+)\\s*$`);
  const buckets: Array<[number, number]> = [];
  for (const line of text.split("\n")) {
    const found = pattern.exec(line);
    const le = found ? /(?:^|,)le="([^"]*)"/.exec(found[1]) : null;
    if (found && le) buckets.push([le[1] === "+Inf" ? Infinity : Number(le[1]), Number(found[2])]);
  }
  buckets.sort((a, b) => a[0] - b[0]);
  return {
    bounds: buckets.filter(([bound]) => Number.isFinite(bound)).map(([bound]) => bound),
    cumulative: buckets.map(([, count]) => count),
  };
}

/**
 * `VF_HEALTH_PORT` as a port: {@link DEFAULT_HEALTH_PORT} when unset or empty, `null` for `0` (no health
 * server). Throws {@link ConfigError} for anything but an integer in 0..65535.
 */
export function healthPortFromEnv(env: EnvSource = Deno.env): number | null {
  const raw = env.get(HEALTH_PORT_ENV)?.trim();
  if (raw === undefined || raw === "") return DEFAULT_HEALTH_PORT;
  const port = /^\d+$/.test(raw) ? Number(raw) : NaN;
  if (!(port <= 65535)) {
    throw malformedVariable(
      HEALTH_PORT_ENV,
      raw,
      "a port number (0 to disable)",
      String(DEFAULT_HEALTH_PORT),
      "or 0 to run without a health server",
    );
  }
  return port === 0 ? null : port;
}

/** Options of a {@link HealthServer}. */
export interface HealthServerOptions {
  /** The port to bind; 0 picks a free one. {@link DEFAULT_HEALTH_PORT} by default. */
  readonly port?: number;
  /** The interface to bind; all interfaces (what a kubelet's probes reach) by default. */
  readonly hostname?: string;
}

const TEXT = "text/plain; charset=utf-8";
const EXPOSITION = "text/plain; version=0.0.4; charset=utf-8";

/**
 * Serves a {@link HealthSource} (one node's {@link HealthState}, or a whole local run's) over HTTP:
 * `/readyz`, `/healthz`, `/metrics`, 404 for anything else.
 */
export class HealthServer {
  readonly #state: HealthSource;
  readonly #port: number;
  readonly #hostname: string;
  #server: Deno.HttpServer<Deno.NetAddr> | null = null;

  constructor(state: HealthSource, options: HealthServerOptions = {}) {
    this.#state = state;
    this.#port = options.port ?? DEFAULT_HEALTH_PORT;
    this.#hostname = options.hostname ?? DEFAULT_HEALTH_HOSTNAME;
  }

  /** The bound port while serving, else `null`. */
  get port(): number | null {
    return this.#server?.addr.port ?? null;
  }

  /** Binds and starts serving; returns the bound port. A second call while serving returns the same port. */
  start(): number {
    this.#server ??= Deno.serve(
      { port: this.#port, hostname: this.#hostname, onListen: () => {} },
      (request) => this.handle(request),
    );
    return this.#server.addr.port;
  }

  /** Stops serving and waits for requests in flight. Idempotent. */
  async stop(): Promise<void> {
    const server = this.#server;
    this.#server = null;
    await server?.shutdown();
  }

  /** The answer to one request, without a socket (what the server calls). */
  handle(request: Request): Response {
    const path = new URL(request.url).pathname;
    if (!HEALTH_PATHS.has(path)) {
      return new Response("not found\n", { status: 404, headers: { "content-type": TEXT } });
    }
    if (request.method !== "GET" && request.method !== "HEAD") {
      return new Response("method not allowed\n", {
        status: 405,
        headers: { "content-type": TEXT, allow: "GET, HEAD" },
      });
    }
    const state = this.#state;
    switch (path) {
      case HealthPath.ready:
        return state.isReady() ? plain(200, "ready") : plain(503, state.notReadyBecause());
      case HealthPath.live:
        return state.isLive() ? plain(200, "ok") : plain(503, state.notLiveBecause());
      default:
        return new Response(state.renderMetrics(), { status: 200, headers: { "content-type": EXPOSITION } });
    }
  }
}

function plain(status: number, body: string): Response {
  return new Response(`${body}\n`, { status, headers: { "content-type": TEXT } });
}
