/**
 * The PayloadStore contract's fault stories (SPEC-MAP section 5: 2, 8, 9, 10, 11, 12, 43, 45, 46), written
 * once against the contract and run against every provider: `memory_test.ts` today, a Redis provider
 * later, without changing a scenario. Each test is named "<provider> <REQ-ID> <story>: <behaviour>" and
 * drives its fault through a barrier, the provider's clock, or a provider hook that models the store
 * misbehaving; a scheduled fault that never fired fails the test (assertAllFired).
 *
 * @module
 */

import assert from "node:assert/strict";
import { DecodeError, IncompatibleProfile, TransientFailure } from "../../../src/core/errors.ts";
import {
  Barrier,
  crash,
  dropResponse,
  type FaultAction,
  FaultSchedule,
  nth,
  raiseTyped,
  SimulatedCrash,
  throwSimulatedCrash,
} from "../../../src/backends/faults.ts";
import {
  type CompositionPlan,
  FlowRequirements,
  messagingCapabilities,
  type PayloadCapabilities,
  planComposition,
  ProfileRequest,
} from "../../../src/backends/capabilities.ts";
import { StaticLedger } from "../../../src/backends/memory/payload.ts";
import { known } from "../../../src/backends/outcomes.ts";
import {
  admitRetention,
  type ImmutablePayloadRef,
  intentObligationId,
  isForeignObligation,
  PayloadBudgetExceeded,
  payloadDigest,
  type PayloadStore,
  type RetentionContract,
  retentionContract,
} from "../../../src/backends/payload.ts";
import { PayloadStoreBlobBridge } from "../../../src/backends/payload_bridge.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

/** The two failure models a provider may be asked to play (see src/backends/memory/payload.ts). */
export type PayloadProviderTier = "durable" | "evictable";

/** What a scenario asks of a fresh store. */
export interface PayloadProviderOptions {
  readonly tier: PayloadProviderTier;
  /** Byte budget; null for unlimited. */
  readonly maxBytes: number | null;
  /** Whether a put of existing content and bytes shares the existing object. */
  readonly forwardUnchanged: boolean;
}

/** A fresh store, the time it runs on, and the hooks that model it misbehaving. */
export interface PayloadHarness {
  readonly store: PayloadStore;
  /** The store's wall time, in epoch seconds (what deadlines are written in). */
  now(): number;
  /** Moves the store's time forward by `seconds`. */
  advance(seconds: number): Promise<void>;
  /** The stored bytes of `key` change; its metadata still names the original. */
  corrupt(key: string): Promise<void>;
  /** The object at `key` vanishes (an operator's DEL). */
  remove(key: string): Promise<void>;
  /** The obligation set of `key` expires while the bytes remain (PAY-008). */
  expireObligationSet(key: string): Promise<void>;
  /** Removes whatever the store left behind. */
  dispose(): Promise<void>;
}

/** A PayloadStore implementation under test. */
export interface PayloadProvider {
  readonly name: string;
  /** The tiers this provider can play; a story needing another is not registered for it. */
  readonly tiers: readonly PayloadProviderTier[];
  /** The orphan grace its stores apply, in seconds (PAY-007). */
  readonly orphanGraceSeconds: number;
  /**
   * Null when its stores enforce a `maxBytes` budget byte for byte; otherwise why they cannot, and a story
   * needing one is registered ignored, with that reason in its name.
   */
  readonly byteBudget: string | null;
  create(options: PayloadProviderOptions): Promise<PayloadHarness>;
}

const DURABLE: PayloadProviderOptions = { tier: "durable", maxBytes: null, forwardUnchanged: true };

/** Plans a reliable_work channel whose payloads go to a store with `payload`'s capabilities (story 12). */
function planReliableWork(payload: PayloadCapabilities): CompositionPlan {
  const messaging = messagingCapabilities({
    adapter: "retained-broker",
    version: "1",
    retainedBacklog: true,
    recoverableDelivery: true,
    latestPerKey: true,
    dedupWindowSeconds: 120,
    publicationLedger: "window",
    replicationFactor: known(1),
    persistentStorage: known(true),
    maxPayloadBytes: known(8 << 20),
    creditResizable: true,
    controlSharesDataSlot: false,
  });
  const requirements = new FlowRequirements({ profiles: [new ProfileRequest("camera", "reliable_work")] });
  return planComposition(requirements, {
    messaging,
    payload,
    payloadRefsInUse: true,
    payloadTtlSeconds: 3600,
    payloadObligations: true,
  });
}

/** A schedule whose Crash throws SimulatedCrash, installed for the scope of `using`. */
function faults(actions: Record<string, FaultAction>): FaultSchedule {
  return new FaultSchedule(actions, { onCrash: throwSimulatedCrash }).install();
}

function contract(obligations: readonly string[], ttlSeconds = 60, horizonSeconds = 60): RetentionContract {
  return retentionContract({ ttlSeconds, horizonSeconds, durableRequired: true, obligations });
}

function frame(seed: number, size = 64): Uint8Array {
  return new SeededRandom(seed).bytes(size);
}

async function assertReadable(store: PayloadStore, ref: ImmutablePayloadRef, data: Uint8Array, why: string) {
  const outcome = await store.read(ref);
  assert.equal(outcome.kind, "bytes", `${why}: read ${ref.key} gave ${outcome.kind}`);
  if (outcome.kind === "bytes") assert.deepEqual(outcome.data, data, why);
}

async function assertMissing(store: PayloadStore, ref: ImmutablePayloadRef, why: string) {
  assert.equal((await store.read(ref)).kind, "missing", why);
}

/** The single key the store holds, read from its inventory. */
async function onlyKey(store: PayloadStore): Promise<string> {
  const inventory = await store.inventory();
  assert.equal(inventory.kind, "known");
  if (inventory.kind !== "known") throw new Error("unreachable");
  assert.equal(inventory.value.length, 1, "exactly one object is stored");
  return inventory.value[0].key;
}

/** A story: its name, the store it needs, and its body. */
type Scenario = readonly [
  name: string,
  options: PayloadProviderOptions,
  run: (harness: PayloadHarness, provider: PayloadProvider) => Promise<void>,
];

async function withStore(
  provider: PayloadProvider,
  options: PayloadProviderOptions,
  run: (harness: PayloadHarness) => Promise<void>,
): Promise<void> {
  const harness = await provider.create(options);
  try {
    await run(harness);
  } finally {
    await harness.dispose();
  }
}

const SCENARIOS: readonly Scenario[] = [
  [
    "PAY-004 2: a settlement whose ack receipt was lost releases nothing: the payload outlives its TTL for the redelivery",
    DURABLE,
    async ({ store, advance }) => {
      const data = frame(2);
      const ref = await store.put(data, "cam:e2", contract(["detector"], 30, 30));
      await advance(3600);
      await assertReadable(store, ref, data, "the redelivery after SettleUnknown still finds the bytes");
      const receipt = await store.releaseObligation(ref, "detector", "settle-2-confirmed");
      assert.equal(receipt.reclaimed, true, "the release after the confirmed settlement reclaims it");
      await assertMissing(store, ref, "reclaimed once nobody owes it");
    },
  ],
  [
    "PAY-007 8: a crash between payload.write.after and obligation.acquire.after leaves a TTL-only orphan, reclaimed only after the grace",
    DURABLE,
    async ({ store, advance }, provider) => {
      const data = frame(8);
      {
        using schedule = faults({ [Barrier.payloadWriteAfter]: crash() });
        await assert.rejects(store.put(data, "cam:e8", contract(["detector"], 3600, 3600)), SimulatedCrash);
        schedule.assertAllFired();
      }
      const ref = await store.refForKey(await onlyKey(store));
      const release = await store.releaseObligation(ref, "detector", "settle-8");
      assert.deepEqual(
        [release.remaining, release.reclaimed, release.stale, release.unknown],
        [null, false, false, false],
        "no obligation set was attached: a release is neither counted nor 'all done'",
      );
      const ledger = new StaticLedger({});
      await advance(provider.orphanGraceSeconds - 1);
      const early = await store.reconcile(ledger, "reconcile-8a");
      assert.deepEqual(early.retained, [ref.key], "inside the grace the put may still be in progress");
      await assertReadable(store, ref, data, "the orphan is intact inside the grace");
      await advance(2);
      const late = await store.reconcile(ledger, "reconcile-8b");
      assert.deepEqual(late.reclaimed, [ref.key], "past the grace the orphan is reclaimed");
      await assertMissing(store, ref, "the orphan is gone");
    },
  ],
  [
    "PAY-008 9: an obligation set that expired with the bytes present: a release reclaims nothing, and the payload is not all done",
    DURABLE,
    async ({ store, expireObligationSet }) => {
      const data = frame(9);
      const ref = await store.put(data, "cam:e9", contract(["detector", "tracker"], 3600, 3600));
      await expireObligationSet(ref.key);
      const receipt = await store.releaseObligation(ref, "detector", "settle-9");
      assert.deepEqual(
        [receipt.remaining, receipt.reclaimed, receipt.stale, receipt.unknown],
        [null, false, false, false],
        "the missing set is neither created nor read as everyone finished",
      );
      await assertReadable(store, ref, data, "the tracker still reads the bytes");
      const reconciled = await store.reconcile(new StaticLedger({ [ref.key]: ["tracker"] }), "reconcile-9");
      assert.deepEqual(reconciled.retained, [ref.key], "the ledger still requires the tracker");
      await assertReadable(store, ref, data, "reconcile kept what the ledger requires");
    },
  ],
  [
    "PAY-006 10: a crash after a confirmed ack and before the release: the reconciler sees the floor past the sequence and cancels the obligation",
    DURABLE,
    async ({ store }) => {
      const data = frame(10);
      const ref = await store.put(data, "cam:e10", contract(["detector", "tracker"], 3600, 3600));
      {
        using schedule = faults({ [Barrier.obligationReleaseBefore]: crash() });
        await assert.rejects(store.releaseObligation(ref, "detector", "settle-10"), SimulatedCrash);
        schedule.assertAllFired();
      }
      const first = await store.reconcile(new StaticLedger({ [ref.key]: ["tracker"] }), "reconcile-10a");
      assert.deepEqual(first.retained, [ref.key], "the tracker's floor is still below the sequence");
      await assertReadable(store, ref, data, "the tracker can still read");
      const receipt = await store.releaseObligation(ref, "tracker", "settle-10-tracker");
      assert.deepEqual(
        [receipt.remaining, receipt.reclaimed],
        [0, true],
        "the detector's crashed release was cancelled: the tracker's release is the last",
      );
      await assertMissing(store, ref, "reclaimed");
    },
  ],
  [
    "PAY-006 10: with every ack floor past the sequence, reconcile cancels the leaked obligations and reclaims",
    DURABLE,
    async ({ store }) => {
      const ref = await store.put(frame(101), "cam:e101", contract(["detector"], 3600, 3600));
      const reconciled = await store.reconcile(new StaticLedger({ [ref.key]: [] }), "reconcile-101");
      assert.deepEqual([reconciled.reclaimed, reconciled.retained, reconciled.unknown], [[ref.key], [], []]);
      await assertMissing(store, ref, "nobody owes it");
    },
  ],
  [
    "PAY-012 11: a publication the channel evicted is owed by nobody: reconcile reclaims it despite reader obligations",
    DURABLE,
    async ({ store }) => {
      const kept = await store.put(frame(111), "cam:e111", contract(["detector"], 3600, 3600));
      const evicted = await store.put(frame(112), "cam:e112", contract(["detector"], 3600, 3600));
      const ledger = new StaticLedger({ [kept.key]: ["detector"], [evicted.key]: [] });
      const reconciled = await store.reconcile(ledger, "reconcile-11");
      assert.deepEqual(reconciled.reclaimed, [evicted.key]);
      assert.deepEqual(reconciled.retained, [kept.key]);
    },
  ],
  [
    "PAY-013 11: a refused publication's intent owes nothing; a key the ledger does not list loses only its intent",
    DURABLE,
    async ({ store }) => {
      const refused = await store.put(frame(113), "cam:e113", contract([intentObligationId("p113")], 3600));
      const withReader = await store.put(
        frame(114),
        "cam:e114",
        contract(["detector", intentObligationId("p114")], 3600),
      );
      const reconciled = await store.reconcile(new StaticLedger({}), "reconcile-13");
      assert.deepEqual(
        reconciled.reclaimed,
        [refused.key],
        "the lone intent was cancelled and the object reclaimed",
      );
      assert.deepEqual(reconciled.retained, [withReader.key], "a reader this ledger may not see keeps it");
      const receipt = await store.releaseObligation(withReader, "detector", "settle-114");
      assert.deepEqual([receipt.remaining, receipt.reclaimed], [0, true], "its intent was cancelled");
    },
  ],
  [
    "BLOB-13 11: a runtime ledger never cancels an archive or dead-letter pin it is not authoritative for",
    DURABLE,
    async ({ store }) => {
      const data = frame(115);
      const ref = await store.put(data, "cam:e115", contract(["detector", "dlq/cam:e115"], 3600));
      const runtimeLedger = new StaticLedger({ [ref.key]: [] }, (id) => !isForeignObligation(id));
      const reconciled = await store.reconcile(runtimeLedger, "reconcile-115");
      assert.deepEqual(reconciled.retained, [ref.key]);
      await assertReadable(store, ref, data, "the dead letter's pin holds the bytes");
      const receipt = await store.releaseObligation(ref, "dlq/cam:e115", "dlq-purge");
      assert.deepEqual([receipt.remaining, receipt.reclaimed], [0, true], "the detector's was cancelled");
    },
  ],
  [
    "reliable_work 12: an evictable store under pressure evicts a payload a reader still owes, so reliable_work over it is refused",
    { tier: "evictable", maxBytes: 1000, forwardUnchanged: true },
    async ({ store }) => {
      const needed = await store.put(frame(121, 600), "cam:e121", contract(["detector"], 3600, 3600));
      const newer = frame(122, 600);
      const pushed = await store.put(newer, "cam:e122", contract(["detector"], 3600, 3600));
      await assertMissing(store, needed, "the detector still owed it, and it was evicted");
      await assertReadable(store, pushed, newer, "the put that caused the pressure was admitted");
      const capabilities = await store.capabilities();
      assert.equal(capabilities.evictable.kind === "known" && capabilities.evictable.value, true);
      assert.equal(capabilities.durable.kind === "known" && capabilities.durable.value, false);
      assert.throws(() => planReliableWork(capabilities), (error: unknown) => {
        assert.ok(error instanceof IncompatibleProfile);
        assert.ok(
          error.diagnostics.some((d) => /evictable/.test(d.message)),
          "the refusal names the eviction",
        );
        return true;
      });
    },
  ],
  [
    "reliable_work 12: a durable store under the same pressure refuses the put (backpressure), keeps what is owed, and is admitted",
    { tier: "durable", maxBytes: 1000, forwardUnchanged: true },
    async ({ store }) => {
      const data = frame(123, 600);
      const needed = await store.put(data, "cam:e123", contract(["detector"], 3600, 3600));
      await assert.rejects(
        store.put(frame(124, 600), "cam:e124", contract(["detector"], 3600, 3600)),
        PayloadBudgetExceeded,
      );
      await assertReadable(store, needed, data, "nothing owed was evicted to make room");
      const capabilities = await store.capabilities();
      assert.equal(capabilities.durable.kind === "known" && capabilities.durable.value, true);
      assert.equal(capabilities.evictable.kind === "known" && capabilities.evictable.value, false);
      assert.deepEqual(planReliableWork(capabilities).channelProfiles, { camera: "reliable_work" });
      await store.releaseObligation(needed, "detector", "settle-123");
      await store.put(frame(124, 600), "cam:e124", contract(["detector"], 3600, 3600));
    },
  ],
  [
    "PAY-009 43: a durable TTL shorter than the horizon is refused without obligations; with them the object lives out the horizon",
    DURABLE,
    async ({ store, advance }) => {
      const unpinned = contract([], 60, 3600);
      assert.throws(() => admitRetention(unpinned), (error: unknown) => {
        assert.ok(error instanceof IncompatibleProfile);
        assert.match(error.message, /60 s.*3600 s/);
        return true;
      });
      const pinned = contract(["detector"], 60, 3600);
      admitRetention(pinned);
      admitRetention(retentionContract({ ttlSeconds: 60, horizonSeconds: 3600, durableRequired: false }));
      const data = frame(43);
      const ref = await store.put(data, "cam:e43", pinned);
      await advance(1800);
      await assertReadable(store, ref, data, "past its TTL, inside the horizon, an obligation pins it");
    },
  ],
  [
    "BLOB-15 45: a digest mismatch reads Corrupt and a vanished object Missing; the bridge makes both a DecodeError naming the ref",
    DURABLE,
    async ({ store, corrupt, remove }) => {
      let content = "cam:e451";
      const bridge = new PayloadStoreBlobBridge(store, {
        obligations: ["detector"],
        horizonSeconds: 3600,
        durableRequired: true,
        contentId: () => content,
      });
      const data = frame(451, 128);
      const corruptKey = await bridge.put(data, 3600);
      await corrupt(corruptKey);
      const outcome = await store.read(await store.refForKey(corruptKey));
      assert.equal(outcome.kind, "corrupt");
      if (outcome.kind === "corrupt") {
        assert.equal(outcome.expectedDigest, payloadDigest(data));
        assert.notEqual(outcome.actualDigest, outcome.expectedDigest);
      }
      await assert.rejects(bridge.get(corruptKey), (error: unknown) => {
        assert.ok(error instanceof DecodeError);
        assert.equal(error.disposition, "poison");
        assert.deepEqual([error.context.ref, error.context.reason], [corruptKey, "corrupt"]);
        return true;
      });
      content = "cam:e452";
      const missingKey = await bridge.put(frame(452, 128), 3600);
      await remove(missingKey);
      assert.equal((await store.read(await store.refForKey(missingKey))).kind, "missing");
      await assert.rejects(bridge.get(missingKey), (error: unknown) => {
        assert.ok(error instanceof DecodeError);
        assert.deepEqual([error.context.ref, error.context.reason], [missingKey, "missing"]);
        return true;
      });
    },
  ],
  [
    "BLOB-15 45: a transient read is retried, never turned into bytes: TransientRead, then a retryable TransientFailure",
    DURABLE,
    async ({ store }) => {
      const data = frame(453, 128);
      const bridge = new PayloadStoreBlobBridge(store, {
        obligations: ["detector"],
        horizonSeconds: 3600,
        durableRequired: true,
        contentId: () => "cam:e453",
      });
      const key = await bridge.put(data, 3600);
      const ref = await store.refForKey(key);
      using schedule = faults({
        [Barrier.payloadReadBefore]: nth(2, raiseTyped("VF_TRANSIENT", "store connection reset")),
      });
      await assertReadable(store, ref, data, "the first read passes the barrier");
      const outcome = await store.read(ref);
      assert.equal(outcome.kind, "transient", "the store was unreachable: the bytes may still exist");
      if (outcome.kind === "transient") assert.match(outcome.reason, /connection reset/);
      schedule.assertAllFired();
      assert.deepEqual(await bridge.get(key), data, "the retry reads the bytes");
      schedule.uninstall();
      using dropped = faults({ [Barrier.payloadReadBefore]: dropResponse() });
      await assert.rejects(bridge.get(key), (error: unknown) => {
        assert.ok(error instanceof TransientFailure && !(error instanceof DecodeError));
        assert.equal(error.disposition, "transient");
        assert.equal(error.context.ref, key);
        return true;
      });
      dropped.assertAllFired();
    },
  ],
  [
    "BLOB-14 46: a release naming a stale generation touches nothing; the current generation's release proceeds",
    { ...DURABLE, forwardUnchanged: false },
    async ({ store }) => {
      const data = frame(46);
      const first = await store.put(data, "cam:e46", contract(["detector", "tracker"], 3600));
      const second = await store.put(data, "cam:e46", contract(["detector", "tracker"], 3600));
      assert.equal(second.key, first.key, "the same content and bytes land on the same key");
      assert.notEqual(second.generation, first.generation, "a put that does not forward mints a generation");
      const stale = await store.releaseObligation(first, "detector", "late-cleanup");
      assert.deepEqual([stale.stale, stale.reclaimed, stale.remaining], [true, false, null]);
      const current = await store.refForKey(first.key);
      assert.equal(current.generation, second.generation, "refForKey completes the current generation");
      await assertReadable(store, current, data, "the stale release deleted nothing");
      const detector = await store.releaseObligation(current, "detector", "settle-46d");
      assert.deepEqual([detector.remaining, detector.reclaimed], [1, false], "the detector was still owed");
      const tracker = await store.releaseObligation(current, "tracker", "settle-46t");
      assert.deepEqual([tracker.remaining, tracker.reclaimed], [0, true]);
    },
  ],
  [
    "BLOB-14 46: a lost release reply reads unknown; the retry is idempotent and never releases twice",
    DURABLE,
    async ({ store }) => {
      const data = frame(461);
      const ref = await store.put(data, "cam:e461", contract(["detector", "tracker"], 3600));
      {
        using schedule = faults({ [Barrier.obligationReleaseAfter]: nth(1, dropResponse()) });
        const lost = await store.releaseObligation(ref, "detector", "settle-461");
        assert.deepEqual([lost.unknown, lost.reclaimed, lost.remaining], [true, false, null]);
        const retry = await store.releaseObligation(ref, "detector", "settle-461");
        assert.deepEqual([retry.unknown, retry.reclaimed, retry.remaining], [false, false, 1]);
        schedule.assertAllFired();
      }
      await assertReadable(store, ref, data, "the tracker's obligation survived the retried release");
      {
        using schedule = faults({ [Barrier.obligationReleaseAfter]: nth(1, dropResponse()) });
        const lost = await store.releaseObligation(ref, "tracker", "settle-462");
        assert.equal(lost.unknown, true);
        const retry = await store.releaseObligation(ref, "tracker", "settle-462");
        assert.deepEqual(
          [retry.unknown, retry.reclaimed, retry.remaining],
          [false, true, 0],
          "the retry learns that its lost release was the last",
        );
        schedule.assertAllFired();
      }
      await assertMissing(store, ref, "reclaimed once, by the release whose reply was lost");
    },
  ],
];

const READERS = ["detector", "tracker", "crop/p0", "crop/p1"] as const;

/**
 * Random put / acquire / renew / release (current and stale) / clock / reconcile sequences against a
 * model of who still owes what; after every step each owed payload must read back intact, and a release
 * or reconcile may reclaim only a payload nobody owes.
 */
async function randomizedNoEarlyReclaim(provider: PayloadProvider, seed: number): Promise<void> {
  const random = new SeededRandom(seed);
  await withStore(
    provider,
    { ...DURABLE, forwardUnchanged: random.chance(0.5) },
    async ({ store, now, advance }) => {
      const owed = new Map<string, Set<string>>();
      const content = new Map<string, Uint8Array>();
      const staleRefs: ImmutablePayloadRef[] = [];
      const variants = Array.from(
        { length: 6 },
        (_, i) => ({ id: `cam:e${i % 3}`, data: frame(seed + i, 16) }),
      );
      const owedBy = (key: string) => owed.get(key) ?? new Set<string>();
      const where = (step: number, what: string) => `seed ${seed}, step ${step}: ${what}`;
      for (let step = 0; step < 250; step++) {
        const keys = [...owed.keys()].filter((key) => owedBy(key).size > 0);
        const op = random.int(0, 9);
        if (op <= 2 || keys.length === 0) {
          const variant = random.pick(variants);
          const readers = READERS.filter(() => random.chance(0.4));
          const intent = random.chance(0.5) ? [intentObligationId(`p${step}`)] : [];
          const ref = await store.put(
            variant.data,
            variant.id,
            contract([...readers, ...intent], random.int(1, 120)),
          );
          content.set(ref.key, variant.data);
          const set = owedBy(ref.key);
          for (const reader of readers) set.add(reader);
          owed.set(ref.key, set);
          staleRefs.push(ref);
        } else if (op === 3) {
          const key = random.pick(keys);
          const reader = random.pick(READERS);
          const ref = await store.refForKey(key);
          await store.acquireObligation(ref, reader, now() + random.int(1, 600));
          owedBy(key).add(reader);
        } else if (op === 4) {
          const key = random.pick(keys);
          const reader = random.pick([...owedBy(key)]);
          await store.renewObligation(await store.refForKey(key), reader, now() + random.int(1, 600));
        } else if (op === 5 || op === 6) {
          const key = random.pick(keys);
          const reader = random.pick([...owedBy(key), ...READERS]);
          const receipt = await store.releaseObligation(await store.refForKey(key), reader, `settle-${step}`);
          owedBy(key).delete(reader);
          assert.ok(
            !receipt.reclaimed || owedBy(key).size === 0,
            where(step, `releasing ${reader} reclaimed ${key} while ${[...owedBy(key)]} still owe it`),
          );
        } else if (op === 7) {
          const old = random.pick(staleRefs);
          const reader = random.pick(READERS);
          const current = await store.refForKey(old.key);
          const receipt = await store.releaseObligation(old, reader, `late-${step}`);
          if (current.generation === old.generation) {
            owedBy(old.key).delete(reader);
            assert.ok(
              !receipt.reclaimed || owedBy(old.key).size === 0,
              where(step, `${old.key} reclaimed early`),
            );
          } else if (current.generation !== "") {
            assert.equal(
              receipt.stale,
              true,
              where(step, `a release of generation ${old.generation} is stale`),
            );
          }
        } else if (op === 8) {
          await advance(random.int(0, 200));
        } else {
          const finished = new Map<string, readonly string[]>();
          for (const key of keys.filter(() => random.chance(0.5))) {
            const still = [...owedBy(key)].filter(() => random.chance(0.6));
            finished.set(key, still);
          }
          const reconciled = await store.reconcile(new StaticLedger(finished), `reconcile-${step}`);
          for (const [key, still] of finished) owed.set(key, new Set(still));
          for (const key of reconciled.reclaimed) {
            assert.equal(
              owedBy(key).size,
              0,
              where(step, `reconcile reclaimed ${key} still owed by ${[...owedBy(key)]}`),
            );
          }
        }
        for (const [key, readers] of owed) {
          if (readers.size === 0) continue;
          const outcome = await store.read(await store.refForKey(key));
          assert.equal(
            outcome.kind,
            "bytes",
            where(step, `${key} owed by ${[...readers]} read ${outcome.kind}`),
          );
          if (outcome.kind === "bytes") {
            assert.deepEqual(
              outcome.data,
              content.get(key),
              where(step, `${key} intact`),
            );
          }
        }
      }
    },
  );
}

/**
 * Registers every scenario `provider` can play as a Deno test, named "<provider> <REQ-ID> <story>:
 * <behaviour>".
 */
export function payloadScenarios(provider: PayloadProvider): void {
  for (const [name, options, run] of SCENARIOS) {
    if (!provider.tiers.includes(options.tier)) continue;
    const ignored = options.maxBytes !== null && provider.byteBudget !== null;
    Deno.test({
      name: `${provider.name} ${name}${ignored ? ` [ignored: ${provider.byteBudget}]` : ""}`,
      ignore: ignored,
      fn: () => withStore(provider, options, (harness) => run(harness, provider)),
    });
  }
  if (!provider.tiers.includes("durable")) return;
  Deno.test(`${provider.name} BLOB-14 randomized: no payload is reclaimed while a reader still owes it`, async () => {
    const seed = testSeed();
    for (let round = 0; round < 8; round++) await randomizedNoEarlyReclaim(provider, seed + round);
  });
}
