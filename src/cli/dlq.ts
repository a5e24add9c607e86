/**
 * `vf dlq FLOW.ts --run-id ID [--state DIR] [--json]`: the dead letters of a run: node, error code, the
 * failed item's trace id, delivery count, payload size, the letter's id and the message, one line each
 * (or one JSON record each with `--json`: the stored record and its `trace_id`).
 *
 * @module
 */

import { ConfigError } from "../core/errors.ts";
import { type DeadLetterRecord, letterEnvelope, readDeadLetters } from "../engines/dead_letters.ts";
import { runDirectory } from "../engines/run_directory.ts";
import { loadFlow } from "./load_flow.ts";
import type { CommandOutput } from "./command_output.ts";
import { DEFAULT_STATE_DIR } from "./run_local.ts";

/** The options `dlq` takes. */
export interface DlqOptions {
  readonly runId?: string;
  readonly state?: string;
  readonly json?: boolean;
}

/** Prints the dead letters of a run of the flow at `path`; resolves with the exit code. */
export async function dlqCommand(path: string, options: DlqOptions, io: CommandOutput): Promise<number> {
  if (options.runId === undefined) {
    throw new ConfigError(
      "vf dlq needs the run",
      "pass --run-id ID (run-local prints it when the run starts)",
    );
  }
  const { flow } = await loadFlow(path);
  const records = await readDeadLetters(
    runDirectory(options.state ?? DEFAULT_STATE_DIR, flow.flowId, options.runId),
  );
  if (options.json) {
    for (const record of records) io.out(JSON.stringify({ ...record, trace_id: traceOf(record) }));
    return 0;
  }
  io.err(
    `${records.length} dead letter${
      records.length === 1 ? "" : "s"
    } in run ${options.runId} of ${flow.flowId}`,
  );
  for (const r of records) {
    io.out(
      `${r.node}  ${r.code}  trace=${traceOf(r)}  deliveries=${r.deliveries ?? "?"}  ${sizeOf(r)}  ` +
        `id=${r.id}  ${r.error}`,
    );
  }
  return 0;
}

/** The trace id of a dead letter's original envelope, or `?` when its bytes do not decode. */
function traceOf(record: DeadLetterRecord): string {
  return letterEnvelope(record)?.traceId || "?";
}

/** The payload's size: the envelope's, or an offloaded payload's, with where it is kept (or that it is not). */
function sizeOf(record: DeadLetterRecord): string {
  if (record.payload === undefined) return `size=${record.size}B`;
  const kept = record.payload.file === null
    ? "not kept: gone with the run"
    : `kept in ${record.payload.file}`;
  return `size=${record.payload.size}B (offloaded, ${kept})`;
}
