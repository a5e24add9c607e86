/**
 * Loading a user's flow file: a TypeScript module whose default export is a `Flow`. Every way a flow
 * file can fail to load becomes one typed error with a remedy, never a stack trace.
 *
 * @module
 */

import { ConfigError, VideoflowError } from "../core/errors.ts";
import { Flow } from "../core/flow.ts";
import { ModuleIndex } from "../core/node_class.ts";
import { subprocessResolutionArgs } from "../engines/deno_config.ts";

/**
 * A loaded flow file: the flow, the module's URL, and the module index its node classes resolve against
 * (the registered built-in modules, then the flow file's own exports).
 */
export interface LoadedFlow {
  readonly flow: Flow;
  readonly url: string;
  readonly modules: ModuleIndex;
}

/** The project root as this module sees it: inside a compiled vf, the root of what it embeds. */
const PROJECT_ROOT = new URL("../../", import.meta.url);

/**
 * Where flow file `path` is: relative to `cwd`, or, in a compiled vf (`standalone`), relative to the project
 * it was built from, since a compiled binary loads only the modules it embeds (`deno task compile FLOW.ts`
 * embeds the flow at that path); an absolute path as given.
 */
export function flowFileUrl(
  path: string,
  standalone: boolean = Deno.build.standalone,
  cwd = Deno.cwd(),
): URL {
  return new URL(path, standalone ? PROJECT_ROOT : `file://${cwd}/`);
}

/** Where in the flow file the error was thrown, when its stack names the file. */
function locationIn(error: unknown, url: string): string | null {
  const stack = error instanceof Error ? error.stack ?? "" : "";
  const match = stack.split("\n").map((line) => line.match(/(file:\/\/[^\s)]+):(\d+):(\d+)/)).find((m) =>
    m !== null && m[1] === url
  );
  return match ? `line ${match[2]}` : null;
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const message = error.message.split("\n")[0];
  // Deno reports a module that does not parse as a TypeError whose message starts with its own name.
  return /^[A-Z]\w*Error: /.test(message) ? message : `${error.name}: ${message}`;
}

/**
 * How long a flow file may take to load before a probe process is asked whether it ever will: Deno ends a
 * process whose top-level await can never settle with a raw message (no event, no handler, whatever keeps
 * the loop alive: tried on Deno 2.9), so the load keeps this process alive and lets a separate one meet
 * that end instead.
 */
const STALL_PROBE_DELAY_MS = 1_000;

/**
 * What the probe may do as it evaluates the flow file a second time: read (files, the environment, the
 * system's facts) and import code, never write, connect, run a program or load a library. A flow file's
 * effects at module scope (a file written, a request sent) then happen once, in vf: in the probe they
 * fail, and a probe whose import fails finds nothing, which leaves vf's own import to decide.
 */
const PROBE_PERMISSIONS = ["--allow-read", "--allow-env", "--allow-sys", "--allow-import", "--no-prompt"];

/** What Deno prints, and where it points, when a module's top-level await can never settle. */
const NEVER_SETTLES = /Top-level await promise never resolved[\s\S]*?\((file:\/\/[^\s)]+):(\d+):\d+\)/;

/**
 * Where the flow file at `url` waits forever when Deno, importing it in a process of its own (under
 * {@link PROBE_PERMISSIONS}), reports a top-level await nothing can settle; `null` when that process loads
 * it, fails otherwise, or cannot start.
 */
async function neverSettlingAwait(url: string, probe: AbortSignal): Promise<string | null> {
  let output: Deno.CommandOutput;
  try {
    output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        ...PROBE_PERMISSIONS,
        ...subprocessResolutionArgs(),
        // A static import: Deno then points at the flow file's own await, and the file is not the main
        // module (`import.meta.main` is false, as when vf imports it).
        `data:text/javascript,${encodeURIComponent(`import ${JSON.stringify(url)};`)}`,
      ],
      env: { NO_COLOR: "1" },
      stdin: "null",
      stdout: "null",
      stderr: "piped",
      signal: probe,
    }).output();
  } catch {
    return null;
  }
  const found = NEVER_SETTLES.exec(new TextDecoder().decode(output.stderr));
  if (found === null) return null;
  return found[1] === url ? `line ${found[2]}` : `${found[1]} line ${found[2]}`;
}

/**
 * The flow file's module namespace. While it loads, `Deno.exit` throws a {@link ConfigError} (a flow file
 * that ends the process would end vf with its own status, before anything was checked); a top-level
 * await that can never settle is a ConfigError too, found by {@link neverSettlingAwait} once the load has
 * taken {@link STALL_PROBE_DELAY_MS}.
 */
async function importFlowModule(url: string, path: string): Promise<Record<string, unknown>> {
  const exit = Deno.exit;
  const probe = new AbortController();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const stalled = new Promise<never>((_, reject) => {
    timer = setTimeout(async () => {
      const where = await neverSettlingAwait(url, probe.signal);
      if (where === null) return;
      reject(
        new ConfigError(
          `flow file ${path} never finishes loading: its top-level await (${where}) waits on a promise ` +
            "nothing can settle",
          "build and export the Flow without waiting at module scope: await what a node needs in its open()",
          { path },
        ),
      );
    }, STALL_PROBE_DELAY_MS);
  });
  (Deno as { exit: (code?: number) => never }).exit = (code?: number): never => {
    const where = locationIn(new Error(), url);
    throw new ConfigError(
      `flow file ${path} calls Deno.exit(${code ?? ""}) while loading${where ? ` (${where})` : ""}`,
      "remove the call: a flow file only builds and exports its Flow, and vf exits with the run's status",
      { path },
    );
  };
  try {
    return await Promise.race([import(url), stalled]);
  } finally {
    Deno.exit = exit;
    clearTimeout(timer);
    probe.abort();
  }
}

/** How Deno says a bare import has no entry in the import map it runs with. */
const UNMAPPED_IMPORT = /not a dependency and not in import map|Relative import path .* not prefixed/;
/** How V8 says a binding was read before its module finished evaluating: modules that import each other. */
const BEFORE_INITIALIZATION = /^ReferenceError: Cannot access '.*' before initialization/;

/** What to do about an error the flow file threw while loading. */
function loadRemedy(described: string): string {
  if (UNMAPPED_IMPORT.test(described)) {
    return "map that name in your project's deno.json and run deno with --config pointing at it (without it " +
      "Deno reads the configuration beside its main module, not beside the flow file)";
  }
  if (BEFORE_INITIALIZATION.test(described)) {
    return "two of the flow's modules import each other, so one is used before it finished loading: move " +
      "what they share into a module that imports neither";
  }
  return "fix the error in the flow file, then run the command again";
}

/**
 * Imports `path` (relative to the working directory) and returns its default-exported `Flow`.
 * Throws {@link ConfigError} when the file does not exist, cannot be loaded, throws while loading, or
 * does not export a Flow; a videoflow error the file itself throws keeps its own class and exit code.
 */
export async function loadFlow(path: string): Promise<LoadedFlow> {
  const url = flowFileUrl(path);
  try {
    const stat = await Deno.stat(url);
    if (!stat.isFile) {
      throw new ConfigError(`flow file ${path} is not a file`, "pass the path of a .ts file", { path });
    }
  } catch (error) {
    if (error instanceof VideoflowError) throw error;
    const missing = error instanceof Deno.errors.NotFound;
    throw new ConfigError(
      missing ? `flow file ${path} does not exist` : `flow file ${path} cannot be read: ${describe(error)}`,
      missing
        ? Deno.build.standalone
          ? `this compiled vf runs the flows it was built with, by their paths in the project: rebuild it ` +
            `with \`deno task compile ${path}\``
          : "check the path, relative to the current directory"
        : "make the file readable by this process (permissions, --allow-read)",
      { path },
    );
  }
  let namespace: Record<string, unknown>;
  try {
    namespace = await importFlowModule(url.href, path);
  } catch (error) {
    if (error instanceof VideoflowError) throw error;
    const where = locationIn(error, url.href);
    throw new ConfigError(
      `flow file ${path} failed while loading${where ? ` (${where})` : ""}: ${describe(error)}`,
      loadRemedy(describe(error)),
      { path },
    );
  }
  const flow = namespace.default;
  if (flow === Flow) {
    throw new ConfigError(
      `flow file ${path} exports the Flow class itself as its default export, not a flow`,
      "export an instance: `export default new Flow([...consumers], { flowType: ... })`",
      { path },
    );
  }
  if (!(flow instanceof Flow)) {
    throw new ConfigError(
      `flow file ${path} does not export a Flow as its default export`,
      "end the file with `export default new Flow([...consumers], { flowType: ... })`",
      { path, default_export: flow === undefined ? "none" : typeof flow },
    );
  }
  return { flow, url: url.href, modules: new ModuleIndex([{ url: url.href, namespace }]) };
}
