/**
 * Calls that carry many: a publisher's publications (or a receiver's settlements) made close together go
 * to the backend as one batch call (`MessagingBackend.publishBatch`, `settleBatch`) with one promise, and
 * each caller gets its own entry's outcome. A batch leaves {@link BATCH_HOPS} microtask turns after the
 * latest call added to it (a node's loop that makes a call every few turns fills one batch until it waits
 * on something), or at once when it holds `maxEntries`. Entries keep the order they were added in, and
 * batches the order they left in, so a batcher changes no order a backend sees.
 *
 * @example
 * ```ts
 * const doubler = new CallBatcher<number, number>((xs) => Promise.resolve(xs.map((x) => 2 * x)), 64);
 * console.log(await Promise.all([doubler.call(1), doubler.call(2)])); // [2, 4], in one batch
 * ```
 *
 * @module
 */

/** Microtask turns a batch waits after its latest call for another before it leaves. */
export const BATCH_HOPS = 8;

interface Entry<O> {
  readonly resolve: (value: O) => void;
  readonly reject: (error: unknown) => void;
}

/** Coalesces calls into batch calls of `run` (see the module comment). */
export class CallBatcher<I, O> {
  readonly #run: (inputs: I[]) => Promise<readonly O[]>;
  readonly #maxEntries: number;
  #inputs: I[] = [];
  #entries: Entry<O>[] = [];
  #hopsLeft = 0;
  readonly #hop = () => {
    if (this.#hopsLeft === 0) return;
    if (--this.#hopsLeft > 0) queueMicrotask(this.#hop);
    else this.#flush();
  };

  /** `run` answers a batch with one output per input, in order; `maxEntries` caps a batch. */
  constructor(run: (inputs: I[]) => Promise<readonly O[]>, maxEntries: number) {
    this.#run = run;
    this.#maxEntries = maxEntries;
  }

  /** Adds `input` to the batch being built; resolves with its own output (rejects with the batch's error). */
  call(input: I): Promise<O> {
    const { promise, resolve, reject } = Promise.withResolvers<O>();
    this.#inputs.push(input);
    this.#entries.push({ resolve, reject });
    if (this.#inputs.length >= this.#maxEntries) this.#flush();
    else if (this.#hopsLeft === 0) {
      this.#hopsLeft = BATCH_HOPS;
      queueMicrotask(this.#hop);
    } else this.#hopsLeft = BATCH_HOPS;
    return promise;
  }

  #flush(): void {
    this.#hopsLeft = 0;
    const inputs = this.#inputs;
    const entries = this.#entries;
    if (inputs.length === 0) return;
    this.#inputs = [];
    this.#entries = [];
    let running: Promise<readonly O[]>;
    try {
      running = this.#run(inputs);
    } catch (error) {
      running = Promise.reject(error);
    }
    running.then(
      (outputs) => {
        for (let i = 0; i < entries.length; i++) entries[i].resolve(outputs[i]);
      },
      (error) => {
        for (const entry of entries) entry.reject(error);
      },
    );
  }
}
