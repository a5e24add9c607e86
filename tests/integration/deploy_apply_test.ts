/**
 * `--apply` and `--teardown` (src/deploy/apply.ts, teardown.ts, cluster_client.ts) against the test API
 * server (tests/support/kube_api_server.ts) through `@kubernetes/client-node`: applying creates every
 * rendered object exactly as rendered, applying again changes nothing, the provision Job is waited for
 * (complete, failed, never finishing), a teardown removes exactly the run's objects (another run whose
 * id shares a prefix, another flow's and an unlabelled object survive), RUN-047 under `--single-run`,
 * objects the run does not own are refused before anything is written; and the server itself refuses a
 * stale `resourceVersion`, a failed JSON-patch `test` and a stale delete precondition, so a client that
 * ignored them would fail here (the server's other rules: tests/integration/kube_api_server_test.ts).
 */
import assert from "node:assert/strict";
import { OwnerLabel } from "../../src/backends/identity.ts";
import { loadFlow } from "../../src/cli/load_flow.ts";
import { compileFlow, nodePermissions, nodePreloads } from "../../src/core/compiler.ts";
import {
  ActiveRunConflict,
  ClusterError,
  EXIT_ENVIRONMENT,
  EXIT_FLOW_FAILED,
  FlowFailed,
  OwnershipConflict,
} from "../../src/core/errors.ts";
import { applyRun, type ApplyRunOptions } from "../../src/deploy/apply.ts";
import { ClusterClient, FIELD_MANAGER } from "../../src/deploy/cluster_client.ts";
import {
  type KubernetesObject,
  type ManifestOptions,
  RENDERED_KINDS,
  renderManifests,
} from "../../src/deploy/manifests.ts";
import { teardownRun } from "../../src/deploy/teardown.ts";
import { KubeApiServer, KUBERNETES_KINDS, type StoredObject } from "../support/kube_api_server.ts";

const root = new URL("../../", import.meta.url);
const HELLO = new URL("examples/hello.ts", root).pathname;
const GPU_FLOW = new URL("tests/fixtures/deploy/gpu_flow.ts", root).pathname;
const NS = "vision";

const OPTIONS: ManifestOptions = {
  namespace: NS,
  image: "registry.local/videoflow:1",
  natsUrl: "nats://nats.vision:4222",
  redisUrl: "redis://redis.vision:6379",
  projectRoot: root.href,
};

async function render(path: string, runId: string, extra: Partial<ManifestOptions> = {}) {
  const { flow, url, modules } = await loadFlow(path);
  const specs = compileFlow(flow, { modules });
  const rendered = renderManifests(
    {
      flowId: flow.flowId,
      flowType: flow.flowType,
      runId,
      specs,
      flowUrl: url,
      permissions: nodePermissions(flow),
      preloads: nodePreloads(flow),
    },
    { ...OPTIONS, ...extra },
  );
  return { flowId: flow.flowId, objects: rendered.objects };
}

function options(flowId: string, runId: string, extra: Partial<ApplyRunOptions> = {}): ApplyRunOptions {
  return {
    flowId,
    runId,
    namespace: NS,
    singleRun: false,
    wait: { timeoutSeconds: 10, pollSeconds: 0.02 },
    ...extra,
  };
}

function provisionName(objects: readonly KubernetesObject[]): string {
  const job = objects.find((o) => o.metadata.labels[OwnerLabel.kind] === "provision");
  assert.ok(job);
  return job.metadata.name;
}

/** Plays the Job controller: finishes the provision Job as soon as it is written. */
async function finishProvision(
  server: KubeApiServer,
  objects: readonly KubernetesObject[],
  outcome: "Complete" | "Failed" = "Complete",
): Promise<void> {
  const name = provisionName(objects);
  await server.whenWritten("batch/v1", "Job", NS, name);
  server.finishJob(NS, name, outcome, outcome === "Failed" ? "BackoffLimitExceeded" : "Completed");
}

async function withServer(
  fn: (server: KubeApiServer, cluster: ClusterClient) => Promise<void>,
  serverOptions: Parameters<typeof KubeApiServer.start>[0] = { namespaces: ["default", NS] },
): Promise<void> {
  const server = KubeApiServer.start(serverOptions);
  try {
    await fn(server, ClusterClient.connect({ server: server.url, token: serverOptions?.token }));
  } finally {
    await server.close();
  }
}

/** The stored object without what the server sets: what the client sent. */
function asSent(stored: StoredObject): Record<string, unknown> {
  const { status: _status, ...rest } = stored;
  const { uid: _u, resourceVersion: _r, creationTimestamp: _c, generation: _g, ...metadata } =
    stored.metadata;
  return { ...rest, metadata };
}

function stored(server: KubeApiServer, object: KubernetesObject): StoredObject | undefined {
  return server.get(object.apiVersion, object.kind, NS, object.metadata.name);
}

/** Every object of every rendered kind in the namespace, as `Kind/name`. */
function inventory(server: KubeApiServer): string[] {
  return RENDERED_KINDS.filter((k) => server.serves(k.apiVersion, k.kind)).flatMap(({ apiVersion, kind }) =>
    server.all(apiVersion, kind).filter((o) => o.metadata.namespace === NS).map((o) =>
      `${kind}/${o.metadata.name}`
    )
  ).sort();
}

Deno.test("apply creates every rendered object as rendered, server-side applied as videoflow", async () => {
  await withServer(async (server, cluster) => {
    const { flowId, objects } = await render(HELLO, "r1");
    const [report] = await Promise.all([
      applyRun(cluster, objects, options(flowId, "r1")),
      finishProvision(server, objects),
    ]);
    assert.deepEqual(report.objects.map((o) => o.change), objects.map(() => "created"));
    assert.equal(report.provisionJob, "vf-squares-provision");
    for (const object of objects) {
      const live = stored(server, object);
      assert.ok(live, `${object.kind} ${object.metadata.name} exists`);
      assert.deepEqual(asSent(live), object, `${object.kind} ${object.metadata.name} arrived as rendered`);
    }
    assert.equal(inventory(server).length, objects.length);
    const writes = server.requests.filter((r) => r.method === "PATCH");
    assert.equal(writes.length, objects.length);
    for (const write of writes) {
      assert.equal(write.contentType, "application/apply-patch+yaml");
      assert.equal(new URLSearchParams(write.query).get("fieldManager"), FIELD_MANAGER);
      assert.equal(new URLSearchParams(write.query).get("force"), "false");
    }
  });
});

Deno.test("applying the same run again changes nothing: same versions, no duplicates", async () => {
  await withServer(async (server, cluster) => {
    const { flowId, objects } = await render(HELLO, "r1");
    const [first] = await Promise.all([
      applyRun(cluster, objects, options(flowId, "r1")),
      finishProvision(server, objects),
    ]);
    const provision = server.get("batch/v1", "Job", NS, provisionName(objects));
    const second = await applyRun(cluster, objects, options(flowId, "r1"));
    assert.deepEqual(second.objects.map((o) => o.change), objects.map(() => "unchanged"));
    assert.deepEqual(
      second.objects.map((o) => o.resourceVersion),
      first.objects.map((o) => o.resourceVersion).map((v, i) =>
        objects[i].metadata.name === provisionName(objects)
          ? provision?.metadata.resourceVersion // the controller wrote its status in between
          : v
      ),
    );
    assert.equal(inventory(server).length, objects.length);
  });
});

Deno.test("a changed object is configured in place, at the version just read", async () => {
  await withServer(async (server, cluster) => {
    const { flowId, objects } = await render(HELLO, "r1");
    await Promise.all([applyRun(cluster, objects, options(flowId, "r1")), finishProvision(server, objects)]);
    const specs = objects[0];
    const before = stored(server, specs)!;
    const changed = [{ ...specs, data: { "specs.json": "[]" } }, ...objects.slice(1)];
    const report = await applyRun(cluster, changed, options(flowId, "r1"));
    assert.equal(report.objects[0].change, "configured");
    assert.notEqual(report.objects[0].resourceVersion, before.metadata.resourceVersion);
    assert.deepEqual(stored(server, specs)!.data, { "specs.json": "[]" });
    assert.equal(stored(server, specs)!.metadata.uid, before.metadata.uid, "updated, not recreated");
    assert.deepEqual(report.objects.slice(1).map((o) => o.change), objects.slice(1).map(() => "unchanged"));
  });
});

Deno.test("a writer between the read and the apply makes the apply fail (409), its write kept", async () => {
  await withServer(async (server, cluster) => {
    const { flowId, objects } = await render(HELLO, "r1");
    await Promise.all([applyRun(cluster, objects, options(flowId, "r1")), finishProvision(server, objects)]);
    const specs = objects[0];
    const path = `/api/v1/namespaces/${NS}/configmaps/${specs.metadata.name}`;
    let raced = false;
    server.beforeRequest = async (request) => {
      if (raced || request.method !== "PATCH" || request.path !== path) return;
      raced = true;
      const response = await fetch(`${server.url}${path}`, {
        method: "PATCH",
        headers: { "content-type": "application/merge-patch+json" },
        body: JSON.stringify({ data: { "specs.json": "other writer" } }),
      });
      assert.equal(response.status, 200);
      await response.body?.cancel();
    };
    const changed = [{ ...specs, data: { "specs.json": "[]" } }, ...objects.slice(1)];
    await assert.rejects(applyRun(cluster, changed, options(flowId, "r1")), (error) => {
      assert.ok(error instanceof ClusterError, String(error));
      assert.equal(error.context.status, 409);
      assert.match(error.message, /applying ConfigMap vision\/vf-squares-specs was refused/);
      return true;
    });
    assert.ok(raced);
    assert.deepEqual(stored(server, specs)!.data, { "specs.json": "other writer" });
  });
});

Deno.test("every kind of a realtime GPU flow with autoscaling applies; without KEDA nothing is written", async () => {
  const { flowId, objects } = await render(GPU_FLOW, "r1", { autoscaling: true });
  const kinds = new Set(objects.map((o) => o.kind));
  for (const kind of ["ConfigMap", "Job", "Deployment", "StatefulSet", "Service", "ScaledObject"]) {
    assert.ok(kinds.has(kind), `${kind} rendered`);
  }
  for (const object of objects) {
    assert.ok(RENDERED_KINDS.some((k) => k.apiVersion === object.apiVersion && k.kind === object.kind));
  }
  await withServer(async (server, cluster) => {
    await Promise.all([applyRun(cluster, objects, options(flowId, "r1")), finishProvision(server, objects)]);
    for (const object of objects) assert.deepEqual(asSent(stored(server, object)!), object);
  });
  await withServer(async (server, cluster) => {
    await assert.rejects(applyRun(cluster, objects, options(flowId, "r1")), (error) => {
      assert.ok(error instanceof ClusterError);
      assert.match(error.message, /keda\.sh\/v1alpha1 ScaledObject/);
      assert.match(error.remedy ?? "", /install KEDA/);
      return true;
    });
    assert.deepEqual(inventory(server), [], "nothing was written");
  }, { namespaces: [NS], kinds: KUBERNETES_KINDS.filter((k) => k.kind !== "ScaledObject") });
});

Deno.test("a failed provision Job is FlowFailed (exit 4) naming its reason", async () => {
  await withServer(async (server, cluster) => {
    const { flowId, objects } = await render(HELLO, "r1");
    const [outcome] = await Promise.allSettled([
      applyRun(cluster, objects, options(flowId, "r1")),
      finishProvision(server, objects, "Failed"),
    ]);
    assert.equal(outcome.status, "rejected");
    const error = (outcome as PromiseRejectedResult).reason;
    assert.ok(error instanceof FlowFailed, String(error));
    assert.equal(error.exitCode, EXIT_FLOW_FAILED);
    assert.match(error.message, /vf-squares-provision failed \(BackoffLimitExceeded/);
    assert.match(error.remedy ?? "", /kubectl logs -n vision job\/vf-squares-provision/);
  });
});

Deno.test("a provision Job that never finishes is a ClusterError (exit 3) at the deadline", async () => {
  await withServer(async (_server, cluster) => {
    const { flowId, objects } = await render(HELLO, "r1");
    const started = performance.now();
    await assert.rejects(
      applyRun(cluster, objects, options(flowId, "r1", { wait: { timeoutSeconds: 0.3, pollSeconds: 0.05 } })),
      (error) => {
        assert.ok(error instanceof ClusterError, String(error));
        assert.equal(error.exitCode, EXIT_ENVIRONMENT);
        assert.match(error.message, /did not finish within 0\.3 s/);
        return true;
      },
    );
    const waited = (performance.now() - started) / 1000;
    assert.ok(waited >= 0.3 && waited < 5, `waited ${waited} s`);
  });
});

Deno.test("teardown removes exactly the run's objects: r10, another flow and unlabelled objects survive", async () => {
  await withServer(async (server, cluster) => {
    const { flowId, objects } = await render(HELLO, "r1");
    await Promise.all([applyRun(cluster, objects, options(flowId, "r1")), finishProvision(server, objects)]);
    const labels = (run: string | null, flow = flowId) => ({
      ...(flow === null ? {} : { [OwnerLabel.flow]: flow }),
      ...(run === null ? {} : { [OwnerLabel.run]: run }),
    });
    const survivors = [
      { apiVersion: "batch/v1", kind: "Job", name: "vf-squares-r10-count", labels: labels("r10") },
      { apiVersion: "v1", kind: "ConfigMap", name: "vf-squares-r1-extra", labels: labels("r1", "squares1") },
      { apiVersion: "v1", kind: "ConfigMap", name: "vf-squares-flow-only", labels: labels(null) },
      { apiVersion: "v1", kind: "ConfigMap", name: "vf-squares-unlabelled", labels: {} },
      { apiVersion: "apps/v1", kind: "Deployment", name: "vf-squares-r1x", labels: labels("r1-x") },
    ];
    for (const s of survivors) {
      server.seed({
        apiVersion: s.apiVersion,
        kind: s.kind,
        metadata: { name: s.name, namespace: NS, labels: s.labels },
        spec: {},
      });
    }
    // The same run's labels in another namespace are not this teardown's either.
    server.seed({
      apiVersion: "v1",
      kind: "Namespace",
      metadata: { name: "other" },
    });
    server.seed({
      apiVersion: "v1",
      kind: "ConfigMap",
      metadata: { name: "vf-squares-specs", namespace: "other", labels: labels("r1") },
    });
    const report = await teardownRun(cluster, {
      flowId,
      runId: "r1",
      namespace: NS,
      timeoutSeconds: 5,
      pollSeconds: 0.02,
    });
    assert.deepEqual(
      [...report.deleted].sort(),
      objects.map((o) => `${o.kind} ${o.metadata.name}`).sort(),
    );
    assert.deepEqual(inventory(server), survivors.map((s) => `${s.kind}/${s.name}`).sort());
    assert.ok(server.get("v1", "ConfigMap", "other", "vf-squares-specs"));
    const deletes = server.requests.filter((r) => r.method === "DELETE");
    assert.equal(deletes.length, objects.length);
    for (const d of deletes) {
      assert.equal(new URLSearchParams(d.query).get("propagationPolicy"), "Background");
    }
    const again = await teardownRun(cluster, { flowId, runId: "r1", namespace: NS, timeoutSeconds: 1 });
    assert.deepEqual(again.deleted, [], "a second teardown finds nothing of the run");
  });
});

Deno.test("--single-run refuses while another run of the flow holds workloads (RUN-047)", async () => {
  await withServer(async (server, cluster) => {
    const { flowId, objects } = await render(HELLO, "r2", { singleRun: true });
    server.seed({
      apiVersion: "batch/v1",
      kind: "Job",
      metadata: {
        name: "vf-squares-older-node",
        namespace: NS,
        labels: { [OwnerLabel.flow]: flowId, [OwnerLabel.run]: "r1" },
      },
      spec: {},
    });
    const before = server.requests.length;
    await assert.rejects(applyRun(cluster, objects, options(flowId, "r2", { singleRun: true })), (error) => {
      assert.ok(error instanceof ActiveRunConflict, String(error));
      assert.equal(error.code, "VF_ACTIVE_RUN");
      assert.equal(error.exitCode, EXIT_ENVIRONMENT);
      assert.match(
        error.message,
        /run\(s\) r1 of flow squares already hold workloads .*Job vf-squares-older-node/,
      );
      return true;
    });
    assert.ok(server.requests.slice(before).every((r) => r.method === "GET"), "nothing was written");
    assert.deepEqual(inventory(server), ["Job/vf-squares-older-node"]);
    // Without --single-run the other run's differently named workload is no conflict.
    const { objects: plain } = await render(HELLO, "r2");
    await Promise.all([applyRun(cluster, plain, options(flowId, "r2")), finishProvision(server, plain)]);
    assert.equal(inventory(server).length, plain.length + 1);
  });
});

Deno.test("objects under the run's names that it does not own are refused, nothing written", async () => {
  await withServer(async (server, cluster) => {
    const { flowId, objects } = await render(HELLO, "r1");
    await Promise.all([applyRun(cluster, objects, options(flowId, "r1")), finishProvision(server, objects)]);
    const { objects: next } = await render(HELLO, "r2");
    const versions = inventory(server).length;
    await assert.rejects(applyRun(cluster, next, options(flowId, "r2")), (error) => {
      assert.ok(error instanceof ActiveRunConflict, String(error));
      assert.match(
        error.message,
        /would reconfigure another run's objects: ConfigMap vf-squares-specs \(run r1\)/,
      );
      return true;
    });
    assert.equal(inventory(server).length, versions);
    assert.equal(
      (stored(server, objects[0])!.metadata.labels as Record<string, string>)[OwnerLabel.run],
      "r1",
    );
  });
  await withServer(async (server, cluster) => {
    const { flowId, objects } = await render(HELLO, "r1");
    server.seed({
      apiVersion: "v1",
      kind: "ConfigMap",
      metadata: { name: "vf-squares-specs", namespace: NS },
    });
    await assert.rejects(applyRun(cluster, objects, options(flowId, "r1")), (error) => {
      assert.ok(error instanceof OwnershipConflict, String(error));
      assert.match(error.message, /not the flow's: ConfigMap vf-squares-specs/);
      return true;
    });
    assert.deepEqual(inventory(server), ["ConfigMap/vf-squares-specs"]);
  });
});

Deno.test("a namespace that does not exist, or a missing token, is a ClusterError with the server's status", async () => {
  const { flowId, objects } = await render(HELLO, "r1");
  await withServer(async (_server, cluster) => {
    await assert.rejects(applyRun(cluster, objects, options(flowId, "r1")), (error) => {
      assert.ok(error instanceof ClusterError, String(error));
      assert.equal(error.context.status, 404);
      assert.match(error.message, /namespaces "vision" not found/);
      return true;
    });
  }, { namespaces: ["default"] });
  const server = KubeApiServer.start({ namespaces: [NS], token: "s3cret" });
  try {
    const anonymous = ClusterClient.connect({ server: server.url });
    await assert.rejects(applyRun(anonymous, objects, options(flowId, "r1")), (error) => {
      assert.ok(error instanceof ClusterError, String(error));
      assert.equal(error.context.status, 401);
      assert.match(error.remedy ?? "", /--token/);
      return true;
    });
    const cluster = ClusterClient.connect({ server: server.url, token: "s3cret" });
    await Promise.all([applyRun(cluster, objects, options(flowId, "r1")), finishProvision(server, objects)]);
  } finally {
    await server.close();
  }
  const unreachable = ClusterClient.connect({ server: "http://127.0.0.1:9" });
  await assert.rejects(applyRun(unreachable, objects, options(flowId, "r1")), (error) => {
    assert.ok(error instanceof ClusterError, String(error));
    assert.match(error.message, /did not answer/);
    return true;
  });
});

Deno.test("the test server refuses stale resourceVersions, failed JSON-patch tests and stale deletes", async () => {
  await withServer(async (server, cluster) => {
    const { objects } = await render(HELLO, "r1");
    const specs = objects[0];
    const created = await cluster.apply(specs);
    const url = `${server.url}/api/v1/namespaces/${NS}/configmaps/${specs.metadata.name}`;
    const send = async (method: string, body: unknown, contentType = "application/json") => {
      const response = await fetch(url, {
        method,
        headers: { "content-type": contentType },
        body: JSON.stringify(body),
      });
      return { status: response.status, body: await response.json() };
    };
    const current = created.metadata.resourceVersion;
    const stale = String(Number(current) - 1);
    // A client-node apply at a stale version is refused, the object unchanged.
    await assert.rejects(cluster.apply({ ...specs, data: { x: "1" } }, stale), (error) => {
      assert.ok(error instanceof ClusterError);
      assert.equal(error.context.status, 409);
      return true;
    });
    const put = await send("PUT", { ...specs, metadata: { ...specs.metadata, resourceVersion: stale } });
    assert.equal(put.status, 409);
    assert.equal(put.body.kind, "Status");
    assert.equal(put.body.reason, "Conflict");
    const test = await send("PATCH", [
      { op: "test", path: "/metadata/resourceVersion", value: stale },
      { op: "replace", path: "/data", value: { x: "1" } },
    ], "application/json-patch+json");
    assert.equal(test.status, 422);
    assert.match(test.body.message, /test failed/);
    const stalePatch = await send("PATCH", [
      { op: "replace", path: "/metadata/resourceVersion", value: stale },
      { op: "replace", path: "/data", value: { x: "1" } },
    ], "application/json-patch+json");
    assert.equal(stalePatch.status, 409);
    const staleDelete = await send("DELETE", { preconditions: { resourceVersion: stale } });
    assert.equal(staleDelete.status, 409);
    assert.equal(server.get("v1", "ConfigMap", NS, specs.metadata.name)!.metadata.resourceVersion, current);
    assert.deepEqual(server.get("v1", "ConfigMap", NS, specs.metadata.name)!.data, specs.data);
    // At the current version each goes through, and each write bumps the version.
    const ok = await send("PATCH", [
      { op: "test", path: "/metadata/resourceVersion", value: current },
      { op: "add", path: "/data/x", value: "1" },
    ], "application/json-patch+json");
    assert.equal(ok.status, 200);
    assert.notEqual(ok.body.metadata.resourceVersion, current);
    assert.equal(ok.body.data.x, "1");
    const badPolicy = await send("DELETE", { propagationPolicy: "Sometimes" });
    assert.equal(badPolicy.status, 400);
    const removed = await send("DELETE", {
      propagationPolicy: "Foreground",
      preconditions: { resourceVersion: ok.body.metadata.resourceVersion },
    });
    assert.equal(removed.status, 200);
    assert.equal(server.get("v1", "ConfigMap", NS, specs.metadata.name), undefined);
  });
});
