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

/**
 * `error` as an {@link UndeclaredPermission} of `node` when it is Deno's refusal of a permission
 * (`Deno.errors.NotCapable`); `null` for anything else.
 */
export function undeclaredPermission(error: unknown, node: string): UndeclaredPermission | null {
  if (!(error instanceof Deno.errors.NotCapable)) return null;
  const match = error.message.match(REFUSAL);
  const permission = match?.[1] ?? null;
  const target = match?.[2] ?? null;
  const what = permission === null
    ? "a permission"
    : `${permission} permission${target === null ? "" : ` for ${JSON.stringify(target)}`}`;
  const declaration = permission === null
    ? "static permissions = { read: [...], net: [...] }"
    : `static permissions = { ${permission}: [${target === null ? "" : JSON.stringify(target)}] }`;
  const failure = new UndeclaredPermission(
    `node ${node} needs ${what}, which it does not declare${match === null ? ` (${error.message})` : ""}`,
    `declare it on the node's class (${declaration}) or in its permissions() override; ` +
      "`vf explain` shows what every node is granted",
    { node, permission, target },
  );
  (failure as { cause?: unknown }).cause = error;
  return failure;
}
