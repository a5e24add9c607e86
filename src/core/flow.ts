/**
 * A flow: the graph a user wired, named by its consumers (spec core.flow). Producers are found by walking
 * parents back from the consumers. A flow file exports its `Flow` as the default export; the CLI
 * validates, compiles and runs it (the file never runs itself).
 *
 * ```ts
 * export default new Flow([print], { flowType: "batch", flowId: "squares" });
 * ```
 *
 * @module
 */

import { ConfigError, Diagnostic, GraphError, raiseForDiagnostics } from "./errors.ts";
import { childrenWithin, discoverNodes, topologicalSort, validate } from "./graph.ts";
import type { ModuleIndex } from "./node_class.ts";
import type { ConsumerNode } from "./node.ts";
import { describe, Node, ProducerNode } from "./node.ts";
import { checkFlowType, FlowType } from "./flow_type.ts";
import { randomHex } from "./hex.ts";

export { FLOW_TYPES, FlowType } from "./flow_type.ts";

/** Options of a {@link Flow}. */
export interface FlowOptions {
  /** `realtime` (default) or `batch`. */
  readonly flowType?: FlowType;
  /** Stable identity across runs (broker subjects, Kubernetes resources); generated when absent. */
  readonly flowId?: string;
}

/** The keys {@link FlowOptions} has. */
const FLOW_OPTION_KEYS: readonly string[] = ["flowType", "flowId"];

/** One task to allocate: a node, its parents' names in `.from()` order, and whether nothing consumes it. */
export interface TaskData {
  /** The node to run. */
  readonly node: Node;
  /** Its parents' names, in `.from()` order. */
  readonly parentNames: readonly string[];
  /** Whether nothing in the flow consumes the node's output. */
  readonly isLast: boolean;
}

/**
 * A fresh flow id: `flow-` and 8 random lowercase hex digits, unchanged by the broker and Kubernetes
 * name encoders.
 */
export function generateFlowId(): string {
  return `flow-${randomHex(4)}`;
}

/**
 * The graph from the given consumers back to its producers, with a flow type and a flow id. Construction
 * checks only the options (a {@link ConfigError} for an unknown flow type or an empty flow id); the graph
 * is checked by {@link Flow.validate}, which reports every problem at once.
 */
export class Flow {
  readonly #consumers: readonly ConsumerNode[];
  readonly #flowType: FlowType;
  readonly #flowId: string;

  /**
   * The flow ending in `consumers`; throws {@link ConfigError} for an unknown or bad option or a non-list,
   * and one {@link GraphError} naming every entry of the list that is not a node.
   */
  constructor(consumers: readonly ConsumerNode[], options: FlowOptions = {}) {
    if (!Array.isArray(consumers)) {
      throw new ConfigError("a Flow takes the list of its consumers", "pass new Flow([sink, ...], options)");
    }
    const strangers = consumers.flatMap((entry, at) =>
      entry instanceof Node ? [] : [
        new Diagnostic(
          "error",
          GraphError.code,
          null,
          `the Flow's consumer list holds ${describe(entry)} at position ${at}, which is not a node`,
          "list the flow's sink nodes (new Flow([sink, ...])), each built with new and wired with .from()",
        ),
      ]
    );
    raiseForDiagnostics(strangers);
    if (typeof options !== "object" || options === null || Array.isArray(options)) {
      throw new ConfigError(
        `a Flow's options must be an object, got ${describe(options)}`,
        `pass { ${FLOW_OPTION_KEYS.join(", ")} }, or nothing`,
      );
    }
    const unknown = Object.keys(options).filter((key) => !FLOW_OPTION_KEYS.includes(key));
    if (unknown.length > 0) {
      throw new ConfigError(
        `unknown Flow option${unknown.length === 1 ? "" : "s"} ${
          unknown.map((k) => JSON.stringify(k)).join(", ")
        }`,
        `a Flow takes ${FLOW_OPTION_KEYS.join(" and ")}; node settings go on the nodes`,
        { options: unknown },
      );
    }
    const flowType = checkFlowType(options.flowType ?? FlowType.realtime);
    const flowId = options.flowId ?? generateFlowId();
    if (typeof flowId !== "string" || flowId === "") {
      throw new ConfigError(
        `flowId must be a non-empty string, got ${JSON.stringify(flowId)}`,
        "pass a stable name such as 'squares', or omit flowId to generate one",
      );
    }
    this.#consumers = [...consumers];
    this.#flowType = flowType;
    this.#flowId = flowId;
  }

  /** `realtime` or `batch`. */
  get flowType(): FlowType {
    return this.#flowType;
  }

  /** The flow's stable identity. */
  get flowId(): string {
    return this.#flowId;
  }

  /** The consumers the flow was built from, in the order given. */
  get consumers(): readonly ConsumerNode[] {
    return this.#consumers;
  }

  /** Every node of the flow, in discovery order (see graph.ts). */
  get nodes(): readonly Node[] {
    return discoverNodes(this.#consumers);
  }

  /** The producers found by walking parents back from the consumers, in discovery order. */
  get producers(): readonly ProducerNode[] {
    return this.nodes.filter((node) => node instanceof ProducerNode);
  }

  /** The children of `node` that belong to this flow, in wiring order. */
  childrenOf(node: Node): readonly Node[] {
    return childrenWithin(node, new Set(this.nodes));
  }

  /**
   * Every problem with the flow's graph, errors first then warnings (see graph.ts `validate`); with
   * `modules`, node classes must be exported from one of them.
   */
  validate(modules?: ModuleIndex): Diagnostic[] {
    return validate(this.producers, this.#consumers, { modules });
  }

  /**
   * The nodes parents-first, ties broken by discovery order; deterministic for a given wiring. Throws
   * GraphError when the graph has a cycle.
   */
  topologicalSort(): Node[] {
    return topologicalSort(this.#consumers);
  }

  /**
   * One entry per node in topological order, after validating the flow: throws one GraphError listing
   * every error found.
   */
  tasksData(modules?: ModuleIndex): TaskData[] {
    raiseForDiagnostics(this.validate(modules));
    const members = new Set(this.nodes);
    return this.topologicalSort().map((node) => ({
      node,
      parentNames: node.parents.map((parent) => parent.name),
      isLast: childrenWithin(node, members).length === 0,
    }));
  }
}
