/**
 * The FlowRuntime conformance scenarios over the memory RuntimeStore: one object holds the ledger, so a
 * "replacement process" is a second FlowRuntime over the same object. Never durable: the checkpoint
 * stories expect a refusal here (RUN-022).
 */
import { MemoryRuntimeStore } from "../../../src/backends/memory/runtime_store.ts";
import { runtimeScenarios } from "./scenarios.ts";

runtimeScenarios({
  name: "memory",
  durable: false,
  midWriteBarrier: false,
  create(clock) {
    const store = new MemoryRuntimeStore(clock);
    return Promise.resolve({
      store,
      reopen: () => Promise.resolve(store),
      [Symbol.asyncDispose]: () => store.close(),
    });
  },
});
