import assert from "node:assert/strict";
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
import { SeededRandom, testSeed } from "../../support/random.ts";

const A100_40 = "NVIDIA-A100-SXM4-40GB";
const A100_80 = "NVIDIA-A100-SXM4-80GB";
const H100 = "NVIDIA-H100-80GB-HBM3";
const H200 = "NVIDIA-H200";
const A30 = "NVIDIA-A30";
const PRODUCTS: Readonly<Record<string, string>> = {
  "A30": A30,
  "A100-40GB": A100_40,
  "A100-80GB": A100_80,
  "H100-80GB": H100,
  "H200-141GB": H200,
};

/**
 * An independent placement oracle: every assignment of a legal start to every instance, checked with a
 * bitmask of memory slices, plus the compute budget and the per-profile caps.
 */
function bruteForceLegal(family: MigFamily, layout: Readonly<Record<string, number>>): boolean {
  const instances: { width: number; starts: readonly number[] }[] = [];
  let compute = 0;
  for (const [name, count] of Object.entries(layout)) {
    const profile = family.profiles[name];
    if (profile === undefined || count > profile.maxInstances) return false;
    compute += count * profile.computeSlices;
    for (let i = 0; i < count; i++) instances.push({ width: profile.memorySlices, starts: profile.starts });
  }
  if (compute > family.computeSlices) return false;
  const full = (1 << family.memorySlices) - 1;
  const assign = (index: number, used: number): boolean => {
    if (index === instances.length) return true;
    const { width, starts } = instances[index];
    return starts.some((start) => {
      const mask = ((1 << width) - 1) << start;
      return (mask & ~full) === 0 && (mask & used) === 0 && assign(index + 1, used | mask);
    });
  };
  return assign(0, 0);
}

Deno.test("product names from GFD labels and NVML map onto their MIG family, unknown ones onto none", () => {
  assert.equal(familyFor("NVIDIA-A100-SXM4-40GB")?.key, "A100-40GB");
  assert.equal(familyFor("NVIDIA-A100-PCIE-40GB")?.key, "A100-40GB");
  assert.equal(familyFor("NVIDIA A100 80GB PCIe")?.key, "A100-80GB");
  assert.equal(familyFor("NVIDIA-A100-SXM4-80GB")?.key, "A100-80GB");
  assert.equal(familyFor("NVIDIA-H100-80GB-HBM3")?.key, "H100-80GB");
  assert.equal(familyFor("NVIDIA H100 PCIe")?.key, "H100-80GB");
  assert.equal(familyFor("NVIDIA-H200")?.key, "H200-141GB");
  assert.equal(familyFor("NVIDIA-A30")?.key, "A30");
  assert.equal(familyFor("NVIDIA-H100-NVL"), null, "the 94 GB H100 NVL has other profiles");
  assert.equal(familyFor("NVIDIA-GH200-480GB"), null);
  assert.equal(familyFor("Tesla-T4"), null);
});

Deno.test("the table carries NVIDIA's published instance counts, slice widths and starts", () => {
  const a100 = MIG_FAMILIES["A100-40GB"];
  assert.deepEqual([a100.computeSlices, a100.memorySlices, a100.memoryGib], [7, 8, 40]);
  const caps = Object.fromEntries(Object.values(a100.profiles).map((p) => [p.name, p.maxInstances]));
  assert.deepEqual(caps, {
    "1g.5gb": 7,
    "1g.10gb": 4,
    "2g.10gb": 3,
    "3g.20gb": 2,
    "4g.20gb": 1,
    "7g.40gb": 1,
  });
  assert.deepEqual(a100.profiles["3g.20gb"].starts, [0, 4]);
  assert.deepEqual(a100.profiles["2g.10gb"].starts, [0, 2, 4]);
  assert.deepEqual(Object.keys(MIG_FAMILIES["H200-141GB"].profiles), [
    "1g.18gb",
    "1g.35gb",
    "2g.35gb",
    "3g.71gb",
    "4g.71gb",
    "7g.141gb",
  ]);
  assert.deepEqual(Object.keys(MIG_FAMILIES["H100-80GB"].profiles), [
    "1g.10gb",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
  ]);
  const a30 = MIG_FAMILIES.A30;
  assert.deepEqual([a30.computeSlices, a30.memorySlices], [4, 4]);
  assert.deepEqual(Object.values(a30.profiles).map((p) => [p.name, p.maxInstances, p.starts.length]), [
    ["1g.6gb", 4, 4],
    ["2g.12gb", 2, 2],
    ["4g.24gb", 1, 1],
  ]);
  for (const family of Object.values(MIG_FAMILIES)) {
    for (const p of Object.values(family.profiles)) {
      for (const start of p.starts) {
        assert.ok(start + p.memorySlices <= family.memorySlices, `${family.key} ${p.name} start ${start}`);
      }
    }
  }
});

Deno.test("smallestProfile picks the least memory that covers the request, then the fewest slices", () => {
  assert.equal(smallestProfile(A100_80, 10)?.name, "1g.10gb");
  assert.equal(smallestProfile(A100_80, 15)?.name, "1g.20gb", "1g.20gb beats 2g.20gb on compute");
  assert.equal(smallestProfile(A100_40, 0)?.name, "1g.5gb");
  assert.equal(smallestProfile(A30, 7)?.name, "2g.12gb");
  assert.equal(smallestProfile(H200, 100)?.name, "7g.141gb");
  assert.equal(smallestProfile(A100_40, 41), null);
  assert.equal(smallestProfile("Tesla-T4", 1), null);
});

Deno.test("legal layouts are accepted and placed on allowed, non-overlapping starts", () => {
  const layouts: Record<string, number>[] = [
    { "4g.20gb": 1, "3g.20gb": 1 },
    { "1g.5gb": 7 },
    { "7g.40gb": 1 },
    { "2g.10gb": 3, "1g.5gb": 1 },
  ];
  for (const layout of layouts) {
    assert.deepEqual(checkLayout(A100_40, layout), [], JSON.stringify(layout));
    const placed = placeLayout(A100_40, layout)!;
    const family = familyFor(A100_40)!;
    const used = new Set<number>();
    for (const { profile, start } of placed) {
      const p = family.profiles[profile];
      assert.ok(p.starts.includes(start), `${profile} may not start at ${start}`);
      for (let s = start; s < start + p.memorySlices; s++) {
        assert.ok(!used.has(s), `slice ${s} used twice in ${JSON.stringify(placed)}`);
        used.add(s);
      }
    }
    assert.equal(placed.length, Object.values(layout).reduce((a, b) => a + b, 0));
  }
  assert.deepEqual(checkLayout(A100_40, {}), [], "MIG on with no instances is legal");
});

Deno.test("story 35: a layout that fits by compute-slice count but has no legal starts is rejected", () => {
  const layout = { "3g.20gb": 2, "1g.5gb": 1 };
  const compute = 2 * 3 + 1;
  assert.equal(compute, MIG_FAMILIES["A100-40GB"].computeSlices, "it fits a compute-slice-only planner");
  const problems = checkLayout(A100_40, layout);
  assert.ok(problems.some((p) => /memory slices: 9 exceed/.test(p)), problems.join("; "));
  assert.ok(problems.some((p) => /no legal placement/.test(p)), problems.join("; "));
  assert.equal(placeLayout(A100_40, layout), null);
});

Deno.test("caps, budgets, unknown profiles and bad counts are each reported", () => {
  assert.match(checkLayout(A100_40, { "4g.20gb": 2 }).join(";"), /exceed the A100-40GB cap of 1/);
  assert.match(checkLayout(A100_40, { "4g.20gb": 1, "2g.10gb": 2 }).join(";"), /compute slices: 8 exceed/);
  assert.match(checkLayout(A100_40, { "1g.10gb": 1, "7g.80gb": 1 }).join(";"), /no MIG profile "7g.80gb"/);
  assert.match(checkLayout(A100_40, { "1g.5gb": 1.5 }).join(";"), /positive integer/);
  assert.match(checkLayout(A100_40, { "1g.5gb": 0 }).join(";"), /positive integer/);
  assert.match(checkLayout("Tesla-T4", { "1g.5gb": 1 }).join(";"), /no MIG profile table/);
});

Deno.test("legalLayouts enumerates exactly the non-empty layouts an independent search finds legal", () => {
  for (const [key, product] of Object.entries(PRODUCTS)) {
    const family = MIG_FAMILIES[key];
    const names = Object.keys(family.profiles);
    const expected: string[] = [];
    const counts: Record<string, number> = {};
    const walk = (i: number) => {
      if (i === names.length) {
        const layout = canonicalLayout(counts);
        if (Object.keys(layout).length > 0 && bruteForceLegal(family, layout)) {
          expected.push(JSON.stringify(layout));
        }
        return;
      }
      for (let c = 0; c <= family.profiles[names[i]].maxInstances + 1; c++) {
        counts[names[i]] = c;
        walk(i + 1);
      }
    };
    walk(0);
    const listed = legalLayouts(product).map((l) => JSON.stringify(l));
    assert.deepEqual([...listed].sort(), [...expected].sort(), key);
    assert.equal(new Set(listed).size, listed.length, `${key}: no layout listed twice`);
    assert.ok(listed.includes(JSON.stringify({ [names[names.length - 1]]: 1 })), `${key}: the full card`);
  }
  assert.deepEqual(legalLayouts("Tesla-T4"), []);
});

Deno.test("random layouts: the validator accepts exactly those an independent placement search can place", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let round = 0; round < 2000; round++) {
    const key = random.pick(Object.keys(MIG_FAMILIES));
    const family = MIG_FAMILIES[key];
    const layout: Record<string, number> = {};
    for (const p of Object.values(family.profiles)) {
      if (random.chance(0.45)) layout[p.name] = random.int(1, p.maxInstances + 1);
    }
    const accepted = checkLayout(PRODUCTS[key], layout).length === 0;
    assert.equal(
      accepted,
      bruteForceLegal(family, layout),
      `seed ${seed} round ${round}: ${key} ${JSON.stringify(layout)} -> ${
        checkLayout(PRODUCTS[key], layout)
      }`,
    );
    assert.equal(placeLayout(PRODUCTS[key], layout) !== null, accepted, `seed ${seed} round ${round}`);
  }
});
