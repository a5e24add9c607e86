/**
 * The PayloadStore a node worker uses to reach the local engine's embedded payload store: a proxy over an
 * {@link EmbeddedConnection} to the memory store the supervisor hosts. Every decision (keys, digests,
 * generations, obligations, TTL, budget, barriers) is the hosted store's.
 *
 * Bytes. A read's bytes are this caller's own: a fresh copy the store made for the read, which a
 * MessagePort transfers to this worker instead of copying them again. A put's bytes are copied here, in
 * this thread, when the call is made, and over a MessagePort that copy is transferred, so the store keeps
 * it as it arrives; unless the client was built with `transferPuts`: then, over a MessagePort, a
 * Uint8Array spanning its whole ArrayBuffer is transferred itself and the caller's array is detached once
 * the frame leaves (at the end of the turn). A view into a larger buffer is always copied (moving its
 * buffer would take bytes that are not the payload). Over TCP the link copies. A put given a detached
 * array is a ConfigError, never an empty payload: keep a copy of bytes you may put again (a put retried
 * after PayloadBudgetExceeded).
 *
 * Reconcile. The ledger is this worker's object, so its two questions are asked here: the required
 * obligations are read first, then the store's obligation ids are fetched and judged with
 * `ledger.authoritative`, and the store reconciles against both answers. An obligation attached between
 * the two calls was not judged, so it counts as one the ledger is not authoritative for: it is never
 * cancelled.
 *
 * A lost connection: a read is TransientRead (the bytes may exist), a release already sent is an unknown
 * receipt (it may have applied; a retry is idempotent), an inventory is Unknown('unreachable'), and every
 * other call rejects with BrokerUnavailable.
 *
 * @example
 * ```ts
 * import { EmbeddedConnection } from "./rpc.ts";
 * import { retentionContract } from "../backends/payload.ts";
 * const store = new EmbeddedPayloadStore(await EmbeddedConnection.fromEnv());
 * const ref = await store.put(new Uint8Array([1, 2, 3]), "cam:e1",
 *   retentionContract({ ttlSeconds: 60, horizonSeconds: 60, durableRequired: false }));
 * console.log((await store.read(ref)).kind); // "bytes"
 * ```
 *
 * @module
 */

import { copyBytes } from "../core/bytes.ts";
import { type BrokerUnavailable, ConfigError } from "../core/errors.ts";
import type { PayloadCapabilities } from "../backends/capabilities.ts";
import { type Clock, systemClock } from "../backends/clock.ts";
import { type Observation, unknown } from "../backends/outcomes.ts";
import {
  corruptPayload,
  type DurableReceipt,
  durableReceipt,
  type ImmutablePayloadRef,
  missingPayload,
  type ObligationLedger,
  payloadBytes,
  type PayloadReadOutcome,
  payloadRef,
  type PayloadStore,
  type ReclamationObservation,
  reclamationObservation,
  type ReleaseReceipt,
  releaseReceipt,
  type RetentionContract,
  transientRead,
} from "../backends/payload.ts";
import {
  deepFreeze,
  type EmbeddedConnection,
  FROZEN_REPLY,
  Op,
  PLAIN_REPLY,
  raiseLost,
  type Reply,
  spansBuffer,
} from "./rpc.ts";

function rebuildRef(value: unknown): ImmutablePayloadRef {
  const ref = value as ImmutablePayloadRef;
  return payloadRef(ref.store, ref.key, ref.size, ref.digest, ref.generation, ref.contentId);
}

const REF_REPLY: Reply<null, ImmutablePayloadRef> = Object.freeze({
  decode: rebuildRef,
  lost: raiseLost,
});

const READ_REPLY: Reply<ImmutablePayloadRef, PayloadReadOutcome> = Object.freeze({
  decode: (value: unknown, ref: ImmutablePayloadRef): PayloadReadOutcome => {
    const outcome = value as PayloadReadOutcome;
    switch (outcome.kind) {
      case "bytes":
        return payloadBytes(ref, outcome.data, outcome.digestVerified);
      case "transient":
        return transientRead(ref, outcome.reason);
      case "missing":
        return missingPayload(ref);
      case "corrupt":
        return corruptPayload(ref, outcome.expectedDigest, outcome.actualDigest);
    }
  },
  lost: (ref: ImmutablePayloadRef, _sent: boolean, error: BrokerUnavailable) =>
    transientRead(ref, error.message),
});

interface ObligationCall {
  readonly ref: ImmutablePayloadRef;
  readonly obligationId: string;
}

const RECEIPT_REPLY: Reply<ObligationCall, DurableReceipt> = Object.freeze({
  decode: (value: unknown, call: ObligationCall) =>
    durableReceipt(call.ref, call.obligationId, (value as DurableReceipt).deadline),
  lost: raiseLost,
});

const RELEASE_REPLY: Reply<ObligationCall, ReleaseReceipt> = Object.freeze({
  decode: (value: unknown, call: ObligationCall) => {
    const receipt = value as ReleaseReceipt;
    return releaseReceipt(
      call.ref,
      call.obligationId,
      receipt.remaining,
      receipt.reclaimed,
      receipt.stale,
      receipt.unknown,
    );
  },
  lost: (call: ObligationCall, sent: boolean, error: BrokerUnavailable) => {
    if (!sent) throw error;
    return releaseReceipt(call.ref, call.obligationId, null, false, false, true);
  },
});

const RECLAMATION_REPLY: Reply<null, ReclamationObservation> = Object.freeze({
  decode: (value: unknown) => {
    const observed = value as ReclamationObservation;
    return reclamationObservation(observed.reclaimed, observed.retained, observed.unknown);
  },
  lost: raiseLost,
});

const INVENTORY_REPLY: Reply<Clock, Observation<readonly ImmutablePayloadRef[]>> = Object.freeze({
  decode: (value: unknown) => {
    const observation = value as Observation<readonly ImmutablePayloadRef[]>;
    if (observation.kind === "unknown") return deepFreeze(observation);
    return Object.freeze({ ...observation, value: Object.freeze(observation.value.map(rebuildRef)) });
  },
  lost: (clock: Clock, _sent: boolean, error: BrokerUnavailable) =>
    unknown("unreachable", clock, error.message),
});

/** Options of an {@link EmbeddedPayloadStore}. */
export interface EmbeddedPayloadOptions {
  /** Transfer a put's bytes over a MessagePort instead of copying them (see the module comment). */
  readonly transferPuts?: boolean;
  /** Stamps Unknown inventories (the system clock by default). */
  readonly clock?: Clock;
}

/** The embedded payload store's client (see the module comment). */
export class EmbeddedPayloadStore implements PayloadStore {
  readonly #connection: EmbeddedConnection;
  readonly #transferPuts: boolean;
  readonly #clock: Clock;

  constructor(connection: EmbeddedConnection, options: EmbeddedPayloadOptions = {}) {
    this.#connection = connection;
    this.#transferPuts = options.transferPuts ?? false;
    this.#clock = options.clock ?? systemClock;
  }

  /** {@link PayloadStore.put}, stored by the hosted store; bytes copied or moved as the module comment says. */
  put(data: Uint8Array, contentId: string, contract: RetentionContract): Promise<ImmutablePayloadRef> {
    if (!(data instanceof Uint8Array)) {
      return Promise.reject(
        new ConfigError("payload data must be a Uint8Array", "encode the payload to bytes first"),
      );
    }
    if ((data.buffer as ArrayBuffer).detached) {
      return Promise.reject(
        new ConfigError(
          "the payload's bytes were handed over by an earlier put (their buffer is detached)",
          "keep a copy of bytes you may put again, or build the store without transferPuts",
        ),
      );
    }
    const port = this.#connection.transport === "port";
    const move = this.#transferPuts && port && data.buffer instanceof ArrayBuffer && spansBuffer(data);
    const bytes = move ? data : copyBytes(data);
    return this.#connection.call(
      Op.payloadPut,
      [bytes, contentId, contract],
      null,
      REF_REPLY,
      port ? bytes.buffer as ArrayBuffer : undefined,
    );
  }

  /** {@link PayloadStore.read}; TransientRead when the connection is lost. */
  read(ref: ImmutablePayloadRef): Promise<PayloadReadOutcome> {
    return this.#connection.call(Op.payloadRead, [ref], ref, READ_REPLY);
  }

  /** {@link PayloadStore.acquireObligation}, held by the hosted store. */
  acquireObligation(
    ref: ImmutablePayloadRef,
    obligationId: string,
    deadline: number,
  ): Promise<DurableReceipt> {
    return this.#connection.call(
      Op.payloadAcquire,
      [ref, obligationId, deadline],
      { ref, obligationId },
      RECEIPT_REPLY,
    );
  }

  /** {@link PayloadStore.renewObligation}, applied by the hosted store. */
  renewObligation(ref: ImmutablePayloadRef, obligationId: string, deadline: number): Promise<DurableReceipt> {
    return this.#connection.call(
      Op.payloadRenew,
      [ref, obligationId, deadline],
      { ref, obligationId },
      RECEIPT_REPLY,
    );
  }

  /** {@link PayloadStore.releaseObligation}; an unknown receipt when the connection is lost after sending. */
  releaseObligation(
    ref: ImmutablePayloadRef,
    obligationId: string,
    completionReceipt: string,
  ): Promise<ReleaseReceipt> {
    return this.#connection.call(
      Op.payloadRelease,
      [ref, obligationId, completionReceipt],
      { ref, obligationId },
      RELEASE_REPLY,
    );
  }

  /** {@link PayloadStore.reconcile} against `ledger`, read here (see the module comment). */
  async reconcile(ledger: ObligationLedger, operationId: string): Promise<ReclamationObservation> {
    const required = await ledger.requiredObligations();
    const held = await this.#connection.call(
      Op.payloadObligationIds,
      [],
      null,
      PLAIN_REPLY as Reply<null, string[] | null>,
    );
    const authoritative = (held ?? []).filter((id) => ledger.authoritative(id));
    const listed = [...required].map(([key, ids]) => [key, [...ids]]);
    return await this.#connection.call(
      Op.payloadReconcile,
      [listed, authoritative, operationId],
      null,
      RECLAMATION_REPLY,
    );
  }

  /** {@link PayloadStore.inventory}; Unknown('unreachable') when the connection is lost. */
  inventory(): Promise<Observation<readonly ImmutablePayloadRef[]>> {
    return this.#connection.call(Op.payloadInventory, [], this.#clock, INVENTORY_REPLY);
  }

  /** {@link PayloadStore.refForKey}, completed from the hosted store's metadata. */
  refForKey(key: string): Promise<ImmutablePayloadRef> {
    return this.#connection.call(Op.payloadRefForKey, [key], null, REF_REPLY);
  }

  /** The hosted store's capabilities. */
  capabilities(): Promise<PayloadCapabilities> {
    return this.#connection.call(
      Op.payloadCapabilities,
      [],
      null,
      FROZEN_REPLY as Reply<null, PayloadCapabilities>,
    );
  }
}
