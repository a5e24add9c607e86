import { DropReason } from "../../../src/core/metrics.ts";
import assert from "node:assert/strict";
import { systemClock } from "../../../src/backends/clock.ts";
import { MemoryRuntimeStore } from "../../../src/backends/memory/runtime_store.ts";
import type { MemoryMessagingBackend } from "../../../src/backends/memory/messaging.ts";
import { CONTROL_STOP_KEY } from "../../../src/backends/memory/messaging.ts";
import { Barrier, FaultSchedule, raiseTyped } from "../../../src/backends/faults.ts";
import { channelId, type Envelope, envelope, MessageKind } from "../../../src/backends/messaging.ts";
import { known, type PublicationOutcome, rejected, requireKnown } from "../../../src/backends/outcomes.ts";
import {
  FlowRuntime,
  type OutboxDocument,
  OutboxOutcome,
  TerminatorKind,
} from "../../../src/backends/runtime.ts";
import {
  type RuntimeCapabilities,
  runtimeCapabilities,
  type RuntimeStore,
} from "../../../src/backends/runtime_store.ts";
import { CHECKPOINT_METADATA_KEY, PARTITION_KEY_METADATA_KEY } from "../../../src/core/context.ts";
import {
  BrokerUnavailable,
  CapabilityError,
  ConfigError,
  FlowStalled,
  PoisonMessage,
  TransientFailure,
} from "../../../src/core/errors.ts";
import { StopReason } from "../../../src/core/messenger.ts";
import {
  type BrokerMessenger,
  DeadLetterHeader,
  DEFAULT_IN_FLIGHT,
  RECEIVED_LINGER_SECONDS,
} from "../../../src/messaging/messenger.ts";
import { dataSubscriptionId } from "../../../src/messaging/topology.ts";
import { decodeEnvelope, decodePayload, ENVELOPE_VERSION } from "../../../src/wire/codec.ts";
import { messageId, partitionOwner } from "../../../src/wire/identities.ts";
import {
  answerPublications,
  consume,
  embeddedProvider,
  FLOW,
  type FlowOptions,
  memoryProvider,
  MessengerFlow,
  produce,
  RUN,
  settlesWithin,
} from "../../conformance/messenger/support.ts";

const PIPELINE: FlowOptions = {
  flowType: "batch",
  nodes: [{ name: "cam" }, { name: "det", parents: ["cam"] }, { name: "sink", parents: ["det"] }],
};

async function withFlow(options: FlowOptions, body: (flow: MessengerFlow) => Promise<void>): Promise<void> {
  const flow = await MessengerFlow.create(memoryProvider, options);
  try {
    await body(flow);
  } finally {
    await flow.dispose();
  }
}

function broker(flow: MessengerFlow): MemoryMessagingBackend {
  return flow.backend as MemoryMessagingBackend;
}

/** The data envelopes retained on `node`'s channel, decoded. */
function stored(flow: MessengerFlow, node: string): { readonly envelope: Envelope; readonly id: string }[] {
  return broker(flow).stored(channelId(FLOW, RUN, node))
    .filter((e) => e.kind === MessageKind.data)
    .map((e) => ({ envelope: e, id: e.publicationId }));
}

Deno.test("a pipeline of three messengers carries every value, trace and event time from producer to sink", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    const det = await flow.open("det");
    const sink = await flow.open("sink");
    cam.setOutputEventTimestamp(1_700_000_001.5);
    await produce(flow, cam, [1, 2, 3]);
    const relayed = await consume(flow, det, (group) => (group.cam?.message as number) * 10);
    assert.deepEqual(relayed.groups.map((g) => g.cam?.message), [1, 2, 3]);
    const detOut = stored(flow, "det").map(({ envelope }) => decodeEnvelope(envelope.body));
    assert.deepEqual(detOut.map((e) => [e.traceId, e.seq]), [["cam:1", 1], ["cam:2", 2], ["cam:3", 3]]);
    assert.deepEqual(
      stored(flow, "det").map(({ id }) => id),
      [1, 2, 3].map((n) => messageId(FLOW, RUN, "det", `cam:${n}`, n, "data")),
    );
    const seen = await consume(flow, sink);
    assert.deepEqual(seen.groups.map((g) => g.det?.message), [10, 20, 30]);
    assert.equal(seen.end.det?.isStopSignal, true);
    assert.deepEqual(seen.groups.map((g) => g.det?.eventTs), [1_700_000_001.5, null, null]);
    assert.equal(stored(flow, "det").length, 0, "interest retention frees what every reader settled");
    assert.deepEqual(cam.publicationStats, {
      accepted: 3,
      duplicate: 0,
      unknown: 0,
      dropped: 0,
      rejected: 0,
    });
  });
});

Deno.test("an output recomputed after a crash carries the same id and is deduplicated by the broker", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    await produce(flow, cam, ["a"], false);
    const first = await flow.open("det");
    const group = await flow.drive(first.receiveMessage());
    await flow.drive(first.publishMessage(`${group.cam?.message}!`));
    await first.close({ handBack: false });
    const replacement = await flow.open("det");
    const again = await flow.drive(replacement.receiveMessage());
    assert.equal(replacement.lastInputKey(), first.lastInputKey());
    await flow.drive(replacement.publishMessage(`${again.cam?.message}!`));
    await flow.drive(replacement.ackInputs());
    assert.equal(replacement.publicationStats.duplicate, 1);
    assert.equal(stored(flow, "det").length, 1);
  });
});

Deno.test("an output is reported accepted once, as new, and a group acked once, across a crash and its redo", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const events: string[] = [];
    const cam = await flow.open("cam");
    await flow.drive(cam.publishMessage(1, undefined, () => events.push("cam accepted 1")));
    await flow.drive(cam.awaitInFlight());
    assert.deepEqual(events, ["cam accepted 1"]);
    const first = await flow.open("det");
    await flow.drive(first.receiveMessage());
    await flow.drive(first.publishMessage("1!", undefined, () => events.push("first det accepted")));
    await flow.drive(first.awaitInFlight());
    await first.close({ handBack: false });
    const replacement = await flow.open("det");
    await flow.drive(replacement.receiveMessage());
    await flow.drive(replacement.publishMessage("1!", undefined, () => events.push("replacement accepted")));
    await flow.drive(replacement.ackInputs(() => events.push("replacement acked")));
    await flow.drive(replacement.awaitInFlight());
    assert.deepEqual(events, ["cam accepted 1", "first det accepted", "replacement acked"]);
    assert.equal(replacement.publicationStats.duplicate, 1, "the redone output was a duplicate");
  });
});

Deno.test("a trace join pairs the halves of each trace and carries the shared trace forward", async () => {
  await withFlow({
    flowType: "batch",
    nodes: [
      { name: "cam" },
      { name: "left", parents: ["cam"] },
      { name: "right", parents: ["cam"] },
      { name: "fuse", parents: ["left", "right"] },
      { name: "out", parents: ["fuse"] },
    ],
  }, async (flow) => {
    const cam = await flow.open("cam");
    const left = await flow.open("left");
    const right = await flow.open("right");
    const fuse = await flow.open("fuse");
    await produce(flow, cam, [1, 2, 3, 4]);
    await consume(flow, left, (g) => `L${g.cam?.message}`);
    await consume(flow, right, (g) => `R${g.cam?.message}`);
    const joined = await consume(flow, fuse, (g) => `${g.left?.message}+${g.right?.message}`);
    assert.deepEqual(joined.groups.map((g) => [g.left?.message, g.right?.message]), [
      ["L1", "R1"],
      ["L2", "R2"],
      ["L3", "R3"],
      ["L4", "R4"],
    ]);
    assert.deepEqual(
      stored(flow, "fuse").map(({ envelope }) => decodeEnvelope(envelope.body).traceId),
      ["cam:1", "cam:2", "cam:3", "cam:4"],
    );
    assert.equal(joined.end.left?.isStopSignal && joined.end.right?.isStopSignal, true);
  });
});

Deno.test("a parent's EOS ends the stream only once its subscription stayed quiet for the quiescence", async () => {
  await withFlow({
    flowType: "batch",
    nodes: [{ name: "cam" }, { name: "det", parents: ["cam"], nbTasks: 2 }],
  }, async (flow) => {
    const cam = await flow.open("cam");
    const r0 = await flow.open("det", 0, { prefetch: 0 });
    const r1 = await flow.open("det", 1, { prefetch: 0 });
    await produce(flow, cam, ["x", "y"]);
    const held = await flow.drive(r0.receiveMessage());
    const other = await flow.drive(r1.receiveMessage());
    assert.deepEqual(new Set([held.cam?.message, other.cam?.message]), new Set(["x", "y"]));
    await flow.drive(r1.ackInputs());
    const ending = r1.receiveMessage();
    await flow.drive(flow.clock.sleep(5));
    let ended = false;
    ending.then(() => ended = true);
    await flow.drive(flow.clock.sleep(0));
    assert.equal(ended, false, "an input still leased by a sibling keeps the parent open");
    await flow.drive(r0.ackInputs());
    const ackedAt = flow.clock.monotonic();
    const end = await flow.drive(ending);
    assert.equal(end.cam?.isStopSignal, true);
    assert.ok(flow.clock.monotonic() - ackedAt >= 0.5, "the quiescence elapsed after the last ack");
    assert.equal((await flow.drive(r0.receiveMessage())).cam?.isStopSignal, true);
  });
});

Deno.test("replicas of a partitioned node each process exactly the records their key hashes to", async () => {
  await withFlow({
    flowType: "batch",
    nodes: [{ name: "cam" }, { name: "det", parents: ["cam"], nbTasks: 3, partitionBy: "camera" }],
  }, async (flow) => {
    const cam = await flow.open("cam");
    const replicas = await Promise.all([0, 1, 2].map((i) => flow.open("det", i)));
    const keys = Array.from({ length: 30 }, (_, i) => `camera-${i}`);
    for (const key of keys) {
      await flow.drive(cam.publishMessage(key, { camera: key }));
    }
    await flow.drive(cam.publishStopSignal());
    const seen = await Promise.all(replicas.map((r) => consume(flow, r)));
    seen.forEach((result, replica) => {
      const mine = result.groups.map((g) => g.cam?.message);
      assert.deepEqual(mine, keys.filter((key) => partitionOwner(key, 3) === replica), `replica ${replica}`);
    });
    assert.equal(seen.reduce((n, r) => n + r.groups.length, 0), keys.length);
  });
});

Deno.test("the output's event time and partition key ride the wire; a checkpoint key never does", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    const cam = await flow.open("cam");
    const det = await flow.open("det");
    await produce(flow, cam, [7], false);
    await flow.drive(det.receiveMessage());
    det.setOutputEventTimestamp(1_700_000_002.25);
    det.setOutputPartitionKey("lane-3");
    await flow.drive(det.publishMessage(8, { [CHECKPOINT_METADATA_KEY]: new Uint8Array([1]) }));
    await flow.drive(det.ackInputs());
    const [{ envelope }] = stored(flow, "det");
    const wire = decodeEnvelope(envelope.body);
    assert.equal(wire.eventTs, 1_700_000_002.25);
    assert.deepEqual(Object.keys(wire.metadata), [PARTITION_KEY_METADATA_KEY]);
    assert.equal(wire.metadata[PARTITION_KEY_METADATA_KEY], "lane-3");
    assert.equal(envelope.partitionKey, "lane-3");
    assert.equal(decodePayload(wire.payloadType, wire.payload), 8);
  });
});

Deno.test("quiesce hands held join halves back at once, ends the loop and publishes no EOS", async () => {
  await withFlow({
    flowType: "batch",
    nodes: [{ name: "a" }, { name: "b" }, { name: "fuse", parents: ["a", "b"] }],
  }, async (flow) => {
    const a = await flow.open("a");
    const fuse = await flow.open("fuse");
    await produce(flow, a, [1, 2], false);
    const waiting = fuse.receiveMessage();
    await flow.drive(flow.clock.sleep(1));
    const aSub = dataSubscriptionId(channelId(FLOW, RUN, "a"), "fuse");
    const before = await broker(flow).observeSubscription(aSub);
    assert.equal(before.kind === "known" && before.value.leased, 2);
    await flow.drive(fuse.quiesce());
    const stop = await flow.drive(waiting);
    assert.equal(stop.a?.isStopSignal && stop.b?.isStopSignal, true);
    assert.equal(fuse.stopReason(), StopReason.quiesce);
    const after = await broker(flow).observeSubscription(aSub);
    assert.deepEqual(after.kind === "known" && [after.value.available, after.value.leased], [2, 0]);
    assert.equal(broker(flow).stored(channelId(FLOW, RUN, "fuse")).length, 0);
  });
});

Deno.test("the flow-wide stop is reported as control; a quiesce outranks it", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    assert.equal(cam.checkForTermination(), false);
    broker(flow).commitControl(channelId(FLOW, RUN, "cam"), CONTROL_STOP_KEY, null, new Uint8Array([1]));
    await flow.drive(flow.clock.sleep(0));
    assert.equal(cam.checkForTermination(), true);
    assert.equal(cam.stopReason(), StopReason.control);
    await flow.drive(cam.quiesce());
    assert.equal(cam.stopReason(), StopReason.quiesce);
  });
});

Deno.test("a realtime join evicts its oldest incomplete group beyond max_pending and reports the drop", async () => {
  await withFlow({
    flowType: "realtime",
    nodes: [
      { name: "a" },
      { name: "b" },
      {
        name: "fuse",
        parents: ["a", "b"],
        joinPolicy: { max_pending: 2, missing: "drop", timeout_seconds: 60 },
      },
    ],
  }, async (flow) => {
    const a = await flow.open("a", 0);
    const fuse = await flow.open("fuse");
    const waiting = fuse.receiveMessage();
    for (const value of [1, 2, 3]) {
      await flow.drive(a.publishMessage(value));
      await flow.drive(flow.clock.sleep(0.1));
    }
    await flow.drive(flow.clock.sleep(1));
    assert.deepEqual(fuse.takeDrops(), { join_evicted: 1 });
    assert.deepEqual(fuse.joinStatus(), {
      pending: 2,
      oldestWaitSeconds: fuse.joinStatus().oldestWaitSeconds,
      waitsForever: false,
    });
    await flow.drive(fuse.quiesce());
    await flow.drive(waiting);
  });
});

Deno.test("pending work is Unknown when a parent cannot be observed, never zero; a producer's is Known(0)", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    const det = await flow.open("det");
    await produce(flow, cam, [1, 2, 3], false);
    const counted = await flow.drive(det.pendingObservation());
    assert.equal(counted.kind === "known" && counted.value, 3);
    broker(flow).failObservation(dataSubscriptionId(channelId(FLOW, RUN, "cam"), "det"), "unreachable");
    const failed = await flow.drive(det.pendingObservation());
    assert.equal(failed.kind, "unknown");
    const producer = await flow.drive(cam.pendingObservation());
    assert.equal(producer.kind === "known" && producer.value, 0);
  });
});

Deno.test("a group held past the ack wait is kept alive and never redelivered", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    const det = await flow.open("det", 0, { ackWaitSeconds: 3 });
    await produce(flow, cam, ["slow"], false);
    await flow.drive(det.receiveMessage());
    const info = det.lastInputInfo();
    assert.deepEqual(info?.cam, { eventTs: null, metadata: {}, traceId: "cam:1", seq: 1 });
    await flow.drive(flow.clock.sleep(20));
    const sub = await broker(flow).observeSubscription(
      dataSubscriptionId(channelId(FLOW, RUN, "cam"), "det"),
    );
    assert.deepEqual(sub.kind === "known" && [sub.value.available, sub.value.leased], [0, 1]);
    await flow.drive(det.ackInputs());
  });
});

Deno.test("a transient failure is retried with backoff, then dead-lettered as exhausted after max_deliver", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    const det = await flow.open("det");
    await produce(flow, cam, ["flaky"], false);
    const retriedAt: number[] = [];
    for (let attempt = 1; attempt <= 4; attempt++) {
      await flow.drive(det.receiveMessage());
      retriedAt.push(flow.clock.monotonic());
      await flow.drive(det.failInputs(new TransientFailure("the model server timed out")));
    }
    assert.deepEqual(retriedAt.slice(1).map((t, i) => Math.round(t - retriedAt[i])), [2, 4, 8]);
    assert.deepEqual(det.takeDrops(), { [DropReason.exhausted]: 1 });
    const letters = broker(flow).stored(channelId(FLOW, RUN, "det")).filter((e) =>
      e.kind === MessageKind.dlq
    );
    assert.equal(letters.length, 1);
    assert.equal(letters[0].headers[DeadLetterHeader.numDelivered], "4");
    assert.match(letters[0].headers[DeadLetterHeader.error], /^VF_TRANSIENT: the model server timed out$/);
  });
});

Deno.test("a memory ledger keeps no received sets; a durable one notes each received batch in one write", async () => {
  for (const durableLedger of [false, true]) {
    await withFlow({ ...PIPELINE, durableLedger }, async (flow) => {
      const cam = await flow.open("cam");
      const det = await flow.open("det", 0, { prefetch: 8 });
      await produce(flow, cam, Array.from({ length: 8 }, (_, i) => i));
      await consume(flow, det, (g) => g.cam?.message);
      const records = await flow.store.scan(flow.runtime("det").key("received") + "/");
      if (!durableLedger) {
        assert.equal(records.length, 0);
        return;
      }
      assert.ok(
        records.length >= 1 && records.length < 8,
        `${records.length} received records for 8 messages`,
      );
      assert.equal(await flow.runtime("det").receivedCount("cam", "det--from--cam"), 8);
      assert.equal(await flow.runtime("cam").publishedCount(), 8);
    });
  }
});

Deno.test("only a batch flow notes its published ids in a durable ledger; a realtime EOS counts them itself", async () => {
  for (const flowType of ["batch", "realtime"] as const) {
    await withFlow({ ...PIPELINE, flowType, durableLedger: true }, async (flow) => {
      const cam = await flow.open("cam");
      await produce(flow, cam, [1, 2, 3, 4, 5]);
      const records = await flow.store.scan(flow.runtime("cam").key("published") + "/");
      assert.equal(records.length > 0, flowType === "batch", `${flowType}: ${records.length} records`);
      const eos = broker(flow).stored(channelId(FLOW, RUN, "cam")).filter((e) => e.kind === MessageKind.eos);
      assert.equal(eos.length, 1);
      assert.equal(decodeEnvelope(eos[0].body).seq, 5, `${flowType}: the EOS announces every accepted id`);
    });
  }
});

/**
 * A ledger store that delegates to `inner`, and lets a test see when the received ids are read and hold
 * back the writes that note them.
 */
class WatchedStore implements RuntimeStore {
  /** What `onReceivedScan` returned at each scan of received records. */
  readonly receivedScans: unknown[] = [];
  /** Received-id writes begun (held or not). */
  receivedWrites = 0;
  #held: PromiseWithResolvers<void> | null = null;

  constructor(
    readonly inner: RuntimeStore,
    readonly onReceivedScan: () => Promise<unknown> = () => Promise.resolve(null),
  ) {}

  /** Holds every received-id write from now until {@link release}. */
  hold(): void {
    this.#held = Promise.withResolvers<void>();
  }

  release(): void {
    this.#held?.resolve();
    this.#held = null;
  }

  get(key: string) {
    return this.inner.get(key);
  }

  async cas(key: string, expectedVersion: string | null, value: Uint8Array) {
    if (key.includes("/received/")) {
      this.receivedWrites++;
      if (this.#held !== null) await this.#held.promise;
    }
    return await this.inner.cas(key, expectedVersion, value);
  }

  delete(key: string, expectedVersion: string | null) {
    return this.inner.delete(key, expectedVersion);
  }

  async scan(prefix: string) {
    if (prefix.includes("/received/")) this.receivedScans.push(await this.onReceivedScan());
    return await this.inner.scan(prefix);
  }

  append(log: string, record: Uint8Array) {
    return this.inner.append(log, record);
  }

  logEntries(log: string) {
    return this.inner.logEntries(log);
  }

  capabilities() {
    return this.inner.capabilities();
  }

  close() {
    return Promise.resolve();
  }
}

/** A ledger store (see {@link WatchedStore}) that can hold back its next checkpoint write until released. */
class GatedCheckpoints extends WatchedStore {
  #gate: { reached: PromiseWithResolvers<void>; open: PromiseWithResolvers<void> } | null = null;

  /** Holds the next checkpoint write: `reached` resolves when it begins, `open` lets it go on. */
  holdNextCheckpoint(): { reached: PromiseWithResolvers<void>; open: PromiseWithResolvers<void> } {
    const gate = { reached: Promise.withResolvers<void>(), open: Promise.withResolvers<void>() };
    this.#gate = gate;
    return gate;
  }

  override async cas(key: string, expectedVersion: string | null, value: Uint8Array) {
    const gate = this.#gate;
    if (gate !== null && key.includes("/checkpoint/")) {
      this.#gate = null;
      gate.reached.resolve();
      await gate.open.promise;
    }
    return await super.cas(key, expectedVersion, value);
  }
}

/** `node`'s ledger over `store` instead of the flow's own, with the flow's parent replica counts. */
function runtimeOver(flow: MessengerFlow, node: string, store: RuntimeStore): FlowRuntime {
  return new FlowRuntime({
    store,
    flowId: FLOW,
    runId: RUN,
    node,
    parentReplicas: flow.parentReplicas(node),
    clock: flow.clock,
  });
}

Deno.test("the EOS-7 check reads the received ids only once the broker holds nothing more for the node", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    const cam = await flow.open("cam");
    await produce(flow, cam, Array.from({ length: 40 }, (_, i) => i));
    const data = dataSubscriptionId(channelId(FLOW, RUN, "cam"), "det", null);
    const store = new WatchedStore(flow.store, async () => {
      const counts = requireKnown(await flow.backend.observeSubscription(data), "det's subscription");
      return counts.available + counts.leased;
    });
    const det = await flow.open("det", 0, { runtime: runtimeOver(flow, "det", store), prefetch: 16 });
    const seen = await consume(flow, det, (g) => g.cam?.message);
    assert.equal(seen.groups.length, 40);
    assert.equal(seen.end.cam?.isStopSignal, true);
    assert.ok(store.receivedScans.length >= 1, "the barrier was decided on the received ids");
    assert.deepEqual(
      store.receivedScans.filter((pending) => pending !== 0),
      [],
      `received ids read while the broker still held work: ${store.receivedScans.join(", ")}`,
    );
  });
});

/** A ledger store (see {@link WatchedStore}) that runs `beforeTerminators` once, as the first terminator scan begins. */
class TerminatorScanHook extends WatchedStore {
  #hook: (() => Promise<void>) | null;

  constructor(inner: RuntimeStore, beforeTerminators: () => Promise<void>) {
    super(inner);
    this.#hook = beforeTerminators;
  }

  override async scan(prefix: string) {
    const hook = this.#hook;
    if (hook !== null && prefix.includes("/terminator/")) {
      this.#hook = null;
      await hook();
    }
    return await super.scan(prefix);
  }
}

Deno.test("an EOS-7 barrier whose announced count falls short still waits for an output published while it read the terminators", async () => {
  await withFlow({
    flowType: "batch",
    nodes: [{ name: "src" }, { name: "cam", parents: ["src"], nbTasks: 2 }, {
      name: "det",
      parents: ["cam"],
    }],
    durableLedger: true,
  }, async (flow) => {
    const src = await flow.open("src");
    await produce(flow, src, ["x", "y"], false);
    const cam0 = await flow.open("cam", 0, { prefetch: 1 });
    const cam1 = await flow.open("cam", 1, { prefetch: 1 });
    const pass = async (cam: BrokerMessenger) => {
      const group = await flow.drive(cam.receiveMessage());
      await flow.drive(cam.publishMessage(`${group.src?.message}'`));
      await flow.drive(cam.ackInputs());
      await flow.drive(cam.awaitInFlight());
    };
    await pass(cam0);
    // As if replica 0 had been killed before its tally noted x': its EOS announces none.
    for (const record of await flow.store.scan(`vf/${FLOW}/${RUN}/cam/published/`)) {
      await flow.store.delete(record.key, record.version);
    }
    await flow.drive(cam0.publishStopSignal());
    // Between the barrier's look at the broker and its read of the terminators: replica 1 passes y on and
    // ends, and a sibling of det records that end.
    const store = new TerminatorScanHook(flow.store, async () => {
      await pass(cam1);
      await flow.drive(cam1.publishStopSignal());
      await flow.runtime("det").recordTerminator("cam", 1, TerminatorKind.eos, 1);
    });
    const det = await flow.open("det", 0, { runtime: runtimeOver(flow, "det", store) });
    const seen = await consume(flow, det, (g) => g.cam?.message);
    assert.deepEqual(seen.groups.map((g) => g.cam?.message).sort(), ["x'", "y'"], "y' was not left behind");
    assert.equal(seen.end.cam?.isStopSignal, true);
  });
});

Deno.test("a received batch's ledger write runs while the node works and is done before any of it is acked", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    const cam = await flow.open("cam");
    await produce(flow, cam, [1, 2, 3]);
    const store = new WatchedStore(flow.store);
    const det = await flow.open("det", 0, { runtime: runtimeOver(flow, "det", store) });
    store.hold();
    const group = await flow.drive(det.receiveMessage());
    assert.equal(group.cam?.message, 1, "the node has its input while the write is held");
    await flow.drive(flow.clock.sleep(RECEIVED_LINGER_SECONDS));
    assert.equal(store.receivedWrites, 1, "the write began once its linger was over");
    let acked = false;
    const ack = det.ackInputs().then(() => det.awaitInFlight()).then(() => {
      acked = true;
    });
    for (let turn = 0; turn < 20; turn++) await new Promise((resolve) => setTimeout(resolve, 1));
    const data = dataSubscriptionId(channelId(FLOW, RUN, "cam"), "det", null);
    const leased = async () =>
      requireKnown(await flow.backend.observeSubscription(data), "det's subscription").leased;
    assert.equal(acked, false, "the ack waits for the write");
    assert.equal(await leased(), 3, "nothing left the broker unrecorded");
    store.release();
    await flow.drive(ack);
    assert.equal(await flow.runtime("det").receivedCount("cam", "det--from--cam"), 3);
    assert.equal(await leased(), 2);
  });
});

Deno.test("bytes that do not decode never reach the node: replica 0 of a partitioned node dead-letters them", async () => {
  await withFlow({
    flowType: "batch",
    nodes: [{ name: "cam" }, { name: "det", parents: ["cam"], nbTasks: 2, partitionBy: "trace_id" }],
  }, async (flow) => {
    const r0 = await flow.open("det", 0);
    const r1 = await flow.open("det", 1);
    const garbage = new TextEncoder().encode("\x82\xa1v\x03 not a protobuf envelope");
    const outcome = await flow.drive(flow.backend.publish(
      envelope({
        channel: channelId(FLOW, RUN, "cam"),
        publicationId: "garbage-1",
        body: garbage,
        eventId: "garbage-1",
        schemaVersion: ENVELOPE_VERSION,
      }),
      flow.clock.monotonic() + 5,
    ));
    assert.equal(outcome.kind, "accepted");
    const cam = await flow.open("cam");
    await flow.drive(cam.publishStopSignal());
    const [seen0, seen1] = await Promise.all([consume(flow, r0), consume(flow, r1)]);
    assert.deepEqual([seen0.groups, seen1.groups], [[], []]);
    assert.deepEqual(r0.takeDrops(), { [DropReason.undecodable]: 1 });
    assert.deepEqual(r1.takeDrops(), {});
    const letters = broker(flow).stored(channelId(FLOW, RUN, "det")).filter((e) =>
      e.kind === MessageKind.dlq
    );
    assert.deepEqual(letters.map((e) => e.body), [garbage]);
    assert.match(letters[0].headers[DeadLetterHeader.error], /^VF_POISON_DECODE: /);
  });
});

for (
  const [story, failure, letters, actions] of [
    [
      "a best-effort node dead-letters a sample of its poison failures and terminates the rest",
      () => new PoisonMessage("a frame that will never parse"),
      5, // five per (code, node) per minute
      ["dlq_sample_cap", "dlq_sample_cap"],
    ],
    [
      "a best-effort node terminates its transient failures: none is dead-lettered",
      () => new TransientFailure("a stale frame"),
      0,
      Array(7).fill("term"),
    ],
  ] as const
) {
  Deno.test(story, async () => {
    await withFlow(
      { flowType: "realtime", nodes: [{ name: "cam" }, { name: "det", parents: ["cam"] }] },
      async (flow) => {
        const cam = await flow.open("cam");
        const det = await flow.open("det");
        for (let i = 0; i < 7; i++) {
          await flow.drive(cam.publishMessage(i));
          await flow.drive(det.receiveMessage());
          await flow.drive(det.failInputs(failure()));
        }
        const stored = broker(flow).stored(channelId(FLOW, RUN, "det")).filter((e) =>
          e.kind === MessageKind.dlq
        );
        assert.equal(stored.length, letters);
        const terminal = await flow.drive(det.terminalEntries());
        assert.deepEqual(terminal.map((r) => r.action), actions);
      },
    );
  });
}

Deno.test("a dead letter that keeps failing leaves its delivery unresolved, never silently gone (story 26)", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    const det = await flow.open("det");
    await produce(flow, cam, ["bad"], false);
    using schedule = new FaultSchedule({
      [Barrier.dlqPublishBefore]: raiseTyped("VF_BROKER_UNAVAILABLE", "no DLQ stream"),
    }).install();
    for (let attempt = 1; attempt <= 4; attempt++) {
      await flow.drive(det.receiveMessage());
      await flow.drive(det.failInputs(new PoisonMessage("bad bytes")));
    }
    schedule.assertAllFired();
    const sub = await broker(flow).observeSubscription(
      dataSubscriptionId(channelId(FLOW, RUN, "cam"), "det"),
    );
    assert.deepEqual(sub.kind === "known" && [sub.value.available, sub.value.leased, sub.value.unresolved], [
      0,
      0,
      1,
    ]);
    const handoffs = await flow.drive(flow.runtime("det").pendingHandoffs());
    assert.deepEqual(handoffs.map((h) => h.attempts), [4]);
  });
});

Deno.test("a sink's checkpoint on a ledger that dies with the process is refused (RUN-022)", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    const det = await flow.open("det");
    await produce(flow, cam, [1], false);
    await flow.drive(det.receiveMessage());
    await assert.rejects(flow.drive(det.checkpoint(new Uint8Array([1]))), CapabilityError);
    await assert.rejects(
      flow.drive(det.publishMessage(2, { [CHECKPOINT_METADATA_KEY]: new Uint8Array([1]) })),
      CapabilityError,
    );
    assert.equal(stored(flow, "det").length, 0, "nothing was published past the refused checkpoint");
  });
});

Deno.test("without the EOS-7 barrier a parent with two replicas ends only once both replicas' EOS arrived", async () => {
  await withFlow({
    flowType: "batch",
    nodes: [{ name: "cam" }, { name: "mid", parents: ["cam"], nbTasks: 2 }, {
      name: "sink",
      parents: ["mid"],
    }],
  }, async (flow) => {
    const cam = await flow.open("cam");
    await produce(flow, cam, [1, 2]);
    const mid0 = await flow.open("mid", 0, { prefetch: 0 });
    const mid1 = await flow.open("mid", 1, { prefetch: 0 });
    const one = await flow.drive(mid1.receiveMessage());
    await flow.drive(mid1.publishMessage(one.cam?.message));
    await flow.drive(mid1.ackInputs());
    await consume(flow, mid0, (g) => g.cam?.message);
    const sink = await flow.open("sink");
    for (let i = 0; i < 2; i++) {
      await flow.drive(sink.receiveMessage());
      await flow.drive(sink.ackInputs());
    }
    let ended = false;
    const ending = sink.receiveMessage();
    ending.then(() => ended = true);
    await flow.drive(flow.clock.sleep(5));
    assert.equal(ended, false, "one replica's EOS does not end a two-replica parent");
    await consume(flow, mid1, (g) => g.cam?.message);
    assert.equal((await flow.drive(ending)).mid?.isStopSignal, true);
  });
});

Deno.test("a receiver publishing outside an input group, and a producer asked to receive, are refused", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    const det = await flow.open("det");
    await assert.rejects(flow.drive(det.publishMessage(1)), ConfigError);
    await assert.rejects(flow.drive(cam.receiveMessage()), ConfigError);
    assert.equal(det.lastInputKey(), null);
    assert.equal(det.lastInputInfo(), null);
  });
});

Deno.test("a best-effort parent drains although a crashed sibling left a delivery unresolved", async () => {
  await withFlow({
    flowType: "realtime",
    nodes: [{ name: "cam" }, { name: "det", parents: ["cam"], nbTasks: 2 }],
  }, async (flow) => {
    const cam = await flow.open("cam", 0);
    const crashing = await flow.open("det", 0, { prefetch: 0 });
    await produce(flow, cam, ["lost"], false);
    await flow.drive(crashing.receiveMessage());
    await crashing.close({ handBack: false });
    await flow.drive(flow.clock.sleep(61));
    const sub = await broker(flow).observeSubscription(
      dataSubscriptionId(channelId(FLOW, RUN, "cam"), "det"),
    );
    assert.equal(sub.kind === "known" && sub.value.unresolved, 1);
    await flow.drive(cam.publishStopSignal());
    const survivor = await flow.open("det", 1);
    const seen = await consume(flow, survivor);
    assert.deepEqual(seen.groups, []);
    assert.equal(seen.end.cam?.isStopSignal, true);
    const pending = await flow.drive(survivor.pendingObservation());
    assert.equal(pending.kind === "known" && pending.value, 0);
  });
});

Deno.test("an input is acked only once its output was accepted, while the node already works on the next", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    await produce(flow, cam, [1, 2]);
    const det = await flow.open("det");
    const detChannel = channelId(FLOW, RUN, "det");
    const leased = async () =>
      requireKnown(
        await flow.backend.observeSubscription(dataSubscriptionId(channelId(FLOW, RUN, "cam"), "det", null)),
        "det's subscription",
      ).leased;
    assert.equal((await flow.drive(det.receiveMessage())).cam?.message, 1);
    broker(flow).pauseAcceptance(detChannel);
    await flow.drive(det.publishMessage(10));
    await flow.drive(det.ackInputs());
    assert.equal((await flow.drive(det.receiveMessage())).cam?.message, 2, "the node went on");
    assert.equal(await leased(), 2, "input 1 stays unacked while its output awaits the broker");
    broker(flow).resumeAcceptance(detChannel);
    await flow.drive(det.awaitInFlight());
    assert.equal(await leased(), 1, "input 1 acked once its output was accepted");
    assert.equal(det.publicationStats.accepted, 1);
  });
});

Deno.test("received batches that arrive while a received-set write runs are noted together by the next write", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    const cam = await flow.open("cam");
    await produce(flow, cam, [1, 2, 3], false);
    const store = new WatchedStore(flow.store);
    const det = await flow.open("det", 0, { runtime: runtimeOver(flow, "det", store) });
    store.hold();
    for (const expected of [1, 2, 3]) {
      assert.equal((await flow.drive(det.receiveMessage())).cam?.message, expected);
      await flow.drive(det.publishMessage(expected * 10));
      await flow.drive(det.ackInputs());
    }
    await flow.drive(flow.clock.sleep(RECEIVED_LINGER_SECONDS));
    for (const batch of [[4, 5], [6, 7]]) {
      await produce(flow, cam, batch, false);
      for (const expected of batch) {
        assert.equal((await flow.drive(det.receiveMessage())).cam?.message, expected);
        await flow.drive(det.publishMessage(expected * 10));
        await flow.drive(det.ackInputs());
      }
    }
    assert.equal(store.receivedWrites, 1, "one write runs (held); the later batches wait for it");
    store.release();
    await flow.drive(det.awaitInFlight());
    assert.equal(store.receivedWrites, 2, "both later batches went into one write");
    assert.equal(await flow.runtime("det").receivedCount("cam", "det--from--cam"), 7);
  });
});

Deno.test("a trickle of received ids waits up to the linger to share one write; a full batch is written at once", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    const cam = await flow.open("cam");
    const store = new WatchedStore(flow.store);
    const writtenAt: number[] = [];
    const cas = store.cas.bind(store);
    store.cas = (key, expectedVersion, value) => {
      if (key.includes("/received/")) writtenAt.push(flow.clock.monotonic());
      return cas(key, expectedVersion, value);
    };
    // Items that trickle in, one per receive, to a node that could take 4 at once: three batches of one,
    // received in turn. (How many writes they share depends on how far the fake clock moves while the
    // file ledger works.)
    const det = await flow.open("det", 0, { runtime: runtimeOver(flow, "det", store), prefetch: 4 });
    const startedAt = flow.clock.monotonic();
    for (const item of [1, 2, 3]) {
      await produce(flow, cam, [item], false);
      assert.equal((await flow.drive(det.receiveMessage())).cam?.message, item);
      await flow.drive(det.ackInputs());
    }
    await flow.drive(det.awaitInFlight());
    assert.ok(store.receivedWrites < 3, "batches received in turn share writes");
    assert.ok(writtenAt[0] - startedAt >= RECEIVED_LINGER_SECONDS - 1e-9, "the first waited out the linger");
    const batch = new WatchedStore(flow.store);
    const many = Array.from({ length: DEFAULT_IN_FLIGHT / 2 }, (_, i) => 100 + i);
    await produce(flow, cam, many, false);
    const wide = await flow.open("det", 0, { runtime: runtimeOver(flow, "det", batch) });
    const receivedAt = flow.clock.monotonic();
    const writesAt: number[] = [];
    const batchCas = batch.cas.bind(batch);
    batch.cas = (key, expectedVersion, value) => {
      if (key.includes("/received/")) writesAt.push(flow.clock.monotonic());
      return batchCas(key, expectedVersion, value);
    };
    for (const item of many) {
      assert.equal((await flow.drive(wide.receiveMessage())).cam?.message, item);
      await flow.drive(wide.ackInputs());
    }
    await flow.drive(wide.awaitInFlight());
    assert.equal(batch.receivedWrites, 1, `${many.length} ids received together: one write`);
    assert.ok(writesAt[0] - receivedAt < RECEIVED_LINGER_SECONDS, "written without waiting out the linger");
    assert.equal(await flow.runtime("det").receivedCount("cam", "det--from--cam"), 3 + many.length);
  });
});

Deno.test("a large output moved to the embedded broker counts its bytes in flight: past the byte bound the node waits for its outcome", async () => {
  let hosted: MemoryMessagingBackend | null = null;
  const flow = await MessengerFlow.create(
    embeddedProvider((messaging) => hosted = messaging),
    { flowType: "realtime", nodes: [{ name: "cam" }, { name: "det", parents: ["cam"] }] },
  );
  try {
    const cam = await flow.open("cam", 0, {
      inFlightBytes: 1024 * 1024,
      maxInlinePayloadBytes: 64 * 1024 * 1024,
    });
    (hosted as unknown as MemoryMessagingBackend).pauseAcceptance(channelId(FLOW, RUN, "cam"));
    // Over 8 MiB, so the frame carrying it is sent (and its body moved) within the publish call itself.
    const frame = new Uint8Array(9 * 1024 * 1024).fill(5);
    let returned = false;
    const publishing = cam.publishMessage(frame).then(() => returned = true);
    await flow.drive(flow.clock.sleep(0.05));
    assert.equal(
      returned,
      false,
      "9 MiB in flight, over the 1 MiB bound: publishMessage waits for the outcome",
    );
    (hosted as unknown as MemoryMessagingBackend).resumeAcceptance(channelId(FLOW, RUN, "cam"));
    await flow.drive(publishing);
    await flow.drive(cam.awaitInFlight());
  } finally {
    await flow.dispose();
  }
});

/** `flow`'s backend with the first `count` data publications refused for good (a non-retryable rejection). */
function refuseFirstData(flow: MessengerFlow, count: number): void {
  let refused = 0;
  answerPublications(broker(flow), (env, deadline, original) => {
    if (env.kind === MessageKind.data && refused < count) {
      refused++;
      return Promise.resolve(rejected(env.publicationId, "refused by the test", false));
    }
    return original(env, deadline);
  });
}

Deno.test("outputs refused by a full channel are retried in the order they were made, and later ones wait behind them", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    const refusedOnce = new Set<string>();
    const attempts: string[] = [];
    answerPublications(broker(flow), (env, deadline, original) => {
      if (env.kind !== MessageKind.data) return original(env, deadline);
      attempts.push(env.publicationId);
      // The first two outputs are refused at their first attempt, as a full reliable channel refuses.
      if (refusedOnce.size < 2 && !refusedOnce.has(env.publicationId)) {
        refusedOnce.add(env.publicationId);
        return Promise.resolve(rejected(env.publicationId, "channel cam is full", true));
      }
      return original(env, deadline);
    });
    for (const value of ["f1", "f2", "f3"]) await flow.drive(cam.publishMessage(value));
    await flow.drive(cam.awaitInFlight());
    const values = stored(flow, "cam").map(({ envelope }) => {
      const wire = decodeEnvelope(envelope.body);
      return decodePayload(wire.payloadType, wire.payload);
    });
    assert.deepEqual(values, ["f1", "f2", "f3"], `taken in publication order (attempts: ${attempts})`);
    const [f1, f2, f3] = [...new Set(attempts)];
    assert.ok(
      attempts.lastIndexOf(f1) < attempts.indexOf(f3) && attempts.lastIndexOf(f2) < attempts.indexOf(f3),
      `f3 was not sent before the refused ones were taken: ${attempts}`,
    );
  });
});

Deno.test("a refused output waits the backoff ladder before each retry, its first included", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    const attempts: number[] = [];
    answerPublications(broker(flow), (env, deadline, original) => {
      if (env.kind !== MessageKind.data) return original(env, deadline);
      attempts.push(flow.clock.monotonic());
      return attempts.length <= 3
        ? Promise.resolve(rejected(env.publicationId, "channel cam is full", true))
        : original(env, deadline);
    });
    await flow.drive(cam.publishMessage("f1"));
    await flow.drive(cam.awaitInFlight());
    const gaps = attempts.slice(1).map((at, i) => Math.round((at - attempts[i]) * 1000) / 1000);
    assert.deepEqual(gaps, [0.05, 0.1, 0.2], "WIRE.md's ladder: 0.05, 0.1, 0.2 s ...");
  });
});

Deno.test("an output whose refusal arrives late still goes before one made after it", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    let full = true;
    const firstAttempts: PromiseWithResolvers<PublicationOutcome>[] = [];
    const tried = new Set<string>();
    answerPublications(broker(flow), (env, deadline, original) => {
      if (env.kind !== MessageKind.data) return original(env, deadline);
      if (!tried.has(env.publicationId) && firstAttempts.length < 2) {
        // The first two outputs' answers are held back, as answers still on their way are.
        tried.add(env.publicationId);
        const answer = Promise.withResolvers<PublicationOutcome>();
        firstAttempts.push(answer);
        return answer.promise;
      }
      tried.add(env.publicationId);
      return full
        ? Promise.resolve(rejected(env.publicationId, "channel cam is full", true))
        : original(env, deadline);
    });
    const refuse = (answer: PromiseWithResolvers<PublicationOutcome>) =>
      answer.resolve(rejected("held", "channel cam is full", true));
    await flow.drive(cam.publishMessage("f1"));
    await flow.drive(cam.publishMessage("f2"));
    assert.equal(firstAttempts.length, 2, "both were sent before either answer came back");
    refuse(firstAttempts[0]);
    await flow.drive(flow.clock.sleep(0.2));
    await flow.drive(cam.publishMessage("f3"));
    refuse(firstAttempts[1]);
    await flow.drive(flow.clock.sleep(0.2));
    full = false;
    await flow.drive(cam.awaitInFlight());
    const values = stored(flow, "cam").map(({ envelope }) => {
      const wire = decodeEnvelope(envelope.body);
      return decodePayload(wire.payloadType, wire.payload);
    });
    assert.deepEqual(values, ["f1", "f2", "f3"], "f2 was made before f3, so it is taken before f3");
  });
});

Deno.test("a quiesce's position save begun before the node's own checkpoint never lands its older state over it", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    const store = new GatedCheckpoints(flow.store);
    const cam = await flow.open("cam", 0, { replayable: true, runtime: runtimeOver(flow, "cam", store) });
    assert.equal(await flow.drive(cam.resumeOffset()), 0);
    await flow.drive(cam.publishMessage("f1"));
    await flow.drive(cam.awaitInFlight());
    // Straight after f1's flush: f2's offset waits for the next position save.
    await cam.publishMessage("f2");
    await cam.awaitInFlight();
    const gate = store.holdNextCheckpoint();
    const quiesced = cam.quiesce();
    await flow.drive(gate.reached.promise);
    const state = new TextEncoder().encode("the state after f2");
    const checkpointed = cam.checkpoint(state);
    await flow.drive(flow.clock.sleep(1));
    gate.open.resolve();
    await flow.drive(Promise.all([quiesced, checkpointed]));
    const restored = await flow.runtime("cam").restoreCheckpoint();
    assert.deepEqual(restored.state, state, "the node's checkpoint, not the older state the save began with");
    assert.equal(restored.replayPosition.offset, 2);
  });
});

Deno.test("a reliable replayable output refused for good never advances the resume offset past it", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    const first = await flow.open("cam", 0, { replayable: true });
    assert.equal(await flow.drive(first.resumeOffset()), 0);
    refuseFirstData(flow, 1);
    await flow.drive(first.publishMessage("f1"));
    await assert.rejects(flow.drive(first.awaitInFlight()), BrokerUnavailable);
    await assert.rejects(flow.drive(first.publishMessage("f2")), BrokerUnavailable, "later calls report it");
    await flow.drive(first.close());
    await flow.reopenStore();
    const second = await flow.open("cam", 0, { replayable: true });
    assert.equal(await flow.drive(second.resumeOffset()), 0, "f1 never landed: a resume replays it");
  });
});

Deno.test("an input whose output was refused goes back to the broker at once, and the failure stands", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    await produce(flow, cam, [1]);
    const det = await flow.open("det");
    const subscription = dataSubscriptionId(channelId(FLOW, RUN, "cam"), "det", null);
    const observed = async () => requireKnown(await flow.backend.observeSubscription(subscription), "det");
    assert.equal((await flow.drive(det.receiveMessage())).cam?.message, 1);
    refuseFirstData(flow, 1);
    await flow.drive(det.publishMessage(10));
    // The refusal may already be known when the ack is asked for: then the ack reports it too.
    await flow.drive(det.ackInputs()).catch((error) => assert.ok(error instanceof BrokerUnavailable));
    await assert.rejects(flow.drive(det.awaitInFlight()), BrokerUnavailable);
    const after = await observed();
    assert.equal(after.leased, 0, "not held until the ack wait lapses");
    assert.equal(after.available, 1, "the input waits for the next receiver");
  });
});

Deno.test("a crashed messenger's publication that lands afterwards notes nothing in the ledger", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    const cam = await flow.open("cam");
    const camChannel = channelId(FLOW, RUN, "cam");
    broker(flow).pauseAcceptance(camChannel);
    await flow.drive(cam.publishMessage("late"));
    await cam.close({ handBack: false });
    broker(flow).resumeAcceptance(camChannel);
    await flow.drive(flow.clock.sleep(30));
    await flow.drive(cam.awaitInFlight().catch(() => {}));
    assert.equal(await flow.runtime("cam").publishedCount(), 0, "a dead process writes nothing");
  });
});

/** A memory store that reports itself durable and shared, so a messenger keeps EOS-7 received sets in it. */
class DurableMemoryStore extends WatchedStore {
  override capabilities(): Promise<RuntimeCapabilities> {
    return Promise.resolve(
      runtimeCapabilities("memory, reported durable", known(true, systemClock), true, false, false),
    );
  }
}

Deno.test("a delivery the messenger settles itself (an undecodable one) does not wait out the linger", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const store = new DurableMemoryStore(new MemoryRuntimeStore(flow.clock));
    const det = await flow.open("det", 0, { runtime: runtimeOver(flow, "det", store) });
    const published = await flow.drive(flow.backend.publish(
      envelope({
        channel: channelId(FLOW, RUN, "cam"),
        publicationId: "garbage-1",
        body: new TextEncoder().encode("not a protobuf envelope"),
        eventId: "garbage-1",
        schemaVersion: ENVELOPE_VERSION,
      }),
      flow.clock.monotonic() + 5,
    ));
    assert.equal(published.kind, "accepted");
    const cam = await flow.open("cam");
    await produce(flow, cam, [1], false);
    const startedAt = flow.clock.monotonic();
    assert.equal(
      (await flow.drive(det.receiveMessage())).cam?.message,
      1,
      "the good item, after the bad one",
    );
    assert.deepEqual(det.takeDrops(), { [DropReason.undecodable]: 1 });
    assert.ok(store.receivedWrites >= 1, "the received ids were noted");
    assert.ok(
      flow.clock.monotonic() - startedAt < RECEIVED_LINGER_SECONDS,
      "dead-lettering the bad one sent the write noting it at once",
    );
  });
});

Deno.test("a crashed messenger's received ids still waiting out their linger are never written", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    const cam = await flow.open("cam");
    await produce(flow, cam, [1], false);
    const store = new WatchedStore(flow.store);
    const det = await flow.open("det", 0, { runtime: runtimeOver(flow, "det", store) });
    assert.equal((await flow.drive(det.receiveMessage())).cam?.message, 1);
    // Under load the fake clock may move past the linger while the receive waits: then the write came first.
    const writtenBeforeCrash = store.receivedWrites;
    await det.close({ handBack: false });
    await flow.drive(flow.clock.sleep(RECEIVED_LINGER_SECONDS * 10));
    assert.equal(store.receivedWrites, writtenBeforeCrash, "a dead process writes nothing more");
    const replacement = await flow.open("det");
    await flow.drive(flow.clock.sleep(60));
    assert.equal(
      (await flow.drive(replacement.receiveMessage())).cam?.message,
      1,
      "the input goes to the replacement",
    );
  });
});

Deno.test("an ack begun before a crash and waiting for its ledger write never acks an id the ledger lacks", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    const cam = await flow.open("cam");
    await produce(flow, cam, [1], true);
    const det = await flow.open("det");
    assert.equal((await flow.drive(det.receiveMessage())).cam?.message, 1);
    await det.ackInputs();
    await det.close({ handBack: false });
    await flow.drive(flow.clock.sleep(1));
    const received = await flow.runtime("det").receivedCount("cam", "det--from--cam");
    const leased = requireKnown(
      await flow.backend.observeSubscription(dataSubscriptionId(channelId(FLOW, RUN, "cam"), "det", null)),
      "det's subscription",
    ).leased;
    // The linger may have run out before the crash (under load the fake clock moves while a call waits):
    // then the id was noted first. Either way it is never acked unnoted.
    assert.ok(leased === 1 || received === 1, `acked but never noted: ${received} ids noted`);
    const replacement = await flow.open("det");
    await flow.drive(flow.clock.sleep(60));
    const seen = await consume(flow, replacement);
    assert.deepEqual(
      seen.groups.map((g) => g.cam?.message),
      leased === 1 ? [1] : [],
      "the replacement takes what the dead one left unacked, then ends",
    );
  });
});

Deno.test("a crashed messenger's offloaded output that lands afterwards leaves its outbox intent to the replacement", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    const cam = await flow.open("cam", 0, { maxInlinePayloadBytes: 256 });
    const camChannel = channelId(FLOW, RUN, "cam");
    broker(flow).pauseAcceptance(camChannel);
    const publishing = cam.publishMessage(new Uint8Array(4096).fill(1)).catch(() => {});
    // The intent is a real file write: under a loaded host it may take more than one driver step.
    let intended: OutboxDocument | undefined;
    for (let step = 0; step < 100 && intended === undefined; step++) {
      await flow.drive(flow.clock.sleep(0.1));
      [intended] = await flow.runtime("cam").outboxOf("cam");
    }
    assert.equal(intended?.outcome, OutboxOutcome.intent, "the intent is written before the send");
    await cam.close({ handBack: false });
    broker(flow).resumeAcceptance(camChannel);
    await flow.drive(publishing);
    await flow.drive(flow.clock.sleep(30));
    const [after] = await flow.runtime("cam").outboxOf("cam");
    assert.equal(after.outcome, OutboxOutcome.intent, "a dead process resolves nothing in the ledger");
  });
});

Deno.test("published ids a failed ledger write did not take are written by the next flush", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    let failures = 1;
    const store = new WatchedStore(flow.store);
    const failing: RuntimeStore = Object.assign(Object.create(store), {
      cas(key: string, expectedVersion: string | null, value: Uint8Array) {
        if (key.includes("/published/") && failures > 0) {
          failures--;
          return Promise.reject(new TransientFailure("the ledger's disk hiccupped", "retry"));
        }
        return store.cas(key, expectedVersion, value);
      },
    });
    const cam = await flow.open("cam", 0, { runtime: runtimeOver(flow, "cam", failing) });
    await produce(flow, cam, [1, 2, 3], false);
    await flow.drive(flow.clock.sleep(2));
    await flow.drive(cam.publishMessage(4));
    await assert.rejects(flow.drive(cam.awaitInFlight()), TransientFailure);
    await flow.drive(cam.publishStopSignal().catch(() => {}));
    await flow.drive(cam.close());
    assert.equal(await flow.runtime("cam").publishedCount(), 4, "every accepted id reached the ledger");
  });
});

Deno.test("an event time that is not finite epoch seconds is a VF_CONFIG naming the value and its type", async () => {
  await withFlow(PIPELINE, async (flow) => {
    const cam = await flow.open("cam");
    for (
      const [value, shown] of [[Infinity, "Infinity"], ["123", 'string "123"'], [
        null,
        "object null",
      ]] as const
    ) {
      assert.throws(
        () => cam.setOutputEventTimestamp(value as number),
        (error: unknown) =>
          error instanceof ConfigError &&
          error.message === `an event time must be finite epoch seconds, got ${shown}`,
      );
    }
  });
});

const FAN_IN_CHAIN: FlowOptions = {
  flowType: "batch",
  durableLedger: true,
  nodes: [{ name: "cam" }, { name: "mid", parents: ["cam"], nbTasks: 2 }, { name: "sink", parents: ["mid"] }],
};

Deno.test("an output a killed replica noted and its sibling published again counts once: the child's EOS-7 barrier completes", async () => {
  await withFlow(FAN_IN_CHAIN, async (flow) => {
    const cam = await flow.open("cam");
    await produce(flow, cam, [1, 2]);
    const killed = await flow.open("mid", 0, { prefetch: 0 });
    // A second on, the output's acceptance is due to be noted in the ledger before its input's ack.
    await flow.drive(flow.clock.sleep(1.5));
    const first = await flow.drive(killed.receiveMessage());
    await flow.drive(killed.publishMessage(first.cam?.message));
    await flow.drive(killed.awaitInFlight());
    assert.equal(await flow.drive(flow.runtime("mid", 0).publishedCount()), 1);
    await killed.close({ handBack: false });
    // The input it never acked comes back to the sibling, which publishes the same output id again.
    const sibling = await flow.open("mid", 1);
    const taken = await consume(flow, sibling, (g) => g.cam?.message);
    assert.deepEqual(taken.groups.map((g) => g.cam?.message).sort(), [1, 2]);
    const replacement = await flow.open("mid", 0);
    assert.deepEqual((await consume(flow, replacement, (g) => g.cam?.message)).groups, []);
    const sink = await flow.open("sink");
    for (let i = 0; i < 2; i++) {
      await flow.drive(sink.receiveMessage());
      await flow.drive(sink.ackInputs());
    }
    const ending = sink.receiveMessage();
    assert.ok(await settlesWithin(flow, ending, 30), "the sink ends: 2 distinct outputs, both received");
    assert.equal((await ending).mid?.isStopSignal, true);
    const terminators = await flow.drive(flow.runtime("sink").terminators("mid"));
    assert.deepEqual(terminators.map((t) => [t.replicaId, t.seq]), [[0, 1], [1, 2]], "both counted the id");
    assert.deepEqual([...await flow.drive(flow.runtime("sink").completedParents())], ["mid"]);
  });
});

/**
 * cam publishes two items and ends, its ledger also naming `missing`, an id the broker never holds; det
 * takes and acks both items. Resolves with det and its next receive, which waits on the short barrier.
 */
async function shortBarrier(
  flow: MessengerFlow,
  missing: string,
): Promise<{ det: BrokerMessenger; ending: ReturnType<BrokerMessenger["receiveMessage"]> }> {
  const cam = await flow.open("cam");
  await produce(flow, cam, ["x", "y"], false);
  await flow.drive(flow.runtime("cam").recordPublished([missing]));
  await flow.drive(cam.publishStopSignal());
  const det = await flow.open("det");
  for (let i = 0; i < 2; i++) {
    await flow.drive(det.receiveMessage());
    await flow.drive(det.ackInputs());
  }
  return { det, ending: det.receiveMessage() };
}

Deno.test("a barrier short of its parent's count with nothing left on the broker is pending work, not an idle node", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    // An id the ledger says cam published that never reaches the broker: det's barrier can never complete.
    const { det, ending } = await shortBarrier(flow, "never-sent");
    assert.equal(await settlesWithin(flow, ending, 10), false, "the barrier stays short");
    const pending = await flow.drive(det.pendingObservation());
    assert.equal(pending.kind === "known" && pending.value, 1, "the held EOS marker waits on work");
    await flow.drive(det.quiesce());
    await flow.drive(ending);
  });
});

Deno.test("a barrier short for the ack wait with nothing left on the broker ends with FlowStalled naming the parent and the count", async () => {
  await withFlow({ ...PIPELINE, durableLedger: true }, async (flow) => {
    // The ledger says cam published an id the broker does not hold: what a server that dropped it leaves.
    const { ending } = await shortBarrier(flow, "dropped");
    ending.catch(() => {});
    assert.equal(
      await settlesWithin(flow, ending, 30),
      false,
      "within the ack wait it is still pending work",
    );
    await assert.rejects(flow.drive(ending), (error: unknown) => {
      assert.ok(error instanceof FlowStalled, String(error));
      assert.deepEqual(
        [error.context.parent, error.context.announced, error.context.received, error.context.reason],
        ["cam", 3, 2, "broker_lost_messages"],
      );
      assert.match(error.message, /^1 of the 3 items cam announced never reached this node \(2 received\)/);
      return true;
    });
  });
});
