/**
 * The in-memory MessagingBackend (spec backends.memory.messaging): a faithful model of a JetStream-like
 * broker (and, with `coreOnly`, of Core NATS) under an injected clock. It is the executable specification
 * of the contract in `../messaging.ts`, the provider every conformance scenario runs against first, and the
 * embedded broker of `run-local`.
 *
 * What it models, because the conformance cases turn on it:
 * - Retention. A `limits` channel keeps at most `maxMsgs` messages (and `maxBytes`, and `maxAgeSeconds`) in
 *   the run's slot, data and EOS sharing it unless `perSubjectLimits`; when full it evicts the oldest,
 *   recording a drop for every subscription that had not settled it, or rejects the publication. An
 *   `interest` channel keeps a message until every required (and every bound) subscription of its kind has
 *   settled it.
 * - Leases and redelivery. A delivery is leased for `ackWaitSeconds`; an expired lease redelivers with
 *   attempt + 1 until `maxDeliver` (-1: unlimited). Past the cap the message is unresolved: retained,
 *   undeliverable and reported as such, never as "0 pending" (MSG-012). A redelivery supersedes the earlier
 *   token: settling that one is SettleStale without touching the broker (MSG-011).
 * - Credit. A subscription's `itemCredit` caps its leased messages, shared by every replica competing on
 *   it; `byteCredit` bounds the bytes one receive hands out (the last delivery may overshoot by one message).
 *   With `byteBudget`, this client holds at most that many leased bytes before its receives pause (RUN-025),
 *   again overshooting by one message at most.
 * - Dedup. A publication id seen within the channel's window is accepted as a duplicate and stored once;
 *   beyond it a retry is a new message.
 * - Ambiguous acceptance. {@link MemoryMessagingBackend.pauseAcceptance} holds publications so a caller's
 *   deadline expires with the outcome unknown; {@link MemoryMessagingBackend.resumeAcceptance} then stores
 *   them (late acceptance) unless {@link MemoryMessagingBackend.cancelPublication} removed them first.
 *   `observePublication` resolves an unknown publication inside the window (an idempotent re-publish) and is
 *   Unresolvable beyond it.
 * - Truthful observation. {@link MemoryMessagingBackend.failObservation} makes a subscription's observations
 *   Unknown; nothing here turns a failed read into zero.
 * - Core-only mode: no retention, no leases, no dedup; bounded client queues whose overflow is a recorded
 *   slow-consumer drop; nothing for a subscription that was not attached at publish time.
 * - Subjects. A subscription sees only messages of its own kind. A dead letter (kind `dlq`) is kept by the
 *   flow's DLQ retention, apart from the run's channels: it never occupies, evicts or fills a run slot and
 *   it outlives `close`.
 * - Archive. With `archive`, a data envelope stays replayable by event id for `archiveHorizonSeconds`, past
 *   the close of its run's channels.
 *
 * Fault barriers (`../faults.ts`): `message.publish.before/after` (data and EOS), `dlq.publish.before/after`
 * (dead letters), `message.receive.after`, `message.settle.before/after`, `message.renew.before`, and
 * `broker.observe.after` for every observation and for the inventory read of `close`. A DropResponse at an
 * `after` barrier turns the outcome into its Unknown form; at `broker.observe.after` in `close` it is a
 * failed listing (nothing deleted). With no schedule installed no barrier is awaited at all.
 *
 * The no-fault path is built for throughput: queues are ring buffers, tokens carry a private link to their
 * lease so settling one is a field read, a subscription's outstanding messages are sequence-ordered arrays,
 * the duplicate window is an open-addressing table of its own (no record per id), and a publish allocates
 * one stored record plus one lease record per subscription. {@link MemoryMessagingBackend.publishNow} and
 * {@link MemoryMessagingBackend.settleNow} decide on the spot what `publish` and `settle` would resolve
 * with, for a host serving many calls per turn (the embedded broker).
 *
 * @example
 * ```ts
 * import { FakeClock } from "./clock.ts";
 * import { completed, subscriptionId } from "../messaging.ts";
 * const clock = new FakeClock();
 * const broker = new MemoryMessagingBackend({ clock });
 * const spec = makeChannel("f", "r", "cam", "reliable_work", "interest");
 * await broker.ensureChannel(spec, "op-1");
 * await broker.ensureSubscription(makeSubscription(spec.id, "detect"), "op-2");
 * await broker.publish(makeEnvelope(spec.id, "p-1"), clock.monotonic() + 5);
 * const [delivery] = await broker.receive(subscriptionId(spec.id, "detect"), 8, 1 << 20, clock.monotonic());
 * const settled = await broker.settle(delivery.token, completed(), "s-1");
 * console.log(settled.kind); // "settle_confirmed"
 * ```
 *
 * @module
 */

import { requireCount, requireSeconds } from "../../core/checks.ts";
import { ConfigError, IncompatibleProfile, ResourceUnavailable } from "../../core/errors.ts";
import { DropReason } from "../../core/metrics.ts";
import { ENVELOPE_VERSION } from "../../wire/codec.ts";
import {
  type MessagingCapabilities,
  messagingCapabilities,
  type MessagingProfile,
  PublicationLedger,
  Retention,
} from "../capabilities.ts";
import { type Clock, systemClock, type TimerHandle } from "../clock.ts";
import { Barrier, barrier, type BarrierContext, faultsInstalled } from "../faults.ts";
import { hasOwnerLabels, type OwnerMetadata, owns } from "../identity.ts";
import {
  type ChannelId,
  channelId,
  channelKey,
  type ChannelObservation,
  type ChannelSpec,
  channelSpec,
  checkSettlement,
  type CreditRequest,
  type Delivery,
  type DeliveryToken,
  type Envelope,
  envelope,
  type EnvelopeInit,
  type LeaseObservation,
  leaseObservation,
  MessageKind,
  type MessagingBackend,
  Overflow,
  type PublishCredit,
  type Settlement,
  type SettlementOutcome,
  type SettleRequest,
  type SubscriptionId,
  subscriptionId,
  subscriptionKey,
  type SubscriptionKind,
  type SubscriptionObservation,
  type SubscriptionSpec,
  subscriptionSpec,
  type VerifiedChannel,
  type VerifiedSubscription,
} from "../messaging.ts";
import { streamNameFor } from "../names.ts";
import { ChannelCredit, type CreditHolder, NO_CREDIT } from "./publish_credit.ts";
import type { ObservationLog } from "../observation.ts";
import {
  accepted,
  type CleanupObservation,
  cleanupObservation,
  DURABILITY_MEMORY,
  known,
  type Observation,
  type PublicationOutcome,
  publicationUnknown,
  publicationUnresolvable,
  rejected,
  settleConfirmed,
  settleStale,
  settleUnknown,
  unknown,
  type UnknownReason,
} from "../outcomes.ts";
import { ExpiringMap } from "./_expiring_map.ts";
import { HeldAcceptance } from "./_held_acceptance.ts";
import { Ring } from "./_ring.ts";
import { SeqIndex } from "./_seq_index.ts";

/** How many undelivered messages a core-only subscription's client queue holds before it drops (slow consumer). */
export const DEFAULT_CLIENT_QUEUE_LIMIT = 64;
/** The largest envelope the model accepts by default (8 MiB, a JetStream server's max_payload). */
export const DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024;
/** The default duplicate window, in seconds (WIRE.md: 120 s for every node stream). */
export const DEFAULT_DEDUP_WINDOW_SECONDS = 120;
/** How long an archived envelope stays replayable by default, in seconds. */
export const DEFAULT_ARCHIVE_HORIZON_SECONDS = 3600;
/** How long a dead letter is kept (WIRE.md: the DLQ stream's max age is 7 days). */
export const DLQ_RETENTION_SECONDS = 7 * 24 * 3600;
/** The control key whose committed value is the run's flow-wide stop: committing it wakes `subscribeControl`. */
export const CONTROL_STOP_KEY = "stop";

/** Counts one message `state` lost for `reason`; `unseen` when its consumer never had it (see unseenBy). */
function countDrop(state: SubState, reason: DropReason, unseen = true): void {
  state.dropped++;
  state.droppedBy.set(reason, (state.droppedBy.get(reason) ?? 0) + 1);
  if (unseen) state.unseenBy.set(reason, (state.unseenBy.get(reason) ?? 0) + 1);
}

/** How the model is configured (spec MemoryMessagingBackend's arguments, camelCase). */
export interface MemoryMessagingOptions {
  /** The clock every deadline, lease and window reads (the system clock by default; FakeClock in tests). */
  readonly clock?: Clock;
  /** Model Core NATS: no retention, no leases, client queues. */
  readonly coreOnly?: boolean;
  /** Advertise and implement per-key latest-value slots on limits channels. */
  readonly latestPerKey?: boolean;
  /** Advertise the durable_control profile (MSG-018). */
  readonly durableControl?: boolean;
  /** Advertise the replay_archive profile and keep data envelopes replayable (MSG-024). */
  readonly archive?: boolean;
  readonly archiveHorizonSeconds?: number;
  /** The longest duplicate window a channel gets; a spec asking for more reads back this. */
  readonly dedupWindowSeconds?: number;
  /**
   * The most bytes one channel's duplicate window holds (and the DLQ's): beyond it the oldest ids are
   * forgotten first, as if their time had passed, so a re-publish of one is a new message. Null (the
   * default): bounded by time only.
   */
  readonly dedupWindowBytes?: number | null;
  /** Copies the modelled broker keeps; a channel asking for more is refused. */
  readonly replicationFactor?: number;
  /** Whether the modelled broker's storage outlives it; a persistent channel needs it. */
  readonly persistent?: boolean;
  readonly maxPayloadBytes?: number;
  /** Advertise that channels of one flow may differ in retention. */
  readonly mixedRetention?: boolean;
  /** Core-only slow-consumer bound per subscription. */
  readonly clientQueueLimit?: number;
  /** The most leased envelope bytes this client holds before its receives pause (RUN-025); null: unbounded. */
  readonly byteBudget?: number | null;
  /** An observation log to record publish, deliver, settle, drop and unresolved events into. */
  readonly log?: ObservationLog | null;
}

/** What {@link MemoryMessagingBackend.controlState} reads for one control key. */
export interface ControlState {
  readonly value: Uint8Array | null;
  readonly version: string | null;
}

const DATA = 0;
const EOS = 1;
type KindIndex = typeof DATA | typeof EOS;

function kindIndex(kind: SubscriptionKind | MessageKind): KindIndex {
  return kind === MessageKind.eos ? EOS : DATA;
}

/**
 * How far short of its instant a waiting receive's timer may fire and still count as on time: one tick of a
 * clock that keeps whole microseconds (FakeClock), whose timers round the instant they are armed for.
 */
const WAKE_TOLERANCE_SECONDS = 1e-6;

/**
 * A channel's (or the DLQ's) duplicate window: stored ids, and ids whose publication ended unknown, each
 * kept for `seconds` and within `maxBytes`.
 */
class DedupWindow {
  readonly stored: ExpiringMap<number>;
  readonly unknownIds: ExpiringMap<true>;

  constructor(seconds: number, maxBytes: number) {
    this.stored = new ExpiringMap(seconds, maxBytes);
    this.unknownIds = new ExpiringMap(seconds, maxBytes);
  }

  resize(seconds: number): void {
    this.stored.seconds = seconds;
    this.unknownIds.seconds = seconds;
  }

  remember(id: string, seq: number, now: number): void {
    this.stored.set(id, seq, now);
    this.unknownIds.delete(id);
  }

  /** Marks a publication whose outcome was reported unknown; keeps the time of the first such report. */
  markUnknown(id: string, now: number): void {
    if (this.unknownIds.get(id, now) === undefined) this.unknownIds.set(id, true, now);
  }
}

class StoredMessage {
  removed = false;
  /** Interest retention: subscriptions that have not settled it yet. */
  holders = 0;

  constructor(
    readonly seq: number,
    readonly envelope: Envelope,
    readonly kind: KindIndex,
    readonly storedAt: number,
  ) {}
}

const AVAILABLE = 0;
const LEASED = 1;
const DELAYED = 2;
const UNRESOLVED = 3;
const DONE = 4;
type EntryState = typeof AVAILABLE | typeof LEASED | typeof DELAYED | typeof UNRESOLVED | typeof DONE;

function isAvailable(entry: Entry): boolean {
  return entry.state === AVAILABLE;
}

function isRetained(message: StoredMessage): boolean {
  return !message.removed;
}

/** One message's state for one subscription. */
class Entry {
  state: EntryState = AVAILABLE;
  attempt = 0;
  expiresAt = 0;
  /** Identifies the current lease among the lease queue's slots (a renewal adds a slot). */
  leaseSlot = 0;
  /** The highest attempt `supersede` retired. */
  retired = 0;
  timer: TimerHandle | null = null;

  constructor(readonly sub: SubState, readonly msg: StoredMessage) {}
}

/** A token that links back to its lease, so settling it needs no lookup; any other token is looked up. */
class MemoryToken implements DeliveryToken {
  readonly #entry: Entry;

  constructor(
    readonly subscription: SubscriptionId,
    readonly messageId: string,
    readonly streamSequence: number | null,
    readonly attempt: number,
    readonly generation: string,
    entry: Entry,
  ) {
    this.#entry = entry;
  }

  static entryOf(token: DeliveryToken): Entry | null {
    return #entry in token ? (token as MemoryToken).#entry : null;
  }
}

class MemoryDelivery implements Delivery {
  constructor(
    readonly token: DeliveryToken,
    readonly envelopeBytes: Uint8Array,
    readonly size: number,
    readonly receivedAt: number,
    readonly headers: Readonly<Record<string, string>>,
  ) {}
}

interface Waiter {
  readonly subs: readonly SubState[];
  readonly itemCredit: number;
  readonly byteCredit: number;
  readonly deadline: number;
  readonly resolve: (deliveries: readonly Delivery[]) => void;
  readonly reject: (error: unknown) => void;
  timer: TimerHandle | null;
}

class SubState {
  /** Null for a required subscription the channel keeps messages for but nobody has bound yet. */
  spec: SubscriptionSpec | null = null;
  generation = "";
  closed = false;
  readonly kind: KindIndex;
  readonly outstanding = new SeqIndex<Entry>();
  readonly fresh = new Ring<Entry>();
  readonly redeliver = new Ring<Entry>();
  readonly leases = new Ring<Entry>();
  readonly leaseSlots = new Ring<number>();
  slotCounter = 0;
  available = 0;
  leased = 0;
  unresolved = 0;
  dropped = 0;
  /** {@link dropped}, by reason. */
  readonly droppedBy = new Map<DropReason, number>();
  /** The drops of messages no consumer had been handed, and that were the subscription's own, by reason. */
  readonly unseenBy = new Map<DropReason, number>();
  /** Which messages are the subscription's own (see {@link MemoryMessagingBackend.setDropOwnership}). */
  owns: ((envelope: Envelope) => boolean) | null = null;
  skipped = 0;
  failing: UnknownReason | null = null;
  waiters: Waiter[] = [];
  admit: ((delivery: Delivery) => boolean) | null = null;
  onSkip: ((delivery: Delivery) => void) | null = null;

  constructor(readonly id: SubscriptionId, readonly key: string, readonly channel: ChannelState) {
    this.kind = kindIndex(id.kind);
  }

  /** The next deliverable entry, redeliveries first; stale queue slots are discarded on the way. */
  nextAvailable(): Entry | undefined {
    while (this.redeliver.length > 0) {
      const entry = this.redeliver.shift() as Entry;
      if (entry.state === AVAILABLE) return entry;
    }
    while (this.fresh.length > 0) {
      const entry = this.fresh.shift() as Entry;
      if (entry.state === AVAILABLE) return entry;
    }
    return undefined;
  }

  /** The current lease at the head of the lease queue, after discarding renewed or settled slots. */
  headLease(): Entry | undefined {
    while (this.leases.length > 0) {
      const entry = this.leases.peek() as Entry;
      if (entry.state === LEASED && entry.leaseSlot === this.leaseSlots.peek()) return entry;
      this.leases.shift();
      this.leaseSlots.shift();
    }
    return undefined;
  }

  pushLease(entry: Entry): void {
    entry.leaseSlot = ++this.slotCounter;
    this.leases.push(entry);
    this.leaseSlots.push(entry.leaseSlot);
  }
}

class ChannelState {
  removed = false;
  nextSeq = 1;
  readonly messages: [Ring<StoredMessage>, Ring<StoredMessage>] = [new Ring(), new Ring()];
  readonly count = [0, 0];
  readonly bytes = [0, 0];
  readonly byKey = new Map<string, StoredMessage>();
  readonly dedup: DedupWindow;
  readonly subs = new Map<string, SubState>();
  /** Per kind: the subscriptions a new message of that kind is handed to. */
  fanout: [SubState[], SubState[]] = [[], []];
  readonly acceptance = new HeldAcceptance();
  rejected = 0;
  /** Room held for publishers' data beside what is stored (counted in the data slot). */
  readonly credit = new ChannelCredit();

  constructor(public spec: ChannelSpec, readonly key: string, dedupSeconds: number, dedupBytes: number) {
    this.dedup = new DedupWindow(dedupSeconds, dedupBytes);
  }

  get lastSeq(): number {
    return this.nextSeq - 1;
  }

  /** The oldest retained message of a kind, discarding removed ones from the ring's head. */
  head(kind: KindIndex): StoredMessage | undefined {
    const ring = this.messages[kind];
    while (ring.length > 0 && (ring.peek() as StoredMessage).removed) ring.shift();
    return ring.peek();
  }

  /** The oldest retained message of the slot `kind` counts against (either kind when the slot is shared). */
  oldestInSlot(kind: KindIndex): StoredMessage | undefined {
    if (this.spec.perSubjectLimits) return this.head(kind);
    const data = this.head(DATA);
    const eos = this.head(EOS);
    if (data === undefined) return eos;
    if (eos === undefined) return data;
    return data.seq < eos.seq ? data : eos;
  }

  /** Retained messages in sequence order. */
  retained(): StoredMessage[] {
    return [...this.messages[DATA].toArray(), ...this.messages[EOS].toArray()]
      .filter((message) => !message.removed)
      .sort((a, b) => a.seq - b.seq);
  }
}

class DeadLetterStore {
  nextSeq = 1;
  readonly records = new Ring<StoredMessage>();
  readonly dedup: DedupWindow;

  constructor(dedupSeconds: number, dedupBytes: number) {
    this.dedup = new DedupWindow(dedupSeconds, dedupBytes);
  }

  expire(now: number): void {
    while (
      this.records.length > 0 &&
      now - (this.records.peek() as StoredMessage).storedAt >= DLQ_RETENTION_SECONDS
    ) {
      this.records.shift();
    }
  }
}

const NO_DELIVERIES: readonly Delivery[] = Object.freeze([]);

function requireDeadline(deadline: number): number {
  if (Number.isNaN(deadline)) throw new ConfigError("a deadline must be a monotonic reading, got NaN");
  return deadline;
}

function describeChannel(id: ChannelId): string {
  return `${id.flowId}/${id.runId}/${id.node}`;
}

function describeSubscription(id: SubscriptionId): string {
  const partition = id.partition === null ? "" : ` p${id.partition}`;
  const instance = id.instance === null ? "" : ` @${id.instance}`;
  return `${id.consumerNode} <- ${describeChannel(id.channel)} (${id.kind}${partition}${instance})`;
}

/**
 * The in-memory broker. One instance holds every channel, subscription, lease and dead letter; all of its
 * methods may be called from one thread (a Deno Worker or the supervisor), interleaving freely.
 */
export class MemoryMessagingBackend implements MessagingBackend {
  readonly #clock: Clock;
  readonly #core: boolean;
  readonly #latestPerKey: boolean;
  readonly #durableControl: boolean;
  readonly #dedupSeconds: number;
  readonly #dedupBytes: number;
  readonly #replicationFactor: number;
  readonly #persistent: boolean;
  readonly #maxPayload: number;
  readonly #mixedRetention: boolean;
  readonly #clientQueueLimit: number;
  readonly #byteBudget: number | null;
  readonly #log: ObservationLog | null;
  readonly #archive: ExpiringMap<Envelope> | null;
  readonly #channels = new Map<string, ChannelState>();
  readonly #channelCache = new WeakMap<ChannelId, ChannelState>();
  readonly #subCache = new WeakMap<SubscriptionId, SubState>();
  readonly #deadLetters = new Map<string, DeadLetterStore>();
  /** Channel key → control key → committed value and version. */
  readonly #control = new Map<
    string,
    Map<string, { readonly value: Uint8Array; readonly version: string }>
  >();
  readonly #controlCallbacks: (() => void)[] = [];
  readonly #waiting = new Set<Waiter>();
  #stopCommitted = false;
  #versions = 0;
  #generations = 0;
  #rotation = 0;
  #resident = 0;
  #budgetWaits = 0;
  #shutDown = false;
  /** The credit holder this client's own calls publish as (a host names its own clients' holders). */
  readonly #holder: CreditHolder = {};

  constructor(options: MemoryMessagingOptions = {}) {
    this.#clock = options.clock ?? systemClock;
    this.#core = options.coreOnly ?? false;
    this.#latestPerKey = options.latestPerKey ?? false;
    this.#durableControl = options.durableControl ?? false;
    this.#dedupSeconds = requireSeconds(
      options.dedupWindowSeconds ?? DEFAULT_DEDUP_WINDOW_SECONDS,
      "dedupWindowSeconds",
    );
    const dedupBytes = options.dedupWindowBytes ?? null;
    this.#dedupBytes = dedupBytes === null ? Infinity : requireCount(dedupBytes, "dedupWindowBytes", 1);
    this.#replicationFactor = requireCount(options.replicationFactor ?? 1, "replicationFactor", 1);
    this.#persistent = options.persistent ?? false;
    this.#maxPayload = requireCount(
      options.maxPayloadBytes ?? DEFAULT_MAX_PAYLOAD_BYTES,
      "maxPayloadBytes",
      1,
    );
    this.#mixedRetention = options.mixedRetention ?? false;
    this.#clientQueueLimit = requireCount(
      options.clientQueueLimit ?? DEFAULT_CLIENT_QUEUE_LIMIT,
      "clientQueueLimit",
      1,
    );
    const budget = options.byteBudget ?? null;
    this.#byteBudget = budget === null ? null : requireCount(budget, "byteBudget", 1);
    this.#log = options.log ?? null;
    this.#archive = options.archive
      ? new ExpiringMap(
        requireSeconds(
          options.archiveHorizonSeconds ?? DEFAULT_ARCHIVE_HORIZON_SECONDS,
          "archiveHorizonSeconds",
        ),
      )
      : null;
  }

  // ---- the contract -------------------------------------------------------------------------------

  /** What this model, as configured, guarantees; every broker-dependent fact is Known (it is its own broker). */
  capabilities(): Promise<MessagingCapabilities> {
    return Promise.try(() => {
      this.#live("capabilities");
      return messagingCapabilities({
        adapter: this.#core ? "memory-core" : "memory",
        version: "1",
        retainedBacklog: !this.#core,
        recoverableDelivery: !this.#core,
        latestPerKey: this.#latestPerKey,
        dedupWindowSeconds: this.#core ? null : this.#dedupSeconds,
        publicationLedger: this.#core ? PublicationLedger.none : PublicationLedger.window,
        replicationFactor: known(this.#replicationFactor, this.#clock),
        persistentStorage: known(this.#persistent, this.#clock),
        maxPayloadBytes: known(this.#maxPayload, this.#clock),
        creditResizable: true,
        controlSharesDataSlot: !this.#core,
        durableControl: this.#durableControl,
        archive: this.#archive !== null,
        mixedRetentionPerChannel: this.#mixedRetention,
      });
    });
  }

  /**
   * Creates the channel, or reconciles an existing one: immutable fields (retention, replicas, persistence)
   * that differ throw {@link IncompatibleProfile}, as does a spec this broker cannot provide (more replicas
   * than it keeps, persistence it lacks, interest retention without retention). Mutable limits are applied
   * (a tighter limit trims the oldest, recording drops). The effective configuration is read back; a
   * duplicate window capped by the broker is listed in `mismatches`.
   */
  ensureChannel(spec: ChannelSpec, operationId: string): Promise<VerifiedChannel> {
    return Promise.try(() => {
      this.#live("ensureChannel");
      this.#requireOperation(operationId);
      const checked = channelSpec(spec);
      this.#refuseUnprovidable(checked);
      const key = channelKey(checked.id);
      const dedupSeconds = this.#core ? 0 : Math.min(checked.dedupWindowSeconds, this.#dedupSeconds);
      let ch = this.#channels.get(key);
      if (ch === undefined) {
        ch = new ChannelState(checked, key, dedupSeconds, this.#dedupBytes);
        this.#channels.set(key, ch);
      } else {
        this.#refuseImmutableChange(ch.spec, checked);
        ch.spec = checked;
        ch.dedup.resize(dedupSeconds);
        this.#trim(ch, this.#clock.monotonic());
        this.#serveCredit(ch);
      }
      for (const required of checked.requiredSubscriptions) this.#subState(ch, required);
      this.#rebuildFanout(ch);
      const effective = this.#effectiveChannel(ch, dedupSeconds);
      const mismatches = dedupSeconds === checked.dedupWindowSeconds ? [] : ["dedup_window_seconds"];
      return Object.freeze({ spec: checked, effective, mismatches: Object.freeze(mismatches) });
    });
  }

  /**
   * Binds the subscription on an existing channel ({@link ResourceUnavailable} otherwise), minting its
   * ownership generation, or reconciles a bound one (changing `competing` is {@link IncompatibleProfile}).
   * A subscription bound after messages were stored receives every retained message of its kind; in
   * core-only mode it receives only what is published from now on.
   */
  ensureSubscription(spec: SubscriptionSpec, operationId: string): Promise<VerifiedSubscription> {
    return Promise.try(() => {
      this.#live("ensureSubscription");
      this.#requireOperation(operationId);
      const checked = subscriptionSpec(spec);
      const ch = this.#channelOf(checked.id.channel);
      if (ch === undefined) {
        throw new ResourceUnavailable(
          `subscription ${describeSubscription(checked.id)} names a channel that does not exist`,
          "ensure the channel before its subscriptions",
          { channel: describeChannel(checked.id.channel) },
        );
      }
      const state = this.#subState(ch, checked.id);
      const previous = state.spec;
      if (previous !== null && previous.competing !== checked.competing) {
        throw new IncompatibleProfile(
          `subscription ${describeSubscription(checked.id)} is bound ${
            previous.competing ? "competing" : "per replica"
          }` +
            ` and cannot become ${checked.competing ? "competing" : "per replica"}`,
          "a subscription's delivery mode is immutable: tear the run down and provision it again",
          [],
          { subscription: describeSubscription(checked.id) },
        );
      }
      state.spec = checked;
      if (previous === null) {
        state.generation = String(++this.#generations);
        this.#rebuildFanout(ch);
      } else if (previous.ackWaitSeconds !== checked.ackWaitSeconds) {
        this.#reorderLeases(state);
      }
      const effective = Object.freeze({
        competing: checked.competing,
        ack_wait: checked.ackWaitSeconds,
        max_deliver: checked.maxDeliver,
        max_ack_pending: checked.itemCredit,
        max_bytes: checked.byteCredit,
        filter: checked.id.kind,
        generation: state.generation,
        owner_labels: checked.ownerLabels,
      });
      return Object.freeze({ spec: checked, effective, mismatches: Object.freeze([]) });
    });
  }

  /**
   * Publishes `envelope` (a dead letter when its kind is `dlq`). Accepted with its stream sequence
   * (`duplicate` for an id already stored within the window); Rejected when no channel captures it (not
   * retryable, MSG-014), when it exceeds the payload limit, or when a rejecting channel is full (retryable);
   * PublicationUnknown when the deadline passes while the broker holds it or when the receipt is lost.
   * A deadline already past at the call sends nothing: Rejected, retryable.
   */
  publish(envelope: Envelope, deadline: number): Promise<PublicationOutcome> {
    return this.publishAs(this.#holder, envelope, deadline);
  }

  /**
   * {@link publish} on behalf of `holder` (a host's client, whose credit the publication uses: see
   * {@link reserveCreditAs}).
   */
  publishAs(holder: CreditHolder, envelope: Envelope, deadline: number): Promise<PublicationOutcome> {
    try {
      const outcome = this.publishNow(envelope, deadline, holder);
      return outcome !== null
        ? Promise.resolve(outcome)
        : this.#publishBeforeDeadline(envelope, deadline, envelope.kind === MessageKind.dlq, holder);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /**
   * Publishes `envelopes` in order (see {@link MessagingBackend.publishBatch}): each decided on the spot
   * while it can be, else through {@link publish}'s slow path, awaited before the next starts; behind a
   * data entry refused as retryable on a channel that refuses when full, the later data entries on that
   * channel are refused too.
   */
  async publishBatch(
    envelopes: readonly Envelope[],
    deadline: number,
  ): Promise<readonly PublicationOutcome[]> {
    this.#live("publishBatch");
    const holder = this.#holder;
    requireDeadline(deadline);
    const outcomes: PublicationOutcome[] = new Array(envelopes.length);
    const refusedOn = new Set<ChannelState>();
    for (let i = 0; i < envelopes.length; i++) {
      const envelope = envelopes[i];
      const ch = envelope.kind === MessageKind.data ? this.#channelOf(envelope.channel) : undefined;
      if (ch !== undefined && refusedOn.has(ch)) {
        ch.rejected++;
        outcomes[i] = this.#refused(envelope, "an earlier publication of this batch was refused", true);
        continue;
      }
      const outcome = this.publishNow(envelope, deadline, holder) ??
        await this.#publishBeforeDeadline(envelope, deadline, envelope.kind === MessageKind.dlq, holder);
      outcomes[i] = outcome;
      if (
        ch !== undefined && outcome.kind === "rejected" && outcome.retryable &&
        ch.spec.overflow === Overflow.reject
      ) {
        refusedOn.add(ch);
      }
    }
    return outcomes;
  }

  /**
   * {@link publish} decided on the spot, for a host that serves many publications in one turn (the
   * embedded broker): the same outcome `publish` resolves with, or null when it cannot be decided at once
   * (a fault schedule is installed, or the channel's acceptance is paused), where `publish` must be
   * called instead. Throws what `publish` rejects with.
   */
  publishNow(
    envelope: Envelope,
    deadline: number,
    holder: CreditHolder = this.#holder,
  ): PublicationOutcome | null {
    this.#live("publish");
    const now = this.#clock.monotonic();
    if (requireDeadline(deadline) <= now) {
      return rejected(envelope.publicationId, "the deadline had passed: nothing was sent", true);
    }
    const dlq = envelope.kind === MessageKind.dlq;
    if (faultsInstalled() || (!dlq && this.#channelOf(envelope.channel)?.acceptance.paused === true)) {
      return null;
    }
    return dlq ? this.#storeDeadLetter(envelope, now) : this.#store(envelope, now, holder);
  }

  /**
   * Reserves room for this client's data on `channel` (see {@link MessagingBackend.reserveCredit}): at once
   * when it fits beside what is stored and held and no earlier request waits, else when consumers or other
   * holders free enough, or none at the deadline.
   */
  reserveCredit(
    channel: ChannelId,
    request: CreditRequest,
    deadline: number,
  ): Promise<Observation<PublishCredit>> {
    return this.reserveCreditAs(this.#holder, channel, request, deadline);
  }

  /** {@link reserveCredit} on behalf of `holder`, a host's client (its publications go through {@link publishAs}). */
  reserveCreditAs(
    holder: CreditHolder,
    channel: ChannelId,
    request: CreditRequest,
    deadline: number,
  ): Promise<Observation<PublishCredit>> {
    try {
      this.#live("reserveCredit");
      requireDeadline(deadline);
      const ch = this.#channelOf(channel);
      if (ch === undefined) {
        return Promise.resolve(unknown("missing", this.#clock, `no channel ${describeChannel(channel)}`));
      }
      const spec = ch.spec;
      if (this.#core || spec.overflow !== Overflow.reject) {
        return Promise.resolve(
          known({ items: request.items, bytes: spec.maxBytes === null ? null : request.bytes }, this.#clock),
        );
      }
      if (spec.maxBytes !== null && request.minBytes > spec.maxBytes) {
        return Promise.resolve(known(NO_CREDIT, this.#clock));
      }
      const now = this.#clock.monotonic();
      this.#expireAged(ch, now);
      const [items, bytes] = this.#creditRoom(ch);
      const granted = ch.credit.grant(holder, request, items, bytes);
      if (granted !== null) return Promise.resolve(known(granted, this.#clock));
      if (deadline <= now) return Promise.resolve(known(NO_CREDIT, this.#clock));
      return ch.credit.wait(holder, request, deadline, this.#clock).then((credit) =>
        known(credit, this.#clock)
      );
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** Gives back this client's credit on `channel` (see {@link MessagingBackend.releaseCredit}). */
  releaseCredit(channel: ChannelId): void {
    this.#live("releaseCredit");
    this.releaseCreditOf(this.#holder, channel);
  }

  /**
   * Gives back everything `holder` (a host's client) holds on `channel`, or on every channel (a client
   * that ended).
   */
  releaseCreditOf(holder: CreditHolder, channel: ChannelId | null = null): void {
    if (channel === null) {
      for (const ch of this.#channels.values()) this.#releaseCreditOf(ch, holder);
      return;
    }
    const ch = this.#channelOf(channel);
    if (ch !== undefined) this.#releaseCreditOf(ch, holder);
  }

  #releaseCreditOf(ch: ChannelState, holder: CreditHolder): void {
    ch.credit.release(holder);
    this.#serveCredit(ch);
  }

  /** The room free of stored messages and of everyone's credit in `ch`'s data slot: messages, bytes (null: unbounded). */
  #creditRoom(ch: ChannelState): readonly [number, number | null] {
    const spec = ch.spec;
    const items = spec.maxMsgs - this.#slotCount(ch, DATA) - ch.credit.items;
    const bytes = spec.maxBytes === null ? null : spec.maxBytes - this.#slotBytes(ch, DATA) - ch.credit.bytes;
    return [items, bytes];
  }

  /** Grants what waiting credit requests the room now meets. */
  #serveCredit(ch: ChannelState): void {
    if (ch.credit.waiting) ch.credit.serve(() => this.#creditRoom(ch));
  }

  /**
   * Resolves an earlier publication: PublicationUnknown while the broker still holds it (acceptance
   * paused); Accepted `duplicate` when it was stored within the window; for an id whose publication ended
   * unknown within the window, an idempotent re-publish (stored now); Unresolvable otherwise (outside the
   * window, or in core-only mode, which keeps no ledger).
   */
  async observePublication(envelope: Envelope): Promise<PublicationOutcome> {
    this.#live("observePublication");
    const id = envelope.publicationId;
    const outcome = this.#resolvePublication(envelope);
    if (faultsInstalled()) {
      const hit = await barrier(Barrier.brokerObserveAfter, { what: "publication", op_id: id });
      if (hit.dropResponse) return publicationUnknown(id, "the observation's response was lost");
    }
    return outcome;
  }

  /**
   * Leases what the credits allow (redeliveries first), waiting on the clock until `deadline` for at least
   * one delivery; a subscription nobody bound is {@link ResourceUnavailable}.
   */
  receive(
    subscription: SubscriptionId,
    itemCredit: number,
    byteCredit: number,
    deadline: number,
  ): Promise<readonly Delivery[]> {
    try {
      this.#live("receive");
      return this.#receiveFrom([this.#boundSub(subscription)], itemCredit, byteCredit, deadline);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** {@link receive} over several subscriptions, starting with a different one each call so none starves. */
  receiveAny(
    subscriptions: readonly SubscriptionId[],
    itemCredit: number,
    byteCredit: number,
    deadline: number,
  ): Promise<readonly Delivery[]> {
    return Promise.try(() => {
      this.#live("receiveAny");
      if (subscriptions.length === 0) throw new ConfigError("receiveAny needs at least one subscription");
      return this.#receiveFrom(
        subscriptions.map((id) => this.#boundSub(id)),
        itemCredit,
        byteCredit,
        deadline,
      );
    });
  }

  /**
   * Extends a live lease by the subscription's ack wait from now. Not renewed (with the reason) when the
   * message was settled or dropped, the token is superseded, or the lease already lapsed.
   */
  async renew(token: DeliveryToken): Promise<LeaseObservation> {
    this.#live("renew");
    if (faultsInstalled()) {
      await barrier(Barrier.messageRenewBefore, {
        consumer: token.subscription.consumerNode,
        attempt: token.attempt,
      });
    }
    const now = this.#clock.monotonic();
    const state = this.#lookupSub(token.subscription);
    if (state === undefined || state.spec === null) {
      return leaseObservation(token, false, null, "the subscription does not exist");
    }
    this.#sweepAndServe(state, now);
    const entry = this.#entryFor(state, token);
    const stale = this.#staleness(state, entry, token);
    if (stale !== null) return leaseObservation(token, false, null, stale);
    if (entry === undefined || entry.state === DONE) {
      return leaseObservation(token, false, null, "the message is settled or gone");
    }
    if (entry.state !== LEASED) return leaseObservation(token, false, null, "the lease had lapsed");
    entry.expiresAt = now + state.spec.ackWaitSeconds;
    state.pushLease(entry);
    return leaseObservation(token, true, entry.expiresAt);
  }

  /**
   * Settles one delivery. Stale (superseded attempt, retired token, older generation): SettleStale before
   * any barrier or state change (MSG-011). A token of a subscription that no longer exists: SettleUnknown.
   * A message already settled or dropped for this subscription: confirmed (nothing can redeliver it).
   * Completed and Terminal end it; Retry hands it back (after its delay), or leaves it unresolved when its
   * attempts reached max_deliver. A DropResponse at `message.settle.after` applies the settlement and
   * reports SettleUnknown (PAY-004).
   */
  settle(token: DeliveryToken, outcome: Settlement, settlementId: string): Promise<SettlementOutcome> {
    try {
      const settled = this.settleNow(token, outcome, settlementId);
      return settled !== null
        ? Promise.resolve(settled)
        : this.#settleThroughBarriers(token, outcome, settlementId);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /**
   * {@link settle} decided on the spot (see {@link publishNow}): the same outcome, or null while a fault
   * schedule is installed (its barriers need `settle`). Throws what `settle` rejects with.
   */
  settleNow(token: DeliveryToken, outcome: Settlement, settlementId: string): SettlementOutcome | null {
    this.#live("settle");
    checkSettlement(outcome);
    this.#requireOperation(settlementId);
    if (faultsInstalled()) return null;
    const state = this.#lookupSub(token.subscription);
    const refusal = this.#settleRefusal(state, token);
    if (refusal !== null) return refusal;
    this.#applyTo(state as SubState, token, outcome, settlementId);
    return settleConfirmed(token, settlementId);
  }

  /**
   * Settles `requests` in order (see {@link MessagingBackend.settleBatch}): each decided on the spot while
   * it can be, else through {@link settle}'s barriers, awaited before the next starts. Every request is
   * checked before any is applied.
   */
  async settleBatch(requests: readonly SettleRequest[]): Promise<readonly SettlementOutcome[]> {
    this.#live("settleBatch");
    for (const request of requests) {
      checkSettlement(request.outcome);
      this.#requireOperation(request.settlementId);
    }
    const outcomes: SettlementOutcome[] = new Array(requests.length);
    for (let i = 0; i < requests.length; i++) {
      const { token, outcome, settlementId } = requests[i];
      outcomes[i] = this.settleNow(token, outcome, settlementId) ??
        await this.#settleThroughBarriers(token, outcome, settlementId);
    }
    return outcomes;
  }

  async #settleThroughBarriers(
    token: DeliveryToken,
    outcome: Settlement,
    settlementId: string,
  ): Promise<SettlementOutcome> {
    const state = this.#lookupSub(token.subscription);
    let refusal = this.#settleRefusal(state, token);
    if (refusal !== null) return refusal;
    if (faultsInstalled()) {
      await barrier(Barrier.messageSettleBefore, this.#settleContext(token, outcome, settlementId));
      refusal = this.#settleRefusal(state, token);
      if (refusal !== null) return refusal;
    }
    this.#applyTo(state as SubState, token, outcome, settlementId);
    if (faultsInstalled()) {
      const hit = await barrier(
        Barrier.messageSettleAfter,
        this.#settleContext(token, outcome, settlementId),
      );
      if (hit.dropResponse) return settleUnknown(token, "the broker's confirmation was lost");
    }
    return settleConfirmed(token, settlementId);
  }

  /** Retires a live token without settling it; a later settle of it is SettleStale. */
  supersede(token: DeliveryToken): boolean {
    this.#live("supersede");
    const state = this.#lookupSub(token.subscription);
    if (state === undefined) return false;
    const entry = this.#entryFor(state, token);
    if (entry === undefined || entry.state === DONE || this.#staleness(state, entry, token) !== null) {
      return false;
    }
    entry.retired = token.attempt;
    return true;
  }

  /**
   * The subscription's counters after expiring due leases: Unknown('missing') for a subscription that does
   * not exist, Unknown(reason) while {@link failObservation} is set, Unknown('timeout') when the response is
   * dropped at `broker.observe.after`.
   */
  async observeSubscription(subscription: SubscriptionId): Promise<Observation<SubscriptionObservation>> {
    this.#live("observeSubscription");
    const state = this.#lookupSub(subscription);
    if (state === undefined) {
      return unknown("missing", this.#clock, `no subscription ${describeSubscription(subscription)}`);
    }
    if (state.failing !== null) return unknown(state.failing, this.#clock, "injected observation failure");
    const now = this.#clock.monotonic();
    this.#expireAged(state.channel, now);
    this.#sweepAndServe(state, now);
    const value: SubscriptionObservation = Object.freeze({
      available: state.available,
      leased: state.leased,
      unresolved: state.unresolved,
      dropped: state.dropped,
      rejectedPublications: state.channel.rejected,
    });
    return await this.#observed(value, state.generation, "subscription");
  }

  /** The channel's retained range (Unknown('missing') for a channel that does not exist). */
  async observeChannel(channel: ChannelId): Promise<Observation<ChannelObservation>> {
    this.#live("observeChannel");
    const ch = this.#channelOf(channel);
    if (ch === undefined) return unknown("missing", this.#clock, `no channel ${describeChannel(channel)}`);
    this.#expireAged(ch, this.#clock.monotonic());
    const data = ch.head(DATA);
    const eos = ch.head(EOS);
    const first = Math.min(data?.seq ?? Infinity, eos?.seq ?? Infinity);
    const value: ChannelObservation = Object.freeze({
      firstSeq: first === Infinity ? ch.lastSeq + 1 : first,
      lastSeq: ch.lastSeq,
      messages: ch.count[DATA] + ch.count[EOS],
      retention: ch.spec.retention,
    });
    return await this.#observed(value, null, "channel");
  }

  /**
   * The stream sequence below which everything of the subscription's kind is settled or gone: one less
   * than its oldest outstanding message, or the channel's last sequence when nothing is outstanding.
   * Unknown in core-only mode (no acks exist), for a missing subscription, or while observation fails.
   */
  async observeAckFloor(subscription: SubscriptionId): Promise<Observation<number>> {
    this.#live("observeAckFloor");
    if (this.#core) return unknown("unsupported", this.#clock, "core-only delivery keeps no ack floor");
    const state = this.#lookupSub(subscription);
    if (state === undefined) {
      return unknown("missing", this.#clock, `no subscription ${describeSubscription(subscription)}`);
    }
    if (state.failing !== null) return unknown(state.failing, this.#clock, "injected observation failure");
    this.#expireAged(state.channel, this.#clock.monotonic());
    const oldest = state.outstanding.first();
    const floor = oldest === undefined ? state.channel.lastSeq : oldest - 1;
    return await this.#observed(floor, state.generation, "ack_floor");
  }

  /**
   * Says which messages are `subscription`'s own for {@link unseenDrops}: a partitioned replica's
   * subscription sees every message of its parent but processes only its partition's, so losing another
   * partition's is no loss to it. Every message, until this is called.
   */
  setDropOwnership(subscription: SubscriptionId, owns: (envelope: Envelope) => boolean): void {
    this.#boundSub(subscription).owns = owns;
  }

  /**
   * For an engine whose supervisor gave up on every consumer of `subscription` for good: the subscription
   * holds nothing from now on. Each message it still held is released, a `consumer_gone` drop (an interest
   * message nobody else holds leaves the channel, making room for the publishers it held back), and new
   * messages are no longer handed to it. Returns how many it released; 0 for one already abandoned or
   * unknown. A required subscription no consumer bound yet is abandoned alike.
   */
  abandon(subscription: SubscriptionId): number {
    const state = this.#lookupSub(subscription);
    if (state === undefined || state.closed) return 0;
    state.closed = true;
    const ch = state.channel;
    ch.fanout[state.kind] = ch.fanout[state.kind].filter((other) => other !== state);
    let released = 0;
    for (const entry of [...state.outstanding.values()]) {
      this.#logDrop(state, entry.msg, DropReason.consumerGone, entry.state === LEASED);
      this.#finish(state, entry);
      released++;
    }
    return released;
  }

  /** Installs the admission filter; a refused delivery is settled Completed at once and handed to `onSkip`. */
  setAdmission(
    subscription: SubscriptionId,
    admit: (delivery: Delivery) => boolean,
    onSkip?: (delivery: Delivery) => void,
  ): boolean {
    this.#live("setAdmission");
    const state = this.#boundSub(subscription);
    state.admit = admit;
    state.onSkip = onSkip ?? null;
    return true;
  }

  /** Always 0: the model hands deliveries straight from the broker, it parks none locally. */
  prefetched(subscription: SubscriptionId): number {
    this.#boundSub(subscription);
    return 0;
  }

  /** Calls `callback` (on a later turn) once {@link CONTROL_STOP_KEY} is committed on any channel, or at once if it was. */
  subscribeControl(callback: () => void): void {
    this.#live("subscribeControl");
    this.#controlCallbacks.push(callback);
    if (this.#stopCommitted) queueMicrotask(callback);
  }

  /**
   * Ends this client: every waiting receive returns `[]`, every publication still held reports
   * PublicationUnknown (the broker keeps holding it), waits are disarmed, and later calls throw {@link ResourceUnavailable}. The
   * channels, their messages and leases stay (inspection hooks keep working).
   */
  shutdown(): Promise<void> {
    if (this.#shutDown) return Promise.resolve();
    this.#shutDown = true;
    for (const waiter of [...this.#waiting]) this.#finishWaiter(waiter, NO_DELIVERIES);
    for (const ch of this.#channels.values()) {
      ch.credit.clear();
      for (const publication of ch.acceptance.held) {
        publication.resolve(
          publicationUnknown(publication.envelope.publicationId, "the backend was shut down"),
        );
      }
    }
    return Promise.resolve();
  }

  /**
   * Removes exactly the `owned` channels whose owner labels name their run (and `expectedGeneration`, when
   * not empty): their messages, subscriptions, leases and control keys. A labelled channel owned by another
   * generation is left and reported remaining. Dead letters and archived envelopes stay. A DropResponse at
   * `broker.observe.after` (the inventory read) removes nothing and reports `complete: false`.
   */
  async close(owned: readonly ChannelId[], expectedGeneration: string): Promise<CleanupObservation> {
    this.#live("close");
    const names = owned.map((id) => streamNameFor(id.flowId, id.runId, id.node));
    if (faultsInstalled()) {
      const hit = await barrier(Barrier.brokerObserveAfter, { what: "inventory", status: "close" });
      if (hit.dropResponse) {
        return cleanupObservation(false, [], [...new Set(names)], "the channel inventory could not be read");
      }
    }
    const removed: string[] = [];
    const remaining: string[] = [];
    const reasons: string[] = [];
    const seen = new Set<string>();
    owned.forEach((id, index) => {
      const key = channelKey(id);
      const ch = this.#channels.get(key);
      if (seen.has(key) || ch === undefined) return;
      seen.add(key);
      const labels = ch.spec.ownerLabels;
      if (hasOwnerLabels(labels) && !owns(labels, id.flowId, id.runId, expectedGeneration || null)) {
        remaining.push(names[index]);
        reasons.push(
          `${names[index]} is not owned by run ${id.runId} generation ${expectedGeneration || "(any)"}`,
        );
        return;
      }
      this.#removeChannel(ch);
      removed.push(names[index]);
    });
    return cleanupObservation(remaining.length === 0, removed, remaining, reasons.join("; "));
  }

  // ---- model hooks (spec: the memory backend's extra methods) ---------------------------------------

  /** Whether `channel` refuses publications at its limits (overflow `reject`) instead of evicting; false for an unknown one. */
  refusesWhenFull(channel: ChannelId): boolean {
    return this.#channelOf(channel)?.spec.overflow === Overflow.reject;
  }

  /** Holds every later publication to `channel` until {@link resumeAcceptance} or {@link cancelPublication}. */
  pauseAcceptance(channel: ChannelId): void {
    this.#requireChannel(channel).acceptance.pause();
  }

  /** Stores every held publication (late acceptance) in order and returns their outcomes. */
  resumeAcceptance(channel: ChannelId): PublicationOutcome[] {
    const acceptance = this.#requireChannel(channel).acceptance;
    const now = this.#clock.monotonic();
    return acceptance.resume((envelope, holder) => this.#store(envelope, now, holder));
  }

  /** Definitely cancels a held publication (its publisher, if still waiting, gets Rejected). False when none was held. */
  cancelPublication(channel: ChannelId, publicationId: string): boolean {
    return this.#requireChannel(channel).acceptance.cancel(publicationId);
  }

  /** Makes the subscription's observations Unknown(`reason`) until called with null. */
  failObservation(subscription: SubscriptionId, reason: UnknownReason | null = "timeout"): void {
    const state = this.#lookupSub(subscription);
    if (state === undefined) {
      throw new ConfigError(`no subscription ${describeSubscription(subscription)} to fail observations of`);
    }
    state.failing = reason;
  }

  /** Compare-and-swap of a control key (`expectedVersion` null: must not exist); true when it applied. */
  commitControl(channel: ChannelId, key: string, expectedVersion: string | null, value: Uint8Array): boolean {
    const scope = channelKey(channel);
    let keys = this.#control.get(scope);
    if ((keys?.get(key)?.version ?? null) !== expectedVersion) return false;
    if (keys === undefined) {
      keys = new Map();
      this.#control.set(scope, keys);
    }
    keys.set(key, { value: value.slice(), version: String(++this.#versions) });
    if (key === CONTROL_STOP_KEY && !this.#stopCommitted) {
      this.#stopCommitted = true;
      for (const callback of this.#controlCallbacks) queueMicrotask(callback);
    }
    return true;
  }

  /** The control key's value and version, both null when it was never committed. */
  controlState(channel: ChannelId, key: string): ControlState {
    const slot = this.#control.get(channelKey(channel))?.get(key);
    return Object.freeze({ value: slot?.value.slice() ?? null, version: slot?.version ?? null });
  }

  /** The archived envelope for `eventId` while within the archive horizon; null once expired (or without archive). */
  replay(channel: ChannelId, eventId: string): Envelope | null {
    return this.#archive?.get(JSON.stringify([channelKey(channel), eventId]), this.#clock.monotonic()) ??
      null;
  }

  /** The channel's retained envelopes in sequence order, then the dead letters addressed to it, oldest first. */
  stored(channel: ChannelId): Envelope[] {
    const ch = this.#channelOf(channel);
    const key = channelKey(channel);
    const letters = this.#deadLetters.get(channel.flowId)?.records.toArray()
      .filter((record) => channelKey(record.envelope.channel) === key) ?? [];
    return [...(ch?.retained() ?? []), ...letters].map((message) => message.envelope);
  }

  /** Every channel that exists, in creation order. */
  channelIds(): ChannelId[] {
    return [...this.#channels.values()].map((ch) => ch.spec.id);
  }

  /** The logical subscriptions bound on a channel: the inventory a teardown or a replacement worker reads. */
  subscriptionIds(channel: ChannelId): SubscriptionId[] {
    const ch = this.#channelOf(channel);
    return ch === undefined ? [] : [...ch.subs.values()].filter((s) => s.spec !== null).map((s) => s.id);
  }

  /** Envelope bytes this client holds leased right now (what `byteBudget` bounds). */
  residentBytes(): number {
    return this.#resident;
  }

  /** How many times a receive paused because the byte budget was full (RUN-025). */
  budgetWaits(): number {
    return this.#budgetWaits;
  }

  /**
   * Messages the subscription lost before it settled them (evicted, aged out, superseded, slow consumer),
   * by reason: {@link observeSubscription}'s `dropped`, broken down, read without an observation's barrier.
   */
  drops(subscription: SubscriptionId): Readonly<Record<string, number>> {
    return Object.fromEntries(this.#boundSub(subscription).droppedBy);
  }

  /**
   * The {@link drops} of messages no consumer had been handed, by reason: what the subscription's consumer
   * never saw. A message evicted while a consumer held it is a drop for the broker, but that consumer still
   * processes it; one that is not the subscription's own ({@link setDropOwnership}) is not counted here.
   */
  unseenDrops(subscription: SubscriptionId): Readonly<Record<string, number>> {
    return Object.fromEntries(this.#boundSub(subscription).unseenBy);
  }

  /**
   * Messages the subscription has not settled yet (available, leased or unresolved): {@link
   * observeSubscription}'s counts summed, read without an observation's barrier.
   */
  unsettled(subscription: SubscriptionId): number {
    const state = this.#boundSub(subscription);
    return state.available + state.leased + state.unresolved;
  }

  /** Deliveries the admission filter refused and the model settled on the consumer's behalf. */
  skipped(subscription: SubscriptionId): number {
    return this.#boundSub(subscription).skipped;
  }

  // ---- publication ----------------------------------------------------------------------------------

  /** The slow path: barriers and held acceptance, raced against the deadline (whatever loses still happens). */
  #publishBeforeDeadline(
    envelope: Envelope,
    deadline: number,
    dlq: boolean,
    holder: CreditHolder,
  ): Promise<PublicationOutcome> {
    return new Promise((resolve, reject) => {
      let done = false;
      const timer = this.#clock.setTimer(deadline - this.#clock.monotonic(), () => {
        if (done) return;
        done = true;
        this.#markUnknown(envelope);
        resolve(
          publicationUnknown(envelope.publicationId, "the deadline passed before the broker's receipt"),
        );
      });
      this.#publishSteps(envelope, dlq, holder).then(
        (outcome) => {
          if (done) return;
          done = true;
          timer.cancel();
          resolve(outcome);
        },
        (error) => {
          if (done) return;
          done = true;
          timer.cancel();
          reject(error);
        },
      );
    });
  }

  async #publishSteps(envelope: Envelope, dlq: boolean, holder: CreditHolder): Promise<PublicationOutcome> {
    const context: BarrierContext = { op_id: envelope.publicationId, event_id: envelope.eventId };
    if (faultsInstalled()) {
      await barrier(dlq ? Barrier.dlqPublishBefore : Barrier.messagePublishBefore, context);
    }
    let outcome: PublicationOutcome;
    if (dlq) {
      outcome = this.#storeDeadLetter(envelope, this.#clock.monotonic());
    } else {
      const ch = this.#channelOf(envelope.channel);
      outcome = ch !== undefined && ch.acceptance.paused
        ? await ch.acceptance.hold(envelope, holder)
        : this.#store(envelope, this.#clock.monotonic(), holder);
    }
    if (outcome.kind !== "accepted" || !faultsInstalled()) return outcome;
    const hit = await barrier(dlq ? Barrier.dlqPublishAfter : Barrier.messagePublishAfter, context);
    if (!hit.dropResponse) return outcome;
    this.#markUnknown(envelope);
    return publicationUnknown(envelope.publicationId, "the broker's receipt was lost");
  }

  #markUnknown(envelope: Envelope): void {
    const now = this.#clock.monotonic();
    const window = envelope.kind === MessageKind.dlq
      ? this.#deadLetters.get(envelope.channel.flowId)?.dedup
      : this.#channelOf(envelope.channel)?.dedup;
    window?.markUnknown(envelope.publicationId, now);
  }

  #resolvePublication(envelope: Envelope): PublicationOutcome {
    const id = envelope.publicationId;
    if (this.#core) return publicationUnresolvable(id, "core-only delivery keeps no publication ledger");
    const now = this.#clock.monotonic();
    const dlq = envelope.kind === MessageKind.dlq;
    const ch = dlq ? undefined : this.#channelOf(envelope.channel);
    const window = dlq ? this.#deadLetters.get(envelope.channel.flowId)?.dedup : ch?.dedup;
    if (ch?.acceptance.holds(id)) {
      return publicationUnknown(id, "the broker still holds it: acceptance is paused");
    }
    const seq = window?.stored.get(id, now);
    if (seq !== undefined) return accepted(id, seq, true, DURABILITY_MEMORY);
    if (window?.unknownIds.get(id, now) !== undefined) {
      return dlq ? this.#storeDeadLetter(envelope, now) : this.#store(envelope, now, this.#holder);
    }
    return publicationUnresolvable(id, "no record of it within the channel's duplicate window");
  }

  /**
   * Stores a data or EOS publication on its channel: dedup, age, key slot, room (a data publication's
   * within `holder`'s credit, which it then uses), then fan-out.
   */
  #store(envelope: Envelope, now: number, holder: CreditHolder | null): PublicationOutcome {
    const id = envelope.publicationId;
    const ch = this.#channelOf(envelope.channel);
    if (ch === undefined) {
      return this.#refused(
        envelope,
        `no channel captures ${describeChannel(envelope.channel)} (MSG-014)`,
        false,
      );
    }
    if (envelope.size > this.#maxPayload) {
      return this.#refused(
        envelope,
        `${envelope.size} bytes exceed the broker's max payload ${this.#maxPayload}`,
        false,
      );
    }
    const kind = kindIndex(envelope.kind);
    if (this.#core) return this.#fanOutCore(ch, envelope, kind, now);
    const duplicate = ch.dedup.stored.get(id, now);
    if (duplicate !== undefined) {
      this.#log?.emit("publish", { op_id: id, event_id: envelope.eventId, status: "duplicate" });
      return accepted(id, duplicate, true, DURABILITY_MEMORY);
    }
    this.#expireAged(ch, now);
    const key = this.#latestPerKey && kind === DATA && ch.spec.retention === Retention.limits
      ? envelope.partitionKey
      : null;
    if (key !== null) {
      const previous = ch.byKey.get(key);
      if (previous !== undefined) this.#removeMessage(ch, previous, DropReason.superseded);
    }
    const spender = kind === DATA ? holder : null;
    const refusal = this.#makeRoom(ch, kind, envelope.size, spender);
    if (refusal !== null) {
      ch.rejected++;
      return this.#refused(envelope, refusal.reason, refusal.retryable);
    }
    ch.credit.use(spender, envelope.size);
    const message = new StoredMessage(ch.nextSeq++, envelope, kind, now);
    ch.messages[kind].push(message);
    ch.count[kind]++;
    ch.bytes[kind] += envelope.size;
    if (key !== null) ch.byKey.set(key, message);
    ch.dedup.remember(id, message.seq, now);
    if (this.#archive !== null && kind === DATA) {
      this.#archive.set(JSON.stringify([ch.key, envelope.eventId]), envelope, now);
    }
    this.#log?.emit("publish", { op_id: id, event_id: envelope.eventId, status: "accepted" });
    this.#fanOut(ch, message);
    return accepted(id, message.seq, false, DURABILITY_MEMORY);
  }

  #refused(envelope: Envelope, reason: string, retryable: boolean): PublicationOutcome {
    this.#log?.emit("publish", {
      op_id: envelope.publicationId,
      event_id: envelope.eventId,
      status: "rejected",
      reason,
    });
    return rejected(envelope.publicationId, reason, retryable);
  }

  #storeDeadLetter(envelope: Envelope, now: number): PublicationOutcome {
    const id = envelope.publicationId;
    if (envelope.size > this.#maxPayload) {
      return this.#refused(
        envelope,
        `${envelope.size} bytes exceed the broker's max payload ${this.#maxPayload}`,
        false,
      );
    }
    let store = this.#deadLetters.get(envelope.channel.flowId);
    if (store === undefined) {
      store = new DeadLetterStore(this.#core ? 0 : this.#dedupSeconds, this.#dedupBytes);
      this.#deadLetters.set(envelope.channel.flowId, store);
    }
    const duplicate = store.dedup.stored.get(id, now);
    if (duplicate !== undefined) return accepted(id, duplicate, true, DURABILITY_MEMORY);
    store.expire(now);
    const record = new StoredMessage(store.nextSeq++, envelope, DATA, now);
    store.records.push(record);
    store.dedup.remember(id, record.seq, now);
    this.#log?.emit("dead_letter", { op_id: id, event_id: envelope.eventId, status: "accepted" });
    return accepted(id, record.seq, false, DURABILITY_MEMORY);
  }

  /** Null when the message fits (after evicting for it); otherwise why it is refused. */
  #makeRoom(
    ch: ChannelState,
    kind: KindIndex,
    size: number,
    holder: CreditHolder | null,
  ): { reason: string; retryable: boolean } | null {
    const spec = ch.spec;
    if (spec.maxBytes !== null && size > spec.maxBytes) {
      return { reason: `${size} bytes exceed the channel's max_bytes ${spec.maxBytes}`, retryable: false };
    }
    if (!this.#full(ch, kind, size, holder)) return null;
    if (spec.overflow === Overflow.reject) {
      const held = this.#slotCount(ch, kind) >= spec.maxMsgs
        ? `${spec.maxMsgs} messages`
        : `${this.#slotBytes(ch, kind)} of ${spec.maxBytes} bytes held, ${size} more asked`;
      return { reason: `channel ${describeChannel(spec.id)} is full (${held})`, retryable: true };
    }
    while (this.#full(ch, kind, size)) {
      this.#removeMessage(ch, ch.oldestInSlot(kind) as StoredMessage, DropReason.evicted);
    }
    return null;
  }

  /** Messages in the slot `kind` counts against (both kinds when the slot is shared). */
  #slotCount(ch: ChannelState, kind: KindIndex): number {
    return ch.spec.perSubjectLimits ? ch.count[kind] : ch.count[DATA] + ch.count[EOS];
  }

  /** Bytes in the slot `kind` counts against. */
  #slotBytes(ch: ChannelState, kind: KindIndex): number {
    return ch.spec.perSubjectLimits ? ch.bytes[kind] : ch.bytes[DATA] + ch.bytes[EOS];
  }

  /**
   * Whether one more message of `size` bytes would overflow the slot `kind` counts against, the credit
   * other holders than `holder` keep in it counted as occupied (`holder`'s own as free).
   */
  #full(ch: ChannelState, kind: KindIndex, size: number, holder: CreditHolder | null = null): boolean {
    const maxBytes = ch.spec.maxBytes;
    const credited = kind === DATA || !ch.spec.perSubjectLimits;
    const items = this.#slotCount(ch, kind) + (credited ? ch.credit.othersItems(holder) : 0);
    if (items >= ch.spec.maxMsgs) return true;
    if (maxBytes === null) return false;
    return this.#slotBytes(ch, kind) + (credited ? ch.credit.othersBytes(holder) : 0) + size > maxBytes;
  }

  /** After a limit was tightened: evicts the oldest until every slot is within its limits again. */
  #trim(ch: ChannelState, now: number): void {
    this.#expireAged(ch, now);
    const maxBytes = ch.spec.maxBytes;
    for (const kind of [DATA, EOS] as const) {
      while (
        this.#slotCount(ch, kind) > ch.spec.maxMsgs ||
        (maxBytes !== null && this.#slotBytes(ch, kind) > maxBytes)
      ) {
        this.#removeMessage(ch, ch.oldestInSlot(kind) as StoredMessage, DropReason.evicted);
      }
    }
  }

  /** Hands a new message to every subscription of its kind; an interest message nobody wants is not kept. */
  #fanOut(ch: ChannelState, message: StoredMessage): void {
    const subs = ch.fanout[message.kind];
    for (let i = 0; i < subs.length; i++) {
      const state = subs[i];
      const entry = new Entry(state, message);
      state.outstanding.set(message.seq, entry);
      state.fresh.push(entry);
      state.available++;
      message.holders++;
    }
    if (ch.spec.retention === Retention.interest && message.holders === 0) {
      this.#removeMessage(ch, message, null);
      return;
    }
    for (let i = 0; i < subs.length; i++) {
      if (subs[i].waiters.length > 0) this.#serve(subs[i], message.storedAt);
    }
  }

  /** Core NATS: a copy into each attached client queue, or a slow-consumer drop when the queue is full. */
  #fanOutCore(ch: ChannelState, envelope: Envelope, kind: KindIndex, now: number): PublicationOutcome {
    const message = new StoredMessage(ch.nextSeq++, envelope, kind, now);
    message.removed = true;
    for (const state of ch.fanout[kind]) {
      if (state.available >= this.#clientQueueLimit) {
        this.#logDrop(state, message, DropReason.slowConsumer);
        continue;
      }
      const entry = new Entry(state, message);
      state.fresh.push(entry);
      state.available++;
      if (state.waiters.length > 0) this.#serve(state);
    }
    this.#log?.emit("publish", {
      op_id: envelope.publicationId,
      event_id: envelope.eventId,
      status: "accepted",
    });
    return accepted(envelope.publicationId, null, false, DURABILITY_MEMORY);
  }

  /** Removes a stored message; with a reason, every subscription that had not settled it records a drop. */
  #removeMessage(ch: ChannelState, message: StoredMessage, reason: DropReason | null): void {
    if (message.removed) return;
    message.removed = true;
    ch.count[message.kind]--;
    ch.bytes[message.kind] -= message.envelope.size;
    const key = message.envelope.partitionKey;
    if (key !== null && ch.byKey.get(key) === message) ch.byKey.delete(key);
    ch.head(message.kind);
    ch.messages[message.kind].compactBeyond(ch.count[message.kind], isRetained);
    this.#serveCredit(ch);
    if (reason === null) return;
    for (const state of ch.fanout[message.kind]) {
      const entry = state.outstanding.get(message.seq);
      if (entry === undefined) continue;
      const wasLeased = entry.state === LEASED;
      this.#retire(state, entry);
      this.#logDrop(state, message, reason, wasLeased);
      if (wasLeased && state.waiters.length > 0) this.#serve(state);
    }
  }

  #expireAged(ch: ChannelState, now: number): void {
    const maxAge = ch.spec.maxAgeSeconds;
    if (maxAge === null) return;
    for (const kind of [DATA, EOS] as const) {
      for (
        let head = ch.head(kind);
        head !== undefined && now - head.storedAt >= maxAge;
        head = ch.head(kind)
      ) {
        this.#removeMessage(ch, head, DropReason.maxAge);
      }
    }
  }

  // ---- delivery -------------------------------------------------------------------------------------

  #receiveFrom(
    subs: readonly SubState[],
    itemCredit: number,
    byteCredit: number,
    deadline: number,
  ): Promise<readonly Delivery[]> {
    requireCount(itemCredit, "a receive's item credit", 1);
    requireCount(byteCredit, "a receive's byte credit", 1);
    requireDeadline(deadline);
    const now = this.#clock.monotonic();
    const deliveries = this.#take(subs, itemCredit, byteCredit, now);
    if (deliveries.length > 0) return this.#handOut(deliveries);
    if (deadline <= now) return Promise.resolve(NO_DELIVERIES);
    return new Promise((resolve, reject) => {
      const waiter: Waiter = { subs, itemCredit, byteCredit, deadline, resolve, reject, timer: null };
      for (const state of subs) state.waiters.push(waiter);
      this.#waiting.add(waiter);
      this.#armWaiter(waiter, now);
    });
  }

  /**
   * Leases what the credits allow from `subs` (rotating the starting subscription), after expiring due
   * leases. Refused admissions are settled on the spot and do not count.
   */
  #take(subs: readonly SubState[], itemCredit: number, byteCredit: number, now: number): readonly Delivery[] {
    let out: Delivery[] | null = null;
    let taken = 0;
    let bytes = 0;
    const n = subs.length;
    const start = n === 1 ? 0 : this.#rotation++ % n;
    for (let i = 0; i < n && taken < itemCredit && bytes < byteCredit; i++) {
      const state = subs[(start + i) % n];
      if (state.closed) continue;
      this.#expireAged(state.channel, now);
      this.#sweep(state, now);
      const spec = state.spec as SubscriptionSpec;
      let subBytes = 0;
      while (taken < itemCredit && bytes < byteCredit && subBytes < spec.byteCredit) {
        if (state.available === 0) break;
        if (!this.#core && state.leased >= spec.itemCredit) break;
        if (this.#byteBudget !== null && this.#resident >= this.#byteBudget) {
          this.#budgetWaits++;
          break;
        }
        const entry = state.nextAvailable();
        if (entry === undefined) break;
        const delivery = this.#lease(state, entry, spec, now);
        if (state.admit !== null && !state.admit(delivery)) {
          this.#skip(state, entry, delivery);
          continue;
        }
        (out ??= []).push(delivery);
        taken++;
        bytes += delivery.size;
        subBytes += delivery.size;
      }
    }
    return out ?? NO_DELIVERIES;
  }

  #lease(state: SubState, entry: Entry, spec: SubscriptionSpec, now: number): Delivery {
    const message = entry.msg;
    const envelope = message.envelope;
    entry.attempt++;
    state.available--;
    if (this.#core) {
      entry.state = DONE;
    } else {
      entry.state = LEASED;
      entry.expiresAt = now + spec.ackWaitSeconds;
      state.pushLease(entry);
      state.leased++;
      this.#resident += envelope.size;
    }
    const token = new MemoryToken(
      state.id,
      envelope.publicationId,
      this.#core ? null : message.seq,
      entry.attempt,
      state.generation,
      entry,
    );
    this.#log?.emit("deliver", {
      op_id: envelope.publicationId,
      event_id: envelope.eventId,
      consumer: state.id.consumerNode,
      attempt: entry.attempt,
      generation: state.generation,
    });
    return new MemoryDelivery(token, envelope.body, envelope.size, now, envelope.headers);
  }

  #skip(state: SubState, entry: Entry, delivery: Delivery): void {
    if (entry.state !== DONE) this.#finish(state, entry);
    state.skipped++;
    const onSkip = state.onSkip;
    if (onSkip !== null) queueMicrotask(() => onSkip(delivery));
  }

  /** Returns leased deliveries to the receiver, through `message.receive.after` when faults are installed. */
  #handOut(deliveries: readonly Delivery[]): Promise<readonly Delivery[]> {
    if (!faultsInstalled()) return Promise.resolve(deliveries);
    const first = deliveries[0].token;
    return barrier(Barrier.messageReceiveAfter, {
      consumer: first.subscription.consumerNode,
      attempt: first.attempt,
      status: `${deliveries.length} leased`,
    }).then((hit) => hit.dropResponse ? NO_DELIVERIES : deliveries);
  }

  /** Expires due leases: redelivery, or unresolved once max_deliver attempts were made. True when any expired. */
  #sweep(state: SubState, now: number): boolean {
    let changed = false;
    for (
      let entry = state.headLease();
      entry !== undefined && entry.expiresAt <= now;
      entry = state.headLease()
    ) {
      state.leases.shift();
      state.leaseSlots.shift();
      state.leased--;
      this.#resident -= entry.msg.envelope.size;
      this.#handBack(state, entry, state.spec as SubscriptionSpec);
      changed = true;
    }
    return changed;
  }

  #sweepAndServe(state: SubState, now: number): void {
    if (this.#sweep(state, now)) this.#serveAfterRelease(state);
  }

  /** A no-longer-leased entry goes back for redelivery, or becomes unresolved past max_deliver (MSG-012). */
  #handBack(state: SubState, entry: Entry, spec: SubscriptionSpec, delaySeconds: number | null = null): void {
    if (spec.maxDeliver !== -1 && entry.attempt >= spec.maxDeliver) {
      entry.state = UNRESOLVED;
      state.unresolved++;
      this.#log?.emit("unresolved", {
        op_id: entry.msg.envelope.publicationId,
        event_id: entry.msg.envelope.eventId,
        consumer: state.id.consumerNode,
        attempt: entry.attempt,
      });
      return;
    }
    state.available++;
    if (delaySeconds !== null && delaySeconds > 0) {
      entry.state = DELAYED;
      entry.timer = this.#clock.setTimer(delaySeconds, () => {
        entry.timer = null;
        if (entry.state !== DELAYED) return;
        entry.state = AVAILABLE;
        state.redeliver.push(entry);
        this.#serve(state);
      });
      return;
    }
    entry.state = AVAILABLE;
    state.redeliver.push(entry);
  }

  // ---- settlement -----------------------------------------------------------------------------------

  #applySettlement(state: SubState, entry: Entry, outcome: Settlement): void {
    if (outcome.kind !== "retry") {
      this.#finish(state, entry);
      this.#serveAfterRelease(state);
      return;
    }
    if (entry.state !== LEASED) return;
    state.leased--;
    this.#resident -= entry.msg.envelope.size;
    this.#handBack(state, entry, state.spec as SubscriptionSpec, outcome.delaySeconds);
    this.#serveAfterRelease(state);
  }

  /** Core NATS cannot redeliver: a Retry of a core delivery is a recorded drop. */
  #dropUndeliverable(state: SubState, token: DeliveryToken): void {
    countDrop(state, DropReason.noRedelivery);
    this.#log?.emit("drop", {
      op_id: token.messageId,
      consumer: state.id.consumerNode,
      attempt: token.attempt,
      reason: DropReason.noRedelivery,
    });
  }

  /** Adjusts the counters of the entry's state and marks it done; the caller decides what it means. */
  #retire(state: SubState, entry: Entry): void {
    switch (entry.state) {
      case AVAILABLE:
        state.available--;
        break;
      case LEASED:
        state.leased--;
        this.#resident -= entry.msg.envelope.size;
        break;
      case DELAYED:
        entry.timer?.cancel();
        entry.timer = null;
        state.available--;
        break;
      case UNRESOLVED:
        state.unresolved--;
        break;
      case DONE:
        return;
    }
    entry.state = DONE;
    state.outstanding.delete(entry.msg.seq);
    state.fresh.compactBeyond(state.available, isAvailable);
    state.redeliver.compactBeyond(state.available, isAvailable);
  }

  /** Settles the entry for good; an interest message settled by its last holder leaves the channel. */
  #finish(state: SubState, entry: Entry): void {
    this.#retire(state, entry);
    const message = entry.msg;
    if (--message.holders === 0 && state.channel.spec.retention === Retention.interest) {
      this.#removeMessage(state.channel, message, null);
    }
  }

  /** The outcome of a settle that cannot apply (a missing subscription, a stale token), or null when it can. */
  #settleRefusal(state: SubState | undefined, token: DeliveryToken): SettlementOutcome | null {
    if (state === undefined || state.spec === null) {
      return settleUnknown(token, "the subscription does not exist (its channel was closed)");
    }
    const entry = this.#entryFor(state, token);
    return this.#staleness(state, entry, token) === null ? null : this.#stale(state, entry, token);
  }

  /** Applies a settlement the token may decide (a message already settled or dropped is left as it is). */
  #applyTo(state: SubState, token: DeliveryToken, outcome: Settlement, settlementId: string): void {
    const entry = this.#entryFor(state, token);
    if (this.#core) {
      if (outcome.kind === "retry") this.#dropUndeliverable(state, token);
    } else if (entry !== undefined && entry.state !== DONE && !state.closed) {
      this.#applySettlement(state, entry, outcome);
    }
    this.#logSettle(token, outcome, settlementId);
  }

  /** Why `token` may not decide `entry`'s outcome (undefined: settled or gone), or null when it may. */
  #staleness(state: SubState, entry: Entry | undefined, token: DeliveryToken): string | null {
    if (token.generation !== state.generation) {
      return `generation ${token.generation} was replaced by ${state.generation}`;
    }
    if (entry === undefined) return null;
    if (token.attempt !== entry.attempt) {
      return `attempt ${token.attempt} was superseded by attempt ${entry.attempt}`;
    }
    if (entry.retired >= token.attempt) return `attempt ${token.attempt} was retired by its receiver`;
    return null;
  }

  #stale(state: SubState, entry: Entry | undefined, token: DeliveryToken): SettlementOutcome {
    this.#log?.emit("settle", {
      op_id: token.messageId,
      consumer: token.subscription.consumerNode,
      attempt: token.attempt,
      status: "stale",
    });
    return settleStale(token, entry?.attempt ?? 0, state.generation);
  }

  /** The entry a token names: its own link when it is one of this model's tokens, else by sequence. */
  #entryFor(state: SubState, token: DeliveryToken): Entry | undefined {
    const linked = MemoryToken.entryOf(token);
    if (linked !== null) return linked.sub === state ? linked : undefined;
    return token.streamSequence === null ? undefined : state.outstanding.get(token.streamSequence);
  }

  #settleContext(token: DeliveryToken, outcome: Settlement, settlementId: string): BarrierContext {
    return {
      op_id: settlementId,
      consumer: token.subscription.consumerNode,
      attempt: token.attempt,
      status: outcome.kind,
    };
  }

  #logSettle(token: DeliveryToken, outcome: Settlement, settlementId: string): void {
    this.#log?.emit("settle", {
      op_id: settlementId,
      event_id: token.messageId,
      consumer: token.subscription.consumerNode,
      attempt: token.attempt,
      generation: token.generation,
      status: outcome.kind,
      reason: outcome.kind === "terminal" ? outcome.recordRef : "",
    });
  }

  /** Counts a message the subscription lost for `reason` (`handedOut`: while a consumer held it) and logs it. */
  #logDrop(state: SubState, message: StoredMessage, reason: DropReason, handedOut = false): void {
    countDrop(state, reason, !handedOut && (state.owns === null || state.owns(message.envelope)));
    this.#log?.emit("drop", {
      op_id: message.envelope.publicationId,
      event_id: message.envelope.eventId,
      consumer: state.id.consumerNode,
      reason,
    });
  }

  // ---- waiting receivers ----------------------------------------------------------------------------

  /**
   * Serves the subscription's waiting receivers in arrival order while deliveries and credit last; `now`
   * is a reading taken in this same turn (the clock's own by default).
   */
  #serve(state: SubState, now: number = this.#clock.monotonic()): void {
    while (state.waiters.length > 0 && state.available > 0) {
      const waiter = state.waiters[0];
      const deliveries = this.#take(waiter.subs, waiter.itemCredit, waiter.byteCredit, now);
      if (deliveries.length === 0) return;
      this.#finishWaiter(waiter, deliveries);
    }
  }

  /** After credit or budget was released: this subscription's waiters, then (with a budget) everyone's. */
  #serveAfterRelease(state: SubState): void {
    if (state.waiters.length > 0) this.#serve(state);
    if (this.#byteBudget === null || this.#waiting.size === 0) return;
    for (const waiter of [...this.#waiting]) {
      for (const sub of waiter.subs) {
        if (this.#waiting.has(waiter)) this.#serve(sub);
      }
    }
  }

  #finishWaiter(waiter: Waiter, deliveries: readonly Delivery[]): void {
    this.#waiting.delete(waiter);
    waiter.timer?.cancel();
    waiter.timer = null;
    for (const state of waiter.subs) {
      const index = state.waiters.indexOf(waiter);
      if (index >= 0) state.waiters.splice(index, 1);
    }
    if (deliveries.length === 0) waiter.resolve(deliveries);
    else this.#handOut(deliveries).then(waiter.resolve, waiter.reject);
  }

  /**
   * Wakes the waiter at its deadline or at the earliest lease expiry of its subscriptions, whichever is
   * first. A timer that fires less than {@link WAKE_TOLERANCE_SECONDS} short of that instant (a clock that
   * keeps whole microseconds rounds it) wakes at the instant, so it never re-arms a timer of no length.
   */
  #armWaiter(waiter: Waiter, now: number): void {
    let wake = waiter.deadline;
    for (const state of waiter.subs) {
      const lease = state.headLease();
      if (lease !== undefined && lease.expiresAt < wake) wake = lease.expiresAt;
    }
    waiter.timer = this.#clock.setTimer(wake - now, () => {
      waiter.timer = null;
      const reading = this.#clock.monotonic();
      const at = wake - reading < WAKE_TOLERANCE_SECONDS ? Math.max(reading, wake) : reading;
      for (const state of waiter.subs) this.#sweep(state, at);
      const deliveries = this.#take(waiter.subs, waiter.itemCredit, waiter.byteCredit, at);
      if (deliveries.length > 0 || at >= waiter.deadline) {
        this.#finishWaiter(waiter, deliveries);
      } else {
        this.#armWaiter(waiter, at);
      }
      for (const state of waiter.subs) {
        if (state.waiters.length > 0) this.#serve(state);
      }
    });
  }

  // ---- channels and subscriptions -------------------------------------------------------------------

  #channelOf(id: ChannelId): ChannelState | undefined {
    const cached = this.#channelCache.get(id);
    if (cached !== undefined && !cached.removed) return cached;
    const ch = this.#channels.get(channelKey(id));
    if (ch !== undefined) this.#channelCache.set(id, ch);
    return ch;
  }

  #requireChannel(id: ChannelId): ChannelState {
    const ch = this.#channelOf(id);
    if (ch === undefined) {
      throw new ConfigError(`no channel ${describeChannel(id)}`, "ensure the channel first");
    }
    return ch;
  }

  #lookupSub(id: SubscriptionId): SubState | undefined {
    const cached = this.#subCache.get(id);
    if (cached !== undefined && !cached.closed) return cached;
    const state = this.#channelOf(id.channel)?.subs.get(subscriptionKey(id));
    if (state !== undefined) this.#subCache.set(id, state);
    return state;
  }

  #boundSub(id: SubscriptionId): SubState {
    const state = this.#lookupSub(id);
    if (state === undefined || state.spec === null) {
      throw new ResourceUnavailable(
        `subscription ${describeSubscription(id)} is not bound`,
        "ensure the subscription (and its channel) before receiving from it",
        { subscription: describeSubscription(id) },
      );
    }
    return state;
  }

  /** The subscription's state, created unbound when new: it collects every retained message of its kind. */
  #subState(ch: ChannelState, id: SubscriptionId): SubState {
    const key = subscriptionKey(id);
    let state = ch.subs.get(key);
    if (state !== undefined) return state;
    state = new SubState(id, key, ch);
    ch.subs.set(key, state);
    if (!this.#core) {
      for (const message of ch.retained()) {
        if (message.kind !== state.kind) continue;
        const entry = new Entry(state, message);
        state.outstanding.set(message.seq, entry);
        state.fresh.push(entry);
        state.available++;
        message.holders++;
      }
    }
    return state;
  }

  #rebuildFanout(ch: ChannelState): void {
    const fanout: [SubState[], SubState[]] = [[], []];
    for (const state of ch.subs.values()) {
      if (!this.#core || state.spec !== null) fanout[state.kind].push(state);
    }
    ch.fanout = fanout;
  }

  #reorderLeases(state: SubState): void {
    const live: Entry[] = [];
    for (let entry = state.headLease(); entry !== undefined; entry = state.headLease()) {
      state.leases.shift();
      state.leaseSlots.shift();
      if (!live.includes(entry)) live.push(entry);
    }
    live.sort((a, b) => a.expiresAt - b.expiresAt);
    for (const entry of live) state.pushLease(entry);
  }

  #removeChannel(ch: ChannelState): void {
    ch.removed = true;
    ch.credit.clear();
    this.#channels.delete(ch.key);
    for (const state of ch.subs.values()) {
      state.closed = true;
      for (const entry of state.outstanding.values()) entry.timer?.cancel();
      for (let entry = state.headLease(); entry !== undefined; entry = state.headLease()) {
        state.leases.shift();
        state.leaseSlots.shift();
        this.#resident -= entry.msg.envelope.size;
        entry.state = DONE;
      }
      for (const waiter of [...state.waiters]) this.#finishWaiter(waiter, NO_DELIVERIES);
    }
    for (const publication of ch.acceptance.take()) {
      const id = publication.envelope.publicationId;
      publication.resolve(rejected(id, "the channel was removed before the publication was stored", false));
    }
    this.#control.delete(ch.key);
  }

  #refuseUnprovidable(spec: ChannelSpec): void {
    const problems: string[] = [];
    if (spec.replicas > this.#replicationFactor) {
      problems.push(`${spec.replicas} replicas requested, the broker keeps ${this.#replicationFactor}`);
    }
    if (spec.persistence && !this.#persistent) {
      problems.push("persistence requested, the broker's storage is not persistent");
    }
    if (spec.retention === Retention.interest && this.#core) {
      problems.push("interest retention requested, core-only delivery retains nothing");
    }
    if (problems.length === 0) return;
    throw new IncompatibleProfile(
      `channel ${describeChannel(spec.id)} (${spec.profile}) cannot be provided: ${problems.join("; ")}`,
      "request a profile this broker supports, or deploy a broker that provides it",
      [],
      { channel: describeChannel(spec.id), profile: spec.profile },
    );
  }

  #refuseImmutableChange(current: ChannelSpec, wanted: ChannelSpec): void {
    const changed = (["retention", "replicas", "persistence"] as const).filter((field) =>
      current[field] !== wanted[field]
    );
    if (changed.length === 0) return;
    throw new IncompatibleProfile(
      `channel ${describeChannel(wanted.id)} exists with different ${changed.join(", ")}: ` +
        changed.map((field) => `${field} ${current[field]} != ${wanted[field]}`).join(", "),
      "these settings are immutable: tear the run down and provision it again",
      [],
      { channel: describeChannel(wanted.id) },
    );
  }

  #effectiveChannel(ch: ChannelState, dedupSeconds: number): Readonly<Record<string, unknown>> {
    const spec = ch.spec;
    return Object.freeze({
      retention: spec.retention,
      max_msgs: spec.maxMsgs,
      max_bytes: spec.maxBytes,
      max_age_seconds: spec.maxAgeSeconds,
      overflow: spec.overflow,
      dedup_window_seconds: dedupSeconds,
      replicas: spec.replicas,
      persistence: spec.persistence,
      per_subject_limits: spec.perSubjectLimits,
      latest_per_key: this.#latestPerKey && spec.retention === Retention.limits,
      owner_labels: spec.ownerLabels,
      required_subscriptions: spec.requiredSubscriptions.length,
    });
  }

  async #observed<T>(value: T, generation: string | null, what: string): Promise<Observation<T>> {
    if (faultsInstalled()) {
      const hit = await barrier(Barrier.brokerObserveAfter, { what });
      if (hit.dropResponse) {
        return unknown("timeout", this.#clock, `the ${what} observation's response was lost`);
      }
    }
    return known(value, this.#clock, generation);
  }

  #requireOperation(id: string): void {
    if (typeof id !== "string" || id === "") {
      throw new ConfigError(
        "an operation id must be a non-empty string",
        "pass the operation's stable identity",
      );
    }
  }

  #live(operation: string): void {
    if (this.#shutDown) {
      throw new ResourceUnavailable(
        `the memory messaging backend was shut down; ${operation} is no longer possible`,
        "create a new backend client",
      );
    }
  }
}

/** Options of {@link makeChannel}, defaulting to the spec's test channel (10000 messages, evict oldest, 120 s). */
export interface MakeChannelOptions {
  readonly required?: readonly SubscriptionId[];
  readonly maxMsgs?: number;
  readonly maxBytes?: number | null;
  readonly maxAgeSeconds?: number | null;
  readonly overflow?: Overflow;
  readonly dedupWindowSeconds?: number;
  readonly replicas?: number;
  readonly persistence?: boolean;
  readonly perSubjectLimits?: boolean;
  readonly ownerLabels?: OwnerMetadata;
}

/** A channel spec for tests and for composing the reference runtime (spec make_channel). */
export function makeChannel(
  flowId: string,
  runId: string,
  node: string,
  profile: MessagingProfile,
  retention: Retention,
  options: MakeChannelOptions = {},
): ChannelSpec {
  return channelSpec({
    id: channelId(flowId, runId, node),
    profile,
    retention,
    maxMsgs: options.maxMsgs ?? 10_000,
    maxBytes: options.maxBytes ?? null,
    maxAgeSeconds: options.maxAgeSeconds ?? null,
    overflow: options.overflow ?? Overflow.evictOldest,
    dedupWindowSeconds: options.dedupWindowSeconds ?? DEFAULT_DEDUP_WINDOW_SECONDS,
    replicas: options.replicas ?? 1,
    persistence: options.persistence ?? false,
    requiredSubscriptions: options.required ?? [],
    ownerLabels: options.ownerLabels ?? {},
    perSubjectLimits: options.perSubjectLimits ?? false,
  });
}

/** An envelope for tests (spec make_envelope): body `x`, event id = publication id, wire schema version. */
export function makeEnvelope(
  channel: ChannelId,
  publicationId: string,
  options: Partial<Omit<EnvelopeInit, "channel" | "publicationId">> = {},
): Envelope {
  return envelope({
    body: new TextEncoder().encode("x"),
    eventId: publicationId,
    schemaVersion: ENVELOPE_VERSION,
    ...options,
    channel,
    publicationId,
  });
}

/** Options of {@link makeSubscription}, defaulting to the spec's test subscription. */
export interface MakeSubscriptionOptions {
  readonly competing?: boolean;
  readonly partition?: number | null;
  readonly ackWaitSeconds?: number;
  readonly maxDeliver?: number;
  readonly itemCredit?: number;
  readonly byteCredit?: number;
  readonly kind?: SubscriptionKind;
  readonly instance?: string | null;
}

/**
 * A subscription spec for tests (spec make_subscription): competing, ack wait 30 s, max_deliver 4, item
 * credit 8, byte credit 64 MiB. A partition makes it per-replica (competing false) unless told otherwise.
 */
export function makeSubscription(
  channel: ChannelId,
  consumer: string,
  options: MakeSubscriptionOptions = {},
): SubscriptionSpec {
  const partition = options.partition ?? null;
  return subscriptionSpec({
    id: subscriptionId(channel, consumer, { partition, kind: options.kind, instance: options.instance }),
    competing: options.competing ?? partition === null,
    ackWaitSeconds: options.ackWaitSeconds ?? 30,
    maxDeliver: options.maxDeliver ?? 4,
    itemCredit: options.itemCredit ?? 8,
    byteCredit: options.byteCredit ?? 64 * 1024 * 1024,
  });
}
