/**
 * The broker topology of a flow (spec messaging.topology; WIRE.md "Streams and consumers"): which channels
 * and subscriptions a run needs, with what retention, delivery cap and credit, derived once from the
 * compiled node specs so that provisioning, the messenger's bind and the teardown all agree.
 *
 * - A channel per node output, shaped by its messaging profile: `live_latest` (the realtime default) keeps
 *   the freshest `max(1, buffer)` messages and evicts the oldest; `reliable_work` (the batch default) keeps
 *   at most 10000 until every required subscription settled them and refuses the rest, which a publisher
 *   turns into backpressure ({@link publishBackoffSeconds}). Both keep a 120 s duplicate window (the embedded
 *   broker also bounds it in bytes, {@link DEDUP_WINDOW_BYTES}).
 * - A data subscription per edge: `{child}--from--{parent}`, shared by the child's competing replicas, or one
 *   `{child}--from--{parent}--p{i}` per replica of a partitioned child (every replica reads every message
 *   and acks what it does not own). Its delivery cap comes from the child's DeliveryPolicy (realtime 1,
 *   batch `VF_MAX_RETRIES + 1`, unlimited when the run ledger keeps the budget) and its broker-side credit
 *   from {@link consumerCredit} over the child's processing credit ({@link joinItemCredit}).
 * - An end-of-stream anchor per channel, a subscription to the EOS subject that is never read, so a marker
 *   published before a slow child bound its own EOS subscription is still retained (story 13). Each running
 *   child replica binds its own EOS subscription ({@link eosSubscriptionSpec}) when it starts.
 * - The dead-letter stream is the flow's, outside every run ({@link DeadLetterSpec}): teardown never
 *   removes it.
 *
 * Names come from `backends/names.ts`; {@link durableNameOf} maps a logical subscription to the durable an
 * adapter binds. Everything is pure except {@link provisionFlow}.
 *
 * @example
 * ```ts
 * const topology = flowTopology(specs, { flowId: "f", runId: "r", flowType: "batch" });
 * await provisionFlow(backend, topology, "provision-r");
 * ```
 *
 * @module
 */

import { MessagingProfile, PROFILE_RETENTION } from "../backends/capabilities.ts";
import { flowLabels, ownerLabels } from "../backends/identity.ts";
import {
  type ChannelId,
  channelId,
  type ChannelSpec,
  channelSpec,
  MessageKind,
  type MessagingBackend,
  Overflow,
  type SubscriptionId,
  subscriptionId,
  type SubscriptionSpec,
  subscriptionSpec,
  type VerifiedChannel,
  type VerifiedSubscription,
} from "../backends/messaging.ts";
import {
  dlqStreamName,
  dlqSubjectFilter,
  durableNameFor,
  eosAnchorDurableNameFor,
  eosDurableNameFor,
  partitionedDurableNameFor,
} from "../backends/names.ts";
import { AT_LEAST_ONCE, DEFAULT_MAX_RETRIES, DeliveryPolicy } from "../core/delivery_policy.ts";
import { requireCount } from "../core/checks.ts";
import { ConfigError } from "../core/errors.ts";
import { checkFlowType, FlowType } from "../core/flow_type.ts";
import { JoinPolicy } from "../core/join_policy.ts";
import type { JsonObject } from "../core/node.ts";

/** Inputs one replica holds in processing at a time (a single-parent node). */
export const DEFAULT_ITEM_CREDIT = 1;
/**
 * Deliveries a replica of a realtime flow takes from the broker per receive beyond the one it processes,
 * so the next inputs are in hand when the current one settles (the reference parked 4; a larger batch
 * amortizes each round trip over more messages, and 16 is still few enough that nothing goes stale).
 */
export const DEFAULT_PREFETCH = 16;
/**
 * The same for a batch flow, whose inputs do not go stale: a backlog is worked through in large batches,
 * so a round trip, a received-set ledger write and an ack wait are each shared by many inputs. The bytes
 * one receive takes stay bounded by the byte credit.
 */
export const BATCH_PREFETCH = 256;

/**
 * The spec's prefetch (JetStreamMessagingBackend's `prefetch = 4`, consumer_credit's default): what a node
 * takes ahead over JetStream unless it sets its own, so a durable provisioned here is the durable a
 * reference worker of the same run derives and binds (MSG-017).
 */
export const REFERENCE_PREFETCH = 4;

/**
 * The prefetch a node of a flow of `flowType` takes ahead unless it sets its own: over JetStream
 * (`overJetStream`) the spec's {@link REFERENCE_PREFETCH}, which provisioning, the local engine over servers
 * and every worker derive from here alike; on the embedded broker its own by flow type.
 */
export function defaultPrefetch(flowType: FlowType, overJetStream = false): number {
  if (overJetStream) return REFERENCE_PREFETCH;
  return flowType === FlowType.batch ? BATCH_PREFETCH : DEFAULT_PREFETCH;
}
/** Messages a realtime (live_latest) channel keeps: the freshest one. */
export const DEFAULT_REALTIME_BUFFER = 1;
/** Messages a batch (reliable_work) channel keeps before it refuses publications. */
export const DEFAULT_BATCH_MAX_MSGS = 10_000;
/** Every node channel's duplicate window, in seconds. */
export const DEDUP_WINDOW_SECONDS = 120;
/**
 * The most bytes the embedded broker lets one channel's duplicate window hold (8 MiB, about 65,000 ids),
 * so a fast channel's window is bounded in memory as well as in time: it still covers more than six times
 * the messages a batch channel holds unsettled ({@link DEFAULT_BATCH_MAX_MSGS}), the inputs whose outputs a
 * replacement recomputes.
 */
export const DEDUP_WINDOW_BYTES = 8 * 1024 * 1024;
/** A data subscription's default ack wait, in seconds (`VF_ACK_WAIT_SECONDS`). */
export const DEFAULT_ACK_WAIT_SECONDS = 60;
/** An end-of-stream subscription's ack wait, in seconds. */
export const EOS_ACK_WAIT_SECONDS = 30;
/** Bytes one receive of a subscription may hand out when nothing narrower is configured (64 MiB). */
export const DEFAULT_BYTE_CREDIT = 64 * 1024 * 1024;
/**
 * The bytes a replica's own output buffer may hold (its publications made and not yet taken by the broker)
 * when no channel limit narrows it (64 MiB): many small items overlap, a few large frames do.
 */
export const DEFAULT_IN_FLIGHT_BYTES = 64 * 1024 * 1024;

/** The variable that gives a replica its output buffer's bytes ({@link replicaOutputBufferBytes}). */
export const OUTPUT_BUFFER_ENV = "VF_OUTPUT_BUFFER_BYTES";

/**
 * The bytes each of a node's `nbTasks` replicas may hold in its own output buffer when the node's unsettled
 * data is bounded by `channelMaxBytes` wherever it waits: half the limit, shared by the replicas, at most
 * {@link DEFAULT_IN_FLIGHT_BYTES} each. The node's channel keeps the rest ({@link flowTopology}), so what
 * the broker holds and what the replicas still hold together stay within the limit.
 */
export function replicaOutputBufferBytes(channelMaxBytes: number, nbTasks: number): number {
  return Math.min(DEFAULT_IN_FLIGHT_BYTES, Math.floor(channelMaxBytes / 2 / nbTasks));
}

/** What a node's channel keeps of its byte limit: the rest beside its replicas' output buffers. */
function channelShare(channelMaxBytes: number | null, nbTasks: number): number | null {
  if (channelMaxBytes === null) return null;
  return channelMaxBytes - nbTasks * replicaOutputBufferBytes(channelMaxBytes, nbTasks);
}

/** How long dead letters are retained (STREAM-8): 7 days, the forensic horizon a DLQ payload pin covers. */
export const DLQ_RETENTION_SECONDS = 7 * 24 * 3600;
/** The `instance` of a channel's end-of-stream anchor subscription. */
export const EOS_ANCHOR_INSTANCE = "anchor";
/**
 * How long a publisher waits before retrying a publication a full reliable_work channel refused, by retry:
 * 0.05, 0.1, 0.2, 0.5, 1.0 s, then 1.0 s for every later retry.
 */
export const PUBLISH_BACKOFF_SECONDS: readonly number[] = Object.freeze([0.05, 0.1, 0.2, 0.5, 1.0]);

/** What the topology reads of a compiled node: a `NodeSpec` satisfies it. */
export interface TopologyNode {
  readonly name: string;
  readonly parents: readonly string[];
  readonly nbTasks: number;
  readonly partitionBy: string | null;
  /** The node's JoinPolicy as its dict; `null` takes the flow type's default. */
  readonly joinPolicy: JsonObject | null;
  /** The node's delivery override (`NodeSpec.delivery`); `null` takes the flow type's preset. */
  readonly delivery: JsonObject | null;
  /** Inputs each replica takes ahead (`NodeSpec.prefetch`); `null` or absent takes the run's. */
  readonly prefetch?: number | null;
}

/** Run-wide settings every channel and subscription of a run is derived with. */
export interface TopologySettings {
  readonly flowId: string;
  readonly runId: string;
  readonly flowType: FlowType;
  /** `VF_MAX_RETRIES` (3). */
  readonly maxRetries?: number;
  /** `VF_ACK_WAIT_SECONDS` (60). */
  readonly ackWaitSeconds?: number;
  /** A live_latest channel's message limit ({@link DEFAULT_REALTIME_BUFFER}). */
  readonly realtimeBuffer?: number;
  /** A reliable_work channel's message limit ({@link DEFAULT_BATCH_MAX_MSGS}). */
  readonly batchMaxMsgs?: number;
  /**
   * The most bytes of one node's unsettled data, at the broker and in its replicas' own output buffers
   * (`null`, the default: no byte limit, as a JetStream stream by default). Its channel keeps what the
   * buffers do not ({@link replicaOutputBufferBytes}). A reliable_work channel at its limit refuses
   * publications until its consumers settle (the publisher backs off); a live_latest one evicts its oldest.
   */
  readonly channelMaxBytes?: number | null;
  /**
   * Deliveries a replica takes per receive beyond its processing credit, for a node that sets none
   * ({@link defaultPrefetch}; {@link REFERENCE_PREFETCH} over JetStream).
   */
  readonly prefetch?: number;
  /** Bytes one receive may hand out (`VF_PREFETCH_BYTES`; {@link DEFAULT_BYTE_CREDIT}). */
  readonly byteCredit?: number;
  /** The run ledger enforces retry budgets (a durable, shared store, D11): at-least-once caps become -1. */
  readonly ledgerBudget?: boolean;
  /** Copies a replicated broker keeps of each channel (1). */
  readonly replicas?: number;
  /** The provisioning generation recorded in owner labels; none by default. */
  readonly generation?: string | null;
  /**
   * Every channel keeps terminators apart from data (the embedded broker's choice: a join holding a whole
   * batch channel as unmatched halves then never refuses its parent's end marker); by default only an
   * evicting channel does, and a refusing one is WIRE.md's shared slot.
   */
  readonly perSubjectLimits?: boolean;
  /** Per channel (node name), the messaging profile the composition planner assigned; else the flow type's. */
  readonly profiles?: Readonly<Record<string, MessagingProfile>>;
}

/** How one node reads its inputs: the facts its subscriptions are derived from. */
export interface NodeRouting {
  readonly name: string;
  readonly parents: readonly string[];
  readonly nbTasks: number;
  /** Whether every replica reads every message on its own subscription (a partition key is declared). */
  readonly partitioned: boolean;
  readonly delivery: DeliveryPolicy;
  /** The join policy of a multi-parent node; `null` for a single parent. */
  readonly join: JoinPolicy | null;
  /** The node's own prefetch, or `null` for the run's ({@link TopologySettings.prefetch}). */
  readonly prefetch: number | null;
}

/** The flow's dead-letter stream: flow-scoped, outside every run, never removed by a run's teardown. */
export interface DeadLetterSpec {
  readonly streamName: string;
  /** The subjects it binds: `vf.{flow}._dlq.>`. */
  readonly subjectFilter: string;
  readonly maxAgeSeconds: number;
  readonly ownerLabels: Readonly<Record<string, string>>;
}

/** Everything a run provisions before any worker publishes. */
export interface FlowTopology {
  readonly channels: readonly ChannelSpec[];
  /** Every data subscription of every edge, then every channel's EOS anchor. */
  readonly subscriptions: readonly SubscriptionSpec[];
  readonly deadLetter: DeadLetterSpec;
}

/** What {@link provisionFlow} found on the broker after creating everything. */
export interface ProvisionedTopology {
  readonly channels: readonly VerifiedChannel[];
  readonly subscriptions: readonly VerifiedSubscription[];
  /** Every field the broker did not honour, as `<channel or subscription>: <field>`. */
  readonly mismatches: readonly string[];
}

/**
 * The seconds a publisher waits before retry `retry` (1 for the first) of a publication a full channel
 * refused: {@link PUBLISH_BACKOFF_SECONDS}, repeating its last value.
 */
export function publishBackoffSeconds(retry: number): number {
  requireCount(retry, "a publication retry", 1);
  return PUBLISH_BACKOFF_SECONDS[Math.min(retry, PUBLISH_BACKOFF_SECONDS.length) - 1];
}

/**
 * STREAM-15 (MSG-017): the broker-side credit (max_ack_pending) a data subscription needs so every replica
 * can hold `itemCredit` inputs in processing plus `prefetch` received ahead, without one replica's
 * unsettled work starving another's: a shared (competing) subscription multiplies by the replica count, a
 * per-replica (partitioned) one does not.
 */
export function consumerCredit(
  nbTasks: number,
  partitioned: boolean,
  itemCredit: number = DEFAULT_ITEM_CREDIT,
  prefetch: number = DEFAULT_PREFETCH,
): number {
  requireCount(nbTasks, "nb_tasks", 1);
  requireCount(itemCredit, "the item credit", 1);
  requireCount(prefetch, "the prefetch");
  return (itemCredit + prefetch) * (partitioned ? 1 : nbTasks);
}

/**
 * The inverse of {@link consumerCredit} (RUN-024): how many replicas a subscription's effective credit, as
 * read back from the broker, lets hold `itemCredit` inputs plus `prefetch` at once. A per-replica
 * (partitioned) subscription serves one replica whatever its credit, when that credit suffices for it.
 */
export function creditAdmits(
  effectiveCredit: number,
  partitioned: boolean,
  itemCredit: number = DEFAULT_ITEM_CREDIT,
  prefetch: number = DEFAULT_PREFETCH,
): number {
  requireCount(effectiveCredit, "the effective credit");
  const perReplica = consumerCredit(1, true, itemCredit, prefetch);
  const replicas = Math.floor(effectiveCredit / perReplica);
  return partitioned ? Math.min(1, replicas) : replicas;
}

/**
 * The per-replica processing credit of a node (RUN-005): one input group for a single parent; for a join,
 * its policy's working set (every half of every pending group plus the group being assembled), since a
 * smaller credit lets an adversarial parent ordering fill the subscriptions with halves that never complete.
 */
export function joinItemCredit(nbParents: number, join: JoinPolicy | null): number {
  requireCount(nbParents, "the parent count", 1);
  if (nbParents === 1 || join === null) return DEFAULT_ITEM_CREDIT;
  return join.workingSet(nbParents);
}

/**
 * The delivery cap of a node's data subscriptions, from its effective DeliveryPolicy: 1 for best-effort,
 * `max_retries + 1` for at-least-once, and -1 (the broker never strands a message) for at-least-once when
 * the run ledger counts attempts (`ledgerBudget`, decision D11). With the ledger, a best-effort input gets
 * a second delivery, which never reaches the node when the ledger counted a replica's death against the
 * first: the messenger gives it up then (the poison ladder), where the broker would strand it unseen.
 */
export function maxDeliverFor(delivery: DeliveryPolicy, ledgerBudget: boolean): number {
  if (!ledgerBudget) return delivery.maxDeliver;
  return delivery.delivery === AT_LEAST_ONCE ? -1 : BEST_EFFORT_LEDGER_DELIVERIES;
}

/** Deliveries of a best-effort input under the ledger budget: its own, then one to give it up after a death. */
export const BEST_EFFORT_LEDGER_DELIVERIES = 2;

/** The messaging profile a flow type gives a channel the planner said nothing about. */
export function defaultProfile(flowType: FlowType): MessagingProfile {
  return checkFlowType(flowType) === FlowType.batch
    ? MessagingProfile.reliableWork
    : MessagingProfile.liveLatest;
}

/** What {@link channelSpecFor} shapes a channel with beyond its profile. */
export interface ChannelShape {
  readonly required?: readonly SubscriptionId[];
  /** Data and terminators count against separate limits; by default only on an evicting channel. */
  readonly perSubjectLimits?: boolean;
  readonly realtimeBuffer?: number;
  readonly batchMaxMsgs?: number;
  readonly replicas?: number;
  readonly maxBytes?: number | null;
  readonly generation?: string | null;
}

/**
 * The channel a node's output must provide under `profile`: a live_latest (or archive) channel keeps the
 * freshest `max(1, realtimeBuffer)` messages and evicts the oldest; a reliable_work or durable_control one
 * keeps `batchMaxMsgs` until their required subscriptions settle them and refuses publications beyond.
 * On an evicting channel data and end-of-stream markers count against separate limits, so a publication
 * never evicts a terminator (EOS is never dropped: another replica's later frame would otherwise push a
 * replica's end out of a one-message stream) and a terminator never evicts the freshest frame. A refusing
 * channel evicts nothing, so by default its limit is one for both, exactly WIRE.md's stream (a reference
 * worker's stream is then this one): a terminator refused by a full channel is published again once it has
 * room. `shape.perSubjectLimits` keeps terminators apart on every channel (the embedded broker's choice).
 * The owner labels name the run and the node.
 */
export function channelSpecFor(
  flowId: string,
  runId: string,
  node: string,
  profile: MessagingProfile,
  shape: ChannelShape = {},
): ChannelSpec {
  const retention = PROFILE_RETENTION[profile];
  const live = profile === MessagingProfile.liveLatest || profile === MessagingProfile.replayArchive;
  const maxMsgs = live
    ? Math.max(1, shape.realtimeBuffer ?? DEFAULT_REALTIME_BUFFER)
    : shape.batchMaxMsgs ?? DEFAULT_BATCH_MAX_MSGS;
  return channelSpec({
    id: channelId(flowId, runId, node),
    profile,
    retention,
    maxMsgs,
    maxBytes: shape.maxBytes ?? null,
    maxAgeSeconds: null,
    overflow: live ? Overflow.evictOldest : Overflow.reject,
    dedupWindowSeconds: DEDUP_WINDOW_SECONDS,
    replicas: shape.replicas ?? 1,
    persistence: false,
    requiredSubscriptions: shape.required ?? [],
    ownerLabels: ownerLabels(flowId, runId, node, "stream", shape.generation ?? null),
    perSubjectLimits: shape.perSubjectLimits ?? live,
  });
}

/** The data subscription of `child` on `channel`: shared by its replicas, or replica `partition`'s own. */
export function dataSubscriptionId(
  channel: ChannelId,
  child: string,
  partition: number | null = null,
): SubscriptionId {
  return subscriptionId(channel, child, { partition, kind: MessageKind.data });
}

/** One running replica's own EOS subscription on `channel`, named by its unique `instance`. */
export function eosSubscriptionId(channel: ChannelId, child: string, instance: string): SubscriptionId {
  if (instance === EOS_ANCHOR_INSTANCE) {
    throw new ConfigError(
      `instance ${JSON.stringify(EOS_ANCHOR_INSTANCE)} is reserved for the channel's EOS anchor`,
      "name a replica's EOS subscription with an instance id unique to the running process",
    );
  }
  return subscriptionId(channel, child, { kind: MessageKind.eos, instance });
}

/** The never-read EOS subscription that retains a channel's early end-of-stream markers (story 13). */
export function eosAnchorSubscriptionId(channel: ChannelId): SubscriptionId {
  return subscriptionId(channel, channel.node, { kind: MessageKind.eos, instance: EOS_ANCHOR_INSTANCE });
}

/**
 * The broker durable a logical subscription binds (WIRE.md "Names"): `{child}--from--{parent}`, its
 * `--p{i}` per-replica form, `{child}--eos--{parent}--{instance}`, or the channel's `{node}--eos--anchor`.
 */
export function durableNameOf(id: SubscriptionId): string {
  const parent = id.channel.node;
  if (id.kind === MessageKind.eos) {
    if (id.instance === EOS_ANCHOR_INSTANCE) return eosAnchorDurableNameFor(parent);
    if (id.instance === null) {
      throw new ConfigError(
        `the EOS subscription of ${id.consumerNode} on ${parent} names no instance`,
        "bind EOS subscriptions per running replica with eosSubscriptionId",
      );
    }
    return eosDurableNameFor(id.consumerNode, parent, id.instance);
  }
  return id.partition === null
    ? durableNameFor(id.consumerNode, parent)
    : partitionedDurableNameFor(id.consumerNode, parent, id.partition);
}

/**
 * A subscription spec with `credit` as its broker-side credit. A data subscription without a partition is
 * competing; a partitioned one and every EOS subscription serve one reader.
 */
export function subscriptionSpecFor(
  id: SubscriptionId,
  ackWaitSeconds: number,
  maxDeliver: number,
  credit: number,
  byteCredit: number = DEFAULT_BYTE_CREDIT,
): SubscriptionSpec {
  return subscriptionSpec({
    id,
    competing: id.kind === MessageKind.data && id.partition === null,
    ackWaitSeconds,
    maxDeliver,
    itemCredit: credit,
    byteCredit,
    ownerLabels: ownerLabels(id.channel.flowId, id.channel.runId, id.consumerNode, "consumer"),
  });
}

/**
 * How `node` reads its inputs in a flow of `flowType`: its effective delivery policy (preset, override,
 * `maxRetries`) and, for a join, its join policy (the flow type's default when it declares none).
 */
export function nodeRouting(node: TopologyNode, flowType: FlowType, maxRetries?: number | null): NodeRouting {
  const join = node.parents.length > 1
    ? (node.joinPolicy === null ? JoinPolicy.defaultFor(flowType) : JoinPolicy.fromDict(node.joinPolicy))
    : null;
  return {
    name: node.name,
    parents: [...node.parents],
    nbTasks: requireCount(node.nbTasks, `nb_tasks of ${node.name}`, 1),
    partitioned: node.partitionBy !== null && node.nbTasks > 1,
    delivery: DeliveryPolicy.resolve(flowType, node.delivery, maxRetries ?? DEFAULT_MAX_RETRIES),
    join,
    prefetch: node.prefetch ?? null,
  };
}

/**
 * The data subscriptions `child` reads `parent` through: one shared, or one per replica when partitioned,
 * each with the cap and credit provisioning and the messenger's bind agree on.
 */
export function dataSubscriptionSpecs(
  child: NodeRouting,
  parent: string,
  settings: TopologySettings,
): SubscriptionSpec[] {
  const channel = channelId(settings.flowId, settings.runId, parent);
  const partitions = child.partitioned ? Array.from({ length: child.nbTasks }, (_, i) => i) : [null];
  return partitions.map((partition) => dataSubscriptionSpec(child, channel, partition, settings));
}

/** One data subscription of `child` on `channel` (`partition`: its replica's own, or null when shared). */
export function dataSubscriptionSpec(
  child: NodeRouting,
  channel: ChannelId,
  partition: number | null,
  settings: TopologySettings,
): SubscriptionSpec {
  const credit = consumerCredit(
    child.nbTasks,
    child.partitioned,
    joinItemCredit(child.parents.length, child.join),
    child.prefetch ?? settings.prefetch ?? defaultPrefetch(settings.flowType),
  );
  return subscriptionSpecFor(
    dataSubscriptionId(channel, child.name, partition),
    settings.ackWaitSeconds ?? DEFAULT_ACK_WAIT_SECONDS,
    maxDeliverFor(child.delivery, settings.ledgerBudget ?? false),
    credit,
    settings.byteCredit ?? DEFAULT_BYTE_CREDIT,
  );
}

/**
 * A replica's own EOS subscription on `channel`: room for an EOS and an ABORT from each of the parent's
 * `parentReplicas`, redelivered without a cap until the replica settles them.
 */
export function eosSubscriptionSpec(
  channel: ChannelId,
  child: string,
  instance: string,
  parentReplicas: number,
): SubscriptionSpec {
  const credit = 2 * requireCount(parentReplicas, "the parent's replica count", 1);
  return subscriptionSpecFor(eosSubscriptionId(channel, child, instance), EOS_ACK_WAIT_SECONDS, -1, credit);
}

function anchorSpec(channel: ChannelId): SubscriptionSpec {
  return subscriptionSpecFor(eosAnchorSubscriptionId(channel), EOS_ACK_WAIT_SECONDS, -1, 1);
}

/**
 * Everything the run `settings` names needs for `nodes`, before any worker publishes: every node's output
 * channel (with its data subscriptions and EOS anchor required, so interest retention keeps what nobody has
 * read yet), every data subscription, every EOS anchor, and the flow's dead-letter stream. A live_latest
 * channel keeps at least one message per replica of its node, so one replica's end-of-stream marker is not
 * evicted by a sibling's.
 *
 * @throws ConfigError for a parent no node of the flow is, or settings out of range.
 */
export function flowTopology(nodes: readonly TopologyNode[], settings: TopologySettings): FlowTopology {
  const flowType = checkFlowType(settings.flowType);
  const names = new Set(nodes.map((node) => node.name));
  const byParent = new Map<string, SubscriptionSpec[]>(nodes.map((node) => [node.name, []]));
  for (const node of nodes) {
    const routing = nodeRouting(node, flowType, settings.maxRetries);
    for (const parent of node.parents) {
      if (!names.has(parent)) {
        throw new ConfigError(
          `node ${node.name} reads ${JSON.stringify(parent)}, which is not a node of the flow`,
          "compile the whole flow and provision every node spec it produced",
          { node: node.name, parent },
        );
      }
      byParent.get(parent)?.push(...dataSubscriptionSpecs(routing, parent, settings));
    }
  }
  const channels: ChannelSpec[] = [];
  const subscriptions: SubscriptionSpec[] = [];
  const anchors: SubscriptionSpec[] = [];
  for (const node of nodes) {
    const channel = channelId(settings.flowId, settings.runId, node.name);
    const data = byParent.get(node.name) ?? [];
    const anchor = anchorSpec(channel);
    channels.push(
      channelSpecFor(
        settings.flowId,
        settings.runId,
        node.name,
        settings.profiles?.[node.name] ?? defaultProfile(flowType),
        {
          required: [...data.map((spec) => spec.id), anchor.id],
          realtimeBuffer: Math.max(settings.realtimeBuffer ?? DEFAULT_REALTIME_BUFFER, node.nbTasks),
          batchMaxMsgs: settings.batchMaxMsgs,
          maxBytes: channelShare(settings.channelMaxBytes ?? null, node.nbTasks),
          replicas: settings.replicas,
          generation: settings.generation,
          perSubjectLimits: settings.perSubjectLimits,
        },
      ),
    );
    subscriptions.push(...data);
    anchors.push(anchor);
  }
  return Object.freeze({
    channels: Object.freeze(channels),
    subscriptions: Object.freeze([...subscriptions, ...anchors]),
    deadLetter: Object.freeze({
      streamName: dlqStreamName(settings.flowId),
      subjectFilter: dlqSubjectFilter(settings.flowId),
      maxAgeSeconds: DLQ_RETENTION_SECONDS,
      ownerLabels: Object.freeze(flowLabels(settings.flowId, "dlq")),
    }),
  });
}

/**
 * Creates (or reconciles) every channel, then every subscription of `topology` on `backend`, reading each
 * back; idempotent, so a provisioning job that is retried, and a worker that re-binds, change nothing.
 * `operationId` prefixes each call's operation id. What the broker did not honour is listed in
 * `mismatches`; an immutable conflict throws IncompatibleProfile (the backend's).
 */
export async function provisionFlow(
  backend: MessagingBackend,
  topology: FlowTopology,
  operationId: string,
): Promise<ProvisionedTopology> {
  const channels: VerifiedChannel[] = [];
  for (const spec of topology.channels) {
    channels.push(await backend.ensureChannel(spec, `${operationId}/channel/${spec.id.node}`));
  }
  const subscriptions: VerifiedSubscription[] = [];
  for (const spec of topology.subscriptions) {
    subscriptions.push(
      await backend.ensureSubscription(spec, `${operationId}/subscription/${durableNameOf(spec.id)}`),
    );
  }
  const mismatches = [
    ...channels.flatMap((c) => c.mismatches.map((field) => `${c.spec.id.node}: ${field}`)),
    ...subscriptions.flatMap((s) => s.mismatches.map((field) => `${durableNameOf(s.spec.id)}: ${field}`)),
  ];
  return Object.freeze({
    channels: Object.freeze(channels),
    subscriptions: Object.freeze(subscriptions),
    mismatches: Object.freeze(mismatches),
  });
}
