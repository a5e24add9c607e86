import assert from "node:assert/strict";
import protobuf from "protobufjs";
// @ts-types="protobufjs/light.d.ts"
import light from "protobufjs/dist/light/protobuf.min.js";
import descriptor from "../../../src/wire/envelope.json" with { type: "json" };
import envelopeProto from "../../../src/wire/envelope.proto" with { type: "text" };
import { enumValues, MESSAGE_NAMES, MESSAGE_TYPES, SCHEMA_ROOT } from "../../../src/wire/schema.ts";

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
  if (field instanceof light.MapField) return `${field.id} map<${field.keyType}, ${field.type}>`;
  if (field.repeated) return `${field.id} repeated ${field.type}`;
  if (field.options?.proto3_optional) return `${field.id} optional ${field.type}`;
  return `${field.id} ${field.type}`;
}

function isSynthetic(oneof: protobuf.OneOf): boolean {
  return oneof.fieldsArray.length === 1 && oneof.fieldsArray[0].options?.proto3_optional === true;
}

Deno.test("every message and field of the schema is WIRE.md's table: names, numbers, types, labels", () => {
  const pkg = SCHEMA_ROOT.lookup("videoflow.v1") as protobuf.Namespace;
  const messages = pkg.nestedArray.filter((n) => n instanceof light.Type);
  assert.deepEqual(messages.map((m) => m.name).sort(), Object.keys(WIRE_TABLE).sort());
  for (const message of messages) {
    const actual = Object.fromEntries(message.fieldsArray.map((f) => [f.name, describeField(f)]));
    assert.deepEqual(actual, WIRE_TABLE[message.name], message.name);
    const oneofs = message.oneofsArray.filter((o) => !isSynthetic(o)).map((o) => [o.name, o.oneof]);
    assert.deepEqual(oneofs, message.name === "Value" ? [["kind", Object.keys(WIRE_TABLE.Value)]] : []);
  }
  assert.deepEqual(enumValues("MsgType"), { UNSPECIFIED: 0, DATA: 1, EOS: 2, ABORT: 3 });
  assert.deepEqual(enumValues("NullValue"), { NULL_VALUE: 0 });
  assert.deepEqual(MESSAGE_NAMES.map((name) => MESSAGE_TYPES[name].fullName), [
    ".videoflow.v1.Envelope",
    ".videoflow.v1.Value",
    ".videoflow.v1.Tensor",
    ".videoflow.v1.Frame",
    ".videoflow.v1.Detections",
    ".videoflow.v1.Tracks",
    ".videoflow.v1.BlobRef",
  ]);
});

Deno.test("envelope.json is protobufjs's parse of envelope.proto (rerun tasks/envelope_json.ts when it is not)", () => {
  const parsed = protobuf.parse(envelopeProto, { keepCase: true }).root.toJSON();
  assert.deepEqual(descriptor, JSON.parse(JSON.stringify(parsed)));
  assert.deepEqual(SCHEMA_ROOT.toJSON(), parsed);
});
