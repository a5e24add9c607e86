import assert from "node:assert/strict";
import { FAKE_WALL_START, FakeClock } from "../../../src/backends/memory/clock.ts";
import { ConfigError, DecodeError } from "../../../src/core/errors.ts";
import { JoinPolicy, type JoinPolicyInit } from "../../../src/core/join_policy.ts";
import {
  type CollectEntry,
  entryFromEnvelope,
  type EnvelopeEntry,
  envelopeEntry,
  type GroupAssembler,
  GroupKind,
  makeAssembler,
  type ReadyGroup,
  type Release,
  ReleaseReason,
  Settlement,
  SingleParentAssembler,
  TimeGroupAssembler,
  TraceGroupAssembler,
} from "../../../src/messaging/grouping.ts";
import { createEnvelope } from "../../../src/wire/codec.ts";
import { groupIdentity, MsgType, type Seq, timeGroupIdentity } from "../../../src/wire/identities.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

/** Options of a test entry: anything of an envelope entry but its identity and handle. */
type EntryOptions = Partial<Omit<EnvelopeEntry<number>, "kind" | "traceId" | "seq" | "handle">>;

/** Tracks every handle offered to an assembler and insists each comes back exactly once. */
class Book {
  readonly offered = new Set<number>();
  readonly back = new Map<number, string>();
  readonly groups: ReadyGroup<number>[] = [];
  readonly releases: Release<number>[] = [];
  #next = 1;

  constructor(readonly join: GroupAssembler<number>, readonly label = "") {}

  /** Offers a new delivery of `parent` and returns its handle. */
  offer(parent: string, traceId: string, seq: Seq, options: EntryOptions = {}): number {
    const handle = this.#next++;
    this.offered.add(handle);
    this.join.add(parent, envelopeEntry({ traceId, seq, handle, producerName: parent, ...options }));
    return handle;
  }

  /** Pops every ready group and takes every release, checking that no handle comes back twice. */
  drain(): { groups: ReadyGroup<number>[]; releases: Release<number>[] } {
    const groups: ReadyGroup<number>[] = [];
    for (let g = this.join.popReady(); g !== null; g = this.join.popReady()) {
      groups.push(g);
      for (const h of g.handles) this.#mark(h, `group ${g.traceId}`);
    }
    const releases = this.join.takeReleased();
    for (const r of releases) for (const h of r.handles) this.#mark(h, r.reason);
    this.groups.push(...groups);
    this.releases.push(...releases);
    return { groups, releases };
  }

  /** Asserts every offered handle came back. */
  assertAllBack(): void {
    const missing = [...this.offered].filter((h) => !this.back.has(h));
    assert.deepEqual(missing, [], `${this.label}: handles never returned`);
    assert.equal(this.join.heldHandles(), 0, `${this.label}: the assembler still holds handles`);
  }

  #mark(handle: number, where: string): void {
    assert.ok(this.offered.has(handle), `${this.label}: handle ${handle} was never offered (${where})`);
    const before = this.back.get(handle);
    assert.equal(
      before,
      undefined,
      `${this.label}: handle ${handle} came back twice: ${before} and ${where}`,
    );
    this.back.set(handle, where);
  }
}

function trace(parents: string[], init: JoinPolicyInit = {}, clock = new FakeClock()) {
  const join = makeAssembler<number>("join", parents, new JoinPolicy(init), { clock });
  return { join, clock, book: new Book(join) };
}

function envelopeOf(entry: unknown): EnvelopeEntry<number> {
  assert.ok(entry !== null && (entry as EnvelopeEntry<number>).kind === "envelope", "an envelope entry");
  return entry as EnvelopeEntry<number>;
}

function collectOf(entry: unknown): CollectEntry {
  assert.ok(entry !== null && (entry as CollectEntry).kind === "collect", "a collect entry");
  return entry as CollectEntry;
}

// ---------------------------------------------------------------- entries

Deno.test("an envelope entry defaults every field but its identity and derives the stop and abort flags", () => {
  const data = envelopeEntry({ traceId: "cam:1", seq: 1, handle: "h" });
  assert.deepEqual(data, {
    kind: "envelope",
    type: "data",
    traceId: "cam:1",
    seq: 1,
    eventTs: null,
    message: undefined,
    metadata: null,
    isStopSignal: false,
    isAbort: false,
    producerName: "",
    flowId: "",
    runId: "",
    spanId: "",
    parentSpanId: "",
    replicaId: 0,
    blobRef: null,
    handle: "h",
  });
  const eos = envelopeEntry({ traceId: "eos-r0", seq: 9n, handle: 0, type: MsgType.eos });
  assert.equal(eos.isStopSignal, true);
  assert.equal(eos.isAbort, false);
  const abort = envelopeEntry({ traceId: "abort-r0", seq: 9, handle: 0, type: MsgType.abort });
  assert.equal(abort.isAbort, true);
  assert.equal(abort.isStopSignal, false);
});

Deno.test("an envelope entry without a trace id or an integer seq, or with a non-finite time, is a DecodeError", () => {
  const bad = [
    { traceId: undefined as unknown as string, seq: 1 },
    { traceId: "t", seq: undefined as unknown as number },
    { traceId: "t", seq: 1.5 },
    { traceId: "t", seq: "1" as unknown as number },
    { traceId: "t", seq: 1, eventTs: Number.NaN },
    { traceId: "t", seq: 1, eventTs: Infinity },
  ];
  for (const init of bad) {
    assert.throws(() => envelopeEntry({ ...init, handle: 0 }), DecodeError, JSON.stringify(init));
  }
});

Deno.test("an entry from a decoded envelope carries its fields, the decoded message, the blob and the handle", () => {
  const envelope = createEnvelope({
    type: "data",
    producerName: "cam",
    flowId: "f",
    runId: "r",
    traceId: "cam:7",
    seq: 7,
    eventTs: 12.5,
    spanId: "s1",
    parentSpanId: "s0",
    replicaId: 2,
    metadata: { k: "v" },
  });
  const entry = entryFromEnvelope(envelope, "tok", { frame: 1 }, "vf-blob-1");
  assert.deepEqual(
    [
      entry.traceId,
      entry.seq,
      entry.eventTs,
      entry.producerName,
      entry.flowId,
      entry.runId,
      entry.spanId,
      entry.parentSpanId,
      entry.replicaId,
      entry.metadata,
      entry.message,
      entry.blobRef,
      entry.handle,
    ],
    ["cam:7", 7, 12.5, "cam", "f", "r", "s1", "s0", 2, { k: "v" }, { frame: 1 }, "vf-blob-1", "tok"],
  );
});

// ---------------------------------------------------------------- construction

Deno.test("makeAssembler picks the assembler from the policy's mode and the parents", () => {
  assert.ok(makeAssembler("j", ["a", "b"], new JoinPolicy()) instanceof TraceGroupAssembler);
  assert.ok(makeAssembler("j", ["a"], new JoinPolicy()) instanceof SingleParentAssembler);
  const time = new JoinPolicy({ mode: "time", toleranceMs: 10 });
  assert.ok(makeAssembler("j", ["a", "b"], time) instanceof TimeGroupAssembler);
});

Deno.test("an assembler refuses parents and policies that do not fit, with a remedy", () => {
  const time = (init: JoinPolicyInit) => new JoinPolicy({ mode: "time", toleranceMs: 10, ...init });
  const cases: Array<[string[], JoinPolicy, typeof TraceGroupAssembler | typeof TimeGroupAssembler | null]> =
    [
      [[], new JoinPolicy(), null],
      [["a", "a"], new JoinPolicy(), null],
      [["a", "b"], time({}), TraceGroupAssembler],
      [["a", "b"], new JoinPolicy(), TimeGroupAssembler],
      [["a", "b"], time({ collect: { c: 5 } }), null],
      [["a", "b"], time({ collect: { a: 5, b: 5 } }), null],
      [["a", "b"], time({ timeoutSeconds: 1, quorum: 3 }), null],
    ];
  for (const [parents, policy, Assembler] of cases) {
    const build = () =>
      Assembler === null ? makeAssembler("j", parents, policy) : new Assembler("j", parents, policy);
    assert.throws(build, (e) => e instanceof ConfigError && typeof e.remedy === "string" && e.remedy !== "");
  }
});

Deno.test("an entry from a parent the node does not have is a ConfigError", () => {
  const { join } = trace(["a", "b"]);
  assert.throws(() => join.add("c", envelopeEntry({ traceId: "t", seq: 1, handle: 1 })), ConfigError);
  assert.equal(join.heldHandles(), 0);
});

// ---------------------------------------------------------------- trace joins

Deno.test("a trace group is ready once every parent contributed, and carries min seq and min event time", () => {
  const { join, book } = trace(["a", "b", "c"], { missing: "wait" });
  book.offer("b", "src:1", 5, { eventTs: 20 });
  book.offer("a", "src:1", 3, { eventTs: null });
  assert.equal(join.popReady(), null);
  assert.equal(join.pendingCount(), 1);
  assert.ok(join.hasPendingFrom("a") && join.hasPendingFrom("b") && !join.hasPendingFrom("c"));
  book.offer("c", "src:1", 4, { eventTs: 10 });
  const { groups } = book.drain();
  assert.equal(groups.length, 1);
  const [group] = groups;
  assert.equal(group.kind, GroupKind.data);
  assert.deepEqual([group.traceId, group.seq, group.eventTs], ["src:1", 3, 10]);
  assert.deepEqual(Object.keys(group.entries), ["a", "b", "c"], "entries in parent order");
  assert.deepEqual(Object.values(group.entries).map((e) => envelopeOf(e).handle), [2, 1, 3]);
  assert.deepEqual([...group.handles].sort(), [1, 2, 3]);
  assert.equal(join.pendingCount(), 0);
  assert.ok(!join.hasPendingFrom("a"));
  book.assertAllBack();
});

Deno.test("trace groups become ready in completion order, independent of their arrival order", () => {
  const { book } = trace(["a", "b"], { missing: "wait" });
  book.offer("a", "t1", 1);
  book.offer("a", "t2", 2);
  book.offer("b", "t2", 2);
  book.offer("b", "t1", 1);
  assert.deepEqual(book.drain().groups.map((g) => g.traceId), ["t2", "t1"]);
});

Deno.test("a trace group that outlives the timeout is evicted as a drop under missing drop", () => {
  const { join, clock, book } = trace(["a", "b"], { timeoutSeconds: 10, missing: "drop" });
  const h = book.offer("a", "t1", 1);
  assert.equal(join.nextDeadline(), clock.monotonic() + 10);
  clock.advance(4);
  assert.equal(join.oldestWaitSeconds(), 4);
  clock.advance(5.9);
  join.sweep();
  assert.deepEqual(book.drain().releases, []);
  clock.advance(0.1);
  join.sweep();
  assert.deepEqual(book.drain().releases, [{
    reason: ReleaseReason.timeout,
    settlement: Settlement.ack,
    parents: ["a"],
    handles: [h],
  }]);
  assert.deepEqual(join.takeDrops(), { join_evicted: 1 });
  assert.deepEqual(join.takeDrops(), {}, "takeDrops reports each drop once");
  assert.equal(join.evictions, 1);
  assert.equal(join.pendingCount(), 0);
  assert.equal(join.oldestWaitSeconds(), 0);
  assert.equal(join.nextDeadline(), null);
  book.assertAllBack();
});

Deno.test("a timed-out trace group is naked, not dropped, under missing error", () => {
  const { join, clock, book } = trace(["a", "b"], { timeoutSeconds: 2, missing: "error" });
  const h = book.offer("b", "t1", 1);
  clock.advance(2);
  join.sweep();
  const [release] = book.drain().releases;
  assert.deepEqual([release.reason, release.settlement, release.handles], ["timeout", "nak", [h]]);
  assert.deepEqual(join.takeDrops(), {});
  assert.equal(join.evictions, 1);
});

Deno.test("under missing wait a trace group never times out", () => {
  const { join, clock, book } = trace(["a", "b"], { missing: "wait" });
  book.offer("a", "t1", 1);
  clock.advance(1e6);
  join.sweep();
  assert.equal(join.nextDeadline(), null);
  assert.deepEqual(book.drain(), { groups: [], releases: [] });
  assert.equal(join.pendingCount(), 1);
  assert.equal(join.oldestWaitSeconds(), 1e6);
});

Deno.test("beyond max_pending the oldest incomplete trace group is evicted as a drop, whatever missing says", () => {
  const { join, book } = trace(["a", "b"], { missing: "error", timeoutSeconds: 60, maxPending: 3 });
  const handles = ["t1", "t2", "t3"].map((t, i) => book.offer("a", t, i));
  assert.deepEqual(book.drain().releases, []);
  book.offer("b", "t4", 4);
  assert.deepEqual(book.drain().releases, [{
    reason: ReleaseReason.maxPending,
    settlement: Settlement.ack,
    parents: ["a"],
    handles: [handles[0]],
  }]);
  assert.equal(join.pendingCount(), 3);
  assert.deepEqual(join.takeDrops(), { join_evicted: 1 });
  book.offer("b", "t2", 2);
  assert.deepEqual(book.drain().groups.map((g) => g.traceId), ["t2"]);
});

Deno.test("a redelivered trace half replaces the held one, whose handle comes back superseded", () => {
  const { join, book } = trace(["a", "b"], { missing: "wait" });
  const first = book.offer("a", "t1", 1, { message: "old" });
  const second = book.offer("a", "t1", 1, { message: "new" });
  assert.deepEqual(book.drain().releases, [{
    reason: ReleaseReason.superseded,
    settlement: Settlement.retire,
    parents: ["a"],
    handles: [first],
  }]);
  assert.equal(join.heldHandles(), 1, "the redelivery is not counted twice");
  assert.equal(join.evictions, 0);
  assert.deepEqual(join.takeDrops(), {});
  const b = book.offer("b", "t1", 1);
  const [group] = book.drain().groups;
  assert.deepEqual([...group.handles].sort(), [second, b].sort());
  assert.equal(envelopeOf(group.entries.a).message, "new");
  book.assertAllBack();
});

Deno.test("a redelivery of a complete trace group not yet popped supersedes inside it", () => {
  const { book } = trace(["a", "b"], { missing: "wait" });
  book.offer("a", "t1", 1);
  const b1 = book.offer("b", "t1", 1);
  const b2 = book.offer("b", "t1", 1);
  const { groups, releases } = book.drain();
  assert.equal(groups.length, 1, "one group, not a second half-group");
  assert.ok(groups[0].handles.includes(b2));
  assert.deepEqual(releases.map((r) => [r.reason, r.handles]), [["superseded", [b1]]]);
  book.assertAllBack();
});

Deno.test("a parent's EOS evicts per missing the trace groups that lack it, and what arrives lacking it later", () => {
  for (const [missing, settlement] of [["drop", "ack"], ["error", "nak"], ["wait", "ack"]] as const) {
    const { join, book } = trace(["a", "b"], { missing, timeoutSeconds: missing === "wait" ? null : 30 });
    const a1 = book.offer("a", "t1", 1);
    const b2 = book.offer("b", "t2", 2);
    book.offer("b", "eos-r0", 3, { type: MsgType.eos });
    const { releases } = book.drain();
    assert.deepEqual(
      releases,
      [{ reason: ReleaseReason.parentEnded, settlement, parents: ["a"], handles: [a1] }],
      missing,
    );
    assert.ok(join.hasPendingFrom("b"), "a group holding the ended parent's half can still complete");
    const a3 = book.offer("a", "t3", 3);
    assert.deepEqual(
      book.drain().releases.map((r) => r.handles),
      [[a3]],
      `${missing}: t3 can never complete`,
    );
    book.offer("a", "t2", 2);
    assert.deepEqual(book.drain().groups.map((g) => [g.traceId, g.handles.includes(b2)]), [["t2", true]]);
    assert.deepEqual(join.takeDrops(), settlement === "ack" ? { join_evicted: 2 } : {}, missing);
  }
});

Deno.test("the end group comes once every parent ended and nothing else is held, with every EOS handle", () => {
  const { join, book } = trace(["a", "b"], { missing: "wait" });
  book.offer("a", "t1", 1);
  const eosA = book.offer("a", "eos-r0", 2, { type: MsgType.eos });
  book.offer("b", "t1", 1);
  const eosB0 = book.offer("b", "eos-r0", 2, { type: MsgType.eos });
  const eosB1 = book.offer("b", "eos-r1", 5, { type: MsgType.eos });
  const groups = book.drain().groups;
  assert.deepEqual(groups.map((g) => g.kind), ["data", "end"], "data is drained before the end");
  const end = groups[1];
  assert.deepEqual([...end.handles].sort(), [eosA, eosB0, eosB1].sort());
  assert.ok(Object.values(end.entries).every((e) => envelopeOf(e).isStopSignal));
  assert.deepEqual([end.traceId, end.seq, end.eventTs], ["eos-r0", 2, null]);
  assert.equal(join.popReady(), null, "the end group is returned once");
  book.assertAllBack();
});

Deno.test("no end group while a parent still runs, and a redelivered EOS supersedes the held one", () => {
  const { book } = trace(["a", "b"], { missing: "wait" });
  const first = book.offer("a", "eos-r0", 2, { type: MsgType.eos });
  book.offer("a", "eos-r0", 2, { type: MsgType.eos });
  const { groups, releases } = book.drain();
  assert.deepEqual(groups, []);
  assert.deepEqual(releases.map((r) => [r.reason, r.settlement, r.handles]), [["superseded", "retire", [
    first,
  ]]]);
  book.offer("b", "eos-r0", 2, { type: MsgType.eos });
  assert.deepEqual(book.drain().groups.map((g) => [g.kind, g.handles.length]), [["end", 2]]);
  book.assertAllBack();
});

Deno.test("an ABORT surfaces at once, ahead of ready data, and outranks EOS in the end group", () => {
  const { join, book } = trace(["a", "b", "c"], { missing: "wait" });
  for (const p of ["a", "b", "c"]) book.offer(p, "t1", 1);
  const eosC = book.offer("c", "eos-r0", 2, { type: MsgType.eos });
  const abort = book.offer("b", "abort-r0", 7, {
    type: MsgType.abort,
    message: { node: "b", error: { code: "VF_X" } },
  });
  const first = join.popReady() as ReadyGroup<number>;
  assert.equal(first.kind, GroupKind.abort);
  assert.deepEqual([first.traceId, first.seq, first.handles], ["abort-r0", 7, [abort]]);
  assert.equal(envelopeOf(first.entries.b).isAbort, true);
  assert.equal(first.entries.a, null, "a running parent has no terminal entry");
  assert.equal(envelopeOf(first.entries.c).handle, eosC, "an ended parent shows its EOS");
  assert.equal(join.popReady()?.kind, GroupKind.data);
  book.offer("a", "eos-r0", 2, { type: MsgType.eos });
  book.offer("b", "eos-r0", 2, { type: MsgType.eos });
  const end = join.popReady() as ReadyGroup<number>;
  assert.equal(end.kind, GroupKind.end);
  assert.equal(envelopeOf(end.entries.b).isAbort, true, "ABORT outranks the same parent's EOS (ABORT-3)");
  assert.equal(envelopeOf(end.entries.a).isStopSignal, true);
});

Deno.test("a redelivered ABORT not yet surfaced supersedes the held one", () => {
  const { book } = trace(["a", "b"]);
  const first = book.offer("a", "abort-r0", 1, { type: MsgType.abort });
  const second = book.offer("a", "abort-r0", 1, { type: MsgType.abort });
  const { groups, releases } = book.drain();
  assert.deepEqual(groups.map((g) => [g.kind, g.handles]), [["abort", [second]]]);
  assert.deepEqual(releases.map((r) => [r.reason, r.handles]), [["superseded", [first]]]);
});

Deno.test("handBack gives every held handle back to be naked and forgets the ended parents", () => {
  const { join, book } = trace(["a", "b"], { missing: "wait" });
  book.offer("a", "t1", 1);
  book.offer("a", "t2", 2);
  book.offer("b", "t2", 2);
  book.offer("a", "eos-r0", 3, { type: MsgType.eos });
  book.offer("b", "abort-r0", 3, { type: MsgType.abort });
  join.handBack();
  const { groups, releases } = book.drain();
  assert.deepEqual(groups, []);
  assert.deepEqual(releases.map((r) => [r.reason, r.settlement, r.handles.length]), [[
    "handed_back",
    "nak",
    5,
  ]]);
  assert.deepEqual(join.takeDrops(), {});
  assert.equal(join.evictions, 0);
  book.assertAllBack();
  book.offer("a", "t3", 3);
  assert.equal(join.pendingCount(), 1, "a handed-back parent runs again: t3 waits for b");
});

// ---------------------------------------------------------------- time joins

const TIME = { mode: "time", toleranceMs: 20 } as const;
const T0 = 1_700_000_100;

function time(parents: string[], init: JoinPolicyInit = {}) {
  const clock = new FakeClock();
  const join = makeAssembler<number>("fuse", parents, new JoinPolicy({ ...TIME, ...init }), { clock });
  return { join, clock, book: new Book(join) };
}

Deno.test("a time group gathers one entry per parent within tolerance, with the minted time identity", () => {
  const { book } = time(["left", "right"], { missing: "wait" });
  book.offer("left", "left:1", 1, { eventTs: T0 + 0.010 });
  book.offer("right", "right:7", 7, { eventTs: T0 + 0.002 });
  const [group] = book.drain().groups;
  const expected = timeGroupIdentity({
    left: { producer: "left", traceId: "left:1", seq: 1, eventTs: T0 + 0.010, arrivalTs: 0 },
    right: { producer: "right", traceId: "right:7", seq: 7, eventTs: T0 + 0.002, arrivalTs: 0 },
  });
  assert.deepEqual([group.traceId, group.seq, group.eventTs], [expected.traceId, expected.seq, T0 + 0.002]);
  assert.match(group.traceId, /^tw-\d+-[0-9a-f]{12}$/);
  assert.deepEqual([envelopeOf(group.entries.left).seq, envelopeOf(group.entries.right).seq], [1, 7]);
  book.assertAllBack();
});

Deno.test("a time entry joins the nearest pending group within tolerance, else seeds its own", () => {
  const { join, book } = time(["a", "b"], { missing: "wait" });
  book.offer("a", "a:1", 1, { eventTs: T0 });
  book.offer("a", "a:2", 2, { eventTs: T0 + 0.030 });
  book.offer("a", "a:3", 3, { eventTs: T0 + 0.100 });
  assert.equal(join.pendingCount(), 3, "two entries of one parent never share a group");
  book.offer("b", "b:1", 1, { eventTs: T0 + 0.021 });
  book.offer("b", "b:2", 2, { eventTs: T0 + 0.060 });
  const groups = book.drain().groups;
  assert.deepEqual(
    groups.map((g) => [envelopeOf(g.entries.a).seq, envelopeOf(g.entries.b).seq]),
    [[2, 1]],
    "b:1 is 21 ms from a:1 (beyond tolerance) and 9 ms from a:2 (nearest); b:2 is within 20 ms of none",
  );
  assert.equal(join.pendingCount(), 3);
});

Deno.test("a time group stays within tolerance end to end: a member never stretches it beyond", () => {
  const { join, book } = time(["a", "b", "c"], { missing: "wait" });
  book.offer("a", "a:1", 1, { eventTs: T0 });
  book.offer("b", "b:1", 1, { eventTs: T0 + 0.015 });
  book.offer("c", "c:1", 1, { eventTs: T0 - 0.010 });
  assert.equal(join.pendingCount(), 2, "c:1 is within 20 ms of a:1 but 25 ms from b:1: it seeds a new group");
  assert.deepEqual(book.drain().groups, []);
});

Deno.test("an entry without an event time is placed at its arrival time", () => {
  const { clock, book } = time(["a", "b"], { missing: "wait" });
  const wall = FAKE_WALL_START;
  book.offer("a", "a:1", 1, { eventTs: wall + 0.005 });
  book.offer("b", "b:1", 1, { eventTs: null });
  const [group] = book.drain().groups;
  assert.equal(group.eventTs, wall, "b:1 counts at its arrival, the fake clock's wall start");
  clock.advance(1);
  book.offer("b", "b:2", 2, { eventTs: null });
  book.offer("a", "a:2", 2, { eventTs: wall + 1.010 });
  const [late] = book.drain().groups;
  assert.equal(late.eventTs, wall + 1, "the arrival time (wall clock) stands in for the missing event time");
});

Deno.test("story 50 (JOIN-23): a time group's identity is the same whatever order its members arrive in (replay)", () => {
  const ids: string[] = [];
  for (const order of [["a", "b", "c"], ["c", "a", "b"], ["b", "c", "a"]]) {
    const { book } = time(["a", "b", "c"], { missing: "wait" });
    const ts: Record<string, number> = { a: T0 + 0.004, b: T0 + 0.001, c: T0 + 0.009 };
    for (const p of order) book.offer(p, `${p}:3`, 3, { eventTs: ts[p] });
    const [group] = book.drain().groups;
    ids.push(`${group.traceId}/${group.seq}`);
  }
  assert.equal(new Set(ids).size, 1, ids.join(" "));
});

Deno.test("story 50: at the timeout a time group with a quorum is emitted with null for its missing parents", () => {
  const { join, clock, book } = time(["a", "b", "c"], { timeoutSeconds: 2, quorum: 2 });
  const ha = book.offer("a", "a:1", 1, { eventTs: T0 });
  const hc = book.offer("c", "c:1", 1, { eventTs: T0 + 0.005 });
  clock.advance(1.999);
  join.sweep();
  assert.deepEqual(book.drain().groups, []);
  clock.advance(0.001);
  join.sweep();
  const [group] = book.drain().groups;
  assert.deepEqual(Object.keys(group.entries), ["a", "b", "c"]);
  assert.equal(group.entries.b, null);
  assert.deepEqual([...group.handles].sort(), [ha, hc].sort());
  const members = {
    a: { producer: "a", traceId: "a:1", seq: 1, eventTs: T0, arrivalTs: 0 },
    c: { producer: "c", traceId: "c:1", seq: 1, eventTs: T0 + 0.005, arrivalTs: 0 },
  };
  assert.equal(group.traceId, timeGroupIdentity(members).traceId, "only present members make the identity");
  assert.equal(join.evictions, 0);
  book.assertAllBack();
});

Deno.test("story 50: at the timeout a time group below quorum is evicted per missing", () => {
  for (const [missing, settlement] of [["drop", "ack"], ["error", "nak"]] as const) {
    const { join, clock, book } = time(["a", "b", "c"], { timeoutSeconds: 2, quorum: 2, missing });
    const h = book.offer("b", "b:1", 1, { eventTs: T0 });
    clock.advance(2);
    join.sweep();
    assert.deepEqual(book.drain().releases, [{
      reason: ReleaseReason.timeout,
      settlement,
      parents: ["b"],
      handles: [h],
    }]);
    assert.deepEqual(join.takeDrops(), settlement === "ack" ? { join_evicted: 1 } : {});
  }
});

Deno.test("without a quorum a timed-out time group is evicted, even with all but one parent", () => {
  const { join, clock, book } = time(["a", "b", "c"], { timeoutSeconds: 1 });
  book.offer("a", "a:1", 1, { eventTs: T0 });
  book.offer("b", "b:1", 1, { eventTs: T0 });
  clock.advance(1);
  join.sweep();
  const { groups, releases } = book.drain();
  assert.deepEqual(groups, []);
  assert.deepEqual(releases.map((r) => [r.reason, r.parents]), [["timeout", ["a", "b"]]]);
  book.assertAllBack();
});

Deno.test("beyond max_pending the oldest incomplete time group is evicted as a drop", () => {
  const { join, book } = time(["a", "b"], { timeoutSeconds: 5, maxPending: 2, quorum: 1 });
  const first = book.offer("a", "a:1", 1, { eventTs: T0 });
  book.offer("a", "a:2", 2, { eventTs: T0 + 1 });
  book.offer("a", "a:3", 3, { eventTs: T0 + 2 });
  assert.deepEqual(book.drain().releases.map((r) => [r.reason, r.settlement, r.handles]), [[
    "max_pending",
    "ack",
    [first],
  ]]);
  assert.equal(join.pendingCount(), 2);
});

Deno.test("a lossless (batch) join keeps every incomplete group past max_pending and loses none", () => {
  for (const mode of ["trace", "time"] as const) {
    const clock = new FakeClock();
    const policy = new JoinPolicy(
      mode === "time" ? { ...TIME, missing: "wait", maxPending: 2 } : {
        missing: "wait",
        maxPending: 2,
      },
    );
    const join = makeAssembler<number>("join", ["a", "b"], policy, { clock, lossless: true });
    const book = new Book(join);
    for (let i = 1; i <= 10; i++) book.offer("a", `t${i}`, i, { eventTs: T0 + i });
    assert.deepEqual(book.drain(), { groups: [], releases: [] }, `${mode}: nothing evicted`);
    assert.equal(join.pendingCount(), 10, `${mode}: all ten held`);
    for (let i = 1; i <= 10; i++) book.offer("b", `t${i}`, i, { eventTs: T0 + i });
    const { groups, releases } = book.drain();
    assert.equal(groups.length, 10, `${mode}: every group completes`);
    assert.deepEqual(releases, []);
    assert.equal(join.evictions, 0);
    assert.deepEqual(join.takeDrops(), {});
  }
});

Deno.test("a redelivered time member replaces the held one and the group keeps its identity", () => {
  const { join, book } = time(["a", "b"], { missing: "wait" });
  const first = book.offer("a", "a:1", 1, { eventTs: T0, message: "old" });
  const second = book.offer("a", "a:1", 1, { eventTs: T0, message: "new" });
  assert.equal(join.pendingCount(), 1, "the redelivery seeds no second group");
  assert.deepEqual(book.drain().releases.map((r) => [r.reason, r.settlement, r.handles]), [[
    "superseded",
    "retire",
    [first],
  ]]);
  book.offer("b", "b:1", 1, { eventTs: T0 });
  const [group] = book.drain().groups;
  assert.ok(group.handles.includes(second));
  assert.equal(envelopeOf(group.entries.a).message, "new");
  book.assertAllBack();
});

Deno.test("a sync parent's EOS emits quorum groups that can get no more members, and evicts the rest", () => {
  const { join, book } = time(["a", "b", "c"], { timeoutSeconds: 30, quorum: 2 });
  book.offer("a", "a:1", 1, { eventTs: T0 });
  book.offer("b", "b:1", 1, { eventTs: T0 });
  const lone = book.offer("a", "a:2", 2, { eventTs: T0 + 1 });
  book.offer("c", "eos-r0", 9, { type: MsgType.eos });
  const { groups, releases } = book.drain();
  assert.deepEqual(groups.map((g) => [g.kind, g.entries.c]), [["data", null]], "a+b meet the quorum");
  assert.equal(join.pendingCount(), 1, "a:2 may still be joined by b");
  assert.deepEqual(releases, []);
  book.offer("b", "eos-r0", 9, { type: MsgType.eos });
  assert.deepEqual(book.drain().releases.map((r) => [r.reason, r.handles]), [["parent_ended", [lone]]]);
  book.offer("a", "eos-r0", 9, { type: MsgType.eos });
  assert.deepEqual(book.drain().groups.map((g) => g.kind), ["end"]);
  book.assertAllBack();
});

// ---------------------------------------------------------------- collect parents

function collecting(init: JoinPolicyInit = {}) {
  return time(["cam", "imu"], { collect: { imu: 10 }, timeoutSeconds: 1, ...init });
}

Deno.test("a collect parent contributes every sample within its window of the group's time, oldest first", () => {
  const { clock, book } = collecting();
  const hs = [0.012, -0.004, 0.009, 0.003, -0.011].map((d, i) =>
    book.offer("imu", `imu:${i}`, i, { eventTs: T0 + d, message: d })
  );
  const cam = book.offer("cam", "cam:1", 1, { eventTs: T0 });
  assert.deepEqual(book.drain().groups, [], "a complete group is held for the collect window");
  clock.advance(0.01);
  const [group] = book.drain().groups;
  const imu = collectOf(group.entries.imu);
  assert.deepEqual(imu.message, [-0.004, 0.003, 0.009], "within 10 ms of the group's time, oldest first");
  assert.deepEqual(imu.eventTs, [T0 - 0.004, T0 + 0.003, T0 + 0.009]);
  assert.equal(imu.metadata.length, 3);
  assert.deepEqual([...group.handles].sort(), [cam, hs[1], hs[2], hs[3]].sort());
  assert.deepEqual(Object.keys(group.entries), ["cam", "imu"]);
});

Deno.test("collect parents never gate completeness and the group's identity ignores them", () => {
  const { clock, book } = collecting();
  book.offer("cam", "cam:1", 1, { eventTs: T0 });
  clock.advance(0.01);
  const [group] = book.drain().groups;
  assert.deepEqual(collectOf(group.entries.imu).message, []);
  const alone = groupIdentity({ cam: { producer: "cam", traceId: "cam:1", seq: 1 } }, null, group.seq);
  assert.equal(group.traceId, alone);
});

Deno.test("a sample in two groups' windows is delivered to both but its handle leaves with the first", () => {
  const { clock, book } = collecting();
  const sample = book.offer("imu", "imu:1", 1, { eventTs: T0 + 0.005 });
  book.offer("cam", "cam:1", 1, { eventTs: T0 });
  book.offer("cam", "cam:2", 2, { eventTs: T0 + 0.010 });
  clock.advance(0.01);
  const groups = book.drain().groups;
  assert.equal(groups.length, 2);
  assert.deepEqual(groups.map((g) => collectOf(g.entries.imu).message.length), [1, 1]);
  assert.deepEqual(groups.map((g) => g.handles.includes(sample)), [true, false]);
});

Deno.test("an unclaimed collect sample is dropped after timeout plus the settle window", () => {
  const { join, clock, book } = collecting({ timeoutSeconds: 2 });
  const h = book.offer("imu", "imu:1", 1, { eventTs: T0 });
  assert.ok(join.hasPendingFrom("imu"));
  assert.equal(join.nextDeadline(), clock.monotonic() + 2.01);
  clock.advance(2.009);
  join.sweep();
  assert.deepEqual(book.drain().releases, []);
  clock.advance(0.001);
  join.sweep();
  assert.deepEqual(book.drain().releases, [{
    reason: ReleaseReason.collectExpired,
    settlement: Settlement.ack,
    parents: ["imu"],
    handles: [h],
  }]);
  assert.ok(!join.hasPendingFrom("imu"));
  assert.deepEqual(join.takeDrops(), { join_evicted: 1 });
});

Deno.test("without a timeout an unclaimed sample is kept 30 s plus the settle window", () => {
  const { join, clock, book } = collecting({ timeoutSeconds: null, missing: "wait" });
  book.offer("imu", "imu:1", 1, { eventTs: T0 });
  clock.advance(30.009);
  join.sweep();
  assert.deepEqual(book.drain().releases, []);
  clock.advance(0.001);
  join.sweep();
  assert.deepEqual(book.drain().releases.map((r) => r.reason), ["collect_expired"]);
});

Deno.test("a full collect buffer drops its oldest sample to take a new one", () => {
  const { join, book } = collecting({ maxPending: 1 });
  const capacity = join.policy.collectBufferCapacity;
  assert.equal(capacity, 1024);
  const handles = Array.from(
    { length: capacity + 2 },
    (_, i) => book.offer("imu", `imu:${i}`, i, { eventTs: T0 + i }),
  );
  const { releases } = book.drain();
  assert.deepEqual(releases.map((r) => [r.reason, r.settlement, r.handles]), [
    ["collect_overflow", "ack", [handles[0]]],
    ["collect_overflow", "ack", [handles[1]]],
  ]);
  assert.equal(join.heldHandles(), capacity);
});

Deno.test("a redelivered collect sample supersedes an unclaimed one and is held again after a claim", () => {
  const { join, clock, book } = collecting();
  const first = book.offer("imu", "imu:1", 1, { eventTs: T0 });
  const second = book.offer("imu", "imu:1", 1, { eventTs: T0 });
  assert.deepEqual(book.drain().releases.map((r) => [r.reason, r.handles]), [["superseded", [first]]]);
  book.offer("cam", "cam:1", 1, { eventTs: T0 });
  clock.advance(0.01);
  assert.ok(book.drain().groups[0].handles.includes(second));
  assert.ok(!join.hasPendingFrom("imu"));
  const third = book.offer("imu", "imu:1", 1, { eventTs: T0 });
  assert.ok(join.hasPendingFrom("imu"), "the redelivery of a claimed sample is a live delivery to settle");
  book.offer("cam", "eos-r0", 5, { type: MsgType.eos });
  const { releases } = book.drain();
  assert.deepEqual(releases.map((r) => [r.reason, r.settlement, r.handles]), [["parent_ended", "ack", [
    third,
  ]]]);
});

Deno.test("once every sync parent ended, unclaimed samples go at once and the collect parent can drain", () => {
  const { join, clock, book } = collecting();
  const early = book.offer("imu", "imu:0", 0, { eventTs: T0 - 5 });
  book.offer("cam", "cam:1", 1, { eventTs: T0 });
  book.offer("cam", "eos-r0", 2, { type: MsgType.eos });
  assert.ok(join.hasPendingFrom("imu"), "the settling group may still claim samples");
  clock.advance(0.01);
  const { groups, releases } = book.drain();
  assert.equal(groups.length, 1);
  assert.deepEqual(releases.map((r) => [r.reason, r.handles]), [["parent_ended", [early]]]);
  const late = book.offer("imu", "imu:9", 9, { eventTs: T0 + 3 });
  assert.deepEqual(book.drain().releases.map((r) => r.handles), [[late]]);
  book.offer("imu", "eos-r0", 10, { type: MsgType.eos });
  assert.deepEqual(book.drain().groups.map((g) => g.kind), ["end"]);
  book.assertAllBack();
});

Deno.test("when the collect parents end, settling groups are released without waiting out the window", () => {
  const { book } = collecting();
  book.offer("imu", "eos-r0", 1, { type: MsgType.eos });
  book.offer("cam", "cam:1", 1, { eventTs: T0 });
  assert.equal(book.drain().groups.length, 1, "no trailing sample can come: no hold");
  const settle = collecting();
  settle.book.offer("cam", "cam:1", 1, { eventTs: T0 });
  assert.deepEqual(settle.book.drain().groups, []);
  settle.book.offer("imu", "eos-r0", 1, { type: MsgType.eos });
  assert.equal(settle.book.drain().groups.length, 1, "the hold ends when the collect parent does");
});

// ---------------------------------------------------------------- randomized

interface Delivery {
  readonly parent: string;
  readonly traceId: string;
  readonly seq: number;
  readonly eventTs: number | null;
  /** Which logical item it belongs to (a trace, or a tick of the time streams). */
  readonly item: number;
}

/** Offers `d`, maybe redelivers it while the first copy is still held, and maybe drains. */
function offerRandomly(book: Book, rnd: SeededRandom, d: Delivery, handleItem: Map<number, number>): void {
  const h = book.offer(d.parent, d.traceId, d.seq, { eventTs: d.eventTs });
  handleItem.set(h, d.item);
  if (rnd.chance(0.1) && !book.back.has(h)) {
    handleItem.set(book.offer(d.parent, d.traceId, d.seq, { eventTs: d.eventTs }), d.item);
  }
  if (rnd.chance(0.5)) book.drain();
}

function endAll(book: Book, rnd: SeededRandom, parents: readonly string[]): void {
  for (const p of rnd.shuffle(parents)) book.offer(p, "eos-r0", 1_000_000, { type: MsgType.eos });
  book.drain();
}

Deno.test("random arrival orders of random trace streams: every complete group is emitted exactly once", () => {
  const seed = testSeed();
  const rnd = new SeededRandom(seed);
  for (let round = 0; round < 60; round++) {
    const parents = Array.from({ length: rnd.int(2, 4) }, (_, i) => `p${i}`);
    const traces = rnd.int(1, 60);
    const deliveries: Delivery[] = [];
    const complete = new Set<string>();
    let partial = 0;
    for (let t = 1; t <= traces; t++) {
      const present = parents.filter(() => rnd.chance(0.9));
      if (present.length === parents.length) complete.add(`src:${t}`);
      else if (present.length > 0) partial++;
      for (const parent of present) {
        deliveries.push({
          parent,
          traceId: `src:${t}`,
          seq: t,
          eventTs: rnd.chance(0.2) ? null : t,
          item: t,
        });
      }
    }
    const label = `seed ${seed} round ${round}`;
    const { join } = trace(parents, { missing: "wait", maxPending: traces + 1 });
    const book = new Book(join, label);
    const handleItem = new Map<number, number>();
    for (const d of rnd.shuffle(deliveries)) offerRandomly(book, rnd, d, handleItem);
    book.drain();
    assert.equal(join.pendingCount(), partial, `${label}: incomplete traces wait`);
    endAll(book, rnd, parents);
    book.assertAllBack();
    const data = book.groups.filter((g) => g.kind === GroupKind.data);
    assert.deepEqual(data.map((g) => g.traceId).sort(), [...complete].sort(), `${label}: emitted traces`);
    for (const g of data) {
      const entries = Object.values(g.entries).map(envelopeOf);
      assert.ok(entries.every((e) => e.traceId === g.traceId), `${label}: one trace per group`);
      assert.ok(
        g.handles.every((h) => handleItem.get(h) === Number(g.seq)),
        `${label}: handles of the group`,
      );
    }
    assert.deepEqual(book.groups.map((g) => g.kind).slice(-1), ["end"], `${label}: the end comes last`);
  }
});

Deno.test("a single-parent assembler gives what a trace assembler over that parent gives: the same groups, supersessions, releases, end and hand-back", () => {
  const seed = testSeed();
  const rnd = new SeededRandom(seed);
  for (let round = 0; round < 40; round++) {
    const policy = new JoinPolicy(
      rnd.chance(0.5) ? { missing: "wait" } : { timeoutSeconds: 1, missing: "drop", maxPending: 2 },
    );
    const clock = new FakeClock();
    const fast = new Book(new SingleParentAssembler<number>("join", ["a"], policy, { clock }));
    const plain = new Book(new TraceGroupAssembler<number>("join", ["a"], policy, { clock }));
    const label = `seed ${seed} round ${round}`;
    const both = (step: (book: Book) => void) => {
      step(fast);
      step(plain);
    };
    const steps = rnd.int(1, 80);
    for (let i = 0; i < steps; i++) {
      const t = rnd.int(1, 20);
      const roll = rnd.int(0, 20);
      if (roll < 14) {
        const eventTs = rnd.chance(0.3) ? null : t;
        both((book) => book.offer("a", `src:${t}`, t, { eventTs }));
      } else if (roll < 16) both((book) => book.offer("a", `eos-${t}`, t, { type: MsgType.eos }));
      else if (roll < 17) both((book) => book.offer("a", `abort-${t}`, t, { type: MsgType.abort }));
      else if (roll < 18) both((book) => book.join.handBack());
      else if (roll < 19) clock.advance(2);
      else both((book) => book.join.sweep());
      if (rnd.chance(0.4)) {
        const [a, b] = [fast.drain(), plain.drain()];
        assert.deepEqual(a, b, `${label} step ${i}: the same groups and releases`);
      }
      assert.equal(fast.join.heldHandles(), plain.join.heldHandles(), `${label}: the same handles held`);
      assert.equal(fast.join.hasPendingFrom("a"), plain.join.hasPendingFrom("a"), label);
      assert.equal(fast.join.pendingCount(), plain.join.pendingCount(), label);
    }
    assert.deepEqual(fast.drain(), plain.drain(), `${label}: the same at the end`);
    assert.deepEqual(fast.join.takeDrops(), plain.join.takeDrops(), label);
  }
});

Deno.test("a single-parent assembler takes two messages that share a trace id as two groups, and a redelivery as the one it supersedes", () => {
  const book = new Book(new SingleParentAssembler<number>("det", ["cam"], new JoinPolicy()));
  const first = book.offer("cam", "cam:1", 1);
  const second = book.offer("cam", "cam:1", 2);
  const again = book.offer("cam", "cam:1", 1);
  const { groups, releases } = book.drain();
  assert.deepEqual(
    groups.map((g) => [g.traceId, g.seq, g.handles]),
    [["cam:1", 1, [again]], ["cam:1", 2, [second]]],
    "the redelivery takes its copy's place",
  );
  assert.deepEqual(releases.flatMap((r) => r.handles), [first], "the superseded delivery is released");
});

Deno.test("random trace joins under timeouts and a small max_pending never lose or duplicate a handle", () => {
  const seed = testSeed();
  const rnd = new SeededRandom(seed);
  for (let round = 0; round < 60; round++) {
    const parents = Array.from({ length: rnd.int(2, 3) }, (_, i) => `p${i}`);
    const policy = new JoinPolicy({
      maxPending: rnd.int(1, 6),
      timeoutSeconds: rnd.pick([null, 0.5, 2]),
      missing: rnd.pick(["drop", "error"] as const),
    });
    const label = `seed ${seed} round ${round} policy ${JSON.stringify(policy.toDict())}`;
    const clock = new FakeClock();
    const join = makeAssembler<number>("join", parents, policy, { clock });
    const book = new Book(join, label);
    const deliveries: Delivery[] = [];
    for (let t = 1; t <= rnd.int(1, 50); t++) {
      for (const parent of parents.filter(() => rnd.chance(0.85))) {
        deliveries.push({ parent, traceId: `src:${t}`, seq: t, eventTs: t, item: t });
      }
    }
    let dropped = 0;
    for (const d of rnd.shuffle(deliveries)) {
      offerRandomly(book, rnd, d, new Map());
      clock.advance(rnd.next() * 0.3);
      if (rnd.chance(0.5)) join.sweep();
      book.drain();
      dropped += join.takeDrops().join_evicted ?? 0;
      assert.ok(join.pendingCount() <= policy.maxPending, `${label}: pending within max_pending`);
      assert.ok(
        join.heldHandles() < policy.workingSet(parents.length),
        `${label}: held within the working set`,
      );
    }
    endAll(book, rnd, parents);
    dropped += join.takeDrops().join_evicted ?? 0;
    book.assertAllBack();
    const acked = book.releases.filter((r) => r.settlement === Settlement.ack).flatMap((r) => r.handles);
    assert.equal(dropped, acked.length, `${label}: takeDrops counts every input acked unprocessed`);
    const emitted = book.groups.filter((g) => g.kind === GroupKind.data).map((g) => g.traceId);
    assert.equal(new Set(emitted).size, emitted.length, `${label}: no trace emitted twice`);
  }
});

const PERIOD = 0.1;

/** Frames of `sync` parents on a common 100 ms tick (jitter under ±9 ms), some missing; optional collect samples. */
function timeStreams(rnd: SeededRandom, sync: readonly string[], ticks: number, collect: string | null) {
  const deliveries: Delivery[] = [];
  const present = new Map<number, number>();
  for (let k = 0; k < ticks; k++) {
    for (const parent of sync) {
      if (!rnd.chance(0.85)) continue;
      present.set(k, (present.get(k) ?? 0) + 1);
      const eventTs = T0 + k * PERIOD + (rnd.next() - 0.5) * 0.018;
      deliveries.push({ parent, traceId: `${parent}:${k}`, seq: k, eventTs, item: k });
    }
  }
  if (collect !== null) {
    for (let i = 0; i < ticks * PERIOD / 0.005; i++) {
      const eventTs = T0 - PERIOD / 2 + i * 0.005 + rnd.next() * 0.001;
      deliveries.push({ parent: collect, traceId: `${collect}:${i}`, seq: i, eventTs, item: -1 });
    }
  }
  return { deliveries, present };
}

/** Delivers in the order of event time plus a random latency (up to 30 ms), moving the clock along. */
function runTimeStreams(
  rnd: SeededRandom,
  label: string,
  parents: readonly string[],
  policy: JoinPolicy,
  deliveries: readonly Delivery[],
) {
  const clock = new FakeClock(1000, T0 - 1);
  const join = makeAssembler<number>("fuse", parents, policy, { clock });
  const book = new Book(join, label);
  const arrivals = deliveries.map((d) => ({ d, at: (d.eventTs as number) + rnd.next() * 0.03 }))
    .sort((x, y) => x.at - y.at);
  const handleItem = new Map<number, number>();
  let now = T0 - 1;
  for (const { d, at } of arrivals) {
    clock.advance(at - now);
    now = at;
    join.sweep();
    offerRandomly(book, rnd, d, handleItem);
  }
  clock.advance(5);
  join.sweep();
  book.drain();
  endAll(book, rnd, parents);
  book.assertAllBack();
  return { book, handleItem };
}

Deno.test("random time streams: each tick forms one group, quorum groups emit, the rest are evicted, ids replay", () => {
  const seed = testSeed();
  const rnd = new SeededRandom(seed);
  for (let round = 0; round < 30; round++) {
    const sync = Array.from({ length: rnd.int(2, 4) }, (_, i) => `cam${i}`);
    const collect = rnd.chance(0.5) ? "imu" : null;
    const parents = collect === null ? sync : [...sync, collect];
    const quorum = rnd.chance(0.5) ? rnd.int(1, sync.length) : null;
    const policy = new JoinPolicy({
      mode: "time",
      toleranceMs: 20,
      timeoutSeconds: 1,
      quorum,
      collect: collect === null ? null : { [collect]: 8 },
    });
    const label = `seed ${seed} round ${round} policy ${JSON.stringify(policy.toDict())}`;
    const { deliveries, present } = timeStreams(rnd, sync, rnd.int(1, 40), collect);
    const ids: Map<number, string>[] = [];
    for (const replay of [0, 1]) {
      const { book, handleItem } = runTimeStreams(
        rnd,
        `${label} replay ${replay}`,
        parents,
        policy,
        deliveries,
      );
      const byTick = new Map<number, string>();
      for (const g of book.groups.filter((g) => g.kind === GroupKind.data)) {
        const members = sync.map((p) => g.entries[p]).filter((e) => e !== null).map(envelopeOf);
        const ticks = new Set(members.map((e) => Number(e.seq)));
        assert.equal(ticks.size, 1, `${label}: a group holds one tick's frames`);
        const [tick] = ticks;
        assert.equal(members.length, present.get(tick), `${label}: tick ${tick} grouped whole`);
        const times = members.map((e) => e.eventTs as number);
        assert.ok(Math.max(...times) - Math.min(...times) <= 0.02, `${label}: members within tolerance`);
        assert.equal(g.eventTs, Math.min(...times), `${label}: the group's time is its earliest member's`);
        if (collect !== null) {
          const window = collectOf(g.entries[collect]).eventTs as number[];
          assert.ok(window.every((t) => Math.abs(t - (g.eventTs as number)) <= 0.008), `${label}: window`);
          assert.deepEqual(window, [...window].sort((a, b) => a - b), `${label}: samples oldest first`);
        }
        assert.ok(!byTick.has(tick), `${label}: tick ${tick} emitted twice`);
        byTick.set(tick, `${g.traceId}/${g.seq}`);
      }
      for (const [tick, count] of present) {
        const emits = count === sync.length || (quorum !== null && count >= quorum);
        assert.equal(
          byTick.has(tick),
          emits,
          `${label}: tick ${tick} with ${count} of ${sync.length} frames`,
        );
      }
      const unemitted = book.releases.filter((r) => r.reason !== "superseded").flatMap((r) => r.handles)
        .map((h) => handleItem.get(h) as number).filter((tick) => tick >= 0);
      assert.ok(unemitted.every((tick) => !byTick.has(tick)), `${label}: an emitted tick lost no frame`);
      ids.push(byTick);
    }
    assert.deepEqual(ids[1], ids[0], `${label}: the same members replay to the same identities`);
  }
});

// ---------------------------------------------------------------- story 14

/**
 * Story 14 at the assembler: two parents behind credit-limited subscriptions (each holds at most `credit`
 * unsettled deliveries); every A is delivered before any B whenever A has credit. Groups are processed
 * (their handles settled) as soon as they are ready; released handles are settled at once. Returns whether
 * delivery stalled with messages left, and the book.
 */
function adversarialJoin(credit: number, maxPending: number, traces: number, reverseB: boolean) {
  const policy = new JoinPolicy({ missing: "wait", maxPending });
  const join = makeAssembler<number>("join", ["a", "b"], policy, { clock: new FakeClock() });
  const book = new Book(join, `credit ${credit} max_pending ${maxPending} traces ${traces}`);
  const outstanding = { a: 0, b: 0 };
  const parentOf = new Map<number, "a" | "b">();
  const sent = { a: 0, b: 0 };
  let peakHeld = 0;
  const settleAll = () => {
    const { groups, releases } = book.drain();
    for (const h of [...groups, ...releases].flatMap((x) => x.handles)) outstanding[parentOf.get(h) ?? "a"]--;
  };
  for (;;) {
    const parent = sent.a < traces && outstanding.a < credit
      ? "a"
      : sent.b < traces && outstanding.b < credit
      ? "b"
      : null;
    if (parent === null) break;
    const n = ++sent[parent];
    const t = parent === "b" && reverseB ? traces + 1 - n : n;
    parentOf.set(book.offer(parent, `src:${t}`, t), parent);
    outstanding[parent]++;
    peakHeld = Math.max(peakHeld, join.heldHandles());
    settleAll();
  }
  const stalled = sent.a < traces || sent.b < traces;
  return { stalled, book, join, policy, peakHeld, settleAll };
}

Deno.test("story 14 (RUN-005): all of A then all of B deadlocks a join whose credit is below its working set", () => {
  const { stalled, book, join, peakHeld } = adversarialJoin(4, 8, 50, true);
  assert.ok(stalled, "delivery stops with messages left");
  assert.equal(join.heldHandles(), 8, "both credits are full of halves that can never meet");
  assert.equal(peakHeld, 8);
  assert.deepEqual(book.groups, []);
  assert.equal(join.evictions, 0, "max_pending was never exceeded, so nothing was evicted to free credit");
});

Deno.test("story 14 (RUN-005): with credit = working set, the oldest groups are evicted as drops and the join completes", () => {
  const seed = testSeed();
  const rnd = new SeededRandom(seed);
  const shapes = [[8, 50, true], [8, 50, false], [1, 5, true]] as const;
  const randomShapes = Array.from(
    { length: 20 },
    () => [rnd.int(1, 16), rnd.int(1, 80), rnd.chance(0.5)] as const,
  );
  for (const [maxPending, traces, reverseB] of [...shapes, ...randomShapes]) {
    const credit = new JoinPolicy({ missing: "wait", maxPending }).workingSet(2);
    const run = adversarialJoin(credit, maxPending, traces, reverseB);
    const label = `seed ${seed} max_pending ${maxPending} traces ${traces} reverse ${reverseB}`;
    assert.ok(!run.stalled, `${label}: no deadlock`);
    assert.ok(run.peakHeld <= credit * 2, `${label}: held within both credits`);
    for (const p of ["a", "b"]) run.book.offer(p, "eos-r0", traces + 1, { type: MsgType.eos });
    run.settleAll();
    run.book.assertAllBack();
    const data = run.book.groups.filter((g) => g.kind === GroupKind.data);
    const drops = run.book.releases.filter((r) => r.settlement === Settlement.ack).flatMap((r) => r.handles);
    assert.equal(data.length * 2 + drops.length, traces * 2, `${label}: every input processed or dropped`);
    assert.deepEqual(run.join.takeDrops(), drops.length > 0 ? { join_evicted: drops.length } : {}, label);
    assert.ok(
      traces <= maxPending || run.book.releases.some((r) => r.reason === ReleaseReason.maxPending),
      `${label}: progress came from max_pending evictions`,
    );
  }
});
