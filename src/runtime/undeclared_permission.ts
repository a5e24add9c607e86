/**
 * A node that reaches past the Deno permissions it declared. Its worker runs with exactly those
 * permissions, so Deno refuses the operation with `Deno.errors.NotCapable`, whose own advice ("run again
 * with the --allow-read flag") is wrong for a sandboxed node. {@link guardPermissions} turns that refusal,
 * wherever the node's code meets it, into an {@link UndeclaredPermission} that names the node, the
 * permission and what it was for, with the fix: declare it.
 *
 * ```ts
 * const node = await rebuildNode(config.nodeClass, config.nodeParams, config.nodeKind);
 * guardPermissions(node); // a read of an undeclared file now fails as VF_NODE_CONTRACT, exit 2
 * ```
 *
 * @module
 */

import { EXIT_USER, NodeContractError, WorkerFatal } from "../core/errors.ts";
import type { Node } from "../core/node.ts";

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

const GUARDED_METHODS = ["open", "next", "seek", "process", "consume", "close"] as const;

/**
 * Makes every lifecycle method of `node` (open, next, seek, process, consume, close, where it has them)
 * reject with {@link UndeclaredPermission} where Deno refused it a permission; anything else it throws
 * passes through unchanged. The methods become async, which the task loop awaits anyway.
 */
export function guardPermissions(node: Node): void {
  const methods = node as unknown as Record<string, unknown>;
  for (const name of GUARDED_METHODS) {
    const method = methods[name];
    if (typeof method !== "function") continue;
    methods[name] = async (...args: unknown[]) => {
      try {
        return await method.apply(node, args);
      } catch (error) {
        throw undeclaredPermission(error, node.name) ?? error;
      }
    };
  }
}
