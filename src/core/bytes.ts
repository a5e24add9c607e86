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

/**
 * Bytes a maker of large arrays (a decoder's frames) leaves free before them in their buffer, so that the
 * envelope that carries them can be written around them in place ({@link giveWhole}); an envelope whose
 * header and trailer do not fit is written into an allocation of its own, as any other.
 */
export const ENVELOPE_HEADROOM = 4096;
/** Bytes left free after such an array, for what an envelope writes after it (a Frame's format, time). */
export const ENVELOPE_TAILROOM = 64;

/** Buffers given up whole, each mapped to whether an encoder may still claim it. */
const givenWhole = new WeakMap<ArrayBufferLike, boolean>();

/**
 * Gives `buffer` up whole, as a decoder does with each frame it makes: its maker keeps nothing of it, so
 * the first encoder that writes an array held in it may write its message around that array, over the
 * rest of the buffer ({@link claimGiven}), and whatever sends that message may move the whole buffer to
 * another thread ({@link isGivenWhole}), detaching every view of it here.
 */
export function giveWhole(buffer: ArrayBufferLike): void {
  givenWhole.set(buffer, true);
}

/** Whether `buffer` was given up whole ({@link giveWhole}); an encoder that claimed it keeps it so. */
export function isGivenWhole(buffer: ArrayBufferLike): boolean {
  return givenWhole.has(buffer);
}

/**
 * Claims a buffer given up whole for one message written into it in place: true the first time only, so
 * no second message is ever written over the first.
 */
export function claimGiven(buffer: ArrayBufferLike): boolean {
  if (givenWhole.get(buffer) !== true) return false;
  givenWhole.set(buffer, false);
  return true;
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
