import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import {
  EFFECT_KEY_PREFIX,
  EFFECT_MARKER_SHARDS,
  EFFECT_RETENTION_SECONDS,
  idempotencyKey,
  LedgerIdempotencyStore,
  LEGACY_MARKER_FORMAT,
} from "../../../src/runtime/idempotency.ts";
import { FileRuntimeStore } from "../../../src/runtime/file_store.ts";
import { MemoryRuntimeStore } from "../../../src/backends/memory/runtime_store.ts";
import type { RuntimeStore } from "../../../src/backends/runtime_store.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { Barrier, dropResponse, FaultSchedule, nth } from "../../../src/backends/faults.ts";
import { ConfigError, UnobservableState } from "../../../src/core/errors.ts";

interface Provider {
  readonly name: string;
  open(
    clock: FakeClock,
  ): Promise<{ store: RuntimeStore; reopen: () => Promise<RuntimeStore>; done: () => Promise<void> }>;
}

const providers: readonly Provider[] = [
  {
    name: "memory",
    open(clock) {
      const store = new MemoryRuntimeStore(clock);
      return Promise.resolve({ store, reopen: () => Promise.resolve(store), done: () => store.close() });
    },
  },
  {
    name: "file",
    async open(clock) {
      const dir = await Deno.makeTempDir();
      const opened: RuntimeStore[] = [];
      const reopen = async () => {
        const store = await FileRuntimeStore.open(dir, clock);
        opened.push(store);
        return store;
      };
      const store = await reopen();
      return {
        store,
        reopen,
        done: async () => {
          for (const each of opened) await each.close();
          await Deno.remove(dir, { recursive: true });
        },
      };
    },
  },
];

const key = idempotencyKey("flow-A", "sink", "745708c2eeaf98a60fdbebafe1d04eff");

for (const provider of providers) {
  const scenario = (
    name: string,
    body: (clock: FakeClock, store: RuntimeStore, reopen: () => Promise<RuntimeStore>) => Promise<void>,
  ) =>
    Deno.test(`${provider.name}: ${name}`, async () => {
      const clock = new FakeClock();
      const opened = await provider.open(clock);
      try {
        await body(clock, opened.store, opened.reopen);
      } finally {
        await opened.done();
      }
    });

  scenario(
    "an effect is unseen until marked; the first mark wins, a repeated mark reports it already applied",
    async (clock, store) => {
      const effects = new LedgerIdempotencyStore(store, { clock });
      assert.equal(await effects.seen(key), false);
      assert.equal(await effects.mark(key), true);
      assert.equal(await effects.seen(key), true);
      assert.equal(await effects.mark(key), false);
      assert.equal(await effects.seen(idempotencyKey("flow-A", "sink", "another message")), false);
      const shard = effects.shardOf(key);
      const digest = createHash("sha256").update(key).digest("hex");
      assert.equal(shard, EFFECT_KEY_PREFIX + digest.slice(0, 3));
      assert.equal(effects.markerName(key), digest.slice(3, 32), "a marker is named by the first 128 bits");
      assert.deepEqual(await shardDocument(store, shard), {
        format: 2,
        markers: { [effects.markerName(key)]: clock.now() + 86_400 },
      });
    },
  );

  scenario(
    "a marker is kept 24 hours; after that the effect reads as unseen and the next mark replaces it",
    async (clock, store) => {
      const effects = new LedgerIdempotencyStore(store, { clock });
      assert.equal(effects.retentionSeconds, EFFECT_RETENTION_SECONDS);
      await effects.mark(key);
      clock.advance(EFFECT_RETENTION_SECONDS - 0.001);
      assert.equal(await effects.seen(key), true);
      clock.advance(0.001);
      assert.equal(await effects.seen(key), false);
      assert.equal(await effects.mark(key), true, "an expired marker is replaced");
      clock.advance(EFFECT_RETENTION_SECONDS - 1);
      assert.equal(await effects.seen(key), true, "the replacement starts a new retention");
    },
  );

  scenario(
    "sweep removes exactly the expired markers, an emptied shard with them, and nothing outside its prefix",
    async (clock, store) => {
      const effects = new LedgerIdempotencyStore(store, { clock, retentionSeconds: 60 });
      const [old, young] = sameShardKeys(effects, "young", 2);
      await effects.mark(old);
      await effects.mark("old-elsewhere");
      clock.advance(30);
      await effects.mark(young);
      await store.cas("vf/other/key", null, new TextEncoder().encode("not a marker"));
      clock.advance(30);
      assert.equal(await effects.sweep(), 2);
      assert.deepEqual((await store.scan(EFFECT_KEY_PREFIX)).map((r) => r.key), [effects.shardOf(young)]);
      assert.deepEqual(await shardDocument(store, effects.shardOf(young)), {
        format: 2,
        markers: { [effects.markerName(young)]: clock.now() + 30 },
      });
      assert.equal((await store.get("vf/other/key")).kind, "present");
      assert.equal(await effects.sweep(), 0);
      assert.equal(await effects.seen(young), true, "a live marker outlives the sweep");
      assert.equal(await effects.seen(old), false);
    },
  );

  scenario(
    "a mark leaves out its shard's expired markers and keeps the live ones",
    async (clock, store) => {
      const effects = new LedgerIdempotencyStore(store, { clock, retentionSeconds: 60 });
      const [first, second, third] = sameShardKeys(effects, "first", 3);
      await effects.mark(first);
      clock.advance(40);
      await effects.mark(second);
      clock.advance(20);
      await effects.mark(third);
      assert.deepEqual(await shardDocument(store, effects.shardOf(first)), {
        format: 2,
        markers: {
          [effects.markerName(second)]: clock.now() + 40,
          [effects.markerName(third)]: clock.now() + 60,
        },
      });
      assert.equal(await effects.seen(first), false);
      assert.equal(await effects.seen(second), true);
    },
  );

  scenario(
    "two stores over one ledger: a marker one writes the other sees, and of racing marks exactly one wins",
    async (clock, store, reopen) => {
      const first = new LedgerIdempotencyStore(store, { clock });
      const second = new LedgerIdempotencyStore(await reopen(), { clock });
      await first.mark("k1");
      assert.equal(await second.seen("k1"), true);
      for (let round = 0; round < 20; round++) {
        const wins = await Promise.all([first.mark(`race-${round}`), second.mark(`race-${round}`)]);
        assert.equal(wins.filter(Boolean).length, 1, `round ${round}: ${wins}`);
      }
    },
  );

  scenario(
    "a lost write receipt surfaces as UnobservableState, and the retried mark finds the effect marked",
    async (clock, store) => {
      const effects = new LedgerIdempotencyStore(store, { clock });
      using schedule = new FaultSchedule({ [Barrier.ledgerWriteAfter]: nth(1, dropResponse()) }).install();
      await assert.rejects(effects.mark(key), UnobservableState);
      schedule.assertAllFired();
      assert.equal(await effects.mark(key), false);
      assert.equal(await effects.seen(key), true);
    },
  );

  scenario(
    "a marker the version before the shards wrote (one document per key) is still honoured, then swept once expired",
    async (clock, store, reopen) => {
      const marked = idempotencyKey("flow-A", "sink", "marked by the previous version");
      const expiring = idempotencyKey("flow-A", "sink", "marked a day ago");
      const now = clock.now();
      for (
        const [legacy, markedAt] of [[marked, now - 60], [
          expiring,
          now - EFFECT_RETENTION_SECONDS + 30,
        ]] as const
      ) {
        const document = {
          format: LEGACY_MARKER_FORMAT,
          key: legacy,
          marked_at: markedAt,
          expires_at: markedAt + EFFECT_RETENTION_SECONDS,
        };
        assert.ok(
          await store.cas(
            EFFECT_KEY_PREFIX + legacy,
            null,
            new TextEncoder().encode(JSON.stringify(document)),
          ),
        );
      }
      const effects = new LedgerIdempotencyStore(await reopen(), { clock });
      assert.equal(await effects.seen(marked), true, "the upgraded runtime sees the old marker");
      assert.equal(await effects.mark(marked), false, "and does not mark (nor redo) that effect again");
      assert.equal(await effects.seen(expiring), true);
      assert.equal(await effects.sweep(), 0, "a legacy marker still kept is not swept");
      clock.advance(31);
      assert.equal(await effects.seen(expiring), false, "an old marker expires on its own schedule");
      assert.equal(await effects.mark(expiring), true);
      assert.equal(await effects.sweep(), 1, "the expired legacy document is removed");
      assert.equal((await store.get(EFFECT_KEY_PREFIX + expiring)).kind, "absent");
      assert.equal(await effects.seen(expiring), true, "its new marker lives in its shard");
      assert.equal(await effects.seen(marked), true);
    },
  );

  scenario(
    "a document under the prefix that is not a marker is UnobservableState, never 'unseen'",
    async (clock, store) => {
      const effects = new LedgerIdempotencyStore(store, { clock, prefix: "fx/" });
      assert.equal(effects.prefix, "fx/");
      for (
        const [name, text] of [["garbage", "{"], ["wrong", '{"format":1,"markers":{}}'], [
          "nan",
          '{"format":2,"markers":{"nan":"NaN"}}',
        ]]
      ) {
        await store.cas(effects.shardOf(name), null, new TextEncoder().encode(text));
        await assert.rejects(effects.seen(name), UnobservableState, name);
        await assert.rejects(effects.mark(name), UnobservableState, name);
      }
    },
  );
}

/** `count` keys whose markers share `seed`'s shard, `seed` first. */
function sameShardKeys(effects: LedgerIdempotencyStore, seed: string, count: number): string[] {
  const keys = [seed];
  for (let n = 0; keys.length < count; n++) {
    if (effects.shardOf(`${seed}-${n}`) === effects.shardOf(seed)) keys.push(`${seed}-${n}`);
  }
  return keys;
}

async function shardDocument(store: RuntimeStore, shard: string): Promise<unknown> {
  const entry = await store.get(shard);
  assert.equal(entry.kind, "present", shard);
  return JSON.parse(new TextDecoder().decode(entry.kind === "present" ? entry.value : undefined));
}

Deno.test("ten thousand markers, kept or expired, take at most EFFECT_MARKER_SHARDS documents", async () => {
  const clock = new FakeClock();
  const store = new MemoryRuntimeStore(clock);
  const effects = new LedgerIdempotencyStore(store, { clock, retentionSeconds: 1 });
  for (let n = 0; n < 10_000; n++) {
    assert.equal(await effects.mark(idempotencyKey("flow-A", "sink", `message-${n}`)), true);
    clock.advance(0.01);
  }
  const shards = await store.scan(EFFECT_KEY_PREFIX);
  assert.ok(shards.length <= EFFECT_MARKER_SHARDS, `${shards.length} documents`);
  const kept = shards.reduce(
    (sum, r) => sum + Object.keys(JSON.parse(new TextDecoder().decode(r.value)).markers).length,
    0,
  );
  assert.ok(kept < 10_000 * 0.7, `${kept} markers kept of 10000 marked, 100 of them live`);
  assert.equal(await effects.seen(idempotencyKey("flow-A", "sink", "message-9999")), true);
  assert.equal(await effects.seen(idempotencyKey("flow-A", "sink", "message-0")), false);
  await store.close();
});

Deno.test("idempotencyKey is vf-idem- and the SHA-256 hex of flow:node:message_id", () => {
  const expected = createHash("sha256").update("flow-A:sink:745708c2eeaf98a60fdbebafe1d04eff").digest("hex");
  assert.equal(key, `vf-idem-${expected}`);
  assert.notEqual(idempotencyKey("flow-A", "sink2", "x"), idempotencyKey("flow-A", "sink", "x"));
});

Deno.test("a retention that is not a positive number is a ConfigError", () => {
  const store = new MemoryRuntimeStore();
  for (const retention of [0, -1, Number.NaN, Infinity]) {
    assert.throws(() => new LedgerIdempotencyStore(store, { retentionSeconds: retention }), ConfigError);
  }
});

Deno.test("a mark that keeps losing its compare-and-swap gives up with UnobservableState instead of looping", async () => {
  const inner = new MemoryRuntimeStore();
  const contended: RuntimeStore = {
    get: (k) => inner.get(k),
    cas: () => Promise.resolve(false),
    delete: (k, v) => inner.delete(k, v),
    scan: (p) => inner.scan(p),
    append: (l, r) => inner.append(l, r),
    logEntries: (l) => inner.logEntries(l),
    capabilities: () => inner.capabilities(),
    close: () => inner.close(),
  };
  const effects = new LedgerIdempotencyStore(contended);
  await assert.rejects(effects.mark("k"), (error: unknown) => {
    assert.ok(error instanceof UnobservableState);
    assert.equal(error.context.attempts, 8);
    return true;
  });
});
