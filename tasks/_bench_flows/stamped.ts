/**
 * Small items for the benchmarks: {@link StampedCounter} produces `{ seq, sentAt }` records stamped with
 * the time each left the producer, and {@link Relay} passes an item on unchanged, so a chain of relays
 * measures only what the runtime costs per hop.
 *
 * @module
 */

import { END, ProcessorNode, ProducerNode } from "../../mod.ts";
import { nowMs } from "./clock.ts";

/** One small item: its position and when the producer made it ({@link nowMs} milliseconds). */
export interface StampedItem {
  readonly seq: number;
  readonly sentAt: number;
}

/** Produces `count` {@link StampedItem}s numbered 0..count-1, each stamped as `next()` returns it. */
export class StampedCounter extends ProducerNode<{ readonly count: number }> {
  #seq = 0;

  /** The next stamped item, or END after `count`. */
  next(): StampedItem | typeof END {
    return this.#seq < this.params.count ? { seq: this.#seq++, sentAt: nowMs() } : END;
  }
}

/** Passes each input on as it came. */
export class Relay extends ProcessorNode {
  /** The input, unchanged. */
  process(item: unknown): unknown {
    return item;
  }
}
