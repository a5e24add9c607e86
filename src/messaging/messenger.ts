/**
 * The messenger a node's task loop talks to (spec messaging.nats_messenger, the part that is the
 * messenger's to decide): it composes any {@link MessagingBackend} (the transport), an optional
 * {@link PayloadStore} (frames above the inline threshold) and the node's {@link FlowRuntime} ledger, and
 * implements the core {@link Messenger} seam over them.
 *
 * What it decides, and guarantees:
 * - Identities. A producer mints `{node}:{n}` (WIRE.md), `{node}:{epoch}:{n}` over a durable ledger
 *   (MSGID-5: a restarted live source never re-mints a predecessor's ids) or `{node}:{offset}` when
 *   replayable (MSGID-6); a processor carries trace id, seq and event time forward from its input group,
 *   never from a clock, so a recomputed output has the same message id and the broker deduplicates it.
 * - Receive. Deliveries are taken in batches from every parent's data subscription and this replica's own
 *   EOS subscriptions, decoded once, and assembled into complete input groups by the join assembler
 *   (trace or time, quorum, collect, `max_pending` eviction, redelivery supersede); every handle is settled
 *   exactly once. A partitioned replica reads every message and acks what it does not own (the backend's
 *   admission filter when it keeps one; an unusable key is a PartitionKeyError dead-lettered by replica 0,
 *   or routed to `fallback_partition`, RUN-020).
 * - End of stream. A parent is drained (EOS-3) when every expected replica's EOS was seen and its data
 *   subscription reports nothing available, nothing leased beyond the halves this join holds and (for an
 *   at-least-once node) nothing unresolved, continuously for `eosQuiescenceMs`; over a durable, shared
 *   ledger a batch parent instead
 *   passes the EOS-7 completion barrier (terminators of every replica, received ids covering the announced
 *   counts, nothing pending; Unknown waits, never completes). Only then is its EOS acked and fed to the
 *   join. ABORT outranks EOS and surfaces at once (ABORT-3); EOS and ABORT publications are never dropped.
 * - Failures. `failInputs` applies `DeliveryPolicy.actionFor(disposition, numDelivered)`: nak with backoff,
 *   or dead-letter the original bytes (headers VF-Origin-Node, VF-Error, VF-Num-Delivered, id
 *   `dlq:{flow}:{run}:{node}:{stream_seq}`) and terminate only once the dead letter is accepted, else
 *   record a pending handoff and keep the delivery alive (DELIV-15); a termination without a dead letter
 *   references a terminal-log record. Undecodable input, a missing or corrupt payload and an unusable
 *   partition key take the same ladder as poison without reaching the node, and so does a redelivery whose
 *   budget replica deaths used up under the ledger budget (its supervisor counted each death with it inside
 *   the node, `FlowRuntime.recordReplicaDeath`): VF_POISON_REPLICA_CRASHED or VF_POISON_REPLICA_STALLED.
 * - Payloads above the inline threshold leave the envelope through the payload bridge under the readers'
 *   obligations; a reader's obligation is released only after a confirmed settlement (PAY-004).
 * - Checkpoints commit with their output in one ledger write (RUN-003, RUN-022; refused on a ledger that
 *   dies with the process); the covered group's redelivery is acked without reaching the node, after its
 *   committed output is confirmed.
 * - A time join over a durable ledger persists each group it hands out until its inputs settle, so a
 *   replacement re-forms the same group from the redelivered members (story 1).
 * - Ledger writes on the hot path are amortized: a received batch is noted in one write, which runs while
 *   the batch is processed and is done before any of it is settled, accepted publication ids and a
 *   replayable source's offset are flushed in batches, and nothing is written that the configuration does
 *   not need (a memory ledger keeps no received sets). The EOS-7 barrier reads the ledger only when the
 *   broker reports nothing pending for the node, the one state in which it can be complete.
 *
 * The run's channels and data subscriptions must exist (`provisionFlow`) before {@link BrokerMessenger.open}.
 *
 * The messenger is composed of parts that each own their state and say what they guarantee; it holds
 * them and wires them, and they reach it only through the callbacks they are built with:
 * `OutputIdentities` (output_identity.ts: trace ids, seqs, a replayable source's offsets),
 * `OrderedPublisher` (ordered_publisher.ts: credit, batch calls, order across refusals, the stop's
 * give-up), `LedgerWriter` (ledger_writer.ts: batched published ids and offsets, checkpoints),
 * `DeadLetterLadder` (dead_letter_ladder.ts: DELIV-15), `InputSettlement` (input_settlement.ts),
 * `ReceivedRecorder` (received_recorder.ts: EOS-7 received sets), `EosDrain` (eos_drain.ts: EOS-3 and
 * the EOS-7 barrier), `PartitionLease` (partition_lease.ts), `PartitionAdmission`
 * (partition_admission.ts: RUN-020), `GroupRecovery` (group_recovery.ts: story 1), `CheckpointCoverage`
 * (checkpoint_coverage.ts), `DeliveryRoutes` (delivery_routes.ts), `DeliveryKeepalive`
 * (delivery_keepalive.ts) and `PayloadOffload` (payload_offload.ts), with the input groups handed to the
 * task made in input_groups.ts, beside `InFlight`, `OrderedRelease` and the join assembler (grouping.ts).
 * What it keeps itself is the seam: the receive loop and the hand-out of input groups, the group in hand
 * and its outputs, acks and failures, data and end-marker publications, the counts, and the stop
 * signals. The parts see only the backend and ledger contracts, so another backend composes them
 * unchanged.
 *
 * @example
 * ```ts
 * const messenger = await BrokerMessenger.open({
 *   backend, flowId: "f", runId: "r", flowType: "batch", node: "detect", parentNames: ["cam"], runtime,
 * });
 * const group = await messenger.receiveMessage();
 * ```
 *
 * @module
 */

import { ByteSlab } from "../core/bytes.ts";
import { requireCount, requirePositiveSeconds } from "../core/checks.ts";
import { DropReason } from "../core/metrics.ts";
import { MessagingProfile } from "../backends/capabilities.ts";
import { type Clock, systemClock } from "../backends/clock.ts";
import { Barrier, barrier, faultsInstalled } from "../backends/faults.ts";
import {
  type ChannelId,
  channelId,
  completed,
  type Delivery,
  type Envelope as BackendEnvelope,
  envelope as backendEnvelope,
  MessageKind,
  type MessagingBackend,
  retry,
  type SubscriptionId,
  type SubscriptionObservation,
} from "../backends/messaging.ts";
import { MemoryRuntimeStore } from "../backends/memory/runtime_store.ts";
import { known, type Observation, type PublicationOutcome } from "../backends/outcomes.ts";
import { intentObligationId, type PayloadStore } from "../backends/payload.ts";
import {
  BATCH_BLOB_TTL_SECONDS,
  DEFAULT_MAX_INLINE_PAYLOAD_BYTES,
  REALTIME_BLOB_TTL_SECONDS,
} from "../backends/payload_bridge.ts";
import { FlowRuntime, PublicationKind, TerminatorKind } from "../backends/runtime.ts";
import { CHECKPOINT_METADATA_KEY, type Logger, PARTITION_KEY_METADATA_KEY } from "../core/context.ts";
import {
  ACTION_NAK,
  AT_LEAST_ONCE,
  BEST_EFFORT,
  type DeliveryMode,
  DeliveryPolicy,
  drawRetryJitter,
} from "../core/delivery_policy.ts";
import {
  asRuntimeError,
  BrokerUnavailable,
  ConfigError,
  DecodeError,
  DEFAULT_DISPOSITION,
  type Disposition,
  errorToDict,
  PoisonMessage,
  replicaDeathFailure,
  TransientFailure,
  type VideoflowRuntimeError,
} from "../core/errors.ts";
import { checkFlowType, FlowType } from "../core/flow_type.ts";
import { randomHex } from "../core/hex.ts";
import { JOIN_TIME, JoinPolicy } from "../core/join_policy.ts";
import { type InputGroup, type InputInfo, type Messenger, StopReason } from "../core/messenger.ts";
import type { JsonObject } from "../core/node.ts";
import { ORDER_SEQUENCE, type OrderingPolicy } from "../core/ordering_policy.ts";
import type { PartitionKeyPolicy } from "../core/partition_key_policy.ts";
import {
  abortPayload,
  createEnvelope,
  decodePayload,
  encodeEnvelope,
  encodeEnvelopeWithPayload,
  encodePayload,
  type Envelope as WireEnvelope,
  ENVELOPE_VERSION,
  type PreparedPayload,
  preparePayload,
} from "../wire/codec.ts";
import {
  abortTraceId,
  eosTraceId,
  isValidPartitionKey,
  messageId,
  MsgType,
  partitionKeyOf,
  partitionKeyString,
} from "../wire/identities.ts";
import type { BlobRef, WireMap, WirePayload } from "../wire/value.ts";
import {
  entryFromEnvelope,
  type GroupAssembler,
  GroupKind,
  makeAssembler,
  type ReadyGroup,
  type Release,
  ReleaseReason,
  Settlement,
} from "./grouping.ts";
import { OrderedRelease } from "./ordered_release.ts";
import { InFlight } from "./in_flight.ts";
import {
  consumerCredit,
  dataSubscriptionId,
  dataSubscriptionSpec,
  DEFAULT_ACK_WAIT_SECONDS,
  DEFAULT_BYTE_CREDIT,
  DEFAULT_IN_FLIGHT_BYTES,
  defaultPrefetch,
  defaultProfile,
  durableNameOf,
  eosSubscriptionId,
  eosSubscriptionSpec,
  joinItemCredit,
  type NodeRouting,
} from "./topology.ts";
import { OrderedPublisher } from "./ordered_publisher.ts";
import { LedgerWriter } from "./ledger_writer.ts";
import { DeadLetterLadder } from "./dead_letter_ladder.ts";
import { PartitionLease } from "./partition_lease.ts";
import { ReceivedRecorder } from "./received_recorder.ts";
import { EosDrain } from "./eos_drain.ts";
import { GroupRecovery } from "./group_recovery.ts";
import { decodeDelivery, PartitionAdmission } from "./partition_admission.ts";
import { CheckpointCoverage } from "./checkpoint_coverage.ts";
import { DeliveryRoutes } from "./delivery_routes.ts";
import { abortMarker, dataInput, stopGroup, terminalInput } from "./input_groups.ts";
import { DeliveryKeepalive } from "./delivery_keepalive.ts";
import { PayloadOffload } from "./payload_offload.ts";
import { InputSettlement } from "./input_settlement.ts";
import { OutputIdentities, type OutputIdentity } from "./output_identity.ts";

/** EOS-3's quiescence when nothing narrower is configured (`VF_EOS_QUIESCENCE_MS`), in milliseconds. */
export const DEFAULT_EOS_QUIESCENCE_MS = 500;
/** How long one publication waits for the broker's receipt before its outcome is unknown, in seconds. */
export const DEFAULT_PUBLISH_TIMEOUT_SECONDS = 10;
/** The longest a receive waits before the messenger re-checks stops, drains and join timeouts, in seconds. */
export const RECEIVE_WAIT_SECONDS = 0.5;
/**
 * The shortest a receive waits when nothing is available (1 ms): a timeout due right now is handled on the
 * next turn without the loop spinning on a deadline that rounding keeps a hair ahead of the clock.
 */
export const MIN_RECEIVE_WAIT_SECONDS = 0.001;
/**
 * Publications and settlements that may await the broker at once while the node goes on: an input is
 * still acked only after its outputs were accepted, and EOS only after all of them.
 */
export const DEFAULT_IN_FLIGHT = 256;
/** The most publications (or settlements) one batch call carries. */
export const CALL_BATCH_ENTRIES = 64;

export { DeadLetterHeader } from "./dead_letter_ladder.ts";
export { RECEIVED_LINGER_SECONDS } from "./received_recorder.ts";
export { envelopeOwner } from "./partition_admission.ts";

/** The header every envelope carries: the envelope version. */
export const ENVELOPE_VERSION_HEADER = "VF-Env";
/** The headers of every envelope this messenger publishes: one frozen object, shared. */
const ENVELOPE_HEADERS: Readonly<Record<string, string>> = Object.freeze({
  [ENVELOPE_VERSION_HEADER]: String(ENVELOPE_VERSION),
});

/** Publication outcomes by kind. */
export interface PublicationStats {
  accepted: number;
  duplicate: number;
  unknown: number;
  dropped: number;
  rejected: number;
}

/** What the join is doing right now (RUN-006). */
export interface JoinStatus {
  /** Incomplete groups waiting for a member. */
  readonly pending: number;
  /** Seconds the oldest incomplete group has waited (0 when none). */
  readonly oldestWaitSeconds: number;
  /** Whether the policy never gives up on a group (`timeout_seconds` unset): waiting, not progressing. */
  readonly waitsForever: boolean;
}

/** How a {@link BrokerMessenger} is built; the names follow the worker's `WorkerConfig` where both have one. */
export interface MessengerOptions {
  /** The transport. The run's channels and data subscriptions must already be provisioned. */
  readonly backend: MessagingBackend;
  readonly flowId: string;
  readonly runId: string;
  readonly flowType: FlowType;
  /** The node this messenger is bound to. */
  readonly node: string;
  /** The node's real parents in `.from()` order; none for a producer. */
  readonly parentNames?: readonly string[];
  /** This replica's index; the runtime's (a claimed slot's) when absent, else 0. */
  readonly replicaId?: number | null;
  /** The node's replica count (1). */
  readonly nbTasks?: number;
  /** The partition key (`trace_id` or a metadata field); partitioning applies when nbTasks > 1. */
  readonly partitionBy?: string | null;
  /** What a partitioned replica does with an unusable key; reject by default (RUN-020). */
  readonly partitionKeyPolicy?: PartitionKeyPolicy | null;
  /** A join's policy; the flow type's default when absent. */
  readonly joinPolicy?: JoinPolicy | null;
  /** The order input groups are handed out in (RUN-021); arrival order when absent. */
  readonly orderingPolicy?: OrderingPolicy | null;
  /**
   * The node's effective delivery policy; when absent it is resolved from the flow type's preset, the
   * node's `delivery` and `onError` overrides and `maxRetries` (DeliveryPolicy.resolve).
   */
  readonly deliveryPolicy?: DeliveryPolicy | null;
  /** `VF_DELIVERY`: the node's delivery mode override, used when no `deliveryPolicy` is given. */
  readonly delivery?: DeliveryMode | null;
  /** `VF_ON_ERROR`: the disposition of an unclassified error, used when no `deliveryPolicy` is given. */
  readonly onError?: Disposition | null;
  /** `VF_MAX_RETRIES` (3), used when no `deliveryPolicy` is given. */
  readonly maxRetries?: number;
  /** `VF_ACK_WAIT_SECONDS` (60). */
  readonly ackWaitSeconds?: number;
  /** `VF_EOS_QUIESCENCE_MS` (500). */
  readonly eosQuiescenceMs?: number;
  /** Parent name to its replica count (`VF_PARENT_REPLICAS`): how many EOS markers end it; 1 when absent. */
  readonly parentReplicas?: Readonly<Record<string, number>>;
  /** The node's ledger; a process-local memory ledger when absent (nothing then outlives the process). */
  readonly runtime?: FlowRuntime | null;
  /** Where payloads above the inline threshold go; without one such a publish fails with a ConfigError. */
  readonly payloadStore?: PayloadStore | null;
  /** The reader obligations every offloaded put acquires (`VF_BLOB_READER_IDS`). */
  readonly blobReaderIds?: readonly string[];
  /** Offload TTL (`VF_BLOB_TTL_SECONDS`; 3600 realtime, 86400 batch). */
  readonly blobTtlSeconds?: number;
  /** `VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES` (512 KiB). */
  readonly maxInlinePayloadBytes?: number;
  /** Deliveries taken per receive ({@link defaultPrefetch}); provisioning must use the same value. */
  readonly prefetch?: number;
  /** `VF_PREFETCH_BYTES`: the most bytes one receive takes; 64 MiB when absent. */
  readonly prefetchBytes?: number | null;
  /**
   * How many publications and input settlements may still await the broker while the node goes on
   * ({@link DEFAULT_IN_FLIGHT}); 1 waits for each.
   */
  readonly inFlight?: number;
  /**
   * The bytes this replica's own output buffer may hold: its inline publications the broker has not taken
   * yet ({@link DEFAULT_IN_FLIGHT_BYTES}). An output waits for room in it before it is sent.
   */
  readonly inFlightBytes?: number;
  /** A producer that mints ids from its source offset (MSGID-6). */
  readonly replayable?: boolean;
  /** A replayable source's analysis namespace (`{node}:{analysis_version}:{offset}`). */
  readonly analysisVersion?: string | null;
  /** Names this process's EOS subscriptions; unique per running replica (a random id when absent). */
  readonly instanceId?: string;
  /** Where time comes from (the system clock). */
  readonly clock?: Clock;
  /** A source uniform in [0, 1) for retry jitter (Math.random). */
  readonly random?: () => number;
  /** One publication's receipt deadline ({@link DEFAULT_PUBLISH_TIMEOUT_SECONDS}). */
  readonly publishTimeoutSeconds?: number;
  /** Where the messenger reports what it could not do (nothing by default). */
  readonly logger?: Logger | null;
}

/** A delivery this messenger holds, unsettled until {@link Held.settled}. */
class Held {
  settled = false;
  /** Held by the join assembler (a data entry waiting in a group). */
  inJoin = false;
  renewedAt: number;

  constructor(
    readonly delivery: Delivery,
    readonly parent: ParentState,
    /** The decoded envelope; null for bytes that did not decode. */
    readonly envelope: WireEnvelope | null,
    /** The offloaded payload's key, whose reader obligation a confirmed settlement releases. */
    readonly blobRef: string | null,
    now: number,
  ) {
    this.renewedAt = now;
  }
}

/** What the messenger tracks about one parent. */
interface ParentState {
  readonly name: string;
  readonly data: SubscriptionId;
  readonly eos: SubscriptionId;
  /** The data subscription's durable name: the received set's key. */
  readonly durable: string;
  /** How many replicas' EOS end the parent. */
  readonly expected: number;
  /** The EOS-7 barrier decides the drain (durable shared ledger, reliable channel, known replicas). */
  barrier: boolean;
  /** Where non-owned partitioned deliveries are acked: nowhere (not partitioned), the backend, or here. */
  admission: "none" | "backend" | "receiver";
  /** Held EOS markers by parent replica, unsettled until the parent drains. */
  readonly ends: Map<number, Held>;
  drained: boolean;
  /** Data handles of this parent the join holds. */
  inJoin: number;
}

/**
 * A wait shortened to whole microseconds (less a hair), so a clock that keeps time in microsecond ticks
 * reaches the deadline exactly when its timer fires, never a rounding error short of it.
 */
function wholeMicroseconds(seconds: number): number {
  return Math.max(0, Math.floor(seconds * 1e6) / 1e6 - 1e-9);
}

const NO_DROPS: Record<string, number> = Object.freeze({}) as Record<string, number>;
const SILENT: Logger = Object.freeze({
  debug() {},
  info() {},
  warn() {},
  error() {},
});

/**
 * The {@link Messenger} over a {@link MessagingBackend}, a {@link PayloadStore} and a {@link FlowRuntime}.
 * Build it with {@link BrokerMessenger.open}; one instance serves one replica of one node.
 */
export class BrokerMessenger implements Messenger {
  readonly #backend: MessagingBackend;
  readonly #runtime: FlowRuntime;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #random: () => number;
  readonly #flowId: string;
  readonly #runId: string;
  readonly #flowType: FlowType;
  readonly #node: string;
  readonly #replicaId: number;
  readonly #nbTasks: number;
  readonly #partitionBy: string | null;
  /** Which replica owns each delivery of a partitioned node, and whether its key can be used (RUN-020). */
  readonly #admission: PartitionAdmission;
  readonly #delivery: DeliveryPolicy;
  readonly #join: JoinPolicy | null;
  readonly #ackWait: number;
  /** When a parent whose end was seen has drained (EOS-3) or passed the EOS-7 barrier. */
  readonly #eos: EosDrain;
  readonly #prefetch: number;
  readonly #byteCredit: number;
  readonly #channel: ChannelId;
  readonly #reliableOutput: boolean;
  readonly #instance: string;
  readonly #parentReplicas: Readonly<Record<string, number>>;
  readonly #parents: ParentState[];
  /** Which parent, and which of its streams, each bound subscription serves. */
  readonly #routes: DeliveryRoutes<ParentState>;
  readonly #assembler: GroupAssembler<Held> | null;
  /** The deliveries held unsettled, their leases renewed while held. */
  readonly #held: DeliveryKeepalive<Held>;
  /** The ledger writes noting received ids (EOS-7), which a delivery's settlement waits for. */
  readonly #received: ReceivedRecorder;
  readonly #relayOrigins = new WeakMap<object, string>();
  /** Payloads above the inline threshold, put and read through the payload bridge. */
  readonly #payloads: PayloadOffload;
  readonly #drops = new Map<string, number>();
  /** What happens to a delivery that failed or can never reach the node (DELIV-15). */
  readonly #ladder: DeadLetterLadder<Held>;
  readonly #stats: PublicationStats = { accepted: 0, duplicate: 0, unknown: 0, dropped: 0, rejected: 0 };
  /** The join groups a predecessor persisted, re-formed from their redelivered members (story 1). */
  readonly #recovery: GroupRecovery<Held>;
  readonly #work: InFlight;
  /** Every publication, in order and within credit, until its outcome is known. */
  readonly #publisher: OrderedPublisher;
  /** How each held delivery leaves this replica: settled once, in a batch call, or retired. */
  readonly #settlement: InputSettlement<Held>;
  /** The publications of the group in hand, which its settlement waits for. */
  #outputs: Promise<void>[] = [];
  /** The ids of the group in hand's outputs (under the EOS-7 barrier): proven published once it is. */
  #outputIds: string[] = [];
  /** The batched ledger records of this replica's outputs, and its checkpoints. */
  readonly #ledger: LedgerWriter;
  /** The identity of each output, and a replayable source's accepted offsets. */
  readonly #identity: OutputIdentities;

  #started = false;
  #closed = false;
  #durable = false;
  #durableShared = false;
  /**
   * Whether the EOS-7 completion barrier is in force: a batch flow over a durable shared ledger. Only then
   * are accepted ids noted for the terminator's seq. A realtime flow drops by design, so no barrier reads
   * them, and noting them would grow its ledger for as long as a live source runs.
   */
  #barrierFlow = false;
  #ledgerBudget = false;
  #control = false;
  #quiesced = false;
  #authorityLost = false;
  /** Aborted with the first stop of any kind (see {@link stopSignal}). */
  readonly #stopped = new AbortController();
  #current: ReadyGroup<Held> | null = null;
  #currentKey: string | null = null;
  /** Hands ready groups out in sequence order under a sequence ordering policy; `null` for arrival order. */
  #ordered: OrderedRelease<Held> | null = null;
  #ended: InputGroup | null = null;
  /** The join's end group, held while an input of this node is still outstanding at the broker. */
  #heldEnd: ReadyGroup<Held> | null = null;
  /** Where small data envelope bodies are carved from. */
  readonly #bodies = new ByteSlab();
  readonly #takeBody = (size: number) => this.#bodies.take(size);
  /** The group and output the restored checkpoint covers. */
  readonly #coverage: CheckpointCoverage;
  /** This replica's partition lease, when it holds one. */
  readonly #lease: PartitionLease;

  /**
   * Validates the options; binds nothing ({@link start} does). Prefer {@link BrokerMessenger.open}.
   *
   * @throws ConfigError for an unknown flow type, a replica id outside `nbTasks`, counts or times out of
   * range, or a join policy that does not fit the parents.
   */
  constructor(options: MessengerOptions) {
    this.#backend = options.backend;
    this.#clock = options.clock ?? systemClock;
    this.#logger = options.logger ?? SILENT;
    this.#random = options.random ?? Math.random;
    this.#flowId = options.flowId;
    this.#runId = options.runId;
    this.#flowType = checkFlowType(options.flowType);
    this.#node = options.node;
    this.#nbTasks = requireCount(options.nbTasks ?? 1, "nb_tasks", 1);
    this.#replicaId = requireCount(options.replicaId ?? options.runtime?.replicaId ?? 0, "the replica id", 0);
    if (this.#replicaId >= this.#nbTasks && options.partitionBy) {
      throw new ConfigError(
        `replica ${this.#replicaId} of ${this.#node} is outside its ${this.#nbTasks} partitions`,
        "give a partitioned replica an id below nb_tasks",
        { node: this.#node, replica: this.#replicaId },
      );
    }
    this.#partitionBy = this.#nbTasks > 1 ? options.partitionBy ?? null : null;
    this.#admission = new PartitionAdmission({
      node: this.#node,
      partitionBy: this.#partitionBy,
      nbTasks: this.#nbTasks,
      replicaId: this.#replicaId,
      keyPolicy: options.partitionKeyPolicy ?? null,
    });
    if (options.orderingPolicy?.mode === ORDER_SEQUENCE) {
      this.#ordered = new OrderedRelease(options.orderingPolicy, (group) => this.#orderingKey(group));
    }
    this.#delivery = options.deliveryPolicy ?? DeliveryPolicy.resolve(
      this.#flowType,
      { delivery: options.delivery ?? null, on_error: options.onError ?? null },
      options.maxRetries,
    );
    this.#ackWait = requirePositiveSeconds(
      options.ackWaitSeconds ?? DEFAULT_ACK_WAIT_SECONDS,
      "the ack wait",
    );
    const quiescence =
      requireCount(options.eosQuiescenceMs ?? DEFAULT_EOS_QUIESCENCE_MS, "the EOS quiescence", 0) /
      1000;
    this.#prefetch = requireCount(options.prefetch ?? defaultPrefetch(this.#flowType), "the prefetch", 0);
    this.#byteCredit = requireCount(options.prefetchBytes ?? DEFAULT_BYTE_CREDIT, "the prefetch bytes", 1);
    const inFlight = options.inFlight ?? DEFAULT_IN_FLIGHT;
    this.#work = new InFlight(inFlight, options.inFlightBytes ?? DEFAULT_IN_FLIGHT_BYTES);
    const publishTimeout = requirePositiveSeconds(
      options.publishTimeoutSeconds ?? DEFAULT_PUBLISH_TIMEOUT_SECONDS,
      "the publish timeout",
    );
    this.#channel = channelId(this.#flowId, this.#runId, this.#node);
    // The replicas share the in-flight depth as a credit window, so together they hold at most about one
    // and a half depths of a channel's room unused, and an idle replica never holds all of it.
    this.#publisher = new OrderedPublisher({
      backend: this.#backend,
      channel: this.#channel,
      creditItems: Math.ceil(inFlight / this.#nbTasks),
      creditBytes: options.inFlightBytes ?? DEFAULT_IN_FLIGHT_BYTES,
      batchEntries: CALL_BATCH_ENTRIES,
      publishTimeoutSeconds: publishTimeout,
      source: (options.parentNames ?? []).length === 0,
      work: this.#work,
      clock: this.#clock,
    });
    this.#reliableOutput = defaultProfile(this.#flowType) === MessagingProfile.reliableWork;
    this.#instance = options.instanceId ?? randomHex(6);
    this.#runtime = options.runtime ?? new FlowRuntime({
      store: new MemoryRuntimeStore(this.#clock),
      flowId: this.#flowId,
      runId: this.#runId,
      node: this.#node,
      replicaId: this.#replicaId,
      nbTasks: this.#nbTasks,
      clock: this.#clock,
    });
    this.#parentReplicas = { ...options.parentReplicas };
    const parentNames = [...(options.parentNames ?? [])];
    this.#identity = new OutputIdentities({
      node: this.#node,
      receiver: parentNames.length > 0,
      replayable: options.replayable ?? false,
      analysisVersion: options.analysisVersion ?? null,
    });
    this.#join = parentNames.length > 1 ? options.joinPolicy ?? JoinPolicy.defaultFor(this.#flowType) : null;
    this.#assembler = parentNames.length === 0
      ? null
      : makeAssembler<Held>(this.#node, parentNames, this.#join ?? JoinPolicy.defaultFor(this.#flowType), {
        clock: this.#clock,
        lossless: this.#flowType === FlowType.batch,
      });
    this.#routes = new DeliveryRoutes<ParentState>(this.#node);
    this.#held = new DeliveryKeepalive<Held>({
      backend: this.#backend,
      clock: this.#clock,
      logger: this.#logger,
    });
    this.#parents = parentNames.map((name) => this.#parentState(name));
    this.#recovery = new GroupRecovery<Held>({
      runtime: this.#runtime,
      parentNames,
      collect: this.#join?.collect ?? {},
      retire: (held) => this.#settlement.retire(held),
      clock: this.#clock,
    });
    // Ids that send a lingering received-set write at once: half the in-flight depth, and no more than one
    // receive brings (the prefetch), or a write would wait for ids its own unacked deliveries hold back.
    this.#received = new ReceivedRecorder({
      runtime: this.#runtime,
      batchIds: Math.max(1, Math.min(Math.floor(inFlight / 2), this.#prefetch)),
      work: this.#work,
      clock: this.#clock,
    });
    this.#ledger = new LedgerWriter({
      runtime: this.#runtime,
      identity: this.#identity,
      source: parentNames.length === 0,
      durable: () => this.#durable,
      barrierFlow: () => this.#barrierFlow,
      coveredGroup: () => this.#current === null ? null : this.#currentKey,
      onStale: () => this.#loseAuthority(),
      work: this.#work,
      clock: this.#clock,
    });
    this.#coverage = new CheckpointCoverage({
      runtime: this.#runtime,
      republish: (output, body) => this.#republishCovered(output, body),
    });
    this.#lease = new PartitionLease({
      runtime: this.#runtime,
      onLost: () => this.#loseAuthority(),
      logger: this.#logger,
    });
    this.#eos = new EosDrain({
      backend: this.#backend,
      runtime: this.#runtime,
      quiescenceSeconds: quiescence,
      atLeastOnce: this.#delivery.delivery === AT_LEAST_ONCE,
      lease: () => this.#lease.token,
      lossGraceSeconds: this.#ackWait,
    });
    const payloadStore = options.payloadStore ?? null;
    this.#ladder = new DeadLetterLadder<Held>({
      flowId: this.#flowId,
      runId: this.#runId,
      node: this.#node,
      channel: this.#channel,
      multiParent: parentNames.length > 1,
      delivery: this.#delivery,
      runtime: this.#runtime,
      ledgerBudget: () => this.#ledgerBudget,
      payloadStore,
      publish: (env) => this.#publisher.publish(env, false),
      settle: (held, outcome) => this.#settlement.settle(held, outcome),
      drop: (reason) => this.#drop(reason),
      random: this.#random,
      clock: this.#clock,
      logger: this.#logger,
    });
    this.#payloads = new PayloadOffload({
      payloadStore,
      node: this.#node,
      partitionReplica: this.#partitionBy === null ? null : this.#replicaId,
      readers: options.blobReaderIds ?? [],
      ttlSeconds: options.blobTtlSeconds ??
        (this.#flowType === FlowType.batch ? BATCH_BLOB_TTL_SECONDS : REALTIME_BLOB_TTL_SECONDS),
      maxInlineBytes: requireCount(
        options.maxInlinePayloadBytes ?? DEFAULT_MAX_INLINE_PAYLOAD_BYTES,
        "the inline payload limit",
        0,
      ),
      durableRequired: this.#flowType === FlowType.batch,
      logger: this.#logger,
    });
    this.#settlement = new InputSettlement<Held>({
      backend: this.#backend,
      batchEntries: CALL_BATCH_ENTRIES,
      runtime: this.#runtime,
      held: this.#held,
      creditHeld: this.#parents.length === 0
        ? Infinity
        : consumerCredit(1, true, joinItemCredit(this.#parents.length, this.#join), this.#prefetch),
      received: this.#received,
      payloads: this.#payloads,
      work: this.#work,
    });
  }

  /** Builds a messenger and {@link start}s it. */
  static async open(options: MessengerOptions): Promise<BrokerMessenger> {
    const messenger = new BrokerMessenger(options);
    await messenger.start();
    return messenger;
  }

  /**
   * Binds this replica: reads the ledger's capabilities (which decide the EOS-7 barrier, the ledger retry
   * budget and what is recorded), ensures its data subscriptions and its own EOS subscriptions, installs
   * partition admission, subscribes to the flow-wide stop, restores checkpoint coverage and open join
   * groups, re-publishes pending dead-letter handoffs, keeps a held partition lease and starts keeping
   * held deliveries alive. Idempotent.
   */
  async start(): Promise<void> {
    if (this.#started) return;
    const capabilities = await this.#runtime.capabilities();
    this.#durable = capabilities.durable.kind === "known" && capabilities.durable.value;
    this.#durableShared = this.#durable && capabilities.sharedAcrossProcesses;
    this.#barrierFlow = this.#durableShared && this.#flowType === FlowType.batch;
    this.#ledgerBudget = this.#durableShared && this.#delivery.delivery === AT_LEAST_ONCE;
    const routing: NodeRouting = {
      name: this.#node,
      parents: this.#parents.map((p) => p.name),
      nbTasks: this.#nbTasks,
      partitioned: this.#partitionBy !== null,
      delivery: this.#delivery,
      join: this.#join,
      prefetch: this.#prefetch,
    };
    for (const parent of this.#parents) {
      const settings = {
        flowId: this.#flowId,
        runId: this.#runId,
        flowType: this.#flowType,
        ackWaitSeconds: this.#ackWait,
        prefetch: this.#prefetch,
        byteCredit: this.#byteCredit,
        ledgerBudget: this.#durableShared,
      };
      const spec = dataSubscriptionSpec(routing, parent.data.channel, parent.data.partition, settings);
      await this.#backend.ensureSubscription(spec, `bind/${parent.durable}`);
      const eos = eosSubscriptionSpec(parent.eos.channel, this.#node, this.#instance, parent.expected);
      await this.#backend.ensureSubscription(eos, `bind/${durableNameOf(parent.eos)}`);
      this.#installAdmission(parent);
    }
    this.#backend.subscribeControl(() => {
      this.#control = true;
      // A source's outputs that wait for credit at the stop are given up (see OrderedPublisher).
      this.#publisher.haltAtStop();
      this.#stopped.abort();
    });
    if (this.#durable) await this.#restoreLedgerState();
    if (this.#parents.length > 0) await this.#ladder.republishHandoffs();
    await this.#lease.keep(this.#partitionBy !== null && this.#durableShared);
    if (this.#parents.length > 0) this.#held.arm(this.#ackWait);
    this.#ledger.begin();
    this.#started = true;
  }

  // ---- the seam: receiving ------------------------------------------------------------------------------

  /**
   * The next complete input group; an ABORT group as soon as a parent aborts; the end group once every
   * parent drained; after a quiesce or a lost authority, a group whose entries all signal the stop.
   */
  async receiveMessage(): Promise<InputGroup> {
    this.#requireReceiver("receiveMessage");
    this.#work.check();
    for (;;) {
      if (this.#quiesced || this.#authorityLost) {
        await this.#handBack();
        return stopGroup(this.#parents.map((p) => p.name));
      }
      if (this.#ended !== null) return this.#ended;
      const group = this.#heldEnd ?? this.#nextReady();
      this.#heldEnd = null;
      const releasing = this.#settleReleases();
      if (releasing !== null) await releasing;
      // Every parent drained, but an input the join gave back for a retry may still come back: the end
      // waits for it (it joins, finds its parent ended, and is settled), so no input is left behind.
      if (group?.kind === GroupKind.end && await this.#eos.inputsOutstanding(this.#parents)) {
        this.#heldEnd = group;
        await this.#pull();
        continue;
      }
      if (group !== null) {
        const input = await this.#handOut(group);
        if (input !== null) return input;
        continue;
      }
      if (await this.#checkDrains()) continue;
      await this.#pull();
    }
  }

  /**
   * Acknowledges the group last received: each of its deliveries is settled Completed once every output
   * published for it was accepted, and `onAcked` runs once the broker confirmed every one of those
   * settlements (so a group redelivered after a crash is acked, and reported, once). Resolves when that may
   * go on without the node (within the in-flight bound); a failure of it, or of an output, is thrown by the
   * next call that publishes, acks, receives or ends the stream.
   */
  async ackInputs(onAcked?: () => void): Promise<void> {
    const group = this.#current;
    if (group === null) return;
    this.#current = null;
    const outputs = this.#outputs;
    this.#outputs = [];
    const outputIds = this.#outputIds;
    this.#outputIds = [];
    const persisted = this.#recovery.takePersisted();
    this.#work.track(this.#ackAfter(outputs, outputIds, group.handles, persisted, onAcked));
    if (!this.#work.admitsNow()) await this.#work.admit();
  }

  /**
   * Settles a group's deliveries once its outputs were accepted and the ledger recorded their ids (EOS-7:
   * an output of an input acked before its id was recorded, by a replica killed meanwhile, would be in no
   * replica's tally, and the terminator's seq would fall short of what the child receives; the wait shares
   * the batched flush). When an output failed, the deliveries go back to the broker at once (no attempt
   * counted against a replacement's wait) and the failure stands. When every delivery was a first one and
   * the broker confirmed each settled, the group is never processed again, so its outputs (`outputIds`)
   * are proven published for good.
   */
  async #ackAfter(
    outputs: readonly Promise<void>[],
    outputIds: readonly string[],
    handles: readonly Held[],
    persisted: string | null,
    onAcked: (() => void) | undefined,
  ) {
    try {
      if (outputs.length === 1) await outputs[0];
      else if (outputs.length > 1) await Promise.all(outputs);
    } catch (error) {
      if (!this.#work.abandoned) {
        await Promise.all(handles.map((h) => this.#settlement.settle(h, retry(null))));
      }
      throw error;
    }
    if (outputIds.length > 0) await this.#ledger.recorded(this.#ledger.noted);
    if (this.#work.abandoned) return;
    const settled = handles.length === 1
      ? [await this.#settlement.settle(handles[0], completed(), true)]
      : await Promise.all(handles.map((h) => this.#settlement.settle(h, completed(), true)));
    if (persisted !== null) await this.#runtime.settleGroup(persisted);
    if (!settled.every((result) => result?.kind === "settle_confirmed")) return;
    if (outputIds.length > 0 && handles.every((h) => h.delivery.token.attempt === 1)) {
      this.#ledger.proveAfterFlush(outputIds);
    }
    onAcked?.();
  }

  /**
   * Applies the delivery policy to every delivery of the group last received: `actionFor(disposition,
   * numDelivered)` with the broker's (or, under the ledger budget, the ledger's) delivery count. Resolves
   * `true` when any delivery's action was not a retry (the policy gave it up).
   */
  async failInputs(error: unknown): Promise<boolean> {
    const group = this.#current;
    if (group === null) return false;
    this.#current = null;
    this.#outputs = [];
    this.#outputIds = [];
    const failure = asRuntimeError(error, this.#delivery.onError ?? DEFAULT_DISPOSITION);
    const actions = await Promise.all(group.handles.map((h) => this.#ladder.apply(h, failure)));
    await this.#recovery.closePersisted();
    return actions.some((action) => action !== ACTION_NAK);
  }

  /**
   * The message ids of the deliveries behind the group last received, until it is acked or failed (none
   * before any group, or after): the inputs a replica that dies now was holding inside its node.
   */
  currentMessageIds(): string[] {
    return this.#current?.handles.map((held) => held.delivery.token.messageId) ?? [];
  }

  /** Per-parent envelope facts of the group last received (`null` for a producer or before any group). */
  lastInputInfo(): Readonly<Record<string, InputInfo | InputInfo[] | null>> | null {
    const group = this.#current;
    if (group === null) return null;
    const info: Record<string, InputInfo | InputInfo[] | null> = {};
    for (const [parent, entry] of Object.entries(group.entries)) {
      if (entry === null) {
        info[parent] = null;
      } else if (entry.kind === "collect") {
        info[parent] = entry.eventTs.map((eventTs, i) => ({
          eventTs,
          metadata: entry.metadata[i],
          traceId: "",
          seq: 0,
        }));
      } else {
        info[parent] = {
          eventTs: entry.eventTs,
          metadata: entry.metadata,
          traceId: entry.traceId,
          seq: entry.seq,
        };
      }
    }
    return info;
  }

  /**
   * The identity of the group last received, stable across redelivery and restart: a single parent's
   * message id, or a join group's id derived from its trace id and seq.
   */
  lastInputKey(): string | null {
    return this.#currentKey;
  }

  // ---- the seam: publishing -----------------------------------------------------------------------------

  /**
   * Publishes one output. A producer mints its identity; a receiver carries its input group's forward.
   * A checkpoint under {@link CHECKPOINT_METADATA_KEY} is committed with this output in one ledger write
   * before the send and never reaches the wire. A reliable output is sent once this replica's credit on its
   * channel covers it (see `CreditWindow`), so the broker has no reason to refuse it; one the broker
   * refuses all the same is retried with backoff until taken, in the order outputs were made (see
   * `OrderedPublisher.publish`). A live (best-effort) output the broker refuses is counted as a drop. An inline output resolves once it is under way within the in-flight bound
   * (sent, or waiting its turn behind a refused one); its outcome is awaited by its input group's ack and
   * by EOS, and a refusal is thrown by the next call that publishes, acks, receives or ends the stream.
   *
   * `onAccepted` runs once the broker took the output as new (not as a duplicate of one it already had).
   *
   * @throws ConfigError when a receiver publishes outside an input group, or a large payload has no store;
   * SchemaError for a value the wire cannot carry; CapabilityError for a checkpoint on a ledger that dies
   * with the process (RUN-022); BrokerUnavailable when a reliable output is refused for good.
   */
  async publishMessage(
    message: unknown,
    metadata?: Record<string, unknown>,
    onAccepted?: () => void,
  ): Promise<void> {
    this.#requireStarted("publishMessage");
    this.#work.check();
    let checkpoint: Uint8Array | null = null;
    const wireMetadata: Record<string, unknown> = {};
    if (metadata !== undefined) {
      for (const key of Object.keys(metadata)) {
        if (key === CHECKPOINT_METADATA_KEY) checkpoint = metadata[key] as Uint8Array;
        else wireMetadata[key] = metadata[key];
      }
    }
    let partitionKey: string | null = null;
    const outPartitionKey = this.#identity.takePartitionKey();
    if (outPartitionKey !== undefined) {
      wireMetadata[PARTITION_KEY_METADATA_KEY] = outPartitionKey;
      if (isValidPartitionKey(outPartitionKey)) {
        partitionKey = partitionKeyString(outPartitionKey);
      }
    }
    const identity = this.#identity.next(this.#current);
    const eventTs = this.#identity.takeEventTimestamp(identity.eventTs);
    const publicationId = messageId(
      this.#flowId,
      this.#runId,
      this.#node,
      identity.traceId,
      identity.seq,
      MsgType.data,
    );
    if (this.#barrierFlow && this.#parents.length > 0) this.#outputIds.push(publicationId);
    let payload = preparePayload(message as WirePayload);
    if (checkpoint === null && this.#payloads.fitsInline(payload.byteLength)) {
      const body = this.#dataBody(identity, eventTs, wireMetadata, payload);
      const env = this.#dataEnvelope(publicationId, body, eventTs, partitionKey, identity.offset);
      // Read before the send: a body moved to the broker is detached by then.
      const bytes = body.byteLength;
      if (!this.#work.roomNow(bytes)) await this.#work.room(bytes);
      const sending = this.#sendInline(env, identity.offset, onAccepted);
      this.#work.track(sending, bytes);
      if (this.#assembler !== null) this.#outputs.push(sending);
      if (!this.#work.admitsNow()) await this.#work.admit();
      return;
    }
    if (checkpoint !== null) await this.#work.drain();
    let ref = null;
    if (!this.#payloads.fitsInline(payload.byteLength)) {
      ({ payload, ref } = await this.#payloads.offload(publicationId, payload));
    }
    const body = this.#dataBody(identity, eventTs, wireMetadata, payload);
    if (checkpoint !== null) {
      await this.#ledger.commitCheckpoint(checkpoint, { output: publicationId, envelope: body.toBase64() });
    }
    if (ref !== null) {
      await this.#runtime.intendPublication(publicationId, ref.digest, {
        payloadRefs: [ref.key],
        readers: this.#payloads.readers,
        kind: PublicationKind.data,
      });
    }
    const env = this.#dataEnvelope(publicationId, body, eventTs, partitionKey, identity.offset);
    const outcome = await this.#publisher.publish(env, this.#reliableOutput);
    this.#countPublication(outcome, onAccepted);
    // After a crash nothing more reaches the ledger: the intent stays open for the replacement to resolve.
    if (this.#work.abandoned) return;
    if (ref !== null) {
      await this.#runtime.resolvePublication(publicationId, outcome);
      if (outcome.kind === "accepted" || outcome.kind === "rejected") {
        await this.#payloads.release(ref.key, intentObligationId(publicationId), publicationId);
      }
    }
    await this.#concludePublication(env.publicationId, outcome, identity.offset, ref !== null);
  }

  /**
   * A data envelope's bytes, written in one pass: the payload's tensor data copied once, into the envelope.
   * A small one is a piece of a shared slab (no ArrayBuffer of its own to allocate); a large one owns its
   * buffer, so the backend may move it.
   */
  #dataBody(
    identity: OutputIdentity,
    eventTs: number | null,
    metadata: Record<string, unknown>,
    payload: PreparedPayload,
  ): Uint8Array {
    return encodeEnvelopeWithPayload(
      createEnvelope({
        type: MsgType.data,
        producerName: this.#node,
        flowId: this.#flowId,
        runId: this.#runId,
        traceId: identity.traceId,
        seq: identity.seq,
        eventTs,
        replicaId: this.#replicaId,
        metadata: metadata as WireMap,
      }),
      payload,
      { allocate: this.#takeBody },
    );
  }

  /** An inline output's send, run on while the node goes on (the backend sees it at once). */
  async #sendInline(env: BackendEnvelope, offset: number | null, onAccepted?: () => void): Promise<void> {
    const outcome = await this.#publisher.publish(env, this.#reliableOutput);
    this.#countPublication(outcome, onAccepted);
    await this.#concludePublication(env.publicationId, outcome, offset, false);
  }

  /**
   * After an output's final outcome: an accepted one is noted for the ledger (`inOutbox`: its outbox entry
   * notes it already); a refused reliable one throws.
   */
  async #concludePublication(
    publicationId: string,
    outcome: PublicationOutcome,
    offset: number | null,
    inOutbox: boolean,
  ): Promise<void> {
    if (this.#work.abandoned || this.#publisher.isGivenUp(outcome)) return;
    if (offset !== null && (outcome.kind === "accepted" || !this.#reliableOutput)) {
      this.#identity.finalOffset(offset);
    }
    if (outcome.kind === "accepted") {
      const noting = this.#ledger.noteAccepted(publicationId, inOutbox ? null : offset, !inOutbox);
      if (noting !== null) await noting;
    } else if (this.#reliableOutput) this.#refused(outcome);
  }

  /**
   * Resolves once every publication and settlement handed to the broker has its outcome; throws the
   * first failure among them.
   */
  awaitInFlight(): Promise<void> {
    return this.#work.drain();
  }

  /**
   * Publishes this replica's EOS after every output in flight was accepted (and the ledger's published
   * count flushed); never dropped.
   */
  async publishStopSignal(): Promise<void> {
    this.#requireStarted("publishStopSignal");
    await this.#publishMarker(MsgType.eos, eosTraceId(this.#replicaId), encodePayload(undefined));
  }

  /**
   * Publishes ABORT on the EOS subject carrying why this node died: one of ours, a bare error, or a
   * relayed record (whose origin node it keeps). Never dropped; its id is distinct from the clean EOS's.
   */
  async publishAbort(error: unknown): Promise<void> {
    this.#requireStarted("publishAbort");
    const record = errorToDict(error);
    const origin =
      (typeof error === "object" && error !== null ? this.#relayOrigins.get(error) : undefined) ??
        this.#node;
    await this.#publishMarker(
      MsgType.abort,
      abortTraceId(this.#replicaId),
      abortPayload({ node: origin, error: record }),
    );
  }

  /** Sets the event time stamped on the next published output. */
  setOutputEventTimestamp(value: number): void {
    this.#identity.setEventTimestamp(value);
  }

  /** Sets the partition key carried on the next published output, under `_partition_key` metadata. */
  setOutputPartitionKey(value: unknown): void {
    this.#identity.setPartitionKey(value);
  }

  /** Publication outcomes by kind since the start. */
  get publicationStats(): Readonly<PublicationStats> {
    return { ...this.#stats };
  }

  // ---- the seam: control, state ------------------------------------------------------------------------

  /** Whether a stop was signalled (control, quiesce or a lost authority). */
  checkForTermination(): boolean {
    return this.stopReason() !== null;
  }

  /** This replica's authority is gone (its lease, or a fenced write): it stops, and says so. */
  #loseAuthority(): void {
    this.#authorityLost = true;
    this.#stopped.abort();
  }

  /** Aborted once a stop is signalled: the flow-wide stop, a quiesce or a lost authority. */
  get stopSignal(): AbortSignal {
    return this.#stopped.signal;
  }

  /** Which stop {@link checkForTermination} reports: a quiesce and a lost authority outrank the control stop. */
  stopReason(): StopReason | null {
    if (this.#quiesced) return StopReason.quiesce;
    if (this.#authorityLost) return StopReason.authorityLost;
    return this.#control ? StopReason.control : null;
  }

  /**
   * Stops admitting input (RUN-030): everything held and not handed to the node (join halves, waiting end
   * markers) goes back to the broker at once; the group in hand still settles normally; no EOS follows.
   * Idempotent.
   */
  async quiesce(): Promise<void> {
    if (this.#quiesced) return;
    this.#quiesced = true;
    this.#stopped.abort();
    await this.#work.idle();
    await this.#handBack();
    await this.#ledger.flush();
  }

  /**
   * Commits the node's state with the identity of the group being processed, in one ledger write (the
   * immediate form, for a node without output). A redelivery of that group to a replacement is acked
   * without reaching the node.
   *
   * @throws CapabilityError on a ledger that dies with the process (RUN-022); StaleAuthority when a newer
   * owner took the partition (the messenger then reports the lost authority).
   */
  async checkpoint(state: Uint8Array): Promise<void> {
    this.#requireStarted("checkpoint");
    await this.#work.drain();
    await this.#ledger.commitCheckpoint(state, {});
  }

  /** The last checkpointed state of this replica's partition, or `null`. */
  async restoreCheckpoint(): Promise<Uint8Array | null> {
    const restored = await this.#runtime.restoreCheckpoint();
    this.#ledger.adoptState(restored.state);
    return restored.state;
  }

  /**
   * For a replayable producer, the last accepted source offset in the ledger (MSGID-6), so a replacement
   * resumes after it: 0 when none, or not replayable. An engine whose broker lost what it had accepted
   * (one that restarted empty) forgets the positions first (`forgetReplayPositions`).
   */
  async resumeOffset(): Promise<number> {
    if (!this.#identity.replayable) return 0;
    const offset = (await this.#runtime.restoreCheckpoint()).replayPosition.offset;
    const last = typeof offset === "number" && Number.isSafeInteger(offset) && offset > 0 ? offset : 0;
    this.#identity.resume(last);
    this.#ledger.resume(last);
    return last;
  }

  /**
   * Inputs given up on since the last call, by reason: `exhausted`, `undecodable`, `partition_key`,
   * `publish_discarded` (here) and `join_evicted` (the join's).
   */
  takeDrops(): Record<string, number> {
    const join = this.#assembler?.takeDrops() ?? NO_DROPS;
    if (this.#drops.size === 0) return join;
    const drops: Record<string, number> = { ...join };
    for (const [reason, count] of this.#drops) drops[reason] = (drops[reason] ?? 0) + count;
    this.#drops.clear();
    return drops;
  }

  /**
   * Messages waiting for this node across its parents (on the broker, leased, held in join groups, or,
   * for an at-least-once node, retained unresolved), and the end markers held for a parent whose EOS-7
   * barrier stays short with nothing left on the broker (so a barrier that can never complete is a stall
   * the progress deadline ends, not an idle node); Unknown as soon as any parent's subscription could not
   * be read; Known(0) for a producer.
   */
  async pendingObservation(): Promise<Observation<number>> {
    let total = 0;
    for (const parent of this.#parents) {
      const observed = await this.#backend.observeSubscription(parent.data);
      if (observed.kind !== "known") return observed;
      total += this.#eos.waiting(observed.value) + observed.value.leased;
      if (this.#eos.barrierShort(parent) && !parent.drained) total += parent.ends.size;
    }
    return known(total, this.#clock);
  }

  /** Per parent, the backend's observation of this replica's data subscription (Unknown when unreadable). */
  async subscriptionStatus(): Promise<Record<string, Observation<SubscriptionObservation>>> {
    const status: Record<string, Observation<SubscriptionObservation>> = {};
    for (const parent of this.#parents) {
      status[parent.name] = await this.#backend.observeSubscription(parent.data);
    }
    return status;
  }

  /** What the join is doing (RUN-006); a node with one parent or none never waits. */
  joinStatus(): JoinStatus {
    const assembler = this.#assembler;
    return {
      pending: assembler?.pendingCount() ?? 0,
      oldestWaitSeconds: assembler?.oldestWaitSeconds() ?? 0,
      waitsForever: this.#join !== null && this.#join.timeoutSeconds === null,
    };
  }

  /** This node's terminal log (DELIV-15): every delivery it ended without a dead letter. */
  terminalEntries(): Promise<JsonObject[]> {
    return this.#runtime.terminalEntries();
  }

  /**
   * Stops the keepalive and the lease renewal, hands back what is held, flushes the ledger's batches and
   * releases a held partition lease so a replacement takes over at once. The backend stays open (its
   * owner shuts it down). Idempotent. `handBack: false` stops the timers and does nothing else: what a
   * crashed process looks like to the broker and the ledger (its leases lapse on their own; no write or
   * settlement not yet begun begins). Tests simulating a crash pass it; a worker never does.
   */
  async close(options: { readonly handBack?: boolean } = {}): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#held.stop();
    await this.#lease.stop();
    if (options.handBack === false) {
      this.#work.abandon();
      this.#received.sendWaiting();
      return;
    }
    if (this.#started) {
      await this.#work.idle();
      this.#publisher.releaseCredit();
      await this.#handBack();
      await this.#ledger.flush();
      await this.#received.finished();
    }
    if (!this.#authorityLost) await this.#lease.release();
  }

  // ---- start-up ---------------------------------------------------------------------------------------

  #parentState(name: string): ParentState {
    const channel = channelId(this.#flowId, this.#runId, name);
    const data = dataSubscriptionId(channel, this.#node, this.#partitionBy === null ? null : this.#replicaId);
    const state: ParentState = {
      name,
      data,
      eos: eosSubscriptionId(channel, this.#node, this.#instance),
      durable: durableNameOf(data),
      expected: requireCount(this.#parentReplicas[name] ?? 1, `the replica count of ${name}`, 1),
      barrier: false,
      admission: "none",
      ends: new Map(),
      drained: false,
      inJoin: 0,
    };
    this.#routes.add(state.data, state, MessageKind.data);
    this.#routes.add(state.eos, state, MessageKind.eos);
    return state;
  }

  /** Decides, once the ledger's capabilities are known, how each parent drains and where admission runs. */
  #installAdmission(parent: ParentState): void {
    parent.barrier = this.#barrierFlow && Object.hasOwn(this.#parentReplicas, parent.name);
    if (this.#partitionBy === null) return;
    if (parent.barrier) {
      parent.admission = "receiver";
      return;
    }
    const installed = this.#backend.setAdmission(
      parent.data,
      (delivery) => this.#admission.owns(delivery),
      (delivery) => void this.#afterSkip(delivery),
    );
    parent.admission = installed ? "backend" : "receiver";
  }

  async #restoreLedgerState(): Promise<void> {
    const restored = await this.#runtime.restoreCheckpoint();
    this.#ledger.adoptState(restored.state);
    const position = restored.replayPosition;
    this.#coverage.restore(position);
    if (this.#parents.length === 0 && !this.#identity.replayable) {
      this.#identity.adoptEpoch(await this.#runtime.sourceEpoch());
    }
    if (this.#join?.mode !== JOIN_TIME) return;
    this.#recovery.restore(await this.#runtime.openGroups(), this.#ackWait);
  }

  // ---- receiving ------------------------------------------------------------------------------------------

  /** Takes one batch from every subscription, waiting until the next thing the messenger must re-check. */
  async #pull(): Promise<void> {
    const now = this.#clock.monotonic();
    let deadline = now + RECEIVE_WAIT_SECONDS;
    const joinDeadline = this.#assembler?.nextDeadline() ?? null;
    if (joinDeadline !== null && joinDeadline < deadline) deadline = Math.max(now, joinDeadline);
    for (const parent of this.#parents) {
      if (this.#eos.awaitsDrain(parent) && this.#eos.nextCheck(parent) < deadline) {
        deadline = Math.max(now, this.#eos.nextCheck(parent));
      }
    }
    const deliveries = await this.#backend.receiveAny(
      this.#routes.subscriptions,
      Math.max(1, this.#prefetch),
      this.#byteCredit,
      now + wholeMicroseconds(Math.max(MIN_RECEIVE_WAIT_SECONDS, deadline - now)),
    );
    if (deliveries.length === 0) return;
    const received = new Map<ParentState, Delivery[]>();
    const data: Array<readonly [ParentState, Delivery]> = [];
    for (const delivery of deliveries) {
      const { parent, kind } = this.#routes.route(delivery.token.subscription);
      if (kind === MessageKind.eos) {
        await this.#onMarker(parent, delivery);
        continue;
      }
      if (parent.barrier) {
        const batch = received.get(parent);
        if (batch === undefined) received.set(parent, [delivery]);
        else batch.push(delivery);
      }
      data.push([parent, delivery]);
    }
    for (const [parent, batch] of received) this.#received.record(parent, batch);
    for (const [parent, delivery] of data) {
      const pending = this.#onData(parent, delivery, now);
      if (pending !== null) await pending;
    }
  }

  /**
   * One data delivery: decoded, its ownership decided, its payload read, then joined. Synchronous (null)
   * on the common path; a promise when the delivery is settled here or its payload must be fetched.
   */
  #onData(parent: ParentState, delivery: Delivery, now: number): Promise<void> | null {
    const decoded = parent.admission === "backend"
      ? this.#admission.decodeCached(delivery)
      : decodeDelivery(delivery.envelopeBytes);
    if (parent.admission === "receiver" && this.#admission.owner(decoded) !== this.#replicaId) {
      const blobRef = decoded instanceof DecodeError ? null : this.#payloads.blobKey(decoded);
      const held = new Held(delivery, parent, null, blobRef, now);
      this.#held.add(held);
      return this.#settlement.settle(held, completed()).then(() => {});
    }
    if (decoded instanceof DecodeError) {
      return this.#rejectInput(
        new Held(delivery, parent, null, null, now),
        decoded,
        DropReason.undecodable,
      );
    }
    const keyError = this.#admission.keyError(decoded);
    if (keyError !== null) {
      return this.#rejectInput(
        new Held(delivery, parent, decoded, null, now),
        keyError,
        DropReason.partitionKey,
      );
    }
    const held = new Held(delivery, parent, decoded, this.#payloads.blobKey(decoded), now);
    this.#held.add(held);
    if (
      delivery.token.attempt > 1 &&
      (this.#ledgerBudget || this.#durableShared && this.#delivery.delivery === BEST_EFFORT)
    ) {
      return this.#joinRedelivered(held, decoded);
    }
    return this.#readAndJoin(held, decoded);
  }

  /** A held data delivery's payload, read (fetched when offloaded), then joined. */
  #readAndJoin(held: Held, decoded: WireEnvelope): Promise<void> | null {
    if (held.blobRef !== null) return this.#fetchAndJoin(held, decoded);
    let message: unknown;
    try {
      message = decodePayload(decoded.payloadType, decoded.payload);
    } catch (error) {
      return this.#unreadablePayload(held, error);
    }
    this.#enter(held, decoded, message);
    return null;
  }

  /**
   * A redelivery under the ledger budget (or a best-effort one over the same ledger): when replica deaths
   * used up its budget (it was inside the node each time a replica crashed or stalled, the last counted
   * attempt a death; a best-effort input's one delivery), it is given up by the poison ladder with what
   * that death was and never reaches the node again; otherwise it is joined.
   */
  async #joinRedelivered(held: Held, decoded: WireEnvelope): Promise<void> {
    const record = await this.#runtime.replicaDeathOf(held.delivery.token.messageId);
    if (record === null || record.count < this.#delivery.maxDeliver) {
      await this.#readAndJoin(held, decoded);
      return;
    }
    this.#drop(DropReason.exhausted);
    await this.#ladder.apply(
      held,
      replicaDeathFailure(record.death, this.#node, record.count, record.cause),
      {
        counted: record.count,
      },
    );
  }

  /** An offloaded payload: fetched from the store (on this turn, after ownership was decided), then joined. */
  async #fetchAndJoin(held: Held, decoded: WireEnvelope): Promise<void> {
    let message: unknown;
    try {
      const blobRef = decodePayload(decoded.payloadType, decoded.payload) as BlobRef;
      message = decodePayload(blobRef.innerPayloadType, await this.#payloads.fetch(blobRef));
    } catch (error) {
      await this.#unreadablePayload(held, error);
      return;
    }
    this.#enter(held, decoded, message);
  }

  /**
   * A payload that could not be read: poison when missing, corrupt or malformed (DecodeError), retried
   * with backoff when the store failed transiently (BLOB-15); anything else is not the input's fault.
   */
  #unreadablePayload(held: Held, error: unknown): Promise<void> {
    if (error instanceof DecodeError) return this.#rejectInput(held, error, DropReason.undecodable);
    if (error instanceof TransientFailure) {
      const delay = this.#delivery.retryDelay(held.delivery.token.attempt, drawRetryJitter(this.#random));
      return this.#settlement.settle(held, retry(delay)).then(() => {});
    }
    throw error;
  }

  /** Hands a decoded data entry to the join (or to the recovered group that waits for it). */
  #enter(held: Held, decoded: WireEnvelope, message: unknown): void {
    const parent = held.parent;
    const entry = entryFromEnvelope(decoded, held, message, held.blobRef);
    if (this.#recovery.claim(parent.name, decoded, entry)) return;
    held.inJoin = true;
    parent.inJoin++;
    (this.#assembler as GroupAssembler<Held>).add(parent.name, entry);
  }

  /** An EOS or ABORT delivery: recorded (EOS-7), then an ABORT joins at once and an EOS waits for the drain. */
  async #onMarker(parent: ParentState, delivery: Delivery): Promise<void> {
    const now = this.#clock.monotonic();
    const decoded = decodeDelivery(delivery.envelopeBytes);
    if (decoded instanceof DecodeError) {
      await this.#rejectInput(
        new Held(delivery, parent, null, null, now),
        decoded,
        DropReason.undecodable,
      );
      return;
    }
    const held = new Held(delivery, parent, decoded, null, now);
    this.#held.add(held);
    const abort = decoded.type === MsgType.abort ? abortMarker(decoded) : null;
    if (parent.barrier) {
      const seq = Number(decoded.seq);
      await this.#runtime.recordTerminator(
        parent.name,
        decoded.replicaId,
        abort === null ? TerminatorKind.eos : TerminatorKind.abort,
        Number.isSafeInteger(seq) ? seq : 0,
        abort === null ? null : abort.error as unknown as JsonObject,
      );
    }
    if (abort !== null) {
      this.#relayOrigins.set(abort.error, abort.node);
      (this.#assembler as GroupAssembler<Held>).add(parent.name, entryFromEnvelope(decoded, held, abort));
      return;
    }
    if (parent.drained) {
      await this.#settlement.settle(held, completed());
      return;
    }
    const previous = parent.ends.get(decoded.replicaId);
    if (previous !== undefined) this.#settlement.retire(previous);
    parent.ends.set(decoded.replicaId, held);
  }

  /** A partitioned delivery another replica owns was acked by the backend: release this replica's obligation. */
  async #afterSkip(delivery: Delivery): Promise<void> {
    const decoded = this.#admission.decodeCached(delivery);
    if (decoded instanceof DecodeError) return;
    const key = this.#payloads.blobKey(decoded);
    if (key !== null) await this.#payloads.release(key, this.#payloads.readerId, delivery.token.messageId);
  }

  /** Hands every recovered member still waiting to the join, so the normal rules resolve it. */
  #releaseRecovered(): void {
    const assembler = this.#assembler as GroupAssembler<Held>;
    this.#recovery.release((parent, entry) => {
      const state = this.#parents.find((p) => p.name === parent) as ParentState;
      entry.handle.inJoin = true;
      state.inJoin++;
      assembler.add(parent, entry);
    });
  }

  /** The next group to hand out: the join's next ready one, through the ordering policy when there is one. */
  #nextReady(): ReadyGroup<Held> | null {
    const ordered = this.#ordered;
    if (ordered === null) return this.#nextAssembled();
    for (;;) {
      const next = ordered.pop();
      if (next !== null) return next;
      const group = this.#nextAssembled();
      if (group === null) return null;
      ordered.push(group);
    }
  }

  /** The partition key a group is ordered under: one order for an unpartitioned node. */
  #orderingKey(group: ReadyGroup<Held>): string {
    if (this.#partitionBy === null) return "";
    const entry = Object.values(group.entries).find((e) => e !== null && e.kind === "envelope");
    return String(partitionKeyOf(this.#partitionBy, group.traceId, entry?.metadata));
  }

  #nextAssembled(): ReadyGroup<Held> | null {
    const recovered = this.#recovery.nextReady();
    if (recovered !== undefined) return recovered;
    if (this.#recovery.expired()) this.#releaseRecovered();
    const assembler = this.#assembler as GroupAssembler<Held>;
    assembler.sweep();
    return assembler.popReady();
  }

  /**
   * Settles what the join gave back outside a group (drops acked, hand-backs naked, superseded retired) and
   * the late groups the ordering policy dropped (acked, counted).
   */
  #settleReleases(): Promise<void> | null {
    const releases = (this.#assembler as GroupAssembler<Held>).takeReleased();
    const late = this.#ordered?.takeDropped() ?? [];
    if (late.length > 0) this.#drop(DropReason.late, late.length);
    const settling = [
      ...(releases.length === 0 ? [] : [this.#applyReleases(releases)]),
      ...late.flatMap((group) =>
        group.handles.map((held) => {
          this.#leaveJoin(held);
          return this.#settlement.settle(held, completed());
        })
      ),
    ];
    return settling.length === 0 ? null : Promise.all(settling).then(() => {});
  }

  async #applyReleases(releases: readonly Release<Held>[]): Promise<void> {
    const settling: Promise<unknown>[] = [];
    for (const release of releases) {
      // A nak is a hand-back, or a group given up on under `missing: "error"`, which fails its members.
      const failure = release.settlement !== Settlement.nak || release.reason === ReleaseReason.handedBack
        ? null
        : this.#incompleteGroup(release);
      for (const held of release.handles) {
        this.#leaveJoin(held);
        switch (release.settlement) {
          case Settlement.ack:
            settling.push(this.#settlement.settle(held, completed()));
            break;
          case Settlement.nak:
            settling.push(
              failure === null
                ? this.#settlement.settle(held, retry(null))
                : this.#ladder.apply(held, failure),
            );
            break;
          case Settlement.retire:
            this.#settlement.retire(held);
            break;
        }
      }
    }
    await Promise.all(settling);
  }

  /**
   * How a group given up on under `missing: "error"` fails its members, through the delivery ladder: one
   * that timed out is transient (retried with backoff, then dead-lettered; under best-effort delivery given
   * up at once, a join eviction), one a parent's end left unable to complete is poison (dead-lettered at
   * once, a join eviction).
   */
  #incompleteGroup(release: Release<Held>): VideoflowRuntimeError {
    const parents = [...new Set(release.parents)].join(", ");
    if (release.reason === ReleaseReason.timeout) {
      // Best-effort delivery never retries: the join's giving up is the input's end.
      if (this.#delivery.delivery !== AT_LEAST_ONCE) {
        this.#drop(DropReason.joinEvicted, release.handles.length);
      }
      return new TransientFailure(
        `node ${this.#node}: a join group of ${parents} was incomplete when its timeout ran out`,
        'the join\'s missing: "error" retries it and dead-letters it past the retry budget; raise ' +
          'timeout_seconds, or use missing: "drop" or a quorum',
        { node: this.#node, reason: release.reason },
      );
    }
    this.#drop(DropReason.joinEvicted, release.handles.length);
    return new PoisonMessage(
      `node ${this.#node}: a join group of ${parents} can never complete: a parent it lacks has ended`,
      "check why the other parents made no matching item (trace ids, event times within the tolerance)",
      { node: this.#node, reason: release.reason },
    );
  }

  #leaveJoin(held: Held): void {
    if (!held.inJoin) return;
    held.inJoin = false;
    held.parent.inJoin--;
  }

  /** A ready group as the task receives it; null when it was settled here (a covered redelivery). */
  async #handOut(group: ReadyGroup<Held>): Promise<InputGroup | null> {
    for (const held of group.handles) this.#leaveJoin(held);
    switch (group.kind) {
      case GroupKind.abort: {
        await Promise.all(group.handles.map((h) => this.#settlement.settle(h, completed())));
        return terminalInput(group);
      }
      case GroupKind.end: {
        await Promise.all(group.handles.map((h) => this.#settlement.settle(h, completed())));
        this.#ended = terminalInput(group);
        return this.#ended;
      }
      case GroupKind.data:
        break;
    }
    const key = this.#groupKey(group);
    if (this.#coverage.covers(key)) {
      await this.#coverage.confirm();
      await Promise.all(group.handles.map((h) => this.#settlement.settle(h, completed())));
      return null;
    }
    this.#current = group;
    this.#currentKey = key;
    if (this.#durable && this.#join?.mode === JOIN_TIME) await this.#recovery.persist(group);
    return dataInput(group);
  }

  #groupKey(group: ReadyGroup<Held>): string {
    if (this.#parents.length === 1) return group.handles[0].delivery.token.messageId;
    return messageId(this.#flowId, this.#runId, this.#node, group.traceId, group.seq, MsgType.data);
  }

  /** Publishes the output committed with the covering checkpoint again, until taken (see CheckpointCoverage). */
  async #republishCovered(output: string, body: Uint8Array): Promise<void> {
    // The committed body stays this messenger's for a later confirmation: it is sent as a copy.
    const outcome = await this.#publisher.publish(
      this.#dataEnvelope(output, body, null, null, null, false),
      true,
    );
    this.#countPublication(outcome);
    if (outcome.kind !== "accepted") this.#refused(outcome);
  }

  // ---- end of stream ------------------------------------------------------------------------------------

  /** Re-evaluates every parent whose end was seen; true when one drained (its EOS was fed to the join). */
  async #checkDrains(): Promise<boolean> {
    let drained = false;
    for (const parent of this.#parents) {
      if (!this.#eos.awaitsDrain(parent)) continue;
      const now = this.#clock.monotonic();
      if (!this.#eos.due(parent, now)) continue;
      if (await this.#eos.isDrained(parent, now)) {
        await this.#drain(parent);
        drained = true;
      }
    }
    return drained;
  }

  /** Acks the parent's EOS markers (only now, EOS-3) and feeds them to the join. */
  async #drain(parent: ParentState): Promise<void> {
    parent.drained = true;
    if (this.#recovery.waiting) this.#releaseRecovered();
    const ends = [...parent.ends.values()];
    await Promise.all(ends.map((h) => this.#settlement.settle(h, completed())));
    const assembler = this.#assembler as GroupAssembler<Held>;
    for (const held of ends) {
      assembler.add(parent.name, entryFromEnvelope(held.envelope as WireEnvelope, held, undefined));
    }
    parent.ends.clear();
  }

  /** Returns everything held and not handed to the node (join halves, end markers, recovered members). */
  async #handBack(): Promise<void> {
    if (this.#assembler === null) return;
    if (this.#recovery.waiting) this.#releaseRecovered();
    this.#assembler.handBack();
    await this.#settleReleases();
    const waiting: Promise<unknown>[] = [];
    for (const parent of this.#parents) {
      for (const held of parent.ends.values()) waiting.push(this.#settlement.settle(held, retry(null)));
      parent.ends.clear();
    }
    for (const group of this.#recovery.takeReady()) {
      for (const held of group.handles) waiting.push(this.#settlement.settle(held, retry(null)));
    }
    await Promise.all(waiting);
  }

  // ---- settlement and the delivery ladder ---------------------------------------------------------------

  /** Input that never reaches the node (undecodable, a missing payload, an unusable key): the poison ladder. */
  async #rejectInput(held: Held, error: VideoflowRuntimeError, reason: DropReason): Promise<void> {
    this.#held.add(held);
    this.#drop(reason);
    await this.#ladder.apply(held, error);
  }

  #drop(reason: DropReason | typeof DropReason.joinEvicted, count = 1): void {
    this.#drops.set(reason, (this.#drops.get(reason) ?? 0) + count);
  }

  // ---- publishing -----------------------------------------------------------------------------------------

  #dataEnvelope(
    publicationId: string,
    body: Uint8Array,
    eventTs: number | null,
    partitionKey: string | null,
    offset: number | null,
    transferable = true,
  ): BackendEnvelope {
    return backendEnvelope({
      channel: this.#channel,
      publicationId,
      headers: ENVELOPE_HEADERS,
      body,
      eventId: publicationId,
      partitionKey,
      eventTs,
      sourceOffset: offset,
      sourceEpoch: this.#identity.epoch,
      schemaVersion: ENVELOPE_VERSION,
      kind: MessageKind.data,
      bodyTransferable: transferable,
    });
  }

  #countPublication(outcome: PublicationOutcome, onAccepted?: () => void): void {
    if (this.#publisher.isGivenUp(outcome)) return;
    switch (outcome.kind) {
      case "accepted":
        if (outcome.duplicate) {
          this.#stats.duplicate++;
        } else {
          this.#stats.accepted++;
          onAccepted?.();
        }
        return;
      case "rejected":
        this.#stats.rejected++;
        if (!this.#reliableOutput) {
          this.#stats.dropped++;
          this.#drop(DropReason.publishDiscarded);
        }
        return;
      case "publication_unknown":
      case "publication_unresolvable":
        this.#stats.unknown++;
        return;
    }
  }

  #refused(outcome: PublicationOutcome): never {
    const reason = "reason" in outcome ? outcome.reason : outcome.kind;
    throw new BrokerUnavailable(
      `the broker did not take ${this.#node}'s publication ${outcome.publicationId}: ${reason}`,
      "check that the run's channels are provisioned and the broker is healthy, then restart the worker",
      { node: this.#node, publication_id: outcome.publicationId, outcome: outcome.kind },
    );
  }

  /** Publishes an EOS or ABORT marker on the EOS subject, retrying until the broker takes it. */
  async #publishMarker(
    type: MsgType,
    traceId: string,
    payload: { payloadType: string; payload: Uint8Array },
  ) {
    if (type === MsgType.abort) await this.#work.idle();
    else await this.#work.drain();
    // Every output has its outcome: the room still held for more goes back to the channel (and its marker).
    this.#publisher.releaseCredit();
    await this.#ledger.flush();
    const seq = this.#barrierFlow ? await this.#runtime.publishedCount() : this.#ledger.acceptedCount;
    if (faultsInstalled()) await barrier(Barrier.terminatorPublishBefore, { node: this.#node, status: type });
    const publicationId = messageId(this.#flowId, this.#runId, this.#node, traceId, seq, type);
    const body = encodeEnvelope(createEnvelope({
      type,
      producerName: this.#node,
      flowId: this.#flowId,
      runId: this.#runId,
      traceId,
      seq,
      replicaId: this.#replicaId,
      payloadType: payload.payloadType,
      payload: payload.payload,
    }));
    const outcome = await this.#publisher.publish(
      backendEnvelope({
        channel: this.#channel,
        publicationId,
        headers: ENVELOPE_HEADERS,
        body,
        eventId: publicationId,
        schemaVersion: ENVELOPE_VERSION,
        kind: MessageKind.eos,
      }),
      true,
    );
    if (outcome.kind !== "accepted") this.#refused(outcome);
  }

  // ---- guards -------------------------------------------------------------------------------------------

  #requireStarted(what: string): void {
    if (!this.#started) {
      throw new ConfigError(
        `${what} before the messenger of ${this.#node} started`,
        "build it with BrokerMessenger.open",
      );
    }
  }

  #requireReceiver(what: string): void {
    this.#requireStarted(what);
    if (this.#assembler === null) {
      throw new ConfigError(
        `${this.#node} is a producer: it has no input to ${what}`,
        "call it on a receiving node",
      );
    }
  }
}
