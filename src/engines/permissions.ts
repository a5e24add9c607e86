/**
 * The Deno permissions a node replica runs with: exactly what its node declares (the compiled document's
 * `permissions` side document), nothing by default. One declaration, two forms: the `deno.permissions`
 * option of a Deno Worker, and the `--allow-*` flags of a `deno run` subprocess.
 *
 * @module
 */

import { ConfigError } from "../core/errors.ts";
import { PERMISSION_KINDS, type PermissionKind } from "../core/node.ts";

/** A node's granted permissions: only the kinds it was given, each a non-empty list. */
export type GrantedPermissions = Readonly<Partial<Record<PermissionKind, readonly string[]>>>;

/** The `deno.permissions` option of a Worker: every kind listed, `false` for what was not granted. */
export type WorkerPermissions = Record<PermissionKind | "import", false | string[]>;

/** What a node declared, with `extra` added (an engine's own needs, such as the broker's address). */
export function mergePermissions(
  granted: GrantedPermissions,
  extra: GrantedPermissions = {},
): GrantedPermissions {
  const merged: Partial<Record<PermissionKind, readonly string[]>> = {};
  for (const kind of PERMISSION_KINDS) {
    const list = [...new Set([...(granted[kind] ?? []), ...(extra[kind] ?? [])])];
    if (list.length > 0) merged[kind] = list;
  }
  return merged;
}

/**
 * The Worker form: each granted kind as its list, every other kind (and remote `import`) `false`, so the
 * worker can do nothing it did not declare. Modules are loaded by the worker's bootstrap before the sandbox
 * applies, so loading needs no permission.
 */
export function workerPermissions(granted: GrantedPermissions): WorkerPermissions {
  const out = { import: false } as WorkerPermissions;
  for (const kind of PERMISSION_KINDS) {
    const list = granted[kind];
    out[kind] = list === undefined || list.length === 0 ? false : [...list];
  }
  return out;
}

/** The subprocess form: one `--allow-<kind>=<list>` flag per granted kind, in a stable order. */
export function permissionFlags(granted: GrantedPermissions): string[] {
  const flags: string[] = [];
  for (const kind of PERMISSION_KINDS) {
    const list = granted[kind];
    if (list !== undefined && list.length > 0) flags.push(`--allow-${kind}=${list.join(",")}`);
  }
  return flags;
}

/**
 * Refuses, with a {@link ConfigError}, a granted entry that {@link permissionFlags} cannot express: Deno
 * splits an `--allow-<kind>=` list at every comma and has no escape for one, so a path holding a comma
 * would become two paths, neither of them the one declared.
 */
export function checkFlagPermissions(node: string, granted: GrantedPermissions): void {
  for (const kind of PERMISSION_KINDS) {
    const entry = granted[kind]?.find((value) => value.includes(","));
    if (entry !== undefined) {
      throw new ConfigError(
        `node ${node} declares ${kind} permission for ${JSON.stringify(entry)}, which holds a comma: ` +
          `a subprocess replica's --allow-${kind} flag cannot name it`,
        "rename the path without a comma, or run the flow with --isolation worker",
        { node, permission: kind, entry },
      );
    }
  }
}
