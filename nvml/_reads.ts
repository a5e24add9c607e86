/**
 * The shapes every NVML read takes: one unsigned int out, a text buffer, a struct out, a 64-bit count
 * made a JS number. Each returns an Observation; none returns a value the call did not produce. Every
 * observation of one {@link NvmlRead} is stamped with the instant the read began: an inventory is one
 * snapshot (and a clock read per field cost a third of the read).
 *
 * @module
 */

import type { Clock } from "../src/backends/clock.ts";
import {
  type Known,
  known,
  type Observation,
  type Unknown,
  unknown,
  type UnknownReason,
} from "../src/backends/outcomes.ts";
import { decodeCString } from "../ffi/c_string.ts";
import { decodeStruct, HANDLE_OUT, structOut, UINT_OUT } from "../ffi/out_buffers.ts";
import type { FfiType } from "../ffi/symbols.ts";
import type { NvmlSymbol } from "../ffi/nvml_symbols.ts";
import { NVML_SUCCESS, nvmlUnknown } from "../ffi/nvml_error.ts";
import type { NvmlSession } from "./session.ts";

/** One read through a session: the session called and the clock its observations are stamped with. */
export interface NvmlRead {
  readonly session: NvmlSession;
  readonly clock: Clock;
}

/** A read through `session` whose observations all carry `base`'s monotonic time now. */
export function snapshotRead(session: NvmlSession, base: Clock): NvmlRead {
  const at = base.monotonic();
  const clock: Clock = {
    now: () => base.now(),
    monotonic: () => at,
    sleep: (seconds, signal) => base.sleep(seconds, signal),
    setTimer: (seconds, callback) => base.setTimer(seconds, callback),
  };
  return { session, clock };
}

/** `value`, observed by `read`. */
export function seen<T>(read: NvmlRead, value: T): Known<T> {
  return known(value, read.clock);
}

/** An observation `read` could not make, and why. */
export function notSeen(read: NvmlRead, reason: UnknownReason, detail: string): Unknown {
  return unknown(reason, read.clock, detail);
}

/** Calls `symbol`: its return code, or the Unknown standing for the call (no such symbol, a closed session). */
export function call(read: NvmlRead, symbol: NvmlSymbol, ...args: unknown[]): number | Unknown {
  const code = read.session.call(symbol, ...args);
  return typeof code === "number" ? code : notSeen(read, code.reason, code.detail);
}

/** The Unknown a field is when `symbol` returned `code` (described through `nvmlErrorString`). */
export function failure(read: NvmlRead, symbol: NvmlSymbol, code: number): Unknown {
  return nvmlUnknown(read.session.errorFor(symbol, code), read.clock);
}

/** Calls `symbol`: null on `NVML_SUCCESS`, else the Unknown its failure reads as. */
export function attempt(read: NvmlRead, symbol: NvmlSymbol, ...args: unknown[]): Unknown | null {
  const code = call(read, symbol, ...args);
  if (typeof code !== "number") return code;
  return code === NVML_SUCCESS ? null : failure(read, symbol, code);
}

/** A device handle as koffi 3 passes it: the handle's address. */
export type DeviceHandle = bigint;

/** Calls `symbol(...args, &out)` and reads the unsigned int it wrote. */
export function readUint(read: NvmlRead, symbol: NvmlSymbol, ...args: unknown[]): Observation<number> {
  const out = UINT_OUT[0];
  out[0] = 0;
  const failed = attempt(read, symbol, ...args, out);
  return failed ?? seen(read, out[0]);
}

/** Calls `symbol(...args, &out)` and reads the handle it wrote; a null handle is malformed. */
export function readHandle(
  read: NvmlRead,
  symbol: NvmlSymbol,
  ...args: unknown[]
): Observation<DeviceHandle> {
  HANDLE_OUT[0] = 0n;
  const failed = attempt(read, symbol, ...args, HANDLE_OUT);
  if (failed !== null) return failed;
  const handle = HANDLE_OUT[0];
  if (handle === 0n) {
    return notSeen(read, "malformed", `${symbol} succeeded and gave no handle`);
  }
  return seen(read, handle);
}

/** Calls `symbol(handle, buffer, size)` and decodes the text within the buffer (`what` names it). */
export function readText(
  read: NvmlRead,
  symbol: NvmlSymbol,
  handle: DeviceHandle | null,
  size: number,
  what: string,
): Observation<string> {
  const buffer = new Uint8Array(size);
  const failed = handle === null
    ? attempt(read, symbol, buffer, size)
    : attempt(read, symbol, handle, buffer, size);
  return failed ?? decodeCString(buffer, what, read.clock);
}

/** Calls `symbol(...args, &struct)` and returns the `type` struct it wrote, decoded. */
export function readStruct<T>(
  read: NvmlRead,
  symbol: NvmlSymbol,
  type: FfiType,
  ...args: unknown[]
): Observation<T> {
  const out = structOut(type);
  const failed = attempt(read, symbol, ...args, out);
  return failed ?? seen(read, decodeStruct<T>(out, type));
}

/** A 64-bit count as a JS number, or malformed when it is past what a double holds exactly. */
export function exactNumber(read: NvmlRead, value: unknown, what: string): Observation<number> {
  if (typeof value === "number" && Number.isSafeInteger(value) && value >= 0) return seen(read, value);
  return notSeen(read, "malformed", `${what} is not a count this binding can hold (${String(value)})`);
}

/** The Unknown an identity is when the `field` it is built from was read as `observation`. */
export function noIdentity(read: NvmlRead, what: string, field: string, observation: Unknown): Unknown {
  return notSeen(
    read,
    observation.reason,
    `${what} has no identity: its ${field} is unknown (${observation.detail})`,
  );
}
