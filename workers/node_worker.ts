/**
 * The entry of a node replica inside a Deno Worker of the local engine. The engine's generated bootstrap
 * imports the node's module and this one statically (so loading needs no permission inside the sandbox),
 * then posts `{ env, port, inNodeBoard }`: the replica's `VF_*` environment, its broker MessagePort and
 * the shared memory where it records the inputs inside its node. Reports go back
 * with `postMessage`; a `{ type: "quiesce" }` message asks the replica to stop admitting input; the last
 * message is `{ kind: "done", code }`, after which the worker closes itself. `Deno.exit` ends a worker
 * without a word to the engine, so the watchdog ends a wedged replica through the same message, and a
 * `Deno.exit` called inside the worker (a scheduled crash fault, or a node's own) posts it first.
 *
 * @module
 */
/// <reference lib="deno.worker" />

import { runWorker } from "../src/runtime/worker.ts";

/** What the engine posts to start the replica. */
export interface NodeWorkerStart {
  readonly env: Readonly<Record<string, string>>;
  readonly port: MessagePort;
  /** The engine's in-node board (`InNodeBoard`), where the replica records the inputs inside its node. */
  readonly inNodeBoard: SharedArrayBuffer;
}

/** Starts the replica described by the engine's first message. */
export function serveNodeWorker(): void {
  self.onmessage = async (event: MessageEvent<NodeWorkerStart>) => {
    const { env, port, inNodeBoard } = event.data;
    // A quiesce asked for before the replica can take it (its node still opening) is kept for then.
    let quiesce: (() => Promise<void>) | null = null;
    let quiesceAsked = false;
    self.onmessage = (message: MessageEvent<{ type?: string }>) => {
      if (message.data?.type !== "quiesce") return;
      quiesceAsked = true;
      void quiesce?.();
    };
    const done = (code: number) => {
      self.postMessage({ kind: "done", code });
      self.close();
    };
    const exit = Deno.exit;
    Deno.exit = (code?: number): never => {
      self.postMessage({ kind: "done", code: code ?? 0 });
      return exit(code);
    };
    done(
      await runWorker({
        env,
        port,
        inNodeBoard,
        report: (report) => self.postMessage(report),
        onQuiesce: (handler) => {
          quiesce = handler;
          if (quiesceAsked) void handler();
        },
        exit: done,
      }),
    );
  };
}
