/**
 * {@link ArrivalSink}: the benchmarks' sink. It notes when each item arrives (and its end-to-end latency
 * when the item carries a `sentAt`), and at `close()` writes the {@link ArrivalSummary} as JSON to the one
 * file its params name, the only write permission its worker gets.
 *
 * @module
 */

import { ConsumerNode, type NodePermissions } from "../../mod.ts";
import { ArrivalLog, sentAtOf } from "./arrivals.ts";
import { nowMs, processCpuMs } from "./clock.ts";

/** Params of {@link ArrivalSink}. */
export interface ArrivalSinkParams {
  /** Where the summary is written. */
  readonly summaryPath: string;
  /** How many items the run makes, for the CPU time per item (see {@link ArrivalLog}); none by default. */
  readonly expected?: number;
}

/** Records arrivals; writes their summary to `summaryPath` when the stream ends. */
export class ArrivalSink extends ConsumerNode<ArrivalSinkParams> {
  readonly #log = new ArrivalLog(this.params.expected ?? null, processCpuMs);

  /** Write access to the summary file, nothing else. */
  override permissions(): NodePermissions {
    return { ...super.permissions(), write: [this.params.summaryPath] };
  }

  /** Notes the arrival. */
  consume(item: unknown): void {
    this.#log.record(nowMs(), sentAtOf(item));
  }

  /** Writes the summary (the file is replaced). */
  override async close(): Promise<void> {
    await Deno.writeTextFile(this.params.summaryPath, JSON.stringify(this.#log.summary()));
  }
}
