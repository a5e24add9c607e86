/**
 * The codec-facing blob store over a PayloadStore (spec backends.payload_bridge), and the offload rule the
 * codec applies with it (WIRE.md "Payload offload").
 *
 * The codec sees the small RFC 0002 interface, {@link BlobStore}: a put returns the wire key, a get returns
 * bytes or throws. Behind it {@link PayloadStoreBlobBridge} translates:
 * - a put becomes {@link PayloadStore.put} under a {@link RetentionContract} naming the reader obligations
 *   acquired up front (BLOB-14 step 1, `VF_BLOB_READER_IDS`) plus the publisher's `intent/<publication_id>`
 *   for the send in flight; the ref of the last put is kept so the messenger can release that intent once
 *   the publication's outcome is known. With no reader ids the object is TTL-only: no obligations, not
 *   even the intent, because a lone intent released on the PubAck would reclaim an object its
 *   unidentified readers have yet to fetch (ENV-12);
 * - a read's typed outcome becomes an error the delivery ladder understands: {@link TransientFailure}
 *   (retry, never malformed bytes, BLOB-15), {@link DecodeError} for a missing or corrupt object (poison:
 *   dead-lettered with a VF-Error naming the ref and the reason);
 * - `release` is a no-op: obligations are released by reader id ({@link PayloadStoreBlobBridge.releaseReader})
 *   after a confirmed settlement, which is the messenger's decision.
 *
 * @example
 * ```ts
 * import { MemoryPayloadStore } from "./memory/payload.ts";
 * const bridge = new PayloadStoreBlobBridge(new MemoryPayloadStore(), {
 *   obligations: ["detector"], horizonSeconds: 3600, durableRequired: false,
 *   contentId: () => "camera:e1", intent: () => "intent/camera:1:1",
 * });
 * const frame = new Uint8Array(600 * 1024);
 * const blobRef = await offloadPayload("videoflow.v1.Frame", frame, bridge);
 * console.log(blobRef?.size); // 614400
 * ```
 *
 * @module
 */

import { wholeNumberFromText } from "../core/variables.ts";
import { ConfigError, DecodeError, TransientFailure } from "../core/errors.ts";
import { BlobRef } from "../wire/value.ts";
import {
  checkObligationIds,
  type ImmutablePayloadRef,
  type PayloadStore,
  type ReleaseReceipt,
  retentionContract,
} from "./payload.ts";

/** Payloads larger than this many bytes leave the envelope for the blob store (512 KiB). */
export const DEFAULT_MAX_INLINE_PAYLOAD_BYTES = 512 * 1024;

/** The environment variable that overrides {@link DEFAULT_MAX_INLINE_PAYLOAD_BYTES}. */
export const MAX_INLINE_PAYLOAD_ENV = "VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES";

/** The offload TTL of a realtime flow's payloads, in seconds (BLOB-7). */
export const REALTIME_BLOB_TTL_SECONDS = 3600;

/** The offload TTL of a batch flow's payloads, in seconds (BLOB-7). */
export const BATCH_BLOB_TTL_SECONDS = 86400;

/**
 * The inline threshold `env` sets through {@link MAX_INLINE_PAYLOAD_ENV}, else the default. Pure: the
 * caller passes the environment record (a worker without env permission passes what it was handed).
 * Throws {@link ConfigError} for a value that is not a non-negative integer.
 */
export function maxInlinePayloadBytes(env: Readonly<Record<string, string | undefined>>): number {
  const text = env[MAX_INLINE_PAYLOAD_ENV];
  if (text === undefined || text === "") return DEFAULT_MAX_INLINE_PAYLOAD_BYTES;
  return wholeNumberFromText(
    MAX_INLINE_PAYLOAD_ENV,
    text.trim(),
    0,
    String(DEFAULT_MAX_INLINE_PAYLOAD_BYTES),
    `or unset it for the ${DEFAULT_MAX_INLINE_PAYLOAD_BYTES}-byte default`,
  );
}

/**
 * The blob store interface the wire codec's offload path calls (RFC 0002): keys in, bytes out, errors
 * typed for the delivery ladder.
 */
export interface BlobStore {
  /** Stores `data`; resolves to the opaque key {@link BlobStore.get} resolves later. */
  put(data: Uint8Array, ttlSeconds?: number): Promise<string>;
  /** Stores `data` expecting `readers` downstream reads (BLOB-5); a store may ignore the count. */
  putWithReaders(data: Uint8Array, readers: number, ttlSeconds?: number): Promise<string>;
  /** The bytes of `key`; throws a TransientFailure (retry) or a DecodeError (poison) when it cannot. */
  get(key: string): Promise<Uint8Array>;
  /** One downstream reader is finished with `key` (BLOB-6). */
  release(key: string): Promise<void>;
}

/** How {@link offloadPayload} stores bytes that leave the envelope. */
export interface OffloadOptions {
  /** The inline threshold (default {@link DEFAULT_MAX_INLINE_PAYLOAD_BYTES}). */
  readonly maxInlineBytes?: number;
  /** RFC 0002 reader count: `putWithReaders` when given, else `put` (TTL-only). */
  readonly readers?: number | null;
  /** The offload TTL (default {@link REALTIME_BLOB_TTL_SECONDS}). */
  readonly ttlSeconds?: number;
}

/**
 * What the codec does with an encoded payload of `payloadType`: null when it stays inline (at most the
 * threshold), else the {@link BlobRef} the envelope carries instead, after the bytes are stored. Throws
 * {@link ConfigError} when the payload must leave the envelope and no blob store is configured.
 */
export async function offloadPayload(
  payloadType: string,
  data: Uint8Array,
  store: BlobStore | null,
  options: OffloadOptions = {},
): Promise<BlobRef | null> {
  const threshold = options.maxInlineBytes ?? DEFAULT_MAX_INLINE_PAYLOAD_BYTES;
  if (data.length <= threshold) return null;
  if (store === null) {
    throw new ConfigError(
      `a ${payloadType} payload of ${data.length} bytes exceeds the ${threshold}-byte inline limit ` +
        "and no blob store is configured",
      `configure a payload store (VF_BLOB_REDIS_URL, or the local engine's embedded one), or raise ${MAX_INLINE_PAYLOAD_ENV}`,
      { payload_type: payloadType, size: data.length, max_inline_bytes: threshold },
    );
  }
  const ttl = options.ttlSeconds ?? REALTIME_BLOB_TTL_SECONDS;
  const readers = options.readers ?? null;
  const size = data.length;
  const key = readers === null ? await store.put(data, ttl) : await store.putWithReaders(data, readers, ttl);
  return new BlobRef(key, payloadType, size);
}

/**
 * The offloaded bytes a {@link BlobRef} names. Throws what the store's `get` throws, a {@link DecodeError}
 * when the bytes are not the size the envelope recorded, and a {@link ConfigError} when no store is
 * configured to resolve it.
 */
export async function fetchOffloaded(blobRef: BlobRef, store: BlobStore | null): Promise<Uint8Array> {
  if (store === null) {
    throw new ConfigError(
      `the envelope offloads its ${blobRef.innerPayloadType} payload to ${blobRef.ref}, and no blob store is configured`,
      "configure the same payload store the publisher uses (VF_BLOB_REDIS_URL)",
      { ref: blobRef.ref },
    );
  }
  const data = await store.get(blobRef.ref);
  if (BigInt(data.length) !== BigInt(blobRef.size)) {
    throw new DecodeError(
      `offloaded payload ${blobRef.ref} holds ${data.length} bytes; its envelope recorded ${blobRef.size}`,
      "the blob was replaced or truncated: inspect the dead letter",
      { ref: blobRef.ref, reason: "size", expected_size: String(blobRef.size), actual_size: data.length },
    );
  }
  return data;
}

/**
 * The reader obligation id of one consumer of a payload (BLOB-13, as `blobReaderIds` in the compiler
 * lists them): `<node>` for a node whose replicas compete, `<node>/p<i>` for replica `i` of a partitioned
 * node.
 */
export function readerObligationId(node: string, partitionReplica: number | null): string {
  if (node.length === 0) throw new ConfigError("a reader obligation needs a node name");
  if (partitionReplica === null) return node;
  if (!Number.isSafeInteger(partitionReplica) || partitionReplica < 0) {
    throw new ConfigError(
      `a partition replica index must be a non-negative integer, got ${partitionReplica}`,
    );
  }
  return `${node}/p${partitionReplica}`;
}

/** What a {@link PayloadStoreBlobBridge} puts under. */
export interface PayloadStoreBlobBridgeOptions {
  /** The reader obligation ids every put acquires up front (`VF_BLOB_READER_IDS`). */
  readonly obligations: readonly string[];
  /** The recovery horizon the flow promised, recorded on each contract. */
  readonly horizonSeconds: number;
  /** Whether the channel's profile needs the bytes to survive the store's own failure model. */
  readonly durableRequired: boolean;
  /** The logical content identity of the message being published, evaluated at put time. */
  readonly contentId: () => string;
  /** The `intent/<publication_id>` of the send in flight, evaluated at put time; null when none. */
  readonly intent?: () => string | null;
}

/**
 * A {@link BlobStore} over an obligation-keeping {@link PayloadStore}. {@link lastRef} is the ref of the
 * put that completed last, so a publisher reads it right after its own put.
 */
export class PayloadStoreBlobBridge implements BlobStore {
  readonly #store: PayloadStore;
  readonly #obligations: readonly string[];
  readonly #horizonSeconds: number;
  readonly #durableRequired: boolean;
  readonly #contentId: () => string;
  readonly #intent: () => string | null;
  #lastRef: ImmutablePayloadRef | null = null;

  /** Throws {@link ConfigError} for an empty or repeated reader id. */
  constructor(store: PayloadStore, options: PayloadStoreBlobBridgeOptions) {
    checkObligationIds(options.obligations);
    this.#store = store;
    this.#obligations = Object.freeze([...options.obligations]);
    this.#horizonSeconds = options.horizonSeconds;
    this.#durableRequired = options.durableRequired;
    this.#contentId = options.contentId;
    this.#intent = options.intent ?? (() => null);
  }

  /** The store behind the bridge. */
  get store(): PayloadStore {
    return this.#store;
  }

  /** The ref of the most recent put: what the publisher releases its intent on. Null before any put. */
  get lastRef(): ImmutablePayloadRef | null {
    return this.#lastRef;
  }

  /**
   * Stores `data` under the bridge's reader obligations plus the current intent (none at all without
   * reader ids), and returns the wire key.
   */
  async put(data: Uint8Array, ttlSeconds: number = REALTIME_BLOB_TTL_SECONDS): Promise<string> {
    const intent = this.#obligations.length > 0 ? this.#intent() : null;
    const contract = retentionContract({
      ttlSeconds,
      horizonSeconds: this.#horizonSeconds,
      durableRequired: this.#durableRequired,
      obligations: intent === null ? this.#obligations : [...this.#obligations, intent],
    });
    const ref = await this.#store.put(data, this.#contentId(), contract);
    this.#lastRef = ref;
    return ref.key;
  }

  /** {@link put}: the reader set is the bridge's, so the RFC 0002 count means nothing here. */
  putWithReaders(
    data: Uint8Array,
    _readers: number,
    ttlSeconds: number = REALTIME_BLOB_TTL_SECONDS,
  ): Promise<string> {
    return this.put(data, ttlSeconds);
  }

  /**
   * The bytes of `key`, digest-verified where the store keeps a digest. Throws {@link TransientFailure}
   * for a transient read (retry) and {@link DecodeError} for a missing or corrupt object, naming the key
   * and the reason in its context.
   */
  async get(key: string): Promise<Uint8Array> {
    const ref = await this.#store.refForKey(key);
    const outcome = await this.#store.read(ref);
    switch (outcome.kind) {
      case "bytes":
        return outcome.data;
      case "transient":
        throw new TransientFailure(
          `payload ${key} could not be read: ${outcome.reason}`,
          "retry the delivery; the bytes may still exist",
          { ref: key, reason: "transient", detail: outcome.reason },
        );
      case "missing":
        throw new DecodeError(
          `payload ${key} is missing from the ${ref.store} store`,
          "the object expired, was evicted or deleted before this read: inspect the dead letter",
          { ref: key, reason: "missing" },
        );
      case "corrupt":
        throw new DecodeError(
          `payload ${key} is corrupt: digest ${outcome.actualDigest} where ${outcome.expectedDigest} was stored`,
          "the stored bytes changed after the put: inspect the dead letter",
          {
            ref: key,
            reason: "corrupt",
            expected_digest: outcome.expectedDigest,
            actual_digest: outcome.actualDigest,
          },
        );
    }
  }

  /** A no-op: obligations are released by reader id, after a confirmed settlement ({@link releaseReader}). */
  release(_key: string): Promise<void> {
    return Promise.resolve();
  }

  /**
   * Releases reader `readerId`'s obligation on `key` (see {@link readerObligationId}) once its settlement
   * is confirmed; `completionReceipt` names that settlement. Resolves the ref's generation from the
   * store's metadata, so a reader that has only the wire key releases against the right object.
   */
  async releaseReader(key: string, readerId: string, completionReceipt: string): Promise<ReleaseReceipt> {
    const ref = await this.#store.refForKey(key);
    return this.#store.releaseObligation(ref, readerId, completionReceipt);
  }
}
