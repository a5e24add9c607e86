/**
 * The rendered manifests run the flow they describe: against a real nats-server and redis-server, the
 * provision Job's command, a worker pod's init container (the same provisioning, idempotent), and then
 * every worker container of every Job (each completion index a process, started as its pod starts it: the
 * container's command, with the narrowed permissions it names, in its working directory with exactly its
 * environment, the downward-API values filled in) run the flow to its end. The image here is this
 * checkout: the image root is the project directory itself. What a pod has of its own and these processes
 * share is given each process apart, in its environment and its flags alike: its health port (every pod
 * has a network namespace of its own) and its termination log file.
 */
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { loadFlow } from "../../src/cli/load_flow.ts";
import { compileFlow, nodePermissions, nodePreloads } from "../../src/core/compiler.ts";
import { type KubernetesObject, renderManifests } from "../../src/deploy/manifests.ts";
import { DEFAULT_HEALTH_HOSTNAME, HEALTH_PORT_ENV } from "../../src/runtime/health.ts";
import { DEFAULT_TERMINATION_LOG, TERMINATION_LOG_ENV } from "../../src/runtime/watchdog.ts";
import { fakeNvmlLibrary, h100, writeFixture } from "../support/fake_nvml.ts";
import { startNatsServer, startRedisServer } from "../support/services.ts";
import { inTempDir, vf } from "../support/vf_cli.ts";

const root = new URL("../../", import.meta.url);

// deno-lint-ignore no-explicit-any
type Json = Record<string, any>;

/** What a pod's container gets from the node besides its own environment: the deno on its PATH. */
const HOST = ["HOME", "PATH", "DENO_DIR"].flatMap((name) => {
  const value = Deno.env.get(name);
  return value === undefined ? [] : [[name, value] as const];
});

/** `command` with the one entry `from` of its `flag` list replaced by `to`; fails unless there is one. */
function remapEntry(command: readonly string[], flag: string, from: string, to: string): string[] {
  let hits = 0;
  const out = command.map((arg) => {
    if (!arg.startsWith(`${flag}=`)) return arg;
    const entries = arg.slice(flag.length + 1).split(",").map((entry) =>
      entry === from ? (hits++, to) : entry
    );
    return `${flag}=${entries.join(",")}`;
  });
  assert.equal(hits, 1, `${flag} names ${from} once in ${command.join(" ")}`);
  return out;
}

function freePort(): number {
  const listener = Deno.listen({ hostname: DEFAULT_HEALTH_HOSTNAME, port: 0 });
  const { port } = listener.addr as Deno.NetAddr;
  listener.close();
  return port;
}

/** How long one pod's process may run before it is killed. */
const POD_SECONDS = 20;

interface ContainerRun {
  readonly code: number;
  readonly text: string;
  /** What the replica wrote to its termination log ("" when it wrote none). */
  readonly terminationLog: string;
}

async function runContainer(
  container: Json,
  index: number,
  dir: string,
  node: Readonly<Record<string, string>> = {},
): Promise<ContainerRun> {
  const env: Record<string, string> = { ...Object.fromEntries(HOST), ...node };
  for (const entry of container.env ?? []) {
    env[entry.name] = entry.value ??
      (entry.valueFrom.fieldRef.fieldPath.includes("completion-index") ? String(index) : "unexpected");
  }
  assert.ok(Array.isArray(container.command), `${container.name} names its command`);
  let command: string[] = container.command;
  const logPath = join(dir, `${crypto.randomUUID()}.termination-log`);
  if (env[HEALTH_PORT_ENV] !== undefined) {
    // The pod's own port, and the termination log of its own file system, each given this process apart.
    const port = String(freePort());
    command = remapEntry(
      command,
      "--allow-net",
      `${DEFAULT_HEALTH_HOSTNAME}:${env[HEALTH_PORT_ENV]}`,
      `${DEFAULT_HEALTH_HOSTNAME}:${port}`,
    );
    env[HEALTH_PORT_ENV] = port;
    assert.equal(env[TERMINATION_LOG_ENV], DEFAULT_TERMINATION_LOG);
    command = remapEntry(command, "--allow-write", DEFAULT_TERMINATION_LOG, logPath);
    env[TERMINATION_LOG_ENV] = logPath;
  }
  const [program, ...args] = command;
  assert.equal(program, "deno");
  const output = await new Deno.Command(Deno.execPath(), {
    args,
    cwd: container.workingDir,
    clearEnv: true,
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    // A pod that hangs is killed, so its story fails with what it printed instead of never ending.
    signal: AbortSignal.timeout(POD_SECONDS * 1000),
  }).output();
  const decoder = new TextDecoder();
  const terminationLog = await Deno.readTextFile(logPath).catch(() => "");
  return {
    code: output.code,
    text: decoder.decode(output.stdout) + decoder.decode(output.stderr),
    terminationLog,
  };
}

interface PodRun extends ContainerRun {
  readonly job: string;
  readonly index: number;
}

/**
 * Renders `flowPath` as run `runId` against the servers, runs the provision Job, one init container, then
 * every worker Job's pods at once, each given `node` too (what its Kubernetes node adds, such as the NVIDIA
 * toolkit's library path), and resolves with each pod's run.
 */
async function runPods(
  flowPath: string,
  runId: string,
  dir: string,
  node: Readonly<Record<string, string>> = {},
): Promise<PodRun[]> {
  const nats = await startNatsServer();
  const redis = await startRedisServer();
  try {
    const { flow, url, modules } = await loadFlow(new URL(flowPath, root).pathname);
    const { objects } = renderManifests(
      {
        flowId: flow.flowId,
        flowType: flow.flowType,
        runId,
        specs: compileFlow(flow, { modules }),
        flowUrl: url,
        permissions: nodePermissions(flow),
        preloads: nodePreloads(flow),
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
    assert.equal(provision.metadata.name, `vf-${flow.flowId}-provision`);
    const provisioned = await runContainer(provision.spec.template.spec.containers[0], 0, dir);
    assert.equal(provisioned.code, 0, provisioned.text);
    // A worker pod's init container provisions again, changing nothing the Job made.
    const again = await runContainer(workers[0].spec.template.spec.initContainers[0], 0, dir);
    assert.equal(again.code, 0, again.text);
    const runs = workers.flatMap((job) =>
      Array.from(
        { length: job.spec.completions },
        (_, index) =>
          runContainer(job.spec.template.spec.containers[0], index, dir, node).then((run) => ({
            job: job.metadata.name,
            index,
            ...run,
          })),
      )
    );
    return await Promise.all(runs);
  } finally {
    await nats.stop();
    await redis.stop();
  }
}

/** The values a node named `node` logged, in the order logged. */
function printed(text: string, node: string): number[] {
  return [...text.matchAll(new RegExp(` ${node}\\[0\\] (\\d+) flow=`, "g"))].map((m) => Number(m[1]));
}

Deno.test("the provision Job and every worker Job of the first example run it to its end", async () => {
  await inTempDir(async (dir) => {
    const ended = await runPods("examples/hello.ts", "pods-1", dir);
    for (const run of ended) assert.equal(run.code, 0, `${run.job}[${run.index}]: ${run.text}`);
    const sums = printed(ended.find((run) => run.job === "vf-squares-print")!.text, "print");
    assert.deepEqual(
      sums.sort((a, b) => a - b),
      Array.from({ length: 10 }, (_, i) => (i + 1) + (i + 1) ** 2),
    );
  });
});

const UNDECLARED_READ =
  'VF_NODE_CONTRACT: node snoop needs read permission for "deno.json", which it does not declare';

Deno.test("a pod's node reading a file it did not declare fails as under run-local --isolation process; the other pods run to their end", async () => {
  await inTempDir(async (dir) => {
    const flow = "tests/fixtures/deploy/permissions_flow.ts";
    const local = await vf(
      ["run-local", new URL(flow, root).pathname, "--isolation", "process", "--state", join(dir, "state")],
      { cwd: new URL(root).pathname },
    );
    assert.equal(local.code, 2, local.text);
    assert.ok(local.text.includes(`snoop[0] exited with code 2 (${UNDECLARED_READ})`), local.text);
    assert.match(
      local.text,
      /lost\[0\] exited with code 4 \(VF_UPSTREAM_ABORTED: lost stopped: its parent snoop aborted/,
    );
    const ended = await runPods(flow, "pods-2", dir);
    const byJob = Object.fromEntries(ended.map((run) => [run.job.replace("vf-sandboxes-", ""), run]));
    assert.deepEqual(
      Object.fromEntries(Object.entries(byJob).map(([node, run]) => [node, run.code])),
      { count: 0, reader: 0, print: 0, snoop: 2, lost: 4 },
      ended.map((run) => `${run.job}: ${run.text}`).join("\n"),
    );
    assert.ok(byJob.snoop.text.includes(UNDECLARED_READ), byJob.snoop.text);
    assert.match(byJob.snoop.text, /static permissions = \{ read: \["deno\.json"\] \}/);
    assert.equal(JSON.parse(byJob.snoop.terminationLog).code, "VF_NODE_CONTRACT", byJob.snoop.terminationLog);
    assert.match(byJob.lost.text, /VF_UPSTREAM_ABORTED/);
    // The node that declared its read got it, in its pod as under run-local.
    const length = (await Deno.readTextFile(new URL("deno.json", root))).length;
    assert.deepEqual(printed(byJob.print.text, "print"), [1, 2, 3].map((x) => x + length));
    assert.deepEqual(printed(local.text, "print"), [1, 2, 3].map((x) => x + length));
  });
});

Deno.test("a GPU node's pod reads NVML through the ffi its command grants and opens on its GPU", async () => {
  await inTempDir(async (dir) => {
    // The NVIDIA container toolkit puts the driver's libnvidia-ml.so.1 where the loader finds it.
    const library = await fakeNvmlLibrary();
    const node = {
      LD_LIBRARY_PATH: dirname(library),
      FAKE_NVML_FIXTURE: await writeFixture({ devices: [h100(0)] }),
    };
    const ended = await runPods("tests/fixtures/deploy/gpu_pods_flow.ts", "pods-3", dir, node);
    for (const run of ended) assert.equal(run.code, 0, `${run.job}[${run.index}]: ${run.text}`);
    const detect = ended.find((run) => run.job === "vf-gpu-pods-detect")!;
    assert.doesNotMatch(detect.text, /cannot be verified|refuses to open/, detect.text);
    assert.deepEqual(printed(ended.find((run) => run.job === "vf-gpu-pods-print")!.text, "print"), [1, 2, 3]);
  });
});
