/**
 * The search behind the MIG planner (a private part of `mig.ts`): the most demands a set of devices can
 * host, each demand in the one profile it takes on each device it may go to, found exhaustively.
 *
 * Devices of the same geometry are searched next to each other (first appearance first, input order
 * among them), and at each device the demands that every device still to come treats alike are one
 * group: the search state is how many demands of each group are left, memoized, so that alike devices
 * and alike demands are never searched twice. A state is cut when an upper bound (the cheapest demands
 * packed into the free compute slices, the free memory slices and the most instances the devices can
 * hold, each on its own) cannot beat what was found. Ties go to the first choice found: as many of the
 * earlier groups as fit on the earlier devices, and within a group the demands earlier in the input.
 *
 * @module
 */

import type { DeviceModel } from "./_mig_device.ts";

/** One hosted demand: its index in the input, its device's index in the input, its profile there. */
export interface Hosting {
  readonly demand: number;
  /** The device's index in the input. */
  readonly device: number;
  /** The profile's index in the device's `usable`. */
  readonly profile: number;
}

/** The least one more demand of a group costs on the devices from a position on. */
interface Cost {
  readonly compute: number;
  readonly memory: number;
}

/** One device in search order, with the demand groups at it. */
interface Position {
  readonly model: DeviceModel;
  /** The device's index in the input. */
  readonly device: number;
  /** Group → its demands, input order. */
  readonly members: readonly (readonly number[])[];
  /** Group → its profile on this device, or -1. */
  readonly profile: readonly number[];
  /** Group → the group its demands are in at the next position, or -1 when no later device takes them. */
  readonly next: readonly number[];
  /** Group → the least a demand of it costs on this device or a later one. */
  readonly cost: readonly Cost[];
  /** Free compute slices, memory slices and the most new instances of this device and the later ones. */
  readonly free: { readonly compute: number; readonly memory: number; readonly instances: number };
}

interface Best {
  readonly hosted: number;
  /** Group → how many of its demands this position's device takes. */
  readonly take: readonly number[];
}

/** The search order: devices of one geometry next to each other, first appearance first. */
function searchOrder(models: readonly DeviceModel[]): number[] {
  const shape = models.map((m) => {
    const { device: _key, ...rest } = m.geometry;
    return JSON.stringify(rest);
  });
  const first = new Map<string, number>();
  shape.forEach((key, i) => first.has(key) || first.set(key, i));
  return models.map((_, i) => i).sort((a, b) => first.get(shape[a])! - first.get(shape[b])! || a - b);
}

function positionsOf(models: readonly DeviceModel[], signatures: readonly (readonly number[])[]): Position[] {
  const order = searchOrder(models);
  const positions: Position[] = [];
  let later: { groupOf: Map<number, number>; cost: readonly Cost[] } | null = null;
  let free = { compute: 0, memory: 0, instances: 0 };
  for (let at = order.length - 1; at >= 0; at--) {
    const device = order[at];
    const model = models[device];
    const suffix = order.slice(at);
    const byKey = new Map<string, number[]>();
    signatures.forEach((signature, demand) => {
      const profiles = suffix.map((d) => signature[d]);
      if (profiles.every((p) => p < 0)) return;
      const key = profiles.join(",");
      byKey.get(key)?.push(demand) ?? byKey.set(key, [demand]);
    });
    const members = [...byKey.values()];
    const groupOf = new Map(members.flatMap((group, g) => group.map((demand) => [demand, g] as const)));
    const profile = members.map((group) => signatures[group[0]][device]);
    const next = members.map((group) => later?.groupOf.get(group[0]) ?? -1);
    const cost = members.map((_, g) => {
      const here = profile[g] < 0
        ? null
        : { compute: model.usable[profile[g]].info.sliceCount, memory: model.usable[profile[g]].width };
      const after = next[g] < 0 ? null : later!.cost[next[g]];
      if (here === null || after === null) return (here ?? after)!;
      return { compute: Math.min(here.compute, after.compute), memory: Math.min(here.memory, after.memory) };
    });
    free = {
      compute: free.compute + model.geometry.computeSlices - model.keptCompute,
      memory: free.memory + model.geometry.memorySlices - model.keptMemory,
      instances: free.instances + model.mostNew,
    };
    positions.unshift({ model, device, members, profile, next, cost, free });
    later = { groupOf, cost };
  }
  return positions;
}

/** The most of `remaining` (per group) that count demands of `each` cost each fit into `budget`. */
function mostWithin(remaining: readonly number[], each: readonly number[], budget: number): number {
  const order = remaining.map((_, g) => g).filter((g) => remaining[g] > 0).sort((a, b) => each[a] - each[b]);
  let left = budget;
  let count = 0;
  for (const g of order) {
    const k = each[g] === 0 ? remaining[g] : Math.min(remaining[g], Math.floor(left / each[g]));
    count += k;
    left -= k * each[g];
    if (k < remaining[g]) break;
  }
  return count;
}

/** The exhaustive search over one plan's devices and demands. */
class HostingSearch {
  readonly #positions: readonly Position[];
  readonly #memo = new Map<string, Best>();

  constructor(positions: readonly Position[]) {
    this.#positions = positions;
  }

  /** The groups at `at + 1` of what is left at `at` after `take`. */
  advance(at: number, remaining: readonly number[], take: readonly number[]): number[] {
    const { next } = this.#positions[at];
    const out = (this.#positions[at + 1]?.members ?? []).map(() => 0);
    remaining.forEach((r, g) => {
      if (next[g] >= 0) out[next[g]] += r - take[g];
    });
    return out;
  }

  /** An upper bound on what the devices from `at` on can host of `remaining`. */
  #bound(at: number, remaining: readonly number[]): number {
    const position = this.#positions[at];
    if (position === undefined) return 0;
    const { free, cost } = position;
    return Math.min(
      free.instances,
      mostWithin(remaining, cost.map((c) => c.compute), free.compute),
      mostWithin(remaining, cost.map((c) => c.memory), free.memory),
    );
  }

  /** The most the devices from `at` on can host of `remaining`, and what `at`'s device takes for it. */
  best(at: number, remaining: readonly number[]): Best {
    const none: Best = { hosted: 0, take: remaining.map(() => 0) };
    if (at === this.#positions.length || remaining.every((r) => r === 0)) return none;
    const key = `${at}|${remaining.join(",")}`;
    const memo = this.#memo.get(key);
    if (memo !== undefined) return memo;
    const { model, profile } = this.#positions[at];
    const counts = model.usable.map(() => 0);
    const take = remaining.map(() => 0);
    let found: Best | null = null;
    const ceiling = this.#bound(at, remaining);
    const walk = (g: number, taken: number): boolean => {
      if (g === remaining.length) {
        const left = this.advance(at, remaining, take);
        if (found !== null && taken + this.#bound(at + 1, left) <= found.hosted) return false;
        const hosted = taken + this.best(at + 1, left).hosted;
        if (found === null || hosted > found.hosted) found = { hosted, take: [...take] };
        return hosted === ceiling;
      }
      const p = profile[g];
      for (let k = p < 0 ? 0 : remaining[g]; k >= 0; k--) {
        if (k > 0) counts[p] += k;
        const fits = k === 0 || model.placeable.has(counts.join(","));
        take[g] = k;
        const done = fits && walk(g + 1, taken + k);
        if (k > 0) counts[p] -= k;
        take[g] = 0;
        if (done) return true;
      }
      return false;
    };
    walk(0, 0);
    this.#memo.set(key, found ?? none);
    return found ?? none;
  }
}

/**
 * A largest set of demands the devices can host, and where: `signatures[demand][device]` is the index in
 * `models[device].usable` of the profile the demand takes there, or -1 where it cannot go.
 */
export function hostDemands(
  models: readonly DeviceModel[],
  signatures: readonly (readonly number[])[],
): Hosting[] {
  const positions = positionsOf(models, signatures);
  const search = new HostingSearch(positions);
  const hosted: Hosting[] = [];
  const taken = new Set<number>();
  let remaining = positions[0].members.map((group) => group.length);
  positions.forEach((position, at) => {
    const { take } = search.best(at, remaining);
    take.forEach((k, g) => {
      for (const demand of position.members[g].filter((d) => !taken.has(d)).slice(0, k)) {
        taken.add(demand);
        hosted.push({ demand, device: position.device, profile: position.profile[g] });
      }
    });
    remaining = search.advance(at, remaining, take);
  });
  return hosted;
}
