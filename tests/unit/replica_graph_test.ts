/**
 * What a node replica evaluates as it starts: the static module graph of its entry (`workers/`) and of
 * `mod.ts`, which every node's module imports. A replica's isolate evaluates each module of that graph
 * before its first item (a sandboxed Worker cannot load one later), so the supervisor's engine, its
 * embedded broker and the command line stay out of it: `mod.ts` loads them only when its caller runs a
 * flow or the CLI (dynamic imports, which this walk does not follow).
 *
 * @module
 */

import assert from "node:assert/strict";

const REPO = new URL("../../", import.meta.url);

interface InfoDependency {
  readonly isDynamic?: boolean;
  readonly code?: { readonly specifier?: string };
}

interface InfoModule {
  readonly specifier: string;
  readonly dependencies?: readonly InfoDependency[];
}

/** The repository paths of the modules `entries` import statically, transitively, as `deno info` resolves them. */
async function staticGraph(entries: readonly string[]): Promise<string[]> {
  const found = new Set<string>();
  for (const entry of entries) {
    const output = await new Deno.Command(Deno.execPath(), {
      args: ["info", "--json", entry],
      cwd: REPO,
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.ok(output.success, new TextDecoder().decode(output.stderr));
    const info: { roots: string[]; modules: InfoModule[] } = JSON.parse(
      new TextDecoder().decode(output.stdout),
    );
    const modules = new Map(info.modules.map((module) => [module.specifier, module]));
    const pending = [...info.roots];
    while (pending.length > 0) {
      const specifier = pending.pop()!;
      if (found.has(specifier)) continue;
      found.add(specifier);
      for (const dependency of modules.get(specifier)?.dependencies ?? []) {
        const resolved = dependency.code?.specifier;
        if (dependency.isDynamic !== true && resolved !== undefined) pending.push(resolved);
      }
    }
  }
  return [...found].filter((specifier) => specifier.startsWith(REPO.href))
    .map((specifier) => specifier.slice(REPO.href.length)).sort();
}

/** Modules a replica never runs: the local engine's supervisor side and the command line. */
function supervisorModules(paths: readonly string[]): string[] {
  return paths.filter((path) =>
    path.startsWith("src/cli/") ||
    path.startsWith("src/engines/") && path !== "src/engines/stop_signals.ts"
  );
}

Deno.test("a Worker replica's entry and mod.ts load no module of the engine or the CLI statically", async () => {
  const graph = await staticGraph(["workers/node_worker.ts", "mod.ts"]);
  assert.ok(graph.includes("src/runtime/worker.ts"), "the walk follows static imports");
  assert.deepEqual(supervisorModules(graph), []);
});

Deno.test("a subprocess replica's entry loads no module of the engine or the CLI statically", async () => {
  assert.deepEqual(supervisorModules(await staticGraph(["workers/node_process.ts", "mod.ts"])), []);
});
