/**
 * The cost of a full NVML inventory read through koffi, on the fake library (so the figure is the
 * binding's own overhead: the fake answers from memory), beside spawning a `true` subprocess, the floor
 * of any `nvidia-smi` shell-out, in the same run. The fixture is eight H100s in MIG mode (three MIG
 * devices each) with an NVLink P2P matrix: 8 cards, 24 MIG devices, 56 links × 5 reads. The first load
 * (importing koffi and the binding, opening the library, declaring its symbols, `nvmlInit_v2`, the
 * first read) is printed apart, since it is paid once per process.
 *
 * Run: `deno bench -A bench/nvml_inventory_bench.ts` (gcc compiles the fake first).
 *
 * @module
 */

import { FIXTURES, useFakeNvml } from "../tests/support/fake_nvml.ts";

await useFakeNvml(FIXTURES.eightH100Mig);
const started = performance.now();
const { readInventory } = await import("../nvml/inventory.ts");
const { openNvml } = await import("../nvml/session.ts");
const imported = performance.now();
const session = openNvml();
const opened = performance.now();
const first = readInventory({ session });
const read = performance.now();
if (session.kind === "unknown" || first.devices.kind === "unknown" || first.devices.value.length !== 8) {
  throw new Error(`the fake did not serve eight GPUs: ${JSON.stringify(first.devices)}`);
}
console.log(
  `first load: koffi and the binding imported in ${(imported - started).toFixed(1)} ms; ` +
    `NVML opened (dlopen, symbols declared, nvmlInit_v2) in ${(opened - imported).toFixed(1)} ms; ` +
    `first full inventory in ${(read - opened).toFixed(2)} ms`,
);

Deno.bench({
  name: "full inventory through koffi: 8 H100, 24 MIG devices, 56 P2P links",
  group: "nvml inventory",
  fn: () => {
    readInventory({ session });
  },
});

Deno.bench({
  name: "spawn `true` (the floor of an nvidia-smi shell-out)",
  group: "nvml inventory",
  baseline: true,
  fn: async () => {
    await new Deno.Command("true", { stdout: "null", stderr: "null" }).output();
  },
});
