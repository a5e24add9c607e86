/**
 * An independent MIG geometry oracle (spec backends.memory.mig_geometry).
 *
 * A MIG-capable card is a row of memory slices (8 on A100/H100/H200, 4 on A30) and a budget of compute
 * slices (7, or 4 on A30). Each GPU-instance profile takes a fixed number of each, may exist only a
 * limited number of times, and may start only at the memory-slice positions the hardware allows. A
 * layout (profile name → instance count) is legal when its instances can be put at legal,
 * non-overlapping positions within both budgets. This table is what a planner's layout is checked
 * against, so it stays boring: no imports from any planner, nothing shared with what it audits.
 *
 * Source of the values: NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"
 * (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html) for the
 * profile names, memory and compute fractions and instance counts, and the placement diagrams there
 * (what `nvidia-smi mig -lgipp` lists) for the start positions. Memory is the profile's nominal size as
 * its name states. Media-extension variants (`+me`) are not modelled.
 *
 * @example
 * ```ts
 * checkLayout("NVIDIA-A100-SXM4-40GB", { "4g.20gb": 1, "3g.20gb": 1 }); // []
 * checkLayout("NVIDIA-A100-SXM4-40GB", { "3g.20gb": 2, "1g.5gb": 1 }).length > 0; // true: 9 memory slices
 * ```
 *
 * @module
 */

/** One GPU-instance profile of a card family. */
export interface MigProfile {
  /** The profile name, e.g. `3g.20gb`. */
  readonly name: string;
  /** Compute slices one instance takes. */
  readonly computeSlices: number;
  /** Memory slices one instance takes: the width of its placement. */
  readonly memorySlices: number;
  /** Nominal memory of one instance, in GiB. */
  readonly memoryGib: number;
  /** How many instances of this profile one card can hold at most. */
  readonly maxInstances: number;
  /** The memory-slice positions an instance may start at. */
  readonly starts: readonly number[];
}

/** A card family: its slice budgets and its profiles. */
export interface MigFamily {
  /** The family's name, e.g. `A100-40GB`. */
  readonly key: string;
  /** Compute slices of one card. */
  readonly computeSlices: number;
  /** Memory slices of one card. */
  readonly memorySlices: number;
  /** Nominal memory of one card, in GiB. */
  readonly memoryGib: number;
  /** Profile name → profile. */
  readonly profiles: Readonly<Record<string, MigProfile>>;
}

/** One instance of a layout put at a position. */
export interface MigPlacement {
  readonly profile: string;
  /** The memory slice it starts at. */
  readonly start: number;
}

/** A layout: profile name → instance count on one card. */
export type MigLayout = Readonly<Record<string, number>>;

interface FamilyRow {
  readonly family: MigFamily;
  /** Every token must appear in the normalized product name. */
  readonly includes: readonly string[];
  /** No token may appear in it. */
  readonly excludes: readonly string[];
}

function profile(
  name: string,
  computeSlices: number,
  memorySlices: number,
  memoryGib: number,
  maxInstances: number,
  starts: readonly number[],
): MigProfile {
  return Object.freeze({
    name,
    computeSlices,
    memorySlices,
    memoryGib,
    maxInstances,
    starts: Object.freeze([...starts]),
  });
}

function family(
  key: string,
  computeSlices: number,
  memorySlices: number,
  memoryGib: number,
  profiles: readonly MigProfile[],
): MigFamily {
  return Object.freeze({
    key,
    computeSlices,
    memorySlices,
    memoryGib,
    profiles: Object.freeze(Object.fromEntries(profiles.map((p) => [p.name, p]))),
  });
}

/** The five-profile ladder shared by the eight-slice cards; only the memory sizes differ. */
function eightSliceFamily(key: string, memoryGib: number, sizes: readonly [number, number, number, number]) {
  const [small, large, half, full] = sizes;
  return family(key, 7, 8, memoryGib, [
    profile(`1g.${small}gb`, 1, 1, small, 7, [0, 1, 2, 3, 4, 5, 6]),
    profile(`1g.${large}gb`, 1, 2, large, 4, [0, 2, 4, 6]),
    profile(`2g.${large}gb`, 2, 2, large, 3, [0, 2, 4]),
    profile(`3g.${half}gb`, 3, 4, half, 2, [0, 4]),
    profile(`4g.${half}gb`, 4, 4, half, 1, [0]),
    profile(`7g.${full}gb`, 7, 8, full, 1, [0]),
  ]);
}

const FAMILIES: readonly FamilyRow[] = [
  {
    family: family("A30", 4, 4, 24, [
      profile("1g.6gb", 1, 1, 6, 4, [0, 1, 2, 3]),
      profile("2g.12gb", 2, 2, 12, 2, [0, 2]),
      profile("4g.24gb", 4, 4, 24, 1, [0]),
    ]),
    includes: ["A30"],
    excludes: [],
  },
  { family: eightSliceFamily("A100-80GB", 80, [10, 20, 40, 80]), includes: ["A100", "80GB"], excludes: [] },
  { family: eightSliceFamily("A100-40GB", 40, [5, 10, 20, 40]), includes: ["A100"], excludes: ["80GB"] },
  {
    family: eightSliceFamily("H100-80GB", 80, [10, 20, 40, 80]),
    includes: ["H100"],
    excludes: ["NVL", "94GB", "96GB"],
  },
  { family: eightSliceFamily("H200-141GB", 141, [18, 35, 71, 141]), includes: ["H200"], excludes: ["GH200"] },
];

/** Every family in the table, by key. */
export const MIG_FAMILIES: Readonly<Record<string, MigFamily>> = Object.freeze(
  Object.fromEntries(FAMILIES.map((row) => [row.family.key, row.family])),
);

/**
 * The family of a product name as GPU Feature Discovery labels it (`nvidia.com/gpu.product`, e.g.
 * `NVIDIA-A100-SXM4-80GB`) or as NVML names it (`NVIDIA A100 80GB PCIe`); `null` for a product this
 * table does not know, which is "no MIG knowledge", never "no MIG".
 */
export function familyFor(product: string): MigFamily | null {
  const normalized = product.toUpperCase().replace(/[\s_]+/g, "-");
  const row = FAMILIES.find((candidate) =>
    candidate.includes.every((token) => normalized.includes(token)) &&
    !candidate.excludes.some((token) => normalized.includes(token))
  );
  return row?.family ?? null;
}

/**
 * The smallest profile of `product` holding at least `memoryGib` (ties: fewer compute slices, then fewer
 * memory slices); `null` when the product is unknown or no profile is large enough.
 */
export function smallestProfile(product: string, memoryGib: number): MigProfile | null {
  const found = familyFor(product);
  if (found === null) return null;
  const fitting = Object.values(found.profiles).filter((p) => p.memoryGib >= memoryGib);
  fitting.sort((a, b) =>
    a.memoryGib - b.memoryGib || a.computeSlices - b.computeSlices || a.memorySlices - b.memorySlices
  );
  return fitting[0] ?? null;
}

/** The instances of a layout, widest first (the order the placement search tries them in). */
function instancesOf(fam: MigFamily, layout: MigLayout): MigProfile[] {
  const out: MigProfile[] = [];
  for (const [name, count] of Object.entries(layout)) {
    for (let i = 0; i < count; i++) out.push(fam.profiles[name]);
  }
  return out.sort((a, b) =>
    b.memorySlices - a.memorySlices || a.starts.length - b.starts.length || (a.name < b.name ? -1 : 1)
  );
}

/**
 * Legal, non-overlapping positions for every instance of `layout` on one card of `family`, or `null`
 * when none exist. The layout must name only the family's profiles with whole counts.
 */
function place(fam: MigFamily, layout: MigLayout): MigPlacement[] | null {
  const instances = instancesOf(fam, layout);
  const used = new Array<boolean>(fam.memorySlices).fill(false);
  const chosen: MigPlacement[] = [];
  const fits = (p: MigProfile, start: number) => {
    if (start + p.memorySlices > fam.memorySlices) return false;
    for (let s = start; s < start + p.memorySlices; s++) if (used[s]) return false;
    return true;
  };
  const mark = (p: MigProfile, start: number, value: boolean) => {
    for (let s = start; s < start + p.memorySlices; s++) used[s] = value;
  };
  const search = (index: number, minStart: number): boolean => {
    if (index === instances.length) return true;
    const p = instances[index];
    // Instances of one profile are interchangeable: keep their starts ascending to avoid permutations.
    const floor = index > 0 && instances[index - 1] === p ? minStart : 0;
    for (const start of p.starts) {
      if (start < floor || !fits(p, start)) continue;
      mark(p, start, true);
      chosen.push({ profile: p.name, start });
      if (search(index + 1, start + 1)) return true;
      chosen.pop();
      mark(p, start, false);
    }
    return false;
  };
  return search(0, 0) ? chosen.sort((a, b) => a.start - b.start) : null;
}

/**
 * Every problem with putting `layout` on one card of `product`: an unknown product or profile, a count
 * that is not a positive integer, a per-profile instance cap exceeded, compute slices or memory slices
 * over the card's budget, and (the check a slice-count planner lacks) no legal, non-overlapping
 * placement. Empty means the layout can be applied. An empty layout is legal (MIG on, no instances).
 */
export function checkLayout(product: string, layout: MigLayout): string[] {
  const fam = familyFor(product);
  if (fam === null) return [`product ${JSON.stringify(product)} has no MIG profile table`];
  const problems: string[] = [];
  let compute = 0;
  let memory = 0;
  for (const [name, count] of Object.entries(layout)) {
    const p = fam.profiles[name];
    if (p === undefined) {
      problems.push(`${fam.key} has no MIG profile ${JSON.stringify(name)}`);
    } else if (!Number.isSafeInteger(count) || count < 1) {
      problems.push(`${name}: instance count must be a positive integer, got ${count}`);
    } else {
      if (count > p.maxInstances) {
        problems.push(`${name}: ${count} instances exceed the ${fam.key} cap of ${p.maxInstances}`);
      }
      compute += count * p.computeSlices;
      memory += count * p.memorySlices;
    }
  }
  if (problems.length > 0) return problems;
  if (compute > fam.computeSlices) {
    problems.push(`compute slices: ${compute} exceed the ${fam.key} budget of ${fam.computeSlices}`);
  }
  if (memory > fam.memorySlices) {
    problems.push(`memory slices: ${memory} exceed the ${fam.key} budget of ${fam.memorySlices}`);
  }
  if (compute <= fam.computeSlices && place(fam, layout) === null) {
    problems.push(`no legal placement: the instances cannot all start at allowed, non-overlapping slices`);
  }
  return problems;
}

/**
 * Where each instance of a legal layout goes (sorted by start), or `null` when {@link checkLayout}
 * reports any problem.
 */
export function placeLayout(product: string, layout: MigLayout): MigPlacement[] | null {
  const fam = familyFor(product);
  if (fam === null || checkLayout(product, layout).length > 0) return null;
  return place(fam, layout);
}

/** The canonical form of a layout: profile names sorted, zero counts dropped. */
export function canonicalLayout(layout: MigLayout): Record<string, number> {
  const names = Object.keys(layout).filter((name) => layout[name] !== 0).sort();
  return Object.fromEntries(names.map((name) => [name, layout[name]]));
}

/**
 * Every non-empty legal layout of `product`, each canonical (see {@link canonicalLayout}), sorted by
 * their JSON text; empty for an unknown product.
 */
export function legalLayouts(product: string): Record<string, number>[] {
  const fam = familyFor(product);
  if (fam === null) return [];
  const names = Object.keys(fam.profiles).sort();
  const found: Record<string, number>[] = [];
  const counts: Record<string, number> = {};
  const walk = (index: number) => {
    if (index === names.length) {
      const layout = canonicalLayout(counts);
      if (Object.keys(layout).length > 0 && checkLayout(product, layout).length === 0) found.push(layout);
      return;
    }
    const p = fam.profiles[names[index]];
    for (let count = 0; count <= p.maxInstances; count++) {
      counts[p.name] = count;
      walk(index + 1);
    }
  };
  walk(0);
  return found.sort((a, b) => JSON.stringify(a) < JSON.stringify(b) ? -1 : 1);
}
