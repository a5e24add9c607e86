/**
 * Sink effect markers on a Redis server (spec runtime.idempotency RedisIdempotencyStore, RUN-017): the
 * marker of a key is the Redis key itself (WIRE.md: `vf-idem-` + the SHA-256 hex of
 * `{flow}:{node}:{message_id}`, as {@link idempotencyKey} builds it), set with `SET NX EX` to expire after
 * the retention (24 h by default), so a reference worker and a Deno worker sharing the server see each
 * other's markers. Of two writers marking one key, exactly one `SET NX` succeeds.
 *
 * A marker is evidence that this runtime applied the effect, never a certificate of exactly-once (see
 * idempotency.ts). A read or mark the server did not answer throws UnobservableState: "seen" is never
 * guessed.
 *
 * @example
 * ```ts
 * const effects = RedisIdempotencyStore.open("redis://127.0.0.1:6379");
 * const key = idempotencyKey("flow-A", "sink", messageId);
 * if (!(await effects.seen(key))) {
 *   await writeRow(record);
 *   await effects.mark(key);
 * }
 * ```
 *
 * @module
 */

import { ConfigError } from "../core/errors.ts";
import { effectRetention, type IdempotencyStore } from "./idempotency.ts";
import { RedisConnection, type RedisConnectionOptions } from "./redis_connection.ts";

export { idempotencyKey } from "./idempotency.ts";

/** Options of {@link RedisIdempotencyStore.open}. */
export interface RedisIdempotencyStoreOptions extends RedisConnectionOptions {
  /** How long a marker is kept, in seconds (default 86400); the server rounds it up to whole seconds. */
  readonly retentionSeconds?: number;
}

function checkKey(key: string): void {
  if (typeof key !== "string" || key.length === 0) {
    throw new ConfigError("an idempotency key must be a non-empty string", "build it with idempotencyKey");
  }
}

/** Effect markers as expiring Redis keys (see the module comment). */
export class RedisIdempotencyStore implements IdempotencyStore {
  /** How long a marker is kept, in seconds. */
  readonly retentionSeconds: number;
  readonly #connection: RedisConnection;

  private constructor(connection: RedisConnection, retentionSeconds: number) {
    this.#connection = connection;
    this.retentionSeconds = retentionSeconds;
  }

  /** A store on the server `url` names. Throws ConfigError for a bad URL or retention. */
  static open(url: string, options: RedisIdempotencyStoreOptions = {}): RedisIdempotencyStore {
    const retention = effectRetention(options.retentionSeconds);
    return new RedisIdempotencyStore(RedisConnection.open(url, options), retention);
  }

  async seen(key: string): Promise<boolean> {
    checkKey(key);
    return await this.#connection.call("seen", (client) => client.exists(key)) === 1;
  }

  async mark(key: string): Promise<boolean> {
    checkKey(key);
    const seconds = Math.ceil(this.retentionSeconds);
    const reply = await this.#connection.call("mark", (client) => client.set(key, "1", "EX", seconds, "NX"));
    return reply === "OK";
  }

  /** Closes the store's connections. Idempotent. */
  close(): Promise<void> {
    return this.#connection.close();
  }
}
