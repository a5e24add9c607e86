/**
 * The test Kubernetes API server (tests/support/kube_api_server.ts) keeps the API server's rules that the
 * code tested against it depends on, so a client that breaks one fails: label selectors compared exactly,
 * JSON patch (every op, a failed `test` refused whole), server-side apply that creates, merges and drops
 * what its manager stopped applying (a no-op apply keeping the version), a Job's immutable template,
 * `AlreadyExists`, a namespace that must exist, an API group that is not served, and the bearer token.
 */
import assert from "node:assert/strict";
import { OwnerLabel } from "../../src/backends/identity.ts";
import { KubeApiServer, KUBERNETES_KINDS, type StoredObject } from "../support/kube_api_server.ts";

const NS = "vision";

async function withServer(
  fn: (server: KubeApiServer) => Promise<void>,
  options: Parameters<typeof KubeApiServer.start>[0] = { namespaces: [NS] },
): Promise<void> {
  const server = KubeApiServer.start(options);
  try {
    await fn(server);
  } finally {
    await server.close();
  }
}

/** One request; its status and JSON body. */
async function call(
  server: KubeApiServer,
  method: string,
  path: string,
  body?: unknown,
  contentType = "application/json",
  headers: Record<string, string> = {},
  // deno-lint-ignore no-explicit-any
): Promise<{ status: number; body: any }> {
  const response = await fetch(`${server.url}${path}`, {
    method,
    headers: { "content-type": contentType, ...headers },
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
  return { status: response.status, body: await response.json() };
}

const CM = `/api/v1/namespaces/${NS}/configmaps`;

function configMap(name: string, data: Record<string, string>, labels: Record<string, string> = {}) {
  return { apiVersion: "v1", kind: "ConfigMap", metadata: { name, namespace: NS, labels }, data };
}

Deno.test("the test server's label selectors compare exactly and reject a malformed selector", async () => {
  await withServer(async (server) => {
    for (const [name, run] of [["a", "r1"], ["b", "r10"], ["c", "r1-x"], ["d", null]] as const) {
      server.seed({
        apiVersion: "v1",
        kind: "ConfigMap",
        metadata: {
          name,
          namespace: NS,
          labels: run === null ? { app: "x" } : { [OwnerLabel.run]: run, app: "x" },
        },
      });
    }
    const names = async (selector: string) => {
      const response = await fetch(
        `${server.url}/api/v1/namespaces/${NS}/configmaps?labelSelector=${encodeURIComponent(selector)}`,
      );
      const body = await response.json();
      return response.status === 200 ? body.items.map((o: StoredObject) => o.metadata.name) : response.status;
    };
    assert.deepEqual(await names(`${OwnerLabel.run}=r1`), ["a"]);
    assert.deepEqual(await names(`${OwnerLabel.run}==r10`), ["b"]);
    assert.deepEqual(await names(`${OwnerLabel.run}!=r1`), ["b", "c", "d"]);
    assert.deepEqual(await names(`${OwnerLabel.run},${OwnerLabel.run}!=r1`), ["b", "c"]);
    assert.deepEqual(await names(`${OwnerLabel.run} in (r1, r1-x)`), ["a", "c"]);
    assert.deepEqual(await names(`${OwnerLabel.run} notin (r1),app=x`), ["b", "c", "d"]);
    assert.deepEqual(await names(`!${OwnerLabel.run}`), ["d"]);
    assert.equal(await names("=r1"), 400);
  });
});

Deno.test("JSON patch: add, replace, remove, move and copy, in lists too; a failed test keeps the object", async () => {
  await withServer(async (server) => {
    const created = await call(server, "POST", CM, { ...configMap("a", { x: "1" }), list: ["p", "q"] });
    assert.equal(created.status, 201);
    const patched = await call(server, "PATCH", `${CM}/a`, [
      { op: "add", path: "/data/y", value: "2" },
      { op: "replace", path: "/data/x", value: "3" },
      { op: "add", path: "/list/1", value: "between" },
      { op: "add", path: "/list/-", value: "last" },
      { op: "remove", path: "/list/0" },
      { op: "copy", from: "/data/x", path: "/data/z" },
      { op: "move", from: "/data/y", path: "/data/w" },
      { op: "add", path: "/metadata/labels/a~1b", value: "c" },
    ], "application/json-patch+json");
    assert.equal(patched.status, 200, JSON.stringify(patched.body));
    assert.deepEqual(patched.body.data, { x: "3", z: "3", w: "2" });
    assert.deepEqual(patched.body.list, ["between", "q", "last"]);
    assert.deepEqual(patched.body.metadata.labels, { "a/b": "c" });
    const version = patched.body.metadata.resourceVersion;
    for (
      const operations of [
        [{ op: "replace", path: "/data/x", value: "4" }, { op: "test", path: "/data/x", value: "3" }],
        [{ op: "remove", path: "/data/missing" }],
        [{ op: "replace", path: "/list/9", value: "x" }],
      ]
    ) {
      const refused = await call(server, "PATCH", `${CM}/a`, operations, "application/json-patch+json");
      assert.equal(refused.status, 422, JSON.stringify(operations));
      assert.equal(refused.body.kind, "Status");
    }
    assert.equal(
      (await call(server, "PATCH", `${CM}/a`, [{ op: "jump", path: "/x" }], "application/json-patch+json"))
        .status,
      400,
    );
    const after = server.get("v1", "ConfigMap", NS, "a")!;
    assert.equal(after.metadata.resourceVersion, version, "nothing of a refused patch was written");
    assert.deepEqual(after.data, { x: "3", z: "3", w: "2" });
    assert.equal(
      (await call(server, "PATCH", `${CM}/a`, {}, "application/strategic-merge-patch+json")).status,
      415,
    );
    const merged = await call(
      server,
      "PATCH",
      `${CM}/a`,
      { data: { z: null, v: "5" } },
      "application/merge-patch+json",
    );
    assert.deepEqual(merged.body.data, { x: "3", w: "2", v: "5" });
  });
});

Deno.test("server-side apply creates, merges, drops what its manager stopped applying, keeps a no-op", async () => {
  await withServer(async (server) => {
    const apply = (body: unknown, manager: string | null = "videoflow") =>
      call(
        server,
        "PATCH",
        `${CM}/a${manager === null ? "" : `?fieldManager=${manager}`}`,
        body,
        "application/apply-patch+yaml",
      );
    const first = await apply(configMap("a", { x: "1", y: "2" }, { keep: "1", drop: "1" }));
    assert.equal(first.status, 201);
    const version = first.body.metadata.resourceVersion;
    const same = await apply(configMap("a", { x: "1", y: "2" }, { keep: "1", drop: "1" }));
    assert.equal(same.status, 200);
    assert.equal(same.body.metadata.resourceVersion, version, "a repeated apply writes nothing");
    // Another client's field is kept across the manager's applies.
    await call(server, "PATCH", `${CM}/a`, { data: { other: "o" } }, "application/merge-patch+json");
    const second = await apply(
      "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: {keep: '1'}\ndata: {x: '9'}\n",
    );
    assert.equal(second.status, 200, JSON.stringify(second.body));
    assert.deepEqual(second.body.data, { x: "9", other: "o" });
    assert.deepEqual(second.body.metadata.labels, { keep: "1" });
    assert.equal(second.body.metadata.uid, first.body.metadata.uid);
    assert.equal((await apply(configMap("a", {}), null)).status, 400, "an apply names its field manager");
    const wrongName = await call(
      server,
      "PATCH",
      `${CM}/b?fieldManager=m`,
      configMap("a", {}),
      "application/apply-patch+yaml",
    );
    assert.equal(wrongName.status, 400);
    const badLabel = await apply(configMap("a", {}, { "bad label": "x" }));
    assert.equal(badLabel.status, 422);
  });
});

Deno.test("a Job's template is immutable; a second create is AlreadyExists; a namespace must exist", async () => {
  await withServer(async (server) => {
    const job = (image: string) => ({
      apiVersion: "batch/v1",
      kind: "Job",
      metadata: { name: "j", namespace: NS },
      spec: { template: { spec: { containers: [{ name: "w", image }] } } },
    });
    const jobs = `/apis/batch/v1/namespaces/${NS}/jobs`;
    assert.equal((await call(server, "POST", jobs, job("a:1"))).status, 201);
    const again = await call(server, "POST", jobs, job("a:1"));
    assert.equal(again.status, 409);
    assert.equal(again.body.reason, "AlreadyExists");
    const changed = await call(server, "PUT", `${jobs}/j`, job("a:2"));
    assert.equal(changed.status, 422);
    assert.match(changed.body.message, /field is immutable/);
    const finished = server.finishJob(NS, "j", "Complete");
    assert.equal(finished.status && (finished.status as { succeeded: number }).succeeded, 1);
    const missing = await call(server, "POST", "/api/v1/namespaces/nowhere/configmaps", {
      ...configMap("a", {}),
      metadata: { name: "a", namespace: "nowhere" },
    });
    assert.equal(missing.status, 404);
    assert.match(missing.body.message, /namespaces "nowhere" not found/);
    const mismatch = await call(server, "POST", CM, {
      ...configMap("a", {}),
      metadata: { name: "a", namespace: "x" },
    });
    assert.equal(mismatch.status, 400);
    // Deleting a namespace deletes what is in it.
    await call(server, "POST", CM, configMap("c", {}));
    assert.equal((await call(server, "DELETE", `/api/v1/namespaces/${NS}`)).status, 200);
    assert.deepEqual(server.all("v1", "ConfigMap"), []);
    assert.deepEqual(server.all("batch/v1", "Job"), []);
  });
});

Deno.test("discovery lists the served kinds; an unserved group is 404; a token is required when set", async () => {
  await withServer(async (server) => {
    const auth = { authorization: "Bearer t" };
    const apps = await call(server, "GET", "/apis/apps/v1", undefined, "application/json", auth);
    assert.equal(apps.status, 200);
    assert.deepEqual(apps.body.resources.map((r: { kind: string }) => r.kind), ["Deployment", "StatefulSet"]);
    assert.equal(
      (await call(server, "GET", "/apis/keda.sh/v1alpha1", undefined, "application/json", auth)).status,
      404,
    );
    assert.equal(
      (await call(
        server,
        "GET",
        `/apis/keda.sh/v1alpha1/namespaces/${NS}/scaledobjects`,
        undefined,
        "application/json",
        auth,
      )).status,
      404,
    );
    assert.equal((await call(server, "GET", CM)).status, 401);
    const listed = await call(server, "GET", CM, undefined, "application/json", auth);
    assert.equal(listed.status, 200);
    assert.equal(listed.body.kind, "ConfigMapList");
  }, {
    namespaces: [NS],
    token: "t",
    kinds: KUBERNETES_KINDS.filter((k) => !k.apiVersion.startsWith("keda")),
  });
});
