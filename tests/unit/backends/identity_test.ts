import assert from "node:assert/strict";
import { IdentityCollision } from "../../../src/core/errors.ts";
import {
  type Collision,
  collisions,
  collisionsAcrossRuns,
  derivedNames,
  flowLabels,
  hasOwnerLabels,
  LogicalIdentity,
  type NamedSpec,
  nodeNameCollisions,
  OwnerLabel,
  ownerLabels,
  owns,
  raiseForCollisions,
  renderCollisions,
} from "../../../src/backends/identity.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const SEED = testSeed();

function spec(
  name: string,
  parents: string[] = [],
  nbTasks = 1,
  partitionBy: string | null = null,
): NamedSpec {
  return { name, parents, nbTasks, partitionBy };
}

function rendered(identities: readonly LogicalIdentity[] | undefined): string[] {
  return (identities ?? []).map((i) => i.render());
}

function physicalOf(found: readonly Collision[], kind: string): string[] {
  return found.filter((c) => c.identities[0].kind === kind).map((c) => c.physical);
}

const PIPELINE = [
  spec("cam"),
  spec("det", ["cam"], 2, "trace_id"),
  spec("sink", ["det", "outside"]),
];

Deno.test("derivedNames enumerates every name of a flow with the identity behind it", () => {
  const names = derivedNames(PIPELINE, "f", "r");
  assert.deepEqual(rendered(names.get("vf.f.r._control.stop")), ['control_subject("f", "r")']);
  assert.deepEqual(rendered(names.get("vf-f-dlq")), ['dlq_stream("f")']);
  assert.deepEqual(rendered(names.get("vf-f-r-")), ['stream_prefix("f", "r")']);
  assert.deepEqual(rendered(names.get("vf-f-broker")), ['k8s_broker("f")']);
  assert.deepEqual(rendered(names.get("vf.f.r.cam")), ['subject("f", "r", "cam")']);
  assert.deepEqual(rendered(names.get("vf.f.r.cam._eos")), ['eos_subject("f", "r", "cam")']);
  assert.deepEqual(rendered(names.get("vf-f-r-det")), ['stream("f", "r", "det")']);
  assert.deepEqual(rendered(names.get("det--eos--anchor")), ['eos_anchor("det")']);
  assert.deepEqual(rendered(names.get("vf.f._dlq.r.sink")), ['dlq_subject("f", "r", "sink")']);
  assert.deepEqual(rendered(names.get("vf-f-sink")), ['k8s_workload("f", "sink")']);
  assert.deepEqual(rendered(names.get("vf-f-sink-pdb")), ['k8s_pdb("f", "sink")']);
  assert.deepEqual(rendered(names.get("det--from--cam--p0")), ['partitioned_durable("det", "cam", "0")']);
  assert.deepEqual(rendered(names.get("det--from--cam--p1")), ['partitioned_durable("det", "cam", "1")']);
  assert.equal(names.has("det--from--cam"), false, "a partitioned child has no shared durable");
  assert.deepEqual(rendered(names.get("sink--from--det")), ['durable("sink", "det")']);
  assert.equal(
    [...names.keys()].some((n) => n.includes("outside")),
    false,
    "an unknown parent brings nothing",
  );
  assert.equal([...names.keys()].some((n) => n.includes("--eos--") && !n.endsWith("anchor")), false);
});

Deno.test("derivedNames adds the EOS durables of known instances, given as a Map or a record", () => {
  for (const ids of [new Map([["sink", ["u1", "u.2"]]]), { sink: ["u1", "u.2"] }]) {
    const names = derivedNames(PIPELINE, "f", "r", ids);
    assert.deepEqual(rendered(names.get("sink--eos--det--u1")), ['eos_durable("sink", "det", "u1")']);
    assert.deepEqual(rendered(names.get("sink--eos--det--u_2")), ['eos_durable("sink", "det", "u.2")']);
  }
});

Deno.test("a replicated node without a partition key shares one durable", () => {
  const names = derivedNames([spec("a"), spec("b", ["a"], 3)], "f", "r");
  assert.deepEqual(rendered(names.get("b--from--a")), ['durable("b", "a")']);
  assert.equal(names.has("b--from--a--p0"), false);
});

Deno.test("nodes a.b and a_b collide on every broker name and the Kubernetes names", () => {
  const found = collisions([spec("a.b"), spec("a_b")], "f", "r");
  const stream = found.find((c) => c.physical === "vf-f-r-a_b");
  assert.ok(stream, renderCollisions(found));
  assert.equal(stream.render(), '"vf-f-r-a_b" <- stream("f", "r", "a.b") and stream("f", "r", "a_b")');
  for (const kind of ["subject", "eos_subject", "eos_anchor", "dlq_subject", "k8s_workload", "k8s_scaler"]) {
    assert.equal(physicalOf(found, kind).length, 1, `${kind}: ${renderCollisions(found)}`);
  }
  assert.throws(() => raiseForCollisions(found), (error: unknown) => {
    assert.ok(error instanceof IdentityCollision);
    assert.equal(error.code, "VF_IDENTITY_COLLISION");
    assert.match(error.message, /vf-f-r-a_b/);
    assert.ok(error.remedy);
    return true;
  });
});

Deno.test("Node and node collide only in Kubernetes", () => {
  const found = collisions([spec("Node"), spec("node")], "f", "r");
  assert.deepEqual(physicalOf(found, "stream"), []);
  assert.deepEqual(physicalOf(found, "k8s_workload"), ["vf-f-node"]);
});

Deno.test("two long names that truncate onto each other collide in Kubernetes", () => {
  const stem = "camera-pipeline-stage-".repeat(3);
  const found = collisions([spec(`${stem}alpha`), spec(`${stem}beta`)], "flow", "r");
  assert.deepEqual(physicalOf(found, "stream"), []);
  assert.equal(physicalOf(found, "k8s_workload").length, 1, renderCollisions(found));
});

Deno.test("hyphen-joined durable names collide across positions", () => {
  const found = collisions(
    [spec("b--from--c"), spec("c"), spec("a--from--b", ["c"]), spec("a", ["b--from--c"])],
    "f",
    "r",
  );
  assert.deepEqual(
    found.filter((c) => c.identities[0].kind === "durable").map((c) => c.render()),
    ['"a--from--b--from--c" <- durable("a", "b--from--c") and durable("a--from--b", "c")'],
  );
});

Deno.test("different kinds sharing one string are not a collision", () => {
  const specs = [spec("c--from--p"), spec("p--eos--anchor"), spec("c", ["p--eos--anchor"])];
  const names = derivedNames(specs, "f", "r");
  assert.deepEqual(rendered(names.get("c--from--p--eos--anchor")), [
    'eos_anchor("c--from--p")',
    'durable("c", "p--eos--anchor")',
  ]);
  assert.deepEqual(collisions(specs, "f", "r"), []);
});

Deno.test("runs r and r-x share stream names but never subjects, and the DLQ stream is not theirs", () => {
  const specs = [spec("n"), spec("x-n")];
  const found = collisionsAcrossRuns(specs, "f", ["r", "r-x"]);
  assert.deepEqual(
    found.map((c) => c.render()),
    ['"vf-f-r-x-n" <- stream("f", "r", "x-n") and stream("f", "r-x", "n")'],
  );
  assert.deepEqual(collisions(specs, "f", "r"), []);
  assert.deepEqual(collisionsAcrossRuns(specs, "f", ["r1", "r2", "r1"]), []);
});

const LOWER_ALPHANUMERIC = [..."abcdefghijklmnopqrstuvwxyz0123456789"];

Deno.test("distinct lower-case alphanumeric names never collide", () => {
  const random = new SeededRandom(SEED);
  for (let round = 0; round < 200; round++) {
    const names = new Set<string>();
    const count = random.int(2, 9);
    while (names.size < count) {
      const length = random.int(1, 20);
      names.add(Array.from({ length }, () => random.pick(LOWER_ALPHANUMERIC)).join(""));
    }
    const list = [...names];
    const specs = list.map((name, i) =>
      spec(name, i === 0 ? [] : [list[i - 1]], 1 + (i % 3), i % 2 ? "key" : null)
    );
    assert.deepEqual(collisions(specs, "flow", "run"), [], `VF_TEST_SEED=${SEED}: ${list.join(",")}`);
    assert.deepEqual(nodeNameCollisions(list), [], `VF_TEST_SEED=${SEED}: ${list.join(",")}`);
  }
});

Deno.test("nodeNameCollisions finds names one encoder maps together", () => {
  const found = nodeNameCollisions(["a.b", "a_b", "Node", "node", "ok", "ok"]);
  assert.deepEqual(found.map((c) => c.render()), [
    '"a_b" <- broker("a.b") and broker("a_b")',
    '"vf-f-a-b" <- kubernetes("a.b") and kubernetes("a_b")',
    '"vf-f-node" <- kubernetes("Node") and kubernetes("node")',
  ]);
  assert.equal(
    renderCollisions(found.slice(0, 2)),
    '  - "a_b" <- broker("a.b") and broker("a_b")\n  - "vf-f-a-b" <- kubernetes("a.b") and kubernetes("a_b")',
  );
  const long = nodeNameCollisions([`${"x".repeat(60)}1`, `${"x".repeat(60)}2`]);
  assert.deepEqual(long.map((c) => c.identities[0].kind), ["kubernetes"]);
  assert.deepEqual(nodeNameCollisions([]), []);
});

Deno.test("identities are immutable values compared by kind and parts", () => {
  const identity = new LogicalIdentity("stream", ["f", "r", "n"]);
  assert.equal(identity.key, new LogicalIdentity("stream", ["f", "r", "n"]).key);
  assert.notEqual(identity.key, new LogicalIdentity("stream", ["f", "r-n"]).key);
  assert.throws(() => (identity.parts as string[]).push("x"), TypeError);
  assert.doesNotThrow(() => raiseForCollisions([]));
});

Deno.test("owner labels carry flow and run always, node, kind and generation when given", () => {
  assert.deepEqual(ownerLabels("f", "r"), { [OwnerLabel.flow]: "f", [OwnerLabel.run]: "r" });
  assert.deepEqual(ownerLabels("f", "r", "n", "stream", "g1"), {
    "videoflow.io/flow-id": "f",
    "videoflow.io/run-id": "r",
    "videoflow.io/node": "n",
    "videoflow.io/kind": "stream",
    "videoflow.io/generation": "g1",
  });
  assert.deepEqual(flowLabels("f", "dlq"), { "videoflow.io/flow-id": "f", "videoflow.io/kind": "dlq" });
});

Deno.test("owns matches flow and run exactly, never by prefix", () => {
  const labels = ownerLabels("f", "r-x", "n", "stream", "g1");
  assert.equal(owns(labels, "f", "r-x"), true);
  assert.equal(owns(labels, "f", "r"), false);
  assert.equal(owns(ownerLabels("f", "r"), "f", "r-x"), false);
  assert.equal(owns(labels, "F", "r-x"), false);
  assert.equal(owns(labels, "f", "r-x", "g1"), true);
  assert.equal(owns(labels, "f", "r-x", "g2"), false);
  assert.equal(
    owns(ownerLabels("f", "r-x"), "f", "r-x", "g1"),
    false,
    "a generation asked for must be there",
  );
  assert.equal(owns(flowLabels("f", "dlq"), "f", ""), false, "a flow-scoped resource is no run's");
  assert.equal(owns(null, "f", "r"), false);
  assert.equal(owns({}, "f", "r"), false);
  assert.equal(owns({ [OwnerLabel.flow]: "f" }, "f", "r"), false);
});

Deno.test("hasOwnerLabels tells labelled resources from legacy ones", () => {
  assert.equal(hasOwnerLabels(ownerLabels("f", "r")), true);
  assert.equal(hasOwnerLabels(flowLabels("f", "dlq")), true);
  assert.equal(hasOwnerLabels({ [OwnerLabel.run]: "r" }), true);
  assert.equal(hasOwnerLabels({ other: "x" }), false);
  assert.equal(hasOwnerLabels({}), false);
  assert.equal(hasOwnerLabels(undefined), false);
});
