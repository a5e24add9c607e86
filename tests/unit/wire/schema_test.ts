import assert from "node:assert/strict";
import protobuf from "protobufjs";
import { DecodeError } from "../../../src/core/errors.ts";
import { decodeMessage, encodeMessage, type MessageName, SCHEMA_ROOT } from "../../../src/wire/schema.ts";

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

function describeField(field: protobuf.Field): string {
  if (field instanceof protobuf.MapField) return `${field.id} map<${field.keyType}, ${field.type}>`;
  if (field.repeated) return `${field.id} repeated ${field.type}`;
  return `${field.id} ${field.options?.proto3_optional ? "optional " : ""}${field.type}`;
}

function assertRefused(name: MessageName, bytes: number[], contains: string): void {
  assert.throws(() => decodeMessage(name, Uint8Array.from(bytes)), (error: unknown) => {
    assert.ok(error instanceof DecodeError, String(error));
    assert.ok(error.message.includes(contains), error.message);
    return true;
  });
}

Deno.test("every message and field of the schema is WIRE.md's table: names, numbers, types, labels", () => {
  const pkg = SCHEMA_ROOT.lookup("videoflow.v1") as protobuf.Namespace;
  const messages = pkg.nestedArray.filter((nested) => nested instanceof protobuf.Type) as protobuf.Type[];
  assert.deepEqual(messages.map((m) => m.name).sort(), Object.keys(WIRE_TABLE).sort());
  for (const message of messages) {
    const actual = Object.fromEntries(message.fieldsArray.map((f) => [f.name, describeField(f)]));
    assert.deepEqual(actual, WIRE_TABLE[message.name], message.name);
  }
  const value = SCHEMA_ROOT.lookupType("videoflow.v1.Value");
  assert.deepEqual(value.oneofsArray.map((o) => [o.name, o.oneof]), [[
    "kind",
    Object.keys(WIRE_TABLE.Value),
  ]]);
  assert.deepEqual(SCHEMA_ROOT.lookupEnum("videoflow.v1.MsgType").values, {
    UNSPECIFIED: 0,
    DATA: 1,
    EOS: 2,
    ABORT: 3,
  });
  assert.deepEqual(SCHEMA_ROOT.lookupEnum("videoflow.v1.NullValue").values, { NULL_VALUE: 0 });
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
  assertRefused("Tensor", [0x7f], "cannot decode videoflow.v1.Tensor: invalid wire type 7");
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
