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
import { equalBytes, FINGERPRINT_SPAN, fingerprintOf, KeyIndexFile, readAt } from "./_key_index.ts";
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
 * Idempotent by key (`effectGuarantee = "idempotent_key"`): an item whose key is in the file already is not
 * written again, so redelivery and restarts never duplicate a line. The keys written are kept on disk, in
 * the index `<path>.keys` ({@link KeyIndexFile}), never in memory: `open()` reads only the lines written
 * since the index last recorded how far it covers the file (a crash leaves at most a few hundred), so
 * neither the sink's memory nor its `open()` grows with the file. A file the index no longer matches
 * (replaced, truncated or edited before its indexed end) is indexed again from its start, once. A torn
 * last line (a crash mid-write, no final newline) is cut off at `open()`, so its item is written again in
 * full; an unreadable complete line is kept, skipped for keys, and logged. Items without a key are always
 * appended.
 *
 * Needs read and write permission on `path` and `<path>.keys` alone. A missing directory is
 * {@link ResourceUnavailable}; an item with no JSON form is {@link SchemaError} (poison); invalid params are
 * `ConfigError`.
 */
export class JsonlSink extends ConsumerNode<JsonlSinkParams> {
  /** Each line's effect is keyed by `ctx.inputKey` and applied at most once per key. */
  static override effectGuarantee: EffectGuarantee = EffectGuarantee.idempotentKey;

  #file: Deno.FsFile | null = null;
  #keys: KeyIndexFile | null = null;
  /** The file's length: where the next line goes. */
  #end = 0;
  /** The last bytes of the file, for the index's fingerprint. */
  #tail: Uint8Array = new Uint8Array(0);
  /** Lines written since the index last recorded how far it covers the file. */
  #sinceCheckpoint = 0;

  /** Read and write on `path` (the lines) and on its index `<path>.keys`, nothing else. */
  override permissions(): NodePermissions {
    const { path } = this.params;
    const files = [path, keyIndexPath(path)];
    return { ...super.permissions(), read: files, write: files };
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
   * Opens `path` for appending (creating it), cuts off a torn last line, and brings the key index up to
   * the end of the file. Throws `ConfigError` for bad params, {@link ResourceUnavailable} when the file
   * cannot be opened.
   */
  override async open(ctx: RuntimeContext): Promise<void> {
    refuseParamProblems(this, "fix the sink's params");
    const { path } = this.params;
    try {
      this.#file = await Deno.open(path, { read: true, append: true, create: true });
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
      throw new ResourceUnavailable(
        `node ${this.name}: cannot create ${path}: its directory does not exist`,
        "create the directory first",
        { node: this.name, path },
      );
    }
    const file = this.#file;
    const length = (await file.stat()).size;
    const complete = completeLength(file, length);
    if (complete < length) {
      await file.truncate(complete);
      ctx.logger.warn("cut off a torn last line", { path, kept_bytes: complete });
    }
    this.#end = complete;
    const keys = this.#keys = KeyIndexFile.open(keyIndexPath(path));
    let from = keys.header?.indexedTo ?? -1;
    if (
      from > complete ||
      (from >= 0 && !equalBytes(keys.header!.fingerprint, this.#fingerprintAt(from)))
    ) {
      ctx.logger.warn("the file changed since its keys were indexed: indexing it again", { path });
      from = -1;
    }
    if (from < 0) {
      keys.reset(this.#fingerprintAt(0));
      from = 0;
    }
    for (const line of linesFrom(file, from, complete)) {
      const key = keyOf(line.text);
      if (key === undefined) ctx.logger.warn("skipped an unreadable line", { path, offset: line.offset });
      else if (key !== null) keys.restore(key);
    }
    this.#tail = tailBefore(file, complete);
    this.#checkpoint();
  }

  /**
   * Appends the item's line unless its key was written already. A disk that cannot take it or its key
   * index (read-only, full) is ResourceUnavailable naming the file (a `diskFailure`: the input is handed
   * back, not blamed).
   */
  async consume(input: unknown, ctx: RuntimeContext): Promise<void> {
    const file = this.#file;
    const keys = this.#keys;
    if (file === null || keys === null) {
      throw new NodeContractError(`node ${this.name}: consume() before open()`, "open the node first", {
        node: this.name,
      });
    }
    const key = ctx.inputKey;
    if (key !== null && keys.has(key)) return;
    const record: JsonlRecord = { key, value: toJsonLine(input) };
    const bytes = new TextEncoder().encode(`${JSON.stringify(record)}\n`);
    try {
      for (let written = 0; written < bytes.length;) written += await file.write(bytes.subarray(written));
      if (this.params.durable ?? true) await file.syncData();
    } catch (error) {
      throw this.#diskFailure(error, "output", this.params.path);
    }
    this.#end += bytes.length;
    this.#tail = lastBytes(this.#tail, bytes);
    try {
      if (key !== null) keys.insertAbsent(key);
      if (++this.#sinceCheckpoint >= CHECKPOINT_LINES) this.#checkpoint();
    } catch (error) {
      // The line is written but its key may not be: the index is closed without a checkpoint, so it never
      // claims this line, and a re-opened sink indexes the lines past its last checkpoint again.
      this.#keys = null;
      keys.close();
      throw this.#diskFailure(error, "output's key index", keyIndexPath(this.params.path));
    }
  }

  /** `error` as the typed disk failure naming this node's file `path` when it is one, else as it is. */
  #diskFailure(error: unknown, what: string, path: string): unknown {
    return diskFailure(error, `node ${this.name}'s ${what} ${path}`, path) ?? error;
  }

  /** Records how far the index covers the file, and closes both. */
  override close(_ctx: RuntimeContext): void {
    if (this.#keys !== null && this.#file !== null) this.#checkpoint();
    this.#keys?.close();
    this.#keys = null;
    this.#file?.close();
    this.#file = null;
  }

  #checkpoint(): void {
    this.#keys!.checkpoint(this.#end, fingerprintOf(this.#tail));
    this.#sinceCheckpoint = 0;
  }

  #fingerprintAt(offset: number): Uint8Array {
    return fingerprintOf(tailBefore(this.#file!, offset));
  }
}

/** Lines a sink writes between two records of how far its index covers the file. */
const CHECKPOINT_LINES = 256;

/** Where the key index of the file at `path` is kept. */
export function keyIndexPath(path: string): string {
  return `${path}.keys`;
}

/** The last {@link FINGERPRINT_SPAN} bytes of `previous` followed by `added`. */
function lastBytes(previous: Uint8Array, added: Uint8Array): Uint8Array {
  if (added.length >= FINGERPRINT_SPAN) return added.slice(added.length - FINGERPRINT_SPAN);
  const keep = Math.min(previous.length, FINGERPRINT_SPAN - added.length);
  const tail = new Uint8Array(keep + added.length);
  tail.set(previous.subarray(previous.length - keep));
  tail.set(added, keep);
  return tail;
}

/** The up to {@link FINGERPRINT_SPAN} bytes of the file just before `offset`. */
function tailBefore(file: Deno.FsFile, offset: number): Uint8Array {
  const start = Math.max(0, offset - FINGERPRINT_SPAN);
  const bytes = new Uint8Array(offset - start);
  return bytes.subarray(0, readAt(file, start, bytes));
}

/** Bytes read at a time when looking for the last newline and when indexing lines. */
const CHUNK_BYTES = 1 << 20;

/** The length of the file's whole lines: up to and including its last newline (0 for none). */
function completeLength(file: Deno.FsFile, length: number): number {
  for (let end = length; end > 0;) {
    const start = Math.max(0, end - CHUNK_BYTES);
    const bytes = new Uint8Array(end - start);
    const read = readAt(file, start, bytes);
    const newline = bytes.subarray(0, read).lastIndexOf(NEWLINE);
    if (newline >= 0) return start + newline + 1;
    end = start;
  }
  return 0;
}

/** The whole lines of the file from byte `from` (a line start) to `to` (a line end), with their offsets. */
function* linesFrom(
  file: Deno.FsFile,
  from: number,
  to: number,
): Generator<{ text: string; offset: number }> {
  const decoder = new TextDecoder();
  let pending = new Uint8Array(0);
  let pendingAt = from;
  for (let at = from; at < to;) {
    const chunk = new Uint8Array(Math.min(CHUNK_BYTES, to - at));
    const read = readAt(file, at, chunk);
    if (read === 0) break;
    at += read;
    const bytes = new Uint8Array(pending.length + read);
    bytes.set(pending);
    bytes.set(chunk.subarray(0, read), pending.length);
    let start = 0;
    for (let newline = bytes.indexOf(NEWLINE); newline >= 0; newline = bytes.indexOf(NEWLINE, start)) {
      yield { text: decoder.decode(bytes.subarray(start, newline)), offset: pendingAt + start };
      start = newline + 1;
    }
    pending = bytes.slice(start);
    pendingAt += start;
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
