/**
 * Throughput of the in-memory broker's work cycle, publish → receive → settle, beside its floors measured
 * in the same run: the same envelopes pushed through a bare array (push, then shift in batches), once
 * synchronously and once with the awaits the broker's async API costs (one per publish, one per receive
 * batch, one per settle). Each iteration moves 1,024 messages, so messages/s = 1,024 × iter/s; the
 * "x slower" column reads as the broker's overhead ratio.
 *
 * Variants: one receiver on an interest channel with the 120 s duplicate window (the default reliable-work
 * shape), the same without a duplicate window, and a live limits channel with three competing receivers.
 *
 * Run: `deno bench bench/memory_messaging_bench.ts`.
 *
 * @module
 */

import { systemClock } from "../src/backends/clock.ts";
import { makeChannel, makeSubscription, MemoryMessagingBackend } from "../src/backends/memory/messaging.ts";
import {
  type ChannelId,
  completed,
  type Envelope,
  MessageKind,
  type SubscriptionId,
} from "../src/backends/messaging.ts";

const MESSAGES = 1024;
const BATCH = 64;
const BODY = new Uint8Array(256);
const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({});
let counter = 0;
/** Keeps the floors' work observable, so it is not optimised away. */
export let sink = 0;

/** Fresh envelopes with unique publication ids, built the same way for every variant. */
function envelopes(channel: ChannelId): Envelope[] {
  const out: Envelope[] = new Array(MESSAGES);
  for (let i = 0; i < MESSAGES; i++) {
    const id = `p${++counter}`;
    out[i] = {
      channel,
      publicationId: id,
      headers: NO_HEADERS,
      body: BODY,
      size: BODY.byteLength,
      eventId: id,
      partitionKey: null,
      eventTs: null,
      sourceEpoch: null,
      sourceOffset: null,
      schemaVersion: 4,
      payloadRefs: [],
      kind: MessageKind.data,
      bodyTransferable: false,
    };
  }
  return out;
}

interface Rig {
  readonly broker: MemoryMessagingBackend;
  readonly channel: ChannelId;
  readonly subscription: SubscriptionId;
}

async function rig(
  node: string,
  retention: "interest" | "limits",
  dedupWindowSeconds: number,
  maxMsgs = 1_000_000,
): Promise<Rig> {
  const broker = new MemoryMessagingBackend({ clock: systemClock });
  const spec = makeChannel("bench", "run", node, "reliable_work", retention, {
    maxMsgs,
    dedupWindowSeconds,
  });
  await broker.ensureChannel(spec, `ensure-${node}`);
  const subscription = makeSubscription(spec.id, "sink", { itemCredit: MESSAGES, ackWaitSeconds: 60 });
  await broker.ensureSubscription(subscription, `bind-${node}`);
  return { broker, channel: spec.id, subscription: subscription.id };
}

// Interest channels keep nothing once settled, so the million-message bound is never reached; the limits
// channel retains settled messages and evicts them (no drop: nobody still owes them) past four batches.
const withDedup = await rig("dedup", "interest", 120);
const withoutDedup = await rig("plain", "interest", 0);
const competing = await rig("live", "limits", 0, 4 * MESSAGES);

/** Publishes a batch, then `receivers` concurrent loops receive and settle until every message is settled. */
async function cycle({ broker, channel, subscription }: Rig, receivers: number): Promise<void> {
  for (const env of envelopes(channel)) await broker.publish(env, systemClock.monotonic() + 5);
  let settled = 0;
  const receiver = async () => {
    while (settled < MESSAGES) {
      const deliveries = await broker.receive(subscription, Math.ceil(BATCH / receivers), 1 << 30, 0);
      for (const delivery of deliveries) {
        await broker.settle(delivery.token, completed(), delivery.token.messageId);
        settled++;
      }
    }
  };
  await Promise.all(Array.from({ length: receivers }, receiver));
}

Deno.bench({
  name: "bare array push/shift (sync floor)",
  group: "publish -> receive -> settle, 1024 msgs",
  baseline: true,
  fn() {
    const queue: Envelope[] = [];
    for (const env of envelopes(withDedup.channel)) queue.push(env);
    while (queue.length > 0) {
      for (let i = 0; i < BATCH && queue.length > 0; i++) sink += (queue.shift() as Envelope).size;
    }
  },
});

Deno.bench({
  name: "bare array push/shift with the broker API's awaits",
  group: "publish -> receive -> settle, 1024 msgs",
  async fn() {
    const queue: Envelope[] = [];
    for (const env of envelopes(withDedup.channel)) await Promise.resolve(queue.push(env));
    while (queue.length > 0) {
      const taken = await Promise.resolve(queue.splice(0, BATCH));
      for (const env of taken) sink += await Promise.resolve(env.size);
    }
  },
});

Deno.bench({
  name: "memory broker, interest channel, 120 s dedup window",
  group: "publish -> receive -> settle, 1024 msgs",
  async fn() {
    await cycle(withDedup, 1);
  },
});

Deno.bench({
  name: "memory broker, interest channel, no dedup window",
  group: "publish -> receive -> settle, 1024 msgs",
  async fn() {
    await cycle(withoutDedup, 1);
  },
});

Deno.bench({
  name: "memory broker, limits channel, 3 competing receivers",
  group: "publish -> receive -> settle, 1024 msgs",
  async fn() {
    await cycle(competing, 3);
  },
});
