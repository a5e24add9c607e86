import assert from "node:assert/strict";
import { ConfigError } from "../../../src/core/errors.ts";
import {
  controlSubjectFor,
  dlqStreamName,
  dlqSubjectFilter,
  dlqSubjectFor,
  durableNameFor,
  eosAnchorDurableNameFor,
  eosDurableNameFor,
  eosSubjectFor,
  KUBERNETES_NAME_MAX_LENGTH,
  kubernetesFlowResourceName,
  kubernetesName,
  kubernetesNodeResourceName,
  kubernetesWorkloadName,
  partitionedDurableNameFor,
  sanitize,
  streamNameFor,
  streamPrefixFor,
  subjectFor,
  subjectOwner,
} from "../../../src/backends/names.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const SEED = testSeed();
const ALPHABET = [..."aZ0_-. *>éΩ😀/:\t\u0130\u212a"];
function randomString(random: SeededRandom, max: number): string {
  return Array.from({ length: random.int(0, max - 1) }, () => random.pick(ALPHABET)).join("");
}

Deno.test("sanitize turns each run of unsafe characters into one underscore", () => {
  assert.equal(sanitize("a.b"), "a_b");
  assert.equal(sanitize("a..b c"), "a_b_c");
  assert.equal(sanitize("caméra-Ω"), "cam_ra-_");
  assert.equal(sanitize("😀😀x"), "_x");
  assert.equal(sanitize("already_safe-Name09"), "already_safe-Name09");
  assert.equal(sanitize(""), "");
});

Deno.test("sanitize is idempotent, never lengthens, keeps safe strings and yields only [A-Za-z0-9_-]", () => {
  const random = new SeededRandom(SEED);
  for (let i = 0; i < 2000; i++) {
    const value = randomString(random, 24);
    const once = sanitize(value);
    assert.equal(sanitize(once), once, `VF_TEST_SEED=${SEED}: ${JSON.stringify(value)}`);
    assert.match(once, /^[A-Za-z0-9_-]*$/, `VF_TEST_SEED=${SEED}: ${JSON.stringify(value)}`);
    assert.ok(
      once.length <= value.length,
      `VF_TEST_SEED=${SEED}: sanitize never lengthens ${JSON.stringify(value)}`,
    );
    if (/^[A-Za-z0-9_-]*$/.test(value)) {
      assert.equal(once, value, `VF_TEST_SEED=${SEED}: a safe string is kept`);
    }
  }
});

Deno.test("kubernetesName lower-cases, hyphenates non-DNS runs, strips edge hyphens and cuts at 63", () => {
  assert.equal(kubernetesName("vf", "Flow_1", "cam.0"), "vf-flow-1-cam-0");
  assert.equal(kubernetesName("--Node--"), "node");
  assert.equal(kubernetesName("vf", "f", "Node"), kubernetesName("vf", "f", "node"));
  assert.equal(kubernetesName("ÉÉ"), "");
  const cut = kubernetesName("vf", "f", `${"a".repeat(57)}-tail`);
  assert.equal(cut, `vf-f-${"a".repeat(57)}`);
  assert.equal(cut.length, 62, "a hyphen left at the cut is stripped");
});

Deno.test("kubernetesName always yields a DNS-1123 label of at most 63 characters", () => {
  const random = new SeededRandom(SEED ^ 0x9e3779b9);
  for (let i = 0; i < 2000; i++) {
    const parts = Array.from({ length: random.int(1, 3) }, () => randomString(random, 40));
    const name = kubernetesName(...parts);
    assert.ok(name.length <= KUBERNETES_NAME_MAX_LENGTH, `VF_TEST_SEED=${SEED}: ${name}`);
    assert.match(
      name,
      /^(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)?$/,
      `VF_TEST_SEED=${SEED}: ${JSON.stringify(parts)}`,
    );
    assert.equal(kubernetesName(name), name, `VF_TEST_SEED=${SEED}: idempotent on ${name}`);
  }
});

Deno.test("broker names follow WIRE.md with every part sanitized", () => {
  assert.equal(subjectFor("flow-A", "run.1", "cam 0"), "vf.flow-A.run_1.cam_0");
  assert.equal(eosSubjectFor("f", "r", "n.x"), "vf.f.r.n_x._eos");
  assert.equal(streamNameFor("f", "r", "n"), "vf-f-r-n");
  assert.equal(streamPrefixFor("f", "r"), "vf-f-r-");
  assert.equal(controlSubjectFor("f", "r.1"), "vf.f.r_1._control.stop");
  assert.equal(durableNameFor("child.a", "parent"), "child_a--from--parent");
  assert.equal(partitionedDurableNameFor("c", "p", 3), "c--from--p--p3");
  assert.equal(eosDurableNameFor("c", "p", "ab12.x"), "c--eos--p--ab12_x");
  assert.equal(eosAnchorDurableNameFor("n.1"), "n_1--eos--anchor");
});

Deno.test("dead letters are flow-scoped: one stream per flow, the run in the subject", () => {
  assert.equal(dlqStreamName("flow.A"), "vf-flow_A-dlq");
  assert.equal(dlqSubjectFor("f", "r", "n"), "vf.f._dlq.r.n");
  assert.equal(dlqSubjectFilter("f"), "vf.f._dlq.>");
  assert.equal(dlqSubjectFilter("f", "r"), "vf.f._dlq.r.*");
  assert.equal(dlqSubjectFilter("f", null, "n"), "vf.f._dlq.*.n");
  assert.equal(dlqSubjectFilter("f", "r.1", "n"), dlqSubjectFor("f", "r.1", "n"));
});

Deno.test("a replica index must be a non-negative integer", () => {
  assert.throws(() => partitionedDurableNameFor("c", "p", -1), ConfigError);
  assert.throws(() => partitionedDurableNameFor("c", "p", 1.5), ConfigError);
});

Deno.test("subjectOwner reads the run boundary out of subject tokens, never a name prefix", () => {
  assert.deepEqual(subjectOwner("vf.f.r.x-n"), { flow: "f", run: "r", node: "x-n" });
  assert.deepEqual(subjectOwner("vf.f.r-x.n._eos"), { flow: "f", run: "r-x", node: "n" });
  assert.equal(streamNameFor("f", "r", "x-n"), streamNameFor("f", "r-x", "n"));
  assert.equal(subjectOwner(controlSubjectFor("f", "r")), null);
  assert.equal(subjectOwner(dlqSubjectFor("f", "r", "n")), null);
  assert.equal(subjectOwner("vf.f.r.*"), null);
  assert.equal(subjectOwner("xx.f.r.n"), null);
  assert.equal(subjectOwner("vf.f.r.n.extra"), null);
  const random = new SeededRandom(SEED ^ 0x5bd1e995);
  for (let i = 0; i < 500; i++) {
    const [f, r, n] = ["f", "r", "n"].map((fallback) => randomString(random, 8) || fallback);
    const expected = { flow: sanitize(f), run: sanitize(r), node: sanitize(n) };
    assert.deepEqual(subjectOwner(subjectFor(f, r, n)), expected, `VF_TEST_SEED=${SEED}`);
    assert.deepEqual(subjectOwner(eosSubjectFor(f, r, n)), expected, `VF_TEST_SEED=${SEED}`);
  }
});

Deno.test("Kubernetes resource names prefix vf and the flow id", () => {
  assert.equal(kubernetesWorkloadName("Flow", "Det.1"), "vf-flow-det-1");
  assert.equal(kubernetesNodeResourceName("f", "n", "scaler"), "vf-f-n-scaler");
  assert.equal(kubernetesNodeResourceName("f", "n", "hl"), "vf-f-n-hl");
  assert.equal(kubernetesFlowResourceName("f", "netpol"), "vf-f-netpol");
});
