/**
 * `vf run-local FLOW.ts [--isolation worker|process] [--state DIR] [--run-id ID] [--flow-type realtime|batch]
 * [--no-restart] [--channel-max-mib N]`: runs the flow on this machine with the local engine (after printing
 * the flow's warnings), shows a live view while it runs, a summary at the end, and exits with the run's
 * status (0, 2, 3, 4, 5; 130 when forced). The run-wide
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
import {
  checkLocalRunOptions,
  DEFAULT_CHANNEL_MAX_BYTES,
  forwardedSettings,
  Isolation,
  LocalEngine,
  MIB,
} from "../engines/local.ts";
import { checkRunNames } from "../engines/run_directory.ts";
import { loadFlow } from "./load_flow.ts";
import type { CommandOutput } from "./main.ts";

/** The options `run-local` takes. */
export interface RunLocalOptions {
  readonly isolation?: string;
  readonly state?: string;
  readonly runId?: string;
  readonly flowType?: string;
  readonly noRestart?: boolean;
  /** `--channel-max-mib`: the embedded broker's limit on one node's unsettled data, in MiB. */
  readonly channelMaxMib?: string;
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

/** `--channel-max-mib` in bytes; the engine refuses a limit below its largest envelope. */
function channelMaxBytesOf(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!/^[0-9]{1,9}$/.test(value)) {
    throw new ConfigError(
      `--channel-max-mib ${JSON.stringify(value)} is not a whole number of MiB`,
      `pass --channel-max-mib ${DEFAULT_CHANNEL_MAX_BYTES / MIB} (the default), or more for a larger backlog`,
    );
  }
  return Number(value) * MIB;
}

/** Runs the flow file at `path` locally; resolves with the run's exit status. */
export async function runLocalCommand(
  path: string,
  options: RunLocalOptions,
  io: CommandOutput,
): Promise<number> {
  const isolation = isolationOf(options.isolation);
  const channelMaxBytes = channelMaxBytesOf(options.channelMaxMib);
  const extraEnv = forwardedSettings(Deno.env.toObject());
  const runId = options.runId ?? generateRunId();
  const { flow, modules } = await loadFlow(path);
  checkRunNames(flow.flowId, runId);
  const flowType = options.flowType === undefined ? flow.flowType : checkFlowType(options.flowType);
  const permissions = nodePermissions(flow);
  checkLocalRunOptions({ channelMaxBytes, extraEnv, flowType, isolation, permissions });
  const specs = compileFlow(flow, { modules, onWarning: (warning) => io.err(warning.render()) });
  const as = isolation === Isolation.worker ? "Deno Workers" : "subprocesses";
  io.err(`running flow ${flow.flowId} (${flowType}), run ${runId}, ${specs.length} nodes as ${as}`);
  const result = await LocalEngine.run({
    flowId: flow.flowId,
    flowType,
    specs,
    permissions,
    preloads: nodePreloads(flow),
    runId,
    stateDir: options.state ?? DEFAULT_STATE_DIR,
    isolation,
    restart: !(options.noRestart ?? false),
    output: { isTerminal: Deno.stdout.isTerminal(), write: (text) => io.write(text) },
    extraEnv,
    channelMaxBytes,
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
