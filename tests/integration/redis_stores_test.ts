/**
 * The Redis stores against real `redis-server` processes (tests/support/services.ts) where the conformance
 * suites cannot reach: a server frozen with SIGSTOP in the middle of a write, durability and eviction read
 * back from differently configured servers (and from one whose ACL refuses CONFIG: SPEC-MAP story 44), a
 * server out of memory under noeviction, the URL registry, racing compare-and-swaps from separate
 * connections, and the sink effect markers of WIRE.md.
 *
 * @module
 */

import assert from "node:assert/strict";
import { Redis } from "ioredis";
import { Barrier, FaultSchedule, pause, throwSimulatedCrash } from "../../src/backends/faults.ts";
import { FlowRuntime } from "../../src/backends/runtime.ts";
import { FakeClock } from "../../src/backends/memory/clock.ts";
import { StaticLedger } from "../../src/backends/memory/payload.ts";
import { PayloadBudgetExceeded, retentionContract } from "../../src/backends/payload.ts";
import { UnobservableState } from "../../src/core/errors.ts";
import { idempotencyKey } from "../../src/runtime/idempotency.ts";
import { RedisIdempotencyStore } from "../../src/runtime/redis_idempotency.ts";
import { redisPayloadKeys, RedisPayloadStore } from "../../src/runtime/redis_payload.ts";
import { RedisRuntimeStore } from "../../src/runtime/redis_store.ts";
import { openRuntimeStore } from "../../src/runtime/runtime_stores.ts";
import { SeededRandom } from "../support/random.ts";
import { type RedisServer, type RedisServerOptions, startRedisServer } from "../support/services.ts";

/** How long a command waits for its reply in these tests, in seconds. */
const TIMEOUT = 0.5;
const encoder = new TextEncoder();

async function withServer(
  body: (server: RedisServer) => Promise<void>,
  options: RedisServerOptions = {},
): Promise<void> {
  const server = await startRedisServer(options);
  try {
    await body(server);
  } finally {
    await server.stop();
  }
}

const contract = (obligations: readonly string[]) =>
  retentionContract({ ttlSeconds: 3600, horizonSeconds: 3600, durableRequired: true, obligations });

Deno.test("SIGSTOP of redis during a put (bytes stored, obligations being attached) makes the put Unknown, never a success; after SIGCONT the retried put lands and owes its reader", () =>
  withServer(async (server) => {
    const store = RedisPayloadStore.open(server.url, { commandTimeoutSeconds: TIMEOUT });
    const admin = new Redis(server.url);
    try {
      const data = new SeededRandom(7).bytes(4096);
      using schedule = new FaultSchedule(
        { [Barrier.payloadWriteAfter]: pause("redis-frozen") },
        { onCrash: throwSimulatedCrash },
      ).install();
      const put = store.put(data, "cam:e7", contract(["detector"]));
      const outcome = put.then(() => "succeeded", (error: unknown) => error);
      await schedule.untilFired(Barrier.payloadWriteAfter);
      server.pause();
      const started = performance.now();
      schedule.release("redis-frozen");
      const failure = await outcome;
      const waited = (performance.now() - started) / 1000;
      server.resume();
      assert.ok(failure instanceof UnobservableState, `the put's outcome is Unknown, got ${failure}`);
      assert.equal(failure.context.reason, "timeout");
      assert.ok(waited >= TIMEOUT * 0.9 && waited < TIMEOUT + 2, `answered after ${waited} s`);
      schedule.uninstall();

      const [key] = (await admin.keys("vf-blob-*")).filter((name) => !name.includes(":"));
      assert.ok(key !== undefined, "the bytes written before the freeze are on the server");
      const obligations = await admin.hgetall(redisPayloadKeys(key).obligations);
      const ttl = await admin.ttl(key);
      assert.ok(
        Object.keys(obligations).length === 0 ? ttl > 0 : ttl === -1,
        "the frozen attach either never landed (a TTL-only orphan) or landed whole (persistent)",
      );

      const ref = await store.put(data, "cam:e7", contract(["detector"]));
      assert.equal(ref.key, key, "the retry lands on the same object");
      const read = await store.read(ref);
      assert.equal(read.kind, "bytes");
      if (read.kind === "bytes") assert.deepEqual(read.data, data);
      assert.equal(await admin.ttl(key), -1, "an obligated object carries no TTL");
      const release = await store.releaseObligation(ref, "detector", "settle-7");
      assert.deepEqual([release.remaining, release.reclaimed], [0, true], "the detector owed it");
      assert.equal((await store.read(ref)).kind, "missing");
    } finally {
      server.resume();
      await store.close();
      await admin.quit();
    }
  }));

Deno.test("a frozen redis makes reads transient, releases unknown, the inventory and reconcile Unknown, and the ledger's reads and writes UnobservableState; all answer after SIGCONT", () =>
  withServer(async (server) => {
    const payloads = RedisPayloadStore.open(server.url, { commandTimeoutSeconds: TIMEOUT });
    const ledger = RedisRuntimeStore.open(server.url, { commandTimeoutSeconds: TIMEOUT });
    try {
      const data = encoder.encode("frame");
      const ref = await payloads.put(data, "cam:e1", contract(["detector", "tracker"]));
      assert.equal(await ledger.cas("k", null, encoder.encode("v1")), true);
      const before = await ledger.get("k");
      assert.equal(before.kind, "present");
      server.pause();
      assert.equal((await payloads.read(ref)).kind, "transient");
      const release = await payloads.releaseObligation(ref, "detector", "settle-1");
      assert.deepEqual([release.unknown, release.reclaimed, release.remaining], [true, false, null]);
      assert.equal((await payloads.inventory()).kind, "unknown");
      const reconciled = await payloads.reconcile(new StaticLedger({ [ref.key]: ["tracker"] }), "r-1");
      assert.deepEqual([reconciled.reclaimed, reconciled.retained, reconciled.unknown], [[], [], [ref.key]]);
      await assert.rejects(ledger.get("k"), UnobservableState);
      await assert.rejects(
        ledger.cas("k", before.kind === "present" ? before.version : null, encoder.encode("v2")),
        UnobservableState,
      );
      await assert.rejects(ledger.append("log", encoder.encode("r1")), UnobservableState);
      const durability = (await ledger.capabilities()).durable;
      assert.deepEqual([durability.kind, durability.kind === "unknown" && durability.reason], [
        "unknown",
        "timeout",
      ]);
      server.resume();

      const retry = await payloads.releaseObligation(ref, "detector", "settle-1");
      assert.deepEqual([retry.unknown, retry.reclaimed, retry.remaining], [false, false, 1], "released once");
      const after = await ledger.get("k");
      assert.equal(after.kind, "present");
      if (after.kind === "present" && before.kind === "present") {
        const took = new TextDecoder().decode(after.value) === "v2";
        assert.equal(after.version !== before.version, took, "a new version exactly when the write landed");
      }
      const entries = await ledger.logEntries("log");
      assert.ok(entries.length <= 1, "the unanswered append landed at most once");
    } finally {
      server.resume();
      await payloads.close();
      await ledger.close();
    }
  }));

Deno.test("durability is read back: append-only with noeviction is durable; no persistence is not; an evicting policy is evictable and not durable", async () => {
  const cases: [string[], boolean, boolean][] = [
    [[], true, false],
    [["--appendonly", "no"], false, false],
    [["--appendonly", "no", "--save", "3600 1"], true, false],
    [["--maxmemory-policy", "allkeys-lru"], false, true],
  ];
  for (const [args, durable, evictable] of cases) {
    await withServer(async (server) => {
      const ledger = RedisRuntimeStore.open(server.url);
      const payloads = RedisPayloadStore.open(server.url);
      try {
        const runtime = await ledger.capabilities();
        assert.deepEqual(
          [runtime.store, runtime.durable.kind, runtime.durable.kind === "known" && runtime.durable.value],
          ["redis", "known", durable],
          `ledger on ${args.join(" ") || "the defaults"}`,
        );
        const capabilities = await payloads.capabilities();
        assert.deepEqual(
          [capabilities.durable, capabilities.evictable, capabilities.atomicMultikey].map((o) =>
            o.kind === "known" && o.value
          ),
          [durable, evictable, true],
          `payload store on ${args.join(" ") || "the defaults"}`,
        );
        assert.equal(capabilities.maxObjectBytes, 512 * 1024 * 1024);
      } finally {
        await ledger.close();
        await payloads.close();
      }
    }, { args });
  }
});

Deno.test("story 44: a Redis whose ACL refuses CONFIG leaves durability Unknown('auth'), never assumed; the runtime over it is not durable-shared", () =>
  withServer(async (server) => {
    const admin = new Redis(server.url);
    await admin.acl("SETUSER", "app", "on", ">app-secret", "~*", "&*", "+@all", "-config");
    await admin.quit();
    const url = `redis://app:app-secret@127.0.0.1:${server.port}`;
    const ledger = RedisRuntimeStore.open(url);
    const payloads = RedisPayloadStore.open(url);
    try {
      assert.equal(await ledger.cas("k", null, encoder.encode("v")), true, "the user may write the ledger");
      const durable = (await ledger.capabilities()).durable;
      assert.deepEqual([durable.kind, durable.kind === "unknown" && durable.reason], ["unknown", "auth"]);
      const capabilities = await payloads.capabilities();
      for (const observation of [capabilities.durable, capabilities.evictable]) {
        assert.deepEqual(
          [observation.kind, observation.kind === "unknown" && observation.reason],
          ["unknown", "auth"],
        );
      }
      const runtime = new FlowRuntime({
        store: ledger,
        clock: new FakeClock(),
        flowId: "flow-A",
        runId: "run-1",
        node: "sink",
      });
      assert.equal(await runtime.durableShared(), false, "an unobservable ledger is not a durable one");
    } finally {
      await ledger.close();
      await payloads.close();
    }
  }));

Deno.test("a server out of memory under noeviction refuses a put with PayloadBudgetExceeded and keeps what it holds", () =>
  withServer(async (server) => {
    const admin = new Redis(server.url);
    const store = RedisPayloadStore.open(server.url);
    try {
      const random = new SeededRandom(44);
      const first = random.bytes(64 * 1024);
      const stored: [Awaited<ReturnType<typeof store.put>>, Uint8Array][] = [
        [await store.put(first, "cam:first", contract(["detector"])), first],
      ];
      const info = await admin.info("memory");
      const used = Number(/used_memory:(\d+)/.exec(info)?.[1]);
      await admin.config("SET", "maxmemory", String(used + 1024 * 1024));
      let refusal: unknown = null;
      for (let i = 0; i < 64 && refusal === null; i++) {
        const data = random.bytes(64 * 1024);
        try {
          stored.push([await store.put(data, `cam:e${i}`, contract(["detector"])), data]);
        } catch (error) {
          refusal = error;
        }
      }
      assert.ok(refusal instanceof PayloadBudgetExceeded, `the full server refused a put: ${refusal}`);
      assert.ok(stored.length > 8, `${stored.length} puts were admitted before the refusal`);
      for (const [ref, data] of stored) {
        const read = await store.read(ref);
        assert.equal(read.kind, "bytes", `${ref.key} is kept`);
        if (read.kind === "bytes") assert.deepEqual(read.data, data);
      }
    } finally {
      await store.close();
      await admin.quit();
    }
  }));

Deno.test("VF_RUNTIME_STORE_URL=redis://… opens the Redis ledger; racing compare-and-swaps from separate connections have exactly one winner", () =>
  withServer(async (server) => {
    const stores = [await openRuntimeStore(server.url), await openRuntimeStore(server.url)];
    try {
      assert.equal((await stores[0].capabilities()).store, "redis");
      assert.equal(await stores[0].cas("race", null, encoder.encode("0")), true);
      const start = await stores[1].get("race");
      assert.equal(start.kind, "present");
      const version = start.kind === "present" ? start.version : null;
      const wins = await Promise.all(
        Array.from({ length: 24 }, (_, i) => stores[i % 2].cas("race", version, encoder.encode(`w${i}`))),
      );
      assert.equal(wins.filter(Boolean).length, 1, "exactly one writer holding the version wins");
      const winner = wins.indexOf(true);
      const end = await stores[0].get("race");
      assert.equal(end.kind === "present" && new TextDecoder().decode(end.value), `w${winner}`);
      assert.equal(await stores[1].delete("race", version), false, "the old version deletes nothing");
      assert.equal(await stores[1].delete("race", null), true);
      assert.equal(await stores[0].cas("race", null, encoder.encode("again")), true);
      const again = await stores[0].get("race");
      assert.ok(
        again.kind === "present" && again.version !== version,
        "a recreated key never reuses a version",
      );
      assert.deepEqual(await stores[0].scan("ra"), [
        {
          key: "race",
          value: encoder.encode("again"),
          version: again.kind === "present" ? again.version : "",
        },
      ]);
      assert.deepEqual(await stores[0].scan("r*"), [], "a prefix is literal, never a pattern");
    } finally {
      for (const store of stores) await store.close();
    }
  }));

Deno.test("RedisIdempotencyStore keeps WIRE.md's vf-idem- markers for 24 h; of two marks exactly one is new", () =>
  withServer(async (server) => {
    const effects = RedisIdempotencyStore.open(server.url);
    const admin = new Redis(server.url);
    try {
      const key = idempotencyKey("flow-A", "sink", "745708c2eeaf98a60fdbebafe1d04eff");
      assert.match(key, /^vf-idem-[0-9a-f]{64}$/);
      assert.equal(await effects.seen(key), false);
      const marks = await Promise.all([effects.mark(key), effects.mark(key)]);
      assert.deepEqual(marks.sort(), [false, true]);
      assert.equal(await effects.seen(key), true);
      const ttl = await admin.ttl(key);
      assert.ok(ttl > 86_390 && ttl <= 86_400, `kept 24 h, TTL ${ttl}`);
    } finally {
      await effects.close();
      await admin.quit();
    }
  }));

Deno.test("a ledger and payloads read back durable survive a restart of redis-server, and the same store handles resume once it answers again", () =>
  withServer(async (server) => {
    const ledger = RedisRuntimeStore.open(server.url, { commandTimeoutSeconds: TIMEOUT });
    const payloads = RedisPayloadStore.open(server.url, { commandTimeoutSeconds: TIMEOUT });
    try {
      const durable = (await ledger.capabilities()).durable;
      assert.equal(durable.kind === "known" && durable.value, true);
      assert.equal(await ledger.cas("epoch", null, encoder.encode("1")), true);
      assert.equal(await ledger.append("terminal", encoder.encode("r1")), 1);
      const data = new SeededRandom(16).bytes(2048);
      const ref = await payloads.put(data, "cam:e16", contract(["detector"]));
      const before = await ledger.get("epoch");

      await server.restart();

      const after = await retrying(() => ledger.get("epoch"));
      assert.deepEqual(
        after,
        before,
        "the key, its bytes and its version came back from the append-only file",
      );
      assert.deepEqual(await ledger.logEntries("terminal"), [encoder.encode("r1")]);
      assert.equal(await ledger.append("terminal", encoder.encode("r2")), 2, "the log goes on where it was");
      const read = await payloads.read(ref);
      assert.equal(read.kind, "bytes");
      if (read.kind === "bytes") assert.deepEqual(read.data, data);
      const release = await payloads.releaseObligation(ref, "detector", "settle-16");
      assert.deepEqual([release.remaining, release.reclaimed], [0, true], "the obligation survived too");
    } finally {
      await ledger.close();
      await payloads.close();
    }
  }));

/** `call`'s answer once the server answers again: UnobservableState is retried for up to 10 s. */
async function retrying<T>(call: () => Promise<T>): Promise<T> {
  const limit = performance.now() + 10_000;
  for (;;) {
    try {
      return await call();
    } catch (error) {
      if (!(error instanceof UnobservableState) || performance.now() > limit) throw error;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}
