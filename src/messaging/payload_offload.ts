/**
 * The messenger's payload offload (PAY-004, BLOB-14): payloads above the inline threshold leave the
 * envelope through the payload bridge under the readers' obligations, and come back from it on receipt.
 *
 * It guarantees: a payload of at most the inline limit stays in the envelope; a larger one is put once,
 * under the publication's id, with every configured reader's obligation and the TTL, and its reference
 * ({@link Offloaded.ref}) is kept for the publication intent; without a store such a publish fails with
 * a ConfigError (from `offloadPayload`); a failed obligation release is logged and left to
 * reconciliation (PAY-006), never thrown.
 *
 * @module
 */

import { type ImmutablePayloadRef, intentObligationId, type PayloadStore } from "../backends/payload.ts";
import {
  fetchOffloaded,
  offloadPayload,
  PayloadStoreBlobBridge,
  readerObligationId,
} from "../backends/payload_bridge.ts";
import type { Logger } from "../core/context.ts";
import { errorToDict } from "../core/errors.ts";
import {
  decodePayload,
  type Envelope as WireEnvelope,
  PayloadType,
  type PreparedPayload,
  preparePayload,
} from "../wire/codec.ts";
import type { BlobRef } from "../wire/value.ts";

/** How a {@link PayloadOffload} offloads. */
export interface PayloadOffloadOptions {
  /** Where payloads above the inline threshold go; `null` when there is none. */
  readonly payloadStore: PayloadStore | null;
  /** The node whose reader obligation this replica releases. */
  readonly node: string;
  /** This replica's partition, when partitioned (its reader obligation is its own). */
  readonly partitionReplica: number | null;
  /** The reader obligations every offloaded put acquires. */
  readonly readers: readonly string[];
  /** Offload TTL, in seconds. */
  readonly ttlSeconds: number;
  /** The largest payload kept inline, in bytes. */
  readonly maxInlineBytes: number;
  /** Whether an offload must land in a durable store (a batch flow). */
  readonly durableRequired: boolean;
  /** Where a failed release is reported. */
  readonly logger: Logger;
}

/** An output's payload after {@link PayloadOffload.offload}: the reference it carries, and what was put. */
export interface Offloaded {
  /** The payload the envelope carries: the blob reference. */
  readonly payload: PreparedPayload;
  /** The stored payload's reference, when the store reported one. */
  readonly ref: ImmutablePayloadRef | null;
}

/** One replica's offloaded payloads: the puts of its outputs and the reads and releases of its inputs. */
export class PayloadOffload {
  readonly #bridge: PayloadStoreBlobBridge | null;
  readonly #readerId: string;
  readonly #blobReaders: readonly string[];
  readonly #blobTtl: number;
  readonly #maxInline: number;
  readonly #logger: Logger;
  #publicationInFlight = "";

  /** Puts nothing until {@link offload}. */
  constructor(options: PayloadOffloadOptions) {
    this.#blobReaders = Object.freeze([...options.readers]);
    this.#blobTtl = options.ttlSeconds;
    this.#maxInline = options.maxInlineBytes;
    this.#logger = options.logger;
    this.#readerId = readerObligationId(options.node, options.partitionReplica);
    const payloadStore = options.payloadStore;
    this.#bridge = payloadStore === null ? null : new PayloadStoreBlobBridge(payloadStore, {
      obligations: this.#blobReaders,
      horizonSeconds: this.#blobTtl,
      durableRequired: options.durableRequired,
      contentId: () => this.#publicationInFlight,
      intent: () => intentObligationId(this.#publicationInFlight),
    });
  }

  /** This replica's reader obligation on the payloads it receives. */
  get readerId(): string {
    return this.#readerId;
  }

  /** The reader obligations every offloaded put acquires. */
  get readers(): readonly string[] {
    return this.#blobReaders;
  }

  /** Whether a payload of `byteLength` bytes stays in the envelope. */
  fitsInline(byteLength: number): boolean {
    return byteLength <= this.#maxInline;
  }

  /**
   * Puts `payload` for the publication `publicationId` and returns the reference the envelope carries.
   *
   * @throws ConfigError without a payload store.
   */
  async offload(publicationId: string, payload: PreparedPayload): Promise<Offloaded> {
    this.#publicationInFlight = publicationId;
    const blobRef = await offloadPayload(payload.payloadType, payload.bytes(), this.#bridge, {
      maxInlineBytes: this.#maxInline,
      ttlSeconds: this.#blobTtl,
    });
    const ref = this.#bridge?.lastRef ?? null;
    return { payload: preparePayload(blobRef as BlobRef), ref };
  }

  /** The bytes an offloaded payload's reference names, read from the store. */
  fetch(blobRef: BlobRef): Promise<Uint8Array> {
    return fetchOffloaded(blobRef, this.#bridge);
  }

  /** The key of the payload an envelope offloaded; `null` for an inline one (or an unreadable reference). */
  blobKey(decoded: WireEnvelope): string | null {
    if (decoded.payloadType !== PayloadType.blobRef) return null;
    try {
      return (decodePayload(decoded.payloadType, decoded.payload) as BlobRef).ref;
    } catch {
      return null;
    }
  }

  /** Releases `obligationId` on the payload `key`; a failed release is left to reconciliation (PAY-006). */
  async release(key: string, obligationId: string, receipt: string): Promise<void> {
    if (this.#bridge === null) return;
    try {
      await this.#bridge.releaseReader(key, obligationId, receipt);
    } catch (error) {
      this.#logger.warn("a payload obligation could not be released", {
        key,
        obligation_id: obligationId,
        error: errorToDict(error).message,
      });
    }
  }
}
