import assert from "node:assert/strict";
import { DecodeError } from "../../../src/core/errors.ts";
import { decodeMessage } from "../../../src/wire/reader.ts";
import { MESSAGE_TYPES, type MessageName } from "../../../src/wire/schema.ts";
import { encodeMessage, int64 } from "../../../src/wire/writer.ts";

function assertRefused(name: MessageName, bytes: number[], contains: string): void {
  assert.throws(() => decodeMessage(name, Uint8Array.from(bytes)), (error: unknown) => {
    assert.ok(error instanceof DecodeError, String(error));
    assert.ok(error.message.includes(contains), error.message);
    return true;
  });
}

Deno.test("repeated numbers are read packed or unpacked", () => {
  assert.deepEqual(decodeMessage("Tensor", Uint8Array.of(0x0a, 0x02, 0x02, 0x03)), { shape: [2n, 3n] });
  assert.deepEqual(decodeMessage("Tensor", Uint8Array.of(0x08, 0x02, 0x08, 0x03)), { shape: [2n, 3n] });
  assert.deepEqual(decodeMessage("Tensor", Uint8Array.of(0x0a, 0x00)), { shape: [] });
});

Deno.test("an explicitly present default reads back as set, an implicit one as absent", () => {
  assert.deepEqual(decodeMessage("Frame", Uint8Array.of(0x19, 0, 0, 0, 0, 0, 0, 0, 0)), { captureTs: 0 });
  assert.deepEqual(decodeMessage("Value", Uint8Array.of(0x08, 0x00)), { nullValue: 0 });
  assert.deepEqual(decodeMessage("Envelope", Uint8Array.of(0x08, 0x00, 0x1a, 0x00)), {
    v: 0,
    producerName: "",
  });
});

Deno.test("64-bit integers read as exact bigints at their extremes, sint64 zig-zagged", () => {
  assert.deepEqual(decodeMessage("Value", Uint8Array.of(0x18, 0x01)), { intValue: -1n });
  for (const intValue of [-(2n ** 63n), 2n ** 63n - 1n, 2n ** 53n + 1n, -7n]) {
    const bytes = encodeMessage("Value", { int_value: int64(intValue) });
    assert.deepEqual(decodeMessage("Value", bytes), { intValue });
  }
  for (const seq of [2n ** 64n - 1n, 2n ** 53n + 1n]) {
    assert.deepEqual(decodeMessage("Envelope", encodeMessage("Envelope", { seq: int64(seq) })), { seq });
  }
  assert.deepEqual(decodeMessage("Tensor", encodeMessage("Tensor", { shape: [-1] })), { shape: [-1n] });
});

Deno.test("map entries keep wire order, duplicates and keys such as __proto__; a missing value is the default", () => {
  const entry = (key: string, value: object) => {
    const fields: Record<string, object> = Object.create(null);
    fields[key] = value;
    return encodeMessage("Envelope", { metadata: fields });
  };
  // Concatenated messages merge: their map entries follow one another, as one writer would send them.
  const bytes = Uint8Array.from([
    ...entry("b", { bool_value: true }),
    ...entry("__proto__", { null_value: 0 }),
    ...entry("b", { int_value: 2 }),
  ]);
  assert.deepEqual(decodeMessage("Envelope", bytes), {
    metadata: [["b", { boolValue: true }], ["__proto__", { nullValue: 0 }], ["b", { intValue: 2n }]],
  });
  assert.deepEqual(decodeMessage("Envelope", Uint8Array.of(0x62, 0x03, 0x0a, 0x01, 0x61)), {
    metadata: [["a", {}]],
  });
});

Deno.test("a later member of a oneof replaces an earlier one", () => {
  assert.deepEqual(decodeMessage("Value", Uint8Array.of(0x30, 0x01, 0x18, 0x04)), { intValue: 2n });
});

Deno.test("unknown fields are skipped", () => {
  const known = [0x12, 0x05, ...new TextEncoder().encode("uint8")];
  const unknown = [0x78, 0x2a, 0x82, 0x01, 0x02, 0x68, 0x69, 0x85, 0x01, 1, 2, 3, 4];
  assert.deepEqual(decodeMessage("Tensor", Uint8Array.from([...unknown, ...known])), { dtype: "uint8" });
});

Deno.test("strings keep a leading byte-order mark and any code point; invalid UTF-8 is refused", () => {
  for (const dtype of ["\ufeffx", "😀\u0000中"]) {
    assert.deepEqual(decodeMessage("Tensor", encodeMessage("Tensor", { dtype })), { dtype });
  }
  assertRefused("Tensor", [0x12, 0x01, 0xff], "videoflow.v1.Tensor.dtype is not valid UTF-8");
  assertRefused("Tensor", [0x12, 0x02, 0xed, 0xa0], "not valid UTF-8");
});

Deno.test("malformed framing is refused with a DecodeError that says what is wrong", () => {
  assertRefused("Tensor", [0x10, 0x05], "videoflow.v1.Tensor.dtype arrived with wire type 0");
  assertRefused("Tensor", [0x7b, 0x7c], "a group");
  assertRefused("Tensor", [0x00, 0x00], "numbered 0");
  assertRefused("Tensor", [0x1a, 0x05, 0x01], "runs past the end");
  assertRefused(
    "Frame",
    [0x0a, 0x02, 0x12, 0x05, 0x61, 0x62, 0x63, 0x64, 0x65],
    "runs past the end of its message",
  );
  assertRefused("Tensor", [0x0a, 0x01, 0x80, 0x01], "packed videoflow.v1.Tensor.shape runs past");
  assertRefused("Tensor", [0x08, 0x80, 0x80], "ends inside a varint");
  assertRefused("Tensor", [0x08, ...new Array(10).fill(0xff), 0x01], "longer than 10 bytes");
  assertRefused("Tensor", [0x7f], "videoflow.v1.Tensor holds invalid wire type 7");
  assertRefused("Tensor", [0x7e], "invalid wire type 6");
  assertRefused(
    "Envelope",
    [0x62, 0x02, 0x1f, 0x00],
    "an entry of videoflow.v1.Envelope.metadata holds invalid wire type 7",
  );
  assertRefused("Tensor", [0x79, 1, 2, 3], "ends inside a field of 8 bytes");
  assertRefused("Tensor", [0x7d, 1, 2, 3], "ends inside a field of 4 bytes");
  assertRefused("Frame", [0x19, 1, 2, 3, 4, 5, 6, 7], "ends inside a field of 8 bytes");
  assertRefused("Tensor", [0x78, ...new Array(10).fill(0x80), 0x00], "longer than 10 bytes");
});

Deno.test("a length or a tag past 32 bits is refused, never truncated to its low bits", () => {
  // Tensor.data (field 3, bytes) with a length of 2^32 + 1: truncated, it would read as 1 and take the byte.
  assertRefused("Tensor", [0x1a, 0x81, 0x80, 0x80, 0x80, 0x10, 0x07], "a length is larger than 32 bits");
  // Tensor.dtype's tag (0x12) with bit 35 set: truncated, it would read as a valid dtype.
  assertRefused(
    "Tensor",
    [0x92, 0x80, 0x80, 0x80, 0x80, 0x01, 0x01, 0x61],
    "a tag is larger than 32 bits",
  );
  // The largest 32-bit length still reads as a length (and so runs past the end).
  assertRefused("Tensor", [0x1a, 0xff, 0xff, 0xff, 0xff, 0x0f], "a length of 4294967295 bytes runs past");
  // Redundant zero continuation bytes are a valid encoding of a small length and tag.
  assert.deepEqual(decodeMessage("Tensor", Uint8Array.from([0x92, 0x80, 0x00, 0x81, 0x80, 0x00, 0x61])), {
    dtype: "a",
  });
});

Deno.test("bytes fields are views into the input, not copies", () => {
  const input = encodeMessage("Tensor", { data: Uint8Array.of(1, 2, 3) });
  const data = decodeMessage("Tensor", input).data!;
  assert.equal(data.buffer, input.buffer);
  input[input.length - 1] = 9;
  assert.deepEqual([...data], [1, 2, 9]);
});

Deno.test("varints read exactly at every length boundary, 32- and 64-bit; an enum below 0 takes ten bytes", () => {
  assert.deepEqual(decodeMessage("Envelope", Uint8Array.of(0x08, 0x80, 0x01)), { v: 128 });
  assert.deepEqual(decodeMessage("Envelope", encodeMessage("Envelope", { type: -1 })), { type: -1 });
  for (let bits = 0; bits <= 64; bits++) {
    for (const seq of [2n ** BigInt(bits) - 1n, 2n ** BigInt(bits)].filter((n) => n > 0n && n < 2n ** 64n)) {
      const bytes = encodeMessage("Envelope", { seq: int64(seq) });
      assert.equal(bytes.length, 1 + Math.ceil(seq.toString(2).length / 7), `seq ${seq}`);
      assert.deepEqual(decodeMessage("Envelope", bytes), { seq }, `seq ${seq}`);
    }
  }
  // A negative int32 written as a uint32 by another writer: ten bytes, read as its low 32 bits.
  assert.deepEqual(decodeMessage("Envelope", Uint8Array.of(0x08, ...new Array(9).fill(0xff), 0x01)), {
    v: 2 ** 32 - 1,
  });
});

Deno.test("strings of any length decode strictly, the short ASCII path included", () => {
  for (const dtype of ["a", "x".repeat(64), "y".repeat(65), "é".repeat(20), "😀".repeat(40)]) {
    assert.deepEqual(decodeMessage("Tensor", encodeMessage("Tensor", { dtype })), { dtype });
  }
  assertRefused("Tensor", [0x12, 0x03, 0x61, 0x80, 0x62], "not valid UTF-8");
  assertRefused("Tensor", [0x12, 40, ...new Array(39).fill(0x61), 0xc3], "not valid UTF-8");
  assertRefused("Tensor", [0x12, 70, ...new Array(69).fill(0x61), 0xc3], "not valid UTF-8");
});

Deno.test("a message is read from a SharedArrayBuffer, strings short and long", () => {
  const bytes = encodeMessage("Tensor", { dtype: "ü".repeat(50), data: Uint8Array.of(9, 8) });
  const shared = new Uint8Array(new SharedArrayBuffer(bytes.length));
  shared.set(bytes);
  assert.deepEqual(decodeMessage("Tensor", shared), { dtype: "ü".repeat(50), data: Uint8Array.of(9, 8) });
  assert.deepEqual(decodeMessage("Tensor", shared).data!.buffer, shared.buffer);
});

/** What protobufjs's generated decoder makes of `bytes`, as a reader written on it would see it. */
function protobufjsDecode(name: MessageName, bytes: number[]): Record<string, unknown> {
  const type = MESSAGE_TYPES[name];
  return type.toObject(type.decode(Uint8Array.from(bytes)), { longs: String }) as Record<string, unknown>;
}

Deno.test("protobufjs's generated decoder accepts what this reader refuses, or loses what it keeps", () => {
  // A known field (v, a uint32) sent length-delimited: protobufjs reads the length as v, the content as type.
  assert.deepEqual(protobufjsDecode("Envelope", [0x0a, 0x02, 0x10, 0x01]), { v: 2, type: 1 });
  assertRefused("Envelope", [0x0a, 0x02, 0x10, 0x01], "videoflow.v1.Envelope.v arrived with wire type 2");
  // Invalid UTF-8 is read as a string all the same (here one that is not even well-formed Unicode).
  assert.equal(typeof protobufjsDecode("Tensor", [0x12, 0x01, 0xff]).dtype, "string");
  // A group is skipped.
  assert.deepEqual(protobufjsDecode("Tensor", [0x7b, 0x7c, 0x12, 0x01, 0x61]), { dtype: "a" });
  assertRefused("Tensor", [0x7b, 0x7c, 0x12, 0x01, 0x61], "a group");
  // A length past 32 bits is truncated to its low bits, and the byte it then covers is read.
  assert.deepEqual(protobufjsDecode("Tensor", [0x12, 0x81, 0x80, 0x80, 0x80, 0x10, 0x61]), { dtype: "a" });
  // Of two entries with one key only the last is kept, and an integer-like key moves first.
  const entry = (
    key: string,
  ) => [0x62, key.length + 4, 0x0a, key.length, ...new TextEncoder().encode(key), 0x12, 0x00];
  const map = [...entry("b"), ...entry("7"), ...entry("b")];
  assert.deepEqual(Object.keys(protobufjsDecode("Envelope", map).metadata as object), ["7", "b"]);
  assert.deepEqual(decodeMessage("Envelope", Uint8Array.from(map)).metadata?.map(([key]) => key), [
    "b",
    "7",
    "b",
  ]);
  // Nesting has no limit there: 200 levels of lists decode.
  let nested: number[] = [];
  for (let i = 0; i < 200; i++) {
    const list = [0x0a, ...varint(nested.length), ...nested];
    nested = [0x3a, ...varint(list.length), ...list];
  }
  assert.ok(protobufjsDecode("Value", nested).list_value);
  assertRefused("Value", nested, "deeper than 100 levels");
});

function varint(value: number): number[] {
  const out = [];
  while (value > 0x7f) {
    out.push((value & 0x7f) | 0x80);
    value >>>= 7;
  }
  out.push(value);
  return out;
}
