/**
 * Distinct ids counted in bounded records (the EOS-7 received and published sets of the run ledger). Each
 * writer (one replica's process) keeps one {@link IdTally} and rewrites it as one record: the ids it proved
 * unique for good, as a count, and the ids it could not prove, by name. An id is proven when nothing can
 * note it again while the broker lives: a first delivery (attempt 1) the broker confirmed settled
 * Completed or Terminal, an output of inputs proven so, a live source's output (its ids carry a capture
 * epoch of their own process), or a replayable source's output that its saved position covers. A
 * redelivery, a retry, or a writer that died before its settle proves nothing, and what stays named is
 * deduplicated against every other record by the union of names: the distinct ids of a set of tallies (the
 * sum of their counts and the size of the union of their names) are exact whatever crashes came between
 * their writes, and a record holds what is in flight and what failed, not an entry per id that passed.
 *
 * What it assumes: a broker delivers a message id once per subscription until it is settled. A broker that
 * takes a republished id as new after its duplicate window ends delivers it a second time as a first
 * delivery, and that id is counted twice (the EOS-7 barrier then rests on the broker reporting nothing
 * pending, which it also checks).
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
