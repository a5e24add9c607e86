/**
 * The messenger's partition lease: the ownership token a replica holds for its partition over a shared
 * ledger, kept alive while the replica runs.
 *
 * It guarantees: a lease the runtime already holds (a claimed slot's) is kept, and a partitioned replica
 * over a durable shared ledger acquires its own; the lease is renewed until {@link PartitionLease.stop};
 * a lost renewal is reported once (`onLost`), so the replica stops with a lost authority; and
 * {@link PartitionLease.release} gives the partition back so a replacement takes over at once.
 *
 * @module
 */

import type { FlowRuntime, LeaseKeeper, OwnershipToken } from "../backends/runtime.ts";
import type { Logger } from "../core/context.ts";

/** How a {@link PartitionLease} keeps its lease. */
export interface PartitionLeaseOptions {
  /** The node's ledger, which grants and renews the lease. */
  readonly runtime: FlowRuntime;
  /** Called when a renewal finds the lease lost: the replica's authority is gone. */
  readonly onLost: () => void;
  /** Where a lost lease is reported. */
  readonly logger: Logger;
}

/** One replica's partition lease, if it holds one. */
export class PartitionLease {
  readonly #runtime: FlowRuntime;
  readonly #onLost: () => void;
  readonly #logger: Logger;
  #leaseKeeper: LeaseKeeper | null = null;
  #lease: OwnershipToken | null = null;

  /** Holds nothing until {@link keep}. */
  constructor(options: PartitionLeaseOptions) {
    this.#runtime = options.runtime;
    this.#onLost = options.onLost;
    this.#logger = options.logger;
  }

  /** The token held, which fences the replica's completion commit; `null` when none is held. */
  get token(): OwnershipToken | null {
    return this.#lease;
  }

  /**
   * Keeps a partition lease the runtime holds, acquiring one first when `acquire` (a partitioned replica
   * over a shared ledger) and none is held.
   */
  async keep(acquire: boolean): Promise<void> {
    let token = this.#runtime.heldPartition();
    if (token === null && acquire) {
      token = await this.#runtime.acquirePartition();
    }
    if (token === null) return;
    this.#lease = token;
    this.#leaseKeeper = this.#runtime.keepLease(token, (error) => {
      this.#onLost();
      this.#logger.error("the partition lease was lost", { error: error.message });
    });
  }

  /** Stops renewing the lease (it lapses on its own unless {@link release}d). */
  async stop(): Promise<void> {
    await this.#leaseKeeper?.stop();
  }

  /** Gives a held lease back so a replacement takes over at once. */
  async release(): Promise<void> {
    if (this.#lease !== null) await this.#runtime.releasePartition(this.#lease);
  }
}
