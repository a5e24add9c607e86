/**
 * The MessagingBackend conformance stories through the embedded broker's client: every call crosses a
 * MessagePort to an EmbeddedBroker hosting the memory broker on a FakeClock, in its retained and core-only
 * modes. The scenarios are the memory provider's, unchanged; faults fire in the hosted model.
 *
 * @module
 */

import { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  DEFAULT_CLIENT_QUEUE_LIMIT,
  MemoryMessagingBackend,
} from "../../../src/backends/memory/messaging.ts";
import { EmbeddedBroker } from "../../../src/engines/embedded_broker.ts";
import { EmbeddedMessagingBackend } from "../../../src/embedded/messaging_backend.ts";
import { EmbeddedConnection } from "../../../src/embedded/rpc.ts";
import { messagingScenarios } from "./scenarios.ts";

messagingScenarios({
  name: "embedded",
  coreOnly: true,
  clientQueueLimit: DEFAULT_CLIENT_QUEUE_LIMIT,
  byteBudget: true,
  simulatedTime: true,
  dedupWindowSeconds: 120,
  creditReserves: true,
  exactByteLimits: true,
  collidingChannelNames: true,
  create: async (options) => {
    const clock = new FakeClock();
    const broker = new EmbeddedBroker({
      clock,
      messaging: new MemoryMessagingBackend({ clock, ...options }),
    });
    const connection = await EmbeddedConnection.connect(broker.openPort("conformance"));
    const backend = new EmbeddedMessagingBackend(connection, { clock });
    return {
      backend,
      clock,
      now: () => clock.monotonic(),
      advance: (seconds) => clock.advanceAsync(seconds),
      dispose: async () => {
        await backend.shutdown();
        await connection.close();
        await broker.close();
      },
    };
  },
});
