/**
 * The RuntimeStore a node worker uses to reach the run ledger the local engine's supervisor hosts (the
 * file store under `.videoflow/`): a proxy over an {@link EmbeddedConnection}. Versions, compare-and-swap,
 * logs, barriers and capabilities are the hosted store's; since every worker of the run reaches the same
 * store object, races between workers are decided there exactly as between callers of one process.
 *
 * This handle's `close()` ends this worker's use of the ledger only (calls in flight finish first; later
 * calls throw ResourceUnavailable): the hosted store stays open for the other workers, and the connection
 * stays open for the other proxies. A lost connection rejects every call with BrokerUnavailable: whether a
 * write took effect can only be learnt by reading the ledger again once a connection is back.
 *
 * @example
 * ```ts
 * import { EmbeddedConnection } from "./rpc.ts";
 * const ledger = new EmbeddedRuntimeStore(await EmbeddedConnection.fromEnv());
 * await ledger.cas("vf/f/r/n/epoch", null, new TextEncoder().encode("1"));
 * console.log((await ledger.get("vf/f/r/n/epoch")).kind); // "present"
 * ```
 *
 * @module
 */

import {
  ABSENT,
  checkStoreName,
  presentEntry,
  type RuntimeCapabilities,
  type RuntimeStore,
  storeClosedError,
  type StoredRecord,
  storedRecord,
  type StoreEntry,
  type StoreNameRole,
} from "../backends/runtime_store.ts";
import {
  type EmbeddedConnection,
  exactBytes,
  FROZEN_REPLY,
  Op,
  PLAIN_REPLY,
  raiseLost,
  type Reply,
} from "./rpc.ts";

/** The store name closed-handle errors report. */
const STORE = "embedded";

const ENTRY_REPLY: Reply<null, StoreEntry> = Object.freeze({
  decode: (value: unknown) => {
    const entry = value as StoreEntry;
    return entry.kind === "present" ? presentEntry(entry.value, entry.version) : ABSENT;
  },
  lost: raiseLost,
});

const RECORDS_REPLY: Reply<null, readonly StoredRecord[]> = Object.freeze({
  decode: (value: unknown) =>
    Object.freeze(
      (value as StoredRecord[]).map((record) => storedRecord(record.key, record.value, record.version)),
    ),
  lost: raiseLost,
});

const LOG_REPLY: Reply<null, readonly Uint8Array[]> = Object.freeze({
  decode: (value: unknown) => Object.freeze([...(value as Uint8Array[])]),
  lost: raiseLost,
});

/** The embedded run ledger's client (see the module comment). */
export class EmbeddedRuntimeStore implements RuntimeStore {
  readonly #connection: EmbeddedConnection;
  readonly #inFlight = new Set<Promise<unknown>>();
  #closed = false;

  constructor(connection: EmbeddedConnection) {
    this.#connection = connection;
  }

  /** {@link RuntimeStore.get} on the hosted store. */
  get(key: string): Promise<StoreEntry> {
    return this.#call("get", "key", key, Op.storeGet, [key], ENTRY_REPLY);
  }

  /** {@link RuntimeStore.cas} on the hosted store (the value is copied). */
  cas(key: string, expectedVersion: string | null, value: Uint8Array): Promise<boolean> {
    return this.#call("cas", "key", key, Op.storeCas, [key, expectedVersion, exactBytes(value)], PLAIN_REPLY);
  }

  /** {@link RuntimeStore.delete} on the hosted store. */
  delete(key: string, expectedVersion: string | null): Promise<boolean> {
    return this.#call("delete", "key", key, Op.storeDelete, [key, expectedVersion], PLAIN_REPLY);
  }

  /** {@link RuntimeStore.scan} on the hosted store. */
  scan(prefix: string): Promise<readonly StoredRecord[]> {
    return this.#call("scan", "prefix", prefix, Op.storeScan, [prefix], RECORDS_REPLY);
  }

  /** {@link RuntimeStore.append} on the hosted store (the record is copied). */
  append(log: string, record: Uint8Array): Promise<number> {
    return this.#call("append", "log", log, Op.storeAppend, [log, exactBytes(record)], PLAIN_REPLY);
  }

  /** {@link RuntimeStore.logEntries} on the hosted store. */
  logEntries(log: string): Promise<readonly Uint8Array[]> {
    return this.#call("logEntries", "log", log, Op.storeLogEntries, [log], LOG_REPLY);
  }

  /** The hosted store's capabilities, as it reports them (the proxy neither adds nor loses a guarantee). */
  capabilities(): Promise<RuntimeCapabilities> {
    if (this.#closed) return Promise.reject(storeClosedError(STORE, "capabilities"));
    return this.#track(
      this.#connection.call(Op.storeCapabilities, [], null, FROZEN_REPLY as Reply<null, RuntimeCapabilities>),
    );
  }

  /** Ends this handle's use of the ledger once its calls in flight have finished; idempotent. */
  async close(): Promise<void> {
    this.#closed = true;
    while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight]);
  }

  #call<T>(
    operation: string,
    role: StoreNameRole,
    name: string,
    op: Op,
    args: unknown[],
    reply: Reply<null, unknown>,
  ): Promise<T> {
    try {
      if (this.#closed) throw storeClosedError(STORE, operation);
      checkStoreName(role, name);
    } catch (error) {
      return Promise.reject(error);
    }
    return this.#track(this.#connection.call(op, args, null, reply as Reply<null, T>));
  }

  #track<T>(call: Promise<T>): Promise<T> {
    this.#inFlight.add(call);
    const forget = () => this.#inFlight.delete(call);
    call.then(forget, forget);
    return call;
  }
}
