/**
 * The Kubernetes allocator's own cases beside the conformance stories, against the test API server:
 * what a node without the node agent's devices annotation yields (no invented UUIDs), a malformed one
 * (Unknown), existing MIG slices granted and bound by their resource, the write a reservation sends (a
 * JSON patch carrying the resourceVersion read) losing to a writer in between, and holds removed by
 * another writer observed as a failed claim.
 */
import assert from "node:assert/strict";
import { type InventorySnapshot, workloadRequest } from "../../src/backends/allocation.ts";
import { requireKnown } from "../../src/backends/outcomes.ts";
import { OwnershipConflict } from "../../src/core/errors.ts";
import {
  GfdDeviceLabel,
  KubernetesAllocationBackend,
  NodeAnnotation,
  type PublishedDevice,
} from "../../src/deploy/allocation_kubernetes.ts";
import { ClusterClient } from "../../src/deploy/cluster_client.ts";
import { GpuNodeLabel } from "../../src/deploy/gpu_strategy.ts";
import { KubeApiServer } from "../support/kube_api_server.ts";

const GIB = 2 ** 30;
const H100 = "NVIDIA-H100-80GB-HBM3";

async function withCluster(
  fn: (server: KubeApiServer, backend: KubernetesAllocationBackend) => Promise<void>,
): Promise<void> {
  const server = KubeApiServer.start();
  try {
    await fn(server, new KubernetesAllocationBackend(ClusterClient.connect({ server: server.url })));
  } finally {
    await server.close();
  }
}

function seedNode(
  server: KubeApiServer,
  name: string,
  count: number,
  annotations: Record<string, string> = {},
): void {
  server.seed({
    apiVersion: "v1",
    kind: "Node",
    metadata: {
      name,
      labels: {
        [GfdDeviceLabel.count]: String(count),
        [GfdDeviceLabel.product]: H100,
        [GpuNodeLabel.memoryMib]: "81559",
      },
      annotations,
    },
  });
}

function exclusive(workloadId: string, deviceCount: number) {
  return workloadRequest({ flowId: "f", runId: "r", workloadId, deviceCount, sharing: "exclusive" });
}

async function snapshotOf(backend: KubernetesAllocationBackend): Promise<InventorySnapshot> {
  return requireKnown(await backend.inventory(), "the inventory");
}

Deno.test("kubernetes allocation: without the devices annotation a device has no UUID; a malformed one is Unknown", async () => {
  await withCluster(async (server, backend) => {
    seedNode(server, "n1", 2);
    const snapshot = await snapshotOf(backend);
    assert.deepEqual(snapshot.devices.map((d) => [d.node, d.ordinal, d.uuid, d.memoryBytes]), [
      ["n1", 0, null, 81559 * 2 ** 20],
      ["n1", 1, null, 81559 * 2 ** 20],
    ]);
    assert.equal(snapshot.sharing.n1, "physical");
    const plan = await backend.plan([exclusive("w", 2)], snapshot);
    assert.equal(plan.kind, "feasible");
    const claim = await backend.reserve(plan.kind === "feasible" ? plan : assert.fail(), "op-1", null);
    const node = server.get("v1", "Node", null, "n1")!;
    const annotations = node.metadata.annotations as Record<string, string>;
    assert.deepEqual(Object.keys(JSON.parse(annotations[NodeAnnotation.holds])), ["n1/0", "n1/1"]);
    assert.equal(annotations[NodeAnnotation.lastOperation], "op-1");
    assert.equal(requireKnown(await backend.observe(claim.claimId), "the claim").status, "prepared");
    seedNode(server, "n2", 1, { [NodeAnnotation.devices]: '[{"ordinal": 0}]' });
    const broken = await backend.inventory();
    assert.equal(broken.kind, "unknown");
    assert.equal(broken.kind === "unknown" ? broken.reason : null, "malformed");
  });
});

Deno.test("kubernetes allocation: an existing MIG slice is granted and bound by its resource; foreign slice pods count", async () => {
  await withCluster(async (server, backend) => {
    const devices: PublishedDevice[] = [{
      ordinal: 0,
      uuid: "GPU-a",
      memory_bytes: 80 * GIB,
      mig: [
        { uuid: "MIG-a-0", profile: "1g.10gb", memory_bytes: 10 * GIB },
        { uuid: "MIG-a-1", profile: "1g.10gb", memory_bytes: 10 * GIB },
        { uuid: "MIG-a-2", profile: "3g.40gb", memory_bytes: 40 * GIB },
      ],
    }];
    seedNode(server, "n1", 1, { [NodeAnnotation.devices]: JSON.stringify(devices) });
    server.seed({
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name: "foreign", namespace: "default" },
      spec: {
        nodeName: "n1",
        containers: [{ name: "c", resources: { limits: { "nvidia.com/mig-1g.10gb": "1" } } }],
      },
      status: { phase: "Running" },
    });
    const snapshot = await snapshotOf(backend);
    assert.equal(snapshot.sharing.n1, "mig");
    assert.deepEqual(snapshot.occupancy, { "MIG-a-0": 1 }, "the foreign pod holds one 1g.10gb slice");
    const ask = workloadRequest({
      flowId: "f",
      runId: "r",
      workloadId: "w",
      deviceCount: 1,
      sharing: "mig",
      minimumUsableMemoryBytes: 8 * GIB,
    });
    const plan = await backend.plan([ask], snapshot);
    assert.equal(plan.kind, "feasible");
    if (plan.kind !== "feasible") return;
    assert.equal(plan.assignments.w[0].migUuid, "MIG-a-1", "the smallest free slice that holds it");
    const claim = await backend.reserve(plan, "op-1", null);
    assert.equal(claim.status, "allocated");
    const bindings = await backend.bindings(claim.claimId, "w");
    assert.equal(bindings.env.CUDA_VISIBLE_DEVICES, "MIG-a-1");
    assert.deepEqual(bindings.containerFragment, {
      resources: { limits: { "nvidia.com/mig-1g.10gb": "1" } },
    });
    const second = await backend.plan([{ ...ask, workloadId: "x" }], await snapshotOf(backend));
    assert.equal(second.kind === "feasible" ? second.assignments.x[0].migUuid : null, "MIG-a-2");
    const geometry = await backend.plan(
      [{ ...ask, workloadId: "y", minimumUsableMemoryBytes: 60 * GIB }],
      await snapshotOf(backend),
    );
    assert.match(geometry.kind === "infeasible" ? geometry.reasons.join(";") : "", /cannot change geometry/);
  });
});

Deno.test("kubernetes allocation: a reservation's patch carries the version read, and a write in between wins", async () => {
  await withCluster(async (server, backend) => {
    seedNode(server, "n1", 2);
    const plan = await backend.plan([exclusive("w", 1)], await snapshotOf(backend));
    if (plan.kind !== "feasible") return assert.fail("feasible");
    const other = ClusterClient.connect({ server: server.url });
    let interfered = false;
    server.beforeRequest = async (request) => {
      if (interfered || request.method !== "PATCH" || request.path !== "/api/v1/nodes/n1") return;
      interfered = true;
      const node = await other.read({ apiVersion: "v1", kind: "Node", namespace: "", name: "n1" });
      await other.patchNode("n1", [
        { op: "replace", path: "/metadata/resourceVersion", value: node!.metadata.resourceVersion },
        { op: "add", path: "/metadata/labels/team", value: "vision" },
      ]);
    };
    await assert.rejects(backend.reserve(plan, "op-1", null), OwnershipConflict);
    assert.ok(interfered);
    const patch = server.writes.find((w) => w.path === "/api/v1/nodes/n1" && w.body.includes("op-1"));
    assert.equal(patch, undefined, "the reservation's patch was refused, nothing of it kept");
    const refused = server.requests.filter((r) => r.method === "PATCH" && r.path === "/api/v1/nodes/n1");
    assert.equal(refused.at(-1)?.contentType, "application/json-patch+json");
    const node = server.get("v1", "Node", null, "n1")!;
    assert.equal(
      (node.metadata.annotations as Record<string, string> | undefined)?.[NodeAnnotation.holds],
      undefined,
    );
    assert.equal(server.all("v1", "ConfigMap").length, 0, "no claim record was created");
  });
});

Deno.test("kubernetes allocation: holds another writer removed make the claim failed, with what is missing", async () => {
  await withCluster(async (server, backend) => {
    seedNode(server, "n1", 1);
    const plan = await backend.plan([exclusive("w", 1)], await snapshotOf(backend));
    if (plan.kind !== "feasible") return assert.fail("feasible");
    const claim = await backend.reserve(plan, "op-1", null);
    const other = ClusterClient.connect({ server: server.url });
    const node = await other.read({ apiVersion: "v1", kind: "Node", namespace: "", name: "n1" });
    await other.patchNode("n1", [
      { op: "replace", path: "/metadata/resourceVersion", value: node!.metadata.resourceVersion },
      { op: "remove", path: `/metadata/annotations/${NodeAnnotation.holds.replace("/", "~1")}` },
    ]);
    const observed = requireKnown(await backend.observe(claim.claimId), "the claim");
    assert.equal(observed.status, "failed");
    assert.equal(observed.grant, null);
    assert.deepEqual(observed.evidence.missing_holds, [`${claim.claimId}#w@n1/0`]);
  });
});
