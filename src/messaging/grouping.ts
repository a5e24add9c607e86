/**
 * Join assembly (spec messaging.grouping): turns per-parent deliveries into complete input groups for a
 * multi-parent node, without a broker.
 *
 * - {@link TraceGroupAssembler} groups by exact trace id (a single producer's diamond): a group is ready
 *   once every parent contributed the message with that trace id.
 * - {@link TimeGroupAssembler} groups by event time (independent producers): members of a group lie within
 *   `tolerance_ms` of each other; a timed-out group with at least `quorum` synchronized parents is emitted
 *   with `null` for the missing ones; collect parents contribute every sample within their window.
 *
 * An assembler owns the delivery handles it is given and never settles one itself: every handle offered
 * comes back exactly once — inside a {@link ReadyGroup} (the task acks or fails it after processing), or in
 * a {@link Release} (evicted, expired, superseded by a redelivery, or handed back) saying how to settle it.
 * Time comes from an injected {@link Clock}; the caller drives it with {@link GroupAssembler.sweep} and
 * {@link GroupAssembler.popReady} from one task loop (no locking).
 *
 * @example
 * ```ts
 * import { JoinPolicy } from "../core/join_policy.ts";
 * import { envelopeEntry, makeAssembler } from "./grouping.ts";
 * const join = makeAssembler<number>("fuse", ["left", "right"], new JoinPolicy({ missing: "wait" }));
 * join.add("left", envelopeEntry({ traceId: "cam:1", seq: 1, handle: 1 }));
 * join.add("right", envelopeEntry({ traceId: "cam:1", seq: 1, handle: 2 }));
 * join.popReady(); // { kind: "data", traceId: "cam:1", seq: 1, handles: [1, 2], ... }
 * ```
 *
 * @module
 */

import { type Clock, systemClock } from "../backends/clock.ts";
import { ConfigError, DecodeError } from "../core/errors.ts";
import { DropReason } from "../core/metrics.ts";
import { JOIN_TIME, JOIN_TRACE, type JoinMode, type JoinPolicy, MISSING_ERROR } from "../core/join_policy.ts";
import type { Envelope } from "../wire/codec.ts";
import {
  MsgType,
  type Seq,
  timeGroupIdentity,
  type TimeGroupMember,
  traceGroupIdentity,
} from "../wire/identities.ts";

/** An entry's metadata: the envelope's metadata map, or `null` when it carries none. */
export type EntryMetadata = Readonly<Record<string, unknown>> | null;

/**
 * One decoded envelope as the join path carries it (spec `EnvelopeEntry`), with the settlement handle the
 * messenger received it under. Never mutated: a redelivery that supersedes it replaces the whole entry.
 */
export interface EnvelopeEntry<H = unknown> {
  readonly kind: "envelope";
  /** DATA, EOS or ABORT. */
  readonly type: MsgType;
  readonly traceId: string;
  readonly seq: Seq;
  /** Epoch seconds the producer stamped; `null` when it stamped none. */
  readonly eventTs: number | null;
  /** The decoded payload (for an ABORT, the marker the messenger read from it). */
  readonly message: unknown;
  readonly metadata: EntryMetadata;
  /** The parent ended cleanly (`type` is EOS). */
  readonly isStopSignal: boolean;
  /** The parent died (`type` is ABORT). */
  readonly isAbort: boolean;
  readonly producerName: string;
  readonly flowId: string;
  readonly runId: string;
  readonly spanId: string;
  readonly parentSpanId: string;
  readonly replicaId: number;
  /** The blob the payload was fetched from, when it was offloaded. */
  readonly blobRef: string | null;
  /** The opaque token the messenger settles this delivery with. */
  readonly handle: H;
}

/** What {@link envelopeEntry} needs: the identity and the handle; every other field has a default. */
export interface EnvelopeEntryInit<H> {
  readonly traceId: string;
  readonly seq: Seq;
  readonly handle: H;
  readonly type?: MsgType;
  readonly eventTs?: number | null;
  readonly message?: unknown;
  readonly metadata?: EntryMetadata;
  readonly producerName?: string;
  readonly flowId?: string;
  readonly runId?: string;
  readonly spanId?: string;
  readonly parentSpanId?: string;
  readonly replicaId?: number;
  readonly blobRef?: string | null;
}

function isSeq(value: unknown): value is Seq {
  return typeof value === "bigint" || (typeof value === "number" && Number.isSafeInteger(value));
}

/**
 * An entry from its fields (spec `EnvelopeEntry.from_decoded`): absent fields take their defaults (a DATA
 * entry, no event time, no metadata, empty names, replica 0, no blob).
 *
 * @throws DecodeError when the trace id or seq is missing or malformed, or the event time is not finite:
 * without an identity a group has nothing to assemble on.
 */
export function envelopeEntry<H>(init: EnvelopeEntryInit<H>): EnvelopeEntry<H> {
  const eventTs = init.eventTs ?? null;
  if (typeof init.traceId !== "string" || !isSeq(init.seq)) {
    throw new DecodeError(
      `an envelope entry needs a string trace_id and an integer seq, got trace_id=${
        String(init.traceId)
      } seq=${String(init.seq)}`,
      "build entries from decoded envelopes: every envelope carries trace_id and seq",
      { trace_id: String(init.traceId), seq: String(init.seq) },
    );
  }
  if (eventTs !== null && !Number.isFinite(eventTs)) {
    throw new DecodeError(
      `an envelope entry's event_ts must be finite epoch seconds or absent, got ${eventTs}`,
      "stamp event times as finite epoch seconds, or leave them unset",
      { trace_id: init.traceId },
    );
  }
  const type = init.type ?? MsgType.data;
  return {
    kind: "envelope",
    type,
    traceId: init.traceId,
    seq: init.seq,
    eventTs,
    message: init.message,
    metadata: init.metadata ?? null,
    isStopSignal: type === MsgType.eos,
    isAbort: type === MsgType.abort,
    producerName: init.producerName ?? "",
    flowId: init.flowId ?? "",
    runId: init.runId ?? "",
    spanId: init.spanId ?? "",
    parentSpanId: init.parentSpanId ?? "",
    replicaId: init.replicaId ?? 0,
    blobRef: init.blobRef ?? null,
    handle: init.handle,
  };
}

/**
 * The entry for a decoded wire envelope received under `handle`, with the payload the messenger decoded
 * (or fetched from `blobRef`) as `message`.
 */
export function entryFromEnvelope<H>(
  envelope: Envelope,
  handle: H,
  message: unknown,
  blobRef: string | null = null,
): EnvelopeEntry<H> {
  return envelopeEntry({
    traceId: envelope.traceId,
    seq: envelope.seq,
    handle,
    type: envelope.type,
    eventTs: envelope.eventTs,
    message,
    metadata: envelope.metadata,
    producerName: envelope.producerName,
    flowId: envelope.flowId,
    runId: envelope.runId,
    spanId: envelope.spanId,
    parentSpanId: envelope.parentSpanId,
    replicaId: envelope.replicaId,
    blobRef,
  });
}

/**
 * The window of samples a collect parent contributes to one time group (spec `CollectEntry`): every sample
 * within that parent's window of the group's time, oldest first. It has no trace id or seq of its own.
 */
export interface CollectEntry {
  readonly kind: "collect";
  readonly message: readonly unknown[];
  readonly metadata: readonly EntryMetadata[];
  /** Each sample's own event time (`null` when it had none; it was placed by its arrival time). */
  readonly eventTs: readonly (number | null)[];
  readonly isStopSignal: false;
  readonly isAbort: false;
}

/** What one parent contributes to a ready group: an entry, a collected window, or `null` (left out by a quorum). */
export type GroupEntry<H = unknown> = EnvelopeEntry<H> | CollectEntry | null;

/** What a ready group is. */
export const GroupKind = {
  /** A complete (or quorum) input group for the node to process. */
  data: "data",
  /** Every parent ended: the terminal group, one EOS (or ABORT, which outranks it) per parent. */
  end: "end",
  /** A parent died: surfaced ahead of everything else (ABORT-3). */
  abort: "abort",
} as const;
/** What a ready group is. */
export type GroupKind = typeof GroupKind[keyof typeof GroupKind];

/** An assembled group, ready for the node (spec `ReadyGroup`). */
export interface ReadyGroup<H = unknown> {
  readonly kind: GroupKind;
  /**
   * The identity the node's output carries forward: the shared trace id of a trace group, the minted
   * `tw-…` id of a time group, the marker's trace id for an end or abort group.
   */
  readonly traceId: string;
  /** Deterministic representative seq: the same members always give the same seq (output dedup). */
  readonly seq: Seq;
  /** The group's event time (min over its members), `null` when none had one. */
  readonly eventTs: number | null;
  /** One entry per parent, in parent order. */
  readonly entries: Readonly<Record<string, GroupEntry<H>>>;
  /** Every handle backing this group; the task settles each exactly once after processing. */
  readonly handles: readonly H[];
}

/** Why handles came back without a ready group. */
export const ReleaseReason = {
  /** The group outlived the policy timeout without completing (or without a quorum). */
  timeout: "timeout",
  /** More than `max_pending` incomplete groups: the oldest goes, as a drop. */
  maxPending: "max_pending",
  /** A parent the group lacks has ended, so it can never complete. */
  parentEnded: "parent_ended",
  /** A collect sample no group claimed within the retention (timeout + settle window). */
  collectExpired: "collect_expired",
  /** A collect buffer was full (`max(1024, max_pending × 16)` samples): its oldest sample went. */
  collectOverflow: "collect_overflow",
  /** A redelivery of the same message replaced this attempt. */
  superseded: "superseded",
  /** {@link GroupAssembler.handBack}: the wait was cancelled (quiesce or stop). */
  handedBack: "handed_back",
} as const;
/** Why handles came back without a ready group. */
export type ReleaseReason = typeof ReleaseReason[keyof typeof ReleaseReason];

/** How the messenger settles released handles. */
export const Settlement = {
  /** Settle Completed without processing: the input is given up on (a drop, counted by `takeDrops`). */
  ack: "ack",
  /** Settle Retry, so the broker redelivers (missing `error`, or handed back). */
  nak: "nak",
  /** Retire locally with no broker settlement: a newer attempt of the same message is held instead. */
  retire: "retire",
} as const;
/** How the messenger settles released handles. */
export type Settlement = typeof Settlement[keyof typeof Settlement];

/** Handles the assembler gives back outside a ready group, with how to settle them. */
export interface Release<H = unknown> {
  readonly reason: ReleaseReason;
  readonly settlement: Settlement;
  /** The parent each handle came from: `parents[i]` delivered `handles[i]`. */
  readonly parents: readonly string[];
  readonly handles: readonly H[];
}

/** Construction options of an assembler. */
export interface AssemblerOptions {
  /** Where timeouts, settle holds and collect retention read the time (default: the system clock). */
  readonly clock?: Clock;
  /**
   * Never evict an incomplete group for `max_pending` (a batch flow's join, where nothing may be lost; false
   * by default, as the spec's policy says). What the join holds is then bounded by its subscriptions'
   * credit (the policy's working set plus the prefetch, per parent): a parent that runs ahead waits at
   * its credit until the others complete its groups, instead of its oldest groups being dropped.
   */
  readonly lossless?: boolean;
}

/** A held entry and the index of the parent that delivered it. */
interface Member<H> {
  readonly index: number;
  readonly entry: EnvelopeEntry<H>;
}

/** A first-in first-out queue with O(1) amortized push and shift, and indexed reads. */
class Fifo<T> {
  #items: T[] = [];
  #head = 0;

  get size(): number {
    return this.#items.length - this.#head;
  }

  push(item: T): void {
    this.#items.push(item);
  }

  /** The i-th item from the front. */
  at(i: number): T {
    return this.#items[this.#head + i];
  }

  peek(): T | undefined {
    return this.size > 0 ? this.#items[this.#head] : undefined;
  }

  shift(): T | undefined {
    if (this.size === 0) return undefined;
    const item = this.#items[this.#head++];
    if (this.#head === this.#items.length) {
      this.#items = [];
      this.#head = 0;
    } else if (this.#head >= 1024 && this.#head * 2 >= this.#items.length) {
      this.#items = this.#items.slice(this.#head);
      this.#head = 0;
    }
    return item;
  }

  /** Removes and returns every item, front first. */
  drain(): T[] {
    const items = this.#items.slice(this.#head);
    this.#items = [];
    this.#head = 0;
    return items;
  }
}

function checkParents(nodeName: string, parentNames: readonly string[]): Map<string, number> {
  const index = new Map<string, number>();
  parentNames.forEach((name, i) => index.set(name, i));
  if (parentNames.length === 0 || index.size !== parentNames.length) {
    throw new ConfigError(
      `node ${nodeName}: a join needs distinct parent names, got ${JSON.stringify(parentNames)}`,
      "pass the node's real parents, each once",
      { node: nodeName },
    );
  }
  return index;
}

function checkMode(nodeName: string, policy: JoinPolicy, mode: JoinMode, what: string): void {
  if (policy.mode === mode) return;
  throw new ConfigError(
    `node ${nodeName}: a ${what} assembler needs a join policy with mode "${mode}", got "${policy.mode}"`,
    "build assemblers with makeAssembler(), which picks the assembler from the policy's mode",
    { node: nodeName },
  );
}

/**
 * What every assembler shares (spec `GroupAssembler`): feed entries with {@link add}, apply timeouts with
 * {@link sweep}, drain with {@link popReady}, collect what came back otherwise with {@link takeReleased}.
 *
 * Entries by type:
 * - DATA is grouped by the concrete assembler.
 * - EOS ends its parent. Feed it once no more data of that parent can arrive (its data subscription is
 *   drained); what of the parent is still held in groups is no reason to wait. Groups that can then never
 *   complete are resolved at once: emitted when a quorum is still met and nothing more can come, else
 *   evicted per `missing` (`error` naks them; `drop` and `wait` ack them as drops, the wait being over).
 *   Once every parent ended and nothing is held, {@link popReady} returns one `end` group with every EOS
 *   handle (entries: each parent's EOS, or its ABORT, which outranks it).
 * - ABORT surfaces at once: the next {@link popReady} returns an `abort` group for it, ahead of any data.
 *
 * Redelivery: an entry with the identity of one still held replaces it, and the older handle comes back
 * as `superseded` (retire, never settle), so no input is counted twice.
 */
export abstract class GroupAssembler<H = unknown> {
  /** The joining node. */
  readonly nodeName: string;
  /** The node's real parents, in the order entries are laid out. */
  readonly parentNames: readonly string[];
  /** The join policy the groups follow. */
  readonly policy: JoinPolicy;
  /** The clock timeouts are measured on. */
  protected readonly clock: Clock;
  /** Whether more than `max_pending` incomplete groups are kept rather than the oldest evicted. */
  protected readonly lossless: boolean;
  /** Indices of the parents whose EOS was fed, in the order they ended. */
  protected readonly ended: number[] = [];
  /** Per parent, the first EOS fed; defined exactly for the ended parents. */
  protected endOf: (EnvelopeEntry<H> | undefined)[];
  readonly #index: Map<string, number>;
  #abortOf: (EnvelopeEntry<H> | undefined)[];
  #aborts: Member<H>[] = [];
  #eosHeld: Member<H>[] = [];
  readonly #heldData: number[];
  #heldDataTotal = 0;
  #released: Release<H>[] = [];
  #dropped = 0;
  #evictions = 0;

  protected constructor(
    nodeName: string,
    parentNames: readonly string[],
    policy: JoinPolicy,
    options: AssemblerOptions,
  ) {
    this.#index = checkParents(nodeName, parentNames);
    this.nodeName = nodeName;
    this.parentNames = Object.freeze([...parentNames]);
    this.policy = policy;
    this.clock = options.clock ?? systemClock;
    this.lossless = options.lossless ?? false;
    this.endOf = new Array(parentNames.length).fill(undefined);
    this.#abortOf = new Array(parentNames.length).fill(undefined);
    this.#heldData = new Array(parentNames.length).fill(0);
  }

  /**
   * Takes ownership of `entry`, delivered by `parent` (see the class comment for what each entry type does).
   *
   * @throws ConfigError when `parent` is not one of this node's parents.
   */
  add(parent: string, entry: EnvelopeEntry<H>): void {
    const index = this.#index.get(parent);
    if (index === undefined) {
      throw new ConfigError(
        `node ${this.nodeName} has no parent ${JSON.stringify(parent)} (parents: ${
          this.parentNames.join(", ")
        })`,
        "feed the assembler only entries received on the node's parents' subjects",
        { node: this.nodeName, parent },
      );
    }
    switch (entry.type) {
      case MsgType.data:
        this.#heldData[index]++;
        this.#heldDataTotal++;
        this.addData(index, entry);
        return;
      case MsgType.eos:
        this.#addEnd(index, entry);
        return;
      case MsgType.abort:
        this.#addAbort(index, entry);
        return;
    }
  }

  /**
   * The next group for the node, or `null`: an ABORT first, then data groups in the order they became
   * ready, then (once every parent ended and nothing else is held) the end group. Does not apply timeouts:
   * call {@link sweep} for that.
   */
  popReady(): ReadyGroup<H> | null {
    const abort = this.#aborts.shift();
    if (abort !== undefined) return this.#abortGroup(abort);
    return this.nextData() ?? this.#endGroup();
  }

  /** Everything given back outside a ready group since the last call, oldest first. */
  takeReleased(): Release<H>[] {
    const released = this.#released;
    this.#released = [];
    return released;
  }

  /**
   * Inputs given up on (released with {@link Settlement.ack}) since the last call, under the messenger's
   * drop reason: `{join_evicted: n}`, or `{}` when there were none.
   */
  takeDrops(): Record<string, number> {
    const dropped = this.#dropped;
    this.#dropped = 0;
    return dropped > 0 ? { [DropReason.joinEvicted]: dropped } : {};
  }

  /** Evictions so far: groups discarded (timed out, beyond `max_pending`, unfinishable) and collect samples dropped. */
  get evictions(): number {
    return this.#evictions;
  }

  /** Whether a data entry of `parent` is still held anywhere here (the EOS drain check). */
  hasPendingFrom(parent: string): boolean {
    const index = this.#index.get(parent);
    return index !== undefined && this.#heldData[index] > 0;
  }

  /** Handles held right now (data, EOS and ABORT): the deliveries this join keeps unsettled. */
  heldHandles(): number {
    return this.#heldDataTotal + this.#eosHeld.length + this.#aborts.length;
  }

  /**
   * Gives every held handle back ({@link ReleaseReason.handedBack}, nak) and forgets everything, including
   * which parents ended: the flow-wide stop or a quiesce ends the wait and the broker redelivers the rest.
   */
  handBack(): void {
    const members = [...this.takeAllData(), ...this.#aborts, ...this.#eosHeld];
    this.#aborts = [];
    this.#eosHeld = [];
    this.ended.length = 0;
    this.endOf = new Array(this.parentNames.length).fill(undefined);
    this.#abortOf = new Array(this.parentNames.length).fill(undefined);
    this.release(ReleaseReason.handedBack, Settlement.nak, members);
  }

  /** Applies the policy's timeouts (and, for time joins, collect retention) as of the clock's reading. */
  abstract sweep(): void;

  /** Incomplete groups held right now. */
  abstract pendingCount(): number;

  /** Seconds the oldest incomplete group has waited; 0 when none. */
  abstract oldestWaitSeconds(): number;

  /**
   * The monotonic time at which {@link sweep} or {@link popReady} next has something to do on its own (a
   * timeout, a settle hold, a collect sample's retention), or `null` when nothing is scheduled.
   */
  abstract nextDeadline(): number | null;

  /** Groups a data entry of parent `index` (its handle is already counted as held). */
  protected abstract addData(index: number, entry: EnvelopeEntry<H>): void;

  /** The next ready data group, or `null`. */
  protected abstract nextData(): ReadyGroup<H> | null;

  /** Resolves what parent `index` ending decides (called once, after it joined {@link ended}). */
  protected abstract onParentEnded(index: number): void;

  /** Removes and returns every held data member. */
  protected abstract takeAllData(): Member<H>[];

  /** The settlement a group gets when it is given up on: nak under `missing: error`, else ack (a drop). */
  protected get missingSettlement(): Settlement {
    return this.policy.missing === MISSING_ERROR ? Settlement.nak : Settlement.ack;
  }

  /** Counts ended parents for which `has(index)` is false. */
  protected endedAbsent(has: (index: number) => boolean): number {
    let absent = 0;
    for (const index of this.ended) if (!has(index)) absent++;
    return absent;
  }

  /** A data handle of parent `index` leaves with a ready group. */
  protected letGo(index: number): void {
    this.#heldData[index]--;
    this.#heldDataTotal--;
  }

  /** Gives `members` back with `reason` and `settlement` (nothing when empty). */
  protected release(reason: ReleaseReason, settlement: Settlement, members: readonly Member<H>[]): void {
    if (members.length === 0) return;
    for (const { index, entry } of members) if (entry.type === MsgType.data) this.letGo(index);
    this.#released.push({
      reason,
      settlement,
      parents: members.map((m) => this.parentNames[m.index]),
      handles: members.map((m) => m.entry.handle),
    });
    if (settlement === Settlement.ack) this.#dropped += members.length;
    if (reason !== ReleaseReason.superseded && reason !== ReleaseReason.handedBack) this.#evictions++;
  }

  /** Retires `old`, an entry of parent `index` a redelivery replaced. */
  protected supersede(index: number, old: EnvelopeEntry<H>): void {
    this.release(ReleaseReason.superseded, Settlement.retire, [{ index, entry: old }]);
  }

  /** Lays out one value per parent as a record keyed by parent name, in parent order. */
  protected byParent(value: (index: number) => GroupEntry<H>): Record<string, GroupEntry<H>> {
    return Object.fromEntries(this.parentNames.map((name, i) => [name, value(i)]));
  }

  /** An ended or aborted parent's terminal entry (ABORT outranks EOS, ABORT-3); `null` while it runs. */
  #terminal(index: number): EnvelopeEntry<H> | null {
    return this.#abortOf[index] ?? this.endOf[index] ?? null;
  }

  #addEnd(index: number, entry: EnvelopeEntry<H>): void {
    const twin = this.#eosHeld.findIndex((m) => m.index === index && m.entry.traceId === entry.traceId);
    if (twin >= 0) {
      const old = this.#eosHeld[twin].entry;
      this.#eosHeld[twin] = { index, entry };
      this.supersede(index, old);
    } else {
      this.#eosHeld.push({ index, entry });
    }
    if (this.endOf[index] !== undefined) return;
    this.endOf[index] = entry;
    this.ended.push(index);
    this.onParentEnded(index);
  }

  #addAbort(index: number, entry: EnvelopeEntry<H>): void {
    this.#abortOf[index] = entry;
    const twin = this.#aborts.findIndex((m) => m.index === index && m.entry.traceId === entry.traceId);
    if (twin < 0) {
      this.#aborts.push({ index, entry });
      return;
    }
    const old = this.#aborts[twin].entry;
    this.#aborts[twin] = { index, entry };
    this.supersede(index, old);
  }

  #abortGroup({ index, entry }: Member<H>): ReadyGroup<H> {
    return {
      kind: GroupKind.abort,
      traceId: entry.traceId,
      seq: entry.seq,
      eventTs: entry.eventTs,
      entries: this.byParent((i) => i === index ? entry : this.#terminal(i)),
      handles: [entry.handle],
    };
  }

  #endGroup(): ReadyGroup<H> | null {
    if (
      this.ended.length < this.parentNames.length || this.#heldDataTotal > 0 || this.#eosHeld.length === 0
    ) {
      return null;
    }
    const first = this.#terminal(0) as EnvelopeEntry<H>;
    const handles = this.#eosHeld.map((m) => m.entry.handle);
    this.#eosHeld = [];
    return {
      kind: GroupKind.end,
      traceId: first.traceId,
      seq: first.seq,
      eventTs: null,
      entries: this.byParent((i) => this.#terminal(i)),
      handles,
    };
  }
}

/** A trace group being assembled: one slot per parent. */
interface TraceGroup<H> {
  readonly traceId: string;
  /** Monotonic seconds its first entry arrived. */
  readonly createdAt: number;
  readonly slots: (EnvelopeEntry<H> | undefined)[];
  count: number;
}

function slotMembers<H>(slots: readonly (EnvelopeEntry<H> | undefined)[]): Member<H>[] {
  const members: Member<H>[] = [];
  slots.forEach((entry, index) => {
    if (entry !== undefined) members.push({ index, entry });
  });
  return members;
}

/**
 * Groups by exact trace id (spec `TraceGroupAssembler`): a group is ready once every parent delivered its
 * entry with that trace id, and carries forward the shared trace id, the minimum seq and the minimum
 * non-null event time. A group that outlives the timeout is evicted per `missing`; beyond `max_pending`
 * incomplete groups the oldest is evicted as a drop. O(1) per entry.
 */
export class TraceGroupAssembler<H = unknown> extends GroupAssembler<H> {
  /** Incomplete groups by trace id, oldest first. */
  readonly #pending = new Map<string, TraceGroup<H>>();
  /** Complete groups not yet popped, by trace id, in completion order. */
  readonly #staged = new Map<string, TraceGroup<H>>();

  /** @throws ConfigError for duplicate or no parents, or a policy whose mode is not `trace`. */
  constructor(
    nodeName: string,
    parentNames: readonly string[],
    policy: JoinPolicy,
    options: AssemblerOptions = {},
  ) {
    super(nodeName, parentNames, policy, options);
    checkMode(nodeName, policy, JOIN_TRACE, "trace");
  }

  /** Evicts, per `missing`, every group that has waited `timeout_seconds` or more. */
  sweep(): void {
    const timeout = this.policy.timeoutSeconds;
    if (timeout === null) return;
    const now = this.clock.monotonic();
    for (const group of this.#pending.values()) {
      if (group.createdAt + timeout > now) break;
      this.#evict(group, ReleaseReason.timeout, this.missingSettlement);
    }
  }

  pendingCount(): number {
    return this.#pending.size;
  }

  oldestWaitSeconds(): number {
    const oldest = this.#oldest();
    return oldest === undefined ? 0 : Math.max(0, this.clock.monotonic() - oldest.createdAt);
  }

  nextDeadline(): number | null {
    const oldest = this.#oldest();
    const timeout = this.policy.timeoutSeconds;
    return oldest === undefined || timeout === null ? null : oldest.createdAt + timeout;
  }

  protected addData(index: number, entry: EnvelopeEntry<H>): void {
    const staged = this.#staged.get(entry.traceId);
    if (staged !== undefined) {
      this.#place(staged, index, entry);
      return;
    }
    let group = this.#pending.get(entry.traceId);
    if (group === undefined) {
      group = {
        traceId: entry.traceId,
        createdAt: this.clock.monotonic(),
        slots: new Array(this.parentNames.length).fill(undefined),
        count: 0,
      };
      this.#pending.set(entry.traceId, group);
    }
    if (!this.#place(group, index, entry)) return;
    if (group.count === this.parentNames.length) {
      this.#pending.delete(group.traceId);
      this.#staged.set(group.traceId, group);
    } else if (this.ended.length > 0 && this.endedAbsent((i) => group.slots[i] !== undefined) > 0) {
      this.#evict(group, ReleaseReason.parentEnded, this.missingSettlement);
    } else if (!this.lossless && this.#pending.size > this.policy.maxPending) {
      this.#evict(this.#oldest() as TraceGroup<H>, ReleaseReason.maxPending, Settlement.ack);
    }
  }

  protected nextData(): ReadyGroup<H> | null {
    const group = this.#staged.values().next().value;
    if (group === undefined) return null;
    this.#staged.delete(group.traceId);
    const entries = group.slots as EnvelopeEntry<H>[];
    const identity = traceGroupIdentity(entries);
    const handles = entries.map((entry, index) => {
      this.letGo(index);
      return entry.handle;
    });
    return {
      kind: GroupKind.data,
      traceId: identity.traceId,
      seq: identity.seq,
      eventTs: identity.eventTs,
      entries: this.byParent((i) => entries[i]),
      handles,
    };
  }

  protected onParentEnded(index: number): void {
    for (const group of this.#pending.values()) {
      if (group.slots[index] === undefined) {
        this.#evict(group, ReleaseReason.parentEnded, this.missingSettlement);
      }
    }
  }

  protected takeAllData(): Member<H>[] {
    const members = [...this.#pending.values(), ...this.#staged.values()].flatMap((g) =>
      slotMembers(g.slots)
    );
    this.#pending.clear();
    this.#staged.clear();
    return members;
  }

  /** Puts `entry` in its slot; true when the slot was empty, false when it superseded a redelivered one. */
  #place(group: TraceGroup<H>, index: number, entry: EnvelopeEntry<H>): boolean {
    const old = group.slots[index];
    group.slots[index] = entry;
    if (old !== undefined) {
      this.supersede(index, old);
      return false;
    }
    group.count++;
    return true;
  }

  #oldest(): TraceGroup<H> | undefined {
    return this.#pending.values().next().value;
  }

  #evict(group: TraceGroup<H>, reason: ReleaseReason, settlement: Settlement): void {
    this.#pending.delete(group.traceId);
    this.release(reason, settlement, slotMembers(group.slots));
  }
}

/**
 * The trace assembler of a node with one parent: every data entry is a complete group the moment it
 * arrives, so it is staged as it is, with no pending group, no slots and no clock reading. It gives what a
 * {@link TraceGroupAssembler} over that one parent gives (the same groups in the same order, a redelivery
 * of a staged entry superseding it in place, the same end group and hand-back), except that two messages
 * sharing a trace id with different seqs are two groups here, as a reference worker makes them; nothing is
 * ever incomplete, so nothing times out, is evicted or waits on the parent's end.
 */
export class SingleParentAssembler<H = unknown> extends GroupAssembler<H> {
  /**
   * Entries not yet popped, in arrival order, by their redelivery identity (producer, trace id, seq): a
   * redelivery supersedes its staged copy, while two messages that share a trace id (a reference producer's
   * outputs may) are two groups.
   */
  readonly #staged = new Map<string, EnvelopeEntry<H>>();

  /** @throws ConfigError for other than one parent, or a policy whose mode is not `trace`. */
  constructor(
    nodeName: string,
    parentNames: readonly string[],
    policy: JoinPolicy,
    options: AssemblerOptions = {},
  ) {
    super(nodeName, parentNames, policy, options);
    checkMode(nodeName, policy, JOIN_TRACE, "trace");
    if (parentNames.length !== 1) {
      throw new ConfigError(
        `node ${nodeName}: a single-parent assembler needs exactly one parent, got ${parentNames.length}`,
        "build assemblers with makeAssembler(), which picks the assembler from the parents and the policy",
        { node: nodeName },
      );
    }
  }

  /** Nothing to time out: every group is complete. */
  sweep(): void {}

  pendingCount(): number {
    return 0;
  }

  oldestWaitSeconds(): number {
    return 0;
  }

  nextDeadline(): number | null {
    return null;
  }

  protected addData(_index: number, entry: EnvelopeEntry<H>): void {
    const key = memberKey(0, entry);
    const old = this.#staged.get(key);
    this.#staged.set(key, entry);
    if (old !== undefined) this.supersede(0, old);
  }

  protected nextData(): ReadyGroup<H> | null {
    const first = this.#staged.entries().next().value;
    if (first === undefined) return null;
    const [key, entry] = first;
    this.#staged.delete(key);
    this.letGo(0);
    return {
      kind: GroupKind.data,
      traceId: entry.traceId,
      seq: entry.seq,
      eventTs: entry.eventTs,
      entries: { [this.parentNames[0]]: entry },
      handles: [entry.handle],
    };
  }

  /** Nothing held lacks the parent: its end evicts nothing. */
  protected onParentEnded(_index: number): void {}

  protected takeAllData(): Member<H>[] {
    const members = [...this.#staged.values()].map((entry) => ({ index: 0, entry }));
    this.#staged.clear();
    return members;
  }
}

/** A synchronized member of a time group. */
interface TimeMember<H> extends TimeGroupMember {
  readonly entry: EnvelopeEntry<H>;
  /** Its redelivery identity: parent, producer, trace id and seq. */
  readonly key: string;
}

/** A time group being assembled. */
interface TimeGroup<H> {
  /** Effective time of the member that seeded it: its place in the anchor index. */
  readonly anchor: number;
  /** Monotonic seconds it was seeded (its timeout counts from here). */
  readonly createdAt: number;
  /** Smallest and largest effective member time (event time, else arrival time). */
  minTs: number;
  maxTs: number;
  /** One slot per parent; a collect parent's slot stays empty. */
  readonly slots: (TimeMember<H> | undefined)[];
  count: number;
  /** While settling: monotonic seconds the settle hold ends. */
  readyAt: number;
}

/** A buffered sample of a collect parent. */
interface Sample<H> {
  entry: EnvelopeEntry<H>;
  /** Effective time: event time, else arrival time. */
  readonly ts: number;
  /** Monotonic seconds it arrived; it is dropped at `arrivedAt + collectRetentionSeconds`. */
  readonly arrivedAt: number;
  readonly key: string;
  /** A group took its handle; it stays for later groups whose window it also falls in. */
  claimed: boolean;
  /** It arrived with an earlier time than the sample before it (the buffer is then not time-sorted). */
  readonly inverted: boolean;
}

/** A collect parent's samples, in arrival order; bounded, expiring from the front. */
interface CollectBuffer<H> {
  readonly index: number;
  /** The parent's window, in seconds. */
  readonly window: number;
  readonly samples: Fifo<Sample<H>>;
  readonly byKey: Map<string, Sample<H>>;
  /** Samples present that arrived out of time order; 0 means the buffer is sorted by time. */
  inversions: number;
}

function memberKey(index: number, entry: EnvelopeEntry<unknown>): string {
  return `${index}\u0000${entry.producerName}\u0000${entry.traceId}\u0000${entry.seq}`;
}

/** The first position in `groups` (sorted by anchor) whose anchor is >= `anchor`. */
function lowerBound<H>(groups: readonly TimeGroup<H>[], anchor: number): number {
  let lo = 0;
  let hi = groups.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (groups[mid].anchor < anchor) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** The first position in a time-sorted sample buffer whose time is >= `ts`. */
function firstSampleAtOrAfter<H>(samples: Fifo<Sample<H>>, ts: number): number {
  let lo = 0;
  let hi = samples.size;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (samples.at(mid).ts < ts) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * Groups by event time (spec `TimeGroupAssembler`). An entry of a synchronized parent joins the pending
 * group nearest its time that lacks that parent and stays within `tolerance_ms` end to end with it;
 * otherwise it seeds a new group. An entry without `event_ts` is placed by its arrival time (wall clock).
 *
 * A group is ready when every synchronized parent is present — held for the largest collect window first,
 * while a collect parent still runs — or, at the timeout, when at least `quorum` are (the rest emit as
 * `null`); below that it is evicted per `missing`. Its identity is {@link timeGroupIdentity} over its
 * synchronized members, so a replay of the same members yields the same trace id and seq.
 *
 * Collect parents' samples are buffered (at most {@link JoinPolicy.collectBufferCapacity}, the oldest going
 * first) and attached when a group is emitted: every sample within the parent's window of the group's
 * time, oldest first. A sample's handle leaves with the first group that claims it; a sample no group
 * claimed is dropped after {@link JoinPolicy.collectRetentionSeconds}.
 */
export class TimeGroupAssembler<H = unknown> extends GroupAssembler<H> {
  readonly #tolerance: number;
  /** Synchronized members a group needs to be emitted at the timeout (all of them without a quorum). */
  readonly #quorum: number;
  readonly #sync: number[];
  readonly #buffers: (CollectBuffer<H> | undefined)[];
  /** Incomplete groups in the order they were seeded. */
  readonly #pending = new Set<TimeGroup<H>>();
  /** Incomplete groups sorted by anchor. */
  readonly #byAnchor: TimeGroup<H>[] = [];
  readonly #settling = new Fifo<TimeGroup<H>>();
  readonly #ready = new Fifo<TimeGroup<H>>();
  /** Member key to the group holding it, for every group not yet emitted. */
  readonly #byMember = new Map<string, TimeGroup<H>>();

  /**
   * @throws ConfigError for duplicate or no parents, a policy whose mode is not `time`, collect windows
   * naming non-parents, no synchronized parent, or a quorum above the synchronized parents.
   */
  constructor(
    nodeName: string,
    parentNames: readonly string[],
    policy: JoinPolicy,
    options: AssemblerOptions = {},
  ) {
    super(nodeName, parentNames, policy, options);
    checkMode(nodeName, policy, JOIN_TIME, "time");
    const strangers = Object.keys(policy.collect).filter((name) => !parentNames.includes(name));
    const sync = policy.syncParents(parentNames);
    const quorum = policy.quorum ?? sync.length;
    if (strangers.length > 0 || sync.length === 0 || quorum > sync.length) {
      throw new ConfigError(
        `node ${nodeName}: join policy does not fit parents ${parentNames.join(", ")}: collect ${
          JSON.stringify(policy.collect)
        }, quorum ${policy.quorum}`,
        "key collect by parent names, keep at least one parent synchronized, and set quorum to at most the " +
          "number of synchronized parents",
        { node: nodeName },
      );
    }
    this.#tolerance = (policy.toleranceMs as number) / 1000;
    this.#quorum = quorum;
    this.#sync = sync.map((name) => parentNames.indexOf(name));
    this.#buffers = parentNames.map((name, index) =>
      Object.hasOwn(policy.collect, name)
        ? { index, window: policy.collect[name] / 1000, samples: new Fifo(), byKey: new Map(), inversions: 0 }
        : undefined
    );
  }

  /**
   * Applies the timeout to pending groups (emitted with a quorum, else evicted per `missing`) and drops
   * collect samples past their retention.
   */
  sweep(): void {
    const now = this.clock.monotonic();
    const timeout = this.policy.timeoutSeconds;
    if (timeout !== null) {
      for (const group of this.#pending) {
        if (group.createdAt + timeout > now) break;
        if (group.count >= this.#quorum) this.#toReady(group);
        else this.#evict(group, ReleaseReason.timeout, this.missingSettlement);
      }
    }
    const retention = this.policy.collectRetentionSeconds;
    for (const buffer of this.#buffers) {
      if (buffer === undefined) continue;
      const expired: Member<H>[] = [];
      for (
        let s = buffer.samples.peek();
        s !== undefined && s.arrivedAt + retention <= now;
        s = buffer.samples.peek()
      ) {
        this.#dropFront(buffer, expired);
      }
      this.release(ReleaseReason.collectExpired, Settlement.ack, expired);
    }
  }

  pendingCount(): number {
    return this.#pending.size;
  }

  oldestWaitSeconds(): number {
    const oldest = this.#oldest();
    return oldest === undefined ? 0 : Math.max(0, this.clock.monotonic() - oldest.createdAt);
  }

  nextDeadline(): number | null {
    const deadlines: number[] = [];
    const oldest = this.#oldest();
    const timeout = this.policy.timeoutSeconds;
    if (oldest !== undefined && timeout !== null) deadlines.push(oldest.createdAt + timeout);
    const settling = this.#settling.peek();
    if (settling !== undefined) deadlines.push(settling.readyAt);
    for (const buffer of this.#buffers) {
      const front = buffer?.samples.peek();
      if (front !== undefined) deadlines.push(front.arrivedAt + this.policy.collectRetentionSeconds);
    }
    return deadlines.length === 0 ? null : Math.min(...deadlines);
  }

  protected addData(index: number, entry: EnvelopeEntry<H>): void {
    const arrivalTs = this.clock.now();
    const ts = entry.eventTs ?? arrivalTs;
    const key = memberKey(index, entry);
    const buffer = this.#buffers[index];
    if (buffer !== undefined) {
      this.#addSample(buffer, entry, ts, key);
      return;
    }
    const holder = this.#byMember.get(key);
    if (holder !== undefined) {
      const old = holder.slots[index] as TimeMember<H>;
      holder.slots[index] = { ...old, entry };
      this.supersede(index, old.entry);
      return;
    }
    const group = this.#nearest(index, ts) ?? this.#seed(ts);
    group.slots[index] = {
      producer: entry.producerName,
      traceId: entry.traceId,
      seq: entry.seq,
      eventTs: entry.eventTs,
      arrivalTs,
      entry,
      key,
    };
    group.count++;
    if (ts < group.minTs) group.minTs = ts;
    if (ts > group.maxTs) group.maxTs = ts;
    this.#byMember.set(key, group);
    this.#decide(group);
    if (!this.lossless && this.#pending.size > this.policy.maxPending) {
      this.#evict(this.#oldest() as TimeGroup<H>, ReleaseReason.maxPending, Settlement.ack);
    }
  }

  protected nextData(): ReadyGroup<H> | null {
    const now = this.clock.monotonic();
    for (let g = this.#settling.peek(); g !== undefined && g.readyAt <= now; g = this.#settling.peek()) {
      this.#settling.shift();
      this.#ready.push(g);
    }
    const group = this.#ready.shift();
    if (group === undefined) {
      this.#dropUnclaimable();
      return null;
    }
    const ready = this.#emit(group);
    this.#dropUnclaimable();
    return ready;
  }

  protected onParentEnded(index: number): void {
    if (this.#buffers[index] === undefined) {
      for (const group of this.#pending) this.#decide(group);
    } else if (this.#buffers.every((b) => b === undefined || this.endOf[b.index] !== undefined)) {
      for (let g = this.#settling.shift(); g !== undefined; g = this.#settling.shift()) this.#ready.push(g);
    }
    this.#dropUnclaimable();
  }

  protected takeAllData(): Member<H>[] {
    const groups = [...this.#pending, ...this.#settling.drain(), ...this.#ready.drain()];
    const members = groups.flatMap((g) => this.#members(g));
    for (const buffer of this.#buffers) {
      if (buffer === undefined) continue;
      for (const sample of buffer.samples.drain()) {
        if (!sample.claimed) members.push({ index: buffer.index, entry: sample.entry });
      }
      buffer.byKey.clear();
      buffer.inversions = 0;
    }
    this.#pending.clear();
    this.#byAnchor.length = 0;
    this.#byMember.clear();
    return members;
  }

  #oldest(): TimeGroup<H> | undefined {
    return this.#pending.values().next().value;
  }

  #members(group: TimeGroup<H>): Member<H>[] {
    const members: Member<H>[] = [];
    group.slots.forEach((member, index) => {
      if (member !== undefined) members.push({ index, entry: member.entry });
    });
    return members;
  }

  /** The pending group an entry of parent `index` at time `ts` joins, or undefined when none fits. */
  #nearest(index: number, ts: number): TimeGroup<H> | undefined {
    const tolerance = this.#tolerance;
    let best: TimeGroup<H> | undefined;
    let bestDistance = Infinity;
    for (let i = lowerBound(this.#byAnchor, ts - tolerance); i < this.#byAnchor.length; i++) {
      const group = this.#byAnchor[i];
      if (group.anchor > ts + tolerance) break;
      if (group.slots[index] !== undefined) continue;
      if (Math.max(group.maxTs, ts) - Math.min(group.minTs, ts) > tolerance) continue;
      const distance = Math.abs(ts - group.minTs);
      if (distance < bestDistance) {
        best = group;
        bestDistance = distance;
      }
    }
    return best;
  }

  #seed(ts: number): TimeGroup<H> {
    const group: TimeGroup<H> = {
      anchor: ts,
      createdAt: this.clock.monotonic(),
      minTs: ts,
      maxTs: ts,
      slots: new Array(this.parentNames.length).fill(undefined),
      count: 0,
      readyAt: 0,
    };
    this.#pending.add(group);
    let at = lowerBound(this.#byAnchor, ts);
    while (at < this.#byAnchor.length && this.#byAnchor[at].anchor === ts) at++;
    this.#byAnchor.splice(at, 0, group);
    return group;
  }

  /** Takes a pending group out of the pending set and the anchor index. */
  #unpend(group: TimeGroup<H>): void {
    this.#pending.delete(group);
    let at = lowerBound(this.#byAnchor, group.anchor);
    while (this.#byAnchor[at] !== group) at++;
    this.#byAnchor.splice(at, 1);
  }

  /** Moves a pending group on when it completed, or when ended parents decided its fate. */
  #decide(group: TimeGroup<H>): void {
    const sync = this.#sync.length;
    if (group.count === sync) {
      this.#unpend(group);
      if (this.#settleHold()) {
        group.readyAt = this.clock.monotonic() + this.policy.settleSeconds;
        this.#settling.push(group);
      } else {
        this.#ready.push(group);
      }
      return;
    }
    if (this.ended.length === 0) return;
    const gone = this.endedAbsent((i) => this.#buffers[i] !== undefined || group.slots[i] !== undefined);
    const coming = sync - group.count - gone;
    if (group.count + coming < this.#quorum) {
      this.#evict(group, ReleaseReason.parentEnded, this.missingSettlement);
    } else if (coming === 0) {
      this.#toReady(group);
    }
  }

  /** Whether a completed group waits for trailing collect samples: some collect parent is still running. */
  #settleHold(): boolean {
    return this.policy.settleSeconds > 0 &&
      this.#buffers.some((b) => b !== undefined && this.endOf[b.index] === undefined);
  }

  #toReady(group: TimeGroup<H>): void {
    this.#unpend(group);
    this.#ready.push(group);
  }

  #evict(group: TimeGroup<H>, reason: ReleaseReason, settlement: Settlement): void {
    this.#unpend(group);
    for (const member of group.slots) if (member !== undefined) this.#byMember.delete(member.key);
    this.release(reason, settlement, this.#members(group));
  }

  #emit(group: TimeGroup<H>): ReadyGroup<H> {
    const members = new Map<string, TimeMember<H>>();
    const handles: H[] = [];
    group.slots.forEach((member, index) => {
      if (member === undefined) return;
      members.set(this.parentNames[index], member);
      handles.push(member.entry.handle);
      this.#byMember.delete(member.key);
      this.letGo(index);
    });
    const identity = timeGroupIdentity(members);
    const entries = this.byParent((index) => {
      const buffer = this.#buffers[index];
      if (buffer === undefined) return group.slots[index]?.entry ?? null;
      return this.#collect(buffer, identity.eventTs as number, handles);
    });
    return {
      kind: GroupKind.data,
      traceId: identity.traceId,
      seq: identity.seq,
      eventTs: identity.eventTs,
      entries,
      handles,
    };
  }

  /** The window of `buffer` around time `t`, oldest first; claims unclaimed samples into `handles`. */
  #collect(buffer: CollectBuffer<H>, t: number, handles: H[]): CollectEntry {
    const window: Sample<H>[] = [];
    const samples = buffer.samples;
    if (buffer.inversions === 0) {
      for (let i = firstSampleAtOrAfter(samples, t - buffer.window); i < samples.size; i++) {
        const sample = samples.at(i);
        if (sample.ts > t + buffer.window) break;
        window.push(sample);
      }
    } else {
      for (let i = 0; i < samples.size; i++) {
        const sample = samples.at(i);
        if (Math.abs(sample.ts - t) <= buffer.window) window.push(sample);
      }
      window.sort((a, b) => a.ts - b.ts);
    }
    for (const sample of window) {
      if (sample.claimed) continue;
      sample.claimed = true;
      handles.push(sample.entry.handle);
      this.letGo(buffer.index);
    }
    return {
      kind: "collect",
      message: window.map((s) => s.entry.message),
      metadata: window.map((s) => s.entry.metadata),
      eventTs: window.map((s) => s.entry.eventTs),
      isStopSignal: false,
      isAbort: false,
    };
  }

  #addSample(buffer: CollectBuffer<H>, entry: EnvelopeEntry<H>, ts: number, key: string): void {
    const twin = buffer.byKey.get(key);
    if (twin !== undefined) {
      if (twin.claimed) twin.claimed = false;
      else this.supersede(buffer.index, twin.entry);
      twin.entry = entry;
      return;
    }
    if (buffer.samples.size >= this.policy.collectBufferCapacity) {
      const overflow: Member<H>[] = [];
      this.#dropFront(buffer, overflow);
      this.release(ReleaseReason.collectOverflow, Settlement.ack, overflow);
    }
    const last = buffer.samples.size > 0 ? buffer.samples.at(buffer.samples.size - 1) : undefined;
    const inverted = last !== undefined && ts < last.ts;
    if (inverted) buffer.inversions++;
    const sample: Sample<H> = { entry, ts, arrivedAt: this.clock.monotonic(), key, claimed: false, inverted };
    buffer.samples.push(sample);
    buffer.byKey.set(key, sample);
    this.#dropUnclaimable();
  }

  /** Removes the oldest sample of `buffer`, adding it to `dropped` when no group had claimed it. */
  #dropFront(buffer: CollectBuffer<H>, dropped: Member<H>[]): void {
    const sample = buffer.samples.shift() as Sample<H>;
    buffer.byKey.delete(sample.key);
    if (sample.inverted) buffer.inversions--;
    if (!sample.claimed) dropped.push({ index: buffer.index, entry: sample.entry });
  }

  /**
   * Once every synchronized parent ended and no group is left to claim them, unclaimed collect samples can
   * never be claimed: they go at once (as drops) instead of holding their parent's drain for the retention.
   */
  #dropUnclaimable(): void {
    if (
      this.#pending.size + this.#settling.size + this.#ready.size > 0 ||
      !this.#sync.every((i) => this.endOf[i] !== undefined)
    ) return;
    for (const buffer of this.#buffers) {
      if (buffer === undefined) continue;
      const dropped: Member<H>[] = [];
      while (buffer.samples.size > 0) this.#dropFront(buffer, dropped);
      this.release(ReleaseReason.parentEnded, Settlement.ack, dropped);
    }
  }
}

/**
 * The assembler a join policy calls for (spec `make_assembler`): a {@link TimeGroupAssembler} for mode
 * `time`, else a {@link SingleParentAssembler} for one parent and a {@link TraceGroupAssembler} for more.
 *
 * @throws ConfigError when the parents or the policy do not fit (see the assemblers' constructors).
 */
export function makeAssembler<H = unknown>(
  nodeName: string,
  parentNames: readonly string[],
  policy: JoinPolicy,
  options: AssemblerOptions = {},
): GroupAssembler<H> {
  if (policy.mode === JOIN_TIME) return new TimeGroupAssembler<H>(nodeName, parentNames, policy, options);
  return parentNames.length === 1
    ? new SingleParentAssembler<H>(nodeName, parentNames, policy, options)
    : new TraceGroupAssembler<H>(nodeName, parentNames, policy, options);
}
