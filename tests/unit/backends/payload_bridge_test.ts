/**
 * The payload bridge: the inline threshold and offload rule the codec applies, and the BlobStore façade
 * that turns puts into obligation-keeping contracts and typed read outcomes into ladder errors.
 */
import assert from "node:assert/strict";
import { blobReaderIds, NodeSpec } from "../../../src/core/compiler.ts";
import { ConfigError, DecodeError, POISON, TRANSIENT, TransientFailure } from "../../../src/core/errors.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { MemoryPayloadStore } from "../../../src/backends/memory/payload.ts";
import type { PayloadStore, RetentionContract } from "../../../src/backends/payload.ts";
import {
  BATCH_BLOB_TTL_SECONDS,
  type BlobStore,
  DEFAULT_MAX_INLINE_PAYLOAD_BYTES,
  fetchOffloaded,
  MAX_INLINE_PAYLOAD_ENV,
  maxInlinePayloadBytes,
  offloadPayload,
  PayloadStoreBlobBridge,
  type PayloadStoreBlobBridgeOptions,
  readerObligationId,
  REALTIME_BLOB_TTL_SECONDS,
} from "../../../src/backends/payload_bridge.ts";
import { BlobRef } from "../../../src/wire/value.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const FRAME = "videoflow.v1.Frame";

/** A BlobStore that keeps bytes in a map and records how it was called. */
class RecordingBlobStore implements BlobStore {
  readonly calls: string[] = [];
  readonly #blobs = new Map<string, Uint8Array>();

  put(data: Uint8Array, ttlSeconds = REALTIME_BLOB_TTL_SECONDS): Promise<string> {
    return Promise.resolve(this.#keep(data, `put ttl=${ttlSeconds}`));
  }

  putWithReaders(data: Uint8Array, readers: number, ttlSeconds = REALTIME_BLOB_TTL_SECONDS): Promise<string> {
    return Promise.resolve(this.#keep(data, `putWithReaders readers=${readers} ttl=${ttlSeconds}`));
  }

  get(key: string): Promise<Uint8Array> {
    const data = this.#blobs.get(key);
    return data === undefined ? Promise.reject(new DecodeError(`no ${key}`)) : Promise.resolve(data);
  }

  release(key: string): Promise<void> {
    this.calls.push(`release ${key}`);
    return Promise.resolve();
  }

  #keep(data: Uint8Array, call: string): string {
    const key = `blob-${this.#blobs.size}`;
    this.#blobs.set(key, data.slice());
    this.calls.push(call);
    return key;
  }
}

/** A memory store whose puts record the contract they were given. */
function recording(store: MemoryPayloadStore, contracts: RetentionContract[]): PayloadStore {
  return new Proxy(store, {
    get(target, property) {
      if (property === "put") {
        return (data: Uint8Array, contentId: string, contract: RetentionContract) => {
          contracts.push(contract);
          return target.put(data, contentId, contract);
        };
      }
      const value = Reflect.get(target, property);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

function bridgeOver(
  store: PayloadStore,
  options: Partial<PayloadStoreBlobBridgeOptions> = {},
): PayloadStoreBlobBridge {
  return new PayloadStoreBlobBridge(store, {
    obligations: ["detector", "crop/p0"],
    horizonSeconds: 3600,
    durableRequired: true,
    contentId: () => "cam:e1",
    ...options,
  });
}

Deno.test("the inline threshold is 512 KiB unless VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES sets a whole number", () => {
  assert.equal(MAX_INLINE_PAYLOAD_ENV, "VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES");
  assert.equal(DEFAULT_MAX_INLINE_PAYLOAD_BYTES, 524288);
  assert.equal(maxInlinePayloadBytes({}), 524288);
  assert.equal(maxInlinePayloadBytes({ [MAX_INLINE_PAYLOAD_ENV]: "" }), 524288);
  assert.equal(maxInlinePayloadBytes({ [MAX_INLINE_PAYLOAD_ENV]: "1024" }), 1024);
  assert.equal(maxInlinePayloadBytes({ [MAX_INLINE_PAYLOAD_ENV]: "0" }), 0);
  for (const bad of ["-1", "1.5", "1e3", "lots", "99999999999999999999"]) {
    assert.throws(() => maxInlinePayloadBytes({ [MAX_INLINE_PAYLOAD_ENV]: bad }), ConfigError, bad);
  }
  assert.deepEqual([REALTIME_BLOB_TTL_SECONDS, BATCH_BLOB_TTL_SECONDS], [3600, 86400]);
});

Deno.test("a payload at the threshold stays inline and needs no store; one byte more leaves the envelope", async () => {
  assert.equal(await offloadPayload(FRAME, new Uint8Array(DEFAULT_MAX_INLINE_PAYLOAD_BYTES), null), null);
  const store = new RecordingBlobStore();
  const data = new SeededRandom(1).bytes(DEFAULT_MAX_INLINE_PAYLOAD_BYTES + 1);
  const ref = await offloadPayload(FRAME, data, store);
  assert.ok(ref instanceof BlobRef);
  assert.deepEqual([ref.ref, ref.innerPayloadType, ref.size], ["blob-0", FRAME, data.length]);
  assert.deepEqual(store.calls, ["put ttl=3600"]);
  assert.deepEqual(await fetchOffloaded(ref, store), data);
});

Deno.test("with no blob store configured an oversized publish fails with a clear ConfigError", async () => {
  await assert.rejects(
    offloadPayload(FRAME, new Uint8Array(11), null, { maxInlineBytes: 10 }),
    (error: unknown) => {
      assert.ok(error instanceof ConfigError);
      assert.match(
        error.message,
        /11 bytes exceeds the 10-byte inline limit and no blob store is configured/,
      );
      assert.match(error.remedy ?? "", /VIDEOFLOW_MAX_INLINE_PAYLOAD_BYTES/);
      assert.deepEqual(error.context, { payload_type: FRAME, size: 11, max_inline_bytes: 10 });
      return true;
    },
  );
  await assert.rejects(fetchOffloaded(new BlobRef("k", FRAME, 11), null), ConfigError);
});

Deno.test("offload passes the RFC 0002 reader count and TTL through, and fetch checks the recorded size", async () => {
  const store = new RecordingBlobStore();
  const data = new Uint8Array(20);
  const ref = await offloadPayload(FRAME, data, store, { maxInlineBytes: 10, readers: 3, ttlSeconds: 86400 });
  assert.deepEqual(store.calls, ["putWithReaders readers=3 ttl=86400"]);
  assert.deepEqual(await fetchOffloaded(new BlobRef(ref!.ref, FRAME, 20n), store), data);
  await assert.rejects(fetchOffloaded(new BlobRef(ref!.ref, FRAME, 21), store), (error: unknown) => {
    assert.ok(error instanceof DecodeError);
    assert.deepEqual([error.context.ref, error.context.reason], [ref!.ref, "size"]);
    return true;
  });
});

Deno.test("a bridge put acquires every reader obligation and the send's intent, and keeps the last ref", async () => {
  const clock = new FakeClock();
  const memory = new MemoryPayloadStore({ clock });
  const contracts: RetentionContract[] = [];
  let published = 0;
  let identified = 0;
  const store = recording(memory, contracts);
  const bridge = bridgeOver(store, {
    contentId: () => `cam:e${++identified}`,
    intent: () => `intent/cam:1:${++published}`,
  });
  const lastRef = () => bridge.lastRef;
  assert.equal(lastRef(), null);
  const key = await bridge.put(new Uint8Array([1, 2, 3]), 60);
  assert.deepEqual(contracts[0], {
    ttlSeconds: 60,
    horizonSeconds: 3600,
    durableRequired: true,
    obligations: ["detector", "crop/p0", "intent/cam:1:1"],
  });
  assert.equal(lastRef()?.key, key);
  assert.equal(lastRef()?.contentId, "cam:e1", "the content id is read at put time");
  const deadlines = memory.obligations(key);
  assert.deepEqual([...deadlines.keys()], ["detector", "crop/p0", "intent/cam:1:1"]);
  assert.equal(deadlines.get("detector"), clock.now() + 3600, "pinned for the horizon");
  const second = await bridge.putWithReaders(new Uint8Array([4]), 99, 120);
  assert.deepEqual(
    contracts[1].obligations,
    ["detector", "crop/p0", "intent/cam:1:2"],
    "the count means nothing",
  );
  assert.equal(contracts[1].ttlSeconds, 120);
  assert.equal(lastRef()?.key, second);
  assert.equal(lastRef()?.contentId, "cam:e2");
  assert.equal(bridge.store, store);
});

Deno.test("ENV-12: a bridge without reader ids stores TTL-only objects, not even the intent", async () => {
  const clock = new FakeClock();
  const memory = new MemoryPayloadStore({ clock });
  const bridge = bridgeOver(memory, { obligations: [], intent: () => "intent/cam:1:1" });
  const key = await bridge.put(new Uint8Array([1]), 30);
  assert.equal(memory.obligations(key).size, 0);
  clock.advance(30);
  await assert.rejects(bridge.get(key), DecodeError, "the TTL is the only bound");
});

Deno.test("a bridge with no intent acquires the readers only; a repeated reader id is refused", async () => {
  const memory = new MemoryPayloadStore({ clock: new FakeClock() });
  const key = await bridgeOver(memory, { intent: () => null }).put(new Uint8Array([1]));
  assert.deepEqual([...memory.obligations(key).keys()], ["detector", "crop/p0"]);
  assert.throws(() => bridgeOver(memory, { obligations: ["detector", "detector"] }), ConfigError);
  assert.throws(() => bridgeOver(memory, { obligations: [""] }), ConfigError);
});

Deno.test("bridge get maps the read outcomes: bytes, TransientFailure to retry, DecodeError for missing or corrupt", async () => {
  const memory = new MemoryPayloadStore({ clock: new FakeClock() });
  const bridge = bridgeOver(memory);
  const data = new SeededRandom(7).bytes(64);
  const key = await bridge.put(data);
  assert.deepEqual(await bridge.get(key), data);
  memory.failReads(["timeout"]);
  await assert.rejects(bridge.get(key), (error: unknown) => {
    assert.ok(error instanceof TransientFailure);
    assert.equal(error.disposition, TRANSIENT);
    assert.deepEqual(error.context, { ref: key, reason: "transient", detail: "timeout" });
    return true;
  });
  memory.corrupt(key);
  await assert.rejects(bridge.get(key), (error: unknown) => {
    assert.ok(error instanceof DecodeError);
    assert.equal(error.disposition, POISON);
    assert.equal(error.code, "VF_POISON_DECODE");
    assert.equal(error.context.reason, "corrupt");
    assert.match(error.message, new RegExp(key));
    return true;
  });
  await assert.rejects(bridge.get("vf-blob-never-stored"), (error: unknown) => {
    assert.ok(error instanceof DecodeError);
    assert.deepEqual(error.context, { ref: "vf-blob-never-stored", reason: "missing" });
    return true;
  });
});

Deno.test("bridge release is a no-op; readers release by id and the last one reclaims", async () => {
  const memory = new MemoryPayloadStore({ clock: new FakeClock() });
  const bridge = bridgeOver(memory, { obligations: ["detector", "crop/p0", "crop/p1"] });
  const key = await bridge.put(new Uint8Array([1, 2]));
  await bridge.release(key);
  assert.equal(memory.obligations(key).size, 3, "release(key) leaves every obligation in place");
  assert.equal((await bridge.releaseReader(key, readerObligationId("detector", null), "s1")).remaining, 2);
  assert.equal((await bridge.releaseReader(key, readerObligationId("crop", 0), "s2")).remaining, 1);
  const last = await bridge.releaseReader(key, readerObligationId("crop", 1), "s3");
  assert.deepEqual([last.remaining, last.reclaimed], [0, true]);
  await assert.rejects(bridge.get(key), DecodeError);
});

Deno.test("readerObligationId names readers as the compiler's blobReaderIds lists them", () => {
  const shared = { nodeClass: "file:///f.ts#C", params: {}, hasChildren: false, isFinite: true } as const;
  const root = new NodeSpec({
    ...shared,
    name: "root",
    parents: [],
    kind: "producer",
    nbTasks: 1,
    deviceType: "cpu",
  });
  const children = ([["competing", 3, null], ["keyed", 3, "camera"], ["single", 1, "camera"]] as const).map(
    ([name, nbTasks, partitionBy]) =>
      new NodeSpec({
        ...shared,
        name,
        parents: ["root"],
        kind: "processor",
        nbTasks,
        deviceType: "cpu",
        partitionBy,
      }),
  );
  const named = children.flatMap((child) =>
    child.isPartitioned
      ? Array.from({ length: child.nbTasks }, (_, i) => readerObligationId(child.name, i))
      : [readerObligationId(child.name, null)]
  );
  assert.deepEqual(named, blobReaderIds(root, [root, ...children]));
  assert.throws(() => readerObligationId("", null), ConfigError);
  assert.throws(() => readerObligationId("keyed", -1), ConfigError);
  assert.throws(() => readerObligationId("keyed", 0.5), ConfigError);
});

Deno.test("randomized: whatever the size and threshold, offload and fetch give back the payload unchanged", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const memory = new MemoryPayloadStore({ clock: new FakeClock() });
  let n = 0;
  const bridge = bridgeOver(memory, { contentId: () => `cam:e${n}` });
  for (let round = 0; round < 200; round++) {
    n = round;
    const threshold = random.int(0, 64);
    const data = random.bytes(random.int(0, 128));
    const ref = await offloadPayload(FRAME, data, bridge, { maxInlineBytes: threshold });
    assert.equal(
      ref === null,
      data.length <= threshold,
      `seed ${seed}, round ${round}: inline iff at most ${threshold}`,
    );
    if (ref !== null) {
      assert.deepEqual(await fetchOffloaded(ref, bridge), data, `seed ${seed}, round ${round}`);
    }
  }
});

Deno.test("offload records the payload's size even when the store takes the bytes away (a transferred put)", async () => {
  const taken: Uint8Array[] = [];
  const transferring: BlobStore = {
    put(data) {
      const copy = data.slice();
      structuredClone(data.buffer, { transfer: [data.buffer as ArrayBuffer] });
      taken.push(copy);
      return Promise.resolve("vf-blob-moved");
    },
    putWithReaders(data, _readers, ttl) {
      return this.put(data, ttl);
    },
    get: () => Promise.resolve(taken[0]),
    release: () => Promise.resolve(),
  };
  const data = new Uint8Array(DEFAULT_MAX_INLINE_PAYLOAD_BYTES + 10).fill(7);
  const ref = await offloadPayload(FRAME, data, transferring);
  assert.equal(data.length, 0, "the put moved the bytes out of the caller's buffer");
  assert.equal(ref?.size, DEFAULT_MAX_INLINE_PAYLOAD_BYTES + 10);
  assert.deepEqual(await fetchOffloaded(ref!, transferring), taken[0]);
});
