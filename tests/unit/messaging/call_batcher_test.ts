/**
 * The call batcher a messenger sends its publications and settlements through.
 *
 * @module
 */

import assert from "node:assert/strict";
import { CallBatcher } from "../../../src/messaging/call_batcher.ts";

Deno.test("a call batcher sends the calls of one turn as one batch and answers each with its own entry", async () => {
  const batches: number[][] = [];
  const batcher = new CallBatcher<number, string>((inputs) => {
    batches.push([...inputs]);
    return Promise.resolve(inputs.map((n) => `#${n}`));
  }, 3);
  const answers = await Promise.all([1, 2, 3, 4, 5].map((n) => batcher.call(n)));
  assert.deepEqual(answers, ["#1", "#2", "#3", "#4", "#5"]);
  assert.deepEqual(batches, [[1, 2, 3], [4, 5]], "at most maxEntries per batch, in order");
  const failing = new CallBatcher<number, string>(() => Promise.reject(new Error("down")), 8);
  await assert.rejects(Promise.all([failing.call(1), failing.call(2)]), /down/);
});
