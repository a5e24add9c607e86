/**
 * The MessagingBackend conformance stories against the JetStream adapter over a real `nats-server -js`
 * this file starts (file storage in a temporary directory, a free loopback port). Time is the host's:
 * `advance` sleeps, so the stories that let a lease lapse take their ack wait in real seconds. Faults fire
 * at the adapter's barriers around real server calls. The stories a real server cannot play are ignored by
 * name with their reason (see the provider's capabilities below); every other one must pass.
 *
 * @module
 */

import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { systemClock } from "../../../src/backends/clock.ts";
import { JetStreamMessagingBackend } from "../../../src/messaging/jetstream_backend.ts";
import { startNatsServer } from "../../support/services.ts";
import { messagingScenarios } from "./scenarios.ts";

const server = await startNatsServer();

/** Deletes every stream on the server, so each story starts from an empty broker. */
async function emptyServer(): Promise<void> {
  const nc = await connect({ servers: server.url });
  try {
    const jsm = await jetstreamManager(nc);
    const names: string[] = [];
    for await (const info of jsm.streams.list()) names.push(info.config.name);
    for (const name of names) await jsm.streams.delete(name);
  } finally {
    await nc.close();
  }
}

messagingScenarios({
  name: "jetstream",
  coreOnly: false,
  clientQueueLimit: 0,
  byteBudget: true,
  simulatedTime: false,
  dedupWindowSeconds: 3,
  creditReserves: false,
  exactByteLimits: false,
  collidingChannelNames: false,
  create: async (options) => {
    await emptyServer();
    const backend = await JetStreamMessagingBackend.connect({
      url: server.url,
      byteBudget: options.byteBudget,
    });
    return {
      backend,
      clock: systemClock,
      now: () => systemClock.monotonic(),
      advance: (seconds) => systemClock.sleep(seconds),
      dispose: () => backend.shutdown(),
    };
  },
});

Deno.test("jetstream: the nats-server this file started stops", () => server.stop());
