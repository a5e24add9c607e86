/**
 * The messenger's dead-letter ladder (DELIV-15): what happens to a delivery that failed, or that can never
 * reach the node, under the node's {@link DeliveryPolicy}.
 *
 * It guarantees: `actionFor(disposition, numDelivered)` decides, with the broker's delivery count or,
 * under the ledger budget, one more attempt counted in the ledger; a nak carries the policy's backoff
 * (none for a worker-fatal failure); a dead letter carries the original bytes with the headers
 * VF-Origin-Node, VF-Error and VF-Num-Delivered under the id `dlq:{flow}:{run}:{node}:{stream_seq}`, and
 * the delivery is terminated against it only once the broker accepted it, else a pending handoff is
 * recorded and the delivery kept alive (retried with backoff) until a later attempt, or a replacement's
 * start ({@link DeadLetterLadder.republishHandoffs}), hands it off; a termination without a dead letter
 * (`term`, or a sampled dead letter over its per-minute cap) references a terminal-log record; a dead
 * letter's offloaded payload is pinned for the DLQ's retention. An exhausted transient failure of an
 * at-least-once node is counted as a drop.
 *
 * @module
 */

import type { Clock } from "../backends/clock.ts";
import {
  type ChannelId,
  type Delivery,
  type Envelope as BackendEnvelope,
  envelope as backendEnvelope,
  MessageKind,
  retry,
  type Settlement as BackendSettlement,
  terminal,
} from "../backends/messaging.ts";
import type { PublicationOutcome } from "../backends/outcomes.ts";
import type { PayloadStore } from "../backends/payload.ts";
import type { FlowRuntime } from "../backends/runtime.ts";
import type { Logger } from "../core/context.ts";
import {
  ACTION_DLQ,
  ACTION_DLQ_SAMPLED,
  ACTION_NAK,
  ACTION_TERM,
  AT_LEAST_ONCE,
  type DeliveryAction,
  type DeliveryPolicy,
  drawRetryJitter,
} from "../core/delivery_policy.ts";
import { errorToDict, TRANSIENT, type VideoflowRuntimeError, WORKER_FATAL } from "../core/errors.ts";
import { DropReason } from "../core/metrics.ts";
import { ENVELOPE_VERSION } from "../wire/codec.ts";
import { dlqMessageId } from "../wire/identities.ts";
import { DLQ_RETENTION_SECONDS } from "./topology.ts";

/** Dead-letter headers (WIRE.md "Identities"). */
export const DeadLetterHeader = {
  originNode: "VF-Origin-Node",
  error: "VF-Error",
  numDelivered: "VF-Num-Delivered",
} as const;

/** The VF-Error header of a dead letter: the error's code and message on one line. */
function errorHeader(error: VideoflowRuntimeError): string {
  return `${error.code}: ${error.message}`.replace(/[\r\n]+/g, " ");
}

/** What the ladder reads of a held delivery. */
export interface FailedDelivery {
  /** The delivery as the broker handed it out. */
  readonly delivery: Delivery;
  /** The parent it came from. */
  readonly parent: { readonly name: string };
  /** The offloaded payload's key, or `null` for an inline one. */
  readonly blobRef: string | null;
}

/** How a {@link DeadLetterLadder} fails deliveries. */
export interface DeadLetterLadderOptions<H extends FailedDelivery> {
  /** The flow, named in dead-letter ids. */
  readonly flowId: string;
  /** The run, named in dead-letter ids. */
  readonly runId: string;
  /** The node whose deliveries fail: the dead letters' origin. */
  readonly node: string;
  /** Where dead letters are published: the node's own output channel. */
  readonly channel: ChannelId;
  /** Whether the node has more than one parent (its dead-letter ids then name the parent). */
  readonly multiParent: boolean;
  /** The node's effective delivery policy. */
  readonly delivery: DeliveryPolicy;
  /** The node's ledger: attempts, terminal records and pending handoffs. */
  readonly runtime: FlowRuntime;
  /** Whether attempts are counted in the ledger (known once the messenger started). */
  readonly ledgerBudget: () => boolean;
  /** Where an offloaded dead letter's payload is pinned; `null` without a store. */
  readonly payloadStore: PayloadStore | null;
  /** One publication attempt of a dead letter (not persistent: the first refusal stands). */
  readonly publish: (env: BackendEnvelope) => Promise<PublicationOutcome>;
  /** Settles a held delivery once (the messenger's settlement). */
  readonly settle: (held: H, outcome: BackendSettlement) => Promise<unknown>;
  /** Counts an input given up on. */
  readonly drop: (reason: DropReason) => void;
  /** A source uniform in [0, 1) for retry jitter. */
  readonly random: () => number;
  /** Where time comes from (sample windows, payload pins). */
  readonly clock: Clock;
  /** Where what could not be done is reported. */
  readonly logger: Logger;
}

/** One replica's failure ladder over the deliveries it holds (`H`). */
export class DeadLetterLadder<H extends FailedDelivery> {
  readonly #flowId: string;
  readonly #runId: string;
  readonly #node: string;
  readonly #channel: ChannelId;
  readonly #multiParent: boolean;
  readonly #delivery: DeliveryPolicy;
  readonly #runtime: FlowRuntime;
  readonly #ledgerBudget: () => boolean;
  readonly #payloadStore: PayloadStore | null;
  readonly #publish: (env: BackendEnvelope) => Promise<PublicationOutcome>;
  readonly #settleHeld: (held: H, outcome: BackendSettlement) => Promise<unknown>;
  readonly #drop: (reason: DropReason) => void;
  readonly #random: () => number;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #dlqSamples = new Map<string, { windowStart: number; count: number }>();

  /** Holds no delivery; each call is given the one it fails. */
  constructor(options: DeadLetterLadderOptions<H>) {
    this.#flowId = options.flowId;
    this.#runId = options.runId;
    this.#node = options.node;
    this.#channel = options.channel;
    this.#multiParent = options.multiParent;
    this.#delivery = options.delivery;
    this.#runtime = options.runtime;
    this.#ledgerBudget = options.ledgerBudget;
    this.#payloadStore = options.payloadStore;
    this.#publish = options.publish;
    this.#settleHeld = options.settle;
    this.#drop = options.drop;
    this.#random = options.random;
    this.#clock = options.clock;
    this.#logger = options.logger;
  }

  /** Re-publishes every dead letter a predecessor could not hand off, under its recorded id (story 26). */
  async republishHandoffs(): Promise<void> {
    for (const handoff of await this.#runtime.pendingHandoffs()) {
      const outcome = await this.#publishDeadLetter(handoff.recordId, handoff.headers, handoff.raw);
      if (outcome?.kind === "accepted") await this.#runtime.clearPendingHandoff(handoff.recordId);
    }
  }

  /**
   * Applies the delivery policy's action to one failed delivery; resolves with that action. The attempt
   * is counted here (the broker's delivery count, or one more in the ledger) unless `counted` says how
   * many attempts the ledger already holds for it.
   */
  async apply(
    held: H,
    failure: VideoflowRuntimeError,
    { counted }: { readonly counted?: number } = {},
  ): Promise<DeliveryAction> {
    const disposition = failure.disposition;
    const token = held.delivery.token;
    const numDelivered = counted ??
      (this.#ledgerBudget()
        ? Math.max(1, await this.#runtime.recordAttempt(token.messageId, disposition))
        : token.attempt);
    const action: DeliveryAction = this.#delivery.actionFor(disposition, numDelivered);
    if (
      action !== ACTION_NAK && disposition === TRANSIENT && this.#delivery.delivery === AT_LEAST_ONCE
    ) {
      this.#drop(DropReason.exhausted);
    }
    switch (action) {
      case ACTION_NAK: {
        const delay = disposition === WORKER_FATAL
          ? null
          : this.#delivery.retryDelay(numDelivered, drawRetryJitter(this.#random));
        await this.#settleHeld(held, retry(delay));
        return action;
      }
      case ACTION_TERM:
        await this.#terminate(held, failure, numDelivered, "term");
        return action;
      case ACTION_DLQ_SAMPLED:
        if (!this.#sampleAdmits(failure.code)) {
          await this.#terminate(held, failure, numDelivered, "dlq_sample_cap");
          return action;
        }
        await this.#deadLetter(held, failure, numDelivered);
        return action;
      case ACTION_DLQ:
        await this.#deadLetter(held, failure, numDelivered);
        return action;
    }
  }

  #sampleAdmits(code: string): boolean {
    const now = this.#clock.monotonic();
    let window = this.#dlqSamples.get(code);
    if (window === undefined || now - window.windowStart >= 60) {
      window = { windowStart: now, count: 0 };
      this.#dlqSamples.set(code, window);
    }
    if (window.count >= this.#delivery.samplePerMinute) return false;
    window.count++;
    return true;
  }

  /** Ends a delivery without a dead letter, against a terminal-log record (DELIV-15). */
  async #terminate(
    held: H,
    failure: VideoflowRuntimeError,
    numDelivered: number,
    action: string,
  ): Promise<void> {
    const token = held.delivery.token;
    const record = await this.#runtime.recordTerminal({
      node: this.#node,
      parent: held.parent.name,
      message_id: token.messageId,
      stream_sequence: token.streamSequence,
      num_delivered: numDelivered,
      action,
      code: failure.code,
      disposition: failure.disposition,
      message: failure.message,
    });
    await this.#settleHeld(held, terminal(record));
  }

  /**
   * Dead-letters the original bytes and terminates the delivery against the dead letter's id once the
   * broker accepted it; otherwise records a pending handoff and keeps the delivery alive (DELIV-15).
   */
  async #deadLetter(held: H, failure: VideoflowRuntimeError, numDelivered: number): Promise<void> {
    const token = held.delivery.token;
    const parent = this.#multiParent ? held.parent.name : null;
    const recordId = token.streamSequence === null
      ? `dlq:${this.#flowId}:${this.#runId}:${this.#node}:${token.messageId}`
      : dlqMessageId(this.#flowId, this.#runId, this.#node, token.streamSequence, parent);
    const headers = {
      ...held.delivery.headers,
      [DeadLetterHeader.originNode]: this.#node,
      [DeadLetterHeader.error]: errorHeader(failure),
      [DeadLetterHeader.numDelivered]: String(numDelivered),
    };
    if (held.blobRef !== null) await this.#pinDeadLetterPayload(held.blobRef, recordId);
    const outcome = await this.#publishDeadLetter(recordId, headers, held.delivery.envelopeBytes);
    if (outcome?.kind === "accepted") {
      await this.#runtime.clearPendingHandoff(recordId);
      await this.#settleHeld(held, terminal(recordId));
      return;
    }
    await this.#runtime.recordPendingHandoff(recordId, headers, held.delivery.envelopeBytes);
    await this.#settleHeld(
      held,
      retry(this.#delivery.retryDelay(numDelivered, drawRetryJitter(this.#random))),
    );
  }

  /** A dead letter's payload outlives the run's readers: pinned for the DLQ's retention (BLOB-14 step 3). */
  async #pinDeadLetterPayload(key: string, recordId: string): Promise<void> {
    const store = this.#payloadStore;
    if (store === null) return;
    try {
      await store.acquireObligation(
        await store.refForKey(key),
        `dlq/${recordId}`,
        this.#clock.now() + DLQ_RETENTION_SECONDS,
      );
    } catch (error) {
      this.#logger.warn("a dead letter's payload could not be pinned", {
        key,
        error: errorToDict(error).message,
      });
    }
  }

  /** One dead-letter publication attempt (resolving a lost receipt); null when the attempt threw. */
  async #publishDeadLetter(
    recordId: string,
    headers: Readonly<Record<string, string>>,
    raw: Uint8Array,
  ): Promise<PublicationOutcome | null> {
    const env = backendEnvelope({
      channel: this.#channel,
      publicationId: recordId,
      headers,
      body: raw,
      eventId: recordId,
      schemaVersion: ENVELOPE_VERSION,
      kind: MessageKind.dlq,
    });
    try {
      return await this.#publish(env);
    } catch (error) {
      this.#logger.warn("a dead letter could not be published", {
        id: recordId,
        error: errorToDict(error).message,
      });
      return null;
    }
  }
}
