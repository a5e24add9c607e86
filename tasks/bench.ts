/**
 * `deno task bench`: the local engine's figures, each beside a baseline measured in the same run on the
 * same machine, so the ratios mean something on a shared, noisy host where absolute numbers do not.
 *
 * 1. Small items: `{ seq, sentAt }` records through producer → relay → sink under `run-local` (worker
 *    isolation, in this process through {@link LocalEngine.run}), against three bare Deno Workers joined
 *    by MessagePorts moving the same items (windowed by sink credit). Throughput is counted at the sink from
 *    its first item to its last; latency is the sink's time minus the producer's stamp; start-up (run start
 *    to the first item at the sink) is reported on its own line, and so is the CPU time the whole process
 *    (every thread) spent per item from the sink's first item to its last, a figure a noisy host disturbs
 *    less than a rate.
 * 2. Video: a 1280x720 H.264 `testsrc` clip decoded by VideoFileReader → mean of one channel → sink
 *    (worker isolation; process isolation on a line of its own), against one bare Deno program reading
 *    the same ffmpeg pipe into one reused frame array and taking the same mean of each frame, and against
 *    `ffmpeg` alone decoding to bgr24 on a pipe this process drains. Steady frames/s runs from the first
 *    frame to the last (the sink's arrivals; the bare program's first and last frames; ffmpeg's first and
 *    last bytes), wall frames/s from the start of the run (the spawn) to its end. The CPU time this process
 *    spends per frame (ffmpeg's own not counted; worker isolation, where every replica is a thread of it)
 *    is set beside the bare program's, and the VideoFileReader's alone beside it too.
 * 3. Start-up: a 10-node chain (producer → 8 relays → sink), from the start of `vf run-local` (a fresh
 *    `deno task vf run-local` process) and from {@link LocalEngine.run} in this process to the first
 *    item at the sink, against ten bare workers chained the same way, spawn to first item; and the CPU
 *    time (every thread) ten Workers spawned at once take to evaluate a replica's entry (a node module and
 *    `workers/node_worker.ts`), against ten Workers that load nothing: the part of start-up each replica's
 *    isolate spends before it serves.
 * 4. Backlog: the video flow with a consumer far slower than its decoder (`--backlog-delay-ms` per frame),
 *    so the embedded broker holds the decoder back at its channel limit: the peak growth of this process's
 *    resident memory during the run, against the decoded size of the whole clip (what a broker that never
 *    held the decoder back would come to hold).
 *
 * 5. Growth: what a long run holds. The 4-node flow producer → 2 identities → counting sink, run by
 *    `vf run-local` in a subprocess at each `--growth-items` count (batch) in each `--growth-isolations`:
 *    the peak memory of the whole process tree (`vf` and every replica process, sampled from `/proc` every
 *    250 ms) as RSS summed and as PSS summed (shared pages, the deno binary's, counted once), the finished
 *    run directory's size on disk and file count, and the end of the run (from the sink's last item to
 *    `vf`'s exit), each at the largest count beside the smallest. Then a realtime flow making `--realtime-rate` items/s for
 *    `--realtime-seconds` into an idempotent `JsonlSink` (`idempotent: true`: effect markers and the
 *    sink's key index): the tree's RSS and PSS and the run directory at the end beside their values
 *    at the end of the warm-up (`--warmup-seconds`), where a flat run keeps them.
 *
 * Rounds of a flow and its baseline alternate, and each figure is the median of its rounds. The table is
 * printed to stdout and, with `--json PATH`, written as JSON.
 *
 * Run: `deno task bench [options]`; `deno task bench --help` lists them ({@link USAGE}). `--state` puts the runs' ledgers somewhere else than the scratch directory (a tmpfs, to
 * see what the disk costs; created if missing); the runs stay there, in a fresh subdirectory.
 *
 * @module
 */

import { parseArgs } from "node:util";
import { Redis } from "ioredis";
import { END, Flow, RuntimeContext, VideoFileReader } from "../mod.ts";
import { compileFlow, nodePermissions } from "../src/core/compiler.ts";
import type { ConsumerNode, ProcessorNode, ProducerNode } from "../src/core/node.ts";
import { ModuleIndex } from "../src/core/node_class.ts";
import { DEFAULT_MAX_INLINE_PAYLOAD_BYTES, MAX_INLINE_PAYLOAD_ENV } from "../src/backends/payload_bridge.ts";
import { readDeadLetters } from "../src/engines/dead_letters.ts";
import { V8_HEAP_FLAGS } from "../src/engines/deno_config.ts";
import { Isolation, LocalEngine, type RunServers } from "../src/engines/local.ts";
import { REFERENCE_PREFETCH } from "../src/messaging/topology.ts";
import { type ArrivalSummary, median } from "./_bench_flows/arrivals.ts";
import * as arrivalSink from "./_bench_flows/arrival_sink.ts";
import {
  type BareNatsDone,
  type BareNatsStage,
  provisionBareHops,
  PULL_BATCH,
} from "./_bench_flows/bare_nats_hops.ts";
import type { BareDone, BareStage } from "./_bench_flows/bare_worker.ts";
import * as channelMean from "./_bench_flows/channel_mean.ts";
import { nowMs, processCpuMs } from "./_bench_flows/clock.ts";
import { eachFrame, FRAME_BYTES, HEIGHT, makeClip, rawDecoder, WIDTH } from "./_bench_flows/raw_video.ts";
import * as stamped from "./_bench_flows/stamped.ts";
import {
  type NatsServer,
  type RedisServer,
  startNatsServer,
  startRedisServer,
} from "../tests/support/services.ts";

/** How often the bare sink grants the producer credit back, in items. */
const GRANT = 256;
/**
 * Small items per round. A run's time grows faster than its item count while a relay drains after its
 * producer's end of stream, so this keeps three rounds within the bench's few minutes.
 */
const DEFAULT_ITEMS = 10_000;
const CHAIN_NODES = 10;
const STARTUP_ITEMS = 10;

const repoRoot = new URL("../", import.meta.url);

/** `deno task vf run-local`'s command line, less its `deno`: the CLI under the project's V8 flags. */
const RUN_LOCAL_ARGS = ["run", "-A", `--v8-flags=${V8_HEAP_FLAGS.join(",")}`, "mod.ts", "run-local"];
const flowModules = [
  { url: new URL("./_bench_flows/stamped.ts", import.meta.url).href, namespace: stamped },
  { url: new URL("./_bench_flows/arrival_sink.ts", import.meta.url).href, namespace: arrivalSink },
  { url: new URL("./_bench_flows/channel_mean.ts", import.meta.url).href, namespace: channelMean },
];
const bareWorkerUrl = new URL("./_bench_flows/bare_worker.ts", import.meta.url);
const bareNatsWorkerUrl = new URL("./_bench_flows/bare_nats_worker.ts", import.meta.url);
/**
 * The reference Python implementation's figure for producer → 2 identities → sink, 10,000 items, batch,
 * end to end over Debian's nats-server 2.9.10 on these machines (issue 15): it cannot be rerun here (PyPI
 * is unreachable), so the bench sets this recorded figure beside the flow's.
 */
const REFERENCE_ITEMS_PER_SECOND = 388;
const REFERENCE_ITEMS = 10_000;
/** What the flows over servers take ahead where throughput is measured: the bare baseline's pull batch. */
const SERVER_BENCH_PREFETCH = PULL_BATCH;

interface Settings {
  readonly items: number;
  readonly itemRounds: number;
  readonly frames: number;
  readonly videoRounds: number;
  readonly startupRounds: number;
  readonly backlogFrames: number;
  readonly backlogDelayMs: number;
  readonly window: number;
  readonly sections: readonly SectionKey[];
  /** Seconds a flow run may take before it is stopped (and its section fails). */
  readonly runTimeout: number;
  /** Item counts of the growth section's batch runs, ascending. */
  readonly growthItems: readonly number[];
  /** Isolations the growth section runs in. */
  readonly growthIsolations: readonly Isolation[];
  /** How long the growth section's realtime flow makes items, and how many a second. */
  readonly realtimeSeconds: number;
  readonly realtimeRate: number;
  /** The realtime run's warm-up: its figures at the end are set beside their values at this time. */
  readonly warmupSeconds: number;
}

/** Which way a figure is better (for readers of the JSON). */
type Better = "higher" | "lower";

/** One line of the table: a flow's figure beside its baseline (medians of the rounds). */
interface Figure {
  readonly section: string;
  readonly name: string;
  readonly unit: string;
  readonly better: Better;
  readonly value: number | null;
  readonly rounds: readonly (number | null)[];
  readonly baselineName: string;
  readonly baseline: number | null;
  readonly baselineRounds: readonly (number | null)[];
  /** value / baseline. */
  readonly ratio: number | null;
  /** What the project aims at, in words, and whether this run meets it (`null`: no aim or no value). */
  readonly aim: string | null;
  readonly meetsAim: boolean | null;
}

interface FigureInit {
  readonly section: string;
  readonly name: string;
  readonly unit: string;
  readonly better: Better;
  readonly rounds: readonly (number | null)[];
  readonly baselineName: string;
  readonly baselineRounds: readonly (number | null)[];
  readonly aim?: { readonly text: string; readonly met: (value: number, ratio: number | null) => boolean };
}

function medianOf(rounds: readonly (number | null)[]): number | null {
  return median(rounds.filter((v): v is number => v !== null));
}

function figure(init: FigureInit): Figure {
  const value = medianOf(init.rounds);
  const baseline = medianOf(init.baselineRounds);
  const ratio = value !== null && baseline !== null && baseline !== 0 ? value / baseline : null;
  return {
    section: init.section,
    name: init.name,
    unit: init.unit,
    better: init.better,
    value,
    rounds: init.rounds,
    baselineName: init.baselineName,
    baseline,
    baselineRounds: init.baselineRounds,
    ratio,
    aim: init.aim?.text ?? null,
    meetsAim: init.aim === undefined || value === null ? null : init.aim.met(value, ratio),
  };
}

function sectionsFrom(text: string): SectionKey[] {
  const keys = text.split(",").map((key) => key.trim()).filter((key) => key !== "");
  const unknown = keys.filter((key) => !(SECTION_KEYS as readonly string[]).includes(key));
  if (keys.length === 0 || unknown.length > 0) {
    throw new Error(
      `--sections takes a comma-separated list of ${SECTION_KEYS.join(", ")}; got ${JSON.stringify(text)}`,
    );
  }
  return keys as SectionKey[];
}

function countsFrom(text: string): number[] {
  const counts = text.split(",").map((part) => Number(part.trim()));
  if (counts.length === 0 || !counts.every((n) => Number.isInteger(n) && n >= 2)) {
    throw new Error(
      `--growth-items takes a comma-separated list of item counts ≥ 2; got ${JSON.stringify(text)}`,
    );
  }
  return counts.sort((a, b) => a - b);
}

function isolationsFrom(text: string): Isolation[] {
  const names = text.split(",").map((part) => part.trim());
  const known = Object.values(Isolation) as string[];
  if (names.length === 0 || !names.every((name) => known.includes(name))) {
    throw new Error(
      `--growth-isolations takes a comma-separated list of ${known.join(", ")}; got ${JSON.stringify(text)}`,
    );
  }
  return names as Isolation[];
}

/** The options, as `--help` prints them. */
const USAGE = [
  "deno task bench [--items 10000] [--item-rounds 3] [--frames 300] [--video-rounds 3]",
  "  [--startup-rounds 5] [--backlog-frames 900] [--backlog-delay-ms 10] [--window 1024]",
  "  [--growth-items 100000,1000000] [--growth-isolations worker,process] [--realtime-seconds 600]",
  "  [--realtime-rate 200] [--warmup-seconds 60]",
  "  [--sections items,video,video-offload,startup,backlog,growth,jetstream-items,jetstream-reference,jetstream-video]",
  "  [--state DIR] [--run-timeout 120] [--json PATH]",
].join("\n");

function settingsFrom(
  args: string[],
): Settings & { readonly json: string | null; readonly state: string | null } {
  const { values } = parseArgs({
    args,
    options: {
      items: { type: "string", default: String(DEFAULT_ITEMS) },
      "item-rounds": { type: "string", default: "3" },
      frames: { type: "string", default: "300" },
      "video-rounds": { type: "string", default: "3" },
      "startup-rounds": { type: "string", default: "5" },
      "backlog-frames": { type: "string", default: "900" },
      "backlog-delay-ms": { type: "string", default: "10" },
      window: { type: "string", default: "1024" },
      "run-timeout": { type: "string", default: "120" },
      "growth-items": { type: "string", default: "100000,1000000" },
      "growth-isolations": { type: "string", default: "worker,process" },
      "realtime-seconds": { type: "string", default: "600" },
      "realtime-rate": { type: "string", default: "200" },
      "warmup-seconds": { type: "string", default: "60" },
      sections: { type: "string", default: DEFAULT_SECTIONS.join(",") },
      json: { type: "string" },
      state: { type: "string" },
    },
  });
  const count = (name: keyof typeof values, minimum: number): number => {
    const value = Number(values[name]);
    if (!Number.isInteger(value) || value < minimum) {
      throw new Error(`--${name} must be an integer ≥ ${minimum}, got ${JSON.stringify(values[name])}`);
    }
    return value;
  };
  return {
    items: count("items", 2),
    itemRounds: count("item-rounds", 1),
    frames: count("frames", 2),
    videoRounds: count("video-rounds", 1),
    startupRounds: count("startup-rounds", 1),
    backlogFrames: count("backlog-frames", 2),
    backlogDelayMs: count("backlog-delay-ms", 1),
    window: count("window", GRANT),
    runTimeout: count("run-timeout", 1),
    growthItems: countsFrom(values["growth-items"] ?? ""),
    growthIsolations: isolationsFrom(values["growth-isolations"] ?? ""),
    realtimeSeconds: count("realtime-seconds", 2),
    realtimeRate: count("realtime-rate", 1),
    warmupSeconds: count("warmup-seconds", 1),
    sections: sectionsFrom(values.sections ?? ""),
    json: values.json ?? null,
    state: values.state ?? null,
  };
}

/** A flow run through the local engine in this process, and what its sink wrote. */
interface FlowRun {
  readonly startedAt: number;
  readonly endedAt: number;
  readonly summary: ArrivalSummary;
}

/** One flow run: where its state goes, where its sink writes, how many items must arrive, extra `VF_*` env. */
interface FlowRunOptions {
  readonly stateDir: string;
  readonly runId: string;
  readonly summaryPath: string;
  readonly expected: number;
  /** After this long the run is stopped the way Ctrl-C stops `vf run-local` (twice, 10 s apart). */
  readonly timeoutSeconds: number;
  readonly env?: Readonly<Record<string, string>>;
  /** How the replicas run; worker isolation by default. */
  readonly isolation?: Isolation;
  /** JetStream and Redis instead of the embedded broker; none by default. */
  readonly servers?: RunServers;
}

/**
 * Runs `flow` with `run-local`'s engine (worker isolation unless told, no restarts) and reads its sink's
 * summary.
 * Throws when the run fails or the sink got fewer than `expected` items (naming the first dead letter).
 */
async function runFlow(flow: Flow, options: FlowRunOptions): Promise<FlowRun> {
  const output: string[] = [];
  const startedAt = nowMs();
  const specs = compileFlow(flow, { modules: new ModuleIndex(flowModules) });
  const interrupt = () => Deno.kill(Deno.pid, "SIGINT");
  let force: ReturnType<typeof setTimeout> | null = null;
  const deadline = setTimeout(() => {
    console.error(
      `bench: ${flow.flowId} run ${options.runId} passed ${options.timeoutSeconds} s: stopping it`,
    );
    interrupt();
    force = setTimeout(interrupt, 10_000);
  }, options.timeoutSeconds * 1000);
  const result = await LocalEngine.run({
    flowId: flow.flowId,
    flowType: flow.flowType,
    specs,
    permissions: nodePermissions(flow),
    runId: options.runId,
    stateDir: options.stateDir,
    isolation: options.isolation ?? Isolation.worker,
    restart: false,
    output: { isTerminal: false, write: (text) => output.push(text) },
    extraEnv: options.env,
    servers: options.servers ?? null,
  }).finally(() => {
    clearTimeout(deadline);
    if (force !== null) clearTimeout(force);
  });
  const endedAt = nowMs();
  const what = `flow ${flow.flowId} run ${options.runId}`;
  if (result.exitCode !== 0) throw new Error(`${what} exited ${result.exitCode}:\n${output.join("")}`);
  const summary: ArrivalSummary = JSON.parse(await Deno.readTextFile(options.summaryPath));
  if (summary.count !== options.expected) {
    const letters = await readDeadLetters(result.runDir);
    const first = letters.length === 0
      ? ""
      : `; the first from ${letters[0].node}: ${letters[0].code} ${letters[0].error}`;
    throw new Error(
      `${what} exited 0 but its sink got ${summary.count} of ${options.expected} items; ` +
        `${letters.length} dead letters${first}`,
    );
  }
  return { startedAt, endedAt, summary };
}

/**
 * producer → `relays` relays → sink of `count` stamped items, as a batch flow; `prefetch` is what each
 * receiving node takes ahead (none: the broker's default).
 */
function itemChain(
  flowId: string,
  count: number,
  relays: number,
  summaryPath: string,
  prefetch: number | null = null,
): Flow {
  let upstream: ProducerNode<object> | ProcessorNode<object> = new stamped.StampedCounter({
    name: "produce",
    count,
  });
  for (let i = 1; i <= relays; i++) {
    upstream = new stamped.Relay({ name: `relay-${i}`, prefetch }).from(upstream);
  }
  const sink: ConsumerNode = new arrivalSink.ArrivalSink({
    name: "sink",
    summaryPath,
    expected: count,
    prefetch,
  })
    .from(upstream);
  return new Flow([sink], { flowType: "batch", flowId });
}

/** A bare chain's run: when the workers were spawned and what the sink saw. */
interface BareRun {
  readonly startedAt: number;
  readonly summary: ArrivalSummary;
}

/** `stages` bare workers (producer, relays, sink) moving `count` items; resolves when the sink has all. */
async function runBareChain(stages: number, count: number, window: number): Promise<BareRun> {
  const startedAt = nowMs();
  const workers = Array.from(
    { length: stages },
    (_, i) => new Worker(bareWorkerUrl, { type: "module", name: `bare-${i}` }),
  );
  try {
    const hops = Array.from({ length: stages - 1 }, () => new MessageChannel());
    const credit = new MessageChannel();
    const done = new Promise<BareDone>((resolve, reject) => {
      const sink = workers[stages - 1];
      sink.onmessage = (event: MessageEvent<BareDone>) => resolve(event.data);
      for (const worker of workers) worker.onerror = (event) => reject(new Error(event.message));
    });
    const start = (worker: Worker, stage: BareStage, ports: MessagePort[]) =>
      worker.postMessage(stage, ports);
    start(workers[0], { role: "producer", count, window, out: hops[0].port1, credit: credit.port1 }, [
      hops[0].port1,
      credit.port1,
    ]);
    for (let i = 1; i < stages - 1; i++) {
      start(workers[i], { role: "relay", in: hops[i - 1].port2, out: hops[i].port1 }, [
        hops[i - 1].port2,
        hops[i].port1,
      ]);
    }
    const last = hops[stages - 2].port2;
    start(workers[stages - 1], { role: "sink", count, grant: GRANT, in: last, credit: credit.port2 }, [
      last,
      credit.port2,
    ]);
    return { startedAt, summary: (await done).summary };
  } finally {
    for (const worker of workers) worker.terminate();
  }
}

function startupSeconds(startedAt: number, summary: ArrivalSummary): number | null {
  return summary.firstAt === null ? null : (summary.firstAt - startedAt) / 1000;
}

/** What every section gets: the settings, a scratch directory, and where progress lines go. */
interface SectionContext {
  readonly settings: Settings;
  readonly dir: string;
  /** Where the runs' ledgers go. */
  readonly stateDir: string;
  readonly progress: (line: string) => void;
}

/** A section of the table: its heading and how to measure it. */
interface Section {
  readonly key: SectionKey;
  readonly title: (settings: Settings) => string;
  readonly measure: (context: SectionContext, title: string) => Promise<Figure[]>;
}

const SECTION_KEYS = [
  "items",
  "video",
  "video-offload",
  "startup",
  "backlog",
  "growth",
  "jetstream-items",
  "jetstream-reference",
  "jetstream-video",
] as const;
type SectionKey = typeof SECTION_KEYS[number];
/** The sections run without `--sections`: all but `growth`, whose full figures take an hour. */
const DEFAULT_SECTIONS: readonly SectionKey[] = SECTION_KEYS.filter((key) => key !== "growth");

/**
 * What a sink's arrivals give beside a baseline's, round by round: throughput (aiming at `aim` × the
 * baseline, which `baselineShort` names in the aim), CPU per item, latency p50 and p99.
 */
function arrivalFigures(
  section: string,
  flow: readonly ArrivalSummary[],
  baseline: readonly ArrivalSummary[],
  baselineName: string,
  aim: number,
  baselineShort: string,
): Figure[] {
  const pair = (pick: (summary: ArrivalSummary) => number | null) => ({
    rounds: flow.map(pick),
    baselineRounds: baseline.map(pick),
    baselineName,
  });
  return [
    figure({
      section,
      name: "throughput, first to last item at the sink",
      unit: "items/s",
      better: "higher",
      ...pair((s) => s.itemsPerSecond),
      aim: { text: `≥ ${aim} × ${baselineShort}`, met: (_, ratio) => ratio !== null && ratio >= aim },
    }),
    figure({
      section,
      name: "CPU per item, first to last at the sink (every thread of this process)",
      unit: "µs/item",
      better: "lower",
      ...pair((s) => s.cpuUsPerItem),
    }),
    figure({
      section,
      name: "latency p50, producer stamp to sink",
      unit: "ms",
      better: "lower",
      ...pair((s) => s.p50Ms),
    }),
    figure({
      section,
      name: "latency p99, producer stamp to sink",
      unit: "ms",
      better: "lower",
      ...pair((s) => s.p99Ms),
    }),
  ];
}

async function smallItems(
  { settings, dir, stateDir, progress }: SectionContext,
  section: string,
): Promise<Figure[]> {
  const flowRuns: FlowRun[] = [];
  const bareRuns: BareRun[] = [];
  for (let round = 0; round < settings.itemRounds; round++) {
    const bare = await runBareChain(3, settings.items, settings.window);
    bareRuns.push(bare);
    const summaryPath = `${dir}/items-${round}.json`;
    const flow = itemChain("bench-items", settings.items, 1, summaryPath);
    const run = await runFlow(flow, {
      stateDir: stateDir,
      runId: `items-${round}`,
      summaryPath,
      expected: settings.items,
      timeoutSeconds: settings.runTimeout,
    });
    flowRuns.push(run);
    progress(
      `items round ${round + 1}/${settings.itemRounds}: flow ${fmt(run.summary.itemsPerSecond)} items/s, ` +
        `bare ${fmt(bare.summary.itemsPerSecond)} items/s`,
    );
  }
  const bareName = `3 bare Workers, postMessage (window ${settings.window})`;
  const flowSummaries = flowRuns.map((r) => r.summary);
  const bareSummaries = bareRuns.map((r) => r.summary);
  return [
    ...arrivalFigures(section, flowSummaries, bareSummaries, bareName, 0.5, "bare"),
    figure({
      section,
      name: "start-up, engine run to first item at the sink",
      unit: "s",
      better: "lower",
      rounds: flowRuns.map((r) => startupSeconds(r.startedAt, r.summary)),
      baselineName: "3 bare Workers, spawn to first item",
      baselineRounds: bareRuns.map((r) => startupSeconds(r.startedAt, r.summary)),
    }),
  ];
}

/** ffmpeg alone: the clip decoded to bgr24 on a pipe this process drains. */
interface DecodeRun {
  readonly frames: number;
  readonly wallSeconds: number;
  /** Frames per second from the first byte on the pipe to the last. */
  readonly steadyFps: number | null;
  /** CPU time this process used per frame from the first frame to the last, in µs; `null`: not measured. */
  readonly cpuUsPerFrame: number | null;
}

async function ffmpegAlone(clip: string): Promise<DecodeRun> {
  const startedAt = nowMs();
  const child = rawDecoder(clip);
  let bytes = 0;
  let firstAt: number | null = null;
  let lastAt = startedAt;
  for await (const chunk of child.stdout) {
    firstAt ??= nowMs();
    bytes += chunk.byteLength;
    lastAt = nowMs();
  }
  const status = await child.status;
  const endedAt = nowMs();
  if (!status.success || bytes % FRAME_BYTES !== 0) {
    throw new Error(`ffmpeg decoding ${clip} exited ${status.code} after ${bytes} bytes`);
  }
  const frames = bytes / FRAME_BYTES;
  const span = firstAt === null ? 0 : (lastAt - firstAt) / 1000;
  // The first chunk holds part of the first frame, so the span covers all frames but a fraction of one.
  return {
    frames,
    wallSeconds: (endedAt - startedAt) / 1000,
    steadyFps: span > 0 ? frames / span : null,
    cpuUsPerFrame: null,
  };
}

/**
 * The bare program: the same ffmpeg pipe as {@link ffmpegAlone}, read frame by frame into one array this
 * process reuses, and the flow's per-frame work ({@link channelMean.channelMeanOf}) on each frame, in this
 * thread: what the flow's decode and work cost without the flow.
 */
async function bareProgram(clip: string): Promise<DecodeRun> {
  const startedAt = nowMs();
  let means = 0;
  let firstAt: number | null = null;
  let cpuAtFirst: number | null = null;
  let lastAt = startedAt;
  const frames = await eachFrame(clip, (frame) => {
    means += channelMean.channelMeanOf(frame, 3, 0);
    lastAt = nowMs();
    if (firstAt === null) {
      firstAt = lastAt;
      cpuAtFirst = processCpuMs();
    }
  });
  const cpuAtEnd = processCpuMs();
  if (!Number.isFinite(means)) throw new Error(`the bare program's means of ${clip} are not finite`);
  const span = firstAt === null ? 0 : (lastAt - firstAt) / 1000;
  return {
    frames,
    wallSeconds: (nowMs() - startedAt) / 1000,
    steadyFps: frames >= 2 && span > 0 ? (frames - 1) / span : null,
    cpuUsPerFrame: cpuAtFirst === null || frames < 2 ? null : (cpuAtEnd - cpuAtFirst) * 1000 / (frames - 1),
  };
}

const silentLogger = { debug() {}, info() {}, warn() {}, error() {} };

/** The flow's decoder without the flow: a VideoFileReader read to its end in this thread. */
async function readerAlone(clip: string): Promise<DecodeRun> {
  const ctx = new RuntimeContext(
    { flowId: "bench", runId: "bench", nodeName: "decode", replicaId: 0 },
    silentLogger,
  );
  const startedAt = nowMs();
  const reader = new VideoFileReader({ name: "decode", path: clip });
  await reader.open(ctx);
  let frames = 0;
  let firstAt: number | null = null;
  let cpuAtFirst: number | null = null;
  let lastAt = startedAt;
  while ((await reader.next(ctx)) !== END) {
    if (firstAt === null) {
      firstAt = nowMs();
      cpuAtFirst = processCpuMs();
    }
    lastAt = nowMs();
    frames++;
  }
  const cpuAtEnd = processCpuMs();
  await reader.close(ctx);
  const span = firstAt === null ? 0 : (lastAt - firstAt) / 1000;
  return {
    frames,
    wallSeconds: (nowMs() - startedAt) / 1000,
    steadyFps: frames >= 2 && span > 0 ? (frames - 1) / span : null,
    cpuUsPerFrame: cpuAtFirst === null || frames < 2 ? null : (cpuAtEnd - cpuAtFirst) * 1000 / (frames - 1),
  };
}

/** The clip of `frames` frames in `dir`, made on first use. */
async function clipIn(dir: string, frames: number): Promise<string> {
  const clip = `${dir}/clip_720p_${frames}.mp4`;
  const exists = await Deno.stat(clip).then(() => true, () => false);
  if (!exists) await makeClip(clip, frames);
  return clip;
}

/** The reference's inline payload limit (512 KiB), below one 720p frame, so frames go to the payload store. */
const OFFLOADED_FRAMES_ENV = { [MAX_INLINE_PAYLOAD_ENV]: String(DEFAULT_MAX_INLINE_PAYLOAD_BYTES) };

/** VideoFileReader on `clip` → mean of one channel → sink, as a batch flow. */
function videoFlow(flowId: string, clip: string, summaryPath: string, expected: number): Flow {
  const decode = new VideoFileReader({ name: "decode", path: clip });
  const mean = new channelMean.ChannelMean({ name: "mean" }).from(decode);
  const sink = new arrivalSink.ArrivalSink({ name: "sink", summaryPath, expected }).from(mean);
  return new Flow([sink], { flowType: "batch", flowId });
}

/** The video section, with frames inline in their envelopes (the local engine's default) or offloaded. */
function videoSection(offloaded: boolean): Section["measure"] {
  return async ({ settings, dir, stateDir, progress }, section) => {
    const clip = await clipIn(dir, settings.frames);
    const flowRuns: FlowRun[] = [];
    const processRuns: FlowRun[] = [];
    const decodeRuns: DecodeRun[] = [];
    const readerRuns: DecodeRun[] = [];
    const bareRuns: DecodeRun[] = [];
    const label = offloaded ? "video-offload" : "video";
    const runVideoFlow = (round: number, isolation: Isolation) => {
      const summaryPath = `${dir}/${label}-${isolation}-${round}.json`;
      const flow = videoFlow(`bench-${label}`, clip, summaryPath, settings.frames);
      return runFlow(flow, {
        stateDir: stateDir,
        runId: `${label}-${isolation}-${round}`,
        summaryPath,
        expected: settings.frames,
        timeoutSeconds: settings.runTimeout,
        env: offloaded ? OFFLOADED_FRAMES_ENV : {},
        isolation,
      });
    };
    for (let round = 0; round < settings.videoRounds; round++) {
      const decoded = await ffmpegAlone(clip);
      const read = await readerAlone(clip);
      const bare = await bareProgram(clip);
      for (const [who, run] of [["ffmpeg", decoded], ["VideoFileReader", read], ["bare", bare]] as const) {
        if (run.frames !== settings.frames) {
          throw new Error(`${who} decoded ${run.frames} of ${settings.frames} frames`);
        }
      }
      decodeRuns.push(decoded);
      readerRuns.push(read);
      bareRuns.push(bare);
      const run = await runVideoFlow(round, Isolation.worker);
      flowRuns.push(run);
      const inProcesses = await runVideoFlow(round, Isolation.process);
      processRuns.push(inProcesses);
      progress(
        `${label} round ${round + 1}/${settings.videoRounds}: flow ${fmt(run.summary.itemsPerSecond)} ` +
          `frames/s (process isolation ${fmt(inProcesses.summary.itemsPerSecond)}), bare program ` +
          `${fmt(bare.steadyFps)}, ffmpeg ${fmt(decoded.steadyFps)} frames/s`,
      );
    }
    const bareName = "one bare Deno program: the same ffmpeg pipe and mean";
    const ffmpegName = "ffmpeg alone, bgr24 to a pipe";
    return [
      figure({
        section,
        name: "frames/s, first to last frame",
        unit: "frames/s",
        better: "higher",
        rounds: flowRuns.map((r) => r.summary.itemsPerSecond),
        baselineName: bareName,
        baselineRounds: bareRuns.map((r) => r.steadyFps),
        aim: { text: "≥ 0.85 × the bare program", met: (_, ratio) => ratio !== null && ratio >= 0.85 },
      }),
      figure({
        section,
        name: "frames/s, first to last frame, process isolation",
        unit: "frames/s",
        better: "higher",
        rounds: processRuns.map((r) => r.summary.itemsPerSecond),
        baselineName: bareName,
        baselineRounds: bareRuns.map((r) => r.steadyFps),
      }),
      figure({
        section,
        name: "frames/s, run start to end (with start-up)",
        unit: "frames/s",
        better: "higher",
        rounds: flowRuns.map((r) => settings.frames / ((r.endedAt - r.startedAt) / 1000)),
        baselineName: ffmpegName,
        baselineRounds: decodeRuns.map((r) => r.frames / r.wallSeconds),
      }),
      figure({
        section,
        name: "frames/s, the bare program",
        unit: "frames/s",
        better: "higher",
        rounds: bareRuns.map((r) => r.steadyFps),
        baselineName: ffmpegName,
        baselineRounds: decodeRuns.map((r) => r.steadyFps),
      }),
      figure({
        section,
        name: "frames/s, the flow's VideoFileReader alone (no flow)",
        unit: "frames/s",
        better: "higher",
        rounds: readerRuns.map((r) => r.steadyFps),
        baselineName: ffmpegName,
        baselineRounds: decodeRuns.map((r) => r.steadyFps),
      }),
      figure({
        section,
        name: "CPU per frame in this process, first to last (ffmpeg's not counted)",
        unit: "µs/frame",
        better: "lower",
        rounds: flowRuns.map((r) => r.summary.cpuUsPerItem),
        baselineName: bareName,
        baselineRounds: bareRuns.map((r) => r.cpuUsPerFrame),
      }),
      figure({
        section,
        name: "CPU per frame, the flow's VideoFileReader alone, in one thread",
        unit: "µs/frame",
        better: "lower",
        rounds: readerRuns.map((r) => r.cpuUsPerFrame),
        baselineName: bareName,
        baselineRounds: bareRuns.map((r) => r.cpuUsPerFrame),
      }),
    ];
  };
}

/** This process's resident set size, in MiB (the flow's workers are threads of it). */
function residentMib(): number {
  return Deno.memoryUsage().rss / (1024 * 1024);
}

/**
 * The backlog section: a decoder far ahead of a consumer that takes `backlogDelayMs` per frame, so the
 * embedded broker holds the decoder back at its channel limit. The figure is how much this process's
 * resident memory grew at its peak during the run, beside the decoded size of the whole clip, which is what
 * a broker that never held the decoder back would come to hold.
 */
async function backlog(
  { settings, dir, stateDir, progress }: SectionContext,
  section: string,
): Promise<Figure[]> {
  const frames = settings.backlogFrames;
  const clip = await clipIn(dir, frames);
  const summaryPath = `${dir}/backlog.json`;
  const decode = new VideoFileReader({ name: "decode", path: clip });
  const slow = new channelMean.ChannelMean({ name: "slow", delayMs: settings.backlogDelayMs }).from(decode);
  const sink = new arrivalSink.ArrivalSink({ name: "sink", summaryPath }).from(slow);
  const flow = new Flow([sink], { flowType: "batch", flowId: "bench-backlog" });
  const before = residentMib();
  let peak = before;
  const sampler = setInterval(() => peak = Math.max(peak, residentMib()), 50);
  try {
    await runFlow(flow, {
      stateDir,
      runId: "backlog",
      summaryPath,
      expected: frames,
      timeoutSeconds: settings.runTimeout,
    });
  } finally {
    clearInterval(sampler);
  }
  peak = Math.max(peak, residentMib());
  progress(`backlog: ${frames} frames, resident ${fmt(before)} → peak ${fmt(peak)} MiB`);
  return [
    figure({
      section,
      name: "peak growth of resident memory",
      unit: "MiB",
      better: "lower",
      rounds: [peak - before],
      baselineName: "the clip's decoded frames, all of them",
      baselineRounds: [frames * FRAME_BYTES / (1024 * 1024)],
    }),
  ];
}

/** The flow file `vf run-local` loads for the start-up figure: the chain with its params written in. */
function chainFlowSource(summaryPath: string): string {
  const url = (path: string) => JSON.stringify(new URL(path, import.meta.url).href);
  return [
    `import { Flow } from ${url("../mod.ts")};`,
    `import { Relay, StampedCounter } from ${url("./_bench_flows/stamped.ts")};`,
    `import { ArrivalSink } from ${url("./_bench_flows/arrival_sink.ts")};`,
    `export { ArrivalSink, Relay, StampedCounter };`,
    `let upstream = new StampedCounter({ name: "produce", count: ${STARTUP_ITEMS} });`,
    `for (let i = 1; i <= ${
      CHAIN_NODES - 2
    }; i++) upstream = new Relay({ name: \`relay-\${i}\` }).from(upstream);`,
    `const sink = new ArrivalSink({ name: "sink", summaryPath: ${
      JSON.stringify(summaryPath)
    } }).from(upstream);`,
    `export default new Flow([sink], { flowType: "batch", flowId: "bench-startup-cli" });`,
    "",
  ].join("\n");
}

/** The memory of a process tree at one moment: its processes' resident bytes summed, and their proportional share. */
interface TreeMemory {
  /** `VmRSS` summed: pages shared by several processes (the deno binary's) count once for each. */
  readonly residentBytes: number;
  /** `Pss` summed: each shared page divided among the processes that map it, so the box's real cost. */
  readonly proportionalBytes: number;
}

/** The memory of the process `root` and all its descendants now, from `/proc`; zeros once it is gone. */
function treeMemory(root: number): TreeMemory {
  const children = new Map<number, number[]>();
  for (const entry of Deno.readDirSync("/proc")) {
    const pid = Number(entry.name);
    if (!Number.isInteger(pid)) continue;
    let stat: string;
    try {
      stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    } catch {
      continue;
    }
    const parent = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    children.set(parent, [...children.get(parent) ?? [], pid]);
  }
  const kib = (pattern: RegExp, text: string) => Number(pattern.exec(text)?.[1] ?? 0) * 1024;
  let residentBytes = 0;
  let proportionalBytes = 0;
  for (const pending = [root]; pending.length > 0;) {
    const pid = pending.pop()!;
    pending.push(...children.get(pid) ?? []);
    try {
      residentBytes += kib(/^VmRSS:\s+(\d+) kB$/m, Deno.readTextFileSync(`/proc/${pid}/status`));
      proportionalBytes += kib(/^Pss:\s+(\d+) kB$/m, Deno.readTextFileSync(`/proc/${pid}/smaps_rollup`));
    } catch {
      // The process ended between the listing and the read.
    }
  }
  return { residentBytes, proportionalBytes };
}

/** What a directory holds: bytes on disk (allocated blocks), bytes of content, files. */
interface DirectoryUsage {
  readonly diskBytes: number;
  readonly bytes: number;
  readonly files: number;
}

async function directoryUsage(path: string): Promise<DirectoryUsage> {
  let diskBytes = 0;
  let bytes = 0;
  let files = 0;
  const walk = async (dir: string): Promise<void> => {
    for await (const entry of Deno.readDir(dir)) {
      const child = `${dir}/${entry.name}`;
      const info = await Deno.lstat(child).catch(() => null);
      if (info === null) continue;
      diskBytes += (info.blocks ?? 0) * 512;
      if (info.isDirectory) await walk(child);
      else {
        bytes += info.size;
        files++;
      }
    }
  };
  await walk(path).catch((error) => {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  });
  return { diskBytes, bytes, files };
}

/** One sample of a growth run: seconds since its start, the tree's memory, the run directory. */
interface GrowthSample extends TreeMemory {
  readonly at: number;
  readonly runDir: DirectoryUsage | null;
}

/** A `vf run-local` run watched from outside: its samples, the peaks of the tree's memory, its directory. */
interface WatchedRun {
  readonly samples: readonly GrowthSample[];
  readonly peakResidentBytes: number;
  readonly peakProportionalBytes: number;
  readonly runDir: DirectoryUsage;
  readonly seconds: number;
  /** When `vf` was seen to exit, in milliseconds since the epoch. */
  readonly exitedAt: number;
}

/**
 * Runs `vf run-local flowPath` in a subprocess, sampling its process tree's resident memory every 250 ms
 * and, every `dirEverySeconds` (when given), the run directory; throws unless it exits 0.
 */
async function watchRunLocal(
  flowPath: string,
  options: {
    readonly stateDir: string;
    readonly runDir: string;
    readonly runId: string;
    readonly isolation: Isolation;
    readonly timeoutSeconds: number;
    readonly dirEverySeconds: number | null;
    readonly progress?: (sample: GrowthSample) => void;
  },
): Promise<WatchedRun> {
  const startedAt = nowMs();
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      ...[...RUN_LOCAL_ARGS, flowPath],
      ...["--state", options.stateDir, "--run-id", options.runId, "--isolation", options.isolation],
      "--no-restart",
    ],
    cwd: repoRoot.pathname,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(options.timeoutSeconds * 1000),
  }).spawn();
  const output = child.output();
  const samples: GrowthSample[] = [];
  let peak = 0;
  let peakProportional = 0;
  let lastDirAt = 0;
  let done = false;
  output.finally(() => (done = true));
  while (!done) {
    const at = (nowMs() - startedAt) / 1000;
    const memory = treeMemory(child.pid);
    peak = Math.max(peak, memory.residentBytes);
    peakProportional = Math.max(peakProportional, memory.proportionalBytes);
    let runDir: DirectoryUsage | null = null;
    if (options.dirEverySeconds !== null && at - lastDirAt >= options.dirEverySeconds) {
      runDir = await directoryUsage(options.runDir);
      lastDirAt = at;
    }
    const sample = { at, ...memory, runDir };
    samples.push(sample);
    if (runDir !== null) options.progress?.(sample);
    await Promise.race([output, new Promise((resolve) => setTimeout(resolve, 250))]);
  }
  const result = await output;
  const exitedAt = Date.now();
  if (!result.success) {
    const said = new TextDecoder().decode(result.stdout) + new TextDecoder().decode(result.stderr);
    throw new Error(
      `vf run-local ${flowPath} (${options.isolation}) exited ${result.code}:\n${said.slice(-4000)}`,
    );
  }
  return {
    samples,
    peakResidentBytes: peak,
    peakProportionalBytes: peakProportional,
    runDir: await directoryUsage(options.runDir),
    seconds: (nowMs() - startedAt) / 1000,
    exitedAt,
  };
}

const MIB = 1024 * 1024;

/** A flow file for `vf run-local`: the bench nodes imported, `body` building `flow`, exported. */
function flowSource(body: readonly string[]): string {
  const url = (path: string) => JSON.stringify(new URL(path, import.meta.url).href);
  return [
    `import { Flow, JsonlSink } from ${url("../mod.ts")};`,
    `import { Relay, StampedCounter } from ${url("./_bench_flows/stamped.ts")};`,
    `import { CountingSink, PacedCounter } from ${url("./_bench_flows/counting.ts")};`,
    `export { CountingSink, JsonlSink, PacedCounter, Relay, StampedCounter };`,
    ...body,
    "",
  ].join("\n");
}

/** What a {@link CountingSink} wrote at its close. */
async function sinkSummaryOf(summaryPath: string): Promise<{ count: number; lastItemAt: number | null }> {
  return JSON.parse(await Deno.readTextFile(summaryPath));
}

/** Issue 13's aim for a growth run's peak memory: flat with the item count, and under 300 MB. */
const PEAK_MEMORY_AIM: NonNullable<FigureInit["aim"]> = {
  text: "≤ 1.2 × and < 300 MB",
  met: (value, ratio) => ratio !== null && ratio <= 1.2 && value * MIB < 300e6,
};

/** A growth batch run, with the end of the run measured from the sink's last item. */
type EndedRun = WatchedRun & { readonly endSeconds: number };

/** The growth section: batch runs at each item count, then the realtime run; see the module doc. */
async function growth(
  { settings, dir, stateDir, progress }: SectionContext,
  section: string,
): Promise<Figure[]> {
  const figures: Figure[] = [];
  const smallest = settings.growthItems[0];
  const largest = settings.growthItems.at(-1)!;
  const flowId = "bench-growth";
  for (const isolation of settings.growthIsolations) {
    const runs = new Map<number, EndedRun>();
    for (const items of settings.growthItems) {
      const summaryPath = `${dir}/growth-${isolation}-${items}.json`;
      const flowPath = `${dir}/growth_chain.ts`;
      await Deno.writeTextFile(
        flowPath,
        flowSource([
          `const produce = new StampedCounter({ name: "produce", count: ${items} });`,
          `const first = new Relay({ name: "identity-1" }).from(produce);`,
          `const second = new Relay({ name: "identity-2" }).from(first);`,
          `const sink = new CountingSink({ name: "sink", summaryPath: ${
            JSON.stringify(summaryPath)
          } }).from(second);`,
          `export default new Flow([sink], { flowType: "batch", flowId: "${flowId}" });`,
        ]),
      );
      const runId = `growth-${isolation}-${items}`;
      const run = await watchRunLocal(flowPath, {
        stateDir,
        runDir: `${stateDir}/${flowId}/${runId}`,
        runId,
        isolation,
        timeoutSeconds: settings.runTimeout,
        dirEverySeconds: null,
      });
      const { count, lastItemAt } = await sinkSummaryOf(summaryPath);
      if (count !== items || lastItemAt === null) {
        throw new Error(`${runId}: the sink counted ${count} of ${items} items`);
      }
      const endSeconds = (run.exitedAt - lastItemAt) / 1000;
      runs.set(items, { ...run, endSeconds });
      progress(
        `growth ${isolation} ${items} items: ${fmt(run.seconds)} s, peak tree RSS ` +
          `${fmt(run.peakResidentBytes / MIB)} MiB (PSS ${fmt(run.peakProportionalBytes / MIB)} MiB), ` +
          `run dir ${fmt(run.runDir.diskBytes / MIB)} MiB on disk in ${run.runDir.files} files, ` +
          `${fmt(endSeconds)} s from the last item to vf's exit`,
      );
    }
    const pair = (pick: (run: EndedRun) => number) => ({
      rounds: [pick(runs.get(largest)!)],
      baselineRounds: [pick(runs.get(smallest)!)],
      baselineName: `the same at ${smallest} items`,
    });
    figures.push(
      figure({
        section,
        name: `${isolation}: peak RSS of the process tree, ${largest} items`,
        unit: "MiB",
        better: "lower",
        ...pair((run) => run.peakResidentBytes / MIB),
        aim: PEAK_MEMORY_AIM,
      }),
      figure({
        section,
        name: `${isolation}: peak PSS of the process tree (shared pages counted once), ${largest} items`,
        unit: "MiB",
        better: "lower",
        ...pair((run) => run.peakProportionalBytes / MIB),
        aim: PEAK_MEMORY_AIM,
      }),
      figure({
        section,
        name: `${isolation}: end of the run, from the sink's last item to vf's exit, ${largest} items`,
        unit: "s",
        better: "lower",
        ...pair((run) => run.endSeconds),
        aim: { text: "< 1 s", met: (value) => value < 1 },
      }),
      figure({
        section,
        name: `${isolation}: finished run directory on disk, ${largest} items`,
        unit: "MiB",
        better: "lower",
        ...pair((run) => run.runDir.diskBytes / MIB),
        aim: {
          text: "≤ 1.2 × (independent of the count)",
          met: (_, ratio) => ratio !== null && ratio <= 1.2,
        },
      }),
      figure({
        section,
        name: `${isolation}: finished run directory's files, ${largest} items`,
        unit: "files",
        better: "lower",
        ...pair((run) => run.runDir.files),
      }),
    );
  }
  const { realtimeRate: rate, realtimeSeconds: seconds, warmupSeconds: warmup } = settings;
  for (const isolation of settings.growthIsolations) {
    const outPath = `${dir}/growth-realtime-${isolation}.jsonl`;
    const flowPath = `${dir}/growth_realtime.ts`;
    await Deno.writeTextFile(
      flowPath,
      flowSource([
        `const produce = new PacedCounter({ name: "produce", rate: ${rate}, seconds: ${seconds} });`,
        `const sink = new JsonlSink({ name: "sink", path: ${
          JSON.stringify(outPath)
        }, idempotent: true }).from(produce);`,
        `export default new Flow([sink], { flowType: "realtime", flowId: "${flowId}-realtime" });`,
      ]),
    );
    const runId = `growth-realtime-${isolation}`;
    const run = await watchRunLocal(flowPath, {
      stateDir,
      runDir: `${stateDir}/${flowId}-realtime/${runId}`,
      runId,
      isolation,
      timeoutSeconds: seconds + settings.runTimeout,
      dirEverySeconds: 5,
      progress: (sample) =>
        progress(
          `growth realtime ${isolation} at ${fmt(sample.at)} s: tree RSS ${
            fmt(sample.residentBytes / MIB)
          } ` +
            `MiB (PSS ${fmt(sample.proportionalBytes / MIB)} MiB), ` +
            `run dir ${fmt(sample.runDir!.diskBytes / MIB)} MiB on disk in ${sample.runDir!.files} files`,
        ),
    });
    const written = (await Deno.readTextFile(outPath)).split("\n").length - 1;
    progress(`growth realtime ${isolation}: ${written} of ${rate * seconds} items written`);
    // The warm-up's figures: the highest RSS sampled up to its end, the run directory first sampled after
    // it; the end's: the highest RSS of the last quarter (at most a warm-up long) of the items' making,
    // the run directory last sampled within it.
    const making = run.samples.filter((sample) => sample.at <= seconds);
    const lateFrom = seconds - Math.min(warmup, seconds / 4);
    const highest = (values: readonly number[]) => values.length === 0 ? null : Math.max(...values);
    const dirs = making.filter((sample) => sample.runDir !== null);
    const warmDir = dirs.find((sample) => sample.at >= warmup)?.runDir ?? null;
    const lateDir = dirs.at(-1);
    const endDir = lateDir !== undefined && lateDir.at >= lateFrom ? lateDir.runDir : null;
    const name = `${isolation}: realtime ${rate} items/s into an idempotent JsonlSink, ${seconds} s`;
    figures.push(
      ...(["residentBytes", "proportionalBytes"] as const).map((measure) =>
        figure({
          section,
          name: `${name}: tree ${measure === "residentBytes" ? "RSS" : "PSS"} at the end`,
          unit: "MiB",
          better: "lower",
          rounds: [highest(making.filter((s) => s.at >= lateFrom).map((s) => s[measure] / MIB))],
          baselineName: `the same in the first ${warmup} s`,
          baselineRounds: [highest(making.filter((s) => s.at <= warmup).map((s) => s[measure] / MIB))],
          aim: { text: "≤ 1.1 × (flat)", met: (_, ratio) => ratio !== null && ratio <= 1.1 },
        })
      ),
      figure({
        section,
        name: `${name}: run directory on disk at the end`,
        unit: "MiB",
        better: "lower",
        rounds: [endDir === null ? null : endDir.diskBytes / MIB],
        baselineName: `the same at ${warmup} s`,
        baselineRounds: [warmDir === null ? null : warmDir.diskBytes / MIB],
        aim: { text: "≤ 1.1 × (flat)", met: (_, ratio) => ratio !== null && ratio <= 1.1 },
      }),
    );
  }
  return figures;
}

/** `vf run-local FLOW` as `deno task vf run-local` runs it ({@link RUN_LOCAL_ARGS}); resolves with its start time. */
async function runLocalCli(
  flowPath: string,
  stateDir: string,
  runId: string,
  timeoutSeconds: number,
): Promise<number> {
  const startedAt = nowMs();
  const result = await new Deno.Command(Deno.execPath(), {
    args: [
      ...RUN_LOCAL_ARGS,
      flowPath,
      "--state",
      stateDir,
      "--run-id",
      runId,
      "--no-restart",
    ],
    cwd: repoRoot.pathname,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(timeoutSeconds * 1000),
  }).output();
  if (!result.success) {
    const said = new TextDecoder().decode(result.stdout) + new TextDecoder().decode(result.stderr);
    throw new Error(`vf run-local ${flowPath} exited ${result.code}:\n${said}`);
  }
  return startedAt;
}

/**
 * The CPU time, over every thread of this process, that `count` Workers spawned at once (as the engine
 * spawns a flow's replicas, with no permissions, as a node's) take until each has evaluated `source`, a
 * module whose last statement posts a message.
 */
async function workersCpuMs(source: string, count: number): Promise<number> {
  const url = `data:application/typescript;base64,${btoa(source)}`;
  const before = processCpuMs();
  const workers = Array.from(
    { length: count },
    () => new Worker(url, { type: "module", deno: { permissions: "none" } } as WorkerOptions),
  );
  try {
    await Promise.all(workers.map((worker) =>
      new Promise((resolve, reject) => {
        worker.onmessage = resolve;
        worker.onerror = (event) => {
          event.preventDefault();
          reject(new Error(event.message));
        };
      })
    ));
    return processCpuMs() - before;
  } finally {
    for (const worker of workers) worker.terminate();
  }
}

/** What a Worker replica of the chain evaluates before it serves: its node's module and the Worker entry. */
const REPLICA_ENTRY_SOURCE = [
  `import ${JSON.stringify(new URL("./_bench_flows/stamped.ts", import.meta.url).href)};`,
  `import ${JSON.stringify(new URL("../workers/node_worker.ts", import.meta.url).href)};`,
  "self.postMessage(0);",
].join("\n");

async function startup(
  { settings, dir, stateDir, progress }: SectionContext,
  section: string,
): Promise<Figure[]> {
  const cliSummary = `${dir}/startup-cli.json`;
  const flowPath = `${dir}/startup_chain.ts`;
  await Deno.writeTextFile(flowPath, chainFlowSource(cliSummary));
  const cli: (number | null)[] = [];
  const engine: (number | null)[] = [];
  const bare: (number | null)[] = [];
  const entryCpu: number[] = [];
  const emptyCpu: number[] = [];
  for (let round = 0; round < settings.startupRounds; round++) {
    emptyCpu.push(await workersCpuMs("self.postMessage(0);", CHAIN_NODES));
    entryCpu.push(await workersCpuMs(REPLICA_ENTRY_SOURCE, CHAIN_NODES));
    const bareRun = await runBareChain(CHAIN_NODES, STARTUP_ITEMS, settings.window);
    bare.push(startupSeconds(bareRun.startedAt, bareRun.summary));
    const cliStarted = await runLocalCli(flowPath, stateDir, `startup-cli-${round}`, settings.runTimeout);
    cli.push(startupSeconds(cliStarted, JSON.parse(await Deno.readTextFile(cliSummary))));
    const summaryPath = `${dir}/startup-engine-${round}.json`;
    const flow = itemChain("bench-startup", STARTUP_ITEMS, CHAIN_NODES - 2, summaryPath);
    const run = await runFlow(flow, {
      stateDir: stateDir,
      runId: `startup-${round}`,
      summaryPath,
      expected: STARTUP_ITEMS,
      timeoutSeconds: settings.runTimeout,
    });
    engine.push(startupSeconds(run.startedAt, run.summary));
    progress(
      `start-up round ${round + 1}/${settings.startupRounds}: cli ${fmt(cli.at(-1) ?? null, 3)} s, ` +
        `engine ${fmt(engine.at(-1) ?? null, 3)} s, bare ${fmt(bare.at(-1) ?? null, 3)} s, ` +
        `${CHAIN_NODES} replica entries ${fmt(entryCpu.at(-1) ?? null)} ms CPU (empty Workers ` +
        `${fmt(emptyCpu.at(-1) ?? null)} ms)`,
    );
  }
  const baselineName = `${CHAIN_NODES} bare Workers, spawn to first item`;
  return [
    figure({
      section,
      name: "`vf run-local` process start to first item",
      unit: "s",
      better: "lower",
      rounds: cli,
      baselineName,
      baselineRounds: bare,
      aim: { text: "≤ 0.5 s (issue 14)", met: (value) => value <= 0.5 },
    }),
    figure({
      section,
      name: "LocalEngine.run (in process) to first item",
      unit: "s",
      better: "lower",
      rounds: engine,
      baselineName,
      baselineRounds: bare,
    }),
    figure({
      section,
      name:
        `CPU of ${CHAIN_NODES} Worker replicas evaluating their entry (node module + workers/node_worker.ts)`,
      unit: "ms",
      better: "lower",
      rounds: entryCpu,
      baselineName: `${CHAIN_NODES} Workers that load nothing`,
      baselineRounds: emptyCpu,
    }),
  ];
}

/**
 * The three stages of the bare nats.js baseline as Workers on the server at `url`, moving `count` items
 * through freshly provisioned streams; resolves when the sink has all of them.
 */
async function runBareNats(url: string, count: number, window: number): Promise<BareRun> {
  await provisionBareHops(url);
  const startedAt = nowMs();
  const roles = ["sink", "relay", "producer"] as const;
  const workers = roles.map((role) =>
    new Worker(bareNatsWorkerUrl, { type: "module", name: `bare-nats-${role}` })
  );
  try {
    const done = new Promise<BareNatsDone>((resolve, reject) => {
      workers[0].onmessage = (event: MessageEvent<BareNatsDone>) => resolve(event.data);
      for (const worker of workers) {
        worker.onerror = (event) => {
          event.preventDefault();
          reject(new Error(event.message));
        };
      }
    });
    for (const [at, role] of roles.entries()) {
      const stage: BareNatsStage = role === "sink" ? { role, url, count } : { role, url, count, window };
      workers[at].postMessage(stage);
    }
    return { startedAt, summary: (await done).summary };
  } finally {
    for (const worker of workers) worker.terminate();
  }
}

/** A `nats-server -js` and a `redis-server` (append-only) started for one section, stopped after it. */
async function withServers<T>(
  measure: (nats: NatsServer, redis: RedisServer, servers: RunServers) => Promise<T>,
): Promise<T> {
  const nats = await startNatsServer();
  try {
    const redis = await startRedisServer();
    try {
      return await measure(nats, redis, { natsUrl: nats.url, redisUrl: redis.url });
    } finally {
      await redis.stop();
    }
  } finally {
    await nats.stop();
  }
}

/** Small items through producer → relay → sink over JetStream, against the same stages in bare nats.js. */
function jetstreamItems(
  { settings, dir, stateDir, progress }: SectionContext,
  section: string,
): Promise<Figure[]> {
  return withServers(async (nats, _redis, servers) => {
    const flowRuns: FlowRun[] = [];
    const bareRuns: BareRun[] = [];
    for (let round = 0; round < settings.itemRounds; round++) {
      const bare = await runBareNats(nats.url, settings.items, settings.window);
      bareRuns.push(bare);
      const summaryPath = `${dir}/jetstream-items-${round}.json`;
      const flow = itemChain("bench-js-items", settings.items, 1, summaryPath, SERVER_BENCH_PREFETCH);
      const run = await runFlow(flow, {
        stateDir,
        runId: `js-items-${round}`,
        summaryPath,
        expected: settings.items,
        timeoutSeconds: settings.runTimeout,
        servers,
      });
      flowRuns.push(run);
      progress(
        `jetstream-items round ${round + 1}/${settings.itemRounds}: flow ${
          fmt(run.summary.itemsPerSecond)
        } ` +
          `items/s, bare nats.js ${fmt(bare.summary.itemsPerSecond)} items/s`,
      );
    }
    const bareName =
      `bare nats.js, 3 Workers (msg ids, ${settings.window} PubAcks out, pull ${PULL_BATCH}, acks)`;
    return arrivalFigures(
      section,
      flowRuns.map((r) => r.summary),
      bareRuns.map((r) => r.summary),
      bareName,
      0.7,
      "bare nats.js",
    );
  });
}

/** The reference's flow (producer → 2 identities → sink, 10,000 items, batch) over JetStream and Redis. */
function jetstreamReference(
  { settings, dir, stateDir, progress }: SectionContext,
  section: string,
): Promise<Figure[]> {
  return withServers(async (_nats, _redis, servers) => {
    const runs = new Map<number | null, FlowRun[]>([[null, []], [SERVER_BENCH_PREFETCH, []]]);
    for (let round = 0; round < settings.itemRounds; round++) {
      for (const [prefetch, done] of runs) {
        const label = prefetch ?? "default";
        const summaryPath = `${dir}/jetstream-reference-${label}-${round}.json`;
        const flow = itemChain("bench-js-reference", REFERENCE_ITEMS, 2, summaryPath, prefetch);
        const run = await runFlow(flow, {
          stateDir,
          runId: `js-reference-${label}-${round}`,
          summaryPath,
          expected: REFERENCE_ITEMS,
          timeoutSeconds: settings.runTimeout,
          servers,
        });
        done.push(run);
        progress(
          `jetstream-reference round ${round + 1}/${settings.itemRounds}, prefetch ${label}: ` +
            `${fmt(REFERENCE_ITEMS / ((run.endedAt - run.startedAt) / 1000))} items/s end to end`,
        );
      }
    }
    const baselineName = "the reference (Python), recorded on this nats-server: not rerunnable here";
    const aim = {
      text: "≥ 10 × the reference",
      met: (_: number, ratio: number | null) => (ratio ?? 0) >= 10,
    };
    return [...runs].flatMap(([prefetch, done]) => {
      const depth = prefetch === null ? `the spec's prefetch ${REFERENCE_PREFETCH}` : `prefetch ${prefetch}`;
      return [
        figure({
          section,
          name: `items/s end to end (run start, provisioning included, to its end), ${depth}`,
          unit: "items/s",
          better: "higher",
          rounds: done.map((r) => REFERENCE_ITEMS / ((r.endedAt - r.startedAt) / 1000)),
          baselineName,
          baselineRounds: [REFERENCE_ITEMS_PER_SECOND],
          aim,
        }),
        figure({
          section,
          name: `items/s, first to last item at the sink, ${depth}`,
          unit: "items/s",
          better: "higher",
          rounds: done.map((r) => r.summary.itemsPerSecond),
          baselineName,
          baselineRounds: [REFERENCE_ITEMS_PER_SECOND],
        }),
      ];
    });
  });
}

/** Bytes in and out of a server so far: nats-server's `/varz`, Redis's `INFO stats`. */
interface ServerTraffic {
  readonly nats: number;
  readonly redis: number;
}

async function serverTraffic(nats: NatsServer, redis: RedisServer): Promise<ServerTraffic> {
  const varz = await (await fetch(`${nats.monitorUrl}/varz`)).json() as {
    in_bytes: number;
    out_bytes: number;
  };
  const client = new Redis(redis.url, { lazyConnect: true });
  try {
    await client.connect();
    const stats = await client.info("stats");
    const field = (name: string) => Number(new RegExp(`^${name}:(\\d+)`, "m").exec(stats)?.[1] ?? NaN);
    return {
      nats: varz.in_bytes + varz.out_bytes,
      redis: field("total_net_input_bytes") + field("total_net_output_bytes"),
    };
  } finally {
    client.disconnect();
  }
}

/**
 * 720p frames over JetStream with every frame in Redis (above the 512 KiB inline limit), against the same
 * flow on the embedded broker with frames inline; and the bytes each server moved per frame (in and out,
 * as the servers count them), against a decoded frame's size.
 */
function jetstreamVideo(
  { settings, dir, stateDir, progress }: SectionContext,
  section: string,
): Promise<Figure[]> {
  return withServers(async (nats, redis, servers) => {
    const clip = await clipIn(dir, settings.frames);
    const overServers: FlowRun[] = [];
    const inline: FlowRun[] = [];
    const natsPerFrame: number[] = [];
    const redisPerFrame: number[] = [];
    for (let round = 0; round < settings.videoRounds; round++) {
      const summaryPath = `${dir}/jetstream-video-${round}.json`;
      const before = await serverTraffic(nats, redis);
      const run = await runFlow(videoFlow("bench-js-video", clip, summaryPath, settings.frames), {
        stateDir,
        runId: `js-video-${round}`,
        summaryPath,
        expected: settings.frames,
        timeoutSeconds: settings.runTimeout,
        servers,
      });
      const after = await serverTraffic(nats, redis);
      overServers.push(run);
      natsPerFrame.push((after.nats - before.nats) / settings.frames);
      redisPerFrame.push((after.redis - before.redis) / settings.frames);
      const inlinePath = `${dir}/jetstream-video-inline-${round}.json`;
      inline.push(
        await runFlow(videoFlow("bench-js-video-inline", clip, inlinePath, settings.frames), {
          stateDir,
          runId: `js-video-inline-${round}`,
          summaryPath: inlinePath,
          expected: settings.frames,
          timeoutSeconds: settings.runTimeout,
        }),
      );
      progress(
        `jetstream-video round ${round + 1}/${settings.videoRounds}: over servers ` +
          `${fmt(run.summary.itemsPerSecond)} frames/s, embedded inline ` +
          `${fmt(inline.at(-1)?.summary.itemsPerSecond ?? null)} frames/s; per frame NATS ` +
          `${fmt(natsPerFrame.at(-1) ?? null)} B, Redis ${fmt(redisPerFrame.at(-1) ?? null)} B`,
      );
    }
    const frameBytes = Array.from({ length: settings.videoRounds }, () => FRAME_BYTES);
    const frameName = "one decoded frame's bytes";
    return [
      figure({
        section,
        name: "frames/s, first to last frame, frames in Redis",
        unit: "frames/s",
        better: "higher",
        rounds: overServers.map((r) => r.summary.itemsPerSecond),
        baselineName: "the same flow on the embedded broker, frames inline",
        baselineRounds: inline.map((r) => r.summary.itemsPerSecond),
      }),
      figure({
        section,
        name: "bytes nats-server moved per frame (in + out)",
        unit: "B/frame",
        better: "lower",
        rounds: natsPerFrame,
        baselineName: frameName,
        baselineRounds: frameBytes,
      }),
      figure({
        section,
        name: "bytes redis-server moved per frame (in + out)",
        unit: "B/frame",
        better: "lower",
        rounds: redisPerFrame,
        baselineName: frameName,
        baselineRounds: frameBytes,
      }),
    ];
  });
}

const SECTIONS: readonly Section[] = [
  {
    key: "items",
    title: (s) => `Small items: ${s.items} through producer → relay → sink (run-local, workers)`,
    measure: smallItems,
  },
  {
    key: "video",
    title: (s) =>
      `Video: ${s.frames} frames ${WIDTH}x${HEIGHT} decode → mean of a channel → sink (frames inline, the default)`,
    measure: videoSection(false),
  },
  {
    key: "video-offload",
    title: (s) =>
      `Video: ${s.frames} frames ${WIDTH}x${HEIGHT}, frames through the payload store (${MAX_INLINE_PAYLOAD_ENV}=512 KiB)`,
    measure: videoSection(true),
  },
  {
    key: "startup",
    title: () => `Start-up: ${CHAIN_NODES}-node chain (producer → ${CHAIN_NODES - 2} relays → sink)`,
    measure: startup,
  },
  {
    key: "growth",
    title: (s) =>
      `Growth: producer → 2 identities → counting sink at ${s.growthItems.join(", ")} items (batch), and ` +
      `a realtime flow at ${s.realtimeRate} items/s for ${s.realtimeSeconds} s into an idempotent JsonlSink ` +
      `(vf run-local, ${s.growthIsolations.join(" and ")} isolation)`,
    measure: growth,
  },
  {
    key: "backlog",
    title: (s) =>
      `Backlog: ${s.backlogFrames} frames ${WIDTH}x${HEIGHT} decoded far faster than a consumer taking ` +
      `${s.backlogDelayMs} ms each`,
    measure: backlog,
  },
  {
    key: "jetstream-items",
    title: (s) =>
      `Small items over servers: ${s.items} through producer → relay → sink (run-local --nats --redis, ` +
      `workers, prefetch ${SERVER_BENCH_PREFETCH})`,
    measure: jetstreamItems,
  },
  {
    key: "jetstream-reference",
    title: () =>
      `The reference's flow over servers: producer → 2 identities → sink, ${REFERENCE_ITEMS} items, batch`,
    measure: jetstreamReference,
  },
  {
    key: "jetstream-video",
    title: (s) => `Video over servers: ${s.frames} frames ${WIDTH}x${HEIGHT}, every frame through Redis`,
    measure: jetstreamVideo,
  },
];

function fmt(value: number | null, digits = 0): string {
  if (value === null) return "n/a";
  if (digits === 0 && Math.abs(value) < 100) return value.toPrecision(3);
  return value.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

function ratioText(f: Figure): string {
  return f.ratio === null ? "n/a" : `${f.ratio.toFixed(2)}×`;
}

/** A section that could not be measured, and why. */
interface Failure {
  readonly section: string;
  readonly error: string;
}

/** The table of one section: a row per figure, columns aligned. */
function sectionTable(figures: readonly Figure[]): string[] {
  const rows = [["  figure", "flow", "baseline", "ratio", "baseline is", "aim"]];
  for (const f of figures) {
    const digits = f.unit === "s" ? 3 : f.unit === "ms" ? 2 : 0;
    rows.push([
      `  ${f.name}`,
      `${fmt(f.value, digits)} ${f.unit}`,
      `${fmt(f.baseline, digits)} ${f.unit}`,
      ratioText(f),
      f.baselineName,
      f.aim === null ? "" : `${f.aim}: ${f.meetsAim ? "met" : "NOT met"}`,
    ]);
  }
  const widths = rows[0].map((_, c) => Math.max(...rows.map((row) => row[c].length)));
  return rows.map((row) => row.map((cell, c) => cell.padEnd(widths[c])).join("  ").trimEnd());
}

/** Every section in the order run: its title, then its table or why it failed. */
function table(titles: readonly string[], figures: readonly Figure[], failures: readonly Failure[]): string {
  return titles.map((title) => {
    const failure = failures.find((f) => f.section === title);
    const body = failure === undefined
      ? sectionTable(figures.filter((f) => f.section === title))
      : [`  FAILED: ${failure.error.split("\n").join("\n  ")}`];
    return [title, ...body].join("\n");
  }).join("\n\n");
}

/** Runs the chosen sections, prints the table (and writes the JSON); exit status 1 if a section failed. */
async function main(): Promise<number> {
  if (Deno.args.includes("--help")) {
    console.log(USAGE);
    return 0;
  }
  let parsed: ReturnType<typeof settingsFrom>;
  try {
    parsed = settingsFrom(Deno.args);
  } catch (error) {
    console.error(`bench: ${error instanceof Error ? error.message : error}\n${USAGE}`);
    return 2;
  }
  const { json, state, ...settings } = parsed;
  const dir = await Deno.makeTempDir({ prefix: "vf_bench_" });
  if (state !== null) await Deno.mkdir(state, { recursive: true });
  const stateDir = state === null
    ? `${dir}/state`
    : await Deno.makeTempDir({ dir: state, prefix: "vf_bench_" });
  const progress = (line: string) => console.error(`bench: ${line}`);
  const began = nowMs();
  const figures: Figure[] = [];
  const failures: Failure[] = [];
  const chosen = SECTIONS.filter((s) => settings.sections.includes(s.key));
  const titles = chosen.map((section) => section.title(settings));
  try {
    for (const [at, section] of chosen.entries()) {
      const title = titles[at];
      try {
        figures.push(...await section.measure({ settings, dir, stateDir, progress }, title));
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        progress(`${section.key} failed: ${message}`);
        failures.push({ section: title, error: message });
      }
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  const seconds = (nowMs() - began) / 1000;
  console.log(table(titles, figures, failures));
  console.log(
    `\nmedians of the rounds; ratio = flow / baseline; ${navigator.hardwareConcurrency} CPUs, ` +
      `Deno ${Deno.version.deno}, ${seconds.toFixed(0)} s in all`,
  );
  if (json !== null) {
    const document = {
      generatedAt: new Date().toISOString(),
      deno: Deno.version.deno,
      cpus: navigator.hardwareConcurrency,
      seconds,
      settings,
      figures,
      failures,
    };
    await Deno.writeTextFile(json, `${JSON.stringify(document, null, 2)}\n`);
  }
  return failures.length === 0 ? 0 : 1;
}

if (import.meta.main) Deno.exit(await main());
