/**
 * The validating reader of videoflow.v1 messages: bytes to the raw records the codec decodes, driven by
 * protobufjs's reflection of the schema (`schema.ts`) and written here because protobufjs's generated
 * decoders do not keep the contract's guarantees. protobufjs 7.5.4 reads a known field with whatever wire
 * type arrives (a length-delimited `v` is misread, not refused), reads invalid UTF-8 as a string all the
 * same, skips groups, truncates a length or tag past 32 bits, has no nesting limit, turns a map into
 * an object (of duplicate keys the last kept, integer-like keys moved first) and 64-bit integers into
 * `Long`s; `tests/unit/wire/reader_test.ts` shows each. What the checks cost, best of 60 interleaved rounds
 * on 2 loaded cores (the groups "decode 164-byte envelope" and "decode 720p frame envelope" of
 * `bench/codec_bench.ts`): `decodeEnvelope` + `decodePayload` of the 164-byte envelope 1.93 µs, of a 720p
 * frame envelope 1.81 µs; protobufjs's unchecked `Envelope.decode` + `Value.decode` 1.02 µs and
 * `Envelope.decode` + `Frame.decode` 0.89 µs.
 *
 * Maps are ordered entry lists, 64-bit integers are bigints, strings must be valid UTF-8, a known field
 * with the wrong wire type or a group is refused, and nesting is capped at {@link MAX_DEPTH}. Unknown
 * fields are skipped (and not kept). Reading is zero-copy: `bytes` fields (an envelope's payload, a
 * frame's pixels) are views into the input.
 *
 * @module
 */

// @ts-types="protobufjs/light.d.ts"
import protobuf from "protobufjs/dist/light/protobuf.min.js";
import { DecodeError } from "../core/errors.ts";
import { MAX_DEPTH, MESSAGE_NAMES, MESSAGE_TYPES, type MessageName, PROTO_PACKAGE } from "./schema.ts";

/** An ordered map as the wire carries it: entries in wire order, duplicates and all. */
export type RawEntries = readonly (readonly [string, RawValue])[];

/** `videoflow.v1.Envelope` as the walker reads and writes it: an absent field is `undefined`. */
export interface RawEnvelope {
  readonly v?: number;
  readonly type?: number;
  readonly producerName?: string;
  readonly flowId?: string;
  readonly runId?: string;
  readonly traceId?: string;
  readonly seq?: bigint;
  readonly eventTs?: number;
  readonly spanId?: string;
  readonly parentSpanId?: string;
  readonly replicaId?: number;
  readonly metadata?: RawEntries;
  readonly payloadType?: string;
  readonly payload?: Uint8Array;
}

/** `videoflow.v1.Value`: at most one member of its `kind` oneof is set. */
export interface RawValue {
  readonly nullValue?: number;
  readonly doubleValue?: number;
  readonly intValue?: bigint;
  readonly stringValue?: string;
  readonly bytesValue?: Uint8Array;
  readonly boolValue?: boolean;
  readonly listValue?: { readonly values?: readonly RawValue[] };
  readonly mapValue?: { readonly fields?: RawEntries };
  readonly tensorValue?: RawTensor;
}

/** `videoflow.v1.Tensor`. */
export interface RawTensor {
  readonly shape?: readonly bigint[];
  readonly dtype?: string;
  readonly data?: Uint8Array;
}

/** `videoflow.v1.Frame`. */
export interface RawFrame {
  readonly pixels?: RawTensor;
  readonly pixelFormat?: string;
  readonly captureTs?: number;
}

/** `videoflow.v1.Detections`. */
export interface RawDetections {
  readonly boxes?: RawTensor;
  readonly classNames?: readonly string[];
}

/** `videoflow.v1.Tracks`. */
export interface RawTracks {
  readonly tracks?: RawTensor;
}

/** `videoflow.v1.BlobRef`. */
export interface RawBlobRef {
  readonly ref?: string;
  readonly innerPayloadType?: string;
  readonly size?: bigint;
}

/** The messages a payload or an envelope can be, by their short name in {@link PROTO_PACKAGE}. */
export interface RawMessages {
  readonly Envelope: RawEnvelope;
  readonly Value: RawValue;
  readonly Tensor: RawTensor;
  readonly Frame: RawFrame;
  readonly Detections: RawDetections;
  readonly Tracks: RawTracks;
  readonly BlobRef: RawBlobRef;
}

type ScalarKind = "uint32" | "enum" | "uint64" | "int64" | "sint64" | "double" | "bool" | "string" | "bytes";
type Kind = ScalarKind | MessagePlan;

interface FieldPlan {
  readonly id: number;
  /** The field's name in camelCase: its key in a raw message. */
  readonly name: string;
  /** The field's full name as the .proto spells it, for errors. */
  readonly fullName: string;
  readonly label: "single" | "repeated" | "map";
  /** The field's type; a map's value type. */
  readonly kind: Kind;
  /** The other members of the field's oneof, cleared when it is read. */
  readonly siblings: readonly string[];
}

interface MessagePlan {
  readonly name: string;
  /** Indexed by field number (a small array: the schema's numbers are dense). */
  readonly byId: (FieldPlan | undefined)[];
}

type Fields = Record<string, unknown>;

const WIRE_TYPE: Readonly<Record<ScalarKind, number>> = {
  uint32: 0,
  enum: 0,
  uint64: 0,
  int64: 0,
  sint64: 0,
  bool: 0,
  double: 1,
  string: 2,
  bytes: 2,
};
const LENGTH_DELIMITED = 2;

function wireTypeOf(kind: Kind): number {
  return typeof kind === "string" ? WIRE_TYPE[kind] : LENGTH_DELIMITED;
}

function isPackable(kind: Kind): boolean {
  return wireTypeOf(kind) !== LENGTH_DELIMITED;
}

function camelCase(name: string): string {
  return name.replace(/_([a-z0-9])/g, (_, letter: string) => letter.toUpperCase());
}

function kindOf(field: protobuf.Field, plans: Map<protobuf.Type, MessagePlan>): Kind {
  const resolved = field.resolvedType;
  if (resolved instanceof protobuf.Type) return planOf(resolved, plans);
  if (resolved instanceof protobuf.Enum) return "enum";
  if (!Object.hasOwn(WIRE_TYPE, field.type) || field.type === "enum") {
    throw new TypeError(`${field.fullName}: type ${field.type} is not implemented`);
  }
  return field.type as ScalarKind;
}

function planOf(type: protobuf.Type, plans: Map<protobuf.Type, MessagePlan>): MessagePlan {
  const known = plans.get(type);
  if (known) return known;
  const plan: MessagePlan = { name: type.fullName.slice(1), byId: [] };
  plans.set(type, plan);
  for (const field of type.fieldsArray) {
    if (field instanceof protobuf.MapField && field.keyType !== "string") {
      throw new TypeError(`${field.fullName}: only string map keys are implemented`);
    }
    const oneof = field.partOf;
    plan.byId[field.id] = {
      id: field.id,
      name: camelCase(field.name),
      fullName: field.fullName.slice(1),
      label: field.map ? "map" : field.repeated ? "repeated" : "single",
      kind: kindOf(field, plans),
      siblings: oneof ? oneof.oneof.filter((name) => name !== field.name).map(camelCase) : [],
    };
  }
  return plan;
}

const PLANS: Readonly<Record<MessageName, MessagePlan>> = (() => {
  const plans = new Map<protobuf.Type, MessagePlan>();
  return Object.fromEntries(
    MESSAGE_NAMES.map((name) => [name, planOf(MESSAGE_TYPES[name], plans)]),
  ) as Record<
    MessageName,
    MessagePlan
  >;
})();

/** Eight bytes for moving a double out of little-endian order. */
const scratch = new DataView(new ArrayBuffer(8));
const scratchBytes = new Uint8Array(scratch.buffer);

const DECODE_REMEDY = "check that the producer speaks videoflow envelope version 4 (videoflow.v1) and that " +
  "nothing truncated or altered the bytes on the way";

function malformed(message: string): DecodeError {
  return new DecodeError(message, DECODE_REMEDY);
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
/** Up to this many bytes, an ASCII string is decoded by hand: cheaper than a call into TextDecoder. */
const SHORT_STRING = 64;

/** A cursor over one message's bytes; every read checks the bounds and throws a DecodeError past them. */
class Reader {
  readonly buf: Uint8Array;
  readonly len: number;
  pos = 0;

  constructor(bytes: Uint8Array) {
    this.buf = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.len = bytes.byteLength;
  }

  /** A varint of up to 10 bytes, truncated to its low 32 bits (unsigned). */
  varint32(): number {
    let value = 0;
    for (let shift = 0; shift < 70; shift += 7) {
      if (this.pos >= this.len) throw malformed("the message ends inside a varint");
      const byte = this.buf[this.pos++];
      if (shift < 32) value |= (byte & 0x7f) << shift;
      if (byte < 0x80) return value >>> 0;
    }
    throw malformed("a varint is longer than 10 bytes");
  }

  /**
   * A varint that must fit in 32 bits unsigned, as a tag or a length must: one that carries a larger value
   * (a length past any message, a field number past protobuf's range) is malformed, never truncated.
   */
  varintU32(what: string): number {
    let value = 0;
    for (let shift = 0; shift < 70; shift += 7) {
      if (this.pos >= this.len) throw malformed("the message ends inside a varint");
      const byte = this.buf[this.pos++];
      const bits = byte & 0x7f;
      if (shift < 28 || (shift === 28 && bits <= 0x0f)) value |= bits << shift;
      else if (bits !== 0) throw malformed(`${what} is larger than 32 bits`);
      if (byte < 0x80) return value >>> 0;
    }
    throw malformed("a varint is longer than 10 bytes");
  }

  /** A varint of up to 10 bytes as an unsigned 64-bit bigint. */
  varint64(): bigint {
    let low = 0;
    let high = 0;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.len) throw malformed("the message ends inside a varint");
      const byte = this.buf[this.pos++];
      const bits = byte & 0x7f;
      if (i < 4) low |= bits << (7 * i);
      else if (i === 4) {
        low |= bits << 28;
        high = bits >>> 4;
      } else high |= bits << (7 * i - 32);
      if (byte < 0x80) {
        return high === 0 ? BigInt(low >>> 0) : (BigInt(high >>> 0) << 32n) | BigInt(low >>> 0);
      }
    }
    throw malformed("a varint is longer than 10 bytes");
  }

  /** A little-endian double. */
  double(): number {
    const at = this.skip(8);
    for (let i = 0; i < 8; i++) scratchBytes[i] = this.buf[at + i];
    return scratch.getFloat64(0, true);
  }

  /** Moves past `count` bytes and returns where they start. */
  skip(count: number): number {
    const at = this.pos;
    if (at + count > this.len) throw malformed(`the message ends inside a field of ${count} bytes`);
    this.pos = at + count;
    return at;
  }

  /** A length-delimited string, which must be valid UTF-8 (a short ASCII one is read without TextDecoder). */
  string(field: FieldPlan): string {
    const end = this.delimitedEnd();
    const start = this.pos;
    this.pos = end;
    if (end - start <= SHORT_STRING) {
      for (let at = start; at < end; at++) {
        if (this.buf[at] >= 0x80) return this.#utf8(start, end, field);
      }
      return String.fromCharCode.apply(null, this.buf.subarray(start, end) as unknown as number[]);
    }
    return this.#utf8(start, end, field);
  }

  #utf8(start: number, end: number, field: FieldPlan): string {
    try {
      return utf8.decode(this.buf.subarray(start, end));
    } catch {
      throw malformed(`${field.fullName} is not valid UTF-8`);
    }
  }

  /** Reads a length and returns where the bytes it announces end. */
  delimitedEnd(): number {
    const length = this.varintU32("a length");
    const end = this.pos + length;
    if (end > this.len) throw malformed(`a length of ${length} bytes runs past the end of the message`);
    return end;
  }
}

function readKind(kind: Kind, r: Reader, field: FieldPlan, depth: number): unknown {
  switch (kind) {
    case "uint32":
      return r.varint32();
    case "enum":
      return r.varint32() | 0;
    case "uint64":
      return r.varint64();
    case "int64":
      return BigInt.asIntN(64, r.varint64());
    case "sint64": {
      const zigzag = r.varint64();
      return (zigzag >> 1n) ^ -(zigzag & 1n);
    }
    case "double":
      return r.double();
    case "bool":
      return r.varint64() !== 0n;
    case "string":
      return r.string(field);
    case "bytes": {
      const end = r.delimitedEnd();
      return r.buf.subarray(r.pos, r.pos = end);
    }
    default:
      return readMessage(kind, r, r.delimitedEnd(), depth + 1);
  }
}

function skipUnknown(r: Reader, wireType: number, where: string): void {
  switch (wireType) {
    case 0:
      r.varint32();
      return;
    case 1:
      r.skip(8);
      return;
    case LENGTH_DELIMITED:
      r.pos = r.delimitedEnd();
      return;
    case 3:
    case 4:
      throw malformed(`wire type ${wireType} (a group) is not part of the ${PROTO_PACKAGE} schema`);
    case 5:
      r.skip(4);
      return;
    default:
      throw malformed(`${where} holds invalid wire type ${wireType}, which protobuf does not define`);
  }
}

function expectWireType(field: FieldPlan, wireType: number, expected: number): void {
  if (wireType !== expected) {
    throw malformed(
      `${field.fullName} arrived with wire type ${wireType}, its type has wire type ${expected}`,
    );
  }
}

function readMapEntry(field: FieldPlan, r: Reader, depth: number): [string, unknown] {
  const end = r.delimitedEnd();
  let key = "";
  let value: unknown = undefined;
  while (r.pos < end) {
    const tag = r.varintU32("a tag");
    const wireType = tag & 7;
    if (tag >>> 3 === 1) {
      expectWireType(field, wireType, LENGTH_DELIMITED);
      key = readKind("string", r, field, depth) as string;
    } else if (tag >>> 3 === 2) {
      expectWireType(field, wireType, wireTypeOf(field.kind));
      value = readKind(field.kind, r, field, depth);
    } else {
      skipUnknown(r, wireType, `an entry of ${field.fullName}`);
    }
    if (r.pos > end) throw malformed(`an entry of ${field.fullName} runs past its length`);
  }
  if (value === undefined) value = defaultOf(field.kind, r, depth);
  return [key, value];
}

function defaultOf(kind: Kind, r: Reader, depth: number): unknown {
  switch (kind) {
    case "uint32":
    case "enum":
    case "double":
      return 0;
    case "uint64":
    case "int64":
    case "sint64":
      return 0n;
    case "bool":
      return false;
    case "string":
      return "";
    case "bytes":
      return new Uint8Array(0);
    default:
      return readMessage(kind, r, r.pos, depth + 1);
  }
}

function append(out: Fields, name: string, item: unknown): void {
  const list = out[name] as unknown[] | undefined;
  if (list) list.push(item);
  else out[name] = [item];
}

function readField(field: FieldPlan, wireType: number, r: Reader, out: Fields, depth: number): void {
  switch (field.label) {
    case "map":
      expectWireType(field, wireType, LENGTH_DELIMITED);
      append(out, field.name, readMapEntry(field, r, depth));
      return;
    case "repeated":
      if (wireType === LENGTH_DELIMITED && isPackable(field.kind)) {
        const end = r.delimitedEnd();
        while (r.pos < end) append(out, field.name, readKind(field.kind, r, field, depth));
        if (r.pos !== end) throw malformed(`packed ${field.fullName} runs past its length`);
        if (out[field.name] === undefined) out[field.name] = [];
        return;
      }
      expectWireType(field, wireType, wireTypeOf(field.kind));
      append(out, field.name, readKind(field.kind, r, field, depth));
      return;
    case "single":
      expectWireType(field, wireType, wireTypeOf(field.kind));
      for (const sibling of field.siblings) if (out[sibling] !== undefined) delete out[sibling];
      out[field.name] = readKind(field.kind, r, field, depth);
  }
}

function readMessage(plan: MessagePlan, r: Reader, end: number, depth: number): Fields {
  if (depth > MAX_DEPTH) throw malformed(`messages nest deeper than ${MAX_DEPTH} levels`);
  const out: Fields = {};
  while (r.pos < end) {
    const tag = r.varintU32("a tag");
    const id = tag >>> 3;
    if (id === 0) throw malformed(`${plan.name} holds a field numbered 0, which protobuf forbids`);
    const field = plan.byId[id];
    if (field === undefined) skipUnknown(r, tag & 7, plan.name);
    else readField(field, tag & 7, r, out, depth);
    if (r.pos > end) throw malformed(`a field of ${plan.name} runs past the end of its message`);
  }
  return out;
}

/**
 * Reads one message of type `name` from `bytes`. Strings are decoded; `bytes` fields are views into
 * `bytes` (no copy), so the caller must not change `bytes` while the result is in use.
 *
 * @throws DecodeError for anything that is not a well-formed message of that type, whatever the cause
 * (truncation, a bad varint, a wrong wire type, invalid UTF-8, nesting beyond {@link MAX_DEPTH}).
 */
export function decodeMessage<K extends MessageName>(name: K, bytes: Uint8Array): RawMessages[K] {
  const reader = new Reader(bytes);
  return readMessage(PLANS[name], reader, reader.len, 0) as RawMessages[K];
}
