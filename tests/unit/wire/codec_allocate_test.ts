import assert from "node:assert/strict";
import {
  createEnvelope,
  decodeEnvelope,
  decodePayload,
  encodeEnvelope,
  encodePayload,
} from "../../../src/wire/codec.ts";
import { Frame, Tensor } from "../../../src/wire/value.ts";

function frameEnvelope() {
  const pixels = Uint8Array.from({ length: 4 * 6 * 3 }, (_, i) => i);
  const frame = new Frame(new Tensor([4, 6, 3], "uint8", pixels), "bgr8", 1700000000.25);
  return {
    frame,
    env: createEnvelope({
      type: "data",
      producerName: "cam",
      flowId: "f",
      runId: "r",
      traceId: "cam:1",
      seq: 1,
      metadata: { proctime: 0.5 },
      ...encodePayload(frame),
    }),
  };
}

Deno.test("encodeEnvelope writes straight into a SharedArrayBuffer the caller allocates, once, at the exact size", () => {
  const { frame, env } = frameEnvelope();
  const expected = encodeEnvelope(env);
  const shared = new SharedArrayBuffer(expected.length + 64);
  const sizes: number[] = [];
  const bytes = encodeEnvelope(env, {
    allocate(size) {
      sizes.push(size);
      return new Uint8Array(shared, 16, size);
    },
  });
  assert.deepEqual(sizes, [expected.length]);
  assert.equal(bytes.buffer, shared);
  assert.equal(bytes.toHex(), expected.toHex());
  const decoded = decodeEnvelope(new Uint8Array(shared, 16, expected.length));
  assert.deepEqual(decoded, env);
  assert.deepEqual(decodePayload(decoded.payloadType, decoded.payload), frame);
});

Deno.test("by default an encoded envelope owns its whole ArrayBuffer", () => {
  const bytes = encodeEnvelope(frameEnvelope().env);
  assert.equal(bytes.byteOffset, 0);
  assert.equal(bytes.buffer.byteLength, bytes.byteLength);
  assert.ok(bytes.buffer instanceof ArrayBuffer);
});
