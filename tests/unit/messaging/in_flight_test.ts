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

Deno.test("admit also waits while the running operations hold the byte bound, but one alone always runs", async () => {
  const work = new InFlight(100, 1000);
  const large = Promise.withResolvers<void>();
  work.track(large.promise, 5000);
  let admitted = false;
  const admission = work.admit().then(() => admitted = true);
  await Promise.resolve();
  await Promise.resolve();
  assert.equal(admitted, false, "one operation holds more than the bound: the next waits");
  large.resolve();
  await admission;
  const halves = [Promise.withResolvers<void>(), Promise.withResolvers<void>()];
  work.track(halves[0].promise, 600);
  await work.admit();
  work.track(halves[1].promise, 600);
  let second = false;
  const waiting = work.admit().then(() => second = true);
  await Promise.resolve();
  await Promise.resolve();
  assert.equal(second, false, "1200 bytes held, over 1000, with only 2 of 100 running");
  halves[0].resolve();
  await waiting;
  halves[1].resolve();
  await work.drain();
  assert.equal(work.running, 0);
});

Deno.test("room waits, before an operation starts, until its bytes fit beside those running: the bytes held never pass the bound, but one alone always runs", async () => {
  const work = new InFlight(100, 1000);
  await work.room(5000);
  const large = Promise.withResolvers<void>();
  work.track(large.promise, 5000);
  let roomy = false;
  const waiting = work.room(1).then(() => roomy = true);
  await Promise.resolve();
  await Promise.resolve();
  assert.equal(roomy, false, "5000 bytes held: not one more fits");
  large.resolve();
  await waiting;
  const first = Promise.withResolvers<void>();
  await work.room(600);
  work.track(first.promise, 600);
  await work.room(400);
  let second = false;
  const next = work.room(401).then(() => second = true);
  await Promise.resolve();
  await Promise.resolve();
  assert.equal(second, false, "600 held: 400 more fit, 401 do not");
  first.resolve();
  await next;
  await work.drain();
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

Deno.test("a depth that is not a positive integer, or a byte bound that is not positive, is a ConfigError", () => {
  for (const depth of [0, -1, 1.5, Number.NaN]) assert.throws(() => new InFlight(depth), ConfigError);
  for (const bytes of [0, -1, Number.NaN]) assert.throws(() => new InFlight(4, bytes), ConfigError);
});

Deno.test("admitsNow and roomNow answer what admit and room would do without waiting, and throw the failure", async () => {
  const work = new InFlight(2, 1000);
  assert.equal(work.admitsNow(), true, "nothing runs");
  const first = Promise.withResolvers<void>();
  work.track(first.promise, 800);
  assert.equal(work.roomNow(100), true, "900 of 1000 bytes");
  assert.equal(work.roomNow(300), false, "1100 of 1000 bytes: room would wait");
  assert.equal(work.admitsNow(), true, "one of two runs, under the bytes");
  const second = Promise.withResolvers<void>();
  work.track(second.promise, 100);
  assert.equal(work.admitsNow(), false, "two of two run: admit would wait");
  first.reject(new Error("refused"));
  second.resolve();
  await work.idle();
  assert.throws(() => work.admitsNow(), /refused/);
  assert.throws(() => work.roomNow(1), /refused/);
});
