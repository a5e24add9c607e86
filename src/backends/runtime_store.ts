/**
 * The RuntimeStore contract (spec backends.runtime.RuntimeStore): a small versioned key-value store with
 * compare-and-swap, plus append-only logs, that the run ledger (FlowRuntime) keeps its facts in.
 *
 * Guarantees every implementation gives (the conformance tests run the same scenarios against each):
 * - Versions are opaque strings the store mints; a caller never fabricates one. A version is never
 *   minted twice for one key, not even after the key is deleted and created again, so a version read
 *   before a delete can never win a swap afterwards.
 * - `cas` succeeds only when the key's current version equals the expected one (`null`: the key must not
 *   exist); of any number of racing writers holding the same expected version, exactly one wins.
 * - A read that could not be made throws {@link UnobservableState}; an absent key is a real observation
 *   ({@link AbsentEntry}), never what a failed read turns into.
 * - Logs are append-only: a record once appended is read back whole, in append order, forever.
 * - Keys and log names are non-empty, well-formed Unicode strings ({@link checkStoreName}).
 *
 * What a store promises beyond that (durable, shared across processes) is its {@link RuntimeCapabilities},
 * which the planner reads; nothing else may assume more.
 *
 * @module
 */

import { ConfigError, ResourceUnavailable, UnobservableState } from "../core/errors.ts";
import { Barrier, barrier, faultsInstalled } from "./faults.ts";
import type { Observation } from "./outcomes.ts";

/** A key that holds a value: the bytes and the version the store minted for them. */
export interface PresentEntry {
  /** Always `present`: the key holds a value. */
  readonly kind: "present";
  /** The stored bytes. */
  readonly value: Uint8Array;
  /** The version the store minted for these bytes; what a compare-and-set names. */
  readonly version: string;
}

/** A key that holds nothing: observed absent, not unread. */
export interface AbsentEntry {
  /** Always `absent`: the key was read and holds nothing. */
  readonly kind: "absent";
}

/** What `get` observed for a key. */
export type StoreEntry = PresentEntry | AbsentEntry;

/** One key of a `scan`: its name, bytes and version. */
export interface StoredRecord {
  /** The key's full name. */
  readonly key: string;
  /** The stored bytes. */
  readonly value: Uint8Array;
  /** The version the store minted for these bytes. */
  readonly version: string;
}

/** The one {@link AbsentEntry}. */
export const ABSENT: AbsentEntry = Object.freeze({ kind: "absent" });

/** Constructs a {@link PresentEntry}. */
export function presentEntry(value: Uint8Array, version: string): PresentEntry {
  return Object.freeze({ kind: "present", value, version });
}

/** Constructs a {@link StoredRecord}. */
export function storedRecord(key: string, value: Uint8Array, version: string): StoredRecord {
  return Object.freeze({ key, value, version });
}

/** Orders records by key in UTF-16 code unit order, the order `scan` returns. */
export function compareRecordKeys(a: StoredRecord, b: StoredRecord): number {
  return a.key < b.key ? -1 : a.key > b.key ? 1 : 0;
}

/**
 * What a runtime store can guarantee (spec backends.capabilities.RuntimeCapabilities), as the planner
 * reads it before admitting a restart-safe profile.
 */
export interface RuntimeCapabilities {
  /** The implementation's name: `memory`, `file`, `redis`. */
  readonly store: string;
  /** Whether an acknowledged write survives the writer's process; Unknown when it cannot be read back. */
  readonly durable: Observation<boolean>;
  /** Whether separate processes (of one host at least) see one state and race on one CAS. */
  readonly sharedAcrossProcesses: boolean;
  /** Whether join groups persisted here survive a worker restart. */
  readonly restartSafeJoins: boolean;
  /** Whether ledger state stays correct as replicas come and go (slots, partition takeover). */
  readonly elasticState: boolean;
}

/** Constructs a {@link RuntimeCapabilities}. */
export function runtimeCapabilities(
  store: string,
  durable: Observation<boolean>,
  sharedAcrossProcesses: boolean,
  restartSafeJoins: boolean,
  elasticState: boolean,
): RuntimeCapabilities {
  return Object.freeze({ store, durable, sharedAcrossProcesses, restartSafeJoins, elasticState });
}

/**
 * Versioned KV with compare-and-swap and append-only logs. Every method may throw
 * {@link UnobservableState} when the store could not be read or the outcome of a write could not be
 * established (the caller re-reads before deciding), and {@link ConfigError} for a name that
 * {@link checkStoreName} refuses. After `close()`, every method throws ResourceUnavailable.
 */
export interface RuntimeStore {
  /** The key's bytes and version, or {@link ABSENT}. */
  get(key: string): Promise<StoreEntry>;
  /**
   * Writes `value` only if the key's current version is `expectedVersion` (`null`: only if the key does
   * not exist). True when this call's write took effect; false when the version did not match.
   */
  cas(key: string, expectedVersion: string | null, value: Uint8Array): Promise<boolean>;
  /**
   * Removes the key if its version is `expectedVersion` (`null`: whatever version it holds). True when this
   * call removed it; false when the key was absent or held another version.
   */
  delete(key: string, expectedVersion: string | null): Promise<boolean>;
  /**
   * Every key that starts with `prefix` (`""`: every key), sorted by key (UTF-16 code unit order). Not a
   * snapshot: a key present for the whole scan is returned, each with a value and version it held during
   * the scan.
   */
  scan(prefix: string): Promise<readonly StoredRecord[]>;
  /** Appends one record to `log` (created on first append); the log's length afterwards (1 for the first). */
  append(log: string, record: Uint8Array): Promise<number>;
  /** Every record appended to `log`, oldest first; empty for a log nothing was ever appended to. */
  logEntries(log: string): Promise<readonly Uint8Array[]>;
  /** What this store guarantees. */
  capabilities(): Promise<RuntimeCapabilities>;
  /** Releases what the store holds open; waits for operations in flight. Idempotent. */
  close(): Promise<void>;
}

/** What a name is used as, for {@link checkStoreName}'s messages. */
export type StoreNameRole = "key" | "log" | "prefix";

/**
 * Throws {@link ConfigError} unless `name` is a usable key, log name or scan prefix: a well-formed Unicode
 * string (no lone surrogate, so it has one UTF-8 form), non-empty unless it is a prefix.
 */
export function checkStoreName(role: StoreNameRole, name: string): void {
  if (typeof name !== "string") {
    throw new ConfigError(
      `a runtime store ${role} must be a string, got ${typeof name}`,
      `pass the ${role} as a string`,
      { role },
    );
  }
  if (role !== "prefix" && name.length === 0) {
    throw new ConfigError(`a runtime store ${role} must not be empty`, `give the ${role} a name`, { role });
  }
  if (!name.isWellFormed()) {
    throw new ConfigError(
      `a runtime store ${role} must be well-formed Unicode: ${JSON.stringify(name)} has a lone surrogate`,
      `build the ${role} from whole characters (String.prototype.toWellFormed replaces lone surrogates)`,
      { role, name },
    );
  }
}

/** The error every method of a closed store throws; `store` names the implementation. */
export function storeClosedError(store: string, operation: string): ResourceUnavailable {
  return new ResourceUnavailable(
    `the ${store} runtime store is closed; ${operation} was not performed`,
    "open the store again (openRuntimeStore) instead of reusing a closed one",
    { store, operation },
  );
}

/**
 * The `ledger.write.before` fault barrier, hit by every store before a mutation (cas, delete, append)
 * reads the state it compares against, so a paused writer lets another one write first.
 */
export async function beforeLedgerWrite(store: string, operation: string, name: string): Promise<void> {
  if (faultsInstalled()) await barrier(Barrier.ledgerWriteBefore, { store, operation, name });
}

/**
 * The `ledger.write.after` fault barrier, hit by every store after a mutation took effect and before the
 * caller learns of it. A DropResponse there is a lost receipt: the write happened, and the caller gets
 * {@link UnobservableState} instead of `true`.
 */
export async function afterLedgerWrite(store: string, operation: string, name: string): Promise<void> {
  if (!faultsInstalled()) return;
  const hit = await barrier(Barrier.ledgerWriteAfter, { store, operation, name });
  if (hit.dropResponse) {
    throw new UnobservableState(
      `the outcome of ${operation} on ${JSON.stringify(name)} in the ${store} runtime store was not received`,
      "re-read the ledger before deciding: the write may have taken effect",
      { store, operation, name, reason: "timeout" },
    );
  }
}
