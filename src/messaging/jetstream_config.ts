/**
 * The JetStream configuration a channel or subscription spec means (WIRE.md "Streams and consumers", spec
 * messaging.topology), and the comparison of what was asked with what the server read back. Pure: no
 * connection, no client calls, so provisioning, the backend's reconcile and the read-back tests derive the
 * same configs from the same specs.
 *
 * - A channel is one stream `vf-{flow}-{run}-{node}` binding its data subject and its `_eos` subject, with
 *   file storage, a duplicate window of the spec's seconds, limits retention and discard old for an
 *   evicting channel, interest retention and discard new for a refusing one. With per-subject limits (data
 *   and EOS never evict or fill each other, the project's rule over the reference's shared slot) the spec's
 *   `max_msgs` caps each subject (`max_msgs_per_subject`, discard-new per subject) and the stream as a
 *   whole holds both subjects' worth; without them `max_msgs` is the stream's, exactly as WIRE.md writes it.
 * - Owner labels travel as stream and consumer `metadata` only on servers that have it (2.10+); on older
 *   ones (Debian's 2.9.10) they are left out and ownership is read from the stream's subjects instead
 *   (`subjectOwner`), the spec's fallback.
 * - The flow's dead-letter stream `vf-{flow}-dlq` binds `vf.{flow}._dlq.>`: limits, discard old, 7 days.
 * - A subscription is a durable pull consumer, explicit ack, delivering all, filtered to the parent's data
 *   or EOS subject, with the spec's ack wait, max deliver and credit (`max_ack_pending`); a replica's own EOS
 *   durable is reaped by the server an hour after it goes inactive.
 *
 * @module
 */

import {
  AckPolicy,
  type ConsumerConfig,
  DeliverPolicy,
  DiscardPolicy,
  RetentionPolicy,
  StorageType,
  type StreamConfig,
} from "@nats-io/jetstream";
import {
  type MessagingCapabilities,
  messagingCapabilities,
  PublicationLedger,
  Retention,
} from "../backends/capabilities.ts";
import type { Observation } from "../backends/outcomes.ts";
import type { ChannelSpec, SubscriptionSpec } from "../backends/messaging.ts";
import { MessageKind, Overflow } from "../backends/messaging.ts";
import {
  dlqStreamName,
  dlqSubjectFilter,
  eosSubjectFor,
  streamNameFor,
  subjectFor,
} from "../backends/names.ts";
import { flowLabels } from "../backends/identity.ts";
import {
  DEDUP_WINDOW_SECONDS,
  DLQ_RETENTION_SECONDS,
  durableNameOf,
  EOS_ANCHOR_INSTANCE,
} from "./topology.ts";

/** Nanoseconds in a second: JetStream's durations are nanoseconds. */
const NS = 1_000_000_000;
/** How long the server keeps a replica's own EOS durable after it went inactive (WIRE.md), in seconds. */
export const EOS_INACTIVE_THRESHOLD_SECONDS = 3600;

/** Seconds as JetStream's nanoseconds. */
export function nanos(seconds: number): number {
  return Math.round(seconds * NS);
}

/** The stream fields a read-back compares: what a spec asks for, nothing the server adds on its own. */
export type RequestedStream =
  & Pick<
    StreamConfig,
    | "name"
    | "subjects"
    | "retention"
    | "discard"
    | "max_msgs"
    | "max_msgs_per_subject"
    | "discard_new_per_subject"
    | "max_bytes"
    | "max_age"
    | "storage"
    | "num_replicas"
    | "duplicate_window"
  >
  & { metadata?: Record<string, string> };

/** The consumer fields a read-back compares. */
export type RequestedConsumer =
  & Pick<
    ConsumerConfig,
    | "durable_name"
    | "ack_policy"
    | "deliver_policy"
    | "filter_subject"
    | "ack_wait"
    | "max_deliver"
    | "max_ack_pending"
  >
  & { inactive_threshold?: number; metadata?: Record<string, string> };

/** Stream fields no update may change: a difference is an IncompatibleProfile, never reconciled. */
export const IMMUTABLE_STREAM_FIELDS: readonly (keyof RequestedStream)[] = [
  "retention",
  "storage",
  "num_replicas",
  "subjects",
];
/** Consumer fields no update may change on the servers this adapter supports. */
export const IMMUTABLE_CONSUMER_FIELDS: readonly (keyof RequestedConsumer)[] = [
  "ack_policy",
  "deliver_policy",
  "filter_subject",
];

/** The stream a channel spec means; `labels` adds the owner labels as metadata (2.10+ servers only). */
export function streamConfigFor(spec: ChannelSpec, labels: boolean): RequestedStream {
  const { flowId, runId, node } = spec.id;
  const evicting = spec.overflow === Overflow.evictOldest;
  const perSubject = spec.perSubjectLimits;
  const config: RequestedStream = {
    name: streamNameFor(flowId, runId, node),
    subjects: [subjectFor(flowId, runId, node), eosSubjectFor(flowId, runId, node)],
    retention: spec.retention === Retention.interest ? RetentionPolicy.Interest : RetentionPolicy.Limits,
    discard: evicting ? DiscardPolicy.Old : DiscardPolicy.New,
    max_msgs: perSubject ? 2 * spec.maxMsgs : spec.maxMsgs,
    max_msgs_per_subject: perSubject ? spec.maxMsgs : -1,
    discard_new_per_subject: perSubject && !evicting,
    max_bytes: spec.maxBytes ?? -1,
    max_age: spec.maxAgeSeconds === null ? 0 : nanos(spec.maxAgeSeconds),
    storage: StorageType.File,
    num_replicas: spec.replicas,
    duplicate_window: nanos(spec.dedupWindowSeconds),
  };
  if (labels) config.metadata = { ...spec.ownerLabels };
  return config;
}

/** The flow's dead-letter stream (outside every run; teardown never removes it). */
export function deadLetterStreamConfig(flowId: string, replicas: number, labels: boolean): RequestedStream {
  const config: RequestedStream = {
    name: dlqStreamName(flowId),
    subjects: [dlqSubjectFilter(flowId)],
    retention: RetentionPolicy.Limits,
    discard: DiscardPolicy.Old,
    max_msgs: -1,
    max_msgs_per_subject: -1,
    discard_new_per_subject: false,
    max_bytes: -1,
    max_age: nanos(DLQ_RETENTION_SECONDS),
    storage: StorageType.File,
    num_replicas: replicas,
    duplicate_window: nanos(DEDUP_WINDOW_SECONDS),
  };
  if (labels) config.metadata = flowLabels(flowId, "dlq");
  return config;
}

/** The durable pull consumer a subscription spec means; `labels` as for {@link streamConfigFor}. */
export function consumerConfigFor(spec: SubscriptionSpec, labels: boolean): RequestedConsumer {
  const { channel, kind, instance } = spec.id;
  const config: RequestedConsumer = {
    durable_name: durableNameOf(spec.id),
    ack_policy: AckPolicy.Explicit,
    deliver_policy: DeliverPolicy.All,
    filter_subject: kind === MessageKind.eos
      ? eosSubjectFor(channel.flowId, channel.runId, channel.node)
      : subjectFor(channel.flowId, channel.runId, channel.node),
    ack_wait: nanos(spec.ackWaitSeconds),
    max_deliver: spec.maxDeliver,
    max_ack_pending: spec.itemCredit,
  };
  if (kind === MessageKind.eos && instance !== EOS_ANCHOR_INSTANCE) {
    config.inactive_threshold = nanos(EOS_INACTIVE_THRESHOLD_SECONDS);
  }
  if (labels) config.metadata = { ...spec.ownerLabels };
  return config;
}

/**
 * Every requested field the effective configuration does not carry, as `field: requested X, effective Y`
 * (subjects compared as sets, metadata key by key; a field the server leaves out is its zero value, false
 * or 0, as nats-server omits those: 2.9.10 reads back no `discard_new_per_subject` for false). Empty: the
 * server gave exactly what was asked.
 */
export function configMismatches<T extends object>(
  requested: T,
  effective: Readonly<Record<string, unknown>>,
  fields: readonly (keyof T)[] = Object.keys(requested) as (keyof T)[],
): string[] {
  const found: string[] = [];
  for (const field of fields) {
    const want = requested[field] as unknown;
    if (want === undefined) continue;
    const have = effective[field as string] ?? zeroValueOf(want);
    if (!sameValue(want, have)) {
      found.push(`${String(field)}: requested ${JSON.stringify(want)}, effective ${JSON.stringify(have)}`);
    }
  }
  return found;
}

/** What a server that leaves out zero values means by an absent field of `want`'s type. */
function zeroValueOf(want: unknown): unknown {
  if (typeof want === "boolean") return false;
  if (typeof want === "number") return 0;
  return undefined;
}

function sameValue(want: unknown, have: unknown): boolean {
  if (Array.isArray(want)) {
    return Array.isArray(have) && want.length === have.length && want.every((v) => have.includes(v));
  }
  if (want !== null && typeof want === "object") {
    if (have === null || typeof have !== "object") return false;
    const got = have as Record<string, unknown>;
    return Object.entries(want).every(([key, value]) => got[key] === value);
  }
  return want === have;
}

/** What a JetStream server is observed to be: the facts its capabilities depend on, each Known or Unknown. */
export interface JetStreamObserved {
  /** The server's version, or `unknown` when no server info was read. */
  readonly version: string;
  /** Stream copies, as read back from a stream (Unknown when none was read). */
  readonly replicationFactor: Observation<number>;
  /** Whether streams are on file storage, as read back from a stream (Unknown when none was read). */
  readonly persistentStorage: Observation<boolean>;
  /** The server's largest message, from its info (Unknown when none was read). */
  readonly maxPayloadBytes: Observation<number>;
}

/**
 * What a JetStream server guarantees as this adapter drives it: retained backlog, redelivery, a publication
 * dedup window, resizable credit, EOS on its own subject; replication, storage and the payload limit as
 * `observed` says, never assumed.
 */
export function jetstreamCapabilities(observed: JetStreamObserved): MessagingCapabilities {
  return messagingCapabilities({
    adapter: "jetstream",
    version: observed.version,
    retainedBacklog: true,
    recoverableDelivery: true,
    latestPerKey: false,
    dedupWindowSeconds: null,
    publicationLedger: PublicationLedger.window,
    replicationFactor: observed.replicationFactor,
    persistentStorage: observed.persistentStorage,
    maxPayloadBytes: observed.maxPayloadBytes,
    creditResizable: true,
    controlSharesDataSlot: false,
  });
}
