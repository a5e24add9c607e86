/**
 * Byte arrays that are cheap to own: a copy of a caller's bytes that nothing else shares (what a store
 * keeps, or a link sends, so that the caller may reuse its array at once), and small arrays carved out of
 * shared slabs ({@link ByteSlab}).
 *
 * @example
 * ```ts
 * const mine = new Uint8Array([1, 2, 3]);
 * const kept = copyBytes(mine);
 * mine.fill(0);
 * console.log([...kept]); // [1, 2, 3]
 * ```
 *
 * @module
 */

/**
 * A copy of `bytes` in a plain Uint8Array spanning an ArrayBuffer of its own, whatever `bytes` is: a Node
 * Buffer's `slice` is a view, not a copy, and a pooled Buffer shares its memory with others.
 */
export function copyBytes(bytes: Uint8Array): Uint8Array<ArrayBuffer> {
  const copy = new Uint8Array(bytes.byteLength);
  copy.set(bytes);
  return copy;
}

/** The largest array a {@link ByteSlab} carves out of a slab by default, in bytes. */
export const SLAB_PIECE_LIMIT = 2048;
/** The size of each slab a {@link ByteSlab} carves from by default, in bytes. */
export const SLAB_BYTES = 64 * 1024;

/**
 * Small byte arrays carved in turn out of shared slabs, so that making many costs one ArrayBuffer per
 * slab instead of one each. A piece is zeroed and handed out once, never again, so it is its taker's
 * alone; a slab lives while any piece of it does. A request above the piece limit gets an array that
 * spans an ArrayBuffer of its own (one that can be transferred).
 */
export class ByteSlab {
  readonly #pieceLimit: number;
  readonly #slabBytes: number;
  #slab = new Uint8Array(0);
  #at = 0;

  constructor(pieceLimit: number = SLAB_PIECE_LIMIT, slabBytes: number = SLAB_BYTES) {
    this.#pieceLimit = pieceLimit;
    this.#slabBytes = Math.max(slabBytes, pieceLimit);
  }

  /** `size` zeroed bytes: a piece of the current slab, or an array of their own above the piece limit. */
  take(size: number): Uint8Array {
    if (size > this.#pieceLimit) return new Uint8Array(size);
    if (this.#at + size > this.#slab.byteLength) {
      this.#slab = new Uint8Array(this.#slabBytes);
      this.#at = 0;
    }
    const piece = this.#slab.subarray(this.#at, this.#at + size);
    this.#at += size;
    return piece;
  }
}

/** Something bytes are written to in pieces: a file, stdout or stderr. */
export interface ByteWriter {
  /** Writes some of `bytes`; resolves with how many. */
  write(bytes: Uint8Array): Promise<number>;
}

/** Writes every one of `bytes` to `writer`, however few each write takes. */
export async function writeAll(writer: ByteWriter, bytes: Uint8Array): Promise<void> {
  let offset = 0;
  while (offset < bytes.length) offset += await writer.write(bytes.subarray(offset));
}
