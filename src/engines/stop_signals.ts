/**
 * SIGINT and SIGTERM, the requests to stop a run, caught from the moment they are listened for: one that
 * arrives before anything can act on it (while the flow loads, while the engine takes its lock and opens
 * its ledger) is kept and handed to the first handler attached, so a stop at any moment of a run is the
 * same clean stop. A process that listens is never ended by those signals' default action until it
 * closes its listener.
 *
 * @example
 * ```ts
 * using signals = StopSignals.listen();
 * // ... load the flow; a Ctrl-C now is kept ...
 * const detach = signals.attach((signal) => console.log(`stop on ${signal}`));
 * detach();
 * ```
 *
 * @module
 */

/** The signals that ask a run to stop. */
export const STOP_SIGNALS = ["SIGINT", "SIGTERM"] as const;

/** One of {@link STOP_SIGNALS}. */
export type StopSignal = typeof STOP_SIGNALS[number];

/** What a run's caller's abort signal is named as when it stops the run (`LocalRunOptions.signal`). */
export const STOP_REQUESTED = "request";

/** What asked a run to stop: a signal to this process, or the caller's abort signal. */
export type StopRequester = Deno.Signal | typeof STOP_REQUESTED;

/** The listener of {@link STOP_SIGNALS} for one process: see the module comment. */
export class StopSignals implements Disposable {
  readonly #listeners: readonly (readonly [StopSignal, () => void])[];
  /** Signals that arrived before a handler was attached, in order. */
  #kept: StopSignal[] = [];
  #handler: ((signal: StopSignal) => void) | null = null;
  /** A handler was attached and detached: what it could stop is over, and later signals change nothing. */
  #over = false;
  #closed = false;

  private constructor() {
    this.#listeners = STOP_SIGNALS.map((signal) => [signal, () => this.#arrived(signal)] as const);
    for (const [signal, listener] of this.#listeners) Deno.addSignalListener(signal, listener);
  }

  /** Starts listening now; the signals are kept until a handler is attached. */
  static listen(): StopSignals {
    return new StopSignals();
  }

  /**
   * Hands every signal to `handler`: first those kept, in the order they came, then each as it arrives,
   * until the returned function detaches it. After that, signals are caught and change nothing.
   *
   * @throws Error when a handler is already attached, or one was detached already.
   */
  attach(handler: (signal: StopSignal) => void): () => void {
    if (this.#handler !== null || this.#over) {
      throw new Error("stop signals are handled once, by one handler");
    }
    this.#handler = handler;
    for (const signal of this.#kept.splice(0)) handler(signal);
    return () => {
      this.#handler = null;
      this.#over = true;
    };
  }

  /** Stops listening: the signals' default action applies again. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const [signal, listener] of this.#listeners) Deno.removeSignalListener(signal, listener);
  }

  /** {@link close}, for `using`. */
  [Symbol.dispose](): void {
    this.close();
  }

  #arrived(signal: StopSignal): void {
    if (this.#handler !== null) this.#handler(signal);
    else if (!this.#over) this.#kept.push(signal);
  }
}
