/**
 * Discovery, topological sorting and validation of a flow's graph (spec core.graph).
 *
 * Validation collects every problem in one pass and reports them together, in a stable order: structural
 * errors first (they make the later checks unreliable), then each node's errors (in topological order, or
 * discovery order when the graph has a cycle), then warnings. {@link raiseForDiagnostics} (errors.ts)
 * turns the errors into one GraphError; warnings never raise.
 *
 * Discovery order is the order a depth-first walk from the consumers (in the order given) meets nodes,
 * visiting each node's parents in `.from()` order. The topological sort is Kahn's algorithm with ties
 * broken by discovery order, so it depends only on how the graph was wired, never on hashing or on the
 * order nodes were constructed in.
 *
 * @module
 */

import { nodeNameCollisions } from "../backends/identity.ts";
import { checkNodeOverride } from "./delivery_policy.ts";
import { Diagnostic, GraphError, VideoflowError } from "./errors.ts";
import { JOIN_TIME, JOIN_TRACE } from "./join_policy.ts";
import type { JoinPolicy } from "./join_policy.ts";
import type { ModuleIndex } from "./node_class.ts";
import {
  ConsumerNode,
  DEVICE_TYPES,
  DeviceType,
  EFFECT_GUARANTEES,
  FunctionProcessorNode,
  GPU_FALLBACKS,
  GpuFallback,
  type Node,
  OneTaskProcessorNode,
  parseExportRef,
  PERMISSION_KINDS,
  type PermissionKind,
  ProcessorNode,
  ProducerNode,
  ReceiverNode,
  REPLAY_POLICIES,
  TaskModuleNode,
} from "./node.ts";
import { PartitionKeyPolicy } from "./partition_key_policy.ts";
import { ORDER_SEQUENCE } from "./ordering_policy.ts";
import {
  isNodeName,
  isNonEmptyString,
  isNonNegativeInteger,
  isPositiveInteger,
  isPositiveNumber,
  NODE_NAME_EXPECTED,
} from "./_predicates.ts";

const GRAPH = "VF_GRAPH";
const CONFIG = "VF_CONFIG";
const CONTRACT = "VF_NODE_CONTRACT";
const IDENTITY = "VF_IDENTITY_COLLISION";
const SHA256_HEX = /^[0-9a-f]{64}$/;

/** Options of {@link validate}. */
export interface ValidateOptions {
  /** The topological sort, when the caller has one; computed (if the graph is acyclic) otherwise. */
  readonly tsort?: readonly Node[];
  /** The modules node classes must be exported from; without it, class exports are not checked. */
  readonly modules?: ModuleIndex;
}

/**
 * Every node reachable from `consumers` by walking parents, in discovery order: depth-first from each
 * consumer in turn, parents in `.from()` order, each node at its first visit.
 */
export function discoverNodes(consumers: readonly Node[]): Node[] {
  const seen = new Set<Node>();
  const order: Node[] = [];
  const stack = [...consumers].reverse();
  while (stack.length > 0) {
    const node = stack.pop()!;
    if (seen.has(node)) continue;
    seen.add(node);
    order.push(node);
    const parents = node.parents;
    for (let i = parents.length - 1; i >= 0; i--) {
      if (!seen.has(parents[i])) stack.push(parents[i]);
    }
  }
  return order;
}

/** The children of `node` that are in `members`, in wiring order (a child listing it twice appears twice). */
export function childrenWithin(node: Node, members: ReadonlySet<Node>): Node[] {
  return node.children.filter((child) => members.has(child));
}

/**
 * Kahn's algorithm over `nodes` (a parent-closed set in discovery order), ties broken by position in
 * `nodes`. Returns the sorted nodes, and the ones left over when the graph has a cycle.
 */
function kahn(nodes: readonly Node[]): { sorted: Node[]; leftover: Node[] } {
  const index = new Map(nodes.map((node, i) => [node, i]));
  const indegree = new Map(nodes.map((node) => [node, node.parents.length]));
  const ready: number[] = nodes.flatMap((node, i) => (node.parents.length === 0 ? [i] : []));
  const sorted: Node[] = [];
  const insert = (i: number): void => {
    let lo = 0;
    let hi = ready.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (ready[mid] < i) lo = mid + 1;
      else hi = mid;
    }
    ready.splice(lo, 0, i);
  };
  while (ready.length > 0) {
    const node = nodes[ready.shift()!];
    sorted.push(node);
    for (const child of node.children) {
      const at = index.get(child);
      if (at === undefined) continue;
      const left = indegree.get(child)! - 1;
      indegree.set(child, left);
      if (left === 0) insert(at);
    }
  }
  const done = new Set(sorted);
  return { sorted, leftover: nodes.filter((node) => !done.has(node)) };
}

/** The strongly connected components of `nodes` that form cycles (a self-loop included), in discovery order. */
function cycles(nodes: readonly Node[]): Node[][] {
  const members = new Set(nodes);
  const index = new Map<Node, number>();
  const low = new Map<Node, number>();
  const onStack = new Set<Node>();
  const stack: Node[] = [];
  const found: Node[][] = [];
  const connect = (node: Node): void => {
    index.set(node, index.size);
    low.set(node, index.get(node)!);
    stack.push(node);
    onStack.add(node);
    for (const parent of node.parents) {
      if (!members.has(parent)) continue;
      if (!index.has(parent)) {
        connect(parent);
        low.set(node, Math.min(low.get(node)!, low.get(parent)!));
      } else if (onStack.has(parent)) {
        low.set(node, Math.min(low.get(node)!, index.get(parent)!));
      }
    }
    if (low.get(node) !== index.get(node)) return;
    const component: Node[] = [];
    let member: Node;
    do {
      member = stack.pop()!;
      onStack.delete(member);
      component.push(member);
    } while (member !== node);
    if (component.length > 1 || node.parents.includes(node)) found.push(component);
  };
  for (const node of nodes) if (!index.has(node)) connect(node);
  const position = new Map(nodes.map((node, i) => [node, i]));
  const byDiscovery = (a: Node, b: Node) => position.get(a)! - position.get(b)!;
  return found.map((component) => component.sort(byDiscovery)).sort((a, b) => byDiscovery(a[0], b[0]));
}

/**
 * The nodes reachable from `consumers`, parents before children, ties broken by discovery order.
 * Throws {@link GraphError} (with one diagnostic per cycle) when the graph has a cycle.
 */
export function topologicalSort(consumers: readonly Node[]): Node[] {
  const nodes = discoverNodes(consumers);
  const { sorted, leftover } = kahn(nodes);
  if (leftover.length === 0) return sorted;
  const diagnostics = cycles(leftover).map(cycleDiagnostic);
  throw new GraphError("the flow's graph has a cycle", "remove the cycle: a flow is a DAG", diagnostics);
}

function cycleDiagnostic(component: readonly Node[]): Diagnostic {
  const names = component.map((node) => node.name).join(", ");
  return fail(
    GRAPH,
    component[0].name,
    component.length === 1 ? `node ${names} is its own parent (a cycle)` : `nodes ${names} form a cycle`,
    "rewire so that no node depends on its own output: a flow is a DAG",
  );
}

function fail(code: string, node: string | null, message: string, remedy: string | null): Diagnostic {
  return new Diagnostic("error", code, node, message, remedy);
}

function fromError(node: string, error: unknown): Diagnostic {
  if (error instanceof VideoflowError) return fail(error.code, node, error.message, error.remedy);
  const message = error instanceof Error ? error.message : String(error);
  return fail(CONTRACT, node, `node ${node}: ${message}`, "fix the node class");
}

/** Runs `compute`, turning a throw into a diagnostic; `undefined` when it threw. */
function attempt<T>(out: Diagnostic[], node: string, compute: () => T): T | undefined {
  try {
    return compute();
  } catch (error) {
    out.push(fromError(node, error));
    return undefined;
  }
}

const isAbsent = (value: unknown): boolean => value === undefined || value === null;

/** A param check: the key, what it must be, and whether a value passes (`undefined` always passes). */
type ParamRule = readonly [key: string, expected: string, passes: (value: unknown) => boolean];

const NODE_RULES: readonly ParamRule[] = [
  ["name", NODE_NAME_EXPECTED, isNodeName],
  ["image", "a non-empty string or null", (v) => v === null || isNonEmptyString(v)],
];
const PRODUCER_RULES: readonly ParamRule[] = [["isFinite", "a boolean", (v) => typeof v === "boolean"]];
const RECEIVER_RULES: readonly ParamRule[] = [
  ["prefetch", "an integer >= 0 or null", (v) => v === null || isNonNegativeInteger(v)],
];
const PROCESSOR_RULES: readonly ParamRule[] = [
  ...RECEIVER_RULES,
  ["nbTasks", "an integer >= 1", isPositiveInteger],
  [
    "deviceType",
    `one of ${DEVICE_TYPES.join(", ")}`,
    (v) => (DEVICE_TYPES as readonly unknown[]).includes(v),
  ],
  ["partitionBy", "'trace_id', a metadata field name, or null", (v) => v === null || isNonEmptyString(v)],
  ["gpuCount", "an integer >= 1 or null", (v) => v === null || isPositiveInteger(v)],
  ["gpuMemoryGib", "a number > 0 or null", (v) => v === null || isPositiveNumber(v)],
];
const CONSUMER_RULES: readonly ParamRule[] = [
  ...RECEIVER_RULES,
  ["metadata", "a boolean", (v) => typeof v === "boolean"],
  ["idempotent", "a boolean", (v) => typeof v === "boolean"],
];

function paramRules(node: Node): readonly ParamRule[] {
  if (node instanceof ProducerNode) return [...NODE_RULES, ...PRODUCER_RULES];
  if (node instanceof ProcessorNode) return [...NODE_RULES, ...PROCESSOR_RULES];
  if (node instanceof ConsumerNode) return [...NODE_RULES, ...CONSUMER_RULES];
  return NODE_RULES;
}

function checkParams(node: Node, out: Diagnostic[]): void {
  let problems: string[];
  try {
    problems = node.paramProblems();
  } catch (error) {
    problems = [`paramProblems() threw: ${error instanceof Error ? error.message : String(error)}`];
  }
  for (const problem of problems) {
    out.push(fail(CONFIG, node.name, `node ${node.name}: ${problem}`, "fix the node's params"));
  }
  const params = node.params as Record<string, unknown>;
  for (const [key, expected, passes] of paramRules(node)) {
    const value = params[key];
    if (value === undefined || passes(value)) continue;
    out.push(
      fail(
        CONFIG,
        node.name,
        `node ${node.name}: ${key} must be ${expected}, got ${JSON.stringify(value) ?? String(value)}`,
        `set ${key} to ${expected}`,
      ),
    );
  }
  if (node instanceof OneTaskProcessorNode && params.nbTasks !== undefined && params.nbTasks !== 1) {
    out.push(
      fail(
        CONFIG,
        node.name,
        `node ${node.name} is a one-task processor, but asks for nbTasks ${JSON.stringify(params.nbTasks)}`,
        "remove nbTasks: a one-task processor keeps state and always runs as one replica",
      ),
    );
  }
  if (node instanceof ProducerNode && params.nbTasks !== undefined && params.nbTasks !== 1) {
    out.push(
      fail(
        CONFIG,
        node.name,
        `node ${node.name} is a producer, but asks for nbTasks ${JSON.stringify(params.nbTasks)}`,
        "remove nbTasks: a producer runs as one replica (a source is not split); give the processors after " +
          "it replicas instead",
      ),
    );
  }
}

function checkNodeClass(node: Node, modules: ModuleIndex | undefined, out: Diagnostic[]): void {
  if (modules === undefined || node instanceof TaskModuleNode || modules.nodeClassOf(node) !== null) return;
  const cls = node.constructor.name || "(an anonymous class)";
  out.push(
    fail(
      CONTRACT,
      node.name,
      `node ${node.name}: its class ${cls} is not exported from the flow's module or any registered module, ` +
        "so a worker cannot rebuild it",
      `export the class from the flow file (export class ${node.constructor.name || "MyNode"} ...)`,
    ),
  );
}

function checkFunctionRef(
  node: FunctionProcessorNode,
  modules: ModuleIndex | undefined,
  out: Diagnostic[],
): void {
  const ref: unknown = node.params.fn;
  if (typeof ref === "function") return;
  if (typeof ref !== "string") {
    out.push(fail(
      CONTRACT,
      node.name,
      `node ${node.name}: fn must be a '<module URL>#<export name>' reference, got ${JSON.stringify(ref)}`,
      "reference an exported function of the flow file as `${import.meta.url}#name`",
    ));
    return;
  }
  let value: unknown;
  try {
    parseExportRef(ref);
    if (modules === undefined) return;
    value = modules.lookup(ref);
  } catch (error) {
    out.push(fromError(node.name, error));
    return;
  }
  if (typeof value === "function") return;
  out.push(fail(
    CONTRACT,
    node.name,
    value === undefined
      ? `node ${node.name}: fn ${ref} is not exported by any module the flow registers`
      : `node ${node.name}: fn ${ref} is not a function`,
    "reference an exported function of the flow file as `${import.meta.url}#name`",
  ));
}

/** A time join's collect parents and quorum, checked against the parents the node really has. */
function checkTimeJoinParents(node: ReceiverNode, policy: JoinPolicy | null, out: Diagnostic[]): void {
  if (policy === null || policy.mode !== JOIN_TIME) return;
  const parents = node.parents.map((parent) => parent.name);
  const strangers = Object.keys(policy.collect).filter((name) => !parents.includes(name));
  if (strangers.length > 0) {
    out.push(
      fail(
        CONFIG,
        node.name,
        `node ${node.name}: join policy collect names ${strangers.join(", ")}, which ` +
          `${strangers.length === 1 ? "is not a parent" : "are not parents"} (parents: ${
            parents.join(", ")
          })`,
        "key collect by the names of this node's parents",
      ),
    );
  }
  const sync = policy.syncParents(parents).length;
  if (policy.quorum !== null && policy.quorum > sync) {
    out.push(
      fail(
        CONFIG,
        node.name,
        `node ${node.name}: join quorum ${policy.quorum} exceeds its ${sync} synchronized parents`,
        `set quorum to at most ${sync}`,
      ),
    );
  }
}

function checkReplication(node: ProcessorNode, policy: JoinPolicy | null, out: Diagnostic[]): void {
  if (node.parents.length < 2 || !isPositiveInteger(node.nbTasks) || node.nbTasks < 2) return;
  if (policy?.mode === JOIN_TIME) {
    out.push(
      fail(
        CONFIG,
        node.name,
        `node ${node.name} is a time-mode join of ${node.parents.length} parents on ${node.nbTasks} replicas: ` +
          "a time window is assembled by one replica, so the members of one window would be split",
        "set nbTasks: 1 on a time-mode join of several parents",
      ),
    );
  } else if (node.partitionBy === null) {
    out.push(
      fail(
        GRAPH,
        node.name,
        `node ${node.name} joins ${node.parents.length} parents on ${node.nbTasks} replicas without a partition ` +
          "key: the halves of one group would land on different replicas",
        "set partitionBy: 'trace_id' (co-locates both halves of a join), or nbTasks: 1",
      ),
    );
  }
}

function checkGpu(node: ProcessorNode, out: Diagnostic[]): void {
  const { gpuCount, gpuMemoryGib } = node.params;
  const knobs = [["gpuCount", gpuCount], ["gpuMemoryGib", gpuMemoryGib]].filter(([, v]) => !isAbsent(v));
  if (node.deviceType === DeviceType.cpu && knobs.length > 0) {
    const names = knobs.map(([key]) => key).join(" and ");
    out.push(
      fail(
        CONFIG,
        node.name,
        `node ${node.name} runs on CPU but sets ${names}: GPU settings need deviceType 'gpu'`,
        `set deviceType: 'gpu', or remove ${names}`,
      ),
    );
  }
  if (typeof gpuCount === "number" && gpuCount > 1 && !isAbsent(gpuMemoryGib)) {
    out.push(
      fail(
        CONFIG,
        node.name,
        `node ${node.name} sets gpuCount ${gpuCount} and gpuMemoryGib ${gpuMemoryGib}: a model cannot span ` +
          "MIG slices, so a node declares whole devices or a fraction of one, never both",
        "remove gpuMemoryGib (whole devices) or set gpuCount to 1 (one MIG slice)",
      ),
    );
  }
}

function declarationProblem(node: Node): string | null {
  const group = node.executionGroup;
  const batching = node.batchingPolicy as unknown;
  if (!(REPLAY_POLICIES as readonly unknown[]).includes(node.replayPolicy)) {
    return `replayPolicy must be one of ${REPLAY_POLICIES.join(", ")}`;
  }
  if (!(GPU_FALLBACKS as readonly unknown[]).includes(node.gpuFallback)) {
    return `gpuFallback must be one of ${GPU_FALLBACKS.join(", ")}`;
  }
  if (typeof node.deterministic !== "boolean") return "deterministic must be a boolean";
  if (typeof node.requiresPeerAccess !== "boolean") return "requiresPeerAccess must be a boolean";
  if (group !== null && !isNonEmptyString(group)) return "executionGroup must be a non-empty string or null";
  if (batching !== null) {
    const problem = batchingProblem(batching);
    if (problem !== null) return problem;
  }
  if (node instanceof ProducerNode) {
    if (typeof node.replayable !== "boolean") return "replayable must be a boolean";
    if (node.analysisVersion !== null && !isNonEmptyString(node.analysisVersion)) {
      return "analysisVersion must be a non-empty string or null";
    }
  }
  if (
    node instanceof ConsumerNode && !(EFFECT_GUARANTEES as readonly unknown[]).includes(node.effectGuarantee)
  ) {
    return `effectGuarantee must be one of ${EFFECT_GUARANTEES.join(", ")}`;
  }
  return null;
}

function batchingProblem(policy: unknown): string | null {
  const expected =
    "batchingPolicy must be { max_batch: integer >= 1, max_wait_ms: number >= 0, fairness?: string }";
  if (typeof policy !== "object" || policy === null || Array.isArray(policy)) return expected;
  const { max_batch, max_wait_ms, fairness, ...extra } = policy as Record<string, unknown>;
  const waits = typeof max_wait_ms === "number" && Number.isFinite(max_wait_ms) && max_wait_ms >= 0;
  const fair = fairness === undefined || typeof fairness === "string";
  return isPositiveInteger(max_batch) && waits && fair && Object.keys(extra).length === 0 ? null : expected;
}

function checkDeclarations(node: Node, out: Diagnostic[]): void {
  const problem = declarationProblem(node);
  if (problem !== null) {
    out.push(
      fail(
        CONFIG,
        node.name,
        `node ${node.name}: class ${node.constructor.name}: ${problem}`,
        "fix the class-level declaration",
      ),
    );
  }
  if (!(node instanceof ReceiverNode) || node.partitionKeyPolicy === null) return;
  const declared = node.partitionKeyPolicy;
  const policy = attempt(out, node.name, () => PartitionKeyPolicy.fromDict(declared));
  if (
    policy && node instanceof ProcessorNode && policy.invalid === "fallback" &&
    policy.fallbackPartition >= node.nbTasks
  ) {
    out.push(
      fail(
        CONFIG,
        node.name,
        `node ${node.name}: partitionKeyPolicy fallback_partition ${policy.fallbackPartition} is not a replica ` +
          `of its ${node.nbTasks}`,
        `set fallback_partition below ${node.nbTasks}`,
      ),
    );
  }
}

function permissionsProblem(node: Node): string | null {
  const declared = (node.constructor as typeof Node).permissions as unknown;
  if (declared === null) return null;
  if (typeof declared !== "object" || Array.isArray(declared)) return "static permissions must be an object";
  for (const [kind, list] of Object.entries(declared as Record<string, unknown>)) {
    if (!(PERMISSION_KINDS as readonly string[]).includes(kind)) {
      return `static permissions has an unknown kind ${JSON.stringify(kind)} (known: ${
        PERMISSION_KINDS.join(", ")
      })`;
    }
    if (!Array.isArray(list) || !list.every(isNonEmptyString)) {
      return `static permissions.${kind} must be a list of non-empty strings`;
    }
  }
  return null;
}

/** What Deno's `sys` permission can name (`Deno.SysPermissionDescriptor`). */
const SYS_NAMES: readonly string[] = [
  "loadavg",
  "hostname",
  "systemMemoryInfo",
  "networkInterfaces",
  "osRelease",
  "osUptime",
  "uid",
  "gid",
  "username",
  "cpus",
  "homedir",
  "statfs",
  "getPriority",
  "setPriority",
  "ca",
  "umask",
];

/** A host, or a host and port, as Deno's `net` permission takes it (no scheme, path or wildcard). */
const NET_ENTRY = /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?$/;

/** Why a granted entry is one Deno would refuse (or read otherwise than meant); null when it is fine. */
function entryProblem(kind: PermissionKind, entry: string): string | null {
  if (kind === "net" && !NET_ENTRY.test(entry)) {
    return `net entry ${JSON.stringify(entry)} is not a host or host:port (no scheme, path or wildcard)`;
  }
  if (kind === "sys" && !SYS_NAMES.includes(entry)) {
    return `sys entry ${JSON.stringify(entry)} is none of ${SYS_NAMES.join(", ")}`;
  }
  if (kind === "env" && (entry === "*" || entry.includes("="))) {
    return `env entry ${JSON.stringify(entry)} names no variable (name one, or a prefix ending in *)`;
  }
  return null;
}

function checkWorkerContract(node: Node, out: Diagnostic[]): void {
  const permissions = permissionsProblem(node) ?? attempt(out, node.name, () => {
    const granted: Partial<Record<PermissionKind, unknown>> = node.permissions() ?? {};
    const missing = PERMISSION_KINDS.filter((kind) => granted[kind] === undefined);
    if (missing.length > 0) {
      return `permissions() returned no list for ${missing.join(", ")}: it must return one for every kind ` +
        `(${PERMISSION_KINDS.join(", ")}), empty where the node needs none`;
    }
    for (const kind of PERMISSION_KINDS) {
      const list = granted[kind];
      if (!Array.isArray(list) || !list.every(isNonEmptyString)) {
        return `permissions().${kind} must be a list of non-empty strings`;
      }
      for (const entry of list) {
        const problem = entryProblem(kind, entry);
        if (problem !== null) return `the ${problem}`;
      }
    }
    return null;
  });
  if (permissions) {
    out.push(
      fail(
        CONTRACT,
        node.name,
        `node ${node.name}: ${permissions}`,
        'declare the node\'s needs on its class, `static override permissions = { read: ["./clips"] }`; ' +
          "override permissions() only to derive them from the params, returning { ...super.permissions(), " +
          "read: [...] }",
      ),
    );
  }
  const assets = attempt(out, node.name, () => node.requiredAssets());
  if (assets === undefined) return;
  const bad = Array.isArray(assets)
    ? assets.find((a) =>
      !(isNonEmptyString(a?.path) && SHA256_HEX.test(a?.sha256) && typeof a?.portable === "boolean")
    )
    : assets;
  if (bad === undefined) return;
  out.push(
    badReturn(
      node,
      "requiredAssets()",
      bad,
      "an asset requirement",
      "return AssetRequirement(path, sha256 as 64 lowercase hex digits, portable)",
    ),
  );
}

/** The error of a node whose method `call` returned `value`, which is not `expected`. */
function badReturn(node: Node, call: string, value: unknown, expected: string, remedy: string): Diagnostic {
  const returned = JSON.stringify(value) ?? String(value);
  return fail(
    CONTRACT,
    node.name,
    `node ${node.name}: ${call} returned ${returned}, not ${expected}`,
    remedy,
  );
}

/** The method each kind of node does its work in, which a worker calls for every item. */
const WORK_METHODS = [
  [ProducerNode, "next"],
  [ProcessorNode, "process"],
  [ConsumerNode, "consume"],
] as const;

/** A node whose class lacks the method its kind works in (a misspelt `process`) would fail every item. */
function checkWorkMethod(node: Node, out: Diagnostic[]): void {
  const method = WORK_METHODS.find(([kind]) => node instanceof kind)?.[1];
  if (method === undefined || typeof (node as unknown as Record<string, unknown>)[method] === "function") {
    return;
  }
  const cls = node.constructor.name || "its class";
  out.push(
    fail(
      CONTRACT,
      node.name,
      `node ${node.name} is a ${node.kind}, but ${cls} has no ${method}() method, so it could do nothing with ` +
        "any item",
      `define ${method}(...) in ${cls}: a ${node.kind} does its work in ${method}()`,
    ),
  );
}

function checkParentsOnce(node: Node, out: Diagnostic[]): void {
  const names = node.parents.map((parent) => parent.name);
  const repeated = node.parents.filter((parent, i) => node.parents.indexOf(parent) !== i);
  if (repeated.length === 0) return;
  out.push(
    fail(
      GRAPH,
      node.name,
      `node ${node.name} lists parent ${repeated[0].name} more than once (parents: ${names.join(", ")})`,
      "list each parent once in .from()",
    ),
  );
}

/**
 * Every accessor of the node's class chain is read as compiling reads the node's settings: a getter whose
 * code throws (an override of `nbTasks` that fails) is the node's error, never a crash of `vf`.
 */
function checkAccessors(node: Node, out: Diagnostic[]): void {
  const read = new Set<string>();
  for (let proto = Object.getPrototypeOf(node); proto !== null; proto = Object.getPrototypeOf(proto)) {
    for (const [key, descriptor] of Object.entries(Object.getOwnPropertyDescriptors(proto))) {
      if (descriptor.get === undefined || read.has(key)) continue;
      read.add(key);
      try {
        Reflect.get(node, key);
      } catch (error) {
        // One of ours is a setting the getter checked: the check of that setting reports it.
        if (error instanceof VideoflowError) continue;
        const why = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
        out.push(
          fail(
            CONTRACT,
            node.name,
            `node ${node.name}: reading its ${key} threw ${why}`,
            `fix the ${key} getter of ${node.constructor.name || "its class"}: it must return the setting`,
          ),
        );
      }
    }
  }
}

/** What `preloadModules()` returns must be a list of module URLs: anything else would be ignored. */
function checkPreloads(node: Node, out: Diagnostic[]): void {
  const modules = attempt(out, node.name, () => node.preloadModules());
  if (modules === undefined || (Array.isArray(modules) && modules.every(isNonEmptyString))) return;
  out.push(
    badReturn(
      node,
      "preloadModules()",
      modules,
      "a list of module URLs",
      "return the URLs of the modules the node imports when it opens, e.g. [new URL('./model.ts', " +
        "import.meta.url).href], or [] for none",
    ),
  );
}

/** Every error of one node, in a fixed order. */
function nodeErrors(node: Node, modules: ModuleIndex | undefined): Diagnostic[] {
  const out: Diagnostic[] = [];
  checkNodeClass(node, modules, out);
  checkWorkMethod(node, out);
  checkAccessors(node, out);
  attempt(out, node.name, () => node.getParams());
  if (node instanceof FunctionProcessorNode) checkFunctionRef(node, modules, out);
  checkParams(node, out);
  checkParentsOnce(node, out);
  if (node instanceof ReceiverNode) {
    attempt(out, node.name, () => checkNodeOverride(node.name, node.deliveryPolicy()));
    const policy = attempt(out, node.name, () => node.joinPolicy);
    attempt(out, node.name, () => node.orderingPolicy);
    checkTimeJoinParents(node, policy ?? null, out);
    if (node instanceof ProcessorNode) {
      checkReplication(node, policy ?? null, out);
      checkGpu(node, out);
    }
  }
  checkDeclarations(node, out);
  checkWorkerContract(node, out);
  checkPreloads(node, out);
  return out;
}

function warn(code: string, node: string | null, message: string, remedy: string): Diagnostic {
  return new Diagnostic("warning", code, node, message, remedy);
}

/** The producers `node` descends from (itself, for a producer). */
function producerAncestors(node: Node, seen = new Set<Node>()): Set<Node> {
  const producers = new Set<Node>();
  if (seen.has(node)) return producers;
  seen.add(node);
  if (node instanceof ProducerNode) producers.add(node);
  for (const parent of node.parents) {
    for (const producer of producerAncestors(parent, seen)) producers.add(producer);
  }
  return producers;
}

/**
 * Whether `node` joins its parents by trace id (the default) though they descend from no common producer:
 * a trace id is minted by one producer and carried forward, so no id ever arrives from every parent.
 */
function joinsStrangers(node: Node): boolean {
  if (!(node instanceof ReceiverNode) || node.parents.length < 2) return false;
  let mode: string;
  try {
    mode = node.joinPolicy?.mode ?? JOIN_TRACE;
  } catch {
    return false; // An invalid policy is reported as an error of its own.
  }
  if (mode !== JOIN_TRACE) return false;
  const ancestors = node.parents.map((parent) => producerAncestors(parent));
  // A parent with no producer above it is an error of its own (a root that is not a producer).
  if (ancestors.some((producers) => producers.size === 0)) return false;
  const [first, ...rest] = ancestors;
  return ![...first].some((producer) => rest.every((others) => others.has(producer)));
}

/** How many replicas a receiver runs. */
function replicasOf(node: ReceiverNode): number {
  return (node as ReceiverNode & { readonly nbTasks?: number }).nbTasks ?? 1;
}

/** The first node upstream of `node` (or `node` itself) that runs several replicas, if any. */
function replicatedUpstream(node: Node, seen = new Set<Node>()): ReceiverNode | null {
  if (seen.has(node)) return null;
  seen.add(node);
  if (node instanceof ReceiverNode && replicasOf(node) > 1) return node;
  for (const parent of node.parents) {
    const found = replicatedUpstream(parent, seen);
    if (found !== null) return found;
  }
  return null;
}

/** Whether `node` declares a valid sequence ordering (an invalid one is an error of its own). */
function reordersBySequence(node: ReceiverNode): boolean {
  try {
    return node.orderingPolicy?.mode === ORDER_SEQUENCE;
  } catch {
    return false;
  }
}

/** Every warning of one node, in a fixed order. */
function nodeWarnings(node: Node, members: ReadonlySet<Node>): Diagnostic[] {
  const out: Diagnostic[] = [];
  const reordering = node instanceof ReceiverNode && (node.constructor as typeof ReceiverNode).inputInOrder &&
      !reordersBySequence(node)
    ? replicatedUpstream(node)
    : null;
  if (reordering !== null) {
    out.push(
      warn(
        GRAPH,
        node.name,
        `node ${node.name} needs its input in the order it was made, but ${reordering.name} runs ` +
          `${replicasOf(reordering)} replicas, which finish items out of order`,
        `run ${reordering.name} as one replica, or give ${node.name} ordering: { mode: "sequence" } ` +
          "(it then takes its input in its producer's order)",
      ),
    );
  }
  if (joinsStrangers(node)) {
    out.push(
      warn(
        GRAPH,
        node.name,
        `node ${node.name} joins ${
          node.parents.map((p) => p.name).join(", ")
        } by trace id, but they descend ` +
          "from no common producer: no trace id reaches it from every parent, so no group ever completes",
        'join them by event time (joinPolicy: { mode: "time", tolerance_ms: ... }), or feed them from one producer',
      ),
    );
  }
  const outside = node.children.filter((child) => !members.has(child));
  if (outside.length > 0) {
    out.push(
      warn(
        GRAPH,
        node.name,
        `node ${node.name} feeds ${
          outside.map((c) => c.name).join(", ")
        }, which no consumer of the flow depends on`,
        "list their consumers in the Flow, or unwire them",
      ),
    );
  }
  if (node instanceof ReceiverNode && node.parents.length < 2 && !isAbsent(node.params.joinPolicy)) {
    out.push(
      warn(
        CONFIG,
        node.name,
        `node ${node.name} sets a join policy but has ${node.parents.length} parent(s): it is ignored`,
        "remove joinPolicy, or wire the node to several parents",
      ),
    );
  }
  if (node instanceof ProducerNode && node.analysisVersion !== null && !node.replayable) {
    out.push(
      warn(
        CONFIG,
        node.name,
        `node ${node.name} declares analysisVersion but is not replayable: it is ignored`,
        "declare static replayable = true, or remove analysisVersion",
      ),
    );
  }
  if (
    node instanceof ProcessorNode && node.deviceType === DeviceType.gpu && node.requiresPeerAccess &&
    node.gpuCount < 2
  ) {
    out.push(
      warn(
        CONFIG,
        node.name,
        `node ${node.name} requires peer access but is granted ${node.gpuCount} device: there is no peer`,
        "set gpuCount > 1, or remove requiresPeerAccess",
      ),
    );
  }
  const onCpu = !(node instanceof ProcessorNode) || node.deviceType !== DeviceType.gpu;
  if (onCpu && (node.gpuFallback === GpuFallback.none || node.requiresPeerAccess)) {
    out.push(
      warn(
        CONFIG,
        node.name,
        `node ${node.name} declares GPU grant requirements (gpuFallback, requiresPeerAccess) but runs on CPU: ` +
          "they are ignored",
        "remove them, or run the node on GPU",
      ),
    );
  }
  if (node instanceof ReceiverNode && node.partitionKeyPolicy !== null && node.partitionBy === null) {
    out.push(
      warn(
        CONFIG,
        node.name,
        `node ${node.name} declares a partitionKeyPolicy but does not partition: it is ignored`,
        "set partitionBy, or remove partitionKeyPolicy",
      ),
    );
  }
  return out;
}

/** Errors about the graph as a whole, in the order the spec lists them. */
function structuralErrors(
  consumers: readonly Node[],
  nodes: readonly Node[],
  members: ReadonlySet<Node>,
  leftover: readonly Node[],
): Diagnostic[] {
  const out: Diagnostic[] = [];
  if (consumers.length === 0) {
    out.push(
      fail(GRAPH, null, "the flow has no consumer", "pass the flow's sinks to Flow"),
    );
  }
  for (const consumer of consumers) {
    if (consumer instanceof ConsumerNode) continue;
    out.push(
      fail(
        GRAPH,
        consumer.name,
        `node ${consumer.name} is listed as a consumer of the flow but is a ${consumer.kind}`,
        "list only ConsumerNode sinks in the Flow",
      ),
    );
  }
  for (const root of nodes) {
    if (root.parents.length > 0 || root instanceof ProducerNode) continue;
    out.push(
      fail(
        GRAPH,
        root.name,
        `node ${root.name} has no parent but is a ${root.kind}: every root of a flow must be a producer`,
        `wire ${root.name} with .from(...), or make it a ProducerNode`,
      ),
    );
  }
  out.push(...cycles(leftover).map(cycleDiagnostic));
  const reached = new Set<Node>();
  const stack: Node[] = nodes.filter((node) => node instanceof ProducerNode);
  while (stack.length > 0) {
    const node = stack.pop()!;
    if (reached.has(node)) continue;
    reached.add(node);
    stack.push(...childrenWithin(node, members));
  }
  for (const consumer of new Set(consumers)) {
    if (reached.has(consumer)) continue;
    out.push(
      fail(
        GRAPH,
        consumer.name,
        `consumer ${consumer.name} is unreachable from any producer`,
        "wire it, through its parents, to a ProducerNode",
      ),
    );
  }
  out.push(...nameErrors(nodes));
  return out;
}

function nameErrors(nodes: readonly Node[]): Diagnostic[] {
  const out: Diagnostic[] = [];
  const byName = new Map<string, number>();
  for (const node of nodes) byName.set(node.name, (byName.get(node.name) ?? 0) + 1);
  for (const [name, count] of byName) {
    if (count < 2) continue;
    out.push(
      fail(
        GRAPH,
        name,
        `${count} nodes are named ${
          JSON.stringify(name)
        }: names identify nodes everywhere outside this process`,
        "give every node a unique name",
      ),
    );
  }
  for (const collision of nodeNameCollisions([...byName.keys()])) {
    const names = collision.identities.map((identity) => identity.parts[0]);
    out.push(
      fail(
        IDENTITY,
        names[0],
        `node names ${names.map((n) => JSON.stringify(n)).join(" and ")} encode to one physical name: ` +
          collision.render(),
        "rename one of them so that their broker and Kubernetes names differ",
      ),
    );
  }
  return out;
}

/**
 * The most bytes of JSON a flow's node params may take, every node's together: the spec's transport for
 * them to a pod is the compiled specs document in a ConfigMap (VF_FLOW_SPECS_PATH), and Kubernetes holds
 * at most 1 MiB of data in one; a subprocess reads the same document when one environment entry (128 KiB)
 * cannot hold a node's params, and a Deno Worker is handed them whole. So a flow that validates has params
 * every engine can carry.
 */
export const MAX_FLOW_PARAMS_BYTES = 1024 * 1024;

const utf8 = new TextEncoder();

/**
 * The params that no transport can carry ({@link MAX_FLOW_PARAMS_BYTES}): each node whose params alone are
 * over it, else the whole flow's when together they are, naming the largest. Params that are not JSON are
 * reported by their node's own check.
 */
function paramsSizeErrors(nodes: readonly Node[]): Diagnostic[] {
  const sizes = nodes.flatMap((node) => {
    try {
      return [{ node: node.name, bytes: utf8.encode(JSON.stringify(node.getParams())).length }];
    } catch {
      return [];
    }
  });
  const limit =
    `${MAX_FLOW_PARAMS_BYTES} bytes (1 MiB: the data a Kubernetes ConfigMap holds, which carries ` +
    "the compiled specs to a worker)";
  const remedy = "keep bulk data out of params: put it in a file the node reads (declare it in " +
    "requiredAssets() and its read permission) and pass the file's path";
  const over = sizes.filter((size) => size.bytes > MAX_FLOW_PARAMS_BYTES);
  if (over.length > 0) {
    return over.map(({ node, bytes }) =>
      fail(CONTRACT, node, `node ${node}'s params are ${bytes} bytes of JSON, more than ${limit}`, remedy)
    );
  }
  const total = sizes.reduce((sum, size) => sum + size.bytes, 0);
  if (total <= MAX_FLOW_PARAMS_BYTES) return [];
  const largest = sizes.toSorted((a, b) => b.bytes - a.bytes).slice(0, 3)
    .map(({ node, bytes }) => `${node} ${bytes}`).join(", ");
  return [
    fail(
      CONTRACT,
      null,
      `the nodes' params are ${total} bytes of JSON together (largest: ${largest}), more than ${limit}`,
      remedy,
    ),
  ];
}

/**
 * Every problem with a graph, in one pass: structural errors (no consumer, a listed consumer that is not
 * a ConsumerNode, a root that is not a producer, cycles, consumers unreachable from any producer,
 * duplicate names, names that collide once encoded), then each node's errors (class not exported, params
 * not JSON, invalid framework params, a repeated parent, invalid delivery or join policy, a replicated
 * join without a partition key, a replicated time-mode join of several parents, GPU knobs on a CPU node,
 * gpuCount > 1 with gpuMemoryGib, invalid class declarations, permissions or assets), then params too
 * large for any transport ({@link MAX_FLOW_PARAMS_BYTES}), then warnings
 * (children outside the flow, ignored declarations, a given producer that feeds no consumer). Empty means
 * the graph is sound.
 */
export function validate(
  producers: readonly Node[],
  consumers: readonly Node[],
  options: ValidateOptions = {},
): Diagnostic[] {
  const nodes = discoverNodes(consumers);
  const members = new Set(nodes);
  const { sorted, leftover } = options.tsort === undefined
    ? kahn(nodes)
    : { sorted: [...options.tsort], leftover: [] };
  const ordered = leftover.length === 0 ? sorted : nodes;
  const errors = [
    ...structuralErrors(consumers, nodes, members, leftover),
    ...ordered.flatMap((node) => nodeErrors(node, options.modules)),
    ...paramsSizeErrors(ordered),
  ];
  const warnings = ordered.flatMap((node) => nodeWarnings(node, members));
  for (const producer of producers) {
    if (members.has(producer)) continue;
    warnings.push(
      warn(
        GRAPH,
        producer.name,
        `producer ${producer.name} feeds no consumer of the flow`,
        "wire it to a consumer the flow lists, or remove it",
      ),
    );
  }
  return [...errors, ...warnings];
}
