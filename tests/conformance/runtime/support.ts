/**
 * What the FlowRuntime conformance scenarios (scenarios.ts) run on: the provider contract a store
 * implementation fills in, and the helpers that drive time and faults deterministically.
 *
 * @module
 */

import type { Clock } from "../../../src/backends/clock.ts";
import { crash, FaultSchedule, nth, throwSimulatedCrash } from "../../../src/backends/faults.ts";
import type { Barrier } from "../../../src/backends/faults.ts";
import type { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  FlowRuntime,
  type FlowRuntimeOptions,
  type LeaseKeeper,
  type OwnershipToken,
} from "../../../src/backends/runtime.ts";
import type { RuntimeStore } from "../../../src/backends/runtime_store.ts";

/** One ledger, as one or more processes see it. Disposing it closes every handle and removes its state. */
export interface LedgerFixture extends AsyncDisposable {
  /** The ledger as the first process opened it. */
  readonly store: RuntimeStore;
  /**
   * The same ledger as another process (a replacement, a sibling) sees it: a fresh handle on the same state
   * where the store has handles, the same object where the state lives in one object.
   */
  reopen(): Promise<RuntimeStore>;
}

/** A RuntimeStore implementation under test. */
export interface RuntimeProvider {
  /** Prefixes every test name: `memory`, `file`. */
  readonly name: string;
  /** Its capabilities report durable Known(true): checkpoints are accepted (RUN-022). */
  readonly durable: boolean;
  /** Its writes hit `ledger.write.mid` (a temporary file written, not yet in place). */
  readonly midWriteBarrier: boolean;
  /** A fresh, empty ledger stamped by `clock`. */
  create(clock: Clock): Promise<LedgerFixture>;
}

/** The namespace every scenario's runtimes share. */
export const FLOW = "flow-A";
export const RUN = "run-1";

/** A runtime over `store` in the scenario namespace; `options` add to or replace the defaults. */
export function runtimeOn(
  store: RuntimeStore,
  clock: Clock,
  options: Partial<FlowRuntimeOptions> & { readonly node: string },
): FlowRuntime {
  return new FlowRuntime({ store, clock, flowId: FLOW, runId: RUN, ...options });
}

/**
 * A schedule that "crashes" the process at the `n`-th hit of `at`: the call throws SimulatedCrash, and the
 * scenario treats that runtime as dead from then on. Install it with `using`.
 */
export function crashAt(at: Barrier, n = 1): FaultSchedule {
  return new FaultSchedule({ [at]: nth(n, crash()) }, { onCrash: throwSimulatedCrash });
}

/** How long (real time) {@link driveClock} lets the work run before it gives up on it. */
const DRIVE_LIMIT_MS = 30_000;

/**
 * Runs `work` to completion on a FakeClock: whenever `sleepers` timers are armed (every party that sleeps
 * on the clock is asleep, none is busy with I/O), time jumps to the earliest one. So time only moves when
 * nothing can happen without it, and the readings the work sees are exact. Rejects as `work` does.
 */
export async function driveClock<T>(clock: FakeClock, work: Promise<T>, sleepers: number): Promise<T> {
  let outcome: { ok: true; value: T } | { ok: false; error: unknown } | null = null;
  work.then((value) => outcome = { ok: true, value }, (error) => outcome = { ok: false, error });
  const limit = performance.now() + DRIVE_LIMIT_MS;
  while (outcome === null) {
    if (performance.now() > limit) throw new Error(`the work did not settle within ${DRIVE_LIMIT_MS} ms`);
    const next = clock.nextTimerIn();
    if (next !== null && clock.pendingTimers() >= sleepers) clock.advance(next);
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
  const settled = outcome as { ok: true; value: T } | { ok: false; error: unknown };
  if (!settled.ok) throw settled.error;
  return settled.value;
}

/**
 * A live holder: `runtime.keepLease(token)` (a renewal every third of a lease on the runtime's clock, one
 * armed timer while it sleeps), whose `stop()` fails the test if the lease was lost meanwhile.
 */
export function keepAlive(runtime: FlowRuntime, token: OwnershipToken): LeaseKeeper {
  let lost: Error | null = null;
  const keeper = runtime.keepLease(token, (error) => lost = error);
  return {
    get renewals() {
      return keeper.renewals;
    },
    async stop() {
      await keeper.stop();
      if (lost !== null) throw lost;
    },
  };
}
