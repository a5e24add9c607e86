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
import { compileFlow, nodePermissions, nodePreloads, type NodeSpec } from "../../../src/core/compiler.ts";
import { CapabilityError, ConfigError, IncompatibleProfile } from "../../../src/core/errors.ts";
import type { FlowType } from "../../../src/core/flow_type.ts";
import type { PermissionDeclaration, PermissionKind } from "../../../src/core/node.ts";
import { admitKubernetesDeployment } from "../../../src/deploy/admission.ts";
import { GpuMode, type GpuStrategyOptions } from "../../../src/deploy/gpu_strategy.ts";
import { schemaProblem, validateManifests } from "../../../src/deploy/manifest_schema.ts";
import {
  CONFIGMAP_MAX_BYTES,
  type KubernetesObject,
  type ManifestInput,
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

async function compiled(path: string): Promise<{
  specs: NodeSpec[];
  flowId: string;
  flowType: FlowType;
  url: string;
  permissions: ManifestInput["permissions"];
  preloads: ManifestInput["preloads"];
}> {
  const { flow, url, modules } = await loadFlow(path);
  return {
    specs: compileFlow(flow, { modules }),
    flowId: flow.flowId,
    flowType: flow.flowType,
    url,
    permissions: nodePermissions(flow),
    preloads: nodePreloads(flow),
  };
}

async function render(path: string, extra: Partial<ManifestOptions> = {}, runId = "run-1") {
  const { specs, flowId, flowType, url, permissions, preloads } = await compiled(path);
  return renderManifests(
    { flowId, flowType, runId, specs, flowUrl: url, permissions, preloads },
    { ...OPTIONS, ...extra },
  );
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
    const { specs, flowId, permissions } = await compiled(path);
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
      assert.deepEqual(
        allowFlags(worker(job)),
        podFlags(worker(job), permissions[spec.name] ?? {}),
        spec.name,
      );
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

/** The `--allow-*` flags of a worker container's command. */
function allowFlags(container: Json): string[] {
  return container.command.filter((arg: string) => arg.startsWith("--allow-"));
}

/**
 * The flags a worker container must carry for a node that declares `declared`: env for exactly its
 * container's variables and the declared ones, read of the declared paths and the specs document, write of
 * the declared paths and the termination log, net to the declared hosts, the servers and the health port,
 * run, ffi and sys as declared, and nothing else.
 */
function podFlags(container: Json, declared: PermissionDeclaration, port = 8080): string[] {
  const names = container.env.map((e: Json) => e.name);
  const list = (kind: PermissionKind, own: readonly string[]) => {
    const entries = [...(declared[kind] ?? []), ...own];
    return entries.length === 0 ? [] : [`--allow-${kind}=${entries.join(",")}`];
  };
  return [
    `--allow-env=${[...names, ...(declared.env ?? [])].join(",")}`,
    ...list("read", [DEFAULT_FLOW_SPECS_PATH]),
    ...list("write", ["/dev/termination-log"]),
    ...list("net", ["nats.vision:4222", "redis.vision:6379", `0.0.0.0:${port}`]),
    ...list("run", []),
    ...list("ffi", []),
    ...list("sys", []),
  ];
}

/** The source of the `data:` entry module a worker container's command runs. */
function entrySource(container: Json): string {
  const entry: string = container.command.find((arg: string) => arg.startsWith("data:"));
  return decodeURIComponent(escape(atob(entry.slice(entry.indexOf(",") + 1))));
}

Deno.test("every worker container runs its node's declared permissions and its replica's own needs, nothing else", async () => {
  const path = new URL("tests/fixtures/deploy/permissions_flow.ts", root).pathname;
  const { objects } = await render(path, { healthPort: 9090 });
  validateManifests(objects);
  const flows = "file:///app/tests/fixtures/deploy/permissions_flow.ts";
  for (const [node, read] of [["count", []], ["reader", ["deno.json"]], ["snoop", []]] as const) {
    const container = worker(byName(objects, "Job", `vf-sandboxes-${node}`));
    const names = container.env.map((e: Json) => e.name);
    assert.deepEqual(container.command.slice(0, 6), [
      "deno",
      "run",
      "--no-prompt",
      "--cached-only",
      "--config=/app/deno.json",
      "--v8-flags=--max-semi-space-size=8,--heap-growing-percent=50",
    ]);
    assert.deepEqual(allowFlags(container), podFlags(container, { read }, 9090), node);
    assert.equal(
      allowFlags(container)[1],
      `--allow-read=${[...read, "/etc/videoflow/specs.json"].join(",")}`,
    );
    // After the flags, the entry, then the settings it may read (and hides from the node), by name.
    assert.deepEqual(container.command.slice(6 + allowFlags(container).length + 1), names);
    assert.ok(names.includes("VF_TERMINATION_LOG") && names.includes("VF_REPLICA_ID"), names.join(","));
    assert.equal(
      entrySource(container),
      `import { serveNodeProcess } from "file:///app/workers/node_process.ts";\n` +
        `import ${JSON.stringify(flows)};\nawait serveNodeProcess("pod");\n`,
    );
    assert.equal(container.terminationMessagePath, "/dev/termination-log");
  }
});

Deno.test("a GPU node's container gets ffi for the NVML binding and imports NVML's inventory; a CPU node neither", async () => {
  const { objects } = await render(GPU_FLOW);
  const detect = worker(byName(objects, "Deployment", "vf-cams-detect"));
  assert.deepEqual(allowFlags(detect), podFlags(detect, { ffi: ["/app/node_modules"] }));
  assert.ok(entrySource(detect).includes('import "file:///app/nvml/inventory.ts";'), entrySource(detect));
  const tidy = worker(byName(objects, "Deployment", "vf-cams-tidy"));
  assert.deepEqual(allowFlags(tidy), podFlags(tidy, {}));
  assert.ok(!entrySource(tidy).includes("nvml"), entrySource(tidy));
});

Deno.test("a node's preloaded modules are imported by its pod's entry from the image, before its sandbox applies", async () => {
  const { specs, flowId, flowType, url, permissions } = await compiled(
    new URL("examples/hello.ts", root).pathname,
  );
  const { objects } = renderManifests({
    flowId,
    flowType,
    runId: "r",
    specs,
    flowUrl: url,
    permissions,
    preloads: { square: [new URL("tests/fixtures/flows/squares.ts", root).href, "npm:yaml@2.9.1"] },
  }, OPTIONS);
  const square = entrySource(worker(byName(objects, "Job", "vf-squares-square")));
  assert.equal(
    square,
    'import { serveNodeProcess } from "file:///app/workers/node_process.ts";\n' +
      'import "file:///app/examples/hello.ts";\nimport "file:///app/tests/fixtures/flows/squares.ts";\n' +
      'import "npm:yaml@2.9.1";\nawait serveNodeProcess("pod");\n',
  );
  assert.ok(!entrySource(worker(byName(objects, "Job", "vf-squares-sum"))).includes("squares.ts"));
});

Deno.test("a declared permission entry holding a comma, which no flag can carry, is refused naming the node", async () => {
  const { specs, flowId, flowType, url, preloads } = await compiled(
    new URL("examples/hello.ts", root).pathname,
  );
  assert.throws(
    () =>
      renderManifests({
        flowId,
        flowType,
        runId: "r",
        specs,
        flowUrl: url,
        preloads,
        permissions: { square: { read: ["/data/a,b"] } },
      }, OPTIONS),
    (error: unknown) =>
      error instanceof ConfigError &&
      /node square declares read permission for "\/data\/a,b"/.test(error.message),
  );
});

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
    byName(objects, "Deployment", "vf-cams-tidy").spec.replicas,
    undefined,
    "the scaler owns the replica count: a re-apply does not take it back",
  );
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
  const { specs, flowId, flowType, url, permissions, preloads } = await compiled(
    new URL("examples/hello.ts", root).pathname,
  );
  const input = { flowId, flowType, runId: "r", specs, flowUrl: url, permissions, preloads };
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
  const { specs, flowId, flowType, url, permissions, preloads } = await compiled(GPU_FLOW);
  assert.throws(
    () =>
      renderManifests({ flowId, flowType, runId: "r", specs, flowUrl: url, permissions, preloads }, {
        ...OPTIONS,
        gpu: { mode: GpuMode.migMixed, migDevices: oneSlot },
      }),
    /detect\/1/,
  );
  assert.throws(
    () =>
      renderManifests({ flowId, flowType, runId: "r", specs, flowUrl: url, permissions, preloads }, {
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
