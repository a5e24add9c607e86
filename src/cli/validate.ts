/**
 * `vf validate FLOW.ts`: every diagnostic of the flow, one line each (severity, code, node, message,
 * remedy), the local engine's admission refusals among them, then a summary; exit 2 when any diagnostic is
 * an error, 0 otherwise.
 *
 * @module
 */

import { EXIT_USER } from "../core/errors.ts";
import { localAdmissionRefusals } from "./admission.ts";
import { loadFlow } from "./load_flow.ts";
import type { CommandOutput } from "./command_output.ts";

/** Validates the flow file at `path`; resolves with the exit code. */
export async function validateCommand(path: string, io: CommandOutput): Promise<number> {
  const { flow, modules } = await loadFlow(path);
  const found = flow.validate(modules);
  // Admission reads a sound graph (a cycle has no order to read it in): its refusals follow a flow with no error.
  const sound = found.every((d) => d.severity !== "error");
  const diagnostics = sound ? [...found, ...localAdmissionRefusals(flow)] : found;
  for (const diagnostic of diagnostics) io.out(diagnostic.render());
  const errors = diagnostics.filter((d) => d.severity === "error").length;
  const warnings = diagnostics.length - errors;
  const verdict = errors > 0 ? "invalid" : "valid";
  io.err(
    `flow ${flow.flowId}: ${verdict} (${errors} errors, ${warnings} warnings, ${flow.nodes.length} nodes)`,
  );
  return errors > 0 ? EXIT_USER : 0;
}
