/**
 * The layer order of DESIGN.md's Layout, enforced: every relative import of a module under `src/`, `ffi/`, `nvml/`,
 * `workers/` or `mod.ts` points to its own layer or one below it, and the contracts import no client
 * library. A new folder fails here until it is given its place in {@link LAYERS}.
 *
 * @module
 */

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize, relative } from "node:path";
import { fileURLToPath } from "node:url";

const REPO = normalize(join(dirname(fileURLToPath(import.meta.url)), "..", ".."));

/**
 * The layers, lowest first; a module may import its own layer and the layers before it. The folders of
 * one entry share a layer: `core`, `backends` and `wire` still import each other (what a user builds
 * names the contracts' outcome types and the wire's identities; the contracts name the wire's ids), so
 * they are one layer until they are untangled. A module belongs to the longest folder that holds it.
 */
const LAYERS: readonly (readonly string[])[] = [
  ["src/core", "src/backends", "src/wire"],
  ["src/backends/memory"],
  ["ffi"],
  ["nvml"],
  ["src/messaging"],
  ["src/embedded"],
  ["src/runtime"],
  ["src/nodes"],
  ["src/deploy"],
  ["src/engines"],
  ["src/cli"],
  ["src/internal.ts", "mod.ts", "workers"],
];

/** The layers that hold the contracts and the model: they import relative modules and `node:` only. */
const NO_CLIENT_LIBRARY: readonly string[] = ["src/core", "src/backends", "src/backends/memory"];

/** The roots whose modules are checked. */
const ROOTS: readonly string[] = ["src", "ffi", "nvml", "workers", "mod.ts"];

/** The layer index and folder of a repository path, or undefined when no layer holds it. */
function layerOf(path: string): { readonly rank: number; readonly folder: string } | undefined {
  let best: { rank: number; folder: string } | undefined;
  LAYERS.forEach((folders, rank) => {
    for (const folder of folders) {
      const holds = path === folder || path.startsWith(`${folder}/`);
      if (holds && (best === undefined || folder.length > best.folder.length)) best = { rank, folder };
    }
  });
  return best;
}

/**
 * The specifiers a module imports: static imports and re-exports, side-effect imports and dynamic
 * imports of a string literal. Comment lines (doc examples) are not code.
 */
function importsOf(source: string): string[] {
  const code = source.split("\n").filter((line) => {
    const start = line.trimStart();
    return !start.startsWith("*") && !start.startsWith("/*") && !start.startsWith("//");
  }).join("\n");
  const found: string[] = [];
  const patterns = [
    /^\s*(?:import|export)\b[^;"'`]*?\bfrom\s*["']([^"']+)["']/gm,
    /^\s*import\s*["']([^"']+)["']/gm,
    /\bimport\s*\(\s*["']([^"']+)["']\s*\)/g,
  ];
  for (const pattern of patterns) {
    for (const match of code.matchAll(pattern)) found.push(match[1]);
  }
  return found;
}

/** Every violation among `modules` (repository path → source text), one line each. */
function layerViolations(modules: ReadonlyMap<string, string>): string[] {
  const violations: string[] = [];
  for (const [path, source] of modules) {
    const from = layerOf(path);
    if (from === undefined) {
      violations.push(`${path} is in no layer: give its folder a place in LAYERS`);
      continue;
    }
    for (const specifier of importsOf(source)) {
      if (!specifier.startsWith(".")) {
        const external = !specifier.startsWith("node:");
        if (external && NO_CLIENT_LIBRARY.includes(from.folder)) {
          violations.push(`${path} imports ${specifier}: ${from.folder} imports no client library`);
        }
        continue;
      }
      const target = normalize(join(dirname(path), specifier));
      const to = layerOf(target);
      if (to === undefined) continue;
      if (to.rank > from.rank) {
        violations.push(`${path} (${from.folder}) imports ${target} (${to.folder}), a layer above it`);
      }
    }
  }
  return violations;
}

function modulesUnder(root: string, into: Map<string, string>): void {
  const absolute = join(REPO, root);
  if (root.endsWith(".ts")) {
    into.set(root, readFileSync(absolute, "utf8"));
    return;
  }
  for (const entry of readdirSync(absolute, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile() || !entry.name.endsWith(".ts")) continue;
    const path = relative(REPO, join(entry.parentPath, entry.name));
    into.set(path, readFileSync(join(REPO, path), "utf8"));
  }
}

Deno.test("every import of src/, ffi/, nvml/, workers/ and mod.ts points to its own layer or one below it", () => {
  const modules = new Map<string, string>();
  for (const root of ROOTS) modulesUnder(root, modules);
  assert.ok(modules.size > 50, `read the modules (${modules.size})`);
  assert.deepEqual(layerViolations(modules), []);
});

Deno.test("an import that points up a layer, a client library in the contracts and a folder in no layer are refused", () => {
  const modules = new Map([
    ["src/backends/payload.ts", 'import { x } from "../messaging/messenger.ts";\n'],
    ["src/core/node.ts", 'import type { X } from "../embedded/rpc.ts";\n'],
    ["src/backends/memory/clock.ts", 'export { y } from "npm:ioredis@5";\n'],
    ["src/messaging/messenger.ts", 'const m = await import("../engines/local.ts");\n'],
    ["src/somewhere/new.ts", 'import "../core/node.ts";\n'],
    [
      "src/engines/local.ts",
      ' * import { x } from "../cli/main.ts";\nimport { y } from "../runtime/worker.ts";\n',
    ],
  ]);
  assert.deepEqual(layerViolations(modules), [
    "src/backends/payload.ts (src/backends) imports src/messaging/messenger.ts (src/messaging), a layer above it",
    "src/core/node.ts (src/core) imports src/embedded/rpc.ts (src/embedded), a layer above it",
    "src/backends/memory/clock.ts imports npm:ioredis@5: src/backends/memory imports no client library",
    "src/messaging/messenger.ts (src/messaging) imports src/engines/local.ts (src/engines), a layer above it",
    "src/somewhere/new.ts is in no layer: give its folder a place in LAYERS",
  ]);
});
