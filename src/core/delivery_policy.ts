/**
 * What a node's failure costs (spec core.policies, DeliveryPolicy): whether a failed input is retried,
 * dropped or dead-lettered, and how many attempts it gets. Defaults come from the flow type (REALTIME:
 * best-effort, sampled DLQ; BATCH: at-least-once, full DLQ) and each axis is overridable per node, because
 * loss tolerance is a property of what a node does with a message.
 *
 * The action depends on the error's disposition (`poison`, `transient`, `worker_fatal`), not only on the
 * flow's patience: a message that will never parse is dead-lettered at once, and a worker whose GPU wedged
 * hands its input back without blaming it.
 *
 * @module
 */

import {
  ConfigError,
  type Disposition,
  DISPOSITIONS,
  isDisposition,
  POISON,
  TRANSIENT,
  WORKER_FATAL,
} from "./errors.ts";
import { isBatchFlow, PolicyCheck, readCheckedDict } from "./_policy_fields.ts";

/** Retry, then dead-letter. */
export const AT_LEAST_ONCE = "at-least-once";
/** Drop a failed message so the freshest one wins. */
export const BEST_EFFORT = "best-effort";
/** How much a node is willing to lose. */
export const DELIVERY_MODES = [AT_LEAST_ONCE, BEST_EFFORT] as const;
/** One of {@link DELIVERY_MODES}. */
export type DeliveryMode = typeof DELIVERY_MODES[number];

/** Every exhausted message is dead-lettered. */
export const DLQ_FULL = "full";
/** A bounded number per (code, node) per minute is dead-lettered: best-effort failures stay visible. */
export const DLQ_SAMPLED = "sampled";
/** Nothing is dead-lettered. */
export const DLQ_OFF = "off";
/** What reaches the dead-letter queue. */
export const DLQ_MODES = [DLQ_FULL, DLQ_SAMPLED, DLQ_OFF] as const;
/** One of {@link DLQ_MODES}. */
export type DlqMode = typeof DLQ_MODES[number];

/** Redeliver (to this or another replica). */
export const ACTION_NAK = "nak";
/** Drop it: no redelivery, no dead letter. */
export const ACTION_TERM = "term";
/** Dead-letter, then terminate the original. */
export const ACTION_DLQ = "dlq";
/** Dead-letter if under the sample cap, then terminate. */
export const ACTION_DLQ_SAMPLED = "dlq_sampled";
/** What the messenger does with a failed input group; returned by {@link DeliveryPolicy.actionFor}. */
export const ACTIONS = [ACTION_NAK, ACTION_TERM, ACTION_DLQ, ACTION_DLQ_SAMPLED] as const;
/** One of {@link ACTIONS}. */
export type DeliveryAction = typeof ACTIONS[number];

/** Retries after the first delivery for an at-least-once node; `max_deliver = retries + 1`. */
export const DEFAULT_MAX_RETRIES = 3;
/** Dead letters admitted per (code, node) per minute under {@link DLQ_SAMPLED}. */
export const DEFAULT_DLQ_SAMPLE_PER_MINUTE = 5;
/** The longest un-jittered backoff before a redelivery, in seconds. */
export const RETRY_DELAY_CAP_SECONDS = 30;
/** Smallest retry jitter multiplier. */
export const RETRY_JITTER_MIN = 0.5;
/** Largest retry jitter multiplier. */
export const RETRY_JITTER_MAX = 1.5;

/** The snake_case keys of a delivery policy dict, in `toDict` order. */
const DELIVERY_KEYS = ["delivery", "max_retries", "dlq", "on_error", "sample_per_minute"];

/** The constructor's camelCase options; every one is optional. */
export interface DeliveryPolicyInit {
  /** `at-least-once` (default) or `best-effort`. */
  readonly delivery?: DeliveryMode;
  /** Redelivery attempts after the first, for at-least-once (default 3); best-effort never redelivers. */
  readonly maxRetries?: number;
  /** `full` (default), `sampled` or `off`. */
  readonly dlq?: DlqMode;
  /** Disposition assumed for an exception nothing classified; `null` is the framework default (transient). */
  readonly onError?: Disposition | null;
  /** Cap for `dlq: "sampled"`, per (code, node) per minute (default 5). */
  readonly samplePerMinute?: number;
}

/** The serialized form, with the spec's exact keys (`DeliveryPolicy.to_dict`). */
export interface DeliveryPolicyDict {
  /** How much the node is willing to lose. */
  readonly delivery: DeliveryMode;
  /** Redelivery attempts after the first (at-least-once only). */
  readonly max_retries: number;
  /** What reaches the dead-letter queue. */
  readonly dlq: DlqMode;
  /** Disposition assumed for unclassified exceptions; `null` means the framework default. */
  readonly on_error: Disposition | null;
  /** Dead letters per (code, node) per minute under `dlq: "sampled"`. */
  readonly sample_per_minute: number;
}

/**
 * A node's own overrides (`NodeSpec.delivery`): its delivery mode and its disposition for unclassified
 * exceptions. Retries, the DLQ mode and sampling are deployment settings (`VF_MAX_RETRIES` ...).
 */
export type DeliveryOverride = Partial<Pick<DeliveryPolicyDict, "delivery" | "on_error">>;

/** The keys a node's {@link DeliveryOverride} may set. */
export const NODE_OVERRIDE_KEYS: readonly string[] = Object.freeze(["delivery", "on_error"]);

/**
 * Refuses, with a {@link ConfigError} naming `node` and the keys, an override of `node` that sets more
 * than {@link NODE_OVERRIDE_KEYS} (a `deliveryPolicy()` override that returns a whole policy's keys).
 */
export function checkNodeOverride(node: string, override: Readonly<Record<string, unknown>> | null): void {
  const extra = Object.keys(override ?? {}).filter((key) => !NODE_OVERRIDE_KEYS.includes(key));
  if (extra.length === 0) return;
  throw new ConfigError(
    `the delivery override of ${node} sets ${extra.join(", ")}, which only the deployment decides`,
    "override only delivery and on_error on a node; deployment settings (VF_MAX_RETRIES) cover the rest",
    { node, keys: extra },
  );
}

type DeliveryRaw = { readonly [K in keyof DeliveryPolicyInit]?: unknown };

/** What each delivery mode means when a node picks it: its DLQ mode and retry budget move with it. */
const PRESETS: Readonly<Record<DeliveryMode, DeliveryPolicyInit>> = {
  [AT_LEAST_ONCE]: { delivery: AT_LEAST_ONCE, maxRetries: DEFAULT_MAX_RETRIES, dlq: DLQ_FULL },
  [BEST_EFFORT]: { delivery: BEST_EFFORT, maxRetries: 0, dlq: DLQ_SAMPLED },
};

function checkDelivery(raw: DeliveryRaw, check: PolicyCheck): Required<DeliveryPolicyInit> {
  const fields = {
    delivery: raw.delivery ?? AT_LEAST_ONCE,
    maxRetries: raw.maxRetries ?? DEFAULT_MAX_RETRIES,
    dlq: raw.dlq ?? DLQ_FULL,
    onError: raw.onError ?? null,
    samplePerMinute: raw.samplePerMinute ?? DEFAULT_DLQ_SAMPLE_PER_MINUTE,
  };
  check.oneOf("delivery", fields.delivery, DELIVERY_MODES);
  check.number("max_retries", fields.maxRetries, { integer: true, min: 0 });
  check.oneOf("dlq", fields.dlq, DLQ_MODES);
  if (fields.onError !== null) check.oneOf("on_error", fields.onError, DISPOSITIONS);
  check.number("sample_per_minute", fields.samplePerMinute, { integer: true, min: 0 });
  check.throwIfAny();
  return fields as Required<DeliveryPolicyInit>;
}

function requirePositiveCount(numDelivered: number): void {
  if (!Number.isInteger(numDelivered) || numDelivered < 1) {
    throw new RangeError(
      `numDelivered is the broker's delivery count (1 for the first), got ${numDelivered}`,
    );
  }
}

/**
 * A validated delivery policy. Construction refuses, all at once in one {@link ConfigError}: an unknown
 * `delivery`, `dlq` or `on_error`, and a `max_retries` or `sample_per_minute` that is not an integer >= 0.
 *
 * @example
 * ```ts
 * const p = DeliveryPolicy.resolve("realtime", { delivery: "at-least-once" });
 * p.maxDeliver;                   // 4
 * p.actionFor("transient", 1);    // "nak"
 * p.actionFor("transient", 4);    // "dlq"
 * ```
 */
export class DeliveryPolicy {
  /** How much the node is willing to lose. */
  readonly delivery: DeliveryMode;
  /** Redelivery attempts after the first (at-least-once only). */
  readonly maxRetries: number;
  /** What reaches the dead-letter queue. */
  readonly dlq: DlqMode;
  /** Disposition assumed for unclassified exceptions; `null` means the framework default. */
  readonly onError: Disposition | null;
  /** Dead letters per (code, node) per minute under `dlq: "sampled"`. */
  readonly samplePerMinute: number;

  /** A policy of `init`, its defaults for what `init` leaves out; throws {@link ConfigError} when invalid. */
  constructor(init: DeliveryPolicyInit = {}) {
    const fields = checkDelivery(init, new PolicyCheck("DeliveryPolicy", "init"));
    this.delivery = fields.delivery;
    this.maxRetries = fields.maxRetries;
    this.dlq = fields.dlq;
    this.onError = fields.onError;
    this.samplePerMinute = fields.samplePerMinute;
  }

  /**
   * The flow type's preset: BATCH is at-least-once with 3 retries and a full DLQ; REALTIME is best-effort
   * with no retries and a sampled DLQ. Throws {@link ConfigError} for an unknown flow type.
   */
  static defaultFor(flowType: string): DeliveryPolicy {
    return new DeliveryPolicy(PRESETS[isBatchFlow(flowType) ? AT_LEAST_ONCE : BEST_EFFORT]);
  }

  /**
   * The effective policy of one node: the flow type's preset, then the node's own overrides (a
   * `NodeSpec.delivery` dict), then the deployment-level retry count (`VF_MAX_RETRIES`), which applies to
   * an at-least-once node only. Overriding `delivery` alone moves the DLQ mode and retry budget with it (an
   * at-least-once sink in a REALTIME flow gets a full DLQ and 3 retries, not 0). An override that is not an
   * object, has an unknown key or yields an invalid policy throws one {@link ConfigError}.
   */
  static resolve(flowType: string, override?: unknown, maxRetries?: number | null): DeliveryPolicy {
    const preset = isBatchFlow(flowType) ? AT_LEAST_ONCE : BEST_EFFORT;
    const own: Record<string, unknown> = override === null || override === undefined
      ? {}
      : readCheckedDict("delivery override", override, DELIVERY_KEYS, (_raw, check) => check.throwIfAny());
    const delivery = own.delivery ?? preset;
    const base = typeof delivery === "string" && Object.hasOwn(PRESETS, delivery)
      ? PRESETS[delivery as DeliveryMode]
      : {};
    const merged: Record<string, unknown> = { ...base, delivery };
    for (const [key, value] of Object.entries(own)) {
      if (value !== null) merged[key] = value;
    }
    if (maxRetries !== null && maxRetries !== undefined && merged.delivery === AT_LEAST_ONCE) {
      merged.maxRetries = maxRetries;
    }
    checkDelivery(merged, new PolicyCheck("DeliveryPolicy", "dict"));
    return new DeliveryPolicy(merged as DeliveryPolicyInit);
  }

  /**
   * A node's `delivery=`/`on_error=` arguments as the override dict `NodeSpec.delivery` carries, or `null`
   * when the node overrides nothing (so a flow that never touches them compiles to the same bytes). Each is
   * checked here, at build time: an unknown value throws {@link ConfigError}.
   */
  static nodeOverride(delivery?: string | null, onError?: string | null): DeliveryOverride | null {
    const check = new PolicyCheck("node delivery options", "init");
    const override: { delivery?: DeliveryMode; on_error?: Disposition } = {};
    if (delivery !== null && delivery !== undefined && check.oneOf("delivery", delivery, DELIVERY_MODES)) {
      override.delivery = delivery;
    }
    if (onError !== null && onError !== undefined && check.oneOf("on_error", onError, DISPOSITIONS)) {
      override.on_error = onError;
    }
    check.throwIfAny();
    return Object.keys(override).length === 0 ? null : override;
  }

  /**
   * Rebuilds a policy from its dict. Absent (or null) keys take the constructor's defaults; a non-object,
   * an unknown key and every invalid value are reported together in one {@link ConfigError}.
   */
  static fromDict(d: unknown): DeliveryPolicy {
    return new DeliveryPolicy(
      readCheckedDict("DeliveryPolicy", d, DELIVERY_KEYS, checkDelivery) as DeliveryPolicyInit,
    );
  }

  /** The dict with the spec's exact keys and order; `fromDict(toDict())` is an equal policy. */
  toDict(): DeliveryPolicyDict {
    return {
      delivery: this.delivery,
      max_retries: this.maxRetries,
      dlq: this.dlq,
      on_error: this.onError,
      sample_per_minute: this.samplePerMinute,
    };
  }

  /**
   * The broker-side delivery cap of the node's durables: 1 for best-effort (never redelivered),
   * `max_retries + 1` for at-least-once. Provisioning and the messenger both read it here.
   */
  get maxDeliver(): number {
    return this.delivery === BEST_EFFORT ? 1 : this.maxRetries + 1;
  }

  /**
   * The action for a failed input group, from its disposition and the broker's delivery count (1 for the
   * first attempt). The normative table (PROTOCOL §7.3):
   *
   * | disposition  | best-effort       | at-least-once              |
   * |--------------|-------------------|----------------------------|
   * | poison       | sampled DLQ, term | DLQ immediately, term      |
   * | transient    | term              | nak until budget, then DLQ |
   * | worker_fatal | nak               | nak                        |
   *
   * "DLQ" follows the `dlq` mode: `full` → `dlq`, `sampled` → `dlq_sampled`, `off` → `term`; a best-effort
   * transient failure is terminated in every DLQ mode (only poison is sampled). `worker_fatal` never
   * dead-letters: the message is fine, the worker is not. Throws {@link ConfigError} naming the known dispositions for any
   * other, and RangeError for a delivery count that is not an integer >= 1.
   */
  actionFor(disposition: string, numDelivered: number): DeliveryAction {
    if (!isDisposition(disposition)) {
      throw new ConfigError(
        `unknown disposition ${JSON.stringify(disposition)}; known: ${DISPOSITIONS.join(", ")}`,
        `classify the error as one of ${DISPOSITIONS.join(", ")}`,
      );
    }
    requirePositiveCount(numDelivered);
    switch (disposition) {
      case WORKER_FATAL:
        return ACTION_NAK;
      case POISON:
        return this.#deadLetterAction();
      case TRANSIENT:
        if (this.delivery === BEST_EFFORT) return ACTION_TERM;
        return numDelivered >= this.maxDeliver ? this.#deadLetterAction() : ACTION_NAK;
    }
  }

  #deadLetterAction(): DeliveryAction {
    if (this.dlq === DLQ_OFF) return ACTION_TERM;
    return this.dlq === DLQ_SAMPLED ? ACTION_DLQ_SAMPLED : ACTION_DLQ;
  }

  /**
   * Seconds to wait before a redelivery: `min(2^max(1, n), 30) × jitter` for delivery count n (2, 4, 8, 16,
   * 30, 30 … s). `jitter` is a multiplier in [0.5, 1.5] the caller draws (see {@link drawRetryJitter}), so
   * replicas that failed together do not retry together and this stays pure. Throws RangeError for a
   * delivery count that is not an integer >= 1 or a jitter outside that range.
   */
  retryDelay(numDelivered: number, jitter = 1): number {
    requirePositiveCount(numDelivered);
    if (!(jitter >= RETRY_JITTER_MIN && jitter <= RETRY_JITTER_MAX)) {
      throw new RangeError(`jitter must be in [${RETRY_JITTER_MIN}, ${RETRY_JITTER_MAX}], got ${jitter}`);
    }
    return Math.min(2 ** Math.max(1, numDelivered), RETRY_DELAY_CAP_SECONDS) * jitter;
  }
}

/**
 * A retry jitter multiplier uniform in [0.5, 1.5), drawn from `random` (a source uniform in [0, 1), like
 * `Math.random`); inject a seeded source to make a schedule reproducible.
 */
export function drawRetryJitter(random: () => number = Math.random): number {
  return RETRY_JITTER_MIN + (RETRY_JITTER_MAX - RETRY_JITTER_MIN) * random();
}
