/**
 * Nodes for the growth benchmark, which must hold nothing per item themselves: {@link CountingSink} only
 * counts what arrives, and {@link PacedCounter} makes small items at a steady rate for a set time, as a
 * live camera does.
 *
 * @module
 */

import { ConsumerNode, END, type NodePermissions, ProducerNode } from "../../mod.ts";

/** Params of {@link CountingSink}. */
export interface CountingSinkParams {
  /** Where `{ "count": n, "lastItemAt": ms }` is written when the stream ends (`lastItemAt`: the wall-clock
   * time of the last item, milliseconds since the epoch; null when none came). */
  readonly summaryPath: string;
}

/** Counts the items it consumes and writes the count and the last one's time to `summaryPath` at `close()`. */
export class CountingSink extends ConsumerNode<CountingSinkParams> {
  #count = 0;
  #lastItemAt: number | null = null;

  /** Write access to the summary file, nothing else. */
  override permissions(): NodePermissions {
    return { ...super.permissions(), write: [this.params.summaryPath] };
  }

  /** Counts the item. */
  consume(): void {
    this.#count++;
    this.#lastItemAt = Date.now();
  }

  /** Writes the count (the file is replaced). */
  override async close(): Promise<void> {
    await Deno.writeTextFile(
      this.params.summaryPath,
      JSON.stringify({ count: this.#count, lastItemAt: this.#lastItemAt }),
    );
  }
}

/** Params of {@link PacedCounter}. */
export interface PacedCounterParams {
  /** Items per second. */
  readonly rate: number;
  /** How long it makes items, in seconds; END after `rate × seconds` items. */
  readonly seconds: number;
}

/** Makes `{ seq }` items at `rate` a second, on a schedule from its first item (late items catch up). */
export class PacedCounter extends ProducerNode<PacedCounterParams> {
  #seq = 0;
  #startedAt: number | null = null;

  /** The next item once its time has come, or END after `rate × seconds` items. */
  async next(): Promise<{ seq: number } | typeof END> {
    const { rate, seconds } = this.params;
    if (this.#seq >= rate * seconds) return END;
    const startedAt = this.#startedAt ??= performance.now();
    const due = startedAt + (this.#seq * 1000) / rate;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    return { seq: this.#seq++ };
  }
}
