/**
 * Replicas of a provisioned flow started as their own `deno run` processes over real servers, as a pod
 * runs them: each configured only by its `VF_*` environment (`VF_NATS_URL`, a `redis://`
 * `VF_RUNTIME_STORE_URL`, `VF_BLOB_REDIS_URL`).
 *
 * @module
 */

import type { NodeSpec } from "../../src/core/compiler.ts";
import { bootstrapUrl, Isolation } from "../../src/engines/local.ts";
import { subprocessResolutionArgs } from "../../src/engines/deno_config.ts";
import { workerEnvFor } from "../../src/runtime/worker_config.ts";
import { MAX_INLINE_PAYLOAD_ENV } from "../../src/backends/payload_bridge.ts";

/** The servers the replicas reach. */
export interface ReplicaServers {
  /** `nats://…` of a `nats-server -js`. */
  readonly nats: string;
  /** `redis://…`: the run ledger and the payload store. */
  readonly redis: string;
}

/**
 * Starts every replica of the nodes named in `only` (every node of `specs` when null) as a process on the
 * servers, payloads above 1024 bytes offloaded to Redis, and resolves with their exit codes by
 * `node/replica`; a replica that exits non-zero has its stderr printed. Termination logs go to `dir`.
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
        },
      );
      const child = new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", ...subprocessResolutionArgs(), bootstrapUrl(spec, Isolation.process)],
        env: { ...env, [MAX_INLINE_PAYLOAD_ENV]: "1024" },
        stdout: "null",
        stderr: "piped",
      }).spawn();
      running.push(
        child.output().then((out) => {
          const code = out.code;
          if (code !== 0) console.error(`${spec.name}[${index}]: ${new TextDecoder().decode(out.stderr)}`);
          return [`${spec.name}/${index}`, code];
        }),
      );
    }
  }
  return Object.fromEntries(await Promise.all(running));
}
