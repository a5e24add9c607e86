/**
 * The videoflow.v1 protobuf schema (envelope version 4) and the reader and writer that move its messages
 * on and off the wire.
 *
 * The schema is `envelope.proto`, imported as text (a static import, so a worker with no read permission
 * loads it with the module graph) and parsed once at module load by `proto_parser.ts`; every field
 * number, wire type, label and oneof the codec uses comes from that parse ({@link ENVELOPE_SCHEMA}). No
 * protobuf library is loaded: the reader and writer here are this module's own.
 *
 * Maps are ordered entry lists, 64-bit integers are bigints, strings must be valid UTF-8, a known field
 * with the wrong wire type or a group is refused, and nesting is capped at {@link MAX_DEPTH}. Unknown
 * fields are skipped (and not kept). Writing follows proto3: fields in number order, implicit-presence
 * fields omitted at their default, repeated numbers packed, map entries with both key and value.
 *
 * Writing measures first: one pass computes every length-delimited size ({@link MeasuredMessage}), then
 * the message is written into one allocation of exactly its size, so `bytes` fields (tensor data, an
 * envelope's payload) are copied once. A `bytes` field may also hold a measured message, written in place
 * as the field's content: on the wire that is byte-identical to the message's own encoding in the field,
 * without writing it twice (an envelope carries its Frame so, the pixels copied once). Reading is
 * zero-copy: `bytes` fields are views into the input.
 *
 * @module
 */

import { DecodeError, SchemaError } from "../core/errors.ts";
import envelopeProto from "./envelope.proto" with { type: "text" };
import { camelCaseName, parseProto, type ProtoFile, type ProtoScalar } from "./proto_parser.ts";

/** The protobuf package of every videoflow message type. */
export const PROTO_PACKAGE = "videoflow.v1";

/** How deep messages may nest (a Value list inside a list ...), reading or writing, as protobuf's own limit. */
export const MAX_DEPTH = 100;

/** The largest message protobuf allows (2 GiB − 1): a longer one cannot be framed or read back. */
export const MAX_MESSAGE_BYTES = 2 ** 31 - 1;

/** `envelope.proto` as parsed: the single source of the messages, field numbers and enum values. */
export const ENVELOPE_SCHEMA: ProtoFile = parseProto(envelopeProto, "envelope.proto");

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

/** The short name of a top-level message type. */
export type MessageName = keyof RawMessages;

/**
 * A raw message as the writer takes it: the same fields, except that any `bytes` field may hold a
 * {@link MeasuredMessage}, written in place as the field's content.
 */
export type Writable<T> = T extends Uint8Array ? Uint8Array | MeasuredMessage
  : T extends object ? { readonly [P in keyof T]: Writable<T[P]> }
  : T;

/** Where {@link encodeMessage} and {@link MeasuredMessage.encode} write. */
export interface EncodeOptions {
  /**
   * Returns a `Uint8Array` of exactly `size` bytes for the message to be written into (a view onto a
   * SharedArrayBuffer, a slot of a ring buffer ...); every byte of it is overwritten. By default a new
   * `Uint8Array` of its own.
   */
  readonly allocate?: (size: number) => Uint8Array;
}

type ScalarKind = ProtoScalar | "enum";
type Kind = ScalarKind | MessagePlan;

interface FieldPlan {
  readonly id: number;
  /** The field's name in camelCase: its key in a raw message. */
  readonly name: string;
  readonly fullName: string;
  readonly label: "single" | "repeated" | "map";
  /** The field's type; a map's value type. */
  readonly kind: Kind;
  /** Whether an explicitly set default is written: message fields, oneof members, proto3 `optional`. */
  readonly presence: boolean;
  /** The other members of the field's oneof, cleared when it is read. */
  readonly siblings: readonly string[];
  /** The tag it is written with: a map entry, a packed list or a list of messages is length-delimited. */
  readonly tag: number;
}

interface MessagePlan {
  readonly name: string;
  /** In field-number order, the order they are written. */
  readonly fields: FieldPlan[];
  readonly byId: Map<number, FieldPlan>;
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
const MAP_KEY_TAG = (1 << 3) | LENGTH_DELIMITED;

function wireTypeOf(kind: Kind): number {
  return typeof kind === "string" ? WIRE_TYPE[kind] : LENGTH_DELIMITED;
}

function isPackable(kind: Kind): boolean {
  return wireTypeOf(kind) !== LENGTH_DELIMITED;
}

function messagePlans(file: ProtoFile): ReadonlyMap<string, MessagePlan> {
  if (file.package !== PROTO_PACKAGE) {
    throw new SyntaxError(
      `envelope.proto declares package ${file.package}, the codec speaks ${PROTO_PACKAGE}`,
    );
  }
  const plans = new Map<string, MessagePlan>(
    file.messages.map((m) => [m.name, { name: `${PROTO_PACKAGE}.${m.name}`, fields: [], byId: new Map() }]),
  );
  for (const message of file.messages) {
    const plan = plans.get(message.name)!;
    for (const field of [...message.fields].sort((a, b) => a.number - b.number)) {
      const { type } = field;
      const kind = type.kind === "scalar" ? type.name : type.kind === "enum" ? "enum" : plans.get(type.name)!;
      const oneof = message.oneofs.find((o) => o.name === field.oneof);
      const label = field.label === "map" || field.label === "repeated" ? field.label : "single";
      const fieldPlan: FieldPlan = {
        id: field.number,
        name: camelCaseName(field.name),
        fullName: `${plan.name}.${field.name}`,
        label,
        kind,
        presence: typeof kind !== "string" || oneof !== undefined || field.label === "optional",
        siblings: oneof ? oneof.fields.filter((name) => name !== field.name).map(camelCaseName) : [],
        tag: (field.number << 3) | (label === "single" ? wireTypeOf(kind) : LENGTH_DELIMITED),
      };
      plan.fields.push(fieldPlan);
      plan.byId.set(field.number, fieldPlan);
    }
  }
  return plans;
}

const PLANS: Readonly<Record<MessageName, MessagePlan>> = (() => {
  const plans = messagePlans(ENVELOPE_SCHEMA);
  const lookup = (name: MessageName) => {
    const plan = plans.get(name);
    if (plan === undefined) throw new SyntaxError(`envelope.proto declares no message ${name}`);
    return plan;
  };
  return {
    Envelope: lookup("Envelope"),
    Value: lookup("Value"),
    Tensor: lookup("Tensor"),
    Frame: lookup("Frame"),
    Detections: lookup("Detections"),
    Tracks: lookup("Tracks"),
    BlobRef: lookup("BlobRef"),
  };
})();

/** Eight bytes for moving a double to and from little-endian order. */
const scratch = new DataView(new ArrayBuffer(8));
const scratchBytes = new Uint8Array(scratch.buffer);

const DECODE_REMEDY = "check that the producer speaks videoflow envelope version 4 (videoflow.v1) and that " +
  "nothing truncated or altered the bytes on the way";

function malformed(message: string): DecodeError {
  return new DecodeError(message, DECODE_REMEDY);
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
/** Up to this many bytes, an ASCII string is decoded by hand: cheaper than a call into TextDecoder. */
const SHORT_STRING = 32;

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
      let ascii = "";
      for (let at = start; at < end; at++) {
        const byte = this.buf[at];
        if (byte >= 0x80) return this.#utf8(start, end, field);
        ascii += String.fromCharCode(byte);
      }
      return ascii;
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
    const field = plan.byId.get(id);
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

/**
 * What the writer walk emits; {@link Measure} adds it up, {@link Write} puts it into the output. A
 * length-delimited part is bracketed by `begin` and `end`; a string's and a part's lengths are measured
 * once and read back, in the same order, when writing.
 */
interface Sink {
  varint32(value: number): void;
  /** A 64-bit varint, as its low and high 32 bits (unsigned). */
  varint64(low: number, high: number): void;
  double(value: number): void;
  /** A string field's length and UTF-8 bytes. @throws SchemaError when it is not well-formed Unicode. */
  string(value: string, field: FieldPlan): void;
  /** A `bytes` field's length and content: bytes as they are, or a measured message written in place. */
  bytes(value: Uint8Array | MeasuredMessage): void;
  begin(): void;
  end(): void;
}

function varint32Size(value: number): number {
  return value < 0x80 ? 1 : value < 0x4000 ? 2 : value < 0x200000 ? 3 : value < 0x10000000 ? 4 : 5;
}

/** The UTF-8 length of a string, or -1 when it is not well-formed (it holds a lone surrogate). */
function utf8Length(value: string): number {
  let length = value.length;
  for (let i = 0; i < value.length; i++) {
    const unit = value.charCodeAt(i);
    if (unit < 0x80) continue;
    if (unit < 0x800) length += 1;
    else if (unit < 0xd800 || unit > 0xdfff) length += 2;
    else {
      const next = value.charCodeAt(i + 1);
      if (unit > 0xdbff || !(next >= 0xdc00 && next <= 0xdfff)) return -1;
      length += 2;
      i++;
    }
  }
  return length;
}

/** Adds up the size of a message and records every length the writing needs, in walk order. */
class Measure implements Sink {
  size = 0;
  readonly lengths: number[] = [];
  /** For each part begun and not ended: the index of its length, then the size before it. */
  readonly #open: number[] = [];

  varint32(value: number): void {
    this.size += varint32Size(value >>> 0);
  }

  varint64(low: number, high: number): void {
    this.size += high === 0 ? varint32Size(low) : high < 8 ? 5 : 5 + varint32Size(high >>> 3);
  }

  double(): void {
    this.size += 8;
  }

  string(value: string, field: FieldPlan): void {
    const length = utf8Length(value);
    if (length < 0) {
      throw new SchemaError(
        `a string for ${field.fullName} is not well-formed Unicode: it holds a lone surrogate`,
        "repair the string (String.prototype.toWellFormed) before it is published",
      );
    }
    this.lengths.push(length);
    this.size += varint32Size(length) + length;
  }

  bytes(value: Uint8Array | MeasuredMessage): void {
    this.size += varint32Size(value.byteLength) + value.byteLength;
  }

  begin(): void {
    this.#open.push(this.lengths.length, this.size);
    this.lengths.push(0);
  }

  end(): void {
    const start = this.#open.pop()!;
    const length = this.size - start;
    this.lengths[this.#open.pop()!] = length;
    this.size += varint32Size(length);
  }
}

const utf8Encoder = new TextEncoder();

/** Writes a measured message into a buffer from `start`, as many bytes as it measured. */
class Write implements Sink {
  #pos: number;
  #next = 0;

  constructor(readonly buf: Uint8Array, readonly lengths: readonly number[], start: number) {
    this.#pos = start;
  }

  varint32(value: number): void {
    const buf = this.buf;
    let pos = this.#pos;
    let rest = value >>> 0;
    while (rest > 0x7f) {
      buf[pos++] = (rest & 0x7f) | 0x80;
      rest >>>= 7;
    }
    buf[pos++] = rest;
    this.#pos = pos;
  }

  varint64(low: number, high: number): void {
    const buf = this.buf;
    let pos = this.#pos;
    let lo = low;
    let hi = high;
    while (hi !== 0) {
      buf[pos++] = (lo & 0x7f) | 0x80;
      lo = ((lo >>> 7) | (hi << 25)) >>> 0;
      hi >>>= 7;
    }
    this.#pos = pos;
    this.varint32(lo);
  }

  double(value: number): void {
    scratch.setFloat64(0, value, true);
    for (let i = 0; i < 8; i++) this.buf[this.#pos + i] = scratchBytes[i];
    this.#pos += 8;
  }

  string(value: string): void {
    const length = this.lengths[this.#next++];
    this.varint32(length);
    const buf = this.buf;
    const pos = this.#pos;
    if (length === value.length) {
      for (let i = 0; i < length; i++) buf[pos + i] = value.charCodeAt(i);
    } else {
      utf8Encoder.encodeInto(value, buf.subarray(pos, pos + length));
    }
    this.#pos = pos + length;
  }

  bytes(value: Uint8Array | MeasuredMessage): void {
    this.varint32(value.byteLength);
    if (value instanceof Uint8Array) this.buf.set(value, this.#pos);
    else value.writeInto(this.buf, this.#pos);
    this.#pos += value.byteLength;
  }

  begin(): void {
    this.varint32(this.lengths[this.#next++]);
  }

  end(): void {}
}

const TWO_TO_32 = 2 ** 32;
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/** An unsigned 64-bit value (below 2^64) as a varint. */
function putVarint64(sink: Sink, value: bigint): void {
  if (value <= MAX_SAFE) {
    const n = Number(value);
    sink.varint64(n >>> 0, Math.floor(n / TWO_TO_32));
  } else {
    sink.varint64(Number(value & 0xffffffffn), Number(value >> 32n));
  }
}

function isDefault(kind: ScalarKind, value: unknown): boolean {
  switch (kind) {
    case "uint32":
    case "enum":
    case "double":
      return value === 0 && !Object.is(value, -0);
    case "uint64":
    case "int64":
    case "sint64":
      return value === 0n;
    case "bool":
      return value === false;
    case "string":
      return value === "";
    case "bytes":
      return (value as Uint8Array | MeasuredMessage).byteLength === 0;
  }
}

function putScalar(kind: ScalarKind, value: unknown, sink: Sink, field: FieldPlan): void {
  switch (kind) {
    case "uint32":
      sink.varint32(value as number);
      return;
    case "enum": {
      const code = value as number;
      if (code >= 0) sink.varint32(code);
      else sink.varint64(code >>> 0, 0xffffffff);
      return;
    }
    case "uint64":
    case "int64":
      putVarint64(sink, BigInt.asUintN(64, value as bigint));
      return;
    case "sint64": {
      const signed = value as bigint;
      putVarint64(sink, BigInt.asUintN(64, (signed << 1n) ^ (signed >> 63n)));
      return;
    }
    case "double":
      sink.double(value as number);
      return;
    case "bool":
      sink.varint32(value ? 1 : 0);
      return;
    case "string":
      sink.string(value as string, field);
      return;
    case "bytes":
      sink.bytes(value as Uint8Array | MeasuredMessage);
  }
}

function putTagged(
  kind: Kind,
  tag: number,
  value: unknown,
  sink: Sink,
  field: FieldPlan,
  depth: number,
): void {
  sink.varint32(tag);
  if (typeof kind === "string") {
    putScalar(kind, value, sink, field);
  } else {
    sink.begin();
    putMessage(kind, value as Fields, sink, depth + 1);
    sink.end();
  }
}

function putMessage(plan: MessagePlan, message: Fields, sink: Sink, depth: number): void {
  if (depth > MAX_DEPTH) {
    throw new SchemaError(
      `a value nests deeper than ${MAX_DEPTH} levels (or refers to itself)`,
      "flatten the value; a payload or metadata entry must be a finite tree",
    );
  }
  for (const field of plan.fields) {
    const value = message[field.name];
    if (value === undefined) continue;
    switch (field.label) {
      case "map": {
        const valueTag = (2 << 3) | wireTypeOf(field.kind);
        for (const [key, item] of value as RawEntries) {
          sink.varint32(field.tag);
          sink.begin();
          putTagged("string", MAP_KEY_TAG, key, sink, field, depth);
          putTagged(field.kind, valueTag, item, sink, field, depth);
          sink.end();
        }
        break;
      }
      case "repeated": {
        const items = value as readonly unknown[];
        if (items.length === 0) break;
        if (isPackable(field.kind)) {
          sink.varint32(field.tag);
          sink.begin();
          for (const item of items) putScalar(field.kind as ScalarKind, item, sink, field);
          sink.end();
        } else {
          for (const item of items) putTagged(field.kind, field.tag, item, sink, field, depth);
        }
        break;
      }
      case "single":
        if (field.presence || !isDefault(field.kind as ScalarKind, value)) {
          putTagged(field.kind, field.tag, value, sink, field, depth);
        }
    }
  }
}

/**
 * A message of type `name`, measured once (its size and every length inside it) and not yet written. It
 * is written standalone by {@link MeasuredMessage.encode}, or in place as the value of a `bytes` field of
 * another message ({@link Writable}), where its bytes are exactly those `encode` returns and its `bytes`
 * fields are copied once, straight into the outer message. A measured message must not change before it
 * is written: it is written as it was measured.
 */
export class MeasuredMessage<K extends MessageName = MessageName> {
  /** The message's type, by its short name in {@link PROTO_PACKAGE}. */
  readonly name: K;
  /** The exact size of the message's encoding, in bytes. */
  readonly byteLength: number;
  readonly #fields: Fields;
  readonly #lengths: readonly number[];

  /**
   * Measures `message` as a `name`; nothing is written or allocated for its bytes.
   *
   * @throws SchemaError when a string is not well-formed Unicode or messages nest deeper than
   * {@link MAX_DEPTH}.
   */
  constructor(name: K, message: Writable<RawMessages[K]>) {
    const measure = new Measure();
    putMessage(PLANS[name], message as Fields, measure, 0);
    this.name = name;
    this.byteLength = measure.size;
    this.#fields = message as Fields;
    this.#lengths = measure.lengths;
  }

  /**
   * The message's bytes, in one allocation of exactly {@link byteLength}, each `bytes` field copied once.
   * By default a new `Uint8Array` that owns its whole `ArrayBuffer` (offset 0, no pool sharing), so it can
   * be transferred to a worker; with `options.allocate` the array that returned.
   *
   * @throws SchemaError when the message would exceed {@link MAX_MESSAGE_BYTES}.
   * @throws RangeError when `options.allocate` returns an array of another size than it was asked for.
   */
  encode(options: EncodeOptions = {}): Uint8Array {
    const size = this.byteLength;
    if (size > MAX_MESSAGE_BYTES) {
      throw new SchemaError(
        `a ${PLANS[this.name].name} of ${size} bytes exceeds protobuf's limit of ${MAX_MESSAGE_BYTES} bytes`,
        "offload the payload to the blob store (a BlobRef) or split it",
      );
    }
    const out = options.allocate ? options.allocate(size) : new Uint8Array(size);
    if (out.byteLength !== size) {
      throw new RangeError(
        `allocate(${size}) returned ${out.byteLength} bytes; it must return exactly ${size}`,
      );
    }
    this.writeInto(out, 0);
    return out;
  }

  /**
   * Writes the message's {@link byteLength} bytes into `out` from `offset`.
   *
   * @throws RangeError when `out` has no room for them there.
   */
  writeInto(out: Uint8Array, offset: number): void {
    if (!(offset >= 0 && offset + this.byteLength <= out.byteLength)) {
      throw new RangeError(
        `${this.byteLength} bytes do not fit at offset ${offset} of an array of ${out.byteLength}`,
      );
    }
    putMessage(PLANS[this.name], this.#fields, new Write(out, this.#lengths, offset), 0);
  }
}

/**
 * Writes one message of type `name` into one allocation of exactly its size, copying each `bytes` field
 * once (a {@link MeasuredMessage} in a `bytes` field is written in place): `new MeasuredMessage(name,
 * message).encode(options)`. By default the result is a new `Uint8Array` that owns its whole
 * `ArrayBuffer` (offset 0, no pool sharing), so it can be transferred to a worker; with
 * `options.allocate` it is the array that returned.
 *
 * @throws SchemaError when a string is not well-formed Unicode, messages nest deeper than
 * {@link MAX_DEPTH}, or the message would exceed {@link MAX_MESSAGE_BYTES}.
 * @throws RangeError when `options.allocate` returns an array of another size than it was asked for.
 */
export function encodeMessage<K extends MessageName>(
  name: K,
  message: Writable<RawMessages[K]>,
  options: EncodeOptions = {},
): Uint8Array {
  return new MeasuredMessage(name, message).encode(options);
}
