/**
 * Replicas of a provisioned flow started as their own `deno run` processes over real servers, as a pod
 * runs them: each configured only by its `VF_*` environment (`VF_NATS_URL`, a `redis://`
 * `VF_RUNTIME_STORE_URL`, `VF_BLOB_REDIS_URL`).
 *
 * @module
 */

import type { NodeSpec } from "../../src/core/compiler.ts";
import { podEntryUrl } from "../../src/deploy/manifests.ts";
import { subprocessResolutionArgs } from "../../src/engines/deno_config.ts";
import { workerEnvFor, type WorkerSettings } from "../../src/runtime/worker_config.ts";
import { MAX_INLINE_PAYLOAD_ENV } from "../../src/backends/payload_bridge.ts";
import { type ProvisionOptions, type ProvisionResult, provisionRun } from "../../src/runtime/provision.ts";

/** This checkout, as the image root a pod's entry names. */
const CHECKOUT = new URL("../../", import.meta.url).pathname;

/** The servers the replicas reach. */
export interface ReplicaServers {
  /** `nats://…` of a `nats-server -js`. */
  readonly nats: string;
  /** `redis://…`: the run ledger and the payload store. */
  readonly redis: string;
}

/**
 * Provisions run `runId` of `flow` (its `specs`) on the servers as `vf provision` does, payloads and the
 * run ledger on Redis, with `extra` options (an ack wait) over the defaults.
 */
export function provisionOnServers(
  servers: ReplicaServers,
  flow: { flowId: string; flowType: "batch" | "realtime" },
  runId: string,
  specs: readonly NodeSpec[],
  extra: Partial<ProvisionOptions> = {},
): Promise<ProvisionResult> {
  return provisionRun({
    natsUrl: servers.nats,
    flowId: flow.flowId,
    runId,
    flowType: flow.flowType,
    specs,
    blobStoreUrl: servers.redis,
    runtimeStoreUrl: servers.redis,
    ...extra,
  });
}

/** One replica process started by {@link startReplica}. */
export interface StartedReplica {
  /** The process. */
  readonly child: Deno.ChildProcess;
  /** Its exit code, once it exited; its stderr is printed when that is not 0. */
  readonly exited: Promise<number>;
}

/**
 * Starts replica `index` of `spec` as a process on the servers, payloads above 1024 bytes offloaded to
 * Redis, configured as a pod is: by its whole `VF_*` environment, with `settings` over the defaults. Its
 * termination log goes to `dir`. It runs the pod's generated entry, or `command` (`deno` meaning this
 * Deno) from the checkout's root, as an image runs its entrypoint from its project directory.
 */
export function startReplica(
  spec: NodeSpec,
  specs: readonly NodeSpec[],
  flow: { flowId: string; flowType: "batch" | "realtime" },
  runId: string,
  servers: ReplicaServers,
  dir: string,
  index: number,
  settings: Partial<WorkerSettings> = {},
  command: readonly string[] | null = null,
): StartedReplica {
  const env = workerEnvFor(
    spec,
    specs,
    flow,
    { runId, broker: { kind: "nats", url: servers.nats } },
    index,
    {
      runtimeStoreUrl: servers.redis,
      blobStoreUrl: servers.redis,
      terminationLog: `${dir}/${spec.name}-${index}.termination.json`,
      healthPort: null,
      ...settings,
    },
  );
  const [program, ...args] = command ??
    ["deno", "run", "-A", ...subprocessResolutionArgs(), podEntryUrl(spec, [], CHECKOUT)];
  const child = new Deno.Command(program === "deno" ? Deno.execPath() : program, {
    args,
    cwd: CHECKOUT,
    env: { ...env, [MAX_INLINE_PAYLOAD_ENV]: "1024" },
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const exited = child.output().then((out) => {
    if (out.code !== 0) console.error(`${spec.name}[${index}]: ${new TextDecoder().decode(out.stderr)}`);
    return out.code;
  });
  return { child, exited };
}

/**
 * Starts every replica of the nodes named in `only` (every node of `specs` when null) with
 * {@link startReplica}, and resolves with their exit codes by `node/replica`.
 */
export async function runReplicas(
  specs: readonly NodeSpec[],
  flow: { flowId: string; flowType: "batch" | "realtime" },
  runId: string,
  servers: ReplicaServers,
  dir: string,
  only: readonly string[] | null = null,
): Promise<Record<string, number>> {
  const running: Promise<[string, number]>[] = [];
  for (const spec of specs) {
    if (only !== null && !only.includes(spec.name)) continue;
    for (let index = 0; index < spec.nbTasks; index++) {
      const { exited } = startReplica(spec, specs, flow, runId, servers, dir, index);
      running.push(exited.then((code) => [`${spec.name}/${index}`, code]));
    }
  }
  return Object.fromEntries(await Promise.all(running));
}
