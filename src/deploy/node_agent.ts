/**
 * The node agent's half of Kubernetes GPU allocation: what NVML shows on this host, published on its
 * Node as the devices annotation `allocation_kubernetes.ts` reads ({@link NodeAnnotation.devices}): every
 * card's UUID and memory, its MIG slices, and its MIG geometry (GPU-instance profiles and their possible
 * placements). GPU feature discovery labels a node with counts and products but no UUIDs; without this the
 * allocator can name no device. A host whose cards cannot all be read publishes nothing: a partial list
 * would let the allocator hand out a device it cannot see, or miss one a pod uses.
 *
 * @example
 * ```ts
 * const devices = publishedDevicesOf(readInventory());
 * if (devices.kind === "known") await publishNodeDevices(cluster, "gpu-node-1", devices.value);
 * ```
 *
 * @module
 */

import { known, type Observation, unknown } from "../backends/outcomes.ts";
import type { NvmlInventory } from "../../nvml/inventory.ts";
import type { PhysicalGpu } from "../../nvml/physical_device.ts";
import { NodeAnnotation, type PublishedDevice } from "./allocation_kubernetes.ts";
import type { ClusterClient } from "./cluster_client.ts";
import { ResourceUnavailable } from "../core/errors.ts";
import type { NodeMigGeometry } from "./mig_parted.ts";
import type { MigProfileInfo } from "./mig.ts";

const MIB = 1024 * 1024;

/** The first Unknown of `observations`, or null when every one is Known. */
function firstUnknown(observations: readonly Observation<unknown>[]): Observation<never> | null {
  return (observations.find((o) => o.kind === "unknown") as Observation<never> | undefined) ?? null;
}

/**
 * A card's MIG geometry as the planner reads it: Known(null) for a card without MIG profiles (no MIG, or
 * MIG off with none listed yet is Unknown, as NVML lists profiles only while MIG is on), Unknown when a
 * profile's name or placements could not be read.
 */
export function migGeometryOf(gpu: PhysicalGpu): Observation<NodeMigGeometry | null> {
  if (gpu.migMode.kind === "known" && gpu.migMode.value === null) return known(null);
  if (gpu.gpuInstanceProfiles.kind === "unknown") return gpu.gpuInstanceProfiles;
  const profiles: MigProfileInfo[] = [];
  for (const profile of gpu.gpuInstanceProfiles.value) {
    const missing = firstUnknown([profile.name, profile.placements]);
    if (missing !== null) return missing;
    if (profile.name.kind !== "known" || profile.placements.kind !== "known") continue;
    profiles.push({
      id: profile.id,
      name: profile.name.value,
      sliceCount: profile.sliceCount,
      instanceCount: profile.instanceCount,
      memorySizeMB: Math.round(profile.memoryBytes / MIB),
      placements: profile.placements.value.map(({ start, size }) => ({ start, size })),
    });
  }
  if (profiles.length === 0) return known(null);
  return known({
    computeSlices: Math.max(...profiles.map((p) => p.sliceCount)),
    memorySlices: Math.max(...profiles.flatMap((p) => p.placements.map((at) => at.start + at.size))),
    profiles,
  });
}

/** One card as published, or the Unknown that keeps the host from publishing. */
function publishedDeviceOf(gpu: PhysicalGpu): Observation<PublishedDevice> {
  // A card with MIG off lists no profiles until MIG is on: it goes without a geometry (the allocator then
  // carves nothing there), where a card with MIG on whose geometry cannot be read is not published.
  const migOff = gpu.migMode.kind === "known" && gpu.migMode.value !== null && !gpu.migMode.value.current;
  const read = migGeometryOf(gpu);
  const geometry = read.kind === "unknown" && migOff ? known(null) : read;
  const missing = firstUnknown([gpu.uuid, gpu.memory, gpu.migMode, gpu.migDevices, geometry]);
  if (missing !== null) return missing;
  if (
    gpu.uuid.kind !== "known" || gpu.memory.kind !== "known" || gpu.migDevices.kind !== "known" ||
    geometry.kind !== "known"
  ) {
    return unknown("unread", undefined, `GPU ${gpu.index} was not read whole`);
  }
  const slices: { uuid: string; profile: string; memory_bytes: number }[] = [];
  for (const slice of gpu.migDevices.value) {
    const unread = firstUnknown([slice.uuid, slice.profile, slice.memory]);
    if (unread !== null) return unread;
    if (slice.uuid.kind !== "known" || slice.profile.kind !== "known" || slice.memory.kind !== "known") {
      continue;
    }
    slices.push({
      uuid: slice.uuid.value,
      profile: slice.profile.value,
      memory_bytes: slice.memory.value.totalBytes,
    });
  }
  return known({
    ordinal: gpu.index,
    uuid: gpu.uuid.value,
    memory_bytes: gpu.memory.value.totalBytes,
    ...(slices.length === 0 ? {} : { mig: slices }),
    ...(geometry.value === null ? {} : { mig_geometry: geometry.value }),
  });
}

/**
 * Every card of `inventory` as the devices annotation carries it, in NVML's index order; Unknown (naming
 * the card and the field) when any part of any card could not be read, or the cards themselves.
 */
export function publishedDevicesOf(inventory: NvmlInventory): Observation<PublishedDevice[]> {
  if (inventory.devices.kind === "unknown") return inventory.devices;
  const devices: PublishedDevice[] = [];
  for (const gpu of inventory.devices.value) {
    const device = publishedDeviceOf(gpu);
    if (device.kind === "unknown") {
      return unknown(device.reason, undefined, `GPU ${gpu.index} cannot be published: ${device.detail}`);
    }
    devices.push(device.value);
  }
  return known(devices);
}

/**
 * Writes `devices` on Node `node` as its devices annotation, under the node's `resourceVersion` as read (a
 * write in between is a 409 from the API server, a ClusterError). Throws ResourceUnavailable when the node
 * does not exist.
 */
export async function publishNodeDevices(
  cluster: ClusterClient,
  node: string,
  devices: readonly PublishedDevice[],
): Promise<void> {
  const live = await cluster.read({ apiVersion: "v1", kind: "Node", namespace: "", name: node });
  if (live === null) {
    throw new ResourceUnavailable(
      `node ${node} is not in the cluster`,
      "pass the name of the Kubernetes node this host is (`kubectl get nodes`), e.g. from the downward API",
      { node },
    );
  }
  const metadata = live.metadata as { resourceVersion?: string; annotations?: Record<string, string> };
  // The whole annotation map as read plus this one, under the version read: a node with none yet has no
  // map to add a key to, and a write in between fails the test instead of being overwritten.
  await cluster.patchNode(node, [
    { op: "test", path: "/metadata/resourceVersion", value: metadata.resourceVersion },
    {
      op: "add",
      path: "/metadata/annotations",
      value: { ...metadata.annotations, [NodeAnnotation.devices]: JSON.stringify(devices) },
    },
  ]);
}
