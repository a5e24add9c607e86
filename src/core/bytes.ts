/**
 * A copy of a caller's bytes that nothing else shares: what a store keeps, or a link sends, so that the
 * caller may reuse its array at once.
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
