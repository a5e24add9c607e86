/**
 * The order a node's ready input groups are handed to it in, under its {@link OrderingPolicy} (RUN-021):
 * in sequence mode, one {@link ReorderBuffer} per partition key releases the groups in their `seq` order
 * (a producer's order, which a stage of several replicas carries forward but finishes out of order). A
 * group waiting behind a gap stays unsettled with the broker, so a crash hands it back to the broker
 * instead of losing it; a replacement starts with empty buffers and waits out the gap again. Nothing in a
 * buffer needs a checkpoint of its own: what it holds is unacked, and what it applied was acked.
 *
 * @module
 */

import { LATE_DROP, type OrderingPolicy, ReorderBuffer } from "../core/ordering_policy.ts";
import { GroupKind, type ReadyGroup } from "./grouping.ts";

/**
 * A key's buffer is replaced by a fresh one at its expected sequence number once it holds nothing and has
 * applied this many groups, so what it remembers stays bounded over a run of days.
 */
export const ORDERED_COMPACT_AFTER = 4096;
/** The most given-up sequence numbers a key remembers (the oldest are forgotten first). */
export const ORDERED_GIVEN_UP_LIMIT = 1024;

interface KeyState<H> {
  buffer: ReorderBuffer<ReadyGroup<H>>;
  /** Groups applied since the buffer was made. */
  applied: number;
  /** Sequence numbers whose slots were given up: a group for one arriving later is late. */
  readonly givenUp: Set<number>;
}

/**
 * Reorders ready groups per partition key. {@link push} takes each group the assembler made, {@link pop}
 * hands them out in order, and {@link takeDropped} the late groups the policy drops, for the messenger to
 * settle and count. A group whose `seq` was seen already (below the expected one and never given up, or
 * held: a redelivery, or a restarted source numbering its items again) is handed out at once rather than
 * swallowed: nothing accepted is lost. An end group releases everything held first, in order, and a group
 * after it (an input retried while the end waited for it) is handed out as it comes; an abort group goes
 * ahead of everything.
 */
export class OrderedRelease<H> {
  readonly #policy: OrderingPolicy;
  readonly #keyOf: (group: ReadyGroup<H>) => string;
  readonly #keys = new Map<string, KeyState<H>>();
  readonly #ready: ReadyGroup<H>[] = [];
  #dropped: ReadyGroup<H>[] = [];
  /** An end or abort group came: the stream is over, and what comes after it (a retried input) passes. */
  #over = false;

  /** Orders under `policy` (sequence mode), one buffer per `keyOf(group)`. */
  constructor(policy: OrderingPolicy, keyOf: (group: ReadyGroup<H>) => string) {
    this.#policy = policy;
    this.#keyOf = keyOf;
  }

  /** How many groups wait behind a gap, over every key. */
  get holding(): number {
    let held = 0;
    for (const state of this.#keys.values()) held += state.buffer.holding;
    return held;
  }

  /** Takes one group the assembler made. */
  push(group: ReadyGroup<H>): void {
    if (group.kind === GroupKind.abort) {
      // Surfaced ahead of everything (ABORT-3): what waits behind a gap stays unsettled, for the broker.
      this.#over = true;
      this.#ready.unshift(group);
      return;
    }
    if (group.kind === GroupKind.end) {
      for (const state of this.#keys.values()) {
        for (const released of state.buffer.flush()) this.#ready.push(released.record);
      }
      this.#keys.clear();
      this.#over = true;
      this.#ready.push(group);
      return;
    }
    if (this.#over) {
      this.#ready.push(group);
      return;
    }
    const seq = Number(group.seq);
    const state = this.#state(this.#keyOf(group));
    const late = state.givenUp.delete(seq);
    const repeat = seq < state.buffer.expected ? !late : state.buffer.holds(seq);
    if (!Number.isSafeInteger(seq) || repeat) {
      this.#ready.push(group);
      return;
    }
    const expected = state.buffer.expected;
    const released = state.buffer.offer(seq, group);
    if (late && this.#policy.late === LATE_DROP) this.#dropped.push(group);
    const releasedSeqs = new Set(released.map((r) => r.seq));
    const givenUpFrom = Math.max(expected, state.buffer.expected - ORDERED_GIVEN_UP_LIMIT);
    for (let slot = givenUpFrom; slot < state.buffer.expected; slot++) {
      if (!releasedSeqs.has(slot)) this.#giveUp(state, slot);
    }
    for (const { record } of released) this.#ready.push(record);
    state.applied += released.length;
    if (state.buffer.holding === 0 && state.applied >= ORDERED_COMPACT_AFTER) {
      state.buffer = new ReorderBuffer(this.#policy, state.buffer.expected);
      state.applied = 0;
    }
  }

  /** The next group to hand out, oldest first; `null` while every group waits behind a gap (or none came). */
  pop(): ReadyGroup<H> | null {
    return this.#ready.shift() ?? null;
  }

  /** The late groups dropped since the last call (policy `late: "drop"`): settle and count each. */
  takeDropped(): ReadyGroup<H>[] {
    const dropped = this.#dropped;
    this.#dropped = [];
    return dropped;
  }

  #state(key: string): KeyState<H> {
    let state = this.#keys.get(key);
    if (state === undefined) {
      state = { buffer: new ReorderBuffer(this.#policy), applied: 0, givenUp: new Set() };
      this.#keys.set(key, state);
    }
    return state;
  }

  #giveUp(state: KeyState<H>, slot: number): void {
    state.givenUp.add(slot);
    if (state.givenUp.size > ORDERED_GIVEN_UP_LIMIT) {
      state.givenUp.delete(state.givenUp.values().next().value as number);
    }
  }
}
