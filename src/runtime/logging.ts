/**
 * Worker logging (spec runtime.logging_config): a {@link Logger} scoped to one node replica, writing one
 * line per record to stderr, as JSON (`VF_STRUCTURED_LOGS=1`, one object a line for a log shipper) or in a
 * plain human format. Every record carries the node's scope (flow, run, node, replica) and whatever fields
 * the caller bound ({@link NodeLogger.with}) or passed.
 *
 * JSON record keys: `ts` (ISO 8601, UTC), `level`, `msg`, then `flow_id`, `run_id`, `node`, `replica` when
 * known, then the fields. A field named like one of the first three is written as `field_<name>` so it can
 * never hide them. Values that JSON cannot hold are written as what they are: a bigint in decimal, an error
 * as its error record, bytes as their length. Logging never throws.
 *
 * @example
 * ```ts
 * const logger = configureLogging({ flowId: "f", runId: "r1", node: "detect", replica: 0 });
 * logger.info("model loaded", { seconds: 2.4 });
 * // VF_STRUCTURED_LOGS=1: {"ts":"…","level":"info","msg":"model loaded","flow_id":"f","run_id":"r1","node":"detect","replica":0,"seconds":2.4}
 * // otherwise:           2024-05-01T10:00:00.000Z INFO  detect[0] model loaded seconds=2.4 flow=f run=r1
 * ```
 *
 * @module
 */

import { type Clock, systemClock } from "../backends/clock.ts";
import type { Logger } from "../core/context.ts";
import { ConfigError, errorToDict } from "../core/errors.ts";

/** `1` turns on JSON lines; anything false-like (or unset) keeps the human format. */
export const STRUCTURED_LOGS_ENV = "VF_STRUCTURED_LOGS";

/** The least severe level written: debug, info (default), warn, error. Not in the spec (inferred). */
export const LOG_LEVEL_ENV = "VF_LOG_LEVEL";

/** Severity of a record, least severe first. */
export const LogLevel = {
  debug: "debug",
  info: "info",
  warn: "warn",
  error: "error",
} as const;
/** Severity of a record. */
export type LogLevel = typeof LogLevel[keyof typeof LogLevel];

/** How a record is written. */
export const LogFormat = {
  /** One JSON object per line. */
  json: "json",
  /** `ts LEVEL node[replica] message key=value …`. */
  human: "human",
} as const;
/** How a record is written. */
export type LogFormat = typeof LogFormat[keyof typeof LogFormat];

const SEVERITY: Readonly<Record<LogLevel, number>> = { debug: 10, info: 20, warn: 30, error: 40 };
const RESERVED = new Set(["ts", "level", "msg"]);

/** Which node replica a logger speaks for; every part optional (a supervisor logs without a node). */
export interface LogScope {
  readonly flowId?: string;
  readonly runId?: string;
  readonly node?: string;
  readonly replica?: number;
}

/** Where a finished line goes (without its newline). */
export type LogSink = (line: string, level: LogLevel) => void;

/** Options of a {@link NodeLogger}. */
export interface NodeLoggerOptions {
  readonly scope?: LogScope;
  /** Human by default. */
  readonly format?: LogFormat;
  /** The least severe level written; info by default. */
  readonly level?: LogLevel;
  /** Stderr by default. */
  readonly sink?: LogSink;
  /** Stamps `ts` from its wall time; the system clock by default. */
  readonly clock?: Clock;
}

const encoder = new TextEncoder();

/** Writes a line and its newline to stderr, synchronously and whole, so lines of one process never interleave. */
export function stderrSink(line: string): void {
  const bytes = encoder.encode(`${line}\n`);
  for (let written = 0; written < bytes.length;) written += Deno.stderr.writeSync(bytes.subarray(written));
}

function jsonValue(_key: string, value: unknown): unknown {
  if (typeof value === "bigint") return value.toString();
  if (value instanceof Error) return errorToDict(value);
  if (ArrayBuffer.isView(value)) return `<${value.byteLength} bytes>`;
  if (value instanceof ArrayBuffer) return `<${value.byteLength} bytes>`;
  if (value instanceof Map) return Object.fromEntries(value);
  if (value instanceof Set) return [...value];
  return value;
}

/**
 * JSON text of one value, `undefined` for a value JSON leaves out (undefined, a function); a value that
 * cannot be serialized (a cycle) becomes a string saying so, so the rest of the record survives.
 */
function valueJson(value: unknown): string | undefined {
  try {
    return JSON.stringify(value, jsonValue);
  } catch (error) {
    return JSON.stringify(`<unserializable: ${error instanceof Error ? error.message : String(error)}>`);
  }
}

/** A JSON object of `entries`, each value serialized on its own ({@link valueJson}). */
function objectJson(entries: Record<string, unknown>): string {
  const members = Object.entries(entries).flatMap(([key, value]) => {
    const text = valueJson(value);
    return text === undefined ? [] : [`${JSON.stringify(key)}:${text}`];
  });
  return `{${members.join(",")}}`;
}

function humanValue(value: unknown): string {
  if (typeof value === "string") return /^[^\s"=]+$/.test(value) ? value : JSON.stringify(value);
  return valueJson(value) ?? "undefined";
}

/**
 * A {@link Logger} for one node replica. Records below the level are dropped before any formatting;
 * nothing it does throws (a sink failure loses the line, never the caller's work).
 */
export class NodeLogger implements Logger {
  /** Which replica this logger speaks for. */
  readonly scope: LogScope;
  /** How lines are written. */
  readonly format: LogFormat;
  /** The least severe level written. */
  readonly level: LogLevel;
  readonly #sink: LogSink;
  readonly #clock: Clock;
  readonly #bound: Readonly<Record<string, unknown>>;

  constructor(options: NodeLoggerOptions = {}, bound: Readonly<Record<string, unknown>> = {}) {
    this.scope = Object.freeze({ ...options.scope });
    this.format = options.format ?? LogFormat.human;
    this.level = options.level ?? LogLevel.info;
    this.#sink = options.sink ?? stderrSink;
    this.#clock = options.clock ?? systemClock;
    this.#bound = Object.freeze({ ...bound });
  }

  /** A logger with the same scope and `fields` bound to every record (a trace id, a partition). */
  with(fields: Record<string, unknown>): NodeLogger {
    const options = {
      scope: this.scope,
      format: this.format,
      level: this.level,
      sink: this.#sink,
      clock: this.#clock,
    };
    return new NodeLogger(options, { ...this.#bound, ...fields });
  }

  /** Whether a record at `level` would be written. */
  enabled(level: LogLevel): boolean {
    return SEVERITY[level] >= SEVERITY[this.level];
  }

  debug(message: string, fields?: Record<string, unknown>): void {
    this.#log(LogLevel.debug, message, fields);
  }

  info(message: string, fields?: Record<string, unknown>): void {
    this.#log(LogLevel.info, message, fields);
  }

  warn(message: string, fields?: Record<string, unknown>): void {
    this.#log(LogLevel.warn, message, fields);
  }

  error(message: string, fields?: Record<string, unknown>): void {
    this.#log(LogLevel.error, message, fields);
  }

  /** The line a record is written as, in this logger's format (what the sink receives). */
  render(level: LogLevel, message: string, fields: Record<string, unknown> = {}): string {
    const ts = new Date(this.#clock.now() * 1000).toISOString();
    const extra: Record<string, unknown> = {};
    for (const [key, value] of Object.entries({ ...this.#bound, ...fields })) {
      extra[RESERVED.has(key) ? `field_${key}` : key] = value;
    }
    const { flowId, runId, node, replica } = this.scope;
    if (this.format === LogFormat.json) {
      return objectJson({
        ts,
        level,
        msg: message,
        ...(flowId === undefined ? {} : { flow_id: flowId }),
        ...(runId === undefined ? {} : { run_id: runId }),
        ...(node === undefined ? {} : { node }),
        ...(replica === undefined ? {} : { replica }),
        ...extra,
      });
    }
    const where = node === undefined ? "-" : replica === undefined ? node : `${node}[${replica}]`;
    const tail = {
      ...extra,
      ...(flowId === undefined ? {} : { flow: flowId }),
      ...(runId === undefined ? {} : { run: runId }),
    };
    const pairs = Object.entries(tail).map(([key, value]) => ` ${key}=${humanValue(value)}`).join("");
    return `${ts} ${level.toUpperCase().padEnd(5)} ${where} ${message}${pairs}`;
  }

  #log(level: LogLevel, message: string, fields: Record<string, unknown> | undefined): void {
    if (!this.enabled(level)) return;
    try {
      this.#sink(this.render(level, message, fields), level);
    } catch {
      // A log line that cannot be written is lost; the caller's work must not fail because of it.
    }
  }
}

/** Where environment variables are read from: `Deno.env`, or a Map in tests. */
type EnvSource = Pick<Deno.Env, "get">;

const TRUE_WORDS = new Set(["1", "true", "yes", "on"]);
const FALSE_WORDS = new Set(["", "0", "false", "no", "off"]);

/** The format and level the environment asks for. */
export interface LoggingConfig {
  readonly format: LogFormat;
  readonly level: LogLevel;
}

/**
 * Reads `VF_STRUCTURED_LOGS` (1/true/yes/on: JSON; unset, empty, 0/false/no/off: human) and `VF_LOG_LEVEL`
 * (debug, info, warn or warning, error; info when unset). Throws {@link ConfigError} for any other value.
 */
export function loggingConfigFromEnv(env: EnvSource = Deno.env): LoggingConfig {
  const structured = (env.get(STRUCTURED_LOGS_ENV) ?? "").trim().toLowerCase();
  if (!TRUE_WORDS.has(structured) && !FALSE_WORDS.has(structured)) {
    throw new ConfigError(
      `${STRUCTURED_LOGS_ENV} must be 1 or 0, got ${JSON.stringify(structured)}`,
      `set ${STRUCTURED_LOGS_ENV}=1 for JSON lines, or leave it unset for the human format`,
      { variable: STRUCTURED_LOGS_ENV, value: structured },
    );
  }
  const rawLevel = (env.get(LOG_LEVEL_ENV) ?? "").trim().toLowerCase();
  const level = rawLevel === "" ? LogLevel.info : rawLevel === "warning" ? LogLevel.warn : rawLevel;
  if (!Object.hasOwn(SEVERITY, level)) {
    throw new ConfigError(
      `${LOG_LEVEL_ENV} must be debug, info, warn or error, got ${JSON.stringify(rawLevel)}`,
      `set ${LOG_LEVEL_ENV} to one of debug, info, warn, error`,
      { variable: LOG_LEVEL_ENV, value: rawLevel },
    );
  }
  return { format: TRUE_WORDS.has(structured) ? LogFormat.json : LogFormat.human, level: level as LogLevel };
}

/** The worker's logger: `scope` in the format and at the level the environment asks for, to stderr. */
export function configureLogging(
  scope: LogScope = {},
  env: EnvSource = Deno.env,
  options: Pick<NodeLoggerOptions, "sink" | "clock"> = {},
): NodeLogger {
  return new NodeLogger({ ...options, ...loggingConfigFromEnv(env), scope });
}
