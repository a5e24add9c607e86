/**
 * A run's dead letters kept beside its ledger (`<run dir>/dead_letters.jsonl`), so they outlive the
 * embedded broker that held them: one JSON line per dead letter with the node, the error's code and
 * message, the delivery count, and the original envelope's bytes. Written whole through a temporary file
 * and a rename, so a reader never sees half a file. A dead letter whose payload was offloaded to the
 * payload store (its envelope carries only a `BlobRef`) keeps that payload too, in
 * `<run dir>/dead_letter_payloads/<key>`, since the embedded store dies with its run.
 *
 * @module
 */

import { ConfigError, DecodeError, PartitionKeyError } from "../core/errors.ts";
import { DropReason } from "../core/metrics.ts";
import type { Envelope } from "../backends/messaging.ts";
import { DeadLetterHeader } from "../messaging/messenger.ts";
import { decodeEnvelope, decodePayload, type Envelope as WireEnvelope } from "../wire/codec.ts";
import { envelopeMessageId } from "../wire/message_id.ts";
import { BlobRef } from "../wire/value.ts";
import { writingRunState } from "./run_directory.ts";

/** The name of the dead-letter file in a run directory. */
export const DEAD_LETTER_FILE = "dead_letters.jsonl";
/** The directory of a run's dead-lettered offloaded payloads, one file per payload-store key. */
export const DEAD_LETTER_PAYLOADS = "dead_letter_payloads";

/** One dead letter as `vf dlq` shows it. */
export interface DeadLetterRecord {
  /** The dead letter's id (`dlq:{flow}:{run}:{node}:{stream_seq}`). */
  readonly id: string;
  /** The node that gave up on the message (`VF-Origin-Node`). */
  readonly node: string;
  /** The error's stable code, from `VF-Error`. */
  readonly code: string;
  /** The error's message, from `VF-Error`. */
  readonly error: string;
  /** How many times the message was delivered (`VF-Num-Delivered`); null when the header is missing. */
  readonly deliveries: number | null;
  /** The original envelope's size in bytes. */
  readonly size: number;
  /** The original envelope, base64. */
  readonly envelope_b64: string;
  /**
   * For an offloaded payload (the envelope holds its `BlobRef`): its payload type, its size in bytes, and
   * the file under the run directory that keeps its encoded bytes, or `null` when they could not be kept
   * (gone from the store); absent for a payload the envelope carries itself.
   */
  readonly payload?: { readonly type: string; readonly size: number; readonly file: string | null };
}

/** The original envelope a dead letter holds, decoded; null when its bytes do not decode. */
export function letterEnvelope(record: DeadLetterRecord): WireEnvelope | null {
  try {
    return decodeEnvelope(Uint8Array.fromBase64(record.envelope_b64));
  } catch {
    return null;
  }
}

/** The payload-store key of the offloaded payload `record`'s envelope refers to, or null for none. */
export function offloadedKey(
  record: DeadLetterRecord,
): { readonly key: string; readonly type: string; readonly size: number } | null {
  const envelope = letterEnvelope(record);
  if (envelope === null) return null;
  try {
    const value = decodePayload(envelope.payloadType, envelope.payload);
    return value instanceof BlobRef
      ? { key: value.ref, type: value.innerPayloadType, size: Number(value.size) }
      : null;
  } catch {
    return null;
  }
}

/**
 * `records` with every offloaded payload kept under `runDir` ({@link DEAD_LETTER_PAYLOADS}): a payload
 * already kept is not read again; `read` gives a key's bytes, or null once the store no longer has them.
 */
export async function keepOffloadedPayloads(
  runDir: string,
  records: readonly DeadLetterRecord[],
  read: (key: string) => Promise<Uint8Array | null>,
): Promise<DeadLetterRecord[]> {
  const kept: DeadLetterRecord[] = [];
  for (const record of records) {
    const offloaded = record.payload === undefined ? offloadedKey(record) : null;
    if (offloaded === null) {
      kept.push(record);
      continue;
    }
    const file = `${DEAD_LETTER_PAYLOADS}/${encodeURIComponent(offloaded.key)}`;
    const path = `${runDir}/${file}`;
    const present = await Deno.stat(path).then(() => true, () => false);
    const bytes = present ? null : await read(offloaded.key);
    if (bytes !== null) {
      await writingRunState("a dead letter's payload", path, async () => {
        await Deno.mkdir(`${runDir}/${DEAD_LETTER_PAYLOADS}`, { recursive: true });
        await Deno.writeFile(`${path}.tmp`, bytes);
        await Deno.rename(`${path}.tmp`, path);
      });
    }
    const where = present || bytes !== null ? file : null;
    kept.push({ ...record, payload: { type: offloaded.type, size: offloaded.size, file: where } });
  }
  return kept;
}

/** A dead letter's error code and message, read from its `VF-Error` header (`CODE: message`) alone. */
export function deadLetterError(envelope: Envelope): { readonly code: string; readonly error: string } {
  const header = envelope.headers[DeadLetterHeader.error] ?? "";
  const split = header.indexOf(": ");
  return split < 0
    ? { code: header, error: "" }
    : { code: header.slice(0, split), error: header.slice(split + 2) };
}

/** The record of a dead-letter envelope the broker holds. */
export function deadLetterRecord(envelope: Envelope): DeadLetterRecord {
  const headers = envelope.headers;
  const { code, error } = deadLetterError(envelope);
  const delivered = Number(headers[DeadLetterHeader.numDelivered]);
  return {
    id: envelope.publicationId,
    node: headers[DeadLetterHeader.originNode] ?? envelope.channel.node,
    code,
    error,
    deliveries: Number.isSafeInteger(delivered) ? delivered : null,
    size: envelope.body.byteLength,
    envelope_b64: envelope.body.toBase64(),
  };
}

/**
 * Writes `records` as the run's dead-letter file, replacing it whole; a disk that cannot take it is a
 * `diskFailure` naming the file, and the file keeps what it held.
 */
export async function writeDeadLetters(runDir: string, records: readonly DeadLetterRecord[]): Promise<void> {
  const path = `${runDir}/${DEAD_LETTER_FILE}`;
  const temporary = `${path}.tmp`;
  await writingRunState("the dead-letter file", path, async () => {
    await Deno.writeTextFile(temporary, records.map((record) => `${JSON.stringify(record)}\n`).join(""));
    await Deno.rename(temporary, path);
  });
}

/**
 * The run's dead letters: none so far for a run that started (its directory exists) and wrote no
 * dead-letter file yet; ConfigError when no run of that name exists.
 */
export async function readDeadLetters(runDir: string): Promise<DeadLetterRecord[]> {
  const records = await readDeadLettersIfAny(runDir);
  if (records !== null) return records;
  if (await Deno.stat(runDir).then((info) => info.isDirectory, () => false)) return [];
  throw new ConfigError(
    `no run in ${runDir}`,
    "check --run-id and --state: they must name a run that vf run-local started",
    { run_dir: runDir },
  );
}

/**
 * The run's dead letters, or null when the run directory has no dead-letter file (a run that never
 * started); any other read failure is thrown.
 *
 * @throws ConfigError naming the file and line when a line is not a JSON object (the file was edited or
 * damaged outside videoflow).
 */
export async function readDeadLettersIfAny(runDir: string): Promise<DeadLetterRecord[] | null> {
  const path = `${runDir}/${DEAD_LETTER_FILE}`;
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return null;
    throw error;
  }
  return text.split("\n").flatMap((line, index) => line === "" ? [] : [parsedLetter(line, path, index + 1)]);
}

function parsedLetter(line: string, path: string, lineNumber: number): DeadLetterRecord {
  let record: unknown;
  try {
    record = JSON.parse(line);
  } catch {
    record = null;
  }
  if (typeof record !== "object" || record === null || Array.isArray(record)) {
    throw new ConfigError(
      `line ${lineNumber} of the dead-letter file ${path} is not a JSON object`,
      "restore the file from the run's own output, or move it aside to start the run's dead letters afresh",
      { path, line: lineNumber },
    );
  }
  return record as DeadLetterRecord;
}

/** The dead letters of one node when they all carry one error code: how many, the code, and the first's error. */
export interface SharedFailure {
  readonly count: number;
  readonly code: string;
  readonly error: string;
}

/**
 * Node → its {@link SharedFailure}, for every node whose letters in `records` all carry one code; a node
 * with letters of several codes, or none, is absent.
 */
export function sharedFailures(records: readonly DeadLetterRecord[]): Map<string, SharedFailure> {
  const shared = new Map<string, SharedFailure>();
  const mixed = new Set<string>();
  for (const { node, code, error } of records) {
    const failure = shared.get(node);
    if (mixed.has(node)) continue;
    if (failure === undefined) shared.set(node, { count: 1, code, error });
    else if (failure.code === code) shared.set(node, { ...failure, count: failure.count + 1 });
    else {
      shared.delete(node);
      mixed.add(node);
    }
  }
  return shared;
}

/**
 * The dead letters of a run its supervisor restarted: those an earlier supervisor wrote, then the current
 * broker's that are not the same message dead-lettered again by the same node (a replayed source
 * re-publishes the same messages). Earlier records come first and are kept as they were. A new letter
 * whose id an earlier, different letter holds (the new broker numbers its streams from 1 again, and a
 * source that is not replayable makes new messages) is listed as `<id>#2` (`#3`, ...), so that every id
 * names one letter.
 */
export function mergeDeadLetters(
  earlier: readonly DeadLetterRecord[],
  current: readonly DeadLetterRecord[],
): DeadLetterRecord[] {
  const seen = new Set(earlier.map(sameLetter));
  const ids = new Set(earlier.map((record) => record.id));
  const merged = [...earlier];
  for (const record of current) {
    if (seen.has(sameLetter(record))) continue;
    let id = record.id;
    for (let k = 2; ids.has(id); k++) id = `${record.id}#${k}`;
    ids.add(id);
    merged.push(id === record.id ? record : { ...record, id });
  }
  return merged;
}

/**
 * What makes two records the same letter: the node, and the message id of the envelope it failed on (a
 * replayed source re-mints it; its metadata, such as the proctime stamps, may differ), or the envelope's
 * bytes when they do not decode.
 */
function sameLetter(record: DeadLetterRecord): string {
  const envelope = letterEnvelope(record);
  return `${record.node}\n${envelope === null ? record.envelope_b64 : envelopeMessageId(envelope)}`;
}

/**
 * The drop reasons a dead letter is also counted under (a node gives up on the input, then keeps it as a
 * letter), each with the code of the letters that belong to it; `null`: the letters no code places.
 */
const DEAD_LETTER_DROP_REASONS: readonly (readonly [reason: string, code: string | null])[] = [
  [DropReason.undecodable, DecodeError.code],
  [DropReason.partitionKey, PartitionKeyError.code],
  [DropReason.poison, null],
  [DropReason.exhausted, null],
];

/**
 * A node's drops by reason without those its dead letters (their codes, `codes`) account for, so that a
 * dead letter is counted once, as a dead letter: each is taken off the reason its code names (an
 * undecodable input, an unusable partition key), the others off poison, then off exhausted retries. What
 * was given up without a letter (DLQ off, a sample cap, an eviction) stays.
 */
export function dropsBesideDeadLetters(
  drops: Readonly<Record<string, number>>,
  codes: readonly string[],
): Record<string, number> {
  const left: Record<string, number> = { ...drops };
  let unplaced = 0;
  for (const code of codes) {
    const reason = DEAD_LETTER_DROP_REASONS.find(([, own]) => own === code)?.[0];
    if (reason !== undefined && (left[reason] ?? 0) > 0) left[reason]--;
    else unplaced++;
  }
  for (const [reason, code] of DEAD_LETTER_DROP_REASONS) {
    if (code !== null || left[reason] === undefined) continue;
    const taken = Math.min(unplaced, left[reason]);
    left[reason] -= taken;
    unplaced -= taken;
  }
  return Object.fromEntries(Object.entries(left).filter(([, n]) => n > 0));
}
