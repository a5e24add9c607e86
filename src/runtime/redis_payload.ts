/**
 * The Redis PayloadStore (spec backends.payload; the reference's Redis blob store with RFC 0006
 * obligations): objects with digests and generations, named obligations instead of a counter, a TTL
 * backstop, orphan grace and reconciliation, every mutation an optimistic WATCH / MULTI / EXEC
 * transaction over the keys of one object. The rules are the memory model's (backends/memory/payload.ts,
 * durable tier); which tier a server plays is what its configuration says, read back by `capabilities()`.
 *
 * Keys of one object (the reference's `vf-blob-<id>` holds the bytes themselves, so a reference reader's
 * GET finds them):
 * ```
 * vf-blob-<id>           the bytes
 * vf-blob-<id>:meta      hash: size, digest, generation, content_id, put_at (epoch seconds)
 * vf-blob-<id>:obl       hash: obligation id -> deadline (epoch seconds); absent when no set is attached
 * vf-blob-<id>:gone      the generation whose obligations all ended, kept a day: answers a retried release
 * ```
 *
 * TTL backstop: an object without an obligation set (a TTL-only put, or an orphan whose put died before
 * its obligations were attached) carries the contract's TTL on the server, and the server drops it then.
 * Attaching an obligation makes the bytes and metadata persistent: an obligated object is never expired,
 * only reclaimed when its set empties (a release) or reconcile cancels what the ledger no longer owes.
 * A put stores the bytes (barrier `payload.write.after`), then attaches the contract's obligations
 * (`obligation.acquire.after`): two transactions, so a crash between them leaves the TTL-only orphan of
 * PAY-007, which reconcile reclaims only past the orphan grace.
 *
 * Time is the clock's wall reading (deadlines, put times, the orphan grace); the TTLs the server applies
 * are relative durations, so a test's FakeClock never makes the server expire anything early.
 *
 * Failures: a put, acquire or renew the server did not answer is UnobservableState (it may have taken
 * effect; a retry is idempotent); a read is TransientRead; a release is `unknown`; a server refusing a
 * write for lack of memory (`OOM`, maxmemory under noeviction) is {@link PayloadBudgetExceeded}.
 *
 * @module
 */

import type { Buffer } from "node:buffer";
import type { Redis } from "ioredis";
import { type PayloadCapabilities, payloadCapabilities } from "../backends/capabilities.ts";
import { type Clock, systemClock } from "../backends/clock.ts";
import { Barrier, barrier, type BarrierContext } from "../backends/faults.ts";
import { DEFAULT_ORPHAN_GRACE_SECONDS } from "../backends/memory/payload.ts";
import { known, type Observation, unknown } from "../backends/outcomes.ts";
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
} from "../backends/payload.ts";
import { ConfigError, ResourceUnavailable, TransientFailure, UnobservableState } from "../core/errors.ts";
import { randomHex } from "../core/hex.ts";
import {
  isReplyError,
  RedisConnection,
  type RedisConnectionOptions,
  type TransactionPlan,
} from "./redis_connection.ts";
import { readRedisDurability } from "./redis_durability.ts";
import { asBuffer, ownBytes } from "./redis_store.ts";

/** The store identity Redis refs carry unless the options name another. */
export const REDIS_PAYLOAD_STORE = "redis";

/** How long a reclaimed object's generation is remembered for a retried release, in seconds. */
export const RECLAIMED_MEMORY_SECONDS = 86_400;

/** What every object key starts with (WIRE.md). */
const OBJECT_PREFIX = "vf-blob-";
/** An object key: the prefix and an id without a `:` (what follows one names an auxiliary key). */
const OBJECT_KEY = /^vf-blob-[^:]+$/;
const SCAN_COUNT = 1000;

/** The server-side keys of the object at `key`. */
export interface RedisPayloadKeys {
  readonly bytes: string;
  readonly meta: string;
  readonly obligations: string;
  readonly reclaimed: string;
}

/** The keys the object stored at wire key `key` occupies (see the module comment). */
export function redisPayloadKeys(key: string): RedisPayloadKeys {
  return Object.freeze({
    bytes: key,
    meta: `${key}:meta`,
    obligations: `${key}:obl`,
    reclaimed: `${key}:gone`,
  });
}

/** Options of {@link RedisPayloadStore.open}. */
export interface RedisPayloadStoreOptions extends RedisConnectionOptions {
  /** Source of wall time (default: the system clock). */
  readonly clock?: Clock;
  /** A put of bytes whose content id and digest already exist shares the existing object (default true). */
  readonly forwardUnchanged?: boolean;
  /** The store identity refs carry (default {@link REDIS_PAYLOAD_STORE}). */
  readonly storeId?: string;
  /** How long an object without an obligation set is left alone by reconcile (default 60 s). */
  readonly orphanGraceSeconds?: number;
}

/** An object's metadata as stored; null fields were absent. */
interface Meta {
  readonly size: number;
  readonly digest: string;
  readonly generation: string;
  readonly contentId: string;
  readonly putAt: number;
}

const META_FIELDS = ["size", "digest", "generation", "content_id", "put_at"] as const;

function metaOf(fields: readonly (string | null)[]): Meta | null {
  const [size, digest, generation, contentId, putAt] = fields;
  if (generation === null || digest === null) return null;
  return {
    size: Number(size ?? 0),
    digest,
    generation,
    contentId: contentId ?? "",
    putAt: Number(putAt ?? 0),
  };
}

/** Whether `error` is the server refusing a write for lack of memory (alone or aborting a MULTI). */
function isOutOfMemory(error: unknown): boolean {
  if (isReplyError(error, "OOM")) return true;
  const previous = error instanceof Error
    ? (error as { previousErrors?: unknown }).previousErrors
    : undefined;
  return isReplyError(error, "EXECABORT") && Array.isArray(previous) &&
    previous.some((inner) => isReplyError(inner, "OOM"));
}

/** A PayloadStore over one Redis server (see the module comment for the layout and its guarantees). */
export class RedisPayloadStore implements PayloadStore {
  readonly #connection: RedisConnection;
  readonly #clock: Clock;
  readonly #forwardUnchanged: boolean;
  readonly #storeId: string;
  readonly #orphanGrace: number;

  private constructor(connection: RedisConnection, options: RedisPayloadStoreOptions) {
    this.#connection = connection;
    this.#clock = options.clock ?? systemClock;
    this.#forwardUnchanged = options.forwardUnchanged ?? true;
    this.#storeId = options.storeId ?? REDIS_PAYLOAD_STORE;
    this.#orphanGrace = options.orphanGraceSeconds ?? DEFAULT_ORPHAN_GRACE_SECONDS;
  }

  /**
   * A store over the server `url` names, connecting in the background. Throws ConfigError for a bad URL,
   * an empty store id or a negative orphan grace.
   */
  static open(url: string, options: RedisPayloadStoreOptions = {}): RedisPayloadStore {
    const grace = options.orphanGraceSeconds ?? DEFAULT_ORPHAN_GRACE_SECONDS;
    checkOrphanGrace(grace);
    if (options.storeId === "") throw new ConfigError("a payload store id must not be empty");
    return new RedisPayloadStore(RedisConnection.open(url, options), options);
  }

  async put(data: Uint8Array, contentId: string, terms: RetentionContract): Promise<ImmutablePayloadRef> {
    const contract = retentionContract(terms);
    if (!(data instanceof Uint8Array)) {
      throw new ConfigError("payload data must be a Uint8Array", "encode the payload to bytes first");
    }
    if (typeof contentId !== "string") throw new ConfigError("a content id must be a string");
    const digest = payloadDigest(data);
    const key = payloadKey(contentId, digest);
    const keys = redisPayloadKeys(key);
    const context = { key, payload_digest: digest };
    await barrier(Barrier.payloadWriteBefore, context);
    const now = this.#clock.now();
    const ttlMs = contract.ttlSeconds * 1000;
    const bytes = asBuffer(data);
    const ref = await this.#write(
      "put",
      key,
      [keys.bytes, keys.meta, keys.obligations],
      async (connection) => {
        const [[, exists], [, fields], [, hasSet], [, pttl]] = await this.#read(
          connection,
          (pipeline) =>
            pipeline.exists(keys.bytes).hmget(keys.meta, ...META_FIELDS).exists(keys.obligations).pttl(
              keys.bytes,
            ),
        ) as [[null, number], [null, (string | null)[]], [null, number], [null, number]];
        const existing = exists === 1 ? metaOf(fields) : null;
        if (existing !== null && this.#forwardUnchanged) {
          return {
            result: this.#refOf(key, existing),
            write: (multi) => {
              multi.hset(keys.meta, "put_at", String(now));
              if (hasSet === 0 && pttl >= 0 && pttl < ttlMs) {
                multi.pexpire(keys.bytes, ttlMs).pexpire(keys.meta, ttlMs);
              }
            },
          };
        }
        const meta: Meta = { size: data.length, digest, generation: randomHex(8), contentId, putAt: now };
        return {
          result: this.#refOf(key, meta),
          write: (multi) => {
            multi.del(keys.meta, keys.reclaimed);
            multi.hset(keys.meta, {
              size: String(meta.size),
              digest,
              generation: meta.generation,
              content_id: contentId,
              put_at: String(now),
            });
            if (hasSet === 1) multi.set(keys.bytes, bytes).persist(keys.meta);
            else multi.set(keys.bytes, bytes, "PX", ttlMs).pexpire(keys.meta, ttlMs);
          },
        };
      },
    );
    const stored = await barrier(Barrier.payloadWriteAfter, { ...context, generation: ref.generation });
    if (stored.dropResponse) throw lostPayloadReply("put", ref);
    if (contract.obligations.length > 0) {
      const deadline = now + Math.max(contract.ttlSeconds, contract.horizonSeconds);
      await this.#attach("put", ref, contract.obligations, deadline, false);
      const attached = await barrier(Barrier.obligationAcquireAfter, {
        ...context,
        generation: ref.generation,
      });
      if (attached.dropResponse) throw lostPayloadReply("put", ref);
    }
    return ref;
  }

  async read(ref: ImmutablePayloadRef): Promise<PayloadReadOutcome> {
    checkRefStore(ref, this.#storeId);
    try {
      const hit = await barrier(Barrier.payloadReadBefore, { key: ref.key, consumer: null });
      if (hit.dropResponse) return transientRead(ref, "the store's reply was lost");
    } catch (error) {
      if (error instanceof TransientFailure) return transientRead(ref, error.message);
      throw error;
    }
    const keys = redisPayloadKeys(ref.key);
    let replies: [Error | null, unknown][] | null;
    try {
      replies = await this.#connection.call(
        "read",
        (client) => client.multi().getBuffer(keys.bytes).hmget(keys.meta, "generation", "digest").exec(),
      );
    } catch (error) {
      return transientRead(ref, error instanceof Error ? error.message : String(error));
    }
    const [[, data], [, fields]] = replies as [[null, Buffer | null], [null, (string | null)[]]];
    if (data === null) return missingPayload(ref);
    const [generation, recorded] = fields;
    const expected = ref.digest !== "" && (generation === null || ref.generation === generation)
      ? ref.digest
      : recorded ?? "";
    const bytes = ownBytes(data);
    if (expected === "") return payloadBytes(ref, bytes, false);
    const actual = payloadDigest(bytes);
    return actual === expected ? payloadBytes(ref, bytes, true) : corruptPayload(ref, expected, actual);
  }

  async acquireObligation(
    ref: ImmutablePayloadRef,
    obligationId: string,
    deadline: number,
  ): Promise<DurableReceipt> {
    const held = await this.#claim("acquire", ref, obligationId, deadline, false);
    const hit = await barrier(Barrier.obligationAcquireAfter, {
      key: ref.key,
      generation: ref.generation,
      obligation_id: obligationId,
    });
    if (hit.dropResponse) throw lostPayloadReply("acquire", ref);
    return durableReceipt(ref, obligationId, held);
  }

  async renewObligation(
    ref: ImmutablePayloadRef,
    obligationId: string,
    deadline: number,
  ): Promise<DurableReceipt> {
    return durableReceipt(ref, obligationId, await this.#claim("renew", ref, obligationId, deadline, true));
  }

  async releaseObligation(
    ref: ImmutablePayloadRef,
    obligationId: string,
    completionReceipt: string,
  ): Promise<ReleaseReceipt> {
    checkRefStore(ref, this.#storeId);
    checkObligationIds([obligationId]);
    if (typeof completionReceipt !== "string") throw new ConfigError("a completion receipt must be a string");
    const context: BarrierContext = { key: ref.key, generation: ref.generation, obligation_id: obligationId };
    await barrier(Barrier.obligationReleaseBefore, context);
    const keys = redisPayloadKeys(ref.key);
    let receipt: ReleaseReceipt;
    try {
      receipt = await this.#connection.transaction(
        "release",
        [keys.bytes, keys.meta, keys.obligations],
        async (connection) => {
          const [[, exists], [, generation], [, reclaimed], [, held], [, size]] = await this.#read(
            connection,
            (pipeline) =>
              pipeline.exists(keys.bytes).hget(keys.meta, "generation").get(keys.reclaimed)
                .hexists(keys.obligations, obligationId).hlen(keys.obligations),
          ) as [[null, number], [null, string | null], [null, string | null], [null, number], [null, number]];
          if (exists === 0) {
            const retry = ref.generation !== "" && reclaimed === ref.generation;
            return { result: releaseReceipt(ref, obligationId, retry ? 0 : null, retry, false), write: null };
          }
          if (ref.generation !== (generation ?? "")) {
            return { result: releaseReceipt(ref, obligationId, null, false, true), write: null };
          }
          if (size === 0) {
            return { result: releaseReceipt(ref, obligationId, null, false, false), write: null };
          }
          const remaining = size - held;
          if (remaining > 0) {
            return {
              result: releaseReceipt(ref, obligationId, remaining, false, false),
              write: held === 1 ? (multi) => multi.hdel(keys.obligations, obligationId) : null,
            };
          }
          return {
            result: releaseReceipt(ref, obligationId, 0, true, false),
            write: (multi) => this.#reclaim(multi, keys, ref.generation),
          };
        },
      );
    } catch (error) {
      if (!(error instanceof UnobservableState)) throw error;
      return releaseReceipt(ref, obligationId, null, false, false, true);
    }
    const hit = await barrier(Barrier.obligationReleaseAfter, context);
    return hit.dropResponse ? releaseReceipt(ref, obligationId, null, false, false, true) : receipt;
  }

  /**
   * {@link PayloadStore.reconcile}'s rules, one transaction per object. A key without metadata (another
   * runtime's blob) is left to its own TTL and reported retained; with the inventory unreadable, or once
   * the server stops answering, the keys not yet judged (and every key the ledger lists) are unknown.
   */
  async reconcile(ledger: ObligationLedger, operationId: string): Promise<ReclamationObservation> {
    if (typeof operationId !== "string") throw new ConfigError("a reconcile operation id must be a string");
    const required = await ledger.requiredObligations();
    let keys: string[];
    try {
      keys = await this.#objectKeys();
    } catch (error) {
      if (!(error instanceof UnobservableState)) throw error;
      return reclamationObservation([], [], [...required.keys()]);
    }
    const reclaimed: string[] = [];
    const retained: string[] = [];
    const unjudged: string[] = [];
    for (const key of keys) {
      if (unjudged.length > 0) {
        unjudged.push(key);
        continue;
      }
      try {
        const outcome = await this.#reconcileOne(key, required.get(key), ledger);
        if (outcome === "reclaimed") reclaimed.push(key);
        else if (outcome === "retained") retained.push(key);
      } catch (error) {
        if (!(error instanceof UnobservableState)) throw error;
        unjudged.push(key);
      }
    }
    return reclamationObservation(reclaimed, retained, unjudged);
  }

  async inventory(): Promise<Observation<readonly ImmutablePayloadRef[]>> {
    try {
      const keys = await this.#objectKeys();
      const metas = await this.#connection.call(
        "inventory",
        (client) => Promise.all(keys.map((key) => client.hmget(redisPayloadKeys(key).meta, ...META_FIELDS))),
      );
      const refs = keys.map((key, i) => this.#refOf(key, metaOf(metas[i])));
      refs.sort((a, b) => a.key < b.key ? -1 : a.key > b.key ? 1 : 0);
      return known(Object.freeze(refs), this.#clock);
    } catch (error) {
      if (!(error instanceof UnobservableState)) throw error;
      const reason = error.context.reason === "timeout" ? "timeout" : "unreachable";
      return unknown(reason, this.#clock, `the payload inventory could not be listed: ${error.message}`);
    }
  }

  async refForKey(key: string): Promise<ImmutablePayloadRef> {
    const keys = redisPayloadKeys(key);
    let replies: [Error | null, unknown][] | null;
    try {
      replies = await this.#connection.call(
        "refForKey",
        (client) =>
          client.multi().strlen(keys.bytes).exists(keys.bytes).hmget(keys.meta, ...META_FIELDS).exec(),
      );
    } catch (error) {
      throw new TransientFailure(
        `the payload store could not complete the ref for ${key}: ${
          error instanceof Error ? error.message : error
        }`,
        "retry once the Redis server answers",
        { key, ref: key },
      );
    }
    const [[, length], [, exists], [, fields]] = replies as [
      [null, number],
      [null, number],
      [null, (string | null)[]],
    ];
    if (exists === 0) return payloadRef(this.#storeId, key, 0, "", "", "");
    return this.#refOf(
      key,
      metaOf(fields) ?? { size: length, digest: "", generation: "", contentId: "", putAt: 0 },
    );
  }

  /**
   * Read back from the server: durable with persistence on and noeviction, evictable under any other
   * policy, every figure Unknown(`auth`) when CONFIG is refused; multi-key transactions are atomic on a
   * server that is not a Cluster node (INFO cluster).
   */
  async capabilities(): Promise<PayloadCapabilities> {
    const durability = await readRedisDurability(this.#connection, this.#clock);
    let atomicMultikey: Observation<boolean>;
    try {
      const info = await this.#connection.call("INFO cluster", (client) => client.info("cluster"));
      const enabled = /cluster_enabled:(\d)/.exec(info)?.[1];
      atomicMultikey = enabled === undefined
        ? unknown("malformed", this.#clock, "INFO cluster did not say whether cluster mode is on")
        : known(enabled === "0", this.#clock);
    } catch (error) {
      if (!(error instanceof UnobservableState) && !isReplyError(error)) throw error;
      atomicMultikey = unknown(isReplyError(error) ? "auth" : "unreachable", this.#clock, String(error));
    }
    return payloadCapabilities({
      adapter: REDIS_PAYLOAD_STORE,
      durable: durability.durable,
      evictable: durability.evictable,
      atomicMultikey,
      maxObjectBytes: durability.maxValueBytes,
      readerIdentities: true,
      referenceForwarding: this.#forwardUnchanged,
    }, this.#clock);
  }

  /** Closes the store's connections; commands in flight are answered or fail. Idempotent. */
  close(): Promise<void> {
    return this.#connection.close();
  }

  /** Adds or extends one obligation (a renewal requires it held); the deadline it now holds. */
  async #claim(
    operation: string,
    ref: ImmutablePayloadRef,
    obligationId: string,
    deadline: number,
    renewal: boolean,
  ): Promise<number> {
    checkRefStore(ref, this.#storeId);
    checkObligationIds([obligationId]);
    checkObligationDeadline(deadline);
    const held = await this.#attach(operation, ref, [obligationId], deadline, renewal);
    return held[0];
  }

  /**
   * Attaches `ids` to the current object of `ref`, each keeping its later deadline, and makes the object
   * persistent; the deadlines held. ResourceUnavailable when the object is gone or superseded, or (a
   * renewal) when the obligation is not held.
   */
  #attach(
    operation: string,
    ref: ImmutablePayloadRef,
    ids: readonly string[],
    deadline: number,
    renewal: boolean,
  ): Promise<number[]> {
    const keys = redisPayloadKeys(ref.key);
    return this.#write(operation, ref.key, [keys.bytes, keys.meta, keys.obligations], async (connection) => {
      const [[, exists], [, generation], [, current]] = await this.#read(
        connection,
        (pipeline) =>
          pipeline.exists(keys.bytes).hget(keys.meta, "generation").hmget(keys.obligations, ...ids),
      ) as [[null, number], [null, string | null], [null, (string | null)[]]];
      if (exists === 0 || generation !== ref.generation) {
        const why = exists === 0 || generation === null ? "is not stored" : `is now generation ${generation}`;
        throw new ResourceUnavailable(
          `cannot ${operation} an obligation on ${ref.key} generation ${JSON.stringify(ref.generation)}: ` +
            `the object ${why}`,
          "complete the ref with refForKey, or put the payload again",
          { key: ref.key, generation: ref.generation },
        );
      }
      if (renewal && current[0] === null) {
        throw new ResourceUnavailable(
          `obligation ${ids[0]} is not held on ${ref.key}`,
          "acquire the obligation before renewing it",
          { key: ref.key, obligation_id: ids[0] },
        );
      }
      const held = ids.map((_, i) => Math.max(Number(current[i] ?? deadline), deadline));
      return {
        result: held,
        write: (multi) => {
          multi.hset(keys.obligations, Object.fromEntries(ids.map((id, i) => [id, String(held[i])])));
          multi.persist(keys.bytes).persist(keys.meta);
        },
      };
    });
  }

  /** Judges one object against the ledger and applies what it decided. */
  #reconcileOne(
    key: string,
    listed: readonly string[] | undefined,
    ledger: ObligationLedger,
  ): Promise<"reclaimed" | "retained" | "gone"> {
    const keys = redisPayloadKeys(key);
    const now = this.#clock.now();
    return this.#connection.transaction(
      "reconcile",
      [keys.bytes, keys.meta, keys.obligations],
      async (connection) => {
        const [[, exists], [, fields], [, set]] = await this.#read(
          connection,
          (pipeline) =>
            pipeline.exists(keys.bytes).hmget(keys.meta, ...META_FIELDS).hgetall(keys.obligations),
        ) as [
          [null, number],
          [null, (string | null)[]],
          [null, Record<string, string>],
        ];
        const meta = metaOf(fields);
        if (exists === 0) return { result: "gone" as const, write: null };
        if (meta === null) return { result: "retained" as const, write: null };
        const held = Object.keys(set);
        const cancelled = held.filter((id) => {
          const owed = listed !== undefined ? listed.includes(id) : !isIntentObligation(id);
          return !owed && ledger.authoritative(id);
        });
        const remaining = held.length - cancelled.length;
        const hadSet = held.length > 0;
        const keep = remaining > 0 || (listed !== undefined && listed.length > 0) ||
          (!hadSet && now - meta.putAt <= this.#orphanGrace);
        if (keep) {
          return {
            result: "retained" as const,
            write: cancelled.length === 0 ? null : (multi) => multi.hdel(keys.obligations, ...cancelled),
          };
        }
        return {
          result: "reclaimed" as const,
          write: (multi) => this.#reclaim(multi, keys, meta.generation),
        };
      },
    );
  }

  /** Every object key on the server (SCAN, never KEYS), auxiliary keys left out, sorted. */
  async #objectKeys(): Promise<string[]> {
    const found = new Set<string>();
    await this.#connection.call("inventory", async (client) => {
      let cursor = "0";
      do {
        const [next, names] = await client.scan(cursor, "MATCH", `${OBJECT_PREFIX}*`, "COUNT", SCAN_COUNT);
        for (const name of names) if (OBJECT_KEY.test(name)) found.add(name);
        cursor = next;
      } while (cursor !== "0");
    });
    return [...found].sort();
  }

  /** Queues the removal of an object whose obligations all ended, remembering its generation. */
  #reclaim(multi: ReturnType<Redis["multi"]>, keys: RedisPayloadKeys, generation: string): void {
    multi.del(keys.bytes, keys.meta, keys.obligations);
    multi.set(keys.reclaimed, generation, "EX", RECLAIMED_MEMORY_SECONDS);
  }

  /** Pipelined reads on a transaction's connection, each reply's error thrown. */
  async #read(
    connection: Redis,
    queue: (pipeline: ReturnType<Redis["pipeline"]>) => ReturnType<Redis["pipeline"]>,
  ): Promise<[Error | null, unknown][]> {
    const replies = await queue(connection.pipeline()).exec() ?? [];
    for (const [error] of replies) if (error !== null) throw error;
    return replies;
  }

  /** A write transaction; a server out of memory is {@link PayloadBudgetExceeded}. */
  async #write<T>(
    operation: string,
    key: string,
    watched: readonly string[],
    plan: (connection: Redis) => Promise<TransactionPlan<T>>,
  ): Promise<T> {
    try {
      return await this.#connection.transaction(operation, watched, plan);
    } catch (error) {
      if (!isOutOfMemory(error)) throw error;
      throw new PayloadBudgetExceeded(
        `the Redis server at ${this.#connection.where} is out of memory and refused ${operation} ${key}`,
        "wait for readers to release what they hold (backpressure), or raise the server's maxmemory",
        { key, operation },
      );
    }
  }

  #refOf(key: string, meta: Meta | null): ImmutablePayloadRef {
    if (meta === null) return payloadRef(this.#storeId, key, 0, "", "", "");
    return payloadRef(this.#storeId, key, meta.size, meta.digest, meta.generation, meta.contentId);
  }
}
