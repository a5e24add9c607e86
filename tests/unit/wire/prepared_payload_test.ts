import assert from "node:assert/strict";
import { SchemaError } from "../../../src/core/errors.ts";
import {
  createEnvelope,
  decodeEnvelope,
  decodePayload,
  encodeEnvelope,
  encodeEnvelopeWithPayload,
  encodePayload,
  type Envelope,
  type EnvelopeHeader,
  PayloadType,
  preparePayload,
} from "../../../src/wire/codec.ts";
import {
  BlobRef,
  Detections,
  Frame,
  OpaquePayload,
  Tensor,
  Tracks,
  WireDouble,
  type WirePayload,
  type WireValue,
} from "../../../src/wire/value.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

/**
 * Tensor data lengths on both sides of each varint boundary of a length prefix (1, 2 and 3 bytes), so
 * a nested message's length prefix changes size inside the envelope as well as inside the payload.
 */
const DATA_LENGTHS = [0, 1, 7, 120, 127, 128, 129, 16370, 16383, 16384, 16400, 70000];

function tensorOfLength(rng: SeededRandom, length: number): Tensor {
  return new Tensor([length], "uint8", rng.bytes(length));
}

function someTensor(rng: SeededRandom): Tensor {
  if (rng.chance(0.3)) return new Tensor([2, 3], "float32", rng.bytes(24));
  return tensorOfLength(rng, rng.pick(DATA_LENGTHS));
}

function someText(rng: SeededRandom): string {
  return rng.pick(["", "a", "bgr8", "é中😀", "x".repeat(rng.int(100, 140))]);
}

function someValue(rng: SeededRandom, depth: number): WireValue {
  switch (rng.int(0, depth < 2 ? 8 : 5)) {
    case 0:
      return null;
    case 1:
      return rng.chance(0.5);
    case 2:
      return rng.pick([0, -1, 2 ** 40, -(2n ** 63n), 0.25, new WireDouble(3)]);
    case 3:
      return someText(rng);
    case 4:
      return rng.bytes(rng.pick(DATA_LENGTHS));
    case 5:
      return someTensor(rng);
    case 6:
      return Array.from({ length: rng.int(0, 3) }, () => someValue(rng, depth + 1));
    default:
      return Object.fromEntries(
        Array.from({ length: rng.int(0, 3) }, (_, i) => [`k${i}`, someValue(rng, depth + 1)]),
      );
  }
}

/** A payload of each kind in turn (`kind` modulo 8), with random content. */
function payloadOfKind(rng: SeededRandom, kind: number): WirePayload | undefined {
  switch (kind % 8) {
    case 0:
      return undefined;
    case 1:
      return someTensor(rng);
    case 2:
      return new Frame(someTensor(rng), someText(rng), rng.chance(0.5) ? null : rng.next() * 2e9);
    case 3:
      return new Detections(someTensor(rng), Array.from({ length: rng.int(0, 3) }, () => someText(rng)));
    case 4:
      return new Tracks(someTensor(rng));
    case 5:
      return new BlobRef(someText(rng), rng.pick(["", PayloadType.frame]), rng.pick([0, 1, 2n ** 64n - 1n]));
    case 6:
      return new OpaquePayload("vendor.T", rng.bytes(rng.pick(DATA_LENGTHS)));
    default:
      return someValue(rng, 0);
  }
}

function someHeader(rng: SeededRandom): EnvelopeHeader {
  return createEnvelope({
    type: rng.pick(["data", "eos", "abort"] as const),
    producerName: someText(rng),
    flowId: "flow",
    runId: someText(rng),
    traceId: `cam:${rng.int(0, 1000)}`,
    seq: rng.pick([0, 1, 300, 2n ** 64n - 1n]),
    eventTs: rng.pick([null, 0, 1700000000.04]),
    replicaId: rng.pick([0, 3]),
    metadata: rng.chance(0.5) ? {} : { proctime: 0.5, tags: ["a", "b"] },
  });
}

/** The two-call path: the payload encoded on its own, then copied into the envelope. */
function twoCalls(header: EnvelopeHeader, value: WirePayload | undefined): Uint8Array {
  return encodeEnvelope({ ...header, ...encodePayload(value) });
}

Deno.test("random payloads of every kind encode to the same bytes in one pass as in two calls", () => {
  const seed = testSeed();
  const rng = new SeededRandom(seed);
  for (let i = 0; i < 800; i++) {
    const header = someHeader(rng);
    const value = payloadOfKind(rng, i);
    const where = `seed ${seed}, case ${i} (kind ${i % 8})`;
    const expected = encodePayload(value);
    const prepared = preparePayload(value);
    assert.equal(prepared.payloadType, expected.payloadType, where);
    assert.equal(prepared.byteLength, expected.payload.byteLength, where);
    assert.equal(prepared.bytes().toHex(), expected.payload.toHex(), where);
    const bytes = encodeEnvelopeWithPayload(header, prepared);
    assert.equal(bytes.toHex(), twoCalls(header, value).toHex(), where);
    // Written again, in an envelope or on its own: the same bytes (protobufjs's queue is not reused).
    assert.equal(encodeEnvelopeWithPayload(header, prepared).toHex(), bytes.toHex(), where);
    assert.equal(prepared.bytes().toHex(), expected.payload.toHex(), where);
    const decoded = decodeEnvelope(bytes);
    assert.equal(decoded.payloadType, expected.payloadType, where);
    assert.deepEqual(decodePayload(decoded.payloadType, decoded.payload), value, where);
  }
});

Deno.test("every golden vector is written back byte-exact in one pass from its decoded payload", () => {
  const folder = new URL("../../fixtures/vectors/envelope/", import.meta.url);
  const manifest: { file: string }[] = JSON.parse(Deno.readTextFileSync(new URL("manifest.json", folder)));
  assert.ok(manifest.length > 0);
  for (const { file } of manifest) {
    const bytes = Deno.readFileSync(new URL(file, folder));
    const env: Envelope = decodeEnvelope(bytes);
    const value = decodePayload(env.payloadType, env.payload);
    const prepared = preparePayload(value);
    assert.equal(prepared.payloadType, env.payloadType, file);
    assert.equal(prepared.byteLength, env.payload.byteLength, file);
    assert.equal(encodeEnvelopeWithPayload(env, prepared).toHex(), bytes.toHex(), file);
  }
});

Deno.test("the payload's type and bytes come from the prepared payload, not from the header", () => {
  const frame = new Frame(new Tensor([2, 2, 3], "uint8", new Uint8Array(12).fill(9)), "rgb8", null);
  const header = createEnvelope({
    type: "data",
    producerName: "cam",
    flowId: "f",
    runId: "r",
    traceId: "cam:1",
    seq: 1,
    payloadType: "vendor.Stale",
    payload: Uint8Array.of(1, 2, 3),
  });
  const decoded = decodeEnvelope(encodeEnvelopeWithPayload(header, preparePayload(frame)));
  assert.equal(decoded.payloadType, PayloadType.frame);
  assert.deepEqual(decodePayload(decoded.payloadType, decoded.payload), frame);
});

Deno.test("a payload whose message encodes to nothing is left out of the envelope, as the two calls do", () => {
  const header = someHeader(new SeededRandom(1));
  const empty = new BlobRef("", "", 0);
  const prepared = preparePayload(empty);
  assert.equal(prepared.byteLength, 0);
  assert.equal(prepared.payloadType, PayloadType.blobRef);
  const bytes = encodeEnvelopeWithPayload(header, prepared);
  assert.equal(bytes.toHex(), twoCalls(header, empty).toHex());
  assert.equal(decodeEnvelope(bytes).payload.byteLength, 0);
});

Deno.test("a one-pass envelope is written into the caller's allocation, asked once for the exact size", () => {
  const pixels = Uint8Array.from({ length: 48 * 64 * 3 }, (_, i) => i * 7);
  const frame = new Frame(new Tensor([48, 64, 3], "uint8", pixels), "bgr8", 1700000000.25);
  const header = someHeader(new SeededRandom(2));
  const expected = twoCalls(header, frame);
  const shared = new SharedArrayBuffer(expected.byteLength + 32);
  const sizes: number[] = [];
  const bytes = encodeEnvelopeWithPayload(header, preparePayload(frame), {
    allocate(size) {
      sizes.push(size);
      return new Uint8Array(shared, 8, size);
    },
  });
  assert.deepEqual(sizes, [expected.byteLength]);
  assert.equal(bytes.buffer, shared);
  assert.equal(bytes.byteOffset, 8);
  assert.equal(bytes.toHex(), expected.toHex());
  assert.throws(
    () =>
      encodeEnvelopeWithPayload(header, preparePayload(frame), {
        allocate: (size) => new Uint8Array(size + 1),
      }),
    RangeError,
  );
});

Deno.test("a prepared payload refers to the tensor data until it is written; nothing is copied up front", () => {
  const pixels = new Uint8Array(300).fill(1);
  const prepared = preparePayload(new Frame(new Tensor([10, 10, 3], "uint8", pixels), "bgr8", null));
  pixels.fill(2);
  const frame = decodePayload(prepared.payloadType, prepared.bytes()) as Frame;
  assert.ok(frame.pixels.data.every((byte) => byte === 2));
});

Deno.test("an opaque payload and no payload keep their bytes as they are, uncopied", () => {
  const data = Uint8Array.of(5, 6, 7);
  const opaque = preparePayload(new OpaquePayload("vendor.T", data));
  assert.equal(opaque.bytes(), data);
  assert.equal(opaque.byteLength, 3);
  const none = preparePayload(undefined);
  assert.equal(none.payloadType, "");
  assert.equal(none.byteLength, 0);
});

Deno.test("a value the wire cannot carry is refused when the payload is prepared, before anything is written", () => {
  assert.throws(() => preparePayload({ when: new Date(0) as unknown as WireValue }), SchemaError);
  assert.throws(() => preparePayload({ name: "\ud800" }), /lone surrogate/);
  assert.throws(() => preparePayload(new BlobRef("r", "", -1)), SchemaError);
});
