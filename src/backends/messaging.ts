/**
 * The MessagingBackend contract (spec backends.messaging): how an envelope reaches its required consumers.
 *
 * A messaging backend owns channels, publication outcomes, logical subscriptions, delivery leases,
 * settlement semantics, transport retention and replay capabilities. It does not own joining inputs, GPU
 * reservations, application effects or whole-run completion: those belong to the runtime, which composes a
 * backend with a payload store and a durable ledger.
 *
 * The vocabulary that matters:
 * - A subscription is a logical consumer. Ten replicas serving one consumer compete for its work (one
 *   {@link SubscriptionId} with `partition: null`); two distinct downstream consumers each have their own
 *   obligations. Fan-out and competing delivery are never interchangeable defaults.
 * - A {@link DeliveryToken} names the subscription, the message, the attempt and the ownership generation.
 *   A stale attempt cannot decide a newer attempt's outcome: `settle` on a superseded token returns
 *   SettleStale without reaching the broker (MSG-011).
 * - Terminal settlement requires a reference to a durable record (a dead-letter acceptance, a ledger
 *   entry): {@link terminal} refuses an empty one (DELIV-15), and so must every adapter.
 * - Observations distinguish zero from unknown: a subscription observation that could not be made is
 *   Unknown; work the broker retains but will never deliver again is `unresolved`, never "0 pending"
 *   (MSG-012).
 *
 * Times are seconds on the backend's clock (`Clock`, injected): deadlines are monotonic readings, never
 * durations.
 *
 * @example
 * ```ts
 * const cam = channelId("flow-A", "run-1", "cam");
 * const work = subscriptionId(cam, "detect");
 * console.log(work.kind, work.partition, completed().kind); // "data" null "completed"
 * ```
 *
 * @module
 */

import { requireCount, requirePositiveSeconds } from "../core/checks.ts";
import { ConfigError } from "../core/errors.ts";
import { type MessagingCapabilities, MessagingProfile, Retention } from "./capabilities.ts";
import type { OwnerMetadata } from "./identity.ts";
import type { CleanupObservation, Observation, PublicationOutcome, SettleOutcome } from "./outcomes.ts";
import type { ImmutablePayloadRef } from "./payload.ts";

/** What an envelope's bytes are, which decides the subject they ride and what a receiver does with them. */
export const MessageKind = {
  /** A node's output. */
  data: "data",
  /** An end-of-stream (or ABORT) terminator on the node's `_eos` subject. */
  eos: "eos",
  /** A dead letter: raw wire bytes addressed by the origin node's channel, kept by the flow's DLQ (DELIV-8). */
  dlq: "dlq",
} as const;
/** One of {@link MessageKind}. */
export type MessageKind = typeof MessageKind[keyof typeof MessageKind];

/** The kinds a subscription can filter to: data or end-of-stream markers, never dead letters. */
export type SubscriptionKind = typeof MessageKind.data | typeof MessageKind.eos;

/** What a full channel does with one more publication. */
export const Overflow = {
  /** Evict the oldest message, recording a drop for every subscription that had not settled it. */
  evictOldest: "evict_oldest",
  /** Refuse the publication (Rejected, retryable: waiting for consumers can make room). */
  reject: "reject",
} as const;
/** One of {@link Overflow}. */
export type Overflow = typeof Overflow[keyof typeof Overflow];

function requireText(value: string, what: string): string {
  if (typeof value !== "string" || value === "") {
    throw new ConfigError(`${what} must be a non-empty string, got ${JSON.stringify(value)}`);
  }
  return value;
}

function oneOf<T extends string>(value: string, allowed: Readonly<Record<string, T>>, what: string): T {
  const values = Object.values(allowed);
  if (!values.includes(value as T)) {
    throw new ConfigError(
      `${what} must be one of ${values.join(", ")}, got ${JSON.stringify(value)}`,
    );
  }
  return value as T;
}

/** The output channel of one node of one run: what a JetStream stream serves. */
export interface ChannelId {
  readonly flowId: string;
  readonly runId: string;
  readonly node: string;
}

/** Constructs a {@link ChannelId}; every part must be non-empty. */
export function channelId(flowId: string, runId: string, node: string): ChannelId {
  return Object.freeze({
    flowId: requireText(flowId, "a channel's flow id"),
    runId: requireText(runId, "a channel's run id"),
    node: requireText(node, "a channel's node"),
  });
}

/** A string equal for two channel ids exactly when their parts are equal (for maps and sets). */
export function channelKey(id: ChannelId): string {
  return JSON.stringify([id.flowId, id.runId, id.node]);
}

/** Whether two channel ids name the same channel. */
export function sameChannel(a: ChannelId, b: ChannelId): boolean {
  return a.flowId === b.flowId && a.runId === b.runId && a.node === b.node;
}

/**
 * One logical consumer of a channel. `partition` is the replica index of a partitioned consumer (every
 * replica has its own logical subscription), `null` for a competing subscription shared by all replicas.
 * `instance` names a per-process observer (an EOS subscription every replica holds for itself), `null` for
 * the logical work subscription.
 */
export interface SubscriptionId {
  readonly channel: ChannelId;
  readonly consumerNode: string;
  readonly partition: number | null;
  readonly kind: SubscriptionKind;
  readonly instance: string | null;
}

/** Constructs a {@link SubscriptionId}: a competing data subscription unless told otherwise. */
export function subscriptionId(
  channel: ChannelId,
  consumerNode: string,
  options: {
    readonly partition?: number | null;
    readonly kind?: SubscriptionKind;
    readonly instance?: string | null;
  } = {},
): SubscriptionId {
  const partition = options.partition ?? null;
  if (partition !== null) requireCount(partition, "a subscription's partition", 0);
  const instance = options.instance ?? null;
  if (instance !== null) requireText(instance, "a subscription's instance");
  const kind = options.kind ?? MessageKind.data;
  if (kind !== MessageKind.data && kind !== MessageKind.eos) {
    throw new ConfigError(
      `a subscription filters to data or eos, got ${JSON.stringify(kind)}`,
      "dead letters are read through the DLQ tools, never through a run subscription",
    );
  }
  return Object.freeze({
    channel,
    consumerNode: requireText(consumerNode, "a subscription's consumer node"),
    partition,
    kind,
    instance,
  });
}

/** A string equal for two subscription ids exactly when their parts are equal (for maps and sets). */
export function subscriptionKey(id: SubscriptionId): string {
  const c = id.channel;
  return JSON.stringify([c.flowId, c.runId, c.node, id.consumerNode, id.partition, id.kind, id.instance]);
}

/**
 * What a channel must provide, verified against the broker before production starts. `profile` is the
 * messaging profile the planner assigned and `retention` the class it compiles to (an `archive` channel
 * keeps history whatever its consumers did, bounded by its limits as a `limits` one is). `maxMsgs` and
 * `maxBytes` bound the run's slot (data and EOS share it unless `perSubjectLimits`); `ownerLabels` is the
 * exact-ownership metadata teardown matches on.
 */
export interface ChannelSpec {
  readonly id: ChannelId;
  readonly profile: MessagingProfile;
  readonly retention: Retention;
  readonly maxMsgs: number;
  readonly maxBytes: number | null;
  readonly maxAgeSeconds: number | null;
  readonly overflow: Overflow;
  readonly dedupWindowSeconds: number;
  readonly replicas: number;
  readonly persistence: boolean;
  readonly requiredSubscriptions: readonly SubscriptionId[];
  readonly ownerLabels: OwnerMetadata;
  readonly perSubjectLimits: boolean;
}

/** The fields of a {@link ChannelSpec}; the last two default to no labels and a shared slot. */
export type ChannelSpecInit =
  & Omit<ChannelSpec, "ownerLabels" | "perSubjectLimits">
  & Partial<Pick<ChannelSpec, "ownerLabels" | "perSubjectLimits">>;

/** Constructs a {@link ChannelSpec}, refusing limits no broker could apply with a {@link ConfigError}. */
export function channelSpec(init: ChannelSpecInit): ChannelSpec {
  if (init.maxBytes !== null) requireCount(init.maxBytes, "a channel's max_bytes", 1);
  if (init.maxAgeSeconds !== null) requirePositiveSeconds(init.maxAgeSeconds, "a channel's max_age");
  for (const required of init.requiredSubscriptions) {
    if (!sameChannel(required.channel, init.id)) {
      throw new ConfigError(
        `required subscription of ${required.consumerNode} reads channel ${channelKey(required.channel)}, ` +
          `not ${channelKey(init.id)}`,
        "list only subscriptions of this channel as its required consumers",
      );
    }
  }
  return Object.freeze({
    id: init.id,
    profile: oneOf(init.profile, MessagingProfile, "a channel's profile"),
    retention: oneOf(init.retention, Retention, "a channel's retention"),
    maxMsgs: requireCount(init.maxMsgs, "a channel's max_msgs", 1),
    maxBytes: init.maxBytes,
    maxAgeSeconds: init.maxAgeSeconds,
    overflow: oneOf(init.overflow, Overflow, "a channel's overflow"),
    dedupWindowSeconds: requireCount(init.dedupWindowSeconds, "a channel's dedup window", 0),
    replicas: requireCount(init.replicas, "a channel's replicas", 1),
    persistence: init.persistence,
    requiredSubscriptions: Object.freeze([...init.requiredSubscriptions]),
    ownerLabels: Object.freeze({ ...init.ownerLabels }),
    perSubjectLimits: init.perSubjectLimits ?? false,
  });
}

/**
 * What a channel retains right now: the first and last stream sequences it holds and how many messages,
 * the eviction facts a reconciler needs (BLOB-14 step 4: a publication below `firstSeq` was evicted and its
 * readers will never take it). An empty channel reports `firstSeq = lastSeq + 1`. The time and generation
 * of the reading are the enclosing {@link Observation}'s.
 */
export interface ChannelObservation {
  readonly firstSeq: number;
  readonly lastSeq: number;
  readonly messages: number;
  readonly retention: Retention;
}

/**
 * How one logical consumer is served. `competing` subscriptions share `itemCredit` (the broker-side cap on
 * leased messages) among every replica; `maxDeliver === -1` means the broker never strands a message (the
 * runtime's ledger budgets attempts); `byteCredit` bounds the bytes one receive hands out.
 */
export interface SubscriptionSpec {
  readonly id: SubscriptionId;
  readonly competing: boolean;
  readonly ackWaitSeconds: number;
  readonly maxDeliver: number;
  readonly itemCredit: number;
  readonly byteCredit: number;
  readonly ownerLabels: OwnerMetadata;
}

/** The fields of a {@link SubscriptionSpec}; owner labels default to none. */
export type SubscriptionSpecInit =
  & Omit<SubscriptionSpec, "ownerLabels">
  & Partial<Pick<SubscriptionSpec, "ownerLabels">>;

/** Constructs a {@link SubscriptionSpec}, refusing settings no broker could apply with a {@link ConfigError}. */
export function subscriptionSpec(init: SubscriptionSpecInit): SubscriptionSpec {
  if (init.competing && init.id.partition !== null) {
    throw new ConfigError(
      `subscription of ${init.id.consumerNode} is competing but names partition ${init.id.partition}`,
      "a partitioned consumer has one subscription per replica (competing: false)",
    );
  }
  if (init.maxDeliver !== -1) {
    requireCount(init.maxDeliver, "a subscription's max_deliver", 1, "use -1 for unlimited redelivery");
  }
  return Object.freeze({
    id: init.id,
    competing: init.competing,
    ackWaitSeconds: requirePositiveSeconds(init.ackWaitSeconds, "a subscription's ack_wait"),
    maxDeliver: init.maxDeliver,
    itemCredit: requireCount(init.itemCredit, "a subscription's item credit", 1),
    byteCredit: requireCount(init.byteCredit, "a subscription's byte credit", 1),
    ownerLabels: Object.freeze({ ...init.ownerLabels }),
  });
}

/**
 * One subscription's state as the broker reports it. `available` is work waiting to be delivered (a
 * delayed retry included), `leased` is work handed out and not yet settled, `unresolved` is work the
 * broker retains but will never deliver again (past max_deliver), `dropped` counts messages this
 * subscription lost to eviction, age or a slow consumer, and `rejectedPublications` counts publications the
 * channel refused. The time and generation of the reading are the enclosing {@link Observation}'s.
 */
export interface SubscriptionObservation {
  readonly available: number;
  readonly leased: number;
  readonly unresolved: number;
  readonly dropped: number;
  readonly rejectedPublications: number;
}

/**
 * Names one delivery attempt: the subscription, the message (its publication id), the stream sequence
 * (diagnostics, not identity), the attempt (1 for the first delivery) and the ownership generation of the
 * subscription that handed it out.
 */
export interface DeliveryToken {
  readonly subscription: SubscriptionId;
  readonly messageId: string;
  readonly streamSequence: number | null;
  readonly attempt: number;
  readonly generation: string;
}

/** Constructs a {@link DeliveryToken}. */
export function deliveryToken(
  subscription: SubscriptionId,
  messageId: string,
  streamSequence: number | null,
  attempt: number,
  generation: string,
): DeliveryToken {
  return Object.freeze({
    subscription,
    messageId: requireText(messageId, "a delivery's message id"),
    streamSequence,
    attempt: requireCount(attempt, "a delivery attempt", 1),
    generation,
  });
}

/** A settlement outcome as settle returns it for this contract's tokens. */
export type SettlementOutcome = SettleOutcome<DeliveryToken>;

/**
 * One leased delivery. `envelopeBytes` is the publication's body; a receiver must treat it as read-only (an
 * in-memory broker hands out the very bytes it retains). `receivedAt` is the backend clock's monotonic
 * reading when the lease began.
 */
export interface Delivery {
  readonly token: DeliveryToken;
  readonly envelopeBytes: Uint8Array;
  readonly size: number;
  readonly receivedAt: number;
  readonly headers: Readonly<Record<string, string>>;
}

/**
 * A publication. `publicationId` is the stable operation identity a retry re-uses (it becomes the broker's
 * dedup key); `eventId` is the logical event identity the runtime reasons about. Physical stream sequences
 * are diagnostics, not identity. `size` is the byte size limits and credits count.
 */
export interface Envelope {
  readonly channel: ChannelId;
  readonly publicationId: string;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: Uint8Array;
  readonly size: number;
  readonly eventId: string;
  readonly partitionKey: string | null;
  readonly eventTs: number | null;
  readonly sourceEpoch: string | null;
  readonly sourceOffset: number | null;
  readonly schemaVersion: number;
  readonly payloadRefs: readonly ImmutablePayloadRef[];
  readonly kind: MessageKind;
  /**
   * The publisher made `body` for this envelope alone, keeps no other view of it and never changes it: a
   * backend that crosses threads may move its buffer to the broker instead of copying it (the array is
   * then detached), and answers a retry of this same envelope with the bytes the broker hands back.
   */
  readonly bodyTransferable: boolean;
}

/** The fields of an {@link Envelope}: channel, ids, body and schema version are required. */
export type EnvelopeInit =
  & Pick<Envelope, "channel" | "publicationId" | "body" | "eventId" | "schemaVersion">
  & Partial<Omit<Envelope, "channel" | "publicationId" | "body" | "eventId" | "schemaVersion">>;

const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({});
const NO_REFS: readonly ImmutablePayloadRef[] = Object.freeze([]);

/**
 * Constructs an {@link Envelope}. Defaults: no headers, `size` = the body's length, no partition key,
 * event time, source epoch or offset, no payload refs, kind data, a body not transferable. The body is not
 * copied; headers and payload refs are copied unless already frozen (a publisher's constant headers are
 * then shared by every envelope, not made again per item).
 */
export function envelope(init: EnvelopeInit): Envelope {
  const size = init.size ?? init.body.byteLength;
  requireCount(size, "an envelope's size", 0);
  if (init.sourceOffset != null) requireCount(init.sourceOffset, "an envelope's source offset", 0);
  const headers = init.headers;
  const refs = init.payloadRefs;
  const kind = init.kind ?? MessageKind.data;
  return Object.freeze({
    channel: init.channel,
    publicationId: requireText(init.publicationId, "an envelope's publication id"),
    headers: headers === undefined
      ? NO_HEADERS
      : Object.isFrozen(headers)
      ? headers
      : Object.freeze({ ...headers }),
    body: init.body,
    size,
    eventId: requireText(init.eventId, "an envelope's event id"),
    partitionKey: init.partitionKey ?? null,
    eventTs: init.eventTs ?? null,
    sourceEpoch: init.sourceEpoch ?? null,
    sourceOffset: init.sourceOffset ?? null,
    schemaVersion: requireCount(init.schemaVersion, "an envelope's schema version", 1),
    payloadRefs: refs === undefined || refs.length === 0
      ? NO_REFS
      : Object.isFrozen(refs)
      ? refs
      : Object.freeze([...refs]),
    kind: kind === MessageKind.data || kind === MessageKind.eos
      ? kind
      : oneOf(kind, MessageKind, "an envelope's kind"),
    bodyTransferable: init.bodyTransferable ?? false,
  });
}

/** The message is done for this subscription: the broker will never deliver it to it again. */
export interface Completed {
  readonly kind: "completed";
}

/** Hand the message back for another attempt, after `delaySeconds` (null: at once). */
export interface Retry {
  readonly kind: "retry";
  readonly delaySeconds: number | null;
}

/** Give up on the message; `recordRef` names the durable record (DLQ acceptance, ledger id) that outlives it. */
export interface Terminal {
  readonly kind: "terminal";
  readonly recordRef: string;
}

/** What a receiver decides about one delivery. */
export type Settlement = Completed | Retry | Terminal;

const COMPLETED: Completed = Object.freeze({ kind: "completed" });

/** The one {@link Completed} settlement. */
export function completed(): Completed {
  return COMPLETED;
}

/** A {@link Retry}; `delaySeconds` must be null or a finite, non-negative number. */
export function retry(delaySeconds: number | null = null): Retry {
  if (delaySeconds !== null && (!Number.isFinite(delaySeconds) || delaySeconds < 0)) {
    throw new ConfigError(
      `a retry delay must be a finite, non-negative number of seconds, got ${delaySeconds}`,
    );
  }
  return Object.freeze({ kind: "retry", delaySeconds });
}

/**
 * A {@link Terminal}. An empty `recordRef` is refused with a {@link ConfigError} (DELIV-15): a message whose
 * only trace would be its own disappearance must not be terminated.
 */
export function terminal(recordRef: string): Terminal {
  return Object.freeze({ kind: "terminal", recordRef: checkRecordRef(recordRef) });
}

function checkRecordRef(recordRef: string): string {
  if (typeof recordRef !== "string" || recordRef.trim() === "") {
    throw new ConfigError(
      "a terminal settlement needs a reference to a durable record (DELIV-15)",
      "dead-letter the message (or record it in the ledger) first, then terminate it with that record's id",
    );
  }
  return recordRef;
}

/**
 * Refuses a settlement no adapter may apply: a Terminal without a durable record reference (DELIV-15) or a
 * Retry with an invalid delay, however it was built. Every adapter calls this before anything else in
 * `settle`.
 */
export function checkSettlement(outcome: Settlement): Settlement {
  switch (outcome.kind) {
    case "completed":
      return outcome;
    case "retry":
      return outcome.delaySeconds === null ? outcome : retry(outcome.delaySeconds);
    case "terminal":
      checkRecordRef(outcome.recordRef);
      return outcome;
  }
}

/** One settlement of a {@link MessagingBackend.settleBatch}: what {@link MessagingBackend.settle} takes. */
export interface SettleRequest {
  readonly token: DeliveryToken;
  readonly outcome: Settlement;
  readonly settlementId: string;
}

/**
 * What a publisher asks of {@link MessagingBackend.reserveCredit}: up to `items` messages and up to `bytes`
 * bytes, and no grant at all unless it holds at least `minBytes` (the size of the publication the
 * publisher is about to send, so that one fits).
 */
export interface CreditRequest {
  readonly items: number;
  readonly bytes: number;
  readonly minBytes: number;
}

/** Constructs a {@link CreditRequest}, refusing counts no grant could meet with a {@link ConfigError}. */
export function creditRequest(items: number, bytes: number, minBytes: number): CreditRequest {
  requireCount(items, "a credit request's items", 1);
  requireCount(minBytes, "a credit request's minimum bytes", 0);
  requireCount(bytes, "a credit request's bytes", minBytes);
  return Object.freeze({ items, bytes, minBytes });
}

/**
 * Room a channel holds for one client's data publications: `items` messages and `bytes` bytes (`null`: the
 * channel bounds no bytes). A grant of no items is no grant.
 */
export interface PublishCredit {
  readonly items: number;
  readonly bytes: number | null;
}

/** What a lease renewal achieved: `renewed` with the new expiry, or why not (`reason`). */
export interface LeaseObservation {
  readonly token: DeliveryToken;
  readonly renewed: boolean;
  readonly expiresAt: number | null;
  readonly reason: string;
}

/** Constructs a {@link LeaseObservation}. */
export function leaseObservation(
  token: DeliveryToken,
  renewed: boolean,
  expiresAt: number | null,
  reason = "",
): LeaseObservation {
  return Object.freeze({ token, renewed, expiresAt, reason });
}

/**
 * A channel as the broker has it after `ensureChannel`: the spec asked for, the configuration read back
 * (snake_case broker field names), and every field where the two still differ.
 */
export interface VerifiedChannel {
  readonly spec: ChannelSpec;
  readonly effective: Readonly<Record<string, unknown>>;
  readonly mismatches: readonly string[];
}

/** A subscription as the broker has it after `ensureSubscription` (see {@link VerifiedChannel}). */
export interface VerifiedSubscription {
  readonly spec: SubscriptionSpec;
  readonly effective: Readonly<Record<string, unknown>>;
  readonly mismatches: readonly string[];
}

/**
 * The transport contract. Every method returns an outcome rather than throwing for the expected failure
 * modes (a full channel, a lost receipt, an unreadable counter, a stale token); exceptions are for
 * programming errors (a {@link ConfigError}: bad input, an unknown subscription) and for injected faults
 * the caller could not have anticipated. Deadlines are monotonic readings of the backend's clock.
 */
export interface MessagingBackend {
  /** What this adapter, as configured, can guarantee (the record the composition planner reads). */
  capabilities(): Promise<MessagingCapabilities>;

  /**
   * Creates or reconciles the channel and reads back its effective configuration. An immutable mismatch
   * (retention, replicas, persistence), or a spec the broker cannot provide, throws IncompatibleProfile;
   * "already exists" is never accepted without inspection. `operationId` makes a retry idempotent.
   */
  ensureChannel(spec: ChannelSpec, operationId: string): Promise<VerifiedChannel>;

  /**
   * Creates or reconciles the subscription on an existing channel (ResourceUnavailable otherwise) and
   * reads it back; an immutable mismatch (competing) throws IncompatibleProfile.
   */
  ensureSubscription(spec: SubscriptionSpec, operationId: string): Promise<VerifiedSubscription>;

  /**
   * True when, once the backend refused one of a publisher's data publications on a channel as retryable,
   * it refuses that publisher's later data publications on the channel until the refused one is taken: a
   * publisher may then send while earlier publications are still at the broker and keep their order.
   * Absent (false) otherwise; a publisher then sends a publication made after a refused one only once
   * every earlier one has its final outcome.
   */
  readonly ordersRefusedPublications?: boolean;

  /** Publishes with a monotonic deadline; past it the outcome is PublicationUnknown, never a guess. */
  publish(envelope: Envelope, deadline: number): Promise<PublicationOutcome>;

  /**
   * Publishes `envelopes` in one call with one deadline: one outcome per envelope, in their order, each
   * what {@link publish} would have answered had they been published one after another (so a batch is
   * never "all accepted" when one entry is Unknown or Rejected). On a channel that refuses when full, an
   * entry behind a data entry refused as retryable on the same channel is refused too, so a retry of the
   * refused tail keeps the publisher's order. Input errors (a shut-down client, a NaN deadline) reject the
   * whole call before any entry is stored.
   */
  publishBatch(envelopes: readonly Envelope[], deadline: number): Promise<readonly PublicationOutcome[]>;

  /**
   * Reserves room on `channel` for this client's data publications (flow control by credit): waits until
   * `deadline` for room beside what the channel stores and what other clients hold, then grants at least
   * one message and `request.minBytes` bytes, at most what was asked. Every data publication of this
   * client the channel stores afterwards uses one message and its size of the credit held (as much as is
   * held). Where credit is a reservation (the memory model, the embedded broker) a publication within the
   * credit held is never Rejected for room; a backend that can only estimate room (JetStream keeps no
   * reservations: its adapter grants from the stream's observed room and limits) may still refuse one,
   * and a publisher handles that refusal as it would without credit. A channel that never refuses for
   * room (it evicts, or keeps no history) grants what was asked at once and holds nothing.
   * Known with no items: the deadline passed first, or `minBytes` exceeds what the channel could ever
   * hold (the publication's own outcome then says why). Unknown when the channel does not exist or could
   * not be asked.
   */
  reserveCredit(
    channel: ChannelId,
    request: CreditRequest,
    deadline: number,
  ): Promise<Observation<PublishCredit>>;

  /**
   * Gives back all the credit this client holds on `channel` (a publisher that is done, or whose count of
   * what it holds became uncertain after an unknown outcome). No reply: a publication made after it in
   * this client's order is judged without that credit.
   */
  releaseCredit(channel: ChannelId): void;

  /**
   * What the backend can say later about `envelope.publicationId`: within its ledger an idempotent
   * re-publish (Accepted, `duplicate` when the first send was stored), beyond it Unresolvable.
   */
  observePublication(envelope: Envelope): Promise<PublicationOutcome>;

  /**
   * Leases up to `itemCredit` deliveries of `subscription` (bounded by its spec's shared credit) whose
   * bytes stop at `byteCredit` (the last one may overshoot by one message, so a large message still
   * moves), waiting until `deadline` for at least one. Returns `[]` at the deadline.
   */
  receive(
    subscription: SubscriptionId,
    itemCredit: number,
    byteCredit: number,
    deadline: number,
  ): Promise<readonly Delivery[]>;

  /**
   * {@link receive} over several subscriptions at once: deliveries from whichever has any, waiting until
   * `deadline` for at least one. Each delivery's `token.subscription` names its subscription.
   */
  receiveAny(
    subscriptions: readonly SubscriptionId[],
    itemCredit: number,
    byteCredit: number,
    deadline: number,
  ): Promise<readonly Delivery[]>;

  /** Extends the lease of a live delivery by its subscription's ack wait; a lapsed or stale one is not renewed. */
  renew(token: DeliveryToken): Promise<LeaseObservation>;

  /**
   * Settles one delivery. A superseded token is SettleStale with no broker call (MSG-011); a settlement the
   * broker applied without confirming is SettleUnknown, on which no payload obligation may be released
   * (PAY-004). A Terminal without a durable record reference is refused (DELIV-15).
   */
  settle(token: DeliveryToken, outcome: Settlement, settlementId: string): Promise<SettlementOutcome>;

  /**
   * Settles `requests` in one call: one outcome per request, in their order, each what {@link settle}
   * would have answered (a batch is never "all confirmed" when one entry is SettleUnknown or SettleStale).
   * Refuses the whole call before settling any entry when one request is malformed (DELIV-15).
   */
  settleBatch(requests: readonly SettleRequest[]): Promise<readonly SettlementOutcome[]>;

  /**
   * Retires a delivery token locally (the receiver now holds a newer attempt of the same logical message)
   * without any broker settlement. Returns whether it was live; a later settle of it is SettleStale.
   */
  supersede(token: DeliveryToken): boolean;

  /** The subscription's counters, or Unknown when they could not be read: never zero for unknown. */
  observeSubscription(subscription: SubscriptionId): Promise<Observation<SubscriptionObservation>>;

  /** The channel's retained range, or Unknown when it could not be read. */
  observeChannel(channel: ChannelId): Promise<Observation<ChannelObservation>>;

  /**
   * The stream sequence up to which `subscription` has settled everything, for any subscription of the
   * run; Unknown when unreadable, which a reconciler treats as "still required", never as settled.
   */
  observeAckFloor(subscription: SubscriptionId): Promise<Observation<number>>;

  /**
   * Runs `admit` on every delivery of `subscription` before it is handed out: a refused delivery is
   * settled Completed by the backend at once and then handed to `onSkip` off the backend's own turn.
   * Returns false when the backend keeps no such filter (the caller then decides on the receiving side).
   */
  setAdmission(
    subscription: SubscriptionId,
    admit: (delivery: Delivery) => boolean,
    onSkip?: (delivery: Delivery) => void,
  ): boolean;

  /** Deliveries fetched from the broker and parked locally for `subscription` (0 when none are kept). */
  prefetched(subscription: SubscriptionId): number;

  /** Calls `callback` when the run's flow-wide stop is published; a backend without a control channel ignores it. */
  subscribeControl(callback: () => void): void;

  /** Releases this client's waits and timers; the channels stay (`close` removes those). */
  shutdown(): Promise<void>;

  /**
   * Removes exactly the `owned` channels whose ownership labels match (and `expectedGeneration`, when not
   * empty); reports what could not be confirmed removed. A listing that failed removes nothing and is
   * `complete: false`, never "nothing to remove".
   */
  close(owned: readonly ChannelId[], expectedGeneration: string): Promise<CleanupObservation>;
}
