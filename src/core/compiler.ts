/**
 * Turns a validated {@link Flow} into one {@link NodeSpec} per node (spec core.compiler): everything an
 * engine needs to launch a node's workers, as plain JSON, without the live node objects. A spec's
 * serialized form is every byte of the specs document a worker reads, so `toDict()` has exactly the
 * spec's 21 keys in the spec's order, and the companion documents (requirements, GPU provenance,
 * execution groups, batching policies, sink guarantees, node permissions) sit beside the specs, emitted
 * only when non-empty: a flow that uses none of them compiles to the same bytes.
 *
 * ```ts
 * const index = new ModuleIndex().add(flowUrl, flowModule);
 * const doc = compileToDict(flow, { modules: index });   // { specs: [...] }
 * JSON.stringify(doc);                                    // the specs document
 * ```
 *
 * @module
 */

import { ConfigError, type Diagnostic, raiseForDiagnostics } from "./errors.ts";
import type { Flow } from "./flow.ts";
import { childrenWithin } from "./graph.ts";
import {
  isNodeName,
  isNonEmptyString,
  isPositiveInteger,
  isPositiveNumber,
  NODE_NAME_EXPECTED,
} from "./_predicates.ts";
import type { ModuleIndex } from "./node_class.ts";
import type {
  BatchingPolicy,
  DeviceType,
  JsonObject,
  Node,
  NodeKind,
  NodePermissions,
  PermissionKind,
} from "./node.ts";
import { ENVELOPE_VERSION } from "../wire/codec.ts";
import {
  ConsumerNode,
  DEVICE_TYPES,
  EffectGuarantee,
  findNonJson,
  NODE_KINDS,
  PERMISSION_KINDS,
  ProcessorNode,
  ProducerNode,
  ReceiverNode,
} from "./node.ts";

/** A node spec's serialized form: the spec's exact snake_case keys, in the spec's order. */
export interface NodeSpecDict {
  /** The node's stable name, unique in the flow. */
  name: string;
  /** `<module URL>#<export name>` of the node's class; `null` for a native component. */
  node_class: string | null;
  /** The node's `getParams()`: what its class is rebuilt from. */
  params: JsonObject;
  /** Parent names, in the order `process()` receives their outputs. */
  parents: string[];
  /** `producer`, `processor` or `consumer`. */
  kind: NodeKind;
  /** Whether anything in the flow consumes this node's output. */
  has_children: boolean;
  /** Replica count (processors; 1 otherwise). */
  nb_tasks: number;
  /** `cpu` or `gpu` (processors; `cpu` otherwise). */
  device_type: DeviceType;
  /** For producers, whether `next()` ends by itself; `true` for the others. */
  is_finite: boolean;
  /** The container image declared on the node, or `null` for the deploy-time default. */
  image: string | null;
  /** The partition key, or `null` when replicas compete. */
  partition_by: string | null;
  /** The join policy dict, or `null` for the flow type's default. */
  join_policy: JsonObject | null;
  /** A remote component's reference, or `null` for a native graph node. */
  component_ref: string | null;
  /** A remote component's descriptor, or `null`. */
  descriptor: JsonObject | null;
  /** A native component's entrypoint command, or `null`. */
  command: string[] | null;
  /** A remote component's wire protocol version, or `null`. */
  protocol_version: number | null;
  /** Whole GPUs each replica requests (default 1). */
  gpu_count: number;
  /** The extended-resource name a GPU strategy resolved, or `null` for the deploy-time default. */
  gpu_resource_name: string | null;
  /** Reader obligations per published message (see {@link blobReaders}); `null` (legacy) disables reclaim. */
  blob_readers: number | null;
  /** Declared GPU memory demand in GiB, or `null`. */
  gpu_memory_gib: number | null;
  /** The node's delivery overrides, or `null` to inherit the flow type's preset. */
  delivery: JsonObject | null;
}

/** What a {@link NodeSpec} is built from: the nine leading fields are required, the rest default. */
export interface NodeSpecInit {
  /** The node's stable name, unique in the flow. */
  readonly name: string;
  /** `<module URL>#<export name>` of the node's class; `null` for a native component. */
  readonly nodeClass: string | null;
  /** The node's `getParams()`: what its class is rebuilt from. */
  readonly params: JsonObject;
  /** Parent names, in the order `process()` receives their outputs. */
  readonly parents: readonly string[];
  /** `producer`, `processor` or `consumer`. */
  readonly kind: NodeKind;
  /** Whether anything in the flow consumes this node's output. */
  readonly hasChildren: boolean;
  /** Replica count (processors; 1 otherwise). */
  readonly nbTasks: number;
  /** `cpu` or `gpu` (processors; `cpu` otherwise). */
  readonly deviceType: DeviceType;
  /** For producers, whether `next()` ends by itself; `true` for the others. */
  readonly isFinite: boolean;
  /** The container image declared on the node, or `null` for the deploy-time default. */
  readonly image?: string | null;
  /** The partition key, or `null` when replicas compete. */
  readonly partitionBy?: string | null;
  /** The join policy dict, or `null` for the flow type's default. */
  readonly joinPolicy?: JsonObject | null;
  /** A remote component's reference, or `null` for a native graph node. */
  readonly componentRef?: string | null;
  /** A remote component's descriptor, or `null`. */
  readonly descriptor?: JsonObject | null;
  /** A native component's entrypoint command, or `null`. */
  readonly command?: readonly string[] | null;
  /** A remote component's wire protocol version, or `null`. */
  readonly protocolVersion?: number | null;
  /** Whole GPUs each replica requests (default 1). */
  readonly gpuCount?: number;
  /** The extended-resource name a GPU strategy resolved, or `null` for the deploy-time default. */
  readonly gpuResourceName?: string | null;
  /** Reader obligations per published message (see {@link blobReaders}); `null` (legacy) disables reclaim. */
  readonly blobReaders?: number | null;
  /** Declared GPU memory demand in GiB, or `null`. */
  readonly gpuMemoryGib?: number | null;
  /** The node's delivery overrides, or `null` to inherit the flow type's preset. */
  readonly delivery?: JsonObject | null;
}

const isString = (v: unknown): boolean => typeof v === "string";
const isBoolean = (v: unknown): boolean => typeof v === "boolean";
const isInteger = (v: unknown): boolean => Number.isSafeInteger(v);
const isCount = (v: unknown): boolean => Number.isSafeInteger(v) && (v as number) >= 0;
const isStringList = (v: unknown): boolean => Array.isArray(v) && v.every(isString);
const isJsonObject = (v: unknown): boolean =>
  typeof v === "object" && v !== null && !Array.isArray(v) && findNonJson(v, "") === null;
const oneOf = (values: readonly string[]) => (v: unknown): boolean => values.includes(v as string);
const nullable = (accepts: (v: unknown) => boolean) => (v: unknown): boolean => v === null || accepts(v);

/** One field of a spec: its key, its property, whether a document must carry it, and what it accepts. */
interface SpecField {
  readonly key: keyof NodeSpecDict;
  readonly prop: keyof NodeSpecInit;
  /** `undefined`: required; otherwise the value an absent key takes. */
  readonly fallback: unknown;
  readonly expected: string;
  readonly accepts: (value: unknown) => boolean;
}

const REQUIRED = undefined;

/** The spec's 21 fields in the spec's order: the order of `toDict()` and of every serialized spec. */
const SPEC_FIELDS: readonly SpecField[] = [
  {
    key: "name",
    prop: "name",
    fallback: REQUIRED,
    expected: NODE_NAME_EXPECTED,
    accepts: isNodeName,
  },
  {
    key: "node_class",
    prop: "nodeClass",
    fallback: REQUIRED,
    expected: "a string or null",
    accepts: nullable(isString),
  },
  { key: "params", prop: "params", fallback: REQUIRED, expected: "a JSON object", accepts: isJsonObject },
  {
    key: "parents",
    prop: "parents",
    fallback: REQUIRED,
    expected: "a list of node names",
    accepts: isStringList,
  },
  {
    key: "kind",
    prop: "kind",
    fallback: REQUIRED,
    expected: `one of ${NODE_KINDS.join(", ")}`,
    accepts: oneOf(NODE_KINDS),
  },
  { key: "has_children", prop: "hasChildren", fallback: REQUIRED, expected: "a boolean", accepts: isBoolean },
  {
    key: "nb_tasks",
    prop: "nbTasks",
    fallback: REQUIRED,
    expected: "an integer >= 1",
    accepts: isPositiveInteger,
  },
  {
    key: "device_type",
    prop: "deviceType",
    fallback: REQUIRED,
    expected: `one of ${DEVICE_TYPES.join(", ")}`,
    accepts: oneOf(DEVICE_TYPES),
  },
  { key: "is_finite", prop: "isFinite", fallback: REQUIRED, expected: "a boolean", accepts: isBoolean },
  { key: "image", prop: "image", fallback: null, expected: "a string or null", accepts: nullable(isString) },
  {
    key: "partition_by",
    prop: "partitionBy",
    fallback: null,
    expected: "a string or null",
    accepts: nullable(isString),
  },
  {
    key: "join_policy",
    prop: "joinPolicy",
    fallback: null,
    expected: "a JSON object or null",
    accepts: nullable(isJsonObject),
  },
  {
    key: "component_ref",
    prop: "componentRef",
    fallback: null,
    expected: "a string or null",
    accepts: nullable(isString),
  },
  {
    key: "descriptor",
    prop: "descriptor",
    fallback: null,
    expected: "a JSON object or null",
    accepts: nullable(isJsonObject),
  },
  {
    key: "command",
    prop: "command",
    fallback: null,
    expected: "a list of strings or null",
    accepts: nullable(isStringList),
  },
  {
    key: "protocol_version",
    prop: "protocolVersion",
    fallback: null,
    expected: "an integer or null",
    accepts: nullable(isInteger),
  },
  {
    key: "gpu_count",
    prop: "gpuCount",
    fallback: 1,
    expected: "an integer >= 1",
    accepts: isPositiveInteger,
  },
  {
    key: "gpu_resource_name",
    prop: "gpuResourceName",
    fallback: null,
    expected: "a non-empty string or null",
    accepts: nullable(isNonEmptyString),
  },
  {
    key: "blob_readers",
    prop: "blobReaders",
    fallback: null,
    expected: "an integer >= 0 or null",
    accepts: nullable(isCount),
  },
  {
    key: "gpu_memory_gib",
    prop: "gpuMemoryGib",
    fallback: null,
    expected: "a number > 0 or null",
    accepts: nullable(isPositiveNumber),
  },
  {
    key: "delivery",
    prop: "delivery",
    fallback: null,
    expected: "a JSON object or null",
    accepts: nullable(isJsonObject),
  },
];

/**
 * A flat, serializable description of one node's deployment. A plain mutable record: a GPU strategy sets
 * `gpuResourceName`, an engine may recompute `blobReaders`.
 */
export class NodeSpec {
  /** The node's stable name, unique in the flow. */
  name: string;
  /** `<module URL>#<export name>` of the node's class; `null` for a native component. */
  nodeClass: string | null;
  /** The node's `getParams()`: what its class is rebuilt from. */
  params: JsonObject;
  /** Parent names, in the order `process()` receives their outputs. */
  parents: string[];
  /** `producer`, `processor` or `consumer`. */
  kind: NodeKind;
  /** Whether anything in the flow consumes this node's output. */
  hasChildren: boolean;
  /** Replica count (processors; 1 otherwise). */
  nbTasks: number;
  /** `cpu` or `gpu` (processors; `cpu` otherwise). */
  deviceType: DeviceType;
  /** For producers, whether `next()` ends by itself; `true` for the others. */
  isFinite: boolean;
  /** The container image declared on the node, or `null` for the deploy-time default. */
  image: string | null;
  /** The partition key, or `null` when replicas compete. */
  partitionBy: string | null;
  /** The join policy dict, or `null` for the flow type's default. */
  joinPolicy: JsonObject | null;
  /** A remote component's reference, or `null` for a native graph node. */
  componentRef: string | null;
  /** A remote component's descriptor, or `null`. */
  descriptor: JsonObject | null;
  /** A native component's entrypoint command, or `null`. */
  command: string[] | null;
  /** A remote component's wire protocol version, or `null`. */
  protocolVersion: number | null;
  /** Whole GPUs each replica requests (default 1). */
  gpuCount: number;
  /** The extended-resource name a GPU strategy resolved, or `null` for the deploy-time default. */
  gpuResourceName: string | null;
  /** Reader obligations per published message (see {@link blobReaders}); `null` (legacy) disables reclaim. */
  blobReaders: number | null;
  /** Declared GPU memory demand in GiB, or `null`. */
  gpuMemoryGib: number | null;
  /** The node's delivery overrides, or `null` to inherit the flow type's preset. */
  delivery: JsonObject | null;

  /** A spec holding `init`'s fields (the parents list copied), the optional ones at their defaults. */
  constructor(init: NodeSpecInit) {
    this.name = init.name;
    this.nodeClass = init.nodeClass;
    this.params = init.params;
    this.parents = [...init.parents];
    this.kind = init.kind;
    this.hasChildren = init.hasChildren;
    this.nbTasks = init.nbTasks;
    this.deviceType = init.deviceType;
    this.isFinite = init.isFinite;
    this.image = init.image ?? null;
    this.partitionBy = init.partitionBy ?? null;
    this.joinPolicy = init.joinPolicy ?? null;
    this.componentRef = init.componentRef ?? null;
    this.descriptor = init.descriptor ?? null;
    this.command = init.command ? [...init.command] : null;
    this.protocolVersion = init.protocolVersion ?? null;
    this.gpuCount = init.gpuCount ?? 1;
    this.gpuResourceName = init.gpuResourceName ?? null;
    this.blobReaders = init.blobReaders ?? null;
    this.gpuMemoryGib = init.gpuMemoryGib ?? null;
    this.delivery = init.delivery ?? null;
  }

  /**
   * Inputs each replica takes ahead, the node's `prefetch` param (`ReceiverParams.prefetch`), or `null` for
   * the broker's default. Read from the params, so the spec document keeps the spec's keys.
   */
  get prefetch(): number | null {
    const prefetch = this.params.prefetch;
    return typeof prefetch === "number" ? prefetch : null;
  }

  /** A non-graph component that runs its own image entrypoint (no node class) and speaks the protobuf wire. */
  get isNative(): boolean {
    return this.nodeClass === null;
  }

  /** Loaded from a component descriptor, rather than a graph node class. */
  get isRemote(): boolean {
    return this.componentRef !== null;
  }

  /** Replicas partition the input by key (`partitionBy` set and more than one replica). */
  get isPartitioned(): boolean {
    return this.partitionBy !== null && this.nbTasks > 1;
  }

  /** The serialized form: the spec's 21 snake_case keys, in the spec's order. */
  toDict(): NodeSpecDict {
    const record = this as unknown as Record<string, unknown>;
    return Object.fromEntries(
      SPEC_FIELDS.map((field) => [field.key, record[field.prop]]),
    ) as unknown as NodeSpecDict;
  }

  /** `toDict()` for `JSON.stringify`. */
  toJSON(): NodeSpecDict {
    return this.toDict();
  }

  /**
   * Reads a serialized spec. Absent optional keys take their defaults (a legacy spec without
   * `blob_readers` reads as `null`); a missing required key, an unknown key or a value of the wrong type
   * throws one {@link ConfigError} listing every problem.
   */
  static fromDict(d: unknown, where = "node spec"): NodeSpec {
    if (typeof d !== "object" || d === null || Array.isArray(d)) {
      throw new ConfigError(`${where} must be an object`, "pass the dict NodeSpec.toDict() wrote", { where });
    }
    const doc = d as Record<string, unknown>;
    const problems: string[] = [];
    const init: Record<string, unknown> = {};
    for (const field of SPEC_FIELDS) {
      const present = Object.hasOwn(doc, field.key);
      if (!present && field.fallback === REQUIRED) {
        problems.push(`${field.key} is missing`);
      } else if (present && !field.accepts(doc[field.key])) {
        problems.push(
          `${field.key} must be ${field.expected}, got ${JSON.stringify(doc[field.key]) ?? "undefined"}`,
        );
      } else {
        init[field.prop] = present ? doc[field.key] : field.fallback;
      }
    }
    const known = new Set<string>(SPEC_FIELDS.map((field) => field.key));
    for (const key of Object.keys(doc)) {
      if (!known.has(key)) problems.push(`unknown key ${JSON.stringify(key)}`);
    }
    if (problems.length > 0) {
      const name = typeof doc.name === "string" ? ` ${doc.name}` : "";
      throw new ConfigError(
        `invalid ${where}${name}: ${problems.join("; ")}`,
        "recompile the flow with this version of videoflow",
        { where, problems },
      );
    }
    return new NodeSpec(init as unknown as NodeSpecInit);
  }
}

/** Reads a list of serialized specs (`VF_FLOW_SPECS_JSON`); throws {@link ConfigError} naming the bad entry. */
export function specsFromDicts(list: unknown): NodeSpec[] {
  if (!Array.isArray(list)) {
    throw new ConfigError("a specs document must be a list of node specs", "pass compileToDict(...).specs");
  }
  return list.map((d, i) => NodeSpec.fromDict(d, `specs[${i}]`));
}

/** What a flow's backend requirements look like to the compiler (`FlowRequirements`). */
export interface RequirementsDocument {
  /** Whether the flow asks nothing beyond the defaults, so no `requirements` key is emitted. */
  isEmpty(): boolean;
  /** The serialized requirements, as emitted under `requirements`. */
  toDict(): Record<string, unknown>;
}

/** Options of {@link compileFlow}. */
export interface CompileOptions {
  /** The modules node classes are exported from: the flow file's, plus the registered ones. */
  readonly modules: ModuleIndex;
  /** An explicit wire version pin; only {@link ENVELOPE_VERSION} is accepted. */
  readonly envelopeVersion?: number | null;
  /** Told each warning the flow's validation finds (its errors throw); warnings are not reported otherwise. */
  readonly onWarning?: (warning: Diagnostic) => void;
}

/** Options of {@link compileToDict}. */
export interface CompileDocumentOptions extends CompileOptions {
  /** The flow's backend requirements, emitted under `requirements` when not empty. */
  readonly requirements?: RequirementsDocument | null;
  /** Emit `gpu_provenance` (never in the default document). */
  readonly gpuProvenance?: boolean;
}

/** Every side document {@link compileToDict} may add beside `specs`, in the order it adds them. */
export interface CompiledDocument {
  /** Every node's serialized spec, in the order {@link compileFlow} returns them. */
  readonly specs: readonly NodeSpecDict[];
  /** The flow's backend requirements; present only when not empty. */
  readonly requirements?: Record<string, unknown>;
  /** {@link gpuProvenance}; present only when asked for and not empty. */
  readonly gpu_provenance?: Record<string, Record<string, string>>;
  /** {@link executionGroups}: group to member names (RUN-035); present only when not empty. */
  readonly execution_groups?: Record<string, string[]>;
  /** {@link batchingPolicies}: node to policy (RUN-036); present only when not empty. */
  readonly batching_policies?: Record<string, BatchingPolicy>;
  /** {@link sinkGuarantees}: sinks declaring more than at-least-once (RUN-017); present only when not empty. */
  readonly sink_guarantees?: Record<string, string>;
  /** {@link nodePermissions}: each node's non-empty Deno permission kinds; present only when not empty. */
  readonly permissions?: Record<string, Partial<Record<PermissionKind, string[]>>>;
}

/**
 * Rejects an explicit wire version pin other than {@link ENVELOPE_VERSION} with a {@link ConfigError}
 * naming the fix; `null`/`undefined` (no pin) is accepted.
 */
export function validateWireCompatibility(
  specs: readonly NodeSpec[],
  envelopeVersion: number | null | undefined,
): void {
  if (envelopeVersion === null || envelopeVersion === undefined || envelopeVersion === ENVELOPE_VERSION) {
    return;
  }
  throw new ConfigError(
    `envelope version ${JSON.stringify(envelopeVersion)} is not supported: every flow speaks the protobuf ` +
      `envelope, version ${ENVELOPE_VERSION}`,
    `remove the pin (VF_ENVELOPE_VERSION / envelopeVersion) or set it to ${ENVELOPE_VERSION}`,
    {
      envelope_version: envelopeVersion,
      native_components: specs.filter((spec) => spec.isNative).map((spec) => spec.name),
    },
  );
}

function specFor(node: Node, members: ReadonlySet<Node>, modules: ModuleIndex): NodeSpec {
  const processor = node instanceof ProcessorNode ? node : null;
  const receiver = node instanceof ReceiverNode ? node : null;
  return new NodeSpec({
    name: node.name,
    nodeClass: modules.nodeClassOf(node),
    params: node.getParams(),
    parents: node.parents.map((parent) => parent.name),
    kind: node.kind,
    hasChildren: childrenWithin(node, members).length > 0,
    nbTasks: processor?.nbTasks ?? 1,
    deviceType: processor?.deviceType ?? "cpu",
    isFinite: node instanceof ProducerNode ? node.isFinite : true,
    image: node.image,
    partitionBy: processor?.partitionBy ?? null,
    joinPolicy: (receiver?.joinPolicy?.toDict() ?? null) as JsonObject | null,
    gpuCount: processor?.gpuCount ?? 1,
    gpuMemoryGib: processor?.gpuMemoryGib ?? null,
    delivery: (receiver?.deliveryPolicy() ?? null) as JsonObject | null,
  });
}

/**
 * One spec per node, in the flow's topological order, with `blobReaders` computed. Validates first: a
 * flow with any error throws one GraphError listing every diagnostic; an envelope pin other than 4 throws
 * {@link ConfigError}.
 */
export function compileFlow(flow: Flow, options: CompileOptions): NodeSpec[] {
  const diagnostics = flow.validate(options.modules);
  raiseForDiagnostics(diagnostics);
  for (const warning of diagnostics) options.onWarning?.(warning);
  const members = new Set(flow.nodes);
  const specs = flow.topologicalSort().map((node) => specFor(node, members, options.modules));
  for (const spec of specs) spec.blobReaders = blobReaders(spec, specs);
  validateWireCompatibility(specs, options.envelopeVersion);
  return specs;
}

function childSpecs(spec: NodeSpec, specs: readonly NodeSpec[]): NodeSpec[] {
  return specs.filter((child) => child.parents.includes(spec.name));
}

/**
 * How many reader obligations each message `spec` publishes carries (RFC 0002, BLOB-5): per child, 1 when
 * its replicas compete on one durable, its replica count when it is partitioned. 0 for a leaf.
 */
export function blobReaders(spec: NodeSpec, specs: readonly NodeSpec[]): number {
  return childSpecs(spec, specs).reduce((sum, child) => sum + (child.isPartitioned ? child.nbTasks : 1), 0);
}

/**
 * The reader obligation ids of what `spec` publishes (BLOB-13, `VF_BLOB_READER_IDS`): `<child>` for a
 * child whose replicas compete, `<child>/p<i>` per replica of a partitioned child. The arithmetic of
 * {@link blobReaders}, by name.
 */
export function blobReaderIds(spec: NodeSpec, specs: readonly NodeSpec[]): string[] {
  return childSpecs(spec, specs).flatMap((child) =>
    child.isPartitioned
      ? Array.from({ length: child.nbTasks }, (_, i) => `${child.name}/p${i}`)
      : [child.name]
  );
}

/**
 * Each parent's replica count, in `spec.parents` order (ENV-11, `VF_PARENT_REPLICAS`): how many
 * terminators the EOS barrier expects from it. Throws {@link ConfigError} for a parent not in `specs`.
 */
export function parentReplicas(spec: NodeSpec, specs: readonly NodeSpec[]): number[] {
  return spec.parents.map((name) => {
    const parent = specs.find((candidate) => candidate.name === name);
    if (parent === undefined) {
      throw new ConfigError(
        `node ${spec.name} names parent ${name}, which is not in the specs`,
        "recompile the flow",
        {
          node: spec.name,
          parent: name,
        },
      );
    }
    return parent.nbTasks;
  });
}

/** Whether any node is a native component (no node class): those force the protobuf wire. */
export function hasNativeComponents(specs: readonly NodeSpec[]): boolean {
  return specs.some((spec) => spec.isNative);
}

/** Whether any node came from a component descriptor. */
export function hasRemoteComponents(specs: readonly NodeSpec[]): boolean {
  return specs.some((spec) => spec.isRemote);
}

/**
 * Where every processor's GPU requirement came from, `{node: {device_type, gpu_count, gpu_memory_gib →
 * source}}`, in topological order; producers and consumers carry no GPU knobs and are omitted.
 */
export function gpuProvenance(flow: Flow): Record<string, Record<string, string>> {
  const out: Record<string, Record<string, string>> = {};
  for (const node of flow.topologicalSort()) {
    if (node instanceof ProcessorNode) out[node.name] = { ...node.gpuProvenance };
  }
  return out;
}

/** The fused execution groups the nodes declare (RUN-035): group → member names, both sorted. */
export function executionGroups(flow: Flow): Record<string, string[]> {
  const groups = new Map<string, string[]>();
  for (const node of flow.nodes) {
    const group = node.executionGroup;
    if (group !== null) groups.set(group, [...(groups.get(group) ?? []), node.name]);
  }
  const names = [...groups.keys()].sort();
  return Object.fromEntries(names.map((name) => [name, groups.get(name)!.sort()]));
}

/** The dynamic-batching contracts the nodes declare (RUN-036): node → policy, in topological order. */
export function batchingPolicies(flow: Flow): Record<string, BatchingPolicy> {
  const out: Record<string, BatchingPolicy> = {};
  for (const node of flow.topologicalSort()) {
    if (node.batchingPolicy !== null) out[node.name] = { ...node.batchingPolicy };
  }
  return out;
}

/** The sinks that declare more than the default effect guarantee (RUN-017): node → declaration. */
export function sinkGuarantees(flow: Flow): Record<string, string> {
  const out: Record<string, string> = {};
  for (const node of flow.topologicalSort()) {
    if (node instanceof ConsumerNode && node.effectGuarantee !== EffectGuarantee.atLeastOnce) {
      out[node.name] = node.effectGuarantee;
    }
  }
  return out;
}

function grantedKinds(granted: NodePermissions): Partial<Record<PermissionKind, string[]>> {
  const out: Partial<Record<PermissionKind, string[]>> = {};
  for (const kind of PERMISSION_KINDS) if (granted[kind].length > 0) out[kind] = [...granted[kind]];
  return out;
}

/** The Deno permissions of every node that gets any: node → the non-empty kinds, in topological order. */
export function nodePermissions(flow: Flow): Record<string, Partial<Record<PermissionKind, string[]>>> {
  const out: Record<string, Partial<Record<PermissionKind, string[]>>> = {};
  for (const node of flow.topologicalSort()) {
    const kinds = grantedKinds(node.permissions());
    if (Object.keys(kinds).length > 0) out[node.name] = kinds;
  }
  return out;
}

/** Node name to the modules its replicas load before their sandbox applies ({@link Node.preloadModules}). */
export function nodePreloads(flow: Flow): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const node of flow.topologicalSort()) {
    const modules = node.preloadModules();
    if (modules.length > 0) out[node.name] = [...modules];
  }
  return out;
}

/**
 * The compiled document: `{ specs }`, then `requirements`, `gpu_provenance` (only when asked for),
 * `execution_groups`, `batching_policies`, `sink_guarantees` and `permissions`, each only when non-empty,
 * so a flow that uses none of them compiles to exactly `{ specs }`. Throws as {@link compileFlow}.
 */
export function compileToDict(flow: Flow, options: CompileDocumentOptions): CompiledDocument {
  const specs = compileFlow(flow, options);
  const sides: Array<readonly [string, Record<string, unknown>]> = [
    [
      "requirements",
      options.requirements && !options.requirements.isEmpty() ? options.requirements.toDict() : {},
    ],
    ["gpu_provenance", options.gpuProvenance ? gpuProvenance(flow) : {}],
    ["execution_groups", executionGroups(flow)],
    ["batching_policies", batchingPolicies(flow)],
    ["sink_guarantees", sinkGuarantees(flow)],
    ["permissions", nodePermissions(flow)],
  ];
  const doc: Record<string, unknown> = { specs: specs.map((spec) => spec.toDict()) };
  for (const [key, value] of sides) if (Object.keys(value).length > 0) doc[key] = value;
  return doc as unknown as CompiledDocument;
}
