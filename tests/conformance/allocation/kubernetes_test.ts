/**
 * The allocation stories against the Kubernetes adapter, the test API server playing the cluster
 * (tests/support/kube_gpu_cluster.ts): nodes labelled by GPU Feature Discovery, foreign pods, JSON
 * patches under resourceVersion preconditions.
 *
 * A small MIG manager answers `nvidia.com/mig.config` writes after `migApplySeconds` on the story's
 * clock. The stories that change geometry run the adapter as the managed-MIG authority, the others as
 * the device plugin's.
 */
import { ClusterClient } from "../../../src/deploy/cluster_client.ts";
import {
  KubernetesAllocationBackend,
  KubernetesAuthority,
} from "../../../src/deploy/allocation_kubernetes.ts";
import { KubeApiServer } from "../../support/kube_api_server.ts";
import { KubeGpuCluster } from "../../support/kube_gpu_cluster.ts";
import { allocationScenarios } from "./scenarios.ts";

allocationScenarios({
  name: "kubernetes",
  geometry: true,
  create: (options) => {
    const server = KubeApiServer.start();
    const hooks = new KubeGpuCluster(server, options.nodes, {
      clock: options.clock,
      migApplySeconds: options.migApplySeconds,
    });
    const backend = new KubernetesAllocationBackend(ClusterClient.connect({ server: server.url }), {
      clock: options.clock,
      authority: options.geometry ? KubernetesAuthority.managedMig : KubernetesAuthority.devicePlugin,
    });
    return Promise.resolve({ backend, hooks, close: () => server.close() });
  },
});
