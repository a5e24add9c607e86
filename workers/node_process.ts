/**
 * The entry of a node replica as a `deno run` subprocess of the local engine (and the shape a Kubernetes
 * pod's entry takes): its `VF_*` environment says everything (the engine starts it with a cleared
 * environment holding only that, its node's declared variables and what Deno itself needs, and names its
 * settings as arguments, the only variables besides the declared ones it may read), the embedded broker
 * is reached on the loopback address the environment names, reports are printed to stdout as lines starting with
 * {@link REPORT_LINE_PREFIX}, and the process exits with the replica's status. Signals: SIGINT is left to
 * the engine (a terminal's Ctrl-C reaches the whole process group, and the engine answers it with the
 * flow-wide stop, which this replica must live through to drain), and so is SIGTERM under the local engine
 * (its environment names the embedded broker), since a service manager's SIGTERM to the group is the same
 * request; elsewhere (a pod) SIGTERM quiesces the replica.
 *
 * @module
 */

import { EMBEDDED_BROKER_ENV } from "../src/embedded/rpc.ts";
import { REPORT_LINE_PREFIX, runWorker } from "../src/runtime/worker.ts";

/**
 * The replica's settings: the variables its arguments name (the local engine names them, and lets it read
 * only those and its node's declared ones), which are then hidden from the node (removed, their read
 * permission revoked), as a Worker replica's are; without arguments (a pod), the whole environment.
 */
function takeSettings(names: readonly string[]): Record<string, string> {
  if (names.length === 0) return Deno.env.toObject();
  const settings: Record<string, string> = {};
  for (const name of names) {
    const value = Deno.env.get(name);
    if (value !== undefined) settings[name] = value;
    Deno.env.delete(name);
    Deno.permissions.revokeSync({ name: "env", variable: name });
  }
  return settings;
}

/**
 * The settings, taken as this module is evaluated: the replica's entry imports it before the node's
 * module, so the node's top-level code already finds them hidden (the broker's secret among them).
 */
const SETTINGS = takeSettings(Deno.args);

/** Runs the replica this process's settings describe, then exits with its status. */
export async function serveNodeProcess(): Promise<never> {
  const encoder = new TextEncoder();
  const underLocalEngine = SETTINGS[EMBEDDED_BROKER_ENV] !== undefined;
  Deno.addSignalListener("SIGINT", () => {});
  if (underLocalEngine) Deno.addSignalListener("SIGTERM", () => {});
  const code = await runWorker({
    env: SETTINGS,
    report: (report) =>
      Deno.stdout.writeSync(encoder.encode(`${REPORT_LINE_PREFIX}${JSON.stringify(report)}\n`)),
    onQuiesce: underLocalEngine ? undefined : (quiesce) => Deno.addSignalListener("SIGTERM", quiesce),
  });
  Deno.exit(code);
}
