/**
 * The bare nats.js baseline's set-up, shared by the benchmark (which provisions it) and its worker
 * (`bare_nats_worker.ts`, one stage each): producer → relay → sink through two streams set up as a batch
 * flow's channels (interest retention, `max_msgs` 10,000, discard new, a 120 s duplicate window), each
 * with one pull durable (explicit acks).
 *
 * @module
 */

import { AckPolicy, DiscardPolicy, jetstreamManager, RetentionPolicy, StorageType } from "@nats-io/jetstream";
import { nanos } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import type { ArrivalSummary } from "./arrivals.ts";

/** The two hops' streams, subjects and durables. */
export const BARE_HOPS = [
  { stream: "bare-produce", subject: "bare.produce", durable: "relay--from--produce" },
  { stream: "bare-relay", subject: "bare.relay", durable: "sink--from--relay" },
] as const;

/** Items a consumer pulls at once, as a batch flow's prefetch. */
export const PULL_BATCH = 256;
/** A refused publish's wait before it is sent again (WIRE.md's first backoff step). */
export const REFUSED_BACKOFF_MS = 50;

/** What the parent posts to start a stage. */
export type BareNatsStage =
  | { readonly role: "producer"; readonly url: string; readonly count: number; readonly window: number }
  | { readonly role: "relay"; readonly url: string; readonly count: number; readonly window: number }
  | { readonly role: "sink"; readonly url: string; readonly count: number };

/** What the sink posts to the parent at the end. */
export interface BareNatsDone {
  readonly summary: ArrivalSummary;
}

/** Creates (or recreates, empty) both hops' streams and durables on the server at `url`. */
export async function provisionBareHops(url: string): Promise<void> {
  const nc = await connect({ servers: url });
  try {
    const jsm = await jetstreamManager(nc);
    for (const hop of BARE_HOPS) {
      await jsm.streams.delete(hop.stream).catch(() => false);
      await jsm.streams.add({
        name: hop.stream,
        subjects: [hop.subject],
        retention: RetentionPolicy.Interest,
        max_msgs: 10_000,
        discard: DiscardPolicy.New,
        duplicate_window: nanos(120_000),
        storage: StorageType.File,
      });
      await jsm.consumers.add(hop.stream, {
        durable_name: hop.durable,
        filter_subject: hop.subject,
        ack_policy: AckPolicy.Explicit,
        ack_wait: nanos(60_000),
        max_ack_pending: 4 * PULL_BATCH,
      });
    }
  } finally {
    await nc.close();
  }
}
