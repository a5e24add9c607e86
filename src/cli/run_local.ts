/**
 * `vf run-local FLOW.ts [--isolation worker|process] [--state DIR] [--run-id ID] [--flow-type realtime|batch]
 * [--no-restart] [--channel-max-mib N] [--nats URL --redis URL]`: runs the flow on this machine with the local
 * engine (after printing the flow's warnings), over a NATS JetStream server and a Redis server instead of
 * the embedded broker when both are given, shows a live view while it runs, a summary at the end, and exits
 * with the run's status (0, 2, 3, 4, 5; 130 when forced). The run-wide
 * worker settings set in its own environment (`VF_PROGRESS_TIMEOUT_SECONDS`, `VF_ACK_WAIT_SECONDS`,
 * `VF_LOG_LEVEL`, a test's `VF_FAULT_SCHEDULE_JSON`, ...: `FORWARDED_SETTINGS` of the local engine) reach
 * every replica.
 *
 * @module
 */

import { compileFlow, nodePermissions, nodePreloads } from "../core/compiler.ts";
import { ConfigError } from "../core/errors.ts";
import { randomHex } from "../core/hex.ts";
import { checkFlowType } from "../core/flow_type.ts";
import type { FlowType } from "../core/flow.ts";
import {
  checkLocalRunOptions,
  DEFAULT_CHANNEL_MAX_BYTES,
  EMBEDDED_MAX_ENVELOPE_BYTES,
  forwardedSettings,
  Isolation,
  LocalEngine,
  type LocalRunResult,
  type MetricsAddress,
  MIB,
  type RunServers,
} from "../engines/local.ts";
import type { ViewOutput } from "../engines/live_view.ts";
import { StopSignals } from "../engines/stop_signals.ts";
import { checkRunNames } from "../engines/run_directory.ts";
import { gpuDemandsOf, planLocalGpus } from "../deploy/allocation_local.ts";
import { readHostGpus } from "../runtime/gpucheck.ts";
import { admitLocally } from "./admission.ts";
import { loadFlow } from "./load_flow.ts";
import type { CommandOutput } from "./command_output.ts";

/** The options `run-local` takes. */
export interface RunLocalOptions {
  readonly isolation?: string;
  readonly state?: string;
  readonly runId?: string;
  readonly flowType?: string;
  readonly noRestart?: boolean;
  /** `--channel-max-mib`: the limit on one node's unsettled data, at the broker and in its buffers, in MiB. */
  readonly channelMaxMib?: string;
  /** `--nats`: the JetStream server the replicas use instead of the embedded broker (with `--redis`). */
  readonly nats?: string;
  /** `--redis`: the Redis server holding the payloads and the run ledger (with `--nats`). */
  readonly redis?: string;
  /** `--metrics [HOST:]PORT`: where the whole run's health endpoint listens; none by default. */
  readonly metrics?: string;
}

/** The state directory when `--state` is not given. */
export const DEFAULT_STATE_DIR = ".videoflow";

/** A fresh run id: `run-` and the UTC time to the second, then 4 random hex digits. */
export function generateRunId(now: Date = new Date()): string {
  const stamp = now.toISOString().replace(/[-:]/g, "").replace("T", "-").slice(0, 15);
  return `run-${stamp}-${randomHex(2)}`;
}

function isolationOf(value: string | undefined): Isolation {
  const isolation = value ?? Isolation.worker;
  if (isolation !== Isolation.worker && isolation !== Isolation.process) {
    throw new ConfigError(
      `unknown isolation ${JSON.stringify(isolation)}`,
      "pass --isolation worker (Deno Workers, the default) or --isolation process (subprocesses)",
    );
  }
  return isolation;
}

/** `--channel-max-mib` in bytes; refused, in the MiB it was given in, below the largest envelope. */
function channelMaxBytesOf(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const remedy = `pass --channel-max-mib ${DEFAULT_CHANNEL_MAX_BYTES / MIB} (the default), or more for a ` +
    `larger backlog; at least ${EMBEDDED_MAX_ENVELOPE_BYTES / MIB}`;
  if (!/^[0-9]{1,9}$/.test(value)) {
    throw new ConfigError(`--channel-max-mib ${JSON.stringify(value)} is not a whole number of MiB`, remedy);
  }
  const mib = Number(value);
  if (mib * MIB < EMBEDDED_MAX_ENVELOPE_BYTES) {
    throw new ConfigError(
      `--channel-max-mib ${mib} is below ${
        EMBEDDED_MAX_ENVELOPE_BYTES / MIB
      } MiB, the largest envelope one ` +
        "channel must hold",
      remedy,
    );
  }
  return mib * MIB;
}

/** `--metrics [HOST:]PORT` as an address (host 127.0.0.1 by default); null when not given. */
function metricsAddressOf(value: string | undefined): MetricsAddress | null {
  if (value === undefined) return null;
  const colon = value.lastIndexOf(":");
  const hostname = colon < 0 ? "127.0.0.1" : value.slice(0, colon).replace(/^\[(.*)\]$/, "$1");
  const portText = colon < 0 ? value : value.slice(colon + 1);
  const port = /^\d{1,5}$/.test(portText) ? Number(portText) : NaN;
  if (!(port <= 65535) || hostname === "") {
    throw new ConfigError(
      `--metrics ${JSON.stringify(value)} is not [HOST:]PORT`,
      "pass a port (--metrics 9100, on 127.0.0.1), a host and port (--metrics 0.0.0.0:9100), or 0 for a free port",
    );
  }
  return { hostname, port };
}

/** `--nats` and `--redis`, given together or not at all. */
function serversOf(nats: string | undefined, redis: string | undefined): RunServers | null {
  if (nats === undefined && redis === undefined) return null;
  if (nats === undefined || redis === undefined) {
    throw new ConfigError(
      `--${nats === undefined ? "redis" : "nats"} was given without --${
        nats === undefined ? "nats" : "redis"
      }`,
      "pass both, --nats nats://host:4222 --redis redis://host:6379 (JetStream carries the messages, " +
        "Redis holds the payloads and the run ledger), or neither for the embedded broker",
    );
  }
  return {
    natsUrl: checkServerUrl("--nats", nats, ["nats"]),
    redisUrl: checkServerUrl("--redis", redis, ["redis", "rediss"]),
  };
}

/** `url` when it is a `host:port` URL of one of `schemes`; else a ConfigError naming `flag`. */
function checkServerUrl(flag: string, url: string, schemes: readonly string[]): string {
  let parsed: URL | null = null;
  try {
    parsed = new URL(url);
  } catch {
    parsed = null;
  }
  if (parsed === null || !schemes.includes(parsed.protocol.slice(0, -1)) || parsed.hostname === "") {
    throw new ConfigError(
      `${flag} ${JSON.stringify(url)} is not a ${schemes.map((s) => `${s}://`).join(" or ")} URL`,
      `pass ${flag} ${schemes[0]}://host:port`,
    );
  }
  return url;
}

/** The terminal's size, when stdout (or another standard stream) is one; `null` otherwise. */
function terminalSize(): { columns: number; rows: number } | null {
  try {
    return Deno.consoleSize();
  } catch {
    return null;
  }
}

/** The live view on this process's stdout, written through `write`: on a terminal, as wide and high as it is. */
function stdoutView(write: (text: string) => void): ViewOutput {
  return {
    isTerminal: Deno.stdout.isTerminal(),
    write,
    columns: () => terminalSize()?.columns ?? null,
    rows: () => terminalSize()?.rows ?? null,
  };
}

/** How {@link runLocal} runs a flow file: what `vf run-local`'s options say, typed. */
export interface LocalFlowRunOptions {
  /** Deno Workers (the default) or subprocesses. */
  readonly isolation?: Isolation;
  /** The state directory ({@link DEFAULT_STATE_DIR} by default). */
  readonly stateDir?: string;
  /** The run id: a fresh one ({@link generateRunId}) by default; an earlier one to go on with that run. */
  readonly runId?: string;
  /** The flow type to run as; the flow's own by default. */
  readonly flowType?: FlowType;
  /** Restart failed replicas (true by default). */
  readonly restart?: boolean;
  /**
   * The limit on one node's unsettled data, at the embedded broker and in its replicas' output buffers, in
   * bytes ({@link DEFAULT_CHANNEL_MAX_BYTES}).
   */
  readonly channelMaxBytes?: number;
  /** Where the live view, the events and the summary go: stdout by default. */
  readonly output?: ViewOutput;
  /** Where the run's opening line and the flow's warnings go, one per call: stderr by default. */
  readonly notices?: (text: string) => void;
  /** Stops the run the clean way when it aborts (a re-run with the same run id goes on from there). */
  readonly signal?: AbortSignal;
  /** NATS JetStream and Redis servers to run over instead of the embedded broker; none by default. */
  readonly servers?: RunServers | null;
  /** Where the whole run's health endpoint listens (`/metrics`, `/readyz`, `/healthz`); none by default. */
  readonly metrics?: MetricsAddress | null;
  /**
   * The run-wide worker settings replicas get (`FORWARDED_SETTINGS`: timeouts, retries, log level): those
   * of this process's environment by default.
   */
  readonly settings?: Readonly<Record<string, string>>;
}

/** A run as the CLI starts it: a library run plus the stop signals `vf` has listened for since it started. */
interface CommandRunOptions extends LocalFlowRunOptions {
  /**
   * SIGINT and SIGTERM as listened for since before the flow loaded (`vf run-local` listens as it
   * starts); by default the engine listens once the flow is loaded and compiled.
   */
  readonly stopSignals?: StopSignals;
}

/**
 * Runs the flow file at `path` (a path or a `file:` URL; its default export is the `Flow`) on this machine,
 * as `vf run-local` does, and resolves with how the run ended. A flow or option that is wrong rejects with a
 * typed error before anything starts. `mod.ts` exports it, loading this module on the first call.
 */
export async function runLocal(path: string, options: CommandRunOptions = {}): Promise<LocalRunResult> {
  const isolation = options.isolation ?? Isolation.worker;
  const extraEnv = forwardedSettings(options.settings ?? Deno.env.toObject());
  const runId = options.runId ?? generateRunId();
  const { flow, modules } = await loadFlow(path);
  checkRunNames(flow.flowId, runId);
  const flowType = options.flowType === undefined ? flow.flowType : checkFlowType(options.flowType);
  // The flow is validated first, as a whole: every problem it has is reported at once, as `vf validate` does;
  // admission reads a sound graph (a cycle has no order to read it in).
  const warnings: string[] = [];
  const specs = compileFlow(flow, { modules, onWarning: (warning) => warnings.push(warning.render()) });
  admitLocally(flow);
  // The host's GPUs are read only for a flow that has GPU nodes; a `none` node that cannot have its
  // devices refuses the flow here, before anything starts.
  const demands = gpuDemandsOf(flow);
  const gpus = demands.length === 0 ? null : planLocalGpus(demands, await readHostGpus());
  const permissions = nodePermissions(flow);
  const { channelMaxBytes } = options;
  checkLocalRunOptions({ channelMaxBytes, extraEnv, flowType, isolation, permissions });
  const notices = options.notices ?? ((text: string) => console.error(text));
  for (const warning of warnings) notices(warning);
  const output = options.output ??
    stdoutView((text) => Deno.stdout.writeSync(new TextEncoder().encode(text)));
  const as = (isolation === Isolation.worker ? "Deno Workers" : "subprocesses") +
    (options.servers == null ? "" : ` on ${options.servers.natsUrl} and ${options.servers.redisUrl}`);
  return await LocalEngine.run({
    onStart: () =>
      notices(`running flow ${flow.flowId} (${flowType}), run ${runId}, ${specs.length} nodes as ${as}`),
    flowId: flow.flowId,
    flowType,
    specs,
    permissions,
    preloads: nodePreloads(flow),
    runId,
    stateDir: options.stateDir ?? DEFAULT_STATE_DIR,
    isolation,
    restart: options.restart ?? true,
    output,
    extraEnv,
    channelMaxBytes,
    signal: options.signal,
    stopSignals: options.stopSignals,
    servers: options.servers ?? null,
    gpus,
    metrics: options.metrics ?? null,
  });
}

/** Runs the flow file at `path` locally; resolves with the run's exit status. */
export async function runLocalCommand(
  path: string,
  options: RunLocalOptions,
  io: CommandOutput,
): Promise<number> {
  // From now until the command returns, a Ctrl-C or SIGTERM is a request to stop, never the end of vf.
  using stopSignals = StopSignals.listen();
  const runId = options.runId ?? generateRunId();
  const result = await runLocal(path, {
    isolation: isolationOf(options.isolation),
    stateDir: options.state,
    runId,
    flowType: options.flowType === undefined ? undefined : checkFlowType(options.flowType),
    restart: !(options.noRestart ?? false),
    channelMaxBytes: channelMaxBytesOf(options.channelMaxMib),
    servers: serversOf(options.nats, options.redis),
    metrics: metricsAddressOf(options.metrics),
    output: stdoutView((text) => io.write(text)),
    notices: (text) => io.err(text),
    stopSignals,
  });
  const deadLetters = result.snapshots.reduce((sum, snapshot) => sum + snapshot.deadLetters, 0);
  if (deadLetters > 0) {
    const state = options.state === undefined ? "" : ` --state ${options.state}`;
    io.err(
      `${deadLetters} dead letter${
        deadLetters === 1 ? "" : "s"
      }: \`vf dlq ${path} --run-id ${runId}${state}\` ` +
        "lists them",
    );
  }
  return result.exitCode;
}
