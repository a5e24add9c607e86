/**
 * {@link ArrivalSink}: the benchmarks' sink. It notes when each item arrives (and its end-to-end latency
 * when the item carries a `sentAt`), and at `close()` writes the {@link ArrivalSummary} as JSON to the one
 * file its params name, the only write permission its worker gets.
 *
 * @module
 */

import { ConsumerNode, type NodePermissions } from "../../mod.ts";
import { ArrivalLog, sentAtOf } from "./arrivals.ts";
import { nowMs } from "./clock.ts";

/** Records arrivals; writes their summary to `summaryPath` when the stream ends. */
export class ArrivalSink extends ConsumerNode<{ readonly summaryPath: string }> {
  readonly #log = new ArrivalLog();

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
