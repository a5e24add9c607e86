/**
 * A piece of work run again on demand, one run at a time, where each run takes its inputs when it starts
 * (a flush of what has piled up, a rewrite of a whole file).
 *
 * @module
 */

/**
 * Runs `work` when asked, one run at a time: a request made while a run goes on queues the next run, and
 * the requests made while that one waits share it, since it reads its inputs only when it starts. Each
 * request resolves or rejects with the run that covers it; a failed run does not stop the next.
 */
export class CoalescedRun {
  readonly #work: () => Promise<void>;
  /** The latest run, settled either way: what the next one waits for. */
  #running: Promise<void> = Promise.resolve();
  /** The run waiting for the one going on, which later requests share. */
  #queued: Promise<void> | null = null;

  constructor(work: () => Promise<void>) {
    this.#work = work;
  }

  /** A run that starts after every earlier one ended: the queued one when one waits, else a new one. */
  request(): Promise<void> {
    if (this.#queued !== null) return this.#queued;
    const run = this.#running.then(() => {
      this.#queued = null;
      return this.#work();
    });
    this.#queued = run;
    this.#running = run.catch(() => {});
    return run;
  }
}
