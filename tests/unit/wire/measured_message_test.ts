import assert from "node:assert/strict";
import { SchemaError } from "../../../src/core/errors.ts";
import { decodeMessage, encodeMessage, MeasuredMessage, type RawTensor } from "../../../src/wire/schema.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

function tensor(rng: SeededRandom, length: number): RawTensor {
  return { shape: [BigInt(length)], dtype: rng.pick(["uint8", "", "é"]), data: rng.bytes(length) };
}

Deno.test("a measured message's size is that of its encoding, and in a bytes field it writes the same bytes", () => {
  const seed = testSeed();
  const rng = new SeededRandom(seed);
  for (let i = 0; i < 300; i++) {
    const length = rng.pick([0, 1, 100, 127, 128, 16383, 16384, rng.int(0, 3000)]);
    const frame = { pixels: tensor(rng, length), pixelFormat: rng.pick(["", "bgr8"]), captureTs: 0.5 };
    const measured = new MeasuredMessage("Frame", frame);
    const standalone = encodeMessage("Frame", frame);
    const where = `seed ${seed}, case ${i}`;
    assert.equal(measured.byteLength, standalone.byteLength, where);
    assert.equal(measured.encode().toHex(), standalone.toHex(), where);
    const inPlace = encodeMessage("Envelope", { v: 4, payloadType: "videoflow.v1.Frame", payload: measured });
    const copied = encodeMessage("Envelope", {
      v: 4,
      payloadType: "videoflow.v1.Frame",
      payload: standalone,
    });
    assert.equal(inPlace.toHex(), copied.toHex(), where);
    assert.equal(decodeMessage("Envelope", inPlace).payload!.toHex(), standalone.toHex(), where);
  }
});

Deno.test("measured messages nest in place at any depth: a Value's bytes holding a Tensor", () => {
  const rng = new SeededRandom(11);
  const inner = new MeasuredMessage("Tensor", tensor(rng, 200));
  const value = new MeasuredMessage("Value", {
    listValue: { values: [{ bytesValue: inner }, { nullValue: 0 }] },
  });
  const expected = encodeMessage("Value", {
    listValue: { values: [{ bytesValue: inner.encode() }, { nullValue: 0 }] },
  });
  assert.equal(value.encode().toHex(), expected.toHex());
  const envelope = encodeMessage("Envelope", { payload: value });
  assert.equal(decodeMessage("Envelope", envelope).payload!.toHex(), expected.toHex());
});

Deno.test("a measured message that encodes to nothing is an implicit default: its bytes field is omitted", () => {
  const empty = new MeasuredMessage("BlobRef", {});
  assert.equal(empty.byteLength, 0);
  assert.equal(encodeMessage("Envelope", { v: 4, payload: empty }).toHex(), "0804");
});

Deno.test("writeInto puts the bytes at an offset and refuses an array without room for them", () => {
  const measured = new MeasuredMessage("BlobRef", { ref: "blob", size: 7n });
  const out = new Uint8Array(measured.byteLength + 4).fill(0xee);
  measured.writeInto(out, 2);
  assert.equal(out.subarray(2, 2 + measured.byteLength).toHex(), measured.encode().toHex());
  assert.deepEqual([...out.subarray(0, 2), ...out.subarray(2 + measured.byteLength)], [
    0xee,
    0xee,
    0xee,
    0xee,
  ]);
  assert.throws(() => measured.writeInto(out, 5), RangeError);
  assert.throws(() => measured.writeInto(out, -1), RangeError);
});

Deno.test("measuring refuses what encoding refuses, before anything is allocated", () => {
  assert.throws(() => new MeasuredMessage("BlobRef", { ref: "\udc00" }), SchemaError);
  const huge = { byteLength: 2 ** 31 } as Uint8Array;
  const measured = new MeasuredMessage("Tensor", { data: huge });
  let asked = false;
  assert.throws(
    () =>
      measured.encode({
        allocate: (size) => {
          asked = true;
          return new Uint8Array(size);
        },
      }),
    /exceeds protobuf's limit/,
  );
  assert.equal(asked, false);
});
