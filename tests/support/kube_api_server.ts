/**
 * A small Kubernetes API server for tests, in process (`Deno.serve` on 127.0.0.1, a free port): the
 * discovery documents and the REST paths of the kinds videoflow writes (ConfigMap, Service, Namespace,
 * Node, Job, Deployment, StatefulSet, KEDA's ScaledObject), each namespaced or cluster-scoped as on a real
 * cluster, answering with `Status` bodies as the API server does.
 *
 * What it honours, because the code under test depends on it:
 * - every write bumps the one cluster-wide `resourceVersion` counter; a write that changes nothing (a
 *   repeated server-side apply) keeps the object's version;
 * - a `metadata.resourceVersion` in a PUT, an apply or a patched object, and `preconditions` of a DELETE,
 *   are preconditions: a stale one is `409 Conflict`, nothing written;
 * - JSON patch (RFC 6902, every op) with `test` ops: a failed test is `422`, nothing written; JSON merge
 *   patch (RFC 7386); server-side apply (`application/apply-patch+yaml`, `fieldManager` required),
 *   creating the object or merging the applied configuration into it, dropping the fields that manager
 *   applied before and applies no more;
 * - label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!` not exists) compared exactly;
 * - an object in a namespace that does not exist is `404`, and a Job's `spec.template` is immutable;
 * - with a token, every request without `Authorization: Bearer TOKEN` is `401`;
 * - a test may refuse requests ({@link KubeApiServer.refuse}: an outage, a forbidden read), and reads
 *   back every write that was kept ({@link KubeApiServer.writes}, with its body).
 *
 * What it leaves out: field-manager conflicts (`force` is accepted and changes nothing), strategic
 * merge patch (`415`), watches, defaulting, controllers (a Job completes only when a test says so,
 * {@link KubeApiServer.finishJob}), and the merging of keyed lists (a list is applied whole).
 *
 * @module
 */

import { parse as parseYaml } from "yaml";

/** One kind the server serves. */
export interface ServedKind {
  /** `v1`, `batch/v1`, `keda.sh/v1alpha1`. */
  readonly apiVersion: string;
  /** Its kind. */
  readonly kind: string;
  /** The resource name in paths: `configmaps`. */
  readonly plural: string;
  /** Whether it lives in a namespace. */
  readonly namespaced: boolean;
}

/** The kinds a cluster with KEDA installed serves here. */
export const KUBERNETES_KINDS: readonly ServedKind[] = [
  { apiVersion: "v1", kind: "Namespace", plural: "namespaces", namespaced: false },
  { apiVersion: "v1", kind: "Node", plural: "nodes", namespaced: false },
  { apiVersion: "v1", kind: "Pod", plural: "pods", namespaced: true },
  { apiVersion: "v1", kind: "ConfigMap", plural: "configmaps", namespaced: true },
  { apiVersion: "v1", kind: "Service", plural: "services", namespaced: true },
  { apiVersion: "batch/v1", kind: "Job", plural: "jobs", namespaced: true },
  { apiVersion: "apps/v1", kind: "Deployment", plural: "deployments", namespaced: true },
  { apiVersion: "apps/v1", kind: "StatefulSet", plural: "statefulsets", namespaced: true },
  { apiVersion: "keda.sh/v1alpha1", kind: "ScaledObject", plural: "scaledobjects", namespaced: true },
];

/** How the server starts. */
export interface KubeApiServerOptions {
  /** The namespaces that exist (`default` unless told). */
  readonly namespaces?: readonly string[];
  /** The kinds served ({@link KUBERNETES_KINDS}); leave KEDA out for a cluster without it. */
  readonly kinds?: readonly ServedKind[];
  /** The bearer token every request must carry; none checked when absent. */
  readonly token?: string;
}

/** A stored object: plain JSON. */
export type StoredObject = Record<string, unknown> & {
  apiVersion: string;
  kind: string;
  metadata: Record<string, unknown> & { name: string; resourceVersion: string };
};

/** One request as the server saw it. */
export interface SeenRequest {
  /** The HTTP method. */
  readonly method: string;
  /** The URL path. */
  readonly path: string;
  /** The query string, with its `?`. */
  readonly query: string;
  /** The request's content type. */
  readonly contentType: string | null;
}

/** A write the server kept (answered 2xx), with its body as sent. */
export interface KeptWrite extends SeenRequest {
  /** The request body. */
  readonly body: string;
}

type Json = Record<string, unknown>;

class ApiFailure extends Error {
  constructor(readonly code: number, readonly reason: string, message: string, readonly details: Json = {}) {
    super(message);
  }
}

const REASONS: Record<number, string> = {
  400: "BadRequest",
  401: "Unauthorized",
  403: "Forbidden",
  404: "NotFound",
  405: "MethodNotAllowed",
  409: "Conflict",
  415: "UnsupportedMediaType",
  422: "Invalid",
  503: "ServiceUnavailable",
  504: "Timeout",
};

function failure(code: number, message: string, details: Json = {}, reason = REASONS[code]): ApiFailure {
  return new ApiFailure(code, reason, message, details);
}

function statusBody(code: number, reason: string, message: string, details: Json): Json {
  return {
    kind: "Status",
    apiVersion: "v1",
    metadata: {},
    status: "Failure",
    message,
    reason,
    details,
    code,
  };
}

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function deepEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (Array.isArray(a) && Array.isArray(b)) {
    return a.length === b.length && a.every((item, i) => deepEqual(item, b[i]));
  }
  if (isObject(a) && isObject(b)) {
    const keys = Object.keys(a);
    return keys.length === Object.keys(b).length && keys.every((k) => k in b && deepEqual(a[k], b[k]));
  }
  return false;
}

/** `target` with `applied` merged in: maps recursively, anything else replaced. */
function mergeInto(target: Json, applied: Json): Json {
  const merged: Json = { ...target };
  for (const [key, value] of Object.entries(applied)) {
    merged[key] = isObject(value) && isObject(merged[key]) ? mergeInto(merged[key] as Json, value) : value;
  }
  return merged;
}

/** `target` without the fields `previous` held and `current` does not (a manager's dropped fields). */
function dropRemoved(target: Json, previous: Json, current: Json): Json {
  const result: Json = { ...target };
  for (const [key, value] of Object.entries(previous)) {
    if (!(key in current)) delete result[key];
    else if (isObject(value) && isObject(current[key]) && isObject(result[key])) {
      result[key] = dropRemoved(result[key] as Json, value, current[key] as Json);
    }
  }
  return result;
}

/** RFC 7386 merge patch. */
function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isObject(patch)) return patch;
  const result: Json = isObject(target) ? { ...target } : {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete result[key];
    else result[key] = mergePatch(result[key], value);
  }
  return result;
}

function pointer(path: string): string[] {
  if (path === "") return [];
  if (!path.startsWith("/")) throw failure(422, `invalid JSON pointer ${JSON.stringify(path)}`);
  return path.slice(1).split("/").map((token) => token.replaceAll("~1", "/").replaceAll("~0", "~"));
}

function parentOf(document: unknown, tokens: string[], path: string): unknown {
  let node = document;
  for (const token of tokens.slice(0, -1)) {
    if (Array.isArray(node)) node = node[Number(token)];
    else if (isObject(node)) node = node[token];
    else node = undefined;
    if (node === undefined) throw failure(422, `path ${path} does not exist: missing ${token}`);
  }
  if (!Array.isArray(node) && !isObject(node)) throw failure(422, `path ${path} has no container`);
  return node;
}

function arrayIndex(array: unknown[], token: string, path: string, forAdd: boolean): number {
  const index = token === "-" && forAdd ? array.length : Number(token);
  const limit = forAdd ? array.length : array.length - 1;
  if (!/^(0|[1-9][0-9]*|-)$/.test(token) || !Number.isInteger(index) || index < 0 || index > limit) {
    throw failure(422, `index ${token} is out of range at ${path}`);
  }
  return index;
}

function readAt(document: unknown, path: string): unknown {
  let node = document;
  for (const token of pointer(path)) {
    if (Array.isArray(node)) node = node[Number(token)];
    else if (isObject(node)) node = token in node ? node[token] : undefined;
    else node = undefined;
    if (node === undefined) throw failure(422, `path ${path} does not exist`);
  }
  return node;
}

function removeAt(document: unknown, path: string): unknown {
  const tokens = pointer(path);
  if (tokens.length === 0) throw failure(422, "cannot remove the whole document");
  const parent = parentOf(document, tokens, path);
  const last = tokens[tokens.length - 1];
  if (Array.isArray(parent)) return parent.splice(arrayIndex(parent, last, path, false), 1)[0];
  const object = parent as Json;
  if (!(last in object)) throw failure(422, `path ${path} does not exist`);
  const value = object[last];
  delete object[last];
  return value;
}

function addAt(document: unknown, path: string, value: unknown, replace: boolean): unknown {
  const tokens = pointer(path);
  if (tokens.length === 0) return structuredClone(value);
  const parent = parentOf(document, tokens, path);
  const last = tokens[tokens.length - 1];
  if (Array.isArray(parent)) {
    const index = arrayIndex(parent, last, path, !replace);
    parent.splice(index, replace ? 1 : 0, structuredClone(value));
  } else {
    if (replace && !(last in (parent as Json))) throw failure(422, `path ${path} does not exist`);
    (parent as Json)[last] = structuredClone(value);
  }
  return document;
}

/** RFC 6902 JSON patch: every op; a failed `test` throws 422, and nothing is kept. */
function jsonPatch(target: Json, operations: unknown): Json {
  if (!Array.isArray(operations)) throw failure(400, "a JSON patch is a list of operations");
  let document: unknown = structuredClone(target);
  for (const operation of operations) {
    if (!isObject(operation) || typeof operation.path !== "string") {
      throw failure(400, `not a JSON patch operation: ${JSON.stringify(operation)}`);
    }
    const path = operation.path;
    switch (operation.op) {
      case "add":
        document = addAt(document, path, operation.value, false);
        break;
      case "replace":
        document = addAt(document, path, operation.value, true);
        break;
      case "remove":
        removeAt(document, path);
        break;
      case "move":
      case "copy": {
        if (typeof operation.from !== "string") throw failure(400, `${operation.op} needs from`);
        const value = operation.op === "move"
          ? removeAt(document, operation.from)
          : structuredClone(readAt(document, operation.from));
        document = addAt(document, path, value, false);
        break;
      }
      case "test":
        if (!deepEqual(readAt(document, path), operation.value)) {
          throw failure(422, `testing value ${path} failed: test failed`);
        }
        break;
      default:
        throw failure(400, `unknown JSON patch op ${JSON.stringify(operation.op)}`);
    }
  }
  if (!isObject(document)) throw failure(422, "the patched object is not an object");
  return document;
}

interface Requirement {
  readonly key: string;
  readonly op: "in" | "notin" | "exists" | "absent";
  readonly values: readonly string[];
}

const LABEL_KEY = /^([a-z0-9]([-a-z0-9.]*[a-z0-9])?\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const LABEL_VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$/;

/** Splits a selector on the commas outside `(…)`. */
function selectorTerms(selector: string): string[] {
  const terms: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < selector.length; i++) {
    if (selector[i] === "(") depth++;
    else if (selector[i] === ")") depth--;
    else if (selector[i] === "," && depth === 0) {
      terms.push(selector.slice(start, i));
      start = i + 1;
    }
  }
  terms.push(selector.slice(start));
  return terms.map((term) => term.trim()).filter((term) => term !== "");
}

function checkedKey(key: string, selector: string): string {
  if (!LABEL_KEY.test(key)) throw failure(400, `unable to parse requirement: invalid label key ${key}`);
  if (selector === "") throw failure(400, "empty selector");
  return key;
}

function checkedValues(values: string[]): string[] {
  for (const value of values) {
    if (!LABEL_VALUE.test(value)) throw failure(400, `invalid label value: ${JSON.stringify(value)}`);
  }
  return values;
}

/** Parses a label selector as the API server does (equality- and set-based); a bad one is 400. */
function parseSelector(selector: string): Requirement[] {
  return selectorTerms(selector).map((term) => {
    let match = /^(\S+?)\s*(==|!=|=)\s*(\S*)$/.exec(term);
    if (match) {
      const values = checkedValues([match[3]]);
      return { key: checkedKey(match[1], selector), op: match[2] === "!=" ? "notin" : "in", values };
    }
    match = /^(\S+)\s+(in|notin)\s*\(([^)]*)\)$/.exec(term);
    if (match) {
      const values = checkedValues(match[3].split(",").map((v) => v.trim()));
      return { key: checkedKey(match[1], selector), op: match[2] as "in" | "notin", values };
    }
    if (term.startsWith("!")) {
      return { key: checkedKey(term.slice(1).trim(), selector), op: "absent", values: [] };
    }
    return { key: checkedKey(term, selector), op: "exists", values: [] };
  });
}

function matches(labels: Record<string, string>, requirements: readonly Requirement[]): boolean {
  return requirements.every(({ key, op, values }) => {
    const has = Object.hasOwn(labels, key);
    switch (op) {
      case "in":
        return has && values.includes(labels[key]);
      case "notin":
        return !has || !values.includes(labels[key]);
      case "exists":
        return has;
      case "absent":
        return !has;
    }
  });
}

const NAME = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;
const PROPAGATION = ["Orphan", "Background", "Foreground"];

/** What a path names. */
interface Target {
  readonly served: ServedKind;
  readonly namespace: string | null;
  readonly name: string | null;
}

/** A small Kubernetes API server for tests (see the module doc). */
export class KubeApiServer {
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  readonly #kinds: readonly ServedKind[];
  readonly #token: string | null;
  readonly #objects = new Map<string, StoredObject>();
  /** Per object key, per field manager: the configuration it last applied. */
  readonly #applied = new Map<string, Map<string, Json>>();
  readonly #waiters = new Map<string, ((object: StoredObject) => void)[]>();
  #version = 0;
  #uid = 0;
  /** Every request, in order. */
  readonly requests: SeenRequest[] = [];
  /** Every write that was kept, in order. */
  readonly writes: KeptWrite[] = [];
  /** Awaited before each request is served: a test's other writer can act between two of a client's. */
  beforeRequest: ((request: SeenRequest) => Promise<void> | void) | null = null;
  /** Asked before each request is served: a status code refuses it with that code, nothing done. */
  refuse: ((request: SeenRequest) => number | null) | null = null;

  private constructor(options: KubeApiServerOptions) {
    this.#kinds = options.kinds ?? KUBERNETES_KINDS;
    this.#token = options.token ?? null;
    for (const namespace of options.namespaces ?? ["default"]) {
      this.seed({ apiVersion: "v1", kind: "Namespace", metadata: { name: namespace } });
    }
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      (request) => this.#handle(request),
    );
  }

  /** Starts a server; {@link close} stops it. */
  static start(options: KubeApiServerOptions = {}): KubeApiServer {
    return new KubeApiServer(options);
  }

  /** The server's base URL, `http://127.0.0.1:PORT`. */
  get url(): string {
    return `http://127.0.0.1:${this.#server.addr.port}`;
  }

  /** Stops serving. */
  async close(): Promise<void> {
    await this.#server.shutdown();
  }

  #served(apiVersion: string, kind: string): ServedKind {
    const served = this.#kinds.find((k) => k.apiVersion === apiVersion && k.kind === kind);
    if (served === undefined) throw new Error(`${apiVersion} ${kind} is not served`);
    return served;
  }

  #key(served: ServedKind, namespace: string | null, name: string): string {
    return `${served.apiVersion}/${served.plural}/${namespace ?? ""}/${name}`;
  }

  /** Whether the server serves `apiVersion`/`kind`. */
  serves(apiVersion: string, kind: string): boolean {
    return this.#kinds.some((k) => k.apiVersion === apiVersion && k.kind === kind);
  }

  /** A copy of the stored object, or undefined. */
  get(apiVersion: string, kind: string, namespace: string | null, name: string): StoredObject | undefined {
    const object = this.#objects.get(this.#key(this.#served(apiVersion, kind), namespace, name));
    return object === undefined ? undefined : structuredClone(object);
  }

  /** Copies of every stored object of a kind, in every namespace. */
  all(apiVersion: string, kind: string): StoredObject[] {
    const served = this.#served(apiVersion, kind);
    const prefix = `${served.apiVersion}/${served.plural}/`;
    return [...this.#objects.entries()].filter(([key]) => key.startsWith(prefix)).map(([, o]) =>
      structuredClone(o)
    );
  }

  /** Stores `object` as another client would create it (no field manager); returns the stored copy. */
  seed(object: Json): StoredObject {
    const served = this.#served(String(object.apiVersion), String(object.kind));
    const metadata = object.metadata as Json;
    const namespace = served.namespaced ? String(metadata.namespace) : null;
    return structuredClone(this.#create(served, namespace, String(metadata.name), object));
  }

  /** Writes `object` over the stored one as another client would, with no precondition; returns the stored copy. */
  overwrite(object: Json): StoredObject {
    const served = this.#served(String(object.apiVersion), String(object.kind));
    const metadata = { ...(object.metadata as Json) };
    delete metadata.resourceVersion;
    const key = this.#key(
      served,
      served.namespaced ? String(metadata.namespace) : null,
      String(metadata.name),
    );
    const current = this.#objects.get(key);
    if (current === undefined) throw new Error(`no ${served.kind} ${String(metadata.name)} to overwrite`);
    return structuredClone(this.#update(served, key, current, { ...structuredClone(object), metadata }));
  }

  /** Deletes the stored object as another client would; false when there was none. */
  remove(apiVersion: string, kind: string, namespace: string | null, name: string): boolean {
    const deleted = this.#objects.delete(this.#key(this.#served(apiVersion, kind), namespace, name));
    if (deleted) this.#nextVersion();
    return deleted;
  }

  /** Resolves with the object once it is first written (at once when it already exists). */
  whenWritten(
    apiVersion: string,
    kind: string,
    namespace: string | null,
    name: string,
  ): Promise<StoredObject> {
    const key = this.#key(this.#served(apiVersion, kind), namespace, name);
    const existing = this.#objects.get(key);
    if (existing !== undefined) return Promise.resolve(structuredClone(existing));
    return new Promise((resolve) => {
      this.#waiters.set(key, [...(this.#waiters.get(key) ?? []), resolve]);
    });
  }

  /** Marks a Job finished as its controller would: `Complete` (succeeded) or `Failed`, with a reason. */
  finishJob(
    namespace: string,
    name: string,
    outcome: "Complete" | "Failed",
    reason: string = outcome,
  ): StoredObject {
    const served = this.#served("batch/v1", "Job");
    const key = this.#key(served, namespace, name);
    const job = this.#objects.get(key);
    if (job === undefined) throw new Error(`no Job ${namespace}/${name}`);
    const now = new Date().toISOString();
    const condition = {
      type: outcome,
      status: "True",
      reason,
      message: `Job ${reason}`,
      lastTransitionTime: now,
    };
    const status = outcome === "Complete" ? { succeeded: 1, completionTime: now } : { failed: 1 };
    return structuredClone(
      this.#store(key, { ...job, status: { ...status, startTime: now, conditions: [condition] } }),
    );
  }

  #nextVersion(): string {
    this.#version += 1;
    return String(this.#version);
  }

  #store(key: string, object: Json): StoredObject {
    const stored = structuredClone(object) as StoredObject;
    stored.metadata.resourceVersion = this.#nextVersion();
    this.#objects.set(key, stored);
    for (const resolve of this.#waiters.get(key) ?? []) resolve(structuredClone(stored));
    this.#waiters.delete(key);
    return stored;
  }

  #checkNamespace(served: ServedKind, namespace: string | null): void {
    if (!served.namespaced) return;
    const namespaces = this.#served("v1", "Namespace");
    if (!this.#objects.has(this.#key(namespaces, null, namespace ?? ""))) {
      throw failure(404, `namespaces "${namespace}" not found`, { name: namespace, kind: "namespaces" });
    }
  }

  /** The checks every written body passes: kind, version, name and namespace agree with the path. */
  #checkBody(served: ServedKind, namespace: string | null, name: string, body: Json): void {
    if (body.apiVersion !== served.apiVersion || body.kind !== served.kind) {
      throw failure(
        400,
        `the body is ${body.apiVersion} ${body.kind}, the path ${served.apiVersion} ${served.kind}`,
      );
    }
    const metadata = body.metadata;
    if (!isObject(metadata) || metadata.name !== name) {
      throw failure(
        400,
        `the name of the object (${
          isObject(metadata) ? metadata.name : undefined
        }) does not match the name on the URL (${name})`,
      );
    }
    if (!NAME.test(name) || name.length > 253) {
      throw failure(
        422,
        `${served.kind} "${name}" is invalid: metadata.name: a lowercase RFC 1123 subdomain is required`,
      );
    }
    if (served.namespaced && metadata.namespace !== undefined && metadata.namespace !== namespace) {
      throw failure(
        400,
        "the namespace of the provided object does not match the namespace sent on the request",
      );
    }
    if (metadata.labels !== undefined) {
      if (!isObject(metadata.labels)) throw failure(422, "metadata.labels is a map of strings");
      for (const [key, value] of Object.entries(metadata.labels)) {
        if (
          !LABEL_KEY.test(key) || typeof value !== "string" || value.length > 63 || !LABEL_VALUE.test(value)
        ) {
          throw failure(422, `metadata.labels: invalid label ${key}=${JSON.stringify(value)}`);
        }
      }
    }
  }

  #create(served: ServedKind, namespace: string | null, name: string, body: Json): StoredObject {
    this.#checkNamespace(served, namespace);
    this.#checkBody(served, namespace, name, body);
    const key = this.#key(served, namespace, name);
    if (this.#objects.has(key)) {
      throw failure(
        409,
        `${served.plural} "${name}" already exists`,
        { name, kind: served.plural },
        "AlreadyExists",
      );
    }
    const metadata = body.metadata as Json;
    this.#uid += 1;
    return this.#store(key, {
      ...body,
      metadata: {
        ...metadata,
        ...(served.namespaced ? { namespace } : {}),
        uid: `00000000-0000-4000-8000-${String(this.#uid).padStart(12, "0")}`,
        creationTimestamp: new Date().toISOString(),
        generation: 1,
      },
    });
  }

  /** Writes `next` over `current` (same key): preconditions, immutability, generation; no-op kept. */
  #update(served: ServedKind, key: string, current: StoredObject, next: Json): StoredObject {
    const wanted = (next.metadata as Json | undefined)?.resourceVersion;
    if (wanted !== undefined && wanted !== current.metadata.resourceVersion) {
      throw failure(
        409,
        `Operation cannot be fulfilled on ${served.plural} "${current.metadata.name}": the object has been ` +
          "modified; please apply your changes to the latest version and try again",
        { name: current.metadata.name, kind: served.plural },
      );
    }
    const metadata = {
      ...(next.metadata as Json),
      name: current.metadata.name,
      uid: current.metadata.uid,
      creationTimestamp: current.metadata.creationTimestamp,
      generation: current.metadata.generation,
      resourceVersion: current.metadata.resourceVersion,
      ...(served.namespaced ? { namespace: current.metadata.namespace } : {}),
    };
    const candidate: Json = { ...next, metadata };
    if (deepEqual(candidate, current)) return current;
    if (
      served.kind === "Job" &&
      !deepEqual((candidate.spec as Json)?.template, (current.spec as Json)?.template)
    ) {
      throw failure(
        422,
        `Job.batch "${current.metadata.name}" is invalid: spec.template: field is immutable`,
      );
    }
    const body = (o: Json) =>
      Object.fromEntries(Object.entries(o).filter(([k]) => k !== "metadata" && k !== "status"));
    if (!deepEqual(body(candidate), body(current))) {
      metadata.generation = Number(current.metadata.generation) + 1;
    }
    return this.#store(key, candidate);
  }

  #target(url: URL): Target {
    const parts = url.pathname.split("/").filter((p) => p !== "").map(decodeURIComponent);
    let rest: string[];
    let apiVersion: string;
    if (parts[0] === "api" && parts.length >= 2) {
      apiVersion = parts[1];
      rest = parts.slice(2);
    } else if (parts[0] === "apis" && parts.length >= 3) {
      apiVersion = `${parts[1]}/${parts[2]}`;
      rest = parts.slice(3);
    } else throw failure(404, "the server could not find the requested resource");
    let namespace: string | null = null;
    if (rest[0] === "namespaces" && rest.length >= 3) {
      namespace = rest[1];
      rest = rest.slice(2);
    }
    const served = this.#kinds.find((k) => k.apiVersion === apiVersion && k.plural === rest[0]);
    if (served === undefined || rest.length > 2 || (namespace !== null && !served.namespaced)) {
      throw failure(404, "the server could not find the requested resource");
    }
    return { served, namespace, name: rest[1] ?? null };
  }

  #discovery(url: URL): Json | null {
    const parts = url.pathname.split("/").filter((p) => p !== "");
    const groupVersion = parts[0] === "api" && parts.length === 2
      ? parts[1]
      : parts[0] === "apis" && parts.length === 3
      ? `${parts[1]}/${parts[2]}`
      : null;
    if (groupVersion === null) return null;
    const resources = this.#kinds.filter((k) => k.apiVersion === groupVersion);
    if (resources.length === 0) throw failure(404, "the server could not find the requested resource");
    return {
      kind: "APIResourceList",
      apiVersion: "v1",
      groupVersion,
      resources: resources.map((k) => ({
        name: k.plural,
        singularName: k.kind.toLowerCase(),
        namespaced: k.namespaced,
        kind: k.kind,
        verbs: ["create", "delete", "get", "list", "patch", "update"],
      })),
    };
  }

  async #handle(request: Request): Promise<Response> {
    const url = new URL(request.url);
    const seen = {
      method: request.method,
      path: url.pathname,
      query: url.search,
      contentType: request.headers.get("content-type"),
    };
    this.requests.push(seen);
    await this.beforeRequest?.(seen);
    try {
      if (this.#token !== null && request.headers.get("authorization") !== `Bearer ${this.#token}`) {
        throw failure(401, "Unauthorized");
      }
      const refused = this.refuse?.(seen) ?? null;
      if (refused !== null) throw failure(refused, `refused by the test (${refused})`);
      const discovery = request.method === "GET" ? this.#discovery(url) : null;
      if (discovery !== null) return Response.json(discovery);
      const target = this.#target(url);
      const text = await request.text();
      const response = this.#serve(request.method, url, target, text, seen.contentType ?? "");
      if (request.method !== "GET" && response.ok) this.writes.push({ ...seen, body: text });
      return response;
    } catch (error) {
      if (!(error instanceof ApiFailure)) throw error;
      return Response.json(statusBody(error.code, error.reason, error.message, error.details), {
        status: error.code,
      });
    }
  }

  #parse(text: string, yaml: boolean): Json {
    let body: unknown;
    try {
      body = yaml ? parseYaml(text) : JSON.parse(text);
    } catch (error) {
      throw failure(400, `the body cannot be decoded: ${(error as Error).message}`);
    }
    if (!isObject(body) && !Array.isArray(body)) throw failure(400, "the body is not an object");
    return body as Json;
  }

  #serve(method: string, url: URL, target: Target, text: string, contentType: string): Response {
    const { served, namespace, name } = target;
    if (name === null) {
      if (method === "GET") {
        return Response.json(this.#list(served, namespace, url.searchParams.get("labelSelector")));
      }
      if (method === "POST") {
        const body = this.#parse(text, false);
        const metadata = isObject(body.metadata) ? body.metadata : {};
        const objectNamespace = served.namespaced ? (namespace ?? String(metadata.namespace)) : null;
        return Response.json(this.#create(served, objectNamespace, String(metadata.name), body), {
          status: 201,
        });
      }
      throw failure(405, `${method} is not allowed on a collection`);
    }
    const key = this.#key(served, namespace, name);
    const current = this.#objects.get(key);
    const notFound = () =>
      failure(404, `${served.plural} "${name}" not found`, { name, kind: served.plural });
    switch (method) {
      case "GET":
        if (current === undefined) throw notFound();
        return Response.json(current);
      case "PUT": {
        if (current === undefined) throw notFound();
        const body = this.#parse(text, false);
        this.#checkBody(served, namespace, name, body);
        return Response.json(this.#update(served, key, current, body));
      }
      case "PATCH":
        return this.#patch(url, served, namespace, name, key, current, text, contentType);
      case "DELETE":
        if (current === undefined) throw notFound();
        return Response.json(this.#delete(url, served, key, current, text));
      default:
        throw failure(405, `${method} is not allowed`);
    }
  }

  #list(served: ServedKind, namespace: string | null, selector: string | null): Json {
    const requirements = selector === null ? [] : parseSelector(selector);
    const prefix = `${served.apiVersion}/${served.plural}/${namespace === null ? "" : `${namespace}/`}`;
    const items = [...this.#objects.entries()]
      .filter(([key]) => key.startsWith(prefix))
      .map(([, object]) => object)
      .filter((object) => matches((object.metadata.labels ?? {}) as Record<string, string>, requirements))
      // As the API server lists them: the items carry no apiVersion or kind, the list does.
      .map(({ apiVersion: _apiVersion, kind: _kind, ...item }) => item);
    return {
      kind: `${served.kind}List`,
      apiVersion: served.apiVersion,
      metadata: { resourceVersion: String(this.#version) },
      items,
    };
  }

  #patch(
    url: URL,
    served: ServedKind,
    namespace: string | null,
    name: string,
    key: string,
    current: StoredObject | undefined,
    text: string,
    contentType: string,
  ): Response {
    const type = contentType.split(";")[0].trim();
    if (type === "application/apply-patch+yaml") {
      const manager = url.searchParams.get("fieldManager");
      if (manager === null || manager === "") {
        throw failure(400, "PATCH requests with apply content type require a fieldManager");
      }
      const applied = this.#parse(text, true);
      this.#checkBody(served, namespace, name, applied);
      const managers = this.#applied.get(key) ?? new Map<string, Json>();
      let result: StoredObject;
      if (current === undefined) {
        const wanted = (applied.metadata as Json).resourceVersion;
        if (wanted !== undefined) {
          throw failure(409, `${served.plural} "${name}" does not exist at resourceVersion ${wanted}`);
        }
        result = this.#create(served, namespace, name, applied);
      } else {
        const previous = managers.get(manager) ?? {};
        const merged = mergeInto(dropRemoved(current, previous, applied), applied);
        result = this.#update(served, key, current, merged);
      }
      const kept = structuredClone(applied);
      delete (kept.metadata as Json).resourceVersion;
      managers.set(manager, kept);
      this.#applied.set(key, managers);
      return Response.json(result, { status: current === undefined ? 201 : 200 });
    }
    if (current === undefined) {
      throw failure(404, `${served.plural} "${name}" not found`, { name, kind: served.plural });
    }
    let patched: Json;
    if (type === "application/json-patch+json") patched = jsonPatch(current, this.#parse(text, false));
    else if (type === "application/merge-patch+json") {
      patched = mergePatch(current, this.#parse(text, false)) as Json;
    } else throw failure(415, `the body of the request was in an unknown format: ${contentType}`);
    this.#checkBody(served, namespace, name, patched);
    return Response.json(this.#update(served, key, current, patched));
  }

  #delete(url: URL, served: ServedKind, key: string, current: StoredObject, text: string): Json {
    const options = text.trim() === "" ? {} : this.#parse(text, false);
    const propagation = url.searchParams.get("propagationPolicy") ?? options.propagationPolicy;
    if (propagation !== undefined && propagation !== null && !PROPAGATION.includes(String(propagation))) {
      throw failure(
        400,
        `propagationPolicy ${JSON.stringify(propagation)} is not one of ${PROPAGATION.join(", ")}`,
      );
    }
    const preconditions = isObject(options.preconditions) ? options.preconditions : {};
    for (const field of ["resourceVersion", "uid"] as const) {
      const wanted = preconditions[field];
      if (wanted !== undefined && wanted !== null && wanted !== current.metadata[field]) {
        throw failure(
          409,
          `Precondition failed: ${field} in precondition: ${wanted}, ${field} in object meta: ${
            current.metadata[field]
          }`,
          { name: current.metadata.name, kind: served.plural },
        );
      }
    }
    this.#objects.delete(key);
    this.#applied.delete(key);
    if (served.kind === "Namespace") {
      for (const other of [...this.#objects.keys()]) {
        if (other.split("/").at(-2) === current.metadata.name) this.#objects.delete(other);
      }
    }
    this.#nextVersion();
    return {
      kind: "Status",
      apiVersion: "v1",
      metadata: {},
      status: "Success",
      details: { name: current.metadata.name, kind: served.plural, uid: current.metadata.uid },
    };
  }
}
