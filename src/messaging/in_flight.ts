/**
 * The publications and settlements a messenger lets run while its node goes on to the next item: a
 * bounded set of background operations whose first failure is kept and thrown by the next call that
 * checks, so a node is never told "done" for work that failed and never waits on a broker round trip it
 * does not depend on.
 *
 * @example
 * ```ts
 * const work = new InFlight(2, 1024);
 * await work.room(512); // resolves once 512 more bytes fit beside those running
 * work.track(Promise.resolve(), 512);
 * await work.admit(); // resolves once fewer than 2 operations, holding under 1024 bytes, run
 * await work.drain(); // resolves once none runs; throws the first failure, if any
 * ```
 *
 * @module
 */

import { ConfigError } from "../core/errors.ts";

/** A bounded set of running operations (by count and by the bytes they hold) and the first failure among them. */
export class InFlight {
  readonly #depth: number;
  readonly #maxBytes: number;
  #running = 0;
  #bytes = 0;
  #failure: { readonly error: unknown } | null = null;
  #waiter: PromiseWithResolvers<void> | null = null;
  #abandoned = false;

  /**
   * `depth`: how many operations may run before {@link admit} waits (1 makes every caller wait for its
   * own operation); `maxBytes`: how many bytes the running operations may hold before it waits (none by
   * default; one operation, however large, may always run).
   *
   * @throws ConfigError when `depth` is not a positive integer or `maxBytes` not a positive number.
   */
  constructor(depth: number, maxBytes = Infinity) {
    if (!Number.isSafeInteger(depth) || depth < 1) {
      throw new ConfigError(
        `the in-flight depth must be a positive integer, got ${depth}`,
        "pass 1 to wait for every publication and settlement, or more to overlap them",
      );
    }
    if (!(maxBytes > 0)) {
      throw new ConfigError(
        `the in-flight bytes must be a positive number, got ${maxBytes}`,
        "pass the most bytes the publications in flight may hold, or leave it unbounded",
      );
    }
    this.#depth = depth;
    this.#maxBytes = maxBytes;
  }

  /** Operations still running. */
  get running(): number {
    return this.#running;
  }

  /** Whether {@link abandon} was called: work not yet begun must not begin. */
  get abandoned(): boolean {
    return this.#abandoned;
  }

  /**
   * Lets `operation`, holding `bytes` until it ends, run on; its rejection becomes this set's failure (the
   * first one is kept).
   */
  track(operation: Promise<unknown>, bytes = 0): void {
    this.#running++;
    this.#bytes += bytes;
    operation.then(
      () => this.#finished(bytes),
      (error) => {
        this.#failure ??= { error };
        this.#finished(bytes);
      },
    );
  }

  /** Throws the first failure of any tracked operation (again on every call). */
  check(): void {
    if (this.#failure !== null) throw this.#failure.error;
  }

  /** Resolves once fewer than the depth run and they hold fewer than the bytes, then {@link check}s. */
  async admit(): Promise<void> {
    while (this.#running >= this.#depth || (this.#running > 0 && this.#bytes >= this.#maxBytes)) {
      await this.#next();
    }
    this.check();
  }

  /**
   * {@link admit} decided now: true (after {@link check}) when it would not wait, false when the caller
   * must await it; saves a turn and a promise per operation on the common path.
   */
  admitsNow(): boolean {
    if (this.#running >= this.#depth || (this.#running > 0 && this.#bytes >= this.#maxBytes)) return false;
    this.check();
    return true;
  }

  /** {@link room} decided now: true (after {@link check}) when `bytes` fit at once, false when the caller must await it. */
  roomNow(bytes: number): boolean {
    if (this.#running > 0 && this.#bytes + bytes > this.#maxBytes) return false;
    this.check();
    return true;
  }

  /**
   * Resolves once an operation holding `bytes` fits beside those running (none runs, or they hold at most
   * the bytes less `bytes`), then {@link check}s: called before the operation starts, it keeps the bytes
   * held within the bound, one operation larger than the bound running alone.
   */
  async room(bytes: number): Promise<void> {
    while (this.#running > 0 && this.#bytes + bytes > this.#maxBytes) await this.#next();
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

  #finished(bytes: number): void {
    this.#running--;
    this.#bytes -= bytes;
    const waiter = this.#waiter;
    if (waiter === null) return;
    this.#waiter = null;
    waiter.resolve();
  }
}
