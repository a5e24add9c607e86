/**
 * An append-only observation log (spec backends.observation): the independent evidence a conformance
 * oracle reads instead of trusting a provider's own counters. Every adapter and the runtime record, for
 * each logical operation, the identities that let a failure be attributed ({@link FIELDS}) with a
 * monotonic and a wall timestamp. Payload bytes are never logged: a binary field value is refused.
 *
 * A log with a path appends each event to it as one JSON line, written synchronously before `emit`
 * returns, so a worker that crashes right after an emit has already recorded it. One file per process:
 * a test gives each worker its own path and merges them afterwards ({@link loadMerged}). Reading is crash
 * tolerant: a line torn by a crash mid-write is skipped and counted, never fatal.
 *
 * @example
 * ```ts
 * import { ObservationLog } from "./observation.ts";
 * using log = new ObservationLog({ path: await Deno.makeTempFile() });
 * log.emit("publish", { event_id: "e1", attempt: 1 });
 * console.log(ObservationLog.load(log.path!).length); // 1
 * ```
 *
 * @module
 */

import { isDeepStrictEqual } from "node:util";
import { ConfigError } from "../core/errors.ts";
import { type Clock, systemClock } from "./clock.ts";

/** Field names every event may carry; adapters use these keys so logs from different backends line up. */
export const FIELDS = [
  "op_id",
  "source_epoch",
  "source_offset",
  "event_id",
  "group_id",
  "consumer",
  "attempt",
  "generation",
  "payload_digest",
  "obligation_id",
  "claim_uid",
  "pod_uid",
  "device_ids",
  "status",
  "reason",
] as const;
/** One of {@link FIELDS}. */
export type ObservationField = typeof FIELDS[number];

/** Field values as recorded: JSON values (a bigint is recorded as its decimal string). */
export type ObservationFields = Readonly<Record<string, unknown>>;

/** One observation. `kind` names what happened ('publish', 'settle', 'claim', ...). */
export interface ObservationEvent {
  readonly kind: string;
  /** The emitting clock's monotonic reading, in seconds. */
  readonly monotonic: number;
  /** The emitting clock's wall reading, in epoch seconds. */
  readonly wall: number;
  readonly fields: ObservationFields;
}

/** What a crash-tolerant read found: the events, and how many torn lines it skipped. */
export interface ObservationRead {
  readonly events: readonly ObservationEvent[];
  readonly skippedLines: number;
}

function recordable(key: string, value: unknown): unknown {
  if (value instanceof ArrayBuffer || ArrayBuffer.isView(value)) {
    throw new ConfigError(
      `observation field ${JSON.stringify(key)} holds bytes; payload bytes are never logged`,
      "record the payload's digest (payload_digest) or its size instead",
      { field: key },
    );
  }
  return typeof value === "bigint" ? value.toString() : value;
}

/** The one JSON line an event is stored as, without its newline. */
function toLine(kind: string, monotonic: number, wall: number, fields: ObservationFields): string {
  return JSON.stringify({ kind, monotonic, wall, fields }, recordable);
}

function isEvent(value: unknown): value is ObservationEvent {
  if (typeof value !== "object" || value === null) return false;
  const record = value as Record<string, unknown>;
  return typeof record.kind === "string" && typeof record.monotonic === "number" &&
    typeof record.wall === "number" && typeof record.fields === "object" && record.fields !== null &&
    !Array.isArray(record.fields);
}

function freezeEvent(event: ObservationEvent): ObservationEvent {
  return Object.freeze({
    kind: event.kind,
    monotonic: event.monotonic,
    wall: event.wall,
    fields: Object.freeze({ ...event.fields }),
  });
}

/**
 * Parses JSONL text written by an {@link ObservationLog}. A line that is not JSON is a line torn by a
 * crash mid-write: skipped and counted. A line that is JSON but not an event means the text is not an
 * observation log: a {@link ConfigError} naming `source` and the line number.
 */
export function parseObservations(text: string, source = "<text>"): ObservationRead {
  const events: ObservationEvent[] = [];
  let skippedLines = 0;
  const lines = text.split("\n");
  for (let index = 0; index < lines.length; index++) {
    const line = lines[index];
    if (line.trim() === "") continue;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch {
      skippedLines++;
      continue;
    }
    if (!isEvent(value)) {
      throw new ConfigError(
        `${source}:${index + 1} is not an observation event`,
        "read only files an ObservationLog wrote",
        { source, line: index + 1 },
      );
    }
    events.push(freezeEvent(value));
  }
  return { events, skippedLines };
}

/** Reads one log file, crash tolerant (see {@link parseObservations}). */
export function readObservations(path: string): ObservationRead {
  return parseObservations(Deno.readTextFileSync(path), path);
}

/** Total order between two events at the heads of different sources; content only, never the source. */
function compareHeads(a: ObservationEvent, b: ObservationEvent): number {
  if (a.monotonic !== b.monotonic) return a.monotonic - b.monotonic;
  if (a.wall !== b.wall) return a.wall - b.wall;
  if (a.kind !== b.kind) return a.kind < b.kind ? -1 : 1;
  const left = JSON.stringify(a.fields);
  const right = JSON.stringify(b.fields);
  return left === right ? 0 : left < right ? -1 : 1;
}

/**
 * Merges event sequences from several sources into one: each source keeps its own order, and the
 * sources interleave by monotonic time (ties by wall time, kind, then fields). The result depends only on
 * the sources' contents, not on the order they are passed in.
 */
export function mergeObservations(sources: readonly (readonly ObservationEvent[])[]): ObservationEvent[] {
  const positions = sources.map(() => 0);
  const total = sources.reduce((sum, source) => sum + source.length, 0);
  const merged: ObservationEvent[] = [];
  while (merged.length < total) {
    let best = -1;
    for (let s = 0; s < sources.length; s++) {
      if (positions[s] >= sources[s].length) continue;
      if (best < 0 || compareHeads(sources[s][positions[s]], sources[best][positions[best]]) < 0) best = s;
    }
    merged.push(sources[best][positions[best]++]);
  }
  return merged;
}

/** Reads and merges the logs of several processes (crash tolerant, see {@link mergeObservations}). */
export function loadMerged(paths: readonly string[]): ObservationEvent[] {
  return mergeObservations(paths.map((path) => readObservations(path).events));
}

/** Options of an {@link ObservationLog}. */
export interface ObservationLogOptions {
  /** When given, every event is also appended to this file as one JSON line (created if missing). */
  readonly path?: string | null;
  /** Where the timestamps come from (default: the system clock). */
  readonly clock?: Clock;
}

/**
 * Append-only and replayable. `emit` records an event in memory and, with a path, on disk before it
 * returns. Close it (or declare it with `using`) to release the file.
 */
export class ObservationLog implements Disposable {
  /** The file this log appends to, or `null`. */
  readonly path: string | null;
  readonly #clock: Clock;
  #events: ObservationEvent[] = [];
  #file: Deno.FsFile | null = null;
  #closed = false;
  readonly #encoder = new TextEncoder();

  constructor(options: ObservationLogOptions = {}) {
    this.path = options.path ?? null;
    this.#clock = options.clock ?? systemClock;
    if (this.path !== null) this.#file = ObservationLog.#openForAppend(this.path);
  }

  /**
   * Opens `path` for appending. A file whose last line was torn by a crash gets a newline first, so the
   * torn fragment stays a line of its own (skipped on read) instead of corrupting the next event.
   */
  static #openForAppend(path: string): Deno.FsFile {
    const file = Deno.openSync(path, { read: true, append: true, create: true });
    if (file.statSync().size > 0) {
      const last = new Uint8Array(1);
      file.seekSync(-1, Deno.SeekMode.End);
      file.readSync(last);
      if (last[0] !== 0x0a) file.writeSync(new Uint8Array([0x0a]));
    }
    return file;
  }

  /** Events of a log file, torn lines skipped (see {@link readObservations} for the count). */
  static load(path: string): ObservationEvent[] {
    return [...readObservations(path).events];
  }

  /**
   * Records one event stamped with the clock's readings. Field values must be JSON values (a bigint is
   * stored as its decimal string); bytes are a {@link ConfigError}. Returns the event as stored.
   */
  emit(kind: string, fields: ObservationFields = {}): ObservationEvent {
    if (this.#closed) {
      throw new ConfigError(
        `observation log ${this.path} is closed`,
        "emit before closing the log, or open a new ObservationLog on the same path to append",
      );
    }
    const line = toLine(kind, this.#clock.monotonic(), this.#clock.now(), fields);
    const event = freezeEvent(JSON.parse(line) as ObservationEvent);
    if (this.#file !== null) this.#append(`${line}\n`);
    this.#events.push(event);
    return event;
  }

  #append(text: string): void {
    const bytes = this.#encoder.encode(text);
    for (let written = 0; written < bytes.length;) {
      written += (this.#file as Deno.FsFile).writeSync(bytes.subarray(written));
    }
  }

  /** Events of `kind` (any kind when `null` or omitted) whose fields deeply equal every `match` entry. */
  events(kind: string | null = null, match: ObservationFields = {}): ObservationEvent[] {
    const wanted = Object.entries(match);
    return this.#events.filter((event) =>
      (kind === null || event.kind === kind) &&
      wanted.every(([key, value]) => isDeepStrictEqual(event.fields[key], value))
    );
  }

  /**
   * Merges events recorded elsewhere (a subprocess's log) into this log's view, as
   * {@link mergeObservations} orders them; they are not appended to this log's file.
   */
  extend(events: Iterable<ObservationEvent>): void {
    this.#events = mergeObservations([this.#events, [...events].map(freezeEvent)]);
  }

  /** Releases the file; a later emit is a {@link ConfigError}. A no-op for a log without a path. */
  close(): void {
    if (this.#file === null) return;
    this.#file.close();
    this.#file = null;
    this.#closed = true;
  }

  /** {@link close}, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }
}
