/**
 * Reading a C string out of a fixed buffer without trusting it: the text ends at the first NUL inside the
 * buffer, a buffer with none is malformed (a read past it would be a made-up value), and bytes that are
 * not UTF-8 are malformed too.
 *
 * @module
 */

import { type Clock, systemClock } from "../src/backends/clock.ts";
import { known, type Observation, unknown } from "../src/backends/outcomes.ts";

const strict = new TextDecoder("utf-8", { fatal: true });

/**
 * The string `bytes` holds up to its first NUL, or `unknown("malformed", ...)` naming `what` when the
 * buffer has no terminator within its length or its text is not UTF-8. Never reads beyond `bytes`.
 */
export function decodeCString(
  bytes: Uint8Array | Int8Array,
  what: string,
  clock: Clock = systemClock,
): Observation<string> {
  const raw = bytes instanceof Uint8Array
    ? bytes
    : new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length);
  const end = raw.indexOf(0);
  if (end < 0) {
    return unknown("malformed", clock, `${what} has no terminator within its ${raw.length}-byte buffer`);
  }
  try {
    return known(strict.decode(raw.subarray(0, end)), clock);
  } catch {
    return unknown("malformed", clock, `${what} is not UTF-8 text`);
  }
}
