import assert from "node:assert/strict";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  makeChannel,
  makeEnvelope,
  makeSubscription,
  MemoryMessagingBackend,
} from "../../../src/backends/memory/messaging.ts";
import { MemoryPayloadStore } from "../../../src/backends/memory/payload.ts";
import { MemoryRuntimeStore } from "../../../src/backends/memory/runtime_store.ts";
import {
  type ChannelId,
  completed,
  Overflow,
  type SubscriptionId,
  subscriptionId,
} from "../../../src/backends/messaging.ts";
import { intentObligationId, retentionContract } from "../../../src/backends/payload.ts";
import { FlowRuntime } from "../../../src/backends/runtime.ts";
import { RuntimeObligationLedger } from "../../../src/messaging/obligations.ts";
import { PayloadReconciler } from "../../../src/runtime/payload_reconciler.ts";

const FLOW = "f";
const RUN = "r";

/** A channel `cam` read by `det` (competing) and by the two replicas of partitioned `trk`. */
class Fixture {
  readonly clock = new FakeClock();
  readonly backend = new MemoryMessagingBackend({ clock: this.clock });
  readonly store = new MemoryRuntimeStore(this.clock);
  readonly cam = this.runtime("cam");
  readonly ledger = new RuntimeObligationLedger(this.runtime("det"), this.backend, ["cam", "mic"]);
  readonly det: SubscriptionId;
  readonly trk0: SubscriptionId;
  readonly trk1: SubscriptionId;
  readonly channel: ChannelId;

  constructor() {
    this.channel = makeChannel(FLOW, RUN, "cam", "reliable_work", "interest").id;
    this.det = subscriptionId(this.channel, "det");
    this.trk0 = subscriptionId(this.channel, "trk", { partition: 0 });
    this.trk1 = subscriptionId(this.channel, "trk", { partition: 1 });
  }

  runtime(node: string): FlowRuntime {
    return new FlowRuntime({ store: this.store, flowId: FLOW, runId: RUN, node, clock: this.clock });
  }

  async provision(): Promise<void> {
    await this.backend.ensureChannel(makeChannel(FLOW, RUN, "cam", "reliable_work", "interest"), "c");
    for (const id of [this.det, this.trk0, this.trk1]) {
      await this.backend.ensureSubscription(
        makeSubscription(this.channel, id.consumerNode, { partition: id.partition }),
        `s-${id.consumerNode}-${id.partition}`,
      );
    }
  }

  /** Publishes `id` on `cam` carrying payload ref `key`, recorded in cam's outbox with its outcome. */
  async publish(
    id: string,
    key: string,
    channel: ChannelId = this.channel,
    runtime = this.cam,
  ): Promise<void> {
    await runtime.intendPublication(id, "digest", {
      payloadRefs: [key],
      readers: ["det", "trk/p0", "trk/p1"],
    });
    const outcome = await this.backend.publish(makeEnvelope(channel, id), this.clock.monotonic() + 5);
    await runtime.resolvePublication(id, outcome);
  }

  async settle(subscription: SubscriptionId): Promise<void> {
    const [delivery] = await this.backend.receive(subscription, 1, 1 << 20, this.clock.monotonic());
    assert.ok(delivery !== undefined, "a delivery to settle");
    await this.backend.settle(delivery.token, completed(), `s-${delivery.token.messageId}`);
  }
}

Deno.test("a reader owes a publication until its ack floor reaches the publication's sequence (PAY-006)", async () => {
  const f = new Fixture();
  await f.provision();
  await f.publish("pub-1", "k1");
  await f.settle(f.det);
  await f.settle(f.trk1);
  const required = await f.ledger.requiredObligations();
  assert.deepEqual(required.get("k1"), ["trk/p0"]);
  await f.settle(f.trk0);
  assert.deepEqual((await f.ledger.requiredObligations()).get("k1"), []);
});

Deno.test("an unresolved publication owes its intent and every reader; a refused one owes nothing (PAY-013)", async () => {
  const f = new Fixture();
  await f.provision();
  await f.cam.intendPublication("pub-2", "digest", { payloadRefs: ["k2"], readers: ["det"] });
  await f.cam.intendPublication("pub-3", "digest", { payloadRefs: ["k3"], readers: ["det"] });
  await f.cam.resolvePublication("pub-3", {
    kind: "rejected",
    publicationId: "pub-3",
    reason: "full",
    retryable: true,
  });
  const required = await f.ledger.requiredObligations();
  assert.deepEqual(required.get("k2"), ["det", intentObligationId("pub-2")]);
  assert.deepEqual(required.get("k3"), []);
});

Deno.test("a publication the channel evicted is owed by nobody (PAY-012)", async () => {
  const f = new Fixture();
  const mic = makeChannel(FLOW, RUN, "mic", "live_latest", "limits", {
    maxMsgs: 1,
    overflow: Overflow.evictOldest,
  });
  await f.backend.ensureChannel(mic, "mic");
  await f.backend.ensureSubscription(makeSubscription(mic.id, "det"), "mic-det");
  const micRuntime = f.runtime("mic");
  await f.publish("pub-4", "k4", mic.id, micRuntime);
  await f.publish("pub-5", "k5", mic.id, micRuntime);
  const required = await f.ledger.requiredObligations();
  assert.deepEqual(required.get("k4"), []);
  assert.deepEqual(required.get("k5"), ["det", "trk/p0", "trk/p1"]);
});

Deno.test("a reader whose ack floor cannot be observed still owes its release", async () => {
  const f = new Fixture();
  await f.provision();
  await f.publish("pub-6", "k6");
  await f.settle(f.trk0);
  await f.settle(f.det);
  assert.deepEqual((await f.ledger.requiredObligations()).get("k6"), ["trk/p1"]);
  f.backend.failObservation(f.trk0, "timeout");
  assert.deepEqual((await f.ledger.requiredObligations()).get("k6"), ["trk/p0", "trk/p1"]);
});

Deno.test("the ledger speaks for intents and the readers it read, never for archive or dead-letter pins", async () => {
  const f = new Fixture();
  await f.provision();
  assert.equal(f.ledger.authoritative("det"), false);
  assert.equal(f.ledger.authoritative(intentObligationId("pub-7")), true);
  await f.publish("pub-7", "k7");
  await f.ledger.requiredObligations();
  assert.equal(f.ledger.authoritative("det"), true);
  assert.equal(f.ledger.authoritative("trk/p1"), true);
  assert.equal(f.ledger.authoritative("someone-else"), false);
  assert.equal(f.ledger.authoritative("dlq/dlq:f:r:det:1"), false);
  assert.equal(f.ledger.authoritative("archive/pub-7"), false);
});

Deno.test("reconciliation reclaims a payload whose readers all acked but never released (story 10)", async () => {
  const f = new Fixture();
  await f.provision();
  const payloads = new MemoryPayloadStore({ clock: f.clock });
  const ref = await payloads.put(
    new Uint8Array([1, 2, 3]),
    "pub-8",
    retentionContract({
      ttlSeconds: 3600,
      horizonSeconds: 3600,
      durableRequired: true,
      obligations: ["det", "trk/p0", "trk/p1", intentObligationId("pub-8")],
    }),
  );
  await f.publish("pub-8", ref.key);
  await f.settle(f.det);
  await f.settle(f.trk0);
  const partial = await payloads.reconcile(f.ledger, "reconcile-1");
  assert.deepEqual(partial.retained, [ref.key]);
  assert.deepEqual([...payloads.obligations(ref.key).keys()], ["trk/p1"]);
  await f.settle(f.trk1);
  const full = await payloads.reconcile(f.ledger, "reconcile-2");
  assert.deepEqual(full.reclaimed, [ref.key]);
  assert.equal(payloads.objectCount(), 0);
});

Deno.test("a worker's reconciler reclaims at its start pass and again each interval; a failed pass is reported and the next runs on time", async () => {
  const f = new Fixture();
  await f.provision();
  const payloads = new MemoryPayloadStore({ clock: f.clock });
  const orphan = async (id: string) => {
    const ref = await payloads.put(
      new Uint8Array([1]),
      id,
      retentionContract({
        ttlSeconds: 3600,
        horizonSeconds: 3600,
        durableRequired: true,
        obligations: ["det", "trk/p0", "trk/p1", intentObligationId(id)],
      }),
    );
    await f.publish(id, ref.key);
    for (const reader of [f.det, f.trk0, f.trk1]) await f.settle(reader);
    return ref.key;
  };
  const passes: string[][] = [];
  const errors: unknown[] = [];
  let failNext = false;
  const store = Object.create(payloads, {
    reconcile: {
      value: (ledger: RuntimeObligationLedger, operationId: string) => {
        if (!failNext) return payloads.reconcile(ledger, operationId);
        failNext = false;
        return Promise.reject(new Error("the store did not answer"));
      },
    },
  });
  const reconciler = new PayloadReconciler({
    store,
    ledger: f.ledger,
    clock: f.clock,
    intervalSeconds: 60,
    operationPrefix: "reconcile:det:0",
    onPass: (pass) => passes.push([...pass.reclaimed]),
    onError: (error) => errors.push(error),
  });
  const first = await orphan("pub-9");
  reconciler.start();
  while (reconciler.passes < 1) await f.clock.advance(0);
  assert.deepEqual(passes, [[first]], "the start pass reclaims what nobody owes");
  const second = await orphan("pub-10");
  failNext = true;
  await f.clock.advance(60);
  while (reconciler.passes < 2) await f.clock.advance(0);
  assert.equal(errors.length, 1, "the failed pass is reported");
  assert.equal(payloads.objectCount(), 1, "nothing reclaimed by a failed pass");
  await f.clock.advance(60);
  while (reconciler.passes < 3) await f.clock.advance(0);
  assert.deepEqual(passes, [[first], [second]], "the next pass runs on time and reclaims");
  await reconciler.stop();
  await orphan("pub-11");
  await f.clock.advance(600);
  assert.equal(reconciler.passes, 3, "no pass after stop");
  assert.equal(payloads.objectCount(), 1);
});
