/**
 * Loading a user's flow file: a TypeScript module whose default export is a `Flow`. Every way a flow
 * file can fail to load becomes one typed error with a remedy, never a stack trace.
 *
 * @module
 */

import { ConfigError, VideoflowError } from "../core/errors.ts";
import { Flow } from "../core/flow.ts";
import { ModuleIndex } from "../core/node_class.ts";

/**
 * A loaded flow file: the flow, the module's URL, and the module index its node classes resolve against
 * (the registered built-in modules, then the flow file's own exports).
 */
export interface LoadedFlow {
  readonly flow: Flow;
  readonly url: string;
  readonly modules: ModuleIndex;
}

function fileUrl(path: string): URL {
  return new URL(path, `file://${Deno.cwd()}/`);
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

/** How Deno says a bare import has no entry in the import map it runs with. */
const UNMAPPED_IMPORT = /not a dependency and not in import map|Relative import path .* not prefixed/;

/**
 * Imports `path` (relative to the working directory) and returns its default-exported `Flow`.
 * Throws {@link ConfigError} when the file does not exist, cannot be loaded, throws while loading, or
 * does not export a Flow; a videoflow error the file itself throws keeps its own class and exit code.
 */
export async function loadFlow(path: string): Promise<LoadedFlow> {
  const url = fileUrl(path);
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
        ? "check the path, relative to the current directory"
        : "make the file readable by this process (permissions, --allow-read)",
      { path },
    );
  }
  let namespace: Record<string, unknown>;
  try {
    namespace = await import(url.href);
  } catch (error) {
    if (error instanceof VideoflowError) throw error;
    const where = locationIn(error, url.href);
    throw new ConfigError(
      `flow file ${path} failed while loading${where ? ` (${where})` : ""}: ${describe(error)}`,
      UNMAPPED_IMPORT.test(describe(error))
        ? "map that name in your project's deno.json and run deno with --config pointing at it (without it " +
          "Deno reads the configuration beside its main module, not beside the flow file)"
        : "fix the error in the flow file, then run the command again",
      { path },
    );
  }
  const flow = namespace.default;
  if (!(flow instanceof Flow)) {
    throw new ConfigError(
      `flow file ${path} does not export a Flow as its default export`,
      "end the file with `export default new Flow([...consumers], { flowType: ... })`",
      { path, default_export: flow === undefined ? "none" : typeof flow },
    );
  }
  return { flow, url: url.href, modules: new ModuleIndex([{ url: url.href, namespace }]) };
}
