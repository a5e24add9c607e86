/**
 * A node that reaches past the Deno permissions it declared. Its worker runs with exactly those
 * permissions, so Deno refuses the operation with `Deno.errors.NotCapable`, whose own advice ("run again
 * with the --allow-read flag") is wrong for a sandboxed node. {@link undeclaredPermission} turns that
 * refusal into an {@link UndeclaredPermission} that names the node, the permission and what it was for,
 * with the fix: declare it. The task loop applies it to whatever a node method throws (`nodeFailure`).
 *
 * @module
 */

import { EXIT_USER, NodeContractError, WorkerFatal } from "./errors.ts";

/**
 * The node used a permission it does not declare. A contract violation of the node (code
 * `VF_NODE_CONTRACT`, exit 2, so no restart is tried) raised while messages flow, so it is a runtime error
 * whose disposition is worker_fatal: its input goes back to the broker and the worker stops, since every
 * other input would meet the same refusal.
 */
export class UndeclaredPermission extends WorkerFatal {
  static override readonly code: string = NodeContractError.code;
  static override readonly exitCode: number = EXIT_USER;
}

const REFUSAL = /^Requires (\w+) access(?: to "([^"]*)")?/;
/** Deno's refusal as a worker's uncaught error reports it: `Uncaught (in promise) NotCapable: Requires ...`. */
const UNCAUGHT_REFUSAL = /\bNotCapable: (Requires .*)$/s;

/**
 * `error` as an {@link UndeclaredPermission} of `node` when it is Deno's refusal of a permission
 * (`Deno.errors.NotCapable`); `null` for anything else.
 */
export function undeclaredPermission(error: unknown, node: string): UndeclaredPermission | null {
  // A refused remote import reaches the node as the module loader's TypeError, not as NotCapable.
  const refusedImport = error instanceof Error && REFUSAL.exec(error.message)?.[1] === "import";
  if (!(error instanceof Deno.errors.NotCapable) && !refusedImport) return null;
  return undeclaredFrom((error as Error).message, node, error);
}

/**
 * The {@link UndeclaredPermission} of `node` in the message of an error its worker did not catch (code
 * at the top level of the node's module, which every replica of every node whose class it holds runs
 * when it loads); `null` when the message is not Deno's refusal of a permission.
 */
export function undeclaredPermissionOnLoad(message: string, node: string): UndeclaredPermission | null {
  const refusal = message.match(UNCAUGHT_REFUSAL)?.[1];
  if (refusal === undefined) return null;
  return undeclaredFrom(
    refusal,
    node,
    message,
    " at the top level of its module (code that every node whose class the module holds runs as it loads)",
  );
}

/** The form of an operation that names its target, by permission kind. */
const NAMED_USE: Readonly<Record<string, string>> = {
  env: 'Deno.env.get("NAME")',
  run: 'new Deno.Command("program") (a process the node started ends with it; it cannot signal others)',
  sys: "the Deno.* call that needs one named sys permission",
};

/** How a node gets the permission Deno refused: a declaration, where one can grant it. */
function remedyFor(permission: string | null, target: string | null): string {
  if (permission === "import") {
    return "a node may not import remote modules while it runs: import them statically at the top of its " +
      "module, which loads before the sandbox applies";
  }
  if (permission !== null && target === null) {
    const named = NAMED_USE[permission] ?? "the operation on a named target";
    return `a node is granted ${permission} permission only for named targets, and this operation needs it ` +
      `for all of them (Deno.env.toObject(), Deno.kill() ...): use ${named} instead, and declare that target ` +
      `(static permissions = { ${permission}: ["..."] })`;
  }
  const declaration = permission === null
    ? "static permissions = { read: [...], net: [...] }"
    : `static permissions = { ${permission}: [${JSON.stringify(target)}] }`;
  return `declare it on the node's class (${declaration}) or in its permissions() override; ` +
    "`vf explain` shows what every node is granted";
}

/** The {@link UndeclaredPermission} of `node` for Deno's `refusal` text, `where` saying when it happened. */
function undeclaredFrom(refusal: string, node: string, cause: unknown, where = ""): UndeclaredPermission {
  const match = refusal.match(REFUSAL);
  const permission = match?.[1] ?? null;
  const target = match?.[2] ?? null;
  const what = permission === null
    ? "a permission"
    : `${permission} permission${target === null ? "" : ` for ${JSON.stringify(target)}`}`;
  const failure = new UndeclaredPermission(
    `node ${node} needs ${what}${where}, which it does not declare${match === null ? ` (${refusal})` : ""}`,
    remedyFor(permission, target),
    { node, permission, target },
  );
  (failure as { cause?: unknown }).cause = cause;
  return failure;
}
