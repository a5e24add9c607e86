/**
 * The messenger's partition admission (RUN-020): which replica of a partitioned node owns a delivery, and
 * whether its key can be used at all.
 *
 * It guarantees: a delivery is decoded at most once for the decision (the backend's admission filter and
 * the receiver share the result); a partitioned replica owns exactly the deliveries whose key hashes to
 * it; undecodable bytes belong to replica 0 (which dead-letters them), and an unusable key to replica 0
 * under the reject policy or to `fallback_partition` under the fallback policy; under the reject policy an
 * owned delivery with an unusable key yields a PartitionKeyError naming the node and trace.
 *
 * @module
 */

import type { Delivery } from "../backends/messaging.ts";
import { DecodeError, errorToDict, type PartitionKeyError } from "../core/errors.ts";
import { INVALID_KEY_FALLBACK, type PartitionKeyPolicy } from "../core/partition_key_policy.ts";
import { decodeEnvelope, type Envelope as WireEnvelope } from "../wire/codec.ts";
import { isValidPartitionKey, partitionKeyOf, partitionOwner, recordKeyError } from "../wire/identities.ts";

/**
 * The replica of a node partitioned by `partitionBy` over `nbTasks` replicas that owns `decoded`: its
 * key's owner; replica 0 for an undecodable envelope, `unusable` for one whose key cannot be used.
 */
function ownerOf(
  decoded: WireEnvelope | DecodeError,
  partitionBy: string,
  nbTasks: number,
  unusable: number,
): number {
  if (decoded instanceof DecodeError) return 0;
  const key = partitionKeyOf(partitionBy, decoded.traceId, decoded.metadata);
  return isValidPartitionKey(key) ? partitionOwner(key, nbTasks) : unusable;
}

/**
 * The replica of a node partitioned by `partitionBy` over `nbTasks` replicas that owns the envelope in
 * `bytes`, as its replicas decide it under the default key policy (an unusable key: replica 0).
 */
export function envelopeOwner(bytes: Uint8Array, partitionBy: string, nbTasks: number): number {
  return ownerOf(decodeDelivery(bytes), partitionBy, nbTasks, 0);
}

/** The envelope in a delivery's bytes, or the DecodeError that says why there is none. */
export function decodeDelivery(bytes: Uint8Array): WireEnvelope | DecodeError {
  try {
    return decodeEnvelope(bytes);
  } catch (error) {
    return error instanceof DecodeError
      ? error
      : new DecodeError(`the envelope could not be decoded: ${errorToDict(error).message}`);
  }
}

/** How a {@link PartitionAdmission} decides. */
export interface PartitionAdmissionOptions {
  /** The node, named in a PartitionKeyError. */
  readonly node: string;
  /** The partition key (`trace_id` or a metadata field); `null` when the node is not partitioned. */
  readonly partitionBy: string | null;
  /** The node's replica count. */
  readonly nbTasks: number;
  /** This replica's index. */
  readonly replicaId: number;
  /** What a partitioned replica does with an unusable key; reject when `null`. */
  readonly keyPolicy: PartitionKeyPolicy | null;
}

/** One replica's ownership decisions over the deliveries of its parents. */
export class PartitionAdmission {
  readonly #node: string;
  readonly #partitionBy: string | null;
  readonly #nbTasks: number;
  readonly #replicaId: number;
  readonly #keyPolicy: PartitionKeyPolicy | null;
  readonly #decoded = new WeakMap<Delivery, WireEnvelope | DecodeError>();

  /**
   * Validates the key policy against the replica count.
   *
   * @throws ConfigError when a fallback partition is outside `nbTasks`.
   */
  constructor(options: PartitionAdmissionOptions) {
    this.#node = options.node;
    this.#partitionBy = options.partitionBy;
    this.#nbTasks = options.nbTasks;
    this.#replicaId = options.replicaId;
    this.#keyPolicy = options.keyPolicy;
    this.#keyPolicy?.checkBound(this.#nbTasks);
  }

  /** {@link decodeDelivery}, remembered for the delivery: the admission filter decodes it first. */
  decodeCached(delivery: Delivery): WireEnvelope | DecodeError {
    let decoded = this.#decoded.get(delivery);
    if (decoded === undefined) {
      decoded = decodeDelivery(delivery.envelopeBytes);
      this.#decoded.set(delivery, decoded);
    }
    return decoded;
  }

  /** The replica owning a decoded delivery (undecodable bytes and unusable rejected keys: replica 0). */
  owner(decoded: WireEnvelope | DecodeError): number {
    const unusable = this.#keyPolicy?.invalid === INVALID_KEY_FALLBACK
      ? this.#keyPolicy.fallbackPartition
      : 0;
    return ownerOf(decoded, this.#partitionBy as string, this.#nbTasks, unusable);
  }

  /** The admission decision: whether this replica owns `delivery` (runs on the backend's turn: cheap, sync). */
  owns(delivery: Delivery): boolean {
    return this.owner(this.decodeCached(delivery)) === this.#replicaId;
  }

  /** The PartitionKeyError of an owned delivery whose key is unusable under the reject policy, else null. */
  keyError(decoded: WireEnvelope): PartitionKeyError | null {
    if (this.#partitionBy === null || this.#keyPolicy?.invalid === INVALID_KEY_FALLBACK) return null;
    const error = recordKeyError(this.#partitionBy, decoded.traceId, decoded.metadata);
    if (error === null) return null;
    error.context.node = this.#node;
    error.context.trace_id = decoded.traceId;
    return error;
  }
}
