/**
 * The PayloadStore contract's records and the memory store's own physics: keys and generations, tiers,
 * TTLs, the byte budget and LRU eviction, digests, the fault hooks, barriers, and the observation log.
 * The fault stories themselves live in tests/conformance/payload/.
 */
import assert from "node:assert/strict";
import {
  ConfigError,
  IncompatibleProfile,
  ResourceUnavailable,
  TRANSIENT,
  TransientFailure,
  UnobservableState,
} from "../../../src/core/errors.ts";
import {
  Barrier,
  dropResponse,
  type FaultAction,
  FaultSchedule,
  raiseTyped,
} from "../../../src/backends/faults.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  DEFAULT_ORPHAN_GRACE_SECONDS,
  MemoryPayloadStore,
  type MemoryPayloadStoreOptions,
  StaticLedger,
} from "../../../src/backends/memory/payload.ts";
import { ObservationLog } from "../../../src/backends/observation.ts";
import {
  admitRetention,
  type ImmutablePayloadRef,
  intentObligationId,
  isForeignObligation,
  isIntentObligation,
  type ObligationLedger,
  PayloadBudgetExceeded,
  payloadDigest,
  type PayloadReadOutcome,
  reclamationObservation,
  type ReleaseReceipt,
  releaseReceipt,
  type RetentionContract,
  retentionContract,
} from "../../../src/backends/payload.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const encoder = new TextEncoder();

function contract(
  obligations: readonly string[] = [],
  ttlSeconds = 60,
  horizonSeconds = 0,
): RetentionContract {
  return retentionContract({ ttlSeconds, horizonSeconds, durableRequired: false, obligations });
}

function fixture(options: MemoryPayloadStoreOptions = {}): { clock: FakeClock; store: MemoryPayloadStore } {
  const clock = new FakeClock();
  return { clock, store: new MemoryPayloadStore({ clock, ...options }) };
}

function bytesOf(outcome: PayloadReadOutcome): Uint8Array {
  assert.equal(outcome.kind, "bytes", `expected bytes, got ${outcome.kind}`);
  return (outcome as { data: Uint8Array }).data;
}

function faults(actions: Record<string, FaultAction>): FaultSchedule {
  return new FaultSchedule(actions).install();
}

Deno.test("payloadDigest is the hex SHA-256 of the bytes", () => {
  assert.equal(
    payloadDigest(encoder.encode("abc")),
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
  );
});

Deno.test("obligation families: intent ids are built and recognised; archive and dlq pins are foreign", () => {
  assert.equal(intentObligationId("cam:1:7"), "intent/cam:1:7");
  assert.throws(() => intentObligationId(""), ConfigError);
  assert.equal(isIntentObligation("intent/x"), true);
  assert.equal(isIntentObligation("detector"), false);
  assert.deepEqual(
    ["archive/a", "dlq/x", "detector", "crop/p1", "intent/p"].map(isForeignObligation),
    [true, true, false, false, false],
  );
});

Deno.test("retentionContract refuses a TTL under one second, a negative horizon and bad obligation ids", () => {
  const base = { ttlSeconds: 60, horizonSeconds: 60, durableRequired: true };
  assert.deepEqual(retentionContract(base).obligations, []);
  for (
    const bad of [
      { ...base, ttlSeconds: 0 },
      { ...base, ttlSeconds: 1.5 },
      { ...base, horizonSeconds: -1 },
      { ...base, obligations: [""] },
      { ...base, obligations: ["detector", "detector"] },
    ]
  ) {
    assert.throws(() => retentionContract(bad), ConfigError, JSON.stringify(bad));
  }
});

Deno.test("admitRetention refuses only a durable contract whose TTL cannot cover an unpinned horizon", () => {
  const admit = (
    ttlSeconds: number,
    horizonSeconds: number,
    durableRequired: boolean,
    obligations: string[],
  ) => admitRetention(retentionContract({ ttlSeconds, horizonSeconds, durableRequired, obligations }));
  admit(3600, 3600, true, []);
  admit(60, 3600, false, []);
  admit(60, 3600, true, ["detector"]);
  assert.throws(() => admit(60, 3600, true, []), (error: unknown) => {
    assert.ok(error instanceof IncompatibleProfile);
    assert.equal(error.diagnostics.length, 1);
    assert.equal(error.diagnostics[0].code, "VF_INCOMPATIBLE_PROFILE");
    assert.deepEqual(error.context, { ttl_seconds: 60, horizon_seconds: 3600 });
    assert.match(error.remedy ?? "", /VF_BLOB_TTL_SECONDS/);
    return true;
  });
});

Deno.test("a release receipt cannot both reclaim and be stale or unknown; reclamation lists are sorted", () => {
  const ref = { store: "memory", key: "k", size: 0, digest: "", generation: "", contentId: "" };
  assert.throws(() => releaseReceipt(ref, "r", 0, true, true), RangeError);
  assert.throws(() => releaseReceipt(ref, "r", 0, true, false, true), RangeError);
  assert.deepEqual(reclamationObservation(["b", "a"], ["d", "c"], []), {
    reclaimed: ["a", "b"],
    retained: ["c", "d"],
    unknown: [],
  });
});

Deno.test("the constructor refuses an unknown tier, a bad budget or grace, and an empty store id", () => {
  for (
    const options of [
      { tier: "cache" as "durable" },
      { maxBytes: -1 },
      { maxBytes: 1.5 },
      { orphanGraceSeconds: -1 },
      { orphanGraceSeconds: Infinity },
      { storeId: "" },
    ]
  ) {
    assert.throws(() => new MemoryPayloadStore(options), ConfigError, JSON.stringify(options));
  }
});

Deno.test("put refuses a malformed contract, non-byte data and a non-string content id before storing", async () => {
  const { store } = fixture();
  const malformed = { ttlSeconds: NaN, horizonSeconds: 0, durableRequired: false, obligations: [] };
  await assert.rejects(store.put(new Uint8Array(1), "cam:a", malformed), ConfigError);
  await assert.rejects(store.put("bytes" as unknown as Uint8Array, "cam:a", contract()), ConfigError);
  await assert.rejects(store.put(new Uint8Array(1), 7 as unknown as string, contract()), ConfigError);
  assert.equal(store.objectCount(), 0);
});

Deno.test("put returns a complete ref and keeps its own copy of the bytes", async () => {
  const { store } = fixture({ storeId: "embedded" });
  const data = encoder.encode("frame bytes");
  const ref = await store.put(data, "cam:e1", contract(["detector"]));
  assert.deepEqual(
    [ref.store, ref.size, ref.digest, ref.contentId],
    ["embedded", data.length, payloadDigest(data), "cam:e1"],
  );
  assert.match(ref.key, /^vf-blob-[0-9a-f]{32}$/);
  assert.notEqual(ref.generation, "");
  data[0] = 0;
  const read = bytesOf(await store.read(ref));
  assert.equal(new TextDecoder().decode(read), "frame bytes", "mutating the caller's buffer changed nothing");
  read[0] = 0;
  assert.equal(new TextDecoder().decode(bytesOf(await store.read(ref))), "frame bytes");
  assert.deepEqual(await store.refForKey(ref.key), ref, "refForKey completes the same ref from metadata");
});

Deno.test("an unchanged frame is forwarded as one object; other bytes or content get their own key", async () => {
  const { store } = fixture();
  const data = encoder.encode("same frame");
  const first = await store.put(data, "cam:e1", contract(["detector"]));
  const again = await store.put(data, "cam:e1", contract(["tracker"]));
  assert.deepEqual(again, first, "the same content and bytes share the object and its generation");
  assert.deepEqual([...store.obligations(first.key).keys()].sort(), ["detector", "tracker"]);
  assert.equal(store.storedBytes(), data.length, "one copy is held");
  const changed = await store.put(encoder.encode("other frame"), "cam:e1", contract());
  const elsewhere = await store.put(data, "cam:e2", contract());
  assert.equal(new Set([first.key, changed.key, elsewhere.key]).size, 3);
  const anonymous = [await store.put(data, "", contract()), await store.put(data, "", contract())];
  assert.notEqual(anonymous[0].key, anonymous[1].key, "without a content id every put is its own object");
  assert.equal((await store.capabilities()).referenceForwarding, true);
});

Deno.test("without forwarding a put of the same content mints a generation that keeps the obligations", async () => {
  const { store } = fixture({ forwardUnchanged: false });
  const data = encoder.encode("frame");
  const first = await store.put(data, "cam:e1", contract(["detector"]));
  const second = await store.put(data, "cam:e1", contract(["tracker"]));
  assert.equal(second.key, first.key);
  assert.notEqual(second.generation, first.generation);
  assert.deepEqual([...store.obligations(first.key).keys()].sort(), ["detector", "tracker"]);
  assert.equal(store.storedBytes(), data.length, "the old generation's bytes were replaced, not added");
  assert.equal((await store.capabilities()).referenceForwarding, false);
});

Deno.test("durable tier: a TTL-only object expires at its TTL; one under obligation never does", async () => {
  const { clock, store } = fixture();
  const free = await store.put(encoder.encode("a"), "cam:a", contract([], 10));
  const held = await store.put(encoder.encode("b"), "cam:b", contract(["detector"], 10, 10));
  clock.advance(9.999);
  assert.equal(store.objectCount(), 2);
  clock.advance(0.001);
  assert.equal((await store.read(free)).kind, "missing", "the TTL fired at exactly 10 s");
  clock.advance(86400);
  assert.equal((await store.read(held)).kind, "bytes", "an obligation pins it past every TTL");
  store.expireObligationSet(held.key);
  assert.equal((await store.read(held)).kind, "missing", "once its set is gone the expired TTL applies");
});

Deno.test("evictable tier: the TTL fires regardless of obligations; acquiring extends it to the deadline", async () => {
  const { clock, store } = fixture({ tier: "evictable" });
  const held = await store.put(encoder.encode("a"), "cam:a", contract(["detector"], 10, 20));
  const extended = await store.put(encoder.encode("b"), "cam:b", contract(["detector"], 10, 20));
  await store.acquireObligation(extended, "tracker", clock.now() + 100);
  clock.advance(20);
  assert.equal(
    (await store.read(held)).kind,
    "missing",
    "the obligation did not stop the TTL at the horizon",
  );
  clock.advance(79);
  assert.equal((await store.read(extended)).kind, "bytes");
  clock.advance(1);
  assert.equal((await store.read(extended)).kind, "missing");
});

Deno.test("acquire is idempotent and keeps the later deadline; renew needs a held obligation", async () => {
  const { clock, store } = fixture();
  const ref = await store.put(encoder.encode("a"), "cam:a", contract(["detector"], 10, 10));
  const now = clock.now();
  assert.equal((await store.acquireObligation(ref, "tracker", now + 50)).deadline, now + 50);
  assert.equal((await store.acquireObligation(ref, "tracker", now + 30)).deadline, now + 50);
  assert.equal((await store.renewObligation(ref, "tracker", now + 90)).deadline, now + 90);
  assert.equal(store.obligations(ref.key).get("tracker"), now + 90);
  assert.equal(store.obligations(ref.key).get("detector"), now + 10);
  await assert.rejects(store.renewObligation(ref, "cropper", now + 90), ResourceUnavailable);
  await assert.rejects(store.acquireObligation(ref, "tracker", NaN), ConfigError);
  await assert.rejects(store.acquireObligation(ref, "", now), ConfigError);
});

Deno.test("acquire refuses an object that is gone or was superseded by a newer generation", async () => {
  const { clock, store } = fixture({ forwardUnchanged: false });
  const first = await store.put(encoder.encode("a"), "cam:a", contract());
  await store.put(encoder.encode("a"), "cam:a", contract());
  await assert.rejects(store.acquireObligation(first, "detector", clock.now() + 1), ResourceUnavailable);
  const gone = await store.refForKey("vf-blob-nothing");
  assert.deepEqual([gone.size, gone.digest, gone.generation], [0, "", ""]);
  await assert.rejects(store.acquireObligation(gone, "detector", clock.now() + 1), ResourceUnavailable);
});

Deno.test("a ref from another store is refused by every operation", async () => {
  const { store } = fixture();
  const foreign = { store: "redis", key: "vf-blob-x", size: 1, digest: "", generation: "1", contentId: "" };
  await assert.rejects(store.read(foreign), ConfigError);
  await assert.rejects(store.acquireObligation(foreign, "detector", 0), ConfigError);
  await assert.rejects(store.releaseObligation(foreign, "detector", "s"), ConfigError);
});

Deno.test("a put refused at payload.write.before stores nothing", async () => {
  const { store } = fixture();
  using schedule = faults({ [Barrier.payloadWriteBefore]: raiseTyped("VF_TRANSIENT", "store down") });
  await assert.rejects(store.put(encoder.encode("a"), "cam:a", contract(["detector"])), TransientFailure);
  schedule.assertAllFired();
  assert.equal(store.objectCount(), 0);
});

Deno.test("a lost put or acquire reply is UnobservableState; the retry is idempotent", async () => {
  const { clock, store } = fixture();
  const data = encoder.encode("a");
  {
    using schedule = faults({ [Barrier.payloadWriteAfter]: dropResponse() });
    await assert.rejects(store.put(data, "cam:a", contract(["detector"])), UnobservableState);
    schedule.assertAllFired();
  }
  const ref = await store.put(data, "cam:a", contract(["detector"]));
  const key = ref.key;
  assert.equal(store.objectCount(), 1, "the retried put found the stored object");
  {
    using schedule = faults({ [Barrier.obligationAcquireAfter]: dropResponse() });
    await assert.rejects(store.acquireObligation(ref, "tracker", clock.now() + 5), UnobservableState);
    schedule.assertAllFired();
  }
  assert.ok(store.obligations(key).has("tracker"), "the acquire took effect before its reply was lost");
  await store.acquireObligation(ref, "tracker", clock.now() + 5);
  assert.deepEqual([...store.obligations(key).keys()].sort(), ["detector", "tracker"]);
});

Deno.test("evictable tier: pressure evicts the least recently used objects, obligations or not", async () => {
  using log = new ObservationLog();
  const { store } = fixture({ tier: "evictable", maxBytes: 300, log });
  const put = (name: string) =>
    store.put(new Uint8Array(100).fill(name.charCodeAt(0)), name, contract(["r"]));
  const a = await put("a");
  const b = await put("b");
  const c = await put("c");
  await store.read(a);
  const d = await put("d");
  assert.equal((await store.read(b)).kind, "missing", "b was least recently used");
  for (const ref of [a, c, d]) assert.equal((await store.read(ref)).kind, "bytes");
  assert.equal(store.storedBytes(), 300);
  assert.deepEqual(log.events("payload.evicted").map((event) => event.fields.key), [b.key]);
  assert.equal(log.events("payload.evicted")[0].fields.status, "claimed by 1");
});

Deno.test("a payload larger than the whole budget is refused in either tier; a full durable store backpressures", async () => {
  for (const tier of ["durable", "evictable"] as const) {
    const { store } = fixture({ tier, maxBytes: 100 });
    await assert.rejects(store.put(new Uint8Array(101), "big", contract()), ResourceUnavailable);
  }
  const { store } = fixture({ maxBytes: 100 });
  await store.put(new Uint8Array(60), "a", contract());
  await assert.rejects(store.put(new Uint8Array(41), "b", contract()), (error: unknown) => {
    assert.ok(error instanceof PayloadBudgetExceeded);
    assert.equal(error.code, "VF_PAYLOAD_BUDGET");
    assert.equal(error.disposition, TRANSIENT);
    return true;
  });
  await store.put(new Uint8Array(40), "b", contract());
  assert.equal(store.storedBytes(), 100);
});

Deno.test("reads verify the digest: corrupted or truncated bytes are Corrupt, never data", async () => {
  const { store } = fixture();
  const data = encoder.encode("0123456789");
  const flipped = await store.put(data, "cam:flip", contract());
  const cut = await store.put(data, "cam:cut", contract());
  const empty = await store.put(new Uint8Array(), "cam:empty", contract());
  store.corrupt(flipped.key);
  store.truncate(cut.key, 4);
  store.corrupt(empty.key);
  for (const ref of [flipped, cut, empty]) {
    const outcome = await store.read(ref);
    assert.equal(outcome.kind, "corrupt", ref.contentId);
    if (outcome.kind === "corrupt") assert.equal(outcome.expectedDigest, ref.digest);
  }
  assert.equal(store.storedBytes(), 10 + 4 + 1, "the hooks account the bytes actually held");
  assert.throws(() => store.truncate(cut.key, 5), ConfigError);
  assert.throws(() => store.corrupt("vf-blob-nothing"), ConfigError);
});

Deno.test("failReads answers transient reads in order, then reads resume", async () => {
  const { store } = fixture();
  const ref = await store.put(encoder.encode("a"), "cam:a", contract());
  store.failReads(["timeout", "connection reset"]);
  const outcomes = [await store.read(ref), await store.read(ref), await store.read(ref)];
  assert.deepEqual(outcomes.map((o) => o.kind), ["transient", "transient", "bytes"]);
  assert.deepEqual(outcomes.slice(0, 2).map((o) => o.kind === "transient" && o.reason), [
    "timeout",
    "connection reset",
  ]);
});

Deno.test("the inventory lists every object sorted by key, or is Unknown when it cannot be read", async () => {
  const { store } = fixture();
  const refs = await Promise.all(["x", "y", "z"].map((id) => store.put(encoder.encode(id), id, contract())));
  const inventory = await store.inventory();
  assert.equal(inventory.kind, "known");
  if (inventory.kind === "known") {
    assert.deepEqual(inventory.value, [...refs].sort((a, b) => a.key < b.key ? -1 : 1));
  }
  store.failInventory("unreachable");
  const failed = await store.inventory();
  assert.deepEqual([failed.kind, failed.kind === "unknown" && failed.reason], ["unknown", "unreachable"]);
  const reconciled = await store.reconcile(new StaticLedger({ [refs[0].key]: [] }), "op");
  assert.deepEqual(reconciled, { reclaimed: [], retained: [], unknown: [refs[0].key] });
  store.failInventory(null);
  assert.equal((await store.inventory()).kind, "known");
});

Deno.test("a ledger that cannot be read reclaims nothing: the failure reaches the caller", async () => {
  const { store } = fixture();
  const ref = await store.put(encoder.encode("a"), "cam:a", contract(["detector"]));
  const broken: ObligationLedger = {
    requiredObligations: () => Promise.reject(new UnobservableState("ack floor unreadable")),
    authoritative: () => true,
  };
  await assert.rejects(store.reconcile(broken, "op"), UnobservableState);
  assert.ok(store.obligations(ref.key).has("detector"));
});

Deno.test("release: counted while others hold, reclaimed by the last, answered the same on a retry", async () => {
  const { store } = fixture();
  const ref = await store.put(encoder.encode("a"), "cam:a", contract(["detector", "tracker"]));
  const pick = (r: ReleaseReceipt) => [r.remaining, r.reclaimed, r.stale, r.unknown];
  assert.deepEqual(pick(await store.releaseObligation(ref, "cropper", "s0")), [2, false, false, false]);
  assert.deepEqual(pick(await store.releaseObligation(ref, "detector", "s1")), [1, false, false, false]);
  assert.deepEqual(pick(await store.releaseObligation(ref, "detector", "s1")), [1, false, false, false]);
  assert.deepEqual(pick(await store.releaseObligation(ref, "tracker", "s2")), [0, true, false, false]);
  assert.deepEqual(pick(await store.releaseObligation(ref, "tracker", "s2")), [0, true, false, false]);
  const unknownKey = await store.refForKey("vf-blob-unknown");
  assert.deepEqual(pick(await store.releaseObligation(unknownKey, "tracker", "s3")), [
    null,
    false,
    false,
    false,
  ]);
});

Deno.test("an object that expired or was deleted is not reported reclaimed to a later release", async () => {
  const { clock, store } = fixture();
  const expired = await store.put(encoder.encode("a"), "cam:a", contract([], 5));
  const deleted = await store.put(encoder.encode("b"), "cam:b", contract(["detector"]));
  store.delete(deleted.key);
  clock.advance(5);
  for (const ref of [expired, deleted]) {
    const receipt = await store.releaseObligation(ref, "detector", "s");
    assert.deepEqual([receipt.remaining, receipt.reclaimed], [null, false], ref.contentId);
  }
});

Deno.test("expireObligation drops one record; an emptied set no longer exists and a release reclaims nothing", async () => {
  const { store } = fixture();
  const ref = await store.put(encoder.encode("a"), "cam:a", contract(["detector", "tracker"]));
  store.expireObligation(ref.key, "detector");
  assert.deepEqual([...store.obligations(ref.key).keys()], ["tracker"]);
  store.expireObligation(ref.key, "tracker");
  assert.equal(store.obligations(ref.key).size, 0);
  const receipt = await store.releaseObligation(ref, "tracker", "s");
  assert.deepEqual([receipt.remaining, receipt.reclaimed], [null, false]);
  assert.equal((await store.read(ref)).kind, "bytes");
});

Deno.test("the orphan grace is configurable and measured from the latest put", async () => {
  const { clock, store } = fixture({ orphanGraceSeconds: 5 });
  const ref = await store.put(encoder.encode("a"), "cam:a", contract([], 3600));
  const ledger = new StaticLedger(new Map());
  clock.advance(5);
  assert.deepEqual((await store.reconcile(ledger, "op1")).retained, [ref.key]);
  await store.put(encoder.encode("a"), "cam:a", contract([], 3600));
  clock.advance(5);
  assert.deepEqual((await store.reconcile(ledger, "op2")).retained, [ref.key], "a forwarded put restarts it");
  clock.advance(0.001);
  assert.deepEqual((await store.reconcile(ledger, "op3")).reclaimed, [ref.key]);
  assert.equal(DEFAULT_ORPHAN_GRACE_SECONDS, 60);
});

Deno.test("a StaticLedger answers its mapping and is authoritative for every id unless told otherwise", async () => {
  const fromRecord = new StaticLedger({ k: ["a"] });
  const fromMap = new StaticLedger(new Map([["k", ["a"]]]), isIntentObligation);
  assert.deepEqual([...(await fromRecord.requiredObligations())], [["k", ["a"]]]);
  assert.deepEqual([...(await fromMap.requiredObligations())], [["k", ["a"]]]);
  assert.equal(fromRecord.authoritative("dlq/x"), true);
  assert.deepEqual([fromMap.authoritative("intent/p"), fromMap.authoritative("detector")], [true, false]);
});

Deno.test("capabilities tell the tiers apart and name the budget", async () => {
  const clock = new FakeClock();
  const durable = await new MemoryPayloadStore({ clock, maxBytes: 1024 }).capabilities();
  assert.deepEqual(
    [durable.adapter, durable.durable, durable.evictable, durable.atomicMultikey, durable.persistentStorage],
    [
      "memory",
      ...[true, false, true, false].map((value) => ({
        kind: "known",
        value,
        observedAt: clock.monotonic(),
        generation: null,
      })),
    ],
  );
  assert.deepEqual([durable.maxObjectBytes, durable.readerIdentities], [1024, true]);
  const evictable = await new MemoryPayloadStore({ clock, tier: "evictable" }).capabilities();
  assert.deepEqual(
    [evictable.durable.kind === "known" && evictable.durable.value, evictable.maxObjectBytes],
    [
      false,
      null,
    ],
  );
});

Deno.test("the observation log records the lifecycle with identities and digests, never bytes", async () => {
  using log = new ObservationLog();
  const { store } = fixture({ log });
  const ref = await store.put(encoder.encode("secret pixels"), "cam:a", contract(["detector"]));
  await store.read(ref, "detector");
  await store.releaseObligation(ref, "detector", "settle-1");
  assert.deepEqual(log.events().map((event) => event.kind), [
    "payload.put",
    "obligation.acquired",
    "payload.read",
    "obligation.released",
    "payload.reclaimed",
  ]);
  assert.deepEqual(log.events("payload.read")[0].fields, {
    key: ref.key,
    consumer: "detector",
    payload_digest: ref.digest,
    status: "ok",
  });
  assert.equal(log.events("payload.reclaimed")[0].fields.op_id, "settle-1");
  assert.ok(!JSON.stringify(log.events()).includes("secret"));
});

Deno.test("randomized: evictable eviction follows least-recent use and the byte budget is never exceeded", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const budget = 1000;
  const { store } = fixture({ tier: "evictable", maxBytes: budget });
  const lru: { ref: ImmutablePayloadRef; size: number }[] = [];
  for (let step = 0; step < 400; step++) {
    const where = `seed ${seed}, step ${step}`;
    if (lru.length > 0 && random.chance(0.4)) {
      const index = random.int(0, lru.length - 1);
      const [entry] = lru.splice(index, 1);
      assert.equal((await store.read(entry.ref)).kind, "bytes", `${where}: ${entry.ref.key} is still held`);
      lru.push(entry);
    } else {
      const size = random.int(0, 400);
      const ref = await store.put(random.bytes(size), `cam:e${step}`, contract(["detector"], 3600));
      let held = lru.reduce((sum, entry) => sum + entry.size, 0);
      while (held + size > budget) held -= (lru.shift() as { size: number }).size;
      lru.push({ ref, size });
    }
    const inventory = await store.inventory();
    assert.equal(inventory.kind, "known");
    if (inventory.kind !== "known") return;
    assert.deepEqual(
      inventory.value.map((ref) => ref.key).sort(),
      lru.map((entry) => entry.ref.key).sort(),
      `${where}: the store evicted exactly the least recently used`,
    );
    assert.ok(store.storedBytes() <= budget, `${where}: ${store.storedBytes()} bytes held over ${budget}`);
  }
});
