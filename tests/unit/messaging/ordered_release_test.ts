import assert from "node:assert/strict";
import { OrderingPolicy } from "../../../src/core/ordering_policy.ts";
import { GroupKind, type ReadyGroup } from "../../../src/messaging/grouping.ts";
import { ORDERED_COMPACT_AFTER, OrderedRelease } from "../../../src/messaging/ordered_release.ts";

function group(seq: number, key = "", kind: GroupKind = GroupKind.data): ReadyGroup<string> {
  return { kind, traceId: key, seq, eventTs: null, entries: {}, handles: [`${key}${seq}`] };
}

function release(policy: OrderingPolicy) {
  return new OrderedRelease<string>(policy, (g) => g.traceId);
}

function drain(ordered: OrderedRelease<string>): string[] {
  const out: string[] = [];
  for (let g = ordered.pop(); g !== null; g = ordered.pop()) {
    out.push(g.kind === GroupKind.data ? `${g.traceId}${g.seq}` : g.kind);
  }
  return out;
}

Deno.test("groups are handed out in seq order per key, each key on its own", () => {
  const ordered = release(new OrderingPolicy({ mode: "sequence" }));
  for (const g of [group(2, "a"), group(1, "b"), group(3, "a"), group(1, "a"), group(2, "b")]) {
    ordered.push(g);
  }
  assert.deepEqual(drain(ordered), ["b1", "a1", "a2", "a3", "b2"]);
  assert.equal(ordered.holding, 0);
});

Deno.test("a gap is given up past the horizon; a late group is dropped for the messenger to settle, or marked", () => {
  const dropping = release(new OrderingPolicy({ mode: "sequence", horizon: 2 }));
  for (const seq of [2, 3, 4]) dropping.push(group(seq));
  assert.deepEqual(drain(dropping), ["2", "3", "4"]);
  dropping.push(group(1));
  assert.deepEqual(drain(dropping), []);
  assert.deepEqual(dropping.takeDropped().map((g) => g.seq), [1]);
  const marking = release(new OrderingPolicy({ mode: "sequence", horizon: 2, late: "mark" }));
  for (const seq of [2, 3, 4, 1]) marking.push(group(seq));
  assert.deepEqual(drain(marking), ["2", "3", "4", "1"]);
  assert.deepEqual(marking.takeDropped(), []);
});

Deno.test("a group seen already (a redelivery, a restarted source) is handed out, never swallowed", () => {
  const ordered = release(new OrderingPolicy({ mode: "sequence" }));
  for (const seq of [1, 2, 4, 4, 1]) ordered.push(group(seq));
  assert.deepEqual(drain(ordered), ["1", "2", "4", "1"]);
  assert.equal(ordered.holding, 1, "the first 4 waits for 3");
  assert.deepEqual(ordered.takeDropped(), []);
});

Deno.test("an end group releases everything held first, in order", () => {
  const ordered = release(new OrderingPolicy({ mode: "sequence" }));
  for (const g of [group(3), group(2), group(5, "", GroupKind.end), group(7)]) ordered.push(g);
  assert.deepEqual(drain(ordered), ["2", "3", "end", "7"], "an input retried after the end is not held");
});

Deno.test("an abort group goes ahead of everything; what waits behind a gap stays held", () => {
  const ordered = release(new OrderingPolicy({ mode: "sequence" }));
  for (const g of [group(1), group(3), group(0, "", GroupKind.abort)]) ordered.push(g);
  assert.deepEqual(drain(ordered), ["abort", "1"]);
  assert.equal(ordered.holding, 1);
});

Deno.test("over a long run the order holds across the buffer's compaction", () => {
  const ordered = release(new OrderingPolicy({ mode: "sequence" }));
  const n = ORDERED_COMPACT_AFTER * 2 + 10;
  for (let seq = 1; seq <= n; seq += 2) {
    ordered.push(group(seq + 1));
    ordered.push(group(seq));
  }
  const out = drain(ordered).map(Number);
  assert.deepEqual(out, Array.from({ length: out.length }, (_, i) => i + 1));
  assert.equal(out.length, n);
});
