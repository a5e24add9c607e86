/**
 * The messenger's output identity (spec messaging.nats_messenger, WIRE.md "Identities"): what trace id, seq
 * and event time the next output carries, and, for a replayable source, which offsets are final.
 *
 * It guarantees: a producer mints `{node}:{n}`, `{node}:{epoch}:{n}` once a durable ledger gave it a capture
 * epoch (MSGID-5: a restarted live source never re-mints a predecessor's ids) or `{node}:{offset}` when
 * replayable (MSGID-6); a receiver carries trace id, seq and event time forward from its input group, never
 * from a clock, so a recomputed output has the same message id. A replayable source's last accepted offset
 * advances only over offsets final with every one before them, so a resume never skips an output still
 * awaiting the broker. The event time and partition key set for the next output are taken by it once.
 *
 * @module
 */

import { ConfigError } from "../core/errors.ts";
import { producerTrace, replayableTraceId, type Seq, sourceEpochTraceId } from "../wire/identities.ts";

/** The identity an output carries: its trace, its event time, and a replayable source's offset. */
export interface OutputIdentity {
  /** The output's trace id. */
  readonly traceId: string;
  /** The output's seq. */
  readonly seq: Seq;
  /** The event time it carries, when its identity has one. */
  readonly eventTs: number | null;
  /** A replayable source's offset; `null` otherwise. */
  readonly offset: number | null;
}

/** The facts of the input group a receiver's output carries forward. */
export interface CarriedIdentity {
  /** The input group's trace id. */
  readonly traceId: string;
  /** The input group's seq. */
  readonly seq: Seq;
  /** The input group's event time. */
  readonly eventTs: number | null;
}

/** How an {@link OutputIdentities} mints. */
export interface OutputIdentityOptions {
  /** The node whose outputs these are. */
  readonly node: string;
  /** Whether the node receives (carries identities forward) rather than produces (mints them). */
  readonly receiver: boolean;
  /** A producer that mints ids from its source offset (MSGID-6). */
  readonly replayable: boolean;
  /** A replayable source's analysis namespace (`{node}:{analysis_version}:{offset}`). */
  readonly analysisVersion: string | null;
}

/** The identities of one replica's outputs, and a replayable source's accepted offsets. */
export class OutputIdentities {
  readonly #node: string;
  readonly #receiver: boolean;
  readonly #replayable: boolean;
  readonly #analysisVersion: string | null;
  /** A replayable producer's offsets minted and not yet final, in order. */
  readonly #offsetsOpen: number[] = [];
  readonly #offsetsFinal = new Set<number>();
  #outEventTs: number | null = null;
  #outPartitionKey: unknown = undefined;
  #count = 0;
  #epoch: string | null = null;
  #nextOffset = 1;
  #lastAcceptedOffset = 0;

  /** Mints nothing yet; the first producer output is `n = 1` (or offset 1). */
  constructor(options: OutputIdentityOptions) {
    this.#node = options.node;
    this.#receiver = options.receiver;
    this.#replayable = options.replayable;
    this.#analysisVersion = options.analysisVersion;
  }

  /** Whether this is a replayable source (ids from source offsets). */
  get replayable(): boolean {
    return this.#replayable;
  }

  /** A live source's capture epoch, once the ledger gave one (`null` otherwise). */
  get epoch(): string | null {
    return this.#epoch;
  }

  /** Mints every later id under `epoch` (a live source over a durable ledger, MSGID-5). */
  adoptEpoch(epoch: string | null): void {
    this.#epoch = epoch;
  }

  /** The highest offset final with every one before it (0 when none). */
  get lastAcceptedOffset(): number {
    return this.#lastAcceptedOffset;
  }

  /** Resumes a replayable source after `last`: the next offset minted is `last + 1`. */
  resume(last: number): void {
    this.#nextOffset = last + 1;
    this.#lastAcceptedOffset = last;
  }

  /**
   * The identity of the next output: minted by a producer, carried forward from `group` by a receiver.
   *
   * @throws ConfigError when a receiver publishes outside an input group.
   */
  next(group: CarriedIdentity | null): OutputIdentity {
    if (this.#receiver) {
      if (group === null) {
        throw new ConfigError(
          `${this.#node} published outside an input group`,
          "publish a receiver's output while processing the group it was received with",
          { node: this.#node },
        );
      }
      return { traceId: group.traceId, seq: group.seq, eventTs: group.eventTs, offset: null };
    }
    if (this.#replayable) {
      const offset = this.#nextOffset++;
      this.#offsetsOpen.push(offset);
      return {
        traceId: replayableTraceId(this.#node, offset, this.#analysisVersion),
        seq: offset,
        eventTs: null,
        offset,
      };
    }
    const n = ++this.#count;
    if (this.#epoch !== null) {
      return { traceId: sourceEpochTraceId(this.#node, this.#epoch, n), seq: n, eventTs: null, offset: null };
    }
    return { ...producerTrace(this.#node, n), eventTs: null, offset: null };
  }

  /**
   * Marks a replayable source's offset final (accepted, or dropped as a live output may be; a reliable
   * output refused for good stays open, so a resume replays it). The last accepted offset advances only
   * over offsets final with every one before them, so a resume never skips an output still awaiting the
   * broker.
   */
  finalOffset(offset: number): void {
    this.#offsetsFinal.add(offset);
    const open = this.#offsetsOpen;
    let done = 0;
    while (done < open.length && this.#offsetsFinal.delete(open[done])) {
      if (open[done] > this.#lastAcceptedOffset) this.#lastAcceptedOffset = open[done];
      done++;
    }
    if (done > 0) open.splice(0, done);
  }

  /**
   * Sets the event time stamped on the next output.
   *
   * @throws ConfigError for a value that is not finite epoch seconds.
   */
  setEventTimestamp(value: number): void {
    if (typeof value !== "number" || !Number.isFinite(value)) {
      throw new ConfigError(
        `an event time must be finite epoch seconds, got ${
          typeof value === "number" ? value : `${typeof value} ${JSON.stringify(value) ?? String(value)}`
        }`,
        "pass Date.now() / 1000",
      );
    }
    this.#outEventTs = value;
  }

  /** The event time set for this output, or `fallback` when none was; the next output starts unset. */
  takeEventTimestamp(fallback: number | null): number | null {
    const eventTs = this.#outEventTs ?? fallback;
    this.#outEventTs = null;
    return eventTs;
  }

  /** Sets the partition key carried on the next output. */
  setPartitionKey(value: unknown): void {
    this.#outPartitionKey = value;
  }

  /** The partition key set for this output (`undefined` when none was); the next output starts unset. */
  takePartitionKey(): unknown {
    const key = this.#outPartitionKey;
    this.#outPartitionKey = undefined;
    return key;
  }
}
