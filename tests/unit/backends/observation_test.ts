import assert from "node:assert/strict";
import { ConfigError } from "../../../src/core/errors.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  FIELDS,
  loadMerged,
  mergeObservations,
  type ObservationEvent,
  ObservationLog,
  parseObservations,
  readObservations,
} from "../../../src/backends/observation.ts";

const labels = (events: readonly ObservationEvent[]) => events.map((e) => `${e.kind}@${e.monotonic}`);

Deno.test("FIELDS lists the spec's attribution identities in order", () => {
  const spec =
    "op_id source_epoch source_offset event_id group_id consumer attempt generation payload_digest " +
    "obligation_id claim_uid pod_uid device_ids status reason";
  assert.equal(FIELDS.join(" "), spec);
});

Deno.test("emit stamps events with the clock's readings and events() filters by kind and fields", () => {
  const clock = new FakeClock();
  const log = new ObservationLog({ clock });
  log.emit("publish", { event_id: "e1", attempt: 1 });
  clock.advance(0.5);
  const settle = log.emit("settle", { event_id: "e1", status: "acked", device_ids: ["GPU-a", "GPU-b"] });
  log.emit("publish", { event_id: "e2", attempt: 2 });
  assert.deepEqual(settle, {
    kind: "settle",
    monotonic: 1000.5,
    wall: 1_700_000_000.5,
    fields: { event_id: "e1", status: "acked", device_ids: ["GPU-a", "GPU-b"] },
  });
  assert.ok(Object.isFrozen(settle) && Object.isFrozen(settle.fields));
  assert.equal(log.events().length, 3);
  assert.deepEqual(log.events("publish").map((e) => e.fields.event_id), ["e1", "e2"]);
  assert.deepEqual(log.events(null, { event_id: "e1" }).map((e) => e.kind), ["publish", "settle"]);
  assert.equal(log.events("settle", { device_ids: ["GPU-a", "GPU-b"] }).length, 1, "deep equality");
  assert.equal(log.events("publish", { attempt: 3 }).length, 0);
});

Deno.test("payload bytes are refused, bigints are recorded as decimal strings", () => {
  const log = new ObservationLog();
  assert.throws(() => log.emit("publish", { frame: new Uint8Array(4) }), ConfigError);
  assert.throws(() => log.emit("publish", { nested: { buffer: new ArrayBuffer(2) } }), ConfigError);
  assert.equal(log.events().length, 0, "a refused event is not recorded");
  const event = log.emit("publish", { source_offset: 2n ** 70n });
  assert.equal(event.fields.source_offset, "1180591620717411303424");
});

Deno.test("a log with a path writes one JSON line per event, readable back as the same events", () => {
  const path = Deno.makeTempFileSync({ suffix: ".jsonl" });
  const clock = new FakeClock();
  {
    using log = new ObservationLog({ path, clock });
    log.emit("claim", { claim_uid: "c1" });
    clock.advance(1);
    log.emit("release", { claim_uid: "c1", reason: "done" });
    const text = Deno.readTextFileSync(path);
    assert.equal(text.split("\n").length, 3, "two lines and a final newline");
    assert.deepEqual(ObservationLog.load(path), log.events());
  }
  Deno.removeSync(path);
});

Deno.test("a closed log refuses to emit", () => {
  const path = Deno.makeTempFileSync();
  const log = new ObservationLog({ path });
  log.close();
  log.close();
  assert.throws(() => log.emit("late"), ConfigError);
  Deno.removeSync(path);
});

Deno.test("a torn last line is skipped and counted, never fatal", () => {
  const path = Deno.makeTempFileSync();
  const clock = new FakeClock();
  {
    using log = new ObservationLog({ path, clock });
    log.emit("publish", { event_id: "e1" });
    log.emit("publish", { event_id: "e2" });
  }
  const whole = Deno.readTextFileSync(path);
  const lines = whole.split("\n");
  const torn = `${lines[0]}\n${lines[1].slice(0, 17)}`;
  Deno.writeTextFileSync(path, torn);
  const read = readObservations(path);
  assert.equal(read.skippedLines, 1);
  assert.deepEqual(read.events.map((e) => e.fields.event_id), ["e1"]);
  assert.deepEqual(
    parseObservations(whole.trimEnd()).events.length,
    2,
    "a whole last line without newline counts",
  );
  Deno.removeSync(path);
});

Deno.test("appending after a torn tail starts a fresh line, so the next event survives intact", () => {
  const path = Deno.makeTempFileSync();
  Deno.writeTextFileSync(path, '{"kind":"publish","monotonic":1,"wall":2,"fields":{}}\n{"kind":"pub');
  {
    using log = new ObservationLog({ path, clock: new FakeClock(5, 6) });
    log.emit("settle", { status: "acked" });
  }
  const read = readObservations(path);
  assert.deepEqual(read.events.map((e) => e.kind), ["publish", "settle"]);
  assert.equal(read.skippedLines, 1);
  Deno.removeSync(path);
});

Deno.test("a file that is JSON but not an observation log is a ConfigError naming the line", () => {
  assert.throws(
    () => parseObservations('{"kind":"a","monotonic":1,"wall":1,"fields":{}}\n{"hello":1}\n', "x.jsonl"),
    (e) => e instanceof ConfigError && e.message.includes("x.jsonl:2"),
  );
});

function source(clock: FakeClock, name: string, steps: ReadonlyArray<[string, number]>): ObservationEvent[] {
  const log = new ObservationLog({ clock });
  for (const [kind, advance] of steps) {
    clock.advance(advance);
    log.emit(kind, { consumer: name });
  }
  return log.events();
}

Deno.test("merging interleaves sources by monotonic time and keeps each source's own order", () => {
  const a = source(new FakeClock(0, 0), "a", [["a1", 1], ["a2", 2], ["a3", 2]]);
  const b = source(new FakeClock(0, 0), "b", [["b1", 2], ["b2", 2], ["b3", 0]]);
  const skewed: ObservationEvent[] = [
    { kind: "c1", monotonic: 4, wall: 4, fields: {} },
    { kind: "c2", monotonic: 1.5, wall: 1.5, fields: {} },
  ];
  const merged = mergeObservations([a, b, skewed]);
  assert.deepEqual(labels(merged), ["a1@1", "b1@2", "a2@3", "b2@4", "b3@4", "c1@4", "c2@1.5", "a3@5"]);
  assert.equal(merged.length, a.length + b.length + skewed.length);
});

Deno.test("the merged order does not depend on the order the sources are given in", () => {
  const sources = [
    source(new FakeClock(0, 0), "a", [["x", 1], ["y", 1], ["z", 0]]),
    source(new FakeClock(0, 0), "b", [["x", 1], ["y", 0], ["z", 1]]),
    source(new FakeClock(0, 10), "c", [["x", 1], ["y", 1], ["z", 1]]),
  ];
  const orders = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
  const expected = mergeObservations(sources);
  for (const order of orders) {
    assert.deepEqual(mergeObservations(order.map((i) => sources[i])), expected, `order ${order}`);
  }
});

Deno.test("logs of two writers merge from their files, and extend merges into a live log", () => {
  const dir = Deno.makeTempDirSync();
  const clockA = new FakeClock(0, 0);
  const clockB = new FakeClock(0, 0);
  {
    using a = new ObservationLog({ path: `${dir}/a.jsonl`, clock: clockA });
    using b = new ObservationLog({ path: `${dir}/b.jsonl`, clock: clockB });
    clockA.advance(1);
    a.emit("publish", { event_id: "e1" });
    clockB.advance(2);
    b.emit("deliver", { event_id: "e1" });
    clockA.advance(2);
    a.emit("settle", { event_id: "e1" });
    clockB.advance(2);
    b.emit("ack", { event_id: "e1" });
    a.extend(ObservationLog.load(`${dir}/b.jsonl`));
    assert.deepEqual(a.events().map((e) => e.kind), ["publish", "deliver", "settle", "ack"]);
  }
  Deno.writeTextFileSync(`${dir}/b.jsonl`, '{"kind":"lost', { append: true });
  const merged = loadMerged([`${dir}/b.jsonl`, `${dir}/a.jsonl`]);
  assert.deepEqual(labels(merged), ["publish@1", "deliver@2", "settle@3", "ack@4"]);
  assert.deepEqual(Deno.readTextFileSync(`${dir}/a.jsonl`).split("\n").length, 3, "extend wrote nothing");
  Deno.removeSync(dir, { recursive: true });
});
