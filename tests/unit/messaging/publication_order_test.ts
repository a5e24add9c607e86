/**
 * A publisher's order across refusals over a backend that keeps it: {@link PublicationOrder} alone (who
 * waits for what), then a messenger over the embedded broker whose channel refuses while full, as a
 * producer far ahead of its consumer meets it: every output is taken in the order made, and publications
 * keep going to the broker while earlier ones are still there instead of one round trip at a time.
 *
 * @module
 */

import assert from "node:assert/strict";
import type { MemoryMessagingBackend } from "../../../src/backends/memory/messaging.ts";
import { channelId, MessageKind } from "../../../src/backends/messaging.ts";
import { rejected } from "../../../src/backends/outcomes.ts";
import { FOLLOW_CLOSELY_BYTES, PublicationOrder } from "../../../src/messaging/publication_order.ts";
import {
  answerPublications,
  embeddedProvider,
  FLOW,
  type FlowOptions,
  MessengerFlow,
  RUN,
} from "../../conformance/messenger/support.ts";

/** A publication small enough to follow closely. */
const SMALL = 100;

/** Whether `promise` has settled once pending callbacks have run. */
async function settled(promise: Promise<unknown>): Promise<boolean> {
  let done = false;
  promise.then(() => done = true, () => done = true);
  for (let i = 0; i < 10; i++) await Promise.resolve();
  return done;
}

Deno.test("a publication is sent once every earlier one is at the broker, never while one waits after a refusal", async () => {
  const order = new PublicationOrder();
  const first = order.enter(SMALL);
  assert.ok(await settled(first.turn()), "nothing before the first");
  first.sending();
  const second = order.enter(SMALL);
  assert.ok(await settled(second.turn()), "the first is at the broker: the second goes right behind it");
  second.sending();
  const leads = first.refused();
  assert.equal(await leads, true, "refused with nothing earlier outstanding, it leads: it backs off");
  const third = order.enter(SMALL);
  const thirdTurn = third.turn();
  assert.equal(await settled(thirdTurn), false, "the first waits after its refusal: the third is held");
  first.sending();
  assert.equal(
    await settled(thirdTurn),
    false,
    "the second went before the first's refusal came back, so it may be refused behind it: still held",
  );
  assert.equal(await second.refused(), false, "it was: it follows the first's new attempt at once");
  assert.equal(await settled(thirdTurn), false);
  second.sending();
  assert.ok(await settled(thirdTurn), "both went again after the last refusal: the third may follow");
});

Deno.test("a publication made while earlier ones are at the broker and none was refused goes at once", async () => {
  const order = new PublicationOrder();
  const places = Array.from({ length: 3 }, () => order.enter(SMALL));
  for (const place of places) {
    assert.ok(await settled(place.turn()));
    place.sending();
  }
  places[0].finished();
  const fourth = order.enter(SMALL);
  assert.ok(await settled(fourth.turn()), "no refusal: nothing holds a new one back");
});

Deno.test("one refused behind an earlier one follows that one's next attempt, or leads once it is taken", async () => {
  const order = new PublicationOrder();
  const head = order.enter(SMALL);
  head.sending();
  const follower = order.enter(SMALL);
  follower.sending();
  const behind = follower.refused();
  assert.equal(
    await settled(behind),
    false,
    "the head's attempt went before the follower's: retrying now would be refused again",
  );
  const headLeads = head.refused();
  assert.equal(await headLeads, true);
  assert.equal(await settled(behind), false, "the head backs off; the follower waits for it");
  head.sending();
  assert.equal(await behind, false, "the head went again: the follower goes right behind it, no backoff");
  follower.sending();
  const again = follower.refused();
  head.finished();
  assert.equal(await again, true, "refused again with the head taken: the follower now leads and backs off");
});

Deno.test("a large one is sent only once every earlier one has its outcome, a small one may go right behind it, and refused it leads", async () => {
  const order = new PublicationOrder();
  const head = order.enter(SMALL);
  head.sending();
  const frame = order.enter(FOLLOW_CLOSELY_BYTES + 1);
  const frameTurn = frame.turn();
  assert.equal(
    await settled(frameTurn),
    false,
    "the head is at the broker, its outcome unknown: the frame waits",
  );
  head.finished();
  assert.ok(await settled(frameTurn), "the head has its outcome: the frame goes");
  frame.sending();
  const small = order.enter(SMALL);
  assert.ok(await settled(small.turn()), "a small one goes right behind the frame");
  small.sending();
  assert.equal(await frame.refused(), true, "refused with nothing before it: the frame leads and backs off");
  const behind = small.refused();
  assert.equal(await settled(behind), false, "the small one waits for the frame to go again");
  frame.sending();
  assert.equal(await behind, false, "and follows it at once");
});

Deno.test("a publication that has its outcome keeps no reference to those before it that have theirs", async () => {
  const order = new PublicationOrder();
  const places = Array.from({ length: 4 }, () => order.enter(SMALL));
  for (const place of places) place.sending();
  places[1].finished();
  places[0].finished();
  const [a, b] = [places[2].refused(), places[3].refused()];
  assert.equal(await a, true, "every earlier one is final: the third leads");
  assert.equal(await settled(b), false, "the fourth waits for the third");
  places[2].finished();
  assert.equal(await b, true);
});

/** A deterministic pseudo-random source in [0, 1) for `seed`. */
function seeded(seed: number): () => number {
  let state = seed;
  return () => (state = (state * 1103515245 + 12345) % 2147483648) / 2147483648;
}

/**
 * A model of the embedded broker as one publisher sees it: calls reach it in the order sent and their
 * answers come back in that order after random delays; the channel holds `room` messages, a consumer
 * frees them at random, and after a refusal it refuses the publisher's later publications until the
 * refused one (the earliest-arrived one it refused) is taken. Publications are made at random moments and
 * each (small or large) goes through the messenger's loop (turn, attempt, refusal, backoff when leading). Returns the ids
 * in the order the broker took them.
 */
async function modelRun(seed: number, count: number, room: number): Promise<number[]> {
  const random = seeded(seed);
  const pause = () => new Promise<void>((resolve) => setTimeout(resolve, 0));
  /** A timer turn half the time, else up to 20 microtask turns: answers and publications interleave. */
  const later = async (draw: number): Promise<void> => {
    if (draw < 0.5) {
      await pause();
      return;
    }
    for (let turn = 0; turn < draw * 40 - 20; turn++) await Promise.resolve();
  };
  const taken: number[] = [];
  let held = 0;
  let head: number | null = null;
  let link = Promise.resolve();
  const send = (id: number): Promise<boolean> => {
    const answer = link.then(async () => {
      await later(random());
      if (head !== null && head !== id) return false;
      if (held >= room) {
        head ??= id;
        return false;
      }
      if (head === id) head = null;
      held++;
      taken.push(id);
      return true;
    });
    link = answer.then(() => {});
    return answer;
  };
  const consumer = setInterval(() => {
    if (held > 0 && random() < 0.5) held--;
  }, 0);
  const order = new PublicationOrder();
  const publish = async (id: number) => {
    const place = order.enter(random() < 0.3 ? FOLLOW_CLOSELY_BYTES + 1 : SMALL);
    try {
      await place.turn();
      for (;;) {
        const attempt = send(id);
        place.sending();
        if (await attempt) return;
        if (await place.refused()) await pause();
      }
    } finally {
      place.finished();
    }
  };
  try {
    const all: Promise<void>[] = [];
    for (let id = 0; id < count; id++) {
      all.push(publish(id));
      await later(random());
    }
    await Promise.all(all);
  } finally {
    clearInterval(consumer);
  }
  return taken;
}

Deno.test("randomized: with answers arriving late, a channel refusing while full and small and large publications mixed, the broker takes every publication in the order made", async () => {
  for (let seed = 1; seed <= 6; seed++) {
    const taken = await modelRun(seed, 100, 3);
    assert.deepEqual(taken, Array.from({ length: 100 }, (_, i) => i), `seed ${seed}`);
  }
});

const PIPELINE: FlowOptions = {
  flowType: "batch",
  nodes: [{ name: "cam" }, { name: "det", parents: ["cam"] }],
};
/** Data messages the channel holds before it refuses, in this story. */
const ROOM = 3;

Deno.test("over the embedded broker a channel that refuses while full takes a producer's outputs in order, with publications still in flight behind a refused one", async () => {
  const cam = channelId(FLOW, RUN, "cam");
  let refusals = 0;
  const provider = embeddedProvider((messaging: MemoryMessagingBackend) => {
    const publishNow = messaging.publishNow.bind(messaging);
    messaging.publishNow = (envelope, deadline, holder) => {
      const held = messaging.stored(cam).filter((e) => e.kind === MessageKind.data).length;
      if (envelope.kind === MessageKind.data && held >= ROOM) {
        refusals++;
        return rejected(envelope.publicationId, `channel cam is full (${held} of ${ROOM})`, true);
      }
      return publishNow(envelope, deadline, holder);
    };
  });
  const flow = await MessengerFlow.create(provider, PIPELINE);
  try {
    const backend = flow.backend;
    assert.equal(backend.ordersRefusedPublications, true);
    let outstanding = 0;
    let refusedSeen = false;
    let overlappedAfterRefusal = 0;
    answerPublications(backend, async (envelope, deadline, publish) => {
      if (envelope.kind !== MessageKind.data) return await publish(envelope, deadline);
      if (refusedSeen && outstanding > 0) overlappedAfterRefusal++;
      outstanding++;
      try {
        const outcome = await publish(envelope, deadline);
        if (outcome.kind === "rejected") refusedSeen = true;
        return outcome;
      } finally {
        outstanding--;
      }
    });
    const producer = await flow.open("cam");
    const consumer = await flow.open("det");
    const values = Array.from({ length: 40 }, (_, i) => `item-${i}`);
    const producing = (async () => {
      for (const value of values) await producer.publishMessage(value);
      await producer.awaitInFlight();
    })();
    const received: unknown[] = [];
    while (received.length < values.length) {
      const group = await flow.drive(consumer.receiveMessage());
      if (group.cam) received.push(group.cam.message);
      await flow.drive(consumer.ackInputs());
    }
    await flow.drive(producing);
    assert.deepEqual(received, values, "every output, once, in the order it was made");
    assert.ok(refusals > 0, "the channel refused while full");
    assert.ok(
      overlappedAfterRefusal > 0,
      "after refusals, publications went to the broker while earlier ones were still there",
    );
  } finally {
    await flow.dispose();
  }
});
