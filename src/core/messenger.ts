/**
 * The seam a task uses to receive input and write output (spec core.engine.Messenger). A messenger is
 * bound to exactly one node: it knows that node's own subject and its real parents' subjects, and routes
 * by node name, so it works for any DAG.
 *
 * @module
 */

import { known, type Observation } from "../backends/outcomes.ts";
import type { ErrorRecord } from "./errors.ts";

/** Why `checkForTermination()` is true. */
export const StopReason = {
  /** The flow-wide control stop: the flow is ending; a producer still closes its stream with EOS. */
  control: "control",
  /** This process is being stopped; a replacement continues the stream, so no EOS. */
  quiesce: "quiesce",
  /** A replacement took this process's partition over; no EOS either. */
  authorityLost: "authority-lost",
} as const;
/** Why `checkForTermination()` is true. */
export type StopReason = typeof StopReason[keyof typeof StopReason];

/** Per-parent envelope facts of the input group being processed. */
export interface InputInfo {
  /** The parent's event time in epoch seconds; `null` when it had none. */
  readonly eventTs: number | null;
  /** The parent's metadata; `null` when it carried none. */
  readonly metadata: Readonly<Record<string, unknown>> | null;
  /** The parent message's `trace_id`. */
  readonly traceId: string;
  /** The parent message's `seq`: a number when ≤ 2^53 − 1, else a bigint. */
  readonly seq: bigint | number;
}

/** One parent's contribution to a received input group. */
export interface InputEntry {
  /** The decoded payload (a list of payloads for a collect parent). */
  readonly message: unknown;
  /** The message's metadata; `null` when it carried none. */
  readonly metadata: Readonly<Record<string, unknown>> | null;
  /** The message's event time in epoch seconds; `null` when it had none. */
  readonly eventTs: number | null;
  /** The parent ended cleanly. */
  readonly isStopSignal: boolean;
  /** The parent died; `abortOrigin` and `abortError` say where and why. */
  readonly isAbort: boolean;
  /** For an abort, the node that failed first. */
  readonly abortOrigin?: string;
  /** For an abort, that node's error record. */
  readonly abortError?: ErrorRecord;
}

/** A complete input group: exactly one entry per real parent (`null` for a parent a quorum left out). */
export type InputGroup = Readonly<Record<string, InputEntry | null>>;

/**
 * What a task needs from the broker side. Every method that can touch I/O returns a Promise; the
 * messenger guarantees ack-after-process: `ackInputs()` is called by the task only once the node has
 * processed the group (and a processor has published its output).
 */
export interface Messenger {
  /**
   * Resolves with the next complete input group, or one whose entries all signal termination. After
   * `quiesce()` or a lost authority, once nothing is left to hand out, it resolves with such a terminating
   * group too, so the task's loop ends (it reads `stopReason()` and publishes no EOS).
   */
  receiveMessage(): Promise<InputGroup>;
  /**
   * Publishes this node's output; under realtime retention it may be dropped when consumers lag. May
   * resolve before the broker answered: a refusal is thrown by a later call. `onAccepted` runs once the
   * broker took the output as new, not as a duplicate of one it already had (a replay after a restart).
   */
  publishMessage(
    message: unknown,
    metadata?: Record<string, unknown>,
    onAccepted?: () => void,
  ): Promise<void>;
  /** Publishes EOS on this node's subject; never dropped, observed exactly once downstream. */
  publishStopSignal(): Promise<void>;
  /** Publishes ABORT carrying why this node died (one of ours, a bare error, or a relayed record). */
  publishAbort(error: unknown): Promise<void>;
  /**
   * Acknowledges the input group last received, once its outputs were accepted; resolves when that may
   * go on without the node (a failure is thrown by a later call). `onAcked` runs once the broker confirmed
   * the acknowledgement, so a group processed again after a crash is reported once.
   */
  ackInputs(onAcked?: () => void): Promise<void>;
  /**
   * Resolves once every publication and settlement handed to the broker has its outcome; throws the
   * first failure among them.
   */
  awaitInFlight(): Promise<void>;
  /**
   * Reports that the node failed on the last input group; the delivery policy decides the cost. Resolves
   * `true` when the policy gave up on an input of the group (dead-lettered or dropped it), `false` when
   * every input goes back for another attempt (or there was no group).
   */
  failInputs(error: unknown): Promise<boolean>;
  /** Whether a stop was signalled; `stopReason()` says which. */
  checkForTermination(): boolean;
  /** Which stop `checkForTermination` reports, or `null` while the flow runs. */
  stopReason(): StopReason | null;
  /**
   * Aborted once a stop is signalled (when `checkForTermination` turns true), so a long wait inside a
   * node call can end early; absent where stops are only polled.
   */
  readonly stopSignal?: AbortSignal;
  /** Stops receiving new input while settling what is already held. */
  quiesce(): Promise<void>;
  /** Records the node's state with the identity of the group being processed, in one ledger write. */
  checkpoint(state: Uint8Array): Promise<void>;
  /** The last checkpointed state of this node in the run, or `null`. */
  restoreCheckpoint(): Promise<Uint8Array | null>;
  /** For a replayable producer: the last offset whose publication was accepted before a restart. */
  resumeOffset(): Promise<number>;
  /** Sets the event time stamped on the next published output. */
  setOutputEventTimestamp(value: number): void;
  /** Sets the partition key carried on the next published output. */
  setOutputPartitionKey(value: unknown): void;
  /** Per-parent envelope facts of the group last received, or `null` for a producer. */
  lastInputInfo(): Readonly<Record<string, InputInfo | InputInfo[] | null>> | null;
  /** A stable identity of the group last received (same across redelivery and restart), or `null`. */
  lastInputKey(): string | null;
  /** Inputs given up on since the last call, by reason. */
  takeDrops(): Record<string, number>;
  /**
   * How many messages wait for this node across its parents (prefetched, held in incomplete join groups,
   * or still on the broker), as an observation: Unknown as soon as any parent's count could not be read,
   * never a total that silently omits one. It feeds the progress deadline. Optional: a messenger without
   * it cannot count, which {@link pendingObservationOf} reads as Known(0), idle (the spec's default).
   */
  pendingObservation?(): Promise<Observation<number>>;
  /** Releases broker resources. */
  close(): Promise<void>;
}

/**
 * The messenger's pending-work observation, or Known(0) for a messenger that cannot count (so the progress
 * deadline reads it as idle and never trips). What a worker hands `ProgressDeadline` as its probe.
 */
export function pendingObservationOf(messenger: Messenger): Promise<Observation<number>> {
  return messenger.pendingObservation?.() ?? Promise.resolve(known(0));
}
