/**
 * The Kubernetes API as the deploy uses it, through `@kubernetes/client-node`'s `KubernetesObjectApi`:
 * read, list by label selector, server-side apply and delete of any kind the cluster serves, each failure
 * a {@link ClusterError} (exit 3) carrying the API server's status code, reason and message, never a raw
 * client exception. A kind the cluster does not serve (KEDA not installed) is told apart from a cluster
 * that cannot be read: {@link ClusterClient.serves} answers false for the first and throws for the second.
 *
 * @module
 */

import {
  ApiException,
  CoreV1Api,
  KubeConfig,
  KubernetesObjectApi,
  PatchStrategy,
} from "@kubernetes/client-node";
import { ClusterError, ConfigError } from "../core/errors.ts";
import type { KubernetesObject } from "./manifests.ts";

/** The field manager every videoflow write is made as. */
export const FIELD_MANAGER = "videoflow";

/** Where the cluster is and who the deploy is there. */
export interface ClusterConnection {
  /** `--server URL`: the API server; with it, `token` authenticates. */
  readonly server?: string;
  /** `--token`: a bearer token for `server`. */
  readonly token?: string;
  /** A kubeconfig file (`--kubeconfig`, else `KUBECONFIG`) whose current context is used without `server`. */
  readonly kubeconfig?: string;
}

/** An object as the API server returned it: plain JSON with its server-set metadata. */
export interface LiveObject {
  /** Its API group and version. */
  readonly apiVersion: string;
  /** Its kind. */
  readonly kind: string;
  /** Its metadata, with labels and annotations always present. */
  readonly metadata: {
    readonly name: string;
    readonly namespace?: string;
    readonly uid: string;
    readonly resourceVersion: string;
    readonly labels: Readonly<Record<string, string>>;
    readonly annotations: Readonly<Record<string, string>>;
    /** Set once the object is being deleted (its finalizers still hold it). */
    readonly deletionTimestamp?: string;
  };
  /** The rest of the object (spec, data, status). */
  readonly [field: string]: unknown;
}

/** What names one object on the cluster. */
export interface ObjectRef {
  /** Its API group and version. */
  readonly apiVersion: string;
  /** Its kind. */
  readonly kind: string;
  /** Its namespace. */
  readonly namespace: string;
  /** Its name. */
  readonly name: string;
}

/** `key` as one token of a JSON pointer (RFC 6901: `~` as `~0`, `/` as `~1`), e.g. an annotation's name. */
export function jsonPointerKey(key: string): string {
  return key.replaceAll("~", "~0").replaceAll("/", "~1");
}

/** One RFC 6902 operation of a JSON patch. */
export interface JsonPatchOperation {
  readonly op: "add" | "remove" | "replace" | "test";
  /** A JSON pointer (`/metadata/annotations/videoflow.io~1holds`). */
  readonly path: string;
  readonly value?: unknown;
}

/** What a delete found: the object removed, already gone, or changed since it was read (kept). */
export type DeleteOutcome = "deleted" | "gone" | "changed";

/** The `KubernetesObjectApi` with discovery exposed: whether a kind is served. */
class ObjectApi extends KubernetesObjectApi {
  async kindServed(apiVersion: string, kind: string): Promise<boolean> {
    try {
      return (await this.resource(apiVersion, kind)) !== undefined;
    } catch (error) {
      // The API group itself is not served: 404 on its discovery document.
      if (error instanceof ApiException && error.code === 404) return false;
      throw error;
    }
  }
}

function kubeConfigOf(connection: ClusterConnection): { config: KubeConfig; server: string } {
  const config = new KubeConfig();
  if (connection.server !== undefined) {
    let url: URL;
    try {
      url = new URL(connection.server);
    } catch {
      throw new ConfigError(
        `--server ${JSON.stringify(connection.server)} is not a URL`,
        "pass the API server's URL, such as https://10.0.0.1:6443",
      );
    }
    if (url.protocol !== "https:" && url.protocol !== "http:") {
      throw new ConfigError(
        `--server ${connection.server} is neither https: nor http:`,
        "pass the API server's URL",
      );
    }
    config.loadFromOptions({
      clusters: [{
        name: "videoflow",
        server: url.href.replace(/\/$/, ""),
        // client-node refuses plain http unless told to skip TLS checks, and there is no TLS to check.
        skipTLSVerify: url.protocol === "http:",
      }],
      users: [{ name: "videoflow", ...(connection.token === undefined ? {} : { token: connection.token }) }],
      contexts: [{ name: "videoflow", cluster: "videoflow", user: "videoflow" }],
      currentContext: "videoflow",
    });
    return { config, server: url.href };
  }
  const kubeconfig = connection.kubeconfig ?? Deno.env.get("KUBECONFIG");
  if (kubeconfig !== undefined) {
    try {
      config.loadFromFile(kubeconfig);
    } catch (error) {
      throw new ConfigError(
        `the kubeconfig ${kubeconfig} cannot be loaded: ${(error as Error).message}`,
        "pass --kubeconfig with a readable kubeconfig, or --server URL",
        { path: kubeconfig },
      );
    }
    const cluster = config.getCurrentCluster();
    if (cluster === null) {
      throw new ConfigError(
        `the kubeconfig ${kubeconfig} has no current context with a cluster`,
        "set its current-context, or pass --server URL",
        { path: kubeconfig },
      );
    }
    return { config, server: cluster.server };
  }
  throw new ConfigError(
    "applying needs a cluster, and none was given",
    "pass --server URL (and --token TOKEN), or --kubeconfig FILE (KUBECONFIG)",
  );
}

function describe(ref: ObjectRef): string {
  return `${ref.kind} ${ref.namespace}/${ref.name}`;
}

/** The API server's Status message in `body`, when it is one. */
function statusMessage(body: unknown): { message: string | null; reason: string | null } {
  let value = body;
  if (typeof value === "string") {
    try {
      value = JSON.parse(value);
    } catch {
      return { message: value === "" ? null : value as string, reason: null };
    }
  }
  if (typeof value !== "object" || value === null) return { message: null, reason: null };
  const status = value as { message?: unknown; reason?: unknown };
  return {
    message: typeof status.message === "string" ? status.message : null,
    reason: typeof status.reason === "string" ? status.reason : null,
  };
}

function remedyFor(status: number | null, server: string): string {
  if (status === null) return `check that the API server at ${server} is reachable from here`;
  if (status === 401 || status === 403) {
    return "pass --token with a token allowed to manage the namespace's objects";
  }
  if (status === 404) {
    return "create the namespace first, or install what serves the kind (KEDA for ScaledObject)";
  }
  if (status === 409) return "another writer changed the object since it was read: run the command again";
  return "fix what the API server names, then run the command again";
}

/** Client-node's exception (or a transport failure) as a {@link ClusterError} naming `what`. */
function clusterError(error: unknown, what: string, server: string): ClusterError {
  if (error instanceof ClusterError) return error;
  if (error instanceof ApiException) {
    const { message, reason } = statusMessage(error.body);
    return new ClusterError(
      `${what} was refused by the API server: ${error.code}${reason === null ? "" : ` ${reason}`}${
        message === null ? "" : `: ${message}`
      }`,
      remedyFor(error.code, server),
      { status: error.code, reason, server },
    );
  }
  const cause = error instanceof Error && error.cause instanceof Error ? `: ${error.cause.message}` : "";
  return new ClusterError(
    `${what} failed: the API server at ${server} did not answer (${(error as Error).message}${cause})`,
    remedyFor(null, server),
    { server },
  );
}

/** Plain JSON of a client-node model (its dates as RFC 3339 strings, as the API sent them). */
function plain(object: unknown): LiveObject {
  const value = JSON.parse(JSON.stringify(object)) as LiveObject;
  const metadata = value.metadata as unknown as Record<string, unknown>;
  metadata.labels ??= {};
  metadata.annotations ??= {};
  return value;
}

/** The cluster the deploy talks to (see the module doc). */
export class ClusterClient {
  readonly #api: ObjectApi;
  readonly #core: CoreV1Api;
  /** The API server's URL, for messages. */
  readonly server: string;

  private constructor(api: ObjectApi, core: CoreV1Api, server: string) {
    this.#api = api;
    this.#core = core;
    this.server = server;
  }

  /**
   * A client for `connection` (without a server or a kubeconfig, the one `KUBECONFIG` names); throws
   * {@link ConfigError} when no cluster was given or it is malformed.
   */
  static connect(connection: ClusterConnection): ClusterClient {
    const { config, server } = kubeConfigOf(connection);
    return new ClusterClient(config.makeApiClient(ObjectApi), config.makeApiClient(CoreV1Api), server);
  }

  /** Whether the cluster serves `apiVersion`/`kind` (false: no such API; throws: it cannot be asked). */
  async serves(apiVersion: string, kind: string): Promise<boolean> {
    try {
      return await this.#api.kindServed(apiVersion, kind);
    } catch (error) {
      throw clusterError(error, `the discovery of ${apiVersion} ${kind}`, this.server);
    }
  }

  /** The object, or `null` when it does not exist. */
  async read(ref: ObjectRef): Promise<LiveObject | null> {
    try {
      return plain(
        await this.#api.read({
          apiVersion: ref.apiVersion,
          kind: ref.kind,
          metadata: { name: ref.name, namespace: ref.namespace },
        }),
      );
    } catch (error) {
      if (error instanceof ApiException && error.code === 404) return null;
      throw clusterError(error, `reading ${describe(ref)}`, this.server);
    }
  }

  /** Every object of a kind in `namespace` whose labels match `labelSelector`. */
  async list(
    apiVersion: string,
    kind: string,
    namespace: string,
    labelSelector: string,
  ): Promise<LiveObject[]> {
    try {
      const list = await this.#api.list(
        apiVersion,
        kind,
        namespace,
        undefined,
        undefined,
        undefined,
        undefined,
        labelSelector,
      );
      // A list's items carry no apiVersion or kind of their own: the list's are theirs.
      return list.items.map((item) => plain({ ...item, apiVersion, kind }));
    } catch (error) {
      throw clusterError(error, `listing ${kind} in ${namespace} (${labelSelector})`, this.server);
    }
  }

  /**
   * Server-side applies `object` as {@link FIELD_MANAGER}, without forcing another manager's fields.
   * With `resourceVersion`, the apply holds only while the object is still at that version (409 else).
   */
  async apply(object: KubernetesObject, resourceVersion?: string): Promise<LiveObject> {
    const body = resourceVersion === undefined
      ? object
      : { ...object, metadata: { ...object.metadata, resourceVersion } };
    try {
      return plain(
        await this.#api.patch(
          structuredClone(body),
          undefined,
          undefined,
          FIELD_MANAGER,
          false,
          PatchStrategy.ServerSideApply,
        ),
      );
    } catch (error) {
      throw clusterError(
        error,
        `applying ${describe({ ...object, ...object.metadata })}`,
        this.server,
      );
    }
  }

  /** Creates `object`; one that exists already is a {@link ClusterError} with status 409. */
  async create(object: KubernetesObject): Promise<LiveObject> {
    try {
      return plain(await this.#api.create(structuredClone(object), undefined, undefined, FIELD_MANAGER));
    } catch (error) {
      throw clusterError(error, `creating ${describe({ ...object, ...object.metadata })}`, this.server);
    }
  }

  /** Replaces `object` while it is still at `resourceVersion` (a {@link ClusterError} with status 409 else). */
  async replace(object: KubernetesObject, resourceVersion: string): Promise<LiveObject> {
    const body = { ...object, metadata: { ...object.metadata, resourceVersion } };
    try {
      return plain(await this.#api.replace(structuredClone(body), undefined, undefined, FIELD_MANAGER));
    } catch (error) {
      throw clusterError(error, `replacing ${describe({ ...object, ...object.metadata })}`, this.server);
    }
  }

  /**
   * JSON-patches the Node `name` (RFC 6902) as {@link FIELD_MANAGER}. A patch that sets
   * `/metadata/resourceVersion` to the version read holds only while the node is still at it (409 else),
   * and a failed `test` op is 422: nothing of the patch is kept either way.
   */
  async patchNode(name: string, operations: readonly JsonPatchOperation[]): Promise<LiveObject> {
    try {
      const node = await this.#core.patchNode({
        name,
        body: structuredClone(operations) as object,
        fieldManager: FIELD_MANAGER,
      });
      return plain({ ...node, apiVersion: "v1", kind: "Node" });
    } catch (error) {
      throw clusterError(error, `patching Node ${name}`, this.server);
    }
  }

  /**
   * Deletes the object if it is still `live` (its uid and resourceVersion as preconditions), its
   * dependents (pods, ReplicaSets) collected in the background.
   */
  async delete(live: LiveObject): Promise<DeleteOutcome> {
    const ref = { ...live, namespace: live.metadata.namespace ?? "", name: live.metadata.name };
    try {
      await this.#api.delete(
        {
          apiVersion: live.apiVersion,
          kind: live.kind,
          metadata: { name: ref.name, namespace: ref.namespace },
        },
        undefined,
        undefined,
        undefined,
        undefined,
        "Background",
        {
          preconditions: { uid: live.metadata.uid, resourceVersion: live.metadata.resourceVersion },
        },
      );
      return "deleted";
    } catch (error) {
      if (error instanceof ApiException && error.code === 404) return "gone";
      if (error instanceof ApiException && error.code === 409) return "changed";
      throw clusterError(error, `deleting ${describe(ref)}`, this.server);
    }
  }
}
