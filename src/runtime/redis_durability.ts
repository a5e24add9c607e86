/**
 * What a Redis server guarantees, read back from it, never declared (spec runtime.redis_runtime_store,
 * backends.capabilities PayloadCapabilities): `CONFIG GET appendonly`, `appendfsync`, `save`,
 * `maxmemory-policy` and `proto-max-bulk-len`.
 *
 * Durable (an acknowledged write outlives a restart of the server and is never evicted) is Known(true)
 * only with persistence on (`appendonly yes` or an RDB `save` schedule) and `maxmemory-policy
 * noeviction`, Known(false) otherwise. A server that refuses CONFIG (an ACL without it, a renamed
 * command: a managed Redis) leaves every figure Unknown(`auth`); an unanswered read leaves them Unknown
 * with the link's reason. Neither is ever taken for durable.
 *
 * @module
 */

import type { Clock } from "../backends/clock.ts";
import { known, type Observation, unknown, type UnknownReason } from "../backends/outcomes.ts";
import { isRecord } from "../core/checks.ts";
import { UnobservableState } from "../core/errors.ts";
import { isReplyError, type RedisConnection } from "./redis_connection.ts";

/** The eviction policy under which Redis refuses a write rather than drop a key. */
export const NO_EVICTION = "noeviction";

/** What a Redis server's configuration guarantees, as read back. */
export interface RedisDurability {
  /** Persistence on and no eviction. */
  readonly durable: Observation<boolean>;
  /** Whether the server may drop keys under memory pressure (any policy but `noeviction`). */
  readonly evictable: Observation<boolean>;
  /** The largest value the server accepts (`proto-max-bulk-len`); null when it could not be read. */
  readonly maxValueBytes: number | null;
  /** The settings read, for messages and events (empty when none could be). */
  readonly settings: Readonly<Record<string, string>>;
}

const SETTINGS = ["appendonly", "appendfsync", "save", "maxmemory-policy", "proto-max-bulk-len"] as const;

/** Why a CONFIG read failed, as an Unknown reason: refused (auth), unanswered, or unexpected. */
function unreadReason(error: unknown): UnknownReason {
  if (isReplyError(error, "NOPERM") || (isReplyError(error) && /unknown command/i.test(error.message))) {
    return "auth";
  }
  if (error instanceof UnobservableState) {
    const reason = error.context.reason;
    return reason === "timeout" ? "timeout" : "unreachable";
  }
  return "malformed";
}

/** Reads the server's persistence and eviction settings through `connection`, stamped by `clock`. */
export async function readRedisDurability(
  connection: RedisConnection,
  clock: Clock,
): Promise<RedisDurability> {
  let settings: Record<string, string>;
  try {
    const replies = await connection.call(
      "CONFIG GET",
      (client) => Promise.all(SETTINGS.map((name) => client.config("GET", name))),
    );
    settings = {};
    for (const reply of replies) {
      const pairs = Array.isArray(reply) ? reply : isRecord(reply) ? Object.entries(reply).flat() : [];
      for (let i = 0; i + 1 < pairs.length; i += 2) settings[String(pairs[i])] = String(pairs[i + 1]);
    }
  } catch (error) {
    const reason = unreadReason(error);
    const detail = `CONFIG GET on ${connection.where} failed: ${
      error instanceof Error ? error.message : error
    }`;
    const unread = unknown(reason, clock, detail);
    return Object.freeze({ durable: unread, evictable: unread, maxValueBytes: null, settings: {} });
  }
  const policy = settings["maxmemory-policy"];
  if (settings.appendonly === undefined || settings.save === undefined || policy === undefined) {
    const missing = unknown(
      "malformed",
      clock,
      `CONFIG GET on ${connection.where} did not name every setting`,
    );
    return Object.freeze({ durable: missing, evictable: missing, maxValueBytes: null, settings });
  }
  const persistent = settings.appendonly === "yes" || settings.save.trim() !== "";
  const bulk = Number(settings["proto-max-bulk-len"]);
  return Object.freeze({
    durable: known(persistent && policy === NO_EVICTION, clock),
    evictable: known(policy !== NO_EVICTION, clock),
    maxValueBytes: Number.isSafeInteger(bulk) && bulk > 0 ? bulk : null,
    settings: Object.freeze(settings),
  });
}
