/**
 * The shapes every NVML read takes: one unsigned int out, a text buffer, a struct out, a 64-bit count
 * made a JS number. Each returns an Observation; none returns a value the call did not produce.
 *
 * @module
 */

import { known, type Observation, type Unknown, unknown } from "../src/backends/outcomes.ts";
import { decodeCString } from "../ffi/c_string.ts";
import { decodeStruct, HANDLE_OUT, structOut, UINT_OUT } from "../ffi/out_buffers.ts";
import type { FfiType } from "../ffi/symbols.ts";
import type { NvmlSymbol } from "../ffi/nvml_symbols.ts";
import type { NvmlSession } from "./session.ts";

/** A device handle as koffi 3 passes it: the handle's address. */
export type DeviceHandle = bigint;

/** Calls `symbol(...args, &out)` and reads the unsigned int it wrote. */
export function readUint(session: NvmlSession, symbol: NvmlSymbol, ...args: unknown[]): Observation<number> {
  const out = UINT_OUT[0];
  out[0] = 0;
  const failed = session.attempt(symbol, ...args, out);
  return failed ?? known(out[0]);
}

/** Calls `symbol(...args, &out)` and reads the handle it wrote; a null handle is malformed. */
export function readHandle(
  session: NvmlSession,
  symbol: NvmlSymbol,
  ...args: unknown[]
): Observation<DeviceHandle> {
  HANDLE_OUT[0] = 0n;
  const failed = session.attempt(symbol, ...args, HANDLE_OUT);
  if (failed !== null) return failed;
  const handle = HANDLE_OUT[0];
  if (handle === 0n) {
    return unknown("malformed", undefined, `${symbol} succeeded and gave no handle`);
  }
  return known(handle);
}

/** Calls `symbol(handle, buffer, size)` and decodes the text within the buffer (`what` names it). */
export function readText(
  session: NvmlSession,
  symbol: NvmlSymbol,
  handle: DeviceHandle | null,
  size: number,
  what: string,
): Observation<string> {
  const buffer = new Uint8Array(size);
  const failed = handle === null
    ? session.attempt(symbol, buffer, size)
    : session.attempt(symbol, handle, buffer, size);
  return failed ?? decodeCString(buffer, what);
}

/** Calls `symbol(...args, &struct)` and returns the `type` struct it wrote, decoded. */
export function readStruct<T>(
  session: NvmlSession,
  symbol: NvmlSymbol,
  type: FfiType,
  ...args: unknown[]
): Observation<T> {
  const out = structOut(type);
  const failed = session.attempt(symbol, ...args, out);
  return failed ?? known(decodeStruct<T>(out, type));
}

/** A 64-bit count as a JS number, or malformed when it is past what a double holds exactly. */
export function exactNumber(value: unknown, what: string): Observation<number> {
  if (typeof value === "number" && Number.isSafeInteger(value) && value >= 0) return known(value);
  return unknown("malformed", undefined, `${what} is not a count this binding can hold (${String(value)})`);
}

/** The Unknown an identity is when the `field` it is built from was read as `observation`. */
export function noIdentity(what: string, field: string, observation: Unknown): Unknown {
  return unknown(
    observation.reason,
    undefined,
    `${what} has no identity: its ${field} is unknown (${observation.detail})`,
  );
}
