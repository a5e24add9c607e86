/**
 * The messenger's received-set recorder (EOS-7): the ledger writes that note the ids a replica received
 * from a parent under the completion barrier, in group commits.
 *
 * It guarantees: each received batch is noted in one write that runs while the batch is processed; each
 * delivery remembers the write that notes it ({@link ReceivedRecorder.writeOf}), which the messenger's
 * settlement waits for, so an id is never acked unrecorded; one write per parent runs at a time and
 * batches received meanwhile join the next one; a write waits at most {@link RECEIVED_LINGER_SECONDS} for
 * more ids, or until `batchIds` arrived; after a crash (`InFlight.abandon`) a write not begun never begins.
 *
 * @module
 */

import type { Clock } from "../backends/clock.ts";
import type { Delivery } from "../backends/messaging.ts";
import type { FlowRuntime } from "../backends/runtime.ts";

/**
 * How long a received-set write waits, from its batch's first id, for more ids to note in the same write,
 * unless half the messenger's in-flight depth arrive first (so the acks waiting for it never hold the node
 * back): a node taking a few items a second writes a few records a second instead of one per item. A
 * settlement of a delivery waits at most this much longer for the write that notes it.
 */
export const RECEIVED_LINGER_SECONDS = 0.1;

/** A received-set write: the ids it notes, its completion, and a way to send it before its linger is over. */
export interface ReceivedWrite {
  /** The ids the write notes (more join it until it begins). */
  readonly ids: string[];
  /** Settles once the write is done; rejects when it failed. */
  readonly written: Promise<void>;
  /** Ends the linger: the write begins once the one before it is done. */
  readonly ready: () => void;
}

/** The parent a batch was received from: its name and its data subscription's durable name (the set's key). */
export interface ReceivingParent {
  /** The parent's name. */
  readonly name: string;
  /** Its data subscription's durable name. */
  readonly durable: string;
}

/** How a {@link ReceivedRecorder} writes. */
export interface ReceivedRecorderOptions {
  /** The node's ledger. */
  readonly runtime: FlowRuntime;
  /** Ids that send a lingering write at once. */
  readonly batchIds: number;
  /** Whether the replica crashed: no write begins (the messenger's `InFlight`). */
  readonly work: { readonly abandoned: boolean };
  /** Where time and timers come from (the linger). */
  readonly clock: Clock;
}

/** One parent's writes: the one waiting to begin, and the latest begun or queued. */
interface ParentWrites {
  /** Received ids waiting for the write running now to finish, and the write that will note them. */
  recordingNext: ReceivedWrite | null;
  /** The latest received-id write begun or queued. */
  recordingLast: Promise<void>;
}

/** One replica's received-id writes, per parent. */
export class ReceivedRecorder {
  readonly #runtime: FlowRuntime;
  readonly #receivedBatchIds: number;
  readonly #work: { readonly abandoned: boolean };
  readonly #clock: Clock;
  readonly #parents = new Map<string, ParentWrites>();
  /** The ledger write noting a delivery as received (EOS-7), which must be done before it is settled. */
  readonly #recordingOf = new WeakMap<Delivery, ReceivedWrite>();
  /** Received-id writes still running. */
  readonly #recordings = new Set<Promise<void>>();

  /** Writes nothing until a batch is recorded. */
  constructor(options: ReceivedRecorderOptions) {
    this.#runtime = options.runtime;
    this.#receivedBatchIds = options.batchIds;
    this.#work = options.work;
    this.#clock = options.clock;
  }

  /**
   * Notes a received batch's ids in the ledger (EOS-7), which runs while the batch is processed: each
   * delivery of the batch remembers the write that notes it, and the settlement waits for that write
   * before the delivery leaves the broker, so an id is never acked unrecorded. One write per parent runs
   * at a time; batches received meanwhile join the next one (a group commit).
   */
  record(receiving: ReceivingParent, batch: readonly Delivery[]): void {
    const writes = this.#parents.get(receiving.durable) ?? this.#firstWrites(receiving.durable);
    let next = writes.recordingNext;
    if (next === null) {
      const ids: string[] = [];
      const ready = Promise.withResolvers<void>();
      const linger = this.#clock.setTimer(RECEIVED_LINGER_SECONDS, ready.resolve);
      const written = Promise.all([writes.recordingLast, ready.promise]).then(async () => {
        linger.cancel();
        writes.recordingNext = null;
        // A write not begun before a crash never begins: its deliveries, unacked, go to the replacement.
        if (!this.#work.abandoned) {
          await this.#runtime.recordReceivedMany(receiving.name, receiving.durable, ids);
        }
      });
      next = { ids, written, ready: ready.resolve };
      writes.recordingNext = next;
      // The next write follows this one whether or not it failed; a failure is reported by the settles.
      writes.recordingLast = written.catch(() => {});
      this.#recordings.add(written);
      const forget = () => this.#recordings.delete(written);
      written.then(forget, forget);
    }
    for (const delivery of batch) {
      next.ids.push(delivery.token.messageId);
      this.#recordingOf.set(delivery, next);
    }
    if (next.ids.length >= this.#receivedBatchIds) next.ready();
  }

  /** A parent's writes, before its first batch. */
  #firstWrites(durable: string): ParentWrites {
    const writes: ParentWrites = { recordingNext: null, recordingLast: Promise.resolve() };
    this.#parents.set(durable, writes);
    return writes;
  }

  /** The write that notes `delivery` as received, if it was recorded. */
  writeOf(delivery: Delivery): ReceivedWrite | undefined {
    return this.#recordingOf.get(delivery);
  }

  /** Ends every write's linger now (what is waiting is sent, or, after a crash, dropped). */
  sendWaiting(): void {
    for (const parent of this.#parents.values()) parent.recordingNext?.ready();
  }

  /** Resolves once every write begun or queued has finished, whether or not it failed. */
  async finished(): Promise<void> {
    await Promise.allSettled(this.#recordings);
  }
}
