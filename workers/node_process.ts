/**
 * The runtime of a node replica as a `deno run` process: a subprocess of the local engine or a Kubernetes
 * pod's worker container, each started from its generated entry (`replicaEntryUrl`), which names its
 * {@link ProcessLauncher}. Its `VF_*` environment says everything (the local engine starts it with a
 * cleared environment holding only that, its node's declared variables and what Deno itself needs; both
 * launchers name its settings as arguments, the only variables besides the declared ones it may read),
 * the broker is reached at the address the environment names, reports are printed to stdout as lines
 * starting with {@link REPORT_LINE_PREFIX}, and the process exits with the replica's status.
 *
 * Run as the main module with no arguments (the worker image's ENTRYPOINT, every permission, for manual
 * use), it serves the replica its whole environment describes, as a pod does, and the worker loads the
 * node's module from VF_NODE_CLASS.
 *
 * Signals: a replica the local engine launched leaves SIGINT and SIGTERM
 * to the engine (a terminal's Ctrl-C or a service manager's SIGTERM reaches vf, which stops the flow the
 * spec's way, and the replica must live through that stop to drain); the engine asks it to quiesce with
 * {@link QUIESCE_LINE} on its stdin, and the end of its stdin (the engine gone) asks the same. A pod's
 * replica takes SIGTERM as the spec does (RUN-030, story 39): it quiesces, so what it prefetched goes back
 * to the broker at once for the other replicas, then dies of the signal (143) without waiting for the
 * call in hand, whose input the broker redelivers after its ack wait.
 *
 * @module
 */

import { QUIESCE_LINE, REPORT_LINE_PREFIX, runWorker } from "../src/runtime/worker.ts";
import { SIGTERM_EXIT_CODE } from "../src/core/task.ts";
import { CUDA_VISIBLE_DEVICES } from "../src/runtime/gpucheck.ts";
import { ProcessLauncher } from "../src/runtime/replica_entry.ts";

/**
 * The replica's settings: the variables its arguments name (its launcher names them, and lets it read
 * only those and its node's declared ones), which are then hidden from the node (removed, their read
 * permission revoked), as a Worker replica's are, all but `CUDA_VISIBLE_DEVICES`, which the node's CUDA
 * library reads; without arguments (the image's ENTRYPOINT, run with every permission), the whole
 * environment.
 */
function takeSettings(names: readonly string[]): Record<string, string> {
  if (names.length === 0) return Deno.env.toObject();
  const settings: Record<string, string> = {};
  for (const name of names) {
    const value = Deno.env.get(name);
    if (value !== undefined) settings[name] = value;
    // The device mask stays where the node's CUDA library reads it: the process environment.
    if (name === CUDA_VISIBLE_DEVICES) continue;
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

/**
 * How long a SIGTERMed pod replica waits for its hand-back to reach the broker before it dies anyway: the
 * hand-back is a few broker calls, and a broker that does not answer must not keep a dying pod alive.
 */
export const SIGTERM_HAND_BACK_SECONDS = 5;

/**
 * Resolves once the local engine asks this replica to quiesce: a line on stdin, or its end. Read from the
 * start, so a request that came while the node was still opening is not lost.
 */
async function quiesceRequested(): Promise<void> {
  const decoder = new TextDecoder();
  let text = "";
  for await (const chunk of Deno.stdin.readable) {
    text += decoder.decode(chunk, { stream: true });
    if (text.includes(QUIESCE_LINE)) return;
  }
}

/** RUN-030's SIGTERM: quiesce, then the signal's default action (exit 143); a second SIGTERM ends it at once. */
function dieOfSigtermAfterQuiesce(quiesce: () => Promise<void>): void {
  let asked = false;
  Deno.addSignalListener("SIGTERM", () => {
    if (asked) Deno.exit(SIGTERM_EXIT_CODE);
    asked = true;
    const handedBack = quiesce().catch((error) =>
      console.error(`the quiesce before SIGTERM's exit failed: ${String(error)}`)
    );
    const grace = new Promise((resolve) => setTimeout(resolve, SIGTERM_HAND_BACK_SECONDS * 1000));
    Promise.race([handedBack, grace]).then(() => Deno.exit(SIGTERM_EXIT_CODE));
  });
}

/**
 * Runs the replica this process's settings describe, then exits with its status; `launcher` says how it
 * is asked to stop (see the module doc).
 */
export async function serveNodeProcess(launcher: ProcessLauncher): Promise<never> {
  const encoder = new TextEncoder();
  Deno.addSignalListener("SIGINT", () => {});
  const requested = launcher === ProcessLauncher.localEngine ? quiesceRequested() : null;
  if (requested !== null) Deno.addSignalListener("SIGTERM", () => {});
  const code = await runWorker({
    env: SETTINGS,
    report: (report) =>
      Deno.stdout.writeSync(encoder.encode(`${REPORT_LINE_PREFIX}${JSON.stringify(report)}\n`)),
    onQuiesce: requested === null ? dieOfSigtermAfterQuiesce : (quiesce) => void requested.then(quiesce),
  });
  Deno.exit(code);
}

// The worker image's ENTRYPOINT: run as the main module, it serves the replica as a pod does.
if (import.meta.main) await serveNodeProcess(ProcessLauncher.pod);
