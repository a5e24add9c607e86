/**
 * The wire codec's encode and decode of the two envelopes that matter most, each beside baselines
 * measured in the same run: a 1280x720x3 bgr8 Frame envelope (against a bare copy of its pixels into a
 * new array of the envelope's size, the floor of one encode call that owns its bytes; two such copies,
 * the floor of `encodePayload` then `encodeEnvelope`; and protobufjs encoding and decoding the same
 * messages from the same `envelope.proto`), and a small `{ seq, sentAt }` map envelope (against
 * protobufjs). The frame envelope is written both ways: in one pass (`preparePayload` then
 * `encodeEnvelopeWithPayload`, the Frame written in place, the pixels copied once), as the messenger
 * publishes it, and in two calls (`encodePayload` then `encodeEnvelope`, the pixels copied twice); each
 * also into a reused SharedArrayBuffer through the `allocate` option.
 *
 * Run: `deno bench bench/codec_bench.ts`.
 *
 * @module
 */

import protobuf from "protobufjs";
import {
  createEnvelope,
  decodeEnvelope,
  decodePayload,
  encodeEnvelope,
  encodeEnvelopeWithPayload,
  encodePayload,
  type EnvelopeInit,
  preparePayload,
} from "../src/wire/codec.ts";
import envelopeProto from "../src/wire/envelope.proto" with { type: "text" };
import { Frame, Tensor, wireMap } from "../src/wire/value.ts";

const WIDTH = 1280;
const HEIGHT = 720;
const pixels = new Uint8Array(WIDTH * HEIGHT * 3).map((_, i) => (i * 31) & 0xff);
const frame = new Frame(new Tensor([HEIGHT, WIDTH, 3], "uint8", pixels), "bgr8", 1700000000.04);
const identity = {
  type: "data",
  producerName: "camera",
  flowId: "flow-bench",
  runId: "run-1",
  traceId: "camera:1",
  seq: 1,
  eventTs: 1700000000.04,
} as const satisfies EnvelopeInit;
const sentAt = 1700000000.125;

function frameEnvelope(allocate?: (size: number) => Uint8Array): Uint8Array {
  return encodeEnvelope(createEnvelope({ ...identity, ...encodePayload(frame) }), { allocate });
}

const header = createEnvelope(identity);

function onePassFrameEnvelope(allocate?: (size: number) => Uint8Array): Uint8Array {
  return encodeEnvelopeWithPayload(header, preparePayload(frame), { allocate });
}

function smallEnvelope(): Uint8Array {
  return encodeEnvelope(
    createEnvelope({ ...identity, ...encodePayload(wireMap([["seq", 1], ["sentAt", sentAt]])) }),
  );
}

const frameBytes = frameEnvelope();
if (onePassFrameEnvelope().toHex() !== frameBytes.toHex()) {
  throw new Error("the one-pass frame envelope differs from the two-call one");
}
const framePayload = encodePayload(frame);
const smallBytes = smallEnvelope();
const shared = new Uint8Array(new SharedArrayBuffer(frameBytes.byteLength));

const root = protobuf.parse(envelopeProto).root;
const PbEnvelope = root.lookupType("videoflow.v1.Envelope");
const PbFrame = root.lookupType("videoflow.v1.Frame");
const PbValue = root.lookupType("videoflow.v1.Value");
const pbIdentity = { ...identity, v: 4, type: 1 };

function protobufjsFrameEnvelope(): Uint8Array {
  const payload = PbFrame.encode({
    pixels: { shape: [HEIGHT, WIDTH, 3], dtype: "uint8", data: pixels },
    pixelFormat: "bgr8",
    captureTs: frame.captureTs,
  }).finish();
  return PbEnvelope.encode({ ...pbIdentity, payloadType: "videoflow.v1.Frame", payload }).finish();
}

function protobufjsSmallEnvelope(): Uint8Array {
  const payload = PbValue.encode({
    mapValue: { fields: { seq: { intValue: 1 }, sentAt: { doubleValue: sentAt } } },
  }).finish();
  return PbEnvelope.encode({ ...pbIdentity, payloadType: "videoflow.v1.Value", payload }).finish();
}

function decode(bytes: Uint8Array): unknown {
  const env = decodeEnvelope(bytes);
  return decodePayload(env.payloadType, env.payload);
}

function protobufjsDecode(bytes: Uint8Array, payloadType: protobuf.Type): unknown {
  const env = PbEnvelope.decode(bytes) as unknown as { payload: Uint8Array };
  return payloadType.decode(env.payload);
}

Deno.bench({
  name: `copy ${frameBytes.byteLength} bytes of pixels into a new array (floor)`,
  group: "encode 720p frame envelope",
  baseline: true,
  fn() {
    new Uint8Array(frameBytes.byteLength).set(pixels);
  },
});

Deno.bench({
  name: "copy the pixels into two new arrays (floor of two encode calls)",
  group: "encode 720p frame envelope",
  fn() {
    new Uint8Array(framePayload.payload.byteLength).set(pixels);
    new Uint8Array(frameBytes.byteLength).set(pixels);
  },
});

Deno.bench({
  name: "encodeEnvelope alone (the payload encoded once, up front)",
  group: "encode 720p frame envelope",
  fn() {
    encodeEnvelope(createEnvelope({ ...identity, ...framePayload }));
  },
});

Deno.bench({
  name: "preparePayload + encodeEnvelopeWithPayload (one pass, the pixels copied once)",
  group: "encode 720p frame envelope",
  fn() {
    onePassFrameEnvelope();
  },
});

Deno.bench({
  name: "encodePayload + encodeEnvelope",
  group: "encode 720p frame envelope",
  fn() {
    frameEnvelope();
  },
});

Deno.bench({
  name: "preparePayload + encodeEnvelopeWithPayload into a reused SharedArrayBuffer",
  group: "encode 720p frame envelope",
  fn() {
    onePassFrameEnvelope(() => shared);
  },
});

Deno.bench({
  name: "encodePayload + encodeEnvelope into a reused SharedArrayBuffer",
  group: "encode 720p frame envelope",
  fn() {
    frameEnvelope(() => shared);
  },
});

Deno.bench({
  name: "protobufjs Frame.encode + Envelope.encode",
  group: "encode 720p frame envelope",
  fn() {
    protobufjsFrameEnvelope();
  },
});

Deno.bench({
  name: "decodeEnvelope + decodePayload",
  group: "decode 720p frame envelope",
  baseline: true,
  fn() {
    decode(frameBytes);
  },
});

Deno.bench({
  name: "protobufjs Envelope.decode + Frame.decode",
  group: "decode 720p frame envelope",
  fn() {
    protobufjsDecode(frameBytes, PbFrame);
  },
});

Deno.bench({
  name: "protobufjs Value.encode + Envelope.encode",
  group: "encode { seq, sentAt } envelope",
  baseline: true,
  fn() {
    protobufjsSmallEnvelope();
  },
});

Deno.bench({
  name: "encodePayload + encodeEnvelope",
  group: "encode { seq, sentAt } envelope",
  fn() {
    smallEnvelope();
  },
});

Deno.bench({
  name: "protobufjs Envelope.decode + Value.decode",
  group: "decode { seq, sentAt } envelope",
  baseline: true,
  fn() {
    protobufjsDecode(smallBytes, PbValue);
  },
});

Deno.bench({
  name: "decodeEnvelope + decodePayload",
  group: "decode { seq, sentAt } envelope",
  fn() {
    decode(smallBytes);
  },
});
