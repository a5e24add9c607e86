/**
 * `deno task deploy` as an operator runs it, in a subprocess: the manifests of an example print as YAML
 * documents and as JSON that parse and validate against the Kubernetes schemas; a flow the Kubernetes
 * target refuses exits 2 naming every unmet requirement, with nothing on stdout.
 */
import assert from "node:assert/strict";
import { parseAllDocuments } from "yaml";
import { OwnerLabel } from "../../src/backends/identity.ts";
import { schemaProblem } from "../../src/deploy/manifest_schema.ts";
import type { KubernetesObject } from "../../src/deploy/manifests.ts";
import { deployTask } from "../support/vf_cli.ts";

function deploy(...args: string[]) {
  return deployTask(args);
}

function assertValid(objects: readonly KubernetesObject[], runId: string): void {
  assert.ok(objects.length >= 6, `${objects.length} objects`);
  for (const object of objects) {
    assert.equal(schemaProblem(object), null);
    assert.equal(object.metadata.namespace, "vision");
    assert.equal(object.metadata.labels[OwnerLabel.run], runId);
  }
}

Deno.test("deno task deploy prints an example's manifests as YAML documents that validate", async () => {
  const run = await deploy(
    "examples/hello.ts",
    "--namespace",
    "vision",
    "--image",
    "reg/vf:1",
    "--run-id",
    "r7",
  );
  assert.equal(run.code, 0, run.stderr);
  const documents = parseAllDocuments(run.stdout);
  assert.ok(Array.isArray(documents));
  const objects = documents.map((d) => d.toJS() as KubernetesObject);
  assertValid(objects, "r7");
  assert.deepEqual(objects.map((o) => `${o.kind}/${o.metadata.name}`), [
    "ConfigMap/vf-squares-specs",
    "Job/vf-squares-provision",
    "Job/vf-squares-count",
    "Job/vf-squares-square",
    "Job/vf-squares-sum",
    "Job/vf-squares-print",
  ]);
  assert.match(run.stderr, /WARNING: VF_STATE_UNKNOWN/, "what only the live services show is a warning");
});

Deno.test("deno task deploy -o json prints a GPU flow on mixed MIG with a scaler, all valid", async () => {
  const run = await deploy(
    "tests/fixtures/deploy/gpu_flow.ts",
    "--namespace=vision",
    "--image=reg/vf:1",
    "--run-id=r8",
    "-o",
    "json",
    "--gpu-mode",
    "mig-mixed",
    "--mig-geometry",
    "tests/fixtures/deploy/a100_mig.json",
    "--autoscaling",
    "--cpu",
    "500m",
    "--memory",
    "1Gi",
    "--nats-monitoring",
    "nats-monitor.vision:8222",
  );
  assert.equal(run.code, 0, run.stderr);
  const objects = JSON.parse(run.stdout) as KubernetesObject[];
  assertValid(objects, "r8");
  const kinds = objects.map((o) => o.kind);
  for (const kind of ["Deployment", "StatefulSet", "Service", "ScaledObject"]) {
    assert.ok(kinds.includes(kind), kind);
  }
  assert.match(JSON.stringify(objects), /nvidia\.com\/mig-3g\.20gb/);
  // deno-lint-ignore no-explicit-any
  const tidy = objects.find((o) => o.metadata.name === "vf-cams-tidy") as any;
  assert.deepEqual(tidy.spec.template.spec.containers[0].resources, {
    requests: { cpu: "500m", memory: "1Gi" },
  });
  assert.match(JSON.stringify(objects), /"natsServerMonitoringEndpoint":"nats-monitor\.vision:8222"/);
});

Deno.test("deno task deploy of a flow the target refuses exits 2 naming every unmet requirement", async () => {
  const run = await deploy("tests/fixtures/deploy/refused_flow.ts", "--image", "reg/vf:1");
  assert.equal(run.code, 2, run.stderr);
  assert.equal(run.stdout, "");
  assert.match(run.stderr, /ERROR \[VF_INCOMPATIBLE_PROFILE\]|VF_INCOMPATIBLE_PROFILE/);
  assert.match(run.stderr, /execution group fused .*RUN-035/);
  assert.match(run.stderr, /node batched .*RUN-036/);
  assert.doesNotMatch(run.stderr, /^\s+at /m, "no stack trace");
});

Deno.test("deno task deploy with --autoscaling on a batch flow exits 2 (RUN-027)", async () => {
  const run = await deploy("examples/hello.ts", "--image", "reg/vf:1", "--autoscaling");
  assert.equal(run.code, 2, run.stderr);
  assert.equal(run.stdout, "");
  assert.match(
    run.stderr,
    /VF_CAPABILITY.*processors square, sum of this batch flow render each as a Kubernetes Job/,
  );
});
