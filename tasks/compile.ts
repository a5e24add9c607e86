/**
 * `deno task compile [FLOW.ts ...] [--output PATH]`: one `vf` binary for a camera box (`deno compile` of
 * `mod.ts`), which runs `vf run-local FLOW.ts` (replicas as Deno Workers) for the flows it was built with,
 * and `vf gpus`, with nothing else of the project on the box. A compiled binary loads only the modules it
 * embeds, so each flow (a path inside the project, which is how the binary names it later) is embedded
 * with its modules. Embedded besides `mod.ts`'s own module graph (its static and string-literal dynamic
 * imports): the modules a replica's generated entry loads by URL ({@link RUNTIME_LOADED_MODULES}) and
 * koffi's native addon for this platform; the binary extracts itself to disk on its first run
 * (`--self-extracting`), so the addon is a file the dynamic loader can open. It runs with every permission and the V8 heap flags of
 * `deno task vf` ({@link V8_HEAP_FLAGS}), and gives each replica exactly its node's permissions as `vf` does. On the box it needs
 * ffmpeg (video nodes) and, for GPUs, the NVIDIA driver (`libnvidia-ml.so.1`).
 *
 * `deno compile` downloads its runtime (denort) on first use; on a machine that cannot reach it the task
 * fails there, with deno's message.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { isAbsolute, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { RUNTIME_LOADED_MODULES } from "../src/engines/local.ts";
import { V8_HEAP_FLAGS } from "../src/engines/deno_config.ts";

/** The repository root. */
const ROOT = fileURLToPath(new URL("..", import.meta.url));

/**
 * Every `koffi.node` of koffi's package for this platform under `root`'s `node_modules` (paths relative to
 * `root`). Throws when there is none: `deno install` has not run, or koffi ships nothing for this platform.
 */
export function koffiAddons(root: string = ROOT): string[] {
  const platform = `${Deno.build.os}-${Deno.build.arch === "x86_64" ? "x64" : Deno.build.arch}`;
  const found: string[] = [];
  const store = join(root, "node_modules", ".deno");
  for (const entry of safeReadDir(store)) {
    if (!entry.isDirectory || !entry.name.startsWith(`@koromix+koffi-${platform}@`)) continue;
    const pkg = join(store, entry.name, "node_modules", "@koromix", `koffi-${platform}`);
    for (const triplet of safeReadDir(pkg)) {
      const addon = join(pkg, triplet.name, "koffi.node");
      if (triplet.isDirectory && fileExists(addon)) found.push(relative(root, addon));
    }
  }
  if (found.length === 0) {
    throw new Error(
      `no koffi.node for ${platform} under ${store}: run \`deno install\` first (koffi's platform package ` +
        "carries it)",
    );
  }
  return found.sort();
}

/**
 * The `deno compile` arguments that build the binary at `output` from `root`, embedding `flows` (paths
 * relative to `root`). Throws for a flow outside the project or missing: the binary could not name it.
 */
export function compileArgs(output: string, flows: readonly string[] = [], root: string = ROOT): string[] {
  for (const flow of flows) {
    const inside = relative(root, resolve(root, flow));
    if (inside.startsWith("..") || isAbsolute(inside) || !fileExists(join(root, inside))) {
      throw new Error(
        `flow ${flow} is not a file inside the project at ${root}: a compiled vf names its flows by their paths there`,
      );
    }
  }
  const includes = [
    ...RUNTIME_LOADED_MODULES.map((url) => relative(root, fileURLToPath(url))),
    ...koffiAddons(root),
    ...flows.map((flow) => relative(root, resolve(root, flow))),
  ];
  return [
    "compile",
    "-A",
    "--unstable-worker-options",
    "--self-extracting",
    `--v8-flags=${V8_HEAP_FLAGS.join(",")}`,
    "--output",
    output,
    ...includes.flatMap((path) => ["--include", path]),
    "mod.ts",
  ];
}

function safeReadDir(path: string): Deno.DirEntry[] {
  try {
    return [...Deno.readDirSync(path)];
  } catch {
    return [];
  }
}

function fileExists(path: string): boolean {
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
}

if (import.meta.main) {
  const { values, positionals } = parseArgs({
    args: Deno.args,
    allowPositionals: true,
    options: { output: { type: "string" } },
  });
  const args = compileArgs(values.output ?? "dist/vf", positionals.map((flow) => resolve(Deno.cwd(), flow)));
  console.error(`deno ${args.join(" ")}`);
  const status = await new Deno.Command(Deno.execPath(), { args, cwd: ROOT }).spawn().status;
  Deno.exit(status.code);
}
