/**
 * The messenger's checkpoint coverage (RUN-003): the input group a restored checkpoint covers, and the
 * output committed with it.
 *
 * It guarantees: a redelivery of the covered group is recognised ({@link CheckpointCoverage.covers}) so it
 * is acked without reaching the node; before that ack, an output committed with the checkpoint whose
 * acceptance the ledger has not confirmed is published again from the committed bytes (`republish`), so
 * the group's output is never lost between the checkpoint and the crash that followed it.
 *
 * @module
 */

import type { FlowRuntime, ReplayPosition } from "../backends/runtime.ts";

/** How a {@link CheckpointCoverage} confirms. */
export interface CheckpointCoverageOptions {
  /** The node's ledger, which says whether the committed output was confirmed. */
  readonly runtime: FlowRuntime;
  /** Publishes the committed output again (its id, its committed envelope) until taken, else throws. */
  readonly republish: (output: string, body: Uint8Array) => Promise<void>;
}

/** The group and output a replica's restored checkpoint covers. */
export class CheckpointCoverage {
  readonly #runtime: FlowRuntime;
  readonly #republish: (output: string, body: Uint8Array) => Promise<void>;
  #coveredKey: string | null = null;
  #coveredOutput: string | null = null;
  #coveredEnvelope: Uint8Array | null = null;

  /** Covers nothing until {@link restore}. */
  constructor(options: CheckpointCoverageOptions) {
    this.#runtime = options.runtime;
    this.#republish = options.republish;
  }

  /** Takes the coverage a restored checkpoint's replay position records. */
  restore(position: ReplayPosition): void {
    this.#coveredKey = typeof position.group === "string" ? position.group : null;
    this.#coveredOutput = typeof position.output === "string" ? position.output : null;
    this.#coveredEnvelope = typeof position.envelope === "string"
      ? Uint8Array.fromBase64(position.envelope)
      : null;
  }

  /** Whether `key` is the input group the restored checkpoint covers. */
  covers(key: string): boolean {
    return key === this.#coveredKey;
  }

  /** Re-confirms the output committed with the covering checkpoint before its redelivered input is acked. */
  async confirm(): Promise<void> {
    const output = this.#coveredOutput;
    const body = this.#coveredEnvelope;
    if (output === null || body === null) return;
    const coverage = await this.#runtime.checkpointCoverage(this.#coveredKey as string);
    if (coverage.kind !== "covered_unconfirmed") return;
    await this.#republish(output, body);
  }
}
