/**
 * The Deno permissions a node replica runs with: exactly what its node declares (the compiled document's
 * `permissions` side document), nothing by default, plus what the replica's own runtime needs. One
 * declaration, two forms: the `deno.permissions` option of a Deno Worker, and the `--allow-*` flags of a
 * `deno run` process, which {@link replicaProcessFlags} builds alike for a process replica of the local
 * engine and for a Kubernetes pod's container.
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

/** What a replica process's own runtime needs, besides its node's declaration and the engine's extras. */
export interface ReplicaProcessNeeds {
  /** The names of its settings (`VF_*` ...), which it may read (and then hides from its node). */
  readonly settings: readonly string[];
  /** Where it writes its termination reason (`VF_TERMINATION_LOG`). */
  readonly terminationLog: string;
  /** The specs document it reads long params from (`VF_FLOW_SPECS_PATH`), when it has one. */
  readonly specsPath?: string;
}

/**
 * The `--allow-*` flags of a replica process: `--allow-env` for its settings and its node's declared
 * variables first, then {@link permissionFlags} of `granted` (the node's declaration merged with the
 * engine's extras: the servers it reaches, a listen address) with write permission for its termination log
 * and read permission for its specs document. Nothing else: no code loading, which its bootstrap does
 * before the sandbox applies.
 */
export function replicaProcessFlags(granted: GrantedPermissions, needs: ReplicaProcessNeeds): string[] {
  const { env: declaredEnv = [], ...rest } = mergePermissions(granted, {
    write: [needs.terminationLog],
    ...(needs.specsPath === undefined ? {} : { read: [needs.specsPath] }),
  });
  return [
    `--allow-env=${[...new Set([...needs.settings, ...declaredEnv])].join(",")}`,
    ...permissionFlags(rest),
  ];
}

/** A server's default port by URL scheme, for a URL that names none. */
const DEFAULT_PORTS: Readonly<Record<string, string>> = {
  "nats:": "4222",
  "tls:": "4222",
  "redis:": "6379",
  "rediss:": "6379",
};

/**
 * The `host:port` net entries a client of `urls` connects to: one per URL of a comma-separated list (a
 * NATS cluster's), the scheme's default port where a URL names none.
 */
export function serverAddresses(urls: string): string[] {
  return urls.split(",").map((url) => url.trim()).filter((url) => url !== "").map((url) => {
    const parsed = new URL(url);
    return `${parsed.hostname}:${parsed.port === "" ? DEFAULT_PORTS[parsed.protocol] ?? "" : parsed.port}`;
  });
}

/**
 * Refuses, with a {@link ConfigError}, a granted entry that {@link permissionFlags} cannot express: Deno
 * splits an `--allow-<kind>=` list at every comma and has no escape for one, so a path holding a comma
 * would become two paths, neither of them the one declared.
 */
export function checkFlagPermissions(
  node: string,
  granted: GrantedPermissions,
  remedy = "rename the path without a comma, or run the flow with --isolation worker",
): void {
  for (const kind of PERMISSION_KINDS) {
    const entry = granted[kind]?.find((value) => value.includes(","));
    if (entry !== undefined) {
      throw new ConfigError(
        `node ${node} declares ${kind} permission for ${JSON.stringify(entry)}, which holds a comma: ` +
          `a subprocess replica's --allow-${kind} flag cannot name it`,
        remedy,
        { node, permission: kind, entry },
      );
    }
  }
}
