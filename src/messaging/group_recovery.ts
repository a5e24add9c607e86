/**
 * The messenger's join-group recovery (story 1): a time-join group handed to the node over a durable
 * ledger is persisted until its inputs settle, and a replacement re-forms each group its predecessor
 * persisted from that group's redelivered members, so the node sees the same group again.
 *
 * It guarantees: the group in hand is persisted with each member's identity and delivery token before the
 * node sees it, and closed once its inputs are acked or failed; a redelivered member of a persisted group is held here, not joined anew (a newer attempt
 * of the same member retires the older one); a group whose members all came back is handed out before
 * anything new, with the persisted group id, its seq and its earliest event time; after
 * {@link RECOVERY_WAIT_ACK_WAITS} ack waits (a crashed predecessor's leases lapse after one), or when a
 * parent drains or the replica hands back, the members still waiting go to the join, whose own rules
 * resolve them.
 *
 * @module
 */

import type { Clock } from "../backends/clock.ts";
import type { Delivery } from "../backends/messaging.ts";
import type { FlowRuntime, RecoveryRecord } from "../backends/runtime.ts";
import type { Seq } from "../wire/identities.ts";
import { type CollectEntry, type EnvelopeEntry, GroupKind, type ReadyGroup } from "./grouping.ts";

/**
 * How many ack waits a replacement holds the redelivered members of a join group its predecessor persisted
 * before giving up on the rest and letting the join's own rules group them: a crashed predecessor's leases
 * lapse after one.
 */
export const RECOVERY_WAIT_ACK_WAITS = 2;

/** A join group persisted before a replacement's restart (story 1), re-formed from its redelivered members. */
interface RecoveredGroup<H> {
  readonly groupId: string;
  /** Parent name to the member key it waits for. */
  readonly wanted: ReadonlyMap<string, string>;
  readonly arrived: Map<string, EnvelopeEntry<H>>;
}

/** The facts that name a member of a join group: who made it and its identity. */
export interface MemberFacts {
  /** The node that made the member. */
  readonly producerName: string;
  /** The member's trace id. */
  readonly traceId: string;
  /** The member's seq. */
  readonly seq: Seq;
}

/** How a {@link GroupRecovery} re-forms groups. */
export interface GroupRecoveryOptions<H> {
  /** The node's ledger, which keeps the persisted groups. */
  readonly runtime: FlowRuntime;
  /** The join's parents in `.from()` order. */
  readonly parentNames: readonly string[];
  /** The parents the join collects (their entry in a re-formed group is an empty window). */
  readonly collect: Readonly<Record<string, unknown>>;
  /** Retires a delivery a newer attempt of the same member replaced (no broker settlement). */
  readonly retire: (handle: H) => void;
  /** Where time comes from (the recovery deadline). */
  readonly clock: Clock;
}

function memberKey(parent: string, producer: string, traceId: string, seq: Seq): string {
  return `${parent}\u0000${producer}\u0000${traceId}\u0000${seq}`;
}

/** One replacement's persisted join groups, re-formed from their members' handles (`H`). */
export class GroupRecovery<H extends { readonly delivery: Delivery }> {
  readonly #runtime: FlowRuntime;
  readonly #parentNames: readonly string[];
  readonly #collect: Readonly<Record<string, unknown>>;
  readonly #retire: (handle: H) => void;
  readonly #clock: Clock;
  readonly #recovered = new Map<string, RecoveredGroup<H>>();
  readonly #recoveredReady: ReadyGroup<H>[] = [];
  /** When recovered groups whose members did not all come back are handed to the join instead. */
  #recoveryDeadline = 0;
  /** The persisted group of the group in hand, closed once its inputs settle. */
  #persistedGroup: string | null = null;

  /** Holds no group until {@link restore}. */
  constructor(options: GroupRecoveryOptions<H>) {
    this.#runtime = options.runtime;
    this.#parentNames = options.parentNames;
    this.#collect = options.collect;
    this.#retire = options.retire;
    this.#clock = options.clock;
  }

  /** Waits for the members of the open groups a predecessor persisted, for {@link RECOVERY_WAIT_ACK_WAITS} ack waits. */
  restore(records: readonly RecoveryRecord[], ackWaitSeconds: number): void {
    for (const record of records) {
      const wanted = new Map<string, string>();
      for (const [parent, member] of record.members) {
        wanted.set(parent, memberKey(parent, member.producer, member.traceId, member.seq));
      }
      const group: RecoveredGroup<H> = { groupId: record.groupId, wanted, arrived: new Map() };
      for (const key of wanted.values()) this.#recovered.set(key, group);
    }
    this.#recoveryDeadline = this.#clock.monotonic() + RECOVERY_WAIT_ACK_WAITS * ackWaitSeconds;
  }

  /** Whether a recovered group still waits for a member. */
  get waiting(): boolean {
    return this.#recovered.size > 0;
  }

  /** Whether groups still wait and their wait is over (their members then go to the join). */
  expired(): boolean {
    return this.#recovered.size > 0 && this.#clock.monotonic() >= this.#recoveryDeadline;
  }

  /** Holds `entry` when a recovered group waits for it (true), else leaves it to the join (false). */
  claim(parent: string, member: MemberFacts, entry: EnvelopeEntry<H>): boolean {
    if (this.#recovered.size === 0) return false;
    const recovered = this.#recovered.get(memberKey(parent, member.producerName, member.traceId, member.seq));
    if (recovered === undefined) return false;
    this.#recover(recovered, parent, entry);
    return true;
  }

  /** The next re-formed group, complete, to hand out before anything new. */
  nextReady(): ReadyGroup<H> | undefined {
    return this.#recoveredReady.shift();
  }

  /** Every re-formed group not handed out yet, which is then no longer held here. */
  takeReady(): ReadyGroup<H>[] {
    return this.#recoveredReady.splice(0);
  }

  /** Hands every recovered member still waiting to `join`, so the normal rules resolve it. */
  release(join: (parent: string, entry: EnvelopeEntry<H>) => void): void {
    for (const group of new Set(this.#recovered.values())) {
      for (const [parent, entry] of group.arrived) join(parent, entry);
    }
    this.#recovered.clear();
  }

  /** Persists a time-join group handed to the node over a durable ledger, until its inputs settle. */
  async persist(group: ReadyGroup<H>): Promise<void> {
    const members: Record<string, { producer: string; traceId: string; seq: Seq }> = {};
    const tokens: Record<string, string> = {};
    for (const [parent, entry] of Object.entries(group.entries)) {
      if (entry === null || entry.kind === "collect") continue;
      members[parent] = { producer: entry.producerName, traceId: entry.traceId, seq: entry.seq };
      tokens[parent] = `${entry.handle.delivery.token.messageId}#${entry.handle.delivery.token.attempt}`;
    }
    await this.#runtime.persistGroup(group.traceId, members, tokens);
    this.#persistedGroup = group.traceId;
  }

  /** The persisted group of the group in hand, which its ack closes; none is held here any more. */
  takePersisted(): string | null {
    const groupId = this.#persistedGroup;
    this.#persistedGroup = null;
    return groupId;
  }

  /** Closes the persisted join group of the group just settled (its inputs are acked or failed). */
  async closePersisted(): Promise<void> {
    const groupId = this.#persistedGroup;
    if (groupId === null) return;
    this.#persistedGroup = null;
    await this.#runtime.settleGroup(groupId);
  }

  /** Holds a member of a recovered group; the complete group is handed out before anything new. */
  #recover(group: RecoveredGroup<H>, parent: string, entry: EnvelopeEntry<H>): void {
    const old = group.arrived.get(parent);
    if (old !== undefined) this.#retire(old.handle);
    group.arrived.set(parent, entry);
    if (group.arrived.size < group.wanted.size) return;
    for (const key of group.wanted.values()) this.#recovered.delete(key);
    const members = [...group.arrived.values()];
    const seqText = /^tw-(\d+)-/.exec(group.groupId)?.[1];
    const eventTimes = members.map((m) => m.eventTs).filter((ts): ts is number => ts !== null);
    this.#recoveredReady.push({
      kind: GroupKind.data,
      traceId: group.groupId,
      seq: seqText === undefined ? members[0].seq : BigInt(seqText),
      eventTs: eventTimes.length === 0 ? null : Math.min(...eventTimes),
      entries: Object.fromEntries(this.#parentNames.map((name) => {
        const member = group.arrived.get(name);
        if (member !== undefined) return [name, member];
        const collect: CollectEntry = {
          kind: "collect",
          message: [],
          metadata: [],
          eventTs: [],
          isStopSignal: false,
          isAbort: false,
        };
        return [name, Object.hasOwn(this.#collect, name) ? collect : null];
      })),
      handles: members.map((m) => m.handle),
    });
  }
}
