/**
 * mod.ts is what a user imports and src/internal.ts what another runtime does: these tests drive the
 * compile → worker rebuild path and the wire identities through internal.ts alone, so an export dropped
 * from it fails here, and check that mod.ts keeps to a user's surface.
 */
import assert from "node:assert/strict";
import * as user from "../../../mod.ts";
import * as api from "../../../src/internal.ts";
import * as squares from "../../fixtures/flows/squares.ts";

const SQUARES_URL = new URL("../../fixtures/flows/squares.ts", import.meta.url).href;

Deno.test("internal.ts exports the compiler's side documents, spec reading and node rebuilding", () => {
  const names = [
    "batchingPolicies",
    "compileToDict",
    "executionGroups",
    "hasNativeComponents",
    "hasRemoteComponents",
    "isNodeClass",
    "loadNodeClass",
    "nodePermissions",
    "rebuildNode",
    "registerNodeModule",
    "sinkGuarantees",
    "specsFromDicts",
  ] as const;
  for (const name of names) assert.equal(typeof api[name], "function", `internal.ts exports ${name}`);
});

Deno.test("a flow compiled through internal.ts is rebuilt node by node from its JSON specs alone", async () => {
  const modules = new api.ModuleIndex().add(SQUARES_URL, squares);
  const doc = api.compileToDict(squares.default, { modules });
  const specs = api.specsFromDicts(JSON.parse(JSON.stringify(doc.specs)));
  assert.deepEqual(specs.map((spec) => spec.name), ["count", "square", "sum", "print"]);
  assert.equal(api.hasNativeComponents(specs), false);
  assert.equal(api.hasRemoteComponents(specs), false);
  for (const spec of specs) {
    assert.ok(api.isNodeClass(await api.loadNodeClass(spec.nodeClass!)), spec.name);
    const node = await api.rebuildNode(spec.nodeClass!, spec.params, spec.kind);
    assert.equal(node.name, spec.name);
    assert.equal(node.kind, spec.kind);
  }
  assert.deepEqual(api.executionGroups(squares.default), {});
  assert.deepEqual(api.batchingPolicies(squares.default), {});
  assert.deepEqual(api.sinkGuarantees(squares.default), {});
  assert.deepEqual(api.nodePermissions(squares.default), {});
});

Deno.test("the wire identities through internal.ts match WIRE.md's examples and each other", () => {
  assert.equal(
    api.deriveMessageId("flow-A", "run-1", "cam", "cam:1", 1, api.MsgType.data),
    "745708c2eeaf98a60fdbebafe1d04eff",
  );
  const trace = api.producerTrace("cam", 1);
  assert.deepEqual(trace, { traceId: "cam:1", seq: 1 });
  const env = api.createEnvelope({
    type: api.MsgType.data,
    producerName: "cam",
    flowId: "flow-A",
    runId: "run-1",
    ...trace,
  });
  assert.equal(env.payloadType, "");
  assert.equal(api.envelopeMessageId(env), "745708c2eeaf98a60fdbebafe1d04eff");
  assert.deepEqual(api.envelopeFromJson(JSON.parse(JSON.stringify(api.envelopeToJson(env)))), env);
  assert.equal(api.encodePayload(42).payloadType, api.PayloadType.value);
  const owner = api.partitionOwner(api.partitionKeyOf("trace_id", trace.traceId, null), 4);
  assert.ok(Number.isInteger(owner) && owner >= 0 && owner < 4, `owner ${owner}`);
  const member = { producer: "cam", traceId: "cam:1", seq: 1 };
  assert.match(api.groupIdentity({ cam: member }, null), /^g-[0-9a-f]{12}$/);
  const window = api.timeGroupIdentity({ cam: { ...member, eventTs: 2.5, arrivalTs: 3 } });
  assert.equal(window.seq, 2_500_000n);
  assert.equal(window.traceId, api.groupIdentity({ cam: member }, null, 2_500_000n));
  assert.deepEqual(api.traceGroupIdentity([{ traceId: "cam:1", seq: 1, eventTs: null }]), {
    traceId: "cam:1",
    seq: 1,
    eventTs: null,
  });
});

Deno.test("mod.ts exports what a user builds and runs flows with; internal.ts re-exports it and the rest", () => {
  for (
    const name of ["Flow", "ProducerNode", "ProcessorNode", "ConsumerNode", "END", "runLocal", "validate"]
  ) {
    assert.ok(name in user, `mod.ts exports ${name}`);
  }
  for (
    const name of ["encodeEnvelope", "rebuildNode", "compileFlow", "openRuntimeStore", "deriveMessageId"]
  ) {
    assert.ok(!(name in user), `${name} is internal`);
    assert.ok(name in api, `internal.ts exports ${name}`);
  }
  for (const [name, value] of Object.entries(user)) {
    assert.equal((api as Record<string, unknown>)[name], value, `internal.ts re-exports ${name}`);
  }
});
