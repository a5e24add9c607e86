import assert from "node:assert/strict";
import { ConfigError } from "../../../src/core/errors.ts";
import { InFlight } from "../../../src/messaging/in_flight.ts";

Deno.test("admit waits while the depth is reached and goes on as soon as one operation ends", async () => {
  const work = new InFlight(2);
  const first = Promise.withResolvers<void>();
  const second = Promise.withResolvers<void>();
  work.track(first.promise);
  work.track(second.promise);
  let admitted = false;
  const admission = work.admit().then(() => admitted = true);
  await Promise.resolve();
  await Promise.resolve();
  assert.equal(admitted, false, "two running at depth 2");
  second.resolve();
  await admission;
  assert.equal(work.running, 1);
  first.resolve();
  await work.drain();
  assert.equal(work.running, 0);
});

Deno.test("the first failure is kept and thrown by every later check, admit and drain", async () => {
  const work = new InFlight(8);
  work.track(Promise.reject(new Error("first")));
  work.track(Promise.reject(new Error("second")));
  work.track(Promise.resolve());
  await work.idle();
  assert.throws(() => work.check(), /first/);
  await assert.rejects(work.admit(), /first/);
  await assert.rejects(work.drain(), /first/);
});

Deno.test("idle waits for every operation without throwing; abandon is reported to the work that checks it", async () => {
  const work = new InFlight(1);
  const slow = Promise.withResolvers<void>();
  work.track(slow.promise.then(() => {
    throw new Error("late");
  }));
  const idle = work.idle();
  work.abandon();
  assert.equal(work.abandoned, true);
  slow.resolve();
  await idle;
  assert.equal(work.running, 0);
  assert.throws(() => work.check(), /late/);
});

Deno.test("a depth that is not a positive integer is a ConfigError", () => {
  for (const depth of [0, -1, 1.5, Number.NaN]) assert.throws(() => new InFlight(depth), ConfigError);
});
