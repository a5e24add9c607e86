/**
 * What a user builds a flow from (spec core.node): producers, processors and consumers, wired with
 * `.from(...parents)`, each taking ONE params object that is plain JSON so a worker can rebuild the node as
 * `new Cls(node.getParams())` from its `NodeSpec` alone.
 *
 * ```ts
 * class Count extends ProducerNode<{ n: number }> {
 *   #i = 0;
 *   next() { return this.#i < this.params.n ? ++this.#i : END; }
 * }
 * class Square extends ProcessorNode { process(x: number) { return x * x; } }
 * const square = new Square({ name: "square", nbTasks: 2 }).from(new Count({ name: "count", n: 10 }));
 * ```
 *
 * Construction never throws for a misconfiguration: `validate` (graph.ts) reports every problem of a
 * flow at once. Only a wiring that cannot be represented at all (a consumer used as a parent, a parent
 * that is not a node) throws at once.
 *
 * Class-level declarations (`static deterministic`, `replayPolicy`, `gpuFallback`, `requiresPeerAccess`,
 * `executionGroup`, `batchingPolicy`, `permissions`; `replayable`/`analysisVersion` on producers;
 * `partitionKeyPolicy` on processors and consumers; `effectGuarantee` on consumers) are static fields, so
 * declaring them never changes `getParams()` or a compiled spec. A subclass overrides one with
 * `static override replayPolicy = "committed" as const;`.
 *
 * @module
 */

import type { RuntimeContext } from "./context.ts";
import type { DeliveryMode, DeliveryOverride } from "./delivery_policy.ts";
import { DeliveryPolicy } from "./delivery_policy.ts";
import { isPlainObject } from "./checks.ts";
import type { Disposition } from "./errors.ts";
import { ConfigError, NodeContractError } from "./errors.ts";
import type { JoinPolicyDict } from "./join_policy.ts";
import { JoinPolicy } from "./join_policy.ts";
import { OrderingPolicy, type OrderingPolicyDict } from "./ordering_policy.ts";
import type { DeclarationSource, GpuFieldMap } from "./provenance.ts";
import { builtinDefaults, nodeDeclarations, resolveGpuRequirements } from "./provenance.ts";

/** What a producer's `next()` returns once its source is exhausted. Shared across module copies. */
export const END: unique symbol = Symbol.for("videoflow.END");
/** The type of {@link END}. */
export type End = typeof END;

/** The three roles a node plays in a compiled flow (`NodeSpec.kind`). */
export const NodeKind = { producer: "producer", processor: "processor", consumer: "consumer" } as const;
/** The three roles a node plays in a compiled flow (`NodeSpec.kind`). */
export type NodeKind = typeof NodeKind[keyof typeof NodeKind];
/** Every node kind, in the order the spec lists them. */
export const NODE_KINDS: readonly NodeKind[] = Object.values(NodeKind);

/** Where a processor's code runs. */
export const DeviceType = { cpu: "cpu", gpu: "gpu" } as const;
/** Where a processor's code runs. */
export type DeviceType = typeof DeviceType[keyof typeof DeviceType];
/** Every device type. */
export const DEVICE_TYPES: readonly DeviceType[] = Object.values(DeviceType);

/** How a redelivered input is recovered (RFC 0006): processed again, or re-published from the ledger. */
export const ReplayPolicy = { recompute: "recompute", committed: "committed" } as const;
/** How a redelivered input is recovered (RFC 0006). */
export type ReplayPolicy = typeof ReplayPolicy[keyof typeof ReplayPolicy];
/** Every replay policy. */
export const REPLAY_POLICIES: readonly ReplayPolicy[] = Object.values(ReplayPolicy);

/** What a GPU node does under a short or empty grant (RUN-044): run on CPU, or refuse to open. */
export const GpuFallback = { cpu: "cpu", none: "none" } as const;
/** What a GPU node does under a short or empty grant (RUN-044). */
export type GpuFallback = typeof GpuFallback[keyof typeof GpuFallback];
/** Every GPU fallback. */
export const GPU_FALLBACKS: readonly GpuFallback[] = Object.values(GpuFallback);

/** What a sink promises about its external effects (RUN-017). */
export const EffectGuarantee = { atLeastOnce: "at_least_once", idempotentKey: "idempotent_key" } as const;
/** What a sink promises about its external effects (RUN-017). */
export type EffectGuarantee = typeof EffectGuarantee[keyof typeof EffectGuarantee];
/** Every effect guarantee. */
export const EFFECT_GUARANTEES: readonly EffectGuarantee[] = Object.values(EffectGuarantee);

/** A JSON value: what a node's params, a spec's params and every compiled document are made of. */
export type JsonValue = null | boolean | number | string | readonly JsonValue[] | JsonObject;
/** A JSON object. */
export type JsonObject = { readonly [key: string]: JsonValue };

/** A dynamic-batching contract (RUN-036): refused at admission by every shipped engine. */
export interface BatchingPolicy {
  /** The most inputs one batch holds. */
  readonly max_batch: number;
  /** The longest a partial batch waits for more inputs, in milliseconds. */
  readonly max_wait_ms: number;
  /** How inputs from different sources share a batch, when the contract says. */
  readonly fairness?: string;
}

/** How a partitioned replica treats a record whose partition key is unusable (RUN-020). */
export interface PartitionKeyPolicyDeclaration {
  /** `reject`: dead-letter the record as VF_POISON_PARTITION_KEY; `fallback`: route it to one replica. */
  readonly invalid: "reject" | "fallback";
  /** The replica index an invalid key routes to under `fallback`; below the node's nb_tasks. */
  readonly fallback_partition?: number;
}

/** The Deno permission kinds a node's worker may be granted. */
export const PERMISSION_KINDS = ["read", "write", "net", "env", "run", "ffi", "sys"] as const;
/** One Deno permission kind. */
export type PermissionKind = typeof PERMISSION_KINDS[number];
/** What a node class declares (`static override permissions = { read: ["./clips"] }`): any subset. */
export type PermissionDeclaration = { readonly [K in PermissionKind]?: readonly string[] };
/** A node's worker permissions: every kind present, each a list (empty: nothing of that kind). */
export type NodePermissions = { readonly [K in PermissionKind]: readonly string[] };

/** One file a node needs on the machine it runs on, with the sha256 its bytes must have (RUN-033). */
export class AssetRequirement {
  /**
   * A requirement for the file at `path` with digest `sha256`.
   *
   * @param path where the worker finds the file.
   * @param sha256 the lowercase hex digest its bytes must have.
   * @param portable available on every host (a claim, an image layer, a download) rather than one host.
   */
  constructor(readonly path: string, readonly sha256: string, readonly portable: boolean = true) {}

  /** The JSON form. */
  toDict(): { path: string; sha256: string; portable: boolean } {
    return { path: this.path, sha256: this.sha256, portable: this.portable };
  }
}

/** What a node's `joinPolicy` param accepts: a policy, the dict it serializes to, or nothing. */
export type JoinPolicyArg = JoinPolicy | Partial<JoinPolicyDict> | null;

/** What a node's `ordering` param accepts: a policy, the dict it serializes to, or nothing. */
export type OrderingPolicyArg = OrderingPolicy | Partial<OrderingPolicyDict> | null;

/** Params every node takes. */
export interface NodeParams {
  /** Unique, stable identity within a flow; generated from the class name and a counter when absent. */
  readonly name?: string;
  /** The container image the node's worker runs in on Kubernetes; `null` takes the deploy-time default. */
  readonly image?: string | null;
}

/** Params of a producer. */
export interface ProducerParams extends NodeParams {
  /** Whether `next()` eventually returns {@link END} by itself (default true). */
  readonly isFinite?: boolean;
}

/** Params of a node that receives input: its join and failure knobs. */
export interface ReceiverParams extends NodeParams {
  /** How a multi-parent node aligns its inputs; defaults per flow type when unset. */
  readonly joinPolicy?: JoinPolicyArg;
  /** Overrides the flow type's delivery preset. */
  readonly delivery?: DeliveryMode | null;
  /** The disposition of an exception nothing classified. */
  readonly onError?: Disposition | null;
  /**
   * The order inputs are handed to the node in, per partition key (RUN-021): `arrival` (the default) or
   * `sequence`, their producer's order, waiting up to `horizon` later inputs for a gap.
   */
  readonly ordering?: OrderingPolicyArg;
  /**
   * Inputs each replica takes ahead of the one it processes (the broker's credit for the node grows with
   * it). Unset: the spec's 4 over JetStream, where a reference worker may bind the same durable, and the
   * embedded broker's own depth on a local run (16 realtime, 256 batch). Raise it over JetStream where
   * throughput needs it: each input pulled ahead saves a round trip.
   */
  readonly prefetch?: number | null;
}

/** Params of a processor. */
export interface ProcessorParams extends ReceiverParams {
  /** Parallel replicas (default 1). */
  readonly nbTasks?: number;
  /** `cpu` (default) or `gpu`. */
  readonly deviceType?: DeviceType;
  /** `trace_id` or a metadata field: replicas partition the input by it instead of competing for it. */
  readonly partitionBy?: string | null;
  /** Whole GPUs per replica (GPU nodes only); unset means one. */
  readonly gpuCount?: number | null;
  /** GPU memory demand in GiB (GPU nodes only); exclusive with `gpuCount > 1`. */
  readonly gpuMemoryGib?: number | null;
}

/** Params of a consumer. */
export interface ConsumerParams extends ReceiverParams {
  /** Receive the parents' metadata instead of their output (default false). */
  readonly metadata?: boolean;
  /** Deduplicate side effects across redelivery when the flow has an idempotency store (default false). */
  readonly idempotent?: boolean;
}

/**
 * The constructor's argument list: the params object is optional exactly when every key of `P` is
 * optional.
 */
export type NodeArgs<P> = object extends P ? [params?: P] : [params: P];

/** Something `.from()` accepts as a parent: a node whose output can be consumed, or a module. */
export type Upstream = ProducerNode<object> | ProcessorNode<object> | ModuleNode;

const autoNameCounters = new WeakMap<object, number>();

function autoName(cls: { name: string }): string {
  const count = (autoNameCounters.get(cls) ?? 0) + 1;
  autoNameCounters.set(cls, count);
  return `${cls.name || "node"}_${count}`;
}

/** A short phrase naming what `value` is, for an error that says what was given instead of a node or params. */
export function describe(value: unknown): string {
  if (value === undefined || value === null) return String(value);
  if (typeof value === "string" || typeof value === "boolean") return JSON.stringify(value);
  if (typeof value === "function") return `a function${value.name ? ` (${value.name})` : ""}`;
  if (typeof value === "symbol") return "a symbol";
  if (typeof value === "bigint") return "a bigint";
  if (typeof value === "number") return String(value);
  const name = (value as object).constructor?.name;
  return name ? `an instance of ${name}` : "an object without a plain prototype";
}

function childPath(path: string, key: string): string {
  return /^[A-Za-z_$][A-Za-z0-9_$]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
}

/** Where a value stops being plain JSON, and what was found there. */
export interface JsonProblem {
  /** The path of the offending value, e.g. `params.options.fn` or `params.list[2]`. */
  readonly path: string;
  /** What the value is, e.g. `a function (double)`, `NaN`, `a cycle back to params`. */
  readonly found: string;
}

/**
 * Every place `value` is not plain JSON (so `JSON.parse(JSON.stringify(value))` would not give it back),
 * in order: a function, symbol, bigint, `undefined`, a non-finite number, an array hole, an object whose
 * prototype is not `Object.prototype` or `null` (a Date, Map, class instance), or a cycle. Empty when the
 * value is plain JSON.
 */
export function nonJsonPlaces(value: unknown, path: string): JsonProblem[] {
  const problems: JsonProblem[] = [];
  walkJson(value, path, [], problems);
  return problems;
}

/** The first of {@link nonJsonPlaces}, or `null` when `value` is plain JSON. */
export function findNonJson(value: unknown, path: string): JsonProblem | null {
  return nonJsonPlaces(value, path)[0] ?? null;
}

function walkJson(value: unknown, path: string, ancestors: object[], out: JsonProblem[]): void {
  if (value === null || typeof value === "string" || typeof value === "boolean") return;
  if (typeof value === "number") {
    if (!Number.isFinite(value)) out.push({ path, found: String(value) });
    return;
  }
  if (typeof value !== "object") return void out.push({ path, found: describe(value) });
  if (ancestors.includes(value)) return void out.push({ path, found: "a cycle back to an enclosing value" });
  ancestors.push(value);
  try {
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) {
        const at = `${path}[${i}]`;
        if (!(i in value)) out.push({ path: at, found: "an array hole" });
        else walkJson(value[i], at, ancestors, out);
      }
    } else if (!isPlainObject(value)) {
      out.push({ path, found: describe(value) });
    } else {
      for (const [key, item] of Object.entries(value)) walkJson(item, childPath(path, key), ancestors, out);
    }
  } finally {
    ancestors.pop();
  }
}

/** The `<module URL>#<export name>` reference a worker loads a class or function by, split in two. */
export interface ExportRef {
  /** The module URL, before the `#`. */
  readonly url: string;
  /** The export name, after the `#`. */
  readonly exportName: string;
}

/**
 * Splits `<module URL>#<export name>` at its last `#` (a module URL percent-encodes its own). Throws
 * {@link NodeContractError} for anything else.
 */
export function parseExportRef(ref: string): ExportRef {
  const at = typeof ref === "string" ? ref.lastIndexOf("#") : -1;
  const exportName = at > 0 ? ref.slice(at + 1) : "";
  if (at <= 0 || !/^[A-Za-z_$][A-Za-z0-9_$]*$/.test(exportName)) {
    throw new NodeContractError(
      `${JSON.stringify(ref)} is not an export reference`,
      "reference an export as '<module URL>#<export name>', e.g. `${import.meta.url}#double`",
      { reference: ref },
    );
  }
  return { url: ref.slice(0, at), exportName };
}

/**
 * Imports the module of an export reference and returns the export. Throws {@link NodeContractError}
 * when the module cannot be imported or has no such export.
 */
export async function importExport(ref: string): Promise<unknown> {
  const { url, exportName } = parseExportRef(ref);
  let namespace: Record<string, unknown>;
  try {
    namespace = await import(url);
  } catch (error) {
    throw new NodeContractError(
      `cannot import ${url}: ${error instanceof Error ? error.message : String(error)}`,
      "make the module importable by the worker (its URL, its permissions, its dependencies)",
      { reference: ref },
    );
  }
  if (!Object.hasOwn(namespace, exportName)) {
    throw new NodeContractError(
      `module ${url} has no export ${JSON.stringify(exportName)}`,
      `export ${exportName} from ${url}`,
      { reference: ref },
    );
  }
  return namespace[exportName];
}

function normalizeParams(params: unknown, cls: { name: string }): Record<string, unknown> {
  if (params === undefined) return {};
  if (typeof params !== "object" || params === null || Array.isArray(params)) {
    throw new NodeContractError(
      `${cls.name || "a node"} takes one params object, got ${describe(params)}`,
      "construct the node as new Cls({ name: ..., ...its params })",
    );
  }
  const copy: Record<string, unknown> = { ...params };
  if (copy.joinPolicy instanceof JoinPolicy) copy.joinPolicy = copy.joinPolicy.toDict();
  if (copy.ordering instanceof OrderingPolicy) copy.ordering = copy.ordering.toDict();
  return copy;
}

/**
 * Throws one {@link ConfigError} listing every one of `node`'s {@link Node.paramProblems}, if it has any:
 * what a node's `open()` calls before it does anything else.
 */
export function refuseParamProblems(node: Node, remedy = "fix the node's params"): void {
  const problems = node.paramProblems();
  if (problems.length === 0) return;
  throw new ConfigError(`node ${node.name}: ${problems.join("; ")}`, remedy, { node: node.name });
}

/**
 * A computational node of a flow. Never subclassed directly: extend {@link ProducerNode},
 * {@link ProcessorNode} or {@link ConsumerNode}.
 */
export abstract class Node<P extends NodeParams = NodeParams> {
  /** Whether the same input always yields the same output. */
  static deterministic: boolean = true;
  /** `recompute` (a redelivered input is processed again) or `committed` (re-published from the ledger). */
  static replayPolicy: ReplayPolicy = ReplayPolicy.recompute;
  /** `cpu` (a short GPU grant still opens, on CPU) or `none` (a short grant refuses to open). */
  static gpuFallback: GpuFallback = GpuFallback.cpu;
  /** A multi-device node whose execution path needs peer access between its devices (RUN-043). */
  static requiresPeerAccess: boolean = false;
  /** The fused execution group this node belongs to (RUN-035); refused at admission today. */
  static executionGroup: string | null = null;
  /** A dynamic-batching contract (RUN-036); refused at admission today. */
  static batchingPolicy: BatchingPolicy | null = null;
  /** The Deno permissions this node's worker gets; `null`: none. */
  static permissions: PermissionDeclaration | null = null;

  /** The params as given (a {@link JoinPolicy} stored as its dict), frozen. */
  readonly params: Readonly<P>;
  readonly #name: string;
  #parents: Node[] = [];
  readonly #children: Node[] = [];

  /**
   * A node holding a frozen copy of its params (the optional `name` among them; `<Class>_<n>` when
   * absent), with no parents and no children yet.
   *
   * @throws NodeContractError when `params` is not one plain object.
   */
  constructor(...[params]: NodeArgs<P>) {
    const stored = normalizeParams(params, new.target);
    this.#name = typeof stored.name === "string" ? stored.name : autoName(new.target);
    this.params = Object.freeze(stored) as unknown as Readonly<P>;
  }

  /** The role this node plays in a compiled flow. */
  abstract get kind(): NodeKind;

  /** The stable, unique-within-a-flow identity: broker subjects, Kubernetes names, logs. */
  get name(): string {
    return this.#name;
  }

  /** The container image declared for this node, or `null` for the deploy-time default. */
  get image(): string | null {
    return (this.params.image ?? null) as string | null;
  }

  /** The parents, in `.from()` order: the order a join receives its inputs in. */
  get parents(): readonly Node[] {
    return [...this.#parents];
  }

  /** Every node wired with this one as a parent, in wiring order. */
  get children(): readonly Node[] {
    return [...this.#children];
  }

  /** The class-level declaration {@link Node.deterministic}. */
  get deterministic(): boolean {
    return (this.constructor as typeof Node).deterministic;
  }

  /** The class-level declaration {@link Node.replayPolicy}. */
  get replayPolicy(): ReplayPolicy {
    return (this.constructor as typeof Node).replayPolicy;
  }

  /** The class-level declaration {@link Node.gpuFallback}. */
  get gpuFallback(): GpuFallback {
    return (this.constructor as typeof Node).gpuFallback;
  }

  /** The class-level declaration {@link Node.requiresPeerAccess}. */
  get requiresPeerAccess(): boolean {
    return (this.constructor as typeof Node).requiresPeerAccess;
  }

  /** The class-level declaration {@link Node.executionGroup}. */
  get executionGroup(): string | null {
    return (this.constructor as typeof Node).executionGroup;
  }

  /** The class-level declaration {@link Node.batchingPolicy}. */
  get batchingPolicy(): BatchingPolicy | null {
    return (this.constructor as typeof Node).batchingPolicy;
  }

  /**
   * The params a worker rebuilds this node from (`new Cls(node.getParams())`): the params as given, with
   * the resolved `name` first. Throws {@link NodeContractError} naming every place that is not plain
   * JSON (see {@link nonJsonPlaces}). The result is a fresh copy.
   */
  getParams(): JsonObject {
    const { name: _given, ...rest } = this.params as Record<string, unknown>;
    const params = { name: this.#name, ...rest };
    const problems = nonJsonPlaces(params, "params");
    if (problems.length > 0) {
      throw new NodeContractError(
        `node ${this.#name}: ${
          problems.map((problem) => `${problem.path} is ${problem.found}`).join("; ")
        }, which is not plain JSON`,
        "pass only strings, finite numbers, booleans, null, arrays and plain objects; reference a function " +
          "as '<module URL>#<export name>' and build other values in open()",
        { node: this.#name, path: problems[0].path },
      );
    }
    return JSON.parse(JSON.stringify(params));
  }

  /** Files this node needs, verified by the worker before `open()` (RUN-033). Default: none. */
  requiredAssets(): readonly AssetRequirement[] {
    return [];
  }

  /**
   * The modules this node imports when it opens, beyond its own class's (their URLs; none by default):
   * an engine loads them with the node's module, before the node's sandbox applies, since a sandboxed
   * node may not read its own flow file.
   */
  preloadModules(): string[] {
    return [];
  }

  /**
   * What is wrong with this node's own params, found without any I/O: one sentence each, none by default.
   * `vf validate` (and every compile) reports each as a `VF_CONFIG` error, so a flow that `open()` would
   * refuse is refused before it runs. Override to check params beyond their types.
   */
  paramProblems(): string[] {
    return [];
  }

  /**
   * The Deno permissions this node's worker gets, every kind present: the class's
   * {@link Node.permissions} declaration, else nothing. Override to derive them from the params.
   */
  permissions(): NodePermissions {
    const declared = (this.constructor as typeof Node).permissions ?? {};
    const granted = {} as Record<PermissionKind, readonly string[]>;
    for (const kind of PERMISSION_KINDS) granted[kind] = [...(declared[kind] ?? [])];
    return granted;
  }

  /** Called once before the first `next`/`process`/`consume`: open files, models, sessions. */
  open(_ctx: RuntimeContext): void | Promise<void> {}

  /** Called once after the last input: release what `open()` acquired. */
  close(_ctx: RuntimeContext): void | Promise<void> {}

  /**
   * Makes `parents` this node's parents (replacing any earlier wiring): a module stands for its exit node.
   * Throws {@link NodeContractError} for a parent that is not a node or cannot have children.
   */
  protected wire(parents: readonly Upstream[]): void {
    const resolved = parents.map((parent) => this.#resolveParent(parent));
    for (const old of this.#parents) {
      const at = old.#children.indexOf(this);
      if (at >= 0) old.#children.splice(at, 1);
    }
    this.#parents = resolved;
    for (const parent of resolved) parent.#children.push(this);
  }

  #resolveParent(parent: unknown): Node {
    if (parent instanceof ModuleNode) return parent.exitNode;
    if (!(parent instanceof Node)) {
      throw new NodeContractError(
        `node ${this.#name}: a parent must be a node, got ${describe(parent)}`,
        "pass producer, processor or module nodes to .from()",
        { node: this.#name },
      );
    }
    if (parent instanceof Leaf) {
      throw new NodeContractError(
        `node ${this.#name}: ${parent.name} is a ${parent.kind} and has no output to consume`,
        "wire from a producer or a processor",
        { node: this.#name, parent: parent.name },
      );
    }
    return parent;
  }
}

/** A node with no input: each `next()` produces one item, {@link END} once the source is exhausted. */
export abstract class ProducerNode<P extends object = object> extends Node<P & ProducerParams> {
  /** The source has a stable position of its own, so a restart re-mints the same message ids (MSGID-6). */
  static replayable: boolean = false;
  /** A replayable source's analysis namespace (`{node}:{analysis_version}:{offset}`); `null`: none. */
  static analysisVersion: string | null = null;

  /** `producer`. */
  get kind(): NodeKind {
    return NodeKind.producer;
  }

  /** Whether `next()` eventually returns {@link END} by itself (a file), rather than only when told (a live stream). */
  get isFinite(): boolean {
    return this.params.isFinite ?? true;
  }

  /** The class-level declaration {@link ProducerNode.replayable}. */
  get replayable(): boolean {
    return (this.constructor as typeof ProducerNode).replayable;
  }

  /** The class-level declaration {@link ProducerNode.analysisVersion}. */
  get analysisVersion(): string | null {
    return (this.constructor as typeof ProducerNode).analysisVersion;
  }

  /** The next item, or {@link END} when the source is exhausted. May be async. */
  abstract next(ctx: RuntimeContext): unknown;

  /**
   * Positions a replayable source so the next `next()` yields item `offset + 1` (`offset` is the last
   * accepted item, 0 for none). The default ignores it: a live source has no position to return to.
   */
  seek(_offset: number, _ctx: RuntimeContext): void | Promise<void> {}
}

/** A node that receives input: it is wired with `.from()` and carries the join and failure knobs. */
export abstract class ReceiverNode<P extends ReceiverParams = ReceiverParams> extends Node<P> {
  /** How a partitioned replica treats an unusable partition key (RUN-020); `null`: reject. */
  static partitionKeyPolicy: PartitionKeyPolicyDeclaration | null = null;
  /**
   * The node needs its input in the order its producer made it (a video encoder): validation warns when
   * an upstream node runs several replicas, which finish items out of order.
   */
  static inputInOrder: boolean = false;

  /** Wires this node to its parents, in the order its inputs arrive in, and returns it. */
  from(...parents: Upstream[]): this {
    this.wire(parents);
    return this;
  }

  /** The class-level declaration {@link ReceiverNode.partitionKeyPolicy}. */
  get partitionKeyPolicy(): PartitionKeyPolicyDeclaration | null {
    return (this.constructor as typeof ReceiverNode).partitionKeyPolicy;
  }

  /** The join policy this node declares (rebuilt from its stored dict), or `null`; throws ConfigError if invalid. */
  get joinPolicy(): JoinPolicy | null {
    const dict = this.params.joinPolicy;
    return dict === undefined || dict === null ? null : JoinPolicy.fromDict(dict);
  }

  /**
   * The ordering this node declares (rebuilt from its stored dict), or `null` for arrival order; throws
   * ConfigError if invalid.
   */
  get orderingPolicy(): OrderingPolicy | null {
    const dict = this.params.ordering;
    return dict === undefined || dict === null ? null : OrderingPolicy.fromDict(dict);
  }

  /** Inputs each replica takes ahead (see {@link ReceiverParams.prefetch}), or `null` for the broker's default. */
  get prefetch(): number | null {
    return this.params.prefetch ?? null;
  }

  /** This node's delivery-mode override, or `null` to inherit the flow's. */
  get delivery(): DeliveryMode | null {
    return this.params.delivery ?? null;
  }

  /** This node's disposition for unclassified exceptions, or `null`. */
  get onError(): Disposition | null {
    return this.params.onError ?? null;
  }

  /**
   * The overrides as the dict `NodeSpec.delivery` carries, or `null` when the node overrides nothing.
   * Throws {@link ConfigError} for an unknown delivery mode or disposition.
   */
  deliveryPolicy(): DeliveryOverride | null {
    return DeliveryPolicy.nodeOverride(this.delivery, this.onError);
  }

  /** The partition key, or `null`: only processors partition. */
  get partitionBy(): string | null {
    return null;
  }
}

/** A node that transforms each input group into one output. */
export abstract class ProcessorNode<P extends object = object> extends ReceiverNode<P & ProcessorParams> {
  /** `processor`. */
  get kind(): NodeKind {
    return NodeKind.processor;
  }

  /** Parallel replicas. */
  get nbTasks(): number {
    return this.params.nbTasks ?? 1;
  }

  /** `cpu` or `gpu`. */
  get deviceType(): DeviceType {
    return this.params.deviceType ?? DeviceType.cpu;
  }

  /** The partition key (`trace_id` or a metadata field), or `null` when replicas compete. */
  override get partitionBy(): string | null {
    return this.params.partitionBy ?? null;
  }

  /** Whole GPUs per replica; 1 when unset. */
  get gpuCount(): number {
    return this.params.gpuCount ?? 1;
  }

  /** Declared GPU memory demand in GiB, or `null`. */
  get gpuMemoryGib(): number | null {
    return this.params.gpuMemoryGib ?? null;
  }

  /**
   * Where each GPU requirement value came from (`node` for an explicit param, `default` for the built-in
   * default), as `{device_type, gpu_count, gpu_memory_gib}` → source. Not a spec field: the compiler
   * collects it beside the specs.
   */
  get gpuProvenance(): GpuFieldMap<DeclarationSource> {
    const declared = nodeDeclarations(this.deviceType, this.params.gpuCount, this.params.gpuMemoryGib);
    return resolveGpuRequirements([...declared, ...builtinDefaults()], `node ${this.name}`).provenance;
  }

  /**
   * The output for one input group: the single parent's output, or an array in `.from()` order for a
   * join. May be async.
   */
  abstract process(input: unknown, ctx: RuntimeContext): unknown;
}

/** A processor that keeps internal state and so always runs as exactly one replica (trackers, aggregators). */
export abstract class OneTaskProcessorNode<P extends object = object> extends ProcessorNode<P> {
  /** Always 1. */
  override get nbTasks(): number {
    return 1;
  }
}

/** A node with no children: nothing may be wired from it. */
export abstract class Leaf<P extends ReceiverParams = ReceiverParams> extends ReceiverNode<P> {}

/** A sink: consumes each input group and publishes nothing. */
export abstract class ConsumerNode<P extends object = object> extends Leaf<P & ConsumerParams> {
  /** `at_least_once` (a redelivery may repeat an effect) or `idempotent_key` (keyed by `ctx.inputKey`). */
  static effectGuarantee: EffectGuarantee = EffectGuarantee.atLeastOnce;

  /** `consumer`. */
  get kind(): NodeKind {
    return NodeKind.consumer;
  }

  /** Whether the consumer receives its parents' metadata instead of their output. */
  get metadata(): boolean {
    return this.params.metadata ?? false;
  }

  /** Whether side effects are deduplicated across redelivery. */
  get idempotent(): boolean {
    return this.params.idempotent ?? false;
  }

  /** The class-level declaration {@link ConsumerNode.effectGuarantee}. */
  get effectGuarantee(): EffectGuarantee {
    return (this.constructor as typeof ConsumerNode).effectGuarantee;
  }

  /** Consumes one input group (an array in `.from()` order for a join). May be async. */
  abstract consume(input: unknown, ctx: RuntimeContext): unknown;
}

/** A function a {@link FunctionProcessorNode} applies. */
export type ProcessFunction = (input: unknown, ctx: RuntimeContext) => unknown;

/**
 * A processor that applies an exported function. A function is not JSON, so the node takes a reference
 * `fn: "<module URL>#<export name>"` (e.g. `` `${import.meta.url}#double` ``) and imports it in `open()`;
 * with a ModuleIndex, `validate` checks the reference names an exported function.
 */
export class FunctionProcessorNode extends ProcessorNode<{ readonly fn: string }> {
  #fn: ProcessFunction | null = null;

  /** The referenced function's module (none for a reference that does not parse: validation reports it). */
  override preloadModules(): string[] {
    try {
      return [parseExportRef(this.params.fn).url];
    } catch {
      return [];
    }
  }

  /** Imports the referenced function. Throws {@link NodeContractError} if it is not an exported function. */
  override async open(_ctx: RuntimeContext): Promise<void> {
    const fn = await importExport(this.params.fn);
    if (typeof fn !== "function") {
      throw new NodeContractError(
        `node ${this.name}: ${this.params.fn} is not a function`,
        "reference an exported function",
        { node: this.name },
      );
    }
    this.#fn = fn as ProcessFunction;
  }

  /** Applies the function. Throws {@link NodeContractError} before `open()`. */
  process(input: unknown, ctx: RuntimeContext): unknown {
    if (this.#fn === null) {
      throw new NodeContractError(`node ${this.name}: process() before open()`, "open the node first", {
        node: this.name,
      });
    }
    return this.#fn(input, ctx);
  }
}

/** The processors between an entry and an exit node, in dependency order; throws ConfigError otherwise. */
function subgraphBetween(entry: ProcessorNode, exit: ProcessorNode, what: string): ProcessorNode[] {
  const order: ProcessorNode[] = [];
  const state = new Map<Node, "open" | "done">();
  const visit = (node: Node): void => {
    if (state.get(node) === "done") return;
    if (state.get(node) === "open") {
      throw new ConfigError(`${what}: the subgraph has a cycle through ${node.name}`, "remove the cycle");
    }
    if (!(node instanceof ProcessorNode)) {
      throw new ConfigError(
        `${what}: ${node.name} is a ${node.kind}; a module holds processors only`,
        "put only processors between the entry and the exit node",
      );
    }
    state.set(node, "open");
    if (node !== entry) {
      if (node.parents.length === 0) {
        throw new ConfigError(
          `${what}: the exit node ${exit.name} is not reachable from the entry node ${entry.name} ` +
            `(${node.name} has no parent inside the module)`,
          "wire every node of the module, down from the entry node",
        );
      }
      node.parents.forEach(visit);
    }
    state.set(node, "done");
    order.push(node);
  };
  visit(exit);
  return order;
}

function moduleEndpoint(node: ProcessorNode | ModuleNode, end: "entryNode" | "exitNode"): ProcessorNode {
  return node instanceof ModuleNode ? node[end] : node;
}

/**
 * A subgraph of processors with one entry and one exit node, wired as one unit: `module.from(p)` wires
 * the entry node, and `.from(module)` wires from the exit node. It is expanded where it is wired, so
 * nothing of it remains in the compiled flow but its processors.
 */
export class ModuleNode {
  /** The processor the module's parents feed. */
  readonly entryNode: ProcessorNode;
  /** The processor whose output is the module's output. */
  readonly exitNode: ProcessorNode;
  readonly #nodes: readonly ProcessorNode[];

  /**
   * Throws {@link ConfigError} if a node between entry and exit is not a processor, the subgraph has a
   * cycle, or the exit node is not reachable from the entry node.
   */
  constructor(entry: ProcessorNode | ModuleNode, exit: ProcessorNode | ModuleNode) {
    this.entryNode = moduleEndpoint(entry, "entryNode");
    this.exitNode = moduleEndpoint(exit, "exitNode");
    this.#nodes = subgraphBetween(this.entryNode, this.exitNode, "ModuleNode");
  }

  /** The module's processors, entry first, in dependency order. */
  get nodes(): readonly ProcessorNode[] {
    return this.#nodes;
  }

  /** Wires the entry node to `parents` and returns the module. */
  from(...parents: Upstream[]): this {
    this.entryNode.from(...parents);
    return this;
  }
}

/**
 * A processor that runs a subgraph of processors in one task. It wraps live node references, so it has
 * no params a worker could rebuild it from: `getParams()` throws {@link NodeContractError}, and `validate`
 * reports it (the spec's "no distributed support"). Use {@link ModuleNode} to group nodes instead.
 */
export class TaskModuleNode extends ProcessorNode {
  readonly #nodes: readonly ProcessorNode[];
  readonly #entry: ProcessorNode;

  /**
   * Throws {@link ConfigError} if the subgraph holds anything but processors, a TaskModuleNode or a GPU
   * node, has a cycle, does not reach the exit node, or holds a one-task processor while `nbTasks > 1`.
   */
  constructor(entry: ProcessorNode, exit: ProcessorNode, params: ProcessorParams = {}) {
    super(params);
    this.#entry = entry;
    this.#nodes = subgraphBetween(entry, exit, `TaskModuleNode ${this.name}`);
    for (const node of this.#nodes) {
      const problem = node instanceof TaskModuleNode
        ? "is a TaskModuleNode; they do not nest"
        : node.deviceType === DeviceType.gpu
        ? "runs on GPU; a TaskModuleNode runs on CPU only"
        : node instanceof OneTaskProcessorNode && this.nbTasks > 1
        ? "is a one-task processor, but the module runs several tasks"
        : null;
      if (problem) {
        throw new ConfigError(`TaskModuleNode ${this.name}: ${node.name} ${problem}`, "change the subgraph");
      }
    }
  }

  /** The wrapped processors, entry first, in dependency order. */
  get nodes(): readonly ProcessorNode[] {
    return this.#nodes;
  }

  /** Always throws {@link NodeContractError}: live node references cannot cross into a worker. */
  override getParams(): JsonObject {
    throw new NodeContractError(
      `node ${this.name}: a TaskModuleNode wraps live node references and cannot be rebuilt in a worker`,
      "use a ModuleNode (its processors run as ordinary nodes) or one processor that does the work",
      { node: this.name },
    );
  }

  /** Opens every wrapped processor, entry first. */
  override async open(ctx: RuntimeContext): Promise<void> {
    for (const node of this.#nodes) await node.open(ctx);
  }

  /** Closes every wrapped processor, exit first. */
  override async close(ctx: RuntimeContext): Promise<void> {
    for (const node of [...this.#nodes].reverse()) await node.close(ctx);
  }

  /** Runs the subgraph on one input: each processor gets its parents' outputs, the exit's is returned. */
  async process(input: unknown, ctx: RuntimeContext): Promise<unknown> {
    const outputs = new Map<Node, unknown>();
    let last: unknown = undefined;
    for (const node of this.#nodes) {
      const parents = node.parents.map((parent) => outputs.get(parent));
      const nodeInput = node === this.#entry ? input : parents.length === 1 ? parents[0] : parents;
      last = await node.process(nodeInput, ctx);
      outputs.set(node, last);
    }
    return last;
  }
}
