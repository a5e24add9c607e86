/**
 * The messenger's ledger writer: what the ledger is told about this replica's outputs, in batches, and its
 * checkpoints (RUN-003, RUN-022).
 *
 * It guarantees: accepted publication ids (noted only under the EOS-7 barrier, a batch flow over a durable
 * shared ledger) and a replayable source's offset are flushed in batches of {@link LEDGER_FLUSH_BATCH} or
 * every {@link LEDGER_FLUSH_SECONDS}, one flush at a time, each taking what it writes when it starts; an
 * id a failed write did not take is written by the next flush, so it still counts toward EOS's seq; an id
 * is proven published for good only once it was noted; a checkpoint commits the state with the group it
 * covers and any output committed with it in one write, and what counts as saved is the offset that write
 * carried; checkpoint writes go one at a time, so a position save never lands an older state or offset
 * over a newer one; {@link recorded} resolves once every id noted so far is in the ledger. A stale authority on a checkpoint is reported (`onStale`) and thrown. After a crash
 * (`InFlight.abandon`) no write begins.
 *
 * @module
 */

import type { Clock } from "../backends/clock.ts";
import type { FlowRuntime, ReplayPosition } from "../backends/runtime.ts";
import { CoalescedRun } from "../core/coalesced_run.ts";
import { StaleAuthority } from "../core/errors.ts";

/** Accepted publication ids (and a replayable source's offset) noted in the ledger per flush, at most. */
export const LEDGER_FLUSH_BATCH = 256;
/** The longest accepted publications wait before they are noted in the ledger, in seconds. */
export const LEDGER_FLUSH_SECONDS = 1;

/** What a position save writes as the state: the one the last checkpoint write saved. */
const SAVED_STATE = Symbol("the state saved last");

/** What the writer reads of the outputs' identities (`OutputIdentities`). */
export interface LedgerIdentity {
  /** Whether the source is replayable (its offset is saved). */
  readonly replayable: boolean;
  /** The highest offset final with every one before it. */
  readonly lastAcceptedOffset: number;
  /** A live source's capture epoch, or `null`. */
  readonly epoch: string | null;
}

/** How a {@link LedgerWriter} writes. */
export interface LedgerWriterOptions {
  /** The node's ledger. */
  readonly runtime: FlowRuntime;
  /** The outputs' identities. */
  readonly identity: LedgerIdentity;
  /** Whether the replica is a source (its epoch-minted ids are never made again). */
  readonly source: boolean;
  /** Whether the ledger outlives the process (known once the messenger started). */
  readonly durable: () => boolean;
  /** Whether the EOS-7 completion barrier is in force (known once the messenger started). */
  readonly barrierFlow: () => boolean;
  /** The identity of the group in hand, which a checkpoint covers; `null` outside a group. */
  readonly coveredGroup: () => string | null;
  /** Called when a checkpoint finds a newer owner of the partition (StaleAuthority). */
  readonly onStale: () => void;
  /** Whether the replica crashed: no write begins (the messenger's `InFlight`). */
  readonly work: { readonly abandoned: boolean };
  /** Where time comes from (the flush clock). */
  readonly clock: Clock;
}

/** One replica's batched ledger records and checkpoints. */
export class LedgerWriter {
  readonly #runtime: FlowRuntime;
  readonly #identity: LedgerIdentity;
  readonly #source: boolean;
  readonly #durable: () => boolean;
  readonly #barrierFlow: () => boolean;
  readonly #coveredGroup: () => string | null;
  readonly #onStale: () => void;
  readonly #work: { readonly abandoned: boolean };
  readonly #clock: Clock;
  /** The ledger flushes, one after another: what each writes is taken when it starts. */
  readonly #flushes = new CoalescedRun(() => this.#write());
  #flushedOffset = 0;
  #acceptedData = 0;
  #publishedPending: string[] = [];
  /**
   * How many published ids were noted for the ledger's tally, and how many of the first of them (in the
   * order noted) it has recorded: an input is settled only once every output noted for it is recorded.
   */
  #publishedNoted = 0;
  #publishedRecorded = 0;
  /** Published ids proven unique for good (see `FlowRuntime.provePublished`), for the next ledger flush. */
  #publishedProven: string[] = [];
  /**
   * A replayable source's published ids with their offsets, in the order noted, until a saved position
   * covers them; the first `#uncoveredNoted` of them are in the ledger.
   */
  #publishedUncovered: Array<readonly [string, number]> = [];
  #uncoveredNoted = 0;
  #lastFlush = 0;
  #state: Uint8Array | null = null;
  /** The checkpoint writes, one at a time: the last one begun is the last one landed. */
  #checkpoints: Promise<void> = Promise.resolve();

  /** Writes nothing until asked. */
  constructor(options: LedgerWriterOptions) {
    this.#runtime = options.runtime;
    this.#identity = options.identity;
    this.#source = options.source;
    this.#durable = options.durable;
    this.#barrierFlow = options.barrierFlow;
    this.#coveredGroup = options.coveredGroup;
    this.#onStale = options.onStale;
    this.#work = options.work;
    this.#clock = options.clock;
  }

  /** Outputs accepted as new since the start: a realtime EOS's seq. */
  get acceptedCount(): number {
    return this.#acceptedData;
  }

  /** Takes `state` as the last checkpointed one (read back from the ledger), which an offset flush commits again. */
  adoptState(state: Uint8Array | null): void {
    this.#state = state;
  }

  /** Resumes a replayable source whose saved position is `offset`. */
  resume(offset: number): void {
    this.#flushedOffset = offset;
  }

  /** Starts the flush clock: the first timed flush is due {@link LEDGER_FLUSH_SECONDS} from now. */
  begin(): void {
    this.#lastFlush = this.#clock.monotonic();
  }

  /** How many published ids were noted so far (a mark for {@link recorded}). */
  get noted(): number {
    return this.#publishedNoted;
  }

  /**
   * Resolves once the ledger recorded the first `noted` ids noted (EOS-7: an output of an input acked
   * before its id was recorded, by a replica killed meanwhile, would be in no replica's tally, and the
   * terminator's seq would fall short of what the child receives), flushing as needed; at once after a
   * crash.
   */
  async recorded(noted: number): Promise<void> {
    while (this.#publishedRecorded < noted && !this.#work.abandoned) await this.flush();
  }

  /** Proves `ids` published for good with the next flush (their group is never processed again). */
  proveAfterFlush(ids: readonly string[]): void {
    for (const id of ids) this.#publishedProven.push(id);
  }

  /**
   * Counts an accepted output and notes it (unless `toNote` is false: its outbox entry notes it) and a
   * replayable source's offset for the ledger's batch.
   */
  noteAccepted(publicationId: string, offset: number | null, toNote: boolean): Promise<void> | null {
    this.#acceptedData++;
    if (this.#barrierFlow() && toNote) {
      this.#publishedPending.push(publicationId);
      this.#publishedNoted++;
      if (offset !== null && this.#identity.replayable) {
        this.#publishedUncovered.push([publicationId, offset]);
      }
    }
    const offsets = this.#identity.replayable && this.#durable()
      ? this.#identity.lastAcceptedOffset - this.#flushedOffset
      : 0;
    if (this.#publishedPending.length === 0 && offsets === 0) return null;
    const due = this.#publishedPending.length >= LEDGER_FLUSH_BATCH || offsets >= LEDGER_FLUSH_BATCH ||
      this.#clock.monotonic() - this.#lastFlush >= LEDGER_FLUSH_SECONDS;
    return due ? this.flush() : null;
  }

  /**
   * Writes the batched ledger records: accepted publication ids (EOS-7) and a replayable source's offset,
   * after any flush still running (one at a time).
   */
  flush(): Promise<void> {
    return this.#flushes.request();
  }

  async #write(): Promise<void> {
    if (this.#work.abandoned) return;
    this.#lastFlush = this.#clock.monotonic();
    // Taken with the ids to note: every id proven by now was noted before it was proven.
    const proven = this.#publishedProven;
    this.#publishedProven = [];
    if (this.#publishedPending.length > 0) {
      const ids = this.#publishedPending;
      this.#publishedPending = [];
      // Every id noted by now is in `ids` or was recorded by an earlier flush.
      const through = this.#publishedNoted;
      try {
        await this.#runtime.recordPublished(ids);
        this.#publishedRecorded = through;
      } catch (error) {
        // Kept for the next flush: an id the ledger never took must still count toward EOS's seq.
        this.#publishedPending = [...ids, ...this.#publishedPending];
        this.#publishedProven = [...proven, ...this.#publishedProven];
        throw error;
      }
      // A live source mints its ids under a capture epoch of its own process: none is ever made again.
      if (this.#source && this.#identity.epoch !== null) this.#runtime.provePublished(ids);
      if (this.#identity.replayable) this.#uncoveredNoted += ids.length;
    }
    this.#runtime.provePublished(proven);
    if (
      this.#identity.replayable && this.#durable() && this.#identity.lastAcceptedOffset > this.#flushedOffset
    ) {
      await this.commitCheckpoint(SAVED_STATE, {});
    }
    this.#proveCovered();
  }

  /**
   * Proves published the noted outputs of a replayable source that its saved position covers: a resume
   * starts after that position, so they are never made again.
   */
  #proveCovered(): void {
    let covered = 0;
    while (covered < this.#uncoveredNoted && this.#publishedUncovered[covered][1] <= this.#flushedOffset) {
      covered++;
    }
    if (covered === 0) return;
    this.#runtime.provePublished(this.#publishedUncovered.slice(0, covered).map(([id]) => id));
    this.#publishedUncovered.splice(0, covered);
    this.#uncoveredNoted -= covered;
  }

  /**
   * One checkpoint write, after every one begun before it: the state (`SAVED_STATE`: the one the last
   * write saved, read when this one's turn comes, for a position save), the group it covers, the output
   * committed with it (and that output's bytes, so a replacement can confirm it), and a replayable
   * source's last accepted offset. What counts as saved is the offset this write carried: outputs accepted
   * while it was on its way are still to save. One at a time, so that a position save (a quiesce's last
   * flush) never lands an older state over a node's own newer checkpoint, nor an older offset over a
   * newer one.
   */
  commitCheckpoint(state: Uint8Array | null | typeof SAVED_STATE, extra: ReplayPosition): Promise<void> {
    const write = this.#checkpoints.then(() =>
      this.#writeCheckpoint(state === SAVED_STATE ? this.#state : state, extra)
    );
    this.#checkpoints = write.catch(() => {});
    return write;
  }

  async #writeCheckpoint(state: Uint8Array | null, extra: ReplayPosition): Promise<void> {
    const position: Record<string, string | number> = {};
    const group = this.#coveredGroup();
    if (group !== null) position.group = group;
    const offset = this.#identity.lastAcceptedOffset;
    if (this.#identity.replayable) position.offset = offset;
    Object.assign(position, extra);
    try {
      await this.#runtime.checkpoint(state, position);
    } catch (error) {
      if (error instanceof StaleAuthority) this.#onStale();
      throw error;
    }
    this.#state = state;
    if (this.#identity.replayable) this.#flushedOffset = offset;
  }
}
