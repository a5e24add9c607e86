/**
 * The memory broker's index of a subscription's outstanding messages by stream sequence.
 *
 * @module
 */

import { COMPACTION_SLACK } from "./_ring.ts";

/**
 * Values by stream sequence, kept in sequence order in parallel arrays: adding a higher sequence is a
 * push, the oldest is at the head, and a lookup is a binary search (the head first, where settlements
 * usually land). Removed values leave holes that are compacted away once they outnumber the live ones,
 * so nothing is rehashed as a subscription's outstanding set fills and drains.
 */
export class SeqIndex<T> {
  #seqs: number[] = [];
  #values: (T | undefined)[] = [];
  #head = 0;
  #live = 0;

  /** Adds `value` under `seq`, which is not present. */
  set(seq: number, value: T): void {
    const seqs = this.#seqs;
    const last = seqs.length - 1;
    this.#live++;
    if (last < this.#head || seqs[last] < seq) {
      seqs.push(seq);
      this.#values.push(value);
      return;
    }
    const at = this.#search(seq);
    seqs.splice(at, 0, seq);
    this.#values.splice(at, 0, value);
  }

  get(seq: number): T | undefined {
    const at = this.#indexOf(seq);
    return at < 0 ? undefined : this.#values[at];
  }

  delete(seq: number): void {
    const at = this.#indexOf(seq);
    if (at < 0 || this.#values[at] === undefined) return;
    this.#values[at] = undefined;
    this.#live--;
    const values = this.#values;
    let head = this.#head;
    while (head < values.length && values[head] === undefined) head++;
    this.#head = head;
    const dead = values.length - head - this.#live;
    if (head === values.length) {
      this.#seqs = [];
      this.#values = [];
      this.#head = 0;
    } else if (head + dead > this.#live + COMPACTION_SLACK) {
      this.#compact();
    }
  }

  /** The lowest sequence present. */
  first(): number | undefined {
    return this.#head < this.#seqs.length ? this.#seqs[this.#head] : undefined;
  }

  /** The values present, in sequence order. */
  *values(): IterableIterator<T> {
    for (let at = this.#head; at < this.#values.length; at++) {
      const value = this.#values[at];
      if (value !== undefined) yield value;
    }
  }

  /** The index of `seq` among the live positions, or -1. */
  #indexOf(seq: number): number {
    if (this.#head < this.#seqs.length && this.#seqs[this.#head] === seq) return this.#head;
    const at = this.#search(seq);
    return at < this.#seqs.length && this.#seqs[at] === seq && this.#values[at] !== undefined ? at : -1;
  }

  /** The first index at or after the head whose sequence is not below `seq`. */
  #search(seq: number): number {
    const seqs = this.#seqs;
    let low = this.#head;
    let high = seqs.length;
    while (low < high) {
      const mid = (low + high) >>> 1;
      if (seqs[mid] < seq) low = mid + 1;
      else high = mid;
    }
    return low;
  }

  #compact(): void {
    const seqs: number[] = [];
    const values: T[] = [];
    for (let at = this.#head; at < this.#values.length; at++) {
      const value = this.#values[at];
      if (value === undefined) continue;
      seqs.push(this.#seqs[at]);
      values.push(value);
    }
    this.#seqs = seqs;
    this.#values = values;
    this.#head = 0;
  }
}
