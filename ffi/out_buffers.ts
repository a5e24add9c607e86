/**
 * Caller-owned output buffers for native calls: an output pointer is passed as a typed array koffi hands
 * to C as is (no marshalling of an `_Out_` value on every call, which costs several times the call), and
 * read back after the call returns, a struct decoded only when the call succeeded. The buffers are shared scratch: calls are synchronous, so each read
 * copies its value out before the next call that uses the same buffer.
 *
 * @module
 */

import koffi from "koffi";
import type { FfiType } from "./symbols.ts";

/** Two `unsigned int` outputs (a call with two, as `nvmlDeviceGetMigMode`, uses both). */
export const UINT_OUT: readonly [Uint32Array, Uint32Array] = [new Uint32Array(1), new Uint32Array(1)];

/** One pointer-sized output (an opaque handle, read back as a BigInt address). */
export const HANDLE_OUT: BigUint64Array = new BigUint64Array(1);

const structBuffers = new Map<FfiType, Uint8Array>();
const decoders = new Map<FfiType, (view: DataView, bytes: Uint8Array) => Record<string, unknown>>();

/** The zeroed scratch buffer for one struct of `type`, sized by koffi to the C layout. */
export function structOut(type: FfiType): Uint8Array {
  let buffer = structBuffers.get(type);
  if (buffer === undefined) {
    buffer = new Uint8Array(koffi.sizeof(type));
    structBuffers.set(type, buffer);
  }
  buffer.fill(0);
  return buffer;
}

/**
 * The struct `buffer` holds, as a fresh object (the buffer may be reused): each member read at the offset
 * koffi gives it (the offsets the layout test checks against gcc). `unsigned int` members are numbers,
 * `unsigned long long` members numbers when a double holds them exactly (else BigInts), character arrays
 * copies of their bytes. A struct with any other member kind is refused when first decoded.
 */
export function decodeStruct<T>(buffer: Uint8Array, type: FfiType): T {
  let decode = decoders.get(type);
  if (decode === undefined) {
    decode = structDecoder(type);
    decoders.set(type, decode);
  }
  return decode(new DataView(buffer.buffer, buffer.byteOffset, buffer.byteLength), buffer) as T;
}

type MemberReader = (view: DataView, bytes: Uint8Array, into: Record<string, unknown>) => void;

function structDecoder(spec: FfiType): (view: DataView, bytes: Uint8Array) => Record<string, unknown> {
  const type = koffi.type(spec);
  const readers = Object.values(type.members ?? {}).map(({ name, offset, type: member }): MemberReader => {
    switch (member.primitive) {
      case "UInt32":
        return (view, _, into) => {
          into[name] = view.getUint32(offset, true);
        };
      case "UInt64":
        return (view, _, into) => {
          const value = view.getBigUint64(offset, true);
          into[name] = value <= MAX_EXACT ? Number(value) : value;
        };
      case "Array":
        if (member.ref?.size === 1) {
          return (_, bytes, into) => {
            into[name] = bytes.slice(offset, offset + member.size);
          };
        }
    }
    throw new TypeError(`${type.name}.${name} (${member.name}) has no decoder here`);
  });
  return (view, bytes) => {
    const into: Record<string, unknown> = {};
    for (const read of readers) read(view, bytes, into);
    return into;
  };
}

const MAX_EXACT = BigInt(Number.MAX_SAFE_INTEGER);
