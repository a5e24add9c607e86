import assert from "node:assert/strict";
import { DecodeError } from "../../../src/core/errors.ts";
import {
  createEnvelope,
  decodeEnvelope,
  decodePayload,
  encodeEnvelope,
  encodePayload,
  type Envelope,
  envelopeFromJson,
  envelopeToJson,
  PayloadType,
} from "../../../src/wire/codec.ts";
import type { MsgType } from "../../../src/wire/identities.ts";
import {
  BlobRef,
  Detections,
  DTYPE_ITEMSIZE,
  Frame,
  OpaquePayload,
  Tensor,
  Tracks,
  WireDouble,
  wireMap,
  type WirePayload,
  type WireValue,
} from "../../../src/wire/value.ts";
import { SeededRandom as Rng, testSeed } from "../../support/random.ts";

/** An integer in [0, n). */
function below(rng: Rng, n: number): number {
  return rng.int(0, n - 1);
}

/** A uniformly random unsigned integer of `bits` bits. */
function randomBits(rng: Rng, bits: number): bigint {
  let value = 0n;
  for (let i = 0; i < bits; i += 16) value = (value << 16n) | BigInt(rng.int(0, 0xffff));
  return BigInt.asUintN(bits, value);
}

function withSeed(name: string, body: (rng: Rng) => void): void {
  Deno.test(name, () => {
    const seed = testSeed();
    try {
      body(new Rng(seed));
    } catch (error) {
      console.error(`${name}: failed with VF_TEST_SEED=${seed}`);
      throw error;
    }
  });
}

const CHARS = ["a", "Z", "0", ":", "-", "_", " ", "é", "Ω", "ü", "😀", "\u0000", "\ufeff", "\n", '"', "中"];
const KEYS = ["__proto__", "constructor", "toString", "0", "10", "", "proctime", "a.b", "ключ"];
const DTYPES = [...Object.keys(DTYPE_ITEMSIZE), "datetime64[ns]", "<U4"];
const SAFE = Number.MAX_SAFE_INTEGER;

function randomString(rng: Rng): string {
  return Array.from({ length: below(rng, 9) }, () => rng.pick(CHARS)).join("");
}

function randomTensor(rng: Rng): Tensor {
  const dtype = rng.pick(DTYPES);
  const shape = Array.from({ length: below(rng, 4) }, () => below(rng, 4));
  const itemsize = (DTYPE_ITEMSIZE as Record<string, number>)[dtype];
  const length = itemsize === undefined ? below(rng, 12) : shape.reduce((n, d) => n * d, 1) * itemsize;
  return new Tensor(shape, dtype, rng.bytes(length));
}

/** An int in its canonical form: a number when safe, else a bigint within int64. */
function randomInt(rng: Rng): number | bigint {
  switch (below(rng, 4)) {
    case 0:
      return below(rng, 200) - 100;
    case 1:
      return rng.pick([SAFE, -SAFE, 0, 2 ** 31, -(2 ** 31) - 1]);
    case 2:
      return rng.pick([1n, -1n]) *
        (BigInt(SAFE) + 1n + randomBits(rng, 62) % (2n ** 63n - BigInt(SAFE) - 1n));
    default:
      return -(2n ** 63n);
  }
}

/** A double in its canonical form: a number unless a bare number would encode as an int. */
function randomDouble(rng: Rng): number | WireDouble {
  switch (below(rng, 3)) {
    case 0:
      return (rng.next() - 0.5) * 10 ** below(rng, 12) + 0.5;
    case 1:
      return rng.pick([NaN, Infinity, -Infinity, -0, 1e300, 5e-324, 2 ** 60, -(2 ** 70)]);
    default:
      return new WireDouble(rng.pick([0, 2, -7, SAFE, -SAFE, 1700000000]));
  }
}

function randomMap(rng: Rng, depth: number): Record<string, WireValue> {
  const keys = Array.from(
    { length: below(rng, 5) },
    () => below(rng, 2) ? rng.pick(KEYS) : randomString(rng),
  );
  return wireMap(keys.map((key) => [key, randomValue(rng, depth + 1)])) as Record<string, WireValue>;
}

function randomValue(rng: Rng, depth = 0): WireValue {
  const kinds = depth < 3 ? 9 : 7;
  switch (below(rng, kinds)) {
    case 0:
      return null;
    case 1:
      return below(rng, 2) === 1;
    case 2:
      return randomInt(rng);
    case 3:
      return randomDouble(rng);
    case 4:
      return randomString(rng);
    case 5:
      return rng.bytes(below(rng, 6));
    case 6:
      return randomTensor(rng);
    case 7:
      return Array.from({ length: below(rng, 5) }, () => randomValue(rng, depth + 1));
    default:
      return randomMap(rng, depth);
  }
}

function randomPayload(rng: Rng): WirePayload | undefined {
  switch (below(rng, 8)) {
    case 0:
      return undefined;
    case 1:
      return randomTensor(rng);
    case 2:
      return new Frame(
        randomTensor(rng),
        rng.pick(["bgr8", "rgb8", "gray8"]),
        below(rng, 2) ? null : rng.next() * 1e9,
      );
    case 3:
      return new Detections(
        randomTensor(rng),
        Array.from({ length: below(rng, 3) }, () => randomString(rng)),
      );
    case 4:
      return new Tracks(randomTensor(rng));
    case 5:
      return new BlobRef(
        randomString(rng),
        PayloadType.frame,
        below(rng, 2) ? below(rng, 1 << 30) : 2n ** 63n + 5n,
      );
    case 6:
      return new OpaquePayload(`vendor.${randomString(rng)}.T`, rng.bytes(below(rng, 20)));
    default:
      return randomValue(rng);
  }
}

function randomEnvelope(rng: Rng): { env: Envelope; payload: WirePayload | undefined } {
  const payload = randomPayload(rng);
  const env = createEnvelope({
    type: rng.pick<MsgType>(["data", "eos", "abort"]),
    producerName: randomString(rng),
    flowId: randomString(rng),
    runId: randomString(rng),
    traceId: randomString(rng),
    seq: below(rng, 3) ? below(rng, 2) ? below(rng, 1000) : SAFE : BigInt(SAFE) + 1n + randomBits(rng, 63),
    eventTs: rng.pick([null, 0, -0, 1700000000.5, rng.next() * 2e9, NaN]),
    spanId: randomString(rng),
    parentSpanId: randomString(rng),
    replicaId: rng.pick([0, 1, 7, 2 ** 32 - 1]),
    metadata: randomMap(rng, 1),
    ...encodePayload(payload),
  });
  return { env, payload };
}

withSeed("random envelopes of every type, metadata and payload round-trip exactly", (rng) => {
  for (let i = 0; i < 1500; i++) {
    const { env, payload } = randomEnvelope(rng);
    const bytes = encodeEnvelope(env);
    const decoded = decodeEnvelope(bytes);
    assert.deepEqual(decoded, env);
    assert.deepEqual(encodeEnvelope(decoded), bytes);
    const value = decodePayload(decoded.payloadType, decoded.payload);
    assert.deepEqual(value, payload);
    const viaJson = envelopeFromJson(JSON.parse(JSON.stringify(envelopeToJson(decoded))));
    assert.deepEqual(viaJson, decoded);
    assert.deepEqual(encodeEnvelope(viaJson), bytes);
  }
});

/** Decoding must give a value or a DecodeError; a value must re-encode and decode to itself. */
function assertDecodesOrRefuses(bytes: Uint8Array): void {
  let env: Envelope;
  try {
    env = decodeEnvelope(bytes);
  } catch (error) {
    assert.ok(error instanceof DecodeError, `not a DecodeError: ${error} for ${bytes.toHex()}`);
    return;
  }
  assert.deepEqual(decodeEnvelope(encodeEnvelope(env)), env, bytes.toHex());
  envelopeToJson(env);
  try {
    decodePayload(env.payloadType, env.payload);
  } catch (error) {
    assert.ok(error instanceof DecodeError, `not a DecodeError: ${error} for ${bytes.toHex()}`);
  }
}

function varint(n: number): number[] {
  return n < 0x80 ? [n] : [(n & 0x7f) | 0x80, ...varint(Math.floor(n / 128))];
}

/** Well-framed fields with random numbers, wire types and contents, nesting length-delimited ones. */
function fieldSoup(rng: Rng, depth = 0): number[] {
  const out: number[] = [];
  for (let fields = below(rng, 6); fields > 0; fields--) {
    const wireType = rng.pick([0, 0, 1, 2, 2, 2, 5]);
    out.push(...varint(((1 + below(rng, 16)) << 3) | wireType));
    if (wireType === 0) out.push(...varint(below(rng, 2) ? below(rng, 300) : below(rng, 2 ** 40)));
    if (wireType === 1 || wireType === 5) out.push(...rng.bytes(wireType === 1 ? 8 : 4));
    if (wireType === 2) {
      const body = depth < 4 && below(rng, 3) ? fieldSoup(rng, depth + 1) : [...rng.bytes(below(rng, 10))];
      out.push(...varint(body.length), ...body);
    }
  }
  return out;
}

withSeed("random bytes decode to an envelope or a DecodeError, nothing else", (rng) => {
  const header = () => [0x08, 0x04, 0x10, 1 + below(rng, 3)];
  for (let i = 0; i < 4000; i++) {
    switch (below(rng, 3)) {
      case 0:
        assertDecodesOrRefuses(rng.bytes(below(rng, 80)));
        break;
      case 1:
        assertDecodesOrRefuses(Uint8Array.from([...header(), ...rng.bytes(below(rng, 80))]));
        break;
      default:
        assertDecodesOrRefuses(Uint8Array.from([...header(), ...fieldSoup(rng)]));
    }
  }
});

withSeed("mutated and truncated golden vectors decode to an envelope or a DecodeError", (rng) => {
  const folder = new URL("../../fixtures/vectors/envelope/", import.meta.url);
  const vectors = [...Deno.readDirSync(folder)]
    .filter((entry) => entry.name.endsWith(".bin"))
    .map((entry) => Deno.readFileSync(new URL(entry.name, folder)));
  assert.ok(vectors.length > 0);
  for (const vector of vectors) {
    for (let cut = 0; cut < vector.length; cut++) assertDecodesOrRefuses(vector.subarray(0, cut));
    for (let i = 0; i < 600; i++) {
      const mutated = [...vector];
      for (let edits = 1 + below(rng, 3); edits > 0; edits--) {
        const at = below(rng, mutated.length);
        switch (below(rng, 4)) {
          case 0:
            mutated[at] ^= 1 << below(rng, 8);
            break;
          case 1:
            mutated[at] = below(rng, 256);
            break;
          case 2:
            mutated.splice(at, 1);
            break;
          default:
            mutated.splice(at, 0, below(rng, 256));
        }
      }
      assertDecodesOrRefuses(Uint8Array.from(mutated));
    }
  }
});

withSeed("random bytes under every known payload type decode to a value or a DecodeError", (rng) => {
  for (const payloadType of Object.values(PayloadType)) {
    for (let i = 0; i < 1000; i++) {
      const bytes = rng.bytes(below(rng, 40));
      try {
        decodePayload(payloadType, bytes);
      } catch (error) {
        assert.ok(
          error instanceof DecodeError,
          `${payloadType}: not a DecodeError: ${error} for ${bytes.toHex()}`,
        );
      }
    }
  }
});

Deno.test("a Value nested deeper than the limit is refused on decode and on encode", () => {
  let value = [0x08, 0x00];
  for (let i = 0; i < 120; i++) {
    const list = [0x0a, ...varint(value.length), ...value];
    value = [0x3a, ...varint(list.length), ...list];
  }
  assert.throws(() => decodePayload(PayloadType.value, Uint8Array.from(value)), DecodeError);
  let nested: WireValue = null;
  for (let i = 0; i < 120; i++) nested = [nested];
  assert.throws(() => encodePayload(nested), /deeper than 100/);
});
