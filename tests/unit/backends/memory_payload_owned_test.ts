/**
 * The memory payload store's host-facing `putOwned` beside `put`, and `read`: `putOwned` keeps the very
 * array it is given (the embedded broker's bytes arrive in a frame of their own, moved or deserialized),
 * `put` keeps a copy, and every read hands out a fresh copy of its own; the store's decisions (digests,
 * corruption) are the same either way.
 *
 * @module
 */

import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { MemoryPayloadStore } from "../../../src/backends/memory/payload.ts";
import { payloadDigest, retentionContract } from "../../../src/backends/payload.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const CONTRACT = retentionContract({ ttlSeconds: 60, horizonSeconds: 60, durableRequired: false });

/** Whether `bytes` are a plain array spanning an ArrayBuffer of their own. */
function ownPlain(bytes: Uint8Array): boolean {
  return bytes.buffer instanceof ArrayBuffer && bytes.byteOffset === 0 &&
    bytes.byteLength === bytes.buffer.byteLength;
}

Deno.test("putOwned keeps the very array it is given where put keeps a copy: a later write to the owned array makes reads corrupt, one to put's array changes nothing", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const bytes = random.bytes(random.int(1, 20_000));
  const store = new MemoryPayloadStore({ clock: new FakeClock() });
  const owned = bytes.slice();
  const ownedRef = await store.putOwned(owned, "cam:owned", CONTRACT);
  const copied = bytes.slice();
  const copiedRef = await store.put(copied, "cam:copied", CONTRACT);
  assert.equal(ownedRef.digest, copiedRef.digest, `seed ${seed}: the same bytes, the same digest`);
  for (const ref of [ownedRef, copiedRef]) {
    const read = await store.read(ref);
    assert.ok(read.kind === "bytes" && read.digestVerified, `seed ${seed}: ${ref.key} reads as stored`);
    assert.deepEqual(read.data, bytes, `seed ${seed}: the bytes as put`);
  }

  const at = random.int(0, bytes.byteLength - 1);
  copied[at] ^= 0xff;
  const intact = await store.read(copiedRef);
  assert.ok(intact.kind === "bytes" && intact.digestVerified, `seed ${seed}: put stored a copy of its own`);
  assert.deepEqual(intact.data, bytes, `seed ${seed}: the caller's write never reached the store`);

  owned[at] ^= 0xff;
  const rotten = await store.read(ownedRef);
  assert.ok(rotten.kind === "corrupt", `seed ${seed}: the owned array is the stored one, so the write shows`);
  assert.deepEqual(
    [rotten.expectedDigest, rotten.actualDigest],
    [ownedRef.digest, payloadDigest(owned)],
    `seed ${seed}: the digest of the bytes as put against that of the array as it is now`,
  );
});

Deno.test("read always hands out a fresh copy of its own, whether the object came from putOwned or put", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const store = new MemoryPayloadStore({ clock: new FakeClock() });
  for (const how of ["putOwned", "put"] as const) {
    const bytes = random.bytes(random.int(0, 20_000));
    const given = bytes.slice();
    const ref = await store[how](given, `cam:${how}`, CONTRACT);
    const first = await store.read(ref);
    const second = await store.read(ref);
    assert.ok(first.kind === "bytes" && second.kind === "bytes", `seed ${seed}, ${how}`);
    assert.ok(
      first.data !== given && second.data !== given && first.data.buffer !== second.data.buffer,
      `seed ${seed}, ${how}: each read is a distinct array, never the one the store keeps`,
    );
    assert.ok(
      ownPlain(first.data) && ownPlain(second.data),
      `seed ${seed}, ${how}: each spans its own buffer`,
    );
    assert.deepEqual(first.data, bytes, `seed ${seed}, ${how}`);
    first.data.fill(0xa5);
    assert.deepEqual(second.data, bytes, `seed ${seed}, ${how}: a reader's write reaches no other reader`);
    const third = await store.read(ref);
    assert.ok(
      third.kind === "bytes" && third.digestVerified,
      `seed ${seed}, ${how}: a reader's write never reaches the store`,
    );
    assert.deepEqual(third.data, bytes, `seed ${seed}, ${how}`);
  }
});

Deno.test("a corrupted object reads as corrupt, never as bytes, whether it came from putOwned or put", async () => {
  const store = new MemoryPayloadStore({ clock: new FakeClock() });
  for (const how of ["putOwned", "put"] as const) {
    const ref = await store[how](new Uint8Array(64).fill(9), `cam:rot-${how}`, CONTRACT);
    store.corrupt(ref.key);
    const outcome = await store.read(ref);
    assert.equal(outcome.kind, "corrupt", how);
  }
});

Deno.test("put keeps a copy of a pooled Node Buffer: the caller reusing the pool changes nothing stored", async () => {
  const store = new MemoryPayloadStore({ clock: new FakeClock() });
  const pooled = Buffer.from("a small frame from the shared pool");
  const ref = await store.put(pooled, "cam:pooled", CONTRACT);
  pooled.fill(0x21);
  const read = await store.read(ref);
  assert.ok(read.kind === "bytes", `read ${read.kind}`);
  assert.equal(new TextDecoder().decode(read.data), "a small frame from the shared pool");
});
