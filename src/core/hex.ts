/**
 * Bytes as lower-case hex, and random hex identifiers (run ids, version nonces, holder and write ids)
 * from the platform's cryptographic random source.
 *
 * @example
 * ```ts
 * console.log(hex(new Uint8Array([0, 171, 255]))); // "00abff"
 * console.log(randomHex(4).length); // 8
 * ```
 *
 * @module
 */

const DIGITS = Array.from({ length: 256 }, (_, byte) => byte.toString(16).padStart(2, "0"));

/** `bytes` as two lower-case hex digits each. */
export function hex(bytes: Uint8Array): string {
  let text = "";
  for (let i = 0; i < bytes.length; i++) text += DIGITS[bytes[i]];
  return text;
}

/** `bytes` cryptographically random bytes as hex (twice as many digits). */
export function randomHex(bytes: number): string {
  return hex(crypto.getRandomValues(new Uint8Array(bytes)));
}
