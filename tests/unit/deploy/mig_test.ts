/**
 * The MIG layout planner (src/deploy/mig.ts) against the independent geometry oracle
 * (src/backends/memory/mig_geometry.ts): every layout it produces is legal by the oracle, every demand
 * sits in the oracle's smallest profile, and every refusal is confirmed by an exhaustive search over the
 * oracle's legal layouts (nothing hosts more demands than the planner's partial layout, so nothing hosts
 * them all), with each unmet demand's reason the first problem the oracle reports for it.
 */
import assert from "node:assert/strict";
import { ConfigError, ResourceUnavailable, UnobservableState } from "../../../src/core/errors.ts";
import {
  canonicalLayout,
  checkLayout,
  familyFor,
  legalLayouts,
  MIG_FAMILIES,
  type MigFamily,
  placeLayout,
  smallestProfile,
} from "../../../src/backends/memory/mig_geometry.ts";
import {
  type MigDemand,
  type MigDeviceGeometry,
  type MigLayoutPlan,
  migRefusalError,
  MigShortfall,
  planMigLayout,
} from "../../../src/deploy/mig.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

/**
 * One GPU-instance profile as NVML reports it on each family, written out: the profile id
 * (`nvmlGpuInstanceProfileInfo_t.id`, as `nvidia-smi mig -lgip` lists it), name, `sliceCount`,
 * `instanceCount`, memory in MiB, placement `size` and the `start` of every possible placement
 * (`nvidia-smi mig -lgipp`). Memory is the nominal size × 1024, so that the planner's smallest fit and the
 * oracle's `smallestProfile` read the same sizes (a driver reports a little less; see the test below).
 */
type Row = readonly [
  id: number,
  name: string,
  slices: number,
  instances: number,
  mib: number,
  size: number,
  starts: readonly number[],
];

interface Table {
  readonly product: string;
  readonly computeSlices: number;
  readonly memorySlices: number;
  readonly rows: readonly Row[];
}

const ALL = [0, 1, 2, 3, 4, 5, 6];
/** The A100 80GB and the H100 80GB list the same profiles. */
const EIGHTY_GB: readonly Row[] = [
  [19, "1g.10gb", 1, 7, 10240, 1, ALL],
  [15, "1g.20gb", 1, 4, 20480, 2, [0, 2, 4, 6]],
  [14, "2g.20gb", 2, 3, 20480, 2, [0, 2, 4]],
  [9, "3g.40gb", 3, 2, 40960, 4, [0, 4]],
  [5, "4g.40gb", 4, 1, 40960, 4, [0]],
  [0, "7g.80gb", 7, 1, 81920, 8, [0]],
];
const TABLES: Readonly<Record<string, Table>> = {
  "A30": {
    product: "NVIDIA-A30",
    computeSlices: 4,
    memorySlices: 4,
    rows: [
      [14, "1g.6gb", 1, 4, 6144, 1, [0, 1, 2, 3]],
      [5, "2g.12gb", 2, 2, 12288, 2, [0, 2]],
      [0, "4g.24gb", 4, 1, 24576, 4, [0]],
    ],
  },
  "A100-40GB": {
    product: "NVIDIA-A100-SXM4-40GB",
    computeSlices: 7,
    memorySlices: 8,
    rows: [
      [19, "1g.5gb", 1, 7, 5120, 1, ALL],
      [15, "1g.10gb", 1, 4, 10240, 2, [0, 2, 4, 6]],
      [14, "2g.10gb", 2, 3, 10240, 2, [0, 2, 4]],
      [9, "3g.20gb", 3, 2, 20480, 4, [0, 4]],
      [5, "4g.20gb", 4, 1, 20480, 4, [0]],
      [0, "7g.40gb", 7, 1, 40960, 8, [0]],
    ],
  },
  "A100-80GB": {
    product: "NVIDIA-A100-SXM4-80GB",
    computeSlices: 7,
    memorySlices: 8,
    rows: EIGHTY_GB,
  },
  "H100-80GB": {
    product: "NVIDIA-H100-80GB-HBM3",
    computeSlices: 7,
    memorySlices: 8,
    rows: EIGHTY_GB,
  },
  "H200-141GB": {
    product: "NVIDIA-H200",
    computeSlices: 7,
    memorySlices: 8,
    rows: [
      [19, "1g.18gb", 1, 7, 18432, 1, ALL],
      [15, "1g.35gb", 1, 4, 35840, 2, [0, 2, 4, 6]],
      [14, "2g.35gb", 2, 3, 35840, 2, [0, 2, 4]],
      [9, "3g.71gb", 3, 2, 72704, 4, [0, 4]],
      [5, "4g.71gb", 4, 1, 72704, 4, [0]],
      [0, "7g.141gb", 7, 1, 144384, 8, [0]],
    ],
  },
};
const FAMILY_KEYS = Object.keys(TABLES);

/** An instance that exists before planning. */
interface Existing {
  readonly profile: string;
  readonly start: number;
}

/** One device of a test case: its family, key and existing instances. */
interface TestDevice {
  readonly family: string;
  readonly key: string;
  readonly existing: readonly Existing[];
}

function device(family: string, key: string, existing: readonly Existing[] = []): TestDevice {
  return { family, key, existing };
}

/** The planner's input for a test device, built from the written table alone. */
function geometryOf(d: TestDevice): MigDeviceGeometry {
  const table = TABLES[d.family];
  const row = (name: string) => table.rows.find((r) => r[1] === name)!;
  return {
    device: d.key,
    computeSlices: table.computeSlices,
    memorySlices: table.memorySlices,
    profiles: table.rows.map(([id, name, sliceCount, instanceCount, memorySizeMB, size, starts]) => ({
      id,
      name,
      sliceCount,
      instanceCount,
      memorySizeMB,
      placements: starts.map((start) => ({ start, size })),
    })),
    instances: d.existing.map((e, i) => ({
      id: i + 1,
      profileId: row(e.profile)[0],
      placement: { start: e.start, size: row(e.profile)[5] },
    })),
  };
}

function plan(devices: readonly TestDevice[], demands: readonly MigDemand[]): MigLayoutPlan {
  return planMigLayout(devices.map(geometryOf), demands);
}

function demandsOf(gibs: readonly number[]): MigDemand[] {
  return gibs.map((gpuMemoryGib, i) => ({ id: `r${i}`, gpuMemoryGib }));
}

function familyOf(d: TestDevice): MigFamily {
  return familyFor(TABLES[d.family].product)!;
}

/**
 * Whether `add` (profile → count) can be put around `existing` at the oracle's starts without overlap:
 * every assignment of starts is tried, with a bitmask of memory slices.
 */
function placesAround(
  fam: MigFamily,
  existing: readonly Existing[],
  add: Readonly<Record<string, number>>,
): boolean {
  let used = 0;
  for (const e of existing) used |= ((1 << fam.profiles[e.profile].memorySlices) - 1) << e.start;
  const instances = Object.entries(add).flatMap(([name, count]) => Array(count).fill(fam.profiles[name]));
  const assign = (index: number, mask: number): boolean => {
    if (index === instances.length) return true;
    const p = instances[index];
    return p.starts.some((start: number) => {
      const bits = ((1 << p.memorySlices) - 1) << start;
      return (bits & mask) === 0 && assign(index + 1, mask | bits);
    });
  };
  return assign(0, used);
}

function countsOf(existing: readonly Existing[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const e of existing) counts[e.profile] = (counts[e.profile] ?? 0) + 1;
  return counts;
}

/** {@link maximalAdditions} by family and existing instances, computed once each. */
const ADDITIONS = new Map<string, Record<string, number>[]>();

/**
 * The inclusion-maximal sets of new instances a device can take by the oracle: its legal layouts that
 * hold the existing instances, less those, whose new instances can be put around the existing ones.
 */
function maximalAdditions(d: TestDevice): Record<string, number>[] {
  const key = JSON.stringify([d.family, d.existing]);
  const known = ADDITIONS.get(key);
  if (known !== undefined) return known;
  const product = TABLES[d.family].product;
  const kept = countsOf(d.existing);
  const adds = [{}, ...legalLayouts(product)].flatMap((layout: Record<string, number>) => {
    const names = new Set([...Object.keys(layout), ...Object.keys(kept)]);
    const add: Record<string, number> = {};
    for (const name of names) {
      const extra = (layout[name] ?? 0) - (kept[name] ?? 0);
      if (extra < 0) return [];
      if (extra > 0) add[name] = extra;
    }
    return placesAround(familyOf(d), d.existing, add) ? [add] : [];
  });
  const within = (a: Record<string, number>, b: Record<string, number>) =>
    Object.entries(a).every(([name, count]) => (b[name] ?? 0) >= count);
  const maximal = adds.filter((a, i) => !adds.some((b, j) => j !== i && within(a, b) && !within(b, a)));
  ADDITIONS.set(key, maximal);
  return maximal;
}

function allowedOn(demand: MigDemand, d: TestDevice): boolean {
  return demand.devices === undefined || demand.devices.includes(d.key);
}

/**
 * The most demands any choice of oracle-legal additions, one per device, can host, each demand in any
 * profile at least its size on a device it may go to (a bipartite matching for each choice): not only
 * the smallest profile, so that a refusal also shows that keeping to the smallest lost nothing.
 */
function oracleMostHosted(devices: readonly TestDevice[], demands: readonly MigDemand[]): number {
  const options = devices.map(maximalAdditions);
  const holds = demands.map((demand) =>
    devices.map((d) =>
      new Set(
        allowedOn(demand, d)
          ? Object.values(familyOf(d).profiles).filter((p) => p.memoryGib >= demand.gpuMemoryGib).map((p) =>
            p.name
          )
          : [],
      )
    )
  );
  let most = 0;
  const choice: Record<string, number>[] = [];
  const match = () => {
    const units = choice.flatMap((add, e) =>
      Object.entries(add).flatMap(([name, count]) => Array.from({ length: count }, () => ({ e, name })))
    );
    const owner = units.map(() => -1);
    const augment = (demand: number, seen: boolean[]): boolean =>
      units.some((unit, u) => {
        if (seen[u] || !holds[demand][unit.e].has(unit.name)) return false;
        seen[u] = true;
        if (owner[u] < 0 || augment(owner[u], seen)) {
          owner[u] = demand;
          return true;
        }
        return false;
      });
    let matched = 0;
    for (let demand = 0; demand < demands.length; demand++) {
      if (augment(demand, units.map(() => false))) matched++;
    }
    return matched;
  };
  const walk = (e: number) => {
    if (most === demands.length) return;
    if (e === devices.length) {
      most = Math.max(most, match());
      return;
    }
    for (const add of options[e]) {
      choice[e] = add;
      walk(e + 1);
    }
  };
  walk(0);
  return most;
}

/** The shortfall the oracle's first problem names for putting `layout` on `product`, or null if none. */
function oracleShortfall(product: string, layout: Record<string, number>): MigShortfall | null {
  const first = checkLayout(product, layout)[0];
  if (first === undefined) return null;
  if (/ cap of /.test(first)) return MigShortfall.maxInstances;
  if (/^compute slices/.test(first)) return MigShortfall.computeSlices;
  if (/^memory slices/.test(first)) return MigShortfall.memorySlices;
  if (/no legal placement/.test(first)) return MigShortfall.noLegalStart;
  throw new Error(`unexpected oracle problem: ${first}`);
}

/**
 * Every check of a plan against the oracle: each device's layout legal and its instances at legal,
 * non-overlapping starts, existing instances untouched, each demand once in its smallest profile on a
 * device it may go to; a refusal hosts as many demands as the oracle's best, and each reason is the
 * oracle's.
 */
function audit(
  devices: readonly TestDevice[],
  demands: readonly MigDemand[],
  result: MigLayoutPlan,
  label: string,
) {
  const layouts = result.kind === "planned" ? result.devices : result.partial;
  assert.deepEqual(layouts.map((l) => l.device), devices.map((d) => d.key), label);
  const hosted = new Set<string>();
  layouts.forEach((out, i) => {
    const d = devices[i];
    const product = TABLES[d.family].product;
    const fam = familyOf(d);
    const at = `${label} on ${d.key}`;
    assert.deepEqual(
      out.kept.map((k) => [k.profile, k.start]),
      [...d.existing].sort((a, b) => a.start - b.start).map((e) => [e.profile, e.start]),
      `${at}: existing instances are kept where they are`,
    );
    assert.deepEqual(out.layout, canonicalLayout({ ...countsOf([...out.kept, ...out.created]) }), at);
    assert.deepEqual(Object.keys(out.layout), Object.keys(out.layout).sort(), `${at}: names sorted`);
    assert.deepEqual(checkLayout(product, out.layout), [], `${at}: ${JSON.stringify(out.layout)}`);
    if (Object.keys(out.layout).length > 0) assert.notEqual(placeLayout(product, out.layout), null, at);
    let used = 0;
    for (const slice of [...out.kept, ...out.created]) {
      const p = fam.profiles[slice.profile];
      assert.ok(p.starts.includes(slice.start), `${at}: ${slice.profile} may not start at ${slice.start}`);
      assert.equal(slice.size, p.memorySlices, at);
      const bits = ((1 << p.memorySlices) - 1) << slice.start;
      assert.equal(bits & used, 0, `${at}: ${slice.profile}@${slice.start} overlaps`);
      used |= bits;
    }
    for (const slice of out.created) {
      const demand = demands.find((x) => x.id === slice.demand);
      assert.ok(demand !== undefined && !hosted.has(slice.demand), `${at}: ${slice.demand} hosted once`);
      hosted.add(slice.demand);
      assert.ok(allowedOn(demand, d), `${at}: ${slice.demand} may not go to ${d.key}`);
      assert.equal(
        slice.profile,
        smallestProfile(product, demand.gpuMemoryGib)?.name,
        `${at}: ${slice.demand}`,
      );
    }
  });
  if (result.kind === "planned") {
    assert.equal(hosted.size, demands.length, `${label}: every demand hosted`);
    return;
  }
  assert.deepEqual(
    result.unmet.map((u) => u.demand),
    demands.filter((x) => !hosted.has(x.id)).map((x) => x.id),
    `${label}: the unmet demands are the ones not hosted, in input order`,
  );
  assert.ok(result.unmet.length > 0, label);
  assert.equal(
    hosted.size,
    oracleMostHosted(devices, demands),
    `${label}: the partial layout hosts as many demands as any oracle-legal layouts (so none hosts all)`,
  );
  for (const unmet of result.unmet) {
    const demand = demands.find((x) => x.id === unmet.demand)!;
    assert.equal(unmet.gpuMemoryGib, demand.gpuMemoryGib);
    const candidates = devices.filter((d) => allowedOn(demand, d));
    assert.deepEqual(unmet.shortfalls.map((s) => s.device), candidates.map((d) => d.key), label);
    unmet.shortfalls.forEach((s, i) => {
      const d = candidates[i];
      const product = TABLES[d.family].product;
      const at = `${label}: ${unmet.demand} on ${d.key}`;
      const smallest = smallestProfile(product, demand.gpuMemoryGib);
      if (smallest === null) {
        assert.equal(s.reason, MigShortfall.noProfile, at);
        assert.equal(s.profile, null, at);
        return;
      }
      assert.equal(s.profile, smallest.name, at);
      const out = layouts[devices.indexOf(d)];
      const more = { ...out.layout, [smallest.name]: (out.layout[smallest.name] ?? 0) + 1 };
      const expected = oracleShortfall(product, more);
      if (expected === null) {
        const add = countsOf(out.created);
        add[smallest.name] = (add[smallest.name] ?? 0) + 1;
        assert.ok(
          !placesAround(familyOf(d), d.existing, add),
          `${at}: it would fit around the existing ones`,
        );
        assert.equal(s.reason, MigShortfall.noLegalStart, at);
      } else {
        assert.equal(s.reason, expected, `${at}: ${s.detail}`);
      }
      assert.ok(s.detail.length > 0, at);
    });
  }
}

/** Every multiset of `values` of size 1 to `most`, ascending. */
function multisets(values: readonly number[], most: number): number[][] {
  const out: number[][] = [];
  const walk = (from: number, chosen: number[]) => {
    if (chosen.length > 0) out.push([...chosen]);
    if (chosen.length === most) return;
    for (let i = from; i < values.length; i++) walk(i, [...chosen, values[i]]);
  };
  walk(0, []);
  return out;
}

/** The demand sizes that tell a family's profiles apart: each profile's memory, and one above the largest. */
function telling(family: string): number[] {
  const sizes = [...new Set(TABLES[family].rows.map((r) => r[4] / 1024))].sort((a, b) => a - b);
  return [...sizes, sizes[sizes.length - 1] + 1];
}

Deno.test("the written NVML tables agree with the oracle's families", () => {
  for (const [key, table] of Object.entries(TABLES)) {
    const fam = MIG_FAMILIES[key];
    assert.equal(familyFor(table.product)?.key, key);
    assert.deepEqual([table.computeSlices, table.memorySlices], [fam.computeSlices, fam.memorySlices], key);
    assert.deepEqual(
      table.rows.map((
        [, name, slices, instances, mib, size, starts],
      ) => [name, slices, instances, mib, size, starts]),
      Object.values(fam.profiles).map((p) => [
        p.name,
        p.computeSlices,
        p.maxInstances,
        p.memoryGib * 1024,
        p.memorySlices,
        p.starts,
      ]),
      key,
    );
  }
});

Deno.test("the planner is independent of the oracle: it imports no geometry table", async () => {
  for (const file of ["mig.ts", "_mig_device.ts", "_mig_search.ts"]) {
    const source = await Deno.readTextFile(new URL(`../../../src/deploy/${file}`, import.meta.url));
    const specifiers = [...source.matchAll(/(?:from|import)\s*\(?\s*["']([^"']+)["']/g)].map((m) => m[1]);
    assert.ok(specifiers.length > 0, `${file} imports something (the pattern reads its imports)`);
    for (const specifier of specifiers) {
      assert.doesNotMatch(specifier, /mig_geometry|backends\/memory/, `${file} imports ${specifier}`);
    }
  }
});

Deno.test("a demand gets the smallest profile that holds it, placed at a legal start", () => {
  const a100 = device("A100-40GB", "GPU-a");
  const result = plan([a100], [{ id: "det", gpuMemoryGib: 16 }, { id: "ocr", gpuMemoryGib: 4 }]);
  assert.equal(result.kind, "planned");
  assert.deepEqual(result.devices[0].layout, { "1g.5gb": 1, "3g.20gb": 1 });
  assert.deepEqual(result.devices[0].created.map((c) => [c.demand, c.profile, c.profileId]), [
    ["ocr", "1g.5gb", 19],
    ["det", "3g.20gb", 9],
  ]);
  audit([a100], [{ id: "det", gpuMemoryGib: 16 }, { id: "ocr", gpuMemoryGib: 4 }], result, "two demands");
  const exact = plan([a100], [{ id: "x", gpuMemoryGib: 5 }, { id: "y", gpuMemoryGib: 5.001 }]);
  assert.equal(exact.kind, "planned");
  assert.deepEqual(
    exact.devices[0].layout,
    { "1g.10gb": 1, "1g.5gb": 1 },
    "5 GiB fits 5120 MiB, 5.001 does not",
  );
  assert.deepEqual(plan([a100], []), {
    kind: "planned",
    devices: [{ device: "GPU-a", layout: {}, kept: [], created: [] }],
  });
});

Deno.test("memory is read as NVML reports it: a 1g.5gb of 4864 MiB does not hold 5 GiB", () => {
  const geometry: MigDeviceGeometry = {
    device: "GPU-real",
    computeSlices: 7,
    memorySlices: 8,
    profiles: [
      {
        id: 19,
        name: "1g.5gb",
        sliceCount: 1,
        instanceCount: 7,
        memorySizeMB: 4864,
        placements: [{ start: 0, size: 1 }],
      },
      {
        id: 15,
        name: "1g.10gb",
        sliceCount: 1,
        instanceCount: 4,
        memorySizeMB: 9856,
        placements: [{ start: 0, size: 2 }],
      },
    ],
    instances: [],
  };
  const result = planMigLayout([geometry], [{ id: "a", gpuMemoryGib: 5 }]);
  assert.equal(result.kind, "planned");
  assert.deepEqual(result.devices[0].created.map((c) => c.profile), ["1g.10gb"]);
  const small = planMigLayout([geometry], [{ id: "a", gpuMemoryGib: 4.75 }]);
  assert.equal(small.kind, "planned");
  assert.deepEqual(small.devices[0].created.map((c) => c.profile), ["1g.5gb"]);
});

Deno.test("story 35: demands that fit by compute-slice count are refused when their instances cannot be placed", () => {
  const a100 = device("A100-40GB", "GPU-a");
  const demands = demandsOf([20, 20, 5]);
  assert.equal(
    2 * 3 + 1,
    MIG_FAMILIES["A100-40GB"].computeSlices,
    "3g.20gb, 3g.20gb, 1g.5gb: 7 compute slices",
  );
  const result = plan([a100], demands);
  assert.equal(result.kind, "refused");
  assert.deepEqual(result.unmet.map((u) => [u.demand, u.shortfalls.map((s) => s.reason)]), [
    ["r2", [MigShortfall.memorySlices]],
  ]);
  assert.ok(
    legalLayouts(TABLES["A100-40GB"].product).every((layout) =>
      (layout["3g.20gb"] ?? 0) < 2 || (layout["1g.5gb"] ?? 0) === 0
    ),
    "no legal layout holds two 3g.20gb and a 1g.5gb",
  );
  audit([a100], demands, result, "story 35, compute-only fit");

  // The slice counts fit beside two existing 1g.5gb at slices 1 and 5 (5 of 7 compute and 6 of 8 memory
  // slices), and the oracle finds the layout legal on a card free to rearrange, but a 3g.20gb may start
  // at 0 or 4 only: both are taken, and existing instances are never moved.
  const fragmented = device("A100-40GB", "GPU-f", [{ profile: "1g.5gb", start: 1 }, {
    profile: "1g.5gb",
    start: 5,
  }]);
  assert.deepEqual(checkLayout(TABLES["A100-40GB"].product, { "1g.5gb": 2, "3g.20gb": 1 }), []);
  const refused = plan([fragmented], demandsOf([20]));
  assert.equal(refused.kind, "refused");
  assert.equal(refused.unmet[0].shortfalls[0].reason, MigShortfall.noLegalStart);
  assert.match(refused.unmet[0].shortfalls[0].detail, /slices 0, 4 only/);
  audit([fragmented], demandsOf([20]), refused, "story 35, no legal start");
  const beside = plan([fragmented], demandsOf([10, 10, 5]));
  assert.equal(beside.kind, "planned", "1g.10gb at 2 and 6, a 1g.5gb at 0, 3 or 4: the small ones still fit");
  audit([fragmented], demandsOf([10, 10, 5]), beside, "story 35, around the fragments");
});

Deno.test("each reason for a refusal: no profile, instance cap, compute slices, memory slices", () => {
  const cases: { family: string; gibs: number[]; reason: MigShortfall }[] = [
    { family: "A100-40GB", gibs: [41], reason: MigShortfall.noProfile },
    { family: "A30", gibs: [6, 6, 6, 6, 6], reason: MigShortfall.maxInstances },
    { family: "A100-40GB", gibs: [5, 5, 5, 5, 5, 5, 5, 5], reason: MigShortfall.maxInstances },
    { family: "H100-80GB", gibs: [15, 15, 15, 15, 15], reason: MigShortfall.maxInstances },
    { family: "H200-141GB", gibs: [141, 18], reason: MigShortfall.computeSlices },
    { family: "A100-80GB", gibs: [40, 40, 10, 10], reason: MigShortfall.computeSlices },
    { family: "A100-80GB", gibs: [40, 40, 10], reason: MigShortfall.memorySlices },
  ];
  for (const { family, gibs, reason } of cases) {
    const devices = [device(family, "GPU-0")];
    const demands = demandsOf(gibs);
    const result = plan(devices, demands);
    const label = `${family} ${gibs.join(",")}`;
    assert.equal(result.kind, "refused", label);
    assert.equal(result.unmet.at(-1)!.shortfalls[0].reason, reason, label);
    audit(devices, demands, result, label);
    const error = migRefusalError(result);
    assert.ok(error instanceof ResourceUnavailable, label);
    assert.equal(error.code, "VF_RESOURCE_UNAVAILABLE");
    assert.equal(error.exitCode, 3);
    for (const u of result.unmet) assert.match(error.message, new RegExp(`${u.demand} \\(`), label);
    assert.match(error.message, new RegExp(reason));
    assert.ok(error.remedy !== null && error.remedy.length > 0);
  }
});

Deno.test("existing instances are kept; demands go around them or are refused", () => {
  const full = device("A100-40GB", "GPU-full", [{ profile: "7g.40gb", start: 0 }]);
  const onFull = plan([full], demandsOf([5]));
  assert.equal(onFull.kind, "refused");
  assert.equal(onFull.unmet[0].shortfalls[0].reason, MigShortfall.computeSlices);
  assert.deepEqual(onFull.partial[0].kept.map((k) => [k.profile, k.start, k.instanceId]), [[
    "7g.40gb",
    0,
    1,
  ]]);
  audit([full], demandsOf([5]), onFull, "a full device");
  const half = device("H100-80GB", "GPU-half", [{ profile: "3g.40gb", start: 4 }]);
  const onHalf = plan([half], demandsOf([40, 10]));
  assert.equal(onHalf.kind, "refused", "a second 3g.40gb at 0 leaves no memory slice for a 1g.10gb");
  assert.deepEqual(onHalf.unmet.map((u) => [u.demand, u.shortfalls[0].reason]), [[
    "r1",
    MigShortfall.memorySlices,
  ]]);
  audit([half], demandsOf([40, 10]), onHalf, "half a device");
  const fits = plan([half], demandsOf([10, 20, 10]));
  assert.equal(fits.kind, "planned");
  assert.deepEqual(fits.devices[0].layout, { "1g.10gb": 2, "1g.20gb": 1, "3g.40gb": 1 });
  assert.ok(fits.devices[0].created.every((c) => c.start < 4), "the new instances go beside the kept one");
  audit([half], demandsOf([10, 20, 10]), fits, "beside a kept 3g.40gb");
});

Deno.test("demands spread over several devices, and pinned demands stay on their devices", () => {
  const devices = [device("A30", "GPU-0"), device("A100-40GB", "GPU-1"), device("A100-40GB", "GPU-2")];
  const demands: MigDemand[] = [
    { id: "big", gpuMemoryGib: 24 },
    { id: "a", gpuMemoryGib: 20 },
    { id: "b", gpuMemoryGib: 20 },
    { id: "c", gpuMemoryGib: 20 },
    { id: "pinned", gpuMemoryGib: 10, devices: ["GPU-2"] },
  ];
  const result = plan(devices, demands);
  assert.equal(result.kind, "planned");
  audit(devices, demands, result, "three devices");
  const where = Object.fromEntries(result.devices.flatMap((l) => l.created.map((c) => [c.demand, l.device])));
  assert.equal(where.big, "GPU-0", "only the A30 holds 24 GiB in a 4g.24gb; the A100s would need a 7g.40gb");
  assert.equal(where.pinned, "GPU-2");
  const crowded: MigDemand[] = [
    { id: "p0", gpuMemoryGib: 40, devices: ["GPU-1"] },
    { id: "p1", gpuMemoryGib: 5, devices: ["GPU-1"] },
    { id: "free", gpuMemoryGib: 5 },
  ];
  const refused = plan(devices, crowded);
  assert.equal(refused.kind, "refused");
  assert.deepEqual(refused.unmet.map((u) => [u.demand, u.shortfalls.map((s) => `${s.device}:${s.reason}`)]), [
    ["p1", ["GPU-1:out-of-compute-slices"]],
  ]);
  audit(devices, crowded, refused, "pinned onto a full device");
});

Deno.test("instance caps and the compute budget bind where a device's placements would allow more", () => {
  // A made-up device (no NVIDIA family has it): four memory slices, but three compute slices and at most
  // two instances of the small profile, so the caps and the budget decide, not the placements.
  const synthetic: MigDeviceGeometry = {
    device: "GPU-s",
    computeSlices: 3,
    memorySlices: 4,
    profiles: [
      {
        id: 1,
        name: "small",
        sliceCount: 1,
        instanceCount: 2,
        memorySizeMB: 1024,
        placements: ALL.slice(0, 4).map((start) => ({ start, size: 1 })),
      },
      {
        id: 2,
        name: "wide",
        sliceCount: 2,
        instanceCount: 1,
        memorySizeMB: 2048,
        placements: [{ start: 0, size: 2 }, { start: 2, size: 2 }],
      },
    ],
    instances: [],
  };
  const capped = planMigLayout([synthetic], demandsOf([1, 1, 1]));
  assert.equal(capped.kind, "refused");
  assert.deepEqual(capped.partial[0].layout, { small: 2 });
  assert.deepEqual(capped.unmet.map((u) => [u.demand, u.shortfalls[0].reason]), [[
    "r2",
    MigShortfall.maxInstances,
  ]]);
  const budget = planMigLayout([synthetic], demandsOf([2, 1, 1]));
  assert.equal(budget.kind, "refused");
  assert.deepEqual(budget.partial[0].layout, { small: 1, wide: 1 });
  assert.deepEqual(budget.unmet.map((u) => [u.demand, u.shortfalls[0].reason]), [[
    "r2",
    MigShortfall.computeSlices,
  ]]);
  assert.match(budget.unmet[0].shortfalls[0].detail, /small takes 1 compute slices, GPU-s has 0 of 3 free/);
  const both = planMigLayout([synthetic], demandsOf([1, 2]));
  assert.equal(both.kind, "planned");
  assert.deepEqual(both.devices[0].created.map((c) => [c.demand, c.profile, c.start]), [["r0", "small", 0], [
    "r1",
    "wide",
    2,
  ]]);
});

Deno.test("exhaustive demand sets on one device of each family match the oracle", () => {
  let planned = 0;
  let refused = 0;
  for (const family of FAMILY_KEYS) {
    const devices = [device(family, `GPU-${family}`)];
    for (const gibs of multisets(telling(family), 8)) {
      const demands = demandsOf(gibs);
      const result = plan(devices, demands);
      audit(devices, demands, result, `${family} ${gibs.join(",")}`);
      if (result.kind === "planned") planned++;
      else refused++;
    }
  }
  assert.ok(planned > 100 && refused > 1000, `planned ${planned}, refused ${refused}`);
});

Deno.test("exhaustive demand sets on two devices of different families match the oracle", () => {
  const devices = [device("A30", "GPU-0"), device("H100-80GB", "GPU-1")];
  const values = [...new Set([...telling("A30"), ...telling("H100-80GB")])].sort((a, b) => a - b);
  let refused = 0;
  for (const gibs of multisets(values, 5)) {
    const demands = demandsOf(gibs);
    const result = plan(devices, demands);
    audit(devices, demands, result, `A30+H100 ${gibs.join(",")}`);
    if (result.kind === "refused") refused++;
  }
  assert.ok(refused > 100, `refused ${refused}`);
});

Deno.test("random devices, existing instances, demands and pins match the oracle", () => {
  const seed = Deno.env.get("VF_TEST_SEED") ? testSeed() : 16;
  const random = new SeededRandom(seed);
  let refusedWithExisting = 0;
  for (let round = 0; round < 250; round++) {
    const devices = Array.from({ length: random.int(1, 3) }, (_, i) => {
      const family = random.pick(FAMILY_KEYS);
      if (!random.chance(0.4)) return device(family, `GPU-${i}`);
      const layouts = legalLayouts(TABLES[family].product);
      const placed = placeLayout(TABLES[family].product, random.pick(layouts))!;
      return device(family, `GPU-${i}`, placed.filter(() => random.chance(0.5)));
    });
    const keys = devices.map((d) => d.key);
    const demands: MigDemand[] = Array.from({ length: random.int(1, 9) }, (_, i) => {
      const gpuMemoryGib = random.chance(0.5)
        ? random.pick(telling(random.pick(FAMILY_KEYS)))
        : Math.round(random.next() * 1500) / 10 + 0.1;
      const pins = keys.filter(() => random.chance(0.5));
      return random.chance(0.2) && pins.length > 0
        ? { id: `r${i}`, gpuMemoryGib, devices: pins }
        : { id: `r${i}`, gpuMemoryGib };
    });
    const result = plan(devices, demands);
    const label = `seed ${seed} round ${round}: ${JSON.stringify(devices)} ${JSON.stringify(demands)}`;
    audit(devices, demands, result, label);
    if (result.kind === "refused" && devices.some((d) => d.existing.length > 0)) refusedWithExisting++;
  }
  assert.ok(
    refusedWithExisting > 10,
    `seed ${seed}: ${refusedWithExisting} refusals beside existing instances`,
  );
});

Deno.test("a plan is deterministic and leaves its input as it was", () => {
  const devices = [
    device("A100-80GB", "GPU-0"),
    device("A100-80GB", "GPU-1", [{ profile: "1g.20gb", start: 2 }]),
  ];
  const demands = demandsOf([10, 20, 40, 10, 20, 5, 80]);
  const geometries = devices.map(geometryOf);
  const before = JSON.stringify([geometries, demands]);
  const first = planMigLayout(geometries, demands);
  assert.equal(JSON.stringify([geometries, demands]), before);
  for (let i = 0; i < 5; i++) {
    assert.deepEqual(planMigLayout(devices.map(geometryOf), demandsOf([10, 20, 40, 10, 20, 5, 80])), first);
  }
  assert.ok(Object.isFrozen(first));
  audit(devices, demands, first, "deterministic");
});

Deno.test("geometry that contradicts itself is UnobservableState, bad demands a ConfigError, naming each", () => {
  const a100 = geometryOf(device("A100-40GB", "GPU-a"));
  const overlap: MigDeviceGeometry = {
    ...a100,
    instances: [
      { id: 1, profileId: 9, placement: { start: 0, size: 4 } },
      { id: 2, profileId: 19, placement: { start: 3, size: 1 } },
      { id: 3, profileId: 77, placement: { start: 6, size: 1 } },
    ],
  };
  const outside: MigDeviceGeometry = {
    ...a100,
    device: "GPU-b",
    profiles: a100.profiles.map((p) =>
      p.id === 9 ? { ...p, placements: [{ start: 0, size: 4 }, { start: 6, size: 4 }] } : p
    ),
  };
  const widths: MigDeviceGeometry = {
    ...a100,
    device: "GPU-c",
    profiles: a100.profiles.map((p) =>
      p.id === 15 ? { ...p, placements: [{ start: 0, size: 2 }, { start: 2, size: 1 }] } : p
    ),
  };
  assert.throws(
    () => planMigLayout([overlap, outside, widths], demandsOf([5])),
    (error: unknown) => {
      assert.ok(error instanceof UnobservableState);
      assert.match(error.message, /GPU instance 2: it overlaps another instance/);
      assert.match(error.message, /GPU instance 3: its profile id 77 is not among/);
      assert.match(
        error.message,
        /"GPU-b": profile "3g.20gb" \(id 9\): placements .* lie outside 8 memory slices/,
      );
      assert.match(
        error.message,
        /"GPU-c": profile "1g.10gb" \(id 15\): its placements disagree on its width/,
      );
      assert.ok(error.remedy !== null);
      return true;
    },
  );
  assert.throws(() => planMigLayout([a100, a100], []), /the device key is not a unique/);
  assert.throws(
    () =>
      planMigLayout([a100], [
        { id: "a", gpuMemoryGib: 0 },
        { id: "a", gpuMemoryGib: Number.NaN },
        { id: "b", gpuMemoryGib: 4, devices: ["GPU-z"] },
        { id: "c", gpuMemoryGib: 4, devices: [] },
      ]),
    (error: unknown) => {
      assert.ok(error instanceof ConfigError);
      assert.match(error.message, /"a": gpuMemoryGib 0 is not a number > 0/);
      assert.match(error.message, /"a": the id is not a unique/);
      assert.match(error.message, /gpuMemoryGib NaN/);
      assert.match(error.message, /"b": devices GPU-z are not offered/);
      assert.match(error.message, /"c": it may go to no device/);
      return true;
    },
  );
  assert.throws(() => planMigLayout([], demandsOf([5])), ConfigError);
});

Deno.test("planning eight H100 for 57 replicas of four sizes stays quick", () => {
  const devices = Array.from({ length: 8 }, (_, i) => device("H100-80GB", `GPU-${i}`));
  const demands = demandsOf(Array.from({ length: 57 }, (_, i) => [5, 15, 30, 60][i % 4]));
  const started = performance.now();
  const result = plan(devices, demands);
  const elapsed = performance.now() - started;
  assert.equal(result.kind, "refused");
  assert.ok(elapsed < 2000, `${elapsed} ms`);
  const hosted = result.partial.reduce((sum, l) => sum + l.created.length, 0);
  assert.equal(hosted + result.unmet.length, 57);
});
