/**
 * {@link JsonlSink}: a sink that appends one JSON line per item to a file, once per input key.
 *
 * ```ts
 * const sink = new JsonlSink({ name: "detections", path: "out/detections.jsonl" }).from(detector);
 * ```
 *
 * @module
 */

import type { RuntimeContext } from "../core/context.ts";
import { diskFailure, NodeContractError, ResourceUnavailable, SchemaError } from "../core/errors.ts";
import type { JsonValue, NodePermissions } from "../core/node.ts";
import { ConsumerNode, EffectGuarantee, refuseParamProblems } from "../core/node.ts";
import {
  BlobRef,
  Detections,
  Frame,
  OpaquePayload,
  Tensor,
  type TensorView,
  Tracks,
  WireDouble,
} from "../wire/value.ts";

/** Params of a {@link JsonlSink}. */
export interface JsonlSinkParams {
  /** The file lines are appended to (created if missing; its directory must exist). */
  readonly path: string;
  /** Sync each line to disk before `consume` returns (default true); false trades that for speed. */
  readonly durable?: boolean;
}

const NEWLINE = 0x0a;

function rows(view: TensorView, width: number): JsonValue[][] {
  const values = Array.from(
    view as ArrayLike<number | bigint>,
    (v) => typeof v === "bigint" ? v.toString() : v,
  );
  const out: JsonValue[][] = [];
  for (let at = 0; at < values.length; at += width) out.push(values.slice(at, at + width));
  return out;
}

function tensorSummary(tensor: Tensor): JsonValue {
  return { type: "tensor", dtype: tensor.dtype, shape: [...tensor.shape] };
}

/**
 * The JSON form of an item, as a line holds it:
 * - `null`, booleans, strings and finite numbers as they are; `undefined` as `null`; `NaN` and ±`Infinity`
 *   as the strings `"NaN"`, `"Infinity"`, `"-Infinity"`; a bigint as its decimal string; a
 *   {@link WireDouble} as its number;
 * - arrays and plain objects member by member;
 * - a {@link Tensor} summarized as `{type: "tensor", dtype, shape}` (no pixel or element data);
 * - a {@link Frame} as `{type: "frame", pixel_format, dtype, shape, capture_ts}`;
 * - {@link Detections} in full, `{type: "detections", boxes: [[x1, y1, x2, y2, score, class_id] ...],
 *   class_names}`, and {@link Tracks} as `{type: "tracks", tracks: [[x1, y1, x2, y2, track_id] ...]}`;
 * - bytes as `{type: "bytes", length}`, a {@link BlobRef} as `{type: "blob_ref", ref,
 *   inner_payload_type, size}`, an {@link OpaquePayload} as `{type: "opaque", payload_type, length}`.
 *
 * Throws {@link SchemaError} for anything else (a function, a symbol, a class instance, a cycle).
 */
export function toJsonLine(value: unknown, ancestors: readonly object[] = []): JsonValue {
  if (value === null || value === undefined) return null;
  if (typeof value === "string" || typeof value === "boolean") return value;
  if (typeof value === "number") return Number.isFinite(value) ? value : String(value);
  if (typeof value === "bigint") return value.toString();
  if (typeof value !== "object") {
    throw new SchemaError(`a ${typeof value} has no JSON form`, "send JSON-like values or wire payloads");
  }
  if (ancestors.includes(value)) {
    throw new SchemaError("the item contains a cycle", "send a tree of values, not a graph");
  }
  const inner = [...ancestors, value];
  if (value instanceof WireDouble) return toJsonLine(value.value);
  if (value instanceof Tensor) return tensorSummary(value);
  if (value instanceof Frame) {
    const { dtype, shape } = value.pixels;
    return {
      type: "frame",
      pixel_format: value.pixelFormat,
      dtype,
      shape: [...shape],
      capture_ts: value.captureTs,
    };
  }
  if (value instanceof Detections) {
    return { type: "detections", boxes: rows(value.boxes.view(), 6), class_names: [...value.classNames] };
  }
  if (value instanceof Tracks) return { type: "tracks", tracks: rows(value.tracks.view(), 5) };
  if (value instanceof Uint8Array) return { type: "bytes", length: value.length };
  if (value instanceof BlobRef) {
    return {
      type: "blob_ref",
      ref: value.ref,
      inner_payload_type: value.innerPayloadType,
      size: toJsonLine(value.size),
    };
  }
  if (value instanceof OpaquePayload) {
    return { type: "opaque", payload_type: value.payloadType, length: value.data.length };
  }
  if (Array.isArray(value)) return value.map((item) => toJsonLine(item, inner));
  const proto = Object.getPrototypeOf(value);
  if (proto !== Object.prototype && proto !== null) {
    throw new SchemaError(
      `an instance of ${value.constructor?.name ?? "an unknown class"} has no JSON form`,
      "send plain objects, arrays, primitives or wire payloads",
    );
  }
  return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, toJsonLine(item, inner)]));
}

/** One line of the file: the input key (`null` outside a keyed run) and the item's JSON form. */
export interface JsonlRecord {
  /** The input's key; `null` outside a keyed run. */
  readonly key: string | null;
  /** The item's JSON form. */
  readonly value: JsonValue;
}

/**
 * Appends `{"key": <ctx.inputKey or null>, "value": <toJsonLine(item)>}` plus a newline to `path` for
 * each item, appended to the end of the file and synced to disk unless `durable` is false.
 *
 * Idempotent by key (`effectGuarantee = "idempotent_key"`): on `open()` it reads the keys already in the
 * file, and an item whose key is there (or was written since) is not written again, so redelivery and
 * restarts never duplicate a line. A torn last line (a crash mid-write, no final newline) is cut off at
 * `open()`, so its item is written again in full; an unreadable complete line is kept, skipped for keys,
 * and logged. Items without a key are always appended.
 *
 * Needs read and write permission on `path` alone. A missing directory is {@link ResourceUnavailable}; an
 * item with no JSON form is {@link SchemaError} (poison); invalid params are `ConfigError`.
 */
export class JsonlSink extends ConsumerNode<JsonlSinkParams> {
  /** Each line's effect is keyed by `ctx.inputKey` and applied at most once per key. */
  static override effectGuarantee: EffectGuarantee = EffectGuarantee.idempotentKey;

  readonly #keys = new Set<string>();
  #file: Deno.FsFile | null = null;

  /** Read (the keys already written) and write (the lines) on `path`, nothing else. */
  override permissions(): NodePermissions {
    return { ...super.permissions(), read: [this.params.path], write: [this.params.path] };
  }

  /** What is wrong with the params: a path that is not a non-empty string, a durable that is not a boolean. */
  override paramProblems(): string[] {
    const { path, durable } = this.params;
    return [
      typeof path === "string" && path !== "" ? null : "path must be a non-empty string",
      durable === undefined || typeof durable === "boolean"
        ? null
        : `durable must be a boolean, got ${durable}`,
    ].filter((problem) => problem !== null);
  }

  /**
   * Opens `path` for appending (creating it), learns the keys it holds and cuts off a torn last line.
   * Throws `ConfigError` for bad params, {@link ResourceUnavailable} when the file cannot be opened.
   */
  override async open(ctx: RuntimeContext): Promise<void> {
    refuseParamProblems(this, "fix the sink's params");
    const { path } = this.params;
    try {
      this.#file = await Deno.open(path, { append: true, create: true });
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
      throw new ResourceUnavailable(
        `node ${this.name}: cannot create ${path}: its directory does not exist`,
        "create the directory first",
        { node: this.name, path },
      );
    }
    const bytes = await Deno.readFile(path);
    const complete = bytes.lastIndexOf(NEWLINE) + 1;
    if (complete < bytes.length) {
      await this.#file.truncate(complete);
      ctx.logger.warn("cut off a torn last line", { path, kept_bytes: complete });
    }
    const lines = new TextDecoder().decode(bytes.subarray(0, complete)).split("\n").slice(0, -1);
    lines.forEach((line, index) => {
      const key = keyOf(line);
      if (key === undefined) ctx.logger.warn("skipped an unreadable line", { path, line: index + 1 });
      else if (key !== null) this.#keys.add(key);
    });
  }

  /**
   * Appends the item's line unless its key was written already. A disk that cannot take it (read-only,
   * full) is ResourceUnavailable naming the file (a `diskFailure`: the input is handed back, not blamed).
   */
  async consume(input: unknown, ctx: RuntimeContext): Promise<void> {
    const file = this.#file;
    if (file === null) {
      throw new NodeContractError(`node ${this.name}: consume() before open()`, "open the node first", {
        node: this.name,
      });
    }
    const key = ctx.inputKey;
    if (key !== null && this.#keys.has(key)) return;
    const record: JsonlRecord = { key, value: toJsonLine(input) };
    const bytes = new TextEncoder().encode(`${JSON.stringify(record)}\n`);
    try {
      for (let written = 0; written < bytes.length;) written += await file.write(bytes.subarray(written));
      if (this.params.durable ?? true) await file.syncData();
    } catch (error) {
      throw diskFailure(error, `node ${this.name}'s output ${this.params.path}`, this.params.path) ?? error;
    }
    if (key !== null) this.#keys.add(key);
  }

  /** Closes the file. */
  override close(_ctx: RuntimeContext): void {
    this.#file?.close();
    this.#file = null;
  }
}

/** The key of a line; `null` for a line written without one; `undefined` for a line that is not a record. */
function keyOf(line: string): string | null | undefined {
  try {
    const record = JSON.parse(line) as Partial<JsonlRecord> | null;
    const key = record?.key;
    return typeof key === "string" || key === null ? key : undefined;
  } catch {
    return undefined;
  }
}
