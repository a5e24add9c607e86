/**
 * The memory broker's two hot-path indexes judged against plain references under random traffic: the
 * duplicate window (its own hash table over publication ids, pruned by time) and a subscription's
 * outstanding set (sequence-ordered arrays behind the ack floor and plain-token lookups).
 *
 * @module
 */

import assert from "node:assert/strict";
import { ConfigError } from "../../../src/core/errors.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  makeChannel,
  makeEnvelope,
  makeSubscription,
  MemoryMessagingBackend,
} from "../../../src/backends/memory/messaging.ts";
import {
  completed,
  type Delivery,
  deliveryToken,
  retry,
  subscriptionId,
} from "../../../src/backends/messaging.ts";
import { requireKnown } from "../../../src/backends/outcomes.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const BIG = 1 << 30;

Deno.test("the duplicate window answers as a map of ids to their first time within the window, through growth, pruning and re-use", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const clock = new FakeClock();
  const broker = new MemoryMessagingBackend({ clock });
  const window = 30;
  const spec = makeChannel("f", "r", "cam", "live_latest", "limits", {
    maxMsgs: 1_000_000,
    dedupWindowSeconds: window,
  });
  await broker.ensureChannel(spec, "ensure");
  const stored = new Map<string, { readonly at: number; readonly seq: number }>();
  let lastSeq = 0;
  const pool = random.int(200, 3000);
  for (let step = 0; step < 20_000; step++) {
    if (random.chance(0.02)) clock.advance(random.pick([0.5, 3, 12, window - 1, window, window + 7]));
    const id = `p-${random.int(0, pool)}-${random.chance(0.5) ? "x" : "long-suffix-of-the-publication"}`;
    const now = clock.monotonic();
    const outcome = await broker.publish(makeEnvelope(spec.id, id), now + 5);
    assert.equal(outcome.kind, "accepted", `seed ${seed} step ${step}`);
    if (outcome.kind !== "accepted") return;
    const known = stored.get(id);
    if (known !== undefined && now - known.at < window) {
      assert.equal(outcome.duplicate, true, `seed ${seed} step ${step}: ${id} is within the window`);
      assert.equal(outcome.sequence, known.seq, `seed ${seed} step ${step}: the first sequence of ${id}`);
    } else {
      assert.equal(outcome.duplicate, false, `seed ${seed} step ${step}: ${id} is new or past the window`);
      assert.equal(outcome.sequence, ++lastSeq, `seed ${seed} step ${step}: a new message`);
      stored.set(id, { at: now, seq: outcome.sequence as number });
    }
  }
});

Deno.test("the ack floor and plain-token settlements follow the outstanding set as messages are leased, retried and settled in any order", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const clock = new FakeClock();
  const broker = new MemoryMessagingBackend({ clock });
  const consumer = subscriptionId(makeChannel("f", "r", "cam", "reliable_work", "interest").id, "detect");
  const spec = makeChannel("f", "r", "cam", "reliable_work", "interest", {
    maxMsgs: 1_000_000,
    required: [consumer],
  });
  await broker.ensureChannel(spec, "ensure");
  await broker.ensureSubscription(
    makeSubscription(spec.id, "detect", { maxDeliver: -1, itemCredit: 10_000, ackWaitSeconds: 600 }),
    "bind",
  );
  const outstanding = new Set<number>();
  let held: Delivery[] = [];
  let published = 0;
  for (let step = 0; step < 3000; step++) {
    const roll = random.next();
    if (roll < 0.35) {
      for (let n = random.int(1, 40); n > 0; n--) {
        const outcome = await broker.publish(makeEnvelope(spec.id, `m${++published}`), clock.monotonic() + 5);
        assert.equal(outcome.kind, "accepted", `seed ${seed}`);
        if (outcome.kind === "accepted") outstanding.add(outcome.sequence as number);
      }
    } else if (roll < 0.6) {
      const batch = await broker.receive(consumer, random.int(1, 64), BIG, clock.monotonic());
      held = held.concat(batch);
    } else if (held.length > 0) {
      held = random.shuffle(held);
      const delivery = held.pop() as Delivery;
      const token = delivery.token;
      const plain = random.chance(0.3)
        ? deliveryToken(
          token.subscription,
          token.messageId,
          token.streamSequence,
          token.attempt,
          token.generation,
        )
        : token;
      const again = random.chance(0.2);
      const settled = await broker.settle(plain, again ? retry() : completed(), `s${step}`);
      assert.equal(settled.kind, "settle_confirmed", `seed ${seed} step ${step}: a live token settles`);
      if (!again) outstanding.delete(token.streamSequence as number);
    }
    const floor = requireKnown(await broker.observeAckFloor(consumer), "ack floor");
    const lowest = outstanding.size === 0 ? published + 1 : Math.min(...outstanding);
    assert.equal(
      floor,
      lowest - 1,
      `seed ${seed} step ${step}: the floor sits below the oldest owed message`,
    );
  }
});

Deno.test("a duplicate window bounded in bytes remembers only the newest ids that fit, and still forgets by time", async () => {
  const clock = new FakeClock();
  const maxBytes = 64 * 1024;
  const broker = new MemoryMessagingBackend({ clock, dedupWindowBytes: maxBytes });
  const spec = makeChannel("f", "r", "cam", "live_latest", "limits", { maxMsgs: 1_000_000 });
  await broker.ensureChannel(spec, "ensure");
  const idOf = (n: number) => `publication-${String(n).padStart(8, "0")}`;
  const published = 20_000;
  for (let n = 0; n < published; n++) {
    const outcome = await broker.publish(makeEnvelope(spec.id, idOf(n)), clock.monotonic() + 5);
    assert.equal(outcome.kind === "accepted" && !outcome.duplicate, true, `${idOf(n)} is new`);
  }
  // Re-publish from the newest back: the remembered ids are a newest run, and the first id past it is new.
  let remembered = 0;
  for (let n = published - 1; n >= 0; n--) {
    const outcome = await broker.publish(makeEnvelope(spec.id, idOf(n)), clock.monotonic() + 5);
    assert.equal(outcome.kind, "accepted");
    if (outcome.kind !== "accepted" || !outcome.duplicate) break;
    remembered++;
  }
  const idBytes = 2 * idOf(0).length;
  assert.ok(remembered <= maxBytes / idBytes, `${remembered} ids of ${idBytes} bytes fit in ${maxBytes}`);
  assert.ok(remembered >= maxBytes / (idBytes + 128), `${remembered} ids: the bound is spent on ids`);
  // Within the bytes, time still forgets: past the 120 s default an id is a new message again.
  clock.advance(121);
  const late = await broker.publish(makeEnvelope(spec.id, idOf(published - 1)), clock.monotonic() + 5);
  assert.equal(late.kind === "accepted" && !late.duplicate, true, "past the window's time it is new");
});

Deno.test("a duplicate window's byte bound must be a whole number of at least 1", () => {
  assert.throws(() => new MemoryMessagingBackend({ dedupWindowBytes: 0 }), ConfigError);
  assert.throws(() => new MemoryMessagingBackend({ dedupWindowBytes: 1.5 }), ConfigError);
});
