/**
 * The wire codec on the messages that matter most, each beside protobufjs's own reflection codec (the same
 * `envelope.proto`, its generated encoders and decoders with no validation, maps as objects, 64-bit values
 * as `Long`s) measured in the same run:
 *
 * - a 164-byte `{ seq, sentAt }` map envelope, encoded as the messenger publishes it
 *   (`preparePayload` + `encodeEnvelopeWithPayload`) and decoded as a consumer reads it (`decodeEnvelope` +
 *   `decodePayload`), each alone and together;
 * - a 1280x720x3 bgr8 Frame envelope: encoded in one pass (the Frame queued in place, the pixels copied
 *   once, into the envelope) beside a bare copy of the pixels into a new array of the envelope's size (the
 *   floor of one encode that owns its bytes) and protobufjs's `Frame.encode` then `Envelope.encode` (the
 *   pixels copied twice), and the same Frame with its pixels in a buffer given up whole (as VideoFileReader
 *   makes them: the envelope written around them in place, nothing allocated or copied; the buffer's
 *   making not timed); decoded (the pixels a view into the envelope's bytes) beside protobufjs's decode;
 * - SHA-256 of a 60-byte message id string (`sha256Hex`, through `node:crypto`);
 * - a Worker's start-up (no permissions, as a node's) to its first envelope encoded, decoded and given its
 *   message id, beside a Worker that loads nothing: what loading protobufjs and `node:crypto` costs (both
 *   need Deno's Node layer, which a bare Worker does not load).
 *
 * Run: `deno bench -A bench/codec_bench.ts` (the Workers read the codec's modules).
 *
 * @module
 */

import protobuf from "protobufjs";
import {
  createEnvelope,
  decodeEnvelope,
  decodePayload,
  encodeEnvelopeWithPayload,
  type EnvelopeInit,
  preparePayload,
} from "../src/wire/codec.ts";
import envelopeProto from "../src/wire/envelope.proto" with { type: "text" };
import { ENVELOPE_HEADROOM, ENVELOPE_TAILROOM, giveWhole } from "../src/core/bytes.ts";
import { sha256Hex } from "../src/wire/sha256.ts";
import { Frame, Tensor, wireMap } from "../src/wire/value.ts";

const identity = {
  type: "data",
  producerName: "producer",
  flowId: "flow-bench-small-items",
  runId: "run-20261202T203000Z-7f3a9c1e04b2d",
  traceId: "producer:123456",
  seq: 123456,
  eventTs: 1700000000.04,
  replicaId: 1,
} as const satisfies EnvelopeInit;
const small = wireMap([["seq", 123456], ["sentAt", 1700000000.125]]);
const header = createEnvelope(identity);

function encodeSmall(): Uint8Array {
  return encodeEnvelopeWithPayload(header, preparePayload(small));
}

function decode(bytes: Uint8Array): unknown {
  const env = decodeEnvelope(bytes);
  return decodePayload(env.payloadType, env.payload);
}

const smallBytes = encodeSmall();
if (smallBytes.byteLength !== 164) {
  throw new Error(`the small envelope is ${smallBytes.byteLength} bytes, not 164`);
}

const WIDTH = 1280;
const HEIGHT = 720;
const pixels = new Uint8Array(WIDTH * HEIGHT * 3).map((_, i) => (i * 31) & 0xff);
const frame = new Frame(new Tensor([HEIGHT, WIDTH, 3], "uint8", pixels), "bgr8", 1700000000.04);
const frameHeader = createEnvelope({ ...identity, traceId: "camera:1", seq: 1 });

function encodeFrame(): Uint8Array {
  return encodeEnvelopeWithPayload(frameHeader, preparePayload(frame));
}

const frameBytes = encodeFrame();

const root = protobuf.parse(envelopeProto).root;
const PbEnvelope = root.lookupType("videoflow.v1.Envelope");
const PbFrame = root.lookupType("videoflow.v1.Frame");
const PbValue = root.lookupType("videoflow.v1.Value");
const pbHeader = { ...identity, v: 4, type: 1 };

function protobufjsEncodeSmall(): Uint8Array {
  const payload = PbValue.encode({
    mapValue: { fields: { seq: { intValue: 123456 }, sentAt: { doubleValue: 1700000000.125 } } },
  }).finish();
  return PbEnvelope.encode({ ...pbHeader, payloadType: "videoflow.v1.Value", payload })
    .finish();
}

function protobufjsEncodeFrame(): Uint8Array {
  const payload = PbFrame.encode({
    pixels: { shape: [HEIGHT, WIDTH, 3], dtype: "uint8", data: pixels },
    pixelFormat: "bgr8",
    captureTs: frame.captureTs,
  }).finish();
  return PbEnvelope.encode({
    ...pbHeader,
    traceId: "camera:1",
    seq: 1,
    payloadType: "videoflow.v1.Frame",
    payload,
  })
    .finish();
}

function protobufjsDecode(bytes: Uint8Array, payloadType: protobuf.Type): unknown {
  const env = PbEnvelope.decode(bytes) as unknown as { payload: Uint8Array };
  return payloadType.decode(env.payload);
}

if (protobufjsEncodeSmall().byteLength !== smallBytes.byteLength) {
  throw new Error("protobufjs's small envelope differs in size from the codec's");
}

Deno.bench({
  name: "codec: preparePayload + encodeEnvelopeWithPayload, decodeEnvelope + decodePayload",
  group: "encode + decode 164-byte envelope",
  baseline: true,
  fn() {
    decode(encodeSmall());
  },
});

Deno.bench({
  name: "protobufjs reflection: Value + Envelope encode, Envelope + Value decode (unvalidated)",
  group: "encode + decode 164-byte envelope",
  fn() {
    protobufjsDecode(protobufjsEncodeSmall(), PbValue);
  },
});

Deno.bench({
  name: "codec: preparePayload + encodeEnvelopeWithPayload",
  group: "encode 164-byte envelope",
  baseline: true,
  fn() {
    encodeSmall();
  },
});

Deno.bench({
  name: "protobufjs reflection: Value.encode + Envelope.encode",
  group: "encode 164-byte envelope",
  fn() {
    protobufjsEncodeSmall();
  },
});

Deno.bench({
  name: "codec: decodeEnvelope + decodePayload",
  group: "decode 164-byte envelope",
  baseline: true,
  fn() {
    decode(smallBytes);
  },
});

Deno.bench({
  name: "protobufjs reflection: Envelope.decode + Value.decode (unvalidated)",
  group: "decode 164-byte envelope",
  fn() {
    protobufjsDecode(smallBytes, PbValue);
  },
});

Deno.bench({
  name: `copy the pixels into a new array of ${frameBytes.byteLength} bytes (floor)`,
  group: "encode 720p frame envelope",
  baseline: true,
  fn() {
    new Uint8Array(frameBytes.byteLength).set(pixels);
  },
});

Deno.bench({
  name: "codec: preparePayload + encodeEnvelopeWithPayload (the pixels copied once)",
  group: "encode 720p frame envelope",
  fn() {
    encodeFrame();
  },
});

/** A frame as VideoFileReader makes one: its pixels in a buffer with room around them, given up whole. */
function givenFrame(): Frame {
  const buffer = new ArrayBuffer(ENVELOPE_HEADROOM + pixels.byteLength + ENVELOPE_TAILROOM);
  const data = new Uint8Array(buffer, ENVELOPE_HEADROOM, pixels.byteLength);
  data.set(pixels);
  giveWhole(buffer);
  return new Frame(new Tensor([HEIGHT, WIDTH, 3], "uint8", data), "bgr8", 1700000000.04);
}

Deno.bench({
  name: "codec: the same, the pixels given up whole (the envelope written around them in place)",
  group: "encode 720p frame envelope",
  fn(b) {
    const given = givenFrame();
    b.start();
    encodeEnvelopeWithPayload(frameHeader, preparePayload(given));
    b.end();
  },
});

Deno.bench({
  name: "protobufjs reflection: Frame.encode + Envelope.encode (the pixels copied twice)",
  group: "encode 720p frame envelope",
  fn() {
    protobufjsEncodeFrame();
  },
});

Deno.bench({
  name: "codec: decodeEnvelope + decodePayload (the pixels a view)",
  group: "decode 720p frame envelope",
  baseline: true,
  fn() {
    decode(frameBytes);
  },
});

Deno.bench({
  name: "protobufjs reflection: Envelope.decode + Frame.decode",
  group: "decode 720p frame envelope",
  fn() {
    protobufjsDecode(frameBytes, PbFrame);
  },
});

const id = "flow-bench:run-1202T203:producer:producer:123456:123456:data";
if (id.length !== 60) throw new Error(`the id is ${id.length} characters, not 60`);

Deno.bench({
  name: "sha256Hex of a 60-byte message id (node:crypto)",
  group: "SHA-256",
  fn() {
    sha256Hex(id);
  },
});

const codecUrl = new URL("../src/wire/codec.ts", import.meta.url).href;
const identitiesUrl = new URL("../src/wire/identities.ts", import.meta.url).href;
const FIRST_ENVELOPE = `
import { createEnvelope, decodeEnvelope, encodeEnvelopeWithPayload, preparePayload } from "${codecUrl}";
import { messageId } from "${identitiesUrl}";
const env = createEnvelope({ type: "data", producerName: "p", flowId: "f", runId: "r", traceId: "p:1", seq: 1 });
decodeEnvelope(encodeEnvelopeWithPayload(env, preparePayload({ seq: 1, sentAt: 1.5 })));
self.postMessage(messageId("f", "r", "p", "p:1", 1, "data"));`;

async function workerStartUp(source: string): Promise<void> {
  const worker = new Worker(`data:application/typescript,${encodeURIComponent(source)}`, {
    type: "module",
    deno: { permissions: "none" },
  });
  try {
    await new Promise((resolve, reject) => {
      worker.onmessage = resolve;
      worker.onerror = (event) => {
        event.preventDefault();
        reject(new Error(event.message));
      };
    });
  } finally {
    worker.terminate();
  }
}

Deno.bench({
  name: "a Worker that loads nothing, spawn to its first message",
  group: "worker start-up",
  baseline: true,
  n: 20,
  warmup: 2,
  async fn() {
    await workerStartUp("self.postMessage(0);");
  },
});

Deno.bench({
  name: "a Worker that loads the codec, spawn to its first envelope and message id",
  group: "worker start-up",
  n: 20,
  warmup: 2,
  async fn() {
    await workerStartUp(FIRST_ENVELOPE);
  },
});
