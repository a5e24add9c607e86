import assert from "node:assert/strict";
import { IN_NODE_BOARD_MAX_BYTES, InNodeBoard } from "../../../src/runtime/in_node_board.ts";

Deno.test("an in-node board reads what was last written, and nothing once the node returned", () => {
  const board = InNodeBoard.create();
  assert.deepEqual(board.read(), []);
  board.write(["a".repeat(64), "b".repeat(64)]);
  assert.deepEqual(board.read(), ["a".repeat(64), "b".repeat(64)]);
  board.write([]);
  assert.deepEqual(board.read(), []);
});

Deno.test("an in-node board grows for long ids, keeps non-ASCII ids whole, and refuses what cannot fit", () => {
  const board = InNodeBoard.create();
  const ids = Array.from({ length: 200 }, (_, i) => `é-${i}-${"x".repeat(60)}`);
  board.write(ids);
  assert.deepEqual(board.read(), ids);
  assert.ok(board.buffer.byteLength > 1024);
  assert.throws(() => board.write(["y".repeat(IN_NODE_BOARD_MAX_BYTES)]), RangeError);
  assert.deepEqual(board.read(), ids, "a refused write leaves the last one readable");
});

Deno.test("an in-node board whose writer stopped in the middle of a write reads as nothing inside the node", () => {
  const board = InNodeBoard.create();
  board.write(["held"]);
  const version = new Int32Array(board.buffer, 0, 1);
  Atomics.add(version, 0, 1);
  assert.deepEqual(board.read(), []);
});

Deno.test("an in-node board is shared with a Worker: what the Worker wrote before it exited is read after", async () => {
  const board = InNodeBoard.create();
  const source = `
    import { InNodeBoard } from ${
    JSON.stringify(new URL("../../../src/runtime/in_node_board.ts", import.meta.url).href)
  };
    self.onmessage = (event) => {
      const board = InNodeBoard.over(event.data);
      board.write(Array.from({ length: 100 }, (_, i) => "id-" + i + "-" + "z".repeat(40)));
      self.postMessage("written");
      Deno.exit(3);
    };`;
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  const worker = new Worker(url, { type: "module" });
  try {
    const written = new Promise((resolve) => (worker.onmessage = resolve));
    worker.postMessage(board.buffer);
    await written;
  } finally {
    worker.terminate();
    URL.revokeObjectURL(url);
  }
  const ids = board.read();
  assert.equal(ids.length, 100);
  assert.equal(ids[99], "id-99-" + "z".repeat(40));
});

Deno.test("an in-node board refuses a buffer that is not one", () => {
  assert.throws(() => InNodeBoard.over(new SharedArrayBuffer(64)), TypeError);
});
