/**
 * The embedded broker: the local engine's supervisor hosts one memory MessagingBackend, one memory
 * PayloadStore and the run's RuntimeStore (the file store under `.videoflow/`) and serves them to every
 * node worker over the protocol of `src/embedded/rpc.ts`: a MessagePort per Deno Worker
 * ({@link EmbeddedBroker.openPort}) and a TCP loopback listener for `deno run` subprocesses
 * ({@link EmbeddedBroker.listen}, whose address and per-run secret {@link EmbeddedBroker.workerEnv} hands
 * out). The workers' side is `EmbeddedConnection` with the three proxies built on it.
 *
 * What the server guarantees:
 * - A connection's calls start in the order they were made; a long-poll receive waits in the broker and
 *   holds back nothing else. Results are coalesced per turn.
 * - A connection's data on a channel that refuses when full is taken in the order it was published: once
 *   one publication was refused, the connection's later data publications on that channel are refused
 *   behind it until it is taken (its messenger retries them in order), whatever room opens meanwhile.
 * - A connection holds the publish credit it reserves (the hosted model counts it per connection), and it
 *   is given back when the connection ends or its messaging shuts down, so a dead worker's credit never
 *   holds a channel's room. A batch call (publish or settle) is taken entry by entry exactly as that many
 *   calls in a row would be, its order guarantee included, and is answered as one number when every entry
 *   was accepted as new (or confirmed).
 * - A server-side exception is its call's error, rebuilt client-side as the same class.
 * - The hosted models hit their fault barriers as they do in-process; the transport adds none.
 * - A worker's death never acks what it held: its leases lapse through the broker's ack wait. A receive
 *   that completes after its connection ended (or after the client's messaging shut down) never reached
 *   anyone, so its deliveries are handed back at once (settled Retry, which costs them an attempt exactly
 *   as a lapsed lease would).
 * - A large publication body from a port client arrives as a copy the client moved here, and is kept as
 *   it is; each delivery of it is a copy this thread makes and moves to the receiver, which then owns it
 *   (the broker keeps its own for redelivery). A small body is copied into its frame's arena, and
 *   everything over TCP is copied by the socket. Payloads likewise: a put's bytes arrive in a frame of
 *   their own (moved or deserialized), so the store keeps them without a copy
 *   (`MemoryPayloadStore.putOwned`); a read is a fresh copy the store made, which a MessagePort moves.
 * - Closing the broker closes every connection (each client's waiting calls end as a lost connection
 *   decides: BrokerUnavailable, or the truthful unknown outcome where the contract has one),
 *   stops the listener and shuts the messaging model down; the payload store has nothing to release and
 *   the runtime store stays its creator's to close.
 *
 * What the supervisor must know:
 * - A MessagePort reports no close: a Deno Worker that dies (`Deno.exit`, a crash) leaves its connection
 *   open until the supervisor calls {@link BrokerConnection.disconnect} (after a missed heartbeat). A TCP
 *   connection ends with its socket. A subprocess needs `--allow-net=127.0.0.1` and
 *   `--allow-env=VF_EMBEDDED_BROKER,VF_EMBEDDED_BROKER_SECRET`.
 * - A long-poll receive is answered by the first publication that wakes it; when its reply is encoded the
 *   server takes whatever else became available within the call's credits (not with faults installed, so
 *   barrier hit counts stay as a test scripts them), so a burst reaches a receiver as one batch.
 * - The hosted models serve every connection at once: a `byteBudget` given to the messaging model bounds
 *   all workers together, and a small publication body is kept as a view into the arena of the frame it
 *   came in (at most 64 KiB stays alive per retained small body).
 *
 * The hosted models are public ({@link EmbeddedBroker.messaging}, {@link EmbeddedBroker.payload},
 * {@link EmbeddedBroker.runtimeStore}): their hooks (commitControl, pauseAcceptance, failObservation,
 * corrupt, ...) are the supervisor's and the tests' controls.
 *
 * @example
 * ```ts
 * const broker = new EmbeddedBroker();
 * const port = broker.openPort("detect-0"); // transfer it to the worker: new Worker(...).postMessage(port, [port])
 * const address = await broker.listen();     // tcp://127.0.0.1:PORT, for subprocesses (with workerEnv())
 * console.log(address.startsWith("tcp://127.0.0.1:"), broker.connections().length); // true 1
 * await broker.close();
 * ```
 *
 * @module
 */

import { BrokerUnavailable, ConfigError, ResourceUnavailable } from "../core/errors.ts";
import { randomHex } from "../core/hex.ts";
import { type Clock, systemClock } from "../backends/clock.ts";
import { faultsInstalled } from "../backends/faults.ts";
import { MemoryMessagingBackend } from "../backends/memory/messaging.ts";
import { MemoryPayloadStore, StaticLedger } from "../backends/memory/payload.ts";
import {
  type ChannelId,
  channelId,
  creditRequest,
  type Delivery,
  type DeliveryToken,
  type Envelope,
  type LeaseObservation,
  MessageKind,
  retry,
  type SettlementOutcome,
  type SettleRequest,
  type SubscriptionId,
  subscriptionId,
  subscriptionKey,
} from "../backends/messaging.ts";
import { type PublicationOutcome, rejected } from "../backends/outcomes.ts";
import type { PayloadReadOutcome } from "../backends/payload.ts";
import type { RuntimeStore } from "../backends/runtime_store.ts";
import {
  decodeEnvelope,
  decodeSettlement,
  decodeToken,
  DeferredFlush,
  EMBEDDED_BROKER_ENV,
  EMBEDDED_BROKER_SECRET_ENV,
  EMBEDDED_PROTOCOL_VERSION,
  EmbeddedEvent,
  encodeDeliveries,
  encodeLease,
  encodeMovedPublication,
  encodePublication,
  encodePublicationBatch,
  encodeSettleBatch,
  encodeSettleOutcome,
  envelopeDeadline,
  errorToWire,
  Frame,
  FrameBuilder,
  type FrameLink,
  IdTable,
  Op,
  portLink,
  secretMatches,
  type SettleWire,
  SHORT_SETTLE_FIELDS,
  socketLink,
  TOKEN_FIELDS,
} from "../embedded/rpc.ts";

/** How long a TCP client has to say hello before the server drops it, by default (seconds). */
export const DEFAULT_HELLO_TIMEOUT_SECONDS = 10;

/** How the broker is composed; every service defaults to a fresh memory model on `clock`. */
export interface EmbeddedBrokerOptions {
  /** The clock the default models read (the system clock by default). */
  readonly clock?: Clock;
  readonly messaging?: MemoryMessagingBackend;
  readonly payload?: MemoryPayloadStore;
  /** The run ledger served to workers; null (the default) serves none (its calls fail ResourceUnavailable). */
  readonly runtimeStore?: RuntimeStore | null;
  /** The secret TCP clients must present; a fresh random one by default. */
  readonly secret?: string;
  /** How long a TCP client may take to say hello (default {@link DEFAULT_HELLO_TIMEOUT_SECONDS}). */
  readonly helloTimeoutSeconds?: number;
  /**
   * Called when a dead letter was stored; its publication is answered once the returned promise settles,
   * so a supervisor can keep the letter somewhere that outlives the broker before the failed input it
   * records is acked. None by default.
   */
  readonly onDeadLetter?: () => Promise<void>;
  /**
   * Called with a connection's label when it ends holding deliveries; their release back to the broker
   * waits for the returned promise (at once when it returns null, the default). The supervisor counts the
   * death of the worker behind the connection against the inputs inside its node first, so a sibling that
   * takes one of them at once reads that count.
   */
  readonly releaseAfter?: (label: string) => Promise<void> | null;
}

/** What a {@link BrokerConnection} serves: the hosted services, shared by every connection. */
interface Services {
  readonly messaging: MemoryMessagingBackend;
  readonly payload: MemoryPayloadStore;
  readonly runtimeStore: RuntimeStore | null;
  stopCommitted(): boolean;
  forget(connection: BrokerConnection): void;
  /** See {@link EmbeddedBrokerOptions.onDeadLetter}. */
  deadLetterStored(): Promise<void>;
  /** See {@link EmbeddedBrokerOptions.releaseAfter}. */
  releaseAfter(label: string): Promise<void> | null;
}

let connectionIds = 0;

/**
 * The server end of one worker's connection. Created by {@link EmbeddedBroker}; the supervisor keeps it
 * to {@link disconnect} a worker it has given up on.
 */
export class BrokerConnection {
  /** Unique within the process. */
  readonly id: number = ++connectionIds;
  readonly #link: FrameLink;
  readonly #services: Services;
  /** The secret a hello must present; null on a MessagePort (the port itself is the capability). */
  readonly #secret: string | null;
  #label: string;
  #welcomed = false;
  #open = true;
  #messagingOpen = true;
  #controlSubscribed = false;
  #helloTimer: ReturnType<typeof setTimeout> | undefined;
  readonly #channels: (ChannelId | undefined)[] = [];
  readonly #subs: (SubscriptionId | undefined)[] = [];
  readonly #subHandles = new WeakMap<SubscriptionId, number>();
  readonly #subKeys = new Map<string, number>();
  readonly #results: FrameBuilder;
  readonly #flusher = new DeferredFlush(() => this.#flush());
  readonly #handleOf = (subscription: SubscriptionId) => this.#handleFor(subscription);
  /** Broker tokens of deliveries handed out on this connection, by id, until settled or released. */
  readonly #tokens = new IdTable<DeliveryToken>();
  /**
   * Per channel handle, the earliest-arrived data publication of this connection the broker refused as
   * retryable and has not taken since: until it is, later data publications on that channel are refused
   * too, so one publisher's outputs are taken in the order it made them (its messenger retries them in
   * that order).
   */
  readonly #refusedHeads = new Map<number, { readonly publicationId: string; readonly arrival: number }>();
  /** Data publications this connection sent, counted as they arrive: their order. */
  #dataArrivals = 0;
  #tokenCount = 0;
  readonly #tokenIdOf = (token: DeliveryToken) => {
    const id = ++this.#tokenCount;
    this.#tokens.add(id, token);
    return id;
  };

  constructor(
    link: FrameLink,
    services: Services,
    label: string,
    secret: string | null,
    helloTimeoutSeconds: number | null,
  ) {
    this.#link = link;
    this.#results = new FrameBuilder(Frame.results, link.kind);
    this.#services = services;
    this.#label = label;
    this.#secret = secret;
    if (helloTimeoutSeconds !== null) {
      this.#helloTimer = setTimeout(
        () => this.disconnect(`no hello within ${helloTimeoutSeconds} s`),
        helloTimeoutSeconds * 1000,
      );
    }
    link.start((frame) => this.#onFrame(frame), () => this.#closed());
  }

  /** The worker's name: the one the supervisor gave the port, else the one its hello named. */
  get label(): string {
    return this.#label;
  }

  /** `port` or `tcp`. */
  get transport(): "port" | "tcp" {
    return this.#link.kind;
  }

  /** Whether the connection still serves calls. */
  get open(): boolean {
    return this.#open;
  }

  /**
   * Ends the connection: the client is told why (its waiting calls end with BrokerUnavailable), nothing
   * it holds is settled (its leases lapse through the ack wait). Idempotent.
   */
  disconnect(reason = "disconnected by the supervisor"): Promise<void> {
    if (this.#open) {
      this.#flush();
      this.#link.send([Frame.bye, reason], []);
    }
    return this.#link.close();
  }

  /** Pushes the flow-wide stop to this worker if it subscribed to control events. */
  notifyStop(): void {
    if (this.#controlSubscribed && this.#open) {
      this.#link.send([Frame.event, EmbeddedEvent.controlStop, null], []);
    }
  }

  /**
   * The connection ended (its worker exited, crashed or was disconnected): its publish credit is given back
   * at once, and every delivery it still held goes back to the broker as a retry, once the supervisor's `releaseAfter` says (at once by default),
   * instead of waiting out its lease, so a replacement or a sibling takes it now (a settle of it that is
   * still on its way becomes stale).
   */
  #closed(): void {
    this.#open = false;
    this.#messagingOpen = false;
    clearTimeout(this.#helloTimer);
    this.#results.take(this.#link.kind);
    this.#services.messaging.releaseCreditOf(this);
    const tokens = this.#tokens.drain();
    this.#services.forget(this);
    if (tokens.length === 0) return;
    const messaging = this.#services.messaging;
    const release = () => {
      for (const token of tokens) {
        const settlementId = `released:${this.id}:${token.messageId}:${token.attempt}`;
        if (messaging.settleNow(token, retry(), settlementId) === null) {
          messaging.settle(token, retry(), settlementId).catch(() => {});
        }
      }
    };
    const after = this.#services.releaseAfter(this.#label);
    if (after === null) release();
    else after.then(release, release);
  }

  #onFrame(frame: unknown[]): void {
    if (!this.#open) return;
    switch (frame[0]) {
      case Frame.calls:
        if (this.#welcomed) this.#dispatch(frame);
        else this.#refuse("the first frame must be a hello");
        return;
      case Frame.hello:
        this.#hello(frame);
        return;
      case Frame.bye:
        this.#link.close();
        return;
      default:
        this.#refuse(`a frame of unknown kind ${String(frame[0])}`);
    }
  }

  #hello(frame: unknown[]): void {
    if (this.#welcomed) {
      this.#refuse("a second hello");
      return;
    }
    if (frame[1] !== EMBEDDED_PROTOCOL_VERSION) {
      this.#refuse(`protocol version ${String(frame[1])} (this broker speaks ${EMBEDDED_PROTOCOL_VERSION})`);
      return;
    }
    if (this.#secret !== null && !secretMatches(frame[2], this.#secret)) {
      this.#refuse("a wrong secret");
      return;
    }
    clearTimeout(this.#helloTimer);
    if (this.#label === "" && typeof frame[3] === "string") this.#label = frame[3];
    this.#welcomed = true;
    this.#link.send([Frame.welcome, EMBEDDED_PROTOCOL_VERSION], []);
  }

  #refuse(why: string): void {
    const error = new BrokerUnavailable(
      `the embedded broker refused the connection: ${why}`,
      `connect with this run's ${EMBEDDED_BROKER_SECRET_ENV} and the same videoflow version`,
      { connection: this.#label },
    );
    this.#link.send([Frame.refused, errorToWire(error)], []);
    this.#link.close();
  }

  #dispatch(frame: unknown[]): void {
    const arena = frame[1] as Uint8Array | null;
    for (let i = 2; i < frame.length && this.#open; i += 3) {
      const op = frame[i] as Op;
      const id = frame[i + 1] as number;
      const args = frame[i + 2] as unknown[];
      let result: unknown;
      try {
        result = this.#invoke(op, args, arena);
      } catch (error) {
        this.#fail(id, error);
        continue;
      }
      if (result instanceof Promise) {
        result.then((value) => this.#answer(id, op, args, value), (error) => this.#fail(id, error));
      } else {
        this.#answer(id, op, args, result);
      }
    }
  }

  /**
   * Encodes a call's result into the results frame being built (packed bytes go to that frame's arena,
   * so encoding and queueing happen in one step). A receive is encoded (or handed back) even when nobody
   * will read the reply.
   */
  #answer(id: number, op: Op, args: unknown[], value: unknown): void {
    let wire = value;
    switch (op) {
      case Op.publish:
      case Op.observePublication:
        wire = encodePublication(value as PublicationOutcome);
        break;
      case Op.publishMoved:
        if (id === 0 || !this.#open) return;
        wire = encodeMovedPublication(value as PublicationOutcome, args[2] as Uint8Array, this.#results);
        break;
      case Op.receive:
        wire = this.#handOut(value as readonly Delivery[], () => args[0] as number);
        break;
      case Op.receiveAny:
        wire = this.#handOut(value as readonly Delivery[], this.#handleOf);
        break;
      case Op.settle:
        wire = this.#settled(args, value as SettlementOutcome);
        break;
      case Op.publishBatch:
        wire = encodePublicationBatch(value as readonly PublicationOutcome[]);
        break;
      case Op.settleBatch: {
        const outcomes = value as readonly SettlementOutcome[];
        for (let i = 0; i < outcomes.length; i++) this.#settled(args[i] as unknown[], outcomes[i]);
        wire = encodeSettleBatch(outcomes);
        break;
      }
      case Op.renew:
        wire = encodeLease(value as LeaseObservation);
        break;
    }
    if (id === 0 || !this.#open) return;
    this.#results.add(id, 1, wire);
    if (op === Op.payloadRead && this.#link.kind === "port") {
      const buffer = transferable(value as PayloadReadOutcome);
      if (buffer !== null) this.#results.move(buffer);
    }
    this.#queueFlush();
  }

  /**
   * Keeps a channel's data in publication order for this connection: a retryable refusal on a channel that
   * refuses when full (whose publishers retry) makes its publication the channel's refused head unless an
   * earlier-arrived one is (an outcome decided late, with faults installed, may come back out of order),
   * later data publications are refused behind it, and the head's next outcome that is not another
   * retryable refusal clears it.
   */
  #noteOrder(
    handle: number,
    envelope: Envelope,
    arrival: number,
    outcome: PublicationOutcome,
  ): PublicationOutcome {
    const refused = outcome.kind === "rejected" && outcome.retryable;
    const head = this.#refusedHeads.get(handle);
    if (head !== undefined && head.publicationId === envelope.publicationId) {
      if (!refused) this.#refusedHeads.delete(handle);
    } else if (
      refused && (head === undefined || arrival < head.arrival) &&
      this.#services.messaging.refusesWhenFull(envelope.channel)
    ) {
      this.#refusedHeads.set(handle, { publicationId: envelope.publicationId, arrival });
    }
    return outcome;
  }

  /**
   * One publication of this connection, with its credit (the connection is its holder): a dead letter is
   * answered once the supervisor kept it; a data publication is kept in order behind a refused one (see
   * {@link #noteOrder}).
   */
  #publish(
    handle: number,
    envelope: Envelope,
    deadline: number,
  ): PublicationOutcome | Promise<PublicationOutcome> {
    const messaging = this.#services.messaging;
    const publish = () =>
      messaging.publishNow(envelope, deadline, this) ?? messaging.publishAs(this, envelope, deadline);
    if (envelope.kind === MessageKind.dlq) {
      return Promise.resolve(publish()).then(async (outcome) => {
        if (outcome.kind === "accepted" && !outcome.duplicate) await this.#services.deadLetterStored();
        return outcome;
      });
    }
    if (envelope.kind !== MessageKind.data) return publish();
    const head = this.#refusedHeads.get(handle);
    if (head !== undefined && head.publicationId !== envelope.publicationId) {
      return rejected(
        envelope.publicationId,
        `publication ${head.publicationId}, refused earlier on this channel, is not taken yet: ` +
          "outputs are taken in order",
        true,
      );
    }
    const arrival = ++this.#dataArrivals;
    const outcome = publish();
    return outcome instanceof Promise
      ? outcome.then((settled) => this.#noteOrder(handle, envelope, arrival, settled))
      : this.#noteOrder(handle, envelope, arrival, outcome);
  }

  /**
   * A publish batch's entries from `from` on, one after another as that many publishes (`wires[i + 1]` is
   * entry i's wire): synchronously while each is decided on the spot, the rest once the one that waits is.
   */
  #publishBatch(
    wires: unknown[],
    envelopes: readonly Envelope[],
    deadline: number,
    from: number,
    outcomes: PublicationOutcome[],
  ): PublicationOutcome[] | Promise<PublicationOutcome[]> {
    for (let i = from; i < envelopes.length; i++) {
      const outcome = this.#publish((wires[i + 1] as unknown[])[0] as number, envelopes[i], deadline);
      if (outcome instanceof Promise) {
        return outcome.then((settled) => {
          outcomes[i] = settled;
          return this.#publishBatch(wires, envelopes, deadline, i + 1, outcomes);
        });
      }
      outcomes[i] = outcome;
    }
    return outcomes;
  }

  /** A settle call's token (the broker's own, when kept), settlement and settlement id. */
  #settleRequest(wire: unknown[]): SettleRequest {
    const at = wire.length === SHORT_SETTLE_FIELDS ? 1 : TOKEN_FIELDS;
    return {
      token: this.#token(wire),
      outcome: decodeSettlement(wire[at], wire[at + 1]),
      settlementId: wire[at + 2] as string,
    };
  }

  /** A settle batch's requests from `from` on, in order (as {@link #publishBatch}). */
  #settleBatch(
    requests: readonly SettleRequest[],
    from: number,
    outcomes: SettlementOutcome[],
  ): SettlementOutcome[] | Promise<SettlementOutcome[]> {
    const messaging = this.#services.messaging;
    for (let i = from; i < requests.length; i++) {
      const { token, outcome, settlementId } = requests[i];
      const now = messaging.settleNow(token, outcome, settlementId);
      if (now === null) {
        return messaging.settle(token, outcome, settlementId).then((settled) => {
          outcomes[i] = settled;
          return this.#settleBatch(requests, i + 1, outcomes);
        });
      }
      outcomes[i] = now;
    }
    return outcomes;
  }

  #fail(id: number, error: unknown): void {
    if (id === 0 || !this.#open) return;
    this.#results.add(id, 0, errorToWire(error));
    this.#queueFlush();
  }

  #queueFlush(): void {
    if (this.#results.full) this.#flush();
    else this.#flusher.schedule();
  }

  #flush(): void {
    this.#flusher.cancel();
    if (this.#results.empty || !this.#open) return;
    const { frame, transfer } = this.#results.take(this.#link.kind);
    try {
      this.#link.send(frame, transfer);
    } catch (error) {
      this.#failFrame(frame, error);
    }
  }

  /** A results frame that could not be serialized: each result is replaced by that error. */
  #failFrame(frame: unknown[], error: unknown): void {
    const wire = errorToWire(
      new ConfigError(
        `a result of the embedded broker could not be serialized: ${(error as Error).message}`,
        "report this: every hosted result should be structured-cloneable",
      ),
    );
    const failed: unknown[] = [Frame.results, null];
    for (let i = 2; i < frame.length; i += 3) failed.push(frame[i], 0, wire);
    this.#link.send(failed, []);
  }

  // ---- operations ---------------------------------------------------------------------------------

  #invoke(op: Op, args: unknown[], arena: Uint8Array | null): unknown {
    const messaging = this.#services.messaging;
    switch (op) {
      case Op.publish:
      case Op.publishMoved: {
        if (op === Op.publishMoved && !(args[2] instanceof Uint8Array)) {
          throw new ConfigError(
            "a moved publication reached the embedded broker without its body",
            "use the embedded client of the same videoflow version",
          );
        }
        const envelope = decodeEnvelope(args, this.#channel(args[0]), arena);
        return this.#publish(args[0] as number, envelope, envelopeDeadline(args));
      }
      case Op.publishBatch: {
        const deadline = args[0] as number;
        const envelopes: Envelope[] = new Array(args.length - 1);
        for (let i = 1; i < args.length; i++) {
          const wire = args[i] as unknown[];
          envelopes[i - 1] = decodeEnvelope(wire, this.#channel(wire[0]), arena);
        }
        return this.#publishBatch(args, envelopes, deadline, 0, new Array(envelopes.length));
      }
      case Op.settleBatch: {
        const requests = args.map((wire) => this.#settleRequest(wire as unknown[]));
        return this.#settleBatch(requests, 0, new Array(requests.length));
      }
      case Op.reserveCredit: {
        const request = creditRequest(args[1] as number, args[2] as number, args[3] as number);
        return messaging.reserveCreditAs(this, this.#channel(args[0]), request, args[4] as number);
      }
      case Op.releaseCredit:
        messaging.releaseCreditOf(this, this.#channel(args[0]));
        return null;
      case Op.receive: {
        const sub = this.#sub(args[0]);
        return this.#longPoll(
          args,
          (items, bytes, deadline) => messaging.receive(sub, items, bytes, deadline),
        );
      }
      case Op.settle: {
        const { token, outcome, settlementId } = this.#settleRequest(args);
        return messaging.settleNow(token, outcome, settlementId) ??
          messaging.settle(token, outcome, settlementId);
      }
      case Op.receiveAny: {
        const subs = (args[0] as number[]).map((handle) => this.#sub(handle));
        return this.#longPoll(
          args,
          (items, bytes, deadline) => messaging.receiveAny(subs, items, bytes, deadline),
        );
      }
      case Op.renew:
        return messaging.renew(this.#token(args));
      case Op.supersede:
        return messaging.supersede(this.#token(args));
      case Op.releaseTokens:
        for (const tokenId of args) this.#tokens.take(tokenId as number);
        return null;
      case Op.defineChannel:
        return this.#defineChannel(args[0] as number, args[1] as ChannelId);
      case Op.defineSubscription:
        return this.#defineSubscription(args[0] as number, args[1] as SubscriptionId);
      case Op.messagingCapabilities:
        return messaging.capabilities();
      case Op.ensureChannel:
        return messaging.ensureChannel(
          args[0] as Parameters<MemoryMessagingBackend["ensureChannel"]>[0],
          args[1] as string,
        );
      case Op.ensureSubscription:
        return messaging.ensureSubscription(
          args[0] as Parameters<MemoryMessagingBackend["ensureSubscription"]>[0],
          args[1] as string,
        );
      case Op.observePublication:
        return messaging.observePublication(decodeEnvelope(args, this.#channel(args[0]), arena));
      case Op.observeSubscription:
        return messaging.observeSubscription(this.#sub(args[0]));
      case Op.observeChannel:
        return messaging.observeChannel(this.#channel(args[0]));
      case Op.observeAckFloor:
        return messaging.observeAckFloor(this.#sub(args[0]));
      case Op.subscribeControl:
        this.#controlSubscribed = true;
        if (this.#services.stopCommitted()) this.notifyStop();
        return null;
      case Op.messagingShutdown:
        this.#messagingOpen = false;
        messaging.releaseCreditOf(this);
        return null;
      case Op.closeChannels:
        return messaging.close(args[0] as ChannelId[], args[1] as string);
      default:
        return this.#invokeStore(op, args);
    }
  }

  #invokeStore(op: Op, args: unknown[]): unknown {
    const payload = this.#services.payload;
    type Ref = Parameters<MemoryPayloadStore["read"]>[0];
    switch (op) {
      case Op.payloadPut:
        return payload.putOwned(
          args[0] as Uint8Array,
          args[1] as string,
          args[2] as Parameters<MemoryPayloadStore["put"]>[2],
        );
      case Op.payloadRead:
        return payload.read(args[0] as Ref);
      case Op.payloadAcquire:
        return payload.acquireObligation(args[0] as Ref, args[1] as string, args[2] as number);
      case Op.payloadRenew:
        return payload.renewObligation(args[0] as Ref, args[1] as string, args[2] as number);
      case Op.payloadRelease:
        return payload.releaseObligation(args[0] as Ref, args[1] as string, args[2] as string);
      case Op.payloadObligationIds:
        return this.#obligationIds();
      case Op.payloadReconcile: {
        const authoritative = new Set(args[1] as string[]);
        const ledger = new StaticLedger(
          new Map(args[0] as [string, string[]][]),
          (id) => authoritative.has(id),
        );
        return payload.reconcile(ledger, args[2] as string);
      }
      case Op.payloadInventory:
        return payload.inventory();
      case Op.payloadRefForKey:
        return payload.refForKey(args[0] as string);
      case Op.payloadCapabilities:
        return payload.capabilities();
      default:
        return this.#invokeLedger(op, args);
    }
  }

  #invokeLedger(op: Op, args: unknown[]): unknown {
    const store = this.#services.runtimeStore;
    if (store === null) {
      throw new ResourceUnavailable(
        "this embedded broker serves no runtime store",
        "give the EmbeddedBroker the run's RuntimeStore (runtimeStore option)",
      );
    }
    switch (op) {
      case Op.storeGet:
        return store.get(args[0] as string);
      case Op.storeCas:
        return store.cas(args[0] as string, args[1] as string | null, args[2] as Uint8Array);
      case Op.storeDelete:
        return store.delete(args[0] as string, args[1] as string | null);
      case Op.storeScan:
        return store.scan(args[0] as string);
      case Op.storeAppend:
        return store.append(args[0] as string, args[1] as Uint8Array);
      case Op.storeLogEntries:
        return store.logEntries(args[0] as string);
      case Op.storeCapabilities:
        return store.capabilities();
      default:
        throw new ConfigError(`the embedded broker has no operation ${String(op)}`);
    }
  }

  async #obligationIds(): Promise<string[] | null> {
    const inventory = await this.#services.payload.inventory();
    if (inventory.kind === "unknown") return null;
    const ids = new Set<string>();
    for (const ref of inventory.value) {
      for (const id of this.#services.payload.obligations(ref.key).keys()) ids.add(id);
    }
    return [...ids];
  }

  // ---- tokens -------------------------------------------------------------------------------------

  /**
   * The broker's own token for a wire token, so staleness is decided as for an in-process caller (a token
   * of an older attempt stays stale after the current one settled); a plain token when none is kept.
   */
  #token(wire: unknown[]): DeliveryToken {
    const kept = this.#tokens.get(wire[0] as number);
    if (kept !== undefined) return kept;
    if (wire.length === SHORT_SETTLE_FIELDS) throw unknownHandle("delivery token", wire[0]);
    return decodeToken(wire, this.#sub(wire[1]));
  }

  /**
   * A settle's outcome for the wire. Once a Completed or Terminal settlement is confirmed the server
   * forgets the broker's token: its entry is done at that very attempt, and a plain token of it gets the
   * same answers (confirmed, not renewed, not live).
   */
  #settled(args: unknown[], outcome: SettlementOutcome): SettleWire {
    const code = args[args.length === SHORT_SETTLE_FIELDS ? 1 : TOKEN_FIELDS];
    if (outcome.kind === "settle_confirmed" && code !== 1) this.#tokens.take(args[0] as number);
    return encodeSettleOutcome(outcome);
  }

  // ---- receiving ----------------------------------------------------------------------------------

  /**
   * A receive (`take` over one subscription or several) with the client's deadline, then a top-up
   * within its credits; `args` is `[handle(s), itemCredit, byteCredit, deadline]`.
   */
  #longPoll(
    args: unknown[],
    take: (itemCredit: number, byteCredit: number, deadline: number) => Promise<readonly Delivery[]>,
  ): Promise<readonly Delivery[]> {
    const itemCredit = args[1] as number;
    const byteCredit = args[2] as number;
    return take(itemCredit, byteCredit, args[3] as number).then((deliveries) =>
      this.#topUp(deliveries, itemCredit, byteCredit, (items, bytes) => take(items, bytes, -Infinity))
    );
  }

  /**
   * A long-poll is answered by the first publication that wakes it; by the time its reply is encoded,
   * the rest of that publisher's frame has been stored too. Takes what became available since, within
   * the call's credits (never with faults installed, where barrier hit counts must stay as scripted).
   */
  #topUp(
    deliveries: readonly Delivery[],
    itemCredit: number,
    byteCredit: number,
    more: (items: number, bytes: number) => Promise<readonly Delivery[]>,
  ): readonly Delivery[] | Promise<readonly Delivery[]> {
    if (
      deliveries.length === 0 || deliveries.length >= itemCredit || faultsInstalled() || !this.#messagingOpen
    ) {
      return deliveries;
    }
    let bytes = 0;
    for (const delivery of deliveries) bytes += delivery.size;
    if (bytes >= byteCredit) return deliveries;
    return more(itemCredit - deliveries.length, byteCredit - bytes)
      .then((extra) => extra.length === 0 ? deliveries : deliveries.concat(extra));
  }

  /** Encodes deliveries for this client, or hands them back when nobody is left to receive them. */
  #handOut(deliveries: readonly Delivery[], handleOf: (subscription: SubscriptionId) => number): unknown {
    if (this.#messagingOpen) return encodeDeliveries(deliveries, this.#tokenIdOf, handleOf, this.#results);
    const messaging = this.#services.messaging;
    for (const delivery of deliveries) {
      const token = delivery.token;
      messaging.settle(token, retry(), `handback/${this.id}/${token.messageId}/${token.attempt}`).catch(
        () => {},
      );
    }
    return [];
  }

  // ---- identities ---------------------------------------------------------------------------------

  #defineChannel(handle: number, id: ChannelId): null {
    this.#channels[checkHandle(handle)] = channelId(id.flowId, id.runId, id.node);
    return null;
  }

  #defineSubscription(handle: number, id: SubscriptionId): null {
    const channel = channelId(id.channel.flowId, id.channel.runId, id.channel.node);
    const sub = subscriptionId(channel, id.consumerNode, {
      partition: id.partition,
      kind: id.kind,
      instance: id.instance,
    });
    this.#subs[checkHandle(handle)] = sub;
    this.#subKeys.set(subscriptionKey(sub), handle);
    this.#subHandles.set(sub, handle);
    return null;
  }

  #channel(handle: unknown): ChannelId {
    const id = this.#channels[handle as number];
    if (id === undefined) throw unknownHandle("channel", handle);
    return id;
  }

  #sub(handle: unknown): SubscriptionId {
    const id = this.#subs[handle as number];
    if (id === undefined) throw unknownHandle("subscription", handle);
    return id;
  }

  /** The handle this connection uses for a subscription the broker names (its own id object). */
  #handleFor(subscription: SubscriptionId): number {
    const cached = this.#subHandles.get(subscription);
    if (cached !== undefined) return cached;
    const handle = this.#subKeys.get(subscriptionKey(subscription));
    if (handle === undefined) throw unknownHandle("subscription", subscriptionKey(subscription));
    this.#subHandles.set(subscription, handle);
    return handle;
  }
}

function checkHandle(handle: number): number {
  if (!Number.isSafeInteger(handle) || handle < 0 || handle > 1 << 24) {
    throw new ConfigError(`an identity handle must be a small non-negative integer, got ${handle}`);
  }
  return handle;
}

function unknownHandle(what: string, handle: unknown): ConfigError {
  return new ConfigError(
    `the connection never defined ${what} ${String(handle)}`,
    "use the embedded client of the same videoflow version",
  );
}

/** The buffer of a payload read's fresh bytes, which may move to the reader instead of being copied. */
function transferable(outcome: PayloadReadOutcome): ArrayBuffer | null {
  if (outcome.kind !== "bytes") return null;
  const data = outcome.data;
  const buffer = data.buffer;
  return buffer instanceof ArrayBuffer && data.byteOffset === 0 && data.byteLength === buffer.byteLength
    ? buffer
    : null;
}

/**
 * The broker the local engine's supervisor hosts (see the module comment): the services, the
 * connections, the TCP listener.
 */
export class EmbeddedBroker {
  /** The hosted messaging model (its hooks are the supervisor's and the tests' controls). */
  readonly messaging: MemoryMessagingBackend;
  /** The hosted payload store. */
  readonly payload: MemoryPayloadStore;
  /** The hosted run ledger, or null when none is served. */
  readonly runtimeStore: RuntimeStore | null;
  /** The secret TCP clients present (hand it to subprocesses through {@link workerEnv}). */
  readonly secret: string;
  readonly #helloTimeout: number;
  readonly #connections = new Set<BrokerConnection>();
  readonly #services: Services;
  #listener: Deno.TcpListener | null = null;
  #accepting: Promise<void> = Promise.resolve();
  #stopCommitted = false;
  #closed = false;

  /** Throws ConfigError for an empty secret or a hello timeout that is not a positive number. */
  constructor(options: EmbeddedBrokerOptions = {}) {
    const clock = options.clock ?? systemClock;
    this.messaging = options.messaging ?? new MemoryMessagingBackend({ clock });
    this.payload = options.payload ?? new MemoryPayloadStore({ clock });
    this.runtimeStore = options.runtimeStore ?? null;
    this.secret = options.secret ?? randomHex(32);
    if (this.secret === "") throw new ConfigError("the embedded broker's secret must not be empty");
    this.#helloTimeout = options.helloTimeoutSeconds ?? DEFAULT_HELLO_TIMEOUT_SECONDS;
    if (!(this.#helloTimeout > 0) || !Number.isFinite(this.#helloTimeout)) {
      throw new ConfigError(`helloTimeoutSeconds must be a positive number, got ${this.#helloTimeout}`);
    }
    this.#services = {
      messaging: this.messaging,
      payload: this.payload,
      runtimeStore: this.runtimeStore,
      stopCommitted: () => this.#stopCommitted,
      forget: (connection) => this.#connections.delete(connection),
      deadLetterStored: options.onDeadLetter ?? (() => Promise.resolve()),
      releaseAfter: options.releaseAfter ?? (() => null),
    };
    this.messaging.subscribeControl(() => {
      this.#stopCommitted = true;
      for (const connection of this.#connections) connection.notifyStop();
    });
  }

  /**
   * A new connection over a fresh MessageChannel: serves one end and returns the other, to be transferred
   * to the worker (`worker.postMessage(port, [port])`), which connects with `EmbeddedConnection.connect`.
   */
  openPort(label: string): MessagePort {
    const { port1, port2 } = new MessageChannel();
    this.servePort(port1, label);
    return port2;
  }

  /** Serves an existing MessagePort (the other end belongs to the worker). */
  servePort(port: MessagePort, label: string): BrokerConnection {
    this.#live();
    return this.#add(new BrokerConnection(portLink(port), this.#services, label, null, null));
  }

  /** Starts the TCP listener on 127.0.0.1 (an OS-chosen port) once; resolves with its `tcp://` address. */
  listen(): Promise<string> {
    this.#live();
    if (this.#listener === null) {
      this.#listener = Deno.listen({ hostname: "127.0.0.1", port: 0, transport: "tcp" });
      this.#accepting = this.#accept(this.#listener);
    }
    return Promise.resolve(this.address as string);
  }

  /** The listener's `tcp://127.0.0.1:PORT`, or null before {@link listen}. */
  get address(): string | null {
    const listener = this.#listener;
    return listener === null ? null : `tcp://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`;
  }

  /** The environment a subprocess worker needs to connect; ConfigError before {@link listen}. */
  workerEnv(): Record<string, string> {
    const address = this.address;
    if (address === null) {
      throw new ConfigError(
        "the embedded broker is not listening",
        "call listen() before starting subprocesses",
      );
    }
    return { [EMBEDDED_BROKER_ENV]: address, [EMBEDDED_BROKER_SECRET_ENV]: this.secret };
  }

  /** The connections open now. */
  connections(): readonly BrokerConnection[] {
    return [...this.#connections];
  }

  /**
   * Closes every connection (each client is told), the listener, and the messaging model (every receive
   * still waiting returns empty). Idempotent.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#listener?.close();
    await this.#accepting;
    await Promise.all(
      [...this.#connections].map((connection) => connection.disconnect("the broker is closing")),
    );
    await this.messaging.shutdown();
  }

  async #accept(listener: Deno.TcpListener): Promise<void> {
    try {
      for await (const conn of listener) {
        if (this.#closed) {
          conn.close();
          continue;
        }
        this.#add(
          new BrokerConnection(socketLink(conn), this.#services, "", this.secret, this.#helloTimeout),
        );
      }
    } catch {
      // The listener was closed: accepting ends here.
    }
  }

  #add(connection: BrokerConnection): BrokerConnection {
    if (connection.open) this.#connections.add(connection);
    return connection;
  }

  #live(): void {
    if (this.#closed) {
      throw new ResourceUnavailable(
        "the embedded broker is closed",
        "start a new EmbeddedBroker for a new run",
      );
    }
  }
}
