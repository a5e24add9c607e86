/**
 * The PayloadStore conformance stories against the Redis payload store, on a real `redis-server`
 * (append-only file on, noeviction: the durable tier) started for this file on a free loopback port. The
 * store runs on a FakeClock (deadlines, put times, the orphan grace), the server's own TTLs on real time;
 * the database is flushed before each story. The misbehaviour hooks act on the server itself: a byte of the
 * stored value flipped (SETRANGE), the object's keys deleted, the obligation set's hash deleted.
 *
 * The evictable tier is not played here (this server does not evict), and the byte-budget stories are
 * ignored: Redis admits a write while `used_memory` is at most `maxmemory`, counting its own overhead, and
 * refuses only the next one, so no `maxmemory` makes a 1000-byte budget refuse the second 600-byte put.
 * The refusal itself (OOM → PayloadBudgetExceeded) is proved in tests/integration/redis_payload_test.ts.
 *
 * @module
 */

import { Buffer } from "node:buffer";
import { Redis } from "ioredis";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { DEFAULT_ORPHAN_GRACE_SECONDS } from "../../../src/backends/memory/payload.ts";
import { redisPayloadKeys, RedisPayloadStore } from "../../../src/runtime/redis_payload.ts";
import { startRedisServer } from "../../support/services.ts";
import { payloadScenarios } from "./scenarios.ts";

const server = await startRedisServer();
globalThis.addEventListener("unload", () => server.killNow());

payloadScenarios({
  name: "redis",
  tiers: ["durable"],
  orphanGraceSeconds: DEFAULT_ORPHAN_GRACE_SECONDS,
  byteBudget:
    "Redis counts its own overhead in maxmemory and refuses only the write after the one that crossed it",
  create: async ({ forwardUnchanged }) => {
    const admin = new Redis(server.url);
    await admin.flushdb();
    const clock = new FakeClock();
    const store = RedisPayloadStore.open(server.url, { clock, forwardUnchanged });
    return {
      store,
      now: () => clock.now(),
      advance: (seconds) => clock.advanceAsync(seconds),
      async corrupt(key) {
        const [first] = await admin.getrangeBuffer(key, 0, 0);
        await admin.setrange(key, 0, Buffer.from([(first ?? 0) ^ 0xff]));
      },
      async remove(key) {
        const keys = redisPayloadKeys(key);
        await admin.del(keys.bytes, keys.meta, keys.obligations);
      },
      async expireObligationSet(key) {
        await admin.del(redisPayloadKeys(key).obligations);
      },
      async dispose() {
        await store.close();
        await admin.quit();
      },
    };
  },
});
