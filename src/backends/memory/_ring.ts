/**
 * The memory broker's queue: a growable circular FIFO, compacted once its dead items outnumber its live
 * ones.
 *
 * @module
 */

/** How many dead items a queue may hold beyond twice its live ones before it is compacted. */
export const COMPACTION_SLACK = 64;

/** A growable circular FIFO: push and shift in O(1), no element moves on shift. */
export class Ring<T> {
  #items: (T | undefined)[] = new Array(8);
  #head = 0;
  #length = 0;

  get length(): number {
    return this.#length;
  }

  push(item: T): void {
    if (this.#length === this.#items.length) this.#grow();
    this.#items[(this.#head + this.#length) & (this.#items.length - 1)] = item;
    this.#length++;
  }

  peek(): T | undefined {
    return this.#length === 0 ? undefined : this.#items[this.#head];
  }

  shift(): T | undefined {
    if (this.#length === 0) return undefined;
    const item = this.#items[this.#head];
    this.#items[this.#head] = undefined;
    this.#head = (this.#head + 1) & (this.#items.length - 1);
    this.#length--;
    return item;
  }

  toArray(): T[] {
    const out: T[] = [];
    for (let i = 0; i < this.#length; i++) {
      out.push(this.#items[(this.#head + i) & (this.#items.length - 1)] as T);
    }
    return out;
  }

  /**
   * Drops the items `live` refuses once they outnumber the live ones (`live` counted by the caller) by more
   * than a small slack, keeping order. Each compaction is paid for by the dead items since the last one,
   * so a queue whose head stays put while items behind it die never grows without bound.
   */
  compactBeyond(liveCount: number, live: (item: T) => boolean): void {
    if (this.#length <= 2 * liveCount + COMPACTION_SLACK) return;
    const kept = this.toArray().filter(live);
    this.#items = new Array(Math.max(8, 2 ** Math.ceil(Math.log2(kept.length + 1))));
    this.#head = 0;
    this.#length = 0;
    for (const item of kept) this.push(item);
  }

  #grow(): void {
    const old = this.#items;
    const next: (T | undefined)[] = new Array(old.length * 2);
    for (let i = 0; i < this.#length; i++) next[i] = old[(this.#head + i) & (old.length - 1)];
    this.#items = next;
    this.#head = 0;
  }
}
