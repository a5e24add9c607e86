/**
 * The FlowRuntime conformance scenarios over the Redis RuntimeStore, on a real `redis-server` (append-only
 * file on, noeviction) started for this file on a free loopback port. Each ledger is a fresh key prefix on
 * that server, and a "replacement process" opens its own RedisRuntimeStore (its own connections) on it, as a
 * restarted worker does.
 *
 * @module
 */

import type { RuntimeStore } from "../../../src/backends/runtime_store.ts";
import { randomHex } from "../../../src/core/hex.ts";
import { RedisRuntimeStore } from "../../../src/runtime/redis_store.ts";
import { startRedisServer } from "../../support/services.ts";
import { runtimeScenarios } from "./scenarios.ts";

const server = await startRedisServer();
globalThis.addEventListener("unload", () => server.killNow());

runtimeScenarios({
  name: "redis",
  durable: true,
  midWriteBarrier: false,
  create(clock) {
    const prefix = `vfrt-${randomHex(6)}:`;
    const open = () => RedisRuntimeStore.open(server.url, { clock, prefix });
    const handles: RuntimeStore[] = [open()];
    return Promise.resolve({
      store: handles[0],
      reopen() {
        const handle = open();
        handles.push(handle);
        return Promise.resolve(handle);
      },
      async [Symbol.asyncDispose]() {
        for (const handle of handles) await handle.close();
      },
    });
  },
});
