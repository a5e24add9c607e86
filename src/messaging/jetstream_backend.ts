/**
 * NATS JetStream as a {@link MessagingBackend} (spec messaging.jetstream_backend), on nats.js: one stream
 * per channel, one durable pull consumer per subscription, names and settings from `jetstream_config.ts`.
 * What it guarantees, call by call:
 *
 * - `ensureChannel` / `ensureSubscription` create the stream or durable, or reconcile an existing one: an
 *   immutable difference (retention, storage, replicas, subjects; a durable's ack policy or filter) throws
 *   IncompatibleProfile, a mutable one is updated, and the configuration is read back either way; what the
 *   server still does not carry is listed in `mismatches`. "Already exists" is never taken uninspected.
 *   `ensureChannel` also ensures the flow's dead-letter stream.
 * - Publication: the publication id rides as `Nats-Msg-Id` (the server's dedup key) beside `VF-Env: 4`;
 *   many publications are in flight at once (pipelined PubAcks). A PubAck that does not arrive before the
 *   deadline is PublicationUnknown (never Rejected); a refusal is Rejected, `retryable` for a full stream
 *   (discard new) and not for a subject no stream binds. `observePublication` re-publishes under the same
 *   id inside the duplicate window (one stored copy either way) and is Unresolvable beyond it.
 * - Receiving: pull requests against the durable, `no_wait` first and then one long pull that waits for the
 *   deadline; deliveries are handed out within the receive's item and byte credit (the last may overshoot
 *   by one message) and the client's byte budget (RUN-025, `VF_PREFETCH_BYTES`): what a pull brought beyond
 *   them is parked here, kept alive with `+WPI` every `max(1 s, ack_wait / 3)`, and handed out first next
 *   time. The broker's `max_ack_pending` is the subscription's shared credit (STREAM-15).
 * - Tokens carry the broker's delivery count as the attempt and the durable's creation time as the
 *   generation. A token whose message was since delivered again, or that its receiver retired, is
 *   SettleStale without a broker call (MSG-011).
 * - Settlement is a request on the delivery's ack subject, answered by the server: Completed `+ACK`,
 *   Retry `-NAK` with the delay asked (a last permitted attempt is not NAKed: the server would hold it
 *   leased for ever; it is left to lapse and counted unresolved), Terminal `+TERM` against a durable record
 *   (DELIV-15). An answer that does not come within the confirm timeout is SettleUnknown (PAY-004).
 * - Observations are Known or Unknown, never a zero for an unread counter (MSG-012); `unresolved` counts the
 *   server's MAX_DELIVERIES advisories and the last attempts retried here.
 * - `close` deletes exactly the owned streams: by owner labels where the server keeps metadata, by the
 *   stream's own data subject otherwise; never by prefix, never the dead-letter stream.
 *
 * Fault barriers (`../backends/faults.ts`) sit where the memory model has them, so the conformance stories
 * inject the same faults around real server calls. Time is the host's: deadlines are monotonic readings of
 * the injected clock, which must be a real one (the server's ack waits and windows run on wall time).
 *
 * @example
 * ```ts
 * const backend = await JetStreamMessagingBackend.connect({ url: "nats://127.0.0.1:4222" });
 * console.log((await backend.capabilities()).adapter); // "jetstream"
 * await backend.shutdown();
 * ```
 *
 * @module
 */

import {
  type ConsumerConfig,
  type ConsumerInfo,
  type JetStreamManager,
  jetstreamManager,
  type StreamConfig,
  type StreamInfo,
} from "@nats-io/jetstream";
import { createInbox, headers as natsHeaders, type Msg, type NatsConnection } from "@nats-io/nats-core";
import { compare, parseSemVer } from "@nats-io/nats-core/internal";
import { connect } from "@nats-io/transport-node";
import {
  type MessagingCapabilities,
  messagingCapabilities,
  PublicationLedger,
  Retention,
} from "../backends/capabilities.ts";
import { type Clock, systemClock, type TimerHandle } from "../backends/clock.ts";
import { Barrier, barrier, faultsInstalled } from "../backends/faults.ts";
import { owns } from "../backends/identity.ts";
import {
  type ChannelId,
  channelKey,
  type ChannelObservation,
  type ChannelSpec,
  checkSettlement,
  type CreditRequest,
  type Delivery,
  type DeliveryToken,
  type Envelope,
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
  subscriptionKey,
  type SubscriptionObservation,
  type SubscriptionSpec,
  type VerifiedChannel,
  type VerifiedSubscription,
} from "../backends/messaging.ts";
import {
  controlSubjectFor,
  dlqStreamName,
  dlqSubjectFor,
  eosSubjectFor,
  streamNameFor,
  subjectFor,
  subjectOwner,
} from "../backends/names.ts";
import {
  accepted,
  type CleanupObservation,
  cleanupObservation,
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
} from "../backends/outcomes.ts";
import { requireCount, requirePositiveSeconds } from "../core/checks.ts";
import { BrokerUnavailable, ConfigError, IncompatibleProfile, ResourceUnavailable } from "../core/errors.ts";
import { ENVELOPE_VERSION } from "../wire/codec.ts";
import { ReplyMux, type ReplyOutcome } from "./reply_mux.ts";
import {
  configMismatches,
  consumerConfigFor,
  deadLetterStreamConfig,
  IMMUTABLE_CONSUMER_FIELDS,
  IMMUTABLE_STREAM_FIELDS,
  nanos,
  type RequestedStream,
  streamConfigFor,
} from "./jetstream_config.ts";
import {
  DEDUP_WINDOW_SECONDS,
  DEFAULT_ACK_WAIT_SECONDS,
  durableNameOf,
  EOS_ACK_WAIT_SECONDS,
  subscriptionSpecFor,
} from "./topology.ts";

/**
 * How long a publication, settlement or renewal waits for the server's answer before it is PublicationUnknown
 * or SettleUnknown, in seconds.
 */
export const ACK_CONFIRM_SECONDS = 2;
/** The longest one pull request waits at the server before the receive asks again, in seconds. */
export const LONG_PULL_SECONDS = 5;
/**
 * The expiry a `no_wait` pull for `batch` messages carries, in seconds: 0.4 ms a message, from 5 ms to
 * 0.1 s. nats-server 2.9.10 answers a `no_wait` pull with an expiry only when the batch is full or the
 * expiry passes (also when the durable is empty, and when its credit holds the rest back), so this is what
 * a receive that finds fewer than it asked for waits. A small batch must not wait long: at 0.1 s a node at
 * the spec's prefetch of 4 moved 133 items/s over JetStream, at 5 ms 850-880 (at 1 ms the pulls expire
 * before the server's messages arrive: 310). A large one gains from filling up: at prefetch 256, 0.1 s
 * gave 5,960-5,985 items/s and 5 ms 4,070-4,690 (a 20,000-item producer → relay → sink).
 */
function noWaitSeconds(batch: number): number {
  return Math.min(0.1, Math.max(0.005, batch * 0.0004));
}
/** How often a credit request re-reads a full stream while it waits for room, in seconds. */
const CREDIT_POLL_SECONDS = 0.05;
/** The header carrying the envelope version beside every publication (WIRE.md). */
export const ENVELOPE_HEADER = "VF-Env";
/** The dedup header JetStream keys its duplicate window on. */
export const MSG_ID_HEADER = "Nats-Msg-Id";
/** JetStream's error code for a stream that is full under discard new. */
const FULL_CODES: ReadonlySet<number> = new Set([10077, 10078, 10054]);
/** The first server version that keeps stream and consumer metadata (owner labels). */
const METADATA_SINCE = parseSemVer("2.10.0");

/** Options of {@link JetStreamMessagingBackend.connect}. */
export interface JetStreamBackendOptions {
  /** The server, `nats://host:port`. */
  readonly url: string;
  /** The run whose flow-wide stop {@link JetStreamMessagingBackend.subscribeControl} listens to. */
  readonly run?: { readonly flowId: string; readonly runId: string } | null;
  /** The most envelope bytes this client holds unsettled, parked or handed out (RUN-025); null: unbounded. */
  readonly byteBudget?: number | null;
  /** {@link ACK_CONFIRM_SECONDS} unless given. */
  readonly ackConfirmSeconds?: number;
  /** How long the first connection may take, in seconds (10). */
  readonly connectTimeoutSeconds?: number;
  /** A real clock sharing the host's monotonic basis (the system clock by default). */
  readonly clock?: Clock;
}

const LIVE = 0;
const SETTLED = 1;
const RETIRED = 2;
type TokenState = typeof LIVE | typeof SETTLED | typeof RETIRED;

/** A token this client handed out: the delivery's ack subject, its bytes and what was done with it. */
class JetStreamToken implements DeliveryToken {
  #state: TokenState = LIVE;
  readonly #reply: string;
  readonly #size: number;
  /** Monotonic end of the lease the server granted (received or last renewed plus the ack wait). */
  leaseUntil: number;

  constructor(
    readonly subscription: SubscriptionId,
    readonly messageId: string,
    readonly streamSequence: number,
    readonly attempt: number,
    readonly generation: string,
    reply: string,
    size: number,
    leaseUntil: number,
  ) {
    this.#reply = reply;
    this.#size = size;
    this.leaseUntil = leaseUntil;
  }

  static own(token: DeliveryToken): JetStreamToken | null {
    return #state in token ? token as JetStreamToken : null;
  }

  get state(): TokenState {
    return this.#state;
  }

  set state(state: TokenState) {
    this.#state = state;
  }

  get reply(): string {
    return this.#reply;
  }

  get size(): number {
    return this.#size;
  }
}

/** A message a pull brought, not yet handed out. */
interface Parked {
  readonly msg: Msg;
  readonly delivered: number;
  readonly streamSeq: number;
}

interface Admission {
  readonly admit: (delivery: Delivery) => boolean;
  readonly onSkip: ((delivery: Delivery) => void) | null;
}

/** What this client knows of a channel it ensured. */
interface ChannelState {
  readonly spec: ChannelSpec;
  readonly stream: string;
  /** Credit this client holds: messages and bytes it may still publish as room it counted on. */
  heldItems: number;
  heldBytes: number;
  /** Publications of this client the stream refused. */
  rejected: number;
}

/** What this client knows of a subscription it ensured. */
interface SubState {
  readonly spec: SubscriptionSpec;
  readonly stream: string;
  readonly durable: string;
  readonly generation: string;
  readonly parked: Parked[];
  /** The attempt of the latest delivery handed out, per stream sequence. */
  readonly latest: Map<number, number>;
  /** Stream sequences past max_deliver the server advised (no longer leased there). */
  readonly exhausted: Set<number>;
  /** Last attempts retried here: unresolved, still counted leased by the server until their lease lapses. */
  readonly lapsing: Set<number>;
  /** Sequences settled Completed or Terminal here (for the drops of a limits stream). */
  readonly settled: Set<number>;
  admission: Admission | null;
}

/** One pull request in flight: where its messages go and when it is done. */
interface Pull {
  readonly state: SubState;
  readonly want: number;
  readonly got: Parked[];
  readonly done: () => void;
}

/** What one publication send learned. */
type SendResult =
  | { readonly kind: "ack"; readonly seq: number; readonly duplicate: boolean }
  | { readonly kind: "refused"; readonly reason: string; readonly retryable: boolean }
  | { readonly kind: "lost"; readonly reason: string };

/**
 * Forgets the sequences settled here at or below the durable's ack floor: the server holds nothing of them
 * any more (no advisory or drop can name them), so what is kept stays the window above the floor, however
 * long the run.
 */
function forgetSettledUpTo(state: SubState, floor: number): void {
  for (const seq of state.settled) if (seq <= floor) state.settled.delete(seq);
}

/** Why a request got no answer, in words. */
function unanswered(outcome: Exclude<ReplyOutcome, { kind: "reply" }>): string {
  switch (outcome.kind) {
    case "timeout":
      return "no answer within the confirm timeout";
    case "noResponders":
      return "no responders";
    case "closed":
      return "the connection closed";
  }
}

/** A publication id this client sent, and when (for the duplicate window of observePublication). */
interface Sent {
  readonly at: number;
  readonly windowSeconds: number;
}

function describeError(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The Unknown reason for a failed server call. */
function failureReason(error: unknown): UnknownReason {
  const name = error instanceof Error ? error.constructor.name : "";
  if (/NotFound/.test(name) || /not found/i.test(describeError(error))) return "missing";
  if (/Timeout/.test(name)) return "timeout";
  if (/Closed|Connection|NoResponders/.test(name)) return "unreachable";
  return "api";
}

function isNotFound(error: unknown): boolean {
  return failureReason(error) === "missing";
}

/** The delivery facts in a JetStream ack subject (`$JS.ACK.<stream>.<durable>.<delivered>.<sseq>…`). */
function ackInfo(
  reply: string,
): { stream: string; durable: string; delivered: number; streamSeq: number } | null {
  const tokens = reply.split(".");
  if (tokens[0] !== "$JS" || tokens[1] !== "ACK") return null;
  const at = tokens.length >= 11 ? 4 : 2;
  const delivered = Number(tokens[at + 2]);
  const streamSeq = Number(tokens[at + 3]);
  if (!Number.isSafeInteger(delivered) || !Number.isSafeInteger(streamSeq)) return null;
  return { stream: tokens[at], durable: tokens[at + 1], delivered, streamSeq };
}

/** The subject a publication of `envelope` rides. */
function subjectOf(envelope: Envelope): string {
  const { flowId, runId, node } = envelope.channel;
  switch (envelope.kind) {
    case MessageKind.eos:
      return eosSubjectFor(flowId, runId, node);
    case MessageKind.dlq:
      return dlqSubjectFor(flowId, runId, node);
    default:
      return subjectFor(flowId, runId, node);
  }
}

/**
 * A connection to the NATS server `url` that reconnects for as long as it is used; BrokerUnavailable when
 * the first connection cannot be made within `timeoutSeconds` (10).
 */
export async function connectNats(url: string, timeoutSeconds = 10): Promise<NatsConnection> {
  try {
    return await connect({
      servers: url,
      timeout: timeoutSeconds * 1000,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 500,
    });
  } catch (error) {
    throw new BrokerUnavailable(
      `cannot reach the NATS server at ${url}: ${describeError(error)}`,
      "start nats-server with JetStream (-js) or point VF_NATS_URL at one",
      { url },
    );
  }
}

/** The JetStream adapter (see the module comment). One per process; it owns its connection. */
export class JetStreamMessagingBackend implements MessagingBackend {
  readonly #nc: NatsConnection;
  readonly #jsm: JetStreamManager;
  readonly #clock: Clock;
  readonly #run: { readonly flowId: string; readonly runId: string } | null;
  readonly #byteBudget: number | null;
  /** Every request this client makes per message (publications, settlements, renewals) and its answer. */
  readonly #requests: ReplyMux;
  readonly #labels: boolean;
  readonly #channels = new Map<string, ChannelState>();
  readonly #subs = new Map<string, SubState>();
  /** Subscriptions by `<stream>/<durable>`, for routing a pulled message that arrived late. */
  readonly #byDurable = new Map<string, SubState>();
  readonly #deadLetterStreams = new Set<string>();
  readonly #sent = new Map<string, Sent>();
  readonly #pulls = new Map<string, Pull>();
  readonly #inbox: string;
  readonly #controlCallbacks: (() => void)[] = [];
  readonly #handedOut = new Set<JetStreamToken>();
  /** How many of {@link #handedOut} each subscription (by key) holds. */
  readonly #handedOutBySub = new Map<string, number>();
  #pullCounter = 0;
  #resident = 0;
  #keepalive: TimerHandle | null = null;
  #stopSeen = false;
  #controlSubscribed = false;
  #effective: { replicas: number; persistent: boolean } | null = null;
  #shutDown = false;

  private constructor(nc: NatsConnection, jsm: JetStreamManager, options: JetStreamBackendOptions) {
    this.#nc = nc;
    this.#jsm = jsm;
    this.#clock = options.clock ?? systemClock;
    this.#run = options.run ?? null;
    this.#byteBudget = options.byteBudget ?? null;
    if (this.#byteBudget !== null) requireCount(this.#byteBudget, "the byte budget", 1);
    this.#requests = new ReplyMux(
      nc,
      this.#clock,
      requirePositiveSeconds(options.ackConfirmSeconds ?? ACK_CONFIRM_SECONDS, "ack confirm"),
    );
    this.#labels = compare(parseSemVer(nc.info?.version ?? "0.0.0"), METADATA_SINCE) >= 0;
    this.#inbox = createInbox();
    nc.subscribe(`${this.#inbox}.*`, { callback: (_error, msg) => this.#onPulled(msg) });
  }

  /** Connects to `options.url`; an unreachable server is BrokerUnavailable. */
  static async connect(options: JetStreamBackendOptions): Promise<JetStreamMessagingBackend> {
    const nc = await connectNats(options.url, options.connectTimeoutSeconds);
    try {
      return new JetStreamMessagingBackend(nc, await jetstreamManager(nc), options);
    } catch (error) {
      await nc.close();
      throw new BrokerUnavailable(
        `the NATS server at ${options.url} offers no JetStream: ${describeError(error)}`,
        "run nats-server with -js",
        { url: options.url },
      );
    }
  }

  /** Whether the server keeps stream and consumer metadata (2.10+): owner labels are written there then. */
  get ownerMetadata(): boolean {
    return this.#labels;
  }

  /** Envelope bytes this client holds unsettled right now, parked or handed out. */
  residentBytes(): number {
    return this.#resident;
  }

  /**
   * How many sequences of `subscription` settled here this client still keeps (for its drop and advisory
   * accounting): those above the durable's ack floor as last observed, so bounded by the unsettled window,
   * not by the run's length.
   */
  settledKept(subscription: SubscriptionId): number {
    return this.#subs.get(subscriptionKey(subscription))?.settled.size ?? 0;
  }

  /**
   * How many first sends this client still keeps for `observePublication`: those inside their stream's
   * duplicate window, so bounded by the publication rate times the window, not by the run's length.
   */
  sendsKept(): number {
    return this.#sent.size;
  }

  // ---- capabilities and provisioning ---------------------------------------------------------------

  /** What the server offers; replication and storage are read back from the first channel ensured. */
  capabilities(): Promise<MessagingCapabilities> {
    const effective = this.#effective;
    const unread = unknown("unread", this.#clock, "no channel was ensured by this client yet");
    return Promise.resolve(messagingCapabilities({
      adapter: "jetstream",
      version: this.#nc.info?.version ?? "unknown",
      retainedBacklog: true,
      recoverableDelivery: true,
      latestPerKey: false,
      dedupWindowSeconds: null,
      publicationLedger: PublicationLedger.window,
      replicationFactor: effective === null ? unread : known(effective.replicas, this.#clock),
      persistentStorage: effective === null ? unread : known(effective.persistent, this.#clock),
      maxPayloadBytes: this.#nc.info === undefined
        ? unknown("unread", this.#clock, "no server info")
        : known(this.#nc.info.max_payload, this.#clock),
      creditResizable: true,
      controlSharesDataSlot: false,
    }));
  }

  /** {@link MessagingBackend.ensureChannel} on the channel's stream (see the module comment). */
  async ensureChannel(spec: ChannelSpec, operationId: string): Promise<VerifiedChannel> {
    this.#live("ensureChannel");
    this.#requireOperation(operationId);
    if (spec.retention === Retention.archive) {
      throw new IncompatibleProfile(
        `channel ${spec.id.node} asks for archive retention, which a JetStream stream does not offer here`,
        "use live_latest or reliable_work on JetStream (replay_archive is not a stream-level promise)",
      );
    }
    const requested = streamConfigFor(spec, this.#labels);
    // A reference worker's stream carries no owner labels: WIRE.md's form is compared without them.
    const wire = spec.perSubjectLimits ? streamConfigFor({ ...spec, perSubjectLimits: false }, false) : null;
    const { info, asWire } = await this.#ensureStream(requested, spec.id.node, wire);
    await this.#ensureDeadLetters(spec.id.flowId, spec.replicas);
    if (spec.retention === Retention.interest) await this.#ensureInterest(spec, requested.name);
    const effective = info.config as unknown as Readonly<Record<string, unknown>>;
    this.#effective ??= {
      replicas: info.config.num_replicas,
      persistent: info.config.storage === "file",
    };
    const key = channelKey(spec.id);
    const held = this.#channels.get(key);
    this.#channels.set(key, {
      spec,
      stream: requested.name,
      heldItems: held?.heldItems ?? 0,
      heldBytes: held?.heldBytes ?? 0,
      rejected: held?.rejected ?? 0,
    });
    return Object.freeze({
      spec,
      effective: Object.freeze({ ...effective }),
      mismatches: Object.freeze(asWire ? [] : configMismatches(requested, effective)),
    });
  }

  /**
   * Creates the stream `requested` describes, or reconciles the one there: an immutable difference is
   * IncompatibleProfile, a mutable one is updated, except that a stream exactly as `wire` describes it
   * (WIRE.md's shared slot, as a reference worker creates it) is kept as it is: that run is the reference's
   * too, and its streams stay as it made them, an accepted form of the channel (with the reference's own
   * semantics: one slot for data and terminators).
   */
  async #ensureStream(
    requested: RequestedStream,
    what: string,
    wire: RequestedStream | null = null,
  ): Promise<{ readonly info: StreamInfo; readonly asWire: boolean }> {
    let asWire = false;
    const existing = await this.#streamInfoOrNull(requested.name, what);
    if (existing === null) {
      try {
        await this.#jsm.streams.add(requested as StreamConfig);
      } catch (error) {
        throw this.#unavailable(`create stream ${requested.name}`, error);
      }
    } else {
      const effective = existing.config as unknown as Readonly<Record<string, unknown>>;
      const immutable = configMismatches(requested, effective, IMMUTABLE_STREAM_FIELDS);
      if (immutable.length > 0) {
        throw new IncompatibleProfile(
          `stream ${requested.name} exists with settings it cannot change: ${immutable.join("; ")}`,
          "delete the stream (or use a fresh run id) so it is created with the channel's profile",
          [],
          { stream: requested.name, mismatches: immutable },
        );
      }
      asWire = wire !== null && configMismatches(wire, effective).length === 0;
      if (!asWire && configMismatches(requested, effective).length > 0) {
        try {
          await this.#jsm.streams.update(requested.name, requested as StreamConfig);
        } catch (error) {
          throw this.#unavailable(`update stream ${requested.name}`, error);
        }
      }
    }
    const info = await this.#streamInfoOrNull(requested.name, what);
    if (info === null) {
      throw new BrokerUnavailable(`stream ${requested.name} was created but cannot be read back`);
    }
    return { info, asWire };
  }

  /**
   * Creates the durable of every required subscription that has none yet, so interest retention keeps
   * what they have not read from the first publication on; `ensureSubscription` later sets its own ack
   * wait, delivery cap and credit. An existing durable is left as it is.
   */
  async #ensureInterest(spec: ChannelSpec, stream: string): Promise<void> {
    for (const id of spec.requiredSubscriptions) {
      const eos = id.kind === MessageKind.eos;
      const holder = subscriptionSpecFor(id, eos ? EOS_ACK_WAIT_SECONDS : DEFAULT_ACK_WAIT_SECONDS, -1, 1);
      const config = consumerConfigFor(holder, this.#labels);
      if (await this.#consumerInfoOrNull(stream, config.durable_name as string) !== null) continue;
      try {
        await this.#jsm.consumers.add(stream, config as Partial<ConsumerConfig>);
      } catch (error) {
        throw this.#unavailable(`create durable ${config.durable_name} on ${stream}`, error);
      }
    }
  }

  async #ensureDeadLetters(flowId: string, replicas: number): Promise<void> {
    const name = dlqStreamName(flowId);
    if (this.#deadLetterStreams.has(name)) return;
    await this.#ensureStream(deadLetterStreamConfig(flowId, replicas, this.#labels), `the DLQ of ${flowId}`);
    this.#deadLetterStreams.add(name);
  }

  async #streamInfoOrNull(name: string, what: string): Promise<StreamInfo | null> {
    try {
      return await this.#jsm.streams.info(name);
    } catch (error) {
      if (isNotFound(error)) return null;
      throw this.#unavailable(`read stream ${name} (${what})`, error);
    }
  }

  /**
   * {@link MessagingBackend.ensureSubscription} on the subscription's durable: the channel's stream must
   * exist (ResourceUnavailable otherwise); the durable is created or reconciled and read back, and its
   * MAX_DELIVERIES advisories are followed from now on.
   */
  async ensureSubscription(spec: SubscriptionSpec, operationId: string): Promise<VerifiedSubscription> {
    this.#live("ensureSubscription");
    this.#requireOperation(operationId);
    const { flowId, runId, node } = spec.id.channel;
    const stream = streamNameFor(flowId, runId, node);
    if (await this.#streamInfoOrNull(stream, `the channel of ${spec.id.consumerNode}`) === null) {
      throw new ResourceUnavailable(
        `subscription ${durableNameOf(spec.id)} reads channel ${node}, whose stream ${stream} does not exist`,
        "ensure the channel before its subscriptions",
        { stream },
      );
    }
    const requested = consumerConfigFor(spec, this.#labels);
    const durable = requested.durable_name as string;
    const existing = await this.#consumerInfoOrNull(stream, durable);
    if (existing !== null) {
      const effective = existing.config as unknown as Readonly<Record<string, unknown>>;
      const immutable = configMismatches(requested, effective, IMMUTABLE_CONSUMER_FIELDS);
      if (immutable.length > 0) {
        throw new IncompatibleProfile(
          `durable ${durable} on ${stream} exists with settings it cannot change: ${immutable.join("; ")}`,
          "delete the durable (or use a fresh run id) so it is created with the subscription's settings",
          [],
          { stream, durable, mismatches: immutable },
        );
      }
    }
    if (existing === null || configMismatches(requested, existing.config as never).length > 0) {
      try {
        await this.#jsm.consumers.add(stream, requested as Partial<ConsumerConfig>);
      } catch (error) {
        throw this.#unavailable(`create durable ${durable} on ${stream}`, error);
      }
    }
    const info = await this.#consumerInfoOrNull(stream, durable);
    if (info === null) throw new BrokerUnavailable(`durable ${durable} was created but cannot be read back`);
    const key = subscriptionKey(spec.id);
    const before = this.#subs.get(key);
    const state: SubState = before !== undefined && before.generation === info.created
      ? { ...before, spec }
      : {
        spec,
        stream,
        durable,
        generation: info.created,
        parked: [],
        latest: new Map(),
        exhausted: new Set(),
        lapsing: new Set(),
        settled: new Set(),
        admission: before?.admission ?? null,
      };
    if (before === undefined || before.generation !== info.created) this.#followAdvisories(state);
    this.#subs.set(key, state);
    this.#byDurable.set(`${stream}/${durable}`, state);
    const effective = info.config as unknown as Readonly<Record<string, unknown>>;
    return Object.freeze({
      spec,
      effective: Object.freeze({ ...effective }),
      mismatches: Object.freeze(configMismatches(requested, effective)),
    });
  }

  async #consumerInfoOrNull(stream: string, durable: string): Promise<ConsumerInfo | null> {
    try {
      return await this.#jsm.consumers.info(stream, durable);
    } catch (error) {
      if (isNotFound(error)) return null;
      throw this.#unavailable(`read durable ${durable} on ${stream}`, error);
    }
  }

  #followAdvisories(state: SubState): void {
    const subject = `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.${state.stream}.${state.durable}`;
    this.#nc.subscribe(subject, {
      callback: (_error, msg) => {
        const current = this.#byDurable.get(`${state.stream}/${state.durable}`);
        if (current === undefined) return;
        try {
          const seq = (msg.json() as { stream_seq?: unknown }).stream_seq;
          if (typeof seq !== "number") return;
          current.lapsing.delete(seq);
          if (!current.settled.has(seq)) current.exhausted.add(seq);
        } catch {
          // an advisory that is not JSON names no sequence
        }
      },
    });
  }

  // ---- publication ---------------------------------------------------------------------------------

  /** Publishes before `deadline` (see the module comment); past it the outcome is PublicationUnknown. */
  publish(envelope: Envelope, deadline: number): Promise<PublicationOutcome> {
    if (this.#shutDown) return this.#refused("publish");
    this.#checkDeadline(deadline);
    return this.#publishBefore(envelope, deadline);
  }

  /**
   * {@link MessagingBackend.publishBatch}: every entry is sent at once (their PubAcks outstanding together)
   * and answered in order; with a fault schedule installed, one after another so barrier hits are ordered.
   * Behind a data entry refused as retryable, a later data entry of the same channel is reported refused
   * when the server refused it too; the server takes one connection's publications in order, so under a
   * message limit a later one is refused as well unless a consumer made room in between.
   */
  async publishBatch(
    envelopes: readonly Envelope[],
    deadline: number,
  ): Promise<readonly PublicationOutcome[]> {
    if (this.#shutDown) return this.#refused("publishBatch");
    this.#checkDeadline(deadline);
    if (faultsInstalled()) {
      const outcomes: PublicationOutcome[] = [];
      for (const envelope of envelopes) outcomes.push(await this.#publishBefore(envelope, deadline));
      return outcomes;
    }
    return await this.#publishAllBefore(envelopes, deadline);
  }

  async #publishBefore(envelope: Envelope, deadline: number): Promise<PublicationOutcome> {
    return (await this.#publishAllBefore([envelope], deadline))[0];
  }

  /**
   * Publishes every envelope at once; one still unanswered at `deadline` is PublicationUnknown (one timer
   * for the whole batch).
   */
  async #publishAllBefore(
    envelopes: readonly Envelope[],
    deadline: number,
  ): Promise<PublicationOutcome[]> {
    let expire = () => {};
    const expired = new Promise<null>((resolve) => expire = () => resolve(null));
    const timer = this.#clock.setTimer(Math.max(0, deadline - this.#clock.monotonic()), expire);
    try {
      return await Promise.all(
        envelopes.map(async (envelope) =>
          await Promise.race([this.#publishSteps(envelope), expired]) ??
            publicationUnknown(envelope.publicationId, "the deadline passed before the server's PubAck")
        ),
      );
    } finally {
      timer.cancel();
    }
  }

  async #publishSteps(envelope: Envelope): Promise<PublicationOutcome> {
    const dlq = envelope.kind === MessageKind.dlq;
    const context = { op_id: envelope.publicationId, event_id: envelope.eventId };
    if (faultsInstalled()) {
      await barrier(dlq ? Barrier.dlqPublishBefore : Barrier.messagePublishBefore, context);
    }
    const channel = this.#channels.get(channelKey(envelope.channel));
    this.#noteFirstSend(
      envelope.publicationId,
      dlq || channel === undefined ? DEDUP_WINDOW_SECONDS : channel.spec.dedupWindowSeconds,
    );
    const result = await this.#send(envelope);
    switch (result.kind) {
      case "lost":
        return publicationUnknown(envelope.publicationId, result.reason);
      case "refused":
        if (channel !== undefined && !dlq) channel.rejected++;
        return rejected(envelope.publicationId, result.reason, result.retryable);
    }
    if (channel !== undefined && envelope.kind === MessageKind.data && !result.duplicate) {
      channel.heldItems = Math.max(0, channel.heldItems - 1);
      channel.heldBytes = Math.max(0, channel.heldBytes - envelope.size);
    }
    if (faultsInstalled()) {
      const hit = await barrier(dlq ? Barrier.dlqPublishAfter : Barrier.messagePublishAfter, context);
      if (hit.dropResponse) return publicationUnknown(envelope.publicationId, "the server's PubAck was lost");
    }
    return accepted(envelope.publicationId, result.seq, result.duplicate, "jetstream");
  }

  /**
   * Notes when this client first sent `publicationId` (a re-send does not move it: the window a re-publish
   * may rely on starts no later than the first send), and forgets the oldest sends whose window has passed,
   * so what is kept is bounded by the publication rate times the window, however long the run.
   */
  #noteFirstSend(publicationId: string, windowSeconds: number): void {
    const now = this.#clock.monotonic();
    if (!this.#sent.has(publicationId)) this.#sent.set(publicationId, { at: now, windowSeconds });
    for (const [id, sent] of this.#sent) {
      if (now - sent.at < sent.windowSeconds) break;
      this.#sent.delete(id);
    }
  }

  /** One publication request: the PubAck, a refusal, or nothing known. */
  async #send(envelope: Envelope): Promise<SendResult> {
    const h = natsHeaders();
    for (const [name, value] of Object.entries(envelope.headers)) h.set(name, value);
    h.set(MSG_ID_HEADER, envelope.publicationId);
    h.set(ENVELOPE_HEADER, String(ENVELOPE_VERSION));
    const outcome = await this.#requests.request(subjectOf(envelope), envelope.body, h);
    if (outcome.kind === "noResponders") return await this.#nobodyAnswered(envelope);
    if (outcome.kind !== "reply") return { kind: "lost", reason: `no PubAck: ${unanswered(outcome)}` };
    const reply = outcome.msg;
    let answer: {
      stream?: string;
      seq?: number;
      duplicate?: boolean;
      error?: { err_code?: number; description?: string };
    };
    try {
      answer = reply.json();
    } catch (error) {
      return { kind: "lost", reason: `an unreadable PubAck: ${describeError(error)}` };
    }
    if (answer.error !== undefined) {
      const code = answer.error.err_code ?? 0;
      return {
        kind: "refused",
        reason: `${answer.error.description ?? "refused"} (err_code ${code})`,
        retryable: FULL_CODES.has(code),
      };
    }
    if (typeof answer.seq !== "number") return { kind: "lost", reason: "a PubAck without a sequence" };
    return { kind: "ack", seq: answer.seq, duplicate: answer.duplicate === true };
  }

  /**
   * What a publication nobody answered means: a refusal when the stream it should land on is definitely
   * not there (JetStream says so), else nothing known (JetStream not up yet, a server restarting), so the
   * publisher retries it rather than give the node up.
   */
  async #nobodyAnswered(envelope: Envelope): Promise<SendResult> {
    const { flowId, runId, node } = envelope.channel;
    const stream = envelope.kind === MessageKind.dlq
      ? dlqStreamName(flowId)
      : streamNameFor(flowId, runId, node);
    try {
      if (await this.#streamInfoOrNull(stream, "a publication nobody answered") === null) {
        return {
          kind: "refused",
          reason: `no stream binds ${subjectOf(envelope)}: the server found no responders`,
          retryable: false,
        };
      }
    } catch {
      // JetStream itself did not answer either.
    }
    return {
      kind: "lost",
      reason: `no JetStream answered for ${subjectOf(envelope)}: the server found no responders`,
    };
  }

  /**
   * {@link MessagingBackend.reserveCredit}: room on the stream as read now, beside what this client already
   * holds; JetStream keeps no reservations, so another client may still take it (its refusal is then the
   * publication's outcome). An evicting channel grants at once.
   */
  async reserveCredit(
    channel: ChannelId,
    request: CreditRequest,
    deadline: number,
  ): Promise<Observation<PublishCredit>> {
    this.#live("reserveCredit");
    const state = this.#channels.get(channelKey(channel));
    if (state === undefined) {
      return unknown("missing", this.#clock, `channel ${channel.node} was not ensured by this client`);
    }
    const spec = state.spec;
    if (spec.overflow === Overflow.evictOldest) {
      return known(
        Object.freeze({ items: request.items, bytes: spec.maxBytes === null ? null : request.bytes }),
        this.#clock,
      );
    }
    if (spec.maxBytes !== null && request.minBytes > spec.maxBytes) {
      return known(Object.freeze({ items: 0, bytes: 0 }), this.#clock);
    }
    const data = subjectFor(channel.flowId, channel.runId, channel.node);
    for (;;) {
      let info: StreamInfo;
      try {
        info = await this.#jsm.streams.info(
          state.stream,
          spec.perSubjectLimits ? { subjects_filter: data } : {},
        );
      } catch (error) {
        return unknown(failureReason(error), this.#clock, `stream ${state.stream}: ${describeError(error)}`);
      }
      const stored = spec.perSubjectLimits ? (info.state.subjects?.[data] ?? 0) : info.state.messages;
      const items = spec.maxMsgs - stored - state.heldItems;
      const bytes = spec.maxBytes === null ? null : spec.maxBytes - info.state.bytes - state.heldBytes;
      if (items >= 1 && (bytes === null || bytes >= request.minBytes)) {
        const grant = {
          items: Math.min(request.items, items),
          bytes: bytes === null ? null : Math.min(request.bytes, bytes),
        };
        state.heldItems += grant.items;
        state.heldBytes += grant.bytes ?? 0;
        return known(Object.freeze(grant), this.#clock);
      }
      const left = deadline - this.#clock.monotonic();
      if (left <= 0) return known(Object.freeze({ items: 0, bytes: 0 }), this.#clock);
      await this.#clock.sleep(Math.min(left, CREDIT_POLL_SECONDS));
    }
  }

  /** Gives back the credit this client holds on `channel`. */
  releaseCredit(channel: ChannelId): void {
    this.#live("releaseCredit");
    const state = this.#channels.get(channelKey(channel));
    if (state === undefined) return;
    state.heldItems = 0;
    state.heldBytes = 0;
  }

  /**
   * Within the duplicate window of this client's first send of `envelope.publicationId`, an idempotent
   * re-publish (Accepted, `duplicate` when the first send was stored); beyond it, or for an id this client
   * never sent, Unresolvable: a re-publish there could store a second copy.
   */
  async observePublication(envelope: Envelope): Promise<PublicationOutcome> {
    this.#live("observePublication");
    const sent = this.#sent.get(envelope.publicationId);
    const now = this.#clock.monotonic();
    if (sent === undefined || now - sent.at >= sent.windowSeconds) {
      return publicationUnresolvable(
        envelope.publicationId,
        sent === undefined
          ? "this client never sent the publication, or sent it longer ago than its duplicate window"
          : "the stream's duplicate window has passed since the first send",
      );
    }
    const result = await this.#send(envelope);
    if (faultsInstalled()) {
      const hit = await barrier(Barrier.brokerObserveAfter, {
        what: "publication",
        op_id: envelope.publicationId,
      });
      if (hit.dropResponse) {
        return publicationUnknown(envelope.publicationId, "the observation's answer was lost");
      }
    }
    switch (result.kind) {
      case "lost":
        return publicationUnknown(envelope.publicationId, result.reason);
      case "refused":
        return rejected(envelope.publicationId, result.reason, result.retryable);
      default:
        return accepted(envelope.publicationId, result.seq, result.duplicate, "jetstream");
    }
  }

  // ---- receiving -----------------------------------------------------------------------------------

  /** {@link MessagingBackend.receive} (see the module comment). */
  async receive(
    subscription: SubscriptionId,
    itemCredit: number,
    byteCredit: number,
    deadline: number,
  ): Promise<readonly Delivery[]> {
    this.#live("receive");
    return await this.receiveAny([subscription], itemCredit, byteCredit, deadline);
  }

  /**
   * {@link MessagingBackend.receiveAny}: whatever the subscriptions hold now; else one long pull on each
   * until the deadline, then what any of them brought.
   */
  async receiveAny(
    subscriptions: readonly SubscriptionId[],
    itemCredit: number,
    byteCredit: number,
    deadline: number,
  ): Promise<readonly Delivery[]> {
    this.#live("receiveAny");
    requireCount(itemCredit, "a receive's item credit", 1);
    requireCount(byteCredit, "a receive's byte credit", 1);
    this.#checkDeadline(deadline);
    const states = subscriptions.map((id) => this.#boundSub(id));
    const out: Delivery[] = [];
    const taken = { bytes: 0 };
    for (;;) {
      for (const state of states) {
        await this.#fill(state, out, taken, itemCredit, byteCredit);
        if (out.length >= itemCredit || taken.bytes >= byteCredit) break;
      }
      if (out.length > 0 || this.#shutDown) break;
      const left = deadline - this.#clock.monotonic();
      if (left <= 0) break;
      if (this.#budgetFull()) {
        await this.#clock.sleep(Math.min(left, CREDIT_POLL_SECONDS));
        continue;
      }
      await Promise.race(
        states.map((state) => this.#pull(state, 1, Math.min(left, LONG_PULL_SECONDS), false)),
      );
    }
    if (out.length > 0 && faultsInstalled()) {
      const first = out[0].token;
      const hit = await barrier(Barrier.messageReceiveAfter, {
        consumer: first.subscription.consumerNode,
        attempt: first.attempt,
        status: `${out.length} leased`,
      });
      if (hit.dropResponse) return [];
    }
    return out;
  }

  /**
   * Hands out parked deliveries within the receive's credits, pulling (no_wait) while they and the byte
   * budget leave room; the budget bounds what is pulled (a parked delivery is resident already).
   */
  async #fill(
    state: SubState,
    out: Delivery[],
    taken: { bytes: number },
    itemCredit: number,
    byteCredit: number,
  ): Promise<void> {
    const room = () => out.length < itemCredit && taken.bytes < byteCredit;
    this.#take(state, out, taken, room);
    while (room() && !this.#budgetFull() && !this.#creditHeld(state)) {
      const bytesLeft = Math.min(byteCredit - taken.bytes, this.#budgetRoom());
      const batch = this.#batchSize(state, itemCredit - out.length, bytesLeft);
      const got = await this.#pull(state, batch, noWaitSeconds(batch), true);
      this.#take(state, out, taken, room);
      if (got < batch) return;
    }
  }

  /**
   * Whether this client alone holds all of the durable's credit (`max_ack_pending`): then the server
   * delivers nothing more until one is settled, and a `no_wait` pull would only sit open for
   * {@link noWaitSeconds} (nats-server 2.9.10 does not answer it): at the spec's prefetch of 4 that
   * waited 0.1 s for every few inputs. Replicas sharing the durable hold some of it too; this counts only
   * this client's, so it may still pull in vain. The credit compared is the subscription's own; a durable
   * made elsewhere with more only gets fewer `no_wait` pulls (the long pull still brings what it has).
   */
  #creditHeld(state: SubState): boolean {
    const held = state.parked.length + (this.#handedOutBySub.get(subscriptionKey(state.spec.id)) ?? 0);
    return held >= state.spec.itemCredit;
  }

  /** Messages one pull asks for: enough for the items left, fewer when bytes bound it (by the sizes seen). */
  #batchSize(state: SubState, items: number, bytes: number): number {
    if (!Number.isFinite(bytes) || bytes >= 1 << 30) return items;
    const seen = state.parked.length > 0 ? state.parked[0].msg.data.byteLength : this.#lastSize.get(state);
    if (seen === undefined) return 1;
    return Math.max(1, Math.min(items, Math.ceil(bytes / Math.max(1, seen))));
  }

  readonly #lastSize = new WeakMap<SubState, number>();

  #take(state: SubState, out: Delivery[], taken: { bytes: number }, room: () => boolean): void {
    while (state.parked.length > 0 && room()) {
      const parked = state.parked.shift() as Parked;
      const delivery = this.#deliver(state, parked);
      const admission = state.admission;
      if (admission !== null && !admission.admit(delivery)) {
        this.#skip(delivery, admission);
        continue;
      }
      out.push(delivery);
      taken.bytes += delivery.size;
    }
    this.#armKeepalive();
  }

  #deliver(state: SubState, parked: Parked): Delivery {
    const msg = parked.msg;
    const headers: Record<string, string> = {};
    if (msg.headers !== undefined) {
      for (const [name, values] of msg.headers) headers[name] = values[0] ?? "";
    }
    const messageId = headers[MSG_ID_HEADER] ?? `${state.stream}:${parked.streamSeq}`;
    const token = new JetStreamToken(
      state.spec.id,
      messageId,
      parked.streamSeq,
      parked.delivered,
      state.generation,
      msg.reply ?? "",
      msg.data.byteLength,
      this.#clock.monotonic() + state.spec.ackWaitSeconds,
    );
    state.latest.set(parked.streamSeq, parked.delivered);
    this.#handedOut.add(token);
    const key = subscriptionKey(state.spec.id);
    this.#handedOutBySub.set(key, (this.#handedOutBySub.get(key) ?? 0) + 1);
    this.#lastSize.set(state, msg.data.byteLength);
    return Object.freeze({
      token,
      envelopeBytes: msg.data,
      size: msg.data.byteLength,
      receivedAt: this.#clock.monotonic(),
      headers: Object.freeze(headers),
    });
  }

  #skip(delivery: Delivery, admission: Admission): void {
    const token = delivery.token;
    this.settle(token, { kind: "completed" }, `skip/${token.messageId}/${token.attempt}`).catch(() => {});
    const onSkip = admission.onSkip;
    if (onSkip !== null) queueMicrotask(() => onSkip(delivery));
  }

  /**
   * One pull request of `batch` messages that the server holds open for `seconds` (`noWait`: answers at
   * once when nothing is deliverable). Resolves with how many messages it brought; they are parked.
   */
  #pull(state: SubState, batch: number, seconds: number, noWait: boolean): Promise<number> {
    const token = String(++this.#pullCounter);
    const { promise, resolve } = Promise.withResolvers<number>();
    const got: Parked[] = [];
    const timer = this.#clock.setTimer(seconds + 0.5, () => finish());
    const finish = () => {
      if (!this.#pulls.delete(token)) return;
      timer.cancel();
      resolve(got.length);
    };
    this.#pulls.set(token, { state, want: batch, got, done: finish });
    const request: Record<string, unknown> = { batch, expires: nanos(seconds) };
    if (noWait) request.no_wait = true;
    try {
      this.#nc.publish(
        `$JS.API.CONSUMER.MSG.NEXT.${state.stream}.${state.durable}`,
        JSON.stringify(request),
        { reply: `${this.#inbox}.${token}` },
      );
    } catch {
      finish();
    }
    return promise;
  }

  /**
   * A message on the pull inbox: a status (on the pull's own reply subject) ends that pull; a delivery (on
   * its original subject, named by its ack subject) is parked with its subscription and counted to the
   * oldest open pull of that subscription, which the server serves first.
   */
  #onPulled(msg: Msg): void {
    const info = msg.reply ? ackInfo(msg.reply) : null;
    if (info === null) {
      if (msg.headers?.code === 100) return;
      this.#pulls.get(msg.subject.slice(this.#inbox.length + 1))?.done();
      return;
    }
    const state = this.#byDurable.get(`${info.stream}/${info.durable}`);
    if (state === undefined || this.#shutDown) {
      this.#nc.publish(msg.reply as string, "-NAK");
      return;
    }
    const parked = { msg, delivered: info.delivered, streamSeq: info.streamSeq };
    state.parked.push(parked);
    this.#resident += msg.data.byteLength;
    for (const pull of this.#pulls.values()) {
      if (pull.state !== state) continue;
      pull.got.push(parked);
      if (pull.got.length >= pull.want) pull.done();
      return;
    }
  }

  #budgetFull(): boolean {
    return this.#byteBudget !== null && this.#resident >= this.#byteBudget;
  }

  #budgetRoom(): number {
    return this.#byteBudget === null ? Infinity : Math.max(0, this.#byteBudget - this.#resident);
  }

  /** Keeps parked deliveries leased (`+WPI`) every `max(1 s, shortest ack wait / 3)` while any is parked. */
  #armKeepalive(): void {
    if (this.#keepalive !== null || this.#shutDown) return;
    let shortest = Infinity;
    for (const state of this.#subs.values()) {
      if (state.parked.length > 0) shortest = Math.min(shortest, state.spec.ackWaitSeconds);
    }
    if (shortest === Infinity) return;
    this.#keepalive = this.#clock.setTimer(Math.max(1, shortest / 3), () => {
      this.#keepalive = null;
      for (const state of this.#subs.values()) {
        for (const parked of state.parked) {
          if (parked.msg.reply) this.#nc.publish(parked.msg.reply, "+WPI");
        }
      }
      this.#armKeepalive();
    });
  }

  // ---- leases and settlement -----------------------------------------------------------------------

  /** Extends a live delivery's lease by its ack wait (`+WPI`, answered by the server). */
  async renew(token: DeliveryToken): Promise<LeaseObservation> {
    this.#live("renew");
    const own = JetStreamToken.own(token);
    if (own === null) return leaseObservation(token, false, null, "not a delivery of this client");
    const state = this.#subs.get(subscriptionKey(token.subscription));
    const stale = state === undefined ? "its subscription is not bound here" : this.#staleness(state, own);
    if (stale !== null) return leaseObservation(token, false, null, stale);
    if (faultsInstalled()) {
      await barrier(Barrier.messageRenewBefore, {
        consumer: token.subscription.consumerNode,
        attempt: token.attempt,
      });
    }
    const renewed = await this.#requests.request(own.reply, "+WPI");
    if (renewed.kind !== "reply") {
      return leaseObservation(token, false, null, `the renewal was not confirmed: ${unanswered(renewed)}`);
    }
    own.leaseUntil = this.#clock.monotonic() + (state as SubState).spec.ackWaitSeconds;
    return leaseObservation(token, true, own.leaseUntil);
  }

  /** {@link MessagingBackend.settle} (see the module comment). */
  settle(token: DeliveryToken, outcome: Settlement, settlementId: string): Promise<SettlementOutcome> {
    try {
      this.#checkSettle("settle", outcome, settlementId);
    } catch (error) {
      return Promise.reject(error);
    }
    return this.#settleOne(token, outcome, settlementId);
  }

  /**
   * {@link MessagingBackend.settleBatch}: every request checked first (DELIV-15), then every settlement in
   * flight at once (one after another with a fault schedule installed), answered in order.
   */
  async settleBatch(requests: readonly SettleRequest[]): Promise<readonly SettlementOutcome[]> {
    for (const request of requests) this.#checkSettle("settleBatch", request.outcome, request.settlementId);
    if (faultsInstalled()) {
      const outcomes: SettlementOutcome[] = [];
      for (const r of requests) outcomes.push(await this.#settleOne(r.token, r.outcome, r.settlementId));
      return outcomes;
    }
    return await Promise.all(requests.map((r) => this.#settleOne(r.token, r.outcome, r.settlementId)));
  }

  #checkSettle(operation: string, outcome: Settlement, settlementId: string): void {
    this.#live(operation);
    checkSettlement(outcome);
    this.#requireOperation(settlementId);
  }

  async #settleOne(
    token: DeliveryToken,
    outcome: Settlement,
    settlementId: string,
  ): Promise<SettlementOutcome> {
    const own = JetStreamToken.own(token);
    const state = this.#subs.get(subscriptionKey(token.subscription));
    if (own === null || state === undefined) {
      return settleUnknown(
        token,
        "not a delivery this client handed out, or its subscription is not bound here",
      );
    }
    if (this.#staleness(state, own) !== null) return this.#stale(own, state);
    const context = {
      consumer: token.subscription.consumerNode,
      attempt: token.attempt,
      op_id: settlementId,
    };
    if (faultsInstalled()) {
      await barrier(Barrier.messageSettleBefore, context);
      if (this.#staleness(state, own) !== null) return this.#stale(own, state);
    }
    const seq = own.streamSequence;
    const last = state.spec.maxDeliver !== -1 && own.attempt >= state.spec.maxDeliver;
    if (outcome.kind === "retry" && last) {
      state.lapsing.add(seq);
    } else {
      const payload = outcome.kind === "completed"
        ? "+ACK"
        : outcome.kind === "terminal"
        ? "+TERM"
        : outcome.delaySeconds === null
        ? "-NAK"
        : `-NAK ${JSON.stringify({ delay: nanos(outcome.delaySeconds) })}`;
      const confirmed = await this.#requests.request(own.reply, payload);
      if (confirmed.kind !== "reply") {
        this.#release(own);
        return settleUnknown(token, `the server's confirmation did not come: ${unanswered(confirmed)}`);
      }
    }
    if (outcome.kind !== "retry") {
      own.state = SETTLED;
      state.settled.add(seq);
      state.exhausted.delete(seq);
      state.lapsing.delete(seq);
      if (state.latest.get(seq) === own.attempt) state.latest.delete(seq);
    }
    this.#release(own);
    if (faultsInstalled()) {
      const hit = await barrier(Barrier.messageSettleAfter, context);
      if (hit.dropResponse) return settleUnknown(token, "the server's confirmation was lost");
    }
    return settleConfirmed(token, settlementId);
  }

  /** Why `token` can no longer decide its message here, or null when it is current. */
  #staleness(state: SubState, token: JetStreamToken): string | null {
    if (token.state === RETIRED) return "its receiver retired it";
    if (token.generation !== state.generation) return "its durable was created again since";
    const latest = state.latest.get(token.streamSequence);
    if (latest !== undefined && latest > token.attempt) return `attempt ${latest} was delivered since`;
    return null;
  }

  /** SettleStale for a token no longer current, which then holds nothing here (released). */
  #stale(own: JetStreamToken, state: SubState): SettlementOutcome {
    this.#release(own);
    return settleStale(own, state.latest.get(own.streamSequence) ?? own.attempt, state.generation);
  }

  /** A handed-out token no longer held by its receiver: its bytes leave the budget. */
  #release(token: JetStreamToken): void {
    if (!this.#handedOut.delete(token)) return;
    this.#resident -= token.size;
    const key = subscriptionKey(token.subscription);
    const held = (this.#handedOutBySub.get(key) ?? 1) - 1;
    if (held > 0) this.#handedOutBySub.set(key, held);
    else this.#handedOutBySub.delete(key);
  }

  /** Retires a live token of this client without a broker call; a later settle of it is SettleStale. */
  supersede(token: DeliveryToken): boolean {
    this.#live("supersede");
    const own = JetStreamToken.own(token);
    if (own === null || own.state !== LIVE) return false;
    const state = this.#subs.get(subscriptionKey(token.subscription));
    const current = state !== undefined && this.#staleness(state, own) === null;
    // Current or not, the token holds nothing here any more: its bytes and credit leave this client's count.
    this.#release(own);
    if (current) own.state = RETIRED;
    return current;
  }

  // ---- observation ---------------------------------------------------------------------------------

  /**
   * The durable's counters: `available` is what the server has yet to deliver, `leased` what it holds
   * handed out (less the last attempts retried here, which are unresolved), `unresolved` the exhausted
   * messages still retained, `dropped` the messages the stream lost below the durable's ack floor that it
   * never settled, `rejectedPublications` this client's refused publications on the channel.
   */
  async observeSubscription(subscription: SubscriptionId): Promise<Observation<SubscriptionObservation>> {
    this.#live("observeSubscription");
    const { flowId, runId, node } = subscription.channel;
    const stream = streamNameFor(flowId, runId, node);
    const durable = durableNameOf(subscription);
    let consumer: ConsumerInfo;
    let streamInfo: StreamInfo;
    try {
      [consumer, streamInfo] = await Promise.all([
        this.#jsm.consumers.info(stream, durable),
        this.#jsm.streams.info(stream),
      ]);
    } catch (error) {
      return unknown(
        failureReason(error),
        this.#clock,
        `durable ${durable} on ${stream}: ${describeError(error)}`,
      );
    }
    const lost = await this.#observed("subscription");
    if (lost !== null) return lost;
    const state = this.#subs.get(subscriptionKey(subscription));
    if (state !== undefined) this.#noteLapsed(state);
    const first = streamInfo.state.first_seq;
    const retainedOf = (seqs: Set<number> | undefined) => [...(seqs ?? [])].filter((seq) => seq >= first);
    const unresolved = new Set([...retainedOf(state?.exhausted), ...retainedOf(state?.lapsing)]).size;
    const floor = consumer.ack_floor.stream_seq;
    if (state !== undefined) forgetSettledUpTo(state, floor);
    const settledBetween = [...(state?.settled ?? [])].filter((seq) => seq > floor && seq < first).length;
    const dropped = Math.max(0, first - 1 - floor - settledBetween);
    const channel = this.#channels.get(channelKey(subscription.channel));
    return known(
      Object.freeze({
        available: consumer.num_pending,
        leased: Math.max(0, consumer.num_ack_pending - retainedOf(state?.lapsing).length),
        unresolved,
        dropped,
        rejectedPublications: channel?.rejected ?? 0,
      }),
      this.#clock,
      consumer.created,
    );
  }

  /**
   * Counts as lapsing every last permitted attempt this client handed out whose lease ran out unsettled:
   * the server can never deliver it again, though it counts it leased until it next tries (and then
   * advises MAX_DELIVERIES, which moves it to `exhausted`).
   */
  #noteLapsed(state: SubState): void {
    if (state.spec.maxDeliver === -1) return;
    const now = this.#clock.monotonic();
    const key = subscriptionKey(state.spec.id);
    for (const token of this.#handedOut) {
      if (token.state !== LIVE || subscriptionKey(token.subscription) !== key) continue;
      const seq = token.streamSequence;
      const last = token.attempt >= state.spec.maxDeliver && state.latest.get(seq) === token.attempt;
      if (last && token.leaseUntil <= now && !state.exhausted.has(seq)) state.lapsing.add(seq);
    }
  }

  /**
   * The configuration the server applies to a channel's stream, read back as it is now; Unknown `missing`
   * when no such stream exists, else Unknown with why it could not be read.
   */
  async observeStreamConfig(channel: ChannelId): Promise<Observation<StreamConfig>> {
    this.#live("observeStreamConfig");
    const stream = streamNameFor(channel.flowId, channel.runId, channel.node);
    try {
      const info = await this.#jsm.streams.info(stream);
      return known(info.config, this.#clock, info.created);
    } catch (error) {
      return unknown(failureReason(error), this.#clock, `stream ${stream}: ${describeError(error)}`);
    }
  }

  /** The stream's retained range (`firstSeq = lastSeq + 1` when empty). */
  async observeChannel(channel: ChannelId): Promise<Observation<ChannelObservation>> {
    this.#live("observeChannel");
    const stream = streamNameFor(channel.flowId, channel.runId, channel.node);
    let info: StreamInfo;
    try {
      info = await this.#jsm.streams.info(stream);
    } catch (error) {
      return unknown(failureReason(error), this.#clock, `stream ${stream}: ${describeError(error)}`);
    }
    const lost = await this.#observed("channel");
    if (lost !== null) return lost;
    const s = info.state;
    return known(
      Object.freeze({
        firstSeq: s.messages === 0 ? s.last_seq + 1 : s.first_seq,
        lastSeq: s.last_seq,
        messages: s.messages,
        retention: info.config.retention === "limits" ? Retention.limits : Retention.interest,
      }),
      this.#clock,
      info.created,
    );
  }

  /** The durable's ack floor (stream sequence), for any subscription of any run on this server. */
  async observeAckFloor(subscription: SubscriptionId): Promise<Observation<number>> {
    this.#live("observeAckFloor");
    const { flowId, runId, node } = subscription.channel;
    const stream = streamNameFor(flowId, runId, node);
    const durable = durableNameOf(subscription);
    let info: ConsumerInfo;
    try {
      info = await this.#jsm.consumers.info(stream, durable);
    } catch (error) {
      return unknown(
        failureReason(error),
        this.#clock,
        `durable ${durable} on ${stream}: ${describeError(error)}`,
      );
    }
    const lost = await this.#observed("ack floor");
    if (lost !== null) return lost;
    return known(info.ack_floor.stream_seq, this.#clock, info.created);
  }

  async #observed(what: string): Promise<Observation<never> | null> {
    if (!faultsInstalled()) return null;
    const hit = await barrier(Barrier.brokerObserveAfter, { what });
    return hit.dropResponse
      ? unknown("timeout", this.#clock, `the ${what} observation's answer was lost`)
      : null;
  }

  // ---- the rest of the contract --------------------------------------------------------------------

  /** Keeps `admit` for `subscription`: a refused delivery is settled Completed here and reported to `onSkip`. */
  setAdmission(
    subscription: SubscriptionId,
    admit: (delivery: Delivery) => boolean,
    onSkip?: (delivery: Delivery) => void,
  ): boolean {
    this.#live("setAdmission");
    this.#boundSub(subscription).admission = { admit, onSkip: onSkip ?? null };
    return true;
  }

  /** Deliveries pulled and parked here for `subscription`, not yet handed out. */
  prefetched(subscription: SubscriptionId): number {
    return this.#subs.get(subscriptionKey(subscription))?.parked.length ?? 0;
  }

  /** Calls `callback` once the run's flow-wide stop (core NATS, payload `stop`) is published. */
  subscribeControl(callback: () => void): void {
    this.#live("subscribeControl");
    const run = this.#run;
    if (run === null) {
      throw new ConfigError(
        "this JetStream client serves no run, so it has no control subject to listen to",
        "connect with { run: { flowId, runId } }",
      );
    }
    this.#controlCallbacks.push(callback);
    if (this.#stopSeen) {
      queueMicrotask(callback);
      return;
    }
    if (this.#controlSubscribed) return;
    this.#controlSubscribed = true;
    this.#nc.subscribe(controlSubjectFor(run.flowId, run.runId), {
      callback: () => {
        if (this.#stopSeen) return;
        this.#stopSeen = true;
        for (const cb of this.#controlCallbacks) queueMicrotask(cb);
      },
    });
  }

  /**
   * Hands back every delivery this client still holds (parked or handed out and unsettled: `-NAK`, so the
   * others receive them now rather than after ack_wait), stops its timers and closes its connection. Later
   * calls throw ResourceUnavailable.
   */
  async shutdown(): Promise<void> {
    if (this.#shutDown) return;
    this.#shutDown = true;
    this.#keepalive?.cancel();
    this.#keepalive = null;
    for (const pull of [...this.#pulls.values()]) pull.done();
    for (const state of this.#subs.values()) {
      for (const parked of state.parked.splice(0)) {
        if (parked.msg.reply) this.#nc.publish(parked.msg.reply, "-NAK");
      }
    }
    for (const token of this.#handedOut) {
      if (token.state === LIVE && token.reply) this.#nc.publish(token.reply, "-NAK");
    }
    this.#handedOut.clear();
    this.#handedOutBySub.clear();
    this.#resident = 0;
    this.#requests.close();
    try {
      await this.#nc.drain();
    } catch {
      await this.#nc.close();
    }
  }

  /**
   * Deletes exactly the `owned` channels' streams this run owns: by owner labels (and `expectedGeneration`
   * when given) where the stream has them, else by its data subject naming the run token for token. A
   * stream already gone counts as removed; an inventory that could not be read removes nothing.
   */
  async close(owned: readonly ChannelId[], expectedGeneration: string): Promise<CleanupObservation> {
    this.#live("close");
    const names = owned.map((id) => streamNameFor(id.flowId, id.runId, id.node));
    const inventory = new Map<string, StreamInfo>();
    try {
      for await (const info of this.#jsm.streams.list()) inventory.set(info.config.name, info);
    } catch (error) {
      return cleanupObservation(
        false,
        [],
        [...new Set(names)],
        `the stream inventory: ${describeError(error)}`,
      );
    }
    if (faultsInstalled()) {
      const hit = await barrier(Barrier.brokerObserveAfter, { what: "inventory", status: "close" });
      if (hit.dropResponse) {
        return cleanupObservation(false, [], [...new Set(names)], "the stream inventory could not be read");
      }
    }
    const removed: string[] = [];
    const remaining: string[] = [];
    const reasons: string[] = [];
    const seen = new Set<string>();
    for (const [index, id] of owned.entries()) {
      const name = names[index];
      if (seen.has(name) || name === dlqStreamName(id.flowId)) continue;
      seen.add(name);
      const info = inventory.get(name);
      if (info === undefined) {
        removed.push(name);
        continue;
      }
      if (!this.#ownedStream(info, id, expectedGeneration)) {
        remaining.push(name);
        reasons.push(`${name} is not owned by run ${id.runId} generation ${expectedGeneration || "(any)"}`);
        continue;
      }
      try {
        await this.#jsm.streams.delete(name);
        removed.push(name);
        this.#forget(id);
      } catch (error) {
        if (isNotFound(error)) {
          removed.push(name);
          this.#forget(id);
        } else {
          remaining.push(name);
          reasons.push(`${name}: ${describeError(error)}`);
        }
      }
    }
    return cleanupObservation(remaining.length === 0, removed, remaining, reasons.join("; "));
  }

  /** Whether stream `info` is channel `id`'s by exact ownership (labels, else its subjects). */
  #ownedStream(info: StreamInfo, id: ChannelId, expectedGeneration: string): boolean {
    const metadata = (info.config as { metadata?: Record<string, string> }).metadata;
    if (metadata !== undefined && Object.keys(metadata).length > 0) {
      return owns(metadata, id.flowId, id.runId, expectedGeneration || null);
    }
    const data = subjectFor(id.flowId, id.runId, id.node);
    return (info.config.subjects ?? []).some((subject) => {
      const owner = subjectOwner(subject);
      return subject === data && owner !== null;
    });
  }

  #forget(id: ChannelId): void {
    this.#channels.delete(channelKey(id));
    for (const [key, state] of this.#subs) {
      if (channelKey(state.spec.id.channel) !== channelKey(id)) continue;
      this.#subs.delete(key);
      this.#byDurable.delete(`${state.stream}/${state.durable}`);
    }
  }

  // ---- internals -----------------------------------------------------------------------------------

  #boundSub(id: SubscriptionId): SubState {
    const state = this.#subs.get(subscriptionKey(id));
    if (state === undefined) {
      throw new ConfigError(
        `subscription ${durableNameOf(id)} of ${id.consumerNode} on ${id.channel.node} is not bound here`,
        "ensureSubscription before receiving",
      );
    }
    return state;
  }

  #checkDeadline(deadline: number): void {
    if (!Number.isFinite(deadline)) {
      throw new ConfigError(`a deadline must be a finite monotonic reading, got ${deadline}`);
    }
  }

  #requireOperation(id: string): void {
    if (typeof id !== "string" || id === "") {
      throw new ConfigError(
        "an operation id must be a non-empty string",
        "pass the operation's stable identity",
      );
    }
  }

  #unavailable(what: string, error: unknown): BrokerUnavailable {
    return new BrokerUnavailable(`JetStream could not ${what}: ${describeError(error)}`, null, { what });
  }

  #live(operation: string): void {
    if (this.#shutDown) throw this.#closedError(operation);
  }

  #closedError(operation: string): ResourceUnavailable {
    return new ResourceUnavailable(
      `the JetStream client was shut down; ${operation} is no longer possible`,
      "connect a new JetStreamMessagingBackend",
    );
  }

  #refused<T>(operation: string): Promise<T> {
    return Promise.reject(this.#closedError(operation));
  }
}
