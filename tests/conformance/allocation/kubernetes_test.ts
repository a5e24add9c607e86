/**
 * The allocation stories against the Kubernetes adapter, the test API server playing the cluster
 * (tests/support/kube_gpu_cluster.ts): nodes labelled by GPU Feature Discovery, foreign pods, JSON
 * patches under resourceVersion preconditions.
 *
 * `geometry: false`: the adapter runs under the device plugin's authority, which grants the devices and
 * slices that exist and changes no MIG geometry, so the stories that need geometry changed (34 and the
 * legal-starts half of 35) are ignored for it by the scenarios' own mechanism.
 */
import { ClusterClient } from "../../../src/deploy/cluster_client.ts";
import { KubernetesAllocationBackend } from "../../../src/deploy/allocation_kubernetes.ts";
import { KubeApiServer } from "../../support/kube_api_server.ts";
import { KubeGpuCluster } from "../../support/kube_gpu_cluster.ts";
import { allocationScenarios } from "./scenarios.ts";

allocationScenarios({
  name: "kubernetes",
  geometry: false,
  create: (options) => {
    const server = KubeApiServer.start();
    const hooks = new KubeGpuCluster(server, options.nodes);
    const backend = new KubernetesAllocationBackend(ClusterClient.connect({ server: server.url }), {
      clock: options.clock,
    });
    return Promise.resolve({ backend, hooks, close: () => server.close() });
  },
});
