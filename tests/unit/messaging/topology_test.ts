import assert from "node:assert/strict";
import { MessagingProfile, Retention } from "../../../src/backends/capabilities.ts";
import { OwnerLabel } from "../../../src/backends/identity.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { MemoryMessagingBackend } from "../../../src/backends/memory/messaging.ts";
import { channelId, MessageKind, Overflow } from "../../../src/backends/messaging.ts";
import { DeliveryPolicy } from "../../../src/core/delivery_policy.ts";
import { ConfigError } from "../../../src/core/errors.ts";
import { JoinPolicy } from "../../../src/core/join_policy.ts";
import {
  BATCH_PREFETCH,
  BEST_EFFORT_LEDGER_DELIVERIES,
  channelSpecFor,
  consumerCredit,
  creditAdmits,
  dataSubscriptionId,
  DEDUP_WINDOW_SECONDS,
  DEFAULT_PREFETCH,
  defaultPrefetch,
  DLQ_RETENTION_SECONDS,
  durableNameOf,
  eosAnchorSubscriptionId,
  eosSubscriptionId,
  eosSubscriptionSpec,
  flowTopology,
  joinItemCredit,
  maxDeliverFor,
  nodeRouting,
  provisionFlow,
  publishBackoffSeconds,
  REFERENCE_PREFETCH,
  replicaOutputBufferBytes,
  type TopologyNode,
} from "../../../src/messaging/topology.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

function node(name: string, fields: Partial<TopologyNode> = {}): TopologyNode {
  return { name, parents: [], nbTasks: 1, partitionBy: null, joinPolicy: null, delivery: null, ...fields };
}

const FLOW_NODES: readonly TopologyNode[] = [
  node("cam"),
  node("mic"),
  node("detect", { parents: ["cam"], nbTasks: 3 }),
  node("track", { parents: ["detect"], nbTasks: 2, partitionBy: "trace_id" }),
  node("fuse", { parents: ["track", "mic"] }),
];

Deno.test("a competing subscription's credit multiplies by the replicas, a partitioned one does not", () => {
  assert.equal(consumerCredit(3, false, 1, 4), 15);
  assert.equal(consumerCredit(3, true, 1, 4), 5);
  assert.equal(consumerCredit(1, false), 1 + DEFAULT_PREFETCH);
  assert.throws(() => consumerCredit(0, false), ConfigError);
  assert.throws(() => consumerCredit(1, false, 0), ConfigError);
});

Deno.test("creditAdmits inverts consumerCredit for any replica count and credit (randomized)", () => {
  const random = new SeededRandom(testSeed());
  for (let i = 0; i < 200; i++) {
    const replicas = random.int(1, 32);
    const item = random.int(1, 300);
    const prefetch = random.int(0, 64);
    const credit = consumerCredit(replicas, false, item, prefetch);
    const seed = `seed ${random.seed}`;
    assert.equal(creditAdmits(credit, false, item, prefetch), replicas, seed);
    assert.equal(creditAdmits(credit - 1, false, item, prefetch), replicas - 1, seed);
    assert.equal(creditAdmits(consumerCredit(replicas, true, item, prefetch), true, item, prefetch), 1, seed);
  }
  assert.equal(creditAdmits(4, true, 1, 4), 0);
});

Deno.test("a join's processing credit is its policy's working set; one parent needs one", () => {
  const join = new JoinPolicy({ missing: "wait", maxPending: 8 });
  assert.equal(joinItemCredit(1, null), 1);
  assert.equal(joinItemCredit(2, join), 9);
  assert.equal(joinItemCredit(3, join), 17);
  assert.equal(joinItemCredit(2, null), 1);
});

Deno.test("the delivery cap follows the node's policy, and the ledger budget lifts only at-least-once caps", () => {
  assert.equal(maxDeliverFor(DeliveryPolicy.defaultFor("realtime"), false), 1);
  assert.equal(maxDeliverFor(DeliveryPolicy.defaultFor("batch"), false), 4);
  assert.equal(maxDeliverFor(DeliveryPolicy.resolve("batch", null, 6), false), 7);
  assert.equal(maxDeliverFor(DeliveryPolicy.defaultFor("batch"), true), -1);
  assert.equal(
    maxDeliverFor(DeliveryPolicy.defaultFor("realtime"), true),
    BEST_EFFORT_LEDGER_DELIVERIES,
    "under the ledger a best-effort input gets a second delivery, only to be given up after a death",
  );
  assert.equal(maxDeliverFor(DeliveryPolicy.resolve("realtime", { delivery: "at-least-once" }), false), 4);
});

Deno.test("a live_latest channel keeps the freshest messages, a reliable_work one refuses beyond its limit", () => {
  const live = channelSpecFor("f", "r", "cam", MessagingProfile.liveLatest, { realtimeBuffer: 0 });
  assert.equal(live.retention, Retention.limits);
  assert.equal(live.maxMsgs, 1);
  assert.equal(live.overflow, Overflow.evictOldest);
  assert.equal(live.dedupWindowSeconds, DEDUP_WINDOW_SECONDS);
  assert.equal(live.perSubjectLimits, true);
  assert.equal(live.ownerLabels[OwnerLabel.run], "r");
  assert.equal(live.ownerLabels[OwnerLabel.node], "cam");
  const reliable = channelSpecFor("f", "r", "cam", MessagingProfile.reliableWork, { generation: "g7" });
  assert.equal(reliable.retention, Retention.interest);
  assert.equal(reliable.maxMsgs, 10_000);
  assert.equal(reliable.overflow, Overflow.reject);
  assert.equal(reliable.ownerLabels[OwnerLabel.generation], "g7");
});

Deno.test("durable names follow WIRE.md for shared, partitioned, per-instance EOS and anchor subscriptions", () => {
  const cam = channelId("f", "r", "cam");
  assert.equal(durableNameOf(dataSubscriptionId(cam, "detect")), "detect--from--cam");
  assert.equal(durableNameOf(dataSubscriptionId(cam, "detect", 2)), "detect--from--cam--p2");
  assert.equal(durableNameOf(eosSubscriptionId(cam, "detect", "a1b2")), "detect--eos--cam--a1b2");
  assert.equal(durableNameOf(eosAnchorSubscriptionId(cam)), "cam--eos--anchor");
  assert.throws(() => eosSubscriptionId(cam, "detect", "anchor"), ConfigError);
  const eos = eosSubscriptionSpec(cam, "detect", "a1b2", 3);
  assert.equal(eos.competing, false);
  assert.equal(eos.itemCredit, 6);
  assert.equal(eos.maxDeliver, -1);
});

Deno.test("a flow's topology has a channel per node, a subscription per edge and replica, and an anchor each", () => {
  const topology = flowTopology(FLOW_NODES, { flowId: "f", runId: "r", flowType: "batch", prefetch: 4 });
  assert.deepEqual(topology.channels.map((c) => c.id.node), ["cam", "mic", "detect", "track", "fuse"]);
  const data = topology.subscriptions.filter((s) => s.id.kind === MessageKind.data).map((s) =>
    durableNameOf(s.id)
  );
  assert.deepEqual(data, [
    "detect--from--cam",
    "fuse--from--mic",
    "track--from--detect--p0",
    "track--from--detect--p1",
    "fuse--from--track",
  ]);
  const anchors = topology.subscriptions.filter((s) => s.id.kind === MessageKind.eos);
  assert.equal(anchors.length, 5);
  const byName = new Map(topology.subscriptions.map((s) => [durableNameOf(s.id), s]));
  assert.equal(byName.get("detect--from--cam")?.itemCredit, 15);
  assert.equal(byName.get("detect--from--cam")?.competing, true);
  assert.equal(byName.get("track--from--detect--p1")?.itemCredit, 5);
  assert.equal(byName.get("track--from--detect--p1")?.competing, false);
  const fuseCredit = JoinPolicy.defaultFor("batch").workingSet(2) + 4;
  assert.equal(byName.get("fuse--from--mic")?.itemCredit, fuseCredit);
  assert.equal(byName.get("fuse--from--mic")?.maxDeliver, 4);
  const detect = topology.channels.find((c) => c.id.node === "detect");
  assert.deepEqual(
    detect?.requiredSubscriptions.map((id) => durableNameOf(id)),
    ["track--from--detect--p0", "track--from--detect--p1", "detect--eos--anchor"],
  );
  assert.equal(topology.deadLetter.streamName, "vf-f-dlq");
  assert.equal(topology.deadLetter.subjectFilter, "vf.f._dlq.>");
  assert.equal(topology.deadLetter.maxAgeSeconds, DLQ_RETENTION_SECONDS);
  assert.equal(topology.deadLetter.ownerLabels[OwnerLabel.run], undefined);
});

Deno.test("a batch flow's subscriptions take a deep prefetch by default, a realtime flow's a shallow one; over JetStream both take the spec's", () => {
  assert.equal(defaultPrefetch("batch"), BATCH_PREFETCH);
  assert.equal(defaultPrefetch("realtime"), DEFAULT_PREFETCH);
  assert.equal(defaultPrefetch("batch", true), REFERENCE_PREFETCH);
  assert.equal(defaultPrefetch("realtime", true), REFERENCE_PREFETCH);
  assert.ok(BATCH_PREFETCH > DEFAULT_PREFETCH);
  const credit = (flowType: "batch" | "realtime") =>
    flowTopology(FLOW_NODES, { flowId: "f", runId: "r", flowType }).subscriptions
      .find((s) => durableNameOf(s.id) === "detect--from--cam")?.itemCredit;
  assert.equal(credit("batch"), consumerCredit(3, false, 1, BATCH_PREFETCH));
  assert.equal(credit("realtime"), consumerCredit(3, false, 1, DEFAULT_PREFETCH));
});

Deno.test("a realtime channel keeps one message per replica of its node, so no replica's EOS evicts another's", () => {
  const topology = flowTopology(FLOW_NODES, { flowId: "f", runId: "r", flowType: "realtime" });
  const limits = Object.fromEntries(topology.channels.map((c) => [c.id.node, c.maxMsgs]));
  assert.deepEqual(limits, { cam: 1, mic: 1, detect: 3, track: 2, fuse: 1 });
  assert.ok(topology.channels.every((c) => c.retention === Retention.limits));
  const routing = nodeRouting(FLOW_NODES[2], "realtime");
  assert.equal(routing.delivery.maxDeliver, 1);
  assert.equal(routing.partitioned, false);
});

Deno.test("a channel byte limit, when given, bounds every node's unsettled data: its channel keeps what its replicas' output buffers do not; by default none has one", () => {
  for (const flowType of ["batch", "realtime"] as const) {
    const bounded = flowTopology(FLOW_NODES, { flowId: "f", runId: "r", flowType, channelMaxBytes: 1 << 28 });
    for (const channel of bounded.channels) {
      const { nbTasks } = FLOW_NODES.find((n) => n.name === channel.id.node)!;
      const buffers = nbTasks * replicaOutputBufferBytes(1 << 28, nbTasks);
      assert.equal(channel.maxBytes! + buffers, 1 << 28, `${channel.id.node} (${flowType})`);
      assert.ok(channel.maxBytes! >= 1 << 27, `${channel.id.node} keeps at least half the limit`);
    }
    const unbounded = flowTopology(FLOW_NODES, { flowId: "f", runId: "r", flowType });
    assert.ok(unbounded.channels.every((c) => c.maxBytes === null), flowType);
  }
});

Deno.test("a planner's profile overrides the flow type's for its channel", () => {
  const topology = flowTopology(FLOW_NODES, {
    flowId: "f",
    runId: "r",
    flowType: "realtime",
    profiles: { detect: MessagingProfile.reliableWork },
  });
  const detect = topology.channels.find((c) => c.id.node === "detect");
  assert.equal(detect?.retention, Retention.interest);
  assert.equal(detect?.overflow, Overflow.reject);
});

Deno.test("a topology naming a parent that is not a node of the flow is refused", () => {
  assert.throws(
    () =>
      flowTopology([node("sink", { parents: ["ghost"] })], { flowId: "f", runId: "r", flowType: "batch" }),
    (error: unknown) => error instanceof ConfigError && /ghost/.test(error.message),
  );
});

Deno.test("provisioning is idempotent and reads every channel and subscription back", async () => {
  const clock = new FakeClock();
  const backend = new MemoryMessagingBackend({ clock });
  const topology = flowTopology(FLOW_NODES, { flowId: "f", runId: "r", flowType: "batch" });
  const first = await provisionFlow(backend, topology, "op");
  const again = await provisionFlow(backend, topology, "op");
  assert.equal(first.channels.length, 5);
  assert.equal(first.subscriptions.length, topology.subscriptions.length);
  assert.deepEqual(first.mismatches, []);
  assert.deepEqual(again.mismatches, []);
  assert.equal(backend.subscriptionIds(channelId("f", "r", "detect")).length, 3);
  await backend.shutdown();
});

Deno.test("a refused publication backs off 0.05, 0.1, 0.2, 0.5, 1.0 s and then 1.0 s", () => {
  assert.deepEqual([1, 2, 3, 4, 5, 6, 50].map(publishBackoffSeconds), [0.05, 0.1, 0.2, 0.5, 1, 1, 1]);
  assert.throws(() => publishBackoffSeconds(0), ConfigError);
});
