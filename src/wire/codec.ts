/**
 * The videoflow wire codec, envelope version 4: {@link Envelope} records to and from the bytes a reference
 * (Python) worker reads and writes, payloads to and from {@link WirePayload} values (WIRE.md's payload
 * rules), the ABORT marker's error record, and the JSON view `vf decode` prints.
 *
 * Writing goes through protobufjs (`writer.ts`): the codec turns a record into the message protobufjs
 * writes, with only what the wire holds. Reading goes through the validating reader (`reader.ts`). A
 * frame's pixels are copied once on encode, straight into the envelope's bytes (the Frame is queued in
 * place as the `payload` field), and not at all on decode: a decoded payload, and the tensor data in it,
 * are views into the envelope's bytes.
 *
 * Integers of 64 bits (`seq`, `int_value`, `BlobRef.size`) are a `number` when they are safe
 * (|n| ≤ 2^53 − 1) and a `bigint` beyond, on decode; either is accepted on encode. See `value.ts` for how
 * ints and doubles stay distinct.
 *
 * @module
 */

import { isPlainObject, isRecord } from "../core/checks.ts";
import { DecodeError, type ErrorRecord, EXIT_FLOW_FAILED, SchemaError } from "../core/errors.ts";
import type { JsonValue } from "../core/node.ts";
import { MsgType, type Seq } from "./identities.ts";
import { decodeMessage, type RawEntries, type RawMessages, type RawTensor, type RawValue } from "./reader.ts";
import { enumValues, MAX_DEPTH, type MessageName, PROTO_PACKAGE } from "./schema.ts";
import {
  appendPayload,
  appendWriter,
  finish,
  type Int64,
  int64,
  MessageWriter,
  type PbMap,
  type PbMessages,
  type PbTensor,
  type PbValue,
  wellFormed,
  writeMessage,
} from "./writer.ts";
import {
  BlobRef,
  Detections,
  Frame,
  OpaquePayload,
  Tensor,
  tensorProblem,
  Tracks,
  WireDouble,
  type WireMap,
  wireMap,
  type WirePayload,
  type WireValue,
} from "./value.ts";

/** The envelope version this codec reads and writes; every other version is refused. */
export const ENVELOPE_VERSION = 4;

/** The fully qualified payload type names this codec decodes; any other travels opaquely. */
export const PayloadType = {
  tensor: `${PROTO_PACKAGE}.Tensor`,
  value: `${PROTO_PACKAGE}.Value`,
  frame: `${PROTO_PACKAGE}.Frame`,
  detections: `${PROTO_PACKAGE}.Detections`,
  tracks: `${PROTO_PACKAGE}.Tracks`,
  blobRef: `${PROTO_PACKAGE}.BlobRef`,
} as const;
/** A payload type name this codec decodes. */
export type PayloadType = typeof PayloadType[keyof typeof PayloadType];

/** One message on the wire: `videoflow.v1.Envelope` with camelCase fields. */
export interface Envelope {
  /** Always {@link ENVELOPE_VERSION}. */
  readonly v: typeof ENVELOPE_VERSION;
  /** DATA, EOS or ABORT (ABORT rides the EOS subject). */
  readonly type: MsgType;
  /** The name of the node that published the message. */
  readonly producerName: string;
  /** The flow the message belongs to. */
  readonly flowId: string;
  /** The run of the flow the message belongs to. */
  readonly runId: string;
  /** The logical message identity: what joins match on and the message id hashes. */
  readonly traceId: string;
  /** Decoded as a number when ≤ 2^53 − 1, else a bigint. */
  readonly seq: Seq;
  /** Epoch seconds; `null` when absent (never 0 for absent). */
  readonly eventTs: number | null;
  /** The tracing span of this message; `""` when none. */
  readonly spanId: string;
  /** The tracing span this message's span descends from; `""` when none. */
  readonly parentSpanId: string;
  /** The replica of the producer that published the message (uint32). */
  readonly replicaId: number;
  /** User metadata, carried alongside the payload; insertion order is wire order. */
  readonly metadata: WireMap;
  /** Fully qualified type name of `payload`; `""` when there is none (EOS). */
  readonly payloadType: string;
  /** The encoded payload; on decode, a view into the envelope's bytes. */
  readonly payload: Uint8Array;
}

/** What {@link createEnvelope} needs: the identity fields, and any of the rest. */
export type EnvelopeInit =
  & Pick<Envelope, "type" | "producerName" | "flowId" | "runId" | "traceId" | "seq">
  & Partial<Omit<Envelope, "v">>;

/**
 * An envelope with the defaults of every field not given: no event time, empty span ids, replica 0, no
 * metadata, no payload.
 *
 * @example createEnvelope({ type: "eos", producerName: "cam", flowId: "f", runId: "r", traceId: "eos-r0", seq: 9 })
 */
export function createEnvelope(init: EnvelopeInit): Envelope {
  return {
    v: ENVELOPE_VERSION,
    eventTs: null,
    spanId: "",
    parentSpanId: "",
    replicaId: 0,
    metadata: {},
    payloadType: "",
    payload: new Uint8Array(0),
    ...init,
  };
}

/** A payload as an envelope carries it. */
export interface EncodedPayload {
  /** Fully qualified type name of `payload`; `""` for no payload. */
  readonly payloadType: string;
  /** The payload's encoded bytes. */
  readonly payload: Uint8Array;
}

const DECODE_REMEDY = "check that the producer speaks videoflow envelope version 4 (videoflow.v1) and that " +
  "nothing truncated or altered the bytes on the way";
const VERSION_REMEDY = "run every worker of the flow on a videoflow release that speaks envelope version 4 " +
  "(VF_ENVELOPE_VERSION=4), and drain or purge what older workers published";

const MSG_TYPE_NAMES = Object.values(MsgType);
/** envelope.proto's MsgType values, by their names in lower case. */
const MSG_TYPE_CODES: ReadonlyMap<string, number> = new Map(
  Object.entries(enumValues("MsgType")).map(([name, code]) => [name.toLowerCase(), code]),
);

function msgTypeCode(type: MsgType): number {
  const code = MSG_TYPE_CODES.get(type);
  if (!MSG_TYPE_NAMES.includes(type) || code === undefined) {
    throw new SchemaError(
      `unknown message type ${JSON.stringify(type)}`,
      `use one of ${MSG_TYPE_NAMES.join(", ")}`,
    );
  }
  return code;
}

function msgTypeOf(code: number): MsgType {
  const type = MSG_TYPE_NAMES.find((known) => MSG_TYPE_CODES.get(known) === code);
  if (type !== undefined) return type;
  const known = MSG_TYPE_NAMES.map((t) => `${t.toUpperCase()} (${msgTypeCode(t)})`).join(", ");
  throw new DecodeError(
    code === 0
      ? "the envelope's message type is UNSPECIFIED (0), which is never sent"
      : `unknown message type ${code}: this worker knows ${known}`,
    DECODE_REMEDY,
    { msg_type: code },
  );
}

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const INT64_MIN = -(2n ** 63n);
const UINT64_LIMIT = 2n ** 64n;

function canonicalInt(value: bigint): number | bigint {
  return value >= -MAX_SAFE && value <= MAX_SAFE ? Number(value) : value;
}

/** Whether a bare number is an `int_value` on the wire (value.ts's rule): a safe integer other than -0. */
function isWireInt(value: number): boolean {
  return Number.isSafeInteger(value) && !Object.is(value, -0);
}

function canonicalDouble(value: number): number | WireDouble {
  return isWireInt(value) ? new WireDouble(value) : value;
}

function outOfRange(value: number | bigint, min: bigint, limit: bigint): boolean {
  if (typeof value === "number" && !Number.isSafeInteger(value)) return true;
  const big = BigInt(value);
  return big < min || big >= limit;
}

function checkedInteger(value: number | bigint, what: string, min: bigint, limit: bigint): bigint {
  if (outOfRange(value, min, limit)) {
    const range = `[${min}, ${limit - 1n}]`;
    throw new SchemaError(
      `${what} must be an integer in ${range} (a number only while it is a safe integer), got ${value}`,
      `pass ${what} as a whole number, or as a bigint beyond 2^53`,
    );
  }
  return BigInt(value);
}

function uint64(value: number | bigint, what: string): Int64 {
  if (typeof value === "number" && Number.isSafeInteger(value) && value >= 0) return value;
  return int64(checkedInteger(value, what, 0n, UINT64_LIMIT));
}

function uint32(value: number, what: string): number {
  if (Number.isInteger(value) && value >= 0 && value < 2 ** 32) return value;
  return Number(checkedInteger(value, what, 0n, 2n ** 32n));
}

/** A string field as it is written: left out at its default (`""`), else checked to be well-formed. */
function stringField(value: string, field: string): string | undefined {
  return value === "" ? undefined : wellFormed(value, field);
}

function describe(value: unknown): string {
  if (value === undefined) return "undefined";
  if (typeof value !== "object" || value === null) return typeof value;
  const name = value.constructor?.name ?? "object";
  return `${/^[AEIOU]/i.test(name) ? "an" : "a"} ${name}`;
}

const WIRE_VALUE_KINDS =
  "null, a boolean, a number, a bigint, a string, a Uint8Array, a WireDouble, a Tensor, " +
  "an array or a plain object";

function unencodable(value: unknown, path: string): SchemaError {
  let remedy = "convert it first: a Date to epoch seconds or an ISO string, a Map to a plain object";
  if (value === undefined) remedy = "use null for an absent value, or leave the key out";
  else if (ArrayBuffer.isView(value)) remedy = "wrap a typed array in a Tensor (Tensor.from)";
  const what = describe(value);
  return new SchemaError(`cannot encode ${what} at ${path}: a wire value is ${WIRE_VALUE_KINDS}`, remedy, {
    path,
  });
}

function pbTensor(tensor: Tensor): PbTensor {
  const dtype = stringField(tensor.dtype, "Tensor.dtype");
  const { shape, data } = tensor;
  return data.byteLength === 0 ? { shape, dtype } : { shape, dtype, data };
}

/** `map` as a map field (`field`, `Message.field`) writes it: its keys in their order, `__proto__` one of them. */
function pbMap(map: WireMap, path: string, depth: number, field: string): PbMap {
  const fields: Record<string, PbValue> = {};
  for (const key of Object.keys(map)) {
    const value = pbValue(map[key], `${path}.${key}`, depth);
    if (key === "__proto__") {
      Object.defineProperty(fields, key, { value, enumerable: true, writable: true, configurable: true });
    } else fields[wellFormed(key, field)] = value;
  }
  return fields;
}

function pbValue(value: WireValue, path: string, depth: number): PbValue {
  if (depth > MAX_DEPTH) {
    throw new SchemaError(
      `${path} nests deeper than ${MAX_DEPTH} levels (or refers to itself)`,
      "flatten the value: a payload or metadata entry must be a finite tree",
      { path },
    );
  }
  switch (typeof value) {
    case "boolean":
      return { bool_value: value };
    case "number":
      return isWireInt(value) ? { int_value: value } : { double_value: value };
    case "bigint":
      return { int_value: int64(checkedInteger(value, path, INT64_MIN, -INT64_MIN)) };
    case "string":
      return { string_value: wellFormed(value, "Value.string_value") };
    case "object":
      if (value === null) return { null_value: 0 };
      if (value instanceof WireDouble) return { double_value: value.value };
      if (value instanceof Uint8Array) return { bytes_value: value };
      if (value instanceof Tensor) return { tensor_value: pbTensor(value) };
      if (Array.isArray(value)) {
        return { list_value: { values: value.map((item, i) => pbValue(item, `${path}[${i}]`, depth + 1)) } };
      }
      if (isPlainObject(value)) {
        return { map_value: { fields: pbMap(value as WireMap, path, depth + 1, "MapValue.fields") } };
      }
  }
  throw unencodable(value, path);
}

function decodedMap(entries: RawEntries | undefined): WireMap {
  return wireMap((entries ?? []).map(([key, raw]) => [key, decodedValue(raw)]));
}

function checkedTensor(shape: readonly number[], dtype: string, data: Uint8Array, remedy: string): Tensor {
  const problem = tensorProblem(shape, dtype, data.byteLength);
  if (problem !== null) throw new DecodeError(problem, remedy, { dtype });
  return new Tensor(shape, dtype, data);
}

function decodedTensor(raw: RawTensor): Tensor {
  return checkedTensor(
    (raw.shape ?? []).map(Number),
    raw.dtype ?? "",
    raw.data ?? new Uint8Array(0),
    DECODE_REMEDY,
  );
}

function decodedValue(raw: RawValue): WireValue {
  if (raw.nullValue !== undefined) return null;
  if (raw.doubleValue !== undefined) return canonicalDouble(raw.doubleValue);
  if (raw.intValue !== undefined) return canonicalInt(raw.intValue);
  if (raw.stringValue !== undefined) return raw.stringValue;
  if (raw.bytesValue !== undefined) return raw.bytesValue;
  if (raw.boolValue !== undefined) return raw.boolValue;
  if (raw.listValue !== undefined) return (raw.listValue.values ?? []).map(decodedValue);
  if (raw.mapValue !== undefined) return decodedMap(raw.mapValue.fields);
  if (raw.tensorValue !== undefined) return decodedTensor(raw.tensorValue);
  throw new DecodeError(
    `a ${PayloadType.value} has no kind set (a kind from a newer schema?)`,
    "upgrade this worker to the producer's videoflow release",
  );
}

function requiredTensor(raw: RawTensor | undefined, field: string): Tensor {
  if (raw === undefined) throw new DecodeError(`${PROTO_PACKAGE}.${field} is missing`, DECODE_REMEDY);
  return decodedTensor(raw);
}

/**
 * A payload ready to be written: its type name and exact encoded size, known before any of its bytes
 * are written (its message queued on a protobufjs writer, its tensor data referenced, not copied). An
 * envelope writes it in place ({@link encodeEnvelopeWithPayload}), so a Frame's pixels are copied once,
 * straight into the envelope; {@link PreparedPayload.bytes} writes it on its own where standalone bytes are
 * needed (a payload store). Made by {@link preparePayload}. It may be written any number of times: the
 * first write uses the queue measured up front, each later one queues the message again.
 */
export class PreparedPayload {
  /** Fully qualified type name of the payload; `""` for no payload. */
  readonly payloadType: string;
  /** The exact size of the payload's encoding, in bytes: what an envelope's `payload` field holds. */
  readonly byteLength: number;
  /** The payload's bytes as they are (an opaque payload, no payload), or its message to be queued. */
  readonly #content: Uint8Array | (() => MessageWriter);
  /** The message's queue, measured up front and not yet written; `null` once a write has taken it. */
  #queued: MessageWriter | null;

  /** A payload of type `payloadType` whose encoding is `content`: bytes, or a message queued by `queue`. */
  constructor(payloadType: string, content: Uint8Array | (() => MessageWriter)) {
    this.payloadType = payloadType;
    this.#content = content;
    this.#queued = content instanceof Uint8Array ? null : content();
    this.byteLength = this.#queued === null ? (content as Uint8Array).byteLength : this.#queued.len;
  }

  /** The payload's bytes as they are, or its message queued for one write. */
  #take(): Uint8Array | MessageWriter {
    if (this.#content instanceof Uint8Array) return this.#content;
    const queued = this.#queued ?? this.#content();
    this.#queued = null;
    return queued;
  }

  /**
   * The payload's encoded bytes on their own: the bytes given, unchanged, or the message written into a
   * new array of exactly {@link byteLength} that owns its whole `ArrayBuffer` (each call writes a new one).
   *
   * @throws SchemaError when the message would exceed protobuf's 2 GiB limit.
   */
  bytes(): Uint8Array {
    const content = this.#take();
    if (content instanceof Uint8Array) return content;
    const writer = new MessageWriter();
    appendWriter(writer, content);
    return finish(writer, this.payloadType);
  }

  /** Queues the payload as the last two fields of an envelope whose header `writer` holds. */
  appendTo(writer: MessageWriter): void {
    appendPayload(writer, this.payloadType, this.#take());
  }
}

function prepared<K extends MessageName>(name: K, message: PbMessages[K]): PreparedPayload {
  return new PreparedPayload(`${PROTO_PACKAGE}.${name}`, () => writeMessage(name, message));
}

/**
 * A payload's type name and queued encoding, by WIRE.md's payload rules: a {@link Tensor} is a
 * top-level `videoflow.v1.Tensor`; a Frame, Detections, Tracks or BlobRef its own message; an
 * {@link OpaquePayload} its own type and bytes, unchanged; any other {@link WireValue} (scalar, list, map,
 * with tensors nested as `tensor_value`) a `videoflow.v1.Value`; `undefined` no payload (`""`, empty), as
 * EOS carries. Nothing is written yet: tensor data is referenced, not copied, and must not change before
 * the payload is written.
 *
 * @throws SchemaError for a value the wire cannot carry (a Date, `undefined` in a map, a bigint beyond
 * int64, a lone surrogate ...), naming where it is.
 */
export function preparePayload(value: WirePayload | undefined): PreparedPayload {
  if (value === undefined) return new PreparedPayload("", new Uint8Array(0));
  if (value instanceof OpaquePayload) return new PreparedPayload(value.payloadType, value.data);
  if (value instanceof Tensor) return prepared("Tensor", pbTensor(value));
  if (value instanceof Frame) {
    return prepared("Frame", {
      pixels: pbTensor(value.pixels),
      pixel_format: stringField(value.pixelFormat, "Frame.pixel_format"),
      capture_ts: value.captureTs ?? undefined,
    });
  }
  if (value instanceof Detections) {
    return prepared("Detections", {
      boxes: pbTensor(value.boxes),
      class_names: value.classNames.map((name) => wellFormed(name, "Detections.class_names")),
    });
  }
  if (value instanceof Tracks) return prepared("Tracks", { tracks: pbTensor(value.tracks) });
  if (value instanceof BlobRef) {
    const size = uint64(value.size, "BlobRef.size");
    return prepared("BlobRef", {
      ref: stringField(value.ref, "BlobRef.ref"),
      inner_payload_type: stringField(value.innerPayloadType, "BlobRef.inner_payload_type"),
      size: size === 0 ? undefined : size,
    });
  }
  return prepared("Value", pbValue(value, "payload", 0));
}

/**
 * A payload's type name and bytes ({@link preparePayload}'s rules), written on their own: tensor data
 * copied once into a new array of exactly the payload's size; an {@link OpaquePayload}'s bytes unchanged.
 *
 * @throws SchemaError for a value the wire cannot carry (a Date, `undefined` in a map, a bigint beyond
 * int64, a lone surrogate ...), naming where it is.
 */
export function encodePayload(value: WirePayload | undefined): EncodedPayload {
  const payload = preparePayload(value);
  return { payloadType: payload.payloadType, payload: payload.bytes() };
}

/**
 * The value of a payload, the inverse of {@link encodePayload}: `undefined` for no payload, a record for a
 * known type, an {@link OpaquePayload} for any other type (never decoded, never an error). Bytes and
 * tensor data are views into `payload`. A Value holding only a tensor decodes to that Tensor.
 *
 * @throws DecodeError when the bytes are not a well-formed message of a known type, or a payload has
 * bytes but no type.
 */
export function decodePayload(payloadType: string, payload: Uint8Array): WirePayload | undefined {
  try {
    switch (payloadType) {
      case "":
        if (payload.byteLength === 0) return undefined;
        throw new DecodeError(`a payload of ${payload.byteLength} bytes has no payload_type`, DECODE_REMEDY);
      case PayloadType.tensor:
        return decodedTensor(decodeMessage("Tensor", payload));
      case PayloadType.value:
        return decodedValue(decodeMessage("Value", payload));
      case PayloadType.frame: {
        const raw = decodeMessage("Frame", payload);
        return new Frame(
          requiredTensor(raw.pixels, "Frame.pixels"),
          raw.pixelFormat ?? "",
          raw.captureTs ?? null,
        );
      }
      case PayloadType.detections: {
        const raw = decodeMessage("Detections", payload);
        return new Detections(requiredTensor(raw.boxes, "Detections.boxes"), raw.classNames ?? []);
      }
      case PayloadType.tracks:
        return new Tracks(requiredTensor(decodeMessage("Tracks", payload).tracks, "Tracks.tracks"));
      case PayloadType.blobRef: {
        const raw = decodeMessage("BlobRef", payload);
        return new BlobRef(raw.ref ?? "", raw.innerPayloadType ?? "", canonicalInt(raw.size ?? 0n));
      }
      default:
        return new OpaquePayload(payloadType, payload);
    }
  } catch (error) {
    if (error instanceof DecodeError) error.context.payload_type ??= payloadType;
    throw error;
  }
}

/**
 * The bytes of an envelope, written into one allocation of exactly their size (the payload copied once).
 * By default the result owns its whole `ArrayBuffer`, so it can be transferred. With `options.allocate`,
 * the envelope is written into the `Uint8Array` it returns when called with the size (a view onto a
 * SharedArrayBuffer, say), which must be exactly that long; the result is that array.
 *
 * @throws SchemaError when a field is out of its wire range (seq beyond uint64, replica id beyond uint32),
 * the version is not {@link ENVELOPE_VERSION}, or metadata holds a value the wire cannot carry.
 * @throws RangeError when `options.allocate` returns an array of another length than it was asked for.
 */
export function encodeEnvelope(
  env: Envelope,
  options?: { readonly allocate?: (size: number) => Uint8Array },
): Uint8Array {
  return encodeEnvelopeWithPayload(env, new PreparedPayload(env.payloadType, env.payload), options);
}

/** An envelope without its payload: every field but `payloadType` and `payload`. */
export type EnvelopeHeader = Omit<Envelope, "payloadType" | "payload">;

/**
 * The bytes of an envelope that carries a prepared payload, its `payload_type` and `payload` taken from
 * `payload` (those of `env`, if it has them, are not read), written in one pass into one allocation of
 * exactly their size: the payload's message is written in place as the `payload` field, so its tensor
 * data is copied once, straight into the envelope. The bytes are exactly those of
 * {@link encodeEnvelope} given the payload's {@link PreparedPayload.bytes}. `options.allocate` is
 * honoured as by {@link encodeEnvelope}.
 *
 * @throws SchemaError when a field is out of its wire range (seq beyond uint64, replica id beyond uint32),
 * the version is not {@link ENVELOPE_VERSION}, metadata holds a value the wire cannot carry, or the
 * envelope would exceed protobuf's 2 GiB limit.
 * @throws RangeError when `options.allocate` returns an array of another length than it was asked for.
 */
export function encodeEnvelopeWithPayload(
  env: EnvelopeHeader,
  payload: PreparedPayload,
  options?: { readonly allocate?: (size: number) => Uint8Array },
): Uint8Array {
  if (env.v !== ENVELOPE_VERSION) {
    throw new SchemaError(
      `cannot write envelope version ${env.v}`,
      `this codec writes version ${ENVELOPE_VERSION}`,
    );
  }
  const seq = uint64(env.seq, "seq");
  const replicaId = uint32(env.replicaId, "replica_id");
  const writer = writeMessage("Envelope", {
    v: env.v,
    type: msgTypeCode(env.type),
    producer_name: stringField(env.producerName, "Envelope.producer_name"),
    flow_id: stringField(env.flowId, "Envelope.flow_id"),
    run_id: stringField(env.runId, "Envelope.run_id"),
    trace_id: stringField(env.traceId, "Envelope.trace_id"),
    seq: seq === 0 ? undefined : seq,
    event_ts: env.eventTs ?? undefined,
    span_id: stringField(env.spanId, "Envelope.span_id"),
    parent_span_id: stringField(env.parentSpanId, "Envelope.parent_span_id"),
    replica_id: replicaId === 0 ? undefined : replicaId,
    metadata: pbMap(env.metadata, "metadata", 0, "Envelope.metadata"),
  });
  payload.appendTo(writer);
  return finish(writer, `${PROTO_PACKAGE}.Envelope`, options);
}

/** Whether `bytes` open as a msgpack map whose first key is a lower-case name, as legacy envelopes do. */
function looksLikeMsgpack(bytes: Uint8Array): boolean {
  const first = bytes[0];
  const header = first >= 0x80 && first <= 0x8f ? 1 : first === 0xde ? 3 : first === 0xdf ? 5 : 0;
  if (header === 0) return false;
  const keyLength = bytes[header] - 0xa0;
  if (!(keyLength >= 1 && keyLength < 32)) return false;
  const key = bytes.subarray(header + 1, header + 1 + keyLength);
  return key.length === keyLength && key.every((b) => (b >= 0x61 && b <= 0x7a) || b === 0x5f);
}

function legacyEnvelope(): DecodeError {
  return new DecodeError(
    "the bytes look like a legacy msgpack envelope (envelope version 3 or older); this worker reads only " +
      `protobuf envelope version ${ENVELOPE_VERSION}`,
    VERSION_REMEDY,
  );
}

/**
 * The envelope in `bytes`. Metadata is decoded; the payload is left encoded (see {@link decodePayload})
 * as a view into `bytes`, so `bytes` must not change while the envelope is in use.
 *
 * @throws DecodeError for anything else than a version-4 envelope: a legacy msgpack envelope, another
 * version, an UNSPECIFIED or unknown message type, malformed bytes of any kind. Nothing else is thrown.
 */
export function decodeEnvelope(bytes: Uint8Array): Envelope {
  let raw: RawMessages["Envelope"];
  try {
    raw = decodeMessage("Envelope", bytes);
  } catch (error) {
    throw looksLikeMsgpack(bytes) ? legacyEnvelope() : error;
  }
  const v = raw.v ?? 0;
  if (v !== ENVELOPE_VERSION) {
    if (looksLikeMsgpack(bytes)) throw legacyEnvelope();
    throw new DecodeError(
      v === 0
        ? `the envelope carries no version; this worker reads version ${ENVELOPE_VERSION}`
        : `envelope version ${v} is not supported; this worker reads version ${ENVELOPE_VERSION}`,
      VERSION_REMEDY,
      { envelope_version: v },
    );
  }
  return {
    v: ENVELOPE_VERSION,
    type: msgTypeOf(raw.type ?? 0),
    producerName: raw.producerName ?? "",
    flowId: raw.flowId ?? "",
    runId: raw.runId ?? "",
    traceId: raw.traceId ?? "",
    seq: canonicalInt(raw.seq ?? 0n),
    eventTs: raw.eventTs ?? null,
    spanId: raw.spanId ?? "",
    parentSpanId: raw.parentSpanId ?? "",
    replicaId: raw.replicaId ?? 0,
    metadata: decodedMap(raw.metadata),
    payloadType: raw.payloadType ?? "",
    payload: raw.payload ?? new Uint8Array(0),
  };
}

/** What an ABORT marker says: the node that failed first, and its error record (`errorToDict`'s shape). */
export interface AbortMarker {
  /** The node that failed first. */
  readonly node: string;
  /** That node's error, as `toDict()` records it. */
  readonly error: ErrorRecord;
}

/**
 * The payload of an ABORT marker (WIRE.md): a `videoflow.v1.Value` map of the error record's fields
 * (code, type, message, remedy, exit_code, disposition, context ...) plus `node`.
 *
 * @throws SchemaError when the record is not JSON-safe.
 */
export function abortPayload(marker: AbortMarker): EncodedPayload {
  const fields = Object.entries(marker.error).filter(([, value]) => value !== undefined);
  return encodePayload(wireMap([...fields as [string, WireValue][], ["node", marker.node]]));
}

function isWireMap(value: WirePayload | undefined): value is WireMap {
  return !Array.isArray(value) && isPlainObject(value);
}

function plainJson(value: WireValue): unknown {
  if (value instanceof WireDouble) return value.value;
  if (typeof value === "bigint") return value.toString();
  if (value instanceof Uint8Array) return value.toBase64();
  if (value instanceof Tensor) return tensorJson(value);
  if (Array.isArray(value)) return value.map(plainJson);
  if (isWireMap(value)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plainJson(v)]));
  return value;
}

function stringOrNull(value: unknown): string | null {
  return typeof value === "string" ? value : null;
}

/**
 * The marker an ABORT envelope's payload carries, the inverse of {@link abortPayload}. Missing optional
 * fields get their defaults (type = code, remedy and disposition null, exit_code 4, context empty); values
 * come back JSON-safe (bigints as decimal strings, bytes as base64), so the record relays unchanged.
 *
 * @throws DecodeError when the payload is not a Value map with string `node`, `code` and `message`.
 */
export function readAbortPayload(payloadType: string, payload: Uint8Array): AbortMarker {
  const value = decodePayload(payloadType, payload);
  if (!isWireMap(value)) {
    const type = JSON.stringify(payloadType);
    throw new DecodeError(
      `an ABORT marker's payload is not a ${PayloadType.value} map (payload_type ${type})`,
      "publish ABORT markers with abortPayload()",
    );
  }
  const fields = plainJson(value) as Record<string, unknown>;
  const { node, code, type, message, remedy, exit_code, disposition, context, ...rest } = fields;
  if (typeof node !== "string" || typeof code !== "string" || typeof message !== "string") {
    throw new DecodeError(
      "an ABORT marker needs string node, code and message fields",
      "publish ABORT markers with abortPayload()",
    );
  }
  const error: ErrorRecord = {
    ...rest,
    code,
    type: typeof type === "string" ? type : code,
    message,
    remedy: stringOrNull(remedy),
    exit_code: typeof exit_code === "number" ? exit_code : EXIT_FLOW_FAILED,
    disposition: stringOrNull(disposition),
    context: isRecord(context) ? context : {},
  };
  return { node, error };
}

/**
 * An envelope as `vf decode` prints it: WIRE.md's snake_case field names, the shape the golden vectors'
 * manifest describes messages in. Values are tagged: `{"i": 7}` int, `{"d": 2.0}` double, `{"s": ...}`,
 * `{"bool": ...}`, `{"null": true}`, `{"bytes_b64": ...}`, `{"list": [...]}`, `{"map": {...}}`,
 * `{"tensor": {"shape", "dtype", "data_b64"}}`. An int beyond 2^53 − 1 is a decimal string; so is a
 * double JSON cannot spell: `"NaN"`, `"Infinity"`, `"-Infinity"`, `"-0"`. The payload is `{"none": true}`,
 * `{"tensor": ...}`, `{"value": <tagged>}`, `{"frame": ...}`, `{"detections": ...}`, `{"tracks": ...}`,
 * `{"blob_ref": ...}`, `{"opaque": {"payload_type", "data_b64"}}` for an unknown type, or
 * `{"undecodable": {"payload_type", "error", "data_b64"}}` when its bytes are malformed.
 */
export interface EnvelopeJson {
  /** The envelope version, {@link ENVELOPE_VERSION}. */
  readonly v: number;
  /** {@link Envelope.type}. */
  readonly type: MsgType;
  /** {@link Envelope.producerName}. */
  readonly producer_name: string;
  /** {@link Envelope.flowId}. */
  readonly flow_id: string;
  /** {@link Envelope.runId}. */
  readonly run_id: string;
  /** {@link Envelope.traceId}. */
  readonly trace_id: string;
  /** {@link Envelope.seq}: a number, or a decimal string beyond 2^53 − 1. */
  readonly seq: number | string;
  /** {@link Envelope.eventTs}: a number, a string for a double JSON cannot spell, or `null`. */
  readonly event_ts: number | string | null;
  /** {@link Envelope.spanId}. */
  readonly span_id: string;
  /** {@link Envelope.parentSpanId}. */
  readonly parent_span_id: string;
  /** {@link Envelope.replicaId}. */
  readonly replica_id: number;
  /** {@link Envelope.metadata} as a tagged map, `{"map": {...}}`. */
  readonly metadata: JsonValue;
  /** {@link Envelope.payloadType}. */
  readonly payload_type: string;
  /** The decoded payload, tagged as described above. */
  readonly payload: JsonValue;
}

const JSON_REMEDY = "write the envelope as envelopeToJson (vf decode) prints it";

function jsonInt(value: number | bigint): number | string {
  const canonical = typeof value === "bigint" ? canonicalInt(value) : value;
  return typeof canonical === "bigint" ? canonical.toString() : canonical;
}

function jsonDouble(value: number): number | string {
  if (Object.is(value, -0)) return "-0";
  return Number.isFinite(value) ? value : String(value);
}

function tensorJson(tensor: Tensor): JsonValue {
  return { shape: [...tensor.shape], dtype: tensor.dtype, data_b64: tensor.data.toBase64() };
}

function valueToJson(value: WireValue): JsonValue {
  switch (typeof value) {
    case "boolean":
      return { bool: value };
    case "number":
      return isWireInt(value) ? { i: value } : { d: jsonDouble(value) };
    case "bigint":
      return { i: jsonInt(value) };
    case "string":
      return { s: value };
  }
  if (value === null) return { null: true };
  if (value instanceof WireDouble) return { d: jsonDouble(value.value) };
  if (value instanceof Uint8Array) return { bytes_b64: value.toBase64() };
  if (value instanceof Tensor) return { tensor: tensorJson(value) };
  if (Array.isArray(value)) return { list: value.map(valueToJson) };
  return { map: Object.fromEntries(Object.entries(value).map(([k, v]) => [k, valueToJson(v)])) };
}

function payloadValueToJson(value: WirePayload | undefined): JsonValue {
  if (value === undefined) return { none: true };
  if (value instanceof OpaquePayload) {
    return { opaque: { payload_type: value.payloadType, data_b64: value.data.toBase64() } };
  }
  if (value instanceof Tensor) return { tensor: tensorJson(value) };
  if (value instanceof Frame) {
    const captureTs = value.captureTs === null ? null : jsonDouble(value.captureTs);
    return {
      frame: { pixels: tensorJson(value.pixels), pixel_format: value.pixelFormat, capture_ts: captureTs },
    };
  }
  if (value instanceof Detections) {
    return { detections: { boxes: tensorJson(value.boxes), class_names: [...value.classNames] } };
  }
  if (value instanceof Tracks) return { tracks: { tracks: tensorJson(value.tracks) } };
  if (value instanceof BlobRef) {
    const { ref, innerPayloadType, size } = value;
    return { blob_ref: { ref, inner_payload_type: innerPayloadType, size: jsonInt(size) } };
  }
  return { value: valueToJson(value) };
}

function payloadToJson(payloadType: string, payload: Uint8Array): JsonValue {
  try {
    return payloadValueToJson(decodePayload(payloadType, payload));
  } catch (error) {
    if (!(error instanceof DecodeError)) throw error;
    return { undecodable: { payload_type: payloadType, error: error.message, data_b64: payload.toBase64() } };
  }
}

/**
 * The JSON view of an envelope (see {@link EnvelopeJson}); the payload is decoded when its type is known.
 * Never throws for a decoded envelope: a malformed payload shows as `undecodable`.
 */
export function envelopeToJson(env: Envelope): EnvelopeJson {
  return {
    v: env.v,
    type: env.type,
    producer_name: env.producerName,
    flow_id: env.flowId,
    run_id: env.runId,
    trace_id: env.traceId,
    seq: jsonInt(env.seq),
    event_ts: env.eventTs === null ? null : jsonDouble(env.eventTs),
    span_id: env.spanId,
    parent_span_id: env.parentSpanId,
    replica_id: env.replicaId,
    metadata: valueToJson(env.metadata),
    payload_type: env.payloadType,
    payload: payloadToJson(env.payloadType, env.payload),
  };
}

function badJson(path: string, expected: string): DecodeError {
  return new DecodeError(`${path} must be ${expected}`, JSON_REMEDY, { path });
}

type JsonObject = Readonly<Record<string, unknown>>;

function anyJsonObject(json: unknown, path: string): JsonObject {
  if (typeof json !== "object" || json === null || Array.isArray(json)) throw badJson(path, "an object");
  return json as JsonObject;
}

function jsonObject(
  json: unknown,
  path: string,
  keys: readonly string[],
  required: readonly string[],
): JsonObject {
  const object = anyJsonObject(json, path);
  const stranger = Object.keys(object).find((key) => !keys.includes(key));
  if (stranger !== undefined) {
    throw badJson(`${path}.${stranger}`, `absent: the fields are ${keys.join(", ")}`);
  }
  const missing = required.find((key) => !Object.hasOwn(object, key));
  if (missing !== undefined) throw badJson(`${path}.${missing}`, "present");
  return object;
}

function tagged(json: unknown, path: string, tags: readonly string[]): [string, unknown] {
  const object = jsonObject(json, path, tags, []);
  const keys = Object.keys(object);
  if (keys.length !== 1) throw badJson(path, `an object with exactly one of ${tags.join(", ")}`);
  return [keys[0], object[keys[0]]];
}

function jsonString(json: unknown, path: string): string {
  if (typeof json !== "string") throw badJson(path, "a string");
  return json;
}

function jsonBytes(json: unknown, path: string): Uint8Array {
  try {
    return Uint8Array.fromBase64(jsonString(json, path));
  } catch (error) {
    if (error instanceof DecodeError) throw error;
    throw badJson(path, "base64");
  }
}

function jsonInteger(json: unknown, path: string): number | bigint {
  if (typeof json === "number" && Number.isSafeInteger(json)) return json;
  if (typeof json === "string" && /^-?[0-9]+$/.test(json)) return canonicalInt(BigInt(json));
  throw badJson(path, "an integer, or a decimal string beyond 2^53");
}

function jsonNumber(json: unknown, path: string): number {
  if (typeof json === "number") return json;
  if (json === "NaN" || json === "Infinity" || json === "-Infinity" || json === "-0") return Number(json);
  throw badJson(path, 'a number, "NaN", "Infinity", "-Infinity" or "-0"');
}

function jsonArray(json: unknown, path: string): readonly unknown[] {
  if (!Array.isArray(json)) throw badJson(path, "an array");
  return json;
}

function tensorFromJson(json: unknown, path: string): Tensor {
  const object = jsonObject(json, path, ["shape", "dtype", "data_b64"], ["shape", "dtype", "data_b64"]);
  const shape = jsonArray(object.shape, `${path}.shape`).map((dim, i) =>
    jsonNumber(dim, `${path}.shape[${i}]`)
  );
  const data = jsonBytes(object.data_b64, `${path}.data_b64`);
  return checkedTensor(shape, jsonString(object.dtype, `${path}.dtype`), data, JSON_REMEDY);
}

const VALUE_TAGS = ["null", "bool", "i", "d", "s", "bytes_b64", "list", "map", "tensor"] as const;

function valueFromJson(json: unknown, path: string): WireValue {
  const [tag, body] = tagged(json, path, VALUE_TAGS);
  switch (tag as typeof VALUE_TAGS[number]) {
    case "null":
      if (body !== true) throw badJson(`${path}.null`, "true");
      return null;
    case "bool":
      if (typeof body !== "boolean") throw badJson(`${path}.bool`, "a boolean");
      return body;
    case "i": {
      const value = jsonInteger(body, `${path}.i`);
      if (outOfRange(value, INT64_MIN, -INT64_MIN)) throw badJson(`${path}.i`, "within int64");
      return value;
    }
    case "d":
      return canonicalDouble(jsonNumber(body, `${path}.d`));
    case "s":
      return jsonString(body, `${path}.s`);
    case "bytes_b64":
      return jsonBytes(body, `${path}.bytes_b64`);
    case "list":
      return jsonArray(body, `${path}.list`).map((item, i) => valueFromJson(item, `${path}.list[${i}]`));
    case "map":
      return mapFromJson(body, `${path}.map`);
    case "tensor":
      return tensorFromJson(body, `${path}.tensor`);
  }
}

function mapFromJson(json: unknown, path: string): WireMap {
  return wireMap(
    Object.entries(anyJsonObject(json, path)).map((
      [key, item],
    ) => [key, valueFromJson(item, `${path}.${key}`)]),
  );
}

const PAYLOAD_TAGS = [
  "none",
  "value",
  "tensor",
  "frame",
  "detections",
  "tracks",
  "blob_ref",
  "opaque",
  "undecodable",
] as const;

function payloadFromJson(json: unknown, path: string): WirePayload | undefined {
  const [tag, body] = tagged(json, path, PAYLOAD_TAGS);
  const at = `${path}.${tag}`;
  switch (tag as typeof PAYLOAD_TAGS[number]) {
    case "none":
      if (body !== true) throw badJson(at, "true");
      return undefined;
    case "value":
      return valueFromJson(body, at);
    case "tensor":
      return tensorFromJson(body, at);
    case "frame": {
      const o = jsonObject(body, at, ["pixels", "pixel_format", "capture_ts"], ["pixels", "pixel_format"]);
      const captureTs = o.capture_ts === undefined || o.capture_ts === null
        ? null
        : jsonNumber(o.capture_ts, `${at}.capture_ts`);
      return new Frame(
        tensorFromJson(o.pixels, `${at}.pixels`),
        jsonString(o.pixel_format, `${at}.pixel_format`),
        captureTs,
      );
    }
    case "detections": {
      const o = jsonObject(body, at, ["boxes", "class_names"], ["boxes"]);
      const names = jsonArray(o.class_names ?? [], `${at}.class_names`);
      return new Detections(
        tensorFromJson(o.boxes, `${at}.boxes`),
        names.map((name, i) => jsonString(name, `${at}.class_names[${i}]`)),
      );
    }
    case "tracks":
      return new Tracks(tensorFromJson(jsonObject(body, at, ["tracks"], ["tracks"]).tracks, `${at}.tracks`));
    case "blob_ref": {
      const keys = ["ref", "inner_payload_type", "size"];
      const o = jsonObject(body, at, keys, keys);
      return new BlobRef(
        jsonString(o.ref, `${at}.ref`),
        jsonString(o.inner_payload_type, `${at}.inner_payload_type`),
        jsonInteger(o.size, `${at}.size`),
      );
    }
    case "opaque":
    case "undecodable": {
      const keys = tag === "opaque" ? ["payload_type", "data_b64"] : ["payload_type", "error", "data_b64"];
      const o = jsonObject(body, at, keys, ["payload_type", "data_b64"]);
      return new OpaquePayload(
        jsonString(o.payload_type, `${at}.payload_type`),
        jsonBytes(o.data_b64, `${at}.data_b64`),
      );
    }
  }
}

const ENVELOPE_FIELDS = [
  "v",
  "type",
  "producer_name",
  "flow_id",
  "run_id",
  "trace_id",
  "seq",
  "event_ts",
  "span_id",
  "parent_span_id",
  "replica_id",
  "metadata",
  "payload_type",
  "payload",
];
const REQUIRED_ENVELOPE_FIELDS = ["type", "producer_name", "flow_id", "run_id", "trace_id", "seq"];

/**
 * The envelope a JSON view describes, the inverse of {@link envelopeToJson}: `envelopeToJson`'s output
 * comes back as the same envelope, and encodes to the same bytes. Only the identity fields (`type`,
 * `producer_name`, `flow_id`, `run_id`, `trace_id`, `seq`) are required; the rest default as in
 * {@link createEnvelope}, and `payload_type` follows from `payload`.
 *
 * @throws DecodeError for a document not in that shape (an unknown field, a wrong type, a version other
 * than 4, a `payload_type` that contradicts `payload`); SchemaError for a value the wire cannot carry.
 */
export function envelopeFromJson(json: unknown): Envelope {
  const o = jsonObject(json, "envelope", ENVELOPE_FIELDS, REQUIRED_ENVELOPE_FIELDS);
  if (o.v !== undefined && o.v !== ENVELOPE_VERSION) throw badJson("envelope.v", `${ENVELOPE_VERSION}`);
  const type = MSG_TYPE_NAMES.find((known) => known === o.type);
  if (type === undefined) throw badJson("envelope.type", `one of ${MSG_TYPE_NAMES.join(", ")}`);
  const metadata = valueFromJson(o.metadata ?? { map: {} }, "envelope.metadata");
  if (!isWireMap(metadata)) throw badJson("envelope.metadata", 'a tagged map ({"map": {...}})');
  const replicaId = o.replica_id ?? 0;
  if (typeof replicaId !== "number") throw badJson("envelope.replica_id", "a number");
  const { payloadType, payload } = encodePayload(
    payloadFromJson(o.payload ?? { none: true }, "envelope.payload"),
  );
  if (o.payload_type !== undefined && o.payload_type !== payloadType) {
    throw badJson("envelope.payload_type", `${JSON.stringify(payloadType)}, the type of envelope.payload`);
  }
  const optionalString = (key: string) => o[key] === undefined ? "" : jsonString(o[key], `envelope.${key}`);
  return createEnvelope({
    type,
    producerName: jsonString(o.producer_name, "envelope.producer_name"),
    flowId: jsonString(o.flow_id, "envelope.flow_id"),
    runId: jsonString(o.run_id, "envelope.run_id"),
    traceId: jsonString(o.trace_id, "envelope.trace_id"),
    seq: jsonInteger(o.seq, "envelope.seq"),
    eventTs: o.event_ts === undefined || o.event_ts === null
      ? null
      : jsonNumber(o.event_ts, "envelope.event_ts"),
    spanId: optionalString("span_id"),
    parentSpanId: optionalString("parent_span_id"),
    replicaId,
    metadata,
    payloadType,
    payload,
  });
}
