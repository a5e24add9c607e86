import assert from "node:assert/strict";
import { ENVELOPE_HEADROOM, ENVELOPE_TAILROOM, giveWhole, isGivenWhole } from "../../../src/core/bytes.ts";
import { SchemaError } from "../../../src/core/errors.ts";
import { createEnvelope, encodeEnvelope, encodePayload } from "../../../src/wire/codec.ts";
import { decodeMessage } from "../../../src/wire/reader.ts";
import { MAX_MESSAGE_BYTES } from "../../../src/wire/schema.ts";
import { Frame, Tensor } from "../../../src/wire/value.ts";
import {
  appendPayload,
  appendWriter,
  encodeMessage,
  finish,
  int64,
  MessageWriter,
  type PbFrame,
  wellFormed,
  writeMessage,
} from "../../../src/wire/writer.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

Deno.test("repeated numbers are written packed", () => {
  assert.equal(encodeMessage("Tensor", { shape: [2, 3] }).toHex(), "0a020203");
});

Deno.test("the codec leaves implicit fields at their default out and writes an explicitly present one", () => {
  const bare = createEnvelope({ type: "eos", producerName: "", flowId: "", runId: "", traceId: "", seq: 0 });
  assert.equal(encodeEnvelope(bare).toHex(), "08041002");
  const frame = encodePayload(new Frame(new Tensor([0], "uint8", new Uint8Array(0)), "", 0));
  assert.equal(frame.payload.toHex(), `0a0a0a0100120575696e7438${"19" + "00".repeat(8)}`);
  assert.equal(encodePayload(0.0).payload.toHex(), "1800");
  assert.equal(encodePayload(null).payload.toHex(), "0800");
});

Deno.test("varints are exact at every length boundary, 32- and 64-bit, and enums below 0 take ten bytes", () => {
  assert.equal(encodeMessage("Envelope", { v: 127 }).toHex(), "087f");
  assert.equal(encodeMessage("Envelope", { v: 128 }).toHex(), "088001");
  assert.equal(encodeMessage("Envelope", { v: 2 ** 32 - 1 }).toHex(), "08ffffffff0f");
  assert.equal(encodeMessage("Envelope", { seq: int64(2n ** 35n - 1n) }).toHex(), "38ffffffff7f");
  assert.equal(encodeMessage("Envelope", { seq: int64(2n ** 35n) }).toHex(), "38808080808001");
  assert.equal(
    encodeMessage("Envelope", { seq: int64(2n ** 64n - 1n) }).toHex(),
    "38" + "ff".repeat(9) + "01",
  );
  assert.equal(encodeMessage("Envelope", { type: -1 }).toHex(), "10" + "ff".repeat(9) + "01");
  assert.equal(
    encodeMessage("Value", { int_value: int64(-(2n ** 63n)) }).toHex(),
    "18" + "ff".repeat(9) + "01",
  );
  assert.equal(encodeMessage("Value", { int_value: -1 }).toHex(), "1801");
});

Deno.test("an encoded message owns its whole buffer, small or large, so it can be transferred", () => {
  for (const size of [3, 100_000]) {
    const bytes = encodeMessage("Tensor", { data: new Uint8Array(size) });
    assert.equal(bytes.byteOffset, 0);
    assert.equal(bytes.byteLength, bytes.buffer.byteLength);
    assert.equal(Object.getPrototypeOf(bytes), Uint8Array.prototype);
  }
  // protobufjs's own finish would hand out a piece of its shared pool: a MessageWriter refuses it.
  assert.throws(() => new MessageWriter().uint32(1).finish(), RangeError);
});

Deno.test("encodeMessage writes into the caller's allocation, asked once for the exact size", () => {
  const message: PbFrame = {
    pixels: { shape: [2, 2], dtype: "uint8", data: Uint8Array.of(1, 2, 3, 4) },
    capture_ts: 1.5,
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
  assert.equal(written.toHex(), expected.toHex());
  assert.throws(
    () => encodeMessage("Frame", message, { allocate: (size) => new Uint8Array(size + 1) }),
    (error: unknown) => error instanceof RangeError && /exactly/.test(error.message),
  );
});

Deno.test("a message beyond protobuf's 2 GiB limit is refused before anything is allocated", () => {
  const mebibyte = new Uint8Array(2 ** 20);
  const values = Array.from(
    { length: MAX_MESSAGE_BYTES / mebibyte.length + 1 },
    () => ({ bytes_value: mebibyte }),
  );
  assert.throws(
    () =>
      encodeMessage("Value", { list_value: { values } }, {
        allocate: () => assert.fail("nothing is allocated for a message that cannot be written"),
      }),
    (error: unknown) =>
      error instanceof SchemaError && /videoflow\.v1\.Value of \d+ bytes exceeds/.test(error.message),
  );
});

Deno.test("a queued payload is put in place: the bytes of writing it on its own first", () => {
  const seed = testSeed();
  const rng = new SeededRandom(seed);
  for (let i = 0; i < 200; i++) {
    const length = rng.pick([0, 1, 100, 127, 128, 16383, 16384, rng.int(0, 3000)]);
    const frame: PbFrame = {
      pixels: { shape: [length], dtype: rng.pick(["uint8", "é"]), data: rng.bytes(length) },
      pixel_format: rng.pick([undefined, "bgr8"]),
      capture_ts: 0.5,
    };
    const standalone = encodeMessage("Frame", frame);
    const where = `VF_TEST_SEED=${seed}, case ${i}`;
    const copied = writeMessage("Envelope", { v: 4 });
    appendPayload(copied, "videoflow.v1.Frame", standalone);
    const expected = finish(copied, "videoflow.v1.Envelope");
    const queued = writeMessage("Frame", frame);
    assert.equal(queued.len, standalone.byteLength, where);
    const inPlace = writeMessage("Envelope", { v: 4 });
    appendPayload(inPlace, "videoflow.v1.Frame", queued);
    assert.equal(finish(inPlace, "videoflow.v1.Envelope").toHex(), expected.toHex(), where);
    const alone = new MessageWriter();
    appendWriter(alone, writeMessage("Frame", frame));
    assert.equal(finish(alone, "videoflow.v1.Frame").toHex(), standalone.toHex(), where);
    assert.equal(decodeMessage("Envelope", expected).payload!.toHex(), standalone.toHex(), where);
  }
});

/** `pixels` in a buffer of their own with `before` and `after` free bytes around them, given up whole or not. */
function framed(pixels: Uint8Array, before: number, after: number, given: boolean): Uint8Array {
  const buffer = new ArrayBuffer(before + pixels.byteLength + after);
  const view = new Uint8Array(buffer, before, pixels.byteLength);
  view.set(pixels);
  if (given) giveWhole(buffer);
  return view;
}

function frameEnvelope(data: Uint8Array, allocate?: (size: number) => Uint8Array): Uint8Array {
  const writer = writeMessage("Envelope", { v: 4, producer_name: "decode", seq: 7 });
  appendPayload(
    writer,
    "videoflow.v1.Frame",
    writeMessage("Frame", {
      pixels: { shape: [data.byteLength], dtype: "uint8", data },
      pixel_format: "bgr8",
      capture_ts: 12.5,
    }),
  );
  return finish(writer, "videoflow.v1.Envelope", allocate === undefined ? {} : { allocate });
}

Deno.test("pixels in a buffer given up whole are written around in place, once, to the same bytes", () => {
  const seed = testSeed();
  const rng = new SeededRandom(seed);
  for (let i = 0; i < 50; i++) {
    const pixels = rng.bytes(rng.pick([1, 127, 128, 16384, rng.int(1, 300_000)]));
    const where = `VF_TEST_SEED=${seed}, case ${i}`;
    const expected = frameEnvelope(new Uint8Array(pixels)).toHex();
    const data = framed(pixels, ENVELOPE_HEADROOM, ENVELOPE_TAILROOM, true);
    let allocated = 0;
    const bytes = frameEnvelope(data, (size) => {
      allocated++;
      return new Uint8Array(size);
    });
    assert.equal(bytes.buffer, data.buffer, `${where}: written in the pixels' own buffer`);
    assert.equal(allocated, 0, `${where}: nothing allocated`);
    assert.equal(bytes.toHex(), expected, where);
    assert.ok(
      isGivenWhole(bytes.buffer),
      `${where}: the envelope's buffer stays given up whole, to be moved`,
    );
    const again = frameEnvelope(data);
    assert.notEqual(again.buffer, data.buffer, `${where}: a second message is never written over the first`);
    assert.equal(again.toHex(), expected, where);
    assert.equal(bytes.toHex(), expected, `${where}: the first stays as written`);
  }
});

Deno.test("pixels not given up whole, or without room around them, are copied into an allocation", () => {
  const pixels = new Uint8Array(1000).map((_, i) => i);
  const expected = frameEnvelope(new Uint8Array(pixels)).toHex();
  for (
    const [before, after, given, why] of [
      [ENVELOPE_HEADROOM, ENVELOPE_TAILROOM, false, "not given up"],
      [8, ENVELOPE_TAILROOM, true, "too little room before"],
      [ENVELOPE_HEADROOM, 2, true, "too little room after"],
    ] as const
  ) {
    const data = framed(pixels, before, after, given);
    const bytes = frameEnvelope(data);
    assert.notEqual(bytes.buffer, data.buffer, why);
    assert.equal(bytes.toHex(), expected, why);
    assert.equal(data.toHex(), pixels.toHex(), `${why}: the pixels are untouched`);
  }
});

Deno.test("an empty payload is left out, queued or as bytes", () => {
  for (const payload of [new MessageWriter(), new Uint8Array(0)]) {
    const writer = writeMessage("Envelope", { v: 4 });
    appendPayload(writer, "", payload);
    assert.equal(finish(writer, "videoflow.v1.Envelope").toHex(), "0804");
  }
});

Deno.test("a string with a lone surrogate is refused, naming the field; pairs are written as UTF-8", () => {
  for (const value of ["\ud800", "a\udc00b", "\udc00\ud800", "x\ud83d"]) {
    assert.throws(() => wellFormed(value, "Tensor.dtype"), (error: unknown) => {
      assert.ok(error instanceof SchemaError, String(error));
      assert.match(error.message, /videoflow\.v1\.Tensor\.dtype is not well-formed Unicode/);
      return true;
    });
  }
  assert.throws(
    () => encodePayload(new Tensor([0], "\ud800", new Uint8Array(0))),
    /Tensor\.dtype is not well-formed/,
  );
  assert.throws(() => encodePayload({ "\udc00": 1 }), /MapValue\.fields is not well-formed/);
  assert.throws(() => encodePayload(["\udc00"]), /Value\.string_value is not well-formed/);
  assert.throws(
    () =>
      encodeEnvelope(
        createEnvelope({
          type: "data",
          producerName: "\ud800",
          flowId: "f",
          runId: "r",
          traceId: "t",
          seq: 1,
        }),
      ),
    /Envelope\.producer_name is not well-formed/,
  );
  assert.equal(encodeMessage("Tensor", { dtype: "\ud83d\ude00" }).toHex(), "1204f09f9880");
});
