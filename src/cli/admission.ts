/**
 * The local engine's admission of a flow, before anything starts: what the flow's nodes declare that the
 * engine cannot honour (a fused execution group, RUN-035; a dynamic-batching contract, RUN-036) is refused
 * with `VF_INCOMPATIBLE_PROFILE`, never run as ordinary nodes.
 *
 * @module
 */

import { executionRefusals, FlowRequirements, localExecutionCapabilities } from "../backends/capabilities.ts";
import { batchingPolicies, executionGroups } from "../core/compiler.ts";
import { type Diagnostic, IncompatibleProfile } from "../core/errors.ts";
import type { Flow } from "../core/flow.ts";

/** One error diagnostic per declaration of `flow` the local engine refuses; none when it admits them all. */
export function localAdmissionRefusals(flow: Flow): readonly Diagnostic[] {
  const requirements = new FlowRequirements({
    executionGroups: executionGroups(flow),
    batching: Object.fromEntries(
      Object.entries(batchingPolicies(flow)).map(([node, policy]) => [node, { ...policy }]),
    ),
  });
  return executionRefusals(requirements, localExecutionCapabilities());
}

/** Returns when the local engine admits `flow`; throws {@link IncompatibleProfile} listing every refusal. */
export function admitLocally(flow: Flow): void {
  const refusals = localAdmissionRefusals(flow);
  if (refusals.length === 0) return;
  throw new IncompatibleProfile(
    `the local engine cannot run ${refusals.length} declaration(s) of flow ${flow.flowId}`,
    "fix every declaration listed; nothing was started",
    refusals,
  );
}
