/**
 * The publications and settlements a messenger lets run while its node goes on to the next item: a
 * bounded set of background operations whose first failure is kept and thrown by the next call that
 * checks, so a node is never told "done" for work that failed and never waits on a broker round trip it
 * does not depend on.
 *
 * @example
 * ```ts
 * const work = new InFlight(2);
 * work.track(Promise.resolve());
 * await work.admit(); // resolves once fewer than 2 operations run
 * await work.drain(); // resolves once none runs; throws the first failure, if any
 * ```
 *
 * @module
 */

import { ConfigError } from "../core/errors.ts";

/** A bounded set of running operations and the first failure among them. */
export class InFlight {
  readonly #depth: number;
  #running = 0;
  #failure: { readonly error: unknown } | null = null;
  #waiter: PromiseWithResolvers<void> | null = null;
  #abandoned = false;

  /**
   * `depth`: how many operations may run before {@link admit} waits (1 makes every caller wait for its
   * own operation).
   *
   * @throws ConfigError when `depth` is not a positive integer.
   */
  constructor(depth: number) {
    if (!Number.isSafeInteger(depth) || depth < 1) {
      throw new ConfigError(
        `the in-flight depth must be a positive integer, got ${depth}`,
        "pass 1 to wait for every publication and settlement, or more to overlap them",
      );
    }
    this.#depth = depth;
  }

  /** Operations still running. */
  get running(): number {
    return this.#running;
  }

  /** Whether {@link abandon} was called: work not yet begun must not begin. */
  get abandoned(): boolean {
    return this.#abandoned;
  }

  /** Lets `operation` run on; its rejection becomes this set's failure (the first one is kept). */
  track(operation: Promise<unknown>): void {
    this.#running++;
    operation.then(
      () => this.#finished(),
      (error) => {
        this.#failure ??= { error };
        this.#finished();
      },
    );
  }

  /** Throws the first failure of any tracked operation (again on every call). */
  check(): void {
    if (this.#failure !== null) throw this.#failure.error;
  }

  /** Resolves once fewer than the depth run, then {@link check}s. */
  async admit(): Promise<void> {
    while (this.#running >= this.#depth) await this.#next();
    this.check();
  }

  /** Resolves once nothing runs, whatever failed. */
  async idle(): Promise<void> {
    while (this.#running > 0) await this.#next();
  }

  /** Resolves once nothing runs, then {@link check}s. */
  async drain(): Promise<void> {
    await this.idle();
    this.check();
  }

  /** What a crash leaves: operations already begun run out; work that checks {@link abandoned} does not begin. */
  abandon(): void {
    this.#abandoned = true;
  }

  #next(): Promise<void> {
    this.#waiter ??= Promise.withResolvers<void>();
    return this.#waiter.promise;
  }

  #finished(): void {
    this.#running--;
    const waiter = this.#waiter;
    if (waiter === null) return;
    this.#waiter = null;
    waiter.resolve();
  }
}
