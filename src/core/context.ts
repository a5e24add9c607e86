/**
 * The runtime context a node's `open`, `next`, `process`, `consume` and `close` receive as their last
 * argument (spec core.context): the run's identity, a logger scoped to the node, and the ledger-backed
 * operations a node may call (checkpoints, output partition key and event time).
 *
 * @module
 */

import type { InputInfo, Messenger } from "./messenger.ts";

/**
 * Reserved metadata key under which a task hands a deferred checkpoint to the messenger's publish, so the
 * state and the output it belongs to commit in one ledger write (RUN-003, RUN-022). Never on the wire.
 */
export const CHECKPOINT_METADATA_KEY = "_checkpoint";

/**
 * Metadata key of the seconds from the start of the work that made an output to its publication: for a
 * receiver, from its input group's receipt; for a producer, from the start of its `next()` (as the
 * reference stamps it).
 */
export const PROCTIME_METADATA_KEY = "proctime";

/** Metadata key of the seconds the node's own call (`next` or `process`) took to make an output. */
export const ACTUAL_PROCTIME_METADATA_KEY = "actual_proctime";

/** Reserved metadata key carrying the business partition key set by `setPartitionKey`. */
export const PARTITION_KEY_METADATA_KEY = "_partition_key";

/** A logger scoped to one node. */
export interface Logger {
  /** Logs `message` with structured `fields` at debug level. */
  debug(message: string, fields?: Record<string, unknown>): void;
  /** Logs `message` with structured `fields` at info level. */
  info(message: string, fields?: Record<string, unknown>): void;
  /** Logs `message` with structured `fields` at warning level. */
  warn(message: string, fields?: Record<string, unknown>): void;
  /** Logs `message` with structured `fields` at error level. */
  error(message: string, fields?: Record<string, unknown>): void;
}

/** The identity of one running node replica. */
export interface RuntimeIdentity {
  /** The flow being run. */
  readonly flowId: string;
  /** The run of the flow. */
  readonly runId: string;
  /** The node this replica runs. */
  readonly nodeName: string;
  /** This replica's index within the node, from 0. */
  readonly replicaId: number;
}

/**
 * Handed to node methods. Without a messenger (a node called outside a run) the ledger operations are
 * no-ops and the readers return `null`.
 */
export class RuntimeContext implements RuntimeIdentity {
  /** The flow being run. */
  readonly flowId: string;
  /** The run of the flow. */
  readonly runId: string;
  /** The node this replica runs. */
  readonly nodeName: string;
  /** This replica's index within the node, from 0. */
  readonly replicaId: number;
  /** Logger scoped to this node. */
  readonly logger: Logger;
  /**
   * Whether an output publication follows each processed input (the task sets it from `has_children`).
   * With an output, a checkpoint becomes durable together with that output; without one, at once.
   */
  emitsOutput = false;
  readonly #messenger: Messenger | null;
  #pendingCheckpoint: Uint8Array | null = null;

  /** A context for `identity`, logging to `logger`; `messenger` is `null` outside a run. */
  constructor(identity: RuntimeIdentity, logger: Logger, messenger: Messenger | null = null) {
    this.flowId = identity.flowId;
    this.runId = identity.runId;
    this.nodeName = identity.nodeName;
    this.replicaId = identity.replicaId;
    this.logger = logger;
    this.#messenger = messenger;
  }

  /**
   * Records the node's serialized state with the identity of the input group being processed, in one
   * ledger write: deferred into the next output publication when the node emits output, written at once
   * otherwise. A no-op without a messenger.
   */
  async checkpoint(state: Uint8Array): Promise<void> {
    if (this.#messenger === null) return;
    if (this.emitsOutput) {
      this.#pendingCheckpoint = state;
      return;
    }
    await this.#messenger.checkpoint(state);
  }

  /** The state bytes of this node's last checkpoint in the run, or `null`. Call it from `open()`. */
  restoreCheckpoint(): Promise<Uint8Array | null> {
    return this.#messenger === null ? Promise.resolve(null) : this.#messenger.restoreCheckpoint();
  }

  /** The deferred checkpoint for the next output publication, cleared once taken (the task's call). */
  takePendingCheckpoint(): Uint8Array | null {
    const state = this.#pendingCheckpoint;
    this.#pendingCheckpoint = null;
    return state;
  }

  /** Sets the event time (epoch seconds) stamped on this node's next published output. */
  setEventTimestamp(value: number): void {
    this.#messenger?.setOutputEventTimestamp(value);
  }

  /** Sets the partition key carried on this node's next output, under `_partition_key` metadata. */
  setPartitionKey(value: unknown): void {
    this.#messenger?.setOutputPartitionKey(value);
  }

  /** Per-parent envelope facts of the input group being processed; `null` for producers. */
  get inputInfo(): Readonly<Record<string, InputInfo | InputInfo[] | null>> | null {
    return this.#messenger?.lastInputInfo() ?? null;
  }

  /** A stable identity of the input group being processed, what an idempotent sink keys on. */
  get inputKey(): string | null {
    return this.#messenger?.lastInputKey() ?? null;
  }

  /**
   * Aborted once the flow asks this replica to stop (the flow-wide stop, or a quiesce): a node waiting a
   * long time inside a call (a live source between reconnections) can return early, a producer with
   * {@link END}. Never aborted without a messenger that signals stops.
   */
  get stopSignal(): AbortSignal {
    return this.#messenger?.stopSignal ?? NEVER_STOPPED;
  }
}

/** The stop signal of a context whose messenger signals no stop. */
const NEVER_STOPPED: AbortSignal = new AbortController().signal;
