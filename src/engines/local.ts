/**
 * The local engine: runs every replica of a compiled flow on this machine, each with exactly the Deno
 * permissions its node declares, over the embedded broker (the reference messaging model and payload
 * store, served to workers by the supervisor) with the run ledger in a file store under the state
 * directory (`.videoflow/<flow>/<run>/ledger`). Replicas are Deno Workers by default (frame bytes cross
 * as transferred buffers), or `deno run` subprocesses with matching `--allow-*` flags. The supervisor
 * restarts replicas per {@link SupervisionPolicy.local}, shows a live view, stops the flow the spec's way on
 * SIGINT/SIGTERM (a second signal forces), and resolves with the run's exit status.
 *
 * @module
 */

import type { NodeSpec } from "../core/compiler.ts";
import { EXIT_FLOW_FAILED, EXIT_STALLED, EXIT_USER } from "../core/errors.ts";
import type { FlowType } from "../core/flow.ts";
import {
  nodeExited,
  nodeStarted,
  renderEvent,
  type SupervisionEvent,
  SupervisionPolicy,
  type TerminationReason,
} from "../core/supervision.ts";
import { channelId, MessageKind } from "../backends/messaging.ts";
import { flowTopology, provisionFlow, type TopologyNode } from "../messaging/topology.ts";
import { FileRuntimeStore } from "../runtime/file_store.ts";
import { EMBEDDED_RUNTIME_STORE_URL, REPORT_LINE_PREFIX, type WorkerReport } from "../runtime/worker.ts";
import { workerEnvFor } from "../runtime/worker_config.ts";
import { parseBrokerAddress } from "../runtime/embedded_rpc.ts";
import { type DeadLetterRecord, deadLetterRecord, writeDeadLetters } from "./dead_letters.ts";
import { EmbeddedBroker } from "./embedded_broker.ts";
import { LiveView, type NodeSnapshot, NodeState, renderSummary, type ViewOutput } from "./live_view.ts";
import {
  type GrantedPermissions,
  mergePermissions,
  permissionFlags,
  workerPermissions,
} from "./permissions.ts";

/** How replicas are isolated from each other and from the supervisor. */
export const Isolation = { worker: "worker", process: "process" } as const;
/** How replicas are isolated. */
export type Isolation = typeof Isolation[keyof typeof Isolation];

/** What a local run needs: the compiled specs and how to run them. */
export interface LocalRunOptions {
  readonly flowId: string;
  readonly flowType: FlowType;
  readonly specs: readonly NodeSpec[];
  /** Node name to the permissions its replicas get (the compiled document's `permissions`). */
  readonly permissions: Readonly<Record<string, GrantedPermissions>>;
  readonly runId: string;
  /** The state directory; the run's ledger lives in `<stateDir>/<flow>/<run>/`. */
  readonly stateDir: string;
  readonly isolation: Isolation;
  /** Restart failed replicas (the local supervision policy); false: the first failure is final. */
  readonly restart: boolean;
  /** Where the live view and events are written. */
  readonly output: ViewOutput;
  /** Extra `VF_*` settings every replica gets (fault schedules in tests, timeouts). */
  readonly extraEnv?: Readonly<Record<string, string>>;
  /** How often the live view refreshes, seconds (1). */
  readonly refreshSeconds?: number;
  /** Seconds without any report after which a replica counts as dead (10). */
  readonly silenceSeconds?: number;
}

/** How a local run ended. */
export interface LocalRunResult {
  /** 0 every replica finished; 2, 3, 4 or 5 by the worst failure; 130 when forced by a second signal. */
  readonly exitCode: number;
  readonly outcome: string;
  readonly snapshots: readonly NodeSnapshot[];
  /** Where the run's ledger and termination logs are. */
  readonly runDir: string;
}

/** The exit status of a run stopped by a second interrupt. */
export const EXIT_FORCED = 130;

/** One running (or finished) replica, as the supervisor tracks it. */
interface Replica {
  readonly spec: NodeSpec;
  readonly index: number;
  restarts: number;
  state: NodeState;
  exitCode: number | null;
  reason: TerminationReason | null;
  lastReportAt: number;
  stats: Extract<WorkerReport, { kind: "stats" }> | null;
  stop: (() => void) | null;
  kill: (() => void) | null;
}

const DENO_ENV_PASSTHROUGH = ["PATH", "HOME", "DENO_DIR", "TMPDIR", "NO_COLOR", "XDG_CACHE_HOME", "LANG"];

const configPath = new URL("../../deno.json", import.meta.url);
const nodeWorkerUrl = new URL("../../workers/node_worker.ts", import.meta.url).href;
const nodeProcessUrl = new URL("../../workers/node_process.ts", import.meta.url).href;

function moduleOf(nodeClass: string): string {
  return nodeClass.slice(0, nodeClass.lastIndexOf("#"));
}

/**
 * The generated entry module of a replica: imports the node's module and the worker runtime statically, so
 * both load before the sandbox applies, then serves. A `data:` URL, so nothing is written for it.
 */
export function bootstrapUrl(spec: NodeSpec, isolation: Isolation): string {
  const nodeModule = JSON.stringify(moduleOf(spec.nodeClass ?? ""));
  const source = isolation === Isolation.worker
    ? `import ${nodeModule};\nimport { serveNodeWorker } from ${
      JSON.stringify(nodeWorkerUrl)
    };\nserveNodeWorker();\n`
    : `import ${nodeModule};\nimport { serveNodeProcess } from ${
      JSON.stringify(nodeProcessUrl)
    };\nawait serveNodeProcess();\n`;
  return `data:application/typescript;base64,${btoa(unescape(encodeURIComponent(source)))}`;
}

function topologyNodes(specs: readonly NodeSpec[]): TopologyNode[] {
  return specs.map((spec) => ({
    name: spec.name,
    parents: spec.parents,
    nbTasks: spec.nbTasks,
    partitionBy: spec.partitionBy,
    joinPolicy: spec.joinPolicy,
    delivery: spec.delivery,
  }));
}

/** The run's exit status from its replicas' statuses: the worst failure wins (stalled over failed over user). */
export function runExitCode(codes: readonly number[]): number {
  if (codes.every((code) => code === 0)) return 0;
  if (codes.includes(EXIT_STALLED)) return EXIT_STALLED;
  if (codes.some((code) => code !== 0 && code !== EXIT_USER && code !== 3)) return EXIT_FLOW_FAILED;
  return codes.includes(3) ? 3 : EXIT_USER;
}

/** Runs a compiled flow on this machine until it ends; see the module comment. */
export class LocalEngine {
  readonly #options: LocalRunOptions;
  readonly #replicas: Replica[] = [];
  readonly #view: LiveView;
  readonly #policy: SupervisionPolicy;
  readonly #broker: EmbeddedBroker;
  readonly #runDir: string;
  readonly #started = performance.now() / 1000;
  #stopping = false;
  #forced = false;
  #wake: (() => void) | null = null;

  private constructor(options: LocalRunOptions, ledger: FileRuntimeStore, runDir: string) {
    this.#options = options;
    this.#runDir = runDir;
    this.#broker = new EmbeddedBroker({ runtimeStore: ledger });
    this.#view = new LiveView(options.output, this.#started);
    this.#policy = options.restart ? SupervisionPolicy.local() : SupervisionPolicy.disabled();
  }

  /** Runs the flow and resolves with how it ended. */
  static async run(options: LocalRunOptions): Promise<LocalRunResult> {
    const runDir = `${options.stateDir}/${options.flowId}/${options.runId}`;
    await Deno.mkdir(`${runDir}/termination`, { recursive: true });
    const ledger = await FileRuntimeStore.open(`${runDir}/ledger`);
    const engine = new LocalEngine(options, ledger, runDir);
    try {
      return await engine.#run();
    } finally {
      await engine.#broker.close();
      await ledger.close();
    }
  }

  /** Asks the flow to stop the spec's way (producers end with EOS, workers drain); a second call forces. */
  stop(): void {
    if (this.#stopping) {
      this.#forced = true;
      for (const replica of this.#replicas) replica.kill?.();
      this.#wake?.();
      return;
    }
    this.#stopping = true;
    this.#view.event(`stopping flow ${this.#options.flowId}: producers end their streams (again to force)`);
    for (const spec of this.#options.specs) {
      const channel = channelId(this.#options.flowId, this.#options.runId, spec.name);
      this.#broker.messaging.commitControl(channel, "stop", null, new TextEncoder().encode("stop"));
    }
  }

  async #run(): Promise<LocalRunResult> {
    const { flowId, flowType, runId, specs } = this.#options;
    const topology = flowTopology(topologyNodes(specs), { flowId, runId, flowType });
    await provisionFlow(this.#broker.messaging, topology, `run-local/${runId}`);
    if (this.#options.isolation === Isolation.process) await this.#broker.listen();
    const onSignal = () => this.stop();
    const signals: Deno.Signal[] = ["SIGINT", "SIGTERM"];
    for (const signal of signals) Deno.addSignalListener(signal, onSignal);
    try {
      for (const spec of specs) {
        for (let index = 0; index < spec.nbTasks; index++) {
          const replica: Replica = {
            spec,
            index,
            restarts: 0,
            state: NodeState.starting,
            exitCode: null,
            reason: null,
            lastReportAt: performance.now() / 1000,
            stats: null,
            stop: null,
            kill: null,
          };
          this.#replicas.push(replica);
          this.#launch(replica);
        }
      }
      await this.#supervise();
    } finally {
      for (const signal of signals) Deno.removeSignalListener(signal, onSignal);
    }
    await writeDeadLetters(this.#runDir, this.#deadLetters());
    const snapshots = this.#snapshots();
    const exitCode = this.#forced
      ? EXIT_FORCED
      : runExitCode(this.#replicas.map((r) => r.exitCode ?? EXIT_FLOW_FAILED));
    const outcome = exitCode === 0
      ? `flow ${flowId} finished (run ${runId})`
      : `flow ${flowId} ${
        this.#forced ? "was forced to stop" : "failed"
      } with exit code ${exitCode} (run ${runId})`;
    for (const line of renderSummary(performance.now() / 1000 - this.#started, snapshots, outcome)) {
      this.#options.output.write(`${line}\n`);
    }
    return { exitCode, outcome, snapshots, runDir: this.#runDir };
  }

  #event(event: SupervisionEvent): void {
    const line = renderEvent(event);
    if (line !== null) this.#view.event(line);
  }

  #envFor(replica: Replica): Record<string, string> {
    const { flowId, flowType, runId, specs } = this.#options;
    const broker = this.#options.isolation === Isolation.worker ? { kind: "embedded-port" as const } : {
      kind: "embedded-tcp" as const,
      ...parseBrokerAddress(this.#broker.address ?? ""),
      secret: this.#broker.secret,
    };
    return {
      ...workerEnvFor(replica.spec, specs, { flowId, flowType }, { runId, broker }, replica.index, {
        runtimeStoreUrl: EMBEDDED_RUNTIME_STORE_URL,
        terminationLog: `${this.#runDir}/termination/${replica.spec.name}-${replica.index}.json`,
        healthPort: null,
      }),
      ...this.#options.extraEnv,
    };
  }

  #onReport(replica: Replica, report: WorkerReport): void {
    replica.lastReportAt = performance.now() / 1000;
    if (report.kind === "stats") {
      replica.stats = report;
      if (replica.state === NodeState.starting || replica.state === NodeState.restarting) {
        replica.state = NodeState.running;
      }
    } else {
      replica.reason = report.reason as TerminationReason | null;
    }
  }

  #launch(replica: Replica): void {
    replica.lastReportAt = performance.now() / 1000;
    replica.exitCode = null;
    this.#event(nodeStarted(replica.spec.name, replica.index, replica.restarts));
    if (this.#options.isolation === Isolation.worker) this.#launchWorker(replica);
    else this.#launchProcess(replica);
  }

  #granted(spec: NodeSpec): GrantedPermissions {
    return this.#options.permissions[spec.name] ?? {};
  }

  #launchWorker(replica: Replica): void {
    const { spec, index } = replica;
    const worker = new Worker(bootstrapUrl(spec, Isolation.worker), {
      type: "module",
      name: `${spec.name}/${index}`,
      deno: { permissions: workerPermissions(this.#granted(spec)) },
    } as WorkerOptions);
    let ended = false;
    const end = (code: number) => {
      if (ended) return;
      ended = true;
      worker.terminate();
      this.#exited(replica, code);
    };
    worker.onmessage = (event: MessageEvent<WorkerReport | { kind: "done"; code: number }>) => {
      const message = event.data;
      if (message.kind === "done") end(message.code);
      else this.#onReport(replica, message);
    };
    worker.onerror = (event: ErrorEvent) => {
      event.preventDefault();
      this.#view.event(`${spec.name}[${index}] crashed: ${event.message}`);
      replica.reason = { code: "VF_WORKER_FATAL", message: event.message, disposition: "worker_fatal" };
      end(EXIT_FLOW_FAILED);
    };
    const port = this.#broker.openPort(`${spec.name}/${index}`);
    worker.postMessage({ env: this.#envFor(replica), port }, [port]);
    replica.stop = () => worker.postMessage({ type: "quiesce" });
    replica.kill = () => end(EXIT_FLOW_FAILED);
  }

  #launchProcess(replica: Replica): void {
    const { spec } = replica;
    const granted = mergePermissions(this.#granted(spec), {
      net: [(this.#broker.address ?? "").replace("tcp://", "")],
      write: [`${this.#runDir}/termination`],
    });
    const passthrough = Object.fromEntries(
      DENO_ENV_PASSTHROUGH.flatMap((name) => {
        const value = Deno.env.get(name);
        return value === undefined ? [] : [[name, value]];
      }),
    );
    const child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--no-prompt",
        `--config=${configPath.pathname}`,
        "--allow-env",
        ...permissionFlags(granted),
        bootstrapUrl(spec, Isolation.process),
      ],
      clearEnv: true,
      env: { ...passthrough, ...this.#envFor(replica) },
      stdin: "null",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    replica.stop = () => {
      try {
        child.kill("SIGTERM");
      } catch {
        // already gone
      }
    };
    replica.kill = () => {
      try {
        child.kill("SIGKILL");
      } catch {
        // already gone
      }
    };
    void this.#readReports(replica, child.stdout);
    child.status.then((status) =>
      this.#exited(replica, status.signal === null ? status.code : 128 + signalNumber(status.signal))
    );
  }

  async #readReports(replica: Replica, stdout: ReadableStream<Uint8Array>): Promise<void> {
    let buffered = "";
    for await (const chunk of stdout.pipeThrough(new TextDecoderStream())) {
      buffered += chunk;
      let newline = buffered.indexOf("\n");
      while (newline >= 0) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        if (line.startsWith(REPORT_LINE_PREFIX)) {
          this.#onReport(replica, JSON.parse(line.slice(REPORT_LINE_PREFIX.length)));
        } else {
          this.#options.output.write(`${line}\n`);
        }
        newline = buffered.indexOf("\n");
      }
    }
  }

  #exited(replica: Replica, code: number): void {
    if (replica.exitCode !== null) return;
    replica.exitCode = code;
    replica.stop = null;
    replica.kill = null;
    const exited = nodeExited(replica.spec.name, replica.index, code, replica.reason);
    this.#event(exited);
    const decision = this.#forced || this.#stopping && code !== 0
      ? { kind: "give_up" as const, event: null }
      : this.#policy.decide(exited, replica.restarts);
    if (decision.kind === "finished") {
      replica.state = NodeState.done;
    } else if (decision.kind === "restart") {
      replica.state = NodeState.restarting;
      replica.restarts++;
      this.#event(decision.event);
      setTimeout(() => {
        if (!this.#forced) this.#launch(replica);
      }, decision.delaySeconds * 1000);
    } else {
      replica.state = NodeState.failed;
      if (decision.event !== null) this.#event(decision.event);
      if (!this.#stopping) this.#abortFlow(replica);
    }
    this.#wake?.();
  }

  /** A replica the supervisor gave up on: the flow cannot finish, so every other replica is stopped. */
  #abortFlow(failed: Replica): void {
    this.#view.event(`giving up on ${failed.spec.name}[${failed.index}]: stopping the flow`);
    this.stop();
  }

  /** Every dead letter the broker holds for this run, node by node. */
  #deadLetters(): DeadLetterRecord[] {
    const { flowId, runId, specs } = this.#options;
    return specs.flatMap((spec) =>
      this.#broker.messaging.stored(channelId(flowId, runId, spec.name))
        .filter((envelope) => envelope.kind === MessageKind.dlq)
        .map(deadLetterRecord)
    );
  }

  #snapshots(): NodeSnapshot[] {
    const { flowId, runId, specs } = this.#options;
    return specs.map((spec) => {
      const replicas = this.#replicas.filter((r) => r.spec === spec);
      const states = replicas.map((r) => r.state);
      const state = states.includes(NodeState.failed)
        ? NodeState.failed
        : states.every((s) => s === NodeState.done)
        ? NodeState.done
        : states.includes(NodeState.restarting)
        ? NodeState.restarting
        : states.includes(NodeState.running)
        ? NodeState.running
        : NodeState.starting;
      const drops: Record<string, number> = {};
      for (const r of replicas) {
        for (const [reason, n] of Object.entries(r.stats?.drops ?? {})) {
          drops[reason] = (drops[reason] ?? 0) + n;
        }
      }
      const stored = this.#broker.messaging.stored(channelId(flowId, runId, spec.name));
      return {
        node: spec.name,
        state,
        replicasRunning: replicas.filter((r) =>
          r.exitCode === null && r.state !== NodeState.restarting
        ).length,
        replicas: replicas.length,
        processed: replicas.reduce((sum, r) => sum + (r.stats?.processed ?? 0), 0),
        failed: replicas.reduce((sum, r) => sum + (r.stats?.failed ?? 0), 0),
        inFlight: stored.filter((e) => e.kind === MessageKind.data).length,
        drops,
        deadLetters: stored.filter((e) => e.kind === MessageKind.dlq).length,
        restarts: replicas.reduce((sum, r) => sum + r.restarts, 0),
      };
    });
  }

  async #supervise(): Promise<void> {
    const refresh = (this.#options.refreshSeconds ?? 1) * 1000;
    const silence = this.#options.silenceSeconds ?? 10;
    let shownAt = -Infinity;
    let deadLettersWritten = 0;
    while (!this.#replicas.every((r) => r.state === NodeState.done || r.state === NodeState.failed)) {
      if (this.#forced) break;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, refresh);
        this.#wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.#wake = null;
      const now = performance.now() / 1000;
      for (const replica of this.#replicas) {
        if (
          replica.exitCode === null && replica.state !== NodeState.restarting &&
          now - replica.lastReportAt > silence
        ) {
          this.#view.event(
            `${replica.spec.name}[${replica.index}] went silent for ${silence}s: counted as dead`,
          );
          replica.kill?.();
          this.#exited(replica, EXIT_FLOW_FAILED);
        }
      }
      if (now - shownAt >= refresh / 1000) {
        shownAt = now;
        const snapshots = this.#snapshots();
        this.#view.update(now, snapshots);
        const deadLetters = snapshots.reduce((sum, s) => sum + s.deadLetters, 0);
        if (deadLetters !== deadLettersWritten) {
          deadLettersWritten = deadLetters;
          await writeDeadLetters(this.#runDir, this.#deadLetters());
        }
      }
    }
  }
}

function signalNumber(signal: Deno.Signal): number {
  const numbers: Partial<Record<Deno.Signal, number>> = {
    SIGINT: 2,
    SIGKILL: 9,
    SIGTERM: 15,
    SIGSEGV: 11,
    SIGABRT: 6,
  };
  return numbers[signal] ?? 1;
}
