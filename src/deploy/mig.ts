/**
 * The MIG layout planner (issue 16; spec core `gpu_memory_gib`, RFC 0004's mix strategy): each GPU node
 * replica that declares `gpuMemoryGib` gets an exclusive GPU instance of at least that size on a
 * MIG-capable device, the card shared, the slice not.
 *
 * The planner reads a device as NVML reports it ({@link MigDeviceGeometry}: the GPU-instance profiles of
 * `nvmlDeviceGetGpuInstanceProfileInfoV`, the possible placements of
 * `nvmlDeviceGetGpuInstancePossiblePlacements_v2`, the GPU instances that already exist from
 * `nvmlDeviceGetGpuInstances`) and knows no card family of its own. A plan ({@link planMigLayout}):
 *
 * - gives every demand the smallest profile that holds it (least memory, then fewest compute slices, then
 *   fewest memory slices) and never a larger one;
 * - counts compute slices and memory slices apart, honours every profile's instance cap, and puts every
 *   new instance at a start NVML lists, overlapping nothing;
 * - keeps every instance that exists where it is and never hosts a demand on it: geometry is never
 *   destroyed under a workload, and an existing instance may be some workload's;
 * - is complete: when some assignment of the demands to the devices hosts them all, it finds one;
 * - refuses otherwise with the largest set of demands that can be hosted laid out, and every other demand
 *   named with the reason each of its devices cannot take it as well (no profile large enough, instance
 *   cap, compute slices, memory slices, or no legal start: slice counts that fit but no free position);
 * - is deterministic: the same input gives the same plan. Among equally good plans it fills devices of
 *   one geometry in input order (the geometry seen first first), and of demands every device treats
 *   alike it hosts the earlier ones in the input first.
 *
 * The search is exhaustive and exponential in the worst case; memoized over alike devices and alike
 * demands and cut by slice budgets, a host's plan (eight devices of one family, dozens of replicas of a
 * few sizes) takes milliseconds.
 *
 * @example
 * ```ts
 * const a100: MigDeviceGeometry = {
 *   device: "GPU-0",
 *   computeSlices: 7,
 *   memorySlices: 8,
 *   profiles: [
 *     { id: 0, name: "1g.5gb", sliceCount: 1, instanceCount: 7, memorySizeMB: 5120,
 *       placements: [0, 1, 2, 3, 4, 5, 6].map((start) => ({ start, size: 1 })) },
 *     { id: 2, name: "3g.20gb", sliceCount: 3, instanceCount: 2, memorySizeMB: 20480,
 *       placements: [{ start: 0, size: 4 }, { start: 4, size: 4 }] },
 *   ],
 *   instances: [],
 * };
 * const plan = planMigLayout([a100], [{ id: "det/0", gpuMemoryGib: 16 }, { id: "ocr/0", gpuMemoryGib: 4 }]);
 * if (plan.kind === "planned") console.log(plan.devices[0].layout); // { "1g.5gb": 1, "3g.20gb": 1 }
 * ```
 *
 * @module
 */

import { ConfigError, ResourceUnavailable, UnobservableState } from "../core/errors.ts";
import {
  type DeviceModel,
  deviceModel,
  geometryProblems,
  MIB_PER_GIB,
  smallestFit,
  type UsableProfile,
} from "./_mig_device.ts";
import { hostDemands, type Hosting } from "./_mig_search.ts";

/** One placement: `nvmlGpuInstancePlacement_t`. */
export interface MigPlacementRange {
  /** The first memory slice it occupies. */
  readonly start: number;
  /** How many memory slices it occupies. */
  readonly size: number;
}

/**
 * One GPU-instance profile of a device: the fields of `nvmlGpuInstanceProfileInfo_v2_t` the planner
 * needs, with the placements `nvmlDeviceGetGpuInstancePossiblePlacements_v2` lists for its id (every
 * position the profile may ever start at, not the ones free now).
 */
export interface MigProfileInfo {
  /** The profile id within the device (`id`). */
  readonly id: number;
  /** The profile's name, the key a layout names it by: the info's `name` less NVML's `MIG ` prefix (`1g.10gb`). */
  readonly name: string;
  /** Compute slices one instance takes (`sliceCount`). */
  readonly sliceCount: number;
  /** How many instances of the profile the device can hold at most (`instanceCount`). */
  readonly instanceCount: number;
  /** Memory of one instance in MiB, as NVML's `memorySizeMB` counts it. */
  readonly memorySizeMB: number;
  /** Its possible placements; `size` is the profile's width in memory slices. */
  readonly placements: readonly MigPlacementRange[];
}

/** A GPU instance that exists on the device: `nvmlGpuInstanceInfo_t`. */
export interface MigInstanceInfo {
  /** The GPU-instance id within the device (`id`). */
  readonly id: number;
  /** The id of its profile (`profileId`). */
  readonly profileId: number;
  /** Where it sits (`placement`). */
  readonly placement: MigPlacementRange;
}

/** A MIG-capable device as NVML reports it. */
export interface MigDeviceGeometry {
  /** The device's key (its UUID); unique among the devices of one plan. */
  readonly device: string;
  /** The device's compute-slice budget (the full profile's `sliceCount`). */
  readonly computeSlices: number;
  /** The device's memory-slice budget (the full profile's placement `size`). */
  readonly memorySlices: number;
  /** Its GPU-instance profiles; a profile with no placement or an instance count of 0 is never used. */
  readonly profiles: readonly MigProfileInfo[];
  /** The GPU instances that exist now; each is kept where it is. */
  readonly instances: readonly MigInstanceInfo[];
}

/** One node replica's demand for an exclusive GPU instance. */
export interface MigDemand {
  /** The demand's key (the replica); unique among the demands of one plan. */
  readonly id: string;
  /** The GPU memory it needs, in GiB (1024 MiB). */
  readonly gpuMemoryGib: number;
  /** The devices it may go to (by key); every device when absent. */
  readonly devices?: readonly string[];
}

/** One instance of a planned layout. */
export interface MigSlice {
  /** The profile's name. */
  readonly profile: string;
  /** The profile's id, as `nvmlDeviceCreateGpuInstanceWithPlacement` takes it. */
  readonly profileId: number;
  /** Its first memory slice: one of the profile's possible placements. */
  readonly start: number;
  /** Its width in memory slices. */
  readonly size: number;
}

/** An instance the plan creates for one demand. */
export interface MigCreatedSlice extends MigSlice {
  /** The demand it hosts. */
  readonly demand: string;
}

/** An instance that existed before the plan and stays where it is. */
export interface MigKeptSlice extends MigSlice {
  /** Its GPU-instance id. */
  readonly instanceId: number;
}

/** What one device holds once a plan is applied. */
export interface MigDeviceLayout {
  /** The device's key. */
  readonly device: string;
  /** Every instance by profile name → count, kept ones included; names sorted. */
  readonly layout: Readonly<Record<string, number>>;
  /** The instances that existed, sorted by start. */
  readonly kept: readonly MigKeptSlice[];
  /** The instances to create, sorted by start; none overlaps another or a kept one. */
  readonly created: readonly MigCreatedSlice[];
}

/** Why a device cannot take one more demand. */
export const MigShortfall = {
  /** No usable profile of the device holds the demand's memory. */
  noProfile: "no-profile-large-enough",
  /** The smallest profile that holds it already has as many instances as the device allows. */
  maxInstances: "max-instances-exceeded",
  /** Its compute slices do not fit beside the device's other instances. */
  computeSlices: "out-of-compute-slices",
  /** Its memory slices do not fit beside the device's other instances. */
  memorySlices: "out-of-memory-slices",
  /** The slice counts fit, but no possible placement of it is free however the new instances are put. */
  noLegalStart: "no-legal-start",
} as const;
/** One of {@link MigShortfall}. */
export type MigShortfall = typeof MigShortfall[keyof typeof MigShortfall];

/** Why one device cannot take one unmet demand. */
export interface MigDeviceShortfall {
  /** The device's key. */
  readonly device: string;
  /** The first obstacle, in {@link MigShortfall}'s order. */
  readonly reason: MigShortfall;
  /** The smallest profile of the device that holds the demand; null with `no-profile-large-enough`. */
  readonly profile: string | null;
  /** What an operator reads: the figures behind the reason. */
  readonly detail: string;
}

/** A demand no plan can host beside the hosted ones, with the reason on each device it may go to. */
export interface MigUnmetDemand {
  /** The demand's key. */
  readonly demand: string;
  /** The GPU memory it needs, in GiB. */
  readonly gpuMemoryGib: number;
  /** One entry for each device it may go to, in the order the devices were given. */
  readonly shortfalls: readonly MigDeviceShortfall[];
}

/** Every demand hosted: what each device holds once the plan is applied, in the order given. */
export interface MigLayoutPlanned {
  /** Always `planned`. */
  readonly kind: "planned";
  /** One layout per device, in the order the devices were given. */
  readonly devices: readonly MigDeviceLayout[];
}

/** Not every demand can be hosted: the largest hostable set laid out, and every other demand with why. */
export interface MigLayoutRefused {
  /** Always `refused`. */
  readonly kind: "refused";
  /** Every demand left out, in input order; never empty. */
  readonly unmet: readonly MigUnmetDemand[];
  /** The layout of the largest hostable set of demands, one per device, in the order given. */
  readonly partial: readonly MigDeviceLayout[];
}

/** What {@link planMigLayout} answers. */
export type MigLayoutPlan = MigLayoutPlanned | MigLayoutRefused;

function demandProblems(demands: readonly MigDemand[], devices: ReadonlySet<string>): string[] {
  const problems: string[] = [];
  const ids = new Set<string>();
  for (const d of demands) {
    const label = `demand ${JSON.stringify(d.id)}`;
    if (typeof d.id !== "string" || d.id === "" || ids.has(d.id)) {
      problems.push(`${label}: the id is not a unique, non-empty string`);
    }
    ids.add(d.id);
    if (!(typeof d.gpuMemoryGib === "number" && Number.isFinite(d.gpuMemoryGib) && d.gpuMemoryGib > 0)) {
      problems.push(`${label}: gpuMemoryGib ${d.gpuMemoryGib} is not a number > 0`);
    }
    if (d.devices !== undefined) {
      if (d.devices.length === 0) problems.push(`${label}: it may go to no device`);
      const strangers = d.devices.filter((key) => !devices.has(key));
      if (strangers.length > 0) problems.push(`${label}: devices ${strangers.join(", ")} are not offered`);
    }
  }
  return problems;
}

/** Why `model` cannot take a demand of `gib` beside `counts` new instances. */
function shortfall(model: DeviceModel, counts: readonly number[], gib: number): MigDeviceShortfall {
  const g = model.geometry;
  const index = smallestFit(model, gib);
  if (index < 0) {
    const largest = model.usable.at(-1);
    return {
      device: g.device,
      reason: MigShortfall.noProfile,
      profile: null,
      detail: largest === undefined
        ? `${g.device} lists no profile it can create`
        : `the largest profile of ${g.device}, ${largest.info.name}, has ${largest.info.memorySizeMB} MiB, ` +
          `${gib} GiB is ${gib * MIB_PER_GIB} MiB`,
    };
  }
  const p = model.usable[index];
  const name = p.info.name;
  const of = (field: (u: UsableProfile) => number) =>
    model.usable.reduce((sum, u, i) => sum + counts[i] * field(u), 0);
  const compute = model.keptCompute + of((u) => u.info.sliceCount);
  const memory = model.keptMemory + of((u) => u.width);
  const instances = model.keptCounts[index] + counts[index];
  const at = (reason: MigShortfall, detail: string): MigDeviceShortfall => ({
    device: g.device,
    reason,
    profile: name,
    detail,
  });
  if (instances + 1 > p.info.instanceCount) {
    return at(
      MigShortfall.maxInstances,
      `${g.device} holds ${instances} ${name}, its cap is ${p.info.instanceCount}`,
    );
  }
  if (compute + p.info.sliceCount > g.computeSlices) {
    return at(
      MigShortfall.computeSlices,
      `${name} takes ${p.info.sliceCount} compute slices, ${g.device} has ${g.computeSlices - compute} ` +
        `of ${g.computeSlices} free`,
    );
  }
  if (memory + p.width > g.memorySlices) {
    return at(
      MigShortfall.memorySlices,
      `${name} takes ${p.width} memory slices, ${g.device} has ${g.memorySlices - memory} of ` +
        `${g.memorySlices} free`,
    );
  }
  return at(
    MigShortfall.noLegalStart,
    `${name} may start at slices ${p.placements.map((r) => r.start).join(", ")} only, and none of them ` +
      `is free beside the other instances of ${g.device}, however the new ones are placed`,
  );
}

function canonical(layout: Readonly<Record<string, number>>): Readonly<Record<string, number>> {
  return Object.freeze(Object.fromEntries(Object.keys(layout).sort().map((name) => [name, layout[name]])));
}

/** How many new instances of each usable profile `hosted` puts on `model` (the device at `device`). */
function countsOn(model: DeviceModel, device: number, hosted: readonly Hosting[]): number[] {
  const counts = model.usable.map(() => 0);
  for (const h of hosted) if (h.device === device) counts[h.profile]++;
  return counts;
}

/** What `model` holds once `hosted` is applied: its kept instances and one new instance per demand on it. */
function layoutOf(
  model: DeviceModel,
  device: number,
  hosted: readonly Hosting[],
  demands: readonly MigDemand[],
): MigDeviceLayout {
  const placements = model.placeable.get(countsOn(model, device, hosted).join(","))!;
  const mine = hosted.filter((h) => h.device === device).sort((a, b) => a.demand - b.demand);
  const created = placements.map((slot) => {
    const taker = mine.splice(mine.findIndex((h) => h.profile === slot.profile), 1)[0];
    const p = model.usable[slot.profile];
    return Object.freeze({
      profile: p.info.name,
      profileId: p.info.id,
      start: slot.start,
      size: p.width,
      demand: demands[taker.demand].id,
    });
  });
  const layout: Record<string, number> = {};
  for (const slice of [...model.kept, ...created]) layout[slice.profile] = (layout[slice.profile] ?? 0) + 1;
  return Object.freeze({
    device: model.geometry.device,
    layout: canonical(layout),
    kept: model.kept,
    created: Object.freeze(created),
  });
}

/**
 * Plans exclusive GPU instances for `demands` on `devices` (see the module doc for what a plan
 * guarantees). Throws `UnobservableState` when a device's geometry contradicts itself (an overlap, a
 * placement outside the device, an instance of an unlisted profile: the plan is never guessed) and
 * `ConfigError` for a demand that is not one (no positive memory, a repeated id, a device not offered)
 * or for no device at all; each names every problem at once.
 */
export function planMigLayout(
  devices: readonly MigDeviceGeometry[],
  demands: readonly MigDemand[],
): MigLayoutPlan {
  if (devices.length === 0) {
    throw new ConfigError(
      "there is no MIG device to plan GPU instances onto",
      "run the GPU nodes on whole devices or on their CPU fallback, or plan on a host with MIG enabled",
    );
  }
  const keys = devices.map((g) => g.device);
  const geometry = devices.flatMap((g, i) => {
    const problems = geometryProblems(g);
    if (typeof g.device !== "string" || g.device === "" || keys.indexOf(g.device) !== i) {
      problems.unshift("the device key is not a unique, non-empty string");
    }
    return problems.map((p) => `${JSON.stringify(g.device)}: ${p}`);
  });
  if (geometry.length > 0) {
    throw new UnobservableState(
      `the MIG geometry read for ${geometry.length === 1 ? "a device" : "the devices"} is not consistent: ` +
        geometry.join("; "),
      "read the devices again through NVML (profile info, possible placements, GPU instances) and plan again",
      { problems: geometry },
    );
  }
  const demanded = demandProblems(demands, new Set(keys));
  if (demanded.length > 0) {
    throw new ConfigError(
      `the MIG demands are not valid: ${demanded.join("; ")}`,
      "give every GPU replica a unique id, a gpuMemoryGib > 0 and, when pinned, devices that are offered",
      { problems: demanded },
    );
  }
  const models = devices.map(deviceModel);
  const allowed = (demand: MigDemand, model: DeviceModel) =>
    demand.devices === undefined || demand.devices.includes(model.geometry.device);
  const signatures = demands.map((demand) =>
    models.map((model) => allowed(demand, model) ? smallestFit(model, demand.gpuMemoryGib) : -1)
  );
  const hosted = hostDemands(models, signatures);
  const layouts = models.map((model, device) => layoutOf(model, device, hosted, demands));
  const placed = new Set(hosted.map((h) => h.demand));
  if (placed.size === demands.length) {
    return Object.freeze({ kind: "planned", devices: Object.freeze(layouts) });
  }
  const unmet = demands.flatMap((demand, index) => {
    if (placed.has(index)) return [];
    const shortfalls = models.flatMap((model, device) =>
      allowed(demand, model)
        ? [Object.freeze(shortfall(model, countsOn(model, device, hosted), demand.gpuMemoryGib))]
        : []
    );
    return [
      Object.freeze({
        demand: demand.id,
        gpuMemoryGib: demand.gpuMemoryGib,
        shortfalls: Object.freeze(shortfalls),
      }),
    ];
  });
  return Object.freeze({ kind: "refused", unmet: Object.freeze(unmet), partial: Object.freeze(layouts) });
}

/**
 * The refusal as the typed error a launcher raises: `ResourceUnavailable` naming every unmet demand and
 * each device's reason, with the unmet demands in its context.
 */
export function migRefusalError(refusal: MigLayoutRefused): ResourceUnavailable {
  const lines = refusal.unmet.map((u) =>
    `${u.demand} (${u.gpuMemoryGib} GiB): ` + u.shortfalls.map((s) => `${s.reason}: ${s.detail}`).join("; ")
  );
  return new ResourceUnavailable(
    `${refusal.unmet.length} GPU replica(s) cannot get a MIG instance: ${lines.join(" | ")}`,
    "lower gpuMemoryGib or the replica count, free the instances other workloads hold, or add a MIG device",
    { unmet: refusal.unmet },
  );
}

/**
 * Whether `layout` (profile name → new instances) fits `device` beside the instances it has, every new
 * one at a start NVML lists, overlapping nothing, within the slice budgets and instance caps. A profile
 * the device cannot create never fits. Throws `UnobservableState` when the geometry contradicts itself.
 */
export function migLayoutFits(device: MigDeviceGeometry, layout: Readonly<Record<string, number>>): boolean {
  const problems = geometryProblems(device);
  if (problems.length > 0) {
    throw new UnobservableState(
      `the MIG geometry read for ${device.device} is not consistent: ${problems.join("; ")}`,
      "read the device again through NVML and check again",
      { problems },
    );
  }
  const model = deviceModel(device);
  const named = Object.entries(layout).filter(([, count]) => count > 0);
  if (named.some(([name]) => !model.usable.some((p) => p.info.name === name))) return false;
  return model.placeable.has(model.usable.map((p) => layout[p.info.name] ?? 0).join(","));
}
