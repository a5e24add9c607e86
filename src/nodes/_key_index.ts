/**
 * {@link KeyIndexFile}: an on-disk set of keys, so a sink that skips the inputs it already wrote holds none
 * of them in memory, and learns them at `open()` without rereading what it wrote before.
 *
 * A key is stored as the first 16 bytes of its SHA-256 in an open-addressing hash table on disk. The table
 * grows in levels, each twice the slots of the one before and filled to half: a level is never rehashed,
 * a lookup probes each level once (a few levels for millions of keys, in the page cache), and an insert
 * writes one slot of the newest. The header records how far into the indexed file the keys are all
 * in the table (`indexedTo`), with a fingerprint of the bytes just before it; it is written only after the
 * slots it covers were synced, so after a crash at any instant the owner re-adds the keys of the lines past
 * `indexedTo` and the table holds every key of the file. A fingerprint that no longer matches (the file was
 * replaced, truncated or rewritten) or a header that is not one tells the owner to {@link reset} and index
 * the file from its start: the file is the truth, the index only a way to look into it.
 *
 * Layout: a 64-byte header (`VFKEYIX1`, `indexedTo` and the key count as float64, the 16-byte fingerprint),
 * then level 0 ({@link BASE_SLOTS} slots of 16 bytes), level 1 (twice that), and so on; an all-zero slot
 * is empty, and a file shorter than a level reads as empty slots there (the levels are sparse).
 *
 * Synchronous file I/O throughout: a probe is one seek and one short read in the page cache, cheaper
 * than the promise an asynchronous read would cost, and `close()` must finish inside a synchronous call.
 *
 * @module
 */

import { UnobservableState } from "../core/errors.ts";
import { sha256 } from "../wire/sha256.ts";

const MAGIC = new TextEncoder().encode("VFKEYIX1");
const HEADER_BYTES = 64;
const SLOT_BYTES = 16;
/** Slots of level 0; level `n` holds `BASE_SLOTS << n`. */
const BASE_SLOTS = 1 << 16;
/** Slots one probe reads at a time. */
const PROBE_SLOTS = 16;
/** Bytes of the indexed file the fingerprint covers, just before `indexedTo`. */
export const FINGERPRINT_SPAN = 64;
const FINGERPRINT_BYTES = 16;

/** The fingerprint of the bytes just before an `indexedTo`: the first 16 bytes of their SHA-256. */
export function fingerprintOf(tail: Uint8Array): Uint8Array {
  return sha256(tail).subarray(0, FINGERPRINT_BYTES);
}

function digestOf(key: string): Uint8Array {
  const digest = sha256(key).subarray(0, SLOT_BYTES);
  if (digest.every((byte) => byte === 0)) digest[SLOT_BYTES - 1] = 1;
  return digest;
}

/** Whether `a` and `b` hold the same bytes. */
export function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((byte, i) => byte === b[i]);
}

/** What the header of an index says. */
export interface KeyIndexHeader {
  /** Every key of the indexed file's lines before this byte offset is in the table. */
  readonly indexedTo: number;
  /** The fingerprint of the indexed file's bytes just before `indexedTo`. */
  readonly fingerprint: Uint8Array;
}

/** An on-disk set of keys, one owner at a time; see the module doc. */
export class KeyIndexFile {
  readonly #path: string;
  readonly #file: Deno.FsFile;
  #count = 0;
  #header: KeyIndexHeader | null;

  private constructor(path: string, file: Deno.FsFile, count: number, header: KeyIndexHeader | null) {
    this.#path = path;
    this.#file = file;
    this.#count = count;
    this.#header = header;
  }

  /** Opens (creating) the index at `path`; its header is `null` when the file holds none that is valid. */
  static open(path: string): KeyIndexFile {
    const file = Deno.openSync(path, { read: true, write: true, create: true });
    const bytes = new Uint8Array(HEADER_BYTES);
    const read = readAt(file, 0, bytes);
    const view = new DataView(bytes.buffer);
    const indexedTo = view.getFloat64(8, true);
    const count = view.getFloat64(16, true);
    const valid = read === HEADER_BYTES && equalBytes(bytes.subarray(0, MAGIC.length), MAGIC) &&
      Number.isSafeInteger(indexedTo) && indexedTo >= 0 && Number.isSafeInteger(count) && count >= 0;
    return valid
      ? new KeyIndexFile(path, file, count, {
        indexedTo,
        fingerprint: bytes.slice(24, 24 + FINGERPRINT_BYTES),
      })
      : new KeyIndexFile(path, file, 0, null);
  }

  /** The header as last written; `null` for a new or unreadable index, which must be {@link reset}. */
  get header(): KeyIndexHeader | null {
    return this.#header;
  }

  /** Whether `key` is in the set. */
  has(key: string): boolean {
    const digest = digestOf(key);
    for (let level = 0; level <= this.#level(); level++) {
      if (this.#probe(level, digest).found) return true;
    }
    return false;
  }

  /**
   * Adds the key of a line past `indexedTo` (found at `open()`): inserted unless a slot holds it already, and
   * counted either way, since it was added after the checkpoint whose count the header holds. (Counting a
   * key twice only opens the next level sooner; counting too few could overfill a level.)
   */
  restore(key: string): void {
    if (this.has(key)) this.#count++;
    else this.insertAbsent(key);
  }

  /**
   * Adds a `key` that {@link has} just reported absent, without looking for it again (a key added twice
   * takes two slots and is still found). Not durable until the next {@link checkpoint}.
   */
  insertAbsent(key: string): void {
    const level = this.#level();
    const digest = digestOf(key);
    const { slot } = this.#probe(level, digest);
    writeAt(this.#file, this.#slotOffset(level, slot), digest);
    this.#count++;
  }

  /**
   * Records that every key of the indexed file's lines before `indexedTo` is in the set: syncs the slots,
   * then writes the header with the fingerprint of the bytes before `indexedTo`.
   */
  checkpoint(indexedTo: number, fingerprint: Uint8Array): void {
    this.#file.syncDataSync();
    this.#writeHeader(indexedTo, fingerprint);
  }

  /** Empties the set (the slots first, then the header, so no crash leaves old keys under a new header). */
  reset(fingerprint: Uint8Array): void {
    this.#file.truncateSync(0);
    this.#file.syncDataSync();
    this.#count = 0;
    this.#writeHeader(0, fingerprint);
    this.#file.syncDataSync();
  }

  /** Closes the file (a checkpoint first is the owner's call). */
  close(): void {
    this.#file.close();
  }

  #writeHeader(indexedTo: number, fingerprint: Uint8Array): void {
    const bytes = new Uint8Array(HEADER_BYTES);
    bytes.set(MAGIC);
    const view = new DataView(bytes.buffer);
    view.setFloat64(8, indexedTo, true);
    view.setFloat64(16, this.#count, true);
    bytes.set(fingerprint.subarray(0, FINGERPRINT_BYTES), 24);
    writeAt(this.#file, 0, bytes);
    this.#header = { indexedTo, fingerprint: fingerprint.slice(0, FINGERPRINT_BYTES) };
  }

  /** The newest level: the first whose half is not yet filled, given how many keys the levels hold. */
  #level(): number {
    let level = 0;
    let filled = BASE_SLOTS / 2;
    while (this.#count >= filled) {
      level++;
      filled += (BASE_SLOTS << level) / 2;
    }
    return level;
  }

  #slotOffset(level: number, slot: number): number {
    return HEADER_BYTES + (BASE_SLOTS * (2 ** level - 1) + slot) * SLOT_BYTES;
  }

  /** Linear probing in `level` from the digest's home slot: where it is, or the first empty slot. */
  #probe(level: number, digest: Uint8Array): { found: boolean; slot: number } {
    const slots = BASE_SLOTS << level;
    const home = new DataView(digest.buffer, digest.byteOffset).getUint32(0, true) & (slots - 1);
    const block = new Uint8Array(PROBE_SLOTS * SLOT_BYTES);
    for (let start = home, probed = 0; probed <= slots; start = (start + PROBE_SLOTS) & (slots - 1)) {
      const count = Math.min(PROBE_SLOTS, slots - start);
      const bytes = block.subarray(0, count * SLOT_BYTES);
      bytes.fill(0, readAt(this.#file, this.#slotOffset(level, start), bytes));
      for (let i = 0; i < count; i++) {
        const slot = bytes.subarray(i * SLOT_BYTES, (i + 1) * SLOT_BYTES);
        if (equalBytes(slot, digest)) return { found: true, slot: start + i };
        if (slot.every((byte) => byte === 0)) return { found: false, slot: start + i };
      }
      probed += count;
      if (count < PROBE_SLOTS) start = -PROBE_SLOTS & (slots - 1);
    }
    throw new UnobservableState(
      `the key index ${this.#path} has no free slot in level ${level}, which it never fills past half`,
      "remove the index file: the sink indexes its file again from the start",
      { path: this.#path, level },
    );
  }
}

/** Reads up to `bytes.length` bytes at `offset`; how many were there (fewer at the end of the file). */
export function readAt(file: Deno.FsFile, offset: number, bytes: Uint8Array): number {
  file.seekSync(offset, Deno.SeekMode.Start);
  let read = 0;
  while (read < bytes.length) {
    const n = file.readSync(bytes.subarray(read));
    if (n === null) break;
    read += n;
  }
  return read;
}

function writeAt(file: Deno.FsFile, offset: number, bytes: Uint8Array): void {
  file.seekSync(offset, Deno.SeekMode.Start);
  for (let written = 0; written < bytes.length;) written += file.writeSync(bytes.subarray(written));
}
