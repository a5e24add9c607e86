/**
 * The keys of the file RuntimeStore (file_store.ts) as a journal with group commit: every key's value and
 * version live in memory, and each change is a line appended to one journal file, made durable by one
 * `fdatasync` for however many compare-and-swaps arrived while the previous commit was on its way to the
 * disk. `bench/file_store_bench.ts` measures it against the layout it replaced (one file per key, each
 * write its own temporary file, fsync, rename and directory fsync) on the same disk in the same run:
 * 1,278 against 263 read-and-swaps/s for one writer (4.9×), about 5,200 against 990 for 8 concurrent
 * writers (5.3×) and 38,000 against 790 for 64 (48×), on a 2-core host loaded by other work
 * (2026-12-02).
 *
 * Layout under the journal directory:
 * ```
 * <16 digits>.log       a segment: lines `<sha256 hex of the JSON> <JSON>\n`, applied in order; the
 *                       highest-numbered segment is the current one
 * <16 digits>.log.tmp   a compaction in flight, or left behind by a compactor that was killed
 * ```
 * A line is one commit: `{"set":[[key, version, base64 value], ...],"unset":[key, ...]}` (each key at
 * most once), or `{"sealed":<next segment>}`, the last line of a segment that was compacted into its
 * successor.
 *
 * Concurrency. Whoever appends holds the journal's lock (`flock` on a lock file that is never deleted, so
 * the kernel frees it whatever way its holder dies) and first reads every line other processes appended
 * since its last look, so a compare-and-swap is decided on the state every process has committed. Within a
 * process, one commit is in flight at a time; the compare-and-swaps and deletes that arrive meanwhile are
 * decided together, in arrival order (a later one sees an earlier one's write), and written as one line.
 * Each caller learns its outcome, `true` or `false` alike, only once that line is durable. Reads take no
 * lock: a `get` or `scan` first checks (one `fstat`) whether the journal grew, and reads only what was
 * appended; while this process holds the lock, nothing else can have written, and reads answer from
 * memory.
 *
 * Crash safety. A line is durable before anyone learns of it. A process killed while writing leaves at
 * most one incomplete line at the end (a torn tail): its checksum (or its missing newline) marks it,
 * readers stop before it, and the next lock holder cuts it off before appending. A line that fails its
 * checksum with complete lines after it is damage from outside and is reported as UnobservableState,
 * never skipped.
 *
 * Compaction. Once a segment is larger than {@link COMPACT_MIN_BYTES} and {@link COMPACT_RATIO} times
 * what its live keys need, the lock holder writes the live keys as the first line of the next segment (a
 * temporary file, fsynced, renamed, the directory fsynced: the one place where a name changes), after
 * sealing the old segment with a line that names its successor; then the old segment is removed. A
 * process reading the old segment meets the seal and moves on; a sealed segment without a successor (its
 * compactor died between the seal and the rename) is compacted again by the next lock holder. Closing a
 * handle compacts a segment that holds more than twice its live keys, so a finished run's journal is the
 * size of what it keeps.
 *
 * Per commit, the disk sees: the lock taken and released, an `fstat` of the segment (and a read of what
 * other processes appended, if they did), the segment opened for appending, one write, one `fdatasync`.
 * The segment is opened for each commit rather than kept open for writing, so that a mount turned
 * read-only under a running store refuses the next commit (EROFS) as it refuses any other new write.
 * These calls are synchronous (they reach the page cache) except the `fdatasync`, the lock and
 * compaction's file writes: those are the ones that wait for a disk or another process.
 *
 * @module
 */

import { join } from "node:path";
import { randomHex } from "../core/hex.ts";
import { UnobservableState } from "../core/errors.ts";
import { sha256Hex } from "../wire/sha256.ts";
import { syncDirectory, writeAtomically } from "./durable_write.ts";
import { Barrier, barrier, faultsInstalled } from "../backends/faults.ts";
import {
  ABSENT,
  compareRecordKeys,
  presentEntry,
  type StoredRecord,
  storedRecord,
  type StoreEntry,
} from "../backends/runtime_store.ts";

/** A segment is compacted once it is larger than this many bytes (and {@link COMPACT_RATIO}× its live keys). */
export const COMPACT_MIN_BYTES = 1024 * 1024;
/** A segment is compacted once it holds this many times the bytes its live keys need (and is large). */
export const COMPACT_RATIO = 4;
/** Closing a handle compacts a segment larger than this many bytes plus twice its live keys. */
const CLOSE_COMPACT_SLACK_BYTES = 16 * 1024;

const SEGMENT_SUFFIX = ".log";
const TEMP_SUFFIX = ".tmp";
const SEGMENT_DIGITS = 16;
const SEGMENT_NAME = /^[0-9]{16}\.log$/;
const NEWLINE = 0x0a;
const SPACE = 0x20;
const HASH_HEX_LENGTH = 64;
/** Bytes a live key costs in a snapshot line besides its value's base64: quotes, commas, brackets. */
const ENTRY_OVERHEAD_BYTES = 12;

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** A key's value and the version minted for it. */
interface Slot {
  readonly value: Uint8Array;
  readonly version: string;
}

/** A change this handle asks the journal to commit. */
export type KeyMutation =
  | {
    readonly kind: "cas";
    readonly key: string;
    readonly expected: string | null;
    readonly value: Uint8Array;
  }
  | { readonly kind: "delete"; readonly key: string; readonly expected: string | null };

/** One line of a segment, parsed. */
interface JournalLine {
  readonly set?: readonly (readonly [string, string, string])[];
  readonly unset?: readonly string[];
  readonly sealed?: number;
}

interface Pending {
  readonly mutation: KeyMutation;
  readonly resolve: (wrote: boolean) => void;
  readonly reject: (error: unknown) => void;
}

function segmentName(segment: number): string {
  return `${String(segment).padStart(SEGMENT_DIGITS, "0")}${SEGMENT_SUFFIX}`;
}

/** `line` as the bytes of one journal line: checksum, space, JSON, newline. */
function encodeLine(line: JournalLine): Uint8Array {
  const json = encoder.encode(JSON.stringify(line));
  const bytes = new Uint8Array(HASH_HEX_LENGTH + 1 + json.length + 1);
  encoder.encodeInto(sha256Hex(json), bytes);
  bytes[HASH_HEX_LENGTH] = SPACE;
  bytes.set(json, HASH_HEX_LENGTH + 1);
  bytes[bytes.length - 1] = NEWLINE;
  return bytes;
}

function damaged(path: string, at: number, why: string): UnobservableState {
  return new UnobservableState(
    `the journal of the file runtime store is malformed at byte ${at} of ${path}: ${why}`,
    "the ledger file was damaged outside videoflow; restore it from a backup or remove the run's state " +
      "directory to start the run afresh",
    { path, offset: at, reason: "malformed" },
  );
}

function isLine(value: unknown): value is JournalLine {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return false;
  const { set, unset, sealed } = value as Record<string, unknown>;
  if (sealed !== undefined) return Number.isSafeInteger(sealed) && set === undefined && unset === undefined;
  const setOk = set === undefined ||
    (Array.isArray(set) &&
      set.every((entry) =>
        Array.isArray(entry) && entry.length === 3 && entry.every((field) => typeof field === "string")
      ));
  const unsetOk = unset === undefined ||
    (Array.isArray(unset) && unset.every((key) => typeof key === "string"));
  return setOk && unsetOk;
}

/**
 * The line that starts at `start` of `bytes` and its end (the offset after its newline), or null when no
 * whole, checksummed line starts there: the end of what was written so far, or a torn tail.
 */
function lineAt(bytes: Uint8Array, start: number): { line: JournalLine; end: number } | null {
  const newline = bytes.indexOf(NEWLINE, start);
  if (newline < 0 || newline < start + HASH_HEX_LENGTH + 1 || bytes[start + HASH_HEX_LENGTH] !== SPACE) {
    return null;
  }
  const json = bytes.subarray(start + HASH_HEX_LENGTH + 1, newline);
  let hash: string;
  try {
    hash = decoder.decode(bytes.subarray(start, start + HASH_HEX_LENGTH));
  } catch {
    return null;
  }
  if (sha256Hex(json) !== hash) return null;
  let parsed: unknown;
  try {
    parsed = JSON.parse(decoder.decode(json));
  } catch {
    return null;
  }
  return isLine(parsed) ? { line: parsed, end: newline + 1 } : null;
}

/** Every byte of `file` from `from` to `to`. */
function readRange(file: Deno.FsFile, from: number, to: number): Uint8Array {
  const bytes = new Uint8Array(to - from);
  file.seekSync(from, Deno.SeekMode.Start);
  let filled = 0;
  while (filled < bytes.length) {
    const read = file.readSync(bytes.subarray(filled));
    if (read === null || read === 0) return bytes.subarray(0, filled);
    filled += read;
  }
  return bytes;
}

function writeAllSync(file: Deno.FsFile, bytes: Uint8Array): void {
  let written = 0;
  while (written < bytes.length) written += file.writeSync(bytes.subarray(written));
}

/** The next version after `current`: the counter one above, with a fresh random nonce (so no ABA). */
export function nextVersion(current: string | null): string {
  const counter = current === null ? 0 : Number.parseInt(current.split(".")[0], 10);
  const next = Number.isSafeInteger(counter) ? counter + 1 : 1;
  return `${next}.${randomHex(8)}`;
}

/**
 * The lock file at `lockPath`, created if absent; opened for reading alone where it cannot be opened for
 * writing (a read-only mount: `flock` needs no write access, so such a store can still be read).
 */
async function openLockFile(lockPath: string): Promise<Deno.FsFile> {
  try {
    return await Deno.open(lockPath, { read: true, write: true, create: true });
  } catch (error) {
    const readable = await Deno.open(lockPath, { read: true }).catch(() => null);
    if (readable === null) throw error;
    return readable;
  }
}

/** The segment numbers in `dir`, highest last. */
function segmentsIn(dir: string): number[] {
  const segments: number[] = [];
  for (const entry of Deno.readDirSync(dir)) {
    if (SEGMENT_NAME.test(entry.name)) segments.push(Number(entry.name.slice(0, SEGMENT_DIGITS)));
  }
  return segments.sort((a, b) => a - b);
}

/** Bytes a key costs in a snapshot line. */
function slotBytes(key: string, slot: Slot): number {
  return key.length + slot.version.length + Math.ceil(slot.value.byteLength / 3) * 4 + ENTRY_OVERHEAD_BYTES;
}

/**
 * The `ledger.write.mid` fault barrier of a commit: part of its line is in the journal, the rest not yet
 * written, so a Crash there leaves a torn tail.
 */
async function midCommit(first: KeyMutation, entries: number): Promise<void> {
  await barrier(Barrier.ledgerWriteMid, {
    store: "file",
    operation: first.kind,
    name: first.key,
    entries,
  });
}

/** The keys of one file store, as this handle sees them (see the module comment). */
export class KeyJournal {
  readonly #dir: string;
  readonly #lockFile: Deno.FsFile;
  #view = new Map<string, Slot>();
  #liveBytes = 0;
  #segment: number;
  #file: Deno.FsFile;
  /** Bytes of the current segment applied to the view (the end of its last whole line). */
  #offset = 0;
  /** The successor named by the current segment's seal, once read. */
  #sealedInto: number | null = null;
  /** Whether this handle holds the lock and has read everything: the view is the committed state. */
  #lockedFresh = false;
  #pending: Pending[] = [];
  #draining: Promise<void> | null = null;

  private constructor(dir: string, lockFile: Deno.FsFile, segment: number, file: Deno.FsFile) {
    this.#dir = dir;
    this.#lockFile = lockFile;
    this.#segment = segment;
    this.#file = file;
  }

  /**
   * Opens the journal in `dir` (which must exist) under the lock file at `lockPath` (created if absent).
   * `beforeLoad` runs holding the lock, before the journal is read; what it passes to its `snapshot`
   * argument becomes the journal's whole content (a migration from an older layout). Throws what the disk
   * throws, and UnobservableState for a damaged journal.
   */
  static async open(
    dir: string,
    lockPath: string,
    beforeLoad: (snapshot: (entries: Iterable<[string, Slot]>) => Promise<void>) => Promise<void>,
  ): Promise<KeyJournal> {
    const lockFile = await openLockFile(lockPath);
    let journal: KeyJournal | null = null;
    try {
      await lockFile.lock(true);
      try {
        await beforeLoad(async (entries) => {
          const segment = (segmentsIn(dir).at(-1) ?? 0) + 1;
          const bytes = snapshotLine(new Map(entries));
          await writeAtomically(dir, snapshotTempPath(dir, segment), segmentPath(dir, segment), bytes);
        });
        let segments = segmentsIn(dir);
        if (segments.length === 0) {
          Deno.openSync(segmentPath(dir, 1), { append: true, create: true }).close();
          await syncDirectory(dir);
          segments = [1];
        }
        const segment = segments.at(-1)!;
        journal = new KeyJournal(dir, lockFile, segment, KeyJournal.#openSegment(dir, segment));
        if (journal.#catchUp(true)) await journal.#compact();
        journal.#removeLeftovers();
      } finally {
        lockFile.unlockSync();
      }
    } catch (error) {
      if (journal !== null) journal.#file.close();
      lockFile.close();
      throw error;
    }
    return journal;
  }

  /** The committed entry of `key`, as of this call. */
  async get(key: string): Promise<StoreEntry> {
    await this.#fresh();
    const slot = this.#view.get(key);
    return slot === undefined ? ABSENT : presentEntry(slot.value.slice(), slot.version);
  }

  /** Every committed key starting with `prefix`, sorted by key, as of this call. */
  async scan(prefix: string): Promise<readonly StoredRecord[]> {
    await this.#fresh();
    const records: StoredRecord[] = [];
    for (const [key, slot] of this.#view) {
      if (key.startsWith(prefix)) records.push(storedRecord(key, slot.value.slice(), slot.version));
    }
    return records.sort(compareRecordKeys);
  }

  /**
   * Commits `mutation` with whatever else is waiting for the next commit; resolves once the commit is
   * durable: true when it took effect, false when the key's version did not match. Rejects with what
   * failed the commit (the mutation may or may not have taken effect).
   */
  submit(mutation: KeyMutation): Promise<boolean> {
    return new Promise<boolean>((resolve, reject) => {
      this.#pending.push({ mutation, resolve, reject });
      this.#draining ??= this.#drain();
    });
  }

  /**
   * Waits for the commits in flight, compacts a segment that holds more than twice its live keys, and
   * releases the files. A compaction that fails here loses nothing (the segment stays whole and current),
   * so its error is not this call's: the next lock holder compacts when the segment grows past the limit.
   */
  async close(): Promise<void> {
    while (this.#draining !== null) await this.#draining;
    if (this.#offset > 2 * this.#liveBytes + CLOSE_COMPACT_SLACK_BYTES) {
      await this.#underLock(() => this.#compact()).catch(() => {});
    }
    this.#file.close();
    this.#lockFile.close();
  }

  static #openSegment(dir: string, segment: number): Deno.FsFile {
    return Deno.openSync(segmentPath(dir, segment), { read: true });
  }

  /**
   * Appends `bytes` to the current segment through a descriptor opened for this write, so a mount turned
   * read-only (or a file made unwritable) under a running store refuses the next commit, as it refuses any
   * other new write; `between` (when given) runs with the first half written. Not synced.
   */
  async #appendRaw(bytes: Uint8Array, between?: () => Promise<void>): Promise<Deno.FsFile> {
    const file = Deno.openSync(segmentPath(this.#dir, this.#segment), { write: true, append: true });
    try {
      if (between === undefined) {
        writeAllSync(file, bytes);
      } else {
        const half = bytes.length >> 1;
        writeAllSync(file, bytes.subarray(0, half));
        await between();
        writeAllSync(file, bytes.subarray(half));
      }
    } catch (error) {
      file.close();
      throw error;
    }
    return file;
  }

  async #drain(): Promise<void> {
    try {
      while (this.#pending.length > 0) await this.#underLock(() => this.#commit());
    } catch {
      // #commit settles every pending mutation it took, with the error that failed it; a failure before it
      // took them (the lock) leaves them for the next turn of this loop.
    } finally {
      this.#draining = null;
    }
    if (this.#pending.length > 0) this.#draining = this.#drain();
  }

  /**
   * Runs `body` holding the journal's lock, with the view caught up to everything committed (and a sealed
   * segment whose compactor died compacted first). Reads answer from the view meanwhile.
   */
  async #underLock<T>(body: () => Promise<T>): Promise<T> {
    try {
      await this.#lockFile.lock(true);
    } catch (error) {
      this.#failPending(error);
      throw error;
    }
    try {
      const sealedAlone = this.#catchUp(true);
      this.#lockedFresh = true;
      if (sealedAlone) await this.#compact();
      return await body();
    } catch (error) {
      this.#failPending(error);
      throw error;
    } finally {
      this.#lockedFresh = false;
      this.#lockFile.unlockSync();
    }
  }

  #failPending(error: unknown): void {
    const failed = this.#pending;
    this.#pending = [];
    for (const pending of failed) pending.reject(error);
  }

  /** Decides every pending mutation on the committed view, writes the changes as one line, syncs it. */
  async #commit(): Promise<void> {
    const batch = this.#pending;
    this.#pending = [];
    const changes = new Map<string, Slot | null>();
    const outcomes = batch.map(({ mutation }) => {
      const current = changes.has(mutation.key) ? changes.get(mutation.key)! : this.#view.get(mutation.key);
      const version = current?.version ?? null;
      if (mutation.kind === "cas") {
        if (version !== mutation.expected) return false;
        changes.set(mutation.key, { value: mutation.value, version: nextVersion(version) });
        return true;
      }
      if (current === undefined || current === null) return false;
      if (mutation.expected !== null && version !== mutation.expected) return false;
      changes.set(mutation.key, null);
      return true;
    });
    if (changes.size > 0) {
      const set: [string, string, string][] = [];
      const unset: string[] = [];
      for (const [key, slot] of changes) {
        if (slot === null) unset.push(key);
        else set.push([key, slot.version, slot.value.toBase64()]);
      }
      const line = encodeLine(unset.length === 0 ? { set } : set.length === 0 ? { unset } : { set, unset });
      try {
        await this.#append(line, batch[0].mutation, changes.size);
      } catch (error) {
        for (const pending of batch) pending.reject(error);
        return;
      }
      for (const [key, slot] of changes) this.#put(key, slot);
    }
    batch.forEach((pending, i) => pending.resolve(outcomes[i]));
    if (this.#offset > COMPACT_MIN_BYTES && this.#offset > COMPACT_RATIO * this.#liveBytes) {
      // What was just committed is durable whether or not this succeeds: a compaction that fails leaves
      // the segment whole and current, and the next commit tries again.
      await this.#compact().catch(() => {});
    }
  }

  /** Appends `line` to the current segment and makes it durable (the lock is held, the view fresh). */
  async #append(line: Uint8Array, first: KeyMutation, entries: number): Promise<void> {
    const between = faultsInstalled() ? () => midCommit(first, entries) : undefined;
    const file = await this.#appendRaw(line, between);
    try {
      await file.syncData();
    } finally {
      file.close();
    }
    this.#offset += line.length;
  }

  /** Sets (or with null removes) `key` in the view, keeping the live byte count. */
  #put(key: string, slot: Slot | null): void {
    const previous = this.#view.get(key);
    if (previous !== undefined) this.#liveBytes -= slotBytes(key, previous);
    if (slot === null) {
      this.#view.delete(key);
    } else {
      this.#view.set(key, slot);
      this.#liveBytes += slotBytes(key, slot);
    }
  }

  /** Brings the view up to what is committed, unless this handle holds the lock and already did. */
  #fresh(): Promise<void> {
    return Promise.try(() => {
      if (!this.#lockedFresh) this.#catchUp(false);
    });
  }

  /**
   * Applies the lines appended to the current segment since the last look and follows a seal to the
   * current segment. `locked`: this handle holds the lock, so a torn tail is cut off; without the lock it
   * is left as it is (an incomplete line may be a commit still being written). True when the current
   * segment is sealed and has no successor (its compactor died between the seal and the rename): a lock
   * holder compacts it again before writing.
   */
  #catchUp(locked: boolean): boolean {
    for (;;) {
      if (this.#sealedInto === null) {
        const size = this.#file.statSync().size;
        if (size === this.#offset) return false;
        this.#readFrom(size, locked);
        if (this.#sealedInto === null) return false;
      }
      const current = segmentsIn(this.#dir).at(-1) ?? this.#segment;
      if (current <= this.#segment) return true;
      this.#switchTo(current);
    }
  }

  /** Parses the current segment from the view's offset to `size`, applying each whole line. */
  #readFrom(size: number, locked: boolean): void {
    const path = segmentPath(this.#dir, this.#segment);
    if (size < this.#offset) throw damaged(path, size, "the segment is shorter than what was read of it");
    const bytes = readRange(this.#file, this.#offset, size);
    let at = 0;
    while (at < bytes.length && this.#sealedInto === null) {
      const parsed = lineAt(bytes, at);
      if (parsed === null) {
        const newline = bytes.indexOf(NEWLINE, at);
        if (newline >= 0 && newline + 1 < bytes.length) {
          throw damaged(path, this.#offset + at, "a line fails its checksum and more lines follow it");
        }
        break;
      }
      this.#apply(parsed.line);
      at = parsed.end;
    }
    this.#offset += at;
    if (locked && this.#sealedInto === null && this.#offset < size) Deno.truncateSync(path, this.#offset);
  }

  #apply(line: JournalLine): void {
    if (line.sealed !== undefined) {
      this.#sealedInto = line.sealed;
      return;
    }
    for (const [key, version, value] of line.set ?? []) {
      this.#put(key, { value: Uint8Array.fromBase64(value), version });
    }
    for (const key of line.unset ?? []) this.#put(key, null);
  }

  /** Makes `segment` the current one, its view read from its start (on the next catch-up). */
  #switchTo(segment: number): void {
    const file = KeyJournal.#openSegment(this.#dir, segment);
    this.#file.close();
    this.#file = file;
    this.#segment = segment;
    this.#offset = 0;
    this.#sealedInto = null;
    this.#view = new Map();
    this.#liveBytes = 0;
  }

  /**
   * Writes the live keys as the next segment and makes it current (the lock is held, the view fresh):
   * snapshot fsynced, old segment sealed, snapshot renamed into place, directory fsynced, old segment
   * removed.
   */
  async #compact(): Promise<void> {
    const next = this.#segment + 1;
    const bytes = snapshotLine(this.#view);
    const seal = async () => {
      if (this.#sealedInto === null) (await this.#appendRaw(encodeLine({ sealed: next }))).close();
    };
    await writeAtomically(
      this.#dir,
      snapshotTempPath(this.#dir, next),
      segmentPath(this.#dir, next),
      bytes,
      seal,
    );
    const file = KeyJournal.#openSegment(this.#dir, next);
    this.#file.close();
    this.#file = file;
    this.#segment = next;
    this.#offset = bytes.length;
    this.#sealedInto = null;
    this.#removeLeftovers();
  }

  /** Removes segments below the current one and temporary files (only a lock holder may). */
  #removeLeftovers(): void {
    for (const entry of Deno.readDirSync(this.#dir)) {
      const stale = entry.name.endsWith(TEMP_SUFFIX) ||
        (SEGMENT_NAME.test(entry.name) && Number(entry.name.slice(0, SEGMENT_DIGITS)) < this.#segment);
      if (!stale) continue;
      try {
        Deno.removeSync(join(this.#dir, entry.name));
      } catch (error) {
        if (!(error instanceof Deno.errors.NotFound)) throw error;
      }
    }
  }
}

/** The one line of a segment that holds `entries` and nothing else (none for no entries). */
function snapshotLine(entries: ReadonlyMap<string, Slot>): Uint8Array {
  const set: [string, string, string][] = [];
  for (const [key, slot] of entries) set.push([key, slot.version, slot.value.toBase64()]);
  return set.length === 0 ? new Uint8Array() : encodeLine({ set });
}

function segmentPath(dir: string, segment: number): string {
  return join(dir, segmentName(segment));
}

function snapshotTempPath(dir: string, segment: number): string {
  return `${segmentPath(dir, segment)}${TEMP_SUFFIX}`;
}
