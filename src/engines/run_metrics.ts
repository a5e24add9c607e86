/**
 * One health endpoint for a whole local run (`vf run-local --metrics [HOST:]PORT`): `/metrics` is the
 * Prometheus exposition of every replica's metrics, each sample labelled `node` and `replica`, from the
 * reports the replicas send their supervisor; `/readyz` answers 200 once every replica still running has
 * opened its node; `/healthz` answers 200 while the run is on (the endpoint ends with it). A restarted
 * replica's counters start again from zero, as a restarted pod's do (a counter reset to Prometheus).
 *
 * @example
 * ```ts
 * const metrics = new RunMetrics(() => [{ node: "detect", replica: 0, ready: true, ended: false, snapshot: null }]);
 * metrics.isReady(); // true
 * ```
 *
 * @module
 */

import { type HealthSnapshot, type HealthSource, renderExposition } from "../runtime/health.ts";

/** One replica as the run's metrics read it. */
export interface ReplicaMetrics {
  readonly node: string;
  readonly replica: number;
  /** Its node's `open()` returned. */
  readonly ready: boolean;
  /** It has ended (for good, or until its restart). */
  readonly ended: boolean;
  /** Its latest metrics, or null before its first report. */
  readonly snapshot: HealthSnapshot | null;
}

/** A local run's replicas as one {@link HealthSource}, read afresh on every request. */
export class RunMetrics implements HealthSource {
  readonly #replicas: () => readonly ReplicaMetrics[];

  /** `replicas` lists every replica of the run as it is now. */
  constructor(replicas: () => readonly ReplicaMetrics[]) {
    this.#replicas = replicas;
  }

  /** Every replica still running has opened its node. */
  isReady(): boolean {
    return this.#opening().length === 0;
  }

  /** The run is on while this endpoint answers: the supervisor stops it when the run ends. */
  isLive(): boolean {
    return true;
  }

  /** Which replicas are still opening. */
  notReadyBecause(): string {
    const opening = this.#opening().map((r) => `${r.node}[${r.replica}]`);
    return `not ready: ${opening.join(", ")} still opening`;
  }

  /** Never asked: {@link isLive} always holds. */
  notLiveBecause(): string {
    return "the run has ended";
  }

  /** Every replica's samples, labelled `node` and `replica`. */
  renderMetrics(): string {
    return renderExposition(
      this.#replicas().flatMap((r) =>
        r.snapshot === null
          ? []
          : [{ labels: { node: r.node, replica: String(r.replica) }, snapshot: r.snapshot }]
      ),
    );
  }

  #opening(): ReplicaMetrics[] {
    return this.#replicas().filter((r) => !r.ended && !r.ready);
  }
}
