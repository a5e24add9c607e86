/**
 * The credit window: flow control by credit over a MessagingBackend, as a messenger sends its reliable
 * outputs.
 *
 * @module
 */

import assert from "node:assert/strict";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { makeChannel, makeEnvelope, MemoryMessagingBackend } from "../../../src/backends/memory/messaging.ts";
import {
  channelId,
  completed,
  type Envelope,
  type MessagingBackend,
  Overflow,
  subscriptionId,
} from "../../../src/backends/messaging.ts";
import { type PublicationOutcome, publicationUnknown, rejected } from "../../../src/backends/outcomes.ts";
import { CreditWindow } from "../../../src/messaging/credit_window.ts";

const CAM_ID = channelId("f", "r", "cam");
const DET = subscriptionId(CAM_ID, "det");
/** A channel that refuses past four messages, whose one consumer is "det". */
const CAM = makeChannel("f", "r", "cam", "reliable_work", "interest", {
  maxMsgs: 4,
  overflow: Overflow.reject,
  required: [DET],
});

async function provisioned() {
  const clock = new FakeClock();
  const backend = new MemoryMessagingBackend({ clock });
  await backend.ensureChannel(CAM, "ensure");
  await backend.ensureSubscription(
    {
      id: DET,
      competing: true,
      ackWaitSeconds: 30,
      maxDeliver: -1,
      itemCredit: 64,
      byteCredit: 1 << 20,
      ownerLabels: {},
    },
    "bind",
  );
  return { clock, backend };
}

/** Lets the promise callbacks of the current turn run (the window's requests resolve on later turns). */
async function turns(n = 20): Promise<void> {
  for (let i = 0; i < n; i++) await Promise.resolve();
}

function send(window: CreditWindow, backend: MessagingBackend, clock: FakeClock, env: Envelope) {
  return window.send(env.size, () => backend.publish(env, clock.monotonic() + 5));
}

Deno.test("a credit window sends only within the credit it holds, in order, and the rest once consumers make room", async () => {
  const { clock, backend } = await provisioned();
  const window = new CreditWindow(backend, CAM.id, { items: 8, bytes: 1024, waitSeconds: 5, clock });
  const outcomes: (PublicationOutcome | null)[] = [];
  const sends = ["a", "b", "c", "d", "e", "f"].map((id) =>
    send(window, backend, clock, makeEnvelope(CAM.id, id)).then((o) => outcomes.push(o))
  );
  await turns();
  assert.deepEqual(outcomes.map((o) => o?.publicationId), ["a", "b", "c", "d"], "the channel's four");
  assert.ok(outcomes.every((o) => o?.kind === "accepted"), "none was refused");
  assert.equal(backend.stored(CAM.id).length, 4);
  const leased = await backend.receive(DET, 2, 1 << 20, clock.monotonic());
  for (const delivery of leased) {
    await backend.settle(delivery.token, completed(), `s-${delivery.token.messageId}`);
  }
  await Promise.all(sends);
  assert.deepEqual(outcomes.map((o) => o?.publicationId), ["a", "b", "c", "d", "e", "f"], "in order");
});

Deno.test("after a refusal and an unknown outcome a credit window still sends within the room the broker holds: it gives back what it holds and asks again", async () => {
  const { clock, backend } = await provisioned();
  const window = new CreditWindow(backend, CAM.id, { items: 2, bytes: 1024, waitSeconds: 5, clock });
  const answers: PublicationOutcome[] = [
    rejected("x", "refused by the test", false),
    publicationUnknown("y", "lost by the test"),
  ];
  const answer = (env: Envelope) => () => {
    const next = answers.shift();
    return next === undefined ? backend.publish(env, clock.monotonic() + 5) : Promise.resolve(next);
  };
  assert.equal((await window.send(1, answer(makeEnvelope(CAM.id, "x"))))?.kind, "rejected");
  assert.equal((await window.send(1, answer(makeEnvelope(CAM.id, "y"))))?.kind, "publication_unknown");
  // The unknown outcome gave back everything held: the next send asks again, and the channel still has its room.
  for (const id of ["p", "q", "r", "s"]) {
    assert.equal((await send(window, backend, clock, makeEnvelope(CAM.id, id)))?.kind, "accepted", id);
  }
  window.release();
  assert.equal((await backend.publish(makeEnvelope(CAM.id, "t"), clock.monotonic() + 5)).kind, "rejected");
});

Deno.test("a halted credit window ends the sends waiting for credit and every later one, and lets covered sends go until then", async () => {
  const { clock, backend } = await provisioned();
  const window = new CreditWindow(backend, CAM.id, { items: 8, bytes: 1024, waitSeconds: 5, clock });
  const first = await Promise.all(
    ["a", "b", "c", "d"].map((id) => send(window, backend, clock, makeEnvelope(CAM.id, id))),
  );
  assert.ok(first.every((o) => o?.kind === "accepted"));
  const waiting = send(window, backend, clock, makeEnvelope(CAM.id, "e"));
  await turns();
  window.halt();
  assert.equal(await waiting, null, "the waiting send ends unsent");
  assert.equal(await send(window, backend, clock, makeEnvelope(CAM.id, "f")), null, "and every later one");
  assert.equal(backend.stored(CAM.id).length, 4, "nothing past the credit reached the broker");
});

Deno.test("a credit window sends without credit when the broker cannot be asked: the backend's outcome decides", async () => {
  const { clock, backend } = await provisioned();
  backend.reserveCredit = (_channel, _request, _deadline) =>
    Promise.reject(new Error("the broker is unreachable in this test"));
  const window = new CreditWindow(backend, CAM.id, { items: 8, bytes: 1024, waitSeconds: 5, clock });
  const outcome = await send(window, backend, clock, makeEnvelope(CAM.id, "a"));
  assert.equal(outcome?.kind, "accepted");
});
