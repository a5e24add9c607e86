/**
 * Truthful outcome types shared by every backend contract (spec backends.outcomes).
 *
 * A read that failed is {@link Unknown}, never zero, never empty, never complete; a publication whose
 * receipt was lost is {@link PublicationUnknown}, never "accepted"; a settlement that was sent but not
 * confirmed is {@link SettleUnknown}. Every choice is a union tagged by `kind`, so a `switch` that forgets
 * a branch does not compile, and no helper here turns an Unknown into a default value: a decision either
 * branches ({@link match}, {@link isKnown}) or demands the value and fails loudly ({@link requireKnown}).
 *
 * @example
 * ```ts
 * const reads: Observation<number>[] = [known(0), unknown("timeout", undefined, "broker silent for 5 s")];
 * const drained = reads.map((pending) =>
 *   match(pending, {
 *     known: (count) => count === 0,
 *     unknown: () => false, // cannot tell: never declare the drain complete
 *   })
 * );
 * console.log(drained); // [true, false]
 * ```
 *
 * @module
 */

import { UnobservableState } from "../core/errors.ts";
import { type Clock, systemClock } from "./clock.ts";

/**
 * Machine-readable categories of why an observation could not be made. The first five are the spec's
 * core set; the rest name the read that failed (a missing object, an unread inventory, an API refusal,
 * an observation window that lapsed).
 */
export const UNKNOWN_REASONS = [
  "timeout",
  "auth",
  "malformed",
  "unreachable",
  "unsupported",
  "missing",
  "unread",
  "api",
  "window",
] as const;
/** One of {@link UNKNOWN_REASONS}. */
export type UnknownReason = typeof UNKNOWN_REASONS[number];

/** A successful observation: the value, when it was seen, and the provider's version of it. */
export interface Known<T> {
  /** Always `known`: the observation was made. */
  readonly kind: "known";
  /** What was observed. */
  readonly value: T;
  /** Monotonic seconds ({@link Clock.monotonic}) when the observation was made. */
  readonly observedAt: number;
  /** The provider's version of the observed state (a resourceVersion, a ledger version); null if none. */
  readonly generation: string | null;
}

/** An observation that could not be made, and why. It carries no value, so none can be read from it. */
export interface Unknown {
  /** Always `unknown`: the observation could not be made. */
  readonly kind: "unknown";
  /** Short machine-readable category. */
  readonly reason: UnknownReason;
  /** Monotonic seconds when the attempt was given up. */
  readonly observedAt: number;
  /** The human-readable why. */
  readonly detail: string;
}

/** What a read of `T` produced: the value, or the truthful statement that it could not be read. */
export type Observation<T> = Known<T> | Unknown;

/** A {@link Known} stamped with `clock`'s monotonic time. */
export function known<T>(value: T, clock: Clock = systemClock, generation: string | null = null): Known<T> {
  return Object.freeze({ kind: "known", value, observedAt: clock.monotonic(), generation });
}

/** An {@link Unknown} stamped with `clock`'s monotonic time. */
export function unknown(reason: UnknownReason, clock: Clock = systemClock, detail = ""): Unknown {
  return Object.freeze({ kind: "unknown", reason, observedAt: clock.monotonic(), detail });
}

/** Narrows an observation to {@link Known}. */
export function isKnown<T>(observation: Observation<T>): observation is Known<T> {
  return observation.kind === "known";
}

/** Branches on an observation; both branches are required, so the Unknown case cannot be forgotten. */
export function match<T, R>(
  observation: Observation<T>,
  branches: {
    readonly known: (value: T, observation: Known<T>) => R;
    readonly unknown: (observation: Unknown) => R;
  },
): R {
  return observation.kind === "known"
    ? branches.known(observation.value, observation)
    : branches.unknown(observation);
}

/** Applies `f` to a known value, keeping its time and generation; an Unknown passes through unchanged. */
export function mapKnown<T, U>(observation: Observation<T>, f: (value: T) => U): Observation<U> {
  if (observation.kind === "unknown") return observation;
  return Object.freeze({ ...observation, value: f(observation.value) });
}

/**
 * The observed value, for a decision that cannot proceed without it. Throws {@link UnobservableState}
 * naming `what` and the reason, so the caller retries the decision instead of guessing.
 */
export function requireKnown<T>(observation: Observation<T>, what: string): T {
  if (observation.kind === "known") return observation.value;
  const detail = observation.detail ? `: ${observation.detail}` : "";
  throw new UnobservableState(
    `${what} could not be observed (${observation.reason}${detail})`,
    "retry once the backend answers; the decision that needed this read was not made",
    { what, reason: observation.reason, detail: observation.detail },
  );
}

/**
 * A one-line rendering for logs and `explain`: the value through `render`, or `unknown (reason: detail)`.
 * It returns text, never a substitute value, so it cannot feed a decision.
 */
export function describeObservation<T>(
  observation: Observation<T>,
  render: (value: T) => string = (value) => JSON.stringify(value) ?? String(value),
): string {
  if (observation.kind === "known") return render(observation.value);
  return observation.detail
    ? `unknown (${observation.reason}: ${observation.detail})`
    : `unknown (${observation.reason})`;
}

/** Durability boundary of a publication the in-memory broker accepted: it lives as long as the process. */
export const DURABILITY_MEMORY = "memory";

/** The backend durably took the envelope; `duplicate` when it deduplicated a retry of the same id. */
export interface Accepted {
  readonly kind: "accepted";
  readonly publicationId: string;
  /** The stream sequence the backend assigned; null when it assigns none. */
  readonly sequence: number | null;
  readonly duplicate: boolean;
  /** The durability boundary the envelope crossed (e.g. {@link DURABILITY_MEMORY}). */
  readonly durabilityBoundary: string;
}

/** The backend definitely did not take the envelope; `retryable` says whether waiting can help. */
export interface Rejected {
  readonly kind: "rejected";
  readonly publicationId: string;
  readonly reason: string;
  readonly retryable: boolean;
}

/** A response was lost or a deadline expired after the send: the envelope may be stored. */
export interface PublicationUnknown {
  readonly kind: "publication_unknown";
  readonly publicationId: string;
  readonly reason: string;
}

/** The backend keeps no queryable history for this id: only the runtime's own intent can reconcile it. */
export interface PublicationUnresolvable {
  readonly kind: "publication_unresolvable";
  readonly publicationId: string;
  readonly reason: string;
}

/** What happened to a publication. */
export type PublicationOutcome = Accepted | Rejected | PublicationUnknown | PublicationUnresolvable;

/** Constructs an {@link Accepted}. */
export function accepted(
  publicationId: string,
  sequence: number | null,
  duplicate: boolean,
  durabilityBoundary: string,
): Accepted {
  return Object.freeze({ kind: "accepted", publicationId, sequence, duplicate, durabilityBoundary });
}

/** Constructs a {@link Rejected}. */
export function rejected(publicationId: string, reason: string, retryable: boolean): Rejected {
  return Object.freeze({ kind: "rejected", publicationId, reason, retryable });
}

/** Constructs a {@link PublicationUnknown}. */
export function publicationUnknown(publicationId: string, reason: string): PublicationUnknown {
  return Object.freeze({ kind: "publication_unknown", publicationId, reason });
}

/** Constructs a {@link PublicationUnresolvable}. */
export function publicationUnresolvable(publicationId: string, reason: string): PublicationUnresolvable {
  return Object.freeze({ kind: "publication_unresolvable", publicationId, reason });
}

/**
 * The settlement reached the broker and was confirmed. Settlement outcomes are generic over the delivery
 * token type, which the messaging contract defines, so this module depends on no contract above it.
 */
export interface SettleConfirmed<Token> {
  readonly kind: "settle_confirmed";
  readonly token: Token;
  readonly settlementId: string;
}

/** The settlement was sent but not confirmed: the delivery may still be leased or may redeliver. */
export interface SettleUnknown<Token> {
  readonly kind: "settle_unknown";
  readonly token: Token;
  readonly reason: string;
}

/** Refused before reaching the broker: a newer delivery attempt owns this logical message. */
export interface SettleStale<Token> {
  readonly kind: "settle_stale";
  readonly token: Token;
  readonly currentAttempt: number;
  readonly currentGeneration: string;
}

/** What happened to a settlement. */
export type SettleOutcome<Token> = SettleConfirmed<Token> | SettleUnknown<Token> | SettleStale<Token>;

/** Constructs a {@link SettleConfirmed}. */
export function settleConfirmed<Token>(token: Token, settlementId: string): SettleConfirmed<Token> {
  return Object.freeze({ kind: "settle_confirmed", token, settlementId });
}

/** Constructs a {@link SettleUnknown}. */
export function settleUnknown<Token>(token: Token, reason: string): SettleUnknown<Token> {
  return Object.freeze({ kind: "settle_unknown", token, reason });
}

/** Constructs a {@link SettleStale}. */
export function settleStale<Token>(
  token: Token,
  currentAttempt: number,
  currentGeneration: string,
): SettleStale<Token> {
  return Object.freeze({ kind: "settle_stale", token, currentAttempt, currentGeneration });
}

/**
 * What a teardown did. `complete` is false when anything owned could not be confirmed removed, including
 * when the inventory itself could not be read, which is not "nothing to remove".
 */
export interface CleanupObservation {
  readonly complete: boolean;
  readonly removed: readonly string[];
  readonly remaining: readonly string[];
  readonly reason: string;
}

/**
 * Constructs a {@link CleanupObservation}. Throws a RangeError for the contradiction a teardown must never
 * report: complete while something remains.
 */
export function cleanupObservation(
  complete: boolean,
  removed: readonly string[],
  remaining: readonly string[],
  reason = "",
): CleanupObservation {
  if (complete && remaining.length > 0) {
    throw new RangeError(`a cleanup cannot be complete while ${remaining.length} resource(s) remain`);
  }
  return Object.freeze({
    complete,
    removed: Object.freeze([...removed]),
    remaining: Object.freeze([...remaining]),
    reason,
  });
}
