/**
 * The GPU check for a machine with real GPUs: prints the NVML inventory and P2P matrix as JSON, then
 * what `nvidia-smi -q -x`, `nvidia-smi -L` and `nvidia-smi topo -p2p r|w|n|a` print, then field by field
 * where the two agree and where they differ. On a machine without nvidia-smi it says so and still prints
 * the inventory. Exits 0 when every compared field agrees, 1 when any differs or nvidia-smi is missing.
 *
 * Run: `deno run -A tasks/gpu_check.ts` (VF_NVML_LIBRARY picks the library, as for `vf gpus`).
 *
 * @module
 */

import { readInventory } from "../nvml/inventory.ts";
import { compareWithSmi, parseSmiList, parseSmiP2p, parseSmiQuery } from "./_nvidia_smi.ts";

/** What `nvidia-smi ARGS` printed, or why it could not be run. */
async function smi(...args: string[]): Promise<{ ok: true; text: string } | { ok: false; why: string }> {
  try {
    const output = await new Deno.Command("nvidia-smi", { args, stdout: "piped", stderr: "piped" }).output();
    const decoder = new TextDecoder();
    if (!output.success) {
      return {
        ok: false,
        why: `nvidia-smi ${args.join(" ")} exited ${output.code}: ${decoder.decode(output.stderr).trim()}`,
      };
    }
    return { ok: true, text: decoder.decode(output.stdout) };
  } catch (error) {
    return {
      ok: false,
      why: error instanceof Deno.errors.NotFound
        ? "nvidia-smi is not installed on this machine"
        : String(error),
    };
  }
}

const inventory = readInventory();
console.log("== NVML inventory and P2P matrix (JSON) ==");
console.log(JSON.stringify(inventory, null, 2));

const query = await smi("-q", "-x");
if (!query.ok) {
  console.log(`\n== nvidia-smi ==\n${query.why}: nothing to compare the inventory with`);
  Deno.exit(1);
}
const list = await smi("-L");
const matrices: Record<string, Map<string, string>> = {};
console.log(`\n== nvidia-smi -q -x ==\n${query.text}`);
console.log(`== nvidia-smi -L ==\n${list.ok ? list.text : list.why}`);
for (const [capability, flag] of [["read", "r"], ["write", "w"], ["nvlink", "n"], ["atomics", "a"]]) {
  const p2p = await smi("topo", "-p2p", flag);
  console.log(`== nvidia-smi topo -p2p ${flag} ==\n${p2p.ok ? p2p.text : p2p.why}`);
  if (p2p.ok) matrices[capability] = parseSmiP2p(p2p.text);
}

const comparisons = compareWithSmi(inventory, {
  query: parseSmiQuery(query.text),
  list: list.ok ? parseSmiList(list.text) : new Map(),
  p2p: matrices,
});
console.log("== field by field ==");
for (const c of comparisons) {
  console.log(`${c.agree ? "same  " : "DIFFER"} ${c.field}: nvml=${c.nvml} nvidia-smi=${c.nvidiaSmi}`);
}
const differ = comparisons.filter((c) => !c.agree).length;
console.log(`${comparisons.length - differ} fields agree, ${differ} differ`);
Deno.exit(differ === 0 ? 0 : 1);
