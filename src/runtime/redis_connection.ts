/**
 * One Redis server as the Redis stores reach it (spec runtime.redis_runtime_store; the payload store):
 * an ioredis client for single commands and pipelines, a small pool of dedicated connections for
 * optimistic transactions, and every failure typed.
 *
 * WATCH belongs to a connection, and ioredis multiplexes every caller over one, so two transactions on one
 * connection would watch each other's keys and the first EXEC would unwatch the second's: each
 * transaction here runs alone on a pooled connection, and a connection whose transaction failed midway
 * (a timeout, a lost link) is closed rather than reused, so no half-open MULTI or stale WATCH carries over.
 *
 * ioredis facts relied on (ioredis 6.0.0, `node_modules/ioredis/built/`): `commandTimeout` rejects a
 * command's promise with "Command timed out" while the command stays queued, so a late reply is matched
 * to it and dropped (Redis.js sendCommand, Command.js setTimeout); `autoResendUnfulfilledCommands: false`
 * keeps a reconnect from sending a write a second time; a nil EXEC (a watched key changed) resolves to
 * null; a reply error is a `ReplyError` (redis-errors), whose message starts with the server's code.
 *
 * @module
 */

import { Redis } from "ioredis";
import type { ChainableCommander } from "ioredis";
import { redactedUrl } from "../core/checks.ts";
import { ConfigError, UnobservableState } from "../core/errors.ts";

/** The URL schemes a Redis store opens: plain TCP and TLS. */
export const REDIS_SCHEMES: readonly string[] = ["redis", "rediss"];

/**
 * Rounds a transaction tries when a watched key changed under it (another writer's touch, not the
 * caller's mismatch, which the first round reports) before its outcome is reported unobservable.
 */
export const TRANSACTION_RETRIES = 8;

/** How long a command may wait for its reply by default, in seconds; past it the outcome is unknown. */
export const DEFAULT_COMMAND_TIMEOUT_SECONDS = 5;

/** Dedicated connections a {@link RedisConnection} opens at most for transactions in flight. */
const TRANSACTION_CONNECTIONS = 4;

/** What {@link RedisConnection.open} takes. */
export interface RedisConnectionOptions {
  /** How long a command may wait for its reply, in seconds (default {@link DEFAULT_COMMAND_TIMEOUT_SECONDS}). */
  readonly commandTimeoutSeconds?: number;
}

/** What one round of a transaction decided: its result, and the writes (none: nothing to change). */
export interface TransactionPlan<T> {
  readonly result: T;
  readonly write: ((multi: ChainableCommander) => void) | null;
}

/** A reply the server gave as an error (its message starts with the code: `OOM`, `NOPERM`, `ERR`). */
export function isReplyError(error: unknown, code?: string): error is Error {
  if (!(error instanceof Error) || error.name !== "ReplyError") return false;
  return code === undefined || error.message.startsWith(`${code} `);
}

/** Throws {@link ConfigError} unless `url` is a `redis://` or `rediss://` URL. */
export function checkRedisUrl(url: string): void {
  let scheme: string | null = null;
  try {
    scheme = new URL(url).protocol.slice(0, -1).toLowerCase();
  } catch {
    scheme = null;
  }
  if (scheme === null || !REDIS_SCHEMES.includes(scheme)) {
    throw new ConfigError(
      `${JSON.stringify(redactedUrl(url))} is not a redis:// or rediss:// URL`,
      "give the Redis server as redis://[user:password@]host:port[/db] (rediss:// for TLS)",
      { url: redactedUrl(url) },
    );
  }
}

/**
 * A client of one Redis server: {@link call} for commands, {@link transaction} for optimistic
 * WATCH/MULTI/EXEC rounds. Every failure of the server or the link becomes {@link UnobservableState}
 * (reason `timeout` when the reply did not come in time, `unreachable` otherwise); a reply error is
 * passed on for the store to judge.
 */
export class RedisConnection {
  /** The URL without credentials, for messages. */
  readonly where: string;
  readonly #url: string;
  readonly #timeoutMs: number;
  readonly #client: Redis;
  readonly #idle: Redis[] = [];
  readonly #waiters: ((connection: Redis) => void)[] = [];
  #opened = 0;
  #closed = false;

  private constructor(url: string, timeoutMs: number) {
    this.#url = url;
    this.where = redactedUrl(url);
    this.#timeoutMs = timeoutMs;
    this.#client = this.#connect();
  }

  /** A client of the server `url` names (connecting in the background). Throws ConfigError for a bad URL. */
  static open(url: string, options: RedisConnectionOptions = {}): RedisConnection {
    checkRedisUrl(url);
    const seconds = options.commandTimeoutSeconds ?? DEFAULT_COMMAND_TIMEOUT_SECONDS;
    if (!Number.isFinite(seconds) || seconds <= 0) {
      throw new ConfigError(`a Redis command timeout must be positive seconds, got ${seconds}`);
    }
    return new RedisConnection(url, Math.ceil(seconds * 1000));
  }

  /** Runs `body` on the shared client; a failure of the server or the link is {@link UnobservableState}. */
  async call<T>(operation: string, body: (client: Redis) => Promise<T>): Promise<T> {
    try {
      return await body(this.#client);
    } catch (error) {
      throw this.failure(operation, error);
    }
  }

  /**
   * One optimistic transaction: WATCH `keys` on a dedicated connection, let `plan` read (on that
   * connection) and decide, then apply its writes in MULTI/EXEC. A nil EXEC (a watched key changed) starts
   * a new round, up to {@link TRANSACTION_RETRIES}; then, and on any failure midway, the outcome is
   * {@link UnobservableState} (a reply error inside EXEC is thrown as it is).
   */
  async transaction<T>(
    operation: string,
    keys: readonly string[],
    plan: (connection: Redis) => Promise<TransactionPlan<T>>,
  ): Promise<T> {
    for (let round = 0; round < TRANSACTION_RETRIES; round++) {
      const connection = await this.#acquire();
      let healthy = false;
      try {
        await connection.watch(...keys);
        const decided = await plan(connection);
        if (decided.write === null) {
          await connection.unwatch();
          healthy = true;
          return decided.result;
        }
        const multi = connection.multi();
        decided.write(multi);
        const replies = await multi.exec();
        healthy = true;
        if (replies === null) continue;
        for (const [error] of replies) if (error !== null) throw error;
        return decided.result;
      } catch (error) {
        if (isReplyError(error)) throw error;
        throw this.failure(operation, error);
      } finally {
        this.#release(connection, healthy);
      }
    }
    throw new UnobservableState(
      `${operation} on the Redis server at ${this.where} lost ${TRANSACTION_RETRIES} rounds to other writers`,
      "re-read before deciding: nothing of this call was applied, but the state moved meanwhile",
      { where: this.where, operation, reason: "timeout" },
    );
  }

  /** `error` as {@link UnobservableState} naming the server and the operation (a typed error unchanged). */
  failure(operation: string, error: unknown): unknown {
    if (error instanceof UnobservableState || error instanceof ConfigError || isReplyError(error)) {
      return error;
    }
    const message = error instanceof Error ? error.message : String(error);
    const reason = /timed out/i.test(message) ? "timeout" : "unreachable";
    return new UnobservableState(
      `the Redis server at ${this.where} did not answer ${operation}: ${message}`,
      "check that the server is up and reachable; re-read before deciding, a write may have taken effect",
      { where: this.where, operation, reason },
    );
  }

  /** Closes every connection; commands in flight are answered or fail. Idempotent. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const all = [this.#client, ...this.#idle.splice(0)];
    await Promise.allSettled(all.map((connection) => connection.quit()));
    for (const connection of all) connection.disconnect();
  }

  #connect(): Redis {
    const connection = new Redis(this.#url, {
      commandTimeout: this.#timeoutMs,
      connectTimeout: this.#timeoutMs,
      maxRetriesPerRequest: 1,
      autoResendUnfulfilledCommands: false,
    });
    // Link errors reach every command in flight as a rejection; the event itself needs a listener only.
    connection.on("error", () => {});
    return connection;
  }

  #acquire(): Promise<Redis> {
    if (this.#closed) {
      return Promise.reject(
        new UnobservableState(`the Redis connection to ${this.where} is closed`, null, { where: this.where }),
      );
    }
    const idle = this.#idle.pop();
    if (idle !== undefined) return Promise.resolve(idle);
    if (this.#opened < TRANSACTION_CONNECTIONS) {
      this.#opened++;
      return Promise.resolve(this.#connect());
    }
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  #release(connection: Redis, healthy: boolean): void {
    let next = connection;
    if (!healthy || this.#closed) {
      connection.disconnect();
      if (this.#closed) {
        this.#opened--;
        return;
      }
      next = this.#connect();
    }
    const waiter = this.#waiters.shift();
    if (waiter !== undefined) waiter(next);
    else this.#idle.push(next);
  }
}
