/**
 * The FlowRuntime conformance scenarios over the embedded run ledger: an EmbeddedBroker hosts a file
 * RuntimeStore in a fresh temporary directory (what the local engine serves its workers), and each
 * "process" reaches it through its own connection and EmbeddedRuntimeStore, as every worker does. A
 * replacement process is a new connection to the same hosted store.
 *
 * @module
 */

import { EmbeddedBroker } from "../../../src/engines/embedded_broker.ts";
import { EmbeddedConnection } from "../../../src/embedded/rpc.ts";
import { EmbeddedRuntimeStore } from "../../../src/embedded/runtime_store.ts";
import { FileRuntimeStore } from "../../../src/runtime/file_store.ts";
import { runtimeScenarios } from "./scenarios.ts";

runtimeScenarios({
  name: "embedded",
  durable: true,
  midWriteBarrier: true,
  async create(clock) {
    const root = await Deno.makeTempDir({ prefix: "vf-embedded-conformance-" });
    const hosted = await FileRuntimeStore.open(root, clock);
    const broker = new EmbeddedBroker({ clock, runtimeStore: hosted });
    const connections: EmbeddedConnection[] = [];
    const open = async () => {
      const connection = await EmbeddedConnection.connect(broker.openPort(`process-${connections.length}`));
      connections.push(connection);
      return new EmbeddedRuntimeStore(connection);
    };
    return {
      store: await open(),
      reopen: open,
      async [Symbol.asyncDispose]() {
        for (const connection of connections) await connection.close();
        await broker.close();
        await hosted.close();
        await Deno.remove(root, { recursive: true });
      },
    };
  },
});
