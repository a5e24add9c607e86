import assert from "node:assert/strict";
import { RuntimeContext } from "../../../src/core/context.ts";
import { ConfigError, NodeContractError } from "../../../src/core/errors.ts";
import { JoinPolicy } from "../../../src/core/join_policy.ts";
import {
  AssetRequirement,
  ConsumerNode,
  END,
  findNonJson,
  FunctionProcessorNode,
  ModuleNode,
  nonJsonPlaces,
  OneTaskProcessorNode,
  parseExportRef,
  PERMISSION_KINDS,
  ProcessorNode,
  ProducerNode,
  TaskModuleNode,
} from "../../../src/core/node.ts";
import { isNodeClass, loadNodeClass, ModuleIndex, rebuildNode } from "../../../src/core/node_class.ts";
import * as squares from "../../fixtures/flows/squares.ts";

const SQUARES_URL = new URL("../../fixtures/flows/squares.ts", import.meta.url).href;

class Source extends ProducerNode<{ items?: number[] }> {
  #at = 0;
  next() {
    const items = this.params.items ?? [];
    return this.#at < items.length ? items[this.#at++] : END;
  }
}

class AddOne extends ProcessorNode<{ by?: number; options?: Record<string, unknown> }> {
  process(x: number) {
    return x + (this.params.by ?? 1);
  }
}

class Join extends ProcessorNode {
  process(inputs: number[]) {
    return inputs.reduce((a, b) => a + b, 0);
  }
}

class Collect extends ConsumerNode {
  readonly seen: unknown[] = [];
  consume(x: unknown) {
    this.seen.push(x);
  }
}

class Tracker extends OneTaskProcessorNode {
  process(x: unknown) {
    return x;
  }
}

class GpuReader extends ProcessorNode<{ clips: string }> {
  static override permissions = { read: ["/models"], net: ["cam.local:554"] };
  static override replayPolicy = "committed" as const;
  static override executionGroup = "fused";
  process(x: unknown) {
    return x;
  }
}

class Committed extends ConsumerNode {
  static override effectGuarantee = "idempotent_key" as const;
  consume() {}
}

class Replayable extends ProducerNode {
  static override replayable = true;
  static override analysisVersion = "v2";
  next() {
    return END;
  }
}

function context(): RuntimeContext {
  const quiet = { debug() {}, info() {}, warn() {}, error() {} };
  return new RuntimeContext({ flowId: "f", runId: "r", nodeName: "n", replicaId: 0 }, quiet);
}

Deno.test("a node stores its params, and getParams returns them with the name first", () => {
  const node = new AddOne({ by: 3, name: "add" });
  assert.deepEqual(node.params, { by: 3, name: "add" });
  assert.deepEqual(node.getParams(), { name: "add", by: 3 });
  assert.deepEqual(Object.keys(node.getParams()), ["name", "by"]);
  assert.equal(node.name, "add");
  assert.ok(Object.isFrozen(node.params));
});

Deno.test("getParams returns a fresh copy each time", () => {
  const node = new AddOne({ name: "add", options: { list: [1, 2] } });
  const first = node.getParams() as { options: { list: number[] } };
  first.options.list.push(3);
  assert.deepEqual(node.getParams(), { name: "add", options: { list: [1, 2] } });
});

Deno.test("a node without a name gets the class name and a per-class counter, kept by getParams", () => {
  class Fresh extends ProcessorNode {
    process(x: unknown) {
      return x;
    }
  }
  class Other extends ProcessorNode {
    process(x: unknown) {
      return x;
    }
  }
  assert.equal(new Fresh().name, "Fresh_1");
  assert.equal(new Fresh().name, "Fresh_2");
  assert.equal(new Other().name, "Other_1");
  const third = new Fresh();
  assert.equal(third.getParams().name, "Fresh_3");
  assert.equal(new Fresh(third.getParams()).name, "Fresh_3");
});

Deno.test("a JoinPolicy given as joinPolicy is stored as its dict and read back as a policy", () => {
  const policy = new JoinPolicy({ mode: "time", toleranceMs: 15, timeoutSeconds: 2, quorum: 2 });
  const node = new Join({ name: "fuse", joinPolicy: policy });
  assert.deepEqual(node.getParams().joinPolicy, policy.toDict());
  assert.deepEqual(node.joinPolicy?.toDict(), policy.toDict());
  assert.equal(new Join({ name: "plain" }).joinPolicy, null);
});

Deno.test("a node rebuilt from getParams has the same name, params and kind", () => {
  const nodes = [
    new Source({ name: "src", items: [1, 2], isFinite: false }),
    new AddOne({ name: "add", nbTasks: 3, partitionBy: "trace_id", by: 2, delivery: "at-least-once" }),
    new Collect({ name: "sink", metadata: true, idempotent: true, onError: "poison" }),
  ];
  for (const node of nodes) {
    const Cls = node.constructor as new (params: unknown) => typeof node;
    const rebuilt = new Cls(node.getParams());
    assert.equal(rebuilt.name, node.name);
    assert.equal(rebuilt.kind, node.kind);
    assert.deepEqual(rebuilt.getParams(), node.getParams());
  }
});

Deno.test("framework params read through typed accessors with the spec's defaults", () => {
  const producer = new Source({ name: "s" });
  assert.equal(producer.kind, "producer");
  assert.equal(producer.isFinite, true);
  assert.equal(producer.image, null);
  const processor = new AddOne({ name: "p" });
  assert.equal(processor.kind, "processor");
  assert.equal(processor.nbTasks, 1);
  assert.equal(processor.deviceType, "cpu");
  assert.equal(processor.partitionBy, null);
  assert.equal(processor.gpuCount, 1);
  assert.equal(processor.gpuMemoryGib, null);
  assert.equal(processor.delivery, null);
  assert.equal(processor.onError, null);
  const gpu = new AddOne({ name: "g", deviceType: "gpu", gpuCount: 2, image: "ghcr.io/me/app:v1" });
  assert.equal(gpu.gpuCount, 2);
  assert.equal(gpu.image, "ghcr.io/me/app:v1");
  const consumer = new Collect({ name: "c" });
  assert.equal(consumer.kind, "consumer");
  assert.equal(consumer.metadata, false);
  assert.equal(consumer.idempotent, false);
  assert.equal(consumer.partitionBy, null);
});

Deno.test("a one-task processor always runs as one replica", () => {
  assert.equal(new Tracker({ name: "t" }).nbTasks, 1);
  assert.equal(new Tracker({ name: "t", nbTasks: 4 }).nbTasks, 1);
});

Deno.test("deliveryPolicy is null when the node overrides nothing, else the override dict", () => {
  assert.equal(new AddOne({ name: "a" }).deliveryPolicy(), null);
  assert.deepEqual(new AddOne({ name: "a", delivery: "best-effort" }).deliveryPolicy(), {
    delivery: "best-effort",
  });
  assert.deepEqual(
    new Collect({ name: "c", delivery: "at-least-once", onError: "poison" }).deliveryPolicy(),
    {
      delivery: "at-least-once",
      on_error: "poison",
    },
  );
  const bad = new AddOne({ name: "a", delivery: "sometimes" as "best-effort" });
  assert.throws(() => bad.deliveryPolicy(), ConfigError);
});

Deno.test("class-level declarations default as the spec says and are read through the instance", () => {
  const plain = new AddOne({ name: "p" });
  assert.equal(plain.deterministic, true);
  assert.equal(plain.replayPolicy, "recompute");
  assert.equal(plain.gpuFallback, "cpu");
  assert.equal(plain.requiresPeerAccess, false);
  assert.equal(plain.executionGroup, null);
  assert.equal(plain.batchingPolicy, null);
  assert.equal(plain.partitionKeyPolicy, null);
  assert.equal(new Source({ name: "s" }).replayable, false);
  assert.equal(new Source({ name: "s" }).analysisVersion, null);
  assert.equal(new Collect({ name: "c" }).effectGuarantee, "at_least_once");
  const declared = new GpuReader({ name: "r", clips: "/clips" });
  assert.equal(declared.replayPolicy, "committed");
  assert.equal(declared.executionGroup, "fused");
  assert.equal(new Committed({ name: "c" }).effectGuarantee, "idempotent_key");
  assert.equal(new Replayable({ name: "r" }).replayable, true);
  assert.equal(new Replayable({ name: "r" }).analysisVersion, "v2");
  assert.deepEqual(
    declared.getParams(),
    { name: "r", clips: "/clips" },
    "declarations never reach the params",
  );
});

Deno.test("permissions() lists every kind: nothing by default, the class's declaration otherwise", () => {
  const none = new AddOne({ name: "p" }).permissions();
  assert.deepEqual(Object.keys(none), [...PERMISSION_KINDS]);
  assert.ok(PERMISSION_KINDS.every((kind) => none[kind].length === 0));
  const granted = new GpuReader({ name: "r", clips: "/clips" }).permissions();
  assert.deepEqual(granted.read, ["/models"]);
  assert.deepEqual(granted.net, ["cam.local:554"]);
  assert.deepEqual(granted.write, []);
});

Deno.test("requiredAssets() is empty by default and an override derives it from the params", () => {
  class Model extends ProcessorNode<{ weights: string; digest: string }> {
    override requiredAssets() {
      return [new AssetRequirement(this.params.weights, this.params.digest, false)];
    }
    process(x: unknown) {
      return x;
    }
  }
  assert.deepEqual(new AddOne({ name: "p" }).requiredAssets(), []);
  const digest = "a".repeat(64);
  const [asset] = new Model({ name: "m", weights: "/models/w.bin", digest }).requiredAssets();
  assert.deepEqual(asset.toDict(), { path: "/models/w.bin", sha256: digest, portable: false });
  assert.equal(new AssetRequirement("/x", digest).portable, true);
});

Deno.test("END is one registry symbol, shared by every copy of the module", () => {
  assert.equal(END, Symbol.for("videoflow.END"));
  const source = new Source({ name: "s", items: [7] });
  assert.equal(source.next(), 7);
  assert.equal(source.next(), END);
});

Deno.test("from() wires parents in order, records children, returns the node and rewires cleanly", () => {
  const a = new Source({ name: "a" });
  const b = new Source({ name: "b" });
  const join = new Join({ name: "join" });
  assert.equal(join.from(a, b), join);
  assert.deepEqual(join.parents.map((p) => p.name), ["a", "b"]);
  assert.deepEqual(a.children, [join]);
  join.from(b);
  assert.deepEqual(join.parents, [b]);
  assert.deepEqual(a.children, [], "rewiring removes the node from its old parents");
  assert.deepEqual(b.children, [join]);
});

Deno.test("a consumer or a non-node cannot be a parent", () => {
  const sink = new Collect({ name: "sink" });
  const after = new AddOne({ name: "after" });
  assert.throws(
    () => after.from(sink as unknown as AddOne),
    (e: unknown) => e instanceof NodeContractError && /sink is a consumer/.test(e.message),
  );
  assert.throws(() => after.from({} as unknown as AddOne), NodeContractError);
  assert.throws(() => new AddOne(null as unknown as { name: string }), NodeContractError);
});

const NON_JSON: ReadonlyArray<readonly [string, Record<string, unknown>, string, RegExp]> = [
  ["a function", { options: { fn: () => 1 } }, "params.options.fn", /a function/],
  ["a Date", { when: new Date(0) }, "params.when", /instance of Date/],
  ["a Map", { table: new Map() }, "params.table", /instance of Map/],
  ["NaN", { ratio: NaN }, "params.ratio", /NaN/],
  ["Infinity", { list: [1, Infinity] }, "params.list[1]", /Infinity/],
  ["undefined", { maybe: undefined }, "params.maybe", /undefined/],
  ["a class instance", { policy: new (class Knob {})() }, "params.policy", /instance of Knob/],
  ["a bigint", { big: 1n }, "params.big", /bigint/],
  ["a symbol", { tag: Symbol("x") }, "params.tag", /symbol/],
  ["an array hole", { holes: [1, , 3] }, "params.holes[1]", /hole/],
  ["an odd key", { "a.b": { c: () => 0 } }, 'params["a.b"].c', /function/],
];

for (const [what, params, path, found] of NON_JSON) {
  Deno.test(`getParams refuses ${what} with a NodeContractError naming ${path}`, () => {
    const node = new AddOne({ name: "bad", ...params });
    assert.throws(
      () => node.getParams(),
      (e: unknown) =>
        e instanceof NodeContractError && e.context.path === path && e.message.includes(path) &&
        found.test(e.message) && e.remedy !== null,
    );
  });
}

Deno.test("getParams refuses a cyclic object, naming where the cycle closes", () => {
  const loop: Record<string, unknown> = { a: 1 };
  loop.self = { back: loop };
  const node = new AddOne({ name: "bad", options: loop });
  assert.throws(
    () => node.getParams(),
    (e: unknown) => e instanceof NodeContractError && e.context.path === "params.options.self.back",
  );
});

Deno.test("findNonJson accepts plain JSON, shared (acyclic) references and null-prototype objects", () => {
  const shared = { x: 1 };
  const bare = Object.assign(Object.create(null), { k: [true, null, "s", 0.5] });
  assert.equal(findNonJson({ a: shared, b: shared, c: bare, d: [[], {}] }, "v"), null);
  assert.deepEqual(findNonJson([1, { y: undefined }], "v"), { path: "v[1].y", found: "undefined" });
});

Deno.test("parseExportRef splits at the last # and refuses anything that is no reference", () => {
  assert.deepEqual(parseExportRef("file:///a%23b/flow.ts#Count"), {
    url: "file:///a%23b/flow.ts",
    exportName: "Count",
  });
  for (const bad of ["Count", "#Count", "file:///flow.ts#", "file:///flow.ts#not-a-name"]) {
    assert.throws(() => parseExportRef(bad), NodeContractError, bad);
  }
});

Deno.test("a module wires its entry node and is consumed through its exit node", () => {
  const source = new Source({ name: "src" });
  const first = new AddOne({ name: "first" });
  const second = new AddOne({ name: "second" }).from(first);
  const third = new AddOne({ name: "third" }).from(first, second);
  const module = new ModuleNode(first, third);
  assert.deepEqual(module.nodes.map((n) => n.name), ["first", "second", "third"]);
  assert.equal(module.from(source), module);
  assert.deepEqual(first.parents, [source]);
  const sink = new Collect({ name: "sink" }).from(module);
  assert.deepEqual(sink.parents, [third]);
  const outer = new ModuleNode(module, new AddOne({ name: "tail" }).from(module));
  assert.equal(outer.entryNode, first, "a nested module stands for its own entry and exit");
});

Deno.test("a module refuses a non-processor inside, an unreachable exit and a cycle", () => {
  const source = new Source({ name: "src" });
  const entry = new AddOne({ name: "entry" });
  const viaSource = new AddOne({ name: "via" }).from(source);
  assert.throws(
    () => new ModuleNode(entry, viaSource),
    (e: unknown) => e instanceof ConfigError && /producer/.test(e.message),
  );
  const stray = new AddOne({ name: "stray" });
  const exit = new AddOne({ name: "exit" }).from(stray);
  assert.throws(
    () => new ModuleNode(entry, exit),
    (e: unknown) => e instanceof ConfigError && /not reachable/.test(e.message),
  );
  const x = new AddOne({ name: "x" });
  const y = new AddOne({ name: "y" }).from(x);
  x.from(y);
  assert.throws(
    () => new ModuleNode(entry, y),
    (e: unknown) => e instanceof ConfigError && /cycle/.test(e.message),
  );
});

Deno.test("a TaskModuleNode runs its subgraph in one process() and cannot be rebuilt in a worker", async () => {
  const entry = new AddOne({ name: "plus1" });
  const double = new AddOne({ name: "plus10", by: 10 }).from(entry);
  const exit = new Join({ name: "sum" }).from(entry, double);
  const task = new TaskModuleNode(entry, exit, { name: "task" });
  assert.deepEqual(task.nodes.map((n) => n.name), ["plus1", "plus10", "sum"]);
  const ctx = context();
  await task.open(ctx);
  assert.equal(await task.process(1, ctx), 2 + 12);
  await task.close(ctx);
  assert.throws(() => task.getParams(), NodeContractError);
});

Deno.test("a TaskModuleNode refuses GPU nodes, nested task modules and one-task nodes on several tasks", () => {
  const gpu = new AddOne({ name: "gpu", deviceType: "gpu" });
  assert.throws(
    () => new TaskModuleNode(gpu, gpu),
    (e: unknown) => e instanceof ConfigError && /GPU/.test(e.message),
  );
  const tracker = new Tracker({ name: "tracker" });
  assert.throws(
    () => new TaskModuleNode(tracker, tracker, { nbTasks: 2 }),
    (e: unknown) => e instanceof ConfigError && /one-task/.test(e.message),
  );
  const inner = new AddOne({ name: "inner" });
  const nested = new TaskModuleNode(inner, inner);
  assert.throws(
    () => new TaskModuleNode(nested, nested),
    (e: unknown) => e instanceof ConfigError && /nest/.test(e.message),
  );
});

Deno.test("a FunctionProcessorNode imports its referenced function in open() and applies it", async () => {
  const node = new FunctionProcessorNode({ name: "double", fn: `${SQUARES_URL}#double` });
  const ctx = context();
  assert.throws(() => node.process(1, ctx), NodeContractError);
  await node.open(ctx);
  assert.equal(node.process(21, ctx), 42);
  assert.deepEqual(node.getParams(), { name: "double", fn: `${SQUARES_URL}#double` });
});

Deno.test("a FunctionProcessorNode refuses a reference to a missing export or to a non-function", async () => {
  const ctx = context();
  await assert.rejects(
    new FunctionProcessorNode({ fn: `${SQUARES_URL}#missing` }).open(ctx),
    NodeContractError,
  );
  await assert.rejects(
    new FunctionProcessorNode({ fn: `${SQUARES_URL}#notAFunction` }).open(ctx),
    NodeContractError,
  );
  await assert.rejects(
    new FunctionProcessorNode({ fn: "file:///no/such/module.ts#f" }).open(ctx),
    NodeContractError,
  );
});

Deno.test("a processor records where its GPU requirement came from", () => {
  assert.deepEqual(new AddOne({ name: "cpu" }).gpuProvenance, {
    device_type: "node",
    gpu_count: "default",
    gpu_memory_gib: "default",
  });
  assert.deepEqual(new AddOne({ name: "g", deviceType: "gpu", gpuMemoryGib: 10 }).gpuProvenance, {
    device_type: "node",
    gpu_count: "default",
    gpu_memory_gib: "node",
  });
});

Deno.test("a module index resolves a class to the first module URL#export that is exactly it", () => {
  const index = new ModuleIndex().add(SQUARES_URL, squares);
  assert.equal(index.resolve(squares.Count), `${SQUARES_URL}#Count`);
  assert.equal(index.nodeClassOf(new squares.Print({ name: "p" })), `${SQUARES_URL}#Print`);
  assert.equal(index.resolve(AddOne), null);
  const reexport = new ModuleIndex().add("file:///first.ts", { Alias: squares.Sum }).add(
    SQUARES_URL,
    squares,
  );
  assert.equal(reexport.resolve(squares.Sum), "file:///first.ts#Alias");
  assert.equal(index.lookup(`${SQUARES_URL}#double`), squares.double);
  assert.equal(index.lookup(`${SQUARES_URL}#nothing`), undefined);
  assert.equal(index.lookup("file:///elsewhere.ts#double"), undefined);
});

Deno.test("a module index refuses a module URL that is not absolute", () => {
  assert.throws(() => new ModuleIndex().add("./flow.ts", squares), ConfigError);
  assert.throws(() => new ModuleIndex().add("file:///flow.ts#Count", squares), ConfigError);
});

Deno.test("loadNodeClass imports a node class by reference and refuses what is not one", async () => {
  assert.equal(await loadNodeClass(`${SQUARES_URL}#Square`), squares.Square);
  assert.ok(isNodeClass(squares.Square));
  assert.ok(!isNodeClass(squares.double));
  await assert.rejects(loadNodeClass(`${SQUARES_URL}#double`), NodeContractError);
  await assert.rejects(loadNodeClass(`${SQUARES_URL}#Missing`), NodeContractError);
  await assert.rejects(loadNodeClass("not a reference"), NodeContractError);
});

Deno.test("rebuildNode checks the rebuilt node's kind and name against the spec", async () => {
  const node = await rebuildNode(`${SQUARES_URL}#Count`, { name: "count", n: 3 }, "producer");
  assert.ok(node instanceof squares.Count);
  assert.equal(node.name, "count");
  await assert.rejects(
    rebuildNode(`${SQUARES_URL}#Count`, { name: "count", n: 3 }, "consumer"),
    NodeContractError,
  );
});

Deno.test("nonJsonPlaces lists every place a value is not plain JSON, in order; getParams names them all", () => {
  assert.deepEqual(nonJsonPlaces({ a: NaN, b: [1, undefined], c: { d: Infinity } }, "v"), [
    { path: "v.a", found: "NaN" },
    { path: "v.b[1]", found: "undefined" },
    { path: "v.c.d", found: "Infinity" },
  ]);
  assert.deepEqual(nonJsonPlaces({ ok: [1, "x", null] }, "v"), []);
  class Tagged extends ProcessorNode<{ a?: unknown; b?: unknown }> {
    process(x: unknown): unknown {
      return x;
    }
  }
  assert.throws(
    () => new Tagged({ name: "t", a: NaN, b: undefined }).getParams(),
    /^NodeContractError: node t: params\.a is NaN; params\.b is undefined, which is not plain JSON$/,
  );
});
