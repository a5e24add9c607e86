import assert from "node:assert/strict";
import { type Diagnostic, GraphError, raiseForDiagnostics } from "../../../src/core/errors.ts";
import { discoverNodes, MAX_FLOW_PARAMS_BYTES, topologicalSort, validate } from "../../../src/core/graph.ts";
import { JoinPolicy } from "../../../src/core/join_policy.ts";
import {
  AssetRequirement,
  ConsumerNode,
  END,
  FunctionProcessorNode,
  type Node,
  OneTaskProcessorNode,
  ProcessorNode,
  ProducerNode,
  TaskModuleNode,
} from "../../../src/core/node.ts";
import { ModuleIndex } from "../../../src/core/node_class.ts";
import * as several from "../../fixtures/flows/several_problems.ts";
import { SeededRandom } from "../../support/random.ts";

class Src extends ProducerNode {
  next() {
    return END;
  }
}

class Proc extends ProcessorNode<{ tag?: unknown }> {
  process(x: unknown) {
    return x;
  }
}

class Sink extends ConsumerNode {
  consume() {}
}

class Hidden extends ProcessorNode {
  process(x: unknown) {
    return x;
  }
}

class Tracker extends OneTaskProcessorNode {
  process(x: unknown) {
    return x;
  }
}

/** The module the random graphs' classes are "exported" from; Hidden is deliberately not. */
/** A processor whose params it checks itself: `limit` must be below 10; a `limit` of 13 breaks the check. */
class Limited extends ProcessorNode<{ limit?: number }> {
  override paramProblems(): string[] {
    if (this.params.limit === 13) throw new Error("unlucky");
    return (this.params.limit ?? 0) < 10 ? [] : [`limit must be below 10, got ${this.params.limit}`];
  }
  process(x: unknown): unknown {
    return x;
  }
}

/** A sink that needs its input in the order it was made. */
class Ordered extends ConsumerNode {
  static override inputInOrder = true;
  consume(): void {}
}

const INDEX = new ModuleIndex().add("file:///graph_test/flow.ts", {
  Limited,
  Ordered,
  Proc,
  Sink,
  Src,
  Tracker,
});

/** A fresh producer: each sub-case wires its own, so no node feeds a flow it is not part of. */
const fresh = (name = "src"): Src => new Src({ name });
const pair = (): [Src, Src] => [fresh("a"), fresh("b")];
/** Two processors fed by one producer: parents a trace join can join. */
const siblings = (): [Proc, Proc] => {
  const source = fresh("source");
  return [new Proc({ name: "a" }).from(source), new Proc({ name: "b" }).from(source)];
};

function lines(diagnostics: readonly Diagnostic[]): string[] {
  return diagnostics.map((d) => `${d.severity} ${d.code} ${d.node}`);
}

function errorsOf(diagnostics: readonly Diagnostic[]): Diagnostic[] {
  return diagnostics.filter((d) => d.severity === "error");
}

/** The diagnostics of a one-consumer graph. */
function check(sink: Node, options: { modules?: ModuleIndex } = {}): Diagnostic[] {
  return validate([], [sink], options);
}

function assertOnly(diagnostics: readonly Diagnostic[], expected: string, pattern: RegExp): void {
  assert.deepEqual(lines(diagnostics), [expected], diagnostics.map((d) => d.render()).join("\n"));
  assert.match(diagnostics[0].message, pattern);
  assert.ok(diagnostics[0].remedy, "every diagnostic names a remedy");
}

Deno.test("a sound graph validates clean", () => {
  const src = new Src({ name: "src" });
  const a = new Proc({ name: "a", nbTasks: 4 }).from(src);
  const b = new Proc({ name: "b" }).from(src);
  const join = new Proc({ name: "join", nbTasks: 2, partitionBy: "trace_id" }).from(a, b);
  assert.deepEqual(validate([src], [new Sink({ name: "sink" }).from(join)], { modules: INDEX }), []);
});

Deno.test("a flow without consumers is an error", () => {
  assertOnly(validate([], []), "error VF_GRAPH null", /no consumer/);
});

Deno.test("a listed consumer that is not a ConsumerNode is an error", () => {
  const proc = new Proc({ name: "p" }).from(new Src({ name: "s" }));
  assertOnly(check(proc), "error VF_GRAPH p", /listed as a consumer .* processor/);
});

Deno.test("a root that is not a producer is an error", () => {
  const orphan = new Proc({ name: "orphan" });
  const join = new Proc({ name: "join" }).from(new Src({ name: "src" }), orphan);
  assertOnly(check(new Sink({ name: "sink" }).from(join)), "error VF_GRAPH orphan", /no parent .* producer/);
});

Deno.test("a cycle is an error naming its nodes, and a self-loop is one too", () => {
  const x = new Proc({ name: "x" });
  const y = new Proc({ name: "y" }).from(x);
  x.from(fresh(), y);
  const diagnostics = check(new Sink({ name: "sink" }).from(y));
  assertOnly(diagnostics, "error VF_GRAPH y", /nodes y, x form a cycle/);
  const self = new Proc({ name: "self" });
  self.from(fresh(), self);
  assertOnly(check(new Sink({ name: "s2" }).from(self)), "error VF_GRAPH self", /its own parent/);
});

Deno.test("a consumer unreachable from any producer is an error", () => {
  const x = new Proc({ name: "x" });
  const y = new Proc({ name: "y" }).from(x);
  x.from(y);
  const diagnostics = check(new Sink({ name: "sink" }).from(y));
  assert.deepEqual(lines(diagnostics), ["error VF_GRAPH y", "error VF_GRAPH sink"]);
  assert.match(diagnostics[1].message, /unreachable from any producer/);
});

Deno.test("duplicate names are one error per name", () => {
  const src = new Src({ name: "dup" });
  const diagnostics = check(new Sink({ name: "dup" }).from(new Proc({ name: "dup" }).from(src)));
  assertOnly(diagnostics, "error VF_GRAPH dup", /3 nodes are named "dup"/);
});

Deno.test("names that collide after sanitizing or Kubernetes encoding are identity collisions", () => {
  const left = new Src({ name: "cam.0" });
  const right = new Src({ name: "cam_0" });
  const diagnostics = check(new Sink({ name: "sink" }).from(new Proc({ name: "j" }).from(left, right)));
  assert.deepEqual(lines(diagnostics), [
    "error VF_IDENTITY_COLLISION cam.0",
    "error VF_IDENTITY_COLLISION cam.0",
    "warning VF_GRAPH j",
  ]);
  assert.match(diagnostics[0].message, /"cam.0" and "cam_0" .* broker/);
  assert.match(diagnostics[1].message, /kubernetes/);
  const long = "n".repeat(70);
  const truncated = check(new Sink({ name: `${long}1` }).from(new Src({ name: `${long}2` })));
  assert.deepEqual(lines(truncated), [`error VF_IDENTITY_COLLISION ${long}1`]);
});

Deno.test("with a module index, a node class that is not exported is an error", () => {
  const src = new Src({ name: "src" });
  const sink = new Sink({ name: "sink" }).from(new Hidden({ name: "hidden" }).from(src));
  assertOnly(
    check(sink, { modules: INDEX }),
    "error VF_NODE_CONTRACT hidden",
    /class Hidden is not exported/,
  );
  assert.deepEqual(check(sink), [], "without an index, classes are not checked");
});

Deno.test("params that are not plain JSON are an error naming the key", () => {
  const src = new Src({ name: "src" });
  const sink = new Sink({ name: "sink" }).from(new Proc({ name: "p", tag: { when: new Date(0) } }).from(src));
  assertOnly(check(sink), "error VF_NODE_CONTRACT p", /params\.tag\.when is an instance of Date/);
});

Deno.test("a function node's reference must name an exported function", () => {
  const url = "file:///graph_test/flow.ts";
  const flowModule = { Sink, Src, f: (x: number) => x, n: 1 };
  const index = new ModuleIndex().add(url, flowModule).add("file:///builtins.ts", { FunctionProcessorNode });
  for (
    const [fn, pattern] of [
      [`${url}#missing`, /not exported/],
      [`${url}#n`, /not a function/],
      ["f", /not an export reference/],
    ] as const
  ) {
    const node = new FunctionProcessorNode({ name: "fn", fn }).from(new Src({ name: "src" }));
    assertOnly(
      check(new Sink({ name: "sink" }).from(node), { modules: index }),
      "error VF_NODE_CONTRACT fn",
      pattern,
    );
  }
  const good = new FunctionProcessorNode({ name: "fn", fn: `${url}#f` }).from(new Src({ name: "src" }));
  const sink = new Sink({ name: "sink" }).from(good);
  assert.deepEqual(check(sink, { modules: index }), []);
  const withoutBuiltins = new ModuleIndex().add(url, flowModule);
  assertOnly(
    check(sink, { modules: withoutBuiltins }),
    "error VF_NODE_CONTRACT fn",
    /FunctionProcessorNode is not exported/,
  );
});

Deno.test("framework params of the wrong type are configuration errors, one per key", () => {
  const src = new Src({ name: "src", isFinite: "yes" as unknown as boolean });
  const proc = new Proc({
    name: "p",
    nbTasks: 0,
    deviceType: "tpu" as "gpu",
    partitionBy: "",
    image: 3 as unknown as string,
    prefetch: -1,
  }).from(src);
  const sink = new Sink({ name: "sink", metadata: 1 as unknown as boolean, prefetch: 1.5 }).from(proc);
  const diagnostics = check(sink);
  assert.deepEqual(lines(diagnostics), [
    "error VF_CONFIG src",
    "error VF_CONFIG p",
    "error VF_CONFIG p",
    "error VF_CONFIG p",
    "error VF_CONFIG p",
    "error VF_CONFIG p",
    "error VF_CONFIG sink",
    "error VF_CONFIG sink",
  ]);
  assert.deepEqual(
    diagnostics.map((d) => d.message.match(/: (\w+) must be/)?.[1]),
    ["isFinite", "image", "prefetch", "nbTasks", "deviceType", "partitionBy", "prefetch", "metadata"],
  );
  assertOnly(
    check(new Sink({ name: "s" }).from(new Src({ name: "" }))),
    "error VF_CONFIG ",
    /name must be a non-empty string/,
  );
});

Deno.test("a one-task processor asking for several tasks is an error", () => {
  const node = new Tracker({ name: "t", nbTasks: 2 }).from(new Src({ name: "src" }));
  assertOnly(check(new Sink({ name: "sink" }).from(node)), "error VF_CONFIG t", /one-task processor/);
});

Deno.test("a node listing the same parent twice is an error", () => {
  const src = new Src({ name: "src" });
  const node = new Proc({ name: "p" }).from(src, src);
  assertOnly(check(new Sink({ name: "sink" }).from(node)), "error VF_GRAPH p", /parent src more than once/);
});

Deno.test("an invalid delivery mode or disposition is a configuration error", () => {
  const node = new Proc({ name: "p", delivery: "maybe" as "best-effort", onError: "oops" as "poison" }).from(
    fresh(),
  );
  const diagnostics = check(new Sink({ name: "sink" }).from(node));
  assertOnly(diagnostics, "error VF_CONFIG p", /delivery[\s\S]*onError/);
});

Deno.test("an invalid join policy, a collect of a non-parent and an unreachable quorum are errors", () => {
  const bad = new Proc({ name: "bad", joinPolicy: { mode: "sideways" as "time" } }).from(...pair());
  assertOnly(check(new Sink({ name: "s1" }).from(bad)), "error VF_CONFIG bad", /mode/);
  const quorumOfTwo = (collect: Record<string, number>) =>
    new JoinPolicy({ mode: "time", toleranceMs: 10, timeoutSeconds: 1, quorum: 2, collect });
  const stranger = new Proc({ name: "stranger", joinPolicy: quorumOfTwo({ c: 5 }) }).from(...pair());
  assertOnly(check(new Sink({ name: "s2" }).from(stranger)), "error VF_CONFIG stranger", /collect names c/);
  const short = new Proc({ name: "short", joinPolicy: quorumOfTwo({ b: 5 }) }).from(...pair());
  assertOnly(check(new Sink({ name: "s3" }).from(short)), "error VF_CONFIG short", /quorum 2 exceeds its 1/);
});

Deno.test("a trace join of parents with no producer in common is warned about; siblings or a time join are not", () => {
  assertOnly(
    check(new Sink({ name: "sink" }).from(new Proc({ name: "pair" }).from(...pair()))),
    "warning VF_GRAPH pair",
    /joins a, b by trace id, but they descend from no common producer/,
  );
  assert.deepEqual(
    check(new Sink({ name: "sink" }).from(new Proc({ name: "pair" }).from(...siblings()))),
    [],
  );
  const timed = new Proc({ name: "pair", joinPolicy: { mode: "time", tolerance_ms: 10 } }).from(...pair());
  assert.deepEqual(check(new Sink({ name: "sink" }).from(timed)), []);
});

Deno.test("a replicated join without a partition key is a graph error; with one it is sound", () => {
  const join = new Proc({ name: "join", nbTasks: 3 }).from(...siblings());
  assertOnly(
    check(new Sink({ name: "sink" }).from(join)),
    "error VF_GRAPH join",
    /3 replicas without a partition key/,
  );
  const keyed = new Proc({ name: "keyed", nbTasks: 3, partitionBy: "trace_id" }).from(...siblings());
  assert.deepEqual(check(new Sink({ name: "sink" }).from(keyed)), []);
  const single = new Proc({ name: "single", nbTasks: 3 }).from(fresh("a"));
  assert.deepEqual(check(new Sink({ name: "sink" }).from(single)), [], "one parent needs no key");
});

Deno.test("a time-mode join of several parents on several replicas is an error, whatever its key", () => {
  const time = new JoinPolicy({ mode: "time", toleranceMs: 15, timeoutSeconds: 1 });
  for (const partitionBy of ["trace_id", "rig", null]) {
    const fuse = new Proc({ name: "fuse", nbTasks: 2, partitionBy, joinPolicy: time }).from(...pair());
    assertOnly(
      check(new Sink({ name: "sink" }).from(fuse)),
      "error VF_CONFIG fuse",
      /time-mode join of 2 parents/,
    );
  }
  const single = new Proc({ name: "fuse", nbTasks: 1, joinPolicy: time }).from(...pair());
  assert.deepEqual(check(new Sink({ name: "sink" }).from(single)), [], "one replica assembles every window");
  const oneParent = new Proc({ name: "solo", nbTasks: 2, joinPolicy: time }).from(fresh("a"));
  const warnings = check(new Sink({ name: "sink" }).from(oneParent));
  assert.ok(warnings.every((d) => d.severity === "warning"), "one parent: nothing to align across replicas");
});

Deno.test("GPU knobs on a CPU node and gpuCount > 1 with gpuMemoryGib are configuration errors", () => {
  const cpu = new Proc({ name: "cpu", gpuCount: 1, gpuMemoryGib: 8 }).from(fresh());
  assertOnly(
    check(new Sink({ name: "s1" }).from(cpu)),
    "error VF_CONFIG cpu",
    /CPU but sets gpuCount and gpuMemoryGib/,
  );
  const both = new Proc({ name: "both", deviceType: "gpu", gpuCount: 2, gpuMemoryGib: 8 }).from(fresh());
  assertOnly(check(new Sink({ name: "s2" }).from(both)), "error VF_CONFIG both", /never both/);
  const fine = new Proc({ name: "fine", deviceType: "gpu", gpuCount: 2 }).from(fresh());
  assert.deepEqual(check(new Sink({ name: "s3" }).from(fine)), []);
});

Deno.test("invalid class-level declarations are configuration errors", () => {
  class BadReplay extends Proc {
    static override replayPolicy = "sometimes" as "committed";
  }
  class BadBatch extends Proc {
    static override batchingPolicy = { max_batch: 0, max_wait_ms: 5 };
  }
  class BadSink extends Sink {
    static override effectGuarantee = "exactly" as "idempotent_key";
  }
  class BadKeyPolicy extends Proc {
    static override partitionKeyPolicy = { invalid: "guess" as "reject" };
  }
  class FarFallback extends Proc {
    static override partitionKeyPolicy = { invalid: "fallback" as const, fallback_partition: 2 };
  }
  const cases: ReadonlyArray<readonly [() => Node, RegExp]> = [
    [() => new BadReplay({ name: "n" }), /replayPolicy must be/],
    [() => new BadBatch({ name: "n" }), /batchingPolicy must be/],
    [() => new BadKeyPolicy({ name: "n", partitionBy: "k" }), /invalid/],
    [
      () => new FarFallback({ name: "n", partitionBy: "k", nbTasks: 2 }),
      /fallback_partition 2 is not a replica/,
    ],
  ];
  for (const [make, pattern] of cases) {
    const node = make() as Proc;
    assertOnly(
      check(new Sink({ name: "sink" }).from(node.from(new Src({ name: "src" })))),
      "error VF_CONFIG n",
      pattern,
    );
  }
  const sink = new BadSink({ name: "sink" }).from(new Src({ name: "src" }));
  assertOnly(check(sink), "error VF_CONFIG sink", /effectGuarantee must be/);
});

Deno.test("invalid permissions and asset requirements break the worker contract", () => {
  class BadKind extends Proc {
    static override permissions = { disk: ["/"] } as unknown as { read: string[] };
  }
  class BadAsset extends Proc {
    override requiredAssets() {
      return [new AssetRequirement("/models/w.bin", "not-a-digest")];
    }
  }
  assertOnly(
    check(new Sink({ name: "sink" }).from(new BadKind({ name: "n" }).from(fresh()))),
    "error VF_NODE_CONTRACT n",
    /unknown kind "disk"/,
  );
  assertOnly(
    check(new Sink({ name: "sink" }).from(new BadAsset({ name: "n" }).from(fresh()))),
    "error VF_NODE_CONTRACT n",
    /not an asset requirement/,
  );
});

Deno.test("permission entries Deno would refuse or misread break the worker contract, one kind after another", () => {
  const cases: [Record<string, string[]>, RegExp][] = [
    [{ net: ["*"] }, /net entry "\*" is not a host or host:port/],
    [{ net: ["http://example.com/path"] }, /net entry "http:\/\/example.com\/path"/],
    [{ sys: ["bogus"] }, /sys entry "bogus" is none of loadavg/],
    [{ env: ["*"] }, /env entry "\*" names no variable/],
  ];
  for (const [permissions, message] of cases) {
    class Declares extends Proc {
      static override permissions = permissions;
    }
    assertOnly(
      check(new Sink({ name: "sink" }).from(new Declares({ name: "n" }).from(fresh()))),
      "error VF_NODE_CONTRACT n",
      message,
    );
  }
  class Fine extends Proc {
    static override permissions = { net: ["127.0.0.1:4222", "[::1]:80", "example.com"], sys: ["hostname"] };
  }
  const fine = check(new Sink({ name: "sink" }).from(new Fine({ name: "n" }).from(fresh())));
  assert.equal(fine.filter((d) => d.severity === "error").length, 0, JSON.stringify(fine));
});

Deno.test("a producer that asks for replicas is a VF_CONFIG error: a source runs as one replica", () => {
  const many = new Src({ name: "cam", nbTasks: 4 } as unknown as { name: string });
  assertOnly(
    check(new Sink({ name: "sink" }).from(many)),
    "error VF_CONFIG cam",
    /is a producer, but asks for nbTasks 4/,
  );
});

Deno.test("a TaskModuleNode in a flow is refused: it cannot be rebuilt in a worker", () => {
  const inner = new Proc({ name: "inner" });
  const task = new TaskModuleNode(inner, inner, { name: "task" }).from(new Src({ name: "src" }));
  assertOnly(
    check(new Sink({ name: "sink" }).from(task), { modules: INDEX }),
    "error VF_NODE_CONTRACT task",
    /live node/,
  );
});

Deno.test("warnings name ignored settings and nodes outside the flow, after every error", () => {
  class Versioned extends Src {
    static override analysisVersion = "v2";
  }
  class Peer extends Proc {
    static override requiresPeerAccess = true;
  }
  class Strict extends Proc {
    static override gpuFallback = "none" as const;
  }
  class Keyed extends Proc {
    static override partitionKeyPolicy = { invalid: "reject" as const };
  }
  const src = new Versioned({ name: "src" });
  const lonely = new Src({ name: "lonely" });
  const single = new Proc({ name: "single", joinPolicy: { missing: "wait" } }).from(src);
  const peer = new Peer({ name: "peer", deviceType: "gpu" }).from(single);
  const strict = new Strict({ name: "strict" }).from(peer);
  const keyed = new Keyed({ name: "keyed", nbTasks: 0 }).from(strict);
  new Sink({ name: "elsewhere" }).from(keyed);
  const diagnostics = validate([src, lonely], [new Sink({ name: "sink" }).from(keyed)]);
  assert.deepEqual(lines(diagnostics), [
    "error VF_CONFIG keyed",
    "warning VF_CONFIG src",
    "warning VF_CONFIG single",
    "warning VF_CONFIG peer",
    "warning VF_CONFIG strict",
    "warning VF_GRAPH keyed",
    "warning VF_CONFIG keyed",
    "warning VF_GRAPH lonely",
  ]);
  assert.match(diagnostics[1].message, /analysisVersion/);
  assert.match(diagnostics[2].message, /join policy/);
  assert.match(diagnostics[3].message, /peer access/);
  assert.match(diagnostics[4].message, /runs on CPU/);
  assert.match(diagnostics[5].message, /feeds elsewhere/);
  assert.match(diagnostics[6].message, /partitionKeyPolicy/);
  assert.match(diagnostics[7].message, /feeds no consumer/);
  assert.throws(() => raiseForDiagnostics(diagnostics), GraphError);
  assert.doesNotThrow(() => raiseForDiagnostics(diagnostics.filter((d) => d.severity === "warning")));
});

Deno.test("several problems are reported together, structural first, in a stable order", () => {
  const flow = several.default;
  const expected = [
    "error VF_GRAPH join",
    "error VF_IDENTITY_COLLISION a.b",
    "error VF_IDENTITY_COLLISION a.b",
    "error VF_GRAPH join",
    "error VF_CONFIG knob",
    "warning VF_GRAPH join",
  ];
  for (let i = 0; i < 3; i++) assert.deepEqual(lines(flow.validate()), expected);
  assert.match(flow.validate()[0].message, /2 nodes are named "join"/);
  assert.match(flow.validate()[3].message, /without a partition key/);
  assert.match(flow.validate()[4].message, /gpuCount/);
  assert.throws(
    () => raiseForDiagnostics(flow.validate()),
    (e: unknown) => e instanceof GraphError && e.diagnostics.length === 5,
  );
});

Deno.test("a given topological sort is used for the per-node order", () => {
  const src = new Src({ name: "src" });
  const a = new Proc({ name: "a", nbTasks: 0 }).from(src);
  const b = new Proc({ name: "b", nbTasks: 0 }).from(src);
  const sink = new Sink({ name: "sink" }).from(new Proc({ name: "j" }).from(a, b));
  assert.deepEqual(lines(validate([src], [sink])).slice(0, 2), ["error VF_CONFIG a", "error VF_CONFIG b"]);
  const tsort = [src, b, a, ...sink.parents, sink];
  assert.deepEqual(lines(validate([src], [sink], { tsort })).slice(0, 2), [
    "error VF_CONFIG b",
    "error VF_CONFIG a",
  ]);
});

// ---- randomized: seeded DAGs ----

interface Blueprint {
  /** Per node: its kind and the indexes of its parents (always earlier nodes). */
  readonly nodes: ReadonlyArray<
    { readonly kind: "src" | "proc" | "sink"; readonly parents: readonly number[] }
  >;
  /** The consumers' indexes, in the order the flow lists them. */
  readonly sinks: readonly number[];
}

/** A random DAG: producers first, processors wired to 1–3 distinct earlier nodes, a sink under every leaf. */
function randomBlueprint(random: SeededRandom): Blueprint {
  const producers = random.int(1, 3);
  const processors = random.int(2, 31);
  const nodes: Array<{ kind: "src" | "proc" | "sink"; parents: number[] }> = [];
  for (let i = 0; i < producers; i++) nodes.push({ kind: "src", parents: [] });
  for (let i = 0; i < processors; i++) {
    const fanIn = random.int(1, 3);
    const parents = new Set<number>();
    for (let k = 0; k < fanIn; k++) parents.add(random.int(0, nodes.length - 1));
    nodes.push({ kind: "proc", parents: [...parents] });
  }
  const hasChild = new Set(nodes.flatMap((n) => n.parents));
  const sinks: number[] = [];
  for (let i = 0; i < producers + processors; i++) {
    if (hasChild.has(i)) continue;
    sinks.push(nodes.length);
    nodes.push({ kind: "sink", parents: [i] });
  }
  return { nodes, sinks: random.shuffle(sinks) };
}

/** Builds a blueprint, constructing nodes in `order` (the wiring does not depend on it). */
function build(blueprint: Blueprint, order: readonly number[]): { nodes: Node[]; sinks: Sink[] } {
  const nodes: Node[] = new Array(blueprint.nodes.length);
  for (const i of order) {
    const { kind } = blueprint.nodes[i];
    const name = `n${i}`;
    nodes[i] = kind === "src" ? new Src({ name }) : kind === "proc" ? new Proc({ name }) : new Sink({ name });
  }
  blueprint.nodes.forEach(({ parents }, i) => {
    if (parents.length > 0) (nodes[i] as Proc).from(...parents.map((p) => nodes[p] as Proc));
  });
  return { nodes, sinks: blueprint.sinks.map((i) => nodes[i] as Sink) };
}

function withSeed(name: string, runs: number, body: (random: SeededRandom, seed: number) => void): void {
  Deno.test(name, () => {
    for (let run = 0; run < runs; run++) {
      const seed = 0x5eed + run * 7919;
      try {
        body(new SeededRandom(seed), seed);
      } catch (error) {
        console.error(`failing seed: ${seed}`);
        throw error;
      }
    }
  });
}

withSeed(
  "random DAGs: the topological sort puts every parent before its children, each node once",
  200,
  (random) => {
    const blueprint = randomBlueprint(random);
    const { nodes, sinks } = build(blueprint, blueprint.nodes.map((_, i) => i));
    const sorted = topologicalSort(sinks);
    assert.equal(sorted.length, nodes.length);
    assert.equal(new Set(sorted).size, nodes.length);
    const position = new Map(sorted.map((node, i) => [node, i]));
    for (const node of nodes) {
      for (const parent of node.parents) {
        assert.ok(
          position.get(parent)! < position.get(node)!,
          `${parent.name} -> ${node.name}`,
        );
      }
    }
    const diagnostics = validate([], sinks, { modules: INDEX });
    assert.deepEqual(
      diagnostics.filter((d) => d.severity === "error"),
      [],
      "a random DAG of valid nodes is sound",
    );
    // A node joining parents with no producer in common is warned about, and no other.
    const producersOf = (i: number): Set<number> =>
      blueprint.nodes[i].kind === "src"
        ? new Set([i])
        : new Set(blueprint.nodes[i].parents.flatMap((p) => [...producersOf(p)]));
    const strangers = blueprint.nodes.flatMap(({ parents }, i) => {
      if (parents.length < 2) return [];
      const [first, ...rest] = parents.map(producersOf);
      return [...first].some((p) => rest.every((others) => others.has(p))) ? [] : [`warning VF_GRAPH n${i}`];
    });
    assert.deepEqual(lines(diagnostics).sort(), strangers.sort());
  },
);

withSeed("random DAGs: the sort depends only on the wiring, not on construction order", 100, (random) => {
  const blueprint = randomBlueprint(random);
  const identity = blueprint.nodes.map((_, i) => i);
  const first = build(blueprint, identity);
  const again = build(blueprint, random.shuffle(identity));
  const names = (sinks: readonly Node[]) => topologicalSort(sinks).map((n) => n.name);
  assert.deepEqual(names(again.sinks), names(first.sinks));
  assert.deepEqual(names(first.sinks), names(first.sinks));
  assert.deepEqual(
    discoverNodes(again.sinks).map((n) => n.name),
    discoverNodes(first.sinks).map((n) => n.name),
  );
});

/** A problem planted in a random graph: how to plant it, and how to recognize its diagnostic. */
interface Plant {
  readonly what: string;
  readonly matches: (d: Diagnostic) => boolean;
}

withSeed(
  "random graphs with planted problems: validate finds every one, and nothing else",
  150,
  (random, seed) => {
    const blueprint = randomBlueprint(random);
    const { nodes, sinks } = build(blueprint, blueprint.nodes.map((_, i) => i));
    const procs = nodes.filter((n): n is Proc => n instanceof Proc);
    const free = random.shuffle(procs);
    const take = () => free.pop();
    const plants: Plant[] = [];
    const kinds = random.shuffle([
      "cycle",
      "duplicate",
      "collision",
      "join",
      "gpu",
      "orphan",
      "hidden",
      "json",
    ]);
    for (const kind of kinds.slice(0, random.int(1, kinds.length))) {
      const target = take();
      if (target === undefined) break;
      const name = target.name;
      switch (kind) {
        case "cycle": {
          const child = target.children.find((c) => c instanceof Proc) as Proc | undefined;
          if (child === undefined) break;
          target.from(...target.parents as Proc[], child);
          plants.push({
            what: kind,
            matches: (d) => d.code === "VF_GRAPH" && /cycle/.test(d.message) && d.message.includes(name),
          });
          break;
        }
        case "duplicate": {
          const twin = new Proc({ name: "n0" }).from(...target.parents as Proc[]);
          for (const child of target.children) {
            (child as Proc).from(...child.parents.map((p) => (p === target ? twin : p)) as Proc[]);
          }
          plants.push({
            what: kind,
            matches: (d) => d.code === "VF_GRAPH" && /2 nodes are named "n0"/.test(d.message),
          });
          break;
        }
        case "collision": {
          const dotted = new Proc({ name: `x.${name}` }).from(...target.parents as Proc[]);
          const underscored = new Proc({ name: `x_${name}` }).from(dotted);
          for (const child of target.children) {
            (child as Proc).from(...child.parents.map((p) => (p === target ? underscored : p)) as Proc[]);
          }
          plants.push({
            what: kind,
            matches: (d) => d.code === "VF_IDENTITY_COLLISION" && d.message.includes(`"x.${name}"`),
          });
          break;
        }
        case "join": {
          const replicated = new Proc({ name: `${name}j`, nbTasks: 2 }).from(nodes[0] as Src, target);
          new Sink({ name: `${name}js` }).from(replicated);
          sinks.push(replicated.children[0] as Sink);
          plants.push({
            what: kind,
            matches: (d) => d.node === `${name}j` && /without a partition key/.test(d.message),
          });
          break;
        }
        case "gpu": {
          const knob = new Proc({ name: `${name}g`, gpuMemoryGib: 4 }).from(target);
          sinks.push(new Sink({ name: `${name}gs` }).from(knob));
          plants.push({ what: kind, matches: (d) => d.node === `${name}g` && /runs on CPU/.test(d.message) });
          break;
        }
        case "orphan": {
          const orphan = new Proc({ name: `${name}o` });
          sinks.push(
            new Sink({ name: `${name}os` }).from(new Proc({ name: `${name}oj` }).from(target, orphan)),
          );
          plants.push({ what: kind, matches: (d) => d.node === `${name}o` && /no parent/.test(d.message) });
          break;
        }
        case "hidden": {
          sinks.push(new Sink({ name: `${name}hs` }).from(new Hidden({ name: `${name}h` }).from(target)));
          plants.push({
            what: kind,
            matches: (d) => d.node === `${name}h` && /not exported/.test(d.message),
          });
          break;
        }
        case "json": {
          const bad = new Proc({ name: `${name}f`, tag: { fn: () => 0 } }).from(target);
          sinks.push(new Sink({ name: `${name}fs` }).from(bad));
          plants.push({
            what: kind,
            matches: (d) => d.node === `${name}f` && /params\.tag\.fn/.test(d.message),
          });
          break;
        }
      }
    }
    const errors = errorsOf(validate([], sinks, { modules: INDEX }));
    for (const plant of plants) {
      assert.ok(
        errors.some(plant.matches),
        `seed ${seed}: planted ${plant.what} not found in\n${lines(errors).join("\n")}`,
      );
    }
    for (const error of errors) {
      assert.ok(plants.some((p) => p.matches(error)), `seed ${seed}: unexpected ${error.render()}`);
    }
    assert.deepEqual(
      lines(validate([], sinks, { modules: INDEX })),
      lines(validate([], sinks, { modules: INDEX })),
    );
  },
);

Deno.test("a node's own paramProblems() are VF_CONFIG errors of validation; one that throws is reported too", () => {
  const graph = (limit: number) =>
    check(new Sink({ name: "sink" }).from(new Limited({ name: "lim", limit }).from(fresh())), {
      modules: INDEX,
    });
  assert.deepEqual(graph(3), []);
  assertOnly(graph(12), "error VF_CONFIG lim", /^node lim: limit must be below 10, got 12$/);
  assertOnly(graph(13), "error VF_CONFIG lim", /^node lim: paramProblems\(\) threw: unlucky$/);
});

Deno.test("a node that needs its input in order is warned about an upstream node running several replicas", () => {
  const chain = (nbTasks: number) =>
    new Proc({ name: "mid", nbTasks }).from(new Proc({ name: "pre" }).from(fresh()));
  assert.deepEqual(check(new Ordered({ name: "out" }).from(chain(1)), { modules: INDEX }), []);
  assertOnly(
    check(new Ordered({ name: "out" }).from(chain(3)), { modules: INDEX }),
    "warning VF_GRAPH out",
    /^node out needs its input in the order it was made, but mid runs 3 replicas/,
  );
  assert.deepEqual(
    check(new Sink({ name: "out" }).from(chain(3)), { modules: INDEX }),
    [],
    "a sink that does not care",
  );
  assert.deepEqual(
    check(new Ordered({ name: "out", ordering: { mode: "sequence" } }).from(chain(3)), { modules: INDEX }),
    [],
    "a node that takes its input in sequence order",
  );
  assertOnly(
    check(new Ordered({ name: "out", ordering: { mode: "sorted" as "sequence" } }).from(chain(1)), {
      modules: INDEX,
    }),
    "error VF_CONFIG out",
    /mode/,
  );
});

Deno.test("a delivery override beyond delivery and on_error is a VF_CONFIG error of validation", () => {
  class Greedy extends ProcessorNode {
    override deliveryPolicy() {
      return { delivery: "at-least-once", max_retries: 1 } as ReturnType<ProcessorNode["deliveryPolicy"]>;
    }
    process(x: unknown): unknown {
      return x;
    }
  }
  const modules = new ModuleIndex().add("file:///graph_test/greedy.ts", { Greedy, Sink, Src });
  assertOnly(
    check(new Sink({ name: "sink" }).from(new Greedy({ name: "greedy" }).from(fresh())), { modules }),
    "error VF_CONFIG greedy",
    /^the delivery override of greedy sets max_retries, which only the deployment decides$/,
  );
});

Deno.test("params no transport can carry (over 1 MiB of JSON) are refused: a node's alone, naming it and the size; or the flow's together, naming the largest", () => {
  const padded = (name: string, bytes: number) => new Proc({ name, tag: "x".repeat(bytes) });
  const huge = padded("huge", MAX_FLOW_PARAMS_BYTES);
  const size = new TextEncoder().encode(JSON.stringify(huge.getParams())).length;
  assertOnly(
    check(new Sink({ name: "sink" }).from(huge.from(fresh())), { modules: INDEX }),
    "error VF_NODE_CONTRACT huge",
    new RegExp(`^node huge's params are ${size} bytes of JSON, more than 1048576 bytes`),
  );
  const source = fresh();
  const halves = [padded("a", 600_000).from(source), padded("b", 500_000).from(source)];
  assertOnly(
    check(new Sink({ name: "sink" }).from(new Proc({ name: "join" }).from(...halves)), { modules: INDEX }),
    "error VF_NODE_CONTRACT null",
    /^the nodes' params are 11000\d\d bytes of JSON together \(largest: a 6000\d\d, b 5000\d\d, /,
  );
  const fits = padded("fits", 300_000).from(fresh());
  assert.deepEqual(errorsOf(check(new Sink({ name: "sink" }).from(fits), { modules: INDEX })), []);
});
