/**
 * The persistent publications of one publisher in the order it made them, for a backend that keeps that
 * order across refusals (`MessagingBackend.ordersRefusedPublications`): once it refused one data
 * publication, it refuses the publisher's later ones on that channel until the refused one is taken. Over
 * such a backend a publication need not wait for the outcomes of the earlier ones, only for them to be at
 * the broker: a refused one goes again right behind the earlier one it was held back by, and the earliest
 * one still outstanding, refused, backs off first. Outputs keep their order and a publisher under
 * backpressure keeps many publications in flight instead of one round trip at a time. A large one (over
 * {@link FOLLOW_CLOSELY_BYTES}), whose every attempt costs its bytes again, is sent, and sent again after
 * a refusal, only once the earlier ones have their outcomes, so a full channel is not sent a burst of
 * frames to refuse.
 *
 * @example
 * ```ts
 * const order = new PublicationOrder();
 * const place = order.enter(1024);
 * await place.turn();
 * place.sending();
 * // ... the publish; if it was refused:
 * const leads = await place.refused(); // leads: back off before going again
 * // ... at its final outcome:
 * place.finished();
 * ```
 *
 * @module
 */

/**
 * The largest publication (64 KiB) that goes right behind an earlier one whose outcome is still unknown;
 * a larger one waits for that outcome.
 */
export const FOLLOW_CLOSELY_BYTES = 64 * 1024;

/** The publications of one publisher, in the order they were made. */
export class PublicationOrder {
  #last: OrderedPublication | null = null;
  #attempts = 0;
  /**
   * The latest attempt handed out when a refusal last came back: attempts up to it may still be refused
   * behind that one, so a new publication goes only behind a later attempt.
   */
  #refusedThrough = 0;
  /** Publications refused and not yet sent again (nor finished). */
  #waiting = 0;
  #cleared: PromiseWithResolvers<void> | null = null;

  /** A place for the next publication, of `bytes`, behind every one made before. */
  enter(bytes: number): OrderedPublication {
    const place = new OrderedPublication(this.#last, this, bytes <= FOLLOW_CLOSELY_BYTES);
    this.#last = place;
    return place;
  }

  /** The number of the next attempt handed to the backend, in this publisher's order. */
  nextAttempt(): number {
    return ++this.#attempts;
  }

  /** The latest attempt handed out when a refusal last came back. */
  get refusedThrough(): number {
    return this.#refusedThrough;
  }

  /** Notes that a refusal came back: every attempt handed out so far may be refused behind it. */
  noteRefusal(): void {
    this.#refusedThrough = this.#attempts;
  }

  /** Whether any publication waits after a refusal. */
  get waiting(): boolean {
    return this.#waiting > 0;
  }

  /** Resolves once no publication waits after a refusal. */
  cleared(): Promise<void> {
    if (this.#waiting === 0) return Promise.resolve();
    this.#cleared ??= Promise.withResolvers<void>();
    return this.#cleared.promise;
  }

  /** Counts a publication that starts (`+1`) or stops (`-1`) waiting after a refusal. */
  countWaiting(change: 1 | -1): void {
    this.#waiting += change;
    if (this.#waiting > 0) return;
    const cleared = this.#cleared;
    this.#cleared = null;
    cleared?.resolve();
  }
}

/** One publication's place in its publisher's order: what it waits for before each attempt. */
export class OrderedPublication {
  #previous: OrderedPublication | null;
  readonly #order: PublicationOrder;
  /** Whether it may go right behind an earlier one whose outcome is unknown (small enough to resend). */
  readonly #followsClosely: boolean;
  /** The number of this publication's latest attempt (0 before the first), in its publisher's order. */
  #attempt = 0;
  #sending = false;
  #waiting = false;
  #final = false;
  #changed: PromiseWithResolvers<void> | null = null;

  constructor(previous: OrderedPublication | null, order: PublicationOrder, followsClosely: boolean) {
    this.#previous = previous;
    this.#order = order;
    this.#followsClosely = followsClosely;
  }

  /**
   * Resolves once this publication may be sent the first time: no publication waits after a refusal, and
   * every earlier one has its final outcome or, for a small one, is at the broker on an attempt made
   * after the latest refusal came back (one sent before it may yet be refused behind the refused one, and
   * a new publication sent then could be taken first once the refused one is).
   */
  async turn(): Promise<void> {
    for (;;) {
      if (this.#order.waiting) {
        await this.#order.cleared();
        continue;
      }
      const earlier = this.#outstanding();
      if (earlier === null) return;
      if (this.#followsClosely && earlier.#sending && earlier.#attempt > this.#order.refusedThrough) return;
      await earlier.#change();
    }
  }

  /** Notes that an attempt was just handed to the backend (after the earlier ones' current attempts). */
  sending(): void {
    this.#attempt = this.#order.nextAttempt();
    this.#sending = true;
    this.#stopWaiting();
    this.#notify();
  }

  /**
   * Notes a retryable refusal and resolves when the publication should go again: true at once or later
   * when no earlier one is outstanding (it leads: it backs off first), false as soon as the nearest
   * outstanding earlier one was sent again after this one's refused attempt (it follows right behind).
   * A large one was sent with none outstanding before it, so it always leads.
   */
  async refused(): Promise<boolean> {
    this.#order.noteRefusal();
    this.#sending = false;
    if (!this.#waiting) {
      this.#waiting = true;
      this.#order.countWaiting(1);
    }
    this.#notify();
    for (;;) {
      const earlier = this.#outstanding();
      if (earlier === null) return true;
      if (earlier.#sending && earlier.#attempt > this.#attempt) return false;
      await earlier.#change();
    }
  }

  /**
   * Notes the final outcome: the publications behind this one no longer wait for it, only for the earlier
   * ones still outstanding (the only ones it keeps a reference to).
   */
  finished(): void {
    this.#sending = false;
    this.#final = true;
    this.#stopWaiting();
    this.#previous = this.#outstanding();
    this.#notify();
  }

  #stopWaiting(): void {
    if (!this.#waiting) return;
    this.#waiting = false;
    this.#order.countWaiting(-1);
  }

  /** The nearest earlier publication without its final outcome; those with one are dropped from the chain. */
  #outstanding(): OrderedPublication | null {
    let earlier = this.#previous;
    while (earlier !== null && earlier.#final) earlier = earlier.#previous;
    this.#previous = earlier;
    return earlier;
  }

  #change(): Promise<void> {
    this.#changed ??= Promise.withResolvers<void>();
    return this.#changed.promise;
  }

  #notify(): void {
    const changed = this.#changed;
    this.#changed = null;
    changed?.resolve();
  }
}
