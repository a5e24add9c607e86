/**
 * A running worker's payload reconciliation (BLOB-14 step 4, `VF_RECONCILE_INTERVAL_SECONDS`): passes of
 * {@link PayloadStore.reconcile} against the runtime's own obligation ledger, one as the worker starts
 * (in the background: opening does not wait for it) and then one every interval until stopped (none after
 * the first when the interval is 0). What a pass may reclaim is only what the ledger says nobody owes any
 * more (a reader that settled without releasing, a refused publication's objects); everything it could not
 * observe stays. A pass that fails is logged and the next one runs on time, so a store unreachable for a
 * while reclaims nothing then and catches up later. Passes never overlap.
 *
 * @module
 */

import type { Clock, TimerHandle } from "../backends/clock.ts";
import type { ObligationLedger, PayloadStore, ReclamationObservation } from "../backends/payload.ts";

/** How long {@link PayloadReconciler.stop} waits for a pass still running, in seconds. */
export const STOP_WAIT_SECONDS = 5;

/** What a {@link PayloadReconciler} reconciles, how often, and where it says what a pass did. */
export interface PayloadReconcilerOptions {
  readonly store: PayloadStore;
  readonly ledger: ObligationLedger;
  readonly clock: Clock;
  /** Seconds between passes after the first; 0: the first pass only. */
  readonly intervalSeconds: number;
  /** Names the passes' operation ids (`<prefix>:<n>`), unique to this replica's run. */
  readonly operationPrefix: string;
  /** Called after each pass that reclaimed something or could not judge some keys. */
  readonly onPass?: (observation: ReclamationObservation) => void;
  /** Called when a pass failed; the next pass still runs. */
  readonly onError: (error: unknown) => void;
}

/** Runs a worker's reconcile passes (see the module comment). */
export class PayloadReconciler {
  readonly #options: PayloadReconcilerOptions;
  #passes = 0;
  #running: Promise<void> | null = null;
  #timer: TimerHandle | null = null;
  #stopped = false;

  /** Runs nothing until {@link start}. */
  constructor(options: PayloadReconcilerOptions) {
    this.#options = options;
  }

  /** Starts the first pass now (not awaited) and schedules the next ones. */
  start(): void {
    if (this.#stopped || this.#running !== null || this.#timer !== null) return;
    this.#pass();
  }

  /** How many passes have completed (failed ones included). */
  get passes(): number {
    return this.#passes;
  }

  /**
   * Schedules no more passes and waits for the one running, if any, for at most
   * {@link STOP_WAIT_SECONDS} (a pass against a store that stopped answering is left to end on its own).
   */
  async stop(): Promise<void> {
    this.#stopped = true;
    this.#timer?.cancel();
    this.#timer = null;
    if (this.#running === null) return;
    const gaveUp = new AbortController();
    await Promise.race([
      this.#running,
      this.#options.clock.sleep(STOP_WAIT_SECONDS, gaveUp.signal).catch(() => {}),
    ]);
    gaveUp.abort();
  }

  #pass(): void {
    this.#timer = null;
    const { store, ledger, operationPrefix, onPass, onError } = this.#options;
    this.#running = store.reconcile(ledger, `${operationPrefix}:${this.#passes + 1}`).then(
      (observation) => {
        if (observation.reclaimed.length > 0 || observation.unknown.length > 0) onPass?.(observation);
      },
    ).catch(onError).finally(() => {
      this.#passes++;
      this.#running = null;
      this.#schedule();
    });
  }

  #schedule(): void {
    const { intervalSeconds, clock } = this.#options;
    if (this.#stopped || intervalSeconds === 0) return;
    this.#timer = clock.setTimer(intervalSeconds, () => this.#pass());
  }
}
