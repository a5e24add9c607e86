/**
 * One MIG device as the planner reads it (a private part of `mig.ts`): its geometry checked for
 * consistency, the profiles it can create in fit order, the instances it keeps, and every set of new
 * instances that fits beside them with one legal placement for each.
 *
 * @module
 */

import type { MigDeviceGeometry, MigKeptSlice, MigPlacementRange, MigProfileInfo } from "./mig.ts";

/** MiB in one GiB: a demand of `gpuMemoryGib` fits a profile of at least this many times as many MiB. */
export const MIB_PER_GIB = 1024;
/** Memory slices are bits of a number; real devices have at most 8. */
const MAX_MEMORY_SLICES = 30;

/** A profile the device can create, with its width and the slice mask of each possible placement. */
export interface UsableProfile {
  readonly info: MigProfileInfo;
  readonly width: number;
  readonly placements: readonly { readonly start: number; readonly mask: number }[];
}

/** A device read into what the search needs. */
export interface DeviceModel {
  readonly geometry: MigDeviceGeometry;
  /** Usable profiles in fit order: least memory, then fewest compute slices, then narrowest, then id. */
  readonly usable: readonly UsableProfile[];
  readonly kept: readonly MigKeptSlice[];
  /** Kept instances per usable profile (by index in `usable`). */
  readonly keptCounts: readonly number[];
  readonly keptCompute: number;
  readonly keptMemory: number;
  /** Counts of new instances per usable profile (joined by commas) → where they go, by start. */
  readonly placeable: ReadonlyMap<string, readonly { readonly profile: number; readonly start: number }[]>;
  /** The most new instances any placeable set holds. */
  readonly mostNew: number;
}

/** A safe integer >= 0. */
function isCount(value: unknown): value is number {
  return Number.isSafeInteger(value) && (value as number) >= 0;
}

/** The memory slices a placement occupies, as bits. */
function maskOf(range: MigPlacementRange): number {
  return ((1 << range.size) - 1) << range.start;
}

/** Every inconsistency of one device's geometry (its key aside), one line each. */
export function geometryProblems(g: MigDeviceGeometry): string[] {
  const problems: string[] = [];
  if (!isCount(g.computeSlices) || g.computeSlices < 1) {
    problems.push(`compute slices ${g.computeSlices} is not a positive integer`);
  }
  if (!isCount(g.memorySlices) || g.memorySlices < 1 || g.memorySlices > MAX_MEMORY_SLICES) {
    problems.push(`memory slices ${g.memorySlices} is not an integer from 1 to ${MAX_MEMORY_SLICES}`);
    return problems;
  }
  const inRange = (r: MigPlacementRange) =>
    isCount(r.start) && isCount(r.size) && r.size >= 1 && r.start + r.size <= g.memorySlices;
  const ids = new Set<number>();
  const names = new Set<string>();
  for (const p of g.profiles) {
    const label = `profile ${JSON.stringify(p.name)} (id ${p.id})`;
    if (!isCount(p.id) || ids.has(p.id)) problems.push(`${label}: the id is not a unique integer`);
    if (typeof p.name !== "string" || p.name === "" || names.has(p.name)) {
      problems.push(`${label}: the name is not a unique, non-empty string`);
    }
    ids.add(p.id);
    names.add(p.name);
    if (!isCount(p.sliceCount) || !isCount(p.instanceCount)) {
      problems.push(
        `${label}: slice count ${p.sliceCount} or instance count ${p.instanceCount} is not an integer`,
      );
    }
    if (!(Number.isFinite(p.memorySizeMB) && p.memorySizeMB > 0)) {
      problems.push(`${label}: memory ${p.memorySizeMB} MiB is not a positive number`);
    }
    const bad = p.placements.filter((r) => !inRange(r));
    if (bad.length > 0) {
      problems.push(
        `${label}: placements ${JSON.stringify(bad)} lie outside ${g.memorySlices} memory slices`,
      );
    }
    if (new Set(p.placements.map((r) => r.size)).size > 1) {
      problems.push(`${label}: its placements disagree on its width`);
    }
  }
  let used = 0;
  const instanceIds = new Set<number>();
  for (const instance of g.instances) {
    const label = `GPU instance ${instance.id}`;
    if (!isCount(instance.id) || instanceIds.has(instance.id)) {
      problems.push(`${label}: the id is not a unique integer`);
    }
    instanceIds.add(instance.id);
    if (!g.profiles.some((p) => p.id === instance.profileId)) {
      problems.push(`${label}: its profile id ${instance.profileId} is not among the device's profiles`);
    }
    if (!inRange(instance.placement)) {
      problems.push(`${label}: placement ${JSON.stringify(instance.placement)} lies outside the device`);
    } else {
      const mask = maskOf(instance.placement);
      if ((used & mask) !== 0) problems.push(`${label}: it overlaps another instance`);
      used |= mask;
    }
  }
  return problems;
}

/** Every way to put new instances into the slices the kept ones leave, one placement per count vector. */
function placeableSets(
  g: MigDeviceGeometry,
  usable: readonly UsableProfile[],
  keptCounts: readonly number[],
  keptCompute: number,
  keptMask: number,
): { placeable: Map<string, { profile: number; start: number }[]>; mostNew: number } {
  const candidates = usable.flatMap((p, profile) =>
    p.placements.filter((r) => (r.mask & keptMask) === 0).map((r) => ({ profile, ...r }))
  );
  const counts = usable.map(() => 0);
  const chosen: { profile: number; start: number }[] = [];
  const placeable = new Map<string, { profile: number; start: number }[]>();
  let mostNew = 0;
  const walk = (index: number, mask: number, compute: number) => {
    const key = counts.join(",");
    if (!placeable.has(key)) {
      placeable.set(key, [...chosen].sort((a, b) => a.start - b.start));
      mostNew = Math.max(mostNew, chosen.length);
    }
    for (let i = index; i < candidates.length; i++) {
      const c = candidates[i];
      const p = usable[c.profile];
      if ((c.mask & mask) !== 0) continue;
      if (compute + p.info.sliceCount > g.computeSlices) continue;
      if (keptCounts[c.profile] + counts[c.profile] + 1 > p.info.instanceCount) continue;
      counts[c.profile]++;
      chosen.push({ profile: c.profile, start: c.start });
      walk(i + 1, mask | c.mask, compute + p.info.sliceCount);
      chosen.pop();
      counts[c.profile]--;
    }
  };
  walk(0, keptMask, keptCompute);
  return { placeable, mostNew };
}

/** `g` read for the search; `g` must have no {@link geometryProblems}. */
export function deviceModel(g: MigDeviceGeometry): DeviceModel {
  const usable: UsableProfile[] = g.profiles
    .filter((p) => p.instanceCount > 0 && p.placements.length > 0)
    .map((info) => ({
      info,
      width: info.placements[0].size,
      placements: [...info.placements].sort((a, b) => a.start - b.start).map((r) => ({
        start: r.start,
        mask: maskOf(r),
      })),
    }))
    .sort((a, b) =>
      a.info.memorySizeMB - b.info.memorySizeMB || a.info.sliceCount - b.info.sliceCount ||
      a.width - b.width || a.info.id - b.info.id
    );
  const byId = new Map(g.profiles.map((p) => [p.id, p]));
  const kept: MigKeptSlice[] = g.instances.map((instance) => {
    const p = byId.get(instance.profileId)!;
    return Object.freeze({
      profile: p.name,
      profileId: p.id,
      start: instance.placement.start,
      size: instance.placement.size,
      instanceId: instance.id,
    });
  }).sort((a, b) => a.start - b.start);
  Object.freeze(kept);
  const keptCounts = usable.map((p) => kept.filter((k) => k.profileId === p.info.id).length);
  const keptCompute = kept.reduce((sum, k) => sum + byId.get(k.profileId)!.sliceCount, 0);
  const keptMemory = kept.reduce((sum, k) => sum + k.size, 0);
  const keptMask = kept.reduce((mask, k) => mask | maskOf(k), 0);
  const { placeable, mostNew } = placeableSets(g, usable, keptCounts, keptCompute, keptMask);
  return { geometry: g, usable, kept, keptCounts, keptCompute, keptMemory, placeable, mostNew };
}

/** The index in `model.usable` of the smallest profile holding `gib`, or -1. */
export function smallestFit(model: DeviceModel, gib: number): number {
  return model.usable.findIndex((p) => p.info.memorySizeMB >= gib * MIB_PER_GIB);
}
