/**
 * The PayloadStore contract (spec backends.payload): where the image bytes are, and how long they must
 * survive.
 *
 * A decrement-only counter per blob loses in three ways: two deliveries to one reader decrement twice, a
 * counter that expires between EXISTS and DECR deletes a blob another reader needs, and a crash between
 * the acknowledgment and the release leaks the blob until its TTL. This contract replaces the counter
 * with obligations: named, idempotent, generation-fenced claims by logical readers.
 *
 * Guarantees every implementation gives (the conformance suite in `tests/conformance/payload/` runs the
 * same stories against each):
 * - A payload is reclaimable only when no obligation names it. A release is idempotent by
 *   (obligation id, generation); one naming an older generation is stale and touches nothing, so it can
 *   never delete a newer object at the same key.
 * - A missing obligation set is never "everyone finished": a release against it reclaims nothing.
 * - Reads are typed: {@link PayloadBytes}, {@link TransientRead} (retry), {@link MissingPayload} (durable
 *   data loss), {@link CorruptPayload} (digest mismatch). A failed read is never an empty payload.
 * - A TTL is an expiry policy or a final safety net, never proof that every consumer finished.
 * - Reconciliation cancels an obligation only where the {@link ObligationLedger} is authoritative for it.
 *
 * @example
 * ```ts
 * const contract = retentionContract({ ttlSeconds: 3600, horizonSeconds: 86400, durableRequired: true,
 *   obligations: ["detector", "intent/pub-1"] });
 * admitRetention(contract); // pinned by obligations: the short TTL is only a backstop
 * ```
 *
 * @module
 */

import { requireCount } from "../core/checks.ts";
import {
  ConfigError,
  Diagnostic,
  IncompatibleProfile,
  TransientFailure,
  UnobservableState,
} from "../core/errors.ts";
import { sha256Hex } from "../wire/sha256.ts";
import { type PayloadCapabilities, retentionShortfall } from "./capabilities.ts";
import type { Observation } from "./outcomes.ts";

/** The obligation family of a publisher's send in flight: `intent/<publication_id>`. */
export const INTENT_OBLIGATION_PREFIX = "intent/";

/**
 * Obligation families a flow's runtime ledger never speaks for (BLOB-13): an archive's pin and a dead
 * letter's pin outlive the run's readers.
 */
export const FOREIGN_OBLIGATION_PREFIXES = ["archive/", "dlq/"] as const;

/** The intent obligation id of a publication: `intent/<publicationId>`. */
export function intentObligationId(publicationId: string): string {
  if (publicationId.length === 0) {
    throw new ConfigError("an intent obligation needs a publication id", "pass the publication's dedup id");
  }
  return `${INTENT_OBLIGATION_PREFIX}${publicationId}`;
}

/** Whether `obligationId` is a publisher's intent (`intent/*`). */
export function isIntentObligation(obligationId: string): boolean {
  return obligationId.startsWith(INTENT_OBLIGATION_PREFIX);
}

/** Whether `obligationId` belongs to a family no runtime ledger is authoritative for (`archive/*`, `dlq/*`). */
export function isForeignObligation(obligationId: string): boolean {
  return FOREIGN_OBLIGATION_PREFIXES.some((prefix) => obligationId.startsWith(prefix));
}

/** The hex SHA-256 of `data`: the digest a ref carries and a read verifies. */
export function payloadDigest(data: Uint8Array): string {
  return sha256Hex(data);
}

/**
 * The store key of a put (WIRE.md `vf-blob-<id>`): `vf-blob-` + the first 32 hex digits of the SHA-256
 * of `{contentId}\n{digest}`, so a put of the same content and bytes lands on the same key; a fresh
 * `vf-blob-<uuid>` for an empty content id.
 */
export function payloadKey(contentId: string, digest: string): string {
  if (contentId === "") return `vf-blob-${crypto.randomUUID()}`;
  return `vf-blob-${payloadDigest(new TextEncoder().encode(`${contentId}\n${digest}`)).slice(0, 32)}`;
}

/**
 * An immutable reference to one stored object (the spec's ImmutablePayloadRef). Only `key` travels on the
 * wire (BlobRef.ref); a reader completes the rest with {@link PayloadStore.refForKey}.
 */
export interface ImmutablePayloadRef {
  /** The store identity the ref belongs to (`memory`, `redis`). */
  readonly store: string;
  /** The store-local key: the wire BlobRef.ref. */
  readonly key: string;
  /** Byte length of the object. */
  readonly size: number;
  /** Hex SHA-256 of the object; `""` when the store keeps no metadata for the key (unverifiable). */
  readonly digest: string;
  /** Ownership generation minted at put; `""` when unknown (such a ref releases against nothing). */
  readonly generation: string;
  /** The logical content identity (event id + producer). */
  readonly contentId: string;
}

/** Constructs an {@link ImmutablePayloadRef}. */
export function payloadRef(
  store: string,
  key: string,
  size: number,
  digest: string,
  generation: string,
  contentId: string,
): ImmutablePayloadRef {
  return Object.freeze({ store, key, size, digest, generation, contentId });
}

/** Throws {@link ConfigError} unless every id is a non-empty string and none is listed twice. */
export function checkObligationIds(ids: readonly string[]): void {
  const seen = new Set<string>();
  for (const id of ids) {
    if (typeof id !== "string" || id.length === 0) {
      throw new ConfigError("an obligation id must be a non-empty string", "name the reader or intent");
    }
    if (seen.has(id)) {
      throw new ConfigError(
        `obligation ${JSON.stringify(id)} is listed twice`,
        "list each reader obligation once (VF_BLOB_READER_IDS has a duplicate)",
        { obligation_id: id },
      );
    }
    seen.add(id);
  }
}

/** Throws {@link ConfigError} unless `deadline` is finite epoch seconds (an obligation's deadline). */
export function checkObligationDeadline(deadline: number): void {
  if (!Number.isFinite(deadline)) {
    throw new ConfigError(
      `an obligation deadline must be finite epoch seconds, got ${deadline}`,
      "pass clock.now() plus the time the reader needs",
    );
  }
}

/** Throws {@link ConfigError} unless `ref` belongs to the store `storeId` names. */
export function checkRefStore(ref: ImmutablePayloadRef, storeId: string): void {
  if (ref.store !== storeId) {
    throw new ConfigError(
      `ref ${ref.key} belongs to store ${JSON.stringify(ref.store)}, not ${JSON.stringify(storeId)}`,
      "read and release a payload through the store that holds it",
      { key: ref.key, store: ref.store },
    );
  }
}

/** `grace` when it is a finite, non-negative orphan grace in seconds; a ConfigError otherwise. */
export function checkOrphanGrace(grace: number): number {
  if (!Number.isFinite(grace) || grace < 0) {
    throw new ConfigError(`orphanGraceSeconds must be a finite, non-negative number, got ${grace}`);
  }
  return grace;
}

/** What a put or acquire whose reply was lost throws: the effect may have happened; a retry is idempotent. */
export function lostPayloadReply(action: string, ref: ImmutablePayloadRef): UnobservableState {
  return new UnobservableState(
    `the store's reply to ${action} ${ref.key} was lost; the ${action} may have taken effect`,
    `retry the ${action}: it is idempotent`,
    { key: ref.key, generation: ref.generation },
  );
}

/** How long an object must survive and who claims it up front. */
export interface RetentionContract {
  /** The store-side expiry backstop, in seconds. */
  readonly ttlSeconds: number;
  /** The recovery/replay horizon the flow promised, in seconds. */
  readonly horizonSeconds: number;
  /** Whether the profile needs the object to survive the store's own failure model (reliable work). */
  readonly durableRequired: boolean;
  /** The logical readers (and the publisher's intent) that claim the object at put. */
  readonly obligations: readonly string[];
}

/** What {@link retentionContract} takes; `obligations` defaults to none. */
export interface RetentionContractInit {
  readonly ttlSeconds: number;
  readonly horizonSeconds: number;
  readonly durableRequired: boolean;
  readonly obligations?: readonly string[];
}

/**
 * A validated {@link RetentionContract}. Throws {@link ConfigError} for a TTL under 1 s, a negative horizon,
 * or an obligation id that is empty or listed twice.
 */
export function retentionContract(init: RetentionContractInit): RetentionContract {
  const obligations = init.obligations ?? [];
  checkObligationIds(obligations);
  return Object.freeze({
    ttlSeconds: requireCount(init.ttlSeconds, "ttl_seconds", 1),
    horizonSeconds: requireCount(init.horizonSeconds, "horizon_seconds"),
    durableRequired: init.durableRequired === true,
    obligations: Object.freeze([...obligations]),
  });
}

/**
 * Admits a retention contract before a byte is written (BLOB-14 step 5, PAY-009): a `durableRequired`
 * contract whose TTL is shorter than the horizon it promises is refused unless obligations pin the object
 * for the whole horizon. Throws {@link IncompatibleProfile} naming both figures.
 */
export function admitRetention(contract: RetentionContract): void {
  if (!contract.durableRequired) return;
  const shortfall = retentionShortfall(
    contract.ttlSeconds,
    contract.horizonSeconds,
    contract.obligations.length > 0,
  );
  if (shortfall === null) return;
  const remedy = "raise VF_BLOB_TTL_SECONDS to the horizon, or set VF_BLOB_READER_IDS so readers pin it";
  throw new IncompatibleProfile(
    shortfall,
    remedy,
    [new Diagnostic("error", IncompatibleProfile.code, null, shortfall, remedy)],
    { ttl_seconds: contract.ttlSeconds, horizon_seconds: contract.horizonSeconds },
  );
}

/** The store took an obligation: it pins `ref` until `deadline` (epoch seconds) or its release. */
export interface DurableReceipt {
  readonly ref: ImmutablePayloadRef;
  readonly obligationId: string;
  /** Epoch seconds until which the obligation holds. */
  readonly deadline: number;
}

/** Constructs a {@link DurableReceipt}. */
export function durableReceipt(
  ref: ImmutablePayloadRef,
  obligationId: string,
  deadline: number,
): DurableReceipt {
  return Object.freeze({ ref, obligationId, deadline });
}

/**
 * What a release did. `stale`: it named an older generation and touched nothing. `unknown`: the store
 * applied (or may have applied) it but the reply was lost; retrying is safe because a release is
 * idempotent by (obligation id, generation). `remaining` is null when the store could not count the set
 * (it is absent, stale, or the reply was lost).
 */
export interface ReleaseReceipt {
  readonly ref: ImmutablePayloadRef;
  readonly obligationId: string;
  readonly remaining: number | null;
  readonly reclaimed: boolean;
  readonly stale: boolean;
  readonly unknown: boolean;
}

/** Constructs a {@link ReleaseReceipt}; a receipt both reclaimed and stale or unknown is a RangeError. */
export function releaseReceipt(
  ref: ImmutablePayloadRef,
  obligationId: string,
  remaining: number | null,
  reclaimed: boolean,
  stale: boolean,
  unknown = false,
): ReleaseReceipt {
  if (reclaimed && (stale || unknown)) {
    throw new RangeError("a release that reclaimed its object was neither stale nor unknown");
  }
  return Object.freeze({ ref, obligationId, remaining, reclaimed, stale, unknown });
}

/** A successful read: the bytes, and whether their digest was checked against the store's record. */
export interface PayloadBytes {
  readonly kind: "bytes";
  readonly ref: ImmutablePayloadRef;
  readonly data: Uint8Array;
  readonly digestVerified: boolean;
}

/** The store was unreachable or slow (the spec's TransientFailure outcome); the bytes may exist. Retry. */
export interface TransientRead {
  readonly kind: "transient";
  readonly ref: ImmutablePayloadRef;
  readonly reason: string;
}

/** The object is gone: durable data loss, terminal for the delivery that needed it. */
export interface MissingPayload {
  readonly kind: "missing";
  readonly ref: ImmutablePayloadRef;
}

/** The bytes do not match the digest recorded at put: corruption, terminal for the delivery. */
export interface CorruptPayload {
  readonly kind: "corrupt";
  readonly ref: ImmutablePayloadRef;
  readonly expectedDigest: string;
  readonly actualDigest: string;
}

/** What a read produced; a `switch` over `kind` must cover all four. */
export type PayloadReadOutcome = PayloadBytes | TransientRead | MissingPayload | CorruptPayload;

/** Constructs a {@link PayloadBytes}. */
export function payloadBytes(
  ref: ImmutablePayloadRef,
  data: Uint8Array,
  digestVerified: boolean,
): PayloadBytes {
  return Object.freeze({ kind: "bytes", ref, data, digestVerified });
}

/** Constructs a {@link TransientRead}. */
export function transientRead(ref: ImmutablePayloadRef, reason: string): TransientRead {
  return Object.freeze({ kind: "transient", ref, reason });
}

/** Constructs a {@link MissingPayload}. */
export function missingPayload(ref: ImmutablePayloadRef): MissingPayload {
  return Object.freeze({ kind: "missing", ref });
}

/** Constructs a {@link CorruptPayload}. */
export function corruptPayload(
  ref: ImmutablePayloadRef,
  expectedDigest: string,
  actualDigest: string,
): CorruptPayload {
  return Object.freeze({ kind: "corrupt", ref, expectedDigest, actualDigest });
}

/** What a reconciliation did, by key: reclaimed, kept, or not judged because something was unreadable. */
export interface ReclamationObservation {
  readonly reclaimed: readonly string[];
  readonly retained: readonly string[];
  readonly unknown: readonly string[];
}

/** Constructs a {@link ReclamationObservation}; each list is sorted. */
export function reclamationObservation(
  reclaimed: readonly string[],
  retained: readonly string[],
  unknown: readonly string[],
): ReclamationObservation {
  return Object.freeze({
    reclaimed: Object.freeze([...reclaimed].sort()),
    retained: Object.freeze([...retained].sort()),
    unknown: Object.freeze([...unknown].sort()),
  });
}

/**
 * What the runtime knows about obligations, for reconciliation: which readers are still required for which
 * refs. A ledger speaks only for the families it is {@link ObligationLedger.authoritative} for; a store
 * never cancels an obligation the ledger is not authoritative for.
 */
export interface ObligationLedger {
  /**
   * Ref key → obligation ids still required. A key the ledger does not list is one it knows nothing
   * about. Throws (UnobservableState) when the ledger cannot be read: nothing may then be reclaimed.
   */
  requiredObligations(): Promise<ReadonlyMap<string, readonly string[]>>;
  /** Whether this ledger may cancel `obligationId` when it does not require it. */
  authoritative(obligationId: string): boolean;
}

/**
 * A put was refused because the store's byte budget is full and it may not evict (backpressure, the
 * durable tier's answer to pressure). Transient: retry once readers have released what they hold.
 */
export class PayloadBudgetExceeded extends TransientFailure {
  static override readonly code: string = "VF_PAYLOAD_BUDGET";
}

/**
 * Where payload bytes live and how long they must survive. I/O methods return promises; each may throw a
 * typed error when the store cannot be reached (TransientFailure) or the call is malformed (ConfigError).
 */
export interface PayloadStore {
  /**
   * Stores `data` under `contract`, attaching its obligations (each until now + the longer of TTL and
   * horizon, so pinned objects live out the horizon), and returns the ref. Throws {@link PayloadBudgetExceeded} when the store refuses the bytes for lack of room.
   */
  put(data: Uint8Array, contentId: string, contract: RetentionContract): Promise<ImmutablePayloadRef>;
  /** The bytes, or why not: never an empty payload for a failed read. */
  read(ref: ImmutablePayloadRef): Promise<PayloadReadOutcome>;
  /**
   * Claims `ref` for `obligationId` until `deadline` (epoch seconds); idempotent (a second acquire keeps
   * the later deadline). The object's life extends to the deadline.
   */
  acquireObligation(
    ref: ImmutablePayloadRef,
    obligationId: string,
    deadline: number,
  ): Promise<DurableReceipt>;
  /** Extends a held obligation to `deadline`; throws ResourceUnavailable when it is not held. */
  renewObligation(ref: ImmutablePayloadRef, obligationId: string, deadline: number): Promise<DurableReceipt>;
  /**
   * Ends `obligationId`'s claim on `ref`, after the reader's settlement was confirmed
   * (`completionReceipt` names it). Reclaims the object when this empties its obligation set.
   */
  releaseObligation(
    ref: ImmutablePayloadRef,
    obligationId: string,
    completionReceipt: string,
  ): Promise<ReleaseReceipt>;
  /**
   * Reconciles every stored object against `ledger` (BLOB-14 step 4); `operationId` labels the pass. For a
   * key the ledger lists, the list is the whole truth: every other obligation the ledger is authoritative
   * for is cancelled (PAY-006, PAY-012). For a key it does not list, only `intent/*` obligations are
   * cancelled (PAY-013): reader obligations belong to readers the ledger may not see. An object is kept
   * while an obligation remains or the ledger requires anything of it; it is reclaimed when the pass
   * emptied the set it had and, with no set at all, only once older than the store's orphan grace
   * (PAY-007). Keys the store could not judge are reported unknown, never reclaimed.
   */
  reconcile(ledger: ObligationLedger, operationId: string): Promise<ReclamationObservation>;
  /** Every stored object's ref, or Unknown when the store could not be listed (never an empty list). */
  inventory(): Promise<Observation<readonly ImmutablePayloadRef[]>>;
  /**
   * The ref for a wire key, completed from the store's metadata (size, digest, generation as recorded at
   * put). Without metadata for the key the ref has an empty digest and generation: readable,
   * unverifiable, released against nothing.
   */
  refForKey(key: string): Promise<ImmutablePayloadRef>;
  /** What this store guarantees. */
  capabilities(): Promise<PayloadCapabilities>;
}
