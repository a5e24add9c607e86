import assert from "node:assert/strict";
import type { NatsConnection } from "@nats-io/nats-core";
import { ReplyMux } from "../../../src/messaging/reply_mux.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";

/** A connection that records what is published and when, and serves no answers. */
function recordingConnection(): { nc: NatsConnection; published: string[] } {
  const published: string[] = [];
  const nc = {
    subscribe: () => ({}),
    publish: (subject: string) => published.push(subject),
  } as unknown as NatsConnection;
  return { nc, published };
}

Deno.test("requests made in one turn of the event loop reach the connection together, in order, after the turn", async () => {
  const { nc, published } = recordingConnection();
  const mux = new ReplyMux(nc, new FakeClock(), 5);
  void mux.request("a", "1");
  await Promise.resolve();
  void mux.request("b", "2");
  await Promise.resolve();
  void mux.request("c", "3");
  assert.deepEqual(published, [], "nothing is handed over while the turn's microtasks run");
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.deepEqual(published, ["a", "b", "c"]);
  void mux.request("d", "4");
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.deepEqual(published, ["a", "b", "c", "d"]);
  mux.close();
});

Deno.test("a request the mux closed before it was handed over is never published, and ends closed", async () => {
  const { nc, published } = recordingConnection();
  const mux = new ReplyMux(nc, new FakeClock(), 5);
  const outcome = mux.request("a", "1");
  mux.close();
  assert.deepEqual(await outcome, { kind: "closed" });
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.deepEqual(published, []);
});
