/**
 * The run ledger (spec backends.runtime.FlowRuntime; RFC 0006 CTRL-4): the durable facts that make
 * processing correct across restarts, kept in any {@link RuntimeStore}.
 *
 * One FlowRuntime serves one replica of one node. It records terminators and received ids (the EOS-7
 * completion barrier), partition leases with ownership epochs and fencing tokens, the publication outbox,
 * attempt counts, the terminal log, pending dead-letter handoffs, open join groups, checkpoints and
 * sink-effect markers, all under `vf/{flow}/{run}/{node}/`.
 *
 * What it guarantees:
 * - Every mutation is one compare-and-swap (or one append) on one key: a fact that has several fields lives
 *   in one record, so a process killed at any instant leaves each fact whole or absent. A write that lost
 *   a race re-reads and decides again; after {@link CAS_RETRIES} lost rounds the caller is told.
 * - Every read is what the store holds. A read that failed throws UnobservableState; a record that does
 *   not parse throws UnobservableState (`malformed`); neither ever reads as empty, zero or complete.
 * - Time comes from the injected {@link Clock}: lease deadlines and effect retention are wall seconds
 *   (`clock.now()`), waits are `clock.sleep`.
 * - It decides no policy: the messenger asks questions (`completionState`, `attemptsFor`) and records
 *   facts. The answers hold only as far as the store's capabilities do: over a memory store every record
 *   is process-local, which `durableShared()` reports.
 *
 * Fault barriers hit here (backends/faults.ts): `terminator.record.after`, `partition.acquire.after`,
 * `partition.renew.before`, `outbox.intend.after`, `group.persist.after`, `checkpoint.commit.after`; the
 * store itself hits the `ledger.write.*` barriers. A DropResponse at one of the `after` barriers makes the
 * call throw UnobservableState although its write took effect (a lost receipt).
 *
 * @example
 * ```ts
 * import { MemoryRuntimeStore } from "./memory/runtime_store.ts";
 * import { known } from "./outcomes.ts";
 * const runtime = new FlowRuntime({
 *   store: new MemoryRuntimeStore(),
 *   flowId: "f",
 *   runId: "r",
 *   node: "detect",
 *   parentReplicas: { cam: 1 },
 * });
 * await runtime.recordReceived("cam", "detect-cam", "m1");
 * await runtime.recordTerminator("cam", 0, "eos", 1);
 * console.log(await runtime.completionState("cam", "detect-cam", known([0, 0]))); // "complete"
 * ```
 *
 * @module
 */

import {
  CapabilityError,
  ConfigError,
  type Disposition,
  isDisposition,
  OwnershipConflict,
  ReplicaDeath,
  ResourceUnavailable,
  StaleAuthority,
  TransientFailure,
  UnobservableState,
  WORKER_FATAL,
} from "../core/errors.ts";
import { isRecord, requireCount, requirePositiveSeconds } from "../core/checks.ts";
import { secondsFromText } from "../core/variables.ts";
import { randomHex } from "../core/hex.ts";
import type { JsonObject, JsonValue } from "../core/node.ts";
import type { MemberId, MembersByParent, Seq } from "../wire/identities.ts";
import { type Clock, systemClock } from "./clock.ts";
import { Barrier, barrier, type BarrierContext, faultsInstalled } from "./faults.ts";
import { IdTally } from "./id_tally.ts";
import { type Observation, type PublicationOutcome, requireKnown } from "./outcomes.ts";
import type { RuntimeCapabilities, RuntimeStore, StoredRecord } from "./runtime_store.ts";

export {
  groupIdentity,
  membersSignature,
  replayableTraceId,
  sourceEpochTraceId,
} from "../wire/identities.ts";

/**
 * How long a partition lease lasts without renewal (`VF_PARTITION_LEASE_SECONDS`), in seconds: a crashed
 * holder's replacement waits at most this long; a live holder renews every third of it. Long enough that
 * a scheduler hiccup does not usurp a paused process, short enough that a crash is not a long outage.
 */
export const DEFAULT_PARTITION_LEASE_SECONDS = 10;

/**
 * How often a running worker reconciles payload obligations (`VF_RECONCILE_INTERVAL_SECONDS`, BLOB-14
 * step 4), in seconds; 0 disables the periodic pass (the start pass always runs).
 */
export const DEFAULT_RECONCILE_INTERVAL_SECONDS = 60;

/** How often a would-be owner re-reads a held lease while waiting for it to lapse, in seconds. */
export const LEASE_POLL_SECONDS = 0.5;

/** The shortest wait between two reads of a held lease, so rounding never turns a wait into a spin. */
const SHORTEST_WAIT_SECONDS = 0.001;

/**
 * How many compare-and-swap rounds a ledger write loses to concurrent writers before the caller is told
 * the store would not take the update (StaleAuthority for a partition, TransientFailure otherwise).
 */
export const CAS_RETRIES = 8;

/** The environment variable {@link partitionLeaseFromEnv} parses. */
export const PARTITION_LEASE_ENV = "VF_PARTITION_LEASE_SECONDS";

/** The environment variable {@link reconcileIntervalFromEnv} parses. */
export const RECONCILE_INTERVAL_ENV = "VF_RECONCILE_INTERVAL_SECONDS";

/** What ended a parent replica's stream: a clean end of stream, or an ABORT carrying the origin error. */
export const TerminatorKind = { eos: "eos", abort: "abort" } as const;
/** What ended a parent replica's stream. */
export type TerminatorKind = typeof TerminatorKind[keyof typeof TerminatorKind];

/** Where a parent stands for this node (EOS-7); see {@link FlowRuntime.completionState}. */
export const CompletionState = {
  /** Some expected parent replica has recorded no terminator yet. */
  open: "open",
  /** Every terminator is in, but received ids, join halves or broker deliveries are still outstanding. */
  draining: "draining",
  /** An ABORT is recorded and the broker holds nothing more from the parent (ABORT-3). */
  aborted: "aborted",
  /** The broker could not be observed: the barrier cannot be decided, and is never taken as complete. */
  unknown: "unknown",
  /** Every terminator in, every announced id received, no half held, nothing pending on the broker. */
  complete: "complete",
} as const;
/** Where a parent stands for this node (EOS-7). */
export type CompletionState = typeof CompletionState[keyof typeof CompletionState];

/** What an outbox entry knows about its send. */
export const OutboxOutcome = {
  /** The intent is recorded; no outcome yet (the send may not have happened, or its outcome was lost). */
  intent: "intent",
  /** The backend took it (a deduplicated retry included); final. */
  accepted: "accepted",
  /** The backend definitely refused it. */
  rejected: "rejected",
  /** The send's outcome was lost: the envelope may be stored. */
  unknown: "unknown",
  /** The backend keeps no history for the id: only this intent can reconcile it. */
  unresolvable: "unresolvable",
} as const;
/** What an outbox entry knows about its send. */
export type OutboxOutcome = typeof OutboxOutcome[keyof typeof OutboxOutcome];

/** What an outbox entry publishes. */
export const PublicationKind = { data: "data", eos: "eos", abort: "abort", dlq: "dlq" } as const;
/** What an outbox entry publishes. */
export type PublicationKind = typeof PublicationKind[keyof typeof PublicationKind];

/** A durable's `(num_pending, num_ack_pending)`, as the messenger reads it from the broker. */
export type PendingCounts = readonly [numPending: number, numAckPending: number];

/** A fencing token: commits carry it, and a commit under a superseded epoch is refused. */
export interface OwnershipToken {
  readonly partitionId: string;
  /** The partition's ownership epoch, incremented by every acquisition. */
  readonly epoch: number;
  /**
   * Minted fresh by every acquisition: the zero-padded epoch, `-`, a random nonce. Tokens of one partition
   * therefore sort (as strings) in the order they were minted.
   */
  readonly fencingToken: string;
}

/** A parent replica's terminator, as recorded before its marker was acked. */
export interface TerminatorRecord {
  readonly parent: string;
  readonly replicaId: number;
  readonly kind: TerminatorKind;
  /** How many distinct DATA messages the replica published (its `publishedCount()`). */
  readonly seq: number;
  /** The error an ABORT carried (an ErrorRecord); null for a clean EOS. */
  readonly error: JsonObject | null;
}

/** What {@link FlowRuntime.commitCompletion} recorded. */
export interface CompletionReceipt {
  readonly partitionId: string;
  /** The partition epoch the completion was committed under. */
  readonly epoch: number;
  /** The parent's final count: the sum of its replicas' terminator seqs. */
  readonly finalSequence: number;
  /** A version of the partition record that holds the completion. */
  readonly version: string;
}

/** One publication in the outbox. */
export interface OutboxEntry {
  readonly publicationId: string;
  readonly digest: string;
  readonly payloadRefs: readonly string[];
  /** The reader obligations the payload put acquired (VF_BLOB_READER_IDS). */
  readonly readers: readonly string[];
  readonly outcome: OutboxOutcome;
  readonly kind: PublicationKind;
  /** The replica that intended it. */
  readonly replicaId: number;
  /** The stream sequence of an accepted publication, when the backend assigned one. */
  readonly sequence: number | null;
}

/**
 * An outbox entry as stored: the raw record {@link FlowRuntime.outboxOf} returns, in the ledger's
 * snake_case, for a reader reconciling the obligations a parent owes.
 */
export interface OutboxDocument {
  readonly publication_id: string;
  readonly digest: string;
  readonly payload_refs: readonly string[];
  readonly readers: readonly string[];
  readonly kind: PublicationKind;
  readonly replica_id: number;
  readonly outcome: OutboxOutcome;
  readonly sequence: number | null;
  readonly duplicate: boolean;
  readonly reason: string | null;
}

/** A dead letter the broker did not accept, kept for a later re-publication under the same id. */
export interface PendingHandoff {
  readonly recordId: string;
  readonly headers: Readonly<Record<string, string>>;
  readonly raw: Uint8Array;
  /** How many times the handoff was recorded (1 for the first failed publish). */
  readonly attempts: number;
}

/** An open join group: its members by logical id and the delivery token of each. */
export interface RecoveryRecord {
  readonly groupId: string;
  /** Parent name to the member it contributed. */
  readonly members: ReadonlyMap<string, MemberId>;
  /** Parent name to the delivery token of that member's latest delivery. */
  readonly tokens: ReadonlyMap<string, string>;
  readonly version: string;
}

/**
 * A checkpoint's replay position: the node's own vocabulary, a JSON object. Two fields have a meaning the
 * runtime reads: `group` (string), the input key of the group the state covers, and `output` (string),
 * the publication id of the output committed with it. A replayable source keeps `offset` (its last
 * accepted offset).
 */
export type ReplayPosition = JsonObject;

/** What {@link FlowRuntime.restoreCheckpoint} found. */
export interface RestoredCheckpoint {
  /** The state bytes, or null when no checkpoint was ever committed. */
  readonly state: Uint8Array | null;
  /** The position committed with the state; `{}` without a checkpoint. */
  readonly replayPosition: ReplayPosition;
  /** The partition epoch the checkpoint was committed under; 0 without one. */
  readonly epoch: number;
  /** The checkpoint record's version; null without one. */
  readonly version: string | null;
}

/**
 * Whether the last checkpoint covers an input group (RUN-003, RUN-022). `covered`: ack the redelivery
 * without handing it to the node. `covered_unconfirmed`: the state covers it, but the output committed
 * with it is not confirmed accepted; reconcile that publication first. `uncovered`: process it.
 */
export type GroupCoverage =
  | { readonly kind: "uncovered" }
  | { readonly kind: "covered"; readonly output: string | null }
  | { readonly kind: "covered_unconfirmed"; readonly output: string };

/** Options of {@link FlowRuntime.intendPublication}. */
export interface IntentOptions {
  readonly payloadRefs?: readonly string[];
  readonly kind?: PublicationKind;
  readonly readers?: readonly string[];
}

/** Options of {@link FlowRuntime.acquirePartition}. */
export interface AcquireOptions {
  /** Refuse (StaleAuthority) when the partition's epoch is no longer this one. */
  readonly expectedEpoch?: number | null;
  /** Wait (at most one lease) for a live lease to lapse; false refuses a live lease at once. Default true. */
  readonly wait?: boolean;
}

/** What a {@link FlowRuntime} is built with. */
export interface FlowRuntimeOptions {
  /** The RuntimeStore (VF_RUNTIME_STORE_URL). */
  readonly store: RuntimeStore;
  /** The ledger's namespace: `vf/{flowId}/{runId}/{node}/`. */
  readonly flowId: string;
  readonly runId: string;
  readonly node: string;
  /** This replica's index within the node; 0 by default. */
  readonly replicaId?: number;
  /** The node's declared replica count; 1 by default. */
  readonly nbTasks?: number;
  /** The node's partition key, when it declares one. */
  readonly partitionBy?: string | null;
  /** Parent name to its replica count (VF_PARENT_REPLICAS, ENV-11); a parent absent has no barrier. */
  readonly parentReplicas?: Readonly<Record<string, number>> | ReadonlyMap<string, number>;
  /** Where time comes from; the system clock by default. */
  readonly clock?: Clock;
  /** The partition lease length in seconds; {@link DEFAULT_PARTITION_LEASE_SECONDS} by default. */
  readonly leaseSeconds?: number;
}

/** A lease renewal running in the background ({@link FlowRuntime.keepLease}). */
export interface LeaseKeeper {
  /** Renewals that took effect so far. */
  readonly renewals: number;
  /** Stops renewing (the lease is kept until it lapses or is released); waits for a renewal in flight. */
  stop(): Promise<void>;
}

/** Options of {@link claimReplicaSlot}: a runtime's options without a replica id, plus the slot count. */
export interface ClaimReplicaSlotOptions extends Omit<FlowRuntimeOptions, "replicaId"> {
  /** How many identities may be claimed: `nbTasks` unless a scaler may run more (VF_REPLICA_SLOTS). */
  readonly slots?: number;
}

// ---------------------------------------------------------------------------------------------------------
// Environment

function secondsFromEnv(name: string, value: string | null | undefined, fallback: number, zero: boolean) {
  if (value === undefined || value === null || value.trim() === "") return fallback;
  return secondsFromText(
    name,
    value.trim(),
    zero,
    String(fallback),
    `or unset it for the default of ${fallback}`,
  );
}

/**
 * `VF_PARTITION_LEASE_SECONDS` parsed: absent (or blank) means {@link DEFAULT_PARTITION_LEASE_SECONDS};
 * a non-positive or non-numeric value is a ConfigError, so a worker fails fast at start.
 */
export function partitionLeaseFromEnv(value: string | null | undefined): number {
  return secondsFromEnv(PARTITION_LEASE_ENV, value, DEFAULT_PARTITION_LEASE_SECONDS, false);
}

/**
 * `VF_RECONCILE_INTERVAL_SECONDS` parsed: absent (or blank) means {@link DEFAULT_RECONCILE_INTERVAL_SECONDS},
 * 0 disables the periodic pass; a negative or non-numeric value is a ConfigError.
 */
export function reconcileIntervalFromEnv(value: string | null | undefined): number {
  return secondsFromEnv(RECONCILE_INTERVAL_ENV, value, DEFAULT_RECONCILE_INTERVAL_SECONDS, true);
}

/**
 * Whether `store`'s records outlive the process that wrote them (durable is Known(true)) and are seen by
 * sibling processes: the gate of the EOS-7 barrier, the partition lease and the ledger budget (D11).
 */
export async function storeSharedAndDurable(store: RuntimeStore): Promise<boolean> {
  const capabilities = await store.capabilities();
  return capabilities.sharedAcrossProcesses && capabilities.durable.kind === "known" &&
    capabilities.durable.value;
}

/** The ledger key of `node`'s record named by `parts` in a run: `vf/{flow}/{run}/{node}/{parts...}`, escaped. */
function ledgerKey(flowId: string, runId: string, node: string, parts: readonly string[]): string {
  return ["vf", flowId, runId, node, ...parts].map(keyPart).join("/");
}

/** The ledger records that count what passed through the broker: EOS-7's terminators and id sets. */
const BROKER_COUNT_KINDS = ["terminator", "received", "published"] as const;

/** Deletes {@link forgetRecords} has outstanding at once (each waits on its own fsync). */
const FORGET_CONCURRENCY = 64;

/**
 * Deletes the records of `nodes` under the ledger kind `kind` that `picks` chooses (all by default);
 * resolves with how many it deleted. A record rewritten meanwhile is left as it is.
 */
async function forgetRecords(
  store: RuntimeStore,
  flowId: string,
  runId: string,
  nodes: readonly string[],
  kind: string,
  picks: (record: StoredRecord) => boolean = () => true,
): Promise<number> {
  let deleted = 0;
  for (const node of nodes) {
    const records = (await store.scan(ledgerKey(flowId, runId, node, [kind]) + "/")).filter(picks);
    for (let at = 0; at < records.length; at += FORGET_CONCURRENCY) {
      const batch = records.slice(at, at + FORGET_CONCURRENCY);
      const done = await Promise.all(batch.map((record) => store.delete(record.key, record.version)));
      deleted += done.filter(Boolean).length;
    }
  }
  return deleted;
}

/**
 * Deletes what a run's ledger counted through its broker, for a run that goes on over a broker that
 * restarted empty (the embedded one dies with its supervisor): the EOS-7 terminators and received and
 * published ids of `nodes`, and their outbox entries of accepted data, which count toward a terminator's
 * seq too. The old broker's messages are gone with it, so a barrier over those counts would wait forever
 * for ids nobody delivers again, or pass on an old terminator. Every other record (checkpoints, attempts,
 * dead letters, effect markers, unresolved intents) stays. Resolves with how many records were deleted.
 */
export async function forgetBrokerCounts(
  store: RuntimeStore,
  flowId: string,
  runId: string,
  nodes: readonly string[],
): Promise<number> {
  let deleted = 0;
  for (const kind of BROKER_COUNT_KINDS) deleted += await forgetRecords(store, flowId, runId, nodes, kind);
  return deleted + await forgetRecords(
    store,
    flowId,
    runId,
    nodes,
    "outbox",
    (record) => {
      const entry = decodeOutbox(parseDocument(record.value, record.key), record.key);
      return entry.kind === PublicationKind.data && entry.outcome === OutboxOutcome.accepted;
    },
  );
}

/**
 * Deletes the checkpoints of `nodes` that hold a replayable source's position (state and offset together,
 * as they were committed), so each such source replays from its start: for a run that goes on after its
 * broker lost what it had accepted and not delivered (a supervisor that died, not one that drained).
 * Resolves with how many checkpoints were deleted.
 */
export async function forgetReplayPositions(
  store: RuntimeStore,
  flowId: string,
  runId: string,
  nodes: readonly string[],
): Promise<number> {
  return await forgetRecords(
    store,
    flowId,
    runId,
    nodes,
    "checkpoint",
    (record) =>
      typeof decodeCheckpoint(parseDocument(record.value, record.key), record.key).replay_position.offset ===
        "number",
  );
}

// ---------------------------------------------------------------------------------------------------------
// Record encoding

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** One key segment: `%` and `/` escaped, so distinct part lists never make one key. */
function keyPart(part: string): string {
  if (typeof part !== "string" || part.length === 0) {
    throw new ConfigError(
      `a ledger key part must be a non-empty string, got ${JSON.stringify(part)}`,
      "name every flow, run, node, parent and id with a non-empty string",
    );
  }
  return part.replaceAll("%", "%25").replaceAll("/", "%2F");
}

function malformed(key: string, why: string): UnobservableState {
  return new UnobservableState(
    `the ledger record ${key} is malformed: ${why}`,
    "the run ledger was damaged or written by an incompatible version; restore it, or start a new run",
    { key, reason: "malformed" },
  );
}

type Fields = Readonly<Record<string, unknown>>;
type Decoder<T> = (fields: Fields, key: string) => T;

function encodeDocument(document: object): Uint8Array {
  return encoder.encode(JSON.stringify(document));
}

function parseDocument(bytes: Uint8Array, key: string): Fields {
  let parsed: unknown;
  try {
    parsed = JSON.parse(decoder.decode(bytes));
  } catch {
    throw malformed(key, "not UTF-8 JSON");
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw malformed(key, "not a JSON object");
  }
  return parsed as Fields;
}

function text(fields: Fields, name: string, key: string): string {
  const value = fields[name];
  if (typeof value !== "string") throw malformed(key, `${name} is not a string`);
  return value;
}

function textOrNull(fields: Fields, name: string, key: string): string | null {
  return fields[name] === null ? null : text(fields, name, key);
}

function count(fields: Fields, name: string, key: string): number {
  const value = fields[name];
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    throw malformed(key, `${name} is not a non-negative integer`);
  }
  return value;
}

function countOrNull(fields: Fields, name: string, key: string): number | null {
  return fields[name] === null ? null : count(fields, name, key);
}

function seconds(fields: Fields, name: string, key: string): number {
  const value = fields[name];
  if (typeof value !== "number" || !Number.isFinite(value)) throw malformed(key, `${name} is not a number`);
  return value;
}

function flag(fields: Fields, name: string, key: string): boolean {
  const value = fields[name];
  if (typeof value !== "boolean") throw malformed(key, `${name} is not a boolean`);
  return value;
}

function object(fields: Fields, name: string, key: string): JsonObject {
  const value = fields[name];
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw malformed(key, `${name} is not an object`);
  }
  return value as JsonObject;
}

function objectOrNull(fields: Fields, name: string, key: string): JsonObject | null {
  return fields[name] === null ? null : object(fields, name, key);
}

function list<T>(fields: Fields, name: string, key: string, item: (value: unknown) => value is T): T[] {
  const value = fields[name];
  if (!Array.isArray(value) || !value.every(item)) throw malformed(key, `${name} is not a list of its items`);
  return value;
}

function oneOf<T extends string>(
  fields: Fields,
  name: string,
  key: string,
  values: Readonly<Record<string, T>>,
) {
  const value = text(fields, name, key);
  if (!(Object.values(values) as string[]).includes(value)) throw malformed(key, `${name} is ${value}`);
  return value as T;
}

const isString = (value: unknown): value is string => typeof value === "string";
const isPair = (value: unknown): value is [string, string] =>
  Array.isArray(value) && value.length === 2 && isString(value[0]) && isString(value[1]);

/** A seq as stored: decimal text, so a bigint survives JSON. */
function seqText(seq: Seq): string {
  if (typeof seq === "bigint") return seq.toString();
  if (!Number.isSafeInteger(seq)) {
    throw new ConfigError(
      `a member's seq must be an integer, got ${seq}`,
      "pass the envelope's seq as it came",
    );
  }
  return String(seq);
}

function seqOf(textValue: string, key: string): Seq {
  if (!/^-?\d+$/.test(textValue)) throw malformed(key, `seq ${JSON.stringify(textValue)} is not an integer`);
  const big = BigInt(textValue);
  return big >= BigInt(Number.MIN_SAFE_INTEGER) && big <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(big) : big;
}

/** Width of the zero-padded epoch at the head of a fencing token, so tokens sort as their epochs do. */
const EPOCH_DIGITS = 15;

function mintFencingToken(epoch: number): string {
  return `${String(epoch).padStart(EPOCH_DIGITS, "0")}-${randomHex(8)}`;
}

function entriesOf<T>(members: MembersByParent<T>): Array<[string, T]> {
  return members instanceof Map ? [...members.entries()] : Object.entries(members as Record<string, T>);
}

// Stored documents (snake_case, one JSON object per key).

interface CompletionDocument {
  readonly parent: string;
  readonly epoch: number;
  readonly final_sequence: number;
}

interface PartitionDocument {
  readonly partition_id: string;
  readonly epoch: number;
  /** Null once released: a released token holds no authority. */
  readonly fencing_token: string | null;
  readonly holder: string | null;
  /** Wall seconds; 0 when released. */
  readonly lease_until: number;
  readonly completed: readonly CompletionDocument[];
}

function decodePartition(fields: Fields, key: string): PartitionDocument {
  return {
    partition_id: text(fields, "partition_id", key),
    epoch: count(fields, "epoch", key),
    fencing_token: textOrNull(fields, "fencing_token", key),
    holder: textOrNull(fields, "holder", key),
    lease_until: seconds(fields, "lease_until", key),
    completed: list(fields, "completed", key, isRecord).map((c) => ({
      parent: text(c, "parent", key),
      epoch: count(c, "epoch", key),
      final_sequence: count(c, "final_sequence", key),
    })),
  };
}

interface TerminatorDocument {
  readonly parent: string;
  readonly replica_id: number;
  readonly kind: TerminatorKind;
  readonly seq: number;
  readonly error: JsonObject | null;
}

function decodeTerminator(fields: Fields, key: string): TerminatorRecord {
  return Object.freeze({
    parent: text(fields, "parent", key),
    replicaId: count(fields, "replica_id", key),
    kind: oneOf(fields, "kind", key, TerminatorKind),
    seq: count(fields, "seq", key),
    error: objectOrNull(fields, "error", key),
  });
}

/** A received or published tally's record: its writer's replica, how many ids it counted, which it names. */
interface TallyRecord {
  readonly replica_id: number;
  readonly count: number;
  readonly message_ids: readonly string[];
}

function decodeTally(fields: Fields, key: string): TallyRecord {
  return {
    replica_id: count(fields, "replica_id", key),
    count: count(fields, "count", key),
    message_ids: list(fields, "message_ids", key, isString),
  };
}

function decodeOutbox(fields: Fields, key: string): OutboxDocument {
  return {
    publication_id: text(fields, "publication_id", key),
    digest: text(fields, "digest", key),
    payload_refs: list(fields, "payload_refs", key, isString),
    readers: list(fields, "readers", key, isString),
    kind: oneOf(fields, "kind", key, PublicationKind),
    replica_id: count(fields, "replica_id", key),
    outcome: oneOf(fields, "outcome", key, OutboxOutcome),
    sequence: countOrNull(fields, "sequence", key),
    duplicate: flag(fields, "duplicate", key),
    reason: textOrNull(fields, "reason", key),
  };
}

function outboxEntryOf(document: OutboxDocument): OutboxEntry {
  return Object.freeze({
    publicationId: document.publication_id,
    digest: document.digest,
    payloadRefs: Object.freeze([...document.payload_refs]),
    readers: Object.freeze([...document.readers]),
    outcome: document.outcome,
    kind: document.kind,
    replicaId: document.replica_id,
    sequence: document.sequence,
  });
}

interface AttemptDocument {
  readonly message_id: string;
  readonly count: number;
  /** How the replica ended that had the message inside its node at the last attempt counted, when one did. */
  readonly death?: ReplicaDeath;
  /** That replica's exit reason, with `death`. */
  readonly death_cause?: string;
}

function decodeAttempts(fields: Fields, key: string): AttemptDocument {
  const document = { message_id: text(fields, "message_id", key), count: count(fields, "count", key) };
  if (fields.death === undefined) return document;
  return {
    ...document,
    death: oneOf(fields, "death", key, ReplicaDeath),
    death_cause: text(fields, "death_cause", key),
  };
}

/** The attempts of a message whose last counted attempt was a replica's death (see `recordReplicaDeath`). */
export interface ReplicaDeathRecord {
  /** Attempts counted against the message's budget, the deaths included. */
  readonly count: number;
  /** How the last replica ended. */
  readonly death: ReplicaDeath;
  /** Its exit reason, as its supervisor described it. */
  readonly cause: string;
}

interface HandoffDocument {
  readonly record_id: string;
  readonly headers: readonly (readonly [string, string])[];
  readonly raw: string;
  readonly attempts: number;
}

function decodeHandoff(fields: Fields, key: string): HandoffDocument {
  return {
    record_id: text(fields, "record_id", key),
    headers: list(fields, "headers", key, isPair),
    raw: text(fields, "raw", key),
    attempts: count(fields, "attempts", key),
  };
}

function base64Bytes(value: string, key: string): Uint8Array {
  try {
    return Uint8Array.fromBase64(value);
  } catch {
    throw malformed(key, "bytes are not base64");
  }
}

function handoffOf(document: HandoffDocument, key: string): PendingHandoff {
  return Object.freeze({
    recordId: document.record_id,
    headers: Object.freeze(Object.fromEntries(document.headers)),
    raw: base64Bytes(document.raw, key),
    attempts: document.attempts,
  });
}

interface GroupMemberDocument {
  readonly parent: string;
  readonly producer: string;
  readonly trace_id: string;
  readonly seq: string;
  readonly token: string;
}

interface GroupDocument {
  readonly group_id: string;
  readonly replica_id: number;
  readonly members: readonly GroupMemberDocument[];
}

function decodeGroup(fields: Fields, key: string): GroupDocument {
  return {
    group_id: text(fields, "group_id", key),
    replica_id: count(fields, "replica_id", key),
    members: list(fields, "members", key, isRecord).map((m) => ({
      parent: text(m, "parent", key),
      producer: text(m, "producer", key),
      trace_id: text(m, "trace_id", key),
      seq: text(m, "seq", key),
      token: text(m, "token", key),
    })),
  };
}

function recoveryRecordOf(document: GroupDocument, version: string, key: string): RecoveryRecord {
  return Object.freeze({
    groupId: document.group_id,
    members: new Map(
      document.members.map((
        m,
      ) => [m.parent, { producer: m.producer, traceId: m.trace_id, seq: seqOf(m.seq, key) }]),
    ),
    tokens: new Map(document.members.map((m) => [m.parent, m.token])),
    version,
  });
}

interface CheckpointDocument {
  readonly partition_id: string;
  readonly epoch: number;
  /** Identifies the write, so the writer can tell its own version from a later one. */
  readonly write_id: string;
  readonly state: string | null;
  readonly replay_position: JsonObject;
  readonly committed_at: number;
}

function decodeCheckpoint(fields: Fields, key: string): CheckpointDocument {
  return {
    partition_id: text(fields, "partition_id", key),
    epoch: count(fields, "epoch", key),
    write_id: text(fields, "write_id", key),
    state: textOrNull(fields, "state", key),
    replay_position: object(fields, "replay_position", key),
    committed_at: seconds(fields, "committed_at", key),
  };
}

interface EffectDocument {
  readonly key: string;
  readonly marked_at: number;
  readonly expires_at: number;
}

function decodeEffect(fields: Fields, key: string): EffectDocument {
  return {
    key: text(fields, "key", key),
    marked_at: seconds(fields, "marked_at", key),
    expires_at: seconds(fields, "expires_at", key),
  };
}

interface SourceEpochDocument {
  readonly replica_id: number;
  readonly epoch: number;
}

function decodeSourceEpoch(fields: Fields, key: string): SourceEpochDocument {
  return { replica_id: count(fields, "replica_id", key), epoch: count(fields, "epoch", key) };
}

function decodeJsonObject(fields: Fields): JsonObject {
  return fields as JsonObject;
}

// ---------------------------------------------------------------------------------------------------------
// Checks

function requireName(value: string, what: string): string {
  if (typeof value !== "string" || value.length === 0) {
    throw new ConfigError(`${what} must be a non-empty string`, `give ${what} a name`);
  }
  return value;
}

function parentReplicaMap(
  given: Readonly<Record<string, number>> | ReadonlyMap<string, number> | undefined,
): ReadonlyMap<string, number> {
  const map = new Map<string, number>();
  for (const [parent, replicas] of entriesOf(given ?? {})) {
    map.set(
      requireName(parent, "a parent name"),
      requireCount(replicas, `the replica count of ${parent}`, 1),
    );
  }
  return map;
}

function ownershipToken(partitionId: string, epoch: number, fencingToken: string): OwnershipToken {
  return Object.freeze({ partitionId, epoch, fencingToken });
}

function leaseLive(document: PartitionDocument, now: number): boolean {
  return document.holder !== null && document.lease_until > now;
}

function sameLease(a: PartitionDocument, b: PartitionDocument): boolean {
  return a.epoch === b.epoch && a.holder === b.holder && a.lease_until === b.lease_until &&
    a.fencing_token === b.fencing_token;
}

function holdsToken(document: PartitionDocument | null, token: OwnershipToken): boolean {
  return document !== null && document.epoch === token.epoch && document.fencing_token === token.fencingToken;
}

function outcomeFields(
  outcome: PublicationOutcome,
): Pick<OutboxDocument, "outcome" | "sequence" | "duplicate" | "reason"> {
  switch (outcome.kind) {
    case "accepted":
      return { outcome: "accepted", sequence: outcome.sequence, duplicate: outcome.duplicate, reason: null };
    case "rejected":
      return { outcome: "rejected", sequence: null, duplicate: false, reason: outcome.reason };
    case "publication_unknown":
      return { outcome: "unknown", sequence: null, duplicate: false, reason: outcome.reason };
    case "publication_unresolvable":
      return { outcome: "unresolvable", sequence: null, duplicate: false, reason: outcome.reason };
  }
}

/** An `after` barrier: a DropResponse there means the write took effect and its receipt was lost. */
async function passAfter(name: Barrier, context: BarrierContext, what: string): Promise<void> {
  if (!faultsInstalled()) return;
  const hit = await barrier(name, context);
  if (hit.dropResponse) {
    throw new UnobservableState(
      `the outcome of ${what} was not received`,
      "re-read the ledger before deciding: the write took effect",
      { ...context, barrier: name, reason: "timeout" },
    );
  }
}

interface Versioned<T> {
  readonly document: T | null;
  readonly version: string | null;
}

interface Change<T> {
  /** The record as this write found it. */
  readonly before: T | null;
  /** The record as this write left it (`before` when nothing was written). */
  readonly after: T | null;
  readonly written: boolean;
}

/** What a change function returns to leave the record as it is. */
const UNCHANGED = Symbol("unchanged");

// ---------------------------------------------------------------------------------------------------------
// FlowRuntime

/**
 * The per-node runtime ledger over any RuntimeStore (see the module comment for its guarantees). Build one
 * per replica with {@link FlowRuntimeOptions}, or let {@link claimReplicaSlot} pick the replica id.
 */
export class FlowRuntime {
  readonly #store: RuntimeStore;
  readonly #flowId: string;
  readonly #runId: string;
  readonly #node: string;
  readonly #replicaId: number;
  readonly #nbTasks: number;
  readonly #partitionBy: string | null;
  readonly #parentReplicas: ReadonlyMap<string, number>;
  readonly #clock: Clock;
  readonly #leaseSeconds: number;
  readonly #holder: string;
  readonly #held = new Map<string, OwnershipToken>();
  #sourceEpoch: Promise<string> | null = null;
  /** This process's tallies of received and published ids, by record key (one writer each: this one). */
  readonly #tallies = new Map<string, IdTally>();

  /** Throws ConfigError for an empty name, a negative replica id, nb_tasks < 1 or a non-positive lease. */
  constructor(options: FlowRuntimeOptions) {
    this.#store = options.store;
    this.#flowId = requireName(options.flowId, "the flow id");
    this.#runId = requireName(options.runId, "the run id");
    this.#node = requireName(options.node, "the node name");
    this.#replicaId = requireCount(options.replicaId ?? 0, "the replica id");
    this.#nbTasks = requireCount(options.nbTasks ?? 1, "nb_tasks", 1);
    this.#partitionBy = options.partitionBy ?? null;
    this.#parentReplicas = parentReplicaMap(options.parentReplicas);
    this.#clock = options.clock ?? systemClock;
    this.#leaseSeconds = requirePositiveSeconds(
      options.leaseSeconds ?? DEFAULT_PARTITION_LEASE_SECONDS,
      "the partition lease",
    );
    this.#holder = `${Deno.pid}-${randomHex(8)}`;
  }

  /** The store the ledger lives in. */
  get store(): RuntimeStore {
    return this.#store;
  }

  /** The flow id of the ledger's namespace. */
  get flowId(): string {
    return this.#flowId;
  }

  /** The run id of the ledger's namespace. */
  get runId(): string {
    return this.#runId;
  }

  /** The node whose ledger this is. */
  get node(): string {
    return this.#node;
  }

  /** This replica's index within the node. */
  get replicaId(): number {
    return this.#replicaId;
  }

  /** The node's declared replica count. */
  get nbTasks(): number {
    return this.#nbTasks;
  }

  /** The node's partition key, or null. */
  get partitionBy(): string | null {
    return this.#partitionBy;
  }

  /** Parent name to the replica count its barrier expects terminators from. */
  get parentReplicas(): ReadonlyMap<string, number> {
    return this.#parentReplicas;
  }

  /** The partition lease length in seconds. */
  get leaseSeconds(): number {
    return this.#leaseSeconds;
  }

  /** This runtime's identity in lease records: the process id and a random nonce, unique per instance. */
  get holder(): string {
    return this.#holder;
  }

  /** What the store guarantees. */
  capabilities(): Promise<RuntimeCapabilities> {
    return this.#store.capabilities();
  }

  /** Whether records here outlive this process and are seen by sibling replicas (the EOS-7 and D11 gate). */
  durableShared(): Promise<boolean> {
    return storeSharedAndDurable(this.#store);
  }

  /**
   * The ledger key `vf/{flow}/{run}/{node}/{parts...}`; each segment has `%` and `/` escaped, so distinct
   * names never share a key and a parent's prefix never covers another parent's keys.
   */
  key(...parts: string[]): string {
    return this.#keyOf(this.#node, parts);
  }

  /** This replica's partition: `p{replicaId}`. */
  partitionId(): string {
    return `p${this.#replicaId}`;
  }

  // ---- terminators and received ids (EOS-7) ------------------------------------------------------------

  /**
   * Records a parent replica's terminator before its marker is acked. Idempotent by (parent, replica, kind):
   * true when the fact is new, false when it was already recorded (a duplicate marker), whose seq and error
   * are then kept as first recorded.
   */
  async recordTerminator(
    parent: string,
    replicaId: number,
    kind: TerminatorKind,
    seq: number,
    error: JsonObject | null = null,
  ): Promise<boolean> {
    requireCount(replicaId, "a terminator's replica id");
    requireCount(seq, "a terminator's seq");
    if (kind !== TerminatorKind.eos && kind !== TerminatorKind.abort) {
      throw new ConfigError(`a terminator is eos or abort, got ${JSON.stringify(kind)}`, "pass eos or abort");
    }
    const document: TerminatorDocument = { parent, replica_id: replicaId, kind, seq, error };
    const key = this.key("terminator", parent, String(replicaId), kind);
    if (!(await this.#store.cas(key, null, encodeDocument(document)))) return false;
    await passAfter(Barrier.terminatorRecordAfter, { key }, `recording terminator ${key}`);
    return true;
  }

  /** Every terminator recorded from `parent`, by replica id then kind. */
  async terminators(parent: string): Promise<TerminatorRecord[]> {
    const records = await this.#scan(this.key("terminator", parent) + "/", decodeTerminator);
    return records.sort((a, b) =>
      a.replicaId - b.replicaId || (a.kind < b.kind ? -1 : a.kind > b.kind ? 1 : 0)
    );
  }

  /** Parents with a recorded ABORT, each with the error it carried (`{}` when none): ABORT-3. */
  async abortedParents(): Promise<ReadonlyMap<string, JsonObject>> {
    const aborted = new Map<string, JsonObject>();
    for (const record of await this.#scan(this.key("terminator") + "/", decodeTerminator)) {
      if (record.kind === TerminatorKind.abort && !aborted.has(record.parent)) {
        aborted.set(record.parent, record.error ?? {});
      }
    }
    return aborted;
  }

  /**
   * Notes a DATA id delivered from `parent` on `durable` ({@link recordReceivedMany} of one id): true when
   * this process had not noted it yet.
   */
  async recordReceived(parent: string, durable: string, messageId: string): Promise<boolean> {
    return await this.recordReceivedMany(parent, durable, [messageId]);
  }

  /**
   * Notes a received batch of DATA ids from `parent` on `durable` in one write, before any of them is
   * acked: this process's received tally for the pair, saved whole (what it noted since its last write, and
   * what it proved meanwhile). True when any id was new to this process; a redelivery counts once in
   * {@link receivedCount}, whichever replica noted it first. An empty batch writes nothing.
   */
  async recordReceivedMany(parent: string, durable: string, messageIds: readonly string[]): Promise<boolean> {
    if (messageIds.length === 0) return false;
    const key = this.#tallyKey("received", parent, durable);
    const tally = this.#tally(key);
    const added = tally.note(messageIds);
    await this.#saveTally(key, tally, { parent, durable });
    return added;
  }

  /**
   * Proves a received id unique for good: its first delivery (attempt 1), which this process noted, was
   * confirmed settled Completed or Terminal, so the broker never delivers it again. Kept in memory; the
   * next write of the tally saves it as a count instead of a name. An id this process did not note, or
   * whose delivery was not its first, must not be given.
   */
  proveReceived(parent: string, durable: string, messageId: string): void {
    this.#tallies.get(this.#tallyKey("received", parent, durable))?.prove(messageId);
  }

  /**
   * How many distinct DATA ids this node's replicas (every process of each) noted from `parent` on
   * `durable`: the ids proven unique, counted, and the union of every other one noted.
   */
  async receivedCount(parent: string, durable: string): Promise<number> {
    let counted = 0;
    const named = new Set<string>();
    for (const record of await this.#scan(this.key("received", parent, durable) + "/", decodeTally)) {
      counted += record.count;
      for (const id of record.message_ids) named.add(id);
    }
    return counted + named.size;
  }

  /**
   * Where `parent` stands for this node (EOS-7). In order: an ABORT recorded → `aborted` once the broker
   * reports nothing pending (`draining` while it does, `unknown` when it cannot be read), whatever the
   * sibling replicas sent (ABORT-3); a replica without a terminator → `open`; received ids short of the
   * terminators' announced total ({@link #announced}: an id two replicas of the parent both published
   * counts once), or a join half held → `draining`; the broker unobservable → `unknown`; deliveries
   * pending → `draining`; otherwise `complete`. Never complete on evidence never obtained.
   *
   * @param observation the durable's `(num_pending, num_ack_pending)` as the messenger read it.
   * @throws ConfigError when `parent` has no barrier (absent from parentReplicas: drain it by EOS-3).
   */
  async completionState(
    parent: string,
    durable: string,
    observation: Observation<PendingCounts>,
    pendingHalves = false,
  ): Promise<CompletionState> {
    const expected = this.#parentReplicas.get(parent);
    if (expected === undefined) {
      throw new ConfigError(
        `parent ${JSON.stringify(parent)} of ${this.#node} has no completion barrier`,
        "drain it with the EOS-3 quiescence drain, or give its replica count in VF_PARENT_REPLICAS",
        { node: this.#node, parent },
      );
    }
    const terminators = await this.terminators(parent);
    const brokerPending = observation.kind === "known"
      ? observation.value[0] > 0 || observation.value[1] > 0
      : null;
    if (terminators.some((t) => t.kind === TerminatorKind.abort)) {
      if (brokerPending === null) return CompletionState.unknown;
      return brokerPending ? CompletionState.draining : CompletionState.aborted;
    }
    if (new Set(terminators.map((t) => t.replicaId)).size < expected) return CompletionState.open;
    const announced = await this.#announced(parent, terminators);
    if ((await this.receivedCount(parent, durable)) < announced || pendingHalves) {
      return CompletionState.draining;
    }
    if (brokerPending === null) return CompletionState.unknown;
    return brokerPending ? CompletionState.draining : CompletionState.complete;
  }

  /** How many distinct DATA ids `parent`'s terminators recorded so far announce (see {@link completionState}). */
  async announcedCount(parent: string): Promise<number> {
    return await this.#announced(parent, await this.terminators(parent));
  }

  /**
   * How many distinct DATA ids `parent`'s terminators announce: the sum of their seqs, less every id that
   * more than one replica of the parent counted. The replicas share their input, so an input a killed
   * replica published for but never acked is redelivered to a sibling, which publishes the same id again
   * (the broker takes it as a duplicate) and counts it too: a plain sum would then wait forever for ids
   * that were never distinct. The ids each replica counted are read from the parent's own records.
   */
  async #announced(parent: string, terminators: readonly TerminatorRecord[]): Promise<number> {
    const counted = terminators.reduce((sum, t) => sum + t.seq, 0);
    const distinct = new Set<string>();
    let noted = 0;
    for (const { named } of (await this.#publishedByReplica(parent)).values()) {
      noted += named.size;
      for (const id of named) distinct.add(id);
    }
    return counted - (noted - distinct.size);
  }

  /**
   * Records that `parent` is complete for this replica's partition (the token's, when one is given), with
   * the parent's final count. Partitions are independent authorities, so the fact lives in the partition's
   * own record and is written by one compare-and-swap that also checks the token: a superseded epoch is
   * refused (StaleAuthority) even when it loses the race between the check and the write. Without a token
   * (and none held) the completion is recorded under the partition's current epoch, unfenced.
   */
  async commitCompletion(parent: string, token: OwnershipToken | null = null): Promise<CompletionReceipt> {
    const partitionId = token?.partitionId ?? this.partitionId();
    const fence = token ?? this.#held.get(partitionId) ?? null;
    const finalSequence = await this.#announced(parent, await this.terminators(parent));
    const key = this.key("partition", partitionId);
    const { after } = await this.#update(key, decodePartition, (current) => {
      if (fence !== null && !holdsToken(current, fence)) throw this.#superseded(fence, current, "commit");
      const base = current ?? this.#unownedPartition(partitionId);
      const completed = base.completed.filter((c) => c.parent !== parent);
      completed.push({ parent, epoch: base.epoch, final_sequence: finalSequence });
      return { ...base, completed };
    }, () => this.#contended(partitionId));
    const epoch = (after as PartitionDocument).epoch;
    const { version } = await this.#versionHolding(
      key,
      decodePartition,
      (d) => d.completed.some((c) => c.parent === parent && c.epoch === epoch),
    );
    return Object.freeze({ partitionId, epoch, finalSequence, version });
  }

  /** Parents this replica's partition (or `partitionId`'s) has committed complete. */
  async completedParents(partitionId: string = this.partitionId()): Promise<ReadonlySet<string>> {
    const { document } = await this.#read(this.key("partition", partitionId), decodePartition);
    return new Set(document?.completed.map((c) => c.parent) ?? []);
  }

  // ---- partitions: leases, epochs, fencing -------------------------------------------------------------

  /**
   * Takes (or retakes) ownership of a partition: the epoch is incremented by compare-and-swap, a fresh
   * fencing token minted, and the lease `{holder, lease_until}` set one lease ahead. A live lease of
   * another holder is waited on until it lapses (polling every {@link LEASE_POLL_SECONDS}, at most one
   * lease length) and refused the moment it changes, since a renewal proves its holder alive (RUN-018,
   * RUN-019); a lapsed or released lease is taken at once.
   *
   * @throws StaleAuthority when `expectedEpoch` no longer matches, or the store would not take the update.
   * @throws OwnershipConflict when another live process holds the lease (at once with `wait: false`).
   */
  async acquirePartition(
    partitionId: string = this.partitionId(),
    options: AcquireOptions = {},
  ): Promise<OwnershipToken> {
    const key = this.key("partition", partitionId);
    const expectedEpoch = options.expectedEpoch ?? null;
    const wait = options.wait ?? true;
    let waitedOn: PartitionDocument | null = null;
    let deadline = Infinity;
    let lost = 0;
    for (;;) {
      const { document, version } = await this.#read(key, decodePartition);
      const epoch = document?.epoch ?? 0;
      if (expectedEpoch !== null && epoch !== expectedEpoch) {
        throw new StaleAuthority(
          `partition ${partitionId} of ${this.#node} moved to epoch ${epoch}; the caller expected ${expectedEpoch}`,
          "another owner took over: stop, and let the current owner proceed",
          { node: this.#node, partition: partitionId, epoch, expected_epoch: expectedEpoch },
        );
      }
      const now = this.#clock.now();
      if (document !== null && leaseLive(document, now) && document.holder !== this.#holder) {
        if (!wait || (waitedOn !== null && !sameLease(waitedOn, document)) || now >= deadline) {
          throw this.#conflict(partitionId, document, waitedOn !== null);
        }
        if (waitedOn === null) {
          waitedOn = document;
          deadline = now + this.#leaseSeconds;
        }
        await this.#clock.sleep(
          Math.max(
            SHORTEST_WAIT_SECONDS,
            Math.min(LEASE_POLL_SECONDS, document.lease_until - now, deadline - now),
          ),
        );
        continue;
      }
      const next: PartitionDocument = {
        partition_id: partitionId,
        epoch: epoch + 1,
        fencing_token: mintFencingToken(epoch + 1),
        holder: this.#holder,
        lease_until: now + this.#leaseSeconds,
        completed: document?.completed ?? [],
      };
      if (await this.#store.cas(key, version, encodeDocument(next))) {
        const token = ownershipToken(partitionId, next.epoch, next.fencing_token as string);
        this.#held.set(partitionId, token);
        await passAfter(
          Barrier.partitionAcquireAfter,
          { key, epoch: next.epoch },
          `acquiring partition ${partitionId}`,
        );
        return token;
      }
      if (++lost >= CAS_RETRIES) throw this.#contended(partitionId);
    }
  }

  /**
   * Extends the lease of a partition this runtime holds by one lease length from now; returns the new
   * `lease_until` (wall seconds). A record that no longer carries the token belongs to another owner (or
   * was released): StaleAuthority.
   */
  async renewPartition(token: OwnershipToken): Promise<number> {
    const key = this.key("partition", token.partitionId);
    if (faultsInstalled()) await barrier(Barrier.partitionRenewBefore, { key, epoch: token.epoch });
    const { after } = await this.#update(key, decodePartition, (current) => {
      if (current === null || !holdsToken(current, token)) throw this.#superseded(token, current, "renewal");
      return { ...current, holder: this.#holder, lease_until: this.#clock.now() + this.#leaseSeconds };
    }, () => this.#contended(token.partitionId));
    return (after as PartitionDocument).lease_until;
  }

  /**
   * Clears the lease on a graceful close so a replacement takes over at once; the epoch stays, the token
   * stops being authority. A superseded token releases nothing.
   */
  async releasePartition(token: OwnershipToken): Promise<void> {
    if (this.#held.get(token.partitionId)?.fencingToken === token.fencingToken) {
      this.#held.delete(token.partitionId);
    }
    await this.#update(
      this.key("partition", token.partitionId),
      decodePartition,
      (current) =>
        current === null || !holdsToken(current, token)
          ? UNCHANGED
          : { ...current, fencing_token: null, holder: null, lease_until: 0 },
      () => this.#contended(token.partitionId),
    );
  }

  /**
   * Renews `token`'s lease every third of a lease on this runtime's clock until stopped: how a live holder
   * proves it is alive. A renewal the store could not confirm (UnobservableState, TransientFailure) is
   * retried at the next tick; a lost authority (StaleAuthority) or any other failure is handed to `onLost`
   * once, and renewing stops: the holder must stop committing.
   */
  keepLease(token: OwnershipToken, onLost: (error: Error) => void): LeaseKeeper {
    const controller = new AbortController();
    let renewals = 0;
    const loop = (async () => {
      for (;;) {
        try {
          await this.#clock.sleep(this.#leaseSeconds / 3, controller.signal);
        } catch {
          return;
        }
        try {
          await this.renewPartition(token);
          renewals++;
        } catch (error) {
          if (error instanceof UnobservableState || error instanceof TransientFailure) continue;
          if (!controller.signal.aborted) onLost(error as Error);
          return;
        }
      }
    })();
    return {
      get renewals() {
        return renewals;
      },
      async stop() {
        controller.abort();
        await loop;
      },
    };
  }

  /** Refuses (StaleAuthority) unless the partition's record still carries `token`'s epoch and fencing token. */
  async checkAuthority(token: OwnershipToken): Promise<void> {
    const { document } = await this.#read(this.key("partition", token.partitionId), decodePartition);
    if (!holdsToken(document, token)) throw this.#superseded(token, document, "commit");
  }

  /** The partition's ownership epoch; 0 for a partition never acquired. */
  async currentEpoch(partitionId: string = this.partitionId()): Promise<number> {
    return (await this.#read(this.key("partition", partitionId), decodePartition)).document?.epoch ?? 0;
  }

  /** The token this runtime holds for the partition, if it acquired it (and has not released it). */
  heldPartition(partitionId: string = this.partitionId()): OwnershipToken | null {
    return this.#held.get(partitionId) ?? null;
  }

  // ---- the publication outbox --------------------------------------------------------------------------

  /**
   * Records the intent to publish before the send; an existing intent is kept as it is (so a retried send
   * reuses it). `readers` are the reader obligations the payload put acquired (VF_BLOB_READER_IDS).
   * Returns a version of the entry.
   */
  async intendPublication(
    publicationId: string,
    digest: string,
    options: IntentOptions = {},
  ): Promise<string> {
    const kind = options.kind ?? PublicationKind.data;
    if (!(Object.values(PublicationKind) as string[]).includes(kind)) {
      throw new ConfigError(`unknown publication kind ${JSON.stringify(kind)}`, "use a PublicationKind");
    }
    const document: OutboxDocument = {
      publication_id: publicationId,
      digest,
      payload_refs: [...(options.payloadRefs ?? [])],
      readers: [...(options.readers ?? [])],
      kind,
      replica_id: this.#replicaId,
      outcome: OutboxOutcome.intent,
      sequence: null,
      duplicate: false,
      reason: null,
    };
    const key = this.key("outbox", publicationId);
    await this.#store.cas(key, null, encodeDocument(document));
    const { version } = await this.#versionHolding(key, decodeOutbox, () => true);
    await passAfter(Barrier.outboxIntendAfter, { key }, `recording the intent of ${publicationId}`);
    return version;
  }

  /**
   * Records a send's outcome on its intent. Accepted is final: a later outcome never overwrites it, and an
   * accepted DATA id (a deduplicated one included) counts once in {@link publishedCount}.
   *
   * @throws ConfigError when no intent was recorded for the id, or the outcome names another id.
   */
  async resolvePublication(publicationId: string, outcome: PublicationOutcome): Promise<void> {
    if (outcome.publicationId !== publicationId) {
      throw new ConfigError(
        `the outcome of ${outcome.publicationId} was given for ${publicationId}`,
        "resolve each publication with its own outcome",
      );
    }
    const key = this.key("outbox", publicationId);
    await this.#update(key, decodeOutbox, (current) => {
      if (current === null) {
        throw new ConfigError(
          `publication ${publicationId} of ${this.#node} has no recorded intent`,
          "call intendPublication before the send",
          { node: this.#node, publication_id: publicationId },
        );
      }
      return current.outcome === OutboxOutcome.accepted
        ? UNCHANGED
        : { ...current, ...outcomeFields(outcome) };
    }, () => this.#busy(key));
  }

  /** The outbox entry of a publication, or null when none was intended. */
  async outboxEntry(publicationId: string): Promise<OutboxEntry | null> {
    const { document } = await this.#read(this.key("outbox", publicationId), decodeOutbox);
    return document === null ? null : outboxEntryOf(document);
  }

  /**
   * This replica's intents whose send was never confirmed (outcome intent or unknown), by publication id:
   * what a restart must reconcile first.
   */
  async unresolvedPublications(): Promise<OutboxEntry[]> {
    return (await this.#outbox(this.#node))
      .filter((d) =>
        d.replica_id === this.#replicaId &&
        (d.outcome === OutboxOutcome.intent || d.outcome === OutboxOutcome.unknown)
      )
      .map(outboxEntryOf);
  }

  /**
   * Every outbox record of `node` in this run, every replica's, as stored (refs, readers, outcome, sequence
   * when accepted): what a reader reconciling a parent's obligations reads.
   */
  async outboxOf(node: string): Promise<OutboxDocument[]> {
    return await this.#outbox(node);
  }

  /**
   * Notes DATA ids this replica published and the backend accepted (a deduplicated retry included), in one
   * write of this process's published tally: the amortized record a publisher keeps instead of an outbox
   * entry per message when nothing else (no payload ref, no checkpoint) needs one. True when any id was
   * new to this process; an empty list writes nothing.
   */
  async recordPublished(messageIds: readonly string[]): Promise<boolean> {
    if (messageIds.length === 0) return false;
    const key = this.#tallyKey("published", String(this.#replicaId));
    const tally = this.#tally(key);
    const added = tally.note(messageIds);
    await this.#saveTally(key, tally, {});
    return added;
  }

  /**
   * Proves published ids unique for good: nothing publishes them again while the broker lives (an output
   * of inputs proven received, a live source's output, a replayable source's output its saved position
   * covers). Kept in memory and saved as a count by the next {@link recordPublished}; an id this process
   * did not note changes nothing.
   */
  provePublished(messageIds: readonly string[]): void {
    const tally = this.#tallies.get(this.#tallyKey("published", String(this.#replicaId)));
    if (tally === undefined) return;
    for (const id of messageIds) tally.prove(id);
  }

  /**
   * Distinct DATA ids this replica published (accepted, deduplicated ones included): the ids its
   * processes' tallies counted or named, together with the accepted data entries of its outbox. Its
   * terminator's seq.
   */
  async publishedCount(): Promise<number> {
    const mine = (await this.#publishedByReplica(this.#node, this.#replicaId)).get(this.#replicaId);
    return mine === undefined ? 0 : mine.counted + mine.named.size;
  }

  /**
   * What each replica of `node` (or only `replicaId`) noted published, by replica id: the ids its tallies
   * proved unique, counted, and the union of the ids they name with the accepted data entries of the node's
   * outbox. A counted id is in no other record, so only named ones can be shared between replicas.
   */
  async #publishedByReplica(
    node: string,
    replicaId: number | null = null,
  ): Promise<Map<number, { counted: number; named: Set<string> }>> {
    const parts = replicaId === null ? ["published"] : ["published", String(replicaId)];
    const byReplica = new Map<number, { counted: number; named: Set<string> }>();
    const of = (replica: number) => {
      let noted = byReplica.get(replica);
      if (noted === undefined) byReplica.set(replica, noted = { counted: 0, named: new Set() });
      return noted;
    };
    for (const record of await this.#scan(this.#keyOf(node, parts) + "/", decodeTally)) {
      const noted = of(record.replica_id);
      noted.counted += record.count;
      for (const id of record.message_ids) noted.named.add(id);
    }
    for (const d of await this.#outbox(node)) {
      if (
        (replicaId === null || d.replica_id === replicaId) && d.kind === PublicationKind.data &&
        d.outcome === OutboxOutcome.accepted
      ) {
        of(d.replica_id).named.add(d.publication_id);
      }
    }
    return byReplica;
  }

  // ---- attempts, terminal log, dead-letter handoffs ----------------------------------------------------

  /**
   * One failed attempt of `messageId` under `disposition`; returns the budgeted count. A worker_fatal
   * failure never counts (the worker, not the message, failed): the count is returned unchanged.
   */
  async recordAttempt(messageId: string, disposition: Disposition): Promise<number> {
    if (!isDisposition(disposition)) {
      throw new ConfigError(
        `unknown disposition ${JSON.stringify(disposition)}`,
        "use poison, transient or worker_fatal",
      );
    }
    if (disposition === WORKER_FATAL) return await this.attemptsFor(messageId);
    const key = this.key("attempts", messageId);
    const { after } = await this.#update(
      key,
      decodeAttempts,
      (current) => ({ message_id: messageId, count: (current?.count ?? 0) + 1 }),
      () => this.#busy(key),
    );
    return (after as AttemptDocument).count;
  }

  /** Failed attempts of `messageId` that count against its budget; 0 when none was recorded. */
  async attemptsFor(messageId: string): Promise<number> {
    return (await this.#read(this.key("attempts", messageId), decodeAttempts)).document?.count ?? 0;
  }

  /**
   * One delivery of `messageId` that was inside the node when its replica died (`death`, with the exit
   * reason `cause`): it counts against the message's budget like a failed attempt, as a broker counts an
   * expired ack wait; returns the budgeted count. A failed attempt recorded later supersedes the death.
   */
  async recordReplicaDeath(messageId: string, death: ReplicaDeath, cause: string): Promise<number> {
    const key = this.key("attempts", messageId);
    const { after } = await this.#update(
      key,
      decodeAttempts,
      (current) => ({ message_id: messageId, count: (current?.count ?? 0) + 1, death, death_cause: cause }),
      () => this.#busy(key),
    );
    return (after as AttemptDocument).count;
  }

  /** The attempts of `messageId` when the last one counted was a replica's death, else null. */
  async replicaDeathOf(messageId: string): Promise<ReplicaDeathRecord | null> {
    const document = (await this.#read(this.key("attempts", messageId), decodeAttempts)).document;
    if (document?.death === undefined) return null;
    return { count: document.count, death: document.death, cause: document.death_cause ?? "" };
  }

  /**
   * Appends a terminal record (a delivery ended without a dead letter, DELIV-15) to this node's terminal
   * log; returns its reference `{log}#{n}`, what a Terminal settlement names.
   */
  async recordTerminal(record: JsonObject): Promise<string> {
    const log = this.key("terminal");
    const index = await this.#store.append(log, encodeDocument(record));
    return `${log}#${index}`;
  }

  /** Every terminal record of this node, oldest first. */
  async terminalEntries(): Promise<JsonObject[]> {
    const log = this.key("terminal");
    return (await this.#store.logEntries(log)).map((bytes, i) =>
      decodeJsonObject(parseDocument(bytes, `${log}#${i + 1}`))
    );
  }

  /** The terminal record `reference` names, or null when this node's log holds none under it. */
  async terminalRecord(reference: string): Promise<JsonObject | null> {
    const log = this.key("terminal");
    const index = reference.startsWith(`${log}#`) ? reference.slice(log.length + 1) : "";
    if (!/^[1-9]\d*$/.test(index)) return null;
    const entries = await this.#store.logEntries(log);
    const bytes = entries[Number(index) - 1];
    return bytes === undefined ? null : decodeJsonObject(parseDocument(bytes, reference));
  }

  /**
   * The terminal record `reference` names; a terminal settlement is refused without one (DELIV-15).
   *
   * @throws ResourceUnavailable when the reference names no record in this node's terminal log.
   */
  async requireTerminalRecord(reference: string): Promise<JsonObject> {
    const record = await this.terminalRecord(reference);
    if (record === null) {
      throw new ResourceUnavailable(
        `${JSON.stringify(reference)} names no record in the terminal log of ${this.#node}`,
        "terminate a delivery only against a dead letter's id or a reference recordTerminal returned",
        { node: this.#node, reference },
      );
    }
    return record;
  }

  /**
   * Keeps a dead letter the broker did not accept, so a later attempt (or a restart) re-publishes it under
   * the same id. Recording an id again counts one more attempt and keeps the first headers and bytes.
   */
  async recordPendingHandoff(
    recordId: string,
    headers: Readonly<Record<string, string>>,
    raw: Uint8Array,
  ): Promise<void> {
    const key = this.key("handoff", recordId);
    await this.#update(
      key,
      decodeHandoff,
      (current) =>
        current === null
          ? { record_id: recordId, headers: Object.entries(headers), raw: raw.toBase64(), attempts: 1 }
          : { ...current, attempts: current.attempts + 1 },
      () => this.#busy(key),
    );
  }

  /** Every pending dead-letter handoff of this node (any replica's), by record id. */
  async pendingHandoffs(): Promise<PendingHandoff[]> {
    const prefix = this.key("handoff") + "/";
    const records = await this.#store.scan(prefix);
    return records.map((r) => handoffOf(decodeHandoff(parseDocument(r.value, r.key), r.key), r.key));
  }

  /** Forgets a handoff once its dead letter was accepted; a no-op when it is already gone. */
  async clearPendingHandoff(recordId: string): Promise<void> {
    await this.#store.delete(this.key("handoff", recordId), null);
  }

  // ---- open join groups --------------------------------------------------------------------------------

  /**
   * Records a group's members by logical id as they arrive, merged into what is recorded (idempotent; a
   * redelivered member replaces its token). Every member needs a token. Returns the recovery record.
   */
  async persistGroup(
    groupId: string,
    members: MembersByParent<MemberId>,
    tokens: MembersByParent<string>,
  ): Promise<RecoveryRecord> {
    const tokenOf = new Map(entriesOf(tokens));
    const arriving = entriesOf(members).map(([parent, m]): GroupMemberDocument => {
      const token = tokenOf.get(parent);
      if (token === undefined) {
        throw new ConfigError(
          `member ${parent} of group ${groupId} has no delivery token`,
          "pass one token a member",
        );
      }
      return { parent, producer: m.producer, trace_id: m.traceId, seq: seqText(m.seq), token };
    });
    const key = this.#groupKey(groupId);
    await this.#update(key, decodeGroup, (current) => {
      const kept = (current?.members ?? []).filter((m) => !arriving.some((a) => a.parent === m.parent));
      return { group_id: groupId, replica_id: this.#replicaId, members: [...kept, ...arriving] };
    }, () => this.#busy(key));
    const holdsArrivals = (d: GroupDocument) =>
      arriving.every((a) =>
        d.members.some((m) => m.parent === a.parent && m.token === a.token && m.seq === a.seq)
      );
    const { document, version } = await this.#versionHolding(key, decodeGroup, holdsArrivals);
    await passAfter(Barrier.groupPersistAfter, { key }, `persisting group ${groupId}`);
    return recoveryRecordOf(document, version, key);
  }

  /** The members recorded for an open group of this replica, or null when no such group is open. */
  async groupMembers(groupId: string): Promise<ReadonlyMap<string, MemberId> | null> {
    const key = this.#groupKey(groupId);
    const { document, version } = await this.#read(key, decodeGroup);
    return document === null ? null : recoveryRecordOf(document, version as string, key).members;
  }

  /** This replica's open groups (persisted, not settled), by group id: what a replacement restores. */
  async openGroups(): Promise<RecoveryRecord[]> {
    const records = await this.#store.scan(this.key("group", String(this.#replicaId)) + "/");
    return records.map((r) =>
      recoveryRecordOf(decodeGroup(parseDocument(r.value, r.key), r.key), r.version, r.key)
    );
  }

  /** Closes a group once its outputs are published and its inputs acked; a no-op when it is not open. */
  async settleGroup(groupId: string): Promise<void> {
    await this.#store.delete(this.#groupKey(groupId), null);
  }

  // ---- checkpoints, source epochs, effect markers ------------------------------------------------------

  /**
   * Commits the node's state and its replay position in one compare-and-swap, so both always describe the
   * same committed prefix (RUN-003, RUN-022); the position carries the output committed with the state
   * (`output`). A null state records a position without state (a replayable source's offset before its
   * node ever checkpointed): {@link restoreCheckpoint} then reads a null state. Refused on a ledger that
   * dies with the process (RUN-022) and under a superseded epoch (RUN-023): when this runtime holds its
   * partition the token is checked, and a checkpoint written under a newer epoch is never overwritten.
   * Returns the checkpoint's version.
   *
   * @throws CapabilityError when the store is not durable; UnobservableState when its durability is Unknown.
   * @throws StaleAuthority under a superseded epoch.
   */
  async checkpoint(state: Uint8Array | null, replayPosition: ReplayPosition): Promise<string> {
    const durable = requireKnown(
      (await this.#store.capabilities()).durable,
      "the runtime store's durability",
    );
    if (!durable) {
      throw new CapabilityError(
        `a checkpoint of ${this.#node} was refused: the runtime store does not outlive this process`,
        "set VF_RUNTIME_STORE_URL to a durable store (file://<dir> or redis://) to checkpoint state",
        { node: this.#node, rule: "RUN-022" },
      );
    }
    const partitionId = this.partitionId();
    const token = this.#held.get(partitionId) ?? null;
    if (token !== null) await this.checkAuthority(token);
    const epoch = token?.epoch ?? await this.currentEpoch(partitionId);
    const writeId = randomHex(12);
    const key = this.key("checkpoint", partitionId);
    await this.#update(key, decodeCheckpoint, (current) => {
      if (current !== null && current.epoch > epoch) {
        throw new StaleAuthority(
          `a checkpoint of ${this.#node} under epoch ${epoch} was refused: epoch ${current.epoch} already committed one`,
          "a newer owner took over this partition: stop, and let it proceed",
          { node: this.#node, partition: partitionId, epoch, current_epoch: current.epoch },
        );
      }
      return {
        partition_id: partitionId,
        epoch,
        write_id: writeId,
        state: state === null ? null : state.toBase64(),
        replay_position: replayPosition,
        committed_at: this.#clock.now(),
      };
    }, () => this.#busy(key));
    const { version } = await this.#versionHolding(key, decodeCheckpoint, (d) => d.write_id === writeId);
    await passAfter(
      Barrier.checkpointCommitAfter,
      { key, epoch, offset: replayPosition.offset ?? null },
      `committing the checkpoint of ${this.#node}`,
    );
    return version;
  }

  /** The last checkpoint of this replica's partition: state, position, epoch and version (null/{} without). */
  async restoreCheckpoint(): Promise<RestoredCheckpoint> {
    const key = this.key("checkpoint", this.partitionId());
    const { document, version } = await this.#read(key, decodeCheckpoint);
    if (document === null) return Object.freeze({ state: null, replayPosition: {}, epoch: 0, version: null });
    return Object.freeze({
      state: document.state === null ? null : base64Bytes(document.state, key),
      replayPosition: document.replay_position,
      epoch: document.epoch,
      version,
    });
  }

  /**
   * Whether the last checkpoint covers the input group `inputKey` (its `group`), and whether the output
   * committed with it (its `output`) is confirmed accepted in the outbox (RUN-003, RUN-022).
   */
  async checkpointCoverage(inputKey: string): Promise<GroupCoverage> {
    const { replayPosition } = await this.restoreCheckpoint();
    if (replayPosition.group !== inputKey) return { kind: "uncovered" };
    const output: JsonValue | undefined = replayPosition.output;
    if (typeof output !== "string") return { kind: "covered", output: null };
    const entry = await this.outboxEntry(output);
    return entry?.outcome === OutboxOutcome.accepted
      ? { kind: "covered", output }
      : { kind: "covered_unconfirmed", output };
  }

  /**
   * This process's capture epoch for a live source (MSGID-5): a per-replica counter incremented once per
   * FlowRuntime (the first call), so a restarted source never re-mints a predecessor's ids. Decimal text.
   */
  sourceEpoch(): Promise<string> {
    if (this.#sourceEpoch === null) {
      const key = this.key("source_epoch", String(this.#replicaId));
      const next = this.#update(
        key,
        decodeSourceEpoch,
        (current) => ({ replica_id: this.#replicaId, epoch: (current?.epoch ?? 0) + 1 }),
        () => this.#busy(key),
      ).then(({ after }) => String((after as SourceEpochDocument).epoch));
      this.#sourceEpoch = next;
      next.catch(() => {
        if (this.#sourceEpoch === next) this.#sourceEpoch = null;
      });
    }
    return this.#sourceEpoch;
  }

  /**
   * Marks an effect as applied for `retentionSeconds` (RUN-017); false when it already was, within its
   * retention. A marker is evidence this runtime applied the effect, never a proof of exactly-once.
   */
  async markEffect(key: string, retentionSeconds: number): Promise<boolean> {
    requirePositiveSeconds(retentionSeconds, "an effect marker's retention");
    const recordKey = this.key("effect", key);
    const now = this.#clock.now();
    const { written } = await this.#update(
      recordKey,
      decodeEffect,
      (current) =>
        current !== null && current.expires_at > now
          ? UNCHANGED
          : { key, marked_at: now, expires_at: now + retentionSeconds },
      () => this.#busy(recordKey),
    );
    return written;
  }

  /** Whether an effect was marked and its retention has not passed. */
  async effectSeen(key: string): Promise<boolean> {
    const { document } = await this.#read(this.key("effect", key), decodeEffect);
    return document !== null && document.expires_at > this.#clock.now();
  }

  // ---- internals ---------------------------------------------------------------------------------------

  #keyOf(node: string, parts: readonly string[]): string {
    return ledgerKey(this.#flowId, this.#runId, node, parts);
  }

  /** The key of this process's tally under `parts`: one record per writer, named by replica and holder. */
  #tallyKey(...parts: string[]): string {
    return this.key(...parts, `tally:${this.#replicaId}:${this.#holder}`);
  }

  #tally(key: string): IdTally {
    let tally = this.#tallies.get(key);
    if (tally === undefined) this.#tallies.set(key, tally = new IdTally());
    return tally;
  }

  /**
   * Writes `tally` whole over its record, which only this process writes: the state saved is the one in
   * memory when the swap is made, so whichever of two overlapping writes lands last holds everything
   * either was called with.
   */
  async #saveTally(key: string, tally: IdTally, fields: JsonObject): Promise<void> {
    await this.#update(key, decodeTally, (): TallyRecord => {
      const { count, ids } = tally.document();
      return { ...fields, replica_id: this.#replicaId, count, message_ids: ids };
    }, () => this.#busy(key));
  }

  #groupKey(groupId: string): string {
    return this.key("group", String(this.#replicaId), groupId);
  }

  async #outbox(node: string): Promise<OutboxDocument[]> {
    return await this.#scan(this.#keyOf(node, ["outbox"]) + "/", decodeOutbox);
  }

  async #read<T>(key: string, decode: Decoder<T>): Promise<Versioned<T>> {
    const entry = await this.#store.get(key);
    if (entry.kind === "absent") return { document: null, version: null };
    return { document: decode(parseDocument(entry.value, key), key), version: entry.version };
  }

  async #scan<T>(prefix: string, decode: Decoder<T>): Promise<T[]> {
    return (await this.#store.scan(prefix)).map((r) => decode(parseDocument(r.value, r.key), r.key));
  }

  /**
   * Read, change, compare-and-swap, until the swap wins: `change` sees the current record (null when
   * absent) and returns the next one, or {@link UNCHANGED}; it may throw to refuse. After
   * {@link CAS_RETRIES} lost swaps, throws what `exhausted` makes.
   */
  async #update<T extends object>(
    key: string,
    decode: Decoder<T>,
    change: (current: T | null) => T | typeof UNCHANGED,
    exhausted: () => Error,
  ): Promise<Change<T>> {
    for (let round = 0; round < CAS_RETRIES; round++) {
      const { document, version } = await this.#read(key, decode);
      const next = change(document);
      if (next === UNCHANGED) return { before: document, after: document, written: false };
      if (await this.#store.cas(key, version, encodeDocument(next))) {
        return { before: document, after: next, written: true };
      }
    }
    throw exhausted();
  }

  /**
   * The version of `key` after a write, read back: the store's compare-and-swap reports no version. When
   * the record no longer holds what was written (a later writer replaced it), the write's version cannot
   * be observed: UnobservableState, although the write took effect.
   */
  async #versionHolding<T>(
    key: string,
    decode: Decoder<T>,
    holds: (document: T) => boolean,
  ): Promise<{ readonly document: T; readonly version: string }> {
    const { document, version } = await this.#read(key, decode);
    if (document === null || version === null || !holds(document)) {
      throw new UnobservableState(
        `the version of the ledger record ${key} could not be read back: a later write replaced it`,
        "re-read the ledger before deciding: this write took effect",
        { key, reason: "window" },
      );
    }
    return { document, version };
  }

  #unownedPartition(partitionId: string): PartitionDocument {
    return {
      partition_id: partitionId,
      epoch: 0,
      fencing_token: null,
      holder: null,
      lease_until: 0,
      completed: [],
    };
  }

  #superseded(token: OwnershipToken, current: PartitionDocument | null, what: string): StaleAuthority {
    const why = current === null
      ? "the partition has no ownership record"
      : current.fencing_token === null
      ? `the lease was released at epoch ${current.epoch}`
      : `epoch ${current.epoch} superseded it`;
    return new StaleAuthority(
      `the ${what} of ${this.#node} under epoch ${token.epoch} of partition ${token.partitionId} was refused: ${why}`,
      "this process no longer owns the partition: stop, and let the current owner proceed",
      {
        node: this.#node,
        partition: token.partitionId,
        epoch: token.epoch,
        current_epoch: current?.epoch ?? 0,
      },
    );
  }

  #conflict(partitionId: string, held: PartitionDocument, waited: boolean): OwnershipConflict {
    return new OwnershipConflict(
      `partition ${partitionId} of ${this.#node} is held by live process ${held.holder} (epoch ${held.epoch}` +
        (waited ? ", which renewed its lease while this process waited)" : ")"),
      "an extra replica of a singleton or a partition cannot bind: scale the node down, or declare more " +
        "replicas (nb_tasks / VF_REPLICA_SLOTS) instead of adding processes",
      { node: this.#node, partition: partitionId, holder: held.holder, epoch: held.epoch },
    );
  }

  #contended(partitionId: string): StaleAuthority {
    return new StaleAuthority(
      `the store would not take the update of partition ${partitionId} of ${this.#node}: ` +
        `${CAS_RETRIES} compare-and-swaps lost to concurrent writers`,
      "another process is writing the partition: stop, and let the current owner proceed",
      { node: this.#node, partition: partitionId },
    );
  }

  #busy(key: string): TransientFailure {
    return new TransientFailure(
      `the ledger record ${key} changed under ${CAS_RETRIES} consecutive compare-and-swaps`,
      "retry: concurrent writers are contending for one ledger record",
      { key },
    );
  }
}

/**
 * A replica id for a process that was given none (ENV-5 step 3): the lowest slot `0..slots-1` whose
 * partition lease is free or lapsed, claimed through the ledger, and the FlowRuntime that holds it. Free
 * and lapsed slots are probed first without waiting; when none is, each live slot is waited on in turn
 * (at most one lease each; a renewal proves its holder alive). A crashed pod's replacement resumes that
 * pod's slot, and with it its ledger (unresolved intents, open groups), once the lease lapses.
 *
 * @throws OwnershipConflict when every slot is held under a live lease: this process is an extra replica
 * (RUN-018).
 */
export async function claimReplicaSlot(options: ClaimReplicaSlotOptions): Promise<FlowRuntime> {
  const slots = requireCount(options.slots ?? options.nbTasks ?? 1, "the replica slot count", 1);
  const candidates = Array.from(
    { length: slots },
    (_, replicaId) => new FlowRuntime({ ...options, replicaId }),
  );
  for (const wait of [false, true]) {
    for (const runtime of candidates) {
      try {
        await runtime.acquirePartition(runtime.partitionId(), { wait });
        return runtime;
      } catch (error) {
        if (!(error instanceof OwnershipConflict)) throw error;
      }
    }
  }
  throw new OwnershipConflict(
    `every one of the ${slots} replica slot(s) of ${options.node} is held under a live lease`,
    "this process is an extra replica: scale the node down, or raise VF_REPLICA_SLOTS when a scaler wants more",
    { node: options.node, slots },
  );
}
