/**
 * Throughput and latency of the embedded broker's transport: a 3-stage pipeline producer → relay → sink
 * of small messages through three Deno Workers, beside its floor measured in the same run.
 *
 * (a) broker: each worker connects to an EmbeddedBroker in the main thread over a MessagePort and uses
 *     EmbeddedMessagingBackend. The producer publishes to channel `a`; the relay receives `a` (item
 *     credit `--credit`, its next receive already waiting while it works), publishes each message to `b`
 *     and settles it Completed once that publication is accepted; the sink receives `b` and settles.
 *     Both channels are interest channels with the default 120 s duplicate window, as reliable work uses.
 * (b) bare: the same three workers joined by MessagePorts, one postMessage per message per hop.
 *
 * Both modes share the harness's flow control: the sink grants the producer credit back every 256
 * messages over a side port, so at most `--window` messages are in the pipeline. Each message carries its
 * send time (`performance.timeOrigin + performance.now()`, which lines up across workers) and the sink
 * records the end-to-end latency.
 *
 * Printed per round: messages/s, p50/p99 latency, and CPU time per message of each thread (main, producer,
 * relay, sink; read from /proc/thread-self/stat, so Linux only) and of the whole process (GC helpers
 * included). Then the best round of each mode and the ratio broker/bare. CPU per message is the figure to
 * trust on a shared machine: throughput swings with whatever else runs there.
 *
 * Run: `deno run -A bench/embedded_broker_bench.ts [--messages 200000] [--credit 128] [--window 1024]
 * [--body 16] [--rounds 3]`.
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
import { EmbeddedMessagingBackend } from "../src/messaging/embedded_backend.ts";
import { EmbeddedConnection } from "../src/runtime/embedded_rpc.ts";

const FLOW = "bench";
const RUN = "run";
const BIG = 1 << 30;
/** How many messages the sink acknowledges to the producer at a time. */
const GRANT = 256;

interface Settings {
  readonly messages: number;
  readonly credit: number;
  readonly window: number;
  readonly body: number;
}

type Role = "producer" | "relay" | "sink";
type Mode = "broker" | "bare";

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
const fromA = subscriptionId(channelA, "relay");
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

function stamped(size: number): Uint8Array {
  const body = new Uint8Array(Math.max(8, size));
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

async function brokerWorker(role: Role, settings: Settings, ports: Setup["ports"]): Promise<Float64Array> {
  const connection = await EmbeddedConnection.connect(ports.broker, { label: role });
  const backend = new EmbeddedMessagingBackend(connection);
  const deadline = () => systemClock.monotonic() + 5;
  const latencies = new Float64Array(role === "sink" ? settings.messages : 0);
  const pending: Promise<unknown>[] = [];
  try {
    if (role === "producer") {
      await produce(settings, ports.credit, (i) => {
        pending.push(backend.publish(message(channelA, `a${i}`, stamped(settings.body)), deadline()));
      });
      for (const outcome of await Promise.all(pending)) {
        if ((outcome as { kind: string }).kind !== "accepted") throw new Error(JSON.stringify(outcome));
      }
      return latencies;
    }
    const from: SubscriptionId = role === "relay" ? fromA : fromB;
    let handled = 0;
    let next = backend.receive(from, settings.credit, BIG, deadline());
    while (handled < settings.messages) {
      const batch: readonly Delivery[] = await next;
      next = backend.receive(from, settings.credit, BIG, deadline());
      for (const delivery of batch) {
        const token = delivery.token;
        if (role === "relay") {
          pending.push(
            backend.publish(message(channelB, `b${token.messageId}`, delivery.envelopeBytes), deadline())
              .then(() => backend.settle(token, completed(), `s${token.messageId}`)),
          );
        } else {
          latencies[handled] = now() - sentAt(delivery.envelopeBytes);
          pending.push(backend.settle(token, completed(), `s${token.messageId}`));
          if ((handled + 1) % GRANT === 0) ports.credit.postMessage(GRANT);
        }
        handled++;
      }
      if (pending.length > 4096) await Promise.all(pending.splice(0));
    }
    await Promise.all(pending);
    await backend.shutdown();
    await next;
    return latencies;
  } finally {
    ports.credit?.close();
    await connection.close();
  }
}

async function bareWorker(role: Role, settings: Settings, ports: Setup["ports"]): Promise<Float64Array> {
  const latencies = new Float64Array(role === "sink" ? settings.messages : 0);
  if (role === "producer") {
    await produce(settings, ports.credit, () => ports.out.postMessage(stamped(settings.body)));
  } else {
    let count = 0;
    await new Promise<void>((resolve) => {
      ports.in.onmessage = (event) => {
        const body = event.data as Uint8Array;
        if (role === "relay") {
          ports.out.postMessage(body);
        } else {
          latencies[count] = now() - sentAt(body);
          if ((count + 1) % GRANT === 0) ports.credit.postMessage(GRANT);
        }
        if (++count === settings.messages) resolve();
      };
    });
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
    const latencies = setup.mode === "broker"
      ? await brokerWorker(setup.role, setup.settings, setup.ports)
      : await bareWorker(setup.role, setup.settings, setup.ports);
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
  for (const [id, consumer] of [[channelA, fromA], [channelB, fromB]] as const) {
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
function wire(broker: EmbeddedBroker | null): Record<Role, Record<string, MessagePort>> {
  const credit = new MessageChannel();
  if (broker !== null) {
    return {
      producer: { broker: broker.openPort("producer"), credit: credit.port1 },
      relay: { broker: broker.openPort("relay") },
      sink: { broker: broker.openPort("sink"), credit: credit.port2 },
    };
  }
  const ab = new MessageChannel();
  const bc = new MessageChannel();
  return {
    producer: { out: ab.port1, credit: credit.port1 },
    relay: { in: ab.port2, out: bc.port1 },
    sink: { in: bc.port2, credit: credit.port2 },
  };
}

function perMessage(micros: number | null, messages: number): number | null {
  return micros === null ? null : micros / messages;
}

async function round(mode: Mode, settings: Settings): Promise<RoundResult> {
  const roles: Role[] = ["producer", "relay", "sink"];
  const broker = mode === "broker"
    ? new EmbeddedBroker({ messaging: new MemoryMessagingBackend({ clock: systemClock }) })
    : null;
  if (broker !== null) await provision(broker, settings);
  const ports = wire(broker);
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
  start(1);
  start(2);
  await Promise.all([ready[1].promise, ready[2].promise]);
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
  const sorted = reports[2].latencies.slice().sort();
  const n = settings.messages;
  return {
    messagesPerSecond: n / (elapsed / 1000),
    p50Ms: percentile(sorted, 0.5),
    p99Ms: percentile(sorted, 0.99),
    cpu: {
      main: perMessage(mainBefore === null || mainAfter === null ? null : mainAfter - mainBefore, n),
      producer: perMessage(reports[0].cpuMicros, n),
      relay: perMessage(reports[1].cpuMicros, n),
      sink: perMessage(reports[2].cpuMicros, n),
      process: (process.user + process.system) / n,
    },
  };
}

function describe(result: RoundResult): string {
  const cpu = Object.entries(result.cpu)
    .map(([thread, micros]) => `${thread} ${micros === null ? "?" : micros.toFixed(1)}`)
    .join(" ");
  return `${Math.round(result.messagesPerSecond).toLocaleString("en-US").padStart(9)} msgs/s   ` +
    `p50 ${result.p50Ms.toFixed(2).padStart(6)} ms   p99 ${result.p99Ms.toFixed(2).padStart(6)} ms   ` +
    `CPU µs/msg: ${cpu}`;
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
    },
  });
  const settings: Settings = {
    messages: Number(values.messages),
    credit: Number(values.credit),
    window: Number(values.window),
    body: Number(values.body),
  };
  const rounds = Number(values.rounds);
  console.log(
    `3-stage pipeline, ${settings.messages} messages of ${settings.body} bytes, credit ${settings.credit}, ` +
      `window ${settings.window}, ${navigator.hardwareConcurrency} CPUs`,
  );
  const warmup = { ...settings, messages: Math.min(20_000, settings.messages) };
  await round("bare", warmup);
  await round("broker", warmup);
  const best: Partial<Record<Mode, RoundResult>> = {};
  for (let i = 0; i < rounds; i++) {
    for (const mode of ["bare", "broker"] as const) {
      const result = await round(mode, settings);
      console.log(`round ${i + 1} ${mode.padEnd(6)} ${describe(result)}`);
      if ((best[mode]?.messagesPerSecond ?? 0) < result.messagesPerSecond) best[mode] = result;
    }
  }
  const bare = best.bare as RoundResult;
  const brokered = best.broker as RoundResult;
  console.log(`best    bare   ${describe(bare)}`);
  console.log(`best    broker ${describe(brokered)}`);
  console.log(`ratio broker/bare: ${(brokered.messagesPerSecond / bare.messagesPerSecond).toFixed(2)}`);
}
