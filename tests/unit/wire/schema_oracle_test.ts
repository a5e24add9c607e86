/**
 * protobufjs's full build, parsing `envelope.proto` itself, as an independent oracle for the reader
 * (`reader.ts`) and for how the codec drives protobufjs's writer (`writer.ts`): random messages that read
 * and write alike both ways. protobufjs is compared only where it is faithful: map fields become objects
 * there (so the messages here have unique keys that are neither `__proto__` nor integer-like, whose order
 * objects would change), 64-bit integers are compared as decimal strings, bytes as base64, and a oneof has
 * at most one member set.
 */
import assert from "node:assert/strict";
import protobuf from "protobufjs";
import envelopeProto from "../../../src/wire/envelope.proto" with { type: "text" };
import { decodeMessage } from "../../../src/wire/reader.ts";
import { type MessageName, SCHEMA_ROOT } from "../../../src/wire/schema.ts";
import { encodeMessage, int64 } from "../../../src/wire/writer.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const MESSAGES: readonly MessageName[] = [
  "Envelope",
  "Value",
  "Tensor",
  "Frame",
  "Detections",
  "Tracks",
  "BlobRef",
];

/** protobufjs's reflection with camelCase names: the keys of a raw message. */
const oracle = protobuf.parse(envelopeProto).root;
oracle.resolveAll();

function oracleType(name: string): protobuf.Type {
  return oracle.lookupType(`videoflow.v1.${name}`);
}

function isSynthetic(oneof: protobuf.OneOf): boolean {
  return oneof.fieldsArray.length === 1 && oneof.fieldsArray[0].options?.proto3_optional === true;
}

type Raw = Record<string, unknown>;

function hasPresence(field: protobuf.Field): boolean {
  return field.resolvedType instanceof protobuf.Type || field.partOf !== null;
}

function isDefault(value: unknown): boolean {
  if (value instanceof Uint8Array) return value.byteLength === 0;
  return value === 0n || value === false || value === "" || (value === 0 && !Object.is(value, -0));
}

/** The message as it reads back: implicit fields at their default and empty lists and maps dropped. */
function canonical(type: protobuf.Type, raw: Raw): Raw {
  const out: Raw = {};
  for (const [name, value] of Object.entries(raw)) {
    const field = type.fields[name];
    const nested = field.resolvedType instanceof protobuf.Type ? field.resolvedType : null;
    const each = (item: unknown) => nested ? canonical(nested, item as Raw) : item;
    if (field.map) {
      const entries = value as [string, unknown][];
      if (entries.length > 0) out[name] = entries.map(([key, item]) => [key, each(item)]);
    } else if (field.repeated) {
      const items = value as unknown[];
      if (items.length > 0) out[name] = items.map(each);
    } else if (hasPresence(field) || !isDefault(value)) {
      out[name] = each(value);
    }
  }
  return out;
}

/** A raw message in protobufjs's object form: decimal strings for 64-bit integers, base64, maps as objects. */
function plain(type: protobuf.Type, raw: object): Raw {
  const out: Raw = {};
  for (const [name, value] of Object.entries(raw)) {
    const field = type.fields[name];
    const nested = field.resolvedType instanceof protobuf.Type ? field.resolvedType : null;
    const each = (item: unknown): unknown => {
      if (nested) return plain(nested, item as Raw);
      if (typeof item === "bigint") return item.toString();
      if (item instanceof Uint8Array) return item.toBase64();
      return item;
    };
    if (field.map) {
      out[name] = Object.fromEntries((value as [string, unknown][]).map(([k, v]) => [k, each(v)]));
    } else if (field.repeated) out[name] = (value as unknown[]).map(each);
    else out[name] = each(value);
  }
  return out;
}

/**
 * A raw message (the reader's form) as the codec hands it to protobufjs's writer: the .proto's field names,
 * 64-bit integers as `int64`s, maps as prototype-less objects.
 */
function pbOf(type: protobuf.Type, raw: Raw): Raw {
  const written = SCHEMA_ROOT.lookupType(type.fullName);
  const out: Raw = {};
  for (const [name, value] of Object.entries(raw)) {
    const field = type.fields[name];
    const nested = field.resolvedType instanceof protobuf.Type ? field.resolvedType : null;
    const each = (item: unknown): unknown => {
      if (nested) return pbOf(nested, item as Raw);
      return typeof item === "bigint" ? int64(item) : item;
    };
    const key = written.fieldsById[field.id].name;
    if (field.map) {
      const map: Raw = Object.create(null);
      for (const [k, v] of value as [string, unknown][]) map[k] = each(v);
      out[key] = map;
    } else if (field.repeated) out[key] = (value as unknown[]).map(each);
    else out[key] = each(value);
  }
  return out;
}

function oracleDecode(type: protobuf.Type, bytes: Uint8Array): Raw {
  return type.toObject(type.decode(bytes), { longs: String, enums: Number, bytes: String });
}

function oracleEncode(type: protobuf.Type, object: Raw): Uint8Array {
  return type.encode(type.fromObject(object)).finish();
}

const CHARS = ["a", "Z", "_", " ", "é", "Ω", "😀", "\u0000", "\ufeff", "中", "\n"];

function randomString(rng: SeededRandom): string {
  return Array.from({ length: rng.int(0, 6) }, () => rng.pick(CHARS)).join("");
}

/** A uniformly random unsigned integer of exactly `bits` bits (1..64): every varint length gets sampled. */
function randomBits(rng: SeededRandom, bits: number): bigint {
  let value = 1n;
  for (let i = 1; i < bits; i++) value = (value << 1n) | (rng.chance(0.5) ? 1n : 0n);
  return value;
}

function randomScalar(type: string, rng: SeededRandom): unknown {
  switch (type) {
    case "uint32":
      return rng.pick([0, 1, 127, 128, 16383, 16384, 2 ** 31, 2 ** 32 - 1, rng.int(0, 2 ** 32 - 1)]);
    case "uint64":
      return rng.pick([
        0n,
        1n,
        2n ** 35n,
        2n ** 53n + 1n,
        2n ** 63n,
        2n ** 64n - 1n,
        BigInt(rng.int(0, 1e9)),
        randomBits(rng, rng.int(1, 64)),
      ]);
    case "int64":
    case "sint64":
      return rng.pick([
        0n,
        1n,
        -1n,
        -(2n ** 63n),
        2n ** 63n - 1n,
        -(2n ** 53n) - 3n,
        BigInt(rng.int(-1e9, 1e9)),
        randomBits(rng, rng.int(1, 63)) * (rng.chance(0.5) ? -1n : 1n),
      ]);
    case "double":
      return rng.pick([0, -0, 1.5, NaN, Infinity, -Infinity, 5e-324, 1e308, (rng.next() - 0.5) * 1e12]);
    case "bool":
      return rng.chance(0.5);
    case "string":
      return randomString(rng);
    case "bytes":
      return rng.bytes(rng.int(0, 6));
  }
  throw new TypeError(`no generator for ${type}`);
}

function randomOf(field: protobuf.Field, rng: SeededRandom, depth: number): unknown {
  const resolved = field.resolvedType;
  if (resolved instanceof protobuf.Type) return depth < 3 ? randomMessage(resolved, rng, depth + 1) : {};
  if (resolved instanceof protobuf.Enum) return rng.pick([0, 1, 2, 3, 7, -1, 2 ** 31 - 1]);
  return randomScalar(field.type, rng);
}

/** Map keys protobufjs keeps in order: not `__proto__` and not integer-like. */
function randomKeys(rng: SeededRandom): string[] {
  const keys = new Set<string>();
  for (let n = rng.int(0, 3); n > 0; n--) {
    keys.add(rng.pick(["", "seq", "sentAt", "a.b", "ключ", randomString(rng)]));
  }
  return [...keys].filter((key) => key !== "__proto__" && !/^(?:0|[1-9][0-9]*)$/.test(key));
}

function randomMessage(type: protobuf.Type, rng: SeededRandom, depth = 0): Raw {
  const chosen = new Map<protobuf.OneOf, string | null>(
    type.oneofsArray.filter((oneof) => !isSynthetic(oneof)).map((oneof) => [
      oneof,
      rng.chance(0.8) ? rng.pick(oneof.oneof) : null,
    ]),
  );
  const out: Raw = {};
  for (const field of type.fieldsArray) {
    if (field.partOf !== null && chosen.has(field.partOf)) {
      if (chosen.get(field.partOf) !== field.name) continue;
    } else if (!rng.chance(0.7)) continue;
    if (field.map) out[field.name] = randomKeys(rng).map((key) => [key, randomOf(field, rng, depth)]);
    else if (field.repeated) {
      out[field.name] = Array.from({ length: rng.int(0, 3) }, () => randomOf(field, rng, depth));
    } else out[field.name] = randomOf(field, rng, depth);
  }
  return out;
}

Deno.test("random messages of every type read as protobufjs reads them, and write as its full build writes them", () => {
  const seed = testSeed();
  const rng = new SeededRandom(seed);
  for (const name of MESSAGES) {
    const type = oracleType(name);
    for (let i = 0; i < 400; i++) {
      const raw = randomMessage(type, rng);
      const expected = canonical(type, raw);
      const bytes = encodeMessage(name, pbOf(type, expected) as never);
      const at = `${name} #${i}, VF_TEST_SEED=${seed}, bytes ${bytes.toHex()}`;
      assert.deepEqual(decodeMessage(name, bytes), expected, `our reader, ${at}`);
      assert.deepEqual(oracleDecode(type, bytes), plain(type, expected), `protobufjs's reader, ${at}`);
      assert.equal(
        oracleEncode(type, plain(type, expected)).toHex(),
        bytes.toHex(),
        `protobufjs's writer, ${at}`,
      );
      // protobufjs also writes implicit fields at their default; both readers agree on what it wrote.
      const loose = oracleEncode(type, plain(type, raw));
      assert.deepEqual(
        plain(type, decodeMessage(name, loose)),
        oracleDecode(type, loose),
        `both readers, ${at}, protobufjs's bytes ${loose.toHex()}`,
      );
    }
  }
});

const PAYLOAD_TYPES: Readonly<Record<string, MessageName>> = {
  "videoflow.v1.Value": "Value",
  "videoflow.v1.Tensor": "Tensor",
  "videoflow.v1.Frame": "Frame",
  "videoflow.v1.Detections": "Detections",
  "videoflow.v1.Tracks": "Tracks",
  "videoflow.v1.BlobRef": "BlobRef",
};

Deno.test("every golden envelope and its payload read as protobufjs reads them and write back byte-exact", () => {
  const folder = new URL("../../fixtures/vectors/envelope/", import.meta.url);
  const manifest: { file: string }[] = JSON.parse(Deno.readTextFileSync(new URL("manifest.json", folder)));
  assert.ok(manifest.length > 0);
  for (const { file } of manifest) {
    const bytes = Deno.readFileSync(new URL(file, folder));
    const envelope = decodeMessage("Envelope", bytes);
    const type = oracleType("Envelope");
    assert.deepEqual(plain(type, envelope), oracleDecode(type, bytes), file);
    assert.equal(
      encodeMessage("Envelope", pbOf(type, envelope as Raw) as never).toHex(),
      bytes.toHex(),
      file,
    );
    const payloadName = PAYLOAD_TYPES[envelope.payloadType ?? ""];
    if (payloadName === undefined) continue;
    const payload = envelope.payload!;
    const payloadType = oracleType(payloadName);
    const decoded = decodeMessage(payloadName, payload);
    assert.deepEqual(
      plain(payloadType, decoded),
      oracleDecode(payloadType, payload),
      `${file} payload`,
    );
    assert.equal(
      encodeMessage(payloadName, pbOf(payloadType, decoded as Raw) as never).toHex(),
      payload.toHex(),
      `${file} payload`,
    );
  }
});
