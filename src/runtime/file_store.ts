/**
 * The file-directory RuntimeStore (spec FileRuntimeStore, URL `file://<dir>`): the local engine's run
 * ledger, durable across process restarts and shared by every process of one host. Not shared across
 * hosts: the directory must be on a local filesystem (flock is not trustworthy over NFS).
 *
 * Layout under the root (format {@link FILE_STORE_FORMAT}):
 * ```
 * store.json                    format marker
 * journal/<segment>.log         every key: a journal of checksummed JSON lines, one per commit (file_journal.ts)
 * journal/<segment>.log.tmp     a compaction in flight, or left behind by a compactor that was killed
 * logs/<name>/<index>.rec       one JSON document per appended record, index 1, 2, ... (16 digits)
 * logs/<name>/append.tmp        an append in flight, or left behind by a killed appender
 * locks/journal.lock            the journal's lock
 * locks/<00..ff>.lock           256 lock stripes; a log takes the stripe its SHA-256 picks
 * ```
 * A directory of format 1 (one `keys/<name>.json` document per key) is migrated on open: its keys, with
 * their versions, become the journal's first segment, then the marker says format 2 and `keys/` is
 * removed, all under the journal's lock. The migration assumes no process of an older videoflow still
 * writes the directory (the local engine's run lock sees to that for a run's ledger).
 *
 * Keys (cas, delete, get, scan) are the journal's: every value in memory, each commit one line appended
 * and one `fdatasync`, however many compare-and-swaps arrived while the previous commit was being made
 * durable; a compare-and-swap is decided, under the journal's lock, on what every process has committed,
 * and answered once its line is durable. A process killed at any instant leaves each key at a version it
 * held, and at most a torn last line, which readers skip and the next writer cuts off. See
 * file_journal.ts.
 *
 * Logs (append, logEntries): every append goes to a temporary file that is fsynced, atomically renamed
 * to the record's name, and followed by an fsync of the directory before the call returns, holding the
 * log's stripe lock for the whole count-and-write; readers take no lock and open whichever inode the name
 * points at, whose bytes never change after the rename. Every document carries the SHA-256 of its bytes,
 * so corruption from outside (a disk, an editor) is reported as UnobservableState, never returned as
 * data. A lock is `flock` on a lock file (Deno.FsFile.lock), which the kernel releases when its holder
 * dies however it dies; lock files are never deleted, so two processes never lock two inodes under one
 * name. Within one process, a per-stripe promise chain orders appends before they take the flock.
 *
 * ABA: a version is `<counter>.<random 64-bit nonce>`, the counter one above the version it replaces, the
 * nonce fresh for each write. A key deleted and created again restarts its counter but never its nonce,
 * so a version read before the delete can never match afterwards.
 *
 * Fault barriers (backends/faults.ts): every mutation hits `ledger.write.before` before it is decided,
 * `ledger.write.mid` with its write partly done (a key's commit: half its journal line written, so a
 * Crash there leaves a torn tail; an append: the record fsynced in the temporary file, not renamed), and
 * `ledger.write.after` once it took effect (a DropResponse there makes the call throw UnobservableState,
 * the lost receipt).
 *
 * Names: keys and log names become file names through {@link encodeStoreName}, reversibly and without
 * collisions; a name too long for a file name is stored under a hash, with the full key inside the
 * document.
 *
 * @module
 */

import { join } from "node:path";
import { copyBytes } from "../core/bytes.ts";
import { randomHex } from "../core/hex.ts";
import { sha256, sha256Hex } from "../wire/sha256.ts";
import {
  ConfigError,
  diskFailure,
  ResourceUnavailable,
  UnobservableState,
  VideoflowError,
} from "../core/errors.ts";
import { isRecord } from "../core/checks.ts";
import { type Clock, systemClock } from "../backends/clock.ts";
import { Barrier, barrier, faultsInstalled } from "../backends/faults.ts";
import { known } from "../backends/outcomes.ts";
import {
  afterLedgerWrite,
  beforeLedgerWrite,
  checkStoreName,
  type PresentEntry,
  presentEntry,
  type RuntimeCapabilities,
  runtimeCapabilities,
  type RuntimeStore,
  storeClosedError,
  type StoredRecord,
  type StoreEntry,
} from "../backends/runtime_store.ts";
import { syncDirectory, writeAtomically } from "./durable_write.ts";
import { KeyJournal } from "./file_journal.ts";

/** The `format` of `store.json`: the layout. Format 1 (a file per key) is migrated on open. */
export const FILE_STORE_FORMAT = 2;

/** The format 1 layout, whose `keys/` directory {@link FileRuntimeStore.open} migrates into the journal. */
const KEYS_LAYOUT_FORMAT = 1;

/** The `format` field of every per-file document: a log record, and a key of the format 1 layout. */
const DOCUMENT_FORMAT = 1;

/** Number of lock stripes (lock files) under `locks/`. */
export const FILE_STORE_LOCK_STRIPES = 256;

/** Longest encoded name kept readable; a longer one is stored under `~<head>~<sha256>`. */
export const MAX_READABLE_NAME_LENGTH = 160;

const LONG_NAME_HEAD = 96;
/** What starts (and splits) the file name of a name too long to keep readable. */
const HASHED_NAME_MARK = "~";
const KEY_SUFFIX = ".json";
const TEMP_SUFFIX = ".tmp";
const RECORD_SUFFIX = ".rec";
const APPEND_TEMP = "append.tmp";
const INDEX_DIGITS = 16;
const MARKER_NAME = "store.json";
const JOURNAL_LOCK = "journal.lock";
const MARKER_KIND = "videoflow-file-runtime-store";
const HEX_PAIR = /^[0-9a-f]{2}$/;
/** `%xx` for every byte value. */
const HEX_ESCAPES: readonly string[] = Array.from(
  { length: 256 },
  (_, byte) => `%${byte.toString(16).padStart(2, "0")}`,
);

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** Whether a byte (or UTF-16 code unit) is one a store name keeps as itself: `[a-z0-9_-]`. */
function isKeptByte(code: number): boolean {
  return (code >= 0x61 && code <= 0x7a) || (code >= 0x30 && code <= 0x39) || code === 0x5f || code === 0x2d;
}

/** Each byte of `name`'s UTF-8 form as itself when kept, else as `%xx`: a prefix of a name maps to a prefix. */
function escapeStoreName(name: string): string {
  let encoded = "";
  for (const byte of encoder.encode(name)) {
    encoded += isKeptByte(byte) ? String.fromCharCode(byte) : HEX_ESCAPES[byte];
  }
  return encoded;
}

/**
 * The file name (without suffix) a key or log name is stored under. Each UTF-8 byte in `[a-z0-9_-]` is
 * kept and every other byte becomes `%xx` (lowercase hex), so the result is one case-insensitive-safe
 * path segment with no dot, decodes back exactly ({@link decodeStoreName}), and distinct names never
 * share a result. Past {@link MAX_READABLE_NAME_LENGTH} characters the result is `~` + a readable head
 * + `~` + the SHA-256 of the name, which fits every filesystem's 255-byte limit.
 */
export function encodeStoreName(name: string): string {
  const encoded = escapeStoreName(name);
  if (encoded.length <= MAX_READABLE_NAME_LENGTH) return encoded;
  let head = encoded.slice(0, LONG_NAME_HEAD);
  const cut = head.lastIndexOf("%");
  if (cut > LONG_NAME_HEAD - 3) head = head.slice(0, cut);
  return `${HASHED_NAME_MARK}${head}${HASHED_NAME_MARK}${sha256Hex(name)}`;
}

/**
 * The name {@link encodeStoreName} encoded, or null for a hashed (long) name, whose full name only the
 * document holds. Throws RangeError for a string no name encodes to.
 */
export function decodeStoreName(encoded: string): string | null {
  if (encoded.startsWith(HASHED_NAME_MARK)) return null;
  const bytes: number[] = [];
  for (let i = 0; i < encoded.length; i++) {
    const code = encoded.charCodeAt(i);
    if (code === 0x25 && HEX_PAIR.test(encoded.slice(i + 1, i + 3))) {
      bytes.push(parseInt(encoded.slice(i + 1, i + 3), 16));
      i += 2;
    } else if (isKeptByte(code)) {
      bytes.push(code);
    } else {
      throw new RangeError(`${JSON.stringify(encoded)} is not an encoded store name`);
    }
  }
  let name: string;
  try {
    name = decoder.decode(new Uint8Array(bytes));
  } catch {
    throw new RangeError(`${JSON.stringify(encoded)} does not decode to UTF-8`);
  }
  if (encodeStoreName(name) !== encoded) {
    throw new RangeError(`${JSON.stringify(encoded)} is not the canonical encoding of a store name`);
  }
  return name;
}

interface KeyDocument {
  readonly format: number;
  readonly key: string;
  readonly version: string;
  readonly sha256: string;
  readonly value: string;
}

interface RecordDocument {
  readonly format: number;
  readonly log: string;
  readonly index: number;
  readonly sha256: string;
  readonly record: string;
}

function errorCode(error: unknown): string | undefined {
  const code = isRecord(error) ? error.code : undefined;
  return typeof code === "string" ? code : undefined;
}

function malformed(what: string, path: string, why: string): UnobservableState {
  return new UnobservableState(
    `${what} in the file runtime store is malformed: ${why}`,
    "the ledger file was damaged outside videoflow; restore it from a backup or remove the run's state " +
      "directory to start the run afresh",
    { path, reason: "malformed" },
  );
}

/** The bytes a document carries as base64, checked against the SHA-256 it records for them. */
function verifiedBytes(base64: string, sha256: unknown, what: string, path: string): Uint8Array {
  let bytes: Uint8Array;
  try {
    bytes = Uint8Array.fromBase64(base64);
  } catch {
    throw malformed(what, path, "the payload is not base64");
  }
  if (sha256Hex(bytes) !== sha256) throw malformed(what, path, "checksum mismatch");
  return bytes;
}

function parseDocument(bytes: Uint8Array, what: string, path: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(decoder.decode(bytes));
  } catch {
    throw malformed(what, path, "not a complete JSON document");
  }
  if (!isRecord(parsed) || parsed.format !== DOCUMENT_FORMAT) {
    throw malformed(what, path, `not a format ${DOCUMENT_FORMAT} document`);
  }
  return parsed;
}

function readKeyDocument(bytes: Uint8Array, path: string): { key: string; entry: PresentEntry } {
  const doc = parseDocument(bytes, "a key", path) as Partial<KeyDocument>;
  if (typeof doc.key !== "string" || typeof doc.version !== "string" || typeof doc.value !== "string") {
    throw malformed("a key", path, "key, version or value is missing");
  }
  const value = verifiedBytes(doc.value, doc.sha256, `key ${JSON.stringify(doc.key)}`, path);
  return { key: doc.key, entry: presentEntry(value, doc.version) };
}

function readRecordDocument(bytes: Uint8Array, path: string, log: string, index: number): Uint8Array {
  const doc = parseDocument(bytes, "a log record", path) as Partial<RecordDocument>;
  if (doc.log !== log || doc.index !== index || typeof doc.record !== "string") {
    throw malformed(`record ${index} of log ${JSON.stringify(log)}`, path, "it names another log or index");
  }
  return verifiedBytes(doc.record, doc.sha256, `record ${index} of log ${JSON.stringify(log)}`, path);
}

function recordFileName(index: number): string {
  return `${String(index).padStart(INDEX_DIGITS, "0")}${RECORD_SUFFIX}`;
}

/** Whether `name` is the file of a record numbered 1..`count`. */
function isRecordFileName(name: string, count: number): boolean {
  const digits = name.slice(0, -RECORD_SUFFIX.length);
  if (!/^[0-9]+$/.test(digits)) return false;
  const index = Number(digits);
  return index >= 1 && index <= count && name === recordFileName(index);
}

function stripeOf(log: string): number {
  return sha256(`log\0${log}`)[0] % FILE_STORE_LOCK_STRIPES;
}

/** The `ledger.write.mid` fault barrier: the new bytes are in a fsynced temporary file, not yet renamed. */
async function midLedgerWrite(operation: string, name: string): Promise<void> {
  if (faultsInstalled()) await barrier(Barrier.ledgerWriteMid, { store: "file", operation, name });
}

/**
 * What follows a disk failure's remedy: the store's writes are atomic, so what it holds stays consistent
 * and whoever uses it goes on from there.
 */
const STORE_DISK_REMEDY =
  "then run again: every write either happened whole or not at all, so the store goes on " +
  "from what it holds";

/** Whether `error` came from the Deno runtime's I/O layer (and not from a fault barrier or a bug). */
function isIoError(error: unknown): boolean {
  return Object.values(Deno.errors).some((cls) => error instanceof cls);
}

async function readOptional(path: string): Promise<Uint8Array | null> {
  try {
    return await Deno.readFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return null;
    throw error;
  }
}

async function listNames(dir: string): Promise<string[] | null> {
  const names: string[] = [];
  try {
    for await (const entry of Deno.readDir(dir)) names.push(entry.name);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return null;
    throw error;
  }
  return names;
}

async function ensureDirectory(path: string, parent: string): Promise<void> {
  try {
    await Deno.mkdir(path);
  } catch (error) {
    if (error instanceof Deno.errors.AlreadyExists) return;
    throw error;
  }
  await syncDirectory(parent);
}

/**
 * The key documents of a format 1 layout's `keys/` directory, each checked (its checksum, its name);
 * temporary files (writes a killed writer left) are not read.
 */
async function readFormatOneKeys(keysDir: string): Promise<Map<string, PresentEntry>> {
  const entries = new Map<string, PresentEntry>();
  for (const fileName of await listNames(keysDir) ?? []) {
    if (!fileName.endsWith(KEY_SUFFIX)) continue;
    const path = join(keysDir, fileName);
    const { key, entry } = readKeyDocument(await Deno.readFile(path), path);
    if (encodeStoreName(key) !== fileName.slice(0, -KEY_SUFFIX.length)) {
      throw malformed(`key ${JSON.stringify(key)}`, path, "stored under another name");
    }
    entries.set(key, entry);
  }
  return entries;
}

/**
 * Checks (writing it for a new store) the marker in `root`, holding the journal's lock: a format 1 store
 * is migrated (its keys handed to `snapshot`, then the marker rewritten, then `keys/` removed), a
 * `keys/` left by a migration killed after the marker was rewritten is removed, any other kind or format
 * is a ConfigError.
 */
async function checkMarker(
  root: string,
  snapshot: (entries: Iterable<[string, PresentEntry]>) => Promise<void>,
): Promise<void> {
  const path = join(root, MARKER_NAME);
  const keysDir = join(root, "keys");
  const bytes = await readOptional(path);
  let format: unknown = FILE_STORE_FORMAT;
  if (bytes !== null) {
    let marker: unknown;
    try {
      marker = JSON.parse(decoder.decode(bytes));
    } catch {
      throw malformed(`its marker ${MARKER_NAME}`, path, "it is not JSON");
    }
    format = isRecord(marker) && marker.kind === MARKER_KIND ? marker.format : null;
  }
  if (format !== FILE_STORE_FORMAT && format !== KEYS_LAYOUT_FORMAT) {
    throw new ConfigError(
      `${root} holds a ${MARKER_NAME} that is not a format ${FILE_STORE_FORMAT} (or ${KEYS_LAYOUT_FORMAT}) ` +
        "videoflow runtime store",
      "point the file:// runtime store at its own directory, or remove the old one",
      { root },
    );
  }
  if (format === KEYS_LAYOUT_FORMAT) await snapshot(await readFormatOneKeys(keysDir));
  if (bytes === null || format === KEYS_LAYOUT_FORMAT) {
    const marker = JSON.stringify({ kind: MARKER_KIND, format: FILE_STORE_FORMAT });
    await writeAtomically(root, `${path}.${randomHex(8)}${TEMP_SUFFIX}`, path, encoder.encode(marker));
  }
  if (
    await Deno.stat(keysDir).then(() => true, (error) => {
      if (error instanceof Deno.errors.NotFound) return false;
      throw error;
    })
  ) {
    await Deno.remove(keysDir, { recursive: true });
    await syncDirectory(root);
  }
}

/** How a {@link FileRuntimeStore} is opened, besides its directory and clock. */
export interface FileRuntimeStoreOptions {
  /**
   * Called with the typed error (a `diskFailure`: ResourceUnavailable) each time an operation fails
   * because the store's disk is read-only, full or failing, before the operation rejects with it: the
   * owner of the store can then end what depends on it at once instead of waiting for its callers to.
   */
  readonly onDiskFailure?: (error: ResourceUnavailable) => void;
}

/**
 * A file-directory RuntimeStore; create one with {@link FileRuntimeStore.open}.
 *
 * @example
 * ```ts
 * const store = await FileRuntimeStore.open(await Deno.makeTempDir());
 * const won = await store.cas("vf/f/r/n/epoch", null, new TextEncoder().encode("1"));
 * console.log(won, (await store.get("vf/f/r/n/epoch")).kind); // true "present"
 * await store.close();
 * ```
 */
export class FileRuntimeStore implements RuntimeStore {
  /** The directory the store lives in. */
  readonly root: string;
  readonly #clock: Clock;
  readonly #onDiskFailure: (error: ResourceUnavailable) => void;
  readonly #journal: KeyJournal;
  readonly #logsDir: string;
  readonly #locksDir: string;
  readonly #lockFiles = new Map<number, Deno.FsFile>();
  readonly #queues = new Map<number, Promise<void>>();
  readonly #inFlight = new Set<Promise<unknown>>();
  #closed = false;
  #closing: Promise<void> | null = null;

  private constructor(root: string, clock: Clock, options: FileRuntimeStoreOptions, journal: KeyJournal) {
    this.root = root;
    this.#clock = clock;
    this.#onDiskFailure = options.onDiskFailure ?? (() => {});
    this.#journal = journal;
    this.#logsDir = join(root, "logs");
    this.#locksDir = join(root, "locks");
  }

  /**
   * Opens (creating if needed) the store in `root`, migrating a format 1 directory. Throws
   * ResourceUnavailable when the directory cannot be created or written, ConfigError when it holds a store
   * of another kind or format, and UnobservableState when what it holds was damaged.
   */
  static async open(
    root: string,
    clock: Clock = systemClock,
    options: FileRuntimeStoreOptions = {},
  ): Promise<FileRuntimeStore> {
    if (root.length === 0) {
      throw new ConfigError(
        "the file runtime store needs a directory",
        "use file://<dir>, e.g. file://.videoflow",
      );
    }
    let journal: KeyJournal;
    try {
      await Deno.mkdir(root, { recursive: true });
      for (const dir of ["logs", "locks", "journal"]) await ensureDirectory(join(root, dir), root);
      journal = await KeyJournal.open(
        join(root, "journal"),
        join(root, "locks", JOURNAL_LOCK),
        (snapshot) => checkMarker(root, snapshot),
      );
    } catch (error) {
      if (error instanceof VideoflowError) throw error;
      throw diskFailure(error, `the file runtime store at ${root}`, root, STORE_DISK_REMEDY) ??
        new ResourceUnavailable(
          `the file runtime store at ${root} cannot be opened: ${(error as Error).message}`,
          "point VF_RUNTIME_STORE_URL (or --state) at a writable directory on a local disk",
          { root, error_code: errorCode(error) ?? null },
        );
    }
    return new FileRuntimeStore(root, clock, options, journal);
  }

  get(key: string): Promise<StoreEntry> {
    return this.#operation("get", { key }, () => {
      checkStoreName("key", key);
      return this.#journal.get(key);
    });
  }

  cas(key: string, expectedVersion: string | null, value: Uint8Array): Promise<boolean> {
    return this.#operation("cas", { key }, async () => {
      checkStoreName("key", key);
      const bytes = copyBytes(value);
      await beforeLedgerWrite("file", "cas", key);
      const wrote = await this.#journal.submit({ kind: "cas", key, expected: expectedVersion, value: bytes });
      if (wrote) await afterLedgerWrite("file", "cas", key);
      return wrote;
    });
  }

  delete(key: string, expectedVersion: string | null): Promise<boolean> {
    return this.#operation("delete", { key }, async () => {
      checkStoreName("key", key);
      await beforeLedgerWrite("file", "delete", key);
      const removed = await this.#journal.submit({ kind: "delete", key, expected: expectedVersion });
      if (removed) await afterLedgerWrite("file", "delete", key);
      return removed;
    });
  }

  scan(prefix: string): Promise<readonly StoredRecord[]> {
    return this.#operation("scan", { prefix }, () => {
      checkStoreName("prefix", prefix);
      return this.#journal.scan(prefix);
    });
  }

  append(log: string, record: Uint8Array): Promise<number> {
    return this.#operation("append", { log }, async () => {
      checkStoreName("log", log);
      const bytes = copyBytes(record);
      const dir = join(this.#logsDir, encodeStoreName(log));
      await beforeLedgerWrite("file", "append", log);
      const length = await this.#locked(stripeOf(log), async () => {
        await ensureDirectory(dir, this.#logsDir);
        const records = (await listNames(dir) ?? []).filter((name) => name.endsWith(RECORD_SUFFIX));
        const count = records.length;
        if (!records.every((name) => isRecordFileName(name, count))) {
          throw malformed(
            `log ${JSON.stringify(log)}`,
            dir,
            `its ${count} records are not numbered 1..${count}`,
          );
        }
        const index = count + 1;
        const doc: RecordDocument = {
          format: DOCUMENT_FORMAT,
          log,
          index,
          sha256: sha256Hex(bytes),
          record: bytes.toBase64(),
        };
        await writeAtomically(
          dir,
          join(dir, APPEND_TEMP),
          join(dir, recordFileName(index)),
          encoder.encode(JSON.stringify(doc)),
          () => midLedgerWrite("append", log),
        );
        return index;
      });
      await afterLedgerWrite("file", "append", log);
      return length;
    });
  }

  logEntries(log: string): Promise<readonly Uint8Array[]> {
    return this.#operation("logEntries", { log }, async () => {
      checkStoreName("log", log);
      const dir = join(this.#logsDir, encodeStoreName(log));
      const records: Uint8Array[] = [];
      for (let index = 1;; index++) {
        const path = join(dir, recordFileName(index));
        let bytes = await readOptional(path);
        if (bytes === null && await this.#hasRecordAfter(dir, index)) {
          // Records appear in index order, so a later one proves this one was renamed into place before
          // it; a second read sees it unless the log was damaged.
          bytes = await readOptional(path);
          if (bytes === null) {
            throw malformed(`log ${JSON.stringify(log)}`, dir, `record ${index} is missing`);
          }
        }
        if (bytes === null) return records;
        records.push(readRecordDocument(bytes, path, log, index));
      }
    });
  }

  /** Durable (Known(true)) and shared by the processes of this host, so restart-safe joins and elastic state. */
  capabilities(): Promise<RuntimeCapabilities> {
    return this.#operation(
      "capabilities",
      {},
      () => Promise.resolve(runtimeCapabilities("file", known(true, this.#clock), true, true, true)),
    );
  }

  close(): Promise<void> {
    this.#closed = true;
    this.#closing ??= (async () => {
      while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight]);
      for (const file of this.#lockFiles.values()) file.close();
      this.#lockFiles.clear();
      await this.#journal.close();
    })();
    return this.#closing;
  }

  async #hasRecordAfter(dir: string, index: number): Promise<boolean> {
    const names = await listNames(dir) ?? [];
    const later = recordFileName(index);
    return names.some((name) => name.endsWith(RECORD_SUFFIX) && name > later);
  }

  /** Runs `body` holding stripe `stripe`: first in this process's queue for it, then its flock. */
  async #locked<T>(stripe: number, body: () => Promise<T>): Promise<T> {
    const previous = this.#queues.get(stripe) ?? Promise.resolve();
    let release!: () => void;
    const turn = new Promise<void>((resolve) => release = resolve);
    const tail = previous.then(() => turn);
    this.#queues.set(stripe, tail);
    await previous;
    try {
      const lockFile = await this.#lockFile(stripe);
      await lockFile.lock(true);
      try {
        return await body();
      } finally {
        this.#unlock(stripe, lockFile);
      }
    } finally {
      release();
      if (this.#queues.get(stripe) === tail) this.#queues.delete(stripe);
    }
  }

  /** Releases the stripe's flock; releasing never waits, so it costs no turn of the event loop. */
  #unlock(stripe: number, lockFile: Deno.FsFile): void {
    try {
      lockFile.unlockSync();
    } catch (error) {
      // Closing the descriptor is what certainly releases a flock; the next turn reopens the file.
      lockFile.close();
      this.#lockFiles.delete(stripe);
      throw error;
    }
  }

  async #lockFile(stripe: number): Promise<Deno.FsFile> {
    let file = this.#lockFiles.get(stripe);
    if (file === undefined) {
      const name = `${stripe.toString(16).padStart(2, "0")}.lock`;
      file = await Deno.open(join(this.#locksDir, name), { read: true, write: true, create: true });
      this.#lockFiles.set(stripe, file);
    }
    return file;
  }

  /** Runs one public operation: refused after close, tracked for close, I/O failures made typed. */
  #operation<T>(operation: string, context: Record<string, string>, body: () => Promise<T>): Promise<T> {
    if (this.#closed) return Promise.reject(storeClosedError("file", operation));
    const run = Promise.try(body).catch((error: unknown) => {
      throw this.#typedFailure(operation, context, error);
    });
    this.#inFlight.add(run);
    const forget = () => this.#inFlight.delete(run);
    run.then(forget, forget);
    return run;
  }

  /**
   * An I/O failure as a typed error (a disk that cannot take a write: `diskFailure`, told to the
   * `onDiskFailure` observer); anything else (ours, a fault barrier's) unchanged.
   */
  #typedFailure(operation: string, context: Record<string, string>, error: unknown): unknown {
    const disk = diskFailure(
      error,
      `the file runtime store at ${this.root} (${operation})`,
      this.root,
      STORE_DISK_REMEDY,
    );
    if (disk !== null) {
      Object.assign(disk.context, context, { operation });
      this.#onDiskFailure(disk);
      return disk;
    }
    if (!isIoError(error)) return error;
    const code = errorCode(error) ?? null;
    const message = error instanceof Error ? error.message : String(error);
    const where = { ...context, root: this.root, operation, error_code: code };
    return new UnobservableState(
      `the file runtime store at ${this.root} could not complete ${operation}: ${message}`,
      "check the directory's disk and permissions; re-read the ledger before deciding, the write may or " +
        "may not have happened",
      where,
    );
  }
}
