/**
 * Throughput and latency of the embedded broker's transport, each beside its floor measured in the same
 * run, in two cases:
 *
 * 1. Small messages: a 3-stage pipeline producer → relay → sink of `--body`-byte messages through three
 *    Deno Workers.
 *    (a) broker: each worker connects to an EmbeddedBroker in the main thread over a MessagePort and uses
 *        EmbeddedMessagingBackend. The producer publishes to channel `a`; the relay receives `a` (item
 *        credit `--credit`, its next receive already waiting while it works), publishes each message to
 *        `b` and settles it Completed once that publication is accepted; the sink receives `b` and
 *        settles. Both channels are interest channels with the default 120 s duplicate window, as
 *        reliable work uses.
 *    (b) batched: as (a), with the contract's batch forms: the producer publishes what its credit lets it
 *        send in one turn with one `publishBatch`, the relay publishes each received batch with one
 *        `publishBatch` and settles it with one `settleBatch` once accepted, the sink settles each
 *        received batch with one `settleBatch`.
 *    (c) bare: the same three workers joined by MessagePorts, one postMessage (a copy) per message per hop.
 * 2. Large bodies (`--large-count` frames of `--large-size` bytes, a 1280x720 RGB frame by default): a
 *    2-stage producer → sink, the producer writing each frame into a fresh buffer.
 *    (a) broker: as above, over channel `a`; the producer's client copies each body and moves the copy to
 *        the broker, which keeps it and moves a copy it makes (in the main thread) to the sink.
 *    (b) bare: the two workers joined by a MessagePort, each frame's buffer transferred (no copy at all).
 *
 * Every mode shares the harness's flow control: the sink grants the producer credit back every `grant`
 * messages (256 small, 4 large) over a side port, so at most `--window` messages (`--large-window`
 * frames) are in flight. Each message carries its send time (`performance.timeOrigin +
 * performance.now()`, which lines up across workers) and the sink records the end-to-end latency.
 *
 * Printed per round: messages/s (and MB/s for frames), p50/p99 latency, and CPU time per message of each
 * thread (main, producer, relay, sink; read from /proc/thread-self/stat, so Linux only) and of the whole
 * process (GC helpers included). Then the best round of each mode and the ratios to bare. CPU per message
 * is the figure to trust on a shared machine: throughput swings with whatever else runs there.
 *
 * Run: `deno run -A bench/embedded_broker_bench.ts [--messages 200000] [--credit 128] [--window 1024]
 * [--body 16] [--rounds 3] [--large-count 300] [--large-size 2764800] [--large-window 16]`
 * (`--large-count 0` or `--messages 0` skips a case).
 *
 * @module
 */

import { cpuUsage } from "node:process";
import { parseArgs } from "node:util";
import { systemClock } from "../src/backends/clock.ts";
import { MemoryMessagingBackend } from "../src/backends/memory/messaging.ts";
import {
  type ChannelId,
  channelId,
  channelSpec,
  completed,
  type Delivery,
  type Envelope,
  envelope,
  MessageKind,
  Overflow,
  type SubscriptionId,
  subscriptionId,
  subscriptionSpec,
} from "../src/backends/messaging.ts";
import { EmbeddedBroker } from "../src/engines/embedded_broker.ts";
import { EmbeddedMessagingBackend } from "../src/embedded/messaging_backend.ts";
import { EmbeddedConnection } from "../src/embedded/rpc.ts";

const FLOW = "bench";
const RUN = "run";
const BIG = 1 << 30;
/** A 1280x720 RGB frame. */
const FRAME_BYTES = 1280 * 720 * 3;

/** One case's shape: how many messages of what size cross how many stages, with what flow control. */
interface Settings {
  readonly messages: number;
  readonly body: number;
  /** 3: producer → relay → sink; 2: producer → sink. */
  readonly stages: 2 | 3;
  readonly credit: number;
  readonly window: number;
  /** How many messages the sink acknowledges to the producer at a time. */
  readonly grant: number;
  /** Bare mode moves each body's buffer (a transfer) instead of copying it. */
  readonly transfer: boolean;
}

type Role = "producer" | "relay" | "sink";
type Mode = "broker" | "batched" | "bare";

/** What a worker reports at the end of a round. */
interface WorkerReport {
  /** This thread's CPU time for the round, in microseconds; null where it cannot be read. */
  readonly cpuMicros: number | null;
  /** The sink's end-to-end latencies in milliseconds (empty for the other roles). */
  readonly latencies: Float64Array;
}

/** The first message a worker gets: its role, the settings, and its ports. */
interface Setup {
  readonly mode: Mode;
  readonly role: Role;
  readonly settings: Settings;
  /** `broker`: the connection's port (broker mode); `in`, `out`: the data hops (bare); `credit`: flow control. */
  readonly ports: Readonly<Record<string, MessagePort>>;
}

const channelA = channelId(FLOW, RUN, "a");
const channelB = channelId(FLOW, RUN, "b");
const fromA = subscriptionId(channelA, "next");
const fromB = subscriptionId(channelB, "sink");

function now(): number {
  return performance.timeOrigin + performance.now();
}

/** This thread's user + system CPU time in microseconds (Linux), or null. */
function threadCpuMicros(): number | null {
  try {
    const stat = Deno.readTextFileSync("/proc/thread-self/stat");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) * 10_000;
  } catch {
    return null;
  }
}

/** A fresh body of the settings' size, written through (as a producer writes a frame), its first 8 bytes the send time. */
function stamped(settings: Settings, index: number): Uint8Array {
  const size = Math.max(8, settings.body);
  const body = new Uint8Array(size);
  if (size > 8) body.fill(index & 0xff, 8);
  new DataView(body.buffer).setFloat64(0, now());
  return body;
}

function sentAt(body: Uint8Array): number {
  return new DataView(body.buffer, body.byteOffset, body.byteLength).getFloat64(0);
}

function message(channel: ChannelId, id: string, body: Uint8Array): Envelope {
  return envelope({
    channel,
    publicationId: id,
    eventId: id,
    body,
    schemaVersion: 4,
    kind: MessageKind.data,
  });
}

// ---- the workers ------------------------------------------------------------------------------------

/** The producer's side of the flow control: `take()` waits for a unit of credit. */
function creditFrom(port: MessagePort, window: number): { take(): Promise<void> | null } {
  let credit = window;
  let wake: (() => void) | null = null;
  port.onmessage = (event) => {
    credit += event.data as number;
    const resume = wake;
    wake = null;
    resume?.();
  };
  return {
    take() {
      if (credit > 0) {
        credit--;
        return null;
      }
      return new Promise<void>((resolve) => wake = resolve).then(() => {
        credit--;
      });
    },
  };
}

async function produce(settings: Settings, port: MessagePort, send: (i: number) => void): Promise<void> {
  const credit = creditFrom(port, settings.window);
  for (let i = 0; i < settings.messages; i++) {
    const wait = credit.take();
    if (wait !== null) await wait;
    send(i);
  }
}

/** The sink's side of the flow control: records each message's latency and grants credit back. */
class SinkRecorder {
  readonly latencies: Float64Array;
  readonly #settings: Settings;
  readonly #port: MessagePort;

  constructor(settings: Settings, port: MessagePort) {
    this.latencies = new Float64Array(settings.messages);
    this.#settings = settings;
    this.#port = port;
  }

  record(count: number, body: Uint8Array): void {
    this.latencies[count] = now() - sentAt(body);
    if ((count + 1) % this.#settings.grant === 0) this.#port.postMessage(this.#settings.grant);
  }
}

/** What a broker worker does with its backend: the producer's sends, and a receiver's batches. */
interface BrokerRole {
  /** Produces every message; resolves with the outcomes of its publications. */
  produce(backend: EmbeddedMessagingBackend, setup: Setup): Promise<readonly { readonly kind: string }[]>;
  /** Forwards (relay) or records (sink) one received batch; returns the calls it left running. */
  handle(
    backend: EmbeddedMessagingBackend,
    batch: readonly Delivery[],
    sink: SinkRecorder | null,
    handled: number,
  ): Promise<unknown>[];
}

const deadline = () => systemClock.monotonic() + 5;

/** The broker mode: one call per publication and per settlement (see the module comment, 1a). */
const ONE_BY_ONE: BrokerRole = {
  produce: async (backend, { settings, ports }) => {
    const pending: Promise<{ readonly kind: string }>[] = [];
    await produce(settings, ports.credit, (i) => {
      pending.push(backend.publish(message(channelA, `a${i}`, stamped(settings, i)), deadline()));
    });
    return await Promise.all(pending);
  },
  handle: (backend, batch, sink, handled) =>
    batch.map((delivery, i) => {
      const token = delivery.token;
      if (sink === null) {
        return backend.publish(message(channelB, `b${token.messageId}`, delivery.envelopeBytes), deadline())
          .then(() => backend.settle(token, completed(), `s${token.messageId}`));
      }
      sink.record(handled + i, delivery.envelopeBytes);
      return backend.settle(token, completed(), `s${token.messageId}`);
    }),
};

/** The batched mode: the contract's batch forms (see the module comment, 1b). */
const BATCHED: BrokerRole = {
  produce: async (backend, { settings, ports }) => {
    const pending: Promise<readonly { readonly kind: string }[]>[] = [];
    let burst: Envelope[] = [];
    const send = () => {
      if (burst.length > 0) pending.push(backend.publishBatch(burst, deadline()));
      burst = [];
    };
    const credit = creditFrom(ports.credit, settings.window);
    for (let i = 0; i < settings.messages; i++) {
      const wait = credit.take();
      if (wait !== null) {
        send();
        await wait;
      }
      burst.push(message(channelA, `a${i}`, stamped(settings, i)));
      if (burst.length >= settings.credit) send();
    }
    send();
    return (await Promise.all(pending)).flat();
  },
  handle: (backend, batch, sink, handled) => {
    const settles = batch.map((delivery) => ({
      token: delivery.token,
      outcome: completed(),
      settlementId: `s${delivery.token.messageId}`,
    }));
    if (sink === null) {
      const outputs = batch.map((d) => message(channelB, `b${d.token.messageId}`, d.envelopeBytes));
      return [backend.publishBatch(outputs, deadline()).then(() => backend.settleBatch(settles))];
    }
    batch.forEach((delivery, i) => sink.record(handled + i, delivery.envelopeBytes));
    return [backend.settleBatch(settles)];
  },
};

async function brokerWorker(role: Role, mode: BrokerRole, setup: Setup): Promise<Float64Array> {
  const settings = setup.settings;
  const connection = await EmbeddedConnection.connect(setup.ports.broker, { label: role });
  const backend = new EmbeddedMessagingBackend(connection);
  try {
    if (role === "producer") {
      for (const outcome of await mode.produce(backend, setup)) {
        if (outcome.kind !== "accepted") throw new Error(JSON.stringify(outcome));
      }
      return new Float64Array(0);
    }
    const from: SubscriptionId = role === "sink" && settings.stages === 3 ? fromB : fromA;
    const sink = role === "sink" ? new SinkRecorder(settings, setup.ports.credit) : null;
    const pending: Promise<unknown>[] = [];
    let handled = 0;
    let next = backend.receive(from, settings.credit, BIG, deadline());
    while (handled < settings.messages) {
      const batch: readonly Delivery[] = await next;
      next = backend.receive(from, settings.credit, BIG, deadline());
      pending.push(...mode.handle(backend, batch, sink, handled));
      handled += batch.length;
      if (pending.length > 4096) await Promise.all(pending.splice(0));
    }
    await Promise.all(pending);
    await backend.shutdown();
    await next;
    return sink?.latencies ?? new Float64Array(0);
  } finally {
    setup.ports.credit?.close();
    await connection.close();
  }
}

/** The transfer list of a bare hop: the body's buffer when the settings move bodies, else nothing. */
function moving(settings: Settings, body: Uint8Array): ArrayBuffer[] {
  return settings.transfer && body.buffer instanceof ArrayBuffer ? [body.buffer] : [];
}

async function bareWorker(role: Role, settings: Settings, ports: Setup["ports"]): Promise<Float64Array> {
  let latencies: Float64Array = new Float64Array(0);
  if (role === "producer") {
    await produce(settings, ports.credit, (i) => {
      const body = stamped(settings, i);
      ports.out.postMessage(body, moving(settings, body));
    });
  } else {
    const sink = role === "sink" ? new SinkRecorder(settings, ports.credit) : null;
    let count = 0;
    await new Promise<void>((resolve) => {
      ports.in.onmessage = (event) => {
        const body = event.data as Uint8Array;
        if (sink === null) ports.out.postMessage(body, moving(settings, body));
        else sink.record(count, body);
        if (++count === settings.messages) resolve();
      };
    });
    latencies = sink?.latencies ?? latencies;
  }
  for (const port of Object.values(ports)) port.close();
  return latencies;
}

const workerScope = (globalThis as { WorkerGlobalScope?: abstract new () => unknown }).WorkerGlobalScope;
/** Whether this module runs as one of the bench's workers (where `import.meta.main` is true as well). */
const inWorker = workerScope !== undefined && globalThis instanceof workerScope;

if (inWorker) {
  const scope = globalThis as unknown as {
    onmessage: ((event: MessageEvent<Setup>) => void) | null;
    postMessage(message: unknown): void;
  };
  scope.onmessage = async (event) => {
    const setup = event.data;
    scope.onmessage = null;
    scope.postMessage({ ready: true });
    const before = threadCpuMicros();
    const latencies = setup.mode === "bare"
      ? await bareWorker(setup.role, setup.settings, setup.ports)
      : await brokerWorker(setup.role, setup.mode === "batched" ? BATCHED : ONE_BY_ONE, setup);
    const after = threadCpuMicros();
    const report: WorkerReport = {
      cpuMicros: before === null || after === null ? null : after - before,
      latencies,
    };
    scope.postMessage({ done: true, report });
  };
}

// ---- the main thread --------------------------------------------------------------------------------

interface RoundResult {
  readonly messagesPerSecond: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** CPU microseconds per message: each thread, then the whole process. */
  readonly cpu: Readonly<Record<"main" | Role | "process", number | null>>;
}

function percentile(sorted: Float64Array, p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

async function provision(broker: EmbeddedBroker, settings: Settings): Promise<void> {
  const hops: [ChannelId, SubscriptionId][] = settings.stages === 3
    ? [[channelA, fromA], [channelB, fromB]]
    : [[channelA, fromA]];
  for (const [id, consumer] of hops) {
    await broker.messaging.ensureChannel(
      channelSpec({
        id,
        profile: "reliable_work",
        retention: "interest",
        maxMsgs: settings.window * 4,
        maxBytes: null,
        maxAgeSeconds: null,
        overflow: Overflow.reject,
        dedupWindowSeconds: 120,
        replicas: 1,
        persistence: false,
        requiredSubscriptions: [consumer],
      }),
      `ensure-${id.node}`,
    );
    await broker.messaging.ensureSubscription(
      subscriptionSpec({
        id: consumer,
        competing: true,
        ackWaitSeconds: 60,
        maxDeliver: -1,
        itemCredit: settings.credit * 4,
        byteCredit: BIG,
      }),
      `bind-${consumer.consumerNode}`,
    );
  }
}

/** The ports each role gets: the broker connection or the data hops, and the flow-control side port. */
function wire(
  broker: EmbeddedBroker | null,
  roles: readonly Role[],
): Record<string, Record<string, MessagePort>> {
  const credit = new MessageChannel();
  const ports: Record<string, Record<string, MessagePort>> = {};
  for (const role of roles) ports[role] = {};
  ports.producer.credit = credit.port1;
  ports.sink.credit = credit.port2;
  for (let i = 0; i < roles.length; i++) {
    if (broker !== null) {
      ports[roles[i]].broker = broker.openPort(roles[i]);
    } else if (i + 1 < roles.length) {
      const hop = new MessageChannel();
      ports[roles[i]].out = hop.port1;
      ports[roles[i + 1]].in = hop.port2;
    }
  }
  return ports;
}

function perMessage(micros: number | null, messages: number): number | null {
  return micros === null ? null : micros / messages;
}

async function round(mode: Mode, settings: Settings): Promise<RoundResult> {
  const roles: Role[] = settings.stages === 3 ? ["producer", "relay", "sink"] : ["producer", "sink"];
  const broker = mode !== "bare"
    ? new EmbeddedBroker({ messaging: new MemoryMessagingBackend({ clock: systemClock }) })
    : null;
  if (broker !== null) await provision(broker, settings);
  const ports = wire(broker, roles);
  const workers = roles.map((role) =>
    new Worker(import.meta.url, { type: "module", name: `embedded-bench-${mode}-${role}` })
  );
  const ready = roles.map(() => Promise.withResolvers<void>());
  const done = roles.map(() => Promise.withResolvers<WorkerReport>());
  workers.forEach((worker, index) => {
    worker.onmessage = (event) => {
      if (event.data.ready) ready[index].resolve();
      if (event.data.done) done[index].resolve(event.data.report);
    };
    worker.onerror = (event) => {
      event.preventDefault();
      done[index].reject(new Error(`${roles[index]}: ${event.message}`));
    };
  });
  const start = (index: number) => {
    const role = roles[index];
    const setup: Setup = { mode, role, settings, ports: ports[role] };
    workers[index].postMessage(setup, Object.values(ports[role]));
  };
  for (let index = 1; index < roles.length; index++) start(index);
  await Promise.all(ready.slice(1).map((r) => r.promise));
  const mainBefore = threadCpuMicros();
  const processBefore = cpuUsage();
  const started = performance.now();
  start(0);
  const reports = await Promise.all(done.map((d) => d.promise));
  const elapsed = performance.now() - started;
  const mainAfter = threadCpuMicros();
  const process = cpuUsage(processBefore);
  for (const worker of workers) worker.terminate();
  await broker?.close();
  const sorted = reports[roles.length - 1].latencies.slice().sort();
  const n = settings.messages;
  const cpuOf = (role: Role) => {
    const index = roles.indexOf(role);
    return index < 0 ? null : perMessage(reports[index].cpuMicros, n);
  };
  return {
    messagesPerSecond: n / (elapsed / 1000),
    p50Ms: percentile(sorted, 0.5),
    p99Ms: percentile(sorted, 0.99),
    cpu: {
      main: perMessage(mainBefore === null || mainAfter === null ? null : mainAfter - mainBefore, n),
      producer: cpuOf("producer"),
      relay: cpuOf("relay"),
      sink: cpuOf("sink"),
      process: (process.user + process.system) / n,
    },
  };
}

function describe(result: RoundResult, settings: Settings): string {
  const cpu = Object.entries(result.cpu)
    .filter(([thread, micros]) => micros !== null || thread !== "relay")
    .map(([thread, micros]) => `${thread} ${micros === null ? "?" : micros.toFixed(1)}`)
    .join(" ");
  const rate = settings.body >= 1 << 20
    ? ` ${(result.messagesPerSecond * settings.body / 2 ** 20).toFixed(0).padStart(6)} MB/s`
    : "";
  return `${Math.round(result.messagesPerSecond).toLocaleString("en-US").padStart(9)} msgs/s${rate}   ` +
    `p50 ${result.p50Ms.toFixed(2).padStart(6)} ms   p99 ${result.p99Ms.toFixed(2).padStart(6)} ms   ` +
    `CPU µs/msg: ${cpu}`;
}

/** One variant of a case: its label, its mode and its settings. */
interface Variant {
  readonly label: string;
  readonly mode: Mode;
  readonly settings: Settings;
}

/** Runs a warm-up of each variant, then `rounds` rounds of all; prints each round, the best and the ratios. */
async function compare(title: string, variants: readonly Variant[], rounds: number): Promise<void> {
  console.log(title);
  for (const variant of variants) {
    const warmup = Math.min(
      variant.settings.messages,
      Math.max(20, Math.floor(variant.settings.messages / 10)),
    );
    await round(variant.mode, { ...variant.settings, messages: warmup });
  }
  const width = Math.max(...variants.map((variant) => variant.label.length));
  const best = new Map<string, RoundResult>();
  for (let i = 0; i < rounds; i++) {
    for (const variant of variants) {
      const result = await round(variant.mode, variant.settings);
      console.log(`round ${i + 1} ${variant.label.padEnd(width)} ${describe(result, variant.settings)}`);
      if ((best.get(variant.label)?.messagesPerSecond ?? 0) < result.messagesPerSecond) {
        best.set(variant.label, result);
      }
    }
  }
  for (const variant of variants) {
    console.log(
      `best    ${variant.label.padEnd(width)} ${
        describe(best.get(variant.label) as RoundResult, variant.settings)
      }`,
    );
  }
  const floor = best.get("bare") as RoundResult;
  for (const variant of variants) {
    if (variant.label === "bare") continue;
    const ratio = (best.get(variant.label) as RoundResult).messagesPerSecond / floor.messagesPerSecond;
    console.log(`ratio ${variant.label}/bare: ${ratio.toFixed(2)}`);
  }
}

if (import.meta.main && !inWorker) {
  const { values } = parseArgs({
    args: Deno.args,
    options: {
      messages: { type: "string", default: "200000" },
      credit: { type: "string", default: "128" },
      window: { type: "string", default: "1024" },
      body: { type: "string", default: "16" },
      rounds: { type: "string", default: "3" },
      "large-count": { type: "string", default: "300" },
      "large-size": { type: "string", default: String(FRAME_BYTES) },
      "large-window": { type: "string", default: "16" },
    },
  });
  const rounds = Number(values.rounds);
  const small: Settings = {
    messages: Number(values.messages),
    body: Number(values.body),
    stages: 3,
    credit: Number(values.credit),
    window: Number(values.window),
    grant: 256,
    transfer: false,
  };
  const large: Settings = {
    messages: Number(values["large-count"]),
    body: Number(values["large-size"]),
    stages: 2,
    credit: 8,
    window: Number(values["large-window"]),
    grant: 4,
    transfer: true,
  };
  console.log(`${navigator.hardwareConcurrency} CPUs`);
  if (small.messages > 0) {
    await compare(
      `3-stage pipeline, ${small.messages} messages of ${small.body} bytes, credit ${small.credit}, ` +
        `window ${small.window}`,
      [
        { label: "bare", mode: "bare", settings: small },
        { label: "broker", mode: "broker", settings: small },
        { label: "batched", mode: "batched", settings: small },
      ],
      rounds,
    );
  }
  if (large.messages > 0) {
    await compare(
      `2-stage producer → sink, ${large.messages} frames of ${large.body} bytes, window ${large.window}`,
      [
        { label: "bare", mode: "bare", settings: large },
        { label: "broker", mode: "broker", settings: large },
      ],
      rounds,
    );
  }
}
