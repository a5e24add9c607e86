import assert from "node:assert/strict";
import { ByteSlab, copyBytes, writeAll } from "../../../src/core/bytes.ts";

Deno.test("a copy owns its buffer and keeps the bytes when the original changes", () => {
  const pooled = new Uint8Array(16).subarray(4, 7);
  pooled.set([1, 2, 3]);
  const copy = copyBytes(pooled);
  pooled.fill(0);
  assert.deepEqual([...copy], [1, 2, 3]);
  assert.equal(copy.byteOffset, 0);
  assert.equal(copy.buffer.byteLength, 3);
});

Deno.test("a slab hands out disjoint zeroed pieces, a new slab when full, and large arrays of their own", () => {
  const slab = new ByteSlab(8, 20);
  const pieces = [slab.take(8), slab.take(8), slab.take(8), slab.take(3)];
  for (const piece of pieces) assert.ok(piece.every((byte) => byte === 0), "a piece starts zeroed");
  pieces.forEach((piece, i) => piece.fill(i + 1));
  assert.deepEqual(
    pieces.map((piece) => [...new Set(piece)]),
    [[1], [2], [3], [4]],
    "no piece overlaps another",
  );
  assert.equal(pieces[0].buffer, pieces[1].buffer, "the first two share one slab");
  assert.notEqual(pieces[1].buffer, pieces[2].buffer, "the third did not fit: a new slab");
  assert.equal(pieces[2].buffer, pieces[3].buffer);
  const large = slab.take(9);
  assert.equal(large.byteOffset, 0);
  assert.equal(large.buffer.byteLength, 9, "above the piece limit, an array that spans its own buffer");
  assert.notEqual(slab.take(1).buffer, large.buffer);
});

Deno.test("writeAll writes every byte to a writer that takes a few at a time", async () => {
  const taken: number[] = [];
  const writer = {
    write(bytes: Uint8Array): Promise<number> {
      const n = Math.min(3, bytes.length);
      taken.push(...bytes.subarray(0, n));
      return Promise.resolve(n);
    },
  };
  await writeAll(writer, Uint8Array.from({ length: 10 }, (_, i) => i));
  assert.deepEqual(taken, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
});
