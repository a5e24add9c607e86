/**
 * The `vf` command line: `validate`, `compile`, `explain`, `decode`, `run-local`, `provision`, `deploy`, `dlq` and
 * `gpus`. Every failure
 * prints one rendered error (what broke, what to do, the context) and exits with the taxonomy's code; never
 * a stack trace.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { ConfigError, exitCodeOf, VideoflowError } from "../core/errors.ts";
import type { CommandOutput } from "./command_output.ts";
import { compileCommand } from "./compile.ts";
import { decodeCommand } from "./decode.ts";
import { dlqCommand } from "./dlq.ts";
import { explainCommand } from "./explain.ts";
import { runLocalCommand } from "./run_local.ts";
import { validateCommand } from "./validate.ts";

const USAGE = `usage: vf <command> [arguments]

commands:
  validate FLOW.ts   check a flow: one line per diagnostic; exit 2 when any is an error
  compile FLOW.ts    print the compiled document as JSON
  run-local FLOW.ts  run the flow on this machine, with a live view; options:
                     --isolation worker|process  --state DIR  --run-id ID
                     --flow-type realtime|batch  --no-restart
                     --channel-max-mib N  (a node's unsettled data, its own buffers included; 256)
                     --nats URL --redis URL  (over NATS JetStream and Redis instead of the
                     embedded broker)
                     --metrics [HOST:]PORT  (/metrics, /readyz, /healthz of the whole run;
                     HOST 127.0.0.1 by default, PORT 0 picks a free one)
  provision FLOW.ts  create a run's streams and durables on NATS JetStream before its workers start:
                     --run-id ID  --nats URL (else VF_NATS_URL)  [--redis URL]
                     [--flow-type realtime|batch]
  deploy FLOW.ts     print the Kubernetes manifests of one run, or apply or tear it down:
                     [--namespace NS] [--image IMG] [-o yaml|json] [--run-id ID] [--single-run]
                     [--nats URL] [--redis URL] [--flow-type realtime|batch]
                     [--project DIR] [--image-root DIR]  (the project, and where the image holds it)
                     [--autoscaling [--gpu-autoscaling] [--max-replicas N] [--nats-monitoring HOST:PORT]]
                     [--gpu-mode whole|mig-single|mig-mixed] [--gpu-resource-name NAME]
                     [--mig-geometry FILE] [--cpu QUANTITY] [--memory QUANTITY]  (each worker's requests)
                     --apply: server-side apply them and wait for the provision Job;
                     --teardown --run-id ID: delete what the run owns; either with
                     --server URL [--token TOKEN] or --kubeconfig FILE (else KUBECONFIG)
                     [--wait-timeout SECONDS]  (300)
  dlq FLOW.ts        the dead letters of a run: --run-id ID [--state DIR] [--json]
  explain FLOW.ts    what the flow will do: graph, replicas, joins, delivery, permissions
                     (--dot: the graph for Graphviz; --flow-type realtime|batch: as run-local
                     would run it)
  decode FILE        print an envelope's bytes as JSON with the wire's field names
  gpus [DEVICE]      this host's GPUs through NVML: cards, MIG devices, P2P matrix; unknowns
                     shown with their reasons (--json; DEVICE: an index, GPU- or MIG- UUID;
                     VF_NVML_LIBRARY: the libnvidia-ml to load); --publish-node NODE
                     [--server URL --token T | --kubeconfig FILE]: write them on the Kubernetes
                     node for the cluster's GPU allocation (videoflow.io/gpu-devices)

exit codes: 0 ok (a run stopped cleanly by Ctrl-C or SIGTERM too), 2 the flow or its configuration is
wrong, 3 the environment is not as required, 4 the flow ran and failed, 5 the flow stalled, 130 a run forced
to stop by a second Ctrl-C`;

/** Every option any command takes; each command names the ones it accepts. */
const OPTIONS = {
  help: { type: "boolean", short: "h" },
  dot: { type: "boolean" },
  isolation: { type: "string" },
  state: { type: "string" },
  "run-id": { type: "string" },
  "flow-type": { type: "string" },
  "no-restart": { type: "boolean" },
  "channel-max-mib": { type: "string" },
  json: { type: "boolean" },
  nats: { type: "string" },
  redis: { type: "string" },
  metrics: { type: "string" },
  namespace: { type: "string" },
  image: { type: "string" },
  output: { type: "string", short: "o" },
  "single-run": { type: "boolean" },
  project: { type: "string" },
  "image-root": { type: "string" },
  autoscaling: { type: "boolean" },
  "gpu-autoscaling": { type: "boolean" },
  "max-replicas": { type: "string" },
  "gpu-mode": { type: "string" },
  "gpu-resource-name": { type: "string" },
  "mig-geometry": { type: "string" },
  cpu: { type: "string" },
  memory: { type: "string" },
  "nats-monitoring": { type: "string" },
  apply: { type: "boolean" },
  teardown: { type: "boolean" },
  server: { type: "string" },
  token: { type: "string" },
  kubeconfig: { type: "string" },
  "publish-node": { type: "string" },
  "wait-timeout": { type: "string" },
} as const;

/** The parsed options. */
export type CliOptions = {
  readonly [K in keyof typeof OPTIONS]?: typeof OPTIONS[K]["type"] extends "string" ? string : boolean;
};

interface Command {
  readonly accepts: readonly (keyof typeof OPTIONS)[];
  run(path: string, options: CliOptions, io: CommandOutput): Promise<number>;
}

/** A command whose one operand may be left out. */
interface OptionalOperandCommand {
  readonly accepts: readonly (keyof typeof OPTIONS)[];
  run(operand: string | undefined, options: CliOptions, io: CommandOutput): Promise<number>;
}

const OPTIONAL_OPERAND_COMMANDS: Record<string, OptionalOperandCommand> = {
  gpus: {
    accepts: ["json", "publish-node", "server", "token", "kubeconfig"],
    // Loaded on use: koffi loads a native addon when imported, which no other command needs (or may do).
    run: async (device, options, io) =>
      (await import("./gpus.ts")).gpusCommand(device, {
        json: options.json,
        publishNode: options["publish-node"],
        cluster: { server: options.server, token: options.token, kubeconfig: options.kubeconfig },
      }, io),
  },
};

const COMMANDS: Record<string, Command> = {
  validate: { accepts: [], run: (path, _options, io) => validateCommand(path, io) },
  compile: { accepts: [], run: (path, _options, io) => compileCommand(path, io) },
  explain: {
    accepts: ["dot", "flow-type"],
    run: (path, options, io) =>
      explainCommand(path, { dot: options.dot ?? false, flowType: options["flow-type"] }, io),
  },
  decode: { accepts: [], run: (path, _options, io) => decodeCommand(path, io) },
  dlq: {
    accepts: ["run-id", "state", "json"],
    run: (path, options, io) =>
      dlqCommand(path, { runId: options["run-id"], state: options.state, json: options.json }, io),
  },
  provision: {
    accepts: ["run-id", "nats", "redis", "flow-type"],
    // Loaded on use: the NATS and Redis clients it brings are no other command's to load.
    run: async (path, options, io) =>
      (await import("./provision.ts")).provisionCommand(path, {
        runId: options["run-id"],
        nats: options.nats,
        redis: options.redis,
        flowType: options["flow-type"],
      }, io),
  },
  deploy: {
    accepts: [
      "namespace",
      "image",
      "output",
      "run-id",
      "single-run",
      "flow-type",
      "nats",
      "redis",
      "project",
      "image-root",
      "autoscaling",
      "gpu-autoscaling",
      "max-replicas",
      "gpu-mode",
      "gpu-resource-name",
      "mig-geometry",
      "cpu",
      "memory",
      "nats-monitoring",
      "apply",
      "teardown",
      "server",
      "token",
      "kubeconfig",
      "wait-timeout",
    ],
    // Loaded on use: the schema models and the YAML writer are no other command's to load.
    run: async (path, options, io) =>
      (await import("./deploy.ts")).deployCommand(path, {
        namespace: options.namespace,
        image: options.image,
        output: options.output,
        runId: options["run-id"],
        singleRun: options["single-run"],
        flowType: options["flow-type"],
        nats: options.nats,
        redis: options.redis,
        project: options.project,
        imageRoot: options["image-root"],
        autoscaling: options.autoscaling,
        gpuAutoscaling: options["gpu-autoscaling"],
        maxReplicas: options["max-replicas"],
        gpuMode: options["gpu-mode"],
        gpuResourceName: options["gpu-resource-name"],
        migGeometry: options["mig-geometry"],
        cpu: options.cpu,
        memory: options.memory,
        natsMonitoring: options["nats-monitoring"],
        apply: options.apply,
        teardown: options.teardown,
        server: options.server,
        token: options.token,
        kubeconfig: options.kubeconfig,
        waitTimeout: options["wait-timeout"],
      }, io),
  },
  "run-local": {
    accepts: [
      "isolation",
      "state",
      "run-id",
      "flow-type",
      "no-restart",
      "channel-max-mib",
      "nats",
      "redis",
      "metrics",
    ],
    run: (path, options, io) =>
      runLocalCommand(path, {
        isolation: options.isolation,
        state: options.state,
        runId: options["run-id"],
        flowType: options["flow-type"],
        noRestart: options["no-restart"],
        channelMaxMib: options["channel-max-mib"],
        nats: options.nats,
        redis: options.redis,
        metrics: options.metrics,
      }, io),
  },
};

function usageError(message: string): ConfigError {
  return new ConfigError(message, "run `vf --help` for the commands and their arguments");
}

function parse(args: readonly string[]) {
  try {
    return parseArgs({
      args: [...args],
      allowPositionals: true,
      strict: true,
      options: OPTIONS,
    });
  } catch (error) {
    throw usageError(error instanceof Error ? error.message : String(error));
  }
}

/** Runs the CLI on `args` and resolves with the process exit code; writes only through `io`. */
export async function runCli(args: readonly string[], io: CommandOutput): Promise<number> {
  try {
    const { positionals, values } = parse(args);
    if (values.help || positionals.length === 0) {
      io.out(USAGE);
      return values.help ? 0 : 2;
    }
    const [name, ...rest] = positionals;
    const optional = Object.hasOwn(OPTIONAL_OPERAND_COMMANDS, name)
      ? OPTIONAL_OPERAND_COMMANDS[name]
      : undefined;
    const command = Object.hasOwn(COMMANDS, name) ? COMMANDS[name] : optional;
    if (command === undefined) throw usageError(`unknown command ${JSON.stringify(name)}`);
    if (optional !== undefined && rest.length > 1) {
      throw usageError(`${name} takes at most one operand, got ${rest.length}`);
    }
    if (optional === undefined && rest.length !== 1) {
      throw usageError(`${name} takes exactly one path, got ${rest.length}`);
    }
    const refused = Object.keys(values).filter((key) =>
      !(command.accepts as readonly string[]).includes(key)
    );
    if (refused.length > 0) throw usageError(`${name} does not take --${refused.join(", --")}`);
    return optional !== undefined
      ? await optional.run(rest[0], values, io)
      : await COMMANDS[name].run(rest[0], values, io);
  } catch (error) {
    io.err(render(error));
    return exitCodeOf(error);
  }
}

function render(error: unknown): string {
  if (error instanceof VideoflowError) return error.render();
  const text = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return `VF_UNKNOWN: ${text}`;
}

/** The process entry: runs the CLI on `args` (`Deno.args` by default) and exits with its code. */
export async function main(args: readonly string[] = Deno.args): Promise<never> {
  const encoder = new TextEncoder();
  const code = await runCli(args, {
    out: (line) => console.log(line),
    err: (line) => console.error(line),
    write: (text) => Deno.stdout.writeSync(encoder.encode(text)),
  });
  Deno.exit(code);
}
