/**
 * The messenger's end-of-stream drain: when a parent whose end was seen has drained (EOS-3), or passed
 * the EOS-7 completion barrier, so that its EOS may be acked and fed to the join.
 *
 * It guarantees: under EOS-3 a parent drains once every expected replica's EOS was seen and its data
 * subscription reports nothing waiting (unresolved work counts for an at-least-once node), nothing leased
 * beyond the halves the join holds, continuously for the quiescence; under EOS-7 (a batch parent over a
 * durable shared ledger) it drains once the ledger's completion state is complete, and the completion is
 * committed under the replica's partition lease before it is reported; the ledger is read only when the
 * broker reports nothing for the node, the one state in which the barrier can be complete. A subscription
 * that cannot be read never counts as empty (Unknown waits, never completes). Each parent is re-checked at
 * most every {@link BARRIER_CHECK_SECONDS} under the barrier and every fifth of the quiescence otherwise.
 *
 * @module
 */

import type { MessagingBackend, SubscriptionId, SubscriptionObservation } from "../backends/messaging.ts";
import type { Observation } from "../backends/outcomes.ts";
import { CompletionState, type FlowRuntime, type OwnershipToken } from "../backends/runtime.ts";
import { FlowStalled, LASTING_FAILURE_KEY } from "../core/errors.ts";

/** How often the EOS-7 barrier is re-evaluated for a parent whose end was seen, at most, in seconds. */
export const BARRIER_CHECK_SECONDS = 0.25;
/** Readings this close count as the same instant: a deadline met by a timer's rounding is met. */
const TIME_TOLERANCE_SECONDS = 1e-6;

/** What the drain reads of a parent (the messenger's per-parent state). */
export interface DrainingParent {
  /** The parent's name. */
  readonly name: string;
  /** This replica's data subscription on the parent. */
  readonly data: SubscriptionId;
  /** The data subscription's durable name: the received set's key. */
  readonly durable: string;
  /** How many replicas' EOS end the parent. */
  readonly expected: number;
  /** Whether the EOS-7 barrier decides the drain. */
  readonly barrier: boolean;
  /** The end markers held, by parent replica. */
  readonly ends: { readonly size: number };
  /** Whether the parent already drained. */
  readonly drained: boolean;
  /** Data handles of this parent the join holds. */
  readonly inJoin: number;
}

/** How an {@link EosDrain} decides. */
export interface EosDrainOptions {
  /** The transport, observed for what it still holds for the node. */
  readonly backend: MessagingBackend;
  /** The node's ledger: terminators and received sets (EOS-7). */
  readonly runtime: FlowRuntime;
  /** EOS-3's quiescence, in seconds. */
  readonly quiescenceSeconds: number;
  /** Whether the node is at-least-once (unresolved work then still counts for it). */
  readonly atLeastOnce: boolean;
  /** The partition lease a completion is committed under (`null` when none is held). */
  readonly lease: () => OwnershipToken | null;
  /**
   * How long the EOS-7 barrier may stay short with nothing left on the broker before the missing items
   * count as lost (FlowStalled), in seconds: the data subscription's ack wait, the longest a
   * delivery the broker still tracks can stay unseen.
   */
  readonly lossGraceSeconds: number;
}

/** When one parent was last seen quiet, when it is next checked, and whether its barrier stays short. */
interface DrainState {
  quietSince: number | null;
  nextCheck: number;
  /**
   * Since when (monotonic seconds) the EOS-7 checks have found, without a break, every replica ended and
   * the broker holding nothing for this node, yet the ledger noting fewer ids received than the parent
   * announced (the held end markers are work that waits); null when the last check did not.
   */
  shortSince: number | null;
}

/** One replica's drain decisions over its parents. */
export class EosDrain {
  readonly #backend: MessagingBackend;
  readonly #runtime: FlowRuntime;
  readonly #quiescence: number;
  readonly #atLeastOnce: boolean;
  readonly #lease: () => OwnershipToken | null;
  readonly #lossGrace: number;
  readonly #states = new Map<string, DrainState>();

  /** Has checked no parent yet. */
  constructor(options: EosDrainOptions) {
    this.#backend = options.backend;
    this.#runtime = options.runtime;
    this.#quiescence = options.quiescenceSeconds;
    this.#atLeastOnce = options.atLeastOnce;
    this.#lease = options.lease;
    this.#lossGrace = options.lossGraceSeconds;
  }

  /**
   * Whether a parent's drain is being decided: its end was seen (under EOS-3, every expected replica's;
   * under EOS-7 the ledger counts the replicas) and it has not drained yet.
   */
  awaitsDrain(parent: DrainingParent): boolean {
    if (parent.drained || parent.ends.size === 0) return false;
    return parent.barrier || parent.ends.size >= parent.expected;
  }

  /** When `parent` is next checked (monotonic seconds; 0 before its first check). */
  nextCheck(parent: DrainingParent): number {
    return this.#states.get(parent.name)?.nextCheck ?? 0;
  }

  /** Whether `parent`'s next check is due at `now`. */
  due(parent: DrainingParent, now: number): boolean {
    return now + TIME_TOLERANCE_SECONDS >= this.nextCheck(parent);
  }

  /** Whether the last EOS-7 check found the barrier short with nothing left on the broker. */
  barrierShort(parent: DrainingParent): boolean {
    return (this.#states.get(parent.name)?.shortSince ?? null) !== null;
  }

  /**
   * Whether a parent's subscription still holds work for this node: waiting (a retry's delay included) or
   * leased. A subscription that cannot be read counts as holding some (Unknown never passes for none).
   */
  async inputsOutstanding(parents: readonly DrainingParent[]): Promise<boolean> {
    for (const parent of parents) {
      const observed = await this.#backend.observeSubscription(parent.data);
      if (observed.kind !== "known" || this.waiting(observed.value) > 0 || observed.value.leased > 0) {
        return true;
      }
    }
    return false;
  }

  /**
   * Whether `parent`'s data subscription holds nothing for this node any more (EOS-3), or the EOS-7
   * barrier is complete. Deliveries leased beyond the halves this join holds, and work the broker keeps
   * unresolved (unless the node is best-effort, whose exhausted deliveries are dropped by design), keep
   * it open.
   *
   * @throws FlowStalled (exit 5: the run can never finish) when the EOS-7 barrier stayed short, with
   *   nothing on the broker, for the loss grace: the parent announced items the broker no longer holds
   *   (a server that dropped accepted messages), which no wait brings back.
   */
  async isDrained(parent: DrainingParent, now: number): Promise<boolean> {
    const drain = this.#stateOf(parent);
    const observed = await this.#backend.observeSubscription(parent.data);
    if (parent.barrier) {
      drain.nextCheck = now + BARRIER_CHECK_SECONDS;
      const counts: Observation<readonly [number, number]> = observed.kind === "known"
        ? { ...observed, value: [this.waiting(observed.value), observed.value.leased - parent.inJoin] }
        : observed;
      // The barrier is never complete while the broker holds work for this node or cannot be read, so the
      // ledger (terminators, every received record) is read only when the broker's facts allow completion.
      if (counts.kind !== "known" || counts.value[0] > 0 || counts.value[1] > 0) {
        drain.shortSince = null;
        return false;
      }
      const state = await this.#runtime.completionState(parent.name, parent.durable, counts, false);
      drain.shortSince = state === CompletionState.draining ? drain.shortSince ?? now : null;
      if (drain.shortSince !== null && now - drain.shortSince >= this.#lossGrace) {
        throw await this.#lost(parent, now - drain.shortSince);
      }
      if (state !== CompletionState.complete) return false;
      // A terminator recorded after that look at the broker (by a sibling) may end a stream whose last
      // outputs the look missed; a count that falls short (outputs of a replica killed before its tally
      // noted them) would not hold them: the broker is looked at again, after the terminators.
      if (await this.#holdsWork(parent)) return false;
      await this.#runtime.commitCompletion(parent.name, this.#lease());
      return true;
    }
    drain.nextCheck = now + Math.max(0.01, this.#quiescence / 5);
    const quiet = observed.kind === "known" && this.waiting(observed.value) === 0 &&
      observed.value.leased === parent.inJoin;
    if (!quiet) {
      drain.quietSince = null;
      return false;
    }
    drain.quietSince ??= now;
    if (now - drain.quietSince >= this.#quiescence) return true;
    drain.nextCheck = Math.min(drain.nextCheck, drain.quietSince + this.#quiescence);
    return false;
  }

  async #lost(parent: DrainingParent, seconds: number): Promise<FlowStalled> {
    const announced = await this.#runtime.announcedCount(parent.name);
    const received = await this.#runtime.receivedCount(parent.name, parent.durable);
    return new FlowStalled(
      `${announced - received} of the ${announced} items ${parent.name} announced never reached this node ` +
        `(${received} received), and for ${seconds.toFixed(0)} s the broker has held none of them on ` +
        `${parent.durable}: the broker dropped messages it had accepted, or ${parent.name} counted items ` +
        "it never published",
      "check the broker's log around the run (nats-server 2.9.10 stopped or restarted mid-run drops a pull " +
        "delivery in flight) and the parent's published records; rerun with a fresh run id, or make the " +
        "missing items again upstream",
      {
        parent: parent.name,
        durable: parent.durable,
        reason: "broker_lost_messages",
        announced,
        received,
        [LASTING_FAILURE_KEY]: true,
      },
    );
  }

  /** Whether the broker holds work on `parent`'s data for this node beyond the join's halves, or cannot say. */
  async #holdsWork(parent: DrainingParent): Promise<boolean> {
    const observed = await this.#backend.observeSubscription(parent.data);
    return observed.kind !== "known" || this.waiting(observed.value) > 0 ||
      observed.value.leased - parent.inJoin > 0;
  }

  /**
   * Work on a subscription that is not leased and still counts for this node: what waits for delivery, and
   * what the broker keeps unresolved (MSG-012), except for a best-effort node, which drops it by design.
   */
  waiting(observed: SubscriptionObservation): number {
    return observed.available + (this.#atLeastOnce ? observed.unresolved : 0);
  }

  #stateOf(parent: DrainingParent): DrainState {
    let state = this.#states.get(parent.name);
    if (state === undefined) {
      state = { quietSince: null, nextCheck: 0, shortSince: null };
      this.#states.set(parent.name, state);
    }
    return state;
  }
}
