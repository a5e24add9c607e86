/**
 * The messenger's input settlement: how a held delivery leaves this replica, once, in a batch call.
 *
 * It guarantees: a delivery is settled (or retired) at most once; a settlement other than a retry waits
 * for the ledger write noting the delivery as received (EOS-7), so an id is never acked unrecorded; after
 * a crash (`InFlight.abandon`) a settlement that waited across it never reaches the broker; a first
 * delivery settled for good is proven received; a reader's payload obligation is released only after a
 * confirmed Completed or Terminal settlement, never on SettleUnknown (PAY-004); a delivery a newer attempt
 * replaced is retired without a broker settlement (MSG-011).
 *
 * @module
 */

import type {
  Delivery,
  MessagingBackend,
  Settlement as BackendSettlement,
  SettlementOutcome,
  SettleRequest,
} from "../backends/messaging.ts";
import type { FlowRuntime } from "../backends/runtime.ts";
import { CallBatcher } from "./call_batcher.ts";
import type { ReceivedWrite } from "./received_recorder.ts";

/** What the settlement reads and writes of a held delivery. */
export interface SettledDelivery {
  /** The delivery as the broker handed it out. */
  readonly delivery: Delivery;
  /** Whether it was settled or retired already. */
  settled: boolean;
  /** The parent it came from: its name and its data subscription's durable name. */
  readonly parent: { readonly name: string; readonly durable: string };
  /** The offloaded payload's key, whose reader obligation a confirmed settlement releases. */
  readonly blobRef: string | null;
}

/** How an {@link InputSettlement} settles. */
export interface InputSettlementOptions<H> {
  /** The transport. */
  readonly backend: MessagingBackend;
  /** The most settlements one batch call carries. */
  readonly batchEntries: number;
  /** The node's ledger, told of ids proven received. */
  readonly runtime: FlowRuntime;
  /** The held deliveries, which a settled one leaves. */
  readonly held: { delete(held: H): void; readonly size: number };
  /**
   * Held deliveries at which the broker gives this replica no more (its credit on a parent's durable:
   * prefetch plus item credit): a received-id write then no longer lingers for ids that cannot come.
   */
  readonly creditHeld: number;
  /** The received-id writes a settlement waits for. */
  readonly received: { writeOf(delivery: Delivery): ReceivedWrite | undefined };
  /** The payload obligations a confirmed settlement releases. */
  readonly payloads: {
    readonly readerId: string;
    release(key: string, obligationId: string, receipt: string): Promise<void>;
  };
  /** Whether the replica crashed (the messenger's `InFlight`). */
  readonly work: { readonly abandoned: boolean };
}

/** One replica's settlements of the deliveries it holds (`H`). */
export class InputSettlement<H extends SettledDelivery> {
  readonly #backend: MessagingBackend;
  readonly #runtime: FlowRuntime;
  readonly #held: { delete(held: H): void; readonly size: number };
  readonly #creditHeld: number;
  readonly #received: { writeOf(delivery: Delivery): ReceivedWrite | undefined };
  readonly #payloads: InputSettlementOptions<H>["payloads"];
  readonly #work: { readonly abandoned: boolean };
  /** Settlements made close together, sent as one batch call. */
  readonly #settler: CallBatcher<SettleRequest, SettlementOutcome>;

  /** Settles nothing until asked. */
  constructor(options: InputSettlementOptions<H>) {
    this.#backend = options.backend;
    this.#runtime = options.runtime;
    this.#held = options.held;
    this.#creditHeld = options.creditHeld;
    this.#received = options.received;
    this.#payloads = options.payloads;
    this.#work = options.work;
    this.#settler = new CallBatcher((requests) => this.#backend.settleBatch(requests), options.batchEntries);
  }

  /**
   * Settles one held delivery once; a reader's payload obligation is released only after a confirmed
   * Completed or Terminal settlement (never on SettleUnknown, PAY-004). A settlement other than a retry
   * first waits for the ledger write noting the delivery; `lingering` (an ack the node does not wait for)
   * lets that write wait out its linger while more deliveries can still come to join it (the replica holds
   * less than its credit), anything else sends it at once.
   */
  async settle(
    held: H,
    outcome: BackendSettlement,
    lingering = false,
  ): Promise<SettlementOutcome | null> {
    if (held.settled) return null;
    held.settled = true;
    const starved = this.#held.size >= this.#creditHeld;
    this.#held.delete(held);
    const recording = this.#received.writeOf(held.delivery);
    if (recording !== undefined && outcome.kind !== "retry") {
      if (!lingering || starved) recording.ready();
      await recording.written;
    }
    // A settle that waited for its ledger write across a crash never reaches the broker: the write did not
    // happen, and the delivery goes to the replacement when its lease lapses.
    if (this.#work.abandoned) return null;
    const token = held.delivery.token;
    const result = await this.#settler.call({
      token,
      outcome,
      settlementId: `${token.messageId}/${token.attempt}/${outcome.kind}`,
    });
    // A first delivery settled for good is never delivered again: its id is proven received once.
    if (
      recording !== undefined && outcome.kind !== "retry" && token.attempt === 1 &&
      result.kind === "settle_confirmed"
    ) {
      this.#runtime.proveReceived(held.parent.name, held.parent.durable, token.messageId);
    }
    if (result.kind === "settle_confirmed" && outcome.kind !== "retry" && held.blobRef !== null) {
      await this.#payloads.release(held.blobRef, this.#payloads.readerId, result.settlementId);
    }
    return result;
  }

  /** Retires a delivery a newer attempt of the same message replaced: no broker settlement (MSG-011). */
  retire(held: H): void {
    if (held.settled) return;
    held.settled = true;
    this.#held.delete(held);
    this.#backend.supersede(held.delivery.token);
  }
}
