/**
 * {@link ReplyMux} against a real `nats-server`: answers reach the request that asked, "no responders"
 * and silence are told apart, a silent responder's requests time out together after the mux's timeout
 * (and an answer after that is dropped), and closing ends what waits.
 *
 * @module
 */

import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import { systemClock } from "../../src/backends/clock.ts";
import { ReplyMux } from "../../src/messaging/reply_mux.ts";
import { startNatsServer } from "../support/services.ts";

const decoder = new TextDecoder();

Deno.test("ReplyMux: each answer reaches its own request; no responders, timeouts and closing are told apart", async () => {
  const nats = await startNatsServer();
  const nc = await connect({ servers: nats.url });
  try {
    nc.subscribe("echo", {
      callback: (_error, msg) => {
        msg.respond(`re:${decoder.decode(msg.data)}`);
      },
    });
    const held: { respond: (data: string) => boolean }[] = [];
    nc.subscribe("silent", {
      callback: (_error, msg) => {
        held.push(msg);
      },
    });
    await nc.flush();
    const mux = new ReplyMux(nc, systemClock, 0.3);

    const answers = await Promise.all(Array.from({ length: 500 }, (_, i) => mux.request("echo", String(i))));
    assert.deepEqual(
      answers.map((a) => a.kind === "reply" ? decoder.decode(a.msg.data) : a.kind),
      Array.from({ length: 500 }, (_, i) => `re:${i}`),
    );
    assert.deepEqual(await mux.request("nobody.listens", "x"), { kind: "noResponders" });

    const started = performance.now();
    const silent = await Promise.all(Array.from({ length: 50 }, () => mux.request("silent", "x")));
    const waited = (performance.now() - started) / 1000;
    assert.deepEqual(new Set(silent.map((a) => a.kind)), new Set(["timeout"]));
    assert.ok(waited >= 0.29, `timed out after ${waited} s, before the mux's 0.3 s`);
    assert.equal(mux.waiting, 0);
    for (const msg of held) msg.respond("late");
    await nc.flush();
    const after = await mux.request("echo", "after");
    assert.equal(after.kind === "reply" ? decoder.decode(after.msg.data) : after.kind, "re:after");

    const pending = mux.request("silent", "y");
    mux.close();
    assert.deepEqual(await pending, { kind: "closed" });
    assert.deepEqual(await mux.request("echo", "z"), { kind: "closed" });
  } finally {
    await nc.close();
    await nats.stop();
  }
});
