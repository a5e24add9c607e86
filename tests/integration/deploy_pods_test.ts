/**
 * The rendered manifests run the flow they describe: against a real nats-server and redis-server, the
 * provision Job's command, a worker pod's init container (the same provisioning, idempotent), and then
 * every worker container of every Job (each completion index a process, started as its pod starts it: the
 * container's command in its working directory with exactly its environment, the downward-API values
 * filled in, the image's ENTRYPOINT where the container names no command) run the first example to its end,
 * every replica exiting 0 and the sink printing every sum. The image here is this checkout: the image root
 * is the project directory itself.
 */
import assert from "node:assert/strict";
import { loadFlow } from "../../src/cli/load_flow.ts";
import { compileFlow } from "../../src/core/compiler.ts";
import { type KubernetesObject, renderManifests } from "../../src/deploy/manifests.ts";
import { HEALTH_PORT_ENV } from "../../src/runtime/health.ts";
import { startNatsServer, startRedisServer } from "../support/services.ts";

const root = new URL("../../", import.meta.url);

/** The worker image's ENTRYPOINT: what a container without a command of its own runs. */
const ENTRYPOINT: string[] = JSON.parse(
  /^ENTRYPOINT (\[.*\])$/m.exec(Deno.readTextFileSync(new URL("Dockerfile", root)))![1],
);

// deno-lint-ignore no-explicit-any
type Json = Record<string, any>;

/** What a pod's container gets from the node besides its own environment: the deno on its PATH. */
const HOST = ["HOME", "PATH", "DENO_DIR"].flatMap((name) => {
  const value = Deno.env.get(name);
  return value === undefined ? [] : [[name, value] as const];
});

async function runContainer(container: Json, index: number): Promise<{ code: number; text: string }> {
  const env: Record<string, string> = Object.fromEntries(HOST);
  for (const entry of container.env ?? []) {
    env[entry.name] = entry.value ??
      (entry.valueFrom.fieldRef.fieldPath.includes("completion-index") ? String(index) : "unexpected");
  }
  // Every pod has a network namespace of its own; these processes share one host.
  if (env[HEALTH_PORT_ENV] !== undefined) env[HEALTH_PORT_ENV] = "0";
  const [program, ...args] = (container.command ?? ENTRYPOINT) as string[];
  assert.equal(program, "deno");
  const output = await new Deno.Command(Deno.execPath(), {
    args,
    cwd: container.workingDir,
    clearEnv: true,
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  return { code: output.code, text: decoder.decode(output.stdout) + decoder.decode(output.stderr) };
}

Deno.test("the provision Job and every worker Job of the first example run it to its end", async () => {
  const nats = await startNatsServer();
  const redis = await startRedisServer();
  try {
    const { flow, url, modules } = await loadFlow(new URL("examples/hello.ts", root).pathname);
    const { objects } = renderManifests(
      {
        flowId: flow.flowId,
        flowType: flow.flowType,
        runId: "pods-1",
        specs: compileFlow(flow, { modules }),
        flowUrl: url,
      },
      {
        namespace: "test",
        image: "this-checkout",
        natsUrl: nats.url,
        redisUrl: redis.url,
        projectRoot: root.href,
        imageRoot: new URL(root).pathname,
      },
    );
    const jobs = objects.filter((o: KubernetesObject) => o.kind === "Job") as Json[];
    const [provision, ...workers] = jobs;
    assert.equal(provision.metadata.name, "vf-squares-provision");
    const provisioned = await runContainer(provision.spec.template.spec.containers[0], 0);
    assert.equal(provisioned.code, 0, provisioned.text);
    // A worker pod's init container provisions again, changing nothing the Job made.
    const again = await runContainer(workers[0].spec.template.spec.initContainers[0], 0);
    assert.equal(again.code, 0, again.text);
    const runs = workers.flatMap((job) =>
      Array.from(
        { length: job.spec.completions },
        (_, index) =>
          runContainer(job.spec.template.spec.containers[0], index).then((run) => ({
            job: job.metadata.name,
            index,
            ...run,
          })),
      )
    );
    const ended = await Promise.all(runs);
    for (const run of ended) assert.equal(run.code, 0, `${run.job}[${run.index}]: ${run.text}`);
    const printed = ended.find((run) => run.job === "vf-squares-print")!.text;
    const sums = [...printed.matchAll(/ print\[0\] (\d+) flow=squares run=pods-1/g)].map((m) => Number(m[1]));
    assert.deepEqual(
      sums.sort((a, b) => a - b),
      Array.from({ length: 10 }, (_, i) => (i + 1) + (i + 1) ** 2),
    );
  } finally {
    await nats.stop();
    await redis.stop();
  }
});
