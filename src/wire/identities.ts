/**
 * The identities every runtime of the protocol must derive identically (WIRE.md "Identities", spec
 * backends.runtime): message ids, trace ids a producer mints, the identity an input group carries forward,
 * and which replica of a partitioned node owns a record.
 *
 * Everything here is pure and deterministic, and byte-for-byte what the Python reference derives:
 * SHA-256 over UTF-8, integers in plain decimal, strings ordered by Unicode code point (Python's `sorted`),
 * and Python's `round()` (half to even on the IEEE-754 double) for a time group's microseconds.
 *
 * @module
 */

import { PARTITION_KEY_METADATA_KEY } from "../core/context.ts";
import { ConfigError, PartitionKeyError } from "../core/errors.ts";
import { sha256Hex } from "./sha256.ts";

/** A sequence number as it travels (`uint64` on the wire): a JS integer or a bigint. */
export type Seq = bigint | number;

/** What a message is, as its id spells it: the `msg_type` component of {@link messageId}. */
export const MsgType = {
  data: "data",
  eos: "eos",
  abort: "abort",
} as const;
/** What a message is, as its id spells it. */
export type MsgType = typeof MsgType[keyof typeof MsgType];

/** A trace identity: the trace id and sequence number an envelope carries. */
export interface TraceIdentity {
  /** The logical message identity (`trace_id`). */
  readonly traceId: string;
  /** The sequence number (`seq`), a uint64. */
  readonly seq: Seq;
}

/** The identity an assembled input group carries forward to the node's output. */
export interface GroupTraceIdentity extends TraceIdentity {
  /** The group's event time in epoch seconds; `null` when no member had one. */
  readonly eventTs: number | null;
}

/** One member of a group, named by the message it is: who produced it, its trace id and its seq. */
export interface MemberId {
  /** The parent node that produced the member (`producer_name`). */
  readonly producer: string;
  /** The member's `trace_id`. */
  readonly traceId: string;
  /** The member's `seq`. */
  readonly seq: Seq;
}

/** A member of a trace group: its trace identity and event time. */
export interface TraceGroupMember extends TraceIdentity {
  /** The member's event time in epoch seconds; `null` when it has none. */
  readonly eventTs: number | null;
}

/** A synchronized member of a time group: its logical id, event time and local arrival time. */
export interface TimeGroupMember extends MemberId {
  /** The member's event time in epoch seconds; `null` when it has none. */
  readonly eventTs: number | null;
  /** Epoch seconds the member arrived; stands in for a missing `eventTs`. */
  readonly arrivalTs: number;
}

/** Parent name to what that parent contributed: a Map or a plain record. */
export type MembersByParent<T> = ReadonlyMap<string, T> | Readonly<Record<string, T>>;

/** A usable partition key (RUN-020): a non-empty string, a boolean, or an integer. */
export type PartitionKey = string | boolean | bigint | number;

/**
 * Orders two strings by Unicode code point, as Python compares `str` (JS `<` compares UTF-16 code units,
 * which puts U+10000 and above before U+E000..U+FFFF).
 */
export function compareCodePoints(a: string, b: string): number {
  let i = 0;
  let j = 0;
  while (i < a.length && j < b.length) {
    const x = a.codePointAt(i)!;
    const y = b.codePointAt(j)!;
    if (x !== y) return x < y ? -1 : 1;
    i += x > 0xffff ? 2 : 1;
    j += y > 0xffff ? 2 : 1;
  }
  if (i < a.length) return 1;
  return j < b.length ? -1 : 0;
}

/** The decimal form of an integer, as Python's `str(int)` writes it; refuses anything that is not one. */
function decimal(value: Seq, what = "value"): string {
  if (typeof value === "bigint") return value.toString();
  if (!Number.isInteger(value)) {
    throw new ConfigError(`${what} must be an integer, got ${value}`, `pass a whole number as ${what}`);
  }
  return BigInt(value).toString();
}

function entriesOf<T>(members: MembersByParent<T>): Array<[string, T]> {
  return members instanceof Map ? [...members.entries()] : Object.entries(members as Record<string, T>);
}

/**
 * The `Nats-Msg-Id` dedup key: the first 32 hex characters of SHA-256 over
 * `{flow_id}:{run_id}:{producer_name}:{trace_id}:{seq}:{msg_type}`. The parts are the raw (unsanitized)
 * strings, so a retried publication of the same logical message gets the same id, byte for byte the
 * reference's whichever runtime published it first. `abort` gives an ABORT marker an id distinct from its
 * clean EOS's.
 *
 * @example messageId("flow-A", "run-1", "cam", "cam:1", 1, "data") === "745708c2eeaf98a60fdbebafe1d04eff"
 */
export function messageId(
  flowId: string,
  runId: string,
  producerName: string,
  traceId: string,
  seq: Seq,
  msgType: MsgType,
): string {
  return sha256Hex(`${flowId}:${runId}:${producerName}:${traceId}:${decimal(seq, "seq")}:${msgType}`).slice(
    0,
    32,
  );
}

/**
 * The dedup id of a dead letter: `dlq:{flow}:{run}:{node}:{stream_seq}` over the original's stream
 * sequence. Each parent's stream numbers its messages on its own, so for a node with several parents that
 * form would give two failed members of one group the same id, and the DLQ would keep one of them: such a
 * node passes the `parent` whose stream the sequence is from, giving `dlq:{flow}:{run}:{node}:{parent}:{stream_seq}`.
 */
export function dlqMessageId(
  flowId: string,
  runId: string,
  node: string,
  streamSeq: Seq,
  parent: string | null = null,
): string {
  const stream = parent === null ? "" : `${parent}:`;
  return `dlq:${flowId}:${runId}:${node}:${stream}${decimal(streamSeq, "stream sequence")}`;
}

/** A sink's idempotency key for one message: `vf-idem-` + the full SHA-256 hex of `{flow}:{node}:{message_id}`. */
export function sinkIdempotencyKey(flowId: string, node: string, messageIdValue: string): string {
  return `vf-idem-${sha256Hex(`${flowId}:${node}:${messageIdValue}`)}`;
}

/**
 * The n-th message a producer mints: `trace_id = "{node}:{n}"`, `seq = n`, n counting from 1.
 *
 * @example producerTrace("cam", 1) // { traceId: "cam:1", seq: 1 }
 */
export function producerTrace(node: string, n: Seq): TraceIdentity {
  if (n < 1) throw new ConfigError(`a producer's message count starts at 1, got ${n}`, "count from 1");
  return { traceId: `${node}:${decimal(n, "message count")}`, seq: n };
}

/** The trace id of replica `replica`'s clean end-of-stream marker: `eos-r{replica}`. */
export function eosTraceId(replica: number): string {
  return `eos-r${decimal(replica, "replica id")}`;
}

/**
 * The trace id of replica `replica`'s ABORT marker: `abort-r{replica}`, distinct from the clean marker's so
 * a node that died is never deduplicated against, or mistaken for, one that finished.
 */
export function abortTraceId(replica: number): string {
  return `abort-r${decimal(replica, "replica id")}`;
}

/**
 * Trace id of a live source's `sequence`-th capture within capture epoch `epoch` (MSGID-5):
 * `{node}:{epoch}:{sequence}`.
 */
export function sourceEpochTraceId(node: string, epoch: string, sequence: Seq): string {
  return `${node}:${epoch}:${decimal(sequence, "sequence")}`;
}

/**
 * Trace id of a replayable source's frame at `offset` (MSGID-6): `{node}:{offset}`, or
 * `{node}:{analysis_version}:{offset}` when a (non-empty) analysis version opens a namespace of its own.
 */
export function replayableTraceId(node: string, offset: Seq, analysisVersion?: string | null): string {
  const prefix = analysisVersion ? `${node}:${analysisVersion}` : node;
  return `${prefix}:${decimal(offset, "offset")}`;
}

/**
 * What a trace group carries forward: the trace id its members share, the minimum seq and the minimum
 * non-null event time. Independent of member order, so a redelivered group derives the same identity.
 */
export function traceGroupIdentity(members: readonly TraceGroupMember[]): GroupTraceIdentity {
  if (members.length === 0) throw new RangeError("a trace group has at least one member");
  const traceId = members[0].traceId;
  const stranger = members.find((m) => m.traceId !== traceId);
  if (stranger) {
    throw new RangeError(`a trace group shares one trace id: ${traceId} and ${stranger.traceId} differ`);
  }
  let seq = members[0].seq;
  let eventTs: number | null = null;
  for (const member of members) {
    if (member.seq < seq) seq = member.seq;
    if (member.eventTs !== null && (eventTs === null || member.eventTs < eventTs)) eventTs = member.eventTs;
  }
  return { traceId, seq, eventTs };
}

/**
 * Python's `round(x)` for a finite double: the nearest integer, ties to even, decided on the exact value of
 * `x` (not on its decimal spelling). Exact for every finite double, hence a bigint.
 */
export function roundHalfToEven(x: number): bigint {
  if (!Number.isFinite(x)) throw new RangeError(`cannot round ${x} to an integer`);
  if (Number.isInteger(x)) return BigInt(x);
  const floor = Math.floor(x);
  // x is not an integer, so |x| < 2^52 and x - floor(x) is exact.
  const fraction = x - floor;
  const down = BigInt(floor);
  if (fraction < 0.5) return down;
  if (fraction > 0.5) return down + 1n;
  return down % 2n === 0n ? down : down + 1n;
}

/** A time group's seq: `round(ts × 1e6)`, the double product rounded half to even (Python's `round`). */
export function timeWindowSeq(ts: number): bigint {
  return roundHalfToEven(ts * 1e6);
}

/**
 * Canonical identity of an input group (spec `group_identity`), pure and stable across languages.
 *
 * The digest is the first 12 hex characters of SHA-256 over
 * `{window_id or ""}|{parent}={producer}:{trace_id}:{seq}|...` with parents in code-point order, so the
 * order in which members were collected never matters, and a replay of the same members yields the same
 * id. The id is `g-{digest}`, or `tw-{rounded_micros}-{digest}` when `roundedMicros` is given (kept so ids
 * sort by time; distinctness comes from the digest).
 *
 * @param members parent name to the member it contributed.
 * @param windowId the join window or namespace the group formed in (`null` for trace joins).
 */
export function groupIdentity(
  members: MembersByParent<MemberId>,
  windowId: string | null,
  roundedMicros?: Seq | null,
): string {
  const canonical = entriesOf(members)
    .sort(([a], [b]) => compareCodePoints(a, b))
    .map(([parent, m]) => `${parent}=${m.producer}:${m.traceId}:${decimal(m.seq, "seq")}`)
    .join("|");
  const digest = sha256Hex(`${windowId ?? ""}|${canonical}`).slice(0, 12);
  if (roundedMicros === undefined || roundedMicros === null) return `g-${digest}`;
  return `tw-${decimal(roundedMicros, "rounded microseconds")}-${digest}`;
}

/**
 * A 12-hex-character digest of a set of member ids: SHA-256 over them joined by `|` in code-point order.
 * The join is the reference's and is not escaped, so ids containing `|` can alias (`["a", "b"]` and
 * `["a|b"]`); pass ids without it.
 */
export function membersSignature(members: readonly string[]): string {
  return sha256Hex([...members].sort(compareCodePoints).join("|")).slice(0, 12);
}

/**
 * The identity of a time group (RFC 0006 JOIN-23): `ts` is the minimum event time of the synchronized
 * members (a member without one uses its arrival time), `seq = round(ts × 1e6)` half to even,
 * `trace_id = groupIdentity(members, null, seq)` (`tw-{seq}-{digest}`) and `event_ts = ts`. Two distinct
 * groups whose times round to the same microsecond get distinct ids; the same members always regroup to
 * the same one. Pass only the synchronized members present in the group: collect parents and parents a
 * quorum left out are not members.
 */
export function timeGroupIdentity(members: MembersByParent<TimeGroupMember>): GroupTraceIdentity {
  const entries = entriesOf(members);
  if (entries.length === 0) throw new RangeError("a time group has at least one member");
  const ts = Math.min(...entries.map(([, m]) => m.eventTs ?? m.arrivalTs));
  const seq = timeWindowSeq(ts);
  return { traceId: groupIdentity(members, null, seq), seq, eventTs: ts };
}

/**
 * Whether `value` is a usable partition key (RUN-020): a non-empty, well-formed string, a boolean, a
 * bigint, or a JS number holding an integer. Never `null`/`undefined`, `""`, a fractional or non-finite
 * number (Python's float keys are refused too), or a container.
 */
export function isValidPartitionKey(value: unknown): value is PartitionKey {
  switch (typeof value) {
    case "string":
      return value.length > 0 && value.isWellFormed();
    case "boolean":
    case "bigint":
      return true;
    case "number":
      return Number.isInteger(value);
    default:
      return false;
  }
}

/**
 * The string a partition key is hashed as — Python's `str()` of the same key, so replicas of both runtimes
 * agree: a string is itself, a boolean `True`/`False`, an integer its decimal digits (`-0` is `0`).
 *
 * @throws PartitionKeyError when the key is unusable (RUN-020): it is never hashed as the string `None`.
 */
export function partitionKeyString(key: unknown): string {
  if (!isValidPartitionKey(key)) {
    throw unusableKey(key, "a key is a non-empty string, a boolean or an integer");
  }
  if (typeof key === "string") return key;
  if (typeof key === "boolean") return key ? "True" : "False";
  return decimal(key);
}

const KEY_REMEDY = "set the key on every record with ctx.setPartitionKey() and partition by " +
  `"${PARTITION_KEY_METADATA_KEY}" (the metadata field it sets), or partition by "trace_id", or declare ` +
  "partitionKeyPolicy { invalid: 'fallback' } on the node class";

function unusableKey(key: unknown, why: string): PartitionKeyError {
  return new PartitionKeyError(`unusable partition key ${describeKey(key)}: ${why}`, KEY_REMEDY, {
    key_type: key === null ? "null" : typeof key,
  });
}

/**
 * Why the key a node partitioned by `partitionBy` reads from a record is unusable, as the
 * {@link PartitionKeyError} its dead letter carries: it names the field looked for and the metadata fields
 * the record has. `null` when the key is usable.
 */
export function recordKeyError(
  partitionBy: string,
  traceId: string,
  metadata: Readonly<Record<string, unknown>> | null | undefined,
): PartitionKeyError | null {
  const key = partitionKeyOf(partitionBy, traceId, metadata);
  if (isValidPartitionKey(key)) return null;
  const fields = Object.keys(metadata ?? {}).sort();
  const has = fields.length === 0 ? "no metadata fields" : `metadata fields ${fields.join(", ")}`;
  const found = key === undefined ? "the item has no field" : "the item's field is not a usable key in";
  return unusableKey(
    key,
    `${found} ${JSON.stringify(partitionBy)} (partitionBy), and has ${has}; ` +
      "a key is a non-empty string, a boolean or an integer",
  );
}

function describeKey(key: unknown): string {
  if (key === undefined) return "(absent)";
  if (typeof key === "string") return JSON.stringify(key);
  if (typeof key === "number" || typeof key === "bigint" || key === null) return String(key);
  if (Array.isArray(key)) return "(a list)";
  return typeof key === "object" ? "(an object)" : `(a ${typeof key})`;
}

/**
 * The raw partition key of a record: its trace id when the node partitions by `trace_id`, else
 * `metadata[partitionBy]` (`undefined` when the record has no such field). Validation is
 * {@link partitionKeyString}'s.
 */
export function partitionKeyOf(
  partitionBy: string,
  traceId: string,
  metadata: Readonly<Record<string, unknown>> | null | undefined,
): unknown {
  if (partitionBy === "trace_id") return traceId;
  return metadata && Object.hasOwn(metadata, partitionBy) ? metadata[partitionBy] : undefined;
}

/**
 * The replica that owns a record: SHA-256 of the key's string form, its first 8 hex characters read as an
 * unsigned 32-bit integer, modulo `nbTasks`.
 *
 * @throws PartitionKeyError for an unusable key (RUN-020); ConfigError when `nbTasks` is not a positive
 * integer.
 */
export function partitionOwner(key: unknown, nbTasks: number): number {
  if (!Number.isSafeInteger(nbTasks) || nbTasks < 1) {
    throw new ConfigError(`nb_tasks must be a positive integer, got ${nbTasks}`, "declare nb_tasks >= 1");
  }
  return parseInt(sha256Hex(partitionKeyString(key)).slice(0, 8), 16) % nbTasks;
}
