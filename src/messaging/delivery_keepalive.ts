/**
 * The messenger's delivery keepalive: the deliveries a replica holds unsettled (in the join, in the node,
 * or as end markers waiting for a drain), with their broker leases renewed so none is redelivered while
 * it is held.
 *
 * It guarantees: once armed, every held delivery not settled is renewed at least every
 * `max(1 s, min(ack_wait, EOS ack wait) / 3)`, so its lease never lapses while it is held; a failed renewal
 * is logged, never thrown (the broker redelivers on its own if the lease does lapse); after
 * {@link DeliveryKeepalive.stop} nothing more is renewed.
 *
 * @module
 */

import type { Clock, TimerHandle } from "../backends/clock.ts";
import type { Delivery, MessagingBackend } from "../backends/messaging.ts";
import type { Logger } from "../core/context.ts";
import { errorToDict } from "../core/errors.ts";
import { EOS_ACK_WAIT_SECONDS } from "./topology.ts";

/** What the keepalive reads and writes of a held delivery. */
export interface KeptDelivery {
  /** The delivery whose lease is renewed. */
  readonly delivery: Delivery;
  /** Whether it was settled (no longer renewed). */
  readonly settled: boolean;
  /** When its lease was last renewed (or it was received), monotonic seconds. */
  renewedAt: number;
}

/** How a {@link DeliveryKeepalive} renews. */
export interface DeliveryKeepaliveOptions {
  /** The transport whose leases are renewed. */
  readonly backend: MessagingBackend;
  /** Where time and timers come from. */
  readonly clock: Clock;
  /** Where a failed renewal is reported. */
  readonly logger: Logger;
}

/** One replica's held deliveries (`H`), kept alive at the broker. */
export class DeliveryKeepalive<H extends KeptDelivery> {
  readonly #backend: MessagingBackend;
  readonly #clock: Clock;
  readonly #logger: Logger;
  readonly #held = new Set<H>();
  #keepalive: TimerHandle | null = null;
  #stopped = false;

  /** Renews nothing until {@link arm}. */
  constructor(options: DeliveryKeepaliveOptions) {
    this.#backend = options.backend;
    this.#clock = options.clock;
    this.#logger = options.logger;
  }

  /** Holds `held` (renewed until deleted or settled). */
  add(held: H): void {
    this.#held.add(held);
  }

  /** Stops holding `held`. */
  delete(held: H): void {
    this.#held.delete(held);
  }

  /** How many deliveries are held. */
  get size(): number {
    return this.#held.size;
  }

  /** Renews every held delivery's lease every `max(1 s, ack_wait / 3)` (EOS markers' by their own wait). */
  arm(ackWaitSeconds: number): void {
    const interval = Math.max(1, Math.min(ackWaitSeconds, EOS_ACK_WAIT_SECONDS) / 3);
    const tick = () => {
      if (this.#stopped) return;
      const now = this.#clock.monotonic();
      for (const held of this.#held) {
        if (held.settled || now - held.renewedAt < interval) continue;
        held.renewedAt = now;
        this.#backend.renew(held.delivery.token).catch((error) =>
          this.#logger.warn("a lease renewal failed", { error: errorToDict(error).message })
        );
      }
      this.#keepalive = this.#clock.setTimer(interval, tick);
    };
    this.#keepalive = this.#clock.setTimer(interval, tick);
  }

  /** Stops renewing: nothing held is renewed again. */
  stop(): void {
    this.#stopped = true;
    this.#keepalive?.cancel();
    this.#keepalive = null;
  }
}
