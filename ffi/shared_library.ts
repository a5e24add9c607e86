/**
 * Finding and loading a shared library through koffi: an override path from the environment first, else
 * the standard names and paths in order. What could not be loaded is an {@link Unknown} naming every
 * place tried and why, never a throw.
 *
 * @module
 */

import koffi, { type LibraryHandle } from "koffi";
import { known, type Observation, unknown } from "../src/backends/outcomes.ts";

/** A loaded shared library and the path it was loaded from. */
export interface SharedLibrary {
  /** The name or path the library was loaded by (what `dlopen` was given). */
  readonly path: string;
  /** koffi's handle, to declare the library's symbols on. */
  readonly handle: LibraryHandle;
}

/** Where to look for a library: the environment variable that overrides, then the candidates in order. */
export interface LibrarySearch {
  /** The environment variable naming the one path to load; when set, nothing else is tried. */
  readonly overrideVariable: string;
  /** The names (searched by the dynamic loader) and absolute paths to try, in order. */
  readonly candidates: readonly string[];
}

/** The places {@link openSharedLibrary} tries for `search` under `env`: the override alone, else the candidates. */
export function libraryCandidates(
  search: LibrarySearch,
  env: (name: string) => string | undefined,
): string[] {
  const override = env(search.overrideVariable);
  return override !== undefined && override !== "" ? [override] : [...search.candidates];
}

/**
 * The first of `search`'s places that loads, or `unknown("missing", ...)` naming each place tried and
 * the loader's reason. Reading the environment needs `--allow-env` for the override variable; without
 * it the override is read as unset.
 */
export function openSharedLibrary(
  search: LibrarySearch,
  env: (name: string) => string | undefined = readEnv,
): Observation<SharedLibrary> {
  const failures: string[] = [];
  for (const path of libraryCandidates(search, env)) {
    try {
      return known(Object.freeze({ path, handle: koffi.load(path) }));
    } catch (error) {
      failures.push(`${path}: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
  return unknown("missing", undefined, `no shared library could be loaded (${failures.join("; ")})`);
}

function readEnv(name: string): string | undefined {
  try {
    return Deno.env.get(name);
  } catch {
    return undefined;
  }
}
