/**
 * The floor the benchmarks compare a flow against: one stage of a chain of bare Deno Workers joined by
 * MessagePorts, one `postMessage` per item per hop, no broker, no ledger, no codec. The producer sends
 * `{ seq, sentAt }` items under a window (at most `window` items unacknowledged by the sink, which grants
 * credit back every `grant` items over a side port), relays forward what they get, and the sink records
 * arrivals with the same {@link ArrivalLog} as the flow's sink and posts its {@link ArrivalSummary} to the
 * parent once `count` items arrived.
 *
 * @module
 */
/// <reference lib="deno.worker" />

import { ArrivalLog, type ArrivalSummary, sentAtOf } from "./arrivals.ts";
import { nowMs, processCpuMs } from "./clock.ts";

/** What the parent posts to start a stage. */
export type BareStage =
  | {
    readonly role: "producer";
    readonly count: number;
    readonly window: number;
    readonly out: MessagePort;
    readonly credit: MessagePort;
  }
  | { readonly role: "relay"; readonly in: MessagePort; readonly out: MessagePort }
  | {
    readonly role: "sink";
    readonly count: number;
    readonly grant: number;
    readonly in: MessagePort;
    readonly credit: MessagePort;
  };

/** What the sink posts to the parent at the end. */
export interface BareDone {
  readonly summary: ArrivalSummary;
}

function produce(count: number, window: number, out: MessagePort, credit: MessagePort): void {
  let sent = 0;
  let acknowledged = 0;
  const pump = () => {
    while (sent < count && sent - acknowledged < window) {
      out.postMessage({ seq: sent, sentAt: nowMs() });
      sent++;
    }
    if (sent === count) credit.close();
  };
  credit.onmessage = (event: MessageEvent<number>) => {
    acknowledged = event.data;
    pump();
  };
  pump();
}

function sink(count: number, grant: number, input: MessagePort, credit: MessagePort): void {
  const log = new ArrivalLog(count, processCpuMs);
  let received = 0;
  input.onmessage = (event: MessageEvent<unknown>) => {
    log.record(nowMs(), sentAtOf(event.data));
    received++;
    if (received % grant === 0) credit.postMessage(received);
    if (received === count) {
      const done: BareDone = { summary: log.summary() };
      self.postMessage(done);
      input.close();
    }
  };
}

self.onmessage = (event: MessageEvent<BareStage>) => {
  const stage = event.data;
  switch (stage.role) {
    case "producer":
      return produce(stage.count, stage.window, stage.out, stage.credit);
    case "relay":
      stage.in.onmessage = (message: MessageEvent<unknown>) => stage.out.postMessage(message.data);
      return;
    case "sink":
      return sink(stage.count, stage.grant, stage.in, stage.credit);
  }
};
