/**
 * The in-memory PayloadStore (spec backends.memory.payload): objects with digests and generations, named
 * obligations instead of a counter, TTL and byte-budget physics under an injected clock. The executable
 * specification of `../payload.ts`.
 *
 * Two tiers, because the design insists they be told apart:
 * - `durable`: an object under obligation is never expired or evicted; acquiring an obligation extends
 *   the object's life to its deadline; a put over budget is refused ({@link PayloadBudgetExceeded},
 *   backpressure) rather than admitted by eviction.
 * - `evictable`: the Redis volatile-lru shape. Every object's TTL fires regardless of obligations, and
 *   under memory pressure the least recently used object is evicted even if a reader still needs it.
 *   That is the finding the reliable profile must reject; this model makes it observable.
 *
 * Release is atomic and idempotent by (obligation id, generation); a stale generation touches nothing.
 * An object whose obligation set is absent (a put that died before attaching it, or a set that expired)
 * is never reclaimed by a release (BLOB-14 step 2); reconcile reclaims such an orphan only once it is
 * older than `orphanGraceSeconds` (PAY-007), so a put still in progress is not mistaken for a leak.
 *
 * Keys derive from (content id, digest): a put of the same content and bytes lands on the same key, where
 * `forwardUnchanged` shares the existing object and otherwise a new generation replaces it, keeping the
 * obligations it carried (the bytes are identical, so every reader of the key still owes them).
 *
 * Barriers: `payload.write.before` before a put stores anything; `payload.write.after` once the bytes are
 * stored and before any obligation is attached; `obligation.acquire.after` once the obligations are
 * attached (a crash between the two leaves the TTL-only orphan of PAY-007); `payload.read.before` (a
 * TransientFailure raised there, or a dropped response, reads as {@link TransientRead});
 * `obligation.release.before` and `obligation.release.after` (a dropped response: `unknown = true`).
 * A dropped response on a put or an acquire throws UnobservableState: the effect may have happened, and a
 * retry is idempotent.
 *
 * Time is the clock's wall reading (epoch seconds): deadlines, expiry and orphan ages.
 *
 * @example
 * ```ts
 * import { FakeClock } from "./clock.ts";
 * import { retentionContract } from "../payload.ts";
 * const store = new MemoryPayloadStore({ clock: new FakeClock() });
 * const contract = retentionContract({ ttlSeconds: 60, horizonSeconds: 60, durableRequired: true,
 *   obligations: ["detector"] });
 * const ref = await store.put(new Uint8Array([1, 2, 3]), "cam1:e1", contract);
 * const receipt = await store.releaseObligation(ref, "detector", "ack-1");
 * console.log(receipt.reclaimed); // true: nobody owes it any more
 * ```
 *
 * @module
 */

import { copyBytes } from "../../core/bytes.ts";
import { ConfigError, ResourceUnavailable, TransientFailure } from "../../core/errors.ts";
import { type PayloadCapabilities, payloadCapabilities } from "../capabilities.ts";
import { type Clock, systemClock } from "../clock.ts";
import { Barrier, barrier, type BarrierContext } from "../faults.ts";
import type { ObservationLog } from "../observation.ts";
import { known, type Observation, unknown, type UnknownReason } from "../outcomes.ts";
import {
  checkObligationDeadline,
  checkObligationIds,
  checkOrphanGrace,
  checkRefStore,
  corruptPayload,
  type DurableReceipt,
  durableReceipt,
  type ImmutablePayloadRef,
  isIntentObligation,
  lostPayloadReply,
  missingPayload,
  type ObligationLedger,
  PayloadBudgetExceeded,
  payloadBytes,
  payloadDigest,
  payloadKey,
  type PayloadReadOutcome,
  payloadRef,
  type PayloadStore,
  type ReclamationObservation,
  reclamationObservation,
  type ReleaseReceipt,
  releaseReceipt,
  type RetentionContract,
  retentionContract,
  transientRead,
} from "../payload.ts";

/** The two failure models the memory store can play. */
export const PayloadTier = {
  /** Never expires or evicts an object under obligation; refuses a put over budget. */
  durable: "durable",
  /** Redis volatile-lru: TTLs fire regardless of obligations; pressure evicts the least recently used. */
  evictable: "evictable",
} as const;
/** One of {@link PayloadTier}. */
export type PayloadTier = typeof PayloadTier[keyof typeof PayloadTier];

/** How long reconcile leaves an object without an obligation set alone (PAY-007), in seconds. */
export const DEFAULT_ORPHAN_GRACE_SECONDS = 60;

/** The store identity memory refs carry unless the options name another. */
export const MEMORY_PAYLOAD_STORE = "memory";

/** Options of a {@link MemoryPayloadStore}. */
export interface MemoryPayloadStoreOptions {
  /** Source of time (default: the system clock); tests pass a FakeClock. */
  readonly clock?: Clock;
  /** Failure model (default `durable`). */
  readonly tier?: PayloadTier;
  /** Byte budget; null or absent for unlimited. */
  readonly maxBytes?: number | null;
  /** A put of bytes whose content id and digest already exist returns the existing ref (default true). */
  readonly forwardUnchanged?: boolean;
  /** Where lifecycle events are recorded (never bytes); none by default. */
  readonly log?: ObservationLog | null;
  /** The store identity refs carry (default {@link MEMORY_PAYLOAD_STORE}). */
  readonly storeId?: string;
  /** How long an object without an obligation set is left alone by reconcile (default 60 s). */
  readonly orphanGraceSeconds?: number;
}

interface StoredObject {
  /** The bytes as held now (the corrupt and truncate hooks change them; the metadata below does not). */
  data: Uint8Array;
  readonly size: number;
  readonly digest: string;
  readonly generation: string;
  readonly contentId: string;
  /** Wall seconds of the latest put that stored or forwarded this object (the orphan grace runs from it). */
  putAt: number;
  /** Wall seconds at which the TTL fires. */
  expiresAt: number;
  /** Obligation id → deadline (wall seconds); null when the set is absent. A present set is never empty. */
  obligations: Map<string, number> | null;
}

/**
 * A PayloadStore held in one object (see the module comment for its rules). Bytes are copied in and out.
 * Besides the contract it offers fault hooks that model a store misbehaving: {@link corrupt},
 * {@link truncate}, {@link delete}, {@link expireObligation}, {@link expireObligationSet},
 * {@link failReads}, {@link failInventory}.
 */
export class MemoryPayloadStore implements PayloadStore {
  readonly #clock: Clock;
  readonly #tier: PayloadTier;
  readonly #maxBytes: number | null;
  readonly #forwardUnchanged: boolean;
  readonly #log: ObservationLog | null;
  readonly #storeId: string;
  readonly #orphanGrace: number;
  /** Key → object, in least-recently-used-first order (a touch moves a key to the end). */
  readonly #objects = new Map<string, StoredObject>();
  /** Key → generation whose obligations all ended (released or cancelled): answers a retried release. */
  readonly #reclaimed = new Map<string, string>();
  #storedBytes = 0;
  /** No object can expire before this wall time (a lower bound; see #sweep). */
  #nextExpiry = Infinity;
  #lastGeneration = 0;
  readonly #readFailures: string[] = [];
  #inventoryFailure: UnknownReason | null = null;

  /** Throws {@link ConfigError} for an unknown tier, a negative budget or grace, or an empty store id. */
  constructor(options: MemoryPayloadStoreOptions = {}) {
    const tier = options.tier ?? PayloadTier.durable;
    if (!Object.values(PayloadTier).includes(tier)) {
      throw new ConfigError(`unknown payload tier ${JSON.stringify(tier)}`, "use 'durable' or 'evictable'");
    }
    const maxBytes = options.maxBytes ?? null;
    if (maxBytes !== null && (!Number.isSafeInteger(maxBytes) || maxBytes < 0)) {
      throw new ConfigError(`maxBytes must be a non-negative integer or null, got ${maxBytes}`);
    }
    const grace = options.orphanGraceSeconds ?? DEFAULT_ORPHAN_GRACE_SECONDS;
    checkOrphanGrace(grace);
    const storeId = options.storeId ?? MEMORY_PAYLOAD_STORE;
    if (storeId.length === 0) throw new ConfigError("a payload store id must not be empty");
    this.#clock = options.clock ?? systemClock;
    this.#tier = tier;
    this.#maxBytes = maxBytes;
    this.#forwardUnchanged = options.forwardUnchanged ?? true;
    this.#log = options.log ?? null;
    this.#storeId = storeId;
    this.#orphanGrace = grace;
  }

  /** The failure model this store plays. */
  get tier(): PayloadTier {
    return this.#tier;
  }

  put(data: Uint8Array, contentId: string, terms: RetentionContract): Promise<ImmutablePayloadRef> {
    return this.#put(data, contentId, terms, true);
  }

  /**
   * {@link put}, keeping `data` itself as the stored bytes instead of a copy: for a host whose bytes nobody
   * else writes to (the embedded broker's, which arrive in a frame of their own). Everything else is as
   * `put` does it.
   */
  putOwned(data: Uint8Array, contentId: string, terms: RetentionContract): Promise<ImmutablePayloadRef> {
    return this.#put(data, contentId, terms, false);
  }

  async #put(
    data: Uint8Array,
    contentId: string,
    terms: RetentionContract,
    copy: boolean,
  ): Promise<ImmutablePayloadRef> {
    const contract = retentionContract(terms);
    if (!(data instanceof Uint8Array)) {
      throw new ConfigError("payload data must be a Uint8Array", "encode the payload to bytes first");
    }
    if (typeof contentId !== "string") throw new ConfigError("a content id must be a string");
    const bytes = copy ? copyBytes(data) : data;
    const digest = payloadDigest(bytes);
    const key = payloadKey(contentId, digest);
    const context = { key, payload_digest: digest };
    await barrier(Barrier.payloadWriteBefore, context);
    this.#sweep();
    const now = this.#clock.now();
    const existing = this.#objects.get(key);
    let object: StoredObject;
    if (existing !== undefined && this.#forwardUnchanged) {
      object = existing;
      object.expiresAt = Math.max(object.expiresAt, now + contract.ttlSeconds);
      object.putAt = now;
      this.#touch(key, object);
      this.#emit("payload.forwarded", { key, generation: object.generation, payload_digest: digest });
    } else {
      this.#makeRoom(key, bytes.length, existing);
      if (existing !== undefined) this.#remove(key, existing);
      object = {
        data: bytes,
        size: bytes.length,
        digest,
        generation: String(++this.#lastGeneration),
        contentId,
        putAt: now,
        expiresAt: now + contract.ttlSeconds,
        obligations: existing?.obligations ?? null,
      };
      this.#reclaimed.delete(key);
      this.#objects.set(key, object);
      this.#storedBytes += bytes.length;
      this.#emit("payload.put", { key, generation: object.generation, payload_digest: digest });
    }
    this.#noteExpiry(object.expiresAt);
    const ref = this.#refOf(key, object);
    const stored = await barrier(Barrier.payloadWriteAfter, { ...context, generation: ref.generation });
    if (stored.dropResponse) throw lostPayloadReply("put", ref);
    if (contract.obligations.length > 0) {
      this.#attach(ref, contract.obligations, now + Math.max(contract.ttlSeconds, contract.horizonSeconds));
      const attached = await barrier(Barrier.obligationAcquireAfter, {
        ...context,
        generation: ref.generation,
      });
      if (attached.dropResponse) throw lostPayloadReply("put", ref);
    }
    return ref;
  }

  /** {@link PayloadStore.read}; `reader` only labels the observation log's event. */
  async read(ref: ImmutablePayloadRef, reader: string | null = null): Promise<PayloadReadOutcome> {
    checkRefStore(ref, this.#storeId);
    try {
      const hit = await barrier(Barrier.payloadReadBefore, { key: ref.key, consumer: reader });
      if (hit.dropResponse) return transientRead(ref, "the store's reply was lost");
    } catch (error) {
      if (error instanceof TransientFailure) return transientRead(ref, error.message);
      throw error;
    }
    const failure = this.#readFailures.shift();
    if (failure !== undefined) return transientRead(ref, failure);
    this.#sweep();
    const object = this.#objects.get(ref.key);
    if (object === undefined) {
      this.#emit("payload.read", { key: ref.key, consumer: reader, status: "missing" });
      return missingPayload(ref);
    }
    this.#touch(ref.key, object);
    const expected = ref.digest !== "" && ref.generation === object.generation ? ref.digest : object.digest;
    const actual = payloadDigest(object.data);
    const status = actual === expected ? "ok" : "corrupt";
    this.#emit("payload.read", { key: ref.key, consumer: reader, payload_digest: actual, status });
    if (status === "corrupt") return corruptPayload(ref, expected, actual);
    return payloadBytes(ref, object.data.slice(), true);
  }

  async acquireObligation(
    ref: ImmutablePayloadRef,
    obligationId: string,
    deadline: number,
  ): Promise<DurableReceipt> {
    const held = this.#claim(ref, obligationId, deadline, false);
    const hit = await barrier(Barrier.obligationAcquireAfter, {
      key: ref.key,
      generation: ref.generation,
      obligation_id: obligationId,
    });
    if (hit.dropResponse) throw lostPayloadReply("acquire", ref);
    return durableReceipt(ref, obligationId, held);
  }

  renewObligation(ref: ImmutablePayloadRef, obligationId: string, deadline: number): Promise<DurableReceipt> {
    return Promise.try(() =>
      durableReceipt(ref, obligationId, this.#claim(ref, obligationId, deadline, true))
    );
  }

  async releaseObligation(
    ref: ImmutablePayloadRef,
    obligationId: string,
    completionReceipt: string,
  ): Promise<ReleaseReceipt> {
    checkRefStore(ref, this.#storeId);
    checkObligationIds([obligationId]);
    const context: BarrierContext = { key: ref.key, generation: ref.generation, obligation_id: obligationId };
    await barrier(Barrier.obligationReleaseBefore, context);
    this.#sweep();
    const receipt = this.#release(ref, obligationId, completionReceipt);
    const hit = await barrier(Barrier.obligationReleaseAfter, context);
    return hit.dropResponse ? releaseReceipt(ref, obligationId, null, false, false, true) : receipt;
  }

  /**
   * {@link PayloadStore.reconcile}'s rules. With the inventory unreadable ({@link failInventory}) nothing is
   * judged: every key the ledger lists is reported unknown.
   */
  async reconcile(ledger: ObligationLedger, operationId: string): Promise<ReclamationObservation> {
    const required = await ledger.requiredObligations();
    if (this.#inventoryFailure !== null) return reclamationObservation([], [], [...required.keys()]);
    this.#sweep();
    const now = this.#clock.now();
    const reclaimed: string[] = [];
    const retained: string[] = [];
    for (const [key, object] of [...this.#objects]) {
      const listed = required.get(key);
      const hadSet = object.obligations !== null;
      for (const id of [...(object.obligations?.keys() ?? [])]) {
        const owed = listed !== undefined ? listed.includes(id) : !isIntentObligation(id);
        if (owed || !ledger.authoritative(id)) continue;
        this.#dropObligation(object, id);
        this.#emit("obligation.cancelled", {
          op_id: operationId,
          key,
          generation: object.generation,
          obligation_id: id,
        });
      }
      const keep = object.obligations !== null || (listed !== undefined && listed.length > 0) ||
        (!hadSet && now - object.putAt <= this.#orphanGrace);
      if (keep) {
        retained.push(key);
      } else {
        this.#reclaim(key, object, hadSet ? "reconciled" : "orphan", operationId);
        reclaimed.push(key);
      }
    }
    return reclamationObservation(reclaimed, retained, []);
  }

  inventory(): Promise<Observation<readonly ImmutablePayloadRef[]>> {
    return Promise.try(() => {
      if (this.#inventoryFailure !== null) {
        return unknown(this.#inventoryFailure, this.#clock, "the payload inventory could not be listed");
      }
      this.#sweep();
      const refs = [...this.#objects].map(([key, object]) => this.#refOf(key, object));
      refs.sort((a, b) => a.key < b.key ? -1 : a.key > b.key ? 1 : 0);
      return known(Object.freeze(refs), this.#clock);
    });
  }

  refForKey(key: string): Promise<ImmutablePayloadRef> {
    return Promise.try(() => {
      this.#sweep();
      const object = this.#objects.get(key);
      return object === undefined ? payloadRef(this.#storeId, key, 0, "", "", "") : this.#refOf(key, object);
    });
  }

  capabilities(): Promise<PayloadCapabilities> {
    return Promise.try(() => {
      const durable = this.#tier === PayloadTier.durable;
      return payloadCapabilities({
        adapter: MEMORY_PAYLOAD_STORE,
        durable: known(durable, this.#clock),
        evictable: known(!durable, this.#clock),
        atomicMultikey: known(true, this.#clock),
        maxObjectBytes: this.#maxBytes,
        readerIdentities: true,
        referenceForwarding: this.#forwardUnchanged,
        persistentStorage: known(false, this.#clock),
      }, this.#clock);
    });
  }

  /** Fault hook: flips the stored bytes of `key` (the metadata still names the original). */
  corrupt(key: string): void {
    const object = this.#require(key);
    const data = object.data.length === 0 ? new Uint8Array(1) : object.data.slice();
    data[0] ^= 0xff;
    this.#replaceData(object, data);
  }

  /** Fault hook: cuts the stored bytes of `key` to `size` (the metadata still names the original). */
  truncate(key: string, size: number): void {
    const object = this.#require(key);
    if (!Number.isSafeInteger(size) || size < 0 || size > object.data.length) {
      throw new ConfigError(`cannot truncate ${key} (${object.data.length} bytes) to ${size}`);
    }
    this.#replaceData(object, object.data.slice(0, size));
  }

  /** Fault hook: the object vanishes, bytes, metadata and obligations (an operator's DEL). */
  delete(key: string): void {
    this.#remove(key, this.#require(key));
    this.#emit("payload.deleted", { key });
  }

  /** Fault hook: one obligation record vanishes; an emptied set no longer exists, as on the server. */
  expireObligation(key: string, obligationId: string): void {
    this.#dropObligation(this.#require(key), obligationId);
  }

  /** Fault hook: the whole obligation set expires or is evicted while the bytes remain (PAY-008). */
  expireObligationSet(key: string): void {
    this.#dropSet(this.#require(key));
  }

  /** Fault hook: the next reads (one per reason) answer {@link TransientRead} with these reasons. */
  failReads(reasons: readonly string[]): void {
    this.#readFailures.push(...reasons);
  }

  /** Fault hook: the inventory (and so reconcile) cannot be read, for `reason`; null restores it. */
  failInventory(reason: UnknownReason | null): void {
    this.#inventoryFailure = reason;
  }

  /** How many objects are stored (expired ones swept first). */
  objectCount(): number {
    this.#sweep();
    return this.#objects.size;
  }

  /** The obligations on `key`, id → deadline; empty when the object or its set is absent. */
  obligations(key: string): ReadonlyMap<string, number> {
    this.#sweep();
    return new Map(this.#objects.get(key)?.obligations ?? []);
  }

  /** Bytes held now (expired objects swept first). */
  storedBytes(): number {
    this.#sweep();
    return this.#storedBytes;
  }

  /** Adds or extends one obligation (a renewal requires it held); returns the deadline it now holds. */
  #claim(ref: ImmutablePayloadRef, obligationId: string, deadline: number, renewal: boolean): number {
    checkRefStore(ref, this.#storeId);
    checkObligationIds([obligationId]);
    checkObligationDeadline(deadline);
    this.#sweep();
    const object = this.#current(ref, renewal ? "renew" : "acquire");
    if (renewal && !object.obligations?.has(obligationId)) {
      throw new ResourceUnavailable(
        `obligation ${obligationId} is not held on ${ref.key}`,
        "acquire the obligation before renewing it",
        { key: ref.key, obligation_id: obligationId },
      );
    }
    this.#attach(ref, [obligationId], deadline);
    return (object.obligations as Map<string, number>).get(obligationId) as number;
  }

  /** Attaches obligations to the current object of `ref`, keeping each one's later deadline. */
  #attach(ref: ImmutablePayloadRef, ids: readonly string[], deadline: number): void {
    const object = this.#current(ref, "attach obligations to");
    object.obligations ??= new Map();
    for (const id of ids) {
      const held = Math.max(object.obligations.get(id) ?? deadline, deadline);
      object.obligations.set(id, held);
      this.#emit("obligation.acquired", { key: ref.key, generation: ref.generation, obligation_id: id });
    }
    object.expiresAt = Math.max(object.expiresAt, deadline);
  }

  #release(ref: ImmutablePayloadRef, obligationId: string, completionReceipt: string): ReleaseReceipt {
    const object = this.#objects.get(ref.key);
    const fields = {
      key: ref.key,
      generation: ref.generation,
      obligation_id: obligationId,
      op_id: completionReceipt,
    };
    if (object === undefined) {
      const retry = ref.generation !== "" && this.#reclaimed.get(ref.key) === ref.generation;
      this.#emit("obligation.released", { ...fields, status: retry ? "already_reclaimed" : "absent" });
      return releaseReceipt(ref, obligationId, retry ? 0 : null, retry, false);
    }
    if (ref.generation !== object.generation) {
      this.#emit("obligation.released", { ...fields, status: "stale" });
      return releaseReceipt(ref, obligationId, null, false, true);
    }
    if (object.obligations === null) {
      this.#emit("obligation.released", { ...fields, status: "no_set" });
      return releaseReceipt(ref, obligationId, null, false, false);
    }
    this.#dropObligation(object, obligationId);
    this.#emit("obligation.released", { ...fields, status: "released" });
    if (object.obligations !== null) {
      return releaseReceipt(ref, obligationId, object.obligations.size, false, false);
    }
    this.#reclaim(ref.key, object, "released", completionReceipt);
    return releaseReceipt(ref, obligationId, 0, true, false);
  }

  /** Removes one obligation; an emptied set becomes absent, and the object's TTL can fire again. */
  #dropObligation(object: StoredObject, obligationId: string): void {
    object.obligations?.delete(obligationId);
    if (object.obligations?.size === 0) this.#dropSet(object);
  }

  #dropSet(object: StoredObject): void {
    object.obligations = null;
    this.#noteExpiry(object.expiresAt);
  }

  /** The object `ref` names, at its generation; ResourceUnavailable when it is gone or superseded. */
  #current(ref: ImmutablePayloadRef, action: string): StoredObject {
    const object = this.#objects.get(ref.key);
    if (object === undefined || object.generation !== ref.generation) {
      const why = object === undefined ? "is not stored" : `is now generation ${object.generation}`;
      throw new ResourceUnavailable(
        `cannot ${action} ${ref.key} generation ${JSON.stringify(ref.generation)}: the object ${why}`,
        "complete the ref with refForKey, or put the payload again",
        { key: ref.key, generation: ref.generation },
      );
    }
    return object;
  }

  /** Frees room for `size` bytes at `key` (whose `replacing` object goes), evicting only when evictable. */
  #makeRoom(key: string, size: number, replacing: StoredObject | undefined): void {
    if (this.#maxBytes === null) return;
    if (size > this.#maxBytes) {
      throw new ResourceUnavailable(
        `a ${size}-byte payload can never fit the store's ${this.#maxBytes}-byte budget`,
        "raise the store's memory budget, or keep payloads smaller",
        { key, size, max_bytes: this.#maxBytes },
      );
    }
    const budget = this.#maxBytes;
    const freed = replacing?.data.length ?? 0;
    const fits = () => this.#storedBytes - freed + size <= budget;
    if (fits()) return;
    if (this.#tier === PayloadTier.durable) {
      throw new PayloadBudgetExceeded(
        `the payload store is full: ${this.#storedBytes} of ${this.#maxBytes} bytes held, ${size} more asked`,
        "wait for readers to release what they hold (backpressure), or raise the budget",
        { key, size, max_bytes: this.#maxBytes, stored_bytes: this.#storedBytes },
      );
    }
    for (const [victimKey, victim] of [...this.#objects]) {
      if (fits()) break;
      if (victim === replacing) continue;
      this.#remove(victimKey, victim);
      this.#emit("payload.evicted", {
        key: victimKey,
        generation: victim.generation,
        reason: "memory pressure",
        status: victim.obligations === null ? "unclaimed" : `claimed by ${victim.obligations.size}`,
      });
    }
  }

  /**
   * Drops what the TTL has expired: in the durable tier only objects no obligation holds. Scans only when
   * the earliest expiry that can fire has come.
   */
  #sweep(): void {
    const now = this.#clock.now();
    if (now < this.#nextExpiry) return;
    let next = Infinity;
    for (const [key, object] of [...this.#objects]) {
      const pinned = this.#tier === PayloadTier.durable && object.obligations !== null;
      if (now >= object.expiresAt && !pinned) {
        this.#remove(key, object);
        this.#emit("payload.expired", { key, generation: object.generation });
      } else if (!pinned) {
        next = Math.min(next, object.expiresAt);
      }
    }
    this.#nextExpiry = next;
  }

  /** Records that an object may expire at `at` (a durable object whose set just became absent, a put). */
  #noteExpiry(at: number): void {
    this.#nextExpiry = Math.min(this.#nextExpiry, at);
  }

  #reclaim(key: string, object: StoredObject, reason: string, operationId: string): void {
    this.#remove(key, object);
    this.#reclaimed.set(key, object.generation);
    this.#emit("payload.reclaimed", { key, generation: object.generation, reason, op_id: operationId });
  }

  #remove(key: string, object: StoredObject): void {
    this.#objects.delete(key);
    this.#storedBytes -= object.data.length;
  }

  #touch(key: string, object: StoredObject): void {
    this.#objects.delete(key);
    this.#objects.set(key, object);
  }

  #replaceData(object: StoredObject, data: Uint8Array): void {
    this.#storedBytes += data.length - object.data.length;
    object.data = data;
  }

  #require(key: string): StoredObject {
    const object = this.#objects.get(key);
    if (object === undefined) throw new ConfigError(`no payload is stored at ${key}`, null, { key });
    return object;
  }

  #refOf(key: string, object: StoredObject): ImmutablePayloadRef {
    return payloadRef(this.#storeId, key, object.size, object.digest, object.generation, object.contentId);
  }

  #emit(kind: string, fields: Record<string, unknown>): void {
    this.#log?.emit(kind, fields);
  }
}

/** A ledger built from a mapping, for tests and simple runtimes; authoritative for every id unless told. */
export class StaticLedger implements ObligationLedger {
  readonly #required: ReadonlyMap<string, readonly string[]>;
  readonly #authoritative: (obligationId: string) => boolean;

  /** `required`: ref key → obligation ids still required; `authoritative` defaults to every id. */
  constructor(
    required: ReadonlyMap<string, readonly string[]> | Readonly<Record<string, readonly string[]>>,
    authoritative: (obligationId: string) => boolean = () => true,
  ) {
    const entries = required instanceof Map ? [...required] : Object.entries(required);
    this.#required = new Map(entries.map(([key, ids]) => [key, Object.freeze([...ids])]));
    this.#authoritative = authoritative;
  }

  requiredObligations(): Promise<ReadonlyMap<string, readonly string[]>> {
    return Promise.resolve(this.#required);
  }

  authoritative(obligationId: string): boolean {
    return this.#authoritative(obligationId);
  }
}
