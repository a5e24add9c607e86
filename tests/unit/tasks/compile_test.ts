/**
 * `deno task compile`'s include list is complete: what a replica loads by URL at run time is embedded,
 * and every other module the binary runs is in `mod.ts`'s module graph (walked with `deno info --json`),
 * the only imports that graph cannot follow being those of the user's own code.
 *
 * @module
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { RUNTIME_LOADED_MODULES } from "../../../src/engines/local.ts";
import { compileArgs, koffiAddons } from "../../../tasks/compile.ts";
import { V8_HEAP_FLAGS } from "../../../src/engines/deno_config.ts";
import { flowFileUrl } from "../../../src/cli/load_flow.ts";

const ROOT = fileURLToPath(new URL("../../../", import.meta.url));

/** The files `--include` names in `args`. */
function includes(args: readonly string[]): string[] {
  return args.flatMap((arg, i) => (args[i - 1] === "--include" ? [arg] : []));
}

/** The local modules (file URLs) reachable from `entry` through static and string-literal dynamic imports. */
async function moduleGraph(entry: string): Promise<string[]> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", entry],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(output.code, 0, new TextDecoder().decode(output.stderr));
  const info = JSON.parse(new TextDecoder().decode(output.stdout)) as { modules: { specifier: string }[] };
  return info.modules.map((m) => m.specifier).filter((s) => s.startsWith("file:"));
}

/** Source lines of `path` that are code (not comment lines). */
function codeOf(path: string): string {
  return Deno.readTextFileSync(path).split("\n").filter((line) => {
    const start = line.trimStart();
    return !start.startsWith("*") && !start.startsWith("/*") && !start.startsWith("//");
  }).join("\n");
}

Deno.test("the compile task embeds every module a replica's entry loads by URL and koffi's native addon, and runs as deno task vf does", () => {
  const args = compileArgs("dist/vf", ["examples/hello.ts"]);
  const included = includes(args);
  assert(included.includes("examples/hello.ts"), "the flow is embedded, by its path in the project");
  assert.throws(() => compileArgs("dist/vf", ["/etc/hostname"]), /not a file inside the project/);
  assert.throws(() => compileArgs("dist/vf", ["examples/nope.ts"]), /not a file inside the project/);
  for (const url of RUNTIME_LOADED_MODULES) {
    const path = fileURLToPath(url);
    assert(Deno.statSync(path).isFile, path);
    assert(included.includes(path.slice(ROOT.length)), `${path} is included`);
  }
  const addons = koffiAddons();
  assert(addons.length > 0 && addons.every((addon) => included.includes(addon)));
  for (const addon of addons) assert(Deno.statSync(join(ROOT, addon)).size > 100_000, addon);
  assert.equal(args.at(-1), "mod.ts");
  const v8 = `--v8-flags=${V8_HEAP_FLAGS.join(",")}`;
  for (const flag of ["-A", "--unstable-worker-options", "--self-extracting", v8]) {
    assert(args.includes(flag), flag);
  }
});

Deno.test("every module the runtime names by URL to load later is in RUNTIME_LOADED_MODULES", () => {
  const named = new Set<string>();
  const walk = (dir: string) => {
    for (const entry of Deno.readDirSync(dir)) {
      const path = join(dir, entry.name);
      if (entry.isDirectory) walk(path);
      else if (path.endsWith(".ts")) {
        for (const match of codeOf(path).matchAll(/new URL\(\s*"([^"]+\.ts)",\s*import\.meta\.url\s*\)/g)) {
          named.add(new URL(match[1], `file://${path}`).href);
        }
      }
    }
  };
  for (const dir of ["src", "workers"]) walk(join(ROOT, dir));
  assert(named.size > 0, "the worker entries are named this way");
  assert.deepEqual([...named].sort(), [...RUNTIME_LOADED_MODULES].sort());
});

Deno.test("the binary's module graph (mod.ts and what is included) follows every import but the user's own code", async () => {
  const graph = new Set(await moduleGraph("mod.ts"));
  for (const url of RUNTIME_LOADED_MODULES) for (const module of await moduleGraph(url)) graph.add(module);
  for (const lazy of ["src/cli/gpus.ts", "src/engines/server_broker.ts", "src/runtime/redis_store.ts"]) {
    assert(graph.has(new URL(lazy, `file://${ROOT}`).href), `${lazy} is reached`);
  }
  const unfollowed: string[] = [];
  for (const module of graph) {
    const path = fileURLToPath(module);
    if (!path.startsWith(ROOT)) continue;
    for (const match of codeOf(path).matchAll(/\bimport\(\s*([^)\s][^)]*)\)/g)) {
      if (!/^["'][^"']+["']$/.test(match[1].trim())) {
        unfollowed.push(`${path.slice(ROOT.length)}: import(${match[1]})`);
      }
    }
  }
  // A flow file (run-local loads the one it is given) and a node class module (a worker rebuilds its node
  // from it): the user's code, on the box beside the binary.
  assert.deepEqual(unfollowed.map((line) => line.split(":")[0]).sort(), [
    "src/cli/load_flow.ts",
    "src/core/node.ts",
  ]);
});

Deno.test("a compiled vf finds a flow by its path in the project it embeds, deno by the working directory", () => {
  assert.equal(flowFileUrl("flows/cam.ts", false, "/home/op").href, "file:///home/op/flows/cam.ts");
  assert.equal(
    flowFileUrl("flows/cam.ts", true, "/home/op").href,
    new URL("flows/cam.ts", `file://${ROOT}`).href,
  );
  assert.equal(flowFileUrl("/srv/cam.ts", true, "/home/op").href, "file:///srv/cam.ts");
});
