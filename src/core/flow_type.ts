/**
 * The flow type (spec core.flow, FlowType): how a flow's edges retain messages, and the check every reader
 * of a flow type name (a Flow's options, a policy preset) applies to it.
 *
 * @module
 */

import { ConfigError } from "./errors.ts";

/** How a flow's edges retain messages: freshest-wins (`realtime`) or complete, at-least-once (`batch`). */
export const FlowType = { realtime: "realtime", batch: "batch" } as const;
/** How a flow's edges retain messages. */
export type FlowType = typeof FlowType[keyof typeof FlowType];
/** Every flow type. */
export const FLOW_TYPES: readonly FlowType[] = Object.values(FlowType);

/** `name` as a {@link FlowType}; throws {@link ConfigError} naming the flow types for any other value. */
export function checkFlowType(name: unknown): FlowType {
  if ((FLOW_TYPES as readonly unknown[]).includes(name)) return name as FlowType;
  throw new ConfigError(
    `unknown flow type ${JSON.stringify(name) ?? String(name)}`,
    `use one of ${FLOW_TYPES.map((t) => JSON.stringify(t)).join(", ")}`,
    { flow_type: name },
  );
}
