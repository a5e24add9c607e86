/**
 * A worker for the cross-process and cross-thread fault tests: it installs the fault schedule its
 * environment carries (VF_FAULT_SCHEDULE_JSON, VF_FAULT_MARKER_DIR), then hits the named barriers in
 * order and reports each hit, so the parent can compare what it scheduled with what happened.
 *
 * As a subprocess: `deno run fault_worker.ts [--log=PATH] BARRIER...`; reports are JSON lines on stdout.
 * As a Deno Worker: post `{ env, barriers, log }`; reports come back as messages.
 * Reports: `{ step, barrier, hit }` per barrier passed, then `{ done: true }`; an error is
 * `{ error: code }` and exit status 1; `{ finally: true }` is reported when the run unwinds normally, so
 * a parent can tell a Crash (no unwinding) from an error.
 *
 * @module
 */

import { type Barrier, barrier, installFromEnv } from "../../src/backends/faults.ts";
import { ObservationLog } from "../../src/backends/observation.ts";

/** What a Deno Worker running this module is sent. */
export interface FaultWorkerRequest {
  readonly env: Readonly<Record<string, string>>;
  readonly barriers: readonly Barrier[];
  readonly log: string | null;
}

type Report = (message: Record<string, unknown>) => void;

async function run(request: FaultWorkerRequest, report: Report): Promise<number> {
  const schedule = installFromEnv(request.env);
  using log = new ObservationLog({ path: request.log });
  try {
    for (const [step, name] of request.barriers.entries()) {
      log.emit("barrier_reached", { op_id: `step-${step}`, status: name });
      const hit = await barrier(name, { step });
      log.emit("barrier_passed", { op_id: `step-${step}`, status: name });
      report({ step, barrier: name, hit });
    }
    report({ done: true });
    return 0;
  } catch (error) {
    report({ error: (error as { code?: string }).code ?? String(error) });
    return 1;
  } finally {
    schedule?.uninstall();
    report({ finally: true });
  }
}

const workerScope = (globalThis as { WorkerGlobalScope?: abstract new () => unknown }).WorkerGlobalScope;
if (workerScope !== undefined && globalThis instanceof workerScope) {
  const scope = globalThis as unknown as {
    onmessage: ((event: MessageEvent<FaultWorkerRequest>) => void) | null;
    postMessage(message: unknown): void;
  };
  scope.onmessage = (event) => {
    run(event.data, (message) => scope.postMessage(message));
  };
} else if (import.meta.main) {
  const logArg = Deno.args.find((arg) => arg.startsWith("--log="));
  const barriers = Deno.args.filter((arg) => !arg.startsWith("--")) as Barrier[];
  const env = {
    VF_FAULT_SCHEDULE_JSON: Deno.env.get("VF_FAULT_SCHEDULE_JSON") ?? "",
    VF_FAULT_MARKER_DIR: Deno.env.get("VF_FAULT_MARKER_DIR") ?? "",
  };
  const status = await run(
    { env, barriers, log: logArg === undefined ? null : logArg.slice("--log=".length) },
    (message) => console.log(JSON.stringify(message)),
  );
  Deno.exit(status);
}
