/**
 * The PayloadStore conformance stories through the embedded broker's client: every call crosses a
 * MessagePort to an EmbeddedBroker hosting the memory store (both tiers) on a FakeClock. The store's
 * misbehaviour hooks are the hosted store's, reached through the broker.
 *
 * @module
 */

import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { DEFAULT_ORPHAN_GRACE_SECONDS, MemoryPayloadStore } from "../../../src/backends/memory/payload.ts";
import { EmbeddedBroker } from "../../../src/engines/embedded_broker.ts";
import { EmbeddedPayloadStore } from "../../../src/embedded/payload_store.ts";
import { EmbeddedConnection } from "../../../src/embedded/rpc.ts";
import { payloadScenarios } from "./scenarios.ts";

payloadScenarios({
  name: "embedded",
  tiers: ["durable", "evictable"],
  orphanGraceSeconds: DEFAULT_ORPHAN_GRACE_SECONDS,
  byteBudget: null,
  create: async (options) => {
    const clock = new FakeClock();
    const broker = new EmbeddedBroker({ clock, payload: new MemoryPayloadStore({ clock, ...options }) });
    const connection = await EmbeddedConnection.connect(broker.openPort("conformance"));
    const store = new EmbeddedPayloadStore(connection, { clock });
    return {
      store,
      now: () => clock.now(),
      advance: (seconds) => clock.advanceAsync(seconds),
      corrupt: (key) => Promise.resolve(broker.payload.corrupt(key)),
      remove: (key) => Promise.resolve(broker.payload.delete(key)),
      expireObligationSet: (key) => Promise.resolve(broker.payload.expireObligationSet(key)),
      dispose: async () => {
        await connection.close();
        await broker.close();
      },
    };
  },
});
