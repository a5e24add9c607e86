/**
 * The FlowRuntime conformance scenarios over the file RuntimeStore: each ledger is a fresh temporary
 * directory, and a "replacement process" opens its own FileRuntimeStore on it, as a restarted worker does.
 */
import type { RuntimeStore } from "../../../src/backends/runtime_store.ts";
import { FileRuntimeStore } from "../../../src/runtime/file_store.ts";
import { runtimeScenarios } from "./scenarios.ts";

runtimeScenarios({
  name: "file",
  durable: true,
  midWriteBarrier: true,
  async create(clock) {
    const root = await Deno.makeTempDir({ prefix: "vf-runtime-conformance-" });
    const handles: RuntimeStore[] = [await FileRuntimeStore.open(root, clock)];
    return {
      store: handles[0],
      async reopen() {
        const handle = await FileRuntimeStore.open(root, clock);
        handles.push(handle);
        return handle;
      },
      async [Symbol.asyncDispose]() {
        for (const handle of handles) await handle.close();
        await Deno.remove(root, { recursive: true });
      },
    };
  },
});
