import assert from "node:assert/strict";
import {
  ConfigError,
  NodeContractError,
  ResourceUnavailable,
  SchemaError,
} from "../../../src/core/errors.ts";
import { EffectGuarantee } from "../../../src/core/node.ts";
import { JsonlSink, type JsonlSinkParams, toJsonLine } from "../../../src/nodes/jsonl_sink.ts";
import {
  BlobRef,
  Detections,
  Frame,
  OpaquePayload,
  Tensor,
  Tracks,
  WireDouble,
  wireMap,
} from "../../../src/wire/value.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";
import { inSandbox, type TestContext, testContext } from "../../fixtures/video/clips.ts";

const dir = await Deno.makeTempDir({ prefix: "vf_jsonl_" });
globalThis.addEventListener("unload", () => Deno.removeSync(dir, { recursive: true }));

let files = 0;
function freshPath(): string {
  files += 1;
  return `${dir}/out_${files}.jsonl`;
}

async function opened(params: JsonlSinkParams, t: TestContext = testContext("sink")) {
  const sink = new JsonlSink({ name: "sink", ...params });
  await sink.open(t.ctx);
  return sink;
}

async function lines(path: string): Promise<unknown[]> {
  const text = await Deno.readTextFile(path);
  assert.ok(text === "" || text.endsWith("\n"), "the file ends with a whole line");
  return text.split("\n").slice(0, -1).map((line) => JSON.parse(line));
}

async function consumeKeyed(
  sink: JsonlSink,
  t: TestContext,
  key: string | null,
  value: unknown,
): Promise<void> {
  t.inputKey = key;
  await sink.consume(value, t.ctx);
}

Deno.test("each item is appended as one line {key, value}; a reopened file keeps its lines", async () => {
  const path = freshPath();
  const t = testContext();
  const sink = await opened({ path }, t);
  await consumeKeyed(sink, t, null, { count: 1 });
  await consumeKeyed(sink, t, "g1", [1, "two", null]);
  sink.close(t.ctx);
  const again = await opened({ path, durable: false }, t);
  await consumeKeyed(again, t, "g2", "three");
  again.close(t.ctx);
  assert.deepEqual(await lines(path), [
    { key: null, value: { count: 1 } },
    { key: "g1", value: [1, "two", null] },
    { key: "g2", value: "three" },
  ]);
});

Deno.test("an item whose key was written is not written again, within a run and after a restart", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const path = freshPath();
  const t = testContext();
  let sink = await opened({ path }, t);
  const written = new Set<string>();
  for (let i = 0; i < 200; i++) {
    if (random.chance(0.1)) {
      sink.close(t.ctx);
      sink = await opened({ path }, t);
    }
    const key = `group-${random.int(0, 40)}`;
    await consumeKeyed(sink, t, key, { key, i });
    written.add(key);
  }
  sink.close(t.ctx);
  const keys = (await lines(path)).map((line) => (line as { key: string }).key);
  assert.equal(keys.length, written.size, `one line per key (seed ${seed})`);
  assert.deepEqual(new Set(keys), written, `seed ${seed}`);
});

Deno.test("items without a key are always appended", async () => {
  const path = freshPath();
  const t = testContext();
  const sink = await opened({ path }, t);
  for (let i = 0; i < 3; i++) await consumeKeyed(sink, t, null, "same");
  sink.close(t.ctx);
  assert.equal((await lines(path)).length, 3);
});

Deno.test("a torn last line is cut off at open and its item written again in full", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let round = 0; round < 20; round++) {
    const path = freshPath();
    const whole = [
      JSON.stringify({ key: "a", value: 1 }),
      JSON.stringify({ key: "b", value: "é✓" }),
    ].map((line) => `${line}\n`).join("");
    const torn = `${JSON.stringify({ key: "c", value: { text: "ünïcødé" } })}\n`;
    const tornBytes = new TextEncoder().encode(torn);
    const cut = random.int(1, tornBytes.length - 1);
    await Deno.writeFile(
      path,
      new Uint8Array([...new TextEncoder().encode(whole), ...tornBytes.subarray(0, cut)]),
    );
    const t = testContext();
    const sink = await opened({ path }, t);
    assert.ok(t.logger.records.some((r) => r.message === "cut off a torn last line"), `seed ${seed}`);
    for (const key of ["a", "b", "c"]) await consumeKeyed(sink, t, key, { text: "ünïcødé" });
    sink.close(t.ctx);
    assert.equal(await Deno.readTextFile(path), whole + torn, `cut at byte ${cut} (seed ${seed})`);
  }
});

Deno.test("an unreadable complete line is kept, skipped for keys and logged", async () => {
  const path = freshPath();
  await Deno.writeTextFile(path, `not json\n${JSON.stringify({ key: "k", value: 1 })}\n[1]\n`);
  const t = testContext();
  const sink = await opened({ path }, t);
  await consumeKeyed(sink, t, "k", 2);
  sink.close(t.ctx);
  assert.equal((await Deno.readTextFile(path)).split("\n").length - 1, 3, "nothing added, nothing removed");
  const skipped = t.logger.records.filter((r) => r.message === "skipped an unreadable line");
  assert.deepEqual(skipped.map((r) => r.fields.offset), [0, 31], "the byte offsets of lines 1 and 3");
});

/** Writes `count` keyed lines `{prefix}-{n}` through a sink opened on `path`, then closes it. */
async function writeKeyed(path: string, prefix: string, count: number): Promise<void> {
  const t = testContext();
  const sink = await opened({ path, durable: false }, t);
  for (let n = 0; n < count; n++) await consumeKeyed(sink, t, `${prefix}-${n}`, n);
  sink.close(t.ctx);
}

Deno.test("open() reads only what its key index does not cover: the lines of earlier runs are not read again", async () => {
  const path = freshPath();
  await writeKeyed(path, "earlier", 3000);
  // Blank out the earlier runs' lines in place (same length, before the indexed end's fingerprint): an
  // open() that read them would log each as unreadable, and would forget their keys.
  const bytes = await Deno.readFile(path);
  const blanked = bytes.lastIndexOf(0x0a, bytes.length - 200);
  for (let at = 0; at < blanked; at++) if (bytes[at] !== 0x0a) bytes[at] = 0x20;
  await Deno.writeFile(path, bytes);
  const t = testContext();
  const sink = await opened({ path }, t);
  assert.deepEqual(t.logger.records.filter((r) => r.message === "skipped an unreadable line"), []);
  await consumeKeyed(sink, t, "earlier-7", "again");
  await consumeKeyed(sink, t, "now", "new");
  sink.close(t.ctx);
  const after = await Deno.readFile(path);
  assert.equal(after.length, bytes.length + `${JSON.stringify({ key: "now", value: "new" })}\n`.length);
});

Deno.test("the key index holds every key of a large file: after a reopen each is still skipped", async () => {
  const path = freshPath();
  const count = 40_000;
  await writeKeyed(path, "k", count);
  const size = (await Deno.stat(path)).size;
  const t = testContext();
  const sink = await opened({ path, durable: false }, t);
  for (let n = 0; n < count; n += 97) await consumeKeyed(sink, t, `k-${n}`, "again");
  await consumeKeyed(sink, t, `k-${count - 1}`, "again");
  sink.close(t.ctx);
  assert.equal((await Deno.stat(path)).size, size, "no key written twice");
});

Deno.test("lines the index missed (a crash before its checkpoint) are indexed at open", async () => {
  const path = freshPath();
  await writeKeyed(path, "a", 10);
  const missed = [10, 11, 12].map((n) => `${JSON.stringify({ key: `a-${n}`, value: n })}\n`).join("");
  await Deno.writeTextFile(path, missed, { append: true });
  const size = (await Deno.stat(path)).size;
  const t = testContext();
  const sink = await opened({ path }, t);
  for (const n of [3, 10, 12]) await consumeKeyed(sink, t, `a-${n}`, "again");
  sink.close(t.ctx);
  assert.equal((await Deno.stat(path)).size, size);
});

Deno.test("a file replaced or truncated behind the sink is indexed again from its start", async () => {
  for (const change of ["replaced", "truncated", "index removed"] as const) {
    const path = freshPath();
    await writeKeyed(path, "old", 300);
    if (change === "replaced") {
      await Deno.writeTextFile(path, `${JSON.stringify({ key: "fresh", value: 1 })}\n`.repeat(400));
    } else if (change === "truncated") {
      await Deno.writeTextFile(path, `${JSON.stringify({ key: "old-0", value: 0 })}\n`);
    } else {
      await Deno.remove(`${path}.keys`);
    }
    const t = testContext();
    const sink = await opened({ path }, t);
    assert.equal(
      t.logger.records.some((r) =>
        r.message === "the file changed since its keys were indexed: indexing it again"
      ),
      change !== "index removed",
      change,
    );
    await consumeKeyed(sink, t, "old-0", "kept once");
    await consumeKeyed(sink, t, "old-5", "written");
    await consumeKeyed(sink, t, "fresh", "kept once");
    sink.close(t.ctx);
    const keys = (await lines(path)).map((line) => (line as { key: string }).key);
    const expected = change === "replaced"
      ? [...Array(400).fill("fresh"), "old-0", "old-5"]
      : change === "truncated"
      ? ["old-0", "old-5", "fresh"]
      : [...Array.from({ length: 300 }, (_, n) => `old-${n}`), "fresh"];
    assert.deepEqual(keys, expected, change);
  }
});

Deno.test("values encode to JSON: bigints as strings, tensors and frames summarized, detections in full", () => {
  const pixels = Tensor.from(new Uint8Array(2 * 3 * 3), [2, 3, 3]);
  const boxes = Tensor.from(new Float32Array([1, 2, 3, 4, 0.5, 7]), [1, 6]);
  assert.deepEqual(
    toJsonLine({
      big: 12345678901234567890n,
      double: new WireDouble(2),
      odd: [NaN, Infinity, -Infinity, undefined],
      tensor: Tensor.from(new BigInt64Array([1n, 2n]), [2]),
      frame: new Frame(pixels, "bgr8", 12.5),
      detections: new Detections(boxes, ["cat"]),
      tracks: new Tracks(Tensor.from(new Int32Array([1, 2, 3, 4, 9]), [1, 5])),
      bytes: new Uint8Array(5),
      blob: new BlobRef("k", "frame", 2n ** 60n),
      opaque: new OpaquePayload("x.Y", new Uint8Array(3)),
      map: wireMap([["__proto__", 1]]),
    }),
    {
      big: "12345678901234567890",
      double: 2,
      odd: ["NaN", "Infinity", "-Infinity", null],
      tensor: { type: "tensor", dtype: "int64", shape: [2] },
      frame: { type: "frame", pixel_format: "bgr8", dtype: "uint8", shape: [2, 3, 3], capture_ts: 12.5 },
      detections: { type: "detections", boxes: [[1, 2, 3, 4, 0.5, 7]], class_names: ["cat"] },
      tracks: { type: "tracks", tracks: [[1, 2, 3, 4, 9]] },
      bytes: { type: "bytes", length: 5 },
      blob: { type: "blob_ref", ref: "k", inner_payload_type: "frame", size: String(2n ** 60n) },
      opaque: { type: "opaque", payload_type: "x.Y", length: 3 },
      map: JSON.parse('{"__proto__": 1}'),
    },
  );
});

Deno.test("an item with no JSON form is poison and writes nothing", async () => {
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  for (const bad of [() => 1, Symbol("s"), new Date(0), new Map(), cyclic, [1, { f: () => 2 }]]) {
    assert.throws(() => toJsonLine(bad), SchemaError, String(bad));
  }
  const path = freshPath();
  const t = testContext();
  const sink = await opened({ path }, t);
  await assert.rejects(consumeKeyed(sink, t, "k", new Map()), SchemaError);
  await consumeKeyed(sink, t, "k", "fine");
  sink.close(t.ctx);
  assert.deepEqual(await lines(path), [{ key: "k", value: "fine" }], "the poison's key was not recorded");
});

Deno.test("a missing directory is ResourceUnavailable; bad params a ConfigError; consume() needs open()", async () => {
  const t = testContext();
  await assert.rejects(
    new JsonlSink({ name: "s", path: `${dir}/no/such/dir.jsonl` }).open(t.ctx),
    ResourceUnavailable,
  );
  await assert.rejects(new JsonlSink({ name: "s", path: "" }).open(t.ctx), ConfigError);
  await assert.rejects(
    new JsonlSink({ name: "s", path: freshPath(), durable: "yes" as unknown as boolean }).open(t.ctx),
    ConfigError,
  );
  await assert.rejects(new JsonlSink({ name: "s", path: freshPath() }).consume(1, t.ctx), NodeContractError);
});

Deno.test("permissions(): read and write on the path and its key index alone; the sink declares idempotent_key", () => {
  const sink = new JsonlSink({ name: "s", path: "out/d.jsonl" });
  const granted = sink.permissions();
  assert.deepEqual(granted.write, ["out/d.jsonl", "out/d.jsonl.keys"]);
  assert.deepEqual(granted.read, ["out/d.jsonl", "out/d.jsonl.keys"]);
  assert.deepEqual([granted.run, granted.net, granted.env, granted.ffi, granted.sys], [[], [], [], [], []]);
  assert.equal(sink.effectGuarantee, EffectGuarantee.idempotentKey);
});

Deno.test("with exactly the declared permissions, a worker's sink writes its file", async () => {
  const path = freshPath();
  const body = `
    const sink = new JsonlSink({ name: "s", path: ${JSON.stringify(path)} });
    await sink.open(ctx);
    await sink.consume({ ok: true }, ctx);
    sink.close(ctx);
    return "done";`;
  const granted = new JsonlSink({ name: "s", path }).permissions();
  assert.equal(await inSandbox("jsonl_sink.ts", "JsonlSink", body, granted), "done");
  assert.deepEqual(await lines(path), [{ key: null, value: { ok: true } }]);
});
