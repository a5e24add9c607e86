/**
 * The PayloadStore conformance stories against the memory reference store, both tiers, on a FakeClock.
 *
 * @module
 */

import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { DEFAULT_ORPHAN_GRACE_SECONDS, MemoryPayloadStore } from "../../../src/backends/memory/payload.ts";
import { payloadScenarios } from "./scenarios.ts";

payloadScenarios({
  name: "memory",
  tiers: ["durable", "evictable"],
  orphanGraceSeconds: DEFAULT_ORPHAN_GRACE_SECONDS,
  byteBudget: null,
  create: (options) => {
    const clock = new FakeClock();
    const store = new MemoryPayloadStore({ clock, ...options });
    return Promise.resolve({
      store,
      now: () => clock.now(),
      advance: (seconds) => clock.advanceAsync(seconds),
      corrupt: (key) => Promise.resolve(store.corrupt(key)),
      remove: (key) => Promise.resolve(store.delete(key)),
      expireObligationSet: (key) => Promise.resolve(store.expireObligationSet(key)),
      dispose: () => Promise.resolve(),
    });
  },
});
