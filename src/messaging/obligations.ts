/**
 * The runtime's own obligation ledger (spec messaging.obligations; BLOB-14 step 4): which payload
 * obligations are still owed, derived from durable records a worker already keeps (its parents' outboxes
 * in the run ledger) and from the broker's own facts (retention and ack floors). No counter, no test-built
 * ledger.
 *
 * For every publication of the judged channels that carries payload refs, the readers its put acquired
 * (`<child>` for a competing child, `<child>/p<i>` for replica i of a partitioned child) owe their
 * release as follows:
 * - a publication the channel evicted (its sequence below the channel's first retained sequence) will never
 *   reach a reader that has not taken it: nobody owes it anything (PAY-012);
 * - otherwise a reader owes while its ack floor on the channel is below the sequence; a floor at or past it
 *   means the reader settled the message, so a release that never happened (a crash after a confirmed ack,
 *   PAY-006) is what reconciliation cancels;
 * - `intent/<publication_id>` is owed while the publication is unresolved; a definitely refused publication
 *   owes nothing at all, intent or readers (PAY-007, PAY-013).
 *
 * Anything that could not be observed (a channel, an ack floor, a sequence) is required: an unobservable
 * release is not a release. The ledger is authoritative only for publishers' intents and for the reader
 * ids it read in the outboxes; an archive's or a dead letter's pin (`archive/*`, `dlq/*`) never.
 *
 * @example
 * ```ts
 * const ledger = new RuntimeObligationLedger(runtime, backend, ["camera", "detector"]);
 * await payloadStore.reconcile(ledger, "reconcile-1");
 * ```
 *
 * @module
 */

import { channelId, type MessagingBackend } from "../backends/messaging.ts";
import type { Observation } from "../backends/outcomes.ts";
import {
  intentObligationId,
  isForeignObligation,
  isIntentObligation,
  type ObligationLedger,
} from "../backends/payload.ts";
import { type FlowRuntime, type OutboxDocument, OutboxOutcome } from "../backends/runtime.ts";
import { dataSubscriptionId } from "./topology.ts";

const PARTITION_READER = /^(.+)\/p(0|[1-9]\d*)$/;

/** What the ledger read of one channel during a pass: its first retained sequence, read once. */
type FirstSequence = Observation<number>;

/**
 * An {@link ObligationLedger} over a node's {@link FlowRuntime} (whose store holds its parents' outboxes)
 * and the {@link MessagingBackend} the run's channels live on.
 */
export class RuntimeObligationLedger implements ObligationLedger {
  readonly #runtime: FlowRuntime;
  readonly #backend: MessagingBackend;
  readonly #channels: readonly string[];
  #readers: ReadonlySet<string> = new Set();

  /**
   * @param runtime the node's ledger.
   * @param backend the transport, for channel retention and ack floors.
   * @param channels the publishing nodes whose obligations to judge: this node's parents, and itself for
   * its own intents.
   */
  constructor(runtime: FlowRuntime, backend: MessagingBackend, channels: readonly string[]) {
    this.#runtime = runtime;
    this.#backend = backend;
    this.#channels = Object.freeze([...new Set(channels)]);
  }

  /**
   * Ref key → obligation ids still required, over every outbox entry with payload refs of the judged
   * channels. A key listed with no ids is one nobody owes anything. Throws UnobservableState (the
   * runtime's) when an outbox cannot be read: then nothing may be reclaimed.
   */
  async requiredObligations(): Promise<ReadonlyMap<string, readonly string[]>> {
    const required = new Map<string, Set<string>>();
    const readers = new Set<string>();
    for (const node of this.#channels) {
      const entries = (await this.#runtime.outboxOf(node)).filter((d) => d.payload_refs.length > 0);
      if (entries.length === 0) continue;
      const first = await this.#firstSequence(node);
      const floors = new Map<string, Promise<Observation<number>>>();
      for (const entry of entries) {
        for (const reader of entry.readers) readers.add(reader);
        const owed = await this.#owed(node, entry, first, floors);
        for (const key of entry.payload_refs) {
          const ids = required.get(key) ?? new Set<string>();
          for (const id of owed) ids.add(id);
          required.set(key, ids);
        }
      }
    }
    this.#readers = readers;
    return new Map([...required].map(([key, ids]) => [key, Object.freeze([...ids].sort())]));
  }

  /**
   * Whether this ledger may cancel `obligationId` when it does not require it: a publisher's intent, or a
   * reader id the last {@link requiredObligations} pass read in an outbox; never an `archive/*` or `dlq/*`
   * pin.
   */
  authoritative(obligationId: string): boolean {
    if (isForeignObligation(obligationId)) return false;
    return isIntentObligation(obligationId) || this.#readers.has(obligationId);
  }

  async #firstSequence(node: string): Promise<FirstSequence> {
    const observed = await this.#backend.observeChannel(
      channelId(this.#runtime.flowId, this.#runtime.runId, node),
    );
    return observed.kind === "known" ? { ...observed, value: observed.value.firstSeq } : observed;
  }

  async #owed(
    node: string,
    entry: OutboxDocument,
    first: FirstSequence,
    floors: Map<string, Promise<Observation<number>>>,
  ): Promise<string[]> {
    switch (entry.outcome) {
      case OutboxOutcome.rejected:
        return [];
      case OutboxOutcome.intent:
      case OutboxOutcome.unknown:
      case OutboxOutcome.unresolvable:
        return [intentObligationId(entry.publication_id), ...entry.readers];
      case OutboxOutcome.accepted:
        break;
    }
    const sequence = entry.sequence;
    if (sequence === null) return [...entry.readers];
    if (first.kind === "known" && sequence < first.value) return [];
    const owed: string[] = [];
    for (const reader of entry.readers) {
      let floor = floors.get(reader);
      if (floor === undefined) {
        floor = this.#ackFloor(node, reader);
        floors.set(reader, floor);
      }
      const observed = await floor;
      if (observed.kind !== "known" || observed.value < sequence) owed.push(reader);
    }
    return owed;
  }

  /** The ack floor of `reader`'s subscription (`<child>` or `<child>/p<i>`) on `node`'s channel. */
  #ackFloor(node: string, reader: string): Promise<Observation<number>> {
    const channel = channelId(this.#runtime.flowId, this.#runtime.runId, node);
    const partitioned = PARTITION_READER.exec(reader);
    const subscription = partitioned === null
      ? dataSubscriptionId(channel, reader)
      : dataSubscriptionId(channel, partitioned[1], Number(partitioned[2]));
    return this.#backend.observeAckFloor(subscription);
  }
}
