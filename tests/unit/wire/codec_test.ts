import assert from "node:assert/strict";
import { DecodeError, errorToDict, SchemaError, UpstreamAborted } from "../../../src/core/errors.ts";
import {
  abortPayload,
  createEnvelope,
  decodeEnvelope,
  decodePayload,
  encodeEnvelope,
  encodePayload,
  type Envelope,
  envelopeFromJson,
  envelopeToJson,
  PayloadType,
  readAbortPayload,
} from "../../../src/wire/codec.ts";
import { BlobRef, Frame, OpaquePayload, Tensor, WireDouble, wireMap } from "../../../src/wire/value.ts";

const VECTORS = new URL("../../fixtures/vectors/", import.meta.url);

interface ManifestEntry {
  readonly name: string;
  readonly file: string;
  readonly version: number;
  readonly [field: string]: unknown;
}

interface RejectEntry {
  readonly name: string;
  readonly file: string;
  readonly expect: {
    readonly reject?: { message_contains: string };
    readonly opaque?: Record<string, string>;
  };
}

/** The identity fields of a data envelope, for tests that build one. */
const IDENTITY = { type: "data", producerName: "p", flowId: "f", runId: "r", traceId: "t", seq: 1 } as const;

function readVector(folder: string, file: string): Uint8Array {
  return Deno.readFileSync(new URL(`${folder}/${file}`, VECTORS));
}

function readManifest<T>(folder: string): T[] {
  return JSON.parse(Deno.readTextFileSync(new URL(`${folder}/manifest.json`, VECTORS)));
}

const ENVELOPES = readManifest<ManifestEntry>("envelope");
const REJECTS = readManifest<RejectEntry>("reject");

/** The manifest's description of a message as the JSON view spells it: `version` is the field `v`. */
function expectedJson(entry: ManifestEntry): Record<string, unknown> {
  const { name: _name, file: _file, version, ...fields } = entry;
  return { v: version, ...fields };
}

function pick(json: object, keys: readonly string[]): Record<string, unknown> {
  return Object.fromEntries(keys.map((key) => [key, (json as Record<string, unknown>)[key]]));
}

/** `json` with every object's keys in `like`'s order (the two hold the same keys). */
function orderedLike(json: unknown, like: unknown): unknown {
  if (Array.isArray(json)) return json.map((item, i) => orderedLike(item, (like as unknown[])[i]));
  if (typeof json !== "object" || json === null) return json;
  const source = json as Record<string, unknown>;
  const order = Object.keys(like as object).filter((key) => key in source);
  return Object.fromEntries(
    order.map((key) => [key, orderedLike(source[key], (like as Record<string, unknown>)[key])]),
  );
}

function assertDecodeError(action: () => unknown, contains: string | RegExp): DecodeError {
  let caught: unknown;
  try {
    action();
  } catch (error) {
    caught = error;
  }
  assert.ok(caught instanceof DecodeError, `expected a DecodeError, got ${caught}`);
  if (typeof contains === "string") assert.ok(caught.message.includes(contains), caught.message);
  else assert.match(caught.message, contains);
  assert.ok(caught.remedy, "a DecodeError carries a remedy");
  return caught;
}

Deno.test("every golden envelope decodes to exactly what its manifest entry describes", () => {
  assert.equal(ENVELOPES.length, 7);
  for (const entry of ENVELOPES) {
    const env = decodeEnvelope(readVector("envelope", entry.file));
    const expected = expectedJson(entry);
    const actual = pick(envelopeToJson(env), Object.keys(expected));
    assert.deepEqual(actual, expected, entry.name);
    assert.equal(env.spanId, "", entry.name);
    assert.equal(env.parentSpanId, "", entry.name);
  }
});

Deno.test("every golden envelope re-encodes from its decoded record to the identical bytes", () => {
  for (const entry of ENVELOPES) {
    const bytes = readVector("envelope", entry.file);
    assert.deepEqual(encodeEnvelope(decodeEnvelope(bytes)), bytes, entry.name);
  }
});

Deno.test("every manifest entry encodes to its vector's bytes, map entries in the order the vector holds them", () => {
  for (const entry of ENVELOPES) {
    const bytes = readVector("envelope", entry.file);
    const wireOrder = envelopeToJson(decodeEnvelope(bytes));
    const json = orderedLike(expectedJson(entry), wireOrder);
    assert.deepEqual(encodeEnvelope(envelopeFromJson(json)), bytes, entry.name);
  }
});

Deno.test("a manifest entry encodes as written when the reference wrote its maps in that order", () => {
  const reordered = ["data_value_map"];
  for (const entry of ENVELOPES) {
    const bytes = readVector("envelope", entry.file);
    const encoded = encodeEnvelope(envelopeFromJson(expectedJson(entry)));
    assert.equal(encoded.byteLength, bytes.byteLength, entry.name);
    assert.equal(reordered.includes(entry.name), !encoded.every((b, i) => b === bytes[i]), entry.name);
  }
});

Deno.test("decoded vectors keep ints and doubles apart, 64-bit values exact, and absent event_ts null", () => {
  const byName = (name: string) => decodeEnvelope(readVector("envelope", `${name}.bin`));
  const list = decodePayload(byName("data_value_list").payloadType, byName("data_value_list").payload);
  assert.deepEqual(list, [1, new WireDouble(2), "three", false, null]);
  const map = byName("data_value_map");
  assert.equal(map.eventTs, null);
  assert.deepEqual(map.metadata, { actual_proctime: 0.2, proctime: 0.1 });
  assert.deepEqual(Object.keys(decodePayload(map.payloadType, map.payload) as object), [
    "ratio",
    "flag",
    "count",
    "nothing",
    "label",
  ]);
  const big = byName("unicode_names_big_seq");
  assert.equal(big.seq, 9000000000);
  assert.equal(big.producerName, "caméra-Ω");
  const tensor = decodePayload(big.payloadType, big.payload) as Tensor;
  assert.deepEqual([...(tensor.view() as BigInt64Array)], [1n, 2n, 3n]);
  const eos = byName("eos");
  assert.equal(eos.type, "eos");
  assert.equal(eos.payloadType, "");
  assert.equal(decodePayload(eos.payloadType, eos.payload), undefined);
});

Deno.test("a legacy msgpack envelope is refused with a DecodeError that says msgpack and how to fix it", () => {
  const entry = REJECTS.find((e) => e.expect.reject)!;
  const error = assertDecodeError(
    () => decodeEnvelope(readVector("reject", entry.file)),
    entry.expect.reject!.message_contains,
  );
  assert.match(error.remedy!, /version 4/);
  assert.equal(error.code, "VF_POISON_DECODE");
});

Deno.test("an unknown payload type is carried opaquely: never decoded, never an error, same bytes back", () => {
  const entry = REJECTS.find((e) => e.expect.opaque)!;
  const bytes = readVector("reject", entry.file);
  const env = decodeEnvelope(bytes);
  const payload = decodePayload(env.payloadType, env.payload);
  assert.ok(payload instanceof OpaquePayload);
  assert.equal(payload.payloadType, entry.expect.opaque!.payload_type);
  assert.equal(payload.data.toBase64(), entry.expect.opaque!.data_b64);
  assert.deepEqual(envelopeToJson(env).payload, { opaque: entry.expect.opaque });
  assert.deepEqual(encodePayload(payload), { payloadType: env.payloadType, payload: env.payload });
  assert.deepEqual(encodeEnvelope(env), bytes);
});

Deno.test("an envelope whose version is not 4, or that has none, is refused", () => {
  const bytes = readVector("envelope", "eos.bin");
  assert.deepEqual([...bytes.subarray(0, 2)], [0x08, 0x04]);
  for (const version of [3, 5, 127]) {
    const other = bytes.slice();
    other[1] = version;
    const error = assertDecodeError(
      () => decodeEnvelope(other),
      `envelope version ${version} is not supported`,
    );
    assert.equal(error.context.envelope_version, version);
  }
  assertDecodeError(() => decodeEnvelope(bytes.subarray(2)), "carries no version");
  assertDecodeError(() => decodeEnvelope(new Uint8Array(0)), "carries no version");
});

Deno.test("an UNSPECIFIED or unknown message type is refused, ABORT (3) is read", () => {
  const bytes = readVector("envelope", "eos.bin");
  assert.deepEqual([...bytes.subarray(2, 4)], [0x10, 0x02]);
  const withType = (code: number) => Uint8Array.from([...bytes.subarray(0, 3), code, ...bytes.subarray(4)]);
  assert.equal(decodeEnvelope(withType(3)).type, "abort");
  assertDecodeError(() => decodeEnvelope(withType(0)), "UNSPECIFIED");
  assertDecodeError(() => decodeEnvelope(withType(9)), "unknown message type 9");
});

Deno.test("createEnvelope fills every field it is not given with the wire default", () => {
  const env = createEnvelope(IDENTITY);
  assert.deepEqual(env, {
    v: 4,
    ...IDENTITY,
    eventTs: null,
    spanId: "",
    parentSpanId: "",
    replicaId: 0,
    metadata: {},
    payloadType: "",
    payload: new Uint8Array(0),
  });
  assert.deepEqual(decodeEnvelope(encodeEnvelope(env)), env);
});

Deno.test("an event time of 0 stays 0 and an absent one stays null", () => {
  const base = createEnvelope(IDENTITY);
  assert.equal(decodeEnvelope(encodeEnvelope({ ...base, eventTs: 0 })).eventTs, 0);
  assert.equal(decodeEnvelope(encodeEnvelope(base)).eventTs, null);
});

Deno.test("encoding refuses fields out of their wire range and values the wire cannot carry, saying where", () => {
  const base = createEnvelope(IDENTITY);
  const refused = (env: Envelope, contains: string) => {
    assert.throws(() => encodeEnvelope(env), (error: unknown) => {
      assert.ok(error instanceof SchemaError, String(error));
      assert.ok(error.message.includes(contains), error.message);
      assert.ok(error.remedy);
      return true;
    });
  };
  refused({ ...base, seq: -1 }, "seq");
  refused({ ...base, seq: 2 ** 64 }, "seq");
  refused({ ...base, seq: 2n ** 64n }, "seq");
  refused({ ...base, seq: 1.5 }, "seq");
  refused({ ...base, replicaId: 2 ** 32 }, "replica_id");
  refused({ ...base, metadata: { when: new Date(0) } as never }, "metadata.when");
  refused({ ...base, metadata: { gone: undefined } as never }, "metadata.gone");
  refused({ ...base, metadata: { list: [1, new Float32Array(2)] } as never }, "metadata.list[1]");
  refused({ ...base, metadata: { huge: 2n ** 63n } }, "metadata.huge");
  refused({ ...base, traceId: "\ud800" }, "lone surrogate");
  refused({ ...base, type: "stop" as never }, "unknown message type");
  refused({ ...base, v: 3 as never }, "version 3");
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  refused({ ...base, metadata: cyclic as never }, "deeper than");
  assert.deepEqual(decodeEnvelope(encodeEnvelope({ ...base, seq: 2n ** 64n - 1n })).seq, 2n ** 64n - 1n);
});

Deno.test("a bare tensor is a top-level Tensor; a tensor inside a list or map is a tensor_value", () => {
  const tensor = Tensor.from(new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3]);
  assert.equal(encodePayload(tensor).payloadType, PayloadType.tensor);
  for (const value of [[tensor], { boxes: tensor }]) {
    const { payloadType, payload } = encodePayload(value);
    assert.equal(payloadType, PayloadType.value);
    assert.deepEqual(decodePayload(payloadType, payload), value);
  }
});

Deno.test("records round-trip through their own payload types", () => {
  const pixels = Tensor.from(new Uint8Array(12), [2, 2, 3]);
  const frame = new Frame(pixels, "bgr8", 1700000000.25);
  const ref = new BlobRef("vf-blob-1", PayloadType.frame, 2n ** 60n);
  for (const [value, type] of [[frame, PayloadType.frame], [ref, PayloadType.blobRef]] as const) {
    const encoded = encodePayload(value);
    assert.equal(encoded.payloadType, type);
    assert.deepEqual(decodePayload(encoded.payloadType, encoded.payload), value);
  }
  assert.deepEqual(encodePayload(undefined), { payloadType: "", payload: new Uint8Array(0) });
});

Deno.test("malformed payloads of known types are DecodeErrors naming the payload type", () => {
  const tensor = encodePayload(Tensor.from(new Float32Array(3))).payload;
  const error = assertDecodeError(
    () => decodePayload(PayloadType.tensor, tensor.subarray(0, tensor.length - 1)),
    "runs past the end",
  );
  assert.equal(error.context.payload_type, PayloadType.tensor);
  const frameWithoutPixels = Uint8Array.of(0x12, 0x04, ...new TextEncoder().encode("bgr8"));
  assertDecodeError(
    () => decodePayload(PayloadType.frame, frameWithoutPixels),
    "Frame.pixels is missing",
  );
  assertDecodeError(() => decodePayload(PayloadType.value, new Uint8Array(0)), "no kind set");
  assertDecodeError(() => decodePayload("", Uint8Array.of(1)), "has no payload_type");
});

Deno.test("a tensor whose bytes disagree with its shape is refused on decode", () => {
  const shapeThree = Uint8Array.of(
    0x0a,
    0x01,
    0x03,
    0x12,
    0x05,
    ...new TextEncoder().encode("int32"),
    0x1a,
    0x04,
    1,
    0,
    0,
    0,
  );
  assertDecodeError(() => decodePayload(PayloadType.tensor, shapeThree), "holds 12 bytes, its data has 4");
});

Deno.test("an ABORT payload carries the error record and the node, and reads back to both", () => {
  const origin = new UpstreamAborted("camera vanished", "check the RTSP URL", { attempt: 3, ratio: 0.5 });
  const marker = { node: "cam", error: errorToDict(origin) };
  const { payloadType, payload } = abortPayload(marker);
  assert.equal(payloadType, PayloadType.value);
  const fields = decodePayload(payloadType, payload) as Record<string, unknown>;
  assert.equal(fields.node, "cam");
  assert.equal(fields.code, "VF_UPSTREAM_ABORTED");
  assert.deepEqual(readAbortPayload(payloadType, payload), marker);
});

Deno.test("an ABORT payload from a sparser writer gets defaults; one without code or node is refused", () => {
  const sparse = encodePayload({ node: "det", code: "VF_X", message: "boom", big: 2n ** 60n });
  assert.deepEqual(readAbortPayload(sparse.payloadType, sparse.payload), {
    node: "det",
    error: {
      code: "VF_X",
      type: "VF_X",
      message: "boom",
      remedy: null,
      exit_code: 4,
      disposition: null,
      context: {},
      big: (2n ** 60n).toString(),
    },
  });
  const noNode = encodePayload({ code: "VF_X", message: "boom" });
  assertDecodeError(() => readAbortPayload(noNode.payloadType, noNode.payload), "node, code and message");
  const list = encodePayload([1]);
  assertDecodeError(() => readAbortPayload(list.payloadType, list.payload), "not a videoflow.v1.Value map");
});

Deno.test("the JSON view names every field in snake_case and spells what JSON cannot hold as strings", () => {
  const env = createEnvelope({
    ...IDENTITY,
    seq: 2n ** 63n,
    eventTs: -0,
    spanId: "s1",
    parentSpanId: "s0",
    replicaId: 3,
    metadata: wireMap([["__proto__", 1], ["nan", NaN], ["raw", Uint8Array.of(255)], [
      "two",
      new WireDouble(2),
    ]]),
    ...encodePayload(new BlobRef("k", PayloadType.tensor, 10)),
  });
  const json = envelopeToJson(env);
  assert.deepEqual(JSON.parse(JSON.stringify(json)), {
    v: 4,
    type: "data",
    producer_name: "p",
    flow_id: "f",
    run_id: "r",
    trace_id: "t",
    seq: "9223372036854775808",
    event_ts: "-0",
    span_id: "s1",
    parent_span_id: "s0",
    replica_id: 3,
    metadata: {
      map: { ["__proto__"]: { i: 1 }, nan: { d: "NaN" }, raw: { bytes_b64: "/w==" }, two: { d: 2 } },
    },
    payload_type: PayloadType.blobRef,
    payload: { blob_ref: { ref: "k", inner_payload_type: PayloadType.tensor, size: 10 } },
  });
  const back = envelopeFromJson(JSON.parse(JSON.stringify(json)));
  assert.deepEqual(back, env);
  assert.ok(Object.hasOwn(back.metadata, "__proto__"));
});

Deno.test("the JSON view shows a malformed payload as undecodable and reads it back as the same bytes", () => {
  const env = createEnvelope({
    ...IDENTITY,
    seq: 1,
    payloadType: PayloadType.tensor,
    payload: Uint8Array.of(0x0a, 0x05),
  });
  const json = envelopeToJson(env);
  const undecodable = (json.payload as { undecodable: Record<string, string> }).undecodable;
  assert.equal(undecodable.payload_type, PayloadType.tensor);
  assert.equal(undecodable.data_b64, "CgU=");
  assert.ok(undecodable.error.length > 0);
  assert.deepEqual(encodeEnvelope(envelopeFromJson(json)), encodeEnvelope(env));
});

Deno.test("envelopeFromJson refuses documents not in the JSON view's shape", () => {
  const ok = { type: "eos", producer_name: "p", flow_id: "f", run_id: "r", trace_id: "t", seq: 1 };
  assert.equal(envelopeFromJson(ok).type, "eos");
  const cases: Array<[unknown, string]> = [
    [[], "envelope must be an object"],
    [{ ...ok, producer: "p" }, "envelope.producer must be absent"],
    [{ ...ok, seq: undefined }, "envelope.seq must be"],
    [{ ...ok, type: "stop" }, "envelope.type must be one of"],
    [{ ...ok, v: 3 }, "envelope.v must be 4"],
    [{ ...ok, seq: 1.5 }, "envelope.seq must be an integer"],
    [{ ...ok, metadata: { list: [] } }, "envelope.metadata must be a tagged map"],
    [{ ...ok, metadata: { map: { a: { i: 1, d: 2 } } } }, "exactly one of"],
    [{ ...ok, metadata: { map: { a: { i: "9223372036854775808" } } } }, "within int64"],
    [{ ...ok, metadata: { map: { a: { bytes_b64: "***" } } } }, "must be base64"],
    [{ ...ok, payload: { tensor: { shape: [2], dtype: "int32", data_b64: "AAAA" } } }, "holds 8 bytes"],
    [
      { ...ok, payload: { value: { s: "x" } }, payload_type: PayloadType.tensor },
      "the type of envelope.payload",
    ],
  ];
  for (const [json, message] of cases) assertDecodeError(() => envelopeFromJson(json), message);
});

Deno.test("a value the wire cannot carry is named with its article: an Int16Array, a Map", () => {
  assert.throws(() => encodePayload(new Int16Array(2) as never), /cannot encode an Int16Array at /);
  assert.throws(() => encodePayload(new Map() as never), /cannot encode a Map at /);
});
