/**
 * How a multi-parent node aligns its inputs (spec core.policies, JoinPolicy): how input groups are formed
 * (by lineage, `trace`, or by event time, `time`) and what happens to a group that never completes
 * (timeout + missing policy, and for time joins an optional quorum and per-parent collect windows).
 *
 * A policy travels with its node as a plain snake_case dict (`toDict`/`fromDict`), so it survives the
 * NodeSpec boundary into a worker that never sees the object graph.
 *
 * @module
 */

import { isRecord } from "./checks.ts";
import { isBatchFlow, PolicyCheck, readCheckedDict } from "./_policy_fields.ts";

/** Give up on a timed-out group and ack its partial inputs. */
export const MISSING_DROP = "drop";
/** Never time out; wait indefinitely (bounded by `max_pending`). */
export const MISSING_WAIT = "wait";
/** Nak the partial inputs of a timed-out group so they redeliver and eventually dead-letter. */
export const MISSING_ERROR = "error";
/** What to do with an incomplete join group once it times out. */
export const MISSING_POLICIES = [MISSING_DROP, MISSING_WAIT, MISSING_ERROR] as const;
/** One of {@link MISSING_POLICIES}. */
export type MissingPolicy = typeof MISSING_POLICIES[number];

/** Group by lineage: an exact trace id match (single-producer diamonds). */
export const JOIN_TRACE = "trace";
/** Group by event time: `event_ts` within a tolerance (independent producers). */
export const JOIN_TIME = "time";
/** How input groups are formed at a multi-parent node. */
export const JOIN_MODES = [JOIN_TRACE, JOIN_TIME] as const;
/** One of {@link JOIN_MODES}. */
export type JoinMode = typeof JOIN_MODES[number];

/** Default cap on buffered incomplete groups. */
export const DEFAULT_MAX_PENDING = 256;
/** How long a REALTIME join waits for the rest of a group before dropping it. */
export const REALTIME_JOIN_TIMEOUT_SECONDS = 10;
/** A collect parent's buffer holds at least this many samples... */
export const COLLECT_BUFFER_MIN_SAMPLES = 1024;
/** ...or this many per allowed pending group, whichever is larger. */
export const COLLECT_BUFFER_SAMPLES_PER_PENDING = 16;
/** How long an unclaimed collect sample is kept when the policy has no timeout (plus the settle window). */
export const DEFAULT_COLLECT_RETENTION_SECONDS = 30;

/** The snake_case keys of a join policy dict, in `toDict` order. */
const JOIN_KEYS = ["timeout_seconds", "missing", "max_pending", "mode", "tolerance_ms", "quorum", "collect"];

/** The constructor's camelCase options; every one is optional and defaults as the spec says. */
export interface JoinPolicyInit {
  /** Seconds to wait for the rest of a group; `null` waits forever. Ignored (null) under `missing: "wait"`. */
  readonly timeoutSeconds?: number | null;
  /** What to do with a group that timed out (default `drop`). */
  readonly missing?: MissingPolicy;
  /** Cap on incomplete groups held; sizes the join's working set (default 256). */
  readonly maxPending?: number;
  /** `trace` (default) or `time`. */
  readonly mode?: JoinMode;
  /** Time mode only, required: the most two members' event times may differ, in ms. */
  readonly toleranceMs?: number | null;
  /** Time mode only: the fewest sync parents a timed-out group may still be emitted with; needs a timeout. */
  readonly quorum?: number | null;
  /** Time mode only: `{parent: window_ms}` for high-rate parents delivered as a list of samples. */
  readonly collect?: Readonly<Record<string, number>> | null;
}

/** The serialized form, with the spec's exact keys (`JoinPolicy.to_dict`). */
export interface JoinPolicyDict {
  /** Seconds to wait for the rest of a group; `null` waits forever. */
  readonly timeout_seconds: number | null;
  /** What happens to a group that timed out. */
  readonly missing: MissingPolicy;
  /** Cap on buffered incomplete groups; the oldest is evicted as a drop beyond the working set. */
  readonly max_pending: number;
  /** How groups are formed. */
  readonly mode: JoinMode;
  /** Time mode: the most two members' event times may differ, in ms; `null` in trace mode. */
  readonly tolerance_ms: number | null;
  /** Time mode: the fewest sync parents a timed-out group is emitted with; `null` requires all. */
  readonly quorum: number | null;
  /** Time mode: `{parent: window_ms}` of the collect parents (empty when none). */
  readonly collect: Readonly<Record<string, number>>;
}

type JoinRaw = { readonly [K in keyof JoinPolicyInit]?: unknown };

/** The checked, normalized fields: exactly what a {@link JoinPolicy} holds. */
type JoinFields = Pick<JoinPolicy, keyof JoinPolicyInit>;

function checkCollect(raw: unknown, check: PolicyCheck): Record<string, number> {
  const collect: Record<string, number> = {};
  if (raw === null || raw === undefined) return collect;
  const name = check.name("collect");
  if (!isRecord(raw)) {
    check.fail(
      "collect",
      `${name} must be an object {parent: window_ms}`,
      `pass ${name} as {parent: window_ms}`,
    );
    return collect;
  }
  for (const [parent, windowMs] of Object.entries(raw)) {
    if (parent === "") {
      check.fail("collect", `${name} names an empty parent`, `key ${name} by parent node names`);
    } else if (typeof windowMs !== "number" || !Number.isFinite(windowMs) || windowMs <= 0) {
      check.fail(
        "collect",
        `${name} window for ${JSON.stringify(parent)} must be a positive number of milliseconds, got ${
          JSON.stringify(windowMs) ?? String(windowMs)
        }`,
        `set the ${name} window of ${JSON.stringify(parent)} to a positive number of milliseconds`,
      );
    } else {
      collect[parent] = windowMs;
    }
  }
  return collect;
}

/** Reports tolerance/quorum/collect set on a trace-mode policy, where they mean nothing. */
function checkTraceOnly(raw: JoinRaw, collect: Record<string, number>, check: PolicyCheck): void {
  const stray = [
    ["tolerance_ms", raw.toleranceMs !== undefined && raw.toleranceMs !== null],
    ["quorum", raw.quorum !== undefined && raw.quorum !== null],
    ["collect", Object.keys(collect).length > 0],
  ].filter(([, set]) => set).map(([field]) => check.name(field as string));
  if (stray.length === 0) return;
  check.fail(
    "mode",
    `${stray.join(", ")} only apply to mode "time"`,
    `set ${check.name("mode")} to "time", or remove ${stray.join(", ")}`,
  );
}

function checkTimeMode(raw: JoinRaw, timeoutSeconds: number | null, check: PolicyCheck): void {
  const tolerance = raw.toleranceMs ?? null;
  if (tolerance === null) {
    check.fail(
      "tolerance_ms",
      `mode "time" requires a positive ${check.name("tolerance_ms")}`,
      `set ${
        check.name("tolerance_ms")
      } below the fastest parent's inter-message period (e.g. < 20 for 50 fps)`,
    );
  } else {
    check.number("tolerance_ms", tolerance, { positive: true });
  }
  const quorum = raw.quorum ?? null;
  if (
    quorum !== null && check.number("quorum", quorum, { integer: true, min: 1 }) && timeoutSeconds === null
  ) {
    check.fail(
      "quorum",
      `${check.name("quorum")} requires ${
        check.name("timeout_seconds")
      } (a quorum group is only emitted once the timeout says no more parents are coming)`,
      `set ${check.name("timeout_seconds")} (and ${check.name("missing")} other than "wait"), or remove ${
        check.name("quorum")
      }`,
    );
  }
}

/** Checks every field at once (throwing one ConfigError listing all problems) and normalizes them. */
function checkJoin(raw: JoinRaw, check: PolicyCheck): JoinFields {
  const missing = raw.missing ?? MISSING_DROP;
  const mode = raw.mode ?? JOIN_TRACE;
  const maxPending = raw.maxPending ?? DEFAULT_MAX_PENDING;
  check.oneOf("missing", missing, MISSING_POLICIES);
  check.oneOf("mode", mode, JOIN_MODES);
  check.number("max_pending", maxPending, { integer: true, min: 1 });
  let timeoutSeconds: number | null = null;
  if (
    missing !== MISSING_WAIT && check.number("timeout_seconds", raw.timeoutSeconds ?? null, {
      positive: true,
      nullable: true,
    })
  ) {
    timeoutSeconds = raw.timeoutSeconds as number;
  }
  const collect = checkCollect(raw.collect, check);
  if (mode === JOIN_TRACE) checkTraceOnly(raw, collect, check);
  if (mode === JOIN_TIME) checkTimeMode(raw, timeoutSeconds, check);
  check.throwIfAny();
  return {
    timeoutSeconds,
    missing: missing as MissingPolicy,
    maxPending: maxPending as number,
    mode: mode as JoinMode,
    toleranceMs: (raw.toleranceMs ?? null) as number | null,
    quorum: (raw.quorum ?? null) as number | null,
    collect: Object.freeze(collect),
  };
}

/**
 * A validated join policy. Construction refuses every invalid combination at once with a
 * {@link ConfigError} naming each field and its fix:
 * - `missing` and `mode` must be known values; `max_pending` an integer >= 1; `timeout_seconds` null or > 0;
 * - `missing: "wait"` never times out, so its `timeout_seconds` is null;
 * - time mode requires a positive `tolerance_ms`; `quorum` is an integer >= 1 and requires a timeout;
 *   every `collect` window is a positive number of ms;
 * - `tolerance_ms`, `quorum` and `collect` only apply to time mode.
 *
 * @example
 * ```ts
 * const p = new JoinPolicy({ mode: "time", toleranceMs: 15, timeoutSeconds: 2, quorum: 2 });
 * JoinPolicy.fromDict(p.toDict()); // an equal policy
 * ```
 */
export class JoinPolicy {
  /** Seconds to wait for the rest of a group; `null` waits forever. */
  readonly timeoutSeconds: number | null;
  /** What happens to a group that timed out. */
  readonly missing: MissingPolicy;
  /** Cap on buffered incomplete groups; the oldest is evicted as a drop beyond the working set. */
  readonly maxPending: number;
  /** How groups are formed. */
  readonly mode: JoinMode;
  /** Time mode: the most two members' event times may differ, in ms; `null` in trace mode. */
  readonly toleranceMs: number | null;
  /** Time mode: the fewest sync parents a timed-out group is emitted with; `null` requires all. */
  readonly quorum: number | null;
  /** Time mode: `{parent: window_ms}` of the collect parents (empty when none). */
  readonly collect: Readonly<Record<string, number>>;

  /** A policy of `init`, its defaults for what `init` leaves out; throws {@link ConfigError} when invalid. */
  constructor(init: JoinPolicyInit = {}) {
    const fields = checkJoin(init, new PolicyCheck("JoinPolicy", "init"));
    this.timeoutSeconds = fields.timeoutSeconds;
    this.missing = fields.missing;
    this.maxPending = fields.maxPending;
    this.mode = fields.mode;
    this.toleranceMs = fields.toleranceMs;
    this.quorum = fields.quorum;
    this.collect = fields.collect;
  }

  /**
   * The policy a flow type implies when a node sets none: BATCH waits (completeness matters; bounded by
   * `max_pending`), REALTIME times out after 10 s and drops (a dropped sibling frame must not stall the join).
   * Throws {@link ConfigError} for an unknown flow type.
   */
  static defaultFor(flowType: string): JoinPolicy {
    return isBatchFlow(flowType)
      ? new JoinPolicy({ missing: MISSING_WAIT })
      : new JoinPolicy({ timeoutSeconds: REALTIME_JOIN_TIMEOUT_SECONDS, missing: MISSING_DROP });
  }

  /**
   * Rebuilds a policy from its dict. Absent (or null) keys take their defaults; anything that is not an
   * object, an unknown key and every invalid value are reported together in one {@link ConfigError}.
   */
  static fromDict(d: unknown): JoinPolicy {
    return new JoinPolicy(readCheckedDict("JoinPolicy", d, JOIN_KEYS, checkJoin) as JoinPolicyInit);
  }

  /** The dict with the spec's exact keys and order; `fromDict(toDict())` is an equal policy. */
  toDict(): JoinPolicyDict {
    return {
      timeout_seconds: this.timeoutSeconds,
      missing: this.missing,
      max_pending: this.maxPending,
      mode: this.mode,
      tolerance_ms: this.toleranceMs,
      quorum: this.quorum,
      collect: { ...this.collect },
    };
  }

  /**
   * The most deliveries a join may hold un-acked while it waits for groups to complete: `max_pending`
   * incomplete groups of up to `nbParents - 1` halves each, plus the group being assembled. A join's
   * durables must be provisioned with at least this credit, or an adversarial parent ordering fills the
   * credit with halves that never complete and the join deadlocks (RUN-005).
   */
  workingSet(nbParents: number): number {
    return Math.max(1, this.maxPending) * Math.max(1, nbParents - 1) + 1;
  }

  /** The parents that gate a group's completeness and count toward quorum: every parent but the collect ones. */
  syncParents(parents: readonly string[]): string[] {
    return parents.filter((parent) => !Object.hasOwn(this.collect, parent));
  }

  /** The most samples a collect parent's buffer holds: `max(1024, max_pending × 16)`; beyond it the oldest goes. */
  get collectBufferCapacity(): number {
    return Math.max(COLLECT_BUFFER_MIN_SAMPLES, this.maxPending * COLLECT_BUFFER_SAMPLES_PER_PENDING);
  }

  /** How long a completed time group is held so trailing collect samples can arrive: the largest window, in s. */
  get settleSeconds(): number {
    return Math.max(0, ...Object.values(this.collect)) / 1000;
  }

  /**
   * How long a collect sample no group claimed is kept before it is dropped: the timeout (30 s without one)
   * plus the settle window.
   */
  get collectRetentionSeconds(): number {
    return (this.timeoutSeconds ?? DEFAULT_COLLECT_RETENTION_SECONDS) + this.settleSeconds;
  }
}
