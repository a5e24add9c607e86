/**
 * The in-memory RuntimeStore (spec backends.memory.runtime_store.MemoryRuntimeStore): the executable
 * specification of the contract, for models and tests. Its state lives in this object only, so it is
 * never durable and never shared; its capabilities say so, and the planner refuses restart-safe
 * profiles over it. Its mutations hit the `ledger.write.before` and `ledger.write.after` fault barriers
 * exactly as every RuntimeStore does (runtime_store.ts).
 *
 * @example
 * ```ts
 * const store = new MemoryRuntimeStore();
 * await store.cas("vf/f/r/n/epoch", null, new TextEncoder().encode("1")); // true: created
 * const entry = await store.get("vf/f/r/n/epoch");
 * console.log(entry.kind); // "present"
 * ```
 *
 * @module
 */

import { copyBytes } from "../../core/bytes.ts";
import { type Clock, systemClock } from "../clock.ts";
import { known } from "../outcomes.ts";
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
} from "../runtime_store.ts";

interface Slot {
  readonly value: Uint8Array;
  readonly version: string;
}

/**
 * A RuntimeStore held in one object. Bytes are copied in and out, so a caller mutating its buffer never
 * changes what the store holds. Versions come from one counter per store, so none is ever minted twice.
 */
export class MemoryRuntimeStore implements RuntimeStore {
  readonly #clock: Clock;
  readonly #keys = new Map<string, Slot>();
  readonly #logs = new Map<string, Uint8Array[]>();
  #lastVersion = 0;
  #closed = false;

  /** `clock` stamps the capabilities observation; the system clock by default. */
  constructor(clock: Clock = systemClock) {
    this.#clock = clock;
  }

  get(key: string): Promise<StoreEntry> {
    return Promise.try(() => {
      this.#open("get");
      checkStoreName("key", key);
      const slot = this.#keys.get(key);
      return slot === undefined ? ABSENT : presentEntry(slot.value.slice(), slot.version);
    });
  }

  async cas(key: string, expectedVersion: string | null, value: Uint8Array): Promise<boolean> {
    this.#open("cas");
    checkStoreName("key", key);
    await beforeLedgerWrite("memory", "cas", key);
    const current = this.#keys.get(key)?.version ?? null;
    if (current !== expectedVersion) return false;
    this.#keys.set(key, { value: copyBytes(value), version: String(++this.#lastVersion) });
    await afterLedgerWrite("memory", "cas", key);
    return true;
  }

  async delete(key: string, expectedVersion: string | null): Promise<boolean> {
    this.#open("delete");
    checkStoreName("key", key);
    await beforeLedgerWrite("memory", "delete", key);
    const slot = this.#keys.get(key);
    if (slot === undefined || (expectedVersion !== null && slot.version !== expectedVersion)) return false;
    this.#keys.delete(key);
    await afterLedgerWrite("memory", "delete", key);
    return true;
  }

  scan(prefix: string): Promise<readonly StoredRecord[]> {
    return Promise.try(() => {
      this.#open("scan");
      checkStoreName("prefix", prefix);
      const records: StoredRecord[] = [];
      for (const [key, slot] of this.#keys) {
        if (key.startsWith(prefix)) records.push(storedRecord(key, slot.value.slice(), slot.version));
      }
      return records.sort(compareRecordKeys);
    });
  }

  async append(log: string, record: Uint8Array): Promise<number> {
    this.#open("append");
    checkStoreName("log", log);
    await beforeLedgerWrite("memory", "append", log);
    let records = this.#logs.get(log);
    if (records === undefined) {
      records = [];
      this.#logs.set(log, records);
    }
    const length = records.push(copyBytes(record));
    await afterLedgerWrite("memory", "append", log);
    return length;
  }

  logEntries(log: string): Promise<readonly Uint8Array[]> {
    return Promise.try(() => {
      this.#open("logEntries");
      checkStoreName("log", log);
      return (this.#logs.get(log) ?? []).map((record) => record.slice());
    });
  }

  /** Never durable (Known(false)), never shared, so neither restart-safe joins nor elastic state. */
  capabilities(): Promise<RuntimeCapabilities> {
    return Promise.try(() => {
      this.#open("capabilities");
      return runtimeCapabilities("memory", known(false, this.#clock), false, false, false);
    });
  }

  close(): Promise<void> {
    this.#closed = true;
    return Promise.resolve();
  }

  #open(operation: string): void {
    if (this.#closed) throw storeClosedError("memory", operation);
  }
}
