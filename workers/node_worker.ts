/**
 * The entry of a node replica inside a Deno Worker of the local engine. The engine's generated bootstrap
 * imports the node's module and this one statically (so loading needs no permission inside the sandbox),
 * then posts `{ env, port }`: the replica's `VF_*` environment and its broker MessagePort. Reports go back
 * with `postMessage`; a `{ type: "quiesce" }` message asks the replica to stop admitting input; the last
 * message is `{ kind: "done", code }`, after which the worker closes itself (also when the watchdog ends a
 * replica whose `process()` never returns: `Deno.exit` would end the worker without a word to the engine).
 *
 * @module
 */
/// <reference lib="deno.worker" />

import { runWorker } from "../src/runtime/worker.ts";

/** What the engine posts to start the replica. */
export interface NodeWorkerStart {
  readonly env: Readonly<Record<string, string>>;
  readonly port: MessagePort;
}

/** Starts the replica described by the engine's first message. */
export function serveNodeWorker(): void {
  self.onmessage = async (event: MessageEvent<NodeWorkerStart>) => {
    const { env, port } = event.data;
    let quiesce: (() => void) | null = null;
    self.onmessage = (message: MessageEvent<{ type?: string }>) => {
      if (message.data?.type === "quiesce") quiesce?.();
    };
    const done = (code: number) => {
      self.postMessage({ kind: "done", code });
      self.close();
    };
    done(
      await runWorker({
        env,
        port,
        report: (report) => self.postMessage(report),
        onQuiesce: (handler) => (quiesce = handler),
        exit: done,
      }),
    );
  };
}
