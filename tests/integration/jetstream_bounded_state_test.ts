/**
 * The JetStream adapter's own bookkeeping stays bounded over a run of any length, against a real
 * `nats-server -js`: what it keeps per publication and per settled delivery is forgotten once the server no
 * longer needs it.
 *
 * @module
 */

import assert from "node:assert/strict";
import { systemClock } from "../../src/backends/clock.ts";
import { makeChannel, makeEnvelope, makeSubscription } from "../../src/backends/memory/messaging.ts";
import { completed, subscriptionId } from "../../src/backends/messaging.ts";
import { JetStreamMessagingBackend } from "../../src/messaging/jetstream_backend.ts";
import { startNatsServer } from "../support/services.ts";

Deno.test("settled sequences are forgotten once the ack floor passes them, first sends once their duplicate window has", async () => {
  const nats = await startNatsServer();
  const backend = await JetStreamMessagingBackend.connect({ url: nats.url });
  try {
    const channel = makeChannel("bounded", "r1", "cam", "reliable_work", "interest", {
      dedupWindowSeconds: 1,
      required: [subscriptionId(makeChannel("bounded", "r1", "cam", "reliable_work", "interest").id, "det")],
    });
    await backend.ensureChannel(channel, "c");
    const subscription = makeSubscription(channel.id, "det", { itemCredit: 64 });
    await backend.ensureSubscription(subscription, "s");
    const count = 300;
    const deadline = () => systemClock.monotonic() + 10;
    await backend.publishBatch(
      Array.from({ length: count }, (_, i) => makeEnvelope(channel.id, `p-${i}`)),
      deadline(),
    );
    for (let settled = 0; settled < count;) {
      const deliveries = await backend.receive(subscription.id, 64, 1 << 20, deadline());
      const outcomes = await backend.settleBatch(
        deliveries.map((d) => ({
          token: d.token,
          outcome: completed(),
          settlementId: `s-${d.token.messageId}`,
        })),
      );
      assert.ok(outcomes.every((o) => o.kind === "settle_confirmed"), JSON.stringify(outcomes));
      settled += deliveries.length;
    }
    assert.equal(backend.settledKept(subscription.id), count, "each settled sequence is kept until observed");
    const observed = await backend.observeSubscription(subscription.id);
    assert.equal(observed.kind, "known");
    assert.equal(backend.settledKept(subscription.id), 0, "the ack floor passed them all");
    assert.equal(backend.sendsKept(), count, "each first send is kept inside its 1 s duplicate window");
    await systemClock.sleep(1.1);
    await backend.publishBatch([makeEnvelope(channel.id, "p-late")], deadline());
    assert.equal(backend.sendsKept(), 1, "the sends past their window are forgotten");
  } finally {
    await backend.shutdown();
    await nats.stop();
  }
});

Deno.test("a stale token's settlement gives back what it held: after a redelivery, nothing stays counted", async () => {
  const nats = await startNatsServer();
  const backend = await JetStreamMessagingBackend.connect({ url: nats.url });
  try {
    const channel = makeChannel("stale", "r1", "cam", "reliable_work", "interest", {
      required: [subscriptionId(makeChannel("stale", "r1", "cam", "reliable_work", "interest").id, "det")],
    });
    await backend.ensureChannel(channel, "c");
    const subscription = makeSubscription(channel.id, "det", { ackWaitSeconds: 1, itemCredit: 1 });
    await backend.ensureSubscription(subscription, "s");
    const deadline = () => systemClock.monotonic() + 10;
    await backend.publishBatch([makeEnvelope(channel.id, "p-1")], deadline());
    const [first] = await backend.receive(subscription.id, 1, 1 << 20, deadline());
    await systemClock.sleep(1.5);
    const [again] = await backend.receive(subscription.id, 1, 1 << 20, deadline());
    assert.equal(again.token.attempt, 2, "delivered again once the lease lapsed");
    const stale = await backend.settle(first.token, completed(), "s-stale");
    assert.equal(stale.kind, "settle_stale");
    assert.equal((await backend.settle(again.token, completed(), "s-again")).kind, "settle_confirmed");
    assert.equal(backend.residentBytes(), 0, "neither delivery is counted as held any more");
  } finally {
    await backend.shutdown();
    await nats.stop();
  }
});
