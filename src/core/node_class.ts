/**
 * Which module a node class comes from (`NodeSpec.node_class` is `<module URL>#<export name>`), and the
 * way back: a JavaScript class does not know its module, so a {@link ModuleIndex} holds (module URL,
 * namespace) pairs and resolves a constructor to the first export that IS that constructor. Built-in node
 * modules are registered once with {@link registerNodeModule}; the CLI adds the flow file's module to
 * its index. {@link loadNodeClass} and {@link rebuildNode} are what a worker uses to get the node back.
 *
 * ```ts
 * import * as flowModule from "./flow.ts";
 * const index = new ModuleIndex().add(new URL("./flow.ts", import.meta.url).href, flowModule);
 * index.resolve(flowModule.Count); // "file:///…/flow.ts#Count"
 * ```
 *
 * @module
 */

import { ConfigError, NodeContractError } from "./errors.ts";
import type { JsonObject, NodeKind } from "./node.ts";
import { importExport, Node, parseExportRef } from "./node.ts";

/** One module a class may be exported from: its URL and its namespace object (`import * as ns`). */
export interface ModuleEntry {
  /** The module's URL, as a `node_class` reference names it before the `#`. */
  readonly url: string;
  /** The module's exports by name. */
  readonly namespace: Readonly<Record<string, unknown>>;
}

/** A concrete node class as a worker instantiates it. */
export type NodeClass = new (params: JsonObject) => Node;

function moduleEntry(url: string, namespace: object): ModuleEntry {
  let parsed: URL | null = null;
  try {
    parsed = new URL(url);
  } catch {
    parsed = null;
  }
  if (parsed === null || parsed.hash !== "") {
    throw new ConfigError(
      `${JSON.stringify(url)} is not an absolute module URL`,
      "register a module by its import.meta.url (or new URL(path, import.meta.url).href)",
      { url },
    );
  }
  if (typeof namespace !== "object" || namespace === null) {
    throw new ConfigError(`the namespace of ${url} is not an object`, "pass the module's `import * as ns`", {
      url,
    });
  }
  return { url, namespace: namespace as Readonly<Record<string, unknown>> };
}

const registered: ModuleEntry[] = [];

/**
 * Registers a module of built-in node classes for every {@link ModuleIndex}, ahead of the modules an
 * index adds itself. Registering a URL again replaces its namespace. Throws {@link ConfigError} for a
 * URL that is not absolute.
 */
export function registerNodeModule(url: string, namespace: object): void {
  const entry = moduleEntry(url, namespace);
  const at = registered.findIndex((existing) => existing.url === url);
  if (at >= 0) registered[at] = entry;
  else registered.push(entry);
}

/**
 * The modules node classes and functions are resolved against: every module registered with
 * {@link registerNodeModule} (in registration order, read at lookup time), then the ones added to this
 * index (in the order added). Within a module, exports are tried in the namespace's order, which ES
 * modules define as sorted by name.
 */
export class ModuleIndex {
  readonly #added: ModuleEntry[] = [];

  /** An index holding the registered modules and `modules`. Throws {@link ConfigError} for a bad URL. */
  constructor(modules: Iterable<ModuleEntry> = []) {
    for (const { url, namespace } of modules) this.add(url, namespace);
  }

  /** Adds a module (URL and namespace) after the ones already held; returns this index. */
  add(url: string, namespace: object): this {
    this.#added.push(moduleEntry(url, namespace));
    return this;
  }

  /** Every module held, registered ones first. */
  get modules(): readonly ModuleEntry[] {
    return [...registered, ...this.#added];
  }

  /** The first `<module URL>#<export name>` whose export is exactly `value`, or `null`. */
  resolve(value: unknown): string | null {
    for (const { url, namespace } of this.modules) {
      for (const [name, exported] of Object.entries(namespace)) {
        if (exported === value) return `${url}#${name}`;
      }
    }
    return null;
  }

  /** The `node_class` reference of a node, or `null` when its class is exported by no module held. */
  nodeClassOf(node: Node): string | null {
    return this.resolve(node.constructor);
  }

  /**
   * The value an export reference names among the modules held, or `undefined` when no module held has
   * that URL or that export. Throws {@link NodeContractError} for a malformed reference.
   */
  lookup(ref: string): unknown {
    const { url, exportName } = parseExportRef(ref);
    for (const entry of this.modules) {
      if (entry.url === url && Object.hasOwn(entry.namespace, exportName)) return entry.namespace[exportName];
    }
    return undefined;
  }
}

/** Whether `value` is a class whose instances are nodes. */
export function isNodeClass(value: unknown): value is NodeClass {
  return typeof value === "function" && value.prototype instanceof Node;
}

/**
 * Imports a `node_class` reference and returns the class. Throws {@link NodeContractError} when the
 * reference is malformed, the module cannot be imported, the export is missing, or it is not a node class.
 */
export async function loadNodeClass(nodeClass: string): Promise<NodeClass> {
  const value = await importExport(nodeClass);
  if (!isNodeClass(value)) {
    throw new NodeContractError(
      `${nodeClass} is not a node class`,
      "reference a class that extends ProducerNode, ProcessorNode or ConsumerNode",
      { node_class: nodeClass },
    );
  }
  return value;
}

/**
 * Rebuilds a node as its worker does: `new Cls(params)` for the class `nodeClass` names, checked to be of
 * `kind` and, when the params carry one, to have the same name. Throws {@link NodeContractError} if
 * anything differs or the constructor throws.
 */
export async function rebuildNode(nodeClass: string, params: JsonObject, kind: NodeKind): Promise<Node> {
  const cls = await loadNodeClass(nodeClass);
  let node: Node;
  try {
    node = new cls(params);
  } catch (error) {
    throw new NodeContractError(
      `${nodeClass} cannot be rebuilt from its params: ${
        error instanceof Error ? error.message : String(error)
      }`,
      "make the constructor accept exactly what getParams() returns",
      { node_class: nodeClass },
    );
  }
  const problem = node.kind !== kind
    ? `is a ${node.kind}, but the spec says ${kind}`
    : typeof params.name === "string" && node.name !== params.name
    ? `is named ${node.name}, but its params name ${params.name}`
    : null;
  if (problem) {
    throw new NodeContractError(`${nodeClass} ${problem}`, "recompile the flow with the current code", {
      node_class: nodeClass,
    });
  }
  return node;
}
