import assert from "node:assert/strict";
import {
  batchingPolicies,
  blobReaderIds,
  blobReaders,
  compileFlow,
  compileToDict,
  executionGroups,
  gpuProvenance,
  hasNativeComponents,
  hasRemoteComponents,
  nodePermissions,
  NodeSpec,
  type NodeSpecInit,
  parentReplicas,
  sinkGuarantees,
  specsFromDicts,
  validateWireCompatibility,
} from "../../../src/core/compiler.ts";
import { ConfigError, GraphError } from "../../../src/core/errors.ts";
import { Flow } from "../../../src/core/flow.ts";
import { JoinPolicy } from "../../../src/core/join_policy.ts";
import { ConsumerNode, END, ProcessorNode, ProducerNode } from "../../../src/core/node.ts";
import { ModuleIndex, rebuildNode } from "../../../src/core/node_class.ts";
import * as several from "../../fixtures/flows/several_problems.ts";
import * as squares from "../../fixtures/flows/squares.ts";
import * as unexported from "../../fixtures/flows/unexported.ts";
import { SeededRandom } from "../../support/random.ts";

const SQUARES_URL = new URL("../../fixtures/flows/squares.ts", import.meta.url).href;
const SQUARES = new ModuleIndex().add(SQUARES_URL, squares);

/** The spec's field order: the NodeSpec constructor signature, a contract. */
const SPEC_KEYS = [
  "name",
  "node_class",
  "params",
  "parents",
  "kind",
  "has_children",
  "nb_tasks",
  "device_type",
  "is_finite",
  "image",
  "partition_by",
  "join_policy",
  "component_ref",
  "descriptor",
  "command",
  "protocol_version",
  "gpu_count",
  "gpu_resource_name",
  "blob_readers",
  "gpu_memory_gib",
  "delivery",
];

export class Src extends ProducerNode {
  next() {
    return END;
  }
}

export class Proc extends ProcessorNode {
  process(x: unknown) {
    return x;
  }
}

export class Sink extends ConsumerNode {
  consume() {}
}

export class Grouped extends ProcessorNode {
  static override executionGroup = "fused";
  process(x: unknown) {
    return x;
  }
}

export class Batched extends ProcessorNode {
  static override batchingPolicy = { max_batch: 8, max_wait_ms: 20 };
  process(x: unknown) {
    return x;
  }
}

export class KeyedSink extends ConsumerNode {
  static override effectGuarantee = "idempotent_key" as const;
  static override permissions = { write: ["./out"], net: [] };
  consume() {}
}

const LOCAL = new ModuleIndex().add(import.meta.url, { Batched, Grouped, KeyedSink, Proc, Sink, Src });

function spec(init: Partial<NodeSpecInit> & { name: string }): NodeSpec {
  return new NodeSpec({
    nodeClass: `file:///f.ts#C`,
    params: {},
    parents: [],
    kind: "processor",
    hasChildren: false,
    nbTasks: 1,
    deviceType: "cpu",
    isFinite: true,
    ...init,
  });
}

Deno.test("a spec serializes to exactly the spec's 21 keys, in the spec's order", () => {
  const dict = spec({ name: "n" }).toDict();
  assert.deepEqual(Object.keys(dict), SPEC_KEYS);
  assert.equal(
    JSON.stringify(dict),
    '{"name":"n","node_class":"file:///f.ts#C","params":{},"parents":[],"kind":"processor",' +
      '"has_children":false,"nb_tasks":1,"device_type":"cpu","is_finite":true,"image":null,' +
      '"partition_by":null,"join_policy":null,"component_ref":null,"descriptor":null,"command":null,' +
      '"protocol_version":null,"gpu_count":1,"gpu_resource_name":null,"blob_readers":null,' +
      '"gpu_memory_gib":null,"delivery":null}',
  );
  assert.equal(JSON.stringify(spec({ name: "n" })), JSON.stringify(dict), "toJSON is toDict");
});

Deno.test("fromDict(toDict()) round-trips every field", () => {
  const full = spec({
    name: "detector",
    params: { name: "detector", weights: "/m.bin", thresholds: [0.5, 0.7] },
    parents: ["a", "b"],
    hasChildren: true,
    nbTasks: 3,
    deviceType: "gpu",
    isFinite: true,
    image: "ghcr.io/me/det:v1",
    partitionBy: "trace_id",
    joinPolicy: new JoinPolicy({ timeoutSeconds: 2 }).toDict() as never,
    componentRef: "components/det",
    descriptor: { spec: { device: ["gpu"] } },
    command: ["./run", "--fast"],
    protocolVersion: 4,
    gpuCount: 2,
    gpuResourceName: "nvidia.com/mig-1g.10gb",
    blobReaders: 5,
    gpuMemoryGib: 9.5,
    delivery: { delivery: "at-least-once" },
  });
  const again = NodeSpec.fromDict(JSON.parse(JSON.stringify(full.toDict())));
  assert.deepEqual(again.toDict(), full.toDict());
  assert.ok(again.isRemote);
  assert.ok(!again.isNative);
  assert.ok(again.isPartitioned);
});

Deno.test("fromDict gives absent optional keys their defaults: a legacy spec has blob_readers null", () => {
  const legacy = spec({ name: "n" }).toDict() as unknown as Record<string, unknown>;
  for (const key of SPEC_KEYS.slice(9)) delete legacy[key];
  const read = NodeSpec.fromDict(legacy);
  assert.equal(read.blobReaders, null);
  assert.equal(read.gpuCount, 1);
  assert.deepEqual(read.toDict(), spec({ name: "n" }).toDict());
});

Deno.test("fromDict refuses a bad document with one ConfigError listing every problem", () => {
  const bad = {
    ...spec({ name: "n" }).toDict(),
    nb_tasks: 0,
    kind: "transformer",
    params: { fn: "ok", when: null, x: [1, { y: NaN }] },
    extra: 1,
  } as Record<string, unknown>;
  delete bad.is_finite;
  assert.throws(
    () => NodeSpec.fromDict(bad),
    (e: unknown) =>
      e instanceof ConfigError && /params must be a JSON object/.test(e.message) &&
      /kind must be/.test(e.message) &&
      /nb_tasks must be/.test(e.message) && /is_finite is missing/.test(e.message) &&
      /unknown key "extra"/.test(e.message) && (e.context.problems as string[]).length === 5,
  );
  for (const notADict of [null, [], "spec", 3]) assert.throws(() => NodeSpec.fromDict(notADict), ConfigError);
});

Deno.test("specsFromDicts reads a list and names the bad entry", () => {
  const specs = [spec({ name: "a" }), spec({ name: "b", parents: ["a"] })];
  assert.deepEqual(specsFromDicts(specs.map((s) => s.toDict())).map((s) => s.name), ["a", "b"]);
  assert.throws(
    () => specsFromDicts([specs[0].toDict(), { name: "b" }]),
    (e: unknown) => e instanceof ConfigError && e.message.startsWith("invalid specs[1] b:"),
  );
  assert.throws(() => specsFromDicts({ specs: [] }), ConfigError);
});

Deno.test("compileFlow emits one spec per node in topological order, classes by module URL#export", () => {
  const specs = compileFlow(squares.default, { modules: SQUARES });
  assert.deepEqual(specs.map((s) => s.name), ["count", "square", "sum", "print"]);
  assert.deepEqual(specs.map((s) => s.nodeClass), [
    `${SQUARES_URL}#Count`,
    `${SQUARES_URL}#Square`,
    `${SQUARES_URL}#Sum`,
    `${SQUARES_URL}#Print`,
  ]);
  assert.deepEqual(specs.map((s) => s.kind), ["producer", "processor", "processor", "consumer"]);
  assert.deepEqual(specs.map((s) => s.parents), [[], ["count"], ["count", "square"], ["sum"]]);
  assert.deepEqual(specs.map((s) => s.hasChildren), [true, true, true, false]);
  assert.deepEqual(specs.map((s) => s.nbTasks), [1, 2, 1, 1]);
  assert.deepEqual(specs.map((s) => s.blobReaders), [2, 1, 1, 0]);
  assert.deepEqual(specs[0].params, { name: "count", n: 10 });
  assert.ok(
    specs.every((s) => s.deviceType === "cpu" && s.isFinite && s.gpuCount === 1 && s.delivery === null),
  );
});

Deno.test("a worker rebuilds every node of a compiled flow from its spec alone", async () => {
  const specs = compileFlow(squares.default, { modules: SQUARES });
  const original = squares.default.topologicalSort();
  for (const [i, s] of specs.entries()) {
    const read = NodeSpec.fromDict(JSON.parse(JSON.stringify(s)));
    const node = await rebuildNode(read.nodeClass!, read.params, read.kind);
    assert.equal(node.constructor, original[i].constructor);
    assert.equal(node.name, original[i].name);
    assert.deepEqual(node.getParams(), original[i].getParams());
  }
});

Deno.test("compiled node settings reach the spec: partitioning, join policy, GPU, delivery, image", () => {
  const a = new Src({ name: "a", isFinite: false });
  const b = new Src({ name: "b" });
  const join = new Proc({
    name: "join",
    nbTasks: 3,
    partitionBy: "trace_id",
    joinPolicy: { missing: "wait" },
    deviceType: "gpu",
    gpuMemoryGib: 10,
    delivery: "at-least-once",
    image: "ghcr.io/me/app:v1",
  }).from(a, b);
  const flow = new Flow([new Sink({ name: "sink", onError: "poison" }).from(join)]);
  const [first, , joined, sink] = compileFlow(flow, { modules: LOCAL });
  assert.equal(first.isFinite, false);
  assert.equal(joined.partitionBy, "trace_id");
  assert.deepEqual(joined.joinPolicy, new JoinPolicy({ missing: "wait" }).toDict());
  assert.equal(joined.deviceType, "gpu");
  assert.equal(joined.gpuMemoryGib, 10);
  assert.deepEqual(joined.delivery, { delivery: "at-least-once" });
  assert.equal(joined.image, "ghcr.io/me/app:v1");
  assert.deepEqual(sink.delivery, { on_error: "poison" });
  assert.equal(first.blobReaders, 3, "a partitioned child holds one obligation per replica");
  assert.deepEqual(blobReaderIds(first, [first, joined, sink]), ["join/p0", "join/p1", "join/p2"]);
});

Deno.test("compileFlow tells onWarning each warning of the flow's validation, and compiles it", () => {
  const seen: string[] = [];
  const onWarning = (warning: { render(): string }) => seen.push(warning.render());
  assert.equal(compileFlow(squares.default, { modules: SQUARES, onWarning }).length, 4);
  assert.deepEqual(seen, [], "a sound flow has no warning");
  const pair = new Proc({ name: "pair" }).from(new Src({ name: "a" }), new Src({ name: "b" }));
  const specs = compileFlow(new Flow([new Sink({ name: "sink" }).from(pair)]), { modules: LOCAL, onWarning });
  assert.deepEqual(specs.map((s) => s.name), ["a", "b", "pair", "sink"]);
  assert.equal(seen.length, 1, seen.join("\n"));
  assert.match(
    seen[0],
    /^warning VF_GRAPH pair: node pair joins a, b by trace id, but they descend from no common producer/,
  );
});

Deno.test("compileFlow validates first and raises every problem in one GraphError", () => {
  assert.throws(
    () => compileFlow(several.default, { modules: new ModuleIndex().add("file:///several.ts", several) }),
    (e: unknown) => e instanceof GraphError && e.diagnostics.length === 5,
  );
  const url = new URL("../../fixtures/flows/unexported.ts", import.meta.url).href;
  assert.throws(
    () => compileFlow(unexported.default, { modules: new ModuleIndex().add(url, unexported) }),
    (e: unknown) =>
      e instanceof GraphError && e.diagnostics.length === 1 && e.diagnostics[0].code === "VF_NODE_CONTRACT" &&
      /Hidden/.test(e.diagnostics[0].message),
  );
});

Deno.test("only envelope version 4 is accepted; no pin is accepted", () => {
  assert.doesNotThrow(() => validateWireCompatibility([], 4));
  assert.doesNotThrow(() => validateWireCompatibility([], null));
  assert.doesNotThrow(() => validateWireCompatibility([], undefined));
  for (const version of [3, 5, 0]) {
    assert.throws(
      () => validateWireCompatibility([spec({ name: "native", nodeClass: null })], version),
      (e: unknown) =>
        e instanceof ConfigError && /set it to 4/.test(e.remedy ?? "") &&
        (e.context.native_components as string[])[0] === "native",
    );
  }
  assert.throws(() => compileFlow(squares.default, { modules: SQUARES, envelopeVersion: 3 }), ConfigError);
  assert.equal(compileFlow(squares.default, { modules: SQUARES, envelopeVersion: 4 }).length, 4);
});

Deno.test("a flow that declares nothing extra compiles to exactly { specs }, byte for byte the same", () => {
  const first = JSON.stringify(compileToDict(squares.default, { modules: SQUARES }));
  const second = JSON.stringify(compileToDict(squares.default, { modules: SQUARES }));
  assert.equal(first, second);
  assert.deepEqual(Object.keys(JSON.parse(first)), ["specs"]);
  const empty = { isEmpty: () => true, toDict: () => ({ restart_safe: false }) };
  assert.equal(
    JSON.stringify(compileToDict(squares.default, { modules: SQUARES, requirements: empty })),
    first,
  );
  const specs = JSON.stringify({ specs: compileFlow(squares.default, { modules: SQUARES }) });
  assert.equal(first, specs);
});

Deno.test("side documents appear, in a fixed order, only for what a flow declares", () => {
  const src = new Src({ name: "src" });
  const grouped = new Grouped({ name: "g2" }).from(src);
  const grouped1 = new Grouped({ name: "g1" }).from(grouped);
  const batched = new Batched({ name: "batched", deviceType: "gpu" }).from(grouped1);
  const flow = new Flow([new KeyedSink({ name: "sink" }).from(batched)]);
  const requirements = { isEmpty: () => false, toDict: () => ({ restart_safe: true }) };
  const doc = compileToDict(flow, { modules: LOCAL, requirements, gpuProvenance: true });
  assert.deepEqual(Object.keys(doc), [
    "specs",
    "requirements",
    "gpu_provenance",
    "execution_groups",
    "batching_policies",
    "sink_guarantees",
    "permissions",
  ]);
  assert.deepEqual(doc.requirements, { restart_safe: true });
  assert.deepEqual(doc.execution_groups, { fused: ["g1", "g2"] });
  assert.deepEqual(doc.batching_policies, { batched: { max_batch: 8, max_wait_ms: 20 } });
  assert.deepEqual(doc.sink_guarantees, { sink: "idempotent_key" });
  assert.deepEqual(doc.permissions, { sink: { write: ["./out"] } });
  assert.deepEqual(doc.gpu_provenance?.batched, {
    device_type: "node",
    gpu_count: "default",
    gpu_memory_gib: "default",
  });
  assert.deepEqual(Object.keys(doc.gpu_provenance ?? {}), ["g2", "g1", "batched"], "processors only");
  assert.ok(
    doc.specs.every((s) => Object.keys(s).join() === SPEC_KEYS.join()),
    "side documents never touch a spec",
  );
  const plain = compileToDict(flow, { modules: LOCAL });
  assert.ok(!("gpu_provenance" in plain) && !("requirements" in plain), "provenance only when asked for");
});

Deno.test("the side-document helpers are empty for a flow that declares nothing", () => {
  const flow = squares.default;
  assert.deepEqual(executionGroups(flow), {});
  assert.deepEqual(batchingPolicies(flow), {});
  assert.deepEqual(sinkGuarantees(flow), {});
  assert.deepEqual(nodePermissions(flow), {});
  assert.deepEqual(Object.keys(gpuProvenance(flow)), ["square", "sum"]);
});

Deno.test("blob readers count competing children once and partitioned children per replica", () => {
  const root = spec({ name: "root", kind: "producer" });
  const competing = spec({ name: "comp", parents: ["root"], nbTasks: 4 });
  const partitioned = spec({ name: "part", parents: ["root", "comp"], nbTasks: 3, partitionBy: "trace_id" });
  const keyedSingle = spec({ name: "single", parents: ["root"], nbTasks: 1, partitionBy: "cam" });
  const leaf = spec({ name: "leaf", parents: ["part"], kind: "consumer" });
  const specs = [root, competing, partitioned, keyedSingle, leaf];
  assert.equal(blobReaders(root, specs), 1 + 3 + 1);
  assert.deepEqual(blobReaderIds(root, specs), ["comp", "part/p0", "part/p1", "part/p2", "single"]);
  assert.equal(blobReaders(competing, specs), 3);
  assert.equal(blobReaders(leaf, specs), 0);
  assert.deepEqual(blobReaderIds(leaf, specs), []);
  assert.deepEqual(parentReplicas(partitioned, specs), [1, 4]);
  assert.deepEqual(parentReplicas(root, specs), []);
  assert.throws(() => parentReplicas(spec({ name: "x", parents: ["ghost"] }), specs), ConfigError);
});

Deno.test("random spec graphs: reader ids are as many as blob readers, and unique", () => {
  for (let run = 0; run < 300; run++) {
    const seed = 0xb10b + run;
    const random = new SeededRandom(seed);
    const count = random.int(2, 13);
    const specs: NodeSpec[] = [];
    for (let i = 0; i < count; i++) {
      const parents = i === 0 ? [] : [
        ...new Set(
          Array.from({ length: random.int(1, 2) }, () => `n${random.int(0, i - 1)}`),
        ),
      ];
      const nbTasks = random.int(1, 4);
      specs.push(
        spec({ name: `n${i}`, parents, nbTasks, partitionBy: random.chance(0.5) ? "trace_id" : null }),
      );
    }
    for (const s of specs) {
      const ids = blobReaderIds(s, specs);
      assert.equal(ids.length, blobReaders(s, specs), `seed ${seed}`);
      assert.equal(new Set(ids).size, ids.length, `seed ${seed}`);
      const expected = specs.filter((c) => c.parents.includes(s.name))
        .reduce((sum, c) => sum + (c.partitionBy !== null && c.nbTasks > 1 ? c.nbTasks : 1), 0);
      assert.equal(blobReaders(s, specs), expected, `seed ${seed}`);
      assert.deepEqual(
        parentReplicas(s, specs),
        s.parents.map((p) => specs.find((x) => x.name === p)!.nbTasks),
      );
    }
  }
});

Deno.test("native and remote components are told apart by node class and component ref", () => {
  const local = spec({ name: "local" });
  const remotePython = spec({ name: "rp", componentRef: "components/sort" });
  const native = spec({
    name: "native",
    nodeClass: null,
    componentRef: "components/det",
    command: ["./det"],
  });
  assert.ok(!hasNativeComponents([local, remotePython]));
  assert.ok(hasNativeComponents([local, native]));
  assert.ok(!hasRemoteComponents([local]));
  assert.ok(hasRemoteComponents([local, remotePython]));
});
