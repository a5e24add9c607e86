/**
 * The publish credit of one channel of the memory broker (`MessagingBackend.reserveCredit`): room the
 * channel holds for a client's data publications beside what it stores. The model counts another client's
 * credit as occupied and a client's own as free, so a publication within the credit its client holds always
 * fits, and grants only room that is free of both stored messages and everyone's credit:
 * `stored + held ≤ limit` holds for items and for bytes at every moment. Waiters are served in the order
 * they asked, so a client that keeps asking cannot starve one that waits.
 *
 * @example
 * ```ts
 * const credit = new ChannelCredit();
 * const me = {};
 * console.log(credit.grant(me, { items: 8, bytes: 100, minBytes: 10 }, 5, 60)); // { items: 5, bytes: 60 }
 * credit.use(me, 10);
 * console.log(credit.items, credit.bytes); // 4 50
 * ```
 *
 * @module
 */

import type { Clock, TimerHandle } from "../clock.ts";
import type { CreditRequest, PublishCredit } from "../messaging.ts";

/** Whoever holds credit: the model's own client in process, a connection in the embedded broker. */
export type CreditHolder = object;

/** The grant that says "none": the deadline passed first, or the request can never be met. */
export const NO_CREDIT: PublishCredit = Object.freeze({ items: 0, bytes: 0 });

interface Holding {
  items: number;
  bytes: number;
}

interface CreditWaiter {
  readonly holder: CreditHolder;
  readonly request: CreditRequest;
  readonly resolve: (credit: PublishCredit) => void;
  timer: TimerHandle | null;
}

/** The credit held on one channel, by holder, and the requests waiting for room. */
export class ChannelCredit {
  /** Messages held by every holder together. */
  items = 0;
  /** Bytes held by every holder together. */
  bytes = 0;
  readonly #held = new Map<CreditHolder, Holding>();
  #waiters: CreditWaiter[] = [];

  /** Whether any request waits for room. */
  get waiting(): boolean {
    return this.#waiters.length > 0;
  }

  /** Messages held by holders other than `holder` (every holder's, for null). */
  othersItems(holder: CreditHolder | null): number {
    if (this.items === 0) return 0;
    return this.items - (holder === null ? 0 : this.#held.get(holder)?.items ?? 0);
  }

  /** Bytes held by holders other than `holder` (every holder's, for null). */
  othersBytes(holder: CreditHolder | null): number {
    if (this.bytes === 0) return 0;
    return this.bytes - (holder === null ? 0 : this.#held.get(holder)?.bytes ?? 0);
  }

  /**
   * Grants `holder` what fits in the free room (`roomItems` messages, `roomBytes` bytes, null: bytes are not
   * bounded) when no earlier request waits and at least one message and `request.minBytes` fit; null
   * otherwise.
   */
  grant(
    holder: CreditHolder,
    request: CreditRequest,
    roomItems: number,
    roomBytes: number | null,
  ): PublishCredit | null {
    if (this.#waiters.length > 0) return null;
    return this.#take(holder, request, roomItems, roomBytes);
  }

  /**
   * Waits, on `clock`, until `deadline` (a monotonic reading) for {@link serve} to grant the request;
   * resolves with {@link NO_CREDIT} at the deadline or when the holder's credit is released meanwhile.
   */
  wait(holder: CreditHolder, request: CreditRequest, deadline: number, clock: Clock): Promise<PublishCredit> {
    return new Promise((resolve) => {
      const waiter: CreditWaiter = { holder, request, resolve, timer: null };
      waiter.timer = clock.setTimer(Math.max(0, deadline - clock.monotonic()), () => {
        waiter.timer = null;
        this.#finish(waiter, NO_CREDIT);
      });
      this.#waiters.push(waiter);
    });
  }

  /** Grants waiting requests in order while the free room (`room()`, read again after each) meets them. */
  serve(room: () => readonly [items: number, bytes: number | null]): void {
    while (this.#waiters.length > 0) {
      const waiter = this.#waiters[0];
      const [items, bytes] = room();
      const credit = this.#take(waiter.holder, waiter.request, items, bytes);
      if (credit === null) return;
      this.#finish(waiter, credit);
    }
  }

  /** Uses one message and `size` bytes of `holder`'s credit (as much as it holds) for a stored publication. */
  use(holder: CreditHolder | null, size: number): void {
    if (holder === null) return;
    const holding = this.#held.get(holder);
    if (holding === undefined) return;
    if (holding.items > 0) {
      holding.items--;
      this.items--;
    }
    const bytes = Math.min(size, holding.bytes);
    holding.bytes -= bytes;
    this.bytes -= bytes;
    if (holding.items === 0 && holding.bytes === 0) this.#held.delete(holder);
  }

  /** Gives back everything `holder` holds and ends its waiting requests with {@link NO_CREDIT}. */
  release(holder: CreditHolder): void {
    const holding = this.#held.get(holder);
    if (holding !== undefined) {
      this.items -= holding.items;
      this.bytes -= holding.bytes;
      this.#held.delete(holder);
    }
    for (const waiter of this.#waiters.filter((w) => w.holder === holder)) this.#finish(waiter, NO_CREDIT);
  }

  /** Ends every waiting request with {@link NO_CREDIT} and forgets every holding (the channel is gone). */
  clear(): void {
    for (const waiter of [...this.#waiters]) this.#finish(waiter, NO_CREDIT);
    this.#held.clear();
    this.items = 0;
    this.bytes = 0;
  }

  #take(
    holder: CreditHolder,
    request: CreditRequest,
    roomItems: number,
    roomBytes: number | null,
  ): PublishCredit | null {
    if (roomItems < 1 || (roomBytes !== null && roomBytes < request.minBytes)) return null;
    const items = Math.min(request.items, roomItems);
    const bytes = roomBytes === null ? 0 : Math.min(request.bytes, roomBytes);
    let holding = this.#held.get(holder);
    if (holding === undefined) {
      holding = { items: 0, bytes: 0 };
      this.#held.set(holder, holding);
    }
    holding.items += items;
    holding.bytes += bytes;
    this.items += items;
    this.bytes += bytes;
    return Object.freeze({ items, bytes: roomBytes === null ? null : bytes });
  }

  #finish(waiter: CreditWaiter, credit: PublishCredit): void {
    const index = this.#waiters.indexOf(waiter);
    if (index < 0) return;
    this.#waiters.splice(index, 1);
    waiter.timer?.cancel();
    waiter.resolve(credit);
  }
}
