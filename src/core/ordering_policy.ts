/**
 * The declared temporal semantics of a keyed stateful node (spec core.policies, OrderingPolicy, RUN-021):
 * records of one partition are applied in arrival order, or released in sequence order within a bounded
 * horizon. {@link ReorderBuffer} is the reference interpreter of a policy for one partition key, and its
 * position is checkpointable with the node's state (RUN-022).
 *
 * @module
 */

import { isRecord } from "./checks.ts";
import { PolicyCheck, readCheckedDict } from "./_policy_fields.ts";

/** Records are applied as they come (the default). */
export const ORDER_ARRIVAL = "arrival";
/** Records are released in sequence order; a gap is waited for up to `horizon` later records. */
export const ORDER_SEQUENCE = "sequence";
/** How a stateful node orders the records of one partition. */
export const ORDERING_MODES = [ORDER_ARRIVAL, ORDER_SEQUENCE] as const;
/** One of {@link ORDERING_MODES}. */
export type OrderingMode = typeof ORDERING_MODES[number];

/** A record arriving after its slot was given up is dropped, and counted. */
export const LATE_DROP = "drop";
/** ...or delivered out of order, marked late, for the node to account for. */
export const LATE_MARK = "mark";
/** What happens to a late record. */
export const LATE_POLICIES = [LATE_DROP, LATE_MARK] as const;
/** One of {@link LATE_POLICIES}. */
export type LatePolicy = typeof LATE_POLICIES[number];

/** How many later records may wait behind a gap by default. */
export const DEFAULT_ORDERING_HORIZON = 8;

const ORDERING_KEYS = ["mode", "horizon", "late"];

/** The constructor's camelCase options; every one is optional. */
export interface OrderingPolicyInit {
  /** `arrival` (default) or `sequence`. */
  readonly mode?: OrderingMode;
  /** Sequence mode: how many later records may be held back waiting for a gap (default 8). */
  readonly horizon?: number;
  /** What happens to a record whose slot was given up: `drop` (default) or `mark`. */
  readonly late?: LatePolicy;
}

/** The serialized form, with the spec's exact keys (`OrderingPolicy.to_dict`). */
export interface OrderingPolicyDict {
  /** How records are ordered. */
  readonly mode: OrderingMode;
  /** Sequence mode: later records that may wait behind a gap before it is given up. */
  readonly horizon: number;
  /** What happens to a record whose slot was given up. */
  readonly late: LatePolicy;
}

type OrderingRaw = { readonly [K in keyof OrderingPolicyInit]?: unknown };

function checkOrdering(raw: OrderingRaw, check: PolicyCheck): Required<OrderingPolicyInit> {
  const fields = {
    mode: raw.mode ?? ORDER_ARRIVAL,
    horizon: raw.horizon ?? DEFAULT_ORDERING_HORIZON,
    late: raw.late ?? LATE_DROP,
  };
  check.oneOf("mode", fields.mode, ORDERING_MODES);
  check.number("horizon", fields.horizon, { integer: true, min: 0 });
  check.oneOf("late", fields.late, LATE_POLICIES);
  check.throwIfAny();
  return fields as Required<OrderingPolicyInit>;
}

/**
 * A validated ordering policy; construction refuses an unknown `mode` or `late` and a `horizon` that is not
 * an integer >= 0, all at once in one {@link ConfigError}.
 */
export class OrderingPolicy {
  /** How records are ordered. */
  readonly mode: OrderingMode;
  /** Sequence mode: later records that may wait behind a gap before it is given up. */
  readonly horizon: number;
  /** What happens to a record whose slot was given up. */
  readonly late: LatePolicy;

  /** A policy of `init`, its defaults for what `init` leaves out; throws {@link ConfigError} when invalid. */
  constructor(init: OrderingPolicyInit = {}) {
    const fields = checkOrdering(init, new PolicyCheck("OrderingPolicy", "init"));
    this.mode = fields.mode;
    this.horizon = fields.horizon;
    this.late = fields.late;
  }

  /**
   * Rebuilds a policy from its dict; `null`, `undefined` or `{}` is the default policy. A non-object, an
   * unknown key and every invalid value are reported together in one {@link ConfigError}.
   */
  static fromDict(d: unknown): OrderingPolicy {
    if (d === null || d === undefined) return new OrderingPolicy();
    return new OrderingPolicy(readCheckedDict("OrderingPolicy", d, ORDERING_KEYS, checkOrdering));
  }

  /** The dict with the spec's exact keys; `fromDict(toDict())` is an equal policy. */
  toDict(): OrderingPolicyDict {
    return { mode: this.mode, horizon: this.horizon, late: this.late };
  }
}

/** One record a {@link ReorderBuffer} released: apply it now, in this order. */
export interface ReorderRelease<T> {
  /** The record's sequence number. */
  readonly seq: number;
  /** The record, as offered. */
  readonly record: T;
  /** The record's slot had been given up (or, at flush, a gap precedes it). */
  readonly late: boolean;
}

/** A buffer's whole position, JSON-serializable when its records are (`ReorderBuffer.snapshot`). */
export interface ReorderSnapshot<T> {
  /** The next expected sequence number. */
  readonly next: number;
  /** Records held behind a gap, keyed by their sequence number as a string, ascending. */
  readonly held: Readonly<Record<string, T>>;
  /** Every sequence number already applied (or given up and seen late), ascending. */
  readonly applied: readonly number[];
  /** How many late records were dropped. */
  readonly dropped: number;
}

function requireSeq(name: string, value: number): void {
  if (!Number.isSafeInteger(value)) throw new RangeError(`${name} must be a safe integer, got ${value}`);
}

function isIntegerList(value: unknown): value is number[] {
  return Array.isArray(value) && value.every((item) => Number.isSafeInteger(item));
}

/**
 * The reference interpreter of an {@link OrderingPolicy} for one partition key. `offer(seq, record)`
 * returns the records that may be applied now, oldest first:
 * - under `arrival`, every record at once;
 * - under `sequence`, the next expected record and whatever follows it contiguously; a gap is given up
 *   only once more than `horizon` later records are held behind it, and a record for a given-up slot is
 *   late: dropped (counted in `dropped`) or released with `late: true` under `late: "mark"`.
 *
 * In both modes a sequence number is never applied twice.
 */
export class ReorderBuffer<T = unknown> {
  /** The policy the buffer interprets. */
  readonly policy: OrderingPolicy;
  #next: number;
  readonly #held = new Map<number, T>();
  readonly #applied = new Set<number>();
  #dropped = 0;

  /** An empty buffer expecting sequence number `start` first; throws a RangeError for an unsafe integer. */
  constructor(policy: OrderingPolicy, start = 1) {
    requireSeq("start", start);
    this.policy = policy;
    this.#next = start;
  }

  /** The next sequence number the buffer waits for. */
  get expected(): number {
    return this.#next;
  }

  /** How many late records were dropped. */
  get dropped(): number {
    return this.#dropped;
  }

  /** How many records are held behind a gap. */
  get holding(): number {
    return this.#held.size;
  }

  /** Whether a record with sequence number `seq` is held behind a gap. */
  holds(seq: number): boolean {
    return this.#held.has(seq);
  }

  /** Offers one record; returns what may be applied now, oldest first (possibly nothing). */
  offer(seq: number, record: T): ReorderRelease<T>[] {
    requireSeq("seq", seq);
    if (this.#applied.has(seq) || this.#held.has(seq)) return [];
    if (this.policy.mode === ORDER_ARRIVAL) {
      this.#applied.add(seq);
      return [{ seq, record, late: false }];
    }
    if (seq < this.#next) {
      this.#applied.add(seq);
      if (this.policy.late === LATE_DROP) {
        this.#dropped += 1;
        return [];
      }
      return [{ seq, record, late: true }];
    }
    this.#held.set(seq, record);
    const released = this.#releaseContiguous();
    while (this.#held.size > this.policy.horizon) {
      this.#next = Math.min(...this.#held.keys());
      released.push(...this.#releaseContiguous());
    }
    return released;
  }

  #releaseContiguous(): ReorderRelease<T>[] {
    const released: ReorderRelease<T>[] = [];
    while (this.#held.has(this.#next)) {
      const seq = this.#next;
      released.push({ seq, record: this.#held.get(seq) as T, late: false });
      this.#held.delete(seq);
      this.#applied.add(seq);
      this.#next = seq + 1;
    }
    return released;
  }

  /** End of input: releases everything held, in order; a record with a gap before it is marked late. */
  flush(): ReorderRelease<T>[] {
    const released: ReorderRelease<T>[] = [];
    for (const seq of [...this.#held.keys()].sort((a, b) => a - b)) {
      released.push({ seq, record: this.#held.get(seq) as T, late: seq !== this.#next });
      this.#applied.add(seq);
      this.#next = seq + 1;
    }
    this.#held.clear();
    return released;
  }

  /**
   * The buffer's whole position, so a stateful node can checkpoint it with its own state and a replacement
   * resumes the declared ordering exactly where the crashed process left it (RUN-021/RUN-022).
   */
  snapshot(): ReorderSnapshot<T> {
    const held: Record<string, T> = {};
    for (const seq of [...this.#held.keys()].sort((a, b) => a - b)) {
      held[String(seq)] = this.#held.get(seq) as T;
    }
    return {
      next: this.#next,
      held,
      applied: [...this.#applied].sort((a, b) => a - b),
      dropped: this.#dropped,
    };
  }

  /**
   * A buffer positioned as `snapshot` recorded it (the inverse of {@link ReorderBuffer.snapshot}); a
   * snapshot of the wrong shape throws one {@link ConfigError} naming every bad field.
   */
  static restore<T>(policy: OrderingPolicy, snapshot: unknown): ReorderBuffer<T> {
    const check = new PolicyCheck("ReorderBuffer snapshot", "dict");
    const raw = isRecord(snapshot) ? snapshot : {};
    if (!isRecord(snapshot)) {
      check.fail("", "a snapshot must be an object", "pass what snapshot() returned");
    }
    const next = raw.next ?? 1;
    const held = raw.held ?? {};
    const applied = raw.applied ?? [];
    const dropped = raw.dropped ?? 0;
    check.number("next", next, { integer: true });
    check.number("dropped", dropped, { integer: true, min: 0 });
    if (!isIntegerList(applied)) {
      check.fail("applied", "applied must be a list of integers", "keep applied intact");
    }
    const heldOk = isRecord(held) && Object.keys(held).every((key) => /^-?\d+$/.test(key));
    if (!heldOk) check.fail("held", "held must map integer keys to records", "keep held intact");
    check.throwIfAny();
    const buffer = new ReorderBuffer<T>(policy, next as number);
    for (const [seq, record] of Object.entries(held as Record<string, T>)) {
      buffer.#held.set(Number(seq), record);
    }
    for (const seq of applied as number[]) buffer.#applied.add(seq);
    buffer.#dropped = dropped as number;
    return buffer;
  }
}
