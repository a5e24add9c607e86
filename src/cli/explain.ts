/**
 * `vf explain FLOW.ts [--dot] [--flow-type realtime|batch]`: what a flow will do when it runs, read off its
 * compiled specs: the graph, each node's replicas and partitioning, its join and delivery policies as
 * resolved for the flow type (the flow's own, or the one `--flow-type` gives, as `run-local` takes it),
 * the Deno permissions its workers get, and what the flow type implies for every edge. `--dot` prints the
 * graph for Graphviz instead.
 *
 * @module
 */

import { compileFlow, nodePermissions, type NodeSpec } from "../core/compiler.ts";
import { DeliveryPolicy } from "../core/delivery_policy.ts";
import { scalingCandidateOf, Workload, workloadOf } from "../deploy/manifests.ts";
import { scalingRejections } from "../runtime/scaling.ts";
import { FlowType } from "../core/flow.ts";
import { checkFlowType } from "../core/flow_type.ts";
import { JoinPolicy } from "../core/join_policy.ts";
import type { PermissionKind } from "../core/node.ts";
import { LOCAL_BATCH_MAX_MSGS } from "../engines/local.ts";
import { DEFAULT_BATCH_MAX_MSGS } from "../messaging/topology.ts";
import { parseWorkerSettings } from "../runtime/worker_config.ts";
import { loadFlow } from "./load_flow.ts";
import type { CommandOutput } from "./command_output.ts";

type Permissions = Record<string, Partial<Record<PermissionKind, string[]>>>;

/** What each flow type implies for every edge (WIRE.md "Streams and consumers"). */
const FLOW_TYPE_MEANING: Record<FlowType, string> = {
  realtime: "realtime: the freshest item wins. Each node's stream keeps its newest item (limits retention, " +
    "buffer 1, discard old), an item is delivered at most once (best effort), and a join gives up on a " +
    "missing member after 10 s.",
  batch: "batch: nothing is lost. Each stream keeps an item until every consuming node acked it (interest " +
    `retention, at most ${LOCAL_BATCH_MAX_MSGS} per stream under run-local and ${DEFAULT_BATCH_MAX_MSGS} on ` +
    "JetStream; a full stream refuses and the publisher backs off), a failed item is retried and then " +
    "dead-lettered, and a join waits for every member (a parent that runs ahead waits; no group is evicted " +
    "while its parents run; one still incomplete when a parent it lacks has ended can never complete: it is " +
    'dropped as join_evicted, or dead-lettered under missing "error").',
};

function plural(n: number, one: string, many = `${one}s`): string {
  return `${n} ${n === 1 ? one : many}`;
}

function replicasLine(spec: NodeSpec): string {
  const replicas = plural(spec.nbTasks, "replica");
  if (spec.nbTasks === 1) return replicas;
  return spec.partitionBy === null
    ? `${replicas} competing for each item`
    : `${replicas} partitioned by ${spec.partitionBy}`;
}

/** What a join does with an incomplete group once its timeout passed, by `missing` policy. */
const MISSING_TEXT: Record<string, string> = {
  drop: "drops the incomplete group (join_evicted)",
  wait: "keeps waiting",
  error: "fails the incomplete group (retried, then dead-lettered)",
};

function joinLine(spec: NodeSpec, flowType: FlowType): string | null {
  if (spec.parents.length < 2) return null;
  const declared = spec.joinPolicy !== null;
  const policy = declared ? JoinPolicy.fromDict(spec.joinPolicy) : JoinPolicy.defaultFor(flowType);
  const how = policy.mode === "time"
    ? `by event time within ${policy.toleranceMs} ms`
    : "by trace id (one item from each parent per source event)";
  const wait = policy.timeoutSeconds === null
    ? "waits for every member"
    : policy.quorum === null
    ? `gives up after ${policy.timeoutSeconds} s and ${MISSING_TEXT[policy.missing]}`
    : `after ${policy.timeoutSeconds} s emits a group of at least ${policy.quorum} (the missing members null) ` +
      `and ${MISSING_TEXT[policy.missing]} below that`;
  const source = declared ? "" : ` (the ${flowType} default)`;
  const bound = flowType === FlowType.batch
    ? `past ${policy.maxPending} incomplete groups a parent that runs ahead waits for the others`
    : `at most ${policy.maxPending} incomplete groups, the oldest dropped beyond`;
  return `join of ${spec.parents.join(", ")} ${how}; ${wait}; ${bound}${source}`;
}

function deliveryLine(spec: NodeSpec, flowType: FlowType, maxRetries: number): string {
  const policy = DeliveryPolicy.resolve(flowType, spec.delivery, maxRetries);
  const source = spec.delivery === null ? ` (the ${flowType} default)` : "";
  const retries = policy.delivery === "at-least-once"
    ? `, ${plural(policy.maxRetries, "retry", "retries")} then dead-letter (${policy.dlq} DLQ)`
    : `, a failed item is not retried (${policy.dlq} DLQ)`;
  return `delivery ${policy.delivery}${retries}, at most ${
    plural(policy.maxDeliver, "delivery", "deliveries")
  }${source}`;
}

/**
 * How `vf deploy` runs the node on Kubernetes and whether `--autoscaling` would scale it: each rule that
 * keeps it fixed by its first clause (a Job, and a producer's or consumer's fixed count, go without saying).
 */
function kubernetesLine(spec: NodeSpec, flowType: FlowType): string {
  const workload = workloadOf(spec, flowType);
  const fixed = `on kubernetes: a ${workload} of ${plural(spec.nbTasks, "replica")}`;
  if (workload === Workload.job || spec.kind !== "processor") return fixed;
  const reasons = scalingRejections(scalingCandidateOf(spec, flowType)).map((reason) => reason.split(":")[0]);
  return reasons.length === 0
    ? `${fixed}, which --autoscaling scales on its backlog on ${spec.parents.join(", ")}`
    : `${fixed}, not autoscaled: ${reasons.join("; ")}`;
}

function permissionsLine(name: string, permissions: Permissions): string {
  const granted = permissions[name];
  if (granted === undefined) return "permissions: none";
  const parts = Object.entries(granted).map(([kind, list]) =>
    list.length === 0 ? `${kind} (all)` : `${kind} ${list.join(", ")}`
  );
  return `permissions: ${parts.join("; ")}`;
}

/**
 * The text view: the flow type, the edges, then one block per node; `maxRetries` is the retry budget the
 * replicas get (`VF_MAX_RETRIES`, as a worker reads it).
 */
export function explainText(
  flowId: string,
  flowType: FlowType,
  specs: readonly NodeSpec[],
  permissions: Permissions,
  maxRetries: number,
): string {
  const width = Math.max(...specs.map((s) => s.name.length));
  const lines = [
    `flow ${flowId} (${flowType}), ${plural(specs.length, "node")}`,
    `  ${FLOW_TYPE_MEANING[flowType]}`,
    "",
    "graph",
  ];
  for (const spec of specs) {
    const children = specs.filter((child) => child.parents.includes(spec.name)).map((child) => child.name);
    lines.push(
      `  ${spec.name.padEnd(width)} ${children.length === 0 ? "(sink)" : `──▶ ${children.join(", ")}`}`,
    );
  }
  lines.push("", "nodes");
  for (const spec of specs) {
    lines.push(
      `  ${spec.name} (${spec.kind}, ${replicasLine(spec)}${spec.deviceType === "gpu" ? ", gpu" : ""})`,
    );
    const details = [
      spec.parents.length === 1 ? `input from ${spec.parents[0]}` : null,
      joinLine(spec, flowType),
      spec.kind === "producer" ? null : deliveryLine(spec, flowType, maxRetries),
      permissionsLine(spec.name, permissions),
      kubernetesLine(spec, flowType),
    ];
    for (const detail of details) if (detail !== null) lines.push(`    ${detail}`);
  }
  return lines.join("\n");
}

/** Text as the inside of a Graphviz quoted string: `\\`, `"` and line breaks escaped. */
function dotEscaped(text: string): string {
  return text.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("\n", "\\n");
}

/** Text as a Graphviz quoted string. */
function dotQuoted(text: string): string {
  return `"${dotEscaped(text)}"`;
}

function dotLabel(spec: NodeSpec): string {
  const name = dotEscaped(spec.name);
  return spec.nbTasks === 1 ? `${name}\\n${spec.kind}` : `${name}\\n${spec.kind} ×${spec.nbTasks}`;
}

const DOT_SHAPES: Record<string, string> = { producer: "invhouse", processor: "box", consumer: "house" };

/** The Graphviz view: one node per spec, one edge per parent link. */
export function explainDot(flowId: string, specs: readonly NodeSpec[]): string {
  const lines = [`digraph ${dotQuoted(flowId)} {`, "  rankdir=LR;"];
  for (const spec of specs) {
    lines.push(`  ${dotQuoted(spec.name)} [shape=${DOT_SHAPES[spec.kind]}, label="${dotLabel(spec)}"];`);
  }
  for (const spec of specs) {
    for (const parent of spec.parents) {
      lines.push(`  ${dotQuoted(parent)} -> ${dotQuoted(spec.name)};`);
    }
  }
  lines.push("}");
  return lines.join("\n");
}

/** Explains the flow file at `path` (text, or Graphviz with `dot`); resolves with the exit code. */
export async function explainCommand(
  path: string,
  options: { readonly dot: boolean; readonly flowType?: string },
  io: CommandOutput,
): Promise<number> {
  const { flow, modules } = await loadFlow(path);
  const flowType = options.flowType === undefined ? flow.flowType : checkFlowType(options.flowType);
  const specs = compileFlow(flow, { modules });
  io.out(
    options.dot ? explainDot(flow.flowId, specs) : explainText(
      flow.flowId,
      flowType,
      specs,
      nodePermissions(flow),
      parseWorkerSettings(Deno.env.toObject(), flowType).maxRetries,
    ),
  );
  return 0;
}
