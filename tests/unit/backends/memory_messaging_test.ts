/**
 * The messaging contract's records and the in-memory broker's physics: what the conformance stories do not
 * pin down (reconciliation, held acceptance, ages and key slots, waiting receivers, admission, core-only
 * mode, dead letters, archive, control keys, teardown, shutdown, the observation log), and a randomized
 * accounting check on an evicting channel.
 *
 * @module
 */

import { DropReason } from "../../../src/core/metrics.ts";
import assert from "node:assert/strict";
import { ConfigError, IncompatibleProfile, ResourceUnavailable } from "../../../src/core/errors.ts";
import type { Retention } from "../../../src/backends/capabilities.ts";
import { Barrier, delay, dropResponse, FaultSchedule, raiseError } from "../../../src/backends/faults.ts";
import { ownerLabels } from "../../../src/backends/identity.ts";
import type { TimerHandle } from "../../../src/backends/clock.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  CONTROL_STOP_KEY,
  makeChannel,
  type MakeChannelOptions,
  makeEnvelope,
  makeSubscription,
  type MakeSubscriptionOptions,
  MemoryMessagingBackend,
  type MemoryMessagingOptions,
} from "../../../src/backends/memory/messaging.ts";
import {
  channelId,
  channelKey,
  channelSpec,
  checkSettlement,
  completed,
  type Delivery,
  deliveryToken,
  envelope,
  MessageKind,
  Overflow,
  retry,
  type SubscriptionId,
  subscriptionId,
  subscriptionKey,
  subscriptionSpec,
  type Terminal,
  terminal,
} from "../../../src/backends/messaging.ts";
import { ObservationLog } from "../../../src/backends/observation.ts";
import { requireKnown } from "../../../src/backends/outcomes.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const BIG = 1 << 30;

interface Rig {
  readonly clock: FakeClock;
  readonly broker: MemoryMessagingBackend;
}

function rig(options: MemoryMessagingOptions = {}): Rig {
  const clock = new FakeClock();
  return { clock, broker: new MemoryMessagingBackend({ clock, ...options }) };
}

/** A channel "cam" of run r with the given subscriptions bound (and required, on an interest channel). */
async function provisioned(
  { broker }: Rig,
  retention: Retention,
  consumers: readonly (readonly [string, MakeSubscriptionOptions?])[],
  options: MakeChannelOptions = {},
) {
  const id = channelId("f", "r", "cam");
  const subs = consumers.map(([name, subOptions]) => makeSubscription(id, name, subOptions));
  const profile = retention === "interest" ? "reliable_work" : "live_latest";
  const spec = makeChannel("f", "r", "cam", profile, retention, {
    required: subs.map((s) => s.id),
    ...options,
  });
  await broker.ensureChannel(spec, "ensure");
  for (const sub of subs) await broker.ensureSubscription(sub, "bind");
  return { spec, id, subs: subs.map((s) => s.id) };
}

function publish({ broker, clock }: Rig, id = channelId("f", "r", "cam"), publicationId = "p", size = 1) {
  return broker.publish(
    makeEnvelope(id, publicationId, { body: new Uint8Array(size) }),
    clock.monotonic() + 5,
  );
}

function poll({ broker, clock }: Rig, sub: SubscriptionId, credit = 64): Promise<readonly Delivery[]> {
  return broker.receive(sub, credit, BIG, clock.monotonic());
}

async function counts({ broker }: Rig, sub: SubscriptionId) {
  return requireKnown(await broker.observeSubscription(sub), "subscription");
}

function ids(deliveries: readonly Delivery[]): string[] {
  return deliveries.map((d) => d.token.messageId);
}

Deno.test("channelSpec refuses limits, retention, profiles and consumers no broker could apply", () => {
  const good = makeChannel("f", "r", "cam", "reliable_work", "interest");
  const other = subscriptionId(channelId("f", "r", "other"), "sink");
  for (
    const change of [
      { maxMsgs: 0 },
      { maxBytes: 0 },
      { maxAgeSeconds: 0 },
      { dedupWindowSeconds: -1 },
      { replicas: 0 },
      { retention: "work_queue" },
      { profile: "fast" },
      { overflow: "drop_newest" },
      { requiredSubscriptions: [other] },
    ]
  ) {
    assert.throws(() => channelSpec({ ...good, ...change } as never), ConfigError, JSON.stringify(change));
  }
  assert.equal(channelSpec(good).perSubjectLimits, false);
});

Deno.test("subscriptionSpec refuses a competing partition, a zero max_deliver and empty credits", () => {
  const id = channelId("f", "r", "cam");
  const good = makeSubscription(id, "sink");
  assert.equal(good.maxDeliver, 4);
  assert.equal(makeSubscription(id, "sink", { maxDeliver: -1 }).maxDeliver, -1, "-1: unlimited");
  assert.throws(
    () => subscriptionSpec({ ...good, id: subscriptionId(id, "sink", { partition: 1 }) }),
    ConfigError,
  );
  assert.throws(() => subscriptionSpec({ ...good, maxDeliver: 0 }), ConfigError);
  assert.throws(() => subscriptionSpec({ ...good, itemCredit: 0 }), ConfigError);
  assert.throws(() => subscriptionSpec({ ...good, byteCredit: 0 }), ConfigError);
  assert.throws(() => subscriptionSpec({ ...good, ackWaitSeconds: 0 }), ConfigError);
  assert.throws(() => subscriptionId(id, "sink", { kind: "dlq" as never }), ConfigError);
  assert.throws(() => subscriptionId(id, "sink", { partition: -1 }), ConfigError);
});

Deno.test("envelope sizes itself from the body, keeps the bytes it was given and refuses unknown kinds", () => {
  const body = new Uint8Array([1, 2, 3]);
  const env = envelope({
    channel: channelId("f", "r", "cam"),
    publicationId: "p",
    eventId: "e",
    body,
    schemaVersion: 4,
  });
  assert.equal(env.size, 3);
  assert.equal(env.body, body, "not copied");
  assert.deepEqual([env.kind, env.partitionKey, env.payloadRefs], ["data", null, []]);
  assert.throws(() => envelope({ ...env, kind: "control" as never }), ConfigError);
  assert.throws(() => envelope({ ...env, publicationId: "" }), ConfigError);
  assert.equal(
    makeEnvelope(env.channel, "q").eventId,
    "q",
    "the test helper's event id is the publication id",
  );
});

Deno.test("keys of channels and subscriptions never confuse parts that contain separators", () => {
  assert.notEqual(channelKey(channelId("a-b", "c", "d")), channelKey(channelId("a", "b-c", "d")));
  const ch = channelId("f", "r", "cam");
  const keys = [
    subscriptionId(ch, "x"),
    subscriptionId(ch, "x", { partition: 0 }),
    subscriptionId(ch, "x", { kind: MessageKind.eos }),
    subscriptionId(ch, "x", { kind: MessageKind.eos, instance: "i" }),
    subscriptionId(channelId("f", "r", "cam2"), "x"),
  ].map(subscriptionKey);
  assert.equal(new Set(keys).size, keys.length);
});

Deno.test("a terminal settlement needs a record, a retry a sane delay, and checkSettlement re-checks literals", () => {
  assert.throws(() => terminal(""), ConfigError);
  assert.throws(() => retry(-1), ConfigError);
  assert.throws(() => retry(Number.NaN), ConfigError);
  assert.throws(() => checkSettlement({ kind: "terminal", recordRef: "" } as Terminal), ConfigError);
  assert.throws(() => checkSettlement({ kind: "retry", delaySeconds: -2 }), ConfigError);
  assert.equal(checkSettlement(terminal("dlq:1")).kind, "terminal");
  assert.equal(checkSettlement(completed()), completed());
});

Deno.test("capabilities: a retained broker offers backlog, redelivery and a dedup ledger; core-only none", async () => {
  const retained = await rig({ archive: true, dedupWindowSeconds: 60 }).broker.capabilities();
  assert.deepEqual(
    [
      retained.retainedBacklog,
      retained.recoverableDelivery,
      retained.dedupWindowSeconds,
      retained.publicationLedger,
    ],
    [true, true, 60, "window"],
  );
  assert.equal(retained.archive, true);
  assert.equal(requireKnown(retained.maxPayloadBytes, "max payload"), 8 * 1024 * 1024);
  const core = await rig({ coreOnly: true }).broker.capabilities();
  assert.deepEqual(
    [core.retainedBacklog, core.recoverableDelivery, core.dedupWindowSeconds, core.publicationLedger],
    [false, false, null, "none"],
  );
});

Deno.test("ensureChannel reads back the effective config and names a duplicate window the broker caps", async () => {
  const { broker } = rig({ dedupWindowSeconds: 60 });
  const verified = await broker.ensureChannel(
    makeChannel("f", "r", "cam", "reliable_work", "interest"),
    "op",
  );
  assert.equal(verified.effective.dedup_window_seconds, 60);
  assert.equal(verified.effective.retention, "interest");
  assert.deepEqual(verified.mismatches, ["dedup_window_seconds"]);
});

Deno.test("ensureChannel refuses what the broker lacks and immutable changes; tighter limits trim with drops", async () => {
  const r = rig();
  await assert.rejects(
    r.broker.ensureChannel(makeChannel("f", "r", "a", "reliable_work", "interest", { replicas: 3 }), "op"),
    IncompatibleProfile,
  );
  await assert.rejects(
    r.broker.ensureChannel(
      makeChannel("f", "r", "a", "reliable_work", "interest", { persistence: true }),
      "op",
    ),
    IncompatibleProfile,
  );
  await assert.rejects(
    rig({ coreOnly: true }).broker.ensureChannel(
      makeChannel("f", "r", "a", "reliable_work", "interest"),
      "op",
    ),
    IncompatibleProfile,
  );
  const { spec, subs } = await provisioned(r, "limits", [["sink"]], { maxMsgs: 5 });
  for (let i = 0; i < 5; i++) await publish(r, spec.id, `p${i}`);
  await assert.rejects(r.broker.ensureChannel({ ...spec, retention: "interest" }, "op"), IncompatibleProfile);
  await r.broker.ensureChannel(channelSpec({ ...spec, maxMsgs: 2 }), "op");
  assert.equal((await counts(r, subs[0])).dropped, 3);
  assert.deepEqual(ids(await poll(r, subs[0])), ["p3", "p4"]);
});

Deno.test("ensureSubscription needs its channel, keeps its generation and refuses a change of mode", async () => {
  const r = rig();
  const id = channelId("f", "r", "cam");
  await assert.rejects(r.broker.ensureSubscription(makeSubscription(id, "sink"), "op"), ResourceUnavailable);
  await r.broker.ensureChannel(makeChannel("f", "r", "cam", "live_latest", "limits"), "op");
  const first = await r.broker.ensureSubscription(makeSubscription(id, "sink"), "op");
  const again = await r.broker.ensureSubscription(makeSubscription(id, "sink", { itemCredit: 2 }), "op");
  assert.equal(again.effective.generation, first.effective.generation);
  assert.equal(again.effective.max_ack_pending, 2);
  await assert.rejects(
    r.broker.ensureSubscription({ ...makeSubscription(id, "sink"), competing: false }, "op"),
    IncompatibleProfile,
  );
  await assert.rejects(poll(r, subscriptionId(id, "nobody")), ResourceUnavailable);
});

Deno.test("a subscription bound after messages were stored receives every retained message of its kind", async () => {
  const r = rig();
  const { spec } = await provisioned(r, "limits", []);
  await publish(r, spec.id, "d1");
  await r.broker.publish(makeEnvelope(spec.id, "e1", { kind: MessageKind.eos }), r.clock.monotonic() + 5);
  await publish(r, spec.id, "d2");
  const late = makeSubscription(spec.id, "late");
  await r.broker.ensureSubscription(late, "op");
  assert.deepEqual(ids(await poll(r, late.id)), ["d1", "d2"]);
  assert.deepEqual(r.broker.subscriptionIds(spec.id), [late.id]);
});

Deno.test("a duplicate within the window shares the first sequence; past the window a retry is new", async () => {
  const r = rig();
  const { spec } = await provisioned(r, "limits", [["sink"]]);
  const first = await publish(r, spec.id, "p1");
  const dup = await publish(r, spec.id, "p1");
  assert.ok(first.kind === "accepted" && dup.kind === "accepted");
  assert.deepEqual([dup.sequence, dup.duplicate], [first.sequence, true]);
  r.clock.advance(120);
  const later = await publish(r, spec.id, "p1");
  assert.ok(later.kind === "accepted" && !later.duplicate && later.sequence !== first.sequence);
  assert.equal(r.broker.stored(spec.id).length, 2);
});

Deno.test("a publication over the payload limit or max_bytes is refused for good; a past deadline sends nothing", async () => {
  const r = rig({ maxPayloadBytes: 100 });
  const { spec } = await provisioned(r, "limits", [["sink"]], { maxBytes: 50 });
  const huge = await publish(r, spec.id, "huge", 101);
  assert.ok(huge.kind === "rejected" && !huge.retryable);
  const wide = await publish(r, spec.id, "wide", 60);
  assert.ok(wide.kind === "rejected" && !wide.retryable);
  const late = await r.broker.publish(makeEnvelope(spec.id, "late"), r.clock.monotonic());
  assert.ok(late.kind === "rejected" && late.retryable);
  assert.equal(r.broker.stored(spec.id).length, 0);
});

Deno.test("held acceptance: unknown past the deadline, stored in order on resume, refused when cancelled", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "interest", [["sink"]]);
  r.broker.pauseAcceptance(spec.id);
  const a = publish(r, spec.id, "a");
  const b = publish(r, spec.id, "b");
  const c = publish(r, spec.id, "c");
  assert.equal((await r.broker.observePublication(makeEnvelope(spec.id, "a"))).kind, "publication_unknown");
  assert.equal(r.broker.cancelPublication(spec.id, "c"), true);
  assert.equal(r.broker.cancelPublication(spec.id, "c"), false, "nothing held under that id any more");
  const cancelled = await c;
  assert.ok(cancelled.kind === "rejected" && cancelled.retryable);
  await r.clock.advanceAsync(6);
  assert.deepEqual([(await a).kind, (await b).kind], ["publication_unknown", "publication_unknown"]);
  assert.equal(r.broker.stored(spec.id).length, 0, "nothing stored while held");
  const outcomes = r.broker.resumeAcceptance(spec.id);
  assert.deepEqual(outcomes.map((o) => o.kind), ["accepted", "accepted"]);
  assert.deepEqual(ids(await poll(r, subs[0])), ["a", "b"]);
  const resolved = await r.broker.observePublication(makeEnvelope(spec.id, "b"));
  assert.ok(resolved.kind === "accepted" && resolved.duplicate);
  assert.equal(
    (await r.broker.observePublication(makeEnvelope(spec.id, "c"))).kind,
    "publication_unresolvable",
  );
});

Deno.test("an unknown publication never stored is re-published by observePublication inside the window", async () => {
  const r = rig();
  const { spec } = await provisioned(r, "limits", [["sink"]]);
  r.broker.pauseAcceptance(spec.id);
  const pending = publish(r, spec.id, "lost");
  await r.clock.advanceAsync(6);
  assert.equal((await pending).kind, "publication_unknown");
  assert.equal(r.broker.cancelPublication(spec.id, "lost"), true);
  r.broker.resumeAcceptance(spec.id);
  const observed = await r.broker.observePublication(makeEnvelope(spec.id, "lost"));
  assert.ok(observed.kind === "accepted" && !observed.duplicate, "stored now, once");
  assert.equal(r.broker.stored(spec.id).length, 1);
});

Deno.test("an interest message stays until every required subscription settled it, bound or not", async () => {
  const r = rig();
  const id = channelId("f", "r", "cam");
  const bound = makeSubscription(id, "bound");
  const unbound = subscriptionId(id, "unbound");
  await r.broker.ensureChannel(
    makeChannel("f", "r", "cam", "reliable_work", "interest", { required: [bound.id, unbound] }),
    "op",
  );
  await r.broker.ensureSubscription(bound, "op");
  await publish(r, id, "p1");
  for (const d of await poll(r, bound.id)) await r.broker.settle(d.token, completed(), "s");
  assert.equal(r.broker.stored(id).length, 1, "the unbound consumer still owes it");
  const latecomer = makeSubscription(id, "unbound");
  await r.broker.ensureSubscription(latecomer, "op");
  for (const d of await poll(r, latecomer.id)) await r.broker.settle(d.token, completed(), "s");
  assert.equal(r.broker.stored(id).length, 0);
});

Deno.test("a limits channel drops what outlives max_age, recording the drop", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "limits", [["sink"]], { maxAgeSeconds: 10 });
  await publish(r, spec.id, "old");
  r.clock.advance(6);
  await publish(r, spec.id, "young");
  r.clock.advance(5);
  assert.deepEqual(ids(await poll(r, subs[0])), ["young"]);
  assert.equal((await counts(r, subs[0])).dropped, 1);
  assert.equal(requireKnown(await r.broker.observeChannel(spec.id), "channel").firstSeq, 2);
});

Deno.test("latest_per_key keeps one message per partition key; the superseded one is a recorded drop", async () => {
  const log = new ObservationLog();
  const r = rig({ latestPerKey: true, log });
  const { spec, subs } = await provisioned(r, "limits", [["sink"]]);
  for (const [pub, key] of [["a1", "a"], ["b1", "b"], ["a2", "a"], ["none", null]] as const) {
    await r.broker.publish(makeEnvelope(spec.id, pub, { partitionKey: key }), r.clock.monotonic() + 5);
  }
  assert.deepEqual(ids(await poll(r, subs[0])), ["b1", "a2", "none"]);
  assert.equal((await counts(r, subs[0])).dropped, 1);
  assert.deepEqual(log.events("drop").map((e) => [e.fields.op_id, e.fields.reason]), [[
    "a1",
    DropReason.superseded,
  ]]);
});

Deno.test("a waiting receive wakes for a publication, for a lapsed lease, and returns [] at its deadline", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "interest", [["sink", { ackWaitSeconds: 10 }]]);
  const sink = subs[0];
  const waiting = r.broker.receive(sink, 8, BIG, r.clock.monotonic() + 60);
  await publish(r, spec.id, "p1");
  const [first] = await waiting;
  assert.equal(first.token.messageId, "p1");
  const redelivery = r.broker.receive(sink, 8, BIG, r.clock.monotonic() + 60);
  await r.clock.advanceAsync(10);
  assert.equal((await redelivery)[0].token.attempt, 2, "woken by the lapse, at the lapse");
  const empty = r.broker.receive(sink, 8, BIG, r.clock.monotonic() + 5);
  await r.clock.advanceAsync(5);
  assert.deepEqual(await empty, []);
});

/** A FakeClock that refuses to arm more than `limit` timers, so a timer re-arming itself fails instead of hanging. */
class BoundedClock extends FakeClock {
  #armed = 0;

  constructor(readonly limit: number) {
    super();
  }

  override setTimer(seconds: number, callback: () => void): TimerHandle {
    if (++this.#armed > this.limit) {
      throw new Error(`more than ${this.limit} timers armed: a timer re-arms itself without time passing`);
    }
    return super.setTimer(seconds, callback);
  }
}

Deno.test("a waiting receive whose deadline or lease expiry falls between microsecond ticks wakes once, on time", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let round = 0; round < 20; round++) {
    // Whole seconds plus a fraction of a microsecond: FakeClock timers fire on whole microseconds, so the
    // timer of such an instant fires a rounding error away from it (short of it, for fractions below 0.5).
    const fraction = (round === 0 ? 0.4 : random.next()) * 1e-6;
    const clock = new BoundedClock(16);
    const r: Rig = { clock, broker: new MemoryMessagingBackend({ clock }) };
    const ackWait = random.int(1, 5) + fraction;
    const { spec, subs } = await provisioned(r, "interest", [["sink", { ackWaitSeconds: ackWait }]]);
    const deadlineIn = random.int(1, 5) + fraction;
    const empty = r.broker.receive(subs[0], 8, BIG, clock.monotonic() + deadlineIn);
    clock.advance(deadlineIn + 1);
    assert.deepEqual(await empty, [], `seed ${seed}, round ${round}: the deadline returns nothing`);
    await publish(r, spec.id, "p1");
    assert.equal((await poll(r, subs[0])).length, 1, `seed ${seed}, round ${round}`);
    const redelivery = r.broker.receive(subs[0], 8, BIG, clock.monotonic() + 60);
    const leasedAt = clock.monotonic();
    clock.advance(ackWait + 1);
    const [again] = await redelivery;
    assert.equal(again?.token.attempt, 2, `seed ${seed}, round ${round}: woken by the lapsed lease`);
    assert.ok(
      Math.abs(clock.monotonic() - leasedAt - (ackWait + 1)) < 1e-6 && clock.pendingTimers() === 0,
      `seed ${seed}, round ${round}: no timer left armed`,
    );
  }
});

Deno.test("receiveAny serves whichever subscription has work; each delivery names its subscription", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "interest", [["a"], ["b", { partition: 0 }]]);
  const waiting = r.broker.receiveAny(subs, 8, BIG, r.clock.monotonic() + 60);
  await publish(r, spec.id, "p1");
  const got = await waiting;
  assert.ok(got.length >= 1, "woken by the publication");
  const rest = await r.broker.receiveAny(subs, 8, BIG, r.clock.monotonic());
  assert.deepEqual(
    [...got, ...rest].map((d) => d.token.subscription.consumerNode).sort(),
    ["a", "b"],
    "both consumers received p1, each through its own subscription",
  );
  await assert.rejects(r.broker.receiveAny([], 8, BIG, 0), ConfigError);
});

Deno.test("a retry with a delay comes back only once the delay has passed", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "interest", [["sink"]]);
  await publish(r, spec.id, "p1");
  const [d] = await poll(r, subs[0]);
  await r.broker.settle(d.token, retry(5), "s");
  assert.equal((await counts(r, subs[0])).available, 1, "pending redelivery counts as available");
  assert.equal((await poll(r, subs[0])).length, 0);
  const waiting = r.broker.receive(subs[0], 8, BIG, r.clock.monotonic() + 60);
  await r.clock.advanceAsync(5);
  assert.equal((await waiting)[0].token.attempt, 2);
});

Deno.test("renew extends a live lease; a lapsed, superseded or settled one is not renewed", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "interest", [["sink", { ackWaitSeconds: 10 }]]);
  await publish(r, spec.id, "p1");
  await publish(r, spec.id, "p2");
  const [d1, d2] = await poll(r, subs[0]);
  r.clock.advance(8);
  const renewed = await r.broker.renew(d1.token);
  assert.deepEqual([renewed.renewed, renewed.expiresAt], [true, r.clock.monotonic() + 10]);
  r.clock.advance(3);
  assert.deepEqual(ids(await poll(r, subs[0])), ["p2"], "p1's renewed lease holds, p2's lapsed");
  const lapsed = await r.broker.renew(d2.token);
  assert.equal(lapsed.renewed, false);
  await r.broker.settle(d1.token, completed(), "s");
  assert.equal((await r.broker.renew(d1.token)).renewed, false);
});

Deno.test("a Delay at message.renew.before past the lease: the renewal finds it lapsed", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "interest", [["sink", { ackWaitSeconds: 10 }]]);
  await publish(r, spec.id, "p1");
  const [d] = await poll(r, subs[0]);
  using schedule = new FaultSchedule({ [Barrier.messageRenewBefore]: delay(20) }, { clock: r.clock })
    .install();
  const renewal = r.broker.renew(d.token);
  await r.clock.advanceAsync(20);
  const lease = await renewal;
  assert.equal(lease.renewed, false);
  assert.match(lease.reason, /lapsed|superseded/);
  schedule.assertAllFired();
});

Deno.test("a token rebuilt from its fields (as across a MessagePort) settles, and goes stale, like the original", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "interest", [["sink", { ackWaitSeconds: 10 }]]);
  await publish(r, spec.id, "p1");
  const [d] = await poll(r, subs[0]);
  const copy = (attempt: number) =>
    deliveryToken(
      subscriptionId(channelId("f", "r", "cam"), "sink"),
      d.token.messageId,
      d.token.streamSequence,
      attempt,
      d.token.generation,
    );
  r.clock.advance(11);
  await poll(r, subs[0]);
  assert.equal((await r.broker.settle(copy(1), completed(), "s")).kind, "settle_stale");
  assert.equal((await r.broker.settle(copy(2), completed(), "s")).kind, "settle_confirmed");
  assert.equal(r.broker.stored(spec.id).length, 0);
  const foreign = deliveryToken(d.token.subscription, "p1", 1, 2, "other-generation");
  assert.equal((await r.broker.settle(foreign, completed(), "s")).kind, "settle_stale");
});

Deno.test("failObservation makes counters Unknown until cleared; the ack floor follows the oldest owed message", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "limits", [["sink"]]);
  for (const p of ["p1", "p2", "p3"]) await publish(r, spec.id, p);
  const [d1, d2] = await poll(r, subs[0], 2);
  await r.broker.settle(d2.token, completed(), "s");
  assert.equal(requireKnown(await r.broker.observeAckFloor(subs[0]), "floor"), 0, "p1 is still owed");
  await r.broker.settle(d1.token, completed(), "s");
  assert.equal(requireKnown(await r.broker.observeAckFloor(subs[0]), "floor"), 2);
  r.broker.failObservation(subs[0], "unreachable");
  const failed = await r.broker.observeSubscription(subs[0]);
  assert.ok(failed.kind === "unknown" && failed.reason === "unreachable");
  assert.equal((await r.broker.observeAckFloor(subs[0])).kind, "unknown");
  r.broker.failObservation(subs[0], null);
  assert.equal((await counts(r, subs[0])).available, 1);
  assert.equal((await r.broker.observeSubscription(subscriptionId(spec.id, "ghost"))).kind, "unknown");
});

Deno.test("admission settles refused deliveries at once, hands them to onSkip, and counts them", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "interest", [["sink", { itemCredit: 2 }]]);
  const skipped: string[] = [];
  const admit = (d: Delivery) => !d.token.messageId.startsWith("skip");
  assert.equal(r.broker.setAdmission(subs[0], admit, (d) => skipped.push(d.token.messageId)), true);
  for (const p of ["skip", "a", "skip2", "b"]) await publish(r, spec.id, p);
  assert.deepEqual(ids(await poll(r, subs[0])), ["a", "b"], "refusals do not use the credit");
  await Promise.resolve();
  assert.deepEqual(skipped, ["skip", "skip2"]);
  assert.equal(r.broker.skipped(subs[0]), 2);
  assert.equal(r.broker.stored(spec.id).length, 2, "the refused ones were settled and left");
});

Deno.test("core-only: no sequence, no ack floor, no ledger, and a retry is a recorded drop", async () => {
  const r = rig({ coreOnly: true });
  const { spec, subs } = await provisioned(r, "limits", [["sink"]]);
  const outcome = await publish(r, spec.id, "p1");
  assert.ok(outcome.kind === "accepted" && outcome.sequence === null);
  const [d] = await poll(r, subs[0]);
  assert.equal(d.token.streamSequence, null);
  assert.equal((await r.broker.observeAckFloor(subs[0])).kind, "unknown");
  assert.equal(
    (await r.broker.observePublication(makeEnvelope(spec.id, "p1"))).kind,
    "publication_unresolvable",
  );
  assert.equal((await r.broker.settle(d.token, retry(), "s")).kind, "settle_confirmed");
  assert.equal((await counts(r, subs[0])).dropped, 1);
  assert.equal((await r.broker.renew(d.token)).renewed, false, "no leases to renew");
});

Deno.test("dead letters are kept apart, listed by stored(), deduplicated, and outlive close", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "limits", [["sink"]], {
    maxMsgs: 1,
    overflow: Overflow.reject,
  });
  await publish(r, spec.id, "d1");
  const letter = makeEnvelope(spec.id, "dlq:f:r:cam:1", { kind: MessageKind.dlq });
  assert.equal((await r.broker.publish(letter, r.clock.monotonic() + 5)).kind, "accepted");
  const again = await r.broker.publish(letter, r.clock.monotonic() + 5);
  assert.ok(again.kind === "accepted" && again.duplicate);
  assert.deepEqual(r.broker.stored(spec.id).map((e) => e.publicationId), ["d1", "dlq:f:r:cam:1"]);
  assert.equal((await counts(r, subs[0])).rejectedPublications, 0);
  await r.broker.close([spec.id], "");
  assert.deepEqual(r.broker.stored(spec.id).map((e) => e.publicationId), ["dlq:f:r:cam:1"]);
});

Deno.test("an archived envelope is replayable within its horizon, after close too, and not past it", async () => {
  const r = rig({ archive: true, archiveHorizonSeconds: 100 });
  const { spec } = await provisioned(r, "limits", [["sink"]]);
  await r.broker.publish(makeEnvelope(spec.id, "p1", { eventId: "event-1" }), r.clock.monotonic() + 5);
  await r.broker.close([spec.id], "");
  assert.equal(r.broker.replay(spec.id, "event-1")?.publicationId, "p1");
  r.clock.advance(100);
  assert.equal(r.broker.replay(spec.id, "event-1"), null);
  assert.equal(rig().broker.replay(spec.id, "event-1"), null, "no archive, nothing to replay");
});

Deno.test("commitControl is a compare-and-swap, and committing the stop wakes every control subscriber", async () => {
  const r = rig({ durableControl: true });
  const id = channelId("f", "r", "cam");
  let woken = 0;
  r.broker.subscribeControl(() => woken++);
  const value = new TextEncoder().encode("stop");
  assert.equal(r.broker.commitControl(id, CONTROL_STOP_KEY, "9", value), false, "nothing to swap yet");
  assert.equal(r.broker.commitControl(id, CONTROL_STOP_KEY, null, value), true);
  const state = r.broker.controlState(id, CONTROL_STOP_KEY);
  assert.deepEqual(state.value, value);
  assert.equal(r.broker.commitControl(id, CONTROL_STOP_KEY, null, value), false, "it exists now");
  assert.equal(r.broker.commitControl(id, CONTROL_STOP_KEY, state.version, value), true);
  await Promise.resolve();
  assert.equal(woken, 1, "one stop, one wake");
  r.broker.subscribeControl(() => woken++);
  await Promise.resolve();
  assert.equal(woken, 2, "a late subscriber learns of the stop already committed");
  assert.deepEqual(r.broker.controlState(id, "absent"), { value: null, version: null });
});

Deno.test("close leaves another generation's channel, ends waiting receives and refuses held publications", async () => {
  const r = rig();
  const ours = makeChannel("f", "r", "a", "live_latest", "limits", {
    ownerLabels: ownerLabels("f", "r", "a", null, "g1"),
  });
  const newer = makeChannel("f", "r", "b", "live_latest", "limits", {
    ownerLabels: ownerLabels("f", "r", "b", null, "g2"),
  });
  await r.broker.ensureChannel(ours, "op");
  await r.broker.ensureChannel(newer, "op");
  const sink = makeSubscription(ours.id, "sink");
  await r.broker.ensureSubscription(sink, "op");
  const waiting = r.broker.receive(sink.id, 8, BIG, r.clock.monotonic() + 60);
  r.broker.pauseAcceptance(ours.id);
  const held = publish(r, ours.id, "held");
  const result = await r.broker.close([ours.id, newer.id, channelId("f", "r", "never")], "g1");
  assert.deepEqual([result.complete, result.removed, result.remaining], [false, ["vf-f-r-a"], ["vf-f-r-b"]]);
  assert.match(result.reason, /g1/);
  assert.deepEqual(await waiting, []);
  const refused = await held;
  assert.ok(refused.kind === "rejected" && !refused.retryable);
  assert.deepEqual(r.broker.channelIds(), [newer.id]);
});

Deno.test("settling after the channel was closed is SettleUnknown, never confirmed", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "interest", [["sink"]]);
  await publish(r, spec.id, "p1");
  const [d] = await poll(r, subs[0]);
  await r.broker.close([spec.id], "");
  assert.equal((await r.broker.settle(d.token, completed(), "s")).kind, "settle_unknown");
});

Deno.test("shutdown ends waiting receives and held publishers, and refuses every later call", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "interest", [["sink"]]);
  const waiting = r.broker.receive(subs[0], 8, BIG, r.clock.monotonic() + 60);
  r.broker.pauseAcceptance(spec.id);
  const held = publish(r, spec.id, "held");
  await r.broker.shutdown();
  assert.deepEqual(await waiting, []);
  assert.equal((await held).kind, "publication_unknown", "the broker still holds it");
  await assert.rejects(publish(r, spec.id, "after"), ResourceUnavailable);
  await assert.rejects(poll(r, subs[0]), ResourceUnavailable);
  await r.broker.shutdown();
});

Deno.test("a raise at message.receive.after loses the response, not the messages; a drop returns nothing", async () => {
  const r = rig();
  const { spec, subs } = await provisioned(r, "interest", [["sink", { ackWaitSeconds: 10 }]]);
  await publish(r, spec.id, "p1");
  {
    using schedule = new FaultSchedule({
      [Barrier.messageReceiveAfter]: raiseError(() => new Error("the worker died reading")),
    }).install();
    await assert.rejects(poll(r, subs[0]), /died reading/);
    schedule.assertAllFired();
  }
  assert.equal((await counts(r, subs[0])).leased, 1, "leased to a receiver that never saw it");
  r.clock.advance(10);
  {
    using schedule = new FaultSchedule({ [Barrier.messageReceiveAfter]: dropResponse() }).install();
    assert.deepEqual(await poll(r, subs[0]), []);
    schedule.assertAllFired();
  }
  r.clock.advance(10);
  assert.deepEqual((await poll(r, subs[0])).map((d) => d.token.attempt), [3]);
});

Deno.test("the byte budget pauses receives, counts the pauses, and a settle wakes a waiting receive", async () => {
  const r = rig({ byteBudget: 150 });
  const { spec, subs } = await provisioned(r, "interest", [["sink", { itemCredit: 100 }]]);
  for (let i = 0; i < 4; i++) await publish(r, spec.id, `p${i}`, 100);
  const held = await poll(r, subs[0]);
  assert.equal(held.length, 2, "100 + 100 overshoots 150 by one message, no more");
  assert.equal(r.broker.residentBytes(), 200);
  const waiting = r.broker.receive(subs[0], 8, BIG, r.clock.monotonic() + 60);
  assert.ok(r.broker.budgetWaits() >= 1);
  await r.broker.settle(held[0].token, completed(), "s");
  const woken = await waiting;
  assert.equal(woken.length, 1, "woken by the settle that made room, and taking what the budget allows");
  assert.equal(r.broker.residentBytes(), 200);
});

Deno.test("the observation log records publish, deliver, settle, drop and unresolved events", async () => {
  const log = new ObservationLog();
  const r = rig({ log });
  const { spec, subs } = await provisioned(r, "limits", [["sink", { maxDeliver: 1 }]], { maxMsgs: 1 });
  await publish(r, spec.id, "p1");
  const [d] = await poll(r, subs[0]);
  await r.broker.settle(d.token, retry(), "s-1");
  await publish(r, spec.id, "p2");
  const [d2] = await poll(r, subs[0]);
  await r.broker.settle(d2.token, terminal("dlq:7"), "s-2");
  assert.deepEqual(log.events().map((e) => e.kind), [
    "publish",
    "deliver",
    "unresolved",
    "settle",
    "drop",
    "publish",
    "deliver",
    "settle",
  ]);
  assert.equal(log.events("settle")[1].fields.reason, "dlq:7");
  assert.equal(log.events("drop")[0].fields.reason, DropReason.evicted);
});

Deno.test("randomized: on an evicting channel each accepted message ends settled, dropped with a record, or owed", async () => {
  const seed = testSeed();
  for (let round = 0; round < 20; round++) {
    const random = new SeededRandom(seed + round);
    const log = new ObservationLog();
    const r = rig({ log });
    const maxMsgs = random.int(1, 6);
    const { spec, subs } = await provisioned(r, "limits", [["a", { ackWaitSeconds: 5 }], ["b", {
      ackWaitSeconds: 5,
    }]], {
      maxMsgs,
      perSubjectLimits: random.chance(0.5),
    });
    const accepted = new Set<string>();
    const settled = subs.map(() => new Set<string>());
    for (let step = 0; step < 120; step++) {
      const op = random.int(0, 5);
      if (op <= 1) {
        const kind = random.chance(0.2) ? MessageKind.eos : MessageKind.data;
        const id = `m${step}`;
        const outcome = await r.broker.publish(makeEnvelope(spec.id, id, { kind }), r.clock.monotonic() + 5);
        assert.equal(outcome.kind, "accepted", `seed ${seed + round}: an evicting channel never refuses`);
        if (kind === MessageKind.data) accepted.add(id);
      } else if (op <= 3) {
        const c = random.int(0, 1);
        for (const d of await poll(r, subs[c], random.int(1, 3))) {
          if (!random.chance(0.7)) continue;
          const outcome = await r.broker.settle(d.token, completed(), `s${step}`);
          if (
            outcome.kind === "settle_confirmed" &&
            !log.events("drop", { op_id: d.token.messageId, consumer: subs[c].consumerNode }).length
          ) {
            assert.ok(
              !settled[c].has(d.token.messageId),
              `seed ${seed + round}: ${d.token.messageId} settled twice`,
            );
            settled[c].add(d.token.messageId);
          }
        }
      } else {
        r.clock.advance(random.pick([1, 3, 6]));
      }
    }
    for (let c = 0; c < subs.length; c++) {
      const consumer = subs[c].consumerNode;
      const drops = new Map<string, number>();
      for (const event of log.events("drop", { consumer })) {
        const id = String(event.fields.op_id);
        drops.set(id, (drops.get(id) ?? 0) + 1);
      }
      const observed = await counts(r, subs[c]);
      assert.equal(observed.dropped, [...drops.values()].reduce((a, b) => a + b, 0), `seed ${seed + round}`);
      const owed = observed.available + observed.leased + observed.unresolved;
      const byReason: Record<string, number> = {};
      for (const event of log.events("drop", { consumer })) {
        const reason = String(event.fields.reason);
        byReason[reason] = (byReason[reason] ?? 0) + 1;
      }
      assert.deepEqual(r.broker.drops(subs[c]), byReason, `seed ${seed + round}: drops by reason`);
      assert.equal(r.broker.unsettled(subs[c]), owed, `seed ${seed + round}: unsettled, read directly`);
      for (const [id, times] of drops) {
        assert.equal(times, 1, `seed ${seed + round}: ${id} dropped twice for ${consumer}`);
        assert.ok(
          !settled[c].has(id),
          `seed ${seed + round}: ${id} both settled and dropped for ${consumer}`,
        );
      }
      assert.equal(
        settled[c].size + drops.size + owed,
        accepted.size,
        `seed ${seed + round}: ${consumer} lost or invented a message`,
      );
    }
  }
});

Deno.test("an eviction counts as a drop either way, and as unseen only when no consumer had been handed it", async () => {
  const r = rig();
  const { subs: [sub] } = await provisioned(r, "limits", [["det"]], { maxMsgs: 1 });
  await publish(r, undefined, "p1");
  assert.deepEqual(ids(await poll(r, sub)), ["p1"], "p1 is handed out and held");
  await publish(r, undefined, "p2");
  await publish(r, undefined, "p3");
  assert.deepEqual(r.broker.drops(sub), { evicted: 2 }, "p1 (held) and p2 (never handed out) evicted");
  assert.deepEqual(r.broker.unseenDrops(sub), { evicted: 1 }, "only p2 went unseen");
  assert.equal((await counts(r, sub)).dropped, 2);
});

Deno.test("a subscription told which messages it owns counts only its own evictions as unseen", async () => {
  const r = rig();
  const { subs: [sub] } = await provisioned(r, "limits", [["det"]], { maxMsgs: 1 });
  r.broker.setDropOwnership(sub, (envelope) => envelope.publicationId !== "p2");
  await publish(r, undefined, "p1");
  await publish(r, undefined, "p2");
  await publish(r, undefined, "p3");
  assert.deepEqual(r.broker.drops(sub), { evicted: 2 }, "the broker lost p1 and p2 for this subscription");
  assert.deepEqual(r.broker.unseenDrops(sub), { evicted: 1 }, "only p1 was its own");
});

Deno.test("an abandoned subscription releases what it held (consumer_gone drops) and holds nothing new", async () => {
  const r = rig();
  const { spec, subs: [gone, other] } = await provisioned(r, "interest", [["writer"], ["sink"]], {
    maxMsgs: 2,
    overflow: Overflow.reject,
  });
  await publish(r, spec.id, "p1");
  await publish(r, spec.id, "p2");
  assert.equal((await poll(r, gone, 1)).length, 1, "one is handed to the writer, which then dies");
  for (const delivery of await poll(r, other)) {
    assert.equal(
      (await r.broker.settle(delivery.token, completed(), `s-${delivery.token.messageId}`)).kind,
      "settle_confirmed",
    );
  }
  const full = await publish(r, spec.id, "p3");
  assert.ok(full.kind === "rejected" && full.retryable, "the writer holds the channel full");
  assert.equal(r.broker.abandon(gone), 2);
  assert.equal(r.broker.abandon(gone), 0, "once");
  assert.deepEqual(r.broker.drops(gone), { consumer_gone: 2 });
  assert.deepEqual(r.broker.unseenDrops(gone), { consumer_gone: 1 }, "one of them had been handed out");
  assert.equal((await publish(r, spec.id, "p3")).kind, "accepted", "room again");
  assert.equal(r.broker.unsettled(gone), 0, "nothing new is held for it");
  assert.deepEqual((await poll(r, other)).map((d) => d.token.messageId), ["p3"]);
});
