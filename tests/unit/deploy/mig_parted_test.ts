/**
 * The MIG manager's side as the Kubernetes allocator drives it: the mig-parted document reads back as
 * written (with `all-disabled` always in it, a malformed one Unknown), and whether a layout fits an
 * empty GPU agrees with the memory model's independent card tables on random layouts.
 */
import assert from "node:assert/strict";
import { checkLayout, familyFor } from "../../../src/backends/memory/mig_geometry.ts";
import { UnobservableState } from "../../../src/core/errors.ts";
import {
  layoutFits,
  MIG_DISABLED,
  migPartedDocument,
  parseMigParted,
  profileFor,
} from "../../../src/deploy/mig_parted.ts";
import { nvmlGeometry } from "../../support/kube_gpu_cluster.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const H100 = "NVIDIA-H100-80GB-HBM3";

Deno.test("mig-parted: the document reads back as written, all-disabled always in it; a broken one is Unknown", () => {
  const text = migPartedDocument({ "claim-a-n0-g1": { "1g.10gb": 2, "3g.40gb": 1 } });
  assert.match(text, /version: v1/);
  assert.deepEqual(parseMigParted(text), {
    [MIG_DISABLED]: {},
    "claim-a-n0-g1": { "1g.10gb": 2, "3g.40gb": 1 },
  });
  assert.deepEqual(parseMigParted(migPartedDocument({})), { [MIG_DISABLED]: {} });
  assert.throws(() => parseMigParted("version: v1\n"), UnobservableState);
  assert.throws(() => parseMigParted(": ["), UnobservableState);
});

Deno.test("mig-parted: a layout fits an empty GPU exactly when the card tables say it is legal", () => {
  const family = familyFor(H100)!;
  const geometry = nvmlGeometry(family);
  assert.equal(profileFor(geometry, 10)?.name, "1g.10gb");
  assert.equal(profileFor(geometry, 81), null, "no profile holds more than the card");
  assert.equal(layoutFits(geometry, { "1g.10gb": 1, "3g.40gb": 2 }), false, "9 memory slices");
  assert.equal(layoutFits(geometry, { "1g.10gb": 1, "4g.40gb": 1 }), true);
  assert.equal(layoutFits(geometry, { "9g.90gb": 1 }), false, "a profile the GPU does not offer");
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const profiles = Object.values(family.profiles);
  let legal = 0;
  for (let round = 0; round < 200; round++) {
    const layout: Record<string, number> = {};
    for (const p of profiles) {
      const count = random.int(0, Math.min(p.maxInstances, 3));
      if (count > 0 && random.chance(0.5)) layout[p.name] = count;
    }
    const oracle = checkLayout(H100, layout).length === 0;
    legal += Number(oracle);
    assert.equal(
      layoutFits(geometry, layout),
      oracle,
      `seed ${seed} round ${round}: ${JSON.stringify(layout)}`,
    );
  }
  assert.ok(legal > 10 && legal < 190, `seed ${seed}: both kinds of layout were drawn (${legal} legal)`);
});
