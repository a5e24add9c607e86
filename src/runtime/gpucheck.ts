/**
 * Worker-side verification of a GPU node's grant (spec runtime.gpucheck; RUN-043, RUN-044), decided
 * before the node is opened: what the node asks for against what the worker can be shown to have.
 *
 * This build reads no device: the NVML binding DESIGN.md plans (`ffi/`, `nvml/`) does not exist yet, and
 * the worker refuses a launcher-recorded grant (`VF_GPU_GRANT_JSON`). So what a worker was granted is
 * Unknown, which is neither zero devices nor a whole grant: a node whose fallback is `none` (a hard
 * requirement) is refused with {@link ResourceUnavailable} naming why, as is a node that requires peer
 * access between its devices; a node whose fallback is `cpu` (the default) opens, told that its grant
 * could not be verified.
 *
 * @example
 * ```ts
 * const report = verifyGrant(
 *   { node: "detect", requested: 1, fallback: "cpu", requiresPeerAccess: false },
 *   observeGrantedDevices(),
 * );
 * report.execution; // "unknown": the grant could not be read, the node opens
 * ```
 *
 * @module
 */

import type { DeviceIdentity } from "../backends/allocation.ts";
import { type Clock, systemClock } from "../backends/clock.ts";
import { type Observation, unknown } from "../backends/outcomes.ts";
import { LASTING_FAILURE_KEY, ResourceUnavailable } from "../core/errors.ts";
import { DeviceType, GpuFallback, type Node, ProcessorNode } from "../core/node.ts";

/** Where a GPU node runs after its grant was checked. */
export const GpuExecution = {
  /** Every requested device was delivered. */
  gpu: "gpu",
  /** The grant was short and the node's declared CPU fallback is taken. */
  cpu: "cpu",
  /** The grant could not be read: whether the node has its devices is not known. */
  unknown: "unknown",
} as const;
/** One of {@link GpuExecution}. */
export type GpuExecution = typeof GpuExecution[keyof typeof GpuExecution];

/** What a GPU node declares about its grant. */
export interface GrantDemand {
  /** The node's name, for messages. */
  readonly node: string;
  /** Whole devices the node asks for (its `gpuCount`). */
  readonly requested: number;
  /** `cpu`: a short or unverifiable grant still opens; `none`: it refuses to open (RUN-044). */
  readonly fallback: GpuFallback;
  /** Whether the node's devices must be verified peers (RUN-043). */
  readonly requiresPeerAccess: boolean;
}

/** What the worker found for one GPU node's grant. */
export interface GrantReport {
  /** Whole devices the node asked for. */
  readonly requested: number;
  /** The devices the worker can use, or Unknown when they could not be read. */
  readonly delivered: Observation<readonly DeviceIdentity[]>;
  /** Where the node runs: `gpu`, `cpu` (the declared fallback) or `unknown`. */
  readonly execution: GpuExecution;
  /** Every shortfall, in words; empty when the grant is whole. */
  readonly problems: readonly string[];
}

/**
 * The devices this worker can use. Always Unknown in this build (reason `unsupported`): no NVML binding
 * reads them, and a count of integers in `CUDA_VISIBLE_DEVICES` is not a reading.
 */
export function observeGrantedDevices(clock: Clock = systemClock): Observation<readonly DeviceIdentity[]> {
  return unknown(
    "unsupported",
    clock,
    "this build has no NVML binding to read the devices granted to a worker",
  );
}

function shortfall(demand: GrantDemand, delivered: Observation<readonly DeviceIdentity[]>): string | null {
  if (delivered.kind === "unknown") {
    return `its grant of ${demand.requested} GPU(s) cannot be verified: ${delivered.detail}`;
  }
  const count = delivered.value.length;
  return count >= demand.requested
    ? null
    : `it was granted ${count} of the ${demand.requested} GPU(s) it asks for`;
}

/**
 * The decision before a GPU node opens. Returns the report when the node may open: a whole grant, or a
 * short or unverifiable one under `fallback: "cpu"` (the report names the shortfall). Throws
 * {@link ResourceUnavailable} naming the node and why when `fallback` is `none` and the grant is short,
 * empty or unverifiable, and when peer access is required between devices this build cannot verify.
 */
export function verifyGrant(
  demand: GrantDemand,
  delivered: Observation<readonly DeviceIdentity[]>,
): GrantReport {
  const problem = shortfall(demand, delivered);
  // The same host refuses the same grant again: no restart mends it.
  const context = {
    node: demand.node,
    requested: demand.requested,
    fallback: demand.fallback,
    [LASTING_FAILURE_KEY]: true,
  };
  if (problem !== null && demand.fallback === GpuFallback.none) {
    throw new ResourceUnavailable(
      `node ${demand.node} refuses to open: ${problem} (gpuFallback "none")`,
      'run it where its GPUs are granted and verifiable, or declare gpuFallback "cpu" to let it open ' +
        "without them",
      context,
    );
  }
  if (demand.requiresPeerAccess && demand.requested > 1) {
    throw new ResourceUnavailable(
      `node ${demand.node} refuses to open: peer access between its ${demand.requested} GPUs cannot be ` +
        "verified (this build reads no device topology)",
      "remove requiresPeerAccess, or run it where the topology is verified",
      context,
    );
  }
  const execution = problem === null
    ? GpuExecution.gpu
    : delivered.kind === "unknown"
    ? GpuExecution.unknown
    : GpuExecution.cpu;
  return { requested: demand.requested, delivered, execution, problems: problem === null ? [] : [problem] };
}

/**
 * The worker's entry point: `null` for a node that does not run on GPU, else {@link verifyGrant} of the
 * node's declarations against {@link observeGrantedDevices}.
 */
export function verifyNodeGrant(node: Node, clock: Clock = systemClock): GrantReport | null {
  if (!(node instanceof ProcessorNode) || node.deviceType !== DeviceType.gpu) return null;
  return verifyGrant(
    {
      node: node.name,
      requested: node.gpuCount,
      fallback: node.gpuFallback,
      requiresPeerAccess: node.requiresPeerAccess,
    },
    observeGrantedDevices(clock),
  );
}
