/**
 * FlowRuntime's own rules, beside the conformance stories (tests/conformance/runtime/): environment
 * parsing, argument checks, key encoding, the EOS-7 decision over random facts, truthful failures of reads
 * and records, outbox and group bookkeeping, fencing-token order, contention.
 */
import assert from "node:assert/strict";
import {
  CapabilityError,
  ConfigError,
  OwnershipConflict,
  StaleAuthority,
  TransientFailure,
  UnobservableState,
} from "../../../src/core/errors.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { MemoryRuntimeStore } from "../../../src/backends/memory/runtime_store.ts";
import {
  accepted,
  known,
  type Observation,
  publicationUnknown,
  rejected,
  unknown,
} from "../../../src/backends/outcomes.ts";
import {
  CAS_RETRIES,
  claimReplicaSlot,
  CompletionState,
  DEFAULT_PARTITION_LEASE_SECONDS,
  DEFAULT_RECONCILE_INTERVAL_SECONDS,
  FlowRuntime,
  type FlowRuntimeOptions,
  forgetBrokerCounts,
  forgetReplayPositions,
  partitionLeaseFromEnv,
  type PendingCounts,
  reconcileIntervalFromEnv,
  storeSharedAndDurable,
} from "../../../src/backends/runtime.ts";
import {
  type RuntimeCapabilities,
  runtimeCapabilities,
  type RuntimeStore,
  type StoredRecord,
  type StoreEntry,
} from "../../../src/backends/runtime_store.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const encoder = new TextEncoder();

function runtime(store: RuntimeStore, options: Partial<FlowRuntimeOptions> = {}): FlowRuntime {
  return new FlowRuntime({ store, flowId: "f", runId: "r", node: "n", ...options });
}

/**
 * A memory store whose reads can be made to fail, whose swaps can be made to lose, and whose durability
 * can be reported as anything: the failures a real store may show, on demand.
 */
class ScriptedStore implements RuntimeStore {
  readonly inner = new MemoryRuntimeStore();
  failReads = false;
  loseSwaps = false;
  durable: Observation<boolean> = known(false);

  get(key: string): Promise<StoreEntry> {
    return this.failReads ? this.#unreadable(key) : this.inner.get(key);
  }

  cas(key: string, expectedVersion: string | null, value: Uint8Array): Promise<boolean> {
    return this.loseSwaps ? Promise.resolve(false) : this.inner.cas(key, expectedVersion, value);
  }

  delete(key: string, expectedVersion: string | null): Promise<boolean> {
    return this.inner.delete(key, expectedVersion);
  }

  scan(prefix: string): Promise<readonly StoredRecord[]> {
    return this.failReads ? this.#unreadable(prefix) : this.inner.scan(prefix);
  }

  append(log: string, record: Uint8Array): Promise<number> {
    return this.inner.append(log, record);
  }

  logEntries(log: string): Promise<readonly Uint8Array[]> {
    return this.failReads ? this.#unreadable(log) : this.inner.logEntries(log);
  }

  capabilities(): Promise<RuntimeCapabilities> {
    return Promise.resolve(runtimeCapabilities("scripted", this.durable, true, true, true));
  }

  close(): Promise<void> {
    return this.inner.close();
  }

  #unreadable(name: string): Promise<never> {
    return Promise.reject(
      new UnobservableState(`${name} could not be read`, null, { reason: "unreachable" }),
    );
  }
}

Deno.test("partitionLeaseFromEnv: absent or blank is the default; a positive number is taken", () => {
  for (const absent of [undefined, null, "", "  "]) {
    assert.equal(partitionLeaseFromEnv(absent), DEFAULT_PARTITION_LEASE_SECONDS);
  }
  assert.equal(partitionLeaseFromEnv("2.5"), 2.5);
  assert.equal(partitionLeaseFromEnv(" 30 "), 30);
  assert.equal(partitionLeaseFromEnv("1e1"), 10);
  assert.equal(partitionLeaseFromEnv(".5"), 0.5);
});

Deno.test("partitionLeaseFromEnv: zero, negative, non-numeric and non-finite values fail fast", () => {
  for (const bad of ["0", "-1", "abc", "5s", "0x10", "NaN", "Infinity", "1e400", "1,5"]) {
    assert.throws(() => partitionLeaseFromEnv(bad), ConfigError, bad);
  }
  assert.throws(() => partitionLeaseFromEnv("0"), /VF_PARTITION_LEASE_SECONDS/);
});

Deno.test("reconcileIntervalFromEnv: absent is the default, 0 turns the periodic pass off, negative fails", () => {
  assert.equal(reconcileIntervalFromEnv(undefined), DEFAULT_RECONCILE_INTERVAL_SECONDS);
  assert.equal(reconcileIntervalFromEnv(""), DEFAULT_RECONCILE_INTERVAL_SECONDS);
  assert.equal(reconcileIntervalFromEnv("0"), 0);
  assert.equal(reconcileIntervalFromEnv("15"), 15);
  for (const bad of ["-1", "soon", "Infinity", "-0.5"]) {
    assert.throws(() => reconcileIntervalFromEnv(bad), ConfigError, bad);
  }
  assert.throws(() => reconcileIntervalFromEnv("-1"), /VF_RECONCILE_INTERVAL_SECONDS/);
});

Deno.test("a FlowRuntime has the spec's defaults and refuses unusable options", () => {
  const store = new MemoryRuntimeStore();
  const plain = runtime(store);
  assert.deepEqual(
    [plain.replicaId, plain.nbTasks, plain.partitionBy, plain.leaseSeconds, plain.partitionId()],
    [0, 1, null, DEFAULT_PARTITION_LEASE_SECONDS, "p0"],
  );
  assert.deepEqual([...runtime(store, { parentReplicas: { a: 2, b: 1 } }).parentReplicas], [["a", 2], [
    "b",
    1,
  ]]);
  assert.equal(runtime(store, { replicaId: 3 }).partitionId(), "p3");
  for (
    const bad of [
      { flowId: "" },
      { runId: "" },
      { node: "" },
      { replicaId: -1 },
      { replicaId: 0.5 },
      { nbTasks: 0 },
      { leaseSeconds: 0 },
      { leaseSeconds: Infinity },
      { parentReplicas: { a: 0 } },
    ]
  ) {
    assert.throws(() => runtime(store, bad), ConfigError, JSON.stringify(bad));
  }
  assert.notEqual(runtime(store).holder, runtime(store).holder, "every runtime is its own lease holder");
});

Deno.test("ledger keys escape their parts: distinct part lists never share a key or a scan prefix", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const store = new MemoryRuntimeStore();
  const alphabet = ["a", "b", "/", "%", "2F", "%2F", "é"];
  const part = () => Array.from({ length: random.int(1, 4) }, () => random.pick(alphabet)).join("");
  const seen = new Map<string, string>();
  for (let i = 0; i < 500; i++) {
    const node = part();
    const parts = Array.from({ length: random.int(1, 3) }, part);
    const key = runtime(store, { node }).key(...parts);
    const identity = JSON.stringify([node, parts]);
    const earlier = seen.get(key);
    assert.ok(
      earlier === undefined || earlier === identity,
      `seed ${seed}: ${identity} and ${earlier} share ${key}`,
    );
    seen.set(key, identity);
    const [parent, child] = [part(), part()];
    const other = random.pick([`${parent}/${child}`, `${parent}%2F`, `${parent}/`]);
    const ledger = runtime(store, { node });
    assert.ok(
      !ledger.key("terminator", other, "0", "eos").startsWith(ledger.key("terminator", parent) + "/"),
      `seed ${seed}: parent ${JSON.stringify(other)} falls under parent ${JSON.stringify(parent)}'s prefix`,
    );
  }
  assert.equal(runtime(store).key("a/b", "c%d"), "vf/f/r/n/a%2Fb/c%25d");
  assert.throws(() => runtime(store).key(""), ConfigError);
});

Deno.test("completionState over random facts is complete exactly when every EOS-7 condition holds", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let round = 0; round < 300; round++) {
    const expected = random.int(1, 3);
    const ledger = runtime(new MemoryRuntimeStore(), { parentReplicas: { cam: expected } });
    const terminated = new Set<number>();
    let announced = 0;
    let aborted = false;
    for (let replica = 0; replica < expected; replica++) {
      if (random.chance(0.2)) continue;
      const kind = random.chance(0.15) ? "abort" : "eos";
      const seq = random.int(0, 4);
      await ledger.recordTerminator("cam", replica, kind, seq, kind === "abort" ? { code: "VF_X" } : null);
      terminated.add(replica);
      announced += seq;
      aborted ||= kind === "abort";
    }
    const ids = new Set<string>();
    for (let i = random.int(0, announced + 2); i > 0; i--) {
      const id = `m${random.int(0, announced + 2)}`;
      assert.equal(
        await ledger.recordReceived("cam", "d", id),
        !ids.has(id),
        `seed ${seed}: ${id} noted twice`,
      );
      ids.add(id);
    }
    const halves = random.chance(0.2);
    const observation: Observation<PendingCounts> = random.chance(0.2)
      ? unknown("timeout")
      : known<PendingCounts>([random.chance(0.7) ? 0 : 1, random.chance(0.7) ? 0 : 2]);
    const drained = observation.kind === "known" && observation.value[0] === 0 && observation.value[1] === 0;
    const state = await ledger.completionState("cam", "d", observation, halves);
    const facts = JSON.stringify({
      seed,
      round,
      expected,
      terminated: [...terminated],
      announced,
      ids: ids.size,
      halves,
      observation,
      aborted,
    });
    const allIn = terminated.size === expected;
    const expectedState = aborted
      ? (observation.kind === "unknown" ? "unknown" : drained ? "aborted" : "draining")
      : !allIn
      ? "open"
      : ids.size < announced || halves
      ? "draining"
      : observation.kind === "unknown"
      ? "unknown"
      : drained
      ? "complete"
      : "draining";
    assert.equal(state, expectedState, facts);
    if (state === CompletionState.complete) {
      assert.ok(
        allIn && !aborted && ids.size >= announced && !halves && drained,
        `never complete early: ${facts}`,
      );
    }
  }
});

Deno.test("completionState counts once an id two replicas of the parent both published (an input redelivered after a kill)", async () => {
  const store = new MemoryRuntimeStore();
  const cam0 = runtime(store, { node: "cam", nbTasks: 2 });
  const cam1 = runtime(store, { node: "cam", nbTasks: 2, replicaId: 1 });
  // cam0 published m2 and died before acking its input, which cam1 then took and published again.
  await cam0.recordPublished(["m1", "m2"]);
  await cam1.recordPublished(["m2", "m3"]);
  await cam1.intendPublication("m4", "sha256:4", { payloadRefs: ["b/4"] });
  await cam1.resolvePublication("m4", accepted("m4", 4, false, "memory"));
  assert.equal(await cam0.publishedCount(), 2);
  assert.equal(await cam1.publishedCount(), 3);
  const sink = runtime(store, { node: "sink", parentReplicas: { cam: 2 } });
  await sink.recordTerminator("cam", 0, "eos", await cam0.publishedCount());
  await sink.recordTerminator("cam", 1, "eos", await cam1.publishedCount());
  const idle = known<PendingCounts>([0, 0]);
  await sink.recordReceivedMany("cam", "d", ["m1", "m2", "m3"]);
  assert.equal(await sink.completionState("cam", "d", idle), "draining", "m4 has not arrived");
  await sink.recordReceived("cam", "d", "m4");
  assert.equal(await sink.completionState("cam", "d", idle), "complete", "4 distinct ids, all received");
  assert.equal((await sink.commitCompletion("cam")).finalSequence, 4);
});

Deno.test("a process's received ids are one record: proven ids become its count, the others stay named, and a redelivery a replacement notes counts once", async () => {
  const store = new MemoryRuntimeStore();
  const first = runtime(store, { node: "sink", parentReplicas: { cam: 1 } });
  const ids = Array.from({ length: 300 }, (_, i) => `m${i}`);
  for (let at = 0; at < ids.length; at += 30) {
    await first.recordReceivedMany("cam", "d", ids.slice(at, at + 30));
    for (const id of ids.slice(at, at + 30)) if (id !== "m299") first.proveReceived("cam", "d", id);
  }
  // An id never noted, or proven twice, changes nothing.
  first.proveReceived("cam", "d", "m-never");
  first.proveReceived("cam", "d", "m0");
  await first.recordReceivedMany("cam", "d", ["m300"]);
  const records = await store.scan(first.key("received") + "/");
  assert.equal(records.length, 1, "one record for the process, rewritten");
  const saved = JSON.parse(new TextDecoder().decode(records[0].value));
  assert.equal(saved.count, 299);
  assert.deepEqual(saved.message_ids.sort(), ["m299", "m300"]);
  // The process died before its settle of m299; a replacement is delivered it again and notes it.
  const replacement = runtime(store, { node: "sink", parentReplicas: { cam: 1 } });
  await replacement.recordReceivedMany("cam", "d", ["m299", "m301"]);
  assert.equal((await store.scan(first.key("received") + "/")).length, 2);
  assert.equal(await replacement.receivedCount("cam", "d"), 302);
  await replacement.recordTerminator("cam", 0, "eos", 302);
  assert.equal(await replacement.completionState("cam", "d", known<PendingCounts>([0, 0])), "complete");
});

Deno.test("published ids proven unique are counted once; the named ones two replicas share count once toward the parent's total", async () => {
  const store = new MemoryRuntimeStore();
  const cam0 = runtime(store, { node: "cam", nbTasks: 2 });
  const cam1 = runtime(store, { node: "cam", nbTasks: 2, replicaId: 1 });
  await cam0.recordPublished(["a", "b", "c"]);
  cam0.provePublished(["a", "b"]);
  await cam0.recordPublished(["d"]);
  // cam0 died before its input of c was acked: cam1 made c again.
  await cam1.recordPublished(["c", "e"]);
  cam1.provePublished(["e"]);
  assert.equal(await cam0.publishedCount(), 4);
  assert.equal(await cam1.publishedCount(), 2);
  const sink = runtime(store, { node: "sink", parentReplicas: { cam: 2 } });
  await sink.recordTerminator("cam", 0, "eos", await cam0.publishedCount());
  await sink.recordTerminator("cam", 1, "eos", await cam1.publishedCount());
  await sink.recordReceivedMany("cam", "d", ["a", "b", "c", "d"]);
  const idle = known<PendingCounts>([0, 0]);
  assert.equal(await sink.completionState("cam", "d", idle), "draining", "e has not arrived");
  await sink.recordReceivedMany("cam", "d", ["e"]);
  assert.equal(await sink.completionState("cam", "d", idle), "complete");
  assert.equal((await sink.commitCompletion("cam")).finalSequence, 5);
});

Deno.test("completionState refuses a parent that has no completion barrier", async () => {
  const ledger = runtime(new MemoryRuntimeStore(), { parentReplicas: { cam: 1 } });
  await assert.rejects(ledger.completionState("mic", "d", known<PendingCounts>([0, 0])), ConfigError);
});

Deno.test("a read that fails is UnobservableState, never an empty ledger", async () => {
  const store = new ScriptedStore();
  const ledger = runtime(store, { parentReplicas: { cam: 1 } });
  await ledger.recordTerminator("cam", 0, "eos", 0);
  store.failReads = true;
  const reads: Array<[string, () => Promise<unknown>]> = [
    ["terminators", () => ledger.terminators("cam")],
    ["abortedParents", () => ledger.abortedParents()],
    ["receivedCount", () => ledger.receivedCount("cam", "d")],
    ["completionState", () => ledger.completionState("cam", "d", known<PendingCounts>([0, 0]))],
    ["currentEpoch", () => ledger.currentEpoch()],
    ["completedParents", () => ledger.completedParents()],
    ["attemptsFor", () => ledger.attemptsFor("m")],
    ["openGroups", () => ledger.openGroups()],
    ["groupMembers", () => ledger.groupMembers("g")],
    ["pendingHandoffs", () => ledger.pendingHandoffs()],
    ["unresolvedPublications", () => ledger.unresolvedPublications()],
    ["publishedCount", () => ledger.publishedCount()],
    ["outboxEntry", () => ledger.outboxEntry("p")],
    ["terminalEntries", () => ledger.terminalEntries()],
    ["restoreCheckpoint", () => ledger.restoreCheckpoint()],
    ["effectSeen", () => ledger.effectSeen("e")],
    ["acquirePartition", () => ledger.acquirePartition()],
  ];
  for (const [name, read] of reads) await assert.rejects(read(), UnobservableState, name);
});

Deno.test("a record that does not parse is UnobservableState (malformed), never read as absent", async () => {
  const store = new MemoryRuntimeStore();
  const ledger = runtime(store);
  const damage = (key: string, bytes: string) => store.cas(key, null, encoder.encode(bytes));
  await damage(ledger.key("attempts", "m1"), "not json");
  await damage(ledger.key("partition", "p0"), JSON.stringify({ partition_id: "p0", epoch: "one" }));
  await damage(ledger.key("terminator", "cam", "0", "eos"), "[1, 2]");
  await damage(ledger.key("outbox", "p"), JSON.stringify({ publication_id: "p", outcome: "sent" }));
  await store.append(ledger.key("terminal"), encoder.encode("\u00ff"));
  const reads: Array<Promise<unknown>> = [
    ledger.attemptsFor("m1"),
    ledger.recordAttempt("m1", "transient"),
    ledger.currentEpoch(),
    ledger.acquirePartition(),
    ledger.terminators("cam"),
    ledger.outboxEntry("p"),
    ledger.terminalEntries(),
  ];
  for (const read of reads) {
    await assert.rejects(read, (error: unknown) => {
      assert.ok(error instanceof UnobservableState);
      assert.equal(error.context.reason, "malformed");
      return true;
    });
  }
});

Deno.test("a ledger write that keeps losing its compare-and-swap tells the caller, typed", async () => {
  const store = new ScriptedStore();
  const ledger = runtime(store);
  store.loseSwaps = true;
  await assert.rejects(ledger.recordAttempt("m", "transient"), TransientFailure);
  await assert.rejects(ledger.acquirePartition(), StaleAuthority);
  await assert.rejects(ledger.acquirePartition(), new RegExp(`${CAS_RETRIES} compare-and-swaps`));
});

Deno.test("fencing tokens sort in the order of their epochs, across retakes and releases", async () => {
  const ledger = runtime(new MemoryRuntimeStore());
  const tokens = [];
  for (let i = 0; i < 12; i++) {
    const token = await ledger.acquirePartition();
    tokens.push(token);
    if (i % 3 === 0) await ledger.releasePartition(token);
  }
  assert.deepEqual(tokens.map((t) => t.epoch), Array.from({ length: 12 }, (_, i) => i + 1));
  const sorted = [...tokens].sort((a, b) => a.fencingToken < b.fencingToken ? -1 : 1);
  assert.deepEqual(sorted, tokens, "string order of the tokens is epoch order (9 before 10)");
  assert.equal(new Set(tokens.map((t) => t.fencingToken)).size, 12);
  for (const old of tokens.slice(0, -1)) await assert.rejects(ledger.checkAuthority(old), StaleAuthority);
  await ledger.checkAuthority(tokens[11]);
});

Deno.test("acquirePartition: expectedEpoch guards a retake; a released token holds no authority", async () => {
  const store = new MemoryRuntimeStore();
  const ledger = runtime(store);
  assert.equal(await ledger.currentEpoch(), 0);
  const first = await ledger.acquirePartition(undefined, { expectedEpoch: 0 });
  await assert.rejects(ledger.acquirePartition(undefined, { expectedEpoch: 0 }), StaleAuthority);
  const second = await ledger.acquirePartition(undefined, { expectedEpoch: 1 });
  assert.equal(second.epoch, 2);
  assert.deepEqual(ledger.heldPartition(), second);
  await ledger.releasePartition(first);
  await ledger.checkAuthority(second);
  assert.deepEqual(ledger.heldPartition(), second, "releasing a superseded token keeps the held one");
  await ledger.releasePartition(second);
  assert.equal(ledger.heldPartition(), null);
  await assert.rejects(ledger.checkAuthority(second), StaleAuthority);
  await assert.rejects(ledger.renewPartition(second), /released/);
  assert.equal(await ledger.currentEpoch(), 2, "a release keeps the epoch");
  await assert.rejects(
    runtime(store).checkAuthority({ ...second, partitionId: "p9" }),
    /no ownership record/,
  );
});

Deno.test("a waiter gives up after one lease of its own when a longer lease is never renewed", async () => {
  const clock = new FakeClock();
  const store = new MemoryRuntimeStore(clock);
  await runtime(store, { clock, leaseSeconds: 100 }).acquirePartition();
  const waiter = runtime(store, { clock, leaseSeconds: 10 });
  const started = clock.now();
  const outcome = waiter.acquirePartition().then(
    () => ({ error: null, at: clock.now() }),
    (error) => ({ error, at: clock.now() }),
  );
  await clock.advanceAsync(100);
  const { error, at } = await outcome;
  assert.ok(error instanceof OwnershipConflict, `expected a refusal, got ${error}`);
  assert.equal(at - started, 10);
});

Deno.test("renewPartition moves the lease one lease ahead of the clock", async () => {
  const clock = new FakeClock();
  const ledger = runtime(new MemoryRuntimeStore(clock), { clock, leaseSeconds: 6 });
  const token = await ledger.acquirePartition();
  clock.advance(4);
  assert.equal(await ledger.renewPartition(token), clock.now() + 6);
});

Deno.test("the outbox counts accepted DATA ids of this replica once, and resolves only recorded intents", async () => {
  const store = new MemoryRuntimeStore();
  const replica0 = runtime(store, { nbTasks: 2 });
  const replica1 = runtime(store, { nbTasks: 2, replicaId: 1 });
  await replica0.intendPublication("d1", "sha256:1", { payloadRefs: ["b/1"], readers: ["sink", "sink/p1"] });
  await replica0.intendPublication("d2", "sha256:2");
  await replica0.intendPublication("eos-r0", "sha256:e", { kind: "eos" });
  await replica1.intendPublication("d3", "sha256:3");
  await replica0.resolvePublication("d1", accepted("d1", 7, false, "memory"));
  await replica0.resolvePublication("d1", accepted("d1", 7, true, "memory"));
  await replica0.resolvePublication("d2", rejected("d2", "stream full", true));
  await replica0.resolvePublication("eos-r0", accepted("eos-r0", 9, false, "memory"));
  await replica1.resolvePublication("d3", accepted("d3", 8, false, "memory"));
  assert.equal(await replica0.publishedCount(), 1);
  assert.equal(await replica1.publishedCount(), 1);
  assert.deepEqual(await replica0.unresolvedPublications(), []);
  const [d1] = await replica1.outboxOf("n");
  assert.deepEqual(
    { refs: d1.payload_refs, readers: d1.readers, outcome: d1.outcome, sequence: d1.sequence },
    { refs: ["b/1"], readers: ["sink", "sink/p1"], outcome: "accepted", sequence: 7 },
  );
  assert.equal((await replica0.outboxOf("n")).length, 4);
  assert.deepEqual(await replica0.outboxOf("elsewhere"), []);
  await assert.rejects(
    replica0.resolvePublication("never", accepted("never", 1, false, "memory")),
    ConfigError,
  );
  await assert.rejects(replica0.resolvePublication("d2", publicationUnknown("d1", "lost")), ConfigError);
  await assert.rejects(replica0.intendPublication("x", "d", { kind: "video" as never }), ConfigError);
});

Deno.test("persistGroup merges arrivals, replaces a redelivered member's token, and keeps big seqs exact", async () => {
  const store = new MemoryRuntimeStore();
  const ledger = runtime(store, { nbTasks: 2, partitionBy: "trace_id" });
  const big = 2n ** 63n + 5n;
  const left = { producer: "left", traceId: "t", seq: big };
  const right = { producer: "right", traceId: "t", seq: 3 };
  await ledger.persistGroup("g", { left }, { left: "d-1" });
  const record = await ledger.persistGroup("g", new Map([["right", right]]), new Map([["right", "d-2"]]));
  assert.deepEqual(Object.fromEntries(record.members), { left, right });
  const redelivered = await ledger.persistGroup("g", { left }, { left: "d-3" });
  assert.deepEqual(Object.fromEntries(redelivered.tokens), { left: "d-3", right: "d-2" });
  assert.notEqual(redelivered.version, record.version);
  assert.equal((await ledger.groupMembers("g"))?.get("left")?.seq, big);
  assert.deepEqual(await runtime(store, { replicaId: 1 }).openGroups(), [], "groups are the replica's own");
  await assert.rejects(ledger.persistGroup("g", { right }, {}), ConfigError);
  await ledger.settleGroup("g");
  await ledger.settleGroup("g");
  assert.deepEqual(await ledger.openGroups(), []);
});

Deno.test("recordTerminator, recordAttempt and markEffect refuse arguments the ledger cannot record", async () => {
  const ledger = runtime(new MemoryRuntimeStore());
  await assert.rejects(ledger.recordTerminator("cam", 0, "stop" as never, 1), ConfigError);
  await assert.rejects(ledger.recordTerminator("cam", 0, "eos", -1), ConfigError);
  await assert.rejects(ledger.recordTerminator("cam", -1, "eos", 1), ConfigError);
  await assert.rejects(ledger.recordAttempt("m", "fatal" as never), ConfigError);
  await assert.rejects(ledger.markEffect("e", 0), ConfigError);
  assert.deepEqual(await ledger.terminators("cam"), []);
});

Deno.test("a checkpoint needs durability that was observed: Unknown is UnobservableState, false refused", async () => {
  const store = new ScriptedStore();
  const ledger = runtime(store);
  store.durable = unknown("auth", undefined, "CONFIG GET denied");
  await assert.rejects(ledger.checkpoint(new Uint8Array([1]), {}), UnobservableState);
  store.durable = known(false);
  await assert.rejects(ledger.checkpoint(new Uint8Array([1]), {}), CapabilityError);
  store.durable = known(true);
  await ledger.checkpoint(new Uint8Array([1]), { offset: 3 });
  assert.deepEqual([...(await ledger.restoreCheckpoint()).state ?? []], [1]);
});

Deno.test("forgetting a broker's counts empties what EOS-7 reads and keeps every other record", async () => {
  const store = new ScriptedStore();
  store.durable = known(true);
  const cam = runtime(store, { node: "cam" });
  const sink = runtime(store, { node: "sink", parentReplicas: { cam: 1 } });
  await cam.recordPublished(["a", "b"]);
  await cam.intendPublication("big", "sha256:1", { payloadRefs: ["b/1"] });
  await cam.resolvePublication("big", accepted("big", 3, false, "memory"));
  await cam.intendPublication("pending", "sha256:2");
  await sink.recordReceivedMany("cam", "sink--from--cam", ["a", "b"]);
  await sink.recordTerminator("cam", 0, "eos", 3);
  await cam.checkpoint(null, { offset: 3 });
  await sink.markEffect("e", 60);
  assert.equal(await cam.publishedCount(), 3);
  assert.equal(await forgetBrokerCounts(store, "f", "r", ["cam", "sink"]), 4);
  assert.equal(await cam.publishedCount(), 0, "the outbox's accepted data counted toward it too");
  assert.equal(await sink.receivedCount("cam", "sink--from--cam"), 0);
  assert.deepEqual(await sink.terminators("cam"), []);
  assert.deepEqual((await cam.unresolvedPublications()).map((e) => e.publicationId), ["pending"]);
  assert.equal((await cam.restoreCheckpoint()).replayPosition.offset, 3, "checkpoints stay");
  assert.equal(await sink.effectSeen("e"), true, "effect markers stay");
});

Deno.test("forgetting replay positions deletes the checkpoints that hold a source offset, and only those", async () => {
  const store = new ScriptedStore();
  store.durable = known(true);
  const replayable = runtime(store, { node: "clip" });
  const live = runtime(store, { node: "camera" });
  await replayable.checkpoint(new Uint8Array([7]), { offset: 42 });
  await live.checkpoint(new Uint8Array([9]), { group: "g-1" });
  assert.equal(await forgetReplayPositions(store, "f", "r", ["clip", "camera"]), 1);
  assert.deepEqual((await replayable.restoreCheckpoint()).replayPosition, {}, "the source starts again");
  assert.equal((await replayable.restoreCheckpoint()).state, null, "with the state committed beside it");
  assert.deepEqual([...(await live.restoreCheckpoint()).state ?? []], [9]);
});

Deno.test("storeSharedAndDurable holds only for a shared store observed durable", async () => {
  assert.equal(await storeSharedAndDurable(new MemoryRuntimeStore()), false);
  const store = new ScriptedStore();
  store.durable = unknown("auth");
  assert.equal(await storeSharedAndDurable(store), false);
  store.durable = known(true);
  assert.equal(await storeSharedAndDurable(store), true);
  assert.equal(await runtime(store).durableShared(), true);
});

Deno.test("sourceEpoch is one epoch per runtime, even when asked concurrently", async () => {
  const store = new MemoryRuntimeStore();
  const ledger = runtime(store);
  const epochs = await Promise.all([ledger.sourceEpoch(), ledger.sourceEpoch(), ledger.sourceEpoch()]);
  assert.deepEqual(epochs, ["1", "1", "1"]);
  assert.equal(await runtime(store).sourceEpoch(), "2");
});

Deno.test("terminal references name one entry of this node's log; anything else resolves to nothing", async () => {
  const ledger = runtime(new MemoryRuntimeStore());
  const first = await ledger.recordTerminal({ message_id: "a" });
  const second = await ledger.recordTerminal({ message_id: "b" });
  assert.deepEqual([first, second], ["vf/f/r/n/terminal#1", "vf/f/r/n/terminal#2"]);
  assert.deepEqual(await ledger.terminalRecord(second), { message_id: "b" });
  for (
    const other of ["vf/f/r/n/terminal#01", "vf/f/r/n/terminal#3", "vf/f/r/n/terminal#", "vf/f/r/n#1", "#1"]
  ) {
    assert.equal(await ledger.terminalRecord(other), null, other);
  }
});

Deno.test("claimReplicaSlot counts slots beyond nb_tasks when a scaler allows them", async () => {
  const store = new MemoryRuntimeStore();
  const options = { store, flowId: "f", runId: "r", node: "n", nbTasks: 1, slots: 3 };
  const ids = [];
  for (let i = 0; i < 3; i++) ids.push((await claimReplicaSlot(options)).replicaId);
  assert.deepEqual(ids, [0, 1, 2]);
  await assert.rejects(claimReplicaSlot({ ...options, slots: 0 }), ConfigError);
  const single = await claimReplicaSlot({ ...options, node: "m", slots: undefined });
  assert.equal(single.nbTasks, 1);
  assert.equal(single.heldPartition()?.epoch, 1);
});

Deno.test("keepLease renews every third of a lease until stopped, so no one else can bind", async () => {
  const clock = new FakeClock();
  const store = new MemoryRuntimeStore(clock);
  const holder = runtime(store, { clock, leaseSeconds: 6 });
  const token = await holder.acquirePartition();
  const lost: Error[] = [];
  const keeper = holder.keepLease(token, (error) => lost.push(error));
  await clock.advanceAsync(13);
  assert.equal(keeper.renewals, 6);
  await assert.rejects(
    runtime(store, { clock }).acquirePartition(undefined, { wait: false }),
    OwnershipConflict,
  );
  await keeper.stop();
  await clock.advanceAsync(13);
  assert.equal(keeper.renewals, 6, "no renewal after stop");
  assert.equal((await runtime(store, { clock }).acquirePartition(undefined, { wait: false })).epoch, 2);
  assert.deepEqual(lost, []);
});

Deno.test("keepLease reports a lost authority once and stops; an unconfirmed renewal is retried", async () => {
  const clock = new FakeClock();
  const store = new ScriptedStore();
  const holder = runtime(store, { clock, leaseSeconds: 3 });
  const token = await holder.acquirePartition();
  const lost: Error[] = [];
  const keeper = holder.keepLease(token, (error) => lost.push(error));
  store.failReads = true;
  await clock.advanceAsync(1);
  store.failReads = false;
  await clock.advanceAsync(1);
  assert.deepEqual([keeper.renewals, lost.length], [1, 0], "the unreadable tick was retried at the next");
  await holder.acquirePartition();
  await clock.advanceAsync(3);
  assert.equal(lost.length, 1);
  assert.ok(lost[0] instanceof StaleAuthority);
  assert.equal(keeper.renewals, 1);
  await keeper.stop();
});
