/**
 * Writing videoflow.v1 messages with protobufjs: its generated encoders (`Type.encode`, from the
 * reflection in `schema.ts`) queue a message's fields on a {@link MessageWriter} in field-number order,
 * and {@link finish} writes them into one allocation of exactly their size. `bytes` fields are queued by
 * reference and copied once, when the message is finished, so a frame's pixels are copied once, straight
 * into the envelope ({@link appendWriter} puts a queued payload message in place as an envelope's `payload`
 * field without writing it twice). A queue is finished once. A 720p bgr8 frame envelope so took 167 µs,
 * beside 153 µs for a bare copy of its pixels into a new array of the envelope's size and 287 µs for
 * protobufjs's `Frame.encode` then `Envelope.encode` (the pixels copied twice; best of 60 rounds on 2 loaded
 * cores, `bench/codec_bench.ts`'s "encode 720p frame envelope").
 *
 * protobufjs writes what it is given: the messages here ({@link PbValue}, {@link PbTensor} ...) carry only
 * what the wire holds, each implicit-presence field left out at its default (proto3), 64-bit integers as
 * {@link Int64}, maps as objects whose keys are written in `Object.keys` order, and every string checked by
 * {@link wellFormed} first (protobufjs would write a lone surrogate as bytes that are not UTF-8).
 *
 * @module
 */

// @ts-types="protobufjs/light.d.ts"
import protobuf from "protobufjs/dist/light/protobuf.min.js";
import { claimGiven, isGivenWhole } from "../core/bytes.ts";
import { SchemaError } from "../core/errors.ts";
import { MAX_MESSAGE_BYTES, MESSAGE_TYPES, type MessageName, PROTO_PACKAGE } from "./schema.ts";

/** A 64-bit integer as protobufjs writes it: a safe integer, or its low and high 32 bits (two's complement). */
export type Int64 = number | { readonly low: number; readonly high: number };

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/**
 * A bigint within int64 or uint64 as an {@link Int64}: a number while it is safe, else its two 32-bit
 * halves (an int64 below 0 as its two's complement, as the wire carries it).
 */
export function int64(value: bigint): Int64 {
  if (value >= -MAX_SAFE && value <= MAX_SAFE) return Number(value);
  return { low: Number(BigInt.asUintN(32, value)), high: Number(BigInt.asUintN(32, value >> 32n)) };
}

/** `videoflow.v1.Tensor` as it is written. */
export interface PbTensor {
  readonly shape?: readonly number[];
  readonly dtype?: string;
  readonly data?: Uint8Array;
}

/** A string-keyed map as it is written: an object without a prototype, its keys in `Object.keys` order. */
export type PbMap = Readonly<Record<string, PbValue>>;

/** `videoflow.v1.Value` as it is written: exactly one member of its `kind` oneof set. */
export interface PbValue {
  readonly null_value?: 0;
  readonly double_value?: number;
  readonly int_value?: Int64;
  readonly string_value?: string;
  readonly bytes_value?: Uint8Array;
  readonly bool_value?: boolean;
  readonly list_value?: { readonly values: readonly PbValue[] };
  readonly map_value?: { readonly fields: PbMap };
  readonly tensor_value?: PbTensor;
}

/** `videoflow.v1.Frame` as it is written. */
export interface PbFrame {
  readonly pixels: PbTensor;
  readonly pixel_format?: string;
  readonly capture_ts?: number;
}

/** `videoflow.v1.Detections` as it is written. */
export interface PbDetections {
  readonly boxes: PbTensor;
  readonly class_names?: readonly string[];
}

/** `videoflow.v1.Tracks` as it is written. */
export interface PbTracks {
  readonly tracks: PbTensor;
}

/** `videoflow.v1.BlobRef` as it is written. */
export interface PbBlobRef {
  readonly ref?: string;
  readonly inner_payload_type?: string;
  readonly size?: Int64;
}

/** `videoflow.v1.Envelope` as it is written, but for `payload_type` and `payload` (see {@link appendPayload}). */
export interface PbEnvelopeHeader {
  readonly v?: number;
  readonly type?: number;
  readonly producer_name?: string;
  readonly flow_id?: string;
  readonly run_id?: string;
  readonly trace_id?: string;
  readonly seq?: Int64;
  readonly event_ts?: number;
  readonly span_id?: string;
  readonly parent_span_id?: string;
  readonly replica_id?: number;
  readonly metadata?: PbMap;
}

/** Each message as it is written, by its short name. */
export interface PbMessages {
  readonly Envelope: PbEnvelopeHeader;
  readonly Value: PbValue;
  readonly Tensor: PbTensor;
  readonly Frame: PbFrame;
  readonly Detections: PbDetections;
  readonly Tracks: PbTracks;
  readonly BlobRef: PbBlobRef;
}

/** Where {@link finish} writes. */
export interface EncodeOptions {
  /**
   * Returns a `Uint8Array` of exactly `size` bytes for the message to be written into (a view onto a
   * SharedArrayBuffer, a slot of a ring buffer ...); every byte of it is overwritten. By default a new
   * `Uint8Array` of its own.
   */
  readonly allocate?: (size: number) => Uint8Array;
}

/** The array {@link finish} has checked and hands to protobufjs's `finish`; `null` outside it. */
let destination: Uint8Array | null = null;

/**
 * A protobufjs writer whose `finish` writes into the array {@link finish} gives it: one that owns its whole
 * `ArrayBuffer` or the caller's allocation, never a piece of protobufjs's shared pool (which a transfer to
 * a worker would detach from under every other message in it).
 */
export class MessageWriter extends protobuf.Writer {
  /** The array {@link finish} prepared for `size` bytes. @throws RangeError outside {@link finish}. */
  static override alloc(size: number): Uint8Array {
    if (destination === null || destination.byteLength !== size) {
      throw new RangeError("a MessageWriter is finished through finish(), which allocates its bytes");
    }
    return destination;
  }
}

/** Queues `message` as a `name` on `writer` (a new one by default) and returns the writer. */
export function writeMessage<K extends MessageName>(
  name: K,
  message: PbMessages[K],
  writer: MessageWriter = new MessageWriter(),
): MessageWriter {
  MESSAGE_TYPES[name].encode(message, writer);
  return writer;
}

const ENVELOPE_FIELDS = MESSAGE_TYPES.Envelope.fields;
const PAYLOAD_TYPE_TAG = (ENVELOPE_FIELDS.payload_type.id << 3) | 2;
const PAYLOAD_TAG = (ENVELOPE_FIELDS.payload.id << 3) | 2;

/**
 * Queues an envelope's last two fields, `payload_type` and `payload`, after its header
 * ({@link writeMessage}`("Envelope", ...)`), each left out when empty: the payload's bytes as they are, or a
 * payload message queued on a writer of its own, put in place without being written twice.
 */
export function appendPayload(
  writer: MessageWriter,
  payloadType: string,
  payload: Uint8Array | MessageWriter,
): void {
  if (payloadType !== "") {
    writer.uint32(PAYLOAD_TYPE_TAG).string(wellFormed(payloadType, "Envelope.payload_type"));
  }
  if (payload instanceof Uint8Array) {
    if (payload.byteLength > 0) writer.uint32(PAYLOAD_TAG).bytes(payload);
  } else if (payload.len > 0) {
    appendWriter(writer.uint32(PAYLOAD_TAG).uint32(payload.len), payload);
  }
}

/** protobufjs's queue of operations: a no-op head, each operation linked to the next. */
interface Operation {
  next: Operation | undefined;
  /** Writes `val` into `buf` at `pos`. */
  fn: (val: unknown, buf: Uint8Array, pos: number) => void;
  /** The bytes the operation writes. */
  len: number;
  val: unknown;
}

/** What a `bytes` field already in place needs written: nothing. */
function inPlace(): void {}

/**
 * Where `writer`'s message can be written in place: around the first `bytes` field that lies in a buffer
 * given up whole (`giveWhole` in `src/core/bytes.ts`) with room enough before and after it, the field's operation then a
 * no-op (its bytes are where they belong). `null` when no field can; the buffer is claimed otherwise.
 */
function inPlaceDestination(writer: MessageWriter): Uint8Array | null {
  let pos = 0;
  for (let op = (writer.head as Operation).next; op !== undefined; op = op.next) {
    const val = op.val;
    if (val instanceof Uint8Array && val.byteLength === op.len && val.byteLength > 0) {
      const start = val.byteOffset - pos;
      if (
        start >= 0 && start + writer.len <= val.buffer.byteLength && isGivenWhole(val.buffer) &&
        claimGiven(val.buffer)
      ) {
        op.fn = inPlace;
        return new Uint8Array(val.buffer, start, writer.len);
      }
    }
    pos += op.len;
  }
  return null;
}

/**
 * Puts everything queued on `source` at the end of `target`'s queue, as protobufjs's own `ldelim` moves a
 * forked queue: the operations are moved, not copied. A queue is written once: nothing may be queued on
 * `target` afterwards (it would land on `source` too; an envelope's payload is its last field), and
 * `source` is spent once `target` is finished (protobufjs's 64-bit operations change as they write).
 */
export function appendWriter(target: MessageWriter, source: MessageWriter): void {
  if (source.len === 0) return;
  (target.tail as Operation).next = (source.head as Operation).next;
  target.tail = source.tail;
  target.len += source.len;
}

/**
 * Writes everything queued on `writer` into one allocation of exactly its size, each `bytes` field copied
 * once. By default a new `Uint8Array` that owns its whole `ArrayBuffer` (offset 0, no pool sharing), so it
 * can be transferred to a worker; with `options.allocate` the array that returned. But a message with a
 * `bytes` field held in a buffer given up whole (`giveWhole` in `src/core/bytes.ts`: a decoder's frame,
 * made with `ENVELOPE_HEADROOM` bytes before it and `ENVELOPE_TAILROOM` after it) is written around that
 * field in place, into a view of that buffer, and the field is not copied at all; the buffer stays given
 * up whole, so a sender may move it. A 720p frame's envelope so took 22 µs beside 623 µs copied into a new
 * array (means on 2 loaded cores, `bench/codec_bench.ts`'s "encode 720p frame envelope"). `typeName`, the message's fully qualified type name, names it in an
 * error.
 *
 * @throws SchemaError when the message would exceed {@link MAX_MESSAGE_BYTES}; nothing is allocated then.
 * @throws RangeError when `options.allocate` returns an array of another size than it was asked for.
 */
export function finish(writer: MessageWriter, typeName: string, options: EncodeOptions = {}): Uint8Array {
  const size = writer.len;
  if (size > MAX_MESSAGE_BYTES) {
    throw new SchemaError(
      `a ${typeName} of ${size} bytes exceeds protobuf's limit of ${MAX_MESSAGE_BYTES} bytes`,
      "offload the payload to the blob store (a BlobRef) or split it",
    );
  }
  const out = inPlaceDestination(writer) ??
    (options.allocate ? options.allocate(size) : new Uint8Array(size));
  if (out.byteLength !== size) {
    throw new RangeError(
      `allocate(${size}) returned ${out.byteLength} bytes; it must return exactly ${size}`,
    );
  }
  destination = out;
  try {
    return writer.finish();
  } finally {
    destination = null;
  }
}

/**
 * `value`, checked to be well-formed Unicode, as a string field of `field` (`Message.field`) is written.
 *
 * @throws SchemaError when it holds a lone surrogate, naming the field.
 */
export function wellFormed(value: string, field: string): string {
  if (value.isWellFormed()) return value;
  throw new SchemaError(
    `a string for ${PROTO_PACKAGE}.${field} is not well-formed Unicode: it holds a lone surrogate`,
    "repair the string (String.prototype.toWellFormed) before it is published",
  );
}

/**
 * A message of type `name` written into one allocation of exactly its size ({@link finish}'s rules):
 * `finish(writeMessage(name, message), typeName, options)`.
 *
 * @throws SchemaError when the message would exceed {@link MAX_MESSAGE_BYTES}.
 * @throws RangeError when `options.allocate` returns an array of another size than it was asked for.
 */
export function encodeMessage<K extends MessageName>(
  name: K,
  message: PbMessages[K],
  options?: EncodeOptions,
): Uint8Array {
  return finish(writeMessage(name, message), `${PROTO_PACKAGE}.${name}`, options);
}
