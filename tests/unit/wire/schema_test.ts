import assert from "node:assert/strict";
import { DecodeError, SchemaError } from "../../../src/core/errors.ts";
import type { ProtoField } from "../../../src/wire/proto_parser.ts";
import {
  decodeMessage,
  encodeMessage,
  ENVELOPE_SCHEMA,
  MAX_MESSAGE_BYTES,
  type MessageName,
} from "../../../src/wire/schema.ts";

/** WIRE.md's table: message -> field -> "number type", with proto3 labels. */
const WIRE_TABLE: Record<string, Record<string, string>> = {
  Envelope: {
    v: "1 uint32",
    type: "2 MsgType",
    producer_name: "3 string",
    flow_id: "4 string",
    run_id: "5 string",
    trace_id: "6 string",
    seq: "7 uint64",
    event_ts: "8 optional double",
    span_id: "9 string",
    parent_span_id: "10 string",
    replica_id: "11 uint32",
    metadata: "12 map<string, Value>",
    payload_type: "13 string",
    payload: "14 bytes",
  },
  Value: {
    null_value: "1 NullValue",
    double_value: "2 double",
    int_value: "3 sint64",
    string_value: "4 string",
    bytes_value: "5 bytes",
    bool_value: "6 bool",
    list_value: "7 ListValue",
    map_value: "8 MapValue",
    tensor_value: "9 Tensor",
  },
  ListValue: { values: "1 repeated Value" },
  MapValue: { fields: "1 map<string, Value>" },
  Tensor: { shape: "1 repeated int64", dtype: "2 string", data: "3 bytes" },
  Frame: { pixels: "1 Tensor", pixel_format: "2 string", capture_ts: "3 optional double" },
  Detections: { boxes: "1 Tensor", class_names: "2 repeated string" },
  Tracks: { tracks: "1 Tensor" },
  BlobRef: { ref: "1 string", inner_payload_type: "2 string", size: "3 uint64" },
};

function describeField(field: ProtoField): string {
  switch (field.label) {
    case "map":
      return `${field.number} map<string, ${field.type.name}>`;
    case "implicit":
      return `${field.number} ${field.type.name}`;
    default:
      return `${field.number} ${field.label} ${field.type.name}`;
  }
}

function assertRefused(name: MessageName, bytes: number[], contains: string): void {
  assert.throws(() => decodeMessage(name, Uint8Array.from(bytes)), (error: unknown) => {
    assert.ok(error instanceof DecodeError, String(error));
    assert.ok(error.message.includes(contains), error.message);
    return true;
  });
}

Deno.test("every message and field of the schema is WIRE.md's table: names, numbers, types, labels", () => {
  assert.equal(ENVELOPE_SCHEMA.package, "videoflow.v1");
  const messages = ENVELOPE_SCHEMA.messages;
  assert.deepEqual(messages.map((m) => m.name).sort(), Object.keys(WIRE_TABLE).sort());
  for (const message of messages) {
    const actual = Object.fromEntries(message.fields.map((f) => [f.name, describeField(f)]));
    assert.deepEqual(actual, WIRE_TABLE[message.name], message.name);
    const expectedOneofs = message.name === "Value"
      ? [{ name: "kind", fields: Object.keys(WIRE_TABLE.Value) }]
      : [];
    assert.deepEqual(message.oneofs, expectedOneofs, message.name);
  }
  const enums = Object.fromEntries(
    ENVELOPE_SCHEMA.enums.map((e) => [e.name, Object.fromEntries(e.values.map((v) => [v.name, v.number]))]),
  );
  assert.deepEqual(enums, {
    MsgType: { UNSPECIFIED: 0, DATA: 1, EOS: 2, ABORT: 3 },
    NullValue: { NULL_VALUE: 0 },
  });
});

Deno.test("repeated numbers are written packed and read packed or unpacked", () => {
  assert.deepEqual([...encodeMessage("Tensor", { shape: [2n, 3n] })], [0x0a, 0x02, 0x02, 0x03]);
  assert.deepEqual(decodeMessage("Tensor", Uint8Array.of(0x08, 0x02, 0x08, 0x03)), { shape: [2n, 3n] });
  assert.deepEqual(decodeMessage("Tensor", Uint8Array.of(0x0a, 0x00)), { shape: [] });
});

Deno.test("implicit fields at their default are omitted; an explicitly present default is written", () => {
  assert.deepEqual([...encodeMessage("Tensor", { shape: [], dtype: "", data: new Uint8Array(0) })], []);
  assert.deepEqual([...encodeMessage("Envelope", { v: 0, seq: 0n, replicaId: 0, metadata: [] })], []);
  assert.deepEqual([...encodeMessage("Frame", { pixelFormat: "", captureTs: 0 })], [
    0x19,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
  ]);
  assert.deepEqual([...encodeMessage("Value", { nullValue: 0 })], [0x08, 0x00]);
  assert.deepEqual([...encodeMessage("Value", { doubleValue: 0 })], [0x11, 0, 0, 0, 0, 0, 0, 0, 0]);
  assert.deepEqual(decodeMessage("Frame", Uint8Array.of(0x19, 0, 0, 0, 0, 0, 0, 0, 0)), { captureTs: 0 });
});

Deno.test("64-bit integers are exact bigints at their extremes, sint64 zig-zagged", () => {
  assert.deepEqual([...encodeMessage("Value", { intValue: -1n })], [0x18, 0x01]);
  for (const intValue of [-(2n ** 63n), 2n ** 63n - 1n, 2n ** 53n + 1n, -7n]) {
    assert.deepEqual(decodeMessage("Value", encodeMessage("Value", { intValue })), { intValue });
  }
  for (const seq of [2n ** 64n - 1n, 2n ** 53n + 1n]) {
    assert.deepEqual(decodeMessage("Envelope", encodeMessage("Envelope", { seq })), { seq });
  }
  assert.deepEqual(decodeMessage("Tensor", encodeMessage("Tensor", { shape: [-1n] })), { shape: [-1n] });
});

Deno.test("map entries keep wire order, duplicates and keys such as __proto__; a missing value is the default", () => {
  const metadata = [["b", { boolValue: true }], ["__proto__", { nullValue: 0 }], ["b", {
    intValue: 2n,
  }]] as const;
  assert.deepEqual(decodeMessage("Envelope", encodeMessage("Envelope", { metadata })), { metadata });
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

Deno.test("an encoded message owns its whole buffer, small or large, so it can be transferred", () => {
  for (const size of [3, 100_000]) {
    const bytes = encodeMessage("Tensor", { data: new Uint8Array(size) });
    assert.equal(bytes.byteOffset, 0);
    assert.equal(bytes.byteLength, bytes.buffer.byteLength);
    assert.equal(Object.getPrototypeOf(bytes), Uint8Array.prototype);
  }
});

Deno.test("bytes fields are views into the input, not copies", () => {
  const input = encodeMessage("Tensor", { data: Uint8Array.of(1, 2, 3) });
  const data = decodeMessage("Tensor", input).data!;
  assert.equal(data.buffer, input.buffer);
  input[input.length - 1] = 9;
  assert.deepEqual([...data], [1, 2, 9]);
});

Deno.test("varints are exact at every length boundary, 32- and 64-bit, and enums below 0 take ten bytes", () => {
  const hex = (bytes: Uint8Array) => bytes.toHex();
  assert.equal(hex(encodeMessage("Envelope", { v: 127 })), "087f");
  assert.equal(hex(encodeMessage("Envelope", { v: 128 })), "088001");
  assert.equal(hex(encodeMessage("Envelope", { v: 2 ** 32 - 1 })), "08ffffffff0f");
  assert.equal(hex(encodeMessage("Envelope", { seq: 2n ** 35n - 1n })), "38ffffffff7f");
  assert.equal(hex(encodeMessage("Envelope", { seq: 2n ** 35n })), "38808080808001");
  assert.equal(hex(encodeMessage("Envelope", { seq: 2n ** 64n - 1n })), "38" + "ff".repeat(9) + "01");
  assert.equal(hex(encodeMessage("Envelope", { type: -1 })), "10" + "ff".repeat(9) + "01");
  assert.deepEqual(decodeMessage("Envelope", encodeMessage("Envelope", { type: -1 })), { type: -1 });
  for (let bits = 0; bits <= 64; bits++) {
    for (const seq of [2n ** BigInt(bits) - 1n, 2n ** BigInt(bits)].filter((n) => n < 2n ** 64n)) {
      const bytes = encodeMessage("Envelope", { seq });
      const length = seq === 0n ? 0 : 1 + Math.ceil(seq.toString(2).length / 7);
      assert.equal(bytes.length, length, `seq ${seq}`);
      assert.deepEqual(decodeMessage("Envelope", bytes), seq === 0n ? {} : { seq }, `seq ${seq}`);
    }
  }
  // A negative int32 written as a uint32 by another writer: ten bytes, read as its low 32 bits.
  assert.deepEqual(decodeMessage("Envelope", Uint8Array.of(0x08, ...new Array(9).fill(0xff), 0x01)), {
    v: 2 ** 32 - 1,
  });
});

Deno.test("strings of any length decode strictly, the short ASCII path included", () => {
  for (const dtype of ["", "a", "x".repeat(32), "y".repeat(33), "é".repeat(20), "😀".repeat(40)]) {
    assert.deepEqual(
      decodeMessage("Tensor", encodeMessage("Tensor", { dtype })),
      dtype === "" ? {} : { dtype },
    );
  }
  assertRefused("Tensor", [0x12, 0x03, 0x61, 0x80, 0x62], "not valid UTF-8");
  assertRefused("Tensor", [0x12, 40, ...new Array(39).fill(0x61), 0xc3], "not valid UTF-8");
});

Deno.test("a string with a lone surrogate is refused on encode, naming the field; pairs are written as UTF-8", () => {
  for (const dtype of ["\ud800", "a\udc00b", "\udc00\ud800", "x\ud83d"]) {
    assert.throws(() => encodeMessage("Tensor", { dtype }), (error: unknown) => {
      assert.ok(error instanceof SchemaError, String(error));
      assert.match(error.message, /videoflow\.v1\.Tensor\.dtype is not well-formed Unicode/);
      return true;
    });
  }
  assert.equal(encodeMessage("Tensor", { dtype: "\ud83d\ude00" }).toHex(), "1204f09f9880");
});

Deno.test("encodeMessage writes into the caller's allocation, asked once for the exact size", () => {
  const message = {
    pixels: { shape: [2n, 2n], dtype: "uint8", data: Uint8Array.of(1, 2, 3, 4) },
    captureTs: 1.5,
  };
  const expected = encodeMessage("Frame", message);
  const shared = new SharedArrayBuffer(expected.length + 10);
  const sizes: number[] = [];
  const written = encodeMessage("Frame", message, {
    allocate(size) {
      sizes.push(size);
      return new Uint8Array(shared, 7, size);
    },
  });
  assert.deepEqual(sizes, [expected.length]);
  assert.equal(written.buffer, shared);
  assert.equal(written.byteOffset, 7);
  assert.deepEqual([...written], [...expected]);
  assert.deepEqual(decodeMessage("Frame", written), message);
  assert.throws(
    () => encodeMessage("Frame", message, { allocate: (size) => new Uint8Array(size + 1) }),
    (error: unknown) => error instanceof RangeError && /exactly/.test(error.message),
  );
});

Deno.test("a message is read from a SharedArrayBuffer, strings short and long", () => {
  const message = { dtype: "ü".repeat(50), data: Uint8Array.of(9, 8) };
  const bytes = encodeMessage("Tensor", message);
  const shared = new Uint8Array(new SharedArrayBuffer(bytes.length));
  shared.set(bytes);
  assert.deepEqual(decodeMessage("Tensor", shared), message);
  assert.deepEqual(decodeMessage("Tensor", shared).data!.buffer, shared.buffer);
});

Deno.test("a message beyond protobuf's 2 GiB limit is refused before anything is allocated", () => {
  const mebibyte = new Uint8Array(2 ** 20);
  const values = Array.from(
    { length: MAX_MESSAGE_BYTES / mebibyte.length + 1 },
    () => ({ bytesValue: mebibyte }),
  );
  assert.throws(
    () =>
      encodeMessage("Value", { listValue: { values } }, {
        allocate: () => assert.fail("nothing is allocated for a message that cannot be written"),
      }),
    (error: unknown) => error instanceof SchemaError && /exceeds protobuf's limit/.test(error.message),
  );
});
