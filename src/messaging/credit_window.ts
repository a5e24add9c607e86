/**
 * A publisher's credit on its output channel (flow control by credit, `MessagingBackend.reserveCredit`):
 * a publication is sent only once the credit this client holds covers it, so the broker never has to
 * refuse it for room, and one that does not fit waits here, in the order sent, until the broker grants
 * more (as consumers settle). The wait replaces refusal and backoff: no refused publication costs a round
 * trip, and how long an output waits is set by the channel's limits, not by a backoff.
 *
 * What it counts mirrors the broker's rule exactly where it can and stays below it where it cannot: a
 * send takes one message and its bytes from the balance; a Rejected or duplicate outcome (the broker
 * stored nothing, so used nothing) gives them back; an unknown outcome leaves the count uncertain, so the
 * window gives back all it holds at the broker and starts again from none. The balance is therefore never
 * above what the broker holds for this client.
 *
 * A new request goes out while less than half a window is left, so a steady publisher does not stall on
 * the round trip. When the broker cannot be asked (Unknown, or the call failed) the waiting sends go out
 * without credit: the backend's own outcome (a retryable refusal, a BrokerUnavailable) then decides, as
 * it would without this window.
 *
 * @example
 * ```ts
 * import { systemClock } from "../backends/clock.ts";
 * import { makeChannel, makeEnvelope, MemoryMessagingBackend } from "../backends/memory/messaging.ts";
 * import { Overflow } from "../backends/messaging.ts";
 * const backend = new MemoryMessagingBackend();
 * const spec = makeChannel("f", "r", "cam", "reliable_work", "interest", {
 *   maxMsgs: 4,
 *   overflow: Overflow.reject,
 * });
 * await backend.ensureChannel(spec, "op");
 * const window = new CreditWindow(backend, spec.id, { items: 2, bytes: 1024, waitSeconds: 5 });
 * const env = makeEnvelope(spec.id, "p-1");
 * const outcome = await window.send(env.size, () => backend.publish(env, systemClock.monotonic() + 5));
 * console.log(outcome?.kind); // "accepted"
 * ```
 *
 * @module
 */

import { type Clock, systemClock } from "../backends/clock.ts";
import { type ChannelId, creditRequest, type MessagingBackend } from "../backends/messaging.ts";
import type { PublicationOutcome } from "../backends/outcomes.ts";

/** How a {@link CreditWindow} asks for credit. */
export interface CreditWindowOptions {
  /** Messages one request asks for: the most this publisher holds unused, about. */
  readonly items: number;
  /** Bytes one request asks for (at least the size of the publication waiting). */
  readonly bytes: number;
  /** How long one request may wait for room before it is asked again, in seconds. */
  readonly waitSeconds: number;
  /** The backend's clock (the system clock by default). */
  readonly clock?: Clock;
}

interface WaitingSend {
  readonly bytes: number;
  readonly publish: () => Promise<PublicationOutcome>;
  readonly resolve: (outcome: Promise<PublicationOutcome | null> | null) => void;
}

/** The credit one publisher holds on one channel, and the sends waiting for more (see the module comment). */
export class CreditWindow {
  readonly #backend: MessagingBackend;
  readonly #channel: ChannelId;
  readonly #options: CreditWindowOptions;
  readonly #clock: Clock;
  #items = 0;
  /** Bytes held; null once a grant said the channel bounds no bytes. */
  #bytes: number | null = 0;
  #queue: WaitingSend[] = [];
  #asking = false;
  /** Bumped by {@link release}: a grant asked before it is not added. */
  #epoch = 0;
  #halted = false;
  #gaveUp = false;

  constructor(backend: MessagingBackend, channel: ChannelId, options: CreditWindowOptions) {
    this.#backend = backend;
    this.#channel = channel;
    this.#options = options;
    this.#clock = options.clock ?? systemClock;
  }

  /**
   * Runs `publish` (a publication of `bytes`) once the credit held covers it, after every send made before
   * it; resolves with its outcome, or with null when {@link halt} ended it before it was sent.
   */
  send(bytes: number, publish: () => Promise<PublicationOutcome>): Promise<PublicationOutcome | null> {
    if (this.#queue.length === 0 && this.#fits(bytes)) {
      return this.#sendNow(bytes, publish);
    }
    if (this.#halted) {
      this.#gaveUp = true;
      return Promise.resolve(null);
    }
    const { promise, resolve } = Promise.withResolvers<PublicationOutcome | null>();
    this.#queue.push({ bytes, publish, resolve });
    this.#ask();
    return promise;
  }

  /**
   * Stops holding sends back (the flow stops): every send waiting for credit ends with null, and from the
   * first one that ends so, so does every later one; until then a send the credit covers still goes.
   */
  halt(): void {
    this.#halted = true;
    const queue = this.#queue;
    this.#queue = [];
    if (queue.length > 0) this.#gaveUp = true;
    for (const waiting of queue) waiting.resolve(null);
  }

  /** Gives back all the credit held (a publisher that is done); a later send asks again. */
  release(): void {
    this.#epoch++;
    this.#items = 0;
    this.#bytes = this.#bytes === null ? null : 0;
    this.#backend.releaseCredit(this.#channel);
  }

  #fits(bytes: number): boolean {
    if (this.#gaveUp) return false;
    return this.#items >= 1 && (this.#bytes === null || this.#bytes >= bytes);
  }

  #sendNow(bytes: number, publish: () => Promise<PublicationOutcome>): Promise<PublicationOutcome> {
    this.#items--;
    if (this.#bytes !== null) this.#bytes -= bytes;
    const epoch = this.#epoch;
    if (this.#items * 2 < this.#options.items) this.#ask();
    return publish().then((outcome) => {
      if (epoch === this.#epoch) this.#settle(outcome, bytes);
      return outcome;
    });
  }

  /** Mirrors the broker's use of this client's credit by the outcome (see the module comment). */
  #settle(outcome: PublicationOutcome, bytes: number): void {
    if (outcome.kind === "rejected" || (outcome.kind === "accepted" && outcome.duplicate)) {
      this.#items++;
      if (this.#bytes !== null) this.#bytes += bytes;
      this.#serve();
    } else if (outcome.kind === "publication_unknown") {
      this.release();
    }
  }

  /** Sends what the credit now covers, in order. */
  #serve(): void {
    while (this.#queue.length > 0 && this.#fits(this.#queue[0].bytes)) {
      const waiting = this.#queue.shift() as WaitingSend;
      waiting.resolve(this.#sendNow(waiting.bytes, waiting.publish));
    }
    if (this.#queue.length > 0) this.#ask();
  }

  /** Sends every waiting send without credit: the backend's outcome decides (the broker could not be asked). */
  #sendUncredited(): void {
    const queue = this.#queue;
    this.#queue = [];
    for (const waiting of queue) waiting.resolve(waiting.publish());
  }

  /**
   * One request at a time, for a window or for the waiting head, whichever is more. No grant before the
   * request's deadline means the channel could never hold the head: it goes without credit, so its own
   * outcome says why.
   */
  #ask(): void {
    if (this.#asking) return;
    this.#asking = true;
    const head = this.#queue.length === 0 ? 0 : this.#queue[0].bytes;
    const request = creditRequest(this.#options.items, Math.max(this.#options.bytes, head), head);
    const epoch = this.#epoch;
    const deadline = this.#clock.monotonic() + this.#options.waitSeconds;
    this.#backend.reserveCredit(this.#channel, request, deadline).then(
      (observed) => {
        this.#asking = false;
        if (observed.kind !== "known") {
          this.#sendUncredited();
          return;
        }
        const credit = observed.value;
        // A grant asked for before a release was given back by that release: the broker holds none of it.
        if (epoch !== this.#epoch) {
          // Nothing to add.
        } else if (credit.items > 0) {
          this.#items += credit.items;
          this.#bytes = credit.bytes === null ? null : (this.#bytes ?? 0) + credit.bytes;
        } else if (this.#queue.length > 0 && this.#clock.monotonic() < deadline) {
          const waiting = this.#queue.shift() as WaitingSend;
          waiting.resolve(waiting.publish());
        }
        this.#serve();
      },
      () => {
        this.#asking = false;
        this.#sendUncredited();
      },
    );
  }
}
