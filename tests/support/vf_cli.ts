/**
 * `vf` as a user runs it, for the end-to-end stories (tests/e2e/): the CLI in a subprocess with the
 * project's deno.json, flows written into a temporary directory from the story nodes, copies of the
 * examples, and readers of what a user sees (the sink's file, the summary table, `vf dlq`). The checks of
 * the examples' outputs live here too, so a story over the embedded broker and one over real servers
 * assert the same outputs.
 *
 * @module
 */

import assert from "node:assert/strict";
import { join } from "node:path";

/** The project's root directory. */
export const root: URL = new URL("../../", import.meta.url);
/** The project's deno.json. */
export const configPath: string = new URL("deno.json", root).pathname;
/** The CLI's entry, `mod.ts`. */
export const modPath: string = new URL("mod.ts", root).pathname;
/** The public API's module URL, for flow files written by a story. */
export const modUrl: string = new URL("mod.ts", root).href;
/** The story nodes' module URL. */
export const storyNodesUrl: string = new URL("tests/fixtures/e2e/story_nodes.ts", root).href;

export interface Run {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
  /** stdout and stderr together: the live view, the events and the nodes' logs. */
  readonly text: string;
}

export interface VfOptions {
  readonly cwd: string;
  readonly env?: Readonly<Record<string, string>>;
  /** Starts the CLI in a session of its own, so a signal can reach its whole process group. */
  readonly ownSession?: boolean;
}

/** `vf ARGS` as a running subprocess: `deno run -A mod.ts ARGS`, with the project's deno.json. */
export function startVf(args: readonly string[], options: VfOptions): Deno.ChildProcess {
  const vf = ["run", "-A", `--config=${configPath}`, modPath, ...args];
  return new Deno.Command(options.ownSession ? "setsid" : Deno.execPath(), {
    args: options.ownSession ? [Deno.execPath(), ...vf] : vf,
    cwd: options.cwd,
    env: { NO_COLOR: "1", ...options.env },
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
}

export async function finished(child: Deno.ChildProcess): Promise<Run> {
  const output = await child.output();
  const decoder = new TextDecoder();
  const stdout = decoder.decode(output.stdout);
  const stderr = decoder.decode(output.stderr);
  return { code: output.code, stdout, stderr, text: `${stdout}\n${stderr}` };
}

export function vf(args: readonly string[], options: VfOptions): Promise<Run> {
  return finished(startVf(args, options));
}

/** `deno task deploy ARGS` as an operator runs it from the project's root, with `env` added. */
export function deployTask(
  args: readonly string[],
  env: Readonly<Record<string, string>> = {},
): Promise<Run> {
  return finished(
    new Deno.Command(Deno.execPath(), {
      args: ["task", "--quiet", "deploy", ...args],
      cwd: root,
      env: { NO_COLOR: "1", ...env },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn(),
  );
}

/** A temporary directory for one story, removed afterwards whatever happened; resolves with `body`'s result. */
export async function inTempDir<T>(body: (dir: string) => Promise<T>): Promise<T> {
  const dir = await Deno.makeTempDir({ prefix: "vf-e2e-" });
  try {
    return await body(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/**
 * Writes a flow file importing the story node classes `classes` (re-exported, so their node class is this
 * file's) and the public API; `body` builds the nodes and ends with the default export.
 */
export async function writeFlow(dir: string, classes: readonly string[], body: string): Promise<string> {
  const names = classes.join(", ");
  const source = [
    `import { Flow, JsonlSink } from ${JSON.stringify(modUrl)};`,
    `import { ${names} } from ${JSON.stringify(storyNodesUrl)};`,
    `export { ${names} };`,
    body,
  ].join("\n");
  const path = join(dir, "flow.ts");
  await Deno.writeTextFile(path, source);
  return path;
}

/** A batch flow `count → <middle> → sink`, the sink a JsonlSink writing `<dir>/out.jsonl`. */
export function pipeline(flowId: string, producer: string, middle: string, dir: string): string {
  return [
    `const count = ${producer};`,
    `const middle = ${middle}.from(count);`,
    `const sink = new JsonlSink({ name: "sink", path: ${
      JSON.stringify(join(dir, "out.jsonl"))
    } }).from(middle);`,
    `export default new Flow([sink], { flowType: "batch", flowId: ${JSON.stringify(flowId)} });`,
  ].join("\n");
}

export interface SinkLine {
  readonly key: string | null;
  readonly value: unknown;
}

export async function sinkLines(path: string): Promise<SinkLine[]> {
  let text: string;
  try {
    text = await Deno.readTextFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return [];
    throw error;
  }
  return text.split("\n").filter((line) => line !== "").map((line) => JSON.parse(line) as SinkLine);
}

/** The sink's numbers, sorted, after checking that no input key was written twice. */
export async function sinkNumbers(path: string): Promise<number[]> {
  const lines = await sinkLines(path);
  const keys = lines.map((line) => line.key);
  assert.equal(new Set(keys).size, keys.length, `every input key once in ${path}`);
  return lines.map((line) => line.value as number).sort((a, b) => a - b);
}

export function range(from: number, to: number): number[] {
  return Array.from({ length: to - from + 1 }, (_, i) => from + i);
}

export interface DeadLetter {
  readonly node: string;
  readonly code: string;
  readonly deliveries: number | null;
  readonly envelope_b64: string;
}

export async function deadLetters(
  flow: string,
  runId: string,
  state: string,
  cwd: string,
): Promise<DeadLetter[]> {
  const run = await vf(["dlq", flow, "--run-id", runId, "--state", state, "--json"], { cwd });
  assert.equal(run.code, 0, run.text);
  return run.stdout.split("\n").filter((line) => line !== "").map((line) => JSON.parse(line));
}

/** The summary table's row of `node`: state, processed, drops (as shown), dead letters and restarts. */
export function summaryRow(run: Run, node: string) {
  const row = run.stdout.split("\n").reverse().find((line) => line.startsWith(`${node} `));
  assert.ok(row !== undefined, `a summary row for ${node} in\n${run.stdout}`);
  const cells = row.trim().split(/\s+/);
  return {
    state: cells[1],
    processed: Number(cells[3]),
    inFlight: Number(cells[5]),
    drops: cells.slice(6, -2).join(" "),
    dlq: Number(cells.at(-2)),
    restarts: Number(cells.at(-1)),
  };
}

/** A copy of one example and the clips under `<dir>/examples`, so its outputs land in the copy. */
export async function copyExample(dir: string, example: string): Promise<void> {
  await Deno.mkdir(join(dir, "examples", "clips"), { recursive: true });
  await Deno.mkdir(join(dir, "examples", "out"), { recursive: true });
  await Deno.copyFile(new URL(`examples/${example}`, root), join(dir, "examples", example));
  for await (const clip of Deno.readDir(new URL("examples/clips", root))) {
    await Deno.copyFile(
      new URL(`examples/clips/${clip.name}`, root),
      join(dir, "examples", "clips", clip.name),
    );
  }
}

/** How many frames ffprobe decodes from the clip at `path`. */
export async function framesIn(path: string): Promise<number> {
  const probe = await new Deno.Command("ffprobe", {
    args: ["-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries", "stream=nb_read_frames"]
      .concat(["-of", "csv=p=0", path]),
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(probe.code, 0, new TextDecoder().decode(probe.stderr));
  return Number(new TextDecoder().decode(probe.stdout).trim());
}

/** Whether two event times are one moment within the example's 20 ms tolerance. */
export function sameMoment(a: number, b: number): boolean {
  return Math.abs(a - b) <= 0.02 + 1e-6;
}

/** Resolves once `path` holds at least `lines` lines (the run is under way), polling. */
export async function waitForLines(path: string, lines: number, child: Deno.ChildProcess): Promise<void> {
  let exited = false;
  child.status.then(() => (exited = true));
  for (;;) {
    if ((await sinkLines(path)).length >= lines) return;
    assert.ok(!exited, `the run ended before ${path} held ${lines} lines`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The hello example's sums, n + n² for n in 1..10. */
export const HELLO_SUMS: readonly number[] = range(1, 10).map((n) => n + n * n);

/** The hello example ran to its end: it printed the 10 sums and every node processed 10 items. */
export function checkHelloRun(run: Run): void {
  assert.equal(run.code, 0, run.text);
  const printed = [...run.text.matchAll(/INFO {2}print\[0\] (\d+) /g)].map((m) => Number(m[1]));
  assert.deepEqual(printed.sort((a, b) => a - b), HELLO_SUMS, run.text);
  assert.match(run.stdout, /flow squares finished \(run run-[0-9a-f-]+\)/);
  for (const node of ["count", "square", "sum", "print"]) {
    assert.deepEqual(
      [summaryRow(run, node).state, summaryRow(run, node).processed],
      ["done", 10],
      `${node} in\n${run.stdout}`,
    );
  }
}

/** The video_motion example, copied into `dir`, wrote 60 motion lines and a decodable 60-frame mp4. */
export async function checkVideoMotionRun(run: Run, dir: string): Promise<void> {
  assert.equal(run.code, 0, run.text);
  const lines = await sinkLines(join(dir, "examples/out/motion_events.jsonl"));
  assert.equal(lines.length, 60, run.text);
  const indexes = lines.map((line) => (line.value as { index: number }).index).sort((a, b) => a - b);
  assert.deepEqual(indexes, range(0, 59));
  for (const { value } of lines) {
    const motion = value as { score: number; moving: boolean };
    assert.ok(motion.score >= 0 && motion.score <= 255, JSON.stringify(motion));
    assert.equal(typeof motion.moving, "boolean");
  }
  assert.equal(await framesIn(join(dir, "examples/out/motion_annotated.mp4")), 60);
}

/** The multi_camera example, copied into `dir`, wrote every frame of both cameras once, paired within 20 ms. */
export async function checkMultiCameraRun(run: Run, dir: string): Promise<void> {
  assert.equal(run.code, 0, run.text);
  const moments = (await sinkLines(join(dir, "examples/out/multi_camera.jsonl"))).map((line) =>
    line.value as { ts: number; a: number | null; b: number | null }
  );
  const start = 1_700_000_000;
  const both = moments.filter((m) => m.a !== null && m.b !== null);
  const onlyA = moments.filter((m) => m.a !== null && m.b === null);
  const onlyB = moments.filter((m) => m.a === null && m.b !== null);
  assert.equal(both.length + onlyA.length + onlyB.length, moments.length, "no line without a camera");
  // Camera A films at 15 frames/s for 4 s, camera B at 10: each frame is on exactly one line, so the
  // A frames are the paired ones and the A-only ones (60 in all), the B frames likewise (40 in all).
  assert.equal(both.length + onlyA.length, 60, run.text);
  assert.equal(both.length + onlyB.length, 40, run.text);
  const aTimes = [...both, ...onlyA].map((m) => m.ts - start);
  const bTimes = [...both, ...onlyB].map((m) => m.ts - start);
  for (let k = 0; k < 60; k++) {
    assert.equal(aTimes.filter((t) => sameMoment(t, k / 15)).length, 1, `camera A frame ${k} once`);
  }
  for (let k = 0; k < 40; k++) {
    assert.equal(bTimes.filter((t) => sameMoment(t, k / 10)).length, 1, `camera B frame ${k} once`);
  }
  // A pair is two frames of one moment: only on the 0.2 s grid where both cameras have a frame.
  for (const m of both) {
    const slot = (m.ts - start) * 5;
    assert.ok(Math.abs(slot - Math.round(slot)) < 1e-3, `a pair at ${m.ts} is on the 0.2 s grid`);
  }
  assert.ok(both.length <= 20);
}

/** Resolves with the text of `path` once it exists and is not empty, polling. */
export async function waitForFile(path: string, child: Deno.ChildProcess): Promise<string> {
  let exited = false;
  child.status.then(() => (exited = true));
  for (;;) {
    const text = await Deno.readTextFile(path).catch(() => "");
    if (text !== "") return text;
    assert.ok(!exited, `the run ended before it wrote ${path}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/**
 * Runs `count (n items) → victim → sink` as subprocess replicas with `args` added (`--state` is given),
 * SIGKILLs the victim once it has written its pid (at its 10th item), and checks that the run ends 0 with
 * the victim restarted and every item at the sink once. What the killed replica held comes back once its
 * lease lapses, after `ackWaitSeconds`.
 */
export async function killVictimMidRun(
  dir: string,
  flowId: string,
  n: number,
  args: readonly string[],
  ackWaitSeconds: number,
): Promise<Run> {
  const pidFile = join(dir, "victim.pid");
  const flow = await writeFlow(
    dir,
    ["Count", "KillMeAt"],
    pipeline(
      flowId,
      `new Count({ name: "count", n: ${n} })`,
      `new KillMeAt({ name: "victim", at: 10, pidFile: ${JSON.stringify(pidFile)} })`,
      dir,
    ),
  );
  const child = startVf(
    ["run-local", flow, "--state", join(dir, "state"), "--isolation", "process", ...args],
    { cwd: dir, env: { VF_ACK_WAIT_SECONDS: String(ackWaitSeconds) } },
  );
  Deno.kill(Number(await waitForFile(pidFile, child)), "SIGKILL");
  const run = await finished(child);
  assert.equal(run.code, 0, run.text);
  assert.match(run.text, /victim\[0\] exited with code 137/);
  assert.match(run.text, /victim\[0\] started \(restart 1\)/);
  assert.deepEqual(await sinkNumbers(join(dir, "out.jsonl")), range(1, n), run.text);
  return run;
}
