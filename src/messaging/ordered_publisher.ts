/**
 * The messenger's ordered publisher: every publication a replica makes goes through it, in a batch call
 * (`CallBatcher`), a persistent data one within this replica's credit on its channel (`CreditWindow`).
 *
 * It guarantees: a publication's outcome is known when it resolves (a lost receipt is resolved by
 * observation, a persistent one until known); a persistent publication is retried with backoff until
 * taken, in the order publications were made (see {@link OrderedPublisher.publish}); after a crash
 * (`InFlight.abandon`) nothing not yet sent is sent; and once the flow stops, a source's outputs its
 * consumers hold back are given up as a prefix-preserving tail (see {@link OrderedPublisher.isGivenUp}).
 *
 * @module
 */

import type { Clock } from "../backends/clock.ts";
import {
  type ChannelId,
  type Envelope as BackendEnvelope,
  MessageKind,
  type MessagingBackend,
} from "../backends/messaging.ts";
import { type PublicationOutcome, rejected } from "../backends/outcomes.ts";
import { CallBatcher } from "./call_batcher.ts";
import { CreditWindow } from "./credit_window.ts";
import { PublicationOrder } from "./publication_order.ts";
import { publishBackoffSeconds } from "./topology.ts";

/** How an {@link OrderedPublisher} publishes. */
export interface OrderedPublisherOptions {
  /** The transport. */
  readonly backend: MessagingBackend;
  /** The replica's output channel, on which its credit is held. */
  readonly channel: ChannelId;
  /** Messages of credit one request asks for. */
  readonly creditItems: number;
  /** Bytes of credit one request asks for. */
  readonly creditBytes: number;
  /** The most publications one batch call carries. */
  readonly batchEntries: number;
  /** One publication's receipt deadline, in seconds (also how long a credit request waits). */
  readonly publishTimeoutSeconds: number;
  /** Whether the replica is a source (whose outputs are given up at the flow's stop). */
  readonly source: boolean;
  /** Whether the replica crashed: work that has not begun does not begin (the messenger's `InFlight`). */
  readonly work: { readonly abandoned: boolean };
  /** Where time comes from (receipt deadlines, backoff). */
  readonly clock: Clock;
}

/** The outcome of a persistent publication whose replica stopped (crashed) before it could be sent. */
function stoppedBeforeTurn(env: BackendEnvelope): PublicationOutcome {
  return rejected(env.publicationId, "the replica stopped before this output's turn", false);
}

/** Whether a persistent publication's outcome calls for another attempt: refused retryably, or unresolvable. */
function retriesAfter(outcome: PublicationOutcome): boolean {
  return outcome.kind === "publication_unresolvable" || (outcome.kind === "rejected" && outcome.retryable);
}

/** One replica's publications, sent in order, within credit, until their outcomes are known. */
export class OrderedPublisher {
  readonly #backend: MessagingBackend;
  readonly #clock: Clock;
  readonly #work: { readonly abandoned: boolean };
  readonly #source: boolean;
  /** The outcomes of a source's outputs given up at the flow's stop (see {@link #givesUpAtStop}). */
  readonly #givenUp = new WeakSet<PublicationOutcome>();
  /** Whether this source gave up an output at the stop: every later one is given up too. */
  #givingUp = false;
  /** Whether the flow-wide stop was seen (see {@link haltAtStop}). */
  #halting = false;
  /** This replica's credit on its output channel: a reliable output is sent only within it. */
  readonly #credit: CreditWindow;
  /** Publications made close together, sent as one batch call. */
  readonly #publisher: CallBatcher<BackendEnvelope, PublicationOutcome>;
  /** Settles once every persistent publication made so far has its final outcome (see {@link publish}). */
  #lastTurn: Promise<void> = Promise.resolve();
  /** Persistent publications waiting for their turn: refused ones, and those made while any was. */
  #waitingTurns = 0;
  /** Persistent publications in the order made, over a backend that keeps that order across refusals. */
  readonly #order = new PublicationOrder();

  /** Holds no credit yet: the first persistent data publication asks for it. */
  constructor(options: OrderedPublisherOptions) {
    this.#backend = options.backend;
    this.#clock = options.clock;
    this.#work = options.work;
    this.#source = options.source;
    const publishTimeout = options.publishTimeoutSeconds;
    this.#credit = new CreditWindow(this.#backend, options.channel, {
      items: options.creditItems,
      bytes: options.creditBytes,
      waitSeconds: publishTimeout,
      clock: this.#clock,
    });
    this.#publisher = new CallBatcher(
      (envelopes) => this.#backend.publishBatch(envelopes, this.#clock.monotonic() + publishTimeout),
      options.batchEntries,
    );
  }

  /**
   * The flow-wide stop was seen: a source's outputs that wait for credit, or that the full channel refuses
   * from now on, are given up (see {@link #givesUpAtStop}).
   */
  haltAtStop(): void {
    this.#halting = true;
    if (this.#source) this.#credit.halt();
  }

  /** Every output has its outcome: the credit still held goes back to the channel. */
  releaseCredit(): void {
    this.#credit.release();
  }

  /** Whether `outcome` is that of an output given up at the stop: not taken, not counted, no failure. */
  isGivenUp(outcome: PublicationOutcome): boolean {
    return this.#givenUp.has(outcome);
  }

  /**
   * Publishes until the outcome is known: a lost receipt is resolved by observation (an idempotent
   * re-publish inside the dedup window). `persistent`: a retryable refusal (a full reliable channel) is
   * retried with backoff until taken; otherwise the first refusal stands. Persistent publications keep the
   * order they were made in: a refused one retries only once every earlier one has its final outcome, and
   * one made while any waits is not sent until its turn, so the outputs a replica makes while its consumers
   * hold it back are taken in the order it made them. One already sent when an earlier one's refusal
   * arrives is kept behind it by the embedded broker, which refuses a connection's later data on a channel
   * until its refused publication is taken; a backend that does not may take it first. Over a backend that
   * does (`ordersRefusedPublications`), {@link #publishOrdered} keeps the order without waiting for each
   * outcome.
   */
  async publish(env: BackendEnvelope, persistent: boolean): Promise<PublicationOutcome> {
    if (!persistent) return await this.#publishOnce(env, false);
    if (this.#backend.ordersRefusedPublications === true) return await this.#publishOrdered(env);
    const previous = this.#lastTurn;
    const turn = Promise.withResolvers<void>();
    this.#lastTurn = turn.promise;
    let earlierDone = false;
    previous.then(() => earlierDone = true);
    try {
      let refused: PublicationOutcome | null = null;
      if (this.#waitingTurns === 0) {
        refused = await this.#publishOnce(env, true);
        if (!retriesAfter(refused) || this.#work.abandoned) return refused;
      }
      this.#waitingTurns++;
      try {
        // Refused with nothing earlier outstanding, it heads the queue: it backs off before its retry.
        if (refused !== null && earlierDone) await this.#clock.sleep(publishBackoffSeconds(1));
        return await this.#publishInTurn(env, refused, previous);
      } finally {
        this.#waitingTurns--;
      }
    } finally {
      // A turn ends once this publication and every earlier one have their final outcomes.
      previous.then(() => turn.resolve());
    }
  }

  /**
   * A persistent publication waiting its turn (see {@link publish}): attempted once every earlier one has
   * its final outcome, then retried with backoff until taken.
   */
  async #publishInTurn(
    env: BackendEnvelope,
    refused: PublicationOutcome | null,
    previous: Promise<void>,
  ): Promise<PublicationOutcome> {
    await previous;
    let outcome = refused;
    for (let retries = refused === null ? 0 : 1;;) {
      if (this.#work.abandoned) return outcome ?? stoppedBeforeTurn(env);
      outcome = await this.#publishOnce(env, true);
      if (!retriesAfter(outcome)) return outcome;
      await this.#clock.sleep(publishBackoffSeconds(++retries));
    }
  }

  /**
   * A persistent publication over a backend that keeps order across refusals: sent once every earlier one
   * is at the broker, and after a retryable refusal sent again right behind the earlier one that held it
   * back, or, when none is outstanding, after a backoff (see {@link PublicationOrder}).
   */
  async #publishOrdered(env: BackendEnvelope): Promise<PublicationOutcome> {
    const place = this.#order.enter(env.body.byteLength);
    try {
      await place.turn();
      let outcome: PublicationOutcome | null = null;
      for (let retries = 0;;) {
        if (this.#work.abandoned) return outcome ?? stoppedBeforeTurn(env);
        if (this.#givesUpAtStop(env, outcome)) return this.#giveUp(env);
        const attempt = this.#publishOnce(env, true);
        place.sending();
        outcome = await attempt;
        if (!retriesAfter(outcome) || this.#work.abandoned) return outcome;
        if (await place.refused()) await this.#clock.sleep(publishBackoffSeconds(++retries));
      }
    } finally {
      place.finished();
    }
  }

  /**
   * Whether a source's output is no longer tried because the flow stops (the control stop) while its
   * consumers hold it back: one the full channel refused (`outcome`) is given up, and so is every later one,
   * so what the broker took stays a prefix of what the source made (over a backend that keeps its order)
   * and a resumed run, in which a replayable source makes the rest again, redoes nothing. The stop then
   * waits only for the consumers to work through what the broker took. A receiver's outputs, made from
   * inputs already taken, and the end markers are tried until taken.
   */
  #givesUpAtStop(env: BackendEnvelope, outcome: PublicationOutcome | null): boolean {
    if (!this.#halting || !this.#source || env.kind !== MessageKind.data) return false;
    if (outcome?.kind === "rejected") this.#givingUp = true;
    return this.#givingUp;
  }

  /** The outcome of an output given up at the stop: not taken, not counted, and no failure of the replica. */
  #giveUp(env: BackendEnvelope): PublicationOutcome {
    const outcome = rejected(env.publicationId, "the flow stopped before the broker took this output", false);
    this.#givenUp.add(outcome);
    return outcome;
  }

  /**
   * One publication (in a batch call; a persistent data one once this replica's credit covers it), then
   * observations of it while its receipt is lost (a persistent one until known). A source's output still
   * waiting for credit at the flow's stop is given up (see {@link #givesUpAtStop}).
   */
  async #publishOnce(env: BackendEnvelope, persistent: boolean): Promise<PublicationOutcome> {
    const sent = persistent && env.kind === MessageKind.data
      ? await this.#credit.send(env.size, () => this.#publisher.call(env))
      : await this.#publisher.call(env);
    if (sent === null) {
      this.#givingUp = true;
      return this.#giveUp(env);
    }
    let outcome = sent;
    let observations = 0;
    while (outcome.kind === "publication_unknown") {
      observations++;
      if (!persistent && observations > 1) return outcome;
      await this.#clock.sleep(publishBackoffSeconds(observations));
      if (this.#work.abandoned) return outcome;
      outcome = await this.#backend.observePublication(env);
    }
    return outcome;
  }
}
