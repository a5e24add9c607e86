/**
 * What a benchmark sink observed, shared by the flow sink ({@link ArrivalSink}) and the bare-worker
 * baseline so both report the same figures: how many items arrived, when the first and the last did, and
 * the end-to-end latency of the items that carried a send time.
 *
 * @module
 */

/** The summary a sink writes: arrival times in {@link nowMs} milliseconds, latencies in milliseconds. */
export interface ArrivalSummary {
  readonly count: number;
  /** When the first item arrived; `null` when none did. */
  readonly firstAt: number | null;
  /** When the last item arrived; `null` when none did. */
  readonly lastAt: number | null;
  /** Items per second from the first arrival to the last (`count - 1` intervals); `null` below 2 items. */
  readonly itemsPerSecond: number | null;
  /** Median end-to-end latency; `null` when no item carried a send time. */
  readonly p50Ms: number | null;
  /** 99th percentile end-to-end latency; `null` when no item carried a send time. */
  readonly p99Ms: number | null;
  /**
   * CPU time the whole process used per item from the first arrival to the `expected`-th, in
   * microseconds; `null` without an expected count or a CPU reader, or below 2 items.
   */
  readonly cpuUsPerItem: number | null;
}

/**
 * The value at quantile `q` (0..1) of `sorted` (ascending), nearest rank; `null` for an empty list.
 * `q` outside 0..1 is clamped.
 */
export function quantile(sorted: ArrayLike<number>, q: number): number | null {
  if (sorted.length === 0) return null;
  const rank = Math.ceil(Math.min(1, Math.max(0, q)) * sorted.length);
  return sorted[Math.max(0, rank - 1)];
}

/** The median of `values` (any order; not modified), the lower middle one for an even count; `null` if empty. */
export function median(values: readonly number[]): number | null {
  return quantile([...values].sort((a, b) => a - b), 0.5);
}

/**
 * Records arrivals as they happen (amortized O(1) each) and summarizes them. Given how many items are
 * `expected` and a reader of the process's CPU time, it also reads that time at the first arrival and at
 * the expected-th one.
 */
export class ArrivalLog {
  readonly #expected: number | null;
  readonly #cpuMs: (() => number) | null;
  #cpuAtFirst: number | null = null;
  #cpuAtExpected: number | null = null;
  #count = 0;
  #firstAt: number | null = null;
  #lastAt: number | null = null;
  #latencies = new Float64Array(1024);
  #latencyCount = 0;

  constructor(expected: number | null = null, cpuMs: (() => number) | null = null) {
    this.#expected = expected;
    this.#cpuMs = cpuMs;
  }

  /** Notes one item arriving at `at`; `sentAt`, when given, is when it was produced. */
  record(at: number, sentAt: number | null): void {
    this.#count++;
    if (this.#cpuMs !== null && this.#count === 1) this.#cpuAtFirst = this.#cpuMs();
    if (this.#cpuMs !== null && this.#count === this.#expected) this.#cpuAtExpected = this.#cpuMs();
    this.#firstAt ??= at;
    this.#lastAt = at;
    if (sentAt === null) return;
    if (this.#latencyCount === this.#latencies.length) {
      const grown = new Float64Array(this.#latencies.length * 2);
      grown.set(this.#latencies);
      this.#latencies = grown;
    }
    this.#latencies[this.#latencyCount++] = at - sentAt;
  }

  /** The figures so far. */
  summary(): ArrivalSummary {
    const sorted = this.#latencies.slice(0, this.#latencyCount).sort();
    const span = this.#firstAt === null || this.#lastAt === null ? 0 : this.#lastAt - this.#firstAt;
    return {
      count: this.#count,
      firstAt: this.#firstAt,
      lastAt: this.#lastAt,
      itemsPerSecond: this.#count >= 2 && span > 0 ? (this.#count - 1) / (span / 1000) : null,
      p50Ms: quantile(sorted, 0.5),
      p99Ms: quantile(sorted, 0.99),
      cpuUsPerItem: this.#cpuAtFirst === null || this.#cpuAtExpected === null || this.#count < 2
        ? null
        : (this.#cpuAtExpected - this.#cpuAtFirst) * 1000 / (this.#count - 1),
    };
  }
}

/** The send time an item carries (`{ sentAt: number }`), or `null`. */
export function sentAtOf(item: unknown): number | null {
  if (typeof item !== "object" || item === null) return null;
  const sentAt = (item as { sentAt?: unknown }).sentAt;
  return typeof sentAt === "number" ? sentAt : null;
}
