/**
 * The embedded broker keeps one connection's data publications on a channel in the order they were made
 * while the channel refuses for lack of room: once it refused one, it refuses the connection's later data
 * publications on that channel until the refused one is taken, whatever room opens meanwhile. Other
 * connections, other channels and end-of-stream markers are not held back, and a channel that evicts
 * instead of refusing never holds a publication back.
 *
 * @module
 */

import assert from "node:assert/strict";
import { type Clock, systemClock } from "../../../src/backends/clock.ts";
import { Barrier, delay, FaultSchedule, nth } from "../../../src/backends/faults.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  makeChannel,
  makeEnvelope,
  makeSubscription,
  MemoryMessagingBackend,
} from "../../../src/backends/memory/messaging.ts";
import {
  type ChannelId,
  channelId,
  completed,
  type Envelope,
  MessageKind,
  Overflow,
  subscriptionId,
} from "../../../src/backends/messaging.ts";
import type { PublicationOutcome } from "../../../src/backends/outcomes.ts";
import { EmbeddedBroker } from "../../../src/engines/embedded_broker.ts";
import { EmbeddedMessagingBackend } from "../../../src/embedded/messaging_backend.ts";
import { EmbeddedConnection } from "../../../src/embedded/rpc.ts";

const CAM = channelId("flow-A", "run-1", "cam");
const MIC = channelId("flow-A", "run-1", "mic");

/**
 * A broker on `clock` whose `cam` and `mic` channels refuse past `limits` (two messages by default), each
 * with one `det` subscription, and a way to connect clients to it and close it all.
 */
async function refusingBroker(
  limits: { readonly maxMsgs?: number; readonly maxBytes?: number } = { maxMsgs: 2 },
  clock: Clock = new FakeClock(),
) {
  const broker = new EmbeddedBroker({ clock, messaging: new MemoryMessagingBackend({ clock }) });
  for (const channel of [CAM, MIC]) {
    await broker.messaging.ensureChannel(
      makeChannel(channel.flowId, channel.runId, channel.node, "reliable_work", "interest", {
        required: [subscriptionId(channel, "det")],
        ...limits,
        overflow: Overflow.reject,
        perSubjectLimits: true,
      }),
      `ensure-${channel.node}`,
    );
    await broker.messaging.ensureSubscription(makeSubscription(channel, "det"), `bind-${channel.node}`);
  }
  const clients: EmbeddedConnection[] = [];
  const client = async (label: string) => {
    const connection = await EmbeddedConnection.connect(broker.openPort(label), { label });
    clients.push(connection);
    return new EmbeddedMessagingBackend(connection, { clock });
  };
  const close = async () => {
    await Promise.all(clients.map((connection) => connection.close()));
    await broker.close();
  };
  return { broker, clock, client, close };
}

function data(channel: ChannelId, id: string): Envelope {
  return makeEnvelope(channel, id);
}

function describe(outcome: PublicationOutcome): string {
  return outcome.kind === "rejected"
    ? `rejected(${outcome.retryable ? "retryable" : "final"})`
    : outcome.kind;
}

Deno.test("after a refusal, a connection's later data on that channel waits behind it, even once room opens", async () => {
  const { broker, clock, client, close } = await refusingBroker();
  try {
    const publisher = await client("decode");
    const consumer = await client("detect");
    const deadline = () => clock.monotonic() + 5;
    const publish = async (envelope: Envelope) => describe(await publisher.publish(envelope, deadline()));
    assert.equal(await publish(data(CAM, "f1")), "accepted");
    assert.equal(await publish(data(CAM, "f2")), "accepted");
    assert.equal(await publish(data(CAM, "f3")), "rejected(retryable)", "the channel is full");
    const [first] = await consumer.receive(subscriptionId(CAM, "det"), 1, 1 << 30, deadline());
    assert.equal((await consumer.settle(first.token, completed(), "done-f1")).kind, "settle_confirmed");
    const behind = await publisher.publish(data(CAM, "f4"), deadline());
    assert.ok(behind.kind === "rejected" && behind.retryable, "room opened, but f3 was refused first");
    assert.match(behind.reason, /publication f3, refused earlier on this channel, is not taken yet/);
    assert.equal(await publish(data(MIC, "m1")), "accepted", "another channel is not held back");
    const eos = makeEnvelope(CAM, "eos", { kind: MessageKind.eos });
    assert.equal(await publish(eos), "accepted", "an end-of-stream marker is not held back");
    assert.equal(await publish(data(CAM, "f3")), "accepted", "the refused publication takes the room");
    assert.equal(await publish(data(CAM, "f4")), "rejected(retryable)", "then the next one waits for room");
    assert.deepEqual(
      broker.messaging.stored(CAM).filter((env) => env.kind === MessageKind.data).map((env) =>
        env.publicationId
      ),
      ["f2", "f3"],
      "taken in the order they were made",
    );
  } finally {
    await close();
  }
});

Deno.test("one connection's refused publication does not hold back another connection's", async () => {
  const { broker, clock, client, close } = await refusingBroker();
  try {
    const first = await client("decode-0");
    const second = await client("decode-1");
    const consumer = await client("detect");
    const deadline = () => clock.monotonic() + 5;
    for (const id of ["a1", "a2"]) {
      assert.equal((await first.publish(data(CAM, id), deadline())).kind, "accepted");
    }
    assert.equal(describe(await first.publish(data(CAM, "a3"), deadline())), "rejected(retryable)");
    const [delivery] = await consumer.receive(subscriptionId(CAM, "det"), 1, 1 << 30, deadline());
    await consumer.settle(delivery.token, completed(), "done-a1");
    assert.equal(
      (await second.publish(data(CAM, "b1"), deadline())).kind,
      "accepted",
      "the other replica's output takes the room: order is kept per publisher",
    );
    assert.deepEqual(broker.messaging.stored(CAM).map((env) => env.publicationId), ["a2", "b1"]);
  } finally {
    await close();
  }
});

Deno.test("a channel that evicts its oldest instead of refusing never holds a publication back", async () => {
  const clock = new FakeClock();
  const broker = new EmbeddedBroker({ clock, messaging: new MemoryMessagingBackend({ clock }) });
  await broker.messaging.ensureChannel(
    makeChannel("flow-A", "run-1", "cam", "live_latest", "limits", { maxMsgs: 1, perSubjectLimits: true }),
    "ensure-cam",
  );
  const connection = await EmbeddedConnection.connect(broker.openPort("decode"), { label: "decode" });
  try {
    const publisher = new EmbeddedMessagingBackend(connection, { clock });
    for (const id of ["f1", "f2", "f3"]) {
      assert.equal((await publisher.publish(data(CAM, id), clock.monotonic() + 5)).kind, "accepted");
    }
    assert.deepEqual(
      broker.messaging.stored(CAM).map((env) => env.publicationId),
      ["f3"],
      "the freshest wins",
    );
  } finally {
    await connection.close();
    await broker.close();
  }
});

Deno.test("when refusals come back out of order (a fault delays one), the earlier publication still heads and is taken first", async () => {
  const { broker, clock, client, close } = await refusingBroker({ maxMsgs: 1 }, systemClock);
  try {
    const publisher = await client("decode");
    const consumer = await client("detect");
    const deadline = () => clock.monotonic() + 5;
    assert.equal(
      (await publisher.publish(data(CAM, "f0"), deadline())).kind,
      "accepted",
      "the channel fills",
    );
    const schedule = new FaultSchedule({ [Barrier.messagePublishBefore]: nth(1, delay(0.05)) });
    const [a, b] = await (async () => {
      using _installed = schedule.install();
      return await Promise.all([
        publisher.publish(data(CAM, "A"), deadline()),
        publisher.publish(data(CAM, "B"), deadline()),
      ]);
    })();
    schedule.assertAllFired();
    assert.deepEqual([describe(a), describe(b)], ["rejected(retryable)", "rejected(retryable)"]);
    const [first] = await consumer.receive(subscriptionId(CAM, "det"), 1, 1 << 30, deadline());
    await consumer.settle(first.token, completed(), "done-f0");
    assert.equal(describe(await publisher.publish(data(CAM, "B"), deadline())), "rejected(retryable)");
    assert.equal(
      (await publisher.publish(data(CAM, "A"), deadline())).kind,
      "accepted",
      "A arrived first, so A heads although B's refusal came back first",
    );
    assert.deepEqual(broker.messaging.stored(CAM).map((env) => env.publicationId), ["A"]);
  } finally {
    await close();
  }
});

Deno.test("a channel refusing for its byte limit says so, with the bytes held and asked", async () => {
  const { clock, client, close } = await refusingBroker({ maxBytes: 10 });
  try {
    const publisher = await client("decode");
    const publish = (id: string, size: number) =>
      publisher.publish(makeEnvelope(CAM, id, { body: new Uint8Array(size) }), clock.monotonic() + 5);
    assert.equal((await publish("f1", 8)).kind, "accepted");
    const refused = await publish("f2", 4);
    assert.ok(refused.kind === "rejected" && refused.retryable);
    assert.match(refused.reason, /is full \(8 of 10 bytes held, 4 more asked\)/);
  } finally {
    await close();
  }
});
