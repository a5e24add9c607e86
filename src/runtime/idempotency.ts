/**
 * Sink-side idempotency (spec runtime.idempotency, RUN-017): effect markers that let a consumer skip an
 * effect it already applied when the broker redelivers a message or a restarted worker replays it, on top
 * of at-least-once delivery. A consumer opts in with `idempotent: true`; the task asks {@link
 * IdempotencyStore.seen} before `consume` and calls {@link IdempotencyStore.mark} after it succeeded.
 *
 * A marker is evidence that this runtime applied the effect; it never certifies exactly-once on its own: a
 * crash between the effect and the mark repeats the effect, and a marker is kept only
 * {@link EFFECT_RETENTION_SECONDS} (less than the dead-letter replay horizon; the planner compares the
 * two). Only a sink that keys its external effect itself (`effect_guarantee = 'idempotent_key'`, keyed by
 * `ctx.inputKey`) gives one logical effect.
 *
 * {@link LedgerIdempotencyStore} keeps the markers in a {@link RuntimeStore} (memory, file or Redis),
 * beside the node's other durable facts, grouped into {@link EFFECT_MARKER_SHARDS} shard documents by the
 * SHA-256 of their key: a long run holds at most that many documents of markers, whatever its item count,
 * and every write of a shard drops the markers in it whose retention has passed, so what the markers take
 * is bounded by the retention (under 100 bytes a marker on disk), not by the run's length. Every write is one
 * compare-and-swap of the key's shard, so of two writers marking the same key exactly one reports it as
 * newly marked. A ledger written before the shards holds one legacy document per key, under the prefix
 * and the key itself ({@link LEGACY_MARKER_FORMAT}); those are still read, and swept once expired, so a
 * run resumed after an upgrade applies no effect its previous version marked.
 *
 * @example
 * ```ts
 * const effects = new LedgerIdempotencyStore(await openRuntimeStore("file://.videoflow"));
 * const key = idempotencyKey("flow-A", "sink", messageId);
 * if (!(await effects.seen(key))) {
 *   await writeRow(record);
 *   await effects.mark(key);
 * }
 * ```
 *
 * @module
 */

import { type Clock, systemClock } from "../backends/clock.ts";
import type { RuntimeStore, StoreEntry } from "../backends/runtime_store.ts";
import { ConfigError, UnobservableState } from "../core/errors.ts";
import { sinkIdempotencyKey } from "../wire/identities.ts";
import { sha256Hex } from "../wire/sha256.ts";

/** How long a sink's effect marker is kept: 24 hours, the reviewed default. */
export const EFFECT_RETENTION_SECONDS = 86_400;

/** Where {@link LedgerIdempotencyStore} keeps its markers in the store by default. */
export const EFFECT_KEY_PREFIX = "vf/effects/";

/** The `format` field of a marker shard document. */
export const EFFECT_MARKER_FORMAT = 2;

/**
 * The `format` field of a marker written by the version before the shards: one document per key, at the
 * prefix followed by the key, `{format, key, marked_at, expires_at}`. Only read (and swept) now.
 */
export const LEGACY_MARKER_FORMAT = 1;

/**
 * How many shard documents the markers are spread over: a key's shard is the first three hex digits of its
 * SHA-256. Fixed, so every writer of a ledger finds a key in the same shard.
 */
export const EFFECT_MARKER_SHARDS = 4096;

const SHARD_DIGITS = 3;
/** Hex digits of a key's SHA-256 that name it: its shard's, then the rest of the first 128 bits. */
const DIGEST_DIGITS = 32;

/** Compare-and-swap rounds a mark tries before it reports the outcome as unobservable. */
const MARK_ATTEMPTS = 8;

/**
 * A sink's idempotency key for one message: `vf-idem-` + the SHA-256 hex of `{flow}:{node}:{message_id}`
 * (WIRE.md identities), the same in every runtime of the protocol.
 */
export const idempotencyKey: (flowId: string, node: string, messageId: string) => string = sinkIdempotencyKey;

/** The check/mark contract a consumer task holds. */
export interface IdempotencyStore {
  /** Whether the effect keyed `key` was marked applied and its marker is still kept. */
  seen(key: string): Promise<boolean>;
  /** Marks the effect keyed `key` applied; true when this call marked it, false when it already was. */
  mark(key: string): Promise<boolean>;
}

/**
 * A marker retention: `seconds`, or {@link EFFECT_RETENTION_SECONDS} when undefined. Throws ConfigError
 * for one that is not a positive finite number.
 */
export function effectRetention(seconds: number | undefined): number {
  const retention = seconds ?? EFFECT_RETENTION_SECONDS;
  if (!Number.isFinite(retention) || retention <= 0) {
    throw new ConfigError(
      `effect retention must be a positive number of seconds, got ${retention}`,
      `use the planner's effect_retention_seconds (default ${EFFECT_RETENTION_SECONDS})`,
      { retention_seconds: retention },
    );
  }
  return retention;
}

/** Options of a {@link LedgerIdempotencyStore}. */
export interface LedgerIdempotencyStoreOptions {
  /** How long a marker is kept, in seconds (above 0); {@link EFFECT_RETENTION_SECONDS} by default. */
  readonly retentionSeconds?: number;
  /** Wall time for marking and expiry; the system clock by default. */
  readonly clock?: Clock;
  /** Key prefix of the marker shards; {@link EFFECT_KEY_PREFIX} by default. */
  readonly prefix?: string;
}

/** One shard of markers: each marker's name with the epoch seconds from which it no longer counts. */
interface ShardDocument {
  readonly format: number;
  readonly markers: Readonly<Record<string, number>>;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * Effect markers in a {@link RuntimeStore} with a retention. An expired marker reads as not seen and is
 * replaced by the next mark; each write of a shard leaves out its expired markers, and {@link sweep} removes
 * them from every shard. A read that fails, or a shard document that is not one, throws
 * {@link UnobservableState}: "seen" is never guessed.
 */
export class LedgerIdempotencyStore implements IdempotencyStore {
  /** How long a marker is kept, in seconds. */
  readonly retentionSeconds: number;
  /** Key prefix of the marker shards. */
  readonly prefix: string;
  readonly #store: RuntimeStore;
  readonly #clock: Clock;

  /** Throws ConfigError for a retention that is not a positive finite number. */
  constructor(store: RuntimeStore, options: LedgerIdempotencyStoreOptions = {}) {
    this.retentionSeconds = effectRetention(options.retentionSeconds);
    this.prefix = options.prefix ?? EFFECT_KEY_PREFIX;
    this.#store = store;
    this.#clock = options.clock ?? systemClock;
  }

  /** The store key of the shard that holds `key`'s marker. */
  shardOf(key: string): string {
    return this.#place(key).shardKey;
  }

  /**
   * Where `key`'s marker is kept: its shard (the first three hex digits of its SHA-256) and its name there
   * (the next 29, the first 128 bits in all, so no two keys of a run share a marker).
   */
  markerName(key: string): string {
    return this.#place(key).name;
  }

  #place(key: string): { shardKey: string; name: string } {
    const digest = sha256Hex(key);
    return {
      shardKey: this.prefix + digest.slice(0, SHARD_DIGITS),
      name: digest.slice(SHARD_DIGITS, DIGEST_DIGITS),
    };
  }

  async seen(key: string): Promise<boolean> {
    const { shardKey, name } = this.#place(key);
    const markers = markersOf(shardKey, await this.#store.get(shardKey));
    return this.#clock.now() < (markers.get(name) ?? -Infinity) || await this.#legacyLive(key);
  }

  async mark(key: string): Promise<boolean> {
    const { shardKey, name } = this.#place(key);
    if (await this.#legacyLive(key)) return false;
    for (let attempt = 0; attempt < MARK_ATTEMPTS; attempt++) {
      const entry = await this.#store.get(shardKey);
      const now = this.#clock.now();
      const markers = markersOf(shardKey, entry);
      if (now < (markers.get(name) ?? -Infinity)) return false;
      const kept = liveMarkers(markers, now);
      kept.set(name, now + this.retentionSeconds);
      const expected = entry.kind === "present" ? entry.version : null;
      if (await this.#store.cas(shardKey, expected, shardBytes(kept))) return true;
    }
    throw new UnobservableState(
      `marking effect ${key} lost ${MARK_ATTEMPTS} compare-and-swap rounds in a row`,
      "another writer keeps replacing this marker's shard; retry the mark, and check that one sink replica owns " +
        "the key",
      { key, attempts: MARK_ATTEMPTS },
    );
  }

  /**
   * Whether the legacy marker of `key` (one document at the prefix and the key, written before the shards)
   * is there and still counts. A shard document at that key (a key that is itself a shard's name) is none.
   */
  async #legacyLive(key: string): Promise<boolean> {
    const storeKey = this.prefix + key;
    const entry = await this.#store.get(storeKey);
    if (entry.kind === "absent") return false;
    const marker = parseMarkerDocument(storeKey, entry.value);
    return marker.kind === "legacy" && this.#clock.now() < marker.expiresAt;
  }

  /**
   * Removes every expired marker under the prefix, and a shard left empty (an expired legacy marker too);
   * resolves with how many markers this call removed. A shard another writer changed meanwhile is left to
   * that writer, which drops its expired markers itself. Safe at any time: an expired marker already reads
   * as not seen, so removing it changes no answer of {@link seen} or {@link mark}.
   */
  async sweep(): Promise<number> {
    let removed = 0;
    for (const record of await this.#store.scan(this.prefix)) {
      const document = parseMarkerDocument(record.key, record.value);
      if (document.kind === "legacy") {
        const expired = document.expiresAt <= this.#clock.now();
        if (expired && await this.#store.delete(record.key, record.version)) removed++;
        continue;
      }
      const markers = document.markers;
      const kept = liveMarkers(markers, this.#clock.now());
      const expired = markers.size - kept.size;
      if (expired === 0) continue;
      const written = kept.size === 0
        ? await this.#store.delete(record.key, record.version)
        : await this.#store.cas(record.key, record.version, shardBytes(kept));
      if (written) removed += expired;
    }
    return removed;
  }
}

/** The markers of a shard entry; none for an absent shard. */
function markersOf(shardKey: string, entry: StoreEntry): ReadonlyMap<string, number> {
  if (entry.kind === "absent") return new Map();
  const document = parseMarkerDocument(shardKey, entry.value);
  if (document.kind === "shard") return document.markers;
  throw malformed(shardKey);
}

/** The markers whose retention has not passed at `now`. */
function liveMarkers(markers: ReadonlyMap<string, number>, now: number): Map<string, number> {
  return new Map([...markers].filter(([, expiresAt]) => now < expiresAt));
}

function shardBytes(markers: ReadonlyMap<string, number>): Uint8Array {
  const document: ShardDocument = { format: EFFECT_MARKER_FORMAT, markers: Object.fromEntries(markers) };
  return encoder.encode(JSON.stringify(document));
}

/** A document under the effect prefix: a shard's markers, or one legacy marker's expiry. */
type MarkerDocument =
  | { readonly kind: "shard"; readonly markers: ReadonlyMap<string, number> }
  | { readonly kind: "legacy"; readonly expiresAt: number };

const isExpiry = (value: unknown): value is number => typeof value === "number" && Number.isFinite(value);

/** @throws UnobservableState when `bytes` are neither a shard document nor a legacy marker. */
function parseMarkerDocument(key: string, bytes: Uint8Array): MarkerDocument {
  let document: unknown;
  try {
    document = JSON.parse(decoder.decode(bytes));
  } catch {
    document = null;
  }
  if (document === null || typeof document !== "object") throw malformed(key);
  const fields = document as Record<string, unknown>;
  if (fields.format === LEGACY_MARKER_FORMAT && isExpiry(fields.expires_at)) {
    return { kind: "legacy", expiresAt: fields.expires_at };
  }
  const markers = fields.markers;
  if (
    fields.format !== EFFECT_MARKER_FORMAT || markers === null || typeof markers !== "object" ||
    Array.isArray(markers) || !Object.values(markers).every(isExpiry)
  ) {
    throw malformed(key);
  }
  return { kind: "shard", markers: new Map(Object.entries(markers as Record<string, number>)) };
}

function malformed(key: string): UnobservableState {
  return new UnobservableState(
    `the effect marker document ${JSON.stringify(key)} is neither a marker shard nor a legacy marker`,
    "something other than videoflow wrote under the effect prefix; remove the key, or give the idempotency " +
      "store a prefix of its own",
    { key, reason: "malformed" },
  );
}
