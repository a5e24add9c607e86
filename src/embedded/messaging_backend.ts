/**
 * The MessagingBackend a node worker uses to reach the local engine's embedded broker: a proxy over an
 * {@link EmbeddedConnection} (`./rpc.ts`) to the memory broker the supervisor hosts
 * (`src/engines/embedded_broker.ts`). Every broker decision (retention, leases, credit, dedup, staleness,
 * barriers) is the hosted model's; this client adds only what the contract makes local:
 *
 * - Token state. A token this client handed out knows whether it was settled or retired here.
 *   {@link EmbeddedMessagingBackend.supersede} answers at once from that state, retires the token locally
 *   and tells the broker without waiting; settling a token retired here is SettleStale without a round
 *   trip (MSG-011). A token this client did not hand out is not live here (supersede returns false).
 *   The server keeps the broker's own token of each delivery it handed out until that delivery is
 *   settled Completed or Terminal, or this client's token is garbage-collected (a FinalizationRegistry
 *   tells the server), so the broker judges staleness exactly as for an in-process caller.
 * - Admission. {@link EmbeddedMessagingBackend.setAdmission} keeps the predicate here and runs it on
 *   every delivery received for the subscription: a refused delivery is settled Completed at once (every
 *   replica reads every message on its durable and acks what it does not own, WIRE.md) and handed to
 *   `onSkip` off the receive's turn; a receive whose deliveries were all refused waits on until its
 *   deadline.
 * - Control events. The broker pushes the flow-wide stop; `subscribeControl` callbacks run on a later turn.
 * - A lost connection. A publish or settle already sent is PublicationUnknown or SettleUnknown (its effect
 *   may have happened: the contract's lost receipt), a renewal is not confirmed (renewed false), an
 *   observation is Unknown('unreachable') and a teardown incomplete; every other call, and every call
 *   made after the loss, rejects with BrokerUnavailable.
 *
 * Bytes: a publication's body is copied when the call is made, and the caller's array is never
 * transferred: a caller may publish the same envelope again under its publication id. A small body is
 * packed into the frame; over a MessagePort a large one is copied, in this thread, and the copy is moved
 * to the broker, which keeps it. A delivery's bytes are this caller's own: a large body is a copy the
 * broker moved here, so writing to it changes neither the broker's body nor another subscriber's; a
 * small one is a view sharing its buffer with the other small deliveries of its frame (at most 64 KiB),
 * so slice it to keep it apart for long.
 *
 * Time: deadlines are passed through unchanged and read on the broker's clock, so the client's `clock`
 * must share its monotonic basis (the system clock in production, the broker's FakeClock in tests); the
 * client reads it only to stamp Unknown observations and to decide when a receive filtered empty by
 * admission has reached its deadline.
 *
 * @example
 * ```ts
 * import { EmbeddedConnection } from "./rpc.ts";
 * const connection = await EmbeddedConnection.fromEnv();
 * const backend = new EmbeddedMessagingBackend(connection);
 * console.log((await backend.capabilities()).adapter); // "memory"
 * ```
 *
 * @module
 */

import { type BrokerUnavailable, ConfigError, ResourceUnavailable } from "../core/errors.ts";
import type { MessagingCapabilities } from "../backends/capabilities.ts";
import { type Clock, systemClock } from "../backends/clock.ts";
import {
  type ChannelId,
  type ChannelObservation,
  type ChannelSpec,
  checkSettlement,
  type CreditRequest,
  type Delivery,
  type DeliveryToken,
  type Envelope,
  type LeaseObservation,
  leaseObservation,
  type MessagingBackend,
  type PublishCredit,
  type Settlement,
  type SettlementOutcome,
  type SettleRequest,
  type SubscriptionId,
  type SubscriptionObservation,
  type SubscriptionSpec,
  type VerifiedChannel,
  type VerifiedSubscription,
} from "../backends/messaging.ts";
import { streamNameFor } from "../backends/names.ts";
import {
  type CleanupObservation,
  cleanupObservation,
  type Observation,
  type PublicationOutcome,
  publicationUnknown,
  settleStale,
  settleUnknown,
  unknown,
} from "../backends/outcomes.ts";
import {
  decodeDeliveries,
  decodeLease,
  decodeMovedPublication,
  decodePublication,
  decodePublicationBatch,
  decodeSettleBatch,
  decodeSettleOutcome,
  deepFreeze,
  type EmbeddedConnection,
  EmbeddedEvent,
  encodeEnvelope,
  encodeSettleCall,
  encodeToken,
  FROZEN_REPLY,
  Op,
  raiseLost,
  type Reply,
} from "./rpc.ts";

const LIVE = 0;
const SETTLED = 1;
const RETIRED = 2;
type TokenState = typeof LIVE | typeof SETTLED | typeof RETIRED;

/**
 * A token this client handed out: the server's id for the broker's token, its subscription handle, and
 * what this client did with it.
 */
class EmbeddedToken implements DeliveryToken {
  #state: TokenState = LIVE;
  /** Whether a Completed or Terminal settle of it was sent (the server may forget it once confirmed). */
  finalSent = false;
  readonly #id: number;
  readonly #handle: number;

  constructor(
    readonly subscription: SubscriptionId,
    readonly messageId: string,
    readonly streamSequence: number | null,
    readonly attempt: number,
    readonly generation: string,
    id: number,
    handle: number,
  ) {
    this.#id = id;
    this.#handle = handle;
  }

  static own(token: DeliveryToken): EmbeddedToken | null {
    return #state in token ? token as EmbeddedToken : null;
  }

  get state(): TokenState {
    return this.#state;
  }

  set state(state: TokenState) {
    this.#state = state;
  }

  get id(): number {
    return this.#id;
  }

  get handle(): number {
    return this.#handle;
  }
}

class EmbeddedDelivery implements Delivery {
  constructor(
    readonly token: DeliveryToken,
    readonly envelopeBytes: Uint8Array,
    readonly size: number,
    readonly receivedAt: number,
    readonly headers: Readonly<Record<string, string>>,
  ) {}
}

interface Admission {
  readonly admit: (delivery: Delivery) => boolean;
  readonly onSkip: ((delivery: Delivery) => void) | null;
}

interface SettleCall {
  readonly token: DeliveryToken;
  readonly settlementId: string;
  readonly final: boolean;
}

const PUBLICATION_REPLY: Reply<string, PublicationOutcome> = Object.freeze({
  decode: decodePublication,
  lost: (publicationId: string, sent: boolean, error: BrokerUnavailable) => {
    if (!sent) throw error;
    return publicationUnknown(publicationId, `the broker's receipt was lost: ${error.message}`);
  },
});

/** A publish whose body went to the broker, and where the body the broker hands back is kept for its retry. */
interface MovedPublish {
  readonly envelope: Envelope;
  readonly returned: WeakMap<Envelope, Uint8Array>;
}

const MOVED_PUBLICATION_REPLY: Reply<MovedPublish, PublicationOutcome> = Object.freeze({
  decode: (value: unknown, call: MovedPublish, arena: Uint8Array | null) => {
    const { outcome, body } = decodeMovedPublication(value, call.envelope.publicationId, arena);
    if (body !== null) call.returned.set(call.envelope, body);
    return outcome;
  },
  lost: (call: MovedPublish, sent: boolean, error: BrokerUnavailable) =>
    PUBLICATION_REPLY.lost(call.envelope.publicationId, sent, error),
});

/** Marks a token this client handed out settled once a Completed or Terminal settle of it is confirmed. */
function noteSettled(call: SettleCall, outcome: SettlementOutcome): SettlementOutcome {
  const own = EmbeddedToken.own(call.token);
  if (outcome.kind === "settle_confirmed" && call.final && own !== null && own.state === LIVE) {
    own.state = SETTLED;
  }
  return outcome;
}

const SETTLE_REPLY: Reply<SettleCall, SettlementOutcome> = Object.freeze({
  decode: (value: unknown, call: SettleCall) =>
    noteSettled(call, decodeSettleOutcome(value, call.token, call.settlementId)),
  lost: (call: SettleCall, sent: boolean, error: BrokerUnavailable) => {
    if (!sent) throw error;
    return settleUnknown(call.token, `the broker's confirmation was lost: ${error.message}`);
  },
});

const PUBLICATION_BATCH_REPLY: Reply<readonly string[], PublicationOutcome[]> = Object.freeze({
  decode: decodePublicationBatch,
  lost: (publicationIds: readonly string[], sent: boolean, error: BrokerUnavailable) => {
    if (!sent) throw error;
    return publicationIds.map((id) =>
      publicationUnknown(id, `the broker's receipt was lost: ${error.message}`)
    );
  },
});

const SETTLE_BATCH_REPLY: Reply<readonly SettleCall[], SettlementOutcome[]> = Object.freeze({
  decode: (value: unknown, calls: readonly SettleCall[]) => {
    const outcomes = decodeSettleBatch(value, calls);
    for (let i = 0; i < calls.length; i++) noteSettled(calls[i], outcomes[i]);
    return outcomes;
  },
  lost: (calls: readonly SettleCall[], sent: boolean, error: BrokerUnavailable) => {
    if (!sent) throw error;
    return calls.map((call) =>
      settleUnknown(call.token, `the broker's confirmation was lost: ${error.message}`)
    );
  },
});

const LEASE_REPLY: Reply<DeliveryToken, LeaseObservation> = Object.freeze({
  decode: decodeLease,
  lost: (token: DeliveryToken, _sent: boolean, error: BrokerUnavailable) =>
    leaseObservation(token, false, null, `the renewal was not confirmed: ${error.message}`),
});

const OBSERVATION_REPLY: Reply<Clock, Observation<never>> = Object.freeze({
  decode: (value: unknown) => deepFreeze(value as Observation<never>),
  lost: (clock: Clock, _sent: boolean, error: BrokerUnavailable) =>
    unknown("unreachable", clock, error.message),
});

const CLEANUP_REPLY: Reply<readonly string[], CleanupObservation> = Object.freeze({
  decode: (value: unknown) => deepFreeze(value as CleanupObservation),
  lost: (names: readonly string[], _sent: boolean, error: BrokerUnavailable) =>
    cleanupObservation(false, [], [...new Set(names)], `the teardown was not confirmed: ${error.message}`),
});

/** Options of an {@link EmbeddedMessagingBackend}. */
export interface EmbeddedMessagingOptions {
  /** The clock sharing the broker's monotonic basis (the system clock by default). */
  readonly clock?: Clock;
}

/**
 * The embedded broker's MessagingBackend client (see the module comment). Any number may share one
 * connection with the payload and runtime-store proxies.
 */
export class EmbeddedMessagingBackend implements MessagingBackend {
  readonly #connection: EmbeddedConnection;
  readonly #clock: Clock;
  readonly #admission = new Map<number, Admission>();
  readonly #controlCallbacks: (() => void)[] = [];
  readonly #waiting = new Set<(deliveries: readonly Delivery[]) => void>();
  /** Server token ids of this client's tokens the garbage collector took, not yet sent. */
  #released: number[] = [];
  readonly #registry = new FinalizationRegistry<number>((tokenId) => this.#release(tokenId));
  #controlSubscribed = false;
  #stopSeen = false;
  #shutDown = false;
  /**
   * The hosted broker refuses a connection's later data on a channel behind its refused publication until
   * that one is taken (and frames reach it in the order sent), so order holds across refusals.
   */
  readonly ordersRefusedPublications = true;
  /** Bodies the broker handed back for envelopes whose own body went to it, kept while the envelope lives. */
  readonly #returned = new WeakMap<Envelope, Uint8Array>();

  static readonly #DELIVERIES: Reply<EmbeddedMessagingBackend, readonly Delivery[]> = Object.freeze({
    decode: (value: unknown, self: EmbeddedMessagingBackend, arena: Uint8Array | null) =>
      self.#decodeDeliveries(value, arena),
    lost: raiseLost,
  });

  constructor(connection: EmbeddedConnection, options: EmbeddedMessagingOptions = {}) {
    this.#connection = connection;
    this.#clock = options.clock ?? systemClock;
  }

  /** The hosted broker's capabilities. */
  capabilities(): Promise<MessagingCapabilities> {
    return this.#call(
      "capabilities",
      Op.messagingCapabilities,
      [],
      null,
      FROZEN_REPLY as Reply<null, MessagingCapabilities>,
    );
  }

  /** {@link MessagingBackend.ensureChannel}, applied by the hosted broker. */
  ensureChannel(spec: ChannelSpec, operationId: string): Promise<VerifiedChannel> {
    return this.#call(
      "ensureChannel",
      Op.ensureChannel,
      [spec, operationId],
      null,
      FROZEN_REPLY as Reply<null, VerifiedChannel>,
    );
  }

  /** {@link MessagingBackend.ensureSubscription}, applied by the hosted broker. */
  ensureSubscription(spec: SubscriptionSpec, operationId: string): Promise<VerifiedSubscription> {
    return this.#call(
      "ensureSubscription",
      Op.ensureSubscription,
      [spec, operationId],
      null,
      FROZEN_REPLY as Reply<null, VerifiedSubscription>,
    );
  }

  /**
   * {@link MessagingBackend.publish}; a publish whose connection is lost after sending is PublicationUnknown.
   * A transferable body too large to pack goes to the broker over a MessagePort without a copy; unless the
   * publication is accepted the broker hands a copy back, which a retry of the same envelope sends.
   */
  publish(envelope: Envelope, deadline: number): Promise<PublicationOutcome> {
    if (this.#shutDown) return this.#refused("publish");
    const connection = this.#connection;
    const body = this.#bodyOf(envelope);
    if (body === null) return this.#bodyGone(envelope);
    const given = envelope.bodyTransferable;
    const handle = connection.channelHandle(envelope.channel);
    const wire = encodeEnvelope(envelope, handle, given ? connection.giver : connection, deadline, body);
    if (!given || !connection.movesGiven(body)) {
      return connection.call(Op.publish, wire, envelope.publicationId, PUBLICATION_REPLY);
    }
    this.#returned.delete(envelope);
    const call: MovedPublish = { envelope, returned: this.#returned };
    return connection.call(Op.publishMoved, wire, call, MOVED_PUBLICATION_REPLY);
  }

  /**
   * {@link MessagingBackend.publishBatch}: consecutive entries go in one call (one frame entry, one reply
   * for all); an entry whose transferable body moves to the broker goes in a call of its own between them,
   * in the same frame, so the broker takes them in order. A batch whose connection is lost after sending is
   * PublicationUnknown entry by entry. An entry whose moved body is with the broker refuses the whole
   * batch before anything is sent.
   */
  publishBatch(envelopes: readonly Envelope[], deadline: number): Promise<readonly PublicationOutcome[]> {
    if (this.#shutDown) return this.#refused("publishBatch");
    const bodies: Uint8Array[] = new Array(envelopes.length);
    for (let i = 0; i < envelopes.length; i++) {
      const body = this.#bodyOf(envelopes[i]);
      if (body === null) return this.#bodyGone(envelopes[i]);
      bodies[i] = body;
    }
    const connection = this.#connection;
    const parts: Promise<readonly PublicationOutcome[]>[] = [];
    let wires: unknown[] = [deadline];
    let ids: string[] = [];
    const sendRun = () => {
      if (ids.length === 0) return;
      parts.push(connection.call(Op.publishBatch, wires, ids, PUBLICATION_BATCH_REPLY));
      wires = [deadline];
      ids = [];
    };
    for (let i = 0; i < envelopes.length; i++) {
      const envelope = envelopes[i];
      if (envelope.bodyTransferable && connection.movesGiven(bodies[i])) {
        sendRun();
        parts.push(this.publish(envelope, deadline).then((outcome) => [outcome]));
        continue;
      }
      wires.push(
        encodeEnvelope(
          envelope,
          connection.channelHandle(envelope.channel),
          envelope.bodyTransferable ? connection.giver : connection,
          null,
          bodies[i],
        ),
      );
      ids.push(envelope.publicationId);
    }
    sendRun();
    if (parts.length === 1) return parts[0];
    return Promise.all(parts).then((outcomes) => outcomes.flat());
  }

  /**
   * {@link MessagingBackend.reserveCredit}, granted by the hosted broker to this connection (a connection
   * that ends gives its credit back); Unknown('unreachable') when the connection is lost.
   */
  reserveCredit(
    channel: ChannelId,
    request: CreditRequest,
    deadline: number,
  ): Promise<Observation<PublishCredit>> {
    if (this.#shutDown) return this.#refused("reserveCredit");
    const args = [
      this.#connection.channelHandle(channel),
      request.items,
      request.bytes,
      request.minBytes,
      deadline,
    ];
    return this.#connection.call(
      Op.reserveCredit,
      args,
      this.#clock,
      OBSERVATION_REPLY as Reply<Clock, Observation<PublishCredit>>,
    );
  }

  /** {@link MessagingBackend.releaseCredit}: sent without waiting, ahead of every later call of this client. */
  releaseCredit(channel: ChannelId): void {
    if (this.#shutDown) throw this.#closedError("releaseCredit");
    this.#connection.send(Op.releaseCredit, [this.#connection.channelHandle(channel)]);
  }

  /** {@link MessagingBackend.observePublication}, answered by the hosted broker's ledger. */
  observePublication(envelope: Envelope): Promise<PublicationOutcome> {
    if (this.#shutDown) return this.#refused("observePublication");
    const body = this.#bodyOf(envelope);
    if (body === null) return this.#bodyGone(envelope);
    const connection = this.#connection;
    const wire = encodeEnvelope(envelope, connection.channelHandle(envelope.channel), connection, null, body);
    return connection.call(Op.observePublication, wire, envelope.publicationId, PUBLICATION_REPLY);
  }

  /** The bytes to send for `envelope`: its body, or the copy the broker handed back; null when neither is left. */
  #bodyOf(envelope: Envelope): Uint8Array | null {
    const body = this.#returned.get(envelope) ?? envelope.body;
    return body.buffer instanceof ArrayBuffer && body.buffer.detached ? null : body;
  }

  /**
   * Sending again an envelope whose body went to the broker and did not come back: after a lost connection
   * its BrokerUnavailable, as for any call made then; else a ConfigError, since its publish is still
   * waiting for the broker's answer.
   */
  #bodyGone(envelope: Envelope): Promise<never> {
    return Promise.reject(
      this.#connection.lostReason ?? new ConfigError(
        `publication ${envelope.publicationId} was sent again while its moved body is with the broker`,
        "send a transferable envelope again only after its previous publish has its outcome",
        { publication_id: envelope.publicationId },
      ),
    );
  }

  /** {@link MessagingBackend.receive}: a long-poll the broker answers; admission filters here. */
  receive(
    subscription: SubscriptionId,
    itemCredit: number,
    byteCredit: number,
    deadline: number,
  ): Promise<readonly Delivery[]> {
    if (this.#shutDown) return this.#refused("receive");
    const args = [this.#connection.subscriptionHandle(subscription), itemCredit, byteCredit, deadline];
    return this.#admission.size === 0
      ? this.#poll(Op.receive, args)
      : this.#admitted(Op.receive, args, deadline);
  }

  /** {@link MessagingBackend.receiveAny}: as {@link receive}, over several subscriptions. */
  receiveAny(
    subscriptions: readonly SubscriptionId[],
    itemCredit: number,
    byteCredit: number,
    deadline: number,
  ): Promise<readonly Delivery[]> {
    if (this.#shutDown) return this.#refused("receiveAny");
    const handles = subscriptions.map((subscription) => this.#connection.subscriptionHandle(subscription));
    const args = [handles, itemCredit, byteCredit, deadline];
    return this.#admission.size === 0
      ? this.#poll(Op.receiveAny, args)
      : this.#admitted(Op.receiveAny, args, deadline);
  }

  /** {@link MessagingBackend.renew}; a renewal whose answer is lost reads as not renewed. */
  renew(token: DeliveryToken): Promise<LeaseObservation> {
    if (this.#shutDown) return this.#refused("renew");
    return this.#connection.call(Op.renew, this.#tokenWire(token), token, LEASE_REPLY);
  }

  /**
   * {@link MessagingBackend.settle}. Refuses a malformed settlement before anything else (DELIV-15); a
   * token retired here is SettleStale without a round trip; a settle whose connection is lost after
   * sending is SettleUnknown.
   */
  settle(token: DeliveryToken, outcome: Settlement, settlementId: string): Promise<SettlementOutcome> {
    try {
      this.#checkSettle("settle", outcome, settlementId);
    } catch (error) {
      return Promise.reject(error);
    }
    const own = EmbeddedToken.own(token);
    if (own !== null && own.state === RETIRED) {
      return Promise.resolve(settleStale(token, token.attempt, token.generation));
    }
    const call: SettleCall = { token, settlementId, final: outcome.kind !== "retry" };
    return this.#connection.call(
      Op.settle,
      this.#settleWire(token, outcome, settlementId),
      call,
      SETTLE_REPLY,
    );
  }

  /**
   * {@link MessagingBackend.settleBatch}: every request checked first (DELIV-15), a token retired here
   * SettleStale without the wire, the rest in one call whose reply is one count when every entry was
   * confirmed; SettleUnknown entry by entry when the connection is lost after sending.
   */
  settleBatch(requests: readonly SettleRequest[]): Promise<readonly SettlementOutcome[]> {
    try {
      for (const request of requests) this.#checkSettle("settleBatch", request.outcome, request.settlementId);
    } catch (error) {
      return Promise.reject(error);
    }
    const outcomes: SettlementOutcome[] = new Array(requests.length);
    const wires: unknown[][] = [];
    const calls: SettleCall[] = [];
    const sent: number[] = [];
    for (let i = 0; i < requests.length; i++) {
      const { token, outcome, settlementId } = requests[i];
      const own = EmbeddedToken.own(token);
      if (own !== null && own.state === RETIRED) {
        outcomes[i] = settleStale(token, token.attempt, token.generation);
        continue;
      }
      wires.push(this.#settleWire(token, outcome, settlementId));
      calls.push({ token, settlementId, final: outcome.kind !== "retry" });
      sent.push(i);
    }
    if (calls.length === 0) return Promise.resolve(outcomes);
    return this.#connection.call(Op.settleBatch, wires, calls, SETTLE_BATCH_REPLY).then((answered) => {
      for (let j = 0; j < sent.length; j++) outcomes[sent[j]] = answered[j];
      return outcomes;
    });
  }

  #checkSettle(operation: string, outcome: Settlement, settlementId: string): void {
    if (this.#shutDown) throw this.#closedError(operation);
    checkSettlement(outcome);
    if (typeof settlementId !== "string" || settlementId === "") {
      throw new ConfigError(
        "an operation id must be a non-empty string",
        "pass the settlement's stable identity",
      );
    }
  }

  /** A settle call's wire for `token` (by its server id alone while the server keeps it). */
  #settleWire(token: DeliveryToken, outcome: Settlement, settlementId: string): unknown[] {
    const own = EmbeddedToken.own(token);
    if (own === null) {
      const handle = this.#connection.subscriptionHandle(token.subscription);
      return encodeSettleCall(token, 0, handle, outcome, settlementId);
    }
    const wire = encodeSettleCall(token, own.id, own.finalSent ? own.handle : null, outcome, settlementId);
    if (outcome.kind !== "retry") own.finalSent = true;
    return wire;
  }

  /**
   * Retires a token this client handed out and has neither settled nor retired: true, and the broker is
   * told (without waiting) so no later settle of it can decide anything. False for any other token.
   */
  supersede(token: DeliveryToken): boolean {
    if (this.#shutDown) throw this.#closedError("supersede");
    const own = EmbeddedToken.own(token);
    if (own === null || own.state !== LIVE) return false;
    own.state = RETIRED;
    this.#connection.send(Op.supersede, encodeToken(own, own.id, own.handle));
    return true;
  }

  /** The hosted subscription's counters; Unknown('unreachable') when the connection is lost. */
  observeSubscription(subscription: SubscriptionId): Promise<Observation<SubscriptionObservation>> {
    return this.#observe(Op.observeSubscription, this.#connection.subscriptionHandle(subscription));
  }

  /** The hosted channel's retained range; Unknown('unreachable') when the connection is lost. */
  observeChannel(channel: ChannelId): Promise<Observation<ChannelObservation>> {
    return this.#observe(Op.observeChannel, this.#connection.channelHandle(channel));
  }

  /** The hosted subscription's ack floor; Unknown('unreachable') when the connection is lost. */
  observeAckFloor(subscription: SubscriptionId): Promise<Observation<number>> {
    return this.#observe(Op.observeAckFloor, this.#connection.subscriptionHandle(subscription));
  }

  /**
   * Keeps `admit` here for `subscription` (see the module comment); always true. A later call for the
   * same subscription replaces the filter.
   */
  setAdmission(
    subscription: SubscriptionId,
    admit: (delivery: Delivery) => boolean,
    onSkip?: (delivery: Delivery) => void,
  ): boolean {
    if (this.#shutDown) throw this.#closedError("setAdmission");
    this.#admission.set(this.#connection.subscriptionHandle(subscription), { admit, onSkip: onSkip ?? null });
    return true;
  }

  /** Always 0: deliveries come from the broker per receive, none is parked here. */
  prefetched(_subscription: SubscriptionId): number {
    return 0;
  }

  /** Calls `callback` on a later turn once the broker reports the flow-wide stop (at once if it already did). */
  subscribeControl(callback: () => void): void {
    if (this.#shutDown) throw this.#closedError("subscribeControl");
    this.#controlCallbacks.push(callback);
    if (this.#stopSeen) {
      queueMicrotask(callback);
      return;
    }
    if (this.#controlSubscribed) return;
    this.#controlSubscribed = true;
    this.#connection.onEvent(EmbeddedEvent.controlStop, () => this.#onStop());
    this.#connection.send(Op.subscribeControl, []);
  }

  /**
   * Ends this client: every receive still waiting returns `[]` at once, the broker hands back whatever a
   * receive of this connection leases from now on, and later calls throw ResourceUnavailable. The
   * channels stay, and so does the connection (the payload and ledger proxies may still use it).
   */
  shutdown(): Promise<void> {
    if (this.#shutDown) return Promise.resolve();
    this.#shutDown = true;
    this.#connection.send(Op.messagingShutdown, []);
    const waiting = [...this.#waiting];
    this.#waiting.clear();
    for (const resolve of waiting) resolve([]);
    return Promise.resolve();
  }

  /** {@link MessagingBackend.close}, applied by the hosted broker; incomplete when the connection is lost. */
  close(owned: readonly ChannelId[], expectedGeneration: string): Promise<CleanupObservation> {
    const names = owned.map((id) => streamNameFor(id.flowId, id.runId, id.node));
    return this.#call("close", Op.closeChannels, [owned, expectedGeneration], names, CLEANUP_REPLY);
  }

  // ---- internals ----------------------------------------------------------------------------------

  #call<C, T>(operation: string, op: Op, args: unknown[], context: C, reply: Reply<C, T>): Promise<T> {
    if (this.#shutDown) return this.#refused(operation);
    return this.#connection.call(op, args, context, reply);
  }

  #observe<T>(op: Op, handle: number): Promise<Observation<T>> {
    if (this.#shutDown) return this.#refused("observe");
    return this.#connection.call(
      op,
      [handle],
      this.#clock,
      OBSERVATION_REPLY as Reply<Clock, Observation<T>>,
    );
  }

  #tokenWire(token: DeliveryToken): unknown[] {
    const own = EmbeddedToken.own(token);
    return own !== null
      ? encodeToken(token, own.id, own.handle)
      : encodeToken(token, 0, this.#connection.subscriptionHandle(token.subscription));
  }

  /** Tells the server (batched, without a reply) that a token is gone, so it forgets the broker's. */
  #release(tokenId: number): void {
    if (this.#released.push(tokenId) > 1) return;
    queueMicrotask(() => {
      const released = this.#released;
      this.#released = [];
      this.#connection.send(Op.releaseTokens, released);
    });
  }

  /** One long-poll; a shutdown resolves it with `[]` at once. */
  #poll(op: Op, args: unknown[]): Promise<readonly Delivery[]> {
    const { promise, resolve, reject } = Promise.withResolvers<readonly Delivery[]>();
    this.#waiting.add(resolve);
    this.#connection.call(op, args, this, EmbeddedMessagingBackend.#DELIVERIES).then(
      (deliveries) => {
        if (this.#waiting.delete(resolve)) resolve(deliveries);
      },
      (error) => {
        if (this.#waiting.delete(resolve)) reject(error);
      },
    );
    return promise;
  }

  /** Long-polls until a delivery is admitted, the broker returns none, or the deadline passes. */
  async #admitted(op: Op, args: unknown[], deadline: number): Promise<readonly Delivery[]> {
    for (;;) {
      const batch = await this.#poll(op, args);
      const kept = this.#admit(batch);
      if (kept.length > 0 || batch.length === 0 || this.#shutDown || this.#clock.monotonic() >= deadline) {
        return kept;
      }
    }
  }

  /** The deliveries admission keeps; each refused one is settled Completed and reported through onSkip. */
  #admit(batch: readonly Delivery[]): readonly Delivery[] {
    let kept: Delivery[] | null = null;
    for (let i = 0; i < batch.length; i++) {
      const delivery = batch[i];
      const token = delivery.token as EmbeddedToken;
      const admission = this.#admission.get(token.handle);
      if (admission === undefined || admission.admit(delivery)) {
        kept?.push(delivery);
        continue;
      }
      kept ??= batch.slice(0, i);
      const id = `skip/${token.messageId}/${token.attempt}`;
      this.settle(token, { kind: "completed" }, id).catch(() => {});
      const onSkip = admission.onSkip;
      if (onSkip !== null) queueMicrotask(() => onSkip(delivery));
    }
    return kept ?? batch;
  }

  #decodeDeliveries(value: unknown, arena: Uint8Array | null): readonly Delivery[] {
    const connection = this.#connection;
    const registry = this.#registry;
    return decodeDeliveries(
      value,
      arena,
      (
        tokenId,
        handle,
        messageId,
        streamSequence,
        attempt,
        generation,
        envelopeBytes,
        size,
        receivedAt,
        headers,
      ) => {
        const subscription = connection.subscriptionOf(handle);
        const token = new EmbeddedToken(
          subscription,
          messageId,
          streamSequence,
          attempt,
          generation,
          tokenId,
          handle,
        );
        registry.register(token, tokenId);
        return new EmbeddedDelivery(token, envelopeBytes, size, receivedAt, headers);
      },
    );
  }

  #onStop(): void {
    if (this.#stopSeen) return;
    this.#stopSeen = true;
    for (const callback of this.#controlCallbacks) queueMicrotask(callback);
  }

  #closedError(operation: string): ResourceUnavailable {
    return new ResourceUnavailable(
      `the embedded messaging client was shut down; ${operation} is no longer possible`,
      "create a new EmbeddedMessagingBackend on the connection",
    );
  }

  #refused<T>(operation: string): Promise<T> {
    return Promise.reject(this.#closedError(operation));
  }
}
