/**
 * One stage of the bare nats.js baseline (`bare_nats_hops.ts` sets up its streams), a Deno Worker with its
 * own connection. The producer publishes `{ seq, sentAt }` items (JSON) with a message id each, pipelined
 * (`window` PubAcks outstanding) and backing off when a full stream refuses one; the relay consumes,
 * publishes each item on with its own id and acks the input once the output's PubAck is back; the sink
 * consumes and acks, records arrivals with the same {@link ArrivalLog} as the flow's sink, and posts its
 * {@link ArrivalSummary} once `count` items arrived. No envelope, ledger, payload store or delivery
 * bookkeeping: what a flow adds to this is its cost.
 *
 * @module
 */
/// <reference lib="deno.worker" />

import { jetstream, type JetStreamClient } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { ArrivalLog, sentAtOf } from "./arrivals.ts";
import {
  BARE_HOPS,
  type BareNatsDone,
  type BareNatsStage,
  PULL_BATCH,
  REFUSED_BACKOFF_MS,
} from "./bare_nats_hops.ts";
import { nowMs, processCpuMs } from "./clock.ts";

/** Publishes `data` with `msgID`, again after {@link REFUSED_BACKOFF_MS} each time a full stream refuses it. */
async function publishPersistently(
  js: JetStreamClient,
  subject: string,
  data: Uint8Array,
  msgID: string,
): Promise<void> {
  for (;;) {
    try {
      await js.publish(subject, data, { msgID });
      return;
    } catch (error) {
      if (!/maximum messages exceeded/i.test(String(error))) throw error;
      await new Promise((resolve) => setTimeout(resolve, REFUSED_BACKOFF_MS));
    }
  }
}

/** Runs `send(i)` for i in 0..count-1 with at most `window` of them unsettled at once. */
async function pipelined(count: number, window: number, send: (i: number) => Promise<void>): Promise<void> {
  const unsettled = new Set<Promise<void>>();
  for (let i = 0; i < count; i++) {
    const sent: Promise<void> = send(i).finally(() => unsettled.delete(sent));
    unsettled.add(sent);
    if (unsettled.size >= window) await Promise.race(unsettled);
  }
  await Promise.all(unsettled);
}

async function produce(url: string, count: number, window: number): Promise<void> {
  const nc = await connect({ servers: url });
  const js = jetstream(nc);
  const encoder = new TextEncoder();
  const [hop] = BARE_HOPS;
  await pipelined(
    count,
    window,
    (seq) =>
      publishPersistently(
        js,
        hop.subject,
        encoder.encode(JSON.stringify({ seq, sentAt: nowMs() })),
        `p-${seq}`,
      ),
  );
  await nc.close();
}

async function relay(url: string, count: number, window: number): Promise<void> {
  const nc = await connect({ servers: url });
  const js = jetstream(nc);
  const [from, to] = BARE_HOPS;
  const messages = await (await js.consumers.get(from.stream, from.durable)).consume({
    max_messages: PULL_BATCH,
  });
  const unsettled = new Set<Promise<void>>();
  let relayed = 0;
  for await (const message of messages) {
    const sent: Promise<void> = publishPersistently(js, to.subject, message.data, `r-${message.seq}`)
      .then(() => message.ack())
      .finally(() => unsettled.delete(sent));
    unsettled.add(sent);
    if (unsettled.size >= window) await Promise.race(unsettled);
    if (++relayed === count) break;
  }
  await Promise.all(unsettled);
  await nc.close();
}

async function sink(url: string, count: number): Promise<void> {
  const nc = await connect({ servers: url });
  const js = jetstream(nc);
  const hop = BARE_HOPS[1];
  const log = new ArrivalLog(count, processCpuMs);
  const messages = await (await js.consumers.get(hop.stream, hop.durable)).consume({
    max_messages: PULL_BATCH,
  });
  let received = 0;
  for await (const message of messages) {
    log.record(nowMs(), sentAtOf(message.json()));
    message.ack();
    if (++received === count) break;
  }
  await nc.flush();
  await nc.close();
  const done: BareNatsDone = { summary: log.summary() };
  self.postMessage(done);
}

self.onmessage = (event: MessageEvent<BareNatsStage>) => {
  const stage = event.data;
  const ran = stage.role === "producer"
    ? produce(stage.url, stage.count, stage.window)
    : stage.role === "relay"
    ? relay(stage.url, stage.count, stage.window)
    : sink(stage.url, stage.count);
  ran.catch((error) => self.reportError(error));
};
