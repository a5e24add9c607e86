/**
 * `vf dlq FLOW.ts --run-id ID [--state DIR] [--json]`: the dead letters of a run: node, error code,
 * message, delivery count and payload size, one line each (or one JSON record each with `--json`).
 *
 * @module
 */

import { ConfigError } from "../core/errors.ts";
import { readDeadLetters } from "../engines/dead_letters.ts";
import { runDirectory } from "../engines/run_directory.ts";
import { loadFlow } from "./load_flow.ts";
import type { CommandOutput } from "./main.ts";
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
    for (const record of records) io.out(JSON.stringify(record));
    return 0;
  }
  io.err(
    `${records.length} dead letter${
      records.length === 1 ? "" : "s"
    } in run ${options.runId} of ${flow.flowId}`,
  );
  for (const r of records) {
    io.out(`${r.node}  ${r.code}  deliveries=${r.deliveries ?? "?"}  size=${r.size}B  ${r.error}`);
  }
  return 0;
}
