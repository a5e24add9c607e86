/**
 * `vf compile FLOW.ts`: the compiled document (`{"specs": [...]}` plus side documents only when used)
 * as JSON on stdout. An invalid flow prints every problem at once and exits 2.
 *
 * @module
 */

import { compileToDict } from "../core/compiler.ts";
import { loadFlow } from "./load_flow.ts";
import type { CommandOutput } from "./command_output.ts";

/** Compiles the flow file at `path` and prints its document; resolves with the exit code. */
export async function compileCommand(path: string, io: CommandOutput): Promise<number> {
  const { flow, modules } = await loadFlow(path);
  io.out(JSON.stringify(compileToDict(flow, { modules }), null, 2));
  return 0;
}
