/**
 * Distinct ids counted in bounded records (the EOS-7 received and published sets of the run ledger). Each
 * writer (one replica's process, one incarnation) keeps one {@link IdTally} and rewrites it as one record:
 * the ids it proved unique for good, as a count, and the ids it could not prove, by name. An id is proven
 * when nothing can ever note it again in this broker's life: a first delivery the broker confirmed settled
 * for good (a redelivery, a retry or a crash before the settle proves nothing), or an output whose input
 * was proven so, or that a replayable source's saved position covers. What a writer did not prove stays
 * named, and the union of named ids deduplicates it against every other record: the distinct ids of a set
 * of tallies (the sum of their counts and the size of the union of their names) are exact whatever crashes came between their writes, and a tally's record holds what is
 * in flight and what failed, not one entry per id that passed.
 *
 * @module
 */

/** A tally as its record holds it: the ids proven unique, counted, and the others, named. */
export interface TallyDocument {
  /** How many ids were proven unique (no other record names or counts them, nor ever will). */
  readonly count: number;
  /** The ids noted and not proven: in flight, redelivered, retried, or noted by a writer that died. */
  readonly ids: readonly string[];
}

/** One writer's tally of distinct ids, kept in memory and saved whole as a {@link TallyDocument}. */
export class IdTally {
  #count = 0;
  readonly #ids = new Set<string>();

  /** Notes ids as seen and not proven; true when any of them was new to this tally. */
  note(ids: readonly string[]): boolean {
    const before = this.#ids.size;
    for (const id of ids) this.#ids.add(id);
    return this.#ids.size > before;
  }

  /**
   * Counts `id` as proven unique, once: only an id this tally holds by name moves to the count (an id it
   * never noted, or proved already, changes nothing).
   */
  prove(id: string): void {
    if (this.#ids.delete(id)) this.#count++;
  }

  /** What the record of this tally holds now. */
  document(): TallyDocument {
    return { count: this.#count, ids: [...this.#ids] };
  }
}
