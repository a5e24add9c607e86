/**
 * `vf provision FLOW.ts --run-id ID [--nats URL] [--redis URL] [--flow-type realtime|batch]`: creates every
 * stream and durable a run of the flow needs on a NATS JetStream server, after admitting the composition
 * against what the server (and Redis, when given) read back live (`provisionRun`), so that workers started
 * afterwards with `VF_NATS_URL` find everything bound. The server is `--nats`, else `VF_NATS_URL`; Redis
 * (`--redis`, else `VF_BLOB_REDIS_URL`) is the payload store and, with `--redis`, the run ledger too. Prints
 * one line per stream and durable, then a summary; a refusal exits with its error's code (2 for an
 * incompatible composition, 3 for an unreachable server) and creates nothing.
 *
 * @module
 */

import { compileFlow } from "../core/compiler.ts";
import { ConfigError } from "../core/errors.ts";
import { checkFlowType } from "../core/flow_type.ts";
import { checkRunNames } from "../engines/run_directory.ts";
import { provisionRun } from "../runtime/provision.ts";
import { WorkerEnvVar } from "../runtime/worker_config.ts";
import { RUNTIME_STORE_ENV } from "../backends/capabilities.ts";
import type { CommandOutput } from "./command_output.ts";
import { loadFlow } from "./load_flow.ts";

/** The options `provision` takes. */
export interface ProvisionCommandOptions {
  readonly runId?: string;
  readonly nats?: string;
  readonly redis?: string;
  readonly flowType?: string;
}

/** The value of `flag`, else of `variable` in `env`; null when neither is set. */
function flagOrEnv(flag: string | undefined, variable: string, env: Record<string, string>): string | null {
  return flag ?? (env[variable] || null);
}

/** Provisions a run of the flow file at `path`; resolves with the exit code. */
export async function provisionCommand(
  path: string,
  options: ProvisionCommandOptions,
  io: CommandOutput,
  env: Record<string, string> = Deno.env.toObject(),
): Promise<number> {
  const natsUrl = flagOrEnv(options.nats, WorkerEnvVar.natsUrl, env);
  if (natsUrl === null) {
    throw new ConfigError(
      "provision needs the NATS server to create the run's streams on",
      `pass --nats nats://host:4222 (or set ${WorkerEnvVar.natsUrl})`,
    );
  }
  if (options.runId === undefined) {
    throw new ConfigError(
      "provision creates one run's streams and durables, and was not told which run",
      "pass --run-id ID: the run id the workers will be started with",
    );
  }
  const { flow, modules } = await loadFlow(path);
  checkRunNames(flow.flowId, options.runId);
  const flowType = options.flowType === undefined ? flow.flowType : checkFlowType(options.flowType);
  const specs = compileFlow(flow, { modules, onWarning: (warning) => io.err(warning.render()) });
  const result = await provisionRun({
    natsUrl,
    flowId: flow.flowId,
    runId: options.runId,
    flowType,
    specs,
    blobStoreUrl: flagOrEnv(options.redis, WorkerEnvVar.blobStoreUrl, env),
    runtimeStoreUrl: flagOrEnv(options.redis, RUNTIME_STORE_ENV, env),
  });
  for (const warning of result.warnings) io.err(`WARNING: ${warning}`);
  for (const channel of result.topology.channels) {
    const { node } = channel.spec.id;
    io.out(
      `stream ${String(channel.effective.name ?? node)} (node ${node}): ${
        describe(channel.effective, STREAM_FIELDS)
      }`,
    );
  }
  for (const subscription of result.topology.subscriptions) {
    io.out(
      `durable ${String(subscription.effective.durable_name ?? "?")}: ${
        describe(subscription.effective, DURABLE_FIELDS)
      }`,
    );
  }
  io.err(
    `flow ${flow.flowId} run ${options.runId} provisioned on ${natsUrl}: ` +
      `${result.topology.channels.length} streams, ${result.topology.subscriptions.length} durables` +
      (result.ledgerBudget ? " (the ledger keeps the retry budgets)" : ""),
  );
  return 0;
}

/** The settings a stream line shows, as the server holds them. */
const STREAM_FIELDS = [
  "subjects",
  "retention",
  "discard",
  "max_msgs",
  "max_msgs_per_subject",
  "duplicate_window",
];
/** The settings a durable line shows, as the server holds them. */
const DURABLE_FIELDS = ["filter_subject", "ack_policy", "ack_wait", "max_deliver", "max_ack_pending"];
/** The settings JetStream holds in nanoseconds, shown in seconds. */
const NANOSECOND_FIELDS: ReadonlySet<string> = new Set(["duplicate_window", "ack_wait"]);

/** `fields` of the broker's effective settings of one object, as `key=value` pairs. */
function describe(effective: Readonly<Record<string, unknown>>, fields: readonly string[]): string {
  return fields.filter((key) => effective[key] !== undefined).map((key) => {
    const value = effective[key];
    if (NANOSECOND_FIELDS.has(key) && typeof value === "number") return `${key}=${value / 1e9}s`;
    return `${key}=${Array.isArray(value) ? value.join(",") : String(value)}`;
  }).join(" ");
}
