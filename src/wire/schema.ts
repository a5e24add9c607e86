/**
 * The videoflow.v1 protobuf schema (envelope version 4) and the reader and writer that move its messages
 * on and off the wire.
 *
 * The schema is `envelope.proto`, imported as text (a static import, so a worker with no read
 * permission loads it with the module graph); protobufjs parses it once at module load, and every field number, wire type,
 * label and oneof the codec uses comes from that parse. The reading and writing walk protobufjs's
 * reflection with its `Reader` and `Writer` instead of its generated message classes, because those decode
 * maps into plain objects (losing wire order and mishandling keys such as `__proto__`), read 64-bit
 * integers through `Long`, accept any wire type for a known field and decode invalid UTF-8 silently.
 * Here maps are ordered entry lists, 64-bit integers are bigints, strings must be valid UTF-8, a known
 * field with the wrong wire type or a group is refused, and nesting is capped at {@link MAX_DEPTH}. Unknown
 * fields are skipped (and not kept). Writing follows proto3: fields in number order, implicit-presence
 * fields omitted at their default, repeated numbers packed, map entries with both key and value.
 *
 * @module
 */

import protobuf from "protobufjs";
import { DecodeError, SchemaError } from "../core/errors.ts";
import envelopeProto from "./envelope.proto" with { type: "text" };

/** The protobuf package of every videoflow message type. */
export const PROTO_PACKAGE = "videoflow.v1";

/** How deep messages may nest (a Value list inside a list ...), reading or writing, as protobuf's own limit. */
export const MAX_DEPTH = 100;

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

type ScalarKind = "uint32" | "enum" | "uint64" | "int64" | "sint64" | "double" | "bool" | "string" | "bytes";
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
const SCALAR_KINDS = Object.keys(WIRE_TYPE) as ScalarKind[];

function wireTypeOf(kind: Kind): number {
  return typeof kind === "string" ? WIRE_TYPE[kind] : LENGTH_DELIMITED;
}

function isPackable(kind: Kind): boolean {
  return wireTypeOf(kind) !== LENGTH_DELIMITED;
}

function kindOf(field: protobuf.Field, plans: Map<protobuf.Type, MessagePlan>): Kind {
  const resolved = field.resolvedType;
  if (resolved instanceof protobuf.Type) return planOf(resolved, plans);
  if (resolved instanceof protobuf.Enum) return "enum";
  const scalar = SCALAR_KINDS.find((kind) => kind === field.type && kind !== "enum");
  if (scalar === undefined) throw new TypeError(`${field.fullName}: type ${field.type} is not implemented`);
  return scalar;
}

function camelCase(name: string): string {
  return name.replace(/_([a-z0-9])/g, (_, letter: string) => letter.toUpperCase());
}

function planOf(type: protobuf.Type, plans: Map<protobuf.Type, MessagePlan>): MessagePlan {
  const known = plans.get(type);
  if (known) return known;
  const plan: MessagePlan = { name: type.fullName.replace(/^\./, ""), fields: [], byId: new Map() };
  plans.set(type, plan);
  for (const field of [...type.fieldsArray].sort((a, b) => a.id - b.id)) {
    if (field instanceof protobuf.MapField && field.keyType !== "string") {
      throw new TypeError(`${field.fullName}: only string map keys are implemented`);
    }
    const kind = kindOf(field, plans);
    const oneof = field.partOf;
    const fieldPlan: FieldPlan = {
      id: field.id,
      name: camelCase(field.name),
      fullName: field.fullName.replace(/^\./, ""),
      label: field.map ? "map" : field.repeated ? "repeated" : "single",
      kind,
      presence: typeof kind !== "string" || oneof !== null,
      siblings: oneof ? oneof.oneof.filter((name) => name !== field.name).map(camelCase) : [],
    };
    plan.fields.push(fieldPlan);
    plan.byId.set(field.id, fieldPlan);
  }
  return plan;
}

const root = protobuf.parse(envelopeProto, { keepCase: true }).root;
root.resolveAll();

/** The parsed schema (protobufjs reflection), for tests and tools that inspect it. */
export const SCHEMA_ROOT: protobuf.Root = root;

const PLANS: Readonly<Record<MessageName, MessagePlan>> = (() => {
  const plans = new Map<protobuf.Type, MessagePlan>();
  const lookup = (name: MessageName) => planOf(root.lookupType(`${PROTO_PACKAGE}.${name}`), plans);
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

const DECODE_REMEDY = "check that the producer speaks videoflow envelope version 4 (videoflow.v1) and that " +
  "nothing truncated or altered the bytes on the way";

function malformed(message: string): DecodeError {
  return new DecodeError(message, DECODE_REMEDY);
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

function delimitedEnd(r: protobuf.Reader): number {
  const length = r.uint32();
  const end = r.pos + length;
  if (end > r.len) throw malformed(`a length of ${length} bytes runs past the end of the message`);
  return end;
}

function readVarint64(r: protobuf.Reader): bigint {
  let value = 0n;
  for (let shift = 0n; shift < 70n; shift += 7n) {
    if (r.pos >= r.len) throw malformed("the message ends inside a varint");
    const byte = r.buf[r.pos++];
    value |= BigInt(byte & 0x7f) << shift;
    if (byte < 0x80) return BigInt.asUintN(64, value);
  }
  throw malformed("a varint is longer than 10 bytes");
}

function readKind(kind: Kind, r: protobuf.Reader, field: FieldPlan, depth: number): unknown {
  switch (kind) {
    case "uint32":
      return r.uint32();
    case "enum":
      return r.int32();
    case "uint64":
      return readVarint64(r);
    case "int64":
      return BigInt.asIntN(64, readVarint64(r));
    case "sint64": {
      const zigzag = readVarint64(r);
      return (zigzag >> 1n) ^ -(zigzag & 1n);
    }
    case "double":
      return r.double();
    case "bool":
      return readVarint64(r) !== 0n;
    case "string": {
      const end = delimitedEnd(r);
      try {
        return utf8.decode(r.buf.subarray(r.pos, r.pos = end));
      } catch {
        throw malformed(`${field.fullName} is not valid UTF-8`);
      }
    }
    case "bytes": {
      const end = delimitedEnd(r);
      return r.buf.subarray(r.pos, r.pos = end);
    }
    default:
      return readMessage(kind, r, delimitedEnd(r), depth + 1);
  }
}

function skipUnknown(r: protobuf.Reader, wireType: number): void {
  if (wireType === 3 || wireType === 4) {
    throw malformed(`wire type ${wireType} (a group) is not part of the ${PROTO_PACKAGE} schema`);
  }
  r.skipType(wireType);
}

function expectWireType(field: FieldPlan, wireType: number, expected: number): void {
  if (wireType !== expected) {
    throw malformed(
      `${field.fullName} arrived with wire type ${wireType}, its type has wire type ${expected}`,
    );
  }
}

function readMapEntry(field: FieldPlan, r: protobuf.Reader, depth: number): [string, unknown] {
  const end = delimitedEnd(r);
  let key = "";
  let value: unknown = undefined;
  while (r.pos < end) {
    const tag = r.uint32();
    const wireType = tag & 7;
    if (tag >>> 3 === 1) {
      expectWireType(field, wireType, LENGTH_DELIMITED);
      key = readKind("string", r, field, depth) as string;
    } else if (tag >>> 3 === 2) {
      expectWireType(field, wireType, wireTypeOf(field.kind));
      value = readKind(field.kind, r, field, depth);
    } else {
      skipUnknown(r, wireType);
    }
    if (r.pos > end) throw malformed(`an entry of ${field.fullName} runs past its length`);
  }
  if (value === undefined) value = defaultOf(field.kind, r, depth);
  return [key, value];
}

function defaultOf(kind: Kind, r: protobuf.Reader, depth: number): unknown {
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

function readField(field: FieldPlan, wireType: number, r: protobuf.Reader, out: Fields, depth: number): void {
  switch (field.label) {
    case "map":
      expectWireType(field, wireType, LENGTH_DELIMITED);
      append(out, field.name, readMapEntry(field, r, depth));
      return;
    case "repeated":
      if (wireType === LENGTH_DELIMITED && isPackable(field.kind)) {
        const end = delimitedEnd(r);
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
      for (const sibling of field.siblings) delete out[sibling];
      out[field.name] = readKind(field.kind, r, field, depth);
  }
}

function readMessage(plan: MessagePlan, r: protobuf.Reader, end: number, depth: number): Fields {
  if (depth > MAX_DEPTH) throw malformed(`messages nest deeper than ${MAX_DEPTH} levels`);
  const out: Fields = {};
  while (r.pos < end) {
    const tag = r.uint32();
    const id = tag >>> 3;
    if (id === 0) throw malformed(`${plan.name} holds a field numbered 0, which protobuf forbids`);
    const field = plan.byId.get(id);
    if (field === undefined) skipUnknown(r, tag & 7);
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
  const view = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const reader = new protobuf.Reader(view);
  try {
    return readMessage(PLANS[name], reader, reader.len, 0) as RawMessages[K];
  } catch (error) {
    if (error instanceof DecodeError) throw error;
    const detail = error instanceof Error ? error.message : String(error);
    const wrapped = malformed(`cannot decode ${PROTO_PACKAGE}.${name}: ${detail}`);
    (wrapped as { cause?: unknown }).cause = error;
    throw wrapped;
  }
}

function toLong(value: bigint): protobuf.Long {
  const bits = BigInt.asUintN(64, value);
  return { low: Number(bits & 0xffffffffn) | 0, high: Number(bits >> 32n) | 0, unsigned: true };
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
      return (value as Uint8Array).byteLength === 0;
  }
}

function writeScalar(kind: ScalarKind, value: unknown, w: protobuf.Writer, field: FieldPlan): void {
  switch (kind) {
    case "uint32":
      w.uint32(value as number);
      return;
    case "enum":
      w.int32(value as number);
      return;
    case "uint64":
    case "int64":
      w.uint64(toLong(value as bigint));
      return;
    case "sint64":
      w.sint64(toLong(value as bigint));
      return;
    case "double":
      w.double(value as number);
      return;
    case "bool":
      w.bool(value as boolean);
      return;
    case "string":
      if (!(value as string).isWellFormed()) {
        throw new SchemaError(
          `a string for ${field.fullName} is not well-formed Unicode: it holds a lone surrogate`,
          "repair the string (String.prototype.toWellFormed) before it is published",
        );
      }
      w.string(value as string);
      return;
    case "bytes":
      w.bytes(value as Uint8Array);
  }
}

function writeTagged(
  kind: Kind,
  id: number,
  value: unknown,
  w: protobuf.Writer,
  field: FieldPlan,
  depth: number,
) {
  w.uint32((id << 3) | wireTypeOf(kind));
  if (typeof kind === "string") {
    writeScalar(kind, value, w, field);
  } else {
    w.fork();
    writeMessage(kind, value as Fields, w, depth + 1);
    w.ldelim();
  }
}

function writeMessage(plan: MessagePlan, message: Fields, w: protobuf.Writer, depth: number): void {
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
      case "map":
        for (const [key, item] of value as RawEntries) {
          w.uint32((field.id << 3) | LENGTH_DELIMITED).fork();
          writeTagged("string", 1, key, w, field, depth);
          writeTagged(field.kind, 2, item, w, field, depth);
          w.ldelim();
        }
        break;
      case "repeated": {
        const items = value as readonly unknown[];
        if (items.length === 0) break;
        if (typeof field.kind === "string" && isPackable(field.kind)) {
          w.uint32((field.id << 3) | LENGTH_DELIMITED).fork();
          for (const item of items) writeScalar(field.kind, item, w, field);
          w.ldelim();
        } else {
          for (const item of items) writeTagged(field.kind, field.id, item, w, field, depth);
        }
        break;
      }
      case "single":
        if (field.presence || !isDefault(field.kind as ScalarKind, value)) {
          writeTagged(field.kind, field.id, value, w, field, depth);
        }
    }
  }
}

/**
 * Writes one message of type `name`. The result owns its whole `ArrayBuffer` (offset 0, no pool sharing),
 * so it can be transferred to a worker.
 *
 * @throws SchemaError when a string is not well-formed Unicode or messages nest deeper than
 * {@link MAX_DEPTH}.
 */
export function encodeMessage<K extends MessageName>(name: K, message: RawMessages[K]): Uint8Array {
  const writer = protobuf.Writer.create();
  writeMessage(PLANS[name], message as Fields, writer, 0);
  const written = writer.finish();
  if (written.byteOffset === 0 && written.byteLength === written.buffer.byteLength) {
    return new Uint8Array(written.buffer, 0, written.byteLength);
  }
  const owned = new Uint8Array(written.byteLength);
  owned.set(written);
  return owned;
}
