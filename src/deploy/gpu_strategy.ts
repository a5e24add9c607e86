/**
 * How a GPU node's replicas ask a Kubernetes cluster for accelerators (spec core `gpu_count`,
 * `gpu_memory_gib`, `gpu_resource_name`; RFC 0003 whole devices, RFC 0004 MIG), under the NVIDIA device
 * plugin's three strategies:
 *
 * - `whole`: `gpu_count` devices of the extended resource (`nvidia.com/gpu` unless the node or the deploy
 *   names another), on nodes labelled `nvidia.com/gpu.present=true`.
 * - `mig-single`: every device of a node is cut into one MIG profile and advertised as `nvidia.com/gpu`;
 *   a replica that declares `gpuMemoryGib` goes to a node whose slices are at least that large
 *   (`nvidia.com/gpu.memory`, MiB, the slice's size as the GPU feature discovery labels it), on nodes
 *   labelled `nvidia.com/mig.strategy=single`.
 * - `mig-mixed`: slices of several profiles, each its own resource `nvidia.com/mig-<profile>`; the profile of
 *   a replica that declares `gpuMemoryGib` is the smallest that holds it in a layout {@link planMigLayout}
 *   finds for every such replica on the target's MIG devices (a refusal names each replica it cannot
 *   host); a GPU node without a memory demand takes whole devices.
 *
 * The strategy stamps the resource it chose on the spec (`gpuResourceName`), which is what the worker's
 * `VF_GPU_RESOURCE_NAME` then says. GPU pods tolerate the `nvidia.com/gpu` taint GPU nodes carry.
 *
 * @module
 */

import { NodeSpec } from "../core/compiler.ts";
import { ConfigError } from "../core/errors.ts";
import { type MigDeviceGeometry, migRefusalError, planMigLayout } from "./mig.ts";

/** The device plugin's strategies, as `--gpu-mode` names them. */
export const GpuMode = { whole: "whole", migSingle: "mig-single", migMixed: "mig-mixed" } as const;
/** One of {@link GpuMode}. */
export type GpuMode = typeof GpuMode[keyof typeof GpuMode];
/** Every {@link GpuMode}. */
export const GPU_MODES: readonly GpuMode[] = Object.values(GpuMode);

/** The extended resource of a whole device (and of a slice under `mig-single`). */
export const DEFAULT_GPU_RESOURCE = "nvidia.com/gpu";
/** The prefix of a MIG profile's resource under `mig-mixed`: `nvidia.com/mig-3g.20gb`. */
export const MIG_RESOURCE_PREFIX = "nvidia.com/mig-";

/** GPU feature discovery's node labels the placements select on. */
export const GpuNodeLabel = {
  present: "nvidia.com/gpu.present",
  migStrategy: "nvidia.com/mig.strategy",
  memoryMib: "nvidia.com/gpu.memory",
} as const;

/** One required node-affinity expression (a `NodeSelectorRequirement`). */
export interface NodeRequirement {
  readonly key: string;
  readonly operator: "In" | "Gt";
  readonly values: readonly string[];
}

/** One pod toleration. */
export interface GpuToleration {
  readonly key: string;
  readonly operator: "Exists";
  readonly effect: "NoSchedule";
}

/** How the replicas of one GPU node are placed: the resource, its count, where, and what they tolerate. */
export interface GpuPlacement {
  /** The extended resource each replica requests and is limited to. */
  readonly resource: string;
  /** How many of it each replica gets. */
  readonly count: number;
  /** Node-affinity expressions a node must meet, all of them. */
  readonly nodeRequirements: readonly NodeRequirement[];
  readonly tolerations: readonly GpuToleration[];
}

/** The deploy's GPU settings. */
export interface GpuStrategyOptions {
  /** The strategy ({@link GpuMode.whole} by default). */
  readonly mode?: GpuMode;
  /** The whole-device resource when a node names none (`--gpu-resource-name`; {@link DEFAULT_GPU_RESOURCE}). */
  readonly resourceName?: string;
  /** The target's MIG devices as NVML reports them: required by `mig-mixed` when a node declares memory. */
  readonly migDevices?: readonly MigDeviceGeometry[];
}

/** What a strategy made of a flow: the specs with their resources stamped, and each GPU node's placement. */
export interface GpuAssignment {
  /** Copies of the specs, a GPU node's `gpuResourceName` set to its resource; the others unchanged. */
  readonly specs: readonly NodeSpec[];
  /** GPU node name → its placement; CPU nodes are absent. */
  readonly placements: ReadonlyMap<string, GpuPlacement>;
}

const GPU_TOLERATION: GpuToleration = Object.freeze({
  key: DEFAULT_GPU_RESOURCE,
  operator: "Exists",
  effect: "NoSchedule",
});

/** Throws {@link ConfigError} for a mode that is not one of {@link GPU_MODES}. */
export function checkGpuMode(mode: string): GpuMode {
  if ((GPU_MODES as readonly string[]).includes(mode)) return mode as GpuMode;
  throw new ConfigError(
    `unknown GPU mode ${JSON.stringify(mode)}`,
    `pass --gpu-mode ${GPU_MODES.join(" | ")}`,
    { gpu_mode: mode },
  );
}

function placement(resource: string, count: number, requirements: NodeRequirement[]): GpuPlacement {
  return Object.freeze({
    resource,
    count,
    nodeRequirements: Object.freeze(requirements),
    tolerations: Object.freeze([GPU_TOLERATION]),
  });
}

function wholeDevices(spec: NodeSpec, options: GpuStrategyOptions): GpuPlacement {
  return placement(spec.gpuResourceName ?? options.resourceName ?? DEFAULT_GPU_RESOURCE, spec.gpuCount, [
    { key: GpuNodeLabel.present, operator: "In", values: ["true"] },
  ]);
}

function singleMig(spec: NodeSpec): GpuPlacement {
  const requirements: NodeRequirement[] = [
    { key: GpuNodeLabel.migStrategy, operator: "In", values: [GpuMode.migSingle.slice(4)] },
  ];
  if (spec.gpuMemoryGib !== null) {
    // Gt is strict: a slice of exactly the demand qualifies.
    const mib = Math.ceil(spec.gpuMemoryGib * 1024);
    requirements.push({ key: GpuNodeLabel.memoryMib, operator: "Gt", values: [String(mib - 1)] });
  }
  return placement(DEFAULT_GPU_RESOURCE, spec.gpuCount, requirements);
}

/** Each memory-declaring GPU node's MIG profile, from one layout for all of their replicas. */
function mixedProfiles(
  sharers: readonly NodeSpec[],
  devices: readonly MigDeviceGeometry[] | undefined,
): Map<string, string> {
  if (sharers.length === 0) return new Map();
  if (devices === undefined || devices.length === 0) {
    throw new ConfigError(
      `--gpu-mode mig-mixed needs the target's MIG devices to choose a profile for ${
        sharers.map((s) => s.name).join(", ")
      }`,
      "pass --mig-geometry FILE (a JSON list of the MIG devices' geometry, as NVML reports it)",
      { nodes: sharers.map((s) => s.name) },
    );
  }
  const demands = sharers.flatMap((spec) =>
    Array.from(
      { length: spec.nbTasks },
      (_, i) => ({ id: `${spec.name}/${i}`, gpuMemoryGib: spec.gpuMemoryGib! }),
    )
  );
  const plan = planMigLayout(devices, demands);
  if (plan.kind === "refused") throw migRefusalError(plan);
  const byDemand = new Map(
    plan.devices.flatMap((d) => d.created.map((slice) => [slice.demand, slice.profile])),
  );
  const profiles = new Map<string, string>();
  for (const spec of sharers) {
    const chosen = [
      ...new Set(demands.filter((d) => d.id.startsWith(`${spec.name}/`)).map((d) => byDemand.get(d.id)!)),
    ];
    if (chosen.length > 1) {
      throw new ConfigError(
        `the replicas of ${spec.name} fit different MIG profiles (${
          chosen.join(", ")
        }) on the target's devices, ` +
          "and one pod template requests one resource",
        "offer devices of one MIG family to the node, or raise gpuMemoryGib to a size one profile holds everywhere",
        { node: spec.name, profiles: chosen },
      );
    }
    profiles.set(spec.name, chosen[0]);
  }
  return profiles;
}

/**
 * Places every GPU node of `specs` under `options`' strategy (see the module doc). Throws
 * {@link ConfigError} for `mig-mixed` without MIG devices or with replicas of one node fitting different
 * profiles, and `ResourceUnavailable` (`migRefusalError`) when the devices cannot host every replica.
 */
export function assignGpus(specs: readonly NodeSpec[], options: GpuStrategyOptions = {}): GpuAssignment {
  const mode = options.mode ?? GpuMode.whole;
  const gpu = specs.filter((spec) => spec.deviceType === "gpu");
  const profiles = mode === GpuMode.migMixed
    ? mixedProfiles(gpu.filter((spec) => spec.gpuMemoryGib !== null), options.migDevices)
    : new Map<string, string>();
  const placements = new Map<string, GpuPlacement>();
  for (const spec of gpu) {
    const profile = profiles.get(spec.name);
    placements.set(
      spec.name,
      profile !== undefined
        ? placement(`${MIG_RESOURCE_PREFIX}${profile}`, 1, [
          { key: GpuNodeLabel.migStrategy, operator: "In", values: [GpuMode.migMixed.slice(4)] },
        ])
        : mode === GpuMode.migSingle
        ? singleMig(spec)
        : wholeDevices(spec, options),
    );
  }
  const stamped = specs.map((spec) => {
    const chosen = placements.get(spec.name);
    if (chosen === undefined) return spec;
    const copy = NodeSpec.fromDict(spec.toDict());
    copy.gpuResourceName = chosen.resource;
    return copy;
  });
  return { specs: stamped, placements };
}
