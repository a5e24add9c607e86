/**
 * The values a videoflow v4 payload or metadata entry carries, as TypeScript holds them.
 *
 * A {@link WireValue} maps one to one onto `videoflow.v1.Value`, with one rule for numbers, since a JS
 * number cannot say whether it was an int or a double:
 *
 * - a `number` holding a safe integer (|n| ≤ 2^53 − 1, not `-0`) is an `int_value`;
 * - any other `number` (fractional, `-0`, `NaN`, ±`Infinity`, integral beyond 2^53) is a `double_value`;
 * - a `bigint` is an `int_value` (it must fit int64);
 * - a {@link WireDouble} is a `double_value` whatever it holds: what a whole-valued double, Python's
 *   `2.0`, decodes to, so it is re-encoded as a double.
 *
 * Decoding gives the canonical form: an `int_value` is a `number` when safe, else a `bigint`; a
 * `double_value` is a `number`, or a {@link WireDouble} when a bare number would re-encode as an int. A
 * decoded value therefore re-encodes to the same bytes.
 *
 * @module
 */

import { SchemaError } from "../core/errors.ts";

/** A double that stays a `double_value` on the wire even when it holds a whole number. */
export class WireDouble {
  /** Wraps `value`, which then always encodes as a `double_value`. */
  constructor(readonly value: number) {}

  /** The number, so arithmetic and comparison (`<`, `+`) work on it directly. */
  valueOf(): number {
    return this.value;
  }

  /** The number, for `JSON.stringify`. */
  toJSON(): number {
    return this.value;
  }
}

/** Bytes per element of every dtype whose size is known (numpy names, little-endian, C order). */
export const DTYPE_ITEMSIZE = {
  bool: 1,
  uint8: 1,
  int8: 1,
  uint16: 2,
  int16: 2,
  float16: 2,
  uint32: 4,
  int32: 4,
  float32: 4,
  uint64: 8,
  int64: 8,
  float64: 8,
  complex64: 8,
  complex128: 16,
} as const;
/** A dtype whose element size is known, so a tensor's byte length can be checked. */
export type KnownDtype = keyof typeof DTYPE_ITEMSIZE;

const VIEWS = {
  bool: Uint8Array,
  uint8: Uint8Array,
  int8: Int8Array,
  uint16: Uint16Array,
  int16: Int16Array,
  float16: Float16Array,
  uint32: Uint32Array,
  int32: Int32Array,
  float32: Float32Array,
  uint64: BigUint64Array,
  int64: BigInt64Array,
  float64: Float64Array,
} as const;
/** A dtype a tensor can be viewed as a typed array of: every known-size dtype but the complex ones. */
export type ViewDtype =
  | "bool"
  | "uint8"
  | "int8"
  | "uint16"
  | "int16"
  | "float16"
  | "uint32"
  | "int32"
  | "float32"
  | "uint64"
  | "int64"
  | "float64";
/** The typed array {@link Tensor.view} returns, one per {@link ViewDtype} (`bool` reads as `Uint8Array`). */
export type TensorView =
  | Uint8Array<ArrayBuffer>
  | Int8Array<ArrayBuffer>
  | Uint16Array<ArrayBuffer>
  | Int16Array<ArrayBuffer>
  | Float16Array<ArrayBuffer>
  | Uint32Array<ArrayBuffer>
  | Int32Array<ArrayBuffer>
  | Float32Array<ArrayBuffer>
  | BigUint64Array<ArrayBuffer>
  | BigInt64Array<ArrayBuffer>
  | Float64Array<ArrayBuffer>;

function isKnownDtype(dtype: string): dtype is KnownDtype {
  return Object.hasOwn(DTYPE_ITEMSIZE, dtype);
}

function isViewDtype(dtype: string): dtype is ViewDtype {
  return Object.hasOwn(VIEWS, dtype);
}

/**
 * What is wrong with a tensor made of these parts, or `null` when nothing is: the dtype is non-empty,
 * every dimension a safe non-negative integer, and, for a {@link KnownDtype}, the data exactly
 * `product(shape) × itemsize` bytes. A dtype of unknown size is carried as is.
 */
export function tensorProblem(shape: readonly number[], dtype: string, byteLength: number): string | null {
  if (dtype === "") return "a tensor needs a dtype";
  const bad = shape.find((dim) => !Number.isSafeInteger(dim) || dim < 0);
  if (bad !== undefined) {
    return `tensor shape [${shape.join(", ")}] has a dimension that is not a size: ${bad}`;
  }
  if (!isKnownDtype(dtype)) return null;
  // In doubles while the product stays safe (then it is exact: it only grows, or is 0), else in bigints.
  const product = shape.reduce((n, dim) => n * dim, DTYPE_ITEMSIZE[dtype]);
  const needed = Number.isSafeInteger(product)
    ? product
    : shape.reduce((n, dim) => n * BigInt(dim), 1n) * BigInt(DTYPE_ITEMSIZE[dtype]);
  if (needed === byteLength) return null;
  return `a ${dtype} tensor of shape [${shape.join(", ")}] holds ${needed} bytes, its data has ${byteLength}`;
}

/** A typed array {@link Tensor.from} accepts. */
export type TensorSource = TensorView | Uint8ClampedArray;

const SOURCE_DTYPES: ReadonlyArray<readonly [abstract new (...args: never[]) => TensorSource, ViewDtype]> = [
  [Uint8Array, "uint8"],
  [Uint8ClampedArray, "uint8"],
  [Int8Array, "int8"],
  [Uint16Array, "uint16"],
  [Int16Array, "int16"],
  [Float16Array, "float16"],
  [Uint32Array, "uint32"],
  [Int32Array, "int32"],
  [Float32Array, "float32"],
  [BigUint64Array, "uint64"],
  [BigInt64Array, "int64"],
  [Float64Array, "float64"],
];

/**
 * An n-dimensional array: a numpy array on the reference side, `videoflow.v1.Tensor` on the wire. `data`
 * is the raw C-contiguous little-endian bytes; {@link Tensor.view} reads them as a typed array.
 */
export class Tensor {
  /** The size of each dimension, outermost first; a copy of what the constructor was given. */
  readonly shape: readonly number[];

  /**
   * A tensor of `dtype` (a numpy name) whose `data` holds the raw C-contiguous little-endian bytes.
   *
   * @throws SchemaError when {@link tensorProblem} finds the parts inconsistent.
   */
  constructor(shape: readonly number[], readonly dtype: string, readonly data: Uint8Array) {
    const problem = tensorProblem(shape, dtype, data.byteLength);
    if (problem !== null) {
      throw new SchemaError(problem, "build the tensor from a shape, dtype and data that agree", { dtype });
    }
    this.shape = [...shape];
  }

  /**
   * A tensor over a typed array's own bytes (no copy), 1-D unless `shape` says otherwise.
   *
   * @example Tensor.from(new Float32Array([1, 2, 3, 4]), [2, 2]).dtype === "float32"
   */
  static from(array: TensorSource, shape: readonly number[] = [array.length]): Tensor {
    const dtype = SOURCE_DTYPES.find(([type]) => array instanceof type)![1];
    return new Tensor(shape, dtype, new Uint8Array(array.buffer, array.byteOffset, array.byteLength));
  }

  /**
   * The elements as a typed array of the dtype (`bool` reads as `Uint8Array`). A view onto `data` when
   * its offset is aligned to the element size, else a copy.
   *
   * @throws SchemaError for a dtype JavaScript has no typed array for (complex64, a string dtype ...).
   */
  view(): TensorView {
    const dtype = this.dtype;
    if (!isViewDtype(dtype)) {
      throw new SchemaError(
        `a ${dtype} tensor has no typed-array view`,
        "read tensor.data, the raw little-endian bytes, directly",
        { dtype },
      );
    }
    const View = VIEWS[dtype];
    const data = this.data.byteOffset % View.BYTES_PER_ELEMENT === 0 ? this.data : this.data.slice();
    return new View(data.buffer as ArrayBuffer, data.byteOffset, data.byteLength / View.BYTES_PER_ELEMENT);
  }
}

/** A string-keyed map of values, `videoflow.v1.Value.map_value`; insertion order is wire order. */
export interface WireMap {
  /** The value under a key. */
  readonly [key: string]: WireValue;
}

/** Anything `videoflow.v1.Value` carries; see the module doc for how numbers map. */
export type WireValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | Uint8Array
  | WireDouble
  | Tensor
  | readonly WireValue[]
  | WireMap;

/**
 * A {@link WireMap} from entries, in their order. Every key becomes an own property, `__proto__`
 * included; a later duplicate key replaces the earlier value, as protobuf's map semantics say.
 */
export function wireMap(entries: Iterable<readonly [string, WireValue]>): WireMap {
  const map: Record<string, WireValue> = {};
  for (const [key, value] of entries) {
    // Only `__proto__` needs defining: assigning it would set the prototype instead.
    if (key === "__proto__") {
      Object.defineProperty(map, key, { value, enumerable: true, writable: true, configurable: true });
    } else {
      map[key] = value;
    }
  }
  return map;
}

/** `videoflow.v1.Frame`: an image and how its pixels are laid out. */
export class Frame {
  /** A frame of `pixels` (height × width × channels) laid out as `pixelFormat`. */
  constructor(
    readonly pixels: Tensor,
    /** bgr8, rgb8, gray8 ... */
    readonly pixelFormat: string,
    /** Capture time in epoch seconds; `null` when unknown. */
    readonly captureTs: number | null = null,
  ) {}
}

/** `videoflow.v1.Detections`: boxes n × 6 (x1 y1 x2 y2 score class_id) and the class names. */
export class Detections {
  /** Detections of `boxes` (n × 6), with `classNames` indexed by class_id. */
  constructor(readonly boxes: Tensor, readonly classNames: readonly string[] = []) {}
}

/** `videoflow.v1.Tracks`: n × 5 (x1 y1 x2 y2 track_id). */
export class Tracks {
  /** Tracks of `tracks` (n × 5). */
  constructor(readonly tracks: Tensor) {}
}

/** `videoflow.v1.BlobRef`: a payload offloaded to the blob store, by key. */
export class BlobRef {
  /** A reference to `size` bytes of `innerPayloadType` stored under `ref`. */
  constructor(
    /** The store-local key. */
    readonly ref: string,
    /** The payload type of the offloaded bytes. */
    readonly innerPayloadType: string,
    /** Size of the offloaded bytes: a number when ≤ 2^53 − 1, else a bigint. */
    readonly size: number | bigint,
  ) {}
}

/**
 * A payload carried without being decoded: a type this runtime does not know (never an error), or bytes
 * relayed as they arrived. Encoding it writes `payloadType` and `data` unchanged.
 */
export class OpaquePayload {
  /** Bytes `data` of type `payloadType`, kept exactly as given. */
  constructor(readonly payloadType: string, readonly data: Uint8Array) {}
}

/** Everything a data message can carry: a value, a record type of the schema, or opaque bytes. */
export type WirePayload = WireValue | Frame | Detections | Tracks | BlobRef | OpaquePayload;
