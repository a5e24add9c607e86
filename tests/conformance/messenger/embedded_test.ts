/**
 * The messenger stories through the embedded broker's clients: every backend and payload call crosses a
 * MessagePort to an EmbeddedBroker hosting the memory broker and payload store on the story's fake clock,
 * as a node worker of the local engine reaches them. The scenarios are the memory provider's, unchanged.
 *
 * @module
 */

import { MemoryMessagingBackend } from "../../../src/backends/memory/messaging.ts";
import { MemoryPayloadStore } from "../../../src/backends/memory/payload.ts";
import { EmbeddedBroker } from "../../../src/engines/embedded_broker.ts";
import { EmbeddedMessagingBackend } from "../../../src/messaging/embedded_backend.ts";
import { EmbeddedPayloadStore } from "../../../src/runtime/embedded_payload.ts";
import { EmbeddedConnection } from "../../../src/runtime/embedded_rpc.ts";
import { messengerScenarios } from "./scenarios.ts";

messengerScenarios({
  name: "embedded",
  async create(clock) {
    const broker = new EmbeddedBroker({
      clock,
      messaging: new MemoryMessagingBackend({ clock }),
      payload: new MemoryPayloadStore({ clock }),
    });
    const connection = await EmbeddedConnection.connect(broker.openPort("messenger-conformance"));
    const backend = new EmbeddedMessagingBackend(connection, { clock });
    return {
      backend,
      payloads: new EmbeddedPayloadStore(connection, { clock }),
      stored: (channel) => broker.messaging.stored(channel),
      async dispose() {
        await backend.shutdown();
        await connection.close();
        await broker.close();
      },
    };
  },
});
