/**
 * Compare-and-swaps per second of the file run ledger (`file://`) at 1, 8 and 64 concurrent writers (as
 * the workers of a run reach the supervisor's one store over the embedded RPC), beside the bare cycle a
 * crash-safe file write is built from (write a temporary file, fsync it, rename it over the target, fsync
 * the directory), measured on the same disk in the same run.
 *
 * One iteration is one round: each writer reads its own key and swaps it from the version it read (so
 * every swap wins), all writers at once. The time per iteration divided by the writers is the cost of one
 * swap, its read included; deno bench prints each group's rows against its baseline.
 *
 * Baseline: the store of an earlier checkout, loaded from `VF_BENCH_BASELINE_ROOT` (the root of that
 * checkout, e.g. a `git worktree` of the commit before the journal), runs in the same groups, so the
 * ratios compare the two on the same disk in the same minute. Without it, the bare cycle is the 1-writer
 * baseline and the other groups have none.
 *
 * Run: `[VF_BENCH_BASELINE_ROOT=/path/to/old/checkout] deno bench -A bench/file_store_bench.ts`.
 *
 * @module
 */

import type { RuntimeStore } from "../src/backends/runtime_store.ts";
import { FileRuntimeStore } from "../src/runtime/file_store.ts";

/** What both stores offer: open a directory. */
type StoreOpener = (root: string) => Promise<RuntimeStore>;

const WRITERS = [1, 8, 64] as const;
/** Rounds per measurement: fixed, because a round of the old store costs milliseconds per writer. */
const ROUNDS = 40;
const WARMUP = 4;

const root = await Deno.makeTempDir({ prefix: "vf-file-bench-" });
const value = new TextEncoder().encode(JSON.stringify({ state: "x".repeat(200) }));
const baselineRoot = Deno.env.get("VF_BENCH_BASELINE_ROOT");
const baseline: StoreOpener | null = baselineRoot === undefined ? null : (
  (await import(`${baselineRoot}/src/runtime/file_store.ts`)).FileRuntimeStore as {
    open: StoreOpener;
  }
).open;
const bare = `${root}/bare`;
await Deno.mkdir(bare);

/** The floor: one crash-safe replacement of a file, with nothing else. */
async function bareReplace(path: string): Promise<void> {
  const temporary = `${path}.tmp`;
  const file = await Deno.open(temporary, { write: true, create: true, truncate: true });
  await file.write(value);
  await file.syncData();
  file.close();
  await Deno.rename(temporary, path);
  const dir = await Deno.open(bare, { read: true });
  await dir.sync();
  dir.close();
}

/** One round of `writers` concurrent read-and-swap writers on `store`, each on its own key. */
function round(store: RuntimeStore, writers: number): Promise<void> {
  return Promise.all(Array.from({ length: writers }, async (_, w) => {
    const key = `vf/bench/run/node-${w}/published/0`;
    const entry = await store.get(key);
    const expected = entry.kind === "present" ? entry.version : null;
    if (!(await store.cas(key, expected, value))) throw new Error("a swap lost with no other writer");
  })).then(() => {});
}

const stores: { name: string; open: StoreOpener; baseline: boolean }[] = [
  ...(baseline === null
    ? []
    : [{ name: "file per key (baseline checkout)", open: baseline, baseline: true }]),
  { name: "journal, group commit", open: (dir: string) => FileRuntimeStore.open(dir), baseline: false },
];

Deno.bench("bare write, fsync, rename, fsync dir", {
  group: "1 writer",
  baseline: baseline === null,
  n: ROUNDS,
  warmup: WARMUP,
}, async () => {
  await bareReplace(`${bare}/hot`);
});

for (const writers of WRITERS) {
  for (const { name, open, baseline } of stores) {
    const store = await open(`${root}/${writers}-${baseline ? "baseline" : "journal"}`);
    Deno.bench(`${name}: ${writers} concurrent read-and-swap`, {
      group: `${writers} writer${writers === 1 ? "" : "s"}`,
      baseline,
      n: ROUNDS,
      warmup: WARMUP,
    }, async () => {
      await round(store, writers);
    });
  }
}

globalThis.addEventListener("unload", () => {
  Deno.removeSync(root, { recursive: true });
});
