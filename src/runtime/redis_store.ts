/**
 * The Redis RuntimeStore (spec runtime.redis_runtime_store, URL `redis://` / `rediss://`): the run ledger
 * for workers spread across hosts (RFC 0006 CTRL-4, ENV-10).
 *
 * Layout, every name under the store's prefix (default {@link DEFAULT_REDIS_RUNTIME_PREFIX}, so a ledger
 * never collides with the payload store sharing the server):
 * ```
 * <prefix>k:<key>   a hash: `value` (the bytes) and `version`
 * <prefix>l:<log>   a list, one element per appended record, oldest first
 * ```
 * Every mutation of a key is one optimistic WATCH / MULTI / EXEC transaction on that one key, so a
 * compare-and-swap is decided on the version the server holds and, of racing writers with one expected
 * version, exactly one EXEC is applied. A version mismatch is answered after the first round; a round
 * lost to another writer's touch is retried ({@link TRANSACTION_RETRIES}). No Lua and no command naming
 * two keys, so a Redis Cluster can host the layout. An append is one RPUSH, whose reply is the log's new
 * length; `scan` pages with SCAN (never KEYS) and reads each key it found, skipping one deleted meanwhile.
 *
 * ABA: a version is `<counter>.<random 64-bit nonce>`, the counter one above the version it replaces; a
 * key deleted and created again restarts its counter but never its nonce, so a version read before the
 * delete never matches afterwards.
 *
 * A command unanswered within the timeout (a paused or lost server) is UnobservableState: the write may
 * or may not have been applied, and the caller re-reads. Durability is read back from the server
 * (redis_durability.ts), never declared.
 *
 * @module
 */

import { Buffer } from "node:buffer";
import { type Clock, systemClock } from "../backends/clock.ts";
import type { Observation } from "../backends/outcomes.ts";
import {
  ABSENT,
  afterLedgerWrite,
  beforeLedgerWrite,
  checkStoreName,
  compareRecordKeys,
  presentEntry,
  type RuntimeCapabilities,
  runtimeCapabilities,
  type RuntimeStore,
  storeClosedError,
  type StoredRecord,
  storedRecord,
  type StoreEntry,
} from "../backends/runtime_store.ts";
import { randomHex } from "../core/hex.ts";
import { UnobservableState } from "../core/errors.ts";
import { isReplyError, RedisConnection, type RedisConnectionOptions } from "./redis_connection.ts";
import { readRedisDurability } from "./redis_durability.ts";

export { TRANSACTION_RETRIES } from "./redis_connection.ts";

/** What every server-side name of a ledger starts with unless the options name another. */
export const DEFAULT_REDIS_RUNTIME_PREFIX = "vfrt:";

/** Keys a SCAN round asks the server for (a hint; Redis may return more or fewer). */
const SCAN_COUNT = 1000;

const STORE = "redis";

/**
 * What a Redis runtime store guarantees, `durable` as read back (or Unknown where nobody read it): shared by
 * every process on every host that reaches the server, so restart-safe joins and elastic state.
 */
export function redisRuntimeCapabilities(durable: Observation<boolean>): RuntimeCapabilities {
  return runtimeCapabilities(STORE, durable, true, true, true);
}

/** Options of {@link RedisRuntimeStore.open}. */
export interface RedisRuntimeStoreOptions extends RedisConnectionOptions {
  /** Stamps the capabilities observation (default: the system clock). */
  readonly clock?: Clock;
  /** What every server-side name starts with (default {@link DEFAULT_REDIS_RUNTIME_PREFIX}). */
  readonly prefix?: string;
}

/** Bytes as ioredis sends them, without a copy. */
export function asBuffer(bytes: Uint8Array): Buffer {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/** A reply's bytes as a plain Uint8Array of their own. */
export function ownBytes(buffer: Uint8Array): Uint8Array {
  return new Uint8Array(buffer);
}

/** `text` with Redis glob metacharacters escaped, so a SCAN MATCH pattern takes it literally. */
export function globEscape(text: string): string {
  return text.replace(/[*?[\]\\]/g, (c) => `\\${c}`);
}

/** The version that replaces `previous` (null: the key is being created). */
function nextVersion(previous: string | null): string {
  const counter = previous === null ? 0 : Number.parseInt(previous, 10);
  return `${(Number.isSafeInteger(counter) ? counter : 0) + 1}.${randomHex(8)}`;
}

/** A RuntimeStore over one Redis server (see the module comment for the layout and its guarantees). */
export class RedisRuntimeStore implements RuntimeStore {
  readonly #connection: RedisConnection;
  readonly #clock: Clock;
  readonly #keyPrefix: string;
  readonly #logPrefix: string;
  readonly #inFlight = new Set<Promise<unknown>>();
  #closing: Promise<void> | null = null;

  private constructor(connection: RedisConnection, clock: Clock, prefix: string) {
    this.#connection = connection;
    this.#clock = clock;
    this.#keyPrefix = `${prefix}k:`;
    this.#logPrefix = `${prefix}l:`;
  }

  /**
   * A store over the server `url` names (`redis://` or `rediss://`), connecting in the background; an
   * unreachable server shows as UnobservableState on the first call. Throws ConfigError for a bad URL.
   */
  static open(url: string, options: RedisRuntimeStoreOptions = {}): RedisRuntimeStore {
    const connection = RedisConnection.open(url, options);
    return new RedisRuntimeStore(
      connection,
      options.clock ?? systemClock,
      options.prefix ?? DEFAULT_REDIS_RUNTIME_PREFIX,
    );
  }

  get(key: string): Promise<StoreEntry> {
    return this.#operation("get", async () => {
      checkStoreName("key", key);
      const [value, version] = await this.#connection.call(
        "get",
        (client) => client.hmgetBuffer(this.#keyPrefix + key, "value", "version"),
      );
      return this.#entry(key, value, version);
    });
  }

  cas(key: string, expectedVersion: string | null, value: Uint8Array): Promise<boolean> {
    return this.#operation("cas", async () => {
      checkStoreName("key", key);
      const bytes = asBuffer(value);
      const name = this.#keyPrefix + key;
      await beforeLedgerWrite(STORE, "cas", key);
      const swapped = await this.#connection.transaction("cas", [name], async (connection) => {
        const current = (await connection.hget(name, "version")) ?? null;
        if (current !== expectedVersion) return { result: false, write: null };
        const version = nextVersion(current);
        return { result: true, write: (multi) => multi.hset(name, "value", bytes, "version", version) };
      });
      if (swapped) await afterLedgerWrite(STORE, "cas", key);
      return swapped;
    });
  }

  delete(key: string, expectedVersion: string | null): Promise<boolean> {
    return this.#operation("delete", async () => {
      checkStoreName("key", key);
      const name = this.#keyPrefix + key;
      await beforeLedgerWrite(STORE, "delete", key);
      const removed = await this.#connection.transaction("delete", [name], async (connection) => {
        const current = (await connection.hget(name, "version")) ?? null;
        if (current === null || (expectedVersion !== null && current !== expectedVersion)) {
          return { result: false, write: null };
        }
        return { result: true, write: (multi) => multi.del(name) };
      });
      if (removed) await afterLedgerWrite(STORE, "delete", key);
      return removed;
    });
  }

  scan(prefix: string): Promise<readonly StoredRecord[]> {
    return this.#operation("scan", async () => {
      checkStoreName("prefix", prefix);
      const pattern = `${globEscape(this.#keyPrefix + prefix)}*`;
      const names = new Set<string>();
      await this.#connection.call("scan", async (client) => {
        let cursor = "0";
        do {
          const [next, found] = await client.scan(cursor, "MATCH", pattern, "COUNT", SCAN_COUNT);
          for (const name of found) names.add(name);
          cursor = next;
        } while (cursor !== "0");
      });
      const ordered = [...names];
      const replies = await this.#connection.call(
        "scan",
        (client) => Promise.all(ordered.map((name) => client.hmgetBuffer(name, "value", "version"))),
      );
      const records: StoredRecord[] = [];
      ordered.forEach((name, i) => {
        const key = name.slice(this.#keyPrefix.length);
        const entry = this.#entry(key, replies[i][0], replies[i][1]);
        if (entry.kind === "present") records.push(storedRecord(key, entry.value, entry.version));
      });
      return records.sort(compareRecordKeys);
    });
  }

  append(log: string, record: Uint8Array): Promise<number> {
    return this.#operation("append", async () => {
      checkStoreName("log", log);
      const bytes = asBuffer(record);
      await beforeLedgerWrite(STORE, "append", log);
      const length = await this.#connection.call(
        "append",
        (client) => client.rpush(this.#logPrefix + log, bytes),
      );
      await afterLedgerWrite(STORE, "append", log);
      return length;
    });
  }

  logEntries(log: string): Promise<readonly Uint8Array[]> {
    return this.#operation("logEntries", async () => {
      checkStoreName("log", log);
      const records = await this.#connection.call(
        "logEntries",
        (client) => client.lrangeBuffer(this.#logPrefix + log, 0, -1),
      );
      return records.map(ownBytes);
    });
  }

  /**
   * Durable as read back from the server (persistence on and noeviction: Known(true); CONFIG refused:
   * Unknown(`auth`)); shared by every process on every host that reaches the server, so restart-safe joins
   * and elastic state.
   */
  capabilities(): Promise<RuntimeCapabilities> {
    return this.#operation("capabilities", async () => {
      const { durable } = await readRedisDurability(this.#connection, this.#clock);
      return redisRuntimeCapabilities(durable);
    });
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight]);
      await this.#connection.close();
    })();
    return this.#closing;
  }

  /** A key's entry from its hash fields; a hash without both is damage from outside, never absence. */
  #entry(key: string, value: Uint8Array | null, version: Uint8Array | null): StoreEntry {
    if (value === null && version === null) return ABSENT;
    if (value === null || version === null) {
      throw new UnobservableState(
        `key ${JSON.stringify(key)} in the Redis runtime store at ${this.#connection.where} is malformed: ` +
          `its hash lacks the ${value === null ? "value" : "version"}`,
        "the ledger was changed outside videoflow; remove the run's keys to start the run afresh",
        { key, reason: "malformed" },
      );
    }
    return presentEntry(ownBytes(value), new TextDecoder().decode(version));
  }

  /** Runs one public operation: refused after close, tracked for close, a server's error reply typed. */
  #operation<T>(operation: string, body: () => Promise<T>): Promise<T> {
    if (this.#closing !== null) return Promise.reject(storeClosedError(STORE, operation));
    const run = Promise.try(body).catch((error: unknown) => {
      if (!isReplyError(error)) throw error;
      throw new UnobservableState(
        `the Redis server at ${this.#connection.where} refused ${operation}: ${error.message}`,
        "check the server's ACL and that nothing else writes under the ledger's prefix",
        { where: this.#connection.where, operation, reason: "malformed" },
      );
    });
    this.#inFlight.add(run);
    const forget = () => this.#inFlight.delete(run);
    run.then(forget, forget);
    return run;
  }
}
