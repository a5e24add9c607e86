import assert from "node:assert/strict";
import { readInventory } from "../../../nvml/inventory.ts";
import { closeNvml } from "../../../nvml/session.ts";
import { compareWithSmi, parseSmiList, parseSmiP2p, parseSmiQuery } from "../../../tasks/_nvidia_smi.ts";
import { FIXTURES, h100, useFakeNvml } from "../../support/fake_nvml.ts";

const sample = (name: string) =>
  Deno.readTextFile(new URL(`../../fixtures/nvidia_smi/${name}`, import.meta.url));

Deno.test("nvidia-smi -q -x, -L and topo -p2p are read into cards, MIG devices and a matrix", async () => {
  const query = parseSmiQuery(await sample("a100_mig_q.xml"));
  assert.equal(query.driverVersion, "550.54.15");
  assert.deepEqual(query.gpus, [{
    pciBusId: "00000000:18:00.0",
    name: "NVIDIA A100-SXM4-40GB",
    uuid: "GPU-a1b2c3d4-0000-4e5f-8a9b-000000000000",
    memoryTotalMib: 40960,
    migCurrent: "Enabled",
    migPending: "Enabled",
  }]);
  const list = parseSmiList(await sample("a100_mig_L.txt"));
  assert.deepEqual(list.get("GPU-a1b2c3d4-0000-4e5f-8a9b-000000000000")?.map((s) => s.profile), [
    "3g.20gb",
    "2g.10gb",
    "1g.5gb",
  ]);
  const p2p = parseSmiP2p(await sample("two_gpu_p2p_r.txt"));
  assert.deepEqual([...p2p], [["0,0", "X"], ["0,1", "OK"], ["1,0", "OK"], ["1,1", "X"]]);
});

Deno.test("the fake A100's inventory agrees with nvidia-smi field by field; a changed field is a difference", async () => {
  closeNvml();
  await useFakeNvml(FIXTURES.a100Mig);
  const inventory = readInventory();
  closeNvml();
  const report = {
    query: parseSmiQuery(await sample("a100_mig_q.xml")),
    list: parseSmiList(await sample("a100_mig_L.txt")),
    p2p: {},
  };
  const same = compareWithSmi(inventory, report);
  assert.equal(same.length, 9);
  assert.deepEqual(same.filter((c) => !c.agree), []);

  const changed = compareWithSmi(inventory, {
    ...report,
    query: { ...report.query, gpus: [{ ...report.query.gpus[0], memoryTotalMib: 40536 }] },
  });
  assert.deepEqual(changed.filter((c) => !c.agree).map((c) => [c.field, c.nvml, c.nvidiaSmi]), [
    ["GPU 0 memory total (MiB)", "40960", "40536"],
  ]);
});

Deno.test("an unread NVML field and a P2P cell are differences, never agreements", async () => {
  closeNvml();
  await useFakeNvml({
    ...FIXTURES.eightH100,
    devices: [h100(0), { ...h100(1), returns: { nvmlDeviceGetUUID: 3 } }],
  });
  const inventory = readInventory();
  closeNvml();
  const comparisons = compareWithSmi(inventory, {
    query: { driverVersion: "550.54.15", gpus: [] },
    list: new Map(),
    p2p: { read: parseSmiP2p(await sample("two_gpu_p2p_r.txt")) },
  });
  const p2p = comparisons.filter((c) => c.field.startsWith("P2P"));
  assert.deepEqual(p2p.map((c) => [c.field, c.agree]), [["P2P read GPU0→GPU1", true], [
    "P2P read GPU1→GPU0",
    true,
  ]]);
  const count = comparisons.find((c) => c.field === "GPU count");
  assert.equal(count?.agree, false);
});
