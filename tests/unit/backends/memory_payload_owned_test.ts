/**
 * The memory payload store's two host-facing variants, `putOwned` and `readSharable`, beside `put` and
 * `read`: which bytes each keeps or hands out, and that the store's decisions (digests, corruption) are
 * the same either way.
 *
 * @module
 */

import assert from "node:assert/strict";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { MemoryPayloadStore } from "../../../src/backends/memory/payload.ts";
import { retentionContract } from "../../../src/backends/payload.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const CONTRACT = retentionContract({ ttlSeconds: 60, horizonSeconds: 60, durableRequired: false });

function shared(bytes: Uint8Array): Uint8Array {
  const out = new Uint8Array(new SharedArrayBuffer(bytes.byteLength));
  out.set(bytes);
  return out;
}

Deno.test("putOwned keeps the very bytes it is given where put keeps a copy; both store the same object", async () => {
  const seed = testSeed();
  const bytes = new SeededRandom(seed).bytes(5000);
  const store = new MemoryPayloadStore({ clock: new FakeClock() });
  const owned = shared(bytes);
  const ownedRef = await store.putOwned(owned, "cam:owned", CONTRACT);
  const copied = shared(bytes);
  const copiedRef = await store.put(copied, "cam:copied", CONTRACT);
  assert.equal(ownedRef.digest, copiedRef.digest, `seed ${seed}: the same bytes, the same digest`);
  const keptOwned = await store.readSharable(ownedRef);
  assert.ok(keptOwned.kind === "bytes" && keptOwned.data === owned, "the owned bytes are the stored ones");
  const keptCopy = await store.readSharable(copiedRef);
  assert.ok(keptCopy.kind === "bytes" && keptCopy.data !== copied, "put stored a copy of its own");
  copied.fill(0);
  const unaffected = await store.read(copiedRef);
  assert.ok(unaffected.kind === "bytes" && unaffected.data.every((b, i) => b === bytes[i]), `seed ${seed}`);
});

Deno.test("readSharable hands out shared stored bytes as they are and copies bytes in an ordinary buffer; read always copies", async () => {
  const store = new MemoryPayloadStore({ clock: new FakeClock() });
  const inShared = shared(new Uint8Array([1, 2, 3, 4, 5]));
  const plain = new Uint8Array([6, 7, 8]);
  const sharedRef = await store.putOwned(inShared, "cam:shared", CONTRACT);
  const plainRef = await store.putOwned(plain, "cam:plain", CONTRACT);
  const fromShared = await store.readSharable(sharedRef);
  assert.ok(fromShared.kind === "bytes" && fromShared.data === inShared && fromShared.digestVerified);
  const fromPlain = await store.readSharable(plainRef);
  assert.ok(
    fromPlain.kind === "bytes" && fromPlain.data !== plain,
    "ordinary bytes are copied for the reader",
  );
  assert.deepEqual([...fromPlain.data], [6, 7, 8]);
  const read = await store.read(sharedRef);
  assert.ok(
    read.kind === "bytes" && read.data !== inShared && !(read.data.buffer instanceof SharedArrayBuffer),
  );
  assert.deepEqual([...read.data], [1, 2, 3, 4, 5]);
});

Deno.test("a corrupted object reads as corrupt through readSharable too, never as bytes", async () => {
  const store = new MemoryPayloadStore({ clock: new FakeClock() });
  const ref = await store.putOwned(shared(new Uint8Array(64).fill(9)), "cam:rot", CONTRACT);
  store.corrupt(ref.key);
  const outcome = await store.readSharable(ref);
  assert.equal(outcome.kind, "corrupt");
});
