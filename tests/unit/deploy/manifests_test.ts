/**
 * The Kubernetes rendering (src/deploy/manifests.ts) of every example and of a realtime GPU flow under each
 * GPU strategy: every object validates against the Kubernetes (and KEDA) schemas, carries the run's owner
 * labels, and a worker's environment reads back through `parseWorkerConfig` as the replica it runs; a
 * broken object fails the same validation.
 */
import assert from "node:assert/strict";
import { OwnerLabel } from "../../../src/backends/identity.ts";
import { durableNameFor, streamNameFor } from "../../../src/backends/names.ts";
import { loadFlow } from "../../../src/cli/load_flow.ts";
import { compileFlow, type NodeSpec } from "../../../src/core/compiler.ts";
import { CapabilityError, ConfigError, IncompatibleProfile } from "../../../src/core/errors.ts";
import type { FlowType } from "../../../src/core/flow_type.ts";
import { admitKubernetesDeployment } from "../../../src/deploy/admission.ts";
import { GpuMode, type GpuStrategyOptions } from "../../../src/deploy/gpu_strategy.ts";
import { schemaProblem, validateManifests } from "../../../src/deploy/manifest_schema.ts";
import {
  CONFIGMAP_MAX_BYTES,
  type KubernetesObject,
  type ManifestOptions,
  renderManifests,
  SINGLE_RUN_ANNOTATION,
  SPECS_KEY,
} from "../../../src/deploy/manifests.ts";
import type { MigDeviceGeometry } from "../../../src/deploy/mig.ts";
import { HealthPath } from "../../../src/runtime/health.ts";
import { JOB_REJECTION } from "../../../src/runtime/scaling.ts";
import { DEFAULT_FLOW_SPECS_PATH, parseWorkerConfig } from "../../../src/runtime/worker_config.ts";

const root = new URL("../../../", import.meta.url);
const EXAMPLES = ["hello.ts", "multi_camera.ts", "video_motion.ts"];
const GPU_FLOW = new URL("tests/fixtures/deploy/gpu_flow.ts", root).pathname;
const A100: MigDeviceGeometry[] = JSON.parse(
  Deno.readTextFileSync(new URL("tests/fixtures/deploy/a100_mig.json", root)),
);

const OPTIONS: ManifestOptions = {
  namespace: "vision",
  image: "registry.local/videoflow:1",
  natsUrl: "nats://nats.vision:4222",
  redisUrl: "redis://redis.vision:6379",
  projectRoot: root.href,
};

async function compiled(
  path: string,
): Promise<{ specs: NodeSpec[]; flowId: string; flowType: FlowType; url: string }> {
  const { flow, url, modules } = await loadFlow(path);
  return { specs: compileFlow(flow, { modules }), flowId: flow.flowId, flowType: flow.flowType, url };
}

async function render(path: string, extra: Partial<ManifestOptions> = {}, runId = "run-1") {
  const { specs, flowId, flowType, url } = await compiled(path);
  return renderManifests({ flowId, flowType, runId, specs, flowUrl: url }, { ...OPTIONS, ...extra });
}

// deno-lint-ignore no-explicit-any
type Json = Record<string, any>;

function byName(objects: readonly KubernetesObject[], kind: string, name: string): Json {
  const found = objects.find((o) => o.kind === kind && o.metadata.name === name);
  assert.ok(found, `${kind} ${name} among ${objects.map((o) => `${o.kind}/${o.metadata.name}`).join(", ")}`);
  return found as Json;
}

function worker(object: Json): Json {
  return object.spec.template.spec.containers[0];
}

/** The container's environment as a replica sees it, the downward-API values filled in for `replica`. */
function envOf(container: Json, replica: number): Record<string, string> {
  return Object.fromEntries(
    container.env.map((
      e: Json,
    ) => [e.name, e.value ?? (e.name === "VF_REPLICA_ID" ? String(replica) : "pod-0")]),
  );
}

function assertOwned(objects: readonly KubernetesObject[], flowId: string, runId: string): void {
  for (const object of objects) {
    assert.equal(object.metadata.namespace, "vision", object.metadata.name);
    assert.equal(object.metadata.labels[OwnerLabel.flow], flowId, object.metadata.name);
    assert.equal(object.metadata.labels[OwnerLabel.run], runId, object.metadata.name);
    assert.ok(object.metadata.labels[OwnerLabel.kind], object.metadata.name);
  }
}

for (const example of EXAMPLES) {
  Deno.test(`examples/${example} renders objects that all validate against the Kubernetes schemas`, async () => {
    const path = new URL(`examples/${example}`, root).pathname;
    const { specs, flowId } = await compiled(path);
    const { objects, notes } = await render(path);
    validateManifests(objects);
    for (const object of objects) assert.equal(schemaProblem(object), null);
    assertOwned(objects, flowId, "run-1");
    assert.deepEqual(notes, []);
    const specsMap = byName(objects, "ConfigMap", `vf-${flowId}-specs`);
    const document = JSON.parse(specsMap.data[SPECS_KEY]);
    assert.deepEqual(document.map((s: Json) => s.name), specs.map((s) => s.name));
    assert.ok(
      document.every((s: Json) => s.node_class.startsWith("file:///app/")),
      "node classes in the image",
    );
    const provision = byName(objects, "Job", `vf-${flowId}-provision`);
    assert.deepEqual(worker(provision).command.slice(4, 6), ["/app/mod.ts", "provision"]);
    assert.ok(worker(provision).command.includes("run-1"));
    for (const spec of specs) {
      // Every node of a batch flow is an indexed Job, probe-less, whose pods provision before they work.
      const job = byName(objects, "Job", `vf-${flowId}-${spec.name}`);
      assert.equal(job.spec.completionMode, "Indexed");
      assert.equal(job.spec.completions, spec.nbTasks);
      assert.equal(job.spec.backoffLimit, 3);
      assert.equal(job.spec.template.spec.initContainers[0].command[5], "provision");
      assert.equal(worker(job).command, undefined, "the image's entrypoint runs the replica");
      assert.equal(worker(job).readinessProbe, undefined);
      for (let replica = 0; replica < spec.nbTasks; replica++) {
        const config = parseWorkerConfig(envOf(worker(job), replica));
        assert.equal(config.nodeName, spec.name);
        assert.equal(config.replicaId, replica);
        assert.equal(config.nbTasks, spec.nbTasks);
        assert.deepEqual(config.parentNames, spec.parents);
        assert.equal(config.runId, "run-1");
        assert.equal(config.runtimeStoreUrl, OPTIONS.redisUrl);
        assert.deepEqual(config.broker, { kind: "nats", url: OPTIONS.natsUrl });
        assert.ok(config.nodeClass.startsWith("file:///app/"), config.nodeClass);
      }
      assert.equal(envOf(worker(job), 0).VF_FLOW_SPECS_PATH, DEFAULT_FLOW_SPECS_PATH);
      assert.deepEqual(worker(job).volumeMounts[0].mountPath, DEFAULT_FLOW_SPECS_PATH);
    }
  });
}

const MODES: ReadonlyArray<readonly [string, GpuStrategyOptions, string, Json]> = [
  [
    "whole devices",
    { mode: GpuMode.whole },
    "nvidia.com/gpu",
    { key: "nvidia.com/gpu.present", operator: "In", values: ["true"] },
  ],
  [
    "single MIG",
    { mode: GpuMode.migSingle },
    "nvidia.com/gpu",
    { key: "nvidia.com/gpu.memory", operator: "Gt", values: ["16383"] },
  ],
  [
    "mixed MIG",
    { mode: GpuMode.migMixed, migDevices: A100 },
    "nvidia.com/mig-3g.20gb",
    { key: "nvidia.com/mig.strategy", operator: "In", values: ["mixed"] },
  ],
];

for (const [what, gpu, resource, requirement] of MODES) {
  Deno.test(`a realtime GPU flow on ${what} renders valid Deployments, a StatefulSet and GPU placements`, async () => {
    const { objects } = await render(GPU_FLOW, { gpu });
    validateManifests(objects);
    assertOwned(objects, "cams", "run-1");
    const detect = byName(objects, "Deployment", "vf-cams-detect");
    assert.equal(detect.spec.replicas, 2);
    assert.deepEqual(worker(detect).resources.limits, { [resource]: "1" });
    const terms =
      detect.spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution;
    assert.ok(
      terms.nodeSelectorTerms[0].matchExpressions.some((e: Json) =>
        JSON.stringify(e) === JSON.stringify(requirement)
      ),
      JSON.stringify(terms),
    );
    assert.deepEqual(detect.spec.template.spec.tolerations, [
      { key: "nvidia.com/gpu", operator: "Exists", effect: "NoSchedule" },
    ]);
    // Two competing replicas claim their slots through the shared ledger: no replica id is written.
    const config = parseWorkerConfig(envOf(worker(detect), 0));
    assert.equal(config.replicaId, null);
    assert.equal(config.gpuResourceName, resource);
    assert.equal(config.gpuCount, 1);
    assert.deepEqual(worker(detect).readinessProbe.httpGet, { path: HealthPath.ready, port: 8080 });
    assert.deepEqual(worker(detect).livenessProbe.httpGet, { path: HealthPath.live, port: 8080 });
    // The whole-device classifier keeps nvidia.com/gpu under every strategy but single MIG's slices.
    const classify = byName(objects, "Deployment", "vf-cams-classify");
    assert.deepEqual(Object.keys(worker(classify).resources.limits), ["nvidia.com/gpu"]);
    // A CPU node asks for no accelerator and goes anywhere.
    const tidy = byName(objects, "Deployment", "vf-cams-tidy");
    assert.deepEqual(worker(tidy).resources, {});
    assert.equal(tidy.spec.template.spec.affinity, undefined);
    assert.equal(parseWorkerConfig(envOf(worker(tidy), 0)).replicaId, 0);
    assert.deepEqual(tidy.spec.strategy, { type: "Recreate" });
    // The partitioned join needs stable ordinals: a StatefulSet with its headless Service.
    const pair = byName(objects, "StatefulSet", "vf-cams-pair");
    assert.equal(pair.spec.serviceName, "vf-cams-pair-hl");
    byName(objects, "Service", "vf-cams-pair-hl");
    assert.equal(parseWorkerConfig(envOf(worker(pair), 1)).replicaId, 1);
    assert.ok(worker(pair).env.some((e: Json) => e.name === "POD_NAME"));
    assert.equal(
      objects.filter((o) => o.kind === "ScaledObject").length,
      0,
      "no scaler without --autoscaling",
    );
  });
}

Deno.test("autoscaling renders a KEDA scaler for the scalable node only, one trigger per parent durable", async () => {
  const { objects, notes } = await render(GPU_FLOW, { autoscaling: true, maxReplicas: 6 });
  validateManifests(objects);
  const scalers = objects.filter((o) => o.kind === "ScaledObject") as Json[];
  assert.deepEqual(scalers.map((s) => s.metadata.name), ["vf-cams-tidy-scaler"]);
  const [scaler] = scalers;
  assert.deepEqual(scaler.spec.scaleTargetRef, {
    apiVersion: "apps/v1",
    kind: "Deployment",
    name: "vf-cams-tidy",
  });
  assert.equal(scaler.spec.minReplicaCount, 1);
  assert.equal(scaler.spec.maxReplicaCount, 6);
  assert.deepEqual(scaler.spec.triggers, [{
    type: "nats-jetstream",
    metadata: {
      natsServerMonitoringEndpoint: "nats.vision:8222",
      account: "$G",
      stream: streamNameFor("cams", "run-1", "pair"),
      consumer: durableNameFor("tidy", "pair"),
      lagThreshold: "10",
    },
  }]);
  // The scaled node claims slots up to the scaler's ceiling.
  const tidy = parseWorkerConfig(envOf(worker(byName(objects, "Deployment", "vf-cams-tidy")), 0));
  assert.equal(tidy.replicaId, null);
  assert.equal(tidy.replicaSlots, 6);
  assert.equal(
    byName(objects, "Deployment", "vf-cams-tidy").spec.strategy,
    undefined,
    "a scaler's pods may surge",
  );
  const noted = notes.map((n) => n.split(" ")[0]).sort();
  assert.deepEqual(noted, ["camera", "classify", "detect", "pair", "sink"]);
  assert.match(notes.find((n) => n.startsWith("pair"))!, /partitioned/);
  assert.match(notes.find((n) => n.startsWith("detect"))!, /--gpu-autoscaling/);
});

Deno.test("autoscaling a batch flow is refused naming every processor: a Job has nothing a scaler scales (RUN-027)", async () => {
  await assert.rejects(
    render(new URL("examples/hello.ts", root).pathname, { autoscaling: true }),
    (error: unknown) =>
      error instanceof CapabilityError && /processors square, sum of this batch flow/.test(error.message) &&
      error.message.includes(JOB_REJECTION.slice(JOB_REJECTION.indexOf("a Kubernetes Job"))),
  );
});

Deno.test("a broken object fails the schema validation, naming it", async () => {
  const { objects } = await render(GPU_FLOW);
  const deployment = structuredClone(byName(objects, "Deployment", "vf-cams-tidy")) as Json;
  delete deployment.spec.selector;
  deployment.spec.replicas = "two";
  const problem = schemaProblem(deployment as KubernetesObject);
  assert.ok(problem !== null && /selector/.test(problem) && /replicas/.test(problem), String(problem));
  const scaler = structuredClone(
    (await render(GPU_FLOW, { autoscaling: true })).objects.find((o) => o.kind === "ScaledObject"),
  ) as Json;
  delete scaler.spec.scaleTargetRef;
  assert.match(String(schemaProblem(scaler as KubernetesObject)), /scaleTargetRef/);
  assert.match(
    String(schemaProblem({ ...deployment, kind: "CronTab" } as KubernetesObject)),
    /no schema is known for apps\/v1\/CronTab/,
  );
  assert.throws(() => validateManifests([objects[0], deployment as KubernetesObject]), ConfigError);
});

Deno.test("a single run marks every object; it is refused for a realtime flow", async () => {
  const { objects } = await render(new URL("examples/hello.ts", root).pathname, { singleRun: true });
  assert.ok(objects.every((o) => o.metadata.annotations?.[SINGLE_RUN_ANNOTATION] === "true"));
  await assert.rejects(render(GPU_FLOW, { singleRun: true }), ConfigError);
});

Deno.test("a module outside the project, a node without an image, an unlabelable run id or a bad quantity is refused", async () => {
  const hello = new URL("examples/hello.ts", root).pathname;
  await assert.rejects(render(hello, { projectRoot: new URL("tests/", root).href }), /outside the project/);
  await assert.rejects(render(hello, { image: null }), /no default image was given/);
  await assert.rejects(render(hello, {}, "_run"), /label value/);
  await assert.rejects(render(hello, { resources: { cpu: "lots" } }), /not a Kubernetes quantity/);
  const { objects } = await render(hello, { resources: { cpu: "250m", memory: "1.5Gi" } });
  validateManifests(objects);
  assert.deepEqual(worker(byName(objects, "Job", "vf-squares-sum")).resources, {
    requests: { cpu: "250m", memory: "1.5Gi" },
  });
});

Deno.test("params too long for one environment entry are read from the specs file; too long for a ConfigMap, refused", async () => {
  const { specs, flowId, flowType, url } = await compiled(new URL("examples/hello.ts", root).pathname);
  const input = { flowId, flowType, runId: "r", specs, flowUrl: url };
  specs[0].params = { ...specs[0].params, table: "x".repeat(200_000) };
  const { objects } = renderManifests(input, OPTIONS);
  validateManifests(objects);
  const env = envOf(worker(byName(objects, "Job", "vf-squares-count")), 0);
  assert.equal(env.VF_NODE_PARAMS_JSON, undefined, "the params stay in the specs document");
  assert.equal(env.VF_FLOW_SPECS_PATH, DEFAULT_FLOW_SPECS_PATH);
  specs[0].params = { ...specs[0].params, table: "x".repeat(CONFIGMAP_MAX_BYTES) };
  assert.throws(() => renderManifests(input, OPTIONS), /more than the 1048576 a ConfigMap holds/);
});

Deno.test("mixed MIG refuses replicas the target's devices cannot host, naming them", async () => {
  const oneSlot: MigDeviceGeometry[] = [{
    ...A100[0],
    profiles: A100[0].profiles.filter((p) => p.name !== "3g.20gb"),
  }];
  const { specs, flowId, flowType, url } = await compiled(GPU_FLOW);
  assert.throws(
    () =>
      renderManifests({ flowId, flowType, runId: "r", specs, flowUrl: url }, {
        ...OPTIONS,
        gpu: { mode: GpuMode.migMixed, migDevices: oneSlot },
      }),
    /detect\/1/,
  );
  assert.throws(
    () =>
      renderManifests({ flowId, flowType, runId: "r", specs, flowUrl: url }, {
        ...OPTIONS,
        gpu: { mode: GpuMode.migMixed },
      }),
    /needs the target's MIG devices/,
  );
});

Deno.test("the Kubernetes admission names every declaration the target refuses; Unknown stays a warning", async () => {
  const { flow, modules } = await loadFlow(new URL("tests/fixtures/deploy/refused_flow.ts", root).pathname);
  const specs = compileFlow(flow, { modules });
  const { executionGroups, batchingPolicies } = await import("../../../src/core/compiler.ts");
  assert.throws(
    () =>
      admitKubernetesDeployment(flow.flowType, specs, {
        executionGroups: executionGroups(flow),
        batching: batchingPolicies(flow),
      }, false),
    (error: unknown) =>
      error instanceof IncompatibleProfile &&
      error.diagnostics.some((d) => /execution group fused .*RUN-035/.test(d.message)) &&
      error.diagnostics.some((d) => d.node === "batched" && /RUN-036/.test(d.message)),
  );
  const hello = await compiled(new URL("examples/hello.ts", root).pathname);
  const warnings = admitKubernetesDeployment(hello.flowType, hello.specs, {
    executionGroups: {},
    batching: {},
  }, false);
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /VF_STATE_UNKNOWN[\s\S]*durability could not be observed/);
});
