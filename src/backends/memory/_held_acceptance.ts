/**
 * The memory broker's held acceptance (spec `pause_acceptance`), the test control that models an ambiguous
 * acceptance: while a channel is paused its publications wait here undecided, so a publisher's deadline
 * can pass with the outcome unknown; resuming stores them in order (late acceptance) unless one was
 * cancelled first.
 *
 * @module
 */

import type { Envelope } from "../messaging.ts";
import { type PublicationOutcome, rejected } from "../outcomes.ts";
import type { CreditHolder } from "./publish_credit.ts";

/** A publication waiting for its channel's acceptance, whose credit it was sent within, and how to tell
 * its publisher the outcome. */
export interface HeldPublication {
  readonly envelope: Envelope;
  readonly holder: CreditHolder | null;
  readonly resolve: (outcome: PublicationOutcome) => void;
}

/** One channel's pause and the publications it holds, oldest first. */
export class HeldAcceptance {
  #paused = false;
  #held: HeldPublication[] = [];

  /** Whether publications wait here instead of being stored. */
  get paused(): boolean {
    return this.#paused;
  }

  /** The publications held now, oldest first. */
  get held(): readonly HeldPublication[] {
    return this.#held;
  }

  /** Holds every later publication until {@link resume} or {@link cancel}. */
  pause(): void {
    this.#paused = true;
  }

  /** Resolves with `envelope`'s outcome once it is stored, cancelled or ended. */
  hold(envelope: Envelope, holder: CreditHolder | null): Promise<PublicationOutcome> {
    return new Promise((resolve) => this.#held.push({ envelope, holder, resolve }));
  }

  /** Whether publication `publicationId` is held. */
  holds(publicationId: string): boolean {
    return this.#held.some((publication) => publication.envelope.publicationId === publicationId);
  }

  /** Unpauses, stores every held publication in order with `store` and returns their outcomes. */
  resume(
    store: (envelope: Envelope, holder: CreditHolder | null) => PublicationOutcome,
  ): PublicationOutcome[] {
    this.#paused = false;
    return this.take().map((publication) => {
      const outcome = store(publication.envelope, publication.holder);
      publication.resolve(outcome);
      return outcome;
    });
  }

  /** Definitely cancels a held publication (its publisher, if still waiting, gets Rejected); false when none was held. */
  cancel(publicationId: string): boolean {
    const index = this.#held.findIndex((publication) => publication.envelope.publicationId === publicationId);
    if (index < 0) return false;
    const [publication] = this.#held.splice(index, 1);
    publication.resolve(
      rejected(publicationId, "the held publication was cancelled before it was stored", true),
    );
    return true;
  }

  /** Hands over every held publication, holding none after. */
  take(): HeldPublication[] {
    const held = this.#held;
    this.#held = [];
    return held;
  }
}
