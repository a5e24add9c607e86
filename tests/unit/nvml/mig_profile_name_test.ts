import assert from "node:assert/strict";
import { migProfileName } from "../../../nvml/mig_profile_name.ts";
import { A100_TOTAL_BYTES, H100_TOTAL_BYTES } from "../../support/fake_nvml.ts";

Deno.test("MIG profile names follow nvidia-smi's for an A100 40GB and an H100 80GB", () => {
  const a100 = [[1, 4864], [2, 9984], [3, 19968], [4, 19968], [7, 40192]].map(([gi, mb]) =>
    migProfileName({ gpuInstance: gi }, mb, A100_TOTAL_BYTES)
  );
  assert.deepEqual(a100, ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]);
  const h100 = [[1, 9856], [1, 19968], [2, 19968], [3, 40192], [7, 80896]].map(([gi, mb]) =>
    migProfileName({ gpuInstance: gi }, mb, H100_TOTAL_BYTES)
  );
  assert.deepEqual(h100, ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb"]);
});

Deno.test("a compute instance smaller than its GPU instance is named with its own slices first", () => {
  assert.equal(migProfileName({ gpuInstance: 3, computeInstance: 1 }, 19968, A100_TOTAL_BYTES), "1c.3g.20gb");
  assert.equal(migProfileName({ gpuInstance: 3, computeInstance: 3 }, 19968, A100_TOTAL_BYTES), "3g.20gb");
  assert.equal(migProfileName({ gpuInstance: 1 }, 9856, H100_TOTAL_BYTES, "+me"), "1g.10gb+me");
  assert.throws(() => migProfileName({ gpuInstance: 1 }, 9856, 0), RangeError);
});
