/**
 * The embedded broker as the local engine uses it: a real Deno Worker over a transferred MessagePort, a
 * real `deno run` subprocess over TCP with the run's secret, and the server's guarantees (order, long-polls
 * that block nothing, typed errors, what a disconnect, a shutdown or a close leaves behind, control
 * events, client-side admission and supersede, payload transfer, the ledger proxy's own close), and how
 * large bytes travel: over a port each is a copy moved to the other side (never shared memory), which the
 * broker and the payload store keep as it arrives; over TCP the socket copies.
 *
 * @module
 */

import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import {
  BrokerUnavailable,
  ConfigError,
  IncompatibleProfile,
  ResourceUnavailable,
} from "../../../src/core/errors.ts";
import { Barrier, FaultSchedule, pause } from "../../../src/backends/faults.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  CONTROL_STOP_KEY,
  makeChannel,
  makeEnvelope,
  makeSubscription,
  MemoryMessagingBackend,
} from "../../../src/backends/memory/messaging.ts";
import {
  channelId,
  completed,
  creditRequest,
  type Delivery,
  type Envelope,
  MessageKind,
  Overflow,
  retry,
  subscriptionId,
  type SubscriptionSpec,
} from "../../../src/backends/messaging.ts";
import { retentionContract } from "../../../src/backends/payload.ts";
import { MemoryRuntimeStore } from "../../../src/backends/memory/runtime_store.ts";
import { EmbeddedBroker } from "../../../src/engines/embedded_broker.ts";
import { ENVELOPE_HEADROOM, ENVELOPE_TAILROOM } from "../../../src/core/bytes.ts";
import { EmbeddedMessagingBackend } from "../../../src/embedded/messaging_backend.ts";
import { EmbeddedPayloadStore } from "../../../src/embedded/payload_store.ts";
import {
  EMBEDDED_BROKER_ENV,
  EMBEDDED_BROKER_SECRET_ENV,
  EmbeddedConnection,
  Frame,
  Op,
  PACK_LIMIT,
  portLink,
  spansBuffer,
} from "../../../src/embedded/rpc.ts";
import { EmbeddedRuntimeStore } from "../../../src/embedded/runtime_store.ts";

const REPO = new URL("../../../", import.meta.url);
const BIG = 1 << 30;
const CAM = channelId("flow-A", "run-1", "cam");
const spec = makeChannel("flow-A", "run-1", "cam", "reliable_work", "interest", {
  required: [subscriptionId(CAM, "det")],
});
const detect: SubscriptionSpec = makeSubscription(spec.id, "det", { ackWaitSeconds: 10 });
const CONTRACT = retentionContract({ ttlSeconds: 60, horizonSeconds: 60, durableRequired: false });
/** A 1280x720 RGB frame's size. */
const FRAME_BYTES = 1280 * 720 * 3;

/** A frame-sized body whose bytes depend on `salt`. */
function frameBytes(salt: number): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(FRAME_BYTES);
  for (let i = 0; i < out.length; i++) out[i] = (i * 31 + salt) & 0xff;
  return out;
}

/** Whether two byte arrays hold the same bytes (a plain loop: deepEqual on megabytes is slow to fail). */
function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.byteLength !== b.byteLength) return false;
  for (let i = 0; i < a.byteLength; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * Whether `bytes` are an ordinary array with an ArrayBuffer of their own (not shared memory, no view into a
 * buffer that holds other data): spanning it, or with at most the room a frame's envelope is written in
 * beside them (a large field kept as it came in a frame of its own, `unpack`).
 */
function ownPlain(bytes: Uint8Array): boolean {
  return bytes.buffer instanceof ArrayBuffer &&
    (spansBuffer(bytes) ||
      bytes.buffer.byteLength - bytes.byteLength <= ENVELOPE_HEADROOM + ENVELOPE_TAILROOM);
}

/** Whether the buffer under `bytes` was moved away (transferred to another thread). */
function detached(bytes: Uint8Array): boolean {
  return (bytes.buffer as ArrayBuffer).detached;
}

/** A large body as the hosted broker was asked to store it. */
interface LargeBody {
  /** The body array the connection decoded and handed to the messaging model. */
  readonly arrived: Uint8Array;
  /** Whether the channel then retained that very array (no copy on the broker's thread). */
  readonly kept: boolean;
}

/** Records every large body the hosted broker is asked to store, and whether it kept that very array. */
function watchLargeBodies(broker: EmbeddedBroker): LargeBody[] {
  const seen: LargeBody[] = [];
  const messaging = broker.messaging;
  const publishNow = messaging.publishNow.bind(messaging);
  messaging.publishNow = (envelope: Envelope, deadline: number) => {
    const outcome = publishNow(envelope, deadline);
    if (envelope.body.byteLength > PACK_LIMIT) {
      const stored = messaging.stored(envelope.channel).find((kept) =>
        kept.publicationId === envelope.publicationId
      );
      seen.push({ arrived: envelope.body, kept: stored?.body === envelope.body });
    }
    return outcome;
  };
  return seen;
}

/** What a test can say about recorded large bodies across threads: ordinary arrays of their own, kept. */
function keptPlain(bodies: readonly LargeBody[]): { plain: boolean; kept: boolean }[] {
  return bodies.map(({ arrived, kept }) => ({ plain: ownPlain(arrived), kept }));
}

/** A broker on `clock` with the `cam` channel and its `det` subscription provisioned. */
async function provisioned(clock = new FakeClock(), runtimeStore = new MemoryRuntimeStore(clock)) {
  const broker = new EmbeddedBroker({
    clock,
    messaging: new MemoryMessagingBackend({ clock }),
    runtimeStore,
  });
  await broker.messaging.ensureChannel(spec, "ensure-cam");
  await broker.messaging.ensureSubscription(detect, "bind-det");
  return { broker, clock };
}

/** Resolves once the server has dispatched every call this connection sent before (calls start in order). */
async function processed(connection: EmbeddedConnection): Promise<void> {
  await new EmbeddedPayloadStore(connection).capabilities();
}

/** Waits (real time, bounded) for work the broker finishes off the caller's turn. */
async function eventually(check: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  assert.fail(`${what} never happened`);
}

async function client(broker: EmbeddedBroker, label: string, clock: FakeClock) {
  const connection = await EmbeddedConnection.connect(broker.openPort(label), { label });
  return { connection, messaging: new EmbeddedMessagingBackend(connection, { clock }) };
}

/**
 * A module that exercises all three services through one connection and returns a JSON-able report. It
 * runs inside a Deno Worker and inside a subprocess, so it names every module by absolute URL.
 */
function clientModule(): string {
  const at = (path: string) => JSON.stringify(new URL(path, REPO).href);
  return `
import { EmbeddedConnection } from ${at("src/embedded/rpc.ts")};
import { EmbeddedMessagingBackend } from ${at("src/embedded/messaging_backend.ts")};
import { EmbeddedPayloadStore } from ${at("src/embedded/payload_store.ts")};
import { EmbeddedRuntimeStore } from ${at("src/embedded/runtime_store.ts")};
import { channelId, completed, envelope, retry, subscriptionId } from ${at("src/backends/messaging.ts")};
import { retentionContract } from ${at("src/backends/payload.ts")};
import { systemClock } from ${at("src/backends/clock.ts")};

export async function exercise(connection) {
  const messaging = new EmbeddedMessagingBackend(connection);
  const payload = new EmbeddedPayloadStore(connection, { transferPuts: true });
  const ledger = new EmbeddedRuntimeStore(connection);
  const cam = channelId("flow-A", "run-1", "cam");
  const det = subscriptionId(cam, "det");
  const deadline = systemClock.monotonic() + 5;
  const published = await Promise.all(["p1", "p2", "p3"].map((id) =>
    messaging.publish(envelope({ channel: cam, publicationId: id, eventId: id, schemaVersion: 4,
      body: new TextEncoder().encode("body-" + id) }), deadline)));
  const deliveries = await messaging.receive(det, 8, 1 << 30, deadline);
  const settled = await Promise.all(deliveries.map((d) => messaging.settle(d.token, completed(), "s-" + d.token.messageId)));
  const big = new Uint8Array(${FRAME_BYTES});
  for (let i = 0; i < big.length; i++) big[i] = (i * 31 + 5) & 0xff;
  const same = (bytes) => bytes.length === big.length && bytes.every((b, i) => b === big[i]);
  const bigPublished = await messaging.publish(envelope({ channel: cam, publicationId: "big", eventId: "big",
    schemaVersion: 4, body: big }), deadline);
  const [first] = await messaging.receive(det, 1, 1 << 30, deadline);
  const firstIntact = same(first.envelopeBytes);
  const firstBytes = first.envelopeBytes;
  const firstOwn = firstBytes.buffer instanceof ArrayBuffer &&
    firstBytes.buffer.byteLength - firstBytes.byteLength <= ${ENVELOPE_HEADROOM + ENVELOPE_TAILROOM};
  first.envelopeBytes.fill(0);
  await messaging.settle(first.token, retry(), "retry-big");
  const [again] = await messaging.receive(det, 1, 1 << 30, deadline);
  const redelivered = again.token.attempt === 2 && same(again.envelopeBytes);
  await messaging.settle(again.token, completed(), "done-big");
  const frame = new Uint8Array(200_000).fill(7);
  const ref = await payload.put(frame, "cam:e1", retentionContract({ ttlSeconds: 60, horizonSeconds: 60, durableRequired: false }));
  const detached = frame.buffer.detached;
  const read = await payload.read(ref);
  const created = await ledger.cas("vf/key", null, new TextEncoder().encode("v1"));
  const entry = await ledger.get("vf/key");
  await ledger.close();
  await messaging.shutdown();
  await connection.close();
  return {
    transport: connection.transport,
    published: published.map((o) => o.kind + ":" + o.sequence),
    received: deliveries.map((d) => new TextDecoder().decode(d.envelopeBytes)),
    settled: settled.map((o) => o.kind),
    big: [bigPublished.kind, firstIntact, firstOwn, redelivered, same(big)],
    detached,
    read: read.kind === "bytes" ? read.data.length + ":" + read.data[199_999] : read.kind,
    created,
    entry: entry.kind === "present" ? new TextDecoder().decode(entry.value) : entry.kind,
  };
}
`;
}

const EXPECTED_REPORT = {
  published: ["accepted:1", "accepted:2", "accepted:3"],
  received: ["body-p1", "body-p2", "body-p3"],
  settled: ["settle_confirmed", "settle_confirmed", "settle_confirmed"],
  big: ["accepted", true, true, true, true],
  read: "200000:7",
  created: true,
  entry: "v1",
};

Deno.test("a Deno Worker reaches the broker, payload store and ledger over a transferred MessagePort", async () => {
  const { broker } = await provisioned(undefined);
  const largeBodies = watchLargeBodies(broker);
  const source = `${clientModule()}
import { EmbeddedConnection as Connect } from ${JSON.stringify(new URL("src/embedded/rpc.ts", REPO).href)};
self.onmessage = async (event) => {
  const report = await exercise(await Connect.connect(event.data, { label: "worker" }));
  self.postMessage(report);
};`;
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  const worker = new Worker(url, { type: "module" });
  try {
    const report = new Promise<Record<string, unknown>>((resolve, reject) => {
      worker.onmessage = (event) => resolve(event.data);
      worker.onerror = (event) => {
        event.preventDefault();
        reject(new Error(event.message));
      };
    });
    const port = broker.openPort("detect-0");
    worker.postMessage(port, [port]);
    const { transport, detached, ...rest } = await report;
    assert.equal(transport, "port");
    assert.equal(detached, true, "the frame moved to the store instead of being copied");
    assert.deepEqual(rest, EXPECTED_REPORT);
    assert.deepEqual(
      keptPlain(largeBodies),
      [{ plain: true, kept: true }],
      "the worker's large body reached the broker as an ordinary array of its own (moved, never shared), kept as it arrived",
    );
    assert.equal(broker.payload.objectCount(), 1);
  } finally {
    worker.terminate();
    URL.revokeObjectURL(url);
    await broker.close();
  }
});

Deno.test("a deno run subprocess with only the broker's env and loopback net reaches the services over TCP", async () => {
  const { broker } = await provisioned(undefined);
  const largeBodies = watchLargeBodies(broker);
  await broker.listen();
  const env = broker.workerEnv();
  assert.match(env[EMBEDDED_BROKER_ENV], /^tcp:\/\/127\.0\.0\.1:\d+$/);
  assert.equal(env[EMBEDDED_BROKER_SECRET_ENV], broker.secret);
  const source = `${clientModule()}
console.log(JSON.stringify(await exercise(await EmbeddedConnection.fromEnv(undefined, "subprocess"))));`;
  try {
    const output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        `--allow-env=${EMBEDDED_BROKER_ENV},${EMBEDDED_BROKER_SECRET_ENV}`,
        "--allow-net=127.0.0.1",
        `--allow-read=${REPO.pathname}`,
        "--config",
        new URL("deno.json", REPO).pathname,
        `data:text/javascript;base64,${btoa(source)}`,
      ],
      cwd: REPO.pathname,
      env,
      stdin: "null",
    }).output();
    const stderr = new TextDecoder().decode(output.stderr);
    assert.equal(output.code, 0, stderr);
    const { transport, detached, ...rest } = JSON.parse(new TextDecoder().decode(output.stdout));
    assert.equal(transport, "tcp");
    assert.equal(detached, false, "a socket copies: the caller keeps its bytes");
    assert.deepEqual(rest, EXPECTED_REPORT);
    assert.deepEqual(
      keptPlain(largeBodies),
      [{ plain: true, kept: true }],
      "the socket's copy is an ordinary array, kept as it arrived",
    );
  } finally {
    await broker.close();
  }
});

Deno.test("a TCP client with a wrong secret is refused, and one that never says hello is dropped", async () => {
  const broker = new EmbeddedBroker({ helloTimeoutSeconds: 0.05 });
  try {
    const address = await broker.listen();
    await assert.rejects(EmbeddedConnection.connect(address, { secret: "guess" }), (error: unknown) => {
      assert.ok(error instanceof BrokerUnavailable);
      assert.match(error.message, /wrong secret/);
      return true;
    });
    const silent = await Deno.connect({ hostname: "127.0.0.1", port: Number(address.split(":")[2]) });
    const buffer = new Uint8Array(256);
    while (await silent.read(buffer) !== null) {
      // The server says why (a bye frame), then closes: read until the end of the stream.
    }
    silent.close();
    assert.equal(broker.connections().length, 0);
    const good = await EmbeddedConnection.connect(address, { secret: broker.secret });
    assert.equal(broker.connections().length, 1);
    await good.close();
  } finally {
    await broker.close();
  }
});

Deno.test("a waiting receive holds back none of the calls made after it on the same connection", async () => {
  const { broker, clock } = await provisioned();
  const { connection, messaging } = await client(broker, "w", clock);
  try {
    const waiting = messaging.receive(detect.id, 8, BIG, clock.monotonic() + 60);
    const observed = await messaging.observeChannel(spec.id);
    assert.equal(observed.kind, "known", "answered while the receive waits");
    const published = await messaging.publish(makeEnvelope(spec.id, "p1"), clock.monotonic() + 5);
    assert.equal(published.kind, "accepted");
    assert.deepEqual((await waiting).map((d) => d.token.messageId), ["p1"], "and the publish woke it");
  } finally {
    await connection.close();
    await broker.close();
  }
});

Deno.test("publish credit is held per connection: another's counts as occupied, its own as free, and a connection that ends gives its credit back", async () => {
  const clock = new FakeClock();
  const broker = new EmbeddedBroker({ clock, messaging: new MemoryMessagingBackend({ clock }) });
  const small = makeChannel("flow-A", "run-1", "cam", "reliable_work", "interest", {
    required: [subscriptionId(CAM, "det")],
    maxMsgs: 3,
    overflow: Overflow.reject,
  });
  await broker.messaging.ensureChannel(small, "ensure-cam");
  await broker.messaging.ensureSubscription(detect, "bind-det");
  const a = await client(broker, "a", clock);
  const b = await client(broker, "b", clock);
  try {
    const request = creditRequest(8, 1024, 1);
    const held = await a.messaging.reserveCredit(small.id, request, clock.monotonic());
    assert.deepEqual(held.kind === "known" && held.value, { items: 3, bytes: null }, "a holds all three");
    const refused = await b.messaging.publish(makeEnvelope(small.id, "b-1"), clock.monotonic() + 5);
    assert.ok(refused.kind === "rejected" && refused.retryable, "a's credit is no room for b");
    const waiting = b.messaging.reserveCredit(small.id, request, clock.monotonic() + 30);
    const batch = await a.messaging.publishBatch(
      [makeEnvelope(small.id, "a-1"), makeEnvelope(small.id, "a-2")],
      clock.monotonic() + 5,
    );
    assert.deepEqual(batch.map((o) => o.kind), ["accepted", "accepted"], "within a's own credit");
    await a.connection.close();
    const granted = await Promise.race([
      waiting,
      new Promise<null>((resolve) => setTimeout(() => resolve(null), 5000)),
    ]);
    assert.ok(granted !== null, "b's request was granted once a's connection ended");
    assert.deepEqual(
      granted.kind === "known" && granted.value,
      { items: 1, bytes: null },
      "a's unused credit came back when its connection ended",
    );
    assert.equal(
      (await b.messaging.publish(makeEnvelope(small.id, "b-1"), clock.monotonic() + 5)).kind,
      "accepted",
    );
  } finally {
    await b.connection.close();
    await broker.close();
  }
});

Deno.test("the calls of one frame start in order and their results come back together", async () => {
  const { broker } = await provisioned();
  const link = portLink(broker.openPort("raw"));
  const frames: unknown[][] = [];
  const arrived = Promise.withResolvers<void>();
  link.start((frame) => {
    frames.push(frame);
    if (frame[0] === Frame.results) arrived.resolve();
  }, () => {});
  link.send([Frame.hello, 1, null, "raw"], []);
  const calls: unknown[] = [Frame.calls, new Uint8Array([120]), Op.defineChannel, 0, [0, spec.id]];
  for (let i = 1; i <= 5; i++) calls.push(Op.publish, i, [0, `p${i}`, 0 * 8192 + 1, 1, 4, 0, 2e9]);
  link.send(calls, []);
  await arrived.promise;
  const results = frames.filter((frame) => frame[0] === Frame.results);
  assert.equal(results.length, 1, "one frame of results for one frame of calls");
  assert.deepEqual(
    results[0].slice(2),
    [1, 1, 1, 2, 1, 2, 3, 1, 3, 4, 1, 4, 5, 1, 5],
    "sequences in call order",
  );
  await link.close();
  await broker.close();
});

Deno.test("a server-side exception is its own call's error, as its class; the rest of the frame succeeds", async () => {
  const { broker, clock } = await provisioned();
  const { connection, messaging } = await client(broker, "w", clock);
  try {
    const ghost = makeSubscription(
      makeChannel("flow-A", "run-1", "ghost", "reliable_work", "interest").id,
      "x",
    );
    const [missing, changed, published] = await Promise.allSettled([
      messaging.ensureSubscription(ghost, "bind-ghost"),
      messaging.ensureSubscription({ ...detect, competing: false }, "rebind"),
      messaging.publish(makeEnvelope(spec.id, "p1"), clock.monotonic() + 5),
    ]);
    assert.ok(missing.status === "rejected" && missing.reason instanceof ResourceUnavailable);
    assert.ok(changed.status === "rejected" && changed.reason instanceof IncompatibleProfile);
    assert.ok(published.status === "fulfilled" && published.value.kind === "accepted");
    await assert.rejects(
      messaging.settle(
        (await messaging.receive(detect.id, 1, BIG, clock.monotonic()))[0].token,
        completed(),
        "",
      ),
      ConfigError,
      "a settlement id is required before anything is sent",
    );
  } finally {
    await connection.close();
    await broker.close();
  }
});

Deno.test("a disconnected worker's waiting calls end truthfully, and what it held goes back at once for a redelivery, never acked", async () => {
  const { broker, clock } = await provisioned();
  const { connection, messaging } = await client(broker, "dying", clock);
  for (const id of ["p0", "p1"]) await messaging.publish(makeEnvelope(spec.id, id), clock.monotonic() + 5);
  const [settledLate, held] = await messaging.receive(detect.id, 2, BIG, clock.monotonic());
  assert.equal(held.token.messageId, "p1");
  broker.messaging.pauseAcceptance(spec.id);
  using schedule = new FaultSchedule({ [Barrier.messageSettleBefore]: pause("hold") }).install();
  const settling = messaging.settle(settledLate.token, completed(), "s-0");
  const publishing = messaging.publish(makeEnvelope(spec.id, "p2"), clock.monotonic() + 30);
  const waiting = messaging.receive(detect.id, 8, BIG, clock.monotonic() + 30);
  await schedule.untilFired(Barrier.messageSettleBefore);
  await broker.connections()[0].disconnect();

  assert.equal((await settling).kind, "settle_unknown", "sent, unanswered: it may still apply");
  assert.equal((await publishing).kind, "publication_unknown", "sent, unanswered: it may be stored");
  await assert.rejects(waiting, BrokerUnavailable);
  const observed = await messaging.observeSubscription(detect.id);
  assert.ok(observed.kind === "unknown" && observed.reason === "unreachable", "never zero for unknown");
  await assert.rejects(
    messaging.publish(makeEnvelope(spec.id, "p3"), clock.monotonic() + 5),
    BrokerUnavailable,
    "nothing is sent once the connection is gone",
  );
  await connection.close();
  schedule.release("hold");
  schedule.assertAllFired();
  schedule.uninstall();
  broker.messaging.resumeAcceptance(spec.id);

  await eventually(async () => {
    const counts = await broker.messaging.observeSubscription(detect.id);
    return counts.kind === "known" && counts.value.leased === 0 && counts.value.available === 2;
  }, "p0's late settle applied, p1 released by the dead worker's end, p2 stored and handed back");
  const fresh = await client(broker, "replacement", clock);
  try {
    const redelivered = await fresh.messaging.receive(detect.id, 8, BIG, clock.monotonic());
    assert.deepEqual(
      redelivered.map((d) => `${d.token.messageId}#${d.token.attempt}`).sort(),
      ["p1#2", "p2#2"],
      "p1 came back when its worker's connection ended, not after its lease; p2, taken by the dead " +
        "worker's still-waiting receive, was handed back",
    );
  } finally {
    await fresh.connection.close();
    await broker.close();
  }
});

Deno.test("a receive that completes after its connection ended is handed back at once, never lost", async () => {
  const { broker, clock } = await provisioned();
  const gone = await client(broker, "gone", clock);
  const waiting = gone.messaging.receive(detect.id, 8, BIG, clock.monotonic() + 60);
  await processed(gone.connection);
  await broker.connections()[0].disconnect();
  await assert.rejects(waiting, BrokerUnavailable);
  await gone.connection.close();
  await broker.messaging.publish(makeEnvelope(spec.id, "p1"), clock.monotonic() + 5);
  await eventually(async () => {
    const counts = await broker.messaging.observeSubscription(detect.id);
    return counts.kind === "known" && counts.value.available === 1;
  }, "the hand-back");
  const next = await client(broker, "next", clock);
  try {
    const [delivery] = await next.messaging.receive(detect.id, 8, BIG, clock.monotonic());
    assert.equal(delivery?.token.messageId, "p1", "available again without waiting for an ack wait");
    assert.equal(delivery.token.attempt, 2, "the handed-back lease cost one attempt");
  } finally {
    await next.connection.close();
    await broker.close();
  }
});

Deno.test("a client's shutdown empties its waiting receive and hands back what the broker leases after", async () => {
  const { broker, clock } = await provisioned();
  const { connection, messaging } = await client(broker, "w", clock);
  try {
    const waiting = messaging.receive(detect.id, 8, BIG, clock.monotonic() + 60);
    await processed(connection);
    await messaging.shutdown();
    assert.deepEqual(await waiting, []);
    await assert.rejects(messaging.receive(detect.id, 8, BIG, clock.monotonic()), ResourceUnavailable);
    await processed(connection);
    await broker.messaging.publish(makeEnvelope(spec.id, "p1"), clock.monotonic() + 5);
    await eventually(async () => {
      const counts = await broker.messaging.observeSubscription(detect.id);
      return counts.kind === "known" && counts.value.available === 1;
    }, "the hand-back");
    const [delivery] = await broker.messaging.receive(detect.id, 8, BIG, clock.monotonic());
    assert.equal(delivery?.token.messageId, "p1", "handed back, not held by the shut-down client");
    assert.equal(delivery.token.attempt, 2);
  } finally {
    await connection.close();
    await broker.close();
  }
});

Deno.test("the flow-wide stop reaches a subscribed worker, and one that subscribes later at once", async () => {
  const { broker, clock } = await provisioned();
  const first = await client(broker, "a", clock);
  try {
    const stopped = Promise.withResolvers<string>();
    first.messaging.subscribeControl(() => stopped.resolve("first"));
    await processed(first.connection);
    assert.equal(broker.messaging.commitControl(spec.id, CONTROL_STOP_KEY, null, new Uint8Array([1])), true);
    assert.equal(await stopped.promise, "first");
    const late = Promise.withResolvers<string>();
    first.messaging.subscribeControl(() => late.resolve("late"));
    assert.equal(await late.promise, "late");
  } finally {
    await first.connection.close();
    await broker.close();
  }
});

Deno.test("a large body published over a port is kept by the broker as the copy that arrived, and each receiver gets a copy of its own: writing to it changes neither the retained body, nor a redelivery, nor another subscriber's bytes", async () => {
  const { broker, clock } = await provisioned();
  const largeBodies = watchLargeBodies(broker);
  const recording = subscriptionId(CAM, "rec");
  await broker.messaging.ensureSubscription(makeSubscription(spec.id, "rec"), "bind-rec");
  const publisher = await client(broker, "publisher", clock);
  const detector = await client(broker, "detector", clock);
  const recorder = await client(broker, "recorder", clock);
  try {
    const expected = frameBytes(3);
    const frame = frameBytes(3);
    const outcome = await publisher.messaging.publish(
      makeEnvelope(spec.id, "frame-1", { body: frame }),
      clock.monotonic() + 5,
    );
    assert.equal(outcome.kind, "accepted");
    assert.equal(frame.buffer.detached, false, "the caller's array is never moved");
    const [retained] = broker.messaging.stored(CAM);
    assert.equal(largeBodies.length, 1);
    assert.ok(
      largeBodies[0].kept && retained.body === largeBodies[0].arrived,
      "the broker keeps the copy that arrived: no copy on its thread",
    );
    assert.ok(ownPlain(retained.body), "an ordinary array of its own, never shared memory");
    assert.ok(
      retained.body !== frame && retained.body.buffer !== frame.buffer && sameBytes(retained.body, expected),
      "a copy of the caller's bytes",
    );
    frame.fill(1);
    assert.ok(sameBytes(retained.body, expected), "the caller reusing its array changes nothing retained");

    const [first] = await detector.messaging.receive(detect.id, 1, BIG, clock.monotonic());
    assert.ok(sameBytes(first.envelopeBytes, expected), "the delivered bytes are the published ones");
    assert.ok(
      ownPlain(first.envelopeBytes) && first.envelopeBytes.buffer !== retained.body.buffer,
      "the receiver's bytes are a copy of its own",
    );
    first.envelopeBytes.fill(0);
    assert.ok(
      sameBytes(retained.body, expected),
      "a receiver writing to its bytes leaves the broker's body alone (and it was not moved away)",
    );
    const [other] = await recorder.messaging.receive(recording, 1, BIG, clock.monotonic());
    assert.ok(sameBytes(other.envelopeBytes, expected), "another subscriber gets the published bytes");
    assert.ok(ownPlain(other.envelopeBytes) && other.envelopeBytes.buffer !== retained.body.buffer);
    other.envelopeBytes.fill(2);
    assert.equal(
      (await detector.messaging.settle(first.token, retry(), "again")).kind,
      "settle_confirmed",
    );
    const [again] = await detector.messaging.receive(detect.id, 1, BIG, clock.monotonic());
    assert.equal(again.token.attempt, 2);
    assert.ok(sameBytes(again.envelopeBytes, expected), "the redelivery carries the published bytes");
    assert.ok(again.envelopeBytes.buffer !== first.envelopeBytes.buffer, "as a fresh copy");
    assert.equal(broker.messaging.stored(CAM)[0].body, retained.body, "the broker still holds the same body");
  } finally {
    await Promise.all([publisher, detector, recorder].map(({ connection }) => connection.close()));
    await broker.close();
  }
});

Deno.test("over TCP large bodies cross as copies both ways, byte for byte, whether a port or a TCP client published them", async () => {
  const { broker, clock } = await provisioned();
  const largeBodies = watchLargeBodies(broker);
  const address = await broker.listen();
  const tcp = await EmbeddedConnection.connect(address, { secret: broker.secret, label: "tcp" });
  const overTcp = new EmbeddedMessagingBackend(tcp, { clock });
  const overPort = await client(broker, "port", clock);
  try {
    const fromPort = frameBytes(11);
    const fromTcp = frameBytes(12);
    await overPort.messaging.publish(
      makeEnvelope(spec.id, "from-port", { body: fromPort }),
      clock.monotonic() + 5,
    );
    await overTcp.publish(makeEnvelope(spec.id, "from-tcp", { body: fromTcp }), clock.monotonic() + 5);
    const stored = broker.messaging.stored(CAM);
    assert.deepEqual(
      keptPlain(largeBodies),
      [{ plain: true, kept: true }, { plain: true, kept: true }],
      "moved from the port, copied by the socket: either way an ordinary array, kept as it arrived",
    );
    assert.ok(
      stored[0].body !== fromPort && sameBytes(stored[0].body, fromPort),
      "a copy of the port's body",
    );
    assert.ok(sameBytes(stored[1].body, fromTcp));
    const received = await overTcp.receive(detect.id, 8, BIG, clock.monotonic());
    assert.deepEqual(received.map((d) => d.token.messageId), ["from-port", "from-tcp"]);
    assert.ok(
      sameBytes(received[0].envelopeBytes, fromPort) && sameBytes(received[1].envelopeBytes, fromTcp),
    );
    assert.ok(received.every((d) => ownPlain(d.envelopeBytes)), "a socket delivers plain copies");
    for (const delivery of received) {
      delivery.envelopeBytes.fill(0);
      await overTcp.settle(delivery.token, retry(), `back-${delivery.token.messageId}`);
    }
    const again = await overPort.messaging.receive(detect.id, 8, BIG, clock.monotonic());
    assert.ok(
      sameBytes(again[0].envelopeBytes, fromPort) && sameBytes(again[1].envelopeBytes, fromTcp),
      "the TCP receiver's writes reached neither the broker nor the port receiver's redelivery",
    );
  } finally {
    await tcp.close();
    await overPort.connection.close();
    await broker.close();
  }
});

Deno.test("a transferable body too large to pack moves to the broker uncopied; a refused one comes back, moved, and the retry of the same envelope sends it; after a lost connection it is never sent empty; over TCP it stays the caller's", async () => {
  const clock = new FakeClock();
  const broker = new EmbeddedBroker({ clock, messaging: new MemoryMessagingBackend({ clock }) });
  const oneAtATime = makeChannel("flow-A", "run-1", "cam", "reliable_work", "interest", {
    required: [subscriptionId(CAM, "det")],
    maxMsgs: 1,
    overflow: Overflow.reject,
  });
  await broker.messaging.ensureChannel(oneAtATime, "ensure-cam");
  await broker.messaging.ensureSubscription(detect, "bind-det");
  const largeBodies = watchLargeBodies(broker);
  const publisher = await client(broker, "publisher", clock);
  const detector = await client(broker, "detector", clock);
  const address = await broker.listen();
  const tcp = await EmbeddedConnection.connect(address, { secret: broker.secret, label: "tcp" });
  const overTcp = new EmbeddedMessagingBackend(tcp, { clock });
  const transferable = (id: string, body: Uint8Array) =>
    makeEnvelope(CAM, id, { body, bodyTransferable: true });
  try {
    const first = transferable("frame-1", frameBytes(21));
    const firstBuffer = first.body.buffer as ArrayBuffer;
    assert.equal((await publisher.messaging.publish(first, clock.monotonic() + 5)).kind, "accepted");
    assert.equal(detached(first.body), true, "the body's buffer was moved to the broker");
    assert.ok(firstBuffer.detached);
    assert.deepEqual(keptPlain(largeBodies), [{ plain: true, kept: true }], "kept as it arrived");
    assert.ok(sameBytes(broker.messaging.stored(CAM)[0].body, frameBytes(21)));

    const second = transferable("frame-2", frameBytes(22));
    const refused = await publisher.messaging.publish(second, clock.monotonic() + 5);
    assert.equal(refused.kind, "rejected", "the channel holds one message");
    assert.ok(refused.kind === "rejected" && refused.retryable);
    assert.equal(detached(second.body), true, "the refused body went to the broker too");
    assert.equal(largeBodies.length, 2);
    assert.equal(
      detached(largeBodies[1].arrived),
      true,
      "a rejected publication was not stored: the body that came went back as it was, not copied",
    );
    const [delivered] = await detector.messaging.receive(detect.id, 1, BIG, clock.monotonic());
    assert.ok(sameBytes(delivered.envelopeBytes, frameBytes(21)));
    assert.equal(
      (await detector.messaging.settle(delivered.token, completed(), "done-1")).kind,
      "settle_confirmed",
    );
    assert.equal(
      (await publisher.messaging.publish(second, clock.monotonic() + 5)).kind,
      "accepted",
      "the retry sends the copy the broker handed back",
    );
    const [retried] = await detector.messaging.receive(detect.id, 1, BIG, clock.monotonic());
    assert.equal(retried.token.messageId, "frame-2");
    assert.ok(sameBytes(retried.envelopeBytes, frameBytes(22)), "byte for byte the refused body");
    await assert.rejects(
      publisher.messaging.observePublication(second),
      ConfigError,
      "once taken, its body is the broker's: sending it again is refused, never sent empty",
    );

    const plain = makeEnvelope(CAM, "frame-plain", { body: frameBytes(23) });
    await publisher.messaging.publish(plain, clock.monotonic() + 5);
    assert.equal(detached(plain.body), false, "a body not marked transferable is copied, as before");
    assert.ok(sameBytes(plain.body, frameBytes(23)));

    const overSocket = transferable("frame-tcp", frameBytes(24));
    await overTcp.publish(overSocket, clock.monotonic() + 5);
    assert.equal(detached(overSocket.body), false, "a socket writes the body; it stays the caller's");
    assert.ok(sameBytes(overSocket.body, frameBytes(24)));

    const lost = transferable("frame-lost", frameBytes(25));
    const sending = publisher.messaging.publish(lost, clock.monotonic() + 5);
    await publisher.connection.close();
    assert.equal(
      (await sending).kind,
      "publication_unknown",
      "closing flushed the publish; its answer was lost with the connection",
    );
    assert.equal(detached(lost.body), true);
    await assert.rejects(
      publisher.messaging.publish(lost, clock.monotonic() + 5),
      BrokerUnavailable,
      "its body went with the connection: the retry fails as the connection does, never sends nothing",
    );
  } finally {
    await Promise.all(
      [publisher.connection, detector.connection, tcp].map((connection) => connection.close()),
    );
    await broker.close();
  }
});

Deno.test("a moved body whose publication the broker may still store comes back as a copy: the broker's own stays whole and is stored later", async () => {
  const { broker, clock } = await provisioned();
  const largeBodies = watchLargeBodies(broker);
  const publisher = await client(broker, "publisher", clock);
  try {
    broker.messaging.pauseAcceptance(spec.id);
    const held = makeEnvelope(spec.id, "frame-held", { body: frameBytes(31), bodyTransferable: true });
    const publishing = publisher.messaging.publish(held, clock.monotonic() + 1);
    await eventually(() => Promise.resolve(largeBodies.length > 0), "the broker holding the publication");
    await clock.advanceAsync(2);
    const outcome = await publishing;
    assert.equal(outcome.kind, "publication_unknown", "its deadline passed while acceptance was paused");
    assert.equal(detached(largeBodies[0].arrived), false, "the broker keeps the body it may yet store");
    broker.messaging.resumeAcceptance(spec.id);
    const [stored] = broker.messaging.stored(CAM);
    assert.ok(stored.body === largeBodies[0].arrived && sameBytes(stored.body, frameBytes(31)));
    const observed = await publisher.messaging.observePublication(held);
    assert.ok(
      observed.kind === "accepted" && observed.duplicate,
      "the caller observes it with the copy handed back",
    );
  } finally {
    await publisher.connection.close();
    await broker.close();
  }
});

Deno.test("admission runs in the client: refused deliveries are acked and reported, kept ones returned", async () => {
  const { broker, clock } = await provisioned();
  const { connection, messaging } = await client(broker, "replica-1", clock);
  try {
    for (const id of ["own-1", "other-1", "own-2"]) {
      await messaging.publish(makeEnvelope(spec.id, id), clock.monotonic() + 5);
    }
    const skipped: string[] = [];
    const allSkipped = Promise.withResolvers<void>();
    assert.equal(
      messaging.setAdmission(detect.id, (d) => d.token.messageId.startsWith("own"), (d) => {
        skipped.push(d.token.messageId);
        allSkipped.resolve();
      }),
      true,
    );
    const kept = await messaging.receive(detect.id, 8, BIG, clock.monotonic());
    assert.deepEqual(kept.map((d: Delivery) => d.token.messageId), ["own-1", "own-2"]);
    await allSkipped.promise;
    assert.deepEqual(skipped, ["other-1"]);
    for (let i = 0; i < 50; i++) {
      const observed = await messaging.observeSubscription(detect.id);
      if (observed.kind === "known" && observed.value.leased === 2) break;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    const observed = await messaging.observeSubscription(detect.id);
    assert.ok(observed.kind === "known" && observed.value.leased === 2, "the refused one was settled");
    assert.equal(messaging.prefetched(detect.id), 0);
  } finally {
    await connection.close();
    await broker.close();
  }
});

Deno.test("supersede retires a token here and at the broker; a token from elsewhere is not live here", async () => {
  const { broker, clock } = await provisioned();
  const { connection, messaging } = await client(broker, "w", clock);
  try {
    await messaging.publish(makeEnvelope(spec.id, "p1"), clock.monotonic() + 5);
    const [delivery] = await messaging.receive(detect.id, 1, BIG, clock.monotonic());
    assert.equal(
      messaging.supersede({ ...delivery.token }),
      false,
      "a copy is not one of this client's tokens",
    );
    assert.equal(messaging.supersede(delivery.token), true);
    assert.equal(messaging.supersede(delivery.token), false);
    assert.equal((await messaging.settle(delivery.token, completed(), "s-1")).kind, "settle_stale");
    const plain = await messaging.settle({ ...delivery.token }, completed(), "s-2");
    assert.equal(plain.kind, "settle_stale", "the broker was told too");
  } finally {
    await connection.close();
    await broker.close();
  }
});

Deno.test("closing the broker ends every connection: later calls fail, observations are Unknown", async () => {
  const { broker, clock } = await provisioned();
  const a = await client(broker, "a", clock);
  const b = await client(broker, "b", clock);
  const waiting = a.messaging.receive(detect.id, 8, BIG, clock.monotonic() + 60);
  await processed(a.connection);
  await broker.close();
  await assert.rejects(waiting, BrokerUnavailable);
  assert.equal(broker.connections().length, 0);
  for (const side of [a, b]) {
    await eventually(() => Promise.resolve(side.connection.lostReason !== null), "the bye");
    assert.ok(side.connection.lostReason instanceof BrokerUnavailable, "each client was told");
    assert.equal((await side.messaging.observeChannel(spec.id)).kind, "unknown");
    await assert.rejects(side.messaging.capabilities(), BrokerUnavailable);
    await side.connection.close();
  }
  assert.throws(() => broker.openPort("late"), ResourceUnavailable);
});

Deno.test("a large payload put over a port reaches the store as an ordinary array of its own, which it keeps uncopied, the caller keeping its bytes; a transferred put moves; each read is a distinct copy whose writes never reach the store", async () => {
  const { broker, clock } = await provisioned();
  const arrived: Uint8Array[] = [];
  const putOwned = broker.payload.putOwned.bind(broker.payload);
  broker.payload.putOwned = (data, contentId, contract) => {
    arrived.push(data);
    return putOwned(data, contentId, contract);
  };
  const { connection } = await client(broker, "w", clock);
  try {
    const frame = frameBytes(21);
    const copied = new EmbeddedPayloadStore(connection);
    const ref = await copied.put(frame, "cam:e1", CONTRACT);
    assert.equal(frame.buffer.detached, false, "the caller keeps its bytes");
    assert.equal(arrived.length, 1, "one put reached the store");
    assert.ok(
      ownPlain(arrived[0]) && arrived[0].buffer !== frame.buffer,
      "the store got a copy in an ordinary buffer of its own, never shared memory",
    );
    frame.fill(0);
    assert.ok(sameBytes(arrived[0], frameBytes(21)), "the caller reusing its array changes nothing stored");
    const moved = frameBytes(22);
    const mover = new EmbeddedPayloadStore(connection, { transferPuts: true });
    const movedRef = await mover.put(moved, "cam:e2", CONTRACT);
    assert.equal(moved.buffer.detached, true, "a transferred put moves its buffer instead");
    assert.equal(arrived.length, 2, "and the second");
    assert.ok(ownPlain(arrived[1]) && sameBytes(arrived[1], frameBytes(22)), "as the bytes that were moved");

    const read = await copied.read(ref);
    assert.ok(
      read.kind === "bytes" && sameBytes(read.data, frameBytes(21)),
      "the stored bytes are the put ones",
    );
    assert.ok(
      ownPlain(read.data) && read.data.buffer !== arrived[0].buffer,
      "a read's bytes are the reader's own copy",
    );
    const direct = await broker.payload.read(ref);
    assert.ok(direct.kind === "bytes" && direct.data !== arrived[0], "the store itself hands out a copy");
    read.data.fill(0);
    assert.ok(sameBytes(arrived[0], frameBytes(21)), "a reader's writes never reach the kept bytes");
    const again = await copied.read(ref);
    assert.ok(
      again.kind === "bytes" && sameBytes(again.data, frameBytes(21)) &&
        again.data.buffer !== read.data.buffer,
      "each read is a distinct copy of the stored bytes",
    );
    const readMoved = await copied.read(movedRef);
    assert.ok(readMoved.kind === "bytes" && sameBytes(readMoved.data, frameBytes(22)));
    assert.ok(ownPlain(readMoved.data) && readMoved.data.buffer !== arrived[1].buffer);

    for (const [index, kept] of [ref, movedRef].entries()) {
      arrived[index][0] ^= 0xff;
      assert.equal(
        (await copied.read(kept)).kind,
        "corrupt",
        `put ${index + 1}: the array that arrived is the stored one, uncopied (a write to it shows)`,
      );
    }
  } finally {
    await connection.close();
    await broker.close();
  }
});

Deno.test("a payload put refuses a detached array instead of storing an empty payload", async () => {
  const broker = new EmbeddedBroker();
  const connection = await EmbeddedConnection.connect(broker.openPort("w"));
  try {
    const store = new EmbeddedPayloadStore(connection, { transferPuts: true });
    const data = new Uint8Array([1, 2, 3]);
    const ref = await store.put(data, "cam:e1", CONTRACT);
    assert.equal(data.buffer.detached, true);
    await assert.rejects(store.put(data, "cam:e1", CONTRACT), ConfigError);
    const view = new Uint8Array(new ArrayBuffer(16), 4, 3).fill(9);
    await store.put(view, "cam:e2", CONTRACT);
    assert.equal(view.buffer.detached, false, "a view into a larger buffer is copied, never moved");
    const copying = new EmbeddedPayloadStore(connection);
    const kept = new Uint8Array([4, 5, 6]);
    await copying.put(kept, "cam:e3", CONTRACT);
    assert.deepEqual([...kept], [4, 5, 6], "without transferPuts the caller keeps its bytes");
    const read = await copying.read(ref);
    assert.ok(read.kind === "bytes" && read.data.join() === "1,2,3" && read.ref === ref);
  } finally {
    await connection.close();
    await broker.close();
  }
});

Deno.test("a Node Buffer, pooled or large, is put as a copy: the caller keeps its bytes and the frame's other calls go through", async () => {
  const { broker, clock } = await provisioned();
  const { connection, messaging } = await client(broker, "w", clock);
  try {
    const store = new EmbeddedPayloadStore(connection);
    const pooled = Buffer.from("a small buffer from the shared pool");
    const large = Buffer.alloc(PACK_LIMIT * 4, 7);
    const [published, pooledRef, largeRef] = await Promise.all([
      messaging.publish(makeEnvelope(spec.id, "f1"), clock.monotonic() + 5),
      store.put(pooled, "cam:pooled", CONTRACT),
      store.put(large, "cam:large", CONTRACT),
    ]);
    assert.equal(published.kind, "accepted", "a publish in the same frame is unaffected");
    assert.equal(pooled.toString(), "a small buffer from the shared pool", "the pooled buffer is intact");
    assert.equal(large.byteLength, PACK_LIMIT * 4, "the large buffer was not moved away");
    const [pooledRead, largeRead] = await Promise.all([store.read(pooledRef), store.read(largeRef)]);
    assert.ok(pooledRead.kind === "bytes" && sameBytes(pooledRead.data, pooled));
    assert.ok(largeRead.kind === "bytes" && sameBytes(largeRead.data, large));
    const body = Buffer.alloc(PACK_LIMIT * 2, 3);
    const outcome = await messaging.publish(makeEnvelope(spec.id, "f2", { body }), clock.monotonic() + 5);
    assert.equal(outcome.kind, "accepted");
    assert.equal(body.byteLength, PACK_LIMIT * 2, "a published Buffer stays the caller's");
  } finally {
    await connection.close();
    await broker.close();
  }
});

Deno.test("a payload put takes its bytes when it is called: the caller reusing its array at once changes nothing stored", async () => {
  const { broker, clock } = await provisioned();
  const { connection } = await client(broker, "w", clock);
  try {
    const store = new EmbeddedPayloadStore(connection);
    for (const [name, size] of [["small", 64], ["large", PACK_LIMIT * 4]] as const) {
      const data = new Uint8Array(size).fill(7);
      const putting = store.put(data, `cam:${name}`, CONTRACT);
      data.fill(0);
      const read = await store.read(await putting);
      assert.ok(
        read.kind === "bytes" && read.data.every((byte) => byte === 7),
        `${name}: the bytes as they were`,
      );
    }
  } finally {
    await connection.close();
    await broker.close();
  }
});

Deno.test("a ledger handle's close ends only that handle; a broker without a ledger refuses ledger calls", async () => {
  const { broker } = await provisioned();
  const one = await EmbeddedConnection.connect(broker.openPort("one"));
  const two = await EmbeddedConnection.connect(broker.openPort("two"));
  try {
    const first = new EmbeddedRuntimeStore(one);
    const second = new EmbeddedRuntimeStore(two);
    const writing = first.append("log", new Uint8Array([1]));
    await first.close();
    assert.equal(await writing, 1, "a call in flight finishes before close resolves");
    await assert.rejects(first.get("k"), ResourceUnavailable);
    assert.deepEqual((await second.logEntries("log")).map((r) => [...r]), [[1]]);
    await assert.rejects(second.get(""), ConfigError, "names are checked before anything is sent");
    assert.equal((await second.capabilities()).store, "memory", "the hosted store's own capabilities");
  } finally {
    await one.close();
    await two.close();
    await broker.close();
  }
  const bare = new EmbeddedBroker();
  const connection = await EmbeddedConnection.connect(bare.openPort("w"));
  await assert.rejects(new EmbeddedRuntimeStore(connection).get("k"), ResourceUnavailable);
  await connection.close();
  await bare.close();
});

Deno.test("deadlines are read on the broker's clock: a past one answers at once, a future one waits for it", async () => {
  const { broker, clock } = await provisioned();
  const { connection, messaging } = await client(broker, "w", clock);
  try {
    assert.deepEqual(await messaging.receive(detect.id, 8, BIG, clock.monotonic() - 1), []);
    let done = false;
    const waiting = messaging.receive(detect.id, 8, BIG, clock.monotonic() + 30).then((d) => {
      done = true;
      return d;
    });
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(done, false, "the broker's clock has not reached the deadline");
    await clock.advanceAsync(31);
    assert.deepEqual(await waiting, []);
  } finally {
    await connection.close();
    await broker.close();
  }
});

Deno.test("a stored dead letter is answered only once the broker's onDeadLetter hook has kept it; a duplicate at once", async () => {
  const clock = new FakeClock();
  let keep = Promise.withResolvers<void>();
  let kept = 0;
  const broker = new EmbeddedBroker({
    clock,
    messaging: new MemoryMessagingBackend({ clock }),
    onDeadLetter: () => {
      kept++;
      return keep.promise;
    },
  });
  await broker.messaging.ensureChannel(spec, "ensure-cam");
  const { connection, messaging } = await client(broker, "dead-lettering", clock);
  try {
    const letter = makeEnvelope(spec.id, "dlq:f:r:cam:1", { kind: MessageKind.dlq });
    let answered = false;
    const publishing = messaging.publish(letter, clock.monotonic() + 5).then((outcome) => {
      answered = true;
      return outcome;
    });
    await eventually(() => Promise.resolve(kept === 1), "the hook was called for the stored letter");
    await processed(connection);
    assert.equal(answered, false, "not answered while the letter is being kept");
    keep.resolve();
    assert.equal((await publishing).kind, "accepted");
    keep = Promise.withResolvers<void>();
    const again = await messaging.publish(letter, clock.monotonic() + 5);
    assert.ok(again.kind === "accepted" && again.duplicate, "a duplicate stores nothing new");
    assert.equal(kept, 1);
  } finally {
    await connection.close();
    await broker.close();
  }
});
