/**
 * `vf gpus --publish-node`: the node agent writes this host's NVML inventory on its Kubernetes node, where
 * the cluster's GPU allocation (`KubernetesAllocationBackend`) reads the real UUIDs and MIG slices; a
 * host whose cards cannot all be read publishes nothing (exit 3). The cluster is the test API server.
 *
 * @module
 */

import assert from "node:assert/strict";
import {
  GfdDeviceLabel,
  KubernetesAllocationBackend,
  NodeAnnotation,
} from "../../src/deploy/allocation_kubernetes.ts";
import { ClusterClient } from "../../src/deploy/cluster_client.ts";
import { requireKnown } from "../../src/backends/outcomes.ts";
import { fakeNvmlLibrary, FIXTURES, writeFixture } from "../support/fake_nvml.ts";
import { KubeApiServer } from "../support/kube_api_server.ts";
import { root, vf } from "../support/vf_cli.ts";

const TOKEN = "agent-token";

/** A GPU node as GPU feature discovery labels it: a count and a product, no UUIDs. */
function seedNode(server: KubeApiServer, name: string, count: number, product: string): void {
  server.seed({
    apiVersion: "v1",
    kind: "Node",
    metadata: { name, labels: { [GfdDeviceLabel.count]: String(count), [GfdDeviceLabel.product]: product } },
  });
}

async function publish(server: KubeApiServer, fixture: Record<string, unknown>, node: string) {
  const env = { VF_NVML_LIBRARY: await fakeNvmlLibrary(), FAKE_NVML_FIXTURE: await writeFixture(fixture) };
  return vf(["gpus", "--publish-node", node, "--server", server.url, "--token", TOKEN], {
    cwd: root.pathname,
    env,
  });
}

function annotationsOf(server: KubeApiServer, node: string): Record<string, string> {
  return (server.get("v1", "Node", null, node)!.metadata.annotations ?? {}) as Record<string, string>;
}

Deno.test("vf gpus --publish-node writes the host's cards, MIG slices and geometry on its node, where the cluster's allocation reads their UUIDs", async () => {
  const server = KubeApiServer.start({ token: TOKEN });
  try {
    seedNode(server, "edge-1", 1, "NVIDIA-A100-SXM4-40GB");
    const run = await publish(server, FIXTURES.a100Mig, "edge-1");
    assert.equal(run.code, 0, run.text);
    assert.match(run.stdout, /published 1 GPU\(s\) on node edge-1/);
    const published = JSON.parse(annotationsOf(server, "edge-1")[NodeAnnotation.devices]);
    assert.equal(published.length, 1);
    assert.match(published[0].uuid, /^GPU-a1b2c3d4-/);
    assert.deepEqual(published[0].mig.map((m: { profile: string }) => m.profile), [
      "3g.20gb",
      "2g.10gb",
      "1g.5gb",
    ]);
    assert(published[0].mig.every((m: { uuid: string }) => m.uuid.startsWith("MIG-")));
    const geometry = published[0].mig_geometry;
    assert.equal(geometry.computeSlices, 7);
    assert.equal(geometry.memorySlices, 8);
    assert(geometry.profiles.some((p: { name: string }) => p.name === "3g.20gb"));
    // The allocator now names the slices by their MIG UUIDs.
    const backend = new KubernetesAllocationBackend(
      ClusterClient.connect({ server: server.url, token: TOKEN }),
    );
    const snapshot = requireKnown(await backend.inventory(), "the inventory");
    assert.deepEqual(
      snapshot.devices.map((
        d,
      ) => [
        d.uuid,
        d.migProfile,
        d.migUuid === published[0].mig.find((m: { profile: string }) => m.profile === d.migProfile)?.uuid,
      ]),
      [
        [published[0].uuid, "3g.20gb", true],
        [published[0].uuid, "2g.10gb", true],
        [published[0].uuid, "1g.5gb", true],
      ],
    );
  } finally {
    await server.close();
  }
});

Deno.test("a host whose cards NVML cannot all read publishes nothing (exit 3), and a node that is not in the cluster is exit 3", async () => {
  const server = KubeApiServer.start({ token: TOKEN });
  try {
    seedNode(server, "edge-2", 1, "NVIDIA-H100-80GB-HBM3");
    const lost = await publish(server, FIXTURES.memoryFails, "edge-2");
    assert.equal(lost.code, 3, lost.text);
    assert.match(
      lost.text,
      /VF_STATE_UNKNOWN: this host's GPUs are not published on node edge-2: .*GPU 0 cannot be published/,
    );
    assert.equal(annotationsOf(server, "edge-2")[NodeAnnotation.devices], undefined, "nothing was written");
    const absent = await publish(server, FIXTURES.oneH100, "nowhere");
    assert.equal(absent.code, 3, absent.text);
    assert.match(absent.text, /node nowhere is not in the cluster/);
  } finally {
    await server.close();
  }
});
