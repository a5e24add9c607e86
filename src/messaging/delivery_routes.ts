/**
 * The messenger's delivery routes: which parent, and which of its streams (data or EOS), each subscription
 * this replica bound belongs to.
 *
 * It guarantees: every subscription added is received from ({@link DeliveryRoutes.subscriptions}, in the
 * order added); a delivery is routed to the parent and kind its subscription was added with, looked up by
 * the subscription's key once and by identity after; a delivery for a subscription never added is a
 * ConfigError, never silently dropped.
 *
 * @module
 */

import { type MessageKind, type SubscriptionId, subscriptionKey } from "../backends/messaging.ts";
import { ConfigError } from "../core/errors.ts";

/** Where a delivery goes: its parent (`P`) and the stream it came on. */
export interface Route<P> {
  /** The parent the subscription serves. */
  readonly parent: P;
  /** The stream it is: data or EOS. */
  readonly kind: MessageKind;
}

/** One replica's subscriptions and the parent (`P`) each serves. */
export class DeliveryRoutes<P> {
  readonly #node: string;
  readonly #routes = new Map<string, Route<P>>();
  readonly #routeCache = new WeakMap<SubscriptionId, Route<P>>();
  readonly #subscriptions: SubscriptionId[] = [];

  /** Routes nothing until {@link add}; `node` names the replica's node in errors. */
  constructor(node: string) {
    this.#node = node;
  }

  /** Every subscription added, in order: what one receive takes from. */
  get subscriptions(): readonly SubscriptionId[] {
    return this.#subscriptions;
  }

  /** Routes deliveries of `id` to `parent`, as `kind`. */
  add(id: SubscriptionId, parent: P, kind: MessageKind): void {
    this.#routes.set(subscriptionKey(id), { parent, kind });
    this.#subscriptions.push(id);
  }

  /**
   * The route of a delivery that arrived on `id`.
   *
   * @throws ConfigError for a subscription never added.
   */
  route(id: SubscriptionId): Route<P> {
    let route = this.#routeCache.get(id);
    if (route === undefined) {
      route = this.#routes.get(subscriptionKey(id));
      if (route === undefined) {
        throw new ConfigError(
          `a delivery arrived for a subscription ${this.#node} did not bind`,
          "receive only through the messenger's own subscriptions",
          { node: this.#node },
        );
      }
      this.#routeCache.set(id, route);
    }
    return route;
  }
}
