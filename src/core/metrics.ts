/**
 * The metric vocabulary: the family names a node's `/metrics` exports and the values of the `reason`
 * label on `videoflow_messages_dropped_total`. The run loop, the messenger, the brokers and the health
 * server all name a family or a reason through these objects; the strings are the spec's and stable,
 * since dashboards and alerts key on them.
 *
 * @example
 * ```ts
 * import { DropReason, Metric, METRIC_PREFIX } from "./metrics.ts";
 * console.log(`${METRIC_PREFIX}${Metric.dropped}{reason="${DropReason.poison}"}`);
 * // videoflow_messages_dropped_total{reason="poison"}
 * ```
 *
 * @module
 */

/** Every family name starts with this. */
export const METRIC_PREFIX = "videoflow_";

/** The metric families the run loop feeds, named without {@link METRIC_PREFIX}. */
export const Metric = {
  /** Histogram: seconds the node's own callback (`process`/`consume`/`next`) took. */
  proctime: "proctime_seconds",
  /** Histogram: seconds of the whole iteration, from an input group's receipt to its ack. */
  actualProctime: "actual_proctime_seconds",
  /** Counter: messages this node published. */
  published: "messages_published_total",
  /** Counter: input messages this node received (one per parent entry). */
  received: "messages_received_total",
  /** Counter: items produced and taken by the broker as new, or input groups processed and their ack confirmed. */
  processed: "messages_processed_total",
  /** Counter: input groups the node failed on. */
  failed: "messages_failed_total",
  /** Counter: input groups of real work handed to the node (end-of-stream and abort markers are not work). */
  offered: "messages_offered_total",
  /** Counter, labelled `reason` (a {@link DropReason}): input groups given up on, never to be redelivered. */
  dropped: "messages_dropped_total",
  /** Counter, labelled `code` and `disposition`: failures by their stable code. */
  errors: "errors_total",
} as const;
/** One of the {@link Metric} family names. */
export type Metric = typeof Metric[keyof typeof Metric];

/**
 * Why an input was given up on: the values of the `reason` label on {@link Metric.dropped}, and of the
 * `reason` a broker records a lost message under.
 */
export const DropReason = {
  /** The run loop: a poison input, dead-lettered on its first failure. */
  poison: "poison",
  /** The run loop: a transient failure best-effort delivery discards instead of retrying. */
  bestEffort: "best_effort",
  /** The messenger: a retry budget was exhausted; the input was dead-lettered (or terminated) after its last attempt. */
  exhausted: "exhausted",
  /** The messenger: the bytes could not be decoded (or their offloaded payload was missing or corrupt). */
  undecodable: "undecodable",
  /** The messenger: a partitioned input whose key was unusable was dead-lettered (RUN-020). */
  partitionKey: "partition_key",
  /** The messenger: an input that came after its slot was given up, under an ordering policy with `late: "drop"`. */
  late: "late",
  /** The messenger: a live (best-effort) publication the broker refused. */
  publishDiscarded: "publish_discarded",
  /** The join assembler: a member of a join group evicted before the group completed. */
  joinEvicted: "join_evicted",
  /** The broker: a full limits channel evicted the oldest message. */
  evicted: "evicted",
  /** The broker: the message outlived the channel's max age. */
  maxAge: "max_age",
  /** The broker: a newer message with the same partition key took the key's latest-value slot. */
  superseded: "superseded",
  /** The broker: a core-only client queue was full (slow consumer). */
  slowConsumer: "slow_consumer",
  /** The broker: a core-only delivery was handed back for a retry no core broker can make. */
  noRedelivery: "no_redelivery",
  /** The broker: every consumer of the subscription was given up on. */
  consumerGone: "consumer_gone",
} as const;
/** One of the {@link DropReason} values. */
export type DropReason = typeof DropReason[keyof typeof DropReason];
