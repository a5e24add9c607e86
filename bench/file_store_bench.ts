/**
 * Compare-and-swap operations per second of the file run ledger (`file://`), beside the bare cycle every
 * crash-safe write is built from, measured on the same disk in the same run: write a temporary file,
 * fsync it, rename it over the target, fsync the directory. The "x slower" column is the ledger's
 * overhead over that floor (its lock, its read of the current version, its record encoding).
 *
 * Variants: swaps on one hot key (every swap reads the version the previous one wrote), and swaps spread
 * over 64 keys.
 *
 * Run: `deno bench -A bench/file_store_bench.ts`.
 *
 * @module
 */

import { FileRuntimeStore } from "../src/runtime/file_store.ts";

const root = await Deno.makeTempDir({ prefix: "vf-file-bench-" });
const store = await FileRuntimeStore.open(`${root}/ledger`);
const bare = `${root}/bare`;
await Deno.mkdir(bare);
const value = new TextEncoder().encode(JSON.stringify({ state: "x".repeat(200) }));
let version: string | null = null;
let spread = 0;
const versions = new Map<string, string | null>();

/** The floor: one crash-safe replacement of a file, with nothing else. */
async function bareReplace(path: string): Promise<void> {
  const temporary = `${path}.tmp`;
  const file = await Deno.open(temporary, { write: true, create: true, truncate: true });
  await file.write(value);
  await file.sync();
  file.close();
  await Deno.rename(temporary, path);
  const dir = await Deno.open(bare, { read: true });
  await dir.sync();
  dir.close();
}

Deno.bench("bare write, fsync, rename, fsync dir", { group: "cas", baseline: true }, async () => {
  await bareReplace(`${bare}/hot`);
});

Deno.bench("file store: compare-and-swap on one key", { group: "cas" }, async () => {
  if (!(await store.cas("bench/hot", version, value))) throw new Error("a swap lost with no other writer");
  const entry = await store.get("bench/hot");
  version = entry.kind === "present" ? entry.version : null;
});

Deno.bench("file store: compare-and-swap over 64 keys", { group: "cas" }, async () => {
  const key = `bench/k${spread++ % 64}`;
  const expected = versions.get(key) ?? null;
  if (!(await store.cas(key, expected, value))) throw new Error("a swap lost with no other writer");
  const entry = await store.get(key);
  versions.set(key, entry.kind === "present" ? entry.version : null);
});

globalThis.addEventListener("unload", () => {
  Deno.removeSync(root, { recursive: true });
});
