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
 * beside the node's other durable facts. Every write is one compare-and-swap, so of two writers marking
 * the same key exactly one reports it as newly marked.
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

/** How long a sink's effect marker is kept: 24 hours, the reviewed default. */
export const EFFECT_RETENTION_SECONDS = 86_400;

/** Where {@link LedgerIdempotencyStore} keeps its markers in the store by default. */
export const EFFECT_KEY_PREFIX = "vf/effects/";

/** The `format` field of a marker document. */
export const EFFECT_MARKER_FORMAT = 1;

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

/** Options of a {@link LedgerIdempotencyStore}. */
export interface LedgerIdempotencyStoreOptions {
  /** How long a marker is kept, in seconds (above 0); {@link EFFECT_RETENTION_SECONDS} by default. */
  readonly retentionSeconds?: number;
  /** Wall time for marking and expiry; the system clock by default. */
  readonly clock?: Clock;
  /** Key prefix of the markers; {@link EFFECT_KEY_PREFIX} by default. */
  readonly prefix?: string;
}

interface MarkerDocument {
  readonly format: number;
  readonly key: string;
  /** Epoch seconds the effect was marked. */
  readonly marked_at: number;
  /** Epoch seconds from which the marker no longer counts. */
  readonly expires_at: number;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * Effect markers in a {@link RuntimeStore} with a retention. An expired marker reads as not seen and is
 * replaced by the next mark; {@link sweep} removes expired markers. A read that fails, or a marker document
 * that is not one, throws {@link UnobservableState}: "seen" is never guessed.
 */
export class LedgerIdempotencyStore implements IdempotencyStore {
  /** How long a marker is kept, in seconds. */
  readonly retentionSeconds: number;
  /** Key prefix of the markers. */
  readonly prefix: string;
  readonly #store: RuntimeStore;
  readonly #clock: Clock;

  /** Throws ConfigError for a retention that is not a positive finite number. */
  constructor(store: RuntimeStore, options: LedgerIdempotencyStoreOptions = {}) {
    const retention = options.retentionSeconds ?? EFFECT_RETENTION_SECONDS;
    if (!Number.isFinite(retention) || retention <= 0) {
      throw new ConfigError(
        `effect retention must be a positive number of seconds, got ${retention}`,
        `use the planner's effect_retention_seconds (default ${EFFECT_RETENTION_SECONDS})`,
        { retention_seconds: retention },
      );
    }
    this.retentionSeconds = retention;
    this.prefix = options.prefix ?? EFFECT_KEY_PREFIX;
    this.#store = store;
    this.#clock = options.clock ?? systemClock;
  }

  async seen(key: string): Promise<boolean> {
    const storeKey = this.prefix + key;
    return this.#live(storeKey, await this.#store.get(storeKey));
  }

  async mark(key: string): Promise<boolean> {
    const storeKey = this.prefix + key;
    for (let attempt = 0; attempt < MARK_ATTEMPTS; attempt++) {
      const entry = await this.#store.get(storeKey);
      if (this.#live(storeKey, entry)) return false;
      const now = this.#clock.now();
      const marker: MarkerDocument = {
        format: EFFECT_MARKER_FORMAT,
        key,
        marked_at: now,
        expires_at: now + this.retentionSeconds,
      };
      const expected = entry.kind === "present" ? entry.version : null;
      if (await this.#store.cas(storeKey, expected, encoder.encode(JSON.stringify(marker)))) return true;
    }
    throw new UnobservableState(
      `marking effect ${key} lost ${MARK_ATTEMPTS} compare-and-swap rounds in a row`,
      "another writer keeps replacing this marker; retry the mark, and check that one sink replica owns the key",
      { key, attempts: MARK_ATTEMPTS },
    );
  }

  /** Removes every expired marker under the prefix; resolves with how many this call removed. */
  async sweep(): Promise<number> {
    let removed = 0;
    for (const record of await this.#store.scan(this.prefix)) {
      const expired = !this.#liveDocument(record.key, record.value);
      if (expired && await this.#store.delete(record.key, record.version)) removed++;
    }
    return removed;
  }

  #live(storeKey: string, entry: StoreEntry): boolean {
    return entry.kind === "present" && this.#liveDocument(storeKey, entry.value);
  }

  #liveDocument(storeKey: string, bytes: Uint8Array): boolean {
    return this.#clock.now() < parseMarker(storeKey, bytes).expires_at;
  }
}

function parseMarker(storeKey: string, bytes: Uint8Array): MarkerDocument {
  let document: unknown;
  try {
    document = JSON.parse(decoder.decode(bytes));
  } catch {
    document = null;
  }
  const marker = document as Partial<MarkerDocument> | null;
  if (
    marker === null || typeof marker !== "object" || marker.format !== EFFECT_MARKER_FORMAT ||
    typeof marker.expires_at !== "number" || !Number.isFinite(marker.expires_at)
  ) {
    throw new UnobservableState(
      `the effect marker ${JSON.stringify(storeKey)} is not a marker document`,
      "something other than videoflow wrote under the effect prefix; remove the key, or give the idempotency " +
        "store a prefix of its own",
      { key: storeKey, reason: "malformed" },
    );
  }
  return marker as MarkerDocument;
}
