import assert from "node:assert/strict";
import {
  LiveView,
  type NodeSnapshot,
  rates,
  renderLines,
  renderSummary,
  renderTable,
  tableRows,
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
    dropsUncounted: false,
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

Deno.test("drops a broker cannot count are shown as ?, beside the counted ones, never as 0", () => {
  const uncounted = snap("compare", 6, { dropsUncounted: true });
  const counted = snap("moments", 3, { dropsUncounted: true, drops: { join_evicted: 2 } });
  const rows = tableRows([uncounted, counted], new Map());
  assert.equal(rows[1][6], "evicted ?");
  assert.equal(rows[2][6], "join_evicted 2, evicted ?");
  assert.equal(tableRows([counted], new Map(), false)[1][6], "2+?");
  assert.match(renderLines(1, [uncounted], new Map())[0], / drops evicted \? dlq /);
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

/** A busy flow: long node names, drops of several reasons, a restarting node, counts in the thousands. */
function busyFlow(): NodeSnapshot[] {
  return [
    snap("camera-entrance-north-01", 123456, { replicas: 1, replicasRunning: 1 }),
    snap("person-detector-yolov8-large", 98765, {
      state: "restarting",
      replicas: 12,
      replicasRunning: 11,
      inFlight: 12345,
      drops: { join_evicted: 1234, exhausted: 56, undecodable: 7 },
      deadLetters: 1234,
      restarts: 1234,
    }),
    snap("archive-sink", 98000, { inFlight: null }),
  ];
}

const busyRates = new Map([["camera-entrance-north-01", 1234.5], ["person-detector-yolov8-large", 987.6]]);

Deno.test("the table fits a terminal 80 or 60 columns wide, whatever the names and drops", () => {
  const natural = renderTable(busyFlow(), busyRates);
  assert.ok(Math.max(...natural.map((line) => line.length)) > 80, "the busy flow is wider than 80 unbounded");
  for (const columns of [80, 60, 40]) {
    const lines = renderTable(busyFlow(), busyRates, columns);
    assert.equal(lines.length, 4, `one line a row at ${columns}`);
    for (const line of lines) assert.ok(line.length <= columns, `${line.length} > ${columns}: ${line}`);
  }
  const [header, camera, detector] = renderTable(busyFlow(), busyRates, 80);
  assert.ok(header.startsWith("node "), header);
  assert.ok(header.includes("dlq") && header.endsWith("restarts"), header);
  assert.ok(camera.startsWith("camera-entr"), camera);
  assert.match(detector, /restarting +11\/12 +98765 .* 12345 +1297 +1234 +1234$/, "drops as one total");
  const [narrow] = renderTable(busyFlow(), busyRates, 60);
  assert.ok(narrow.includes("processed") && narrow.includes("dlq") && narrow.includes("restarts"), narrow);
});

Deno.test("a table that fits is unchanged by the terminal's width", () => {
  const rows = [snap("count", 120), snap("sink", 7, { drops: { exhausted: 2 } })];
  assert.deepEqual(renderTable(rows, new Map(), 80), renderTable(rows, new Map()));
});

Deno.test("on a terminal each redraw fits the width the terminal has at that moment", () => {
  const written: string[] = [];
  let columns: number | null = 80;
  const tty = new LiveView({ isTerminal: true, write: (t) => written.push(t), columns: () => columns }, 0);
  const cursorMoves = new RegExp(`${String.fromCharCode(27)}\\[\\d*[A-Z]`, "g");
  const widest = (text: string) =>
    Math.max(...text.split("\n").map((line) => line.replace(cursorMoves, "").length));
  tty.update(1, busyFlow());
  assert.ok(widest(written[0]) <= 80, written[0]);
  columns = 60;
  tty.update(2, busyFlow());
  assert.ok(widest(written[1]) <= 60, written[1]);
  assert.ok(written[1].startsWith("\x1b[4A"), "it moves up over the 4 lines it drew, each one row");
  columns = null;
  tty.update(3, busyFlow());
  assert.ok(widest(written[2]) <= 80, "a width that cannot be read is taken as 80");
});

Deno.test("the summary's table fits the width it is given", () => {
  const lines = renderSummary(4, busyFlow(), "flow wide finished", [], 80);
  for (const line of lines.slice(0, -1)) assert.ok(line.length <= 80, line);
  assert.equal(lines.at(-1), "flow wide finished in 4.0s");
});

Deno.test("the summary's notes stand between the table and the outcome", () => {
  const lines = renderSummary(4, [snap("a", 40, { state: "done" })], "flow squares finished", ["a note"]);
  assert.deepEqual(lines.slice(-2), ["a note", "flow squares finished in 4.0s"]);
});

/** A flow of `n` nodes `node-1` … `node-n`, the third one restarting and the others done. */
function tallFlow(n: number): NodeSnapshot[] {
  return Array.from({ length: n }, (_, i) =>
    snap(`node-${i + 1}`, 10 * (i + 1), {
      state: i === 2 ? "restarting" : "done",
      deadLetters: i === 5 ? 2 : 0,
      restarts: i === 2 ? 1 : 0,
    }));
}

Deno.test("a table with more nodes than its lines shows as many as fit and sums up the rest in one line", () => {
  const lines = renderTable(tallFlow(12), new Map(), 80, 6);
  assert.equal(lines.length, 6, lines.join("\n"));
  assert.ok(lines[0].startsWith("node "), lines[0]);
  assert.deepEqual(
    lines.slice(1, 5).map((line) => line.split(/ +/)[0]),
    ["node-1", "node-2", "node-3", "node-4"],
    "the restarting node kept, then the done ones, shown in flow order",
  );
  assert.equal(lines[5], "… 8 more nodes (8 done): processed 680, dlq 2, restarts 0");
  const trouble = renderTable(tallFlow(12), new Map(), 80, 3);
  assert.equal(trouble[1].split(/ +/)[0], "node-3", "with room for one node, the one in trouble");
  assert.deepEqual(renderTable(tallFlow(4), new Map(), 80, 5), renderTable(tallFlow(4), new Map()));
});

Deno.test("on a terminal each redraw fits the height the terminal has at that moment: it never scrolls", () => {
  const written: string[] = [];
  let rows: number | null = 8;
  const tty = new LiveView({
    isTerminal: true,
    write: (t) => written.push(t),
    columns: () => 80,
    rows: () => rows,
  }, 0);
  const drawn = (text: string) => text.split("\n").length - 1;
  tty.update(1, tallFlow(30));
  assert.equal(drawn(written[0]), 7, "a row fewer than the terminal's 8: the cursor rests below the table");
  tty.update(2, tallFlow(30));
  assert.ok(written[1].startsWith("\x1b[7A"), "it moves up over exactly what it drew");
  rows = 5;
  tty.update(3, tallFlow(30));
  assert.equal(drawn(written[2]), 4);
  assert.match(written[2], /… 28 more nodes/);
  rows = null;
  tty.update(4, tallFlow(30));
  assert.equal(drawn(written[3]), 23, "a height that cannot be read is taken as 24 rows");
});
