/**
 * `deno task deploy --apply` and `--teardown` as an operator runs them, in a subprocess, against the test
 * API server (tests/support/kube_api_server.ts) playing the cluster and its Job controller: an example is
 * applied (one line per object), applied again (every object unchanged), and torn down; a failed
 * provision Job exits 4, `--single-run` beside another run's workload exits 3 with nothing written, a flow
 * the target refuses exits 2 before the cluster is contacted, and a cluster named without `--apply` is
 * refused. The kubeconfig path (`KUBECONFIG`, a bearer token) is the
 * one a real cluster is reached by.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { OwnerLabel } from "../../src/backends/identity.ts";
import { KubeApiServer } from "../support/kube_api_server.ts";
import { deployTask } from "../support/vf_cli.ts";

const NS = "vision";
const PROVISION = "vf-squares-provision";

function deploy(args: readonly string[], env: Record<string, string> = {}, flow = "examples/hello.ts") {
  return deployTask([flow, "--namespace", NS, "--image", "reg/vf:1", ...args], env);
}

/** Finishes the provision Job once the CLI has written it, as the Job controller would. */
async function controller(server: KubeApiServer, outcome: "Complete" | "Failed"): Promise<void> {
  await server.whenWritten("batch/v1", "Job", NS, PROVISION);
  server.finishJob(NS, PROVISION, outcome, outcome === "Failed" ? "BackoffLimitExceeded" : "Completed");
}

Deno.test("deploy --apply, again, then --teardown, through a kubeconfig with a token", async () => {
  const server = KubeApiServer.start({ namespaces: [NS], token: "t0ken" });
  const dir = await Deno.makeTempDir();
  try {
    const kubeconfig = join(dir, "config");
    await Deno.writeTextFile(
      kubeconfig,
      [
        "apiVersion: v1",
        "kind: Config",
        "clusters:",
        "- name: test",
        `  cluster: {server: "${server.url}", insecure-skip-tls-verify: true}`,
        "users:",
        "- name: test",
        "  user: {token: t0ken}",
        "contexts:",
        "- name: test",
        "  context: {cluster: test, user: test}",
        "current-context: test",
        "",
      ].join("\n"),
    );
    const env = { KUBECONFIG: kubeconfig };
    const [first] = await Promise.all([
      deploy(["--apply", "--run-id", "r1"], env),
      controller(server, "Complete"),
    ]);
    assert.equal(first.code, 0, first.stderr);
    const lines = first.stdout.trim().split("\n");
    assert.equal(lines.length, 6, first.stdout);
    assert.ok(
      lines.every((line) => /^created \S+ vf-squares-\S+ \(resourceVersion \d+\)$/.test(line)),
      first.stdout,
    );
    assert.match(
      first.stderr,
      /6 objects applied to namespace vision .*provision Job vf-squares-provision complete/,
    );
    const again = await deploy(["--apply", "--run-id", "r1"], env);
    assert.equal(again.code, 0, again.stderr);
    assert.deepEqual(
      again.stdout.trim().split("\n").map((line) => line.split(" ")[0]),
      lines.map(() => "unchanged"),
    );
    const down = await deploy(["--teardown", "--run-id", "r1"], env);
    assert.equal(down.code, 0, down.stderr);
    assert.equal(down.stdout.trim().split("\n").filter((line) => line.startsWith("deleted ")).length, 6);
    assert.deepEqual(server.all("batch/v1", "Job"), []);
    assert.deepEqual(server.all("v1", "ConfigMap"), []);
  } finally {
    await server.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("deploy --apply exits 4 on a failed provision Job, 3 on RUN-047, 2 on admission or a stray --server", async () => {
  const server = KubeApiServer.start({ namespaces: [NS] });
  try {
    const [failed] = await Promise.all([
      deploy(["--apply", "--server", server.url, "--run-id", "r1"]),
      controller(server, "Failed"),
    ]);
    assert.equal(failed.code, 4, failed.stderr);
    assert.match(
      failed.stderr,
      /VF_FLOW_FAILED: Job vision\/vf-squares-provision failed \(BackoffLimitExceeded/,
    );
    assert.equal(failed.stdout, "");
    const versions = server.all("batch/v1", "Job").map((job) => job.metadata.resourceVersion);
    const single = await deploy(["--apply", "--server", server.url, "--run-id", "r2", "--single-run"]);
    assert.equal(single.code, 3, single.stderr);
    assert.match(
      single.stderr,
      /VF_ACTIVE_RUN: --single-run: run\(s\) r1 of flow squares already hold workloads/,
    );
    assert.deepEqual(server.all("batch/v1", "Job").map((job) => job.metadata.resourceVersion), versions);
    assert.ok(
      server.all("batch/v1", "Job").every((job) =>
        (job.metadata.labels as Record<string, string>)[OwnerLabel.run] === "r1"
      ),
    );
    const requests = server.requests.length;
    const refused = await deploy(
      ["--apply", "--server", server.url],
      {},
      "tests/fixtures/deploy/refused_flow.ts",
    );
    assert.equal(refused.code, 2, refused.stderr);
    assert.match(refused.stderr, /VF_INCOMPATIBLE_PROFILE/);
    assert.equal(server.requests.length, requests, "admission refused before the cluster was contacted");
    const stray = await deploy(["--server", server.url]);
    assert.equal(stray.code, 2, stray.stderr);
    assert.match(stray.stderr, /VF_CONFIG: --server, --token and --kubeconfig name the cluster of --apply/);
  } finally {
    await server.close();
  }
});
