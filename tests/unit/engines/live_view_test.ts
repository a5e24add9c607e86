import assert from "node:assert/strict";
import {
  LiveView,
  type NodeSnapshot,
  rates,
  renderLines,
  renderSummary,
  renderTable,
} from "../../../src/engines/live_view.ts";

function snap(node: string, processed: number, extra: Partial<NodeSnapshot> = {}): NodeSnapshot {
  return {
    node,
    state: "running",
    replicasRunning: 1,
    replicas: 1,
    processed,
    failed: 0,
    inFlight: 0,
    drops: {},
    deadLetters: 0,
    restarts: 0,
    ...extra,
  };
}

Deno.test("rates are items per second between two snapshots, never negative", () => {
  const r = rates([snap("a", 10), snap("b", 5)], [snap("a", 30), snap("b", 4), snap("c", 8)], 2);
  assert.deepEqual([...r], [["a", 10], ["b", 0], ["c", 4]]);
  assert.equal(rates([], [snap("a", 3)], 0).get("a"), 0);
});

Deno.test("the table aligns columns and shows an unreadable in-flight count as ?, not 0", () => {
  const lines = renderTable(
    [
      snap("count", 120, { replicas: 2, replicasRunning: 2 }),
      snap("sink", 7, { inFlight: null, drops: { join_evicted: 2 } }),
    ],
    new Map([["count", 45.25], ["sink", 150]]),
  );
  assert.equal(
    lines[0],
    "node   state    replicas  processed  rate    in flight  drops           dlq  restarts",
  );
  assert.equal(lines[1], "count  running  2/2       120        45.3/s  0          0               0    0");
  assert.equal(lines[2], "sink   running  1/1       7          150/s   ?          join_evicted 2  0    0");
});

Deno.test("plain lines carry the elapsed time and every counter of each node", () => {
  const [line] = renderLines(
    12,
    [snap("square", 120, { deadLetters: 3, restarts: 1 })],
    new Map([["square", 4]]),
  );
  assert.equal(line, "[12.0s] square running 1/1 processed 120 (4.0/s) in flight 0 drops 0 dlq 3 restarts 1");
});

Deno.test("on a terminal the table is redrawn in place; elsewhere lines are appended", () => {
  const written: string[] = [];
  const tty = new LiveView({ isTerminal: true, write: (t) => written.push(t) }, 0);
  tty.update(1, [snap("a", 1)]);
  tty.update(2, [snap("a", 3)]);
  assert.ok(!written[0].includes("\x1b[2A"));
  assert.ok(written[1].startsWith("\x1b[2A"), "second draw moves up over the 2 drawn lines");
  tty.event("node a restarted");
  assert.ok(written[2].endsWith("node a restarted\n"));
  const plain: string[] = [];
  const pipe = new LiveView({ isTerminal: false, write: (t) => plain.push(t) }, 0);
  pipe.update(1.5, [snap("a", 2)]);
  assert.equal(plain[0], "[1.5s] a running 1/1 processed 2 (0.0/s) in flight 0 drops 0 dlq 0 restarts 0\n");
  assert.ok(!plain[0].includes("\x1b["));
});

Deno.test("the summary ends with the outcome and the elapsed time", () => {
  const lines = renderSummary(4, [snap("a", 40, { state: "done" })], "flow squares finished");
  assert.equal(lines.at(-1), "flow squares finished in 4.0s");
  assert.ok(lines[1].includes("10.0/s"));
});

Deno.test("the summary's notes stand between the table and the outcome", () => {
  const lines = renderSummary(4, [snap("a", 40, { state: "done" })], "flow squares finished", ["a note"]);
  assert.deepEqual(lines.slice(-2), ["a note", "flow squares finished in 4.0s"]);
});
