/**
 * The Deno configuration this process runs under, as far as it can be known from inside: the flags it was
 * started with (read from `/proc/self/cmdline`, so on Linux only) and the configuration file Deno found or
 * was given. A process replica is started with the same module-resolution settings, so a flow that imports
 * through its project's import map loads in a subprocess exactly as it loaded in vf; and a run under worker
 * isolation is refused up front, with a remedy, when Deno would refuse its sandboxed Workers (Deno ends the
 * whole process, with no error to catch, when `--unstable-worker-options` is missing).
 *
 * @module
 */

import { dirname, isAbsolute, join } from "node:path";
import { fileURLToPath } from "node:url";
import { V8_HEAP_FLAGS } from "../runtime/v8_heap_flags.ts";

/** The configuration file names Deno looks for in each directory, in its order. */
const CONFIG_NAMES = ["deno.json", "deno.jsonc"] as const;

/** Flags of `deno run` that take a value and change how modules resolve. */
const RESOLUTION_FLAGS_WITH_VALUE = ["--config", "-c", "--import-map"] as const;
/** Flags of `deno run` that change how modules resolve, with an optional `=value`. */
const RESOLUTION_FLAGS = [
  "--no-config",
  "--lock",
  "--no-lock",
  "--frozen",
  "--node-modules-dir",
  "--vendor",
  "--cached-only",
] as const;

/** The flags this process was started with, before its main module; `null` where they cannot be read. */
export function launchFlags(cmdline: string | null = readCmdline()): readonly string[] | null {
  if (cmdline === null) return null;
  const argv = cmdline.split("\0").filter((arg) => arg !== "");
  const main = Deno.mainModule;
  const at = argv.findIndex((arg, index) => index > 0 && namesModule(arg, main));
  return at < 0 ? null : argv.slice(1, at);
}

function readCmdline(): string | null {
  try {
    return Deno.readTextFileSync("/proc/self/cmdline");
  } catch {
    return null;
  }
}

/**
 * Whether command-line argument `arg` (a path relative to the working directory, a URL, or a `jsr:`
 * package, which Deno runs from `https://jsr.io/`) names the module at `url`.
 */
export function namesModule(arg: string, url: string): boolean {
  if (arg === url) return true;
  const jsr = /^jsr:\/?(@[^/@]+\/[^/@]+)/.exec(arg);
  if (jsr !== null) return url.startsWith(`https://jsr.io/${jsr[1]}/`);
  if (!url.startsWith("file:") || arg.startsWith("-")) return false;
  try {
    return (isAbsolute(arg) ? arg : join(Deno.cwd(), arg)) === fileURLToPath(url);
  } catch {
    return false;
  }
}

/** The module-resolution flags among `flags`, each as one `--flag` or `--flag=value` argument. */
export function resolutionFlags(flags: readonly string[]): string[] {
  const kept: string[] = [];
  for (let i = 0; i < flags.length; i++) {
    const flag = flags[i];
    const name = RESOLUTION_FLAGS_WITH_VALUE.find((name) => flag === name || flag.startsWith(`${name}=`));
    if (name !== undefined) {
      const value = flag === name ? flags[++i] : flag.slice(name.length + 1);
      if (value === undefined) continue;
      const path = isAbsolute(value) || /^[a-z][a-z0-9+.-]*:/i.test(value) ? value : join(Deno.cwd(), value);
      kept.push(`${name === "-c" ? "--config" : name}=${path}`);
    } else if (RESOLUTION_FLAGS.some((name) => flag === name || flag.startsWith(`${name}=`))) {
      kept.push(flag);
    }
  }
  return kept;
}

/**
 * The configuration file Deno uses for this process when none is named on its command line: the first
 * `deno.json` or `deno.jsonc` from the main module's directory up (from the working directory up when the
 * main module is not a local file); `null` when there is none.
 */
export function discoveredConfig(mainModule: string = Deno.mainModule): string | null {
  let dir = mainModule.startsWith("file:") ? dirname(fileURLToPath(mainModule)) : Deno.cwd();
  for (;;) {
    for (const name of CONFIG_NAMES) {
      const path = join(dir, name);
      if (isFile(path)) return path;
    }
    const parent = dirname(dir);
    if (parent === dir) return null;
    dir = parent;
  }
}

function isFile(path: string): boolean {
  try {
    return Deno.statSync(path).isFile;
  } catch {
    return false;
  }
}

/**
 * The arguments that give a `deno run` subprocess this process's module resolution: its own resolution
 * flags when it was given a configuration file (or none), else the file Deno found for it, named
 * explicitly (a replica's main module is a `data:` URL, from which Deno would search elsewhere), or
 * `--no-config` when Deno found none.
 */
export function subprocessResolutionArgs(flags: readonly string[] | null = launchFlags()): string[] {
  const given = resolutionFlags(flags ?? []);
  if (given.some((flag) => flag.startsWith("--config=") || flag === "--no-config")) return given;
  const found = discoveredConfig();
  return [found === null ? "--no-config" : `--config=${found}`, ...given];
}

/** The V8 flags every videoflow process runs under (see their own module). */
export { V8_HEAP_FLAGS };

/**
 * The `--v8-flags` arguments that start a `deno run` subprocess replica under the V8 flags this process
 * runs under, as a Worker replica in it would: {@link V8_HEAP_FLAGS} first, then this process's
 * `DENO_V8_FLAGS` (`envFlags`), then the `--v8-flags` on its own command line, in the order Deno applies
 * them, so a flag the user gave overrides the project's for the same setting.
 */
export function subprocessV8Args(
  flags: readonly string[] | null = launchFlags(),
  envFlags: string | undefined = Deno.env.get("DENO_V8_FLAGS"),
): string[] {
  const given = (flags ?? []).filter((flag) => flag.startsWith("--v8-flags="));
  const fromEnv = envFlags === undefined || envFlags === "" ? [] : [`--v8-flags=${envFlags}`];
  return [`--v8-flags=${V8_HEAP_FLAGS.join(",")}`, ...fromEnv, ...given];
}

/**
 * Whether Deno lets this process give a Worker its own permissions: `--unstable-worker-options` on its
 * command line, or `"unstable": ["worker-options"]` in its configuration file or one above it (where a
 * workspace root keeps it). `null` when that cannot be told: the command line is unreadable, or a
 * configuration file on the way is not plain JSON (comments are allowed).
 */
export function workerOptionsEnabled(flags: readonly string[] | null = launchFlags()): boolean | null {
  if (flags === null) return null;
  if (flags.includes("--unstable-worker-options")) return true;
  if (flags.includes("--no-config")) return false;
  const named = resolutionFlags(flags).find((flag) => flag.startsWith("--config="));
  const config = named === undefined ? discoveredConfig() : named.slice("--config=".length);
  if (config === null) return false;
  let unreadable = false;
  for (const path of [config, ...configsAbove(dirname(config))]) {
    const features = unstableFeatures(path);
    if (features === null) unreadable = true;
    else if (features.includes("worker-options")) return true;
  }
  return unreadable ? null : false;
}

/** The configuration files in the directories above `dir`, nearest first. */
function configsAbove(dir: string): string[] {
  const found: string[] = [];
  for (let parent = dirname(dir); parent !== dir; dir = parent, parent = dirname(parent)) {
    found.push(...CONFIG_NAMES.map((name) => join(parent, name)).filter(isFile));
  }
  return found;
}

/** The `unstable` features the configuration file at `path` enables; `null` when it cannot be read. */
function unstableFeatures(path: string): string[] | null {
  try {
    const config = JSON.parse(withoutComments(Deno.readTextFileSync(path)));
    const unstable = config?.unstable;
    return Array.isArray(unstable) ? unstable.filter((feature) => typeof feature === "string") : [];
  } catch {
    return null;
  }
}

/** JSONC text without its comments (strings untouched). */
export function withoutComments(text: string): string {
  let out = "";
  for (let i = 0; i < text.length; i++) {
    const char = text[i];
    if (char === '"') {
      const start = i;
      for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === "\\") i++;
      out += text.slice(start, i + 1);
    } else if (char === "/" && text[i + 1] === "/") {
      while (i < text.length && text[i] !== "\n") i++;
      out += "\n";
    } else if (char === "/" && text[i + 1] === "*") {
      const end = text.indexOf("*/", i + 2);
      i = end < 0 ? text.length : end + 1;
    } else {
      out += char;
    }
  }
  return out;
}
