import assert from "node:assert/strict";
import { ConfigError, GraphError } from "../../../src/core/errors.ts";
import { Flow, type FlowOptions, type FlowType, generateFlowId } from "../../../src/core/flow.ts";
import { kubernetesName, sanitize } from "../../../src/backends/names.ts";
import { ModuleIndex } from "../../../src/core/node_class.ts";
import * as squares from "../../fixtures/flows/squares.ts";
import * as unexported from "../../fixtures/flows/unexported.ts";

const SQUARES_URL = new URL("../../fixtures/flows/squares.ts", import.meta.url).href;

function squaresFlow(options: { flowType?: FlowType; flowId?: string } = {}) {
  const count = new squares.Count({ name: "count", n: 3 });
  const square = new squares.Square({ name: "square", nbTasks: 2 }).from(count);
  const sum = new squares.Sum({ name: "sum" }).from(count, square);
  const print = new squares.Print({ name: "print" }).from(sum);
  return { flow: new Flow([print], options), count, square, sum, print };
}

Deno.test("a flow is realtime with a generated id unless told otherwise", () => {
  const { flow } = squaresFlow();
  assert.equal(flow.flowType, "realtime");
  assert.match(flow.flowId, /^flow-[0-9a-f]{8}$/);
  const named = squaresFlow({ flowType: "batch", flowId: "squares" }).flow;
  assert.equal(named.flowType, "batch");
  assert.equal(named.flowId, "squares");
});

Deno.test("a generated flow id is fresh each time and unchanged by both name encoders", () => {
  const ids = new Set(Array.from({ length: 200 }, generateFlowId));
  assert.equal(ids.size, 200);
  for (const id of ids) {
    assert.equal(sanitize(id), id);
    assert.equal(kubernetesName(id), id);
  }
});

Deno.test("an unknown flow type, an empty flow id or an unknown option is a ConfigError", () => {
  const { print } = squaresFlow();
  assert.throws(() => new Flow([print], { flowType: "stream" as FlowType }), ConfigError);
  assert.throws(() => new Flow([print], { flowId: "" }), ConfigError);
  assert.throws(() => new Flow(print as unknown as [], {}), ConfigError);
  assert.throws(
    () => new Flow([print], { flowType: "batch", bogus: 1 } as FlowOptions),
    (e: unknown) => e instanceof ConfigError && /unknown Flow option "bogus"/.test(e.message),
  );
});

Deno.test("producers are found by walking parents back from the consumers", () => {
  const { flow, count } = squaresFlow();
  assert.deepEqual(flow.producers, [count]);
  assert.deepEqual(flow.nodes.map((n) => n.name), ["print", "sum", "count", "square"]);
  assert.deepEqual(flow.consumers.map((n) => n.name), ["print"]);
});

Deno.test("the topological sort follows the wiring: count, square, sum, print", () => {
  const { flow } = squaresFlow();
  assert.deepEqual(flow.topologicalSort().map((n) => n.name), ["count", "square", "sum", "print"]);
});

Deno.test("tasksData lists each node with its parents' names and whether nothing consumes it", () => {
  const { flow } = squaresFlow();
  assert.deepEqual(
    flow.tasksData().map((t) => [t.node.name, t.parentNames, t.isLast]),
    [["count", [], false], ["square", ["count"], false], ["sum", ["count", "square"], false], ["print", [
      "sum",
    ], true]],
  );
});

Deno.test("a node's children outside the flow do not count as children of the flow", () => {
  const { flow, sum } = squaresFlow();
  const stray = new squares.Print({ name: "stray" }).from(sum);
  assert.deepEqual(sum.children.map((n) => n.name), ["print", "stray"]);
  assert.deepEqual(flow.childrenOf(sum).map((n) => n.name), ["print"]);
  assert.equal(flow.tasksData().find((t) => t.node === sum)?.isLast, false);
  assert.ok(!flow.nodes.includes(stray));
});

Deno.test("tasksData and topologicalSort refuse an invalid graph with one GraphError", () => {
  const a = new squares.Square({ name: "a" });
  const b = new squares.Square({ name: "b" }).from(a);
  a.from(b);
  const flow = new Flow([new squares.Print({ name: "p" }).from(b)]);
  assert.throws(
    () => flow.topologicalSort(),
    (e: unknown) => e instanceof GraphError && e.diagnostics.length === 1,
  );
  assert.throws(
    () => flow.tasksData(),
    (e: unknown) => e instanceof GraphError && e.diagnostics.length === 2,
  );
});

Deno.test("a flow validates against a module index: the fixture's hidden class is reported", () => {
  const url = new URL("../../fixtures/flows/unexported.ts", import.meta.url).href;
  const diagnostics = unexported.default.validate(new ModuleIndex().add(url, unexported));
  assert.deepEqual(diagnostics.map((d) => [d.code, d.node]), [["VF_NODE_CONTRACT", "hidden"]]);
  assert.deepEqual(unexported.default.validate(), []);
  assert.deepEqual(squares.default.validate(new ModuleIndex().add(SQUARES_URL, squares)), []);
});

Deno.test("a flow with several consumers discovers shared ancestors once, in consumer order", () => {
  const count = new squares.Count({ name: "count", n: 1 });
  const square = new squares.Square({ name: "square" }).from(count);
  const first = new squares.Print({ name: "first" }).from(square);
  const second = new squares.Print({ name: "second" }).from(count);
  const flow = new Flow([second, first]);
  assert.deepEqual(flow.nodes.map((n) => n.name), ["second", "count", "first", "square"]);
  assert.deepEqual(flow.topologicalSort().map((n) => n.name), ["count", "second", "square", "first"]);
});
