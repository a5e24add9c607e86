import assert from "node:assert/strict";

const root = new URL("../../", import.meta.url);
const fixture = (name: string) => new URL(`tests/fixtures/${name}`, root).pathname;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `vf ARGS` as a user would: `deno run -A mod.ts ARGS` in the project directory. */
function vf(...args: string[]): Promise<Run> {
  return vfWith({}, ...args);
}

/** {@link vf} with `env` added to its environment. */
async function vfWith(env: Readonly<Record<string, string>>, ...args: string[]): Promise<Run> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "mod.ts", ...args],
    cwd: root,
    env: { NO_COLOR: "1", ...env },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const decoder = new TextDecoder();
  return { code: output.code, stdout: decoder.decode(output.stdout), stderr: decoder.decode(output.stderr) };
}

function assertNoStackTrace(run: Run): void {
  assert.doesNotMatch(run.stdout + run.stderr, /^\s+at /m, "no stack trace reaches the user");
}

Deno.test("vf validate accepts the first flow and exits 0", async () => {
  const run = await vf("validate", "examples/hello.ts");
  assert.equal(run.code, 0, run.stderr);
  assert.equal(run.stdout.trim(), "");
  assert.match(run.stderr, /flow squares: valid \(0 errors, 0 warnings, 4 nodes\)/);
});

Deno.test("vf validate reports every planted problem at once and exits 2", async () => {
  const run = await vf("validate", fixture("cli/invalid_flow.ts"));
  assert.equal(run.code, 2, run.stderr);
  const lines = run.stdout.trim().split("\n");
  assert.ok(lines.every((line) => /^(error|warning) VF_[A-Z_]+ /.test(line)), run.stdout);
  assert.ok(lines.some((line) => /^error VF_GRAPH join: 2 nodes are named "join"/.test(line)), run.stdout);
  assert.ok(lines.some((line) => /^error VF_GRAPH join: .*partition/i.test(line)), run.stdout);
  assert.ok(lines.some((line) => /^error VF_[A-Z_]+ join: .*gpu/i.test(line)), run.stdout);
  assert.match(run.stderr, /flow bad: invalid/);
  assertNoStackTrace(run);
});

Deno.test("vf compile prints the specs document in topological order", async () => {
  const run = await vf("compile", "examples/hello.ts");
  assert.equal(run.code, 0, run.stderr);
  const doc = JSON.parse(run.stdout);
  assert.deepEqual(Object.keys(doc), ["specs"]);
  assert.deepEqual(doc.specs.map((s: { name: string }) => s.name), ["count", "square", "sum", "print"]);
  const square = doc.specs[1];
  assert.equal(square.node_class, `${new URL("examples/hello.ts", root).href}#Square`);
  assert.equal(square.nb_tasks, 2);
  assert.deepEqual(doc.specs[2].parents, ["count", "square"]);
  assert.equal(doc.specs[3].kind, "consumer");
});

Deno.test("vf validate refuses the built-in nodes' params their open() would refuse, each named", async () => {
  const run = await vf("validate", fixture("cli/bad_node_params.ts"));
  assert.equal(run.code, 2, run.stderr);
  for (
    const problem of [
      /error VF_CONFIG src: node src: width must be a positive integer, got 0/,
      /error VF_CONFIG src: node src: fps must be a positive number, got -1/,
      /error VF_CONFIG src: node src: loop applies to a file, not a live source/,
      /error VF_CONFIG sink: node sink: path must be a non-empty string/,
      /error VF_CONFIG writer: node writer: fps must be a positive number, got 0/,
    ]
  ) {
    assert.match(run.stdout, problem);
  }
  assert.match(run.stderr, /invalid \(6 errors/, "and the empty path as a permission");
});

Deno.test("vf explain shows the graph, replicas, join, delivery and permissions of each node", async () => {
  const run = await vf("explain", "examples/hello.ts");
  assert.equal(run.code, 0, run.stderr);
  const lines = run.stdout.split("\n");
  assert.equal(lines[0], "flow squares (batch), 4 nodes");
  assert.ok(lines[1].startsWith("  batch: nothing is lost"), lines[1]);
  for (
    const line of [
      "  count  ──▶ square, sum",
      "  print  (sink)",
      "  square (processor, 2 replicas competing for each item)",
      "    delivery at-least-once, 3 retries then dead-letter (full DLQ), at most 4 deliveries (the batch default)",
    ]
  ) {
    assert.ok(lines.includes(line), `${JSON.stringify(line)} in\n${run.stdout}`);
  }
  const join = lines.find((line) => line.startsWith("    join of count, square by trace id"));
  assert.ok(join?.includes("waits for every member") && join.endsWith("(the batch default)"), join);
  assert.ok(join?.includes("past 256 incomplete groups a parent that runs ahead waits for the others"), join);
  assert.equal(lines.filter((line) => line === "    permissions: none").length, 4);
  const fewer = await vfWith({ VF_MAX_RETRIES: "0" }, "explain", "examples/hello.ts");
  assert.ok(
    fewer.stdout.includes(
      "    delivery at-least-once, 0 retries then dead-letter (full DLQ), at most 1 delivery",
    ),
    `VF_MAX_RETRIES, as the replicas read it:\n${fewer.stdout}`,
  );
});

Deno.test("vf explain --flow-type realtime explains the flow as run-local --flow-type realtime runs it", async () => {
  const run = await vf("explain", "examples/hello.ts", "--flow-type", "realtime");
  assert.equal(run.code, 0, run.stderr);
  const lines = run.stdout.split("\n");
  assert.equal(lines[0], "flow squares (realtime), 4 nodes");
  assert.ok(lines[1].startsWith("  realtime: the freshest item wins"), lines[1]);
  const join = lines.find((line) => line.startsWith("    join of count, square by trace id"));
  assert.ok(
    join?.includes("at most 256 incomplete groups, the oldest dropped beyond (the realtime default)"),
    join,
  );
  // What vf deploy would make of each node, and whether --autoscaling would scale it.
  for (
    const line of [
      "    on kubernetes: a Job of 1 replica",
      "    on kubernetes: a Deployment of 2 replicas, which --autoscaling scales on its backlog on count",
      "    on kubernetes: a Deployment of 1 replica, not autoscaled: the node joins several parents at a single replica",
    ]
  ) {
    assert.ok(lines.includes(line), `${JSON.stringify(line)} in\n${run.stdout}`);
  }
  const refused = await vf("explain", "examples/hello.ts", "--flow-type", "bulk");
  assert.equal(refused.code, 2, refused.stderr);
});

Deno.test("vf explain --dot prints a Graphviz digraph with every edge", async () => {
  const run = await vf("explain", "examples/hello.ts", "--dot");
  assert.equal(run.code, 0, run.stderr);
  assert.match(run.stdout, /^digraph "squares" \{/);
  for (const edge of ['"count" -> "square"', '"count" -> "sum"', '"square" -> "sum"', '"sum" -> "print"']) {
    assert.ok(run.stdout.includes(edge), edge);
  }
  assert.match(run.stdout, /"square" \[shape=box, label="square\\nprocessor ×2"\]/);
  const refused = await vf("validate", "examples/hello.ts", "--dot");
  assert.equal(refused.code, 2);
  assert.match(refused.stderr, /validate does not take --dot/);
});

Deno.test("vf compile refuses an invalid flow with one rendered GraphError and exit 2", async () => {
  const run = await vf("compile", fixture("cli/invalid_flow.ts"));
  assert.equal(run.code, 2);
  assert.equal(run.stdout, "");
  assert.match(run.stderr, /^VF_GRAPH: /);
  assertNoStackTrace(run);
});

Deno.test("a flow file that does not exist is one clear line and exit 2", async () => {
  const run = await vf("validate", "no/such/flow.ts");
  assert.equal(run.code, 2);
  assert.match(run.stderr, /^VF_CONFIG: flow file no\/such\/flow.ts does not exist\n/);
  assertNoStackTrace(run);
});

Deno.test("a flow file that throws while loading names the file and line, exit 2", async () => {
  const run = await vf("validate", fixture("cli/throws_while_loading.ts"));
  assert.equal(run.code, 2);
  assert.match(
    run.stderr,
    /^VF_CONFIG: flow file .*throws_while_loading.ts failed while loading \(line 3\): TypeError/,
  );
  assertNoStackTrace(run);
});

Deno.test("a flow file slower than a second to load makes its effects at module scope once: the hang probe cannot write", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-cli-" });
  try {
    const effects = `${dir}/effects.txt`;
    const flow = `${dir}/flow.ts`;
    await Deno.writeTextFile(
      flow,
      [
        `import { Flow } from ${JSON.stringify(new URL("mod.ts", root).href)};`,
        `Deno.writeTextFileSync(${JSON.stringify(effects)}, "loaded\\n", { append: true });`,
        // Long enough for the probe, begun after a second, to evaluate the file's first line too.
        `await new Promise((resolve) => setTimeout(resolve, 3000));`,
        `export default new Flow([]);`,
      ].join("\n"),
    );
    const run = await vf("validate", flow);
    assert.equal(run.code, 2, run.stderr);
    assert.match(run.stdout, /the flow has no consumer/, "the flow loaded and was validated");
    assert.equal(await Deno.readTextFile(effects), "loaded\n", "one evaluation wrote, vf's own");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a flow file importing a name vf's import map lacks is told to run with its project's --config, exit 2", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-cli-" });
  try {
    const path = `${dir}/unmapped.ts`;
    await Deno.writeTextFile(path, 'import { Flow } from "my-videoflow";\nexport default new Flow([]);\n');
    const run = await vf("validate", path);
    assert.equal(run.code, 2, run.stderr);
    assert.match(
      run.stderr,
      /failed while loading \(line 1\): TypeError: Import "my-videoflow" not a dependency/,
    );
    assert.match(run.stderr, /remedy: map that name in your project's deno.json and run deno with --config/);
    assertNoStackTrace(run);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a flow file that does not parse names the syntax error once, with its line, exit 2", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-cli-" });
  try {
    const path = `${dir}/broken.ts`;
    await Deno.writeTextFile(
      path,
      'import { Flow } from "../x.ts";\nexport default new Flow([ , { flowId: "x" };\n',
    );
    const run = await vf("validate", path);
    assert.equal(run.code, 2, run.stderr);
    assert.match(run.stderr, /failed while loading \(line 2\): SyntaxError: Expected ',', got ';'/);
    assert.doesNotMatch(run.stderr, /TypeError: SyntaxError/);
    assertNoStackTrace(run);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a flow file without a default Flow export is refused with a remedy, exit 2", async () => {
  const run = await vf("compile", fixture("cli/no_default_export.ts"));
  assert.equal(run.code, 2);
  assert.match(run.stderr, /does not export a Flow as its default export/);
  assert.match(run.stderr, /remedy: end the file with `export default new Flow/);
});

Deno.test("vf decode prints a golden vector with the wire's field names", async () => {
  const run = await vf("decode", fixture("vectors/envelope/eos.bin"));
  assert.equal(run.code, 0, run.stderr);
  const json = JSON.parse(run.stdout);
  assert.equal(json.v, 4);
  assert.equal(json.type, "eos");
  for (const key of ["producer_name", "flow_id", "run_id", "trace_id", "seq", "payload_type"]) {
    assert.ok(key in json, `${key} in ${run.stdout}`);
  }
});

Deno.test("vf decode refuses a legacy msgpack envelope with VF_POISON_DECODE", async () => {
  const run = await vf("decode", fixture("vectors/reject/legacy_msgpack.bin"));
  assert.equal(run.code, 4);
  assert.match(run.stderr, /^VF_POISON_DECODE: /);
  assertNoStackTrace(run);
});

Deno.test("an unknown command or a missing argument is a usage error, exit 2", async () => {
  const unknown = await vf("frobnicate", "x");
  assert.equal(unknown.code, 2);
  assert.match(unknown.stderr, /^VF_CONFIG: unknown command "frobnicate"/);
  const missing = await vf("validate");
  assert.equal(missing.code, 2);
  assert.match(missing.stderr, /validate takes exactly one path, got 0/);
  const help = await vf("--help");
  assert.equal(help.code, 0);
  assert.match(help.stdout, /^usage: vf <command>/);
});

Deno.test("vf explain --dot escapes quotes and backslashes in names and labels", async () => {
  const run = await vf("explain", fixture("cli/quoted_names.ts"), "--dot");
  assert.equal(run.code, 0, run.stderr);
  assert.match(run.stdout, /^digraph "f\\"q" \{/);
  assert.ok(
    run.stdout.includes(String.raw`"my \"cam\" 1" [shape=invhouse, label="my \"cam\" 1\nproducer"];`),
  );
  assert.ok(run.stdout.includes(String.raw`"sink\\x" [shape=house, label="sink\\x\nconsumer"];`));
  assert.ok(run.stdout.includes(String.raw`"my \"cam\" 1" -> "sink\\x";`));
});

Deno.test("run-local refuses, before it starts, a flow id that leaves --state, a bad run id, a too small channel limit and a path a subprocess flag cannot carry: exit 2", async () => {
  const state = await Deno.makeTempDir({ prefix: "vf-cli-" });
  try {
    const escaping = await vf("run-local", fixture("cli/escaping_flow_id.ts"), "--state", `${state}/a/b`);
    assert.equal(escaping.code, 2);
    assert.match(escaping.stderr, /^VF_CONFIG: flow id "\.\.\/\.\.\/escaped" must be non-empty/);
    assert.deepEqual([...Deno.readDirSync(state)], [], "nothing was written anywhere");
    for (
      const [args, message] of [
        [["--run-id", "../x"], /^VF_CONFIG: run id "\.\.\/x" must be non-empty/],
        [
          ["--run-id", "r".repeat(5000)],
          /^VF_CONFIG: run id "r{40}…" is 5000 characters long, more than the 255/,
        ],
        [
          ["--channel-max-mib", "10"],
          /^VF_CONFIG: --channel-max-mib 10 is below 64 MiB, the largest envelope/,
        ],
      ] as const
    ) {
      const run = await vf("run-local", "examples/hello.ts", "--state", state, ...args);
      assert.equal(run.code, 2, run.stderr);
      assert.match(run.stderr, message);
      assert.doesNotMatch(run.stderr, /running flow/, "refused before anything started");
      assertNoStackTrace(run);
    }
    const comma = await vf(
      "run-local",
      fixture("cli/comma_path.ts"),
      "--state",
      state,
      "--isolation",
      "process",
    );
    assert.equal(comma.code, 2, comma.stderr);
    assert.match(
      comma.stderr,
      /^VF_CONFIG: node sink declares read permission for ".*a,b\.jsonl", which holds a comma/,
    );
    assert.doesNotMatch(comma.stderr, /running flow/, "refused before anything started");
  } finally {
    await Deno.remove(state, { recursive: true });
  }
});

Deno.test("run-local refuses malformed worker settings in its environment before it starts, naming each: exit 2", async () => {
  const state = await Deno.makeTempDir({ prefix: "vf-cli-" });
  try {
    const env = { VF_PROGRESS_TIMEOUT_SECONDS: "soon", VF_MAX_RETRIES: "-1" };
    const run = await vfWith(env, "run-local", "examples/hello.ts", "--state", state);
    assert.equal(run.code, 2, run.stderr);
    assert.match(run.stderr, /^VF_CONFIG: the worker environment has 2 problems/);
    assert.match(
      run.stderr,
      /VF_PROGRESS_TIMEOUT_SECONDS must be a number of seconds, 0 or more, got "soon"/,
    );
    assert.match(run.stderr, /VF_MAX_RETRIES must be/);
    assert.doesNotMatch(run.stderr, /running flow/, "refused before anything started");
    assert.deepEqual([...Deno.readDirSync(state)], [], "nothing was written");
    assertNoStackTrace(run);
  } finally {
    await Deno.remove(state, { recursive: true });
  }
});

Deno.test("run-local with a --state that cannot hold directories is a typed environment error, exit 3", async () => {
  const file = await Deno.makeTempFile({ prefix: "vf-cli-" });
  try {
    const run = await vf("run-local", "examples/hello.ts", "--state", file);
    assert.equal(run.code, 3, run.stderr);
    assert.match(run.stderr, /VF_RESOURCE_UNAVAILABLE: the run's state directory .* cannot be created/);
    assert.match(run.stderr, /remedy: point --state at a writable directory/);
    assertNoStackTrace(run);
  } finally {
    await Deno.remove(file);
  }
});

Deno.test("vf dlq of a run that has no dead letter yet lists none; of a run that never started, exit 2", async () => {
  const state = await Deno.makeTempDir({ prefix: "vf-cli-" });
  try {
    await Deno.mkdir(`${state}/squares/r1`, { recursive: true });
    const started = await vf("dlq", "examples/hello.ts", "--run-id", "r1", "--state", state);
    assert.equal(started.code, 0, started.stderr);
    assert.match(started.stderr, /^0 dead letters in run r1 of squares/);
    const never = await vf("dlq", "examples/hello.ts", "--run-id", "r2", "--state", state);
    assert.equal(never.code, 2);
    assert.match(never.stderr, /^VF_CONFIG: no run in .*squares\/r2/);
  } finally {
    await Deno.remove(state, { recursive: true });
  }
});

/** A mistake a user makes in a flow file, and what `vf validate` and `vf run-local` must say about it. */
interface FlowMistake {
  readonly name: string;
  /** The flow file's text after the imports (`Flow`, `JsonlSink`, the node bases and `Count` are in scope). */
  readonly body: string;
  /** What both commands print (on stdout or stderr) for it: each pattern must match. */
  readonly says: readonly RegExp[];
}

const modUrl = new URL("mod.ts", root).href;
const countUrl = new URL("tests/fixtures/e2e/story_nodes.ts", root).href;

const FLOW_MISTAKES: readonly FlowMistake[] = [
  {
    name: "a node that declares permissions() as a method returning only the kinds it needs",
    body:
      `export class Sink extends ConsumerNode { permissions() { return { read: ["./clips"] }; } consume() {} }
export default new Flow([new Sink({ name: "sink" }).from(new Count({ name: "count", n: 3 }))]);`,
    says: [
      /error VF_NODE_CONTRACT sink: node sink: permissions\(\) returned no list for write, net, env, run, ffi, sys/,
      /remedy: declare the node's needs on its class, `static override permissions = /,
    ],
  },
  {
    name: "a consumer list of values that are not nodes",
    body: `export default new Flow([42, "x", null] as never);`,
    says: [
      /VF_GRAPH: the flow is invalid: 3 problems/,
      /holds 42 at position 0, which is not a node/,
      /holds "x" at position 1/,
      /holds null at position 2/,
    ],
  },
  {
    name: "a top-level await that never resolves",
    body: `await new Promise(() => {});\nexport default new Flow([]);`,
    says: [
      /VF_CONFIG: flow file .*flow\.ts never finishes loading: its top-level await \(line 5\) waits on a promise/,
      /remedy: build and export the Flow without waiting at module scope/,
    ],
  },
  {
    name: "a node name with a NUL byte",
    body:
      `export default new Flow([new JsonlSink({ name: "si\\0nk", path: "o.jsonl" }).from(new Count({ name: "count", n: 3 }))]);`,
    says: [/error VF_CONFIG .*name must be a non-empty string without control characters, got "si\\u0000nk"/],
  },
  {
    name: "the Flow class itself as the default export",
    body: `export default Flow;`,
    says: [/VF_CONFIG: flow file .*flow\.ts exports the Flow class itself/, /remedy: export an instance/],
  },
  {
    name: "a node whose constructor throws",
    body: `export class Camera extends ProducerNode {
  constructor(params: { name: string }) { super(params); throw new Error("no camera at /dev/video0"); }
  next() { return END; }
}
export default new Flow([new JsonlSink({ name: "sink", path: "o.jsonl" }).from(new Camera({ name: "cam" }))]);`,
    says: [
      /VF_CONFIG: flow file .*flow\.ts failed while loading \(line 6\): Error: no camera at \/dev\/video0/,
    ],
  },
  {
    name: "a function among a node's params",
    body: `export default new Flow([
  new JsonlSink({ name: "sink", path: "o.jsonl", format: (x: unknown) => String(x) } as never)
    .from(new Count({ name: "count", n: 3 })),
]);`,
    says: [
      /error VF_NODE_CONTRACT sink: node sink: params\.format is a function \(format\), which is not plain JSON/,
    ],
  },
  {
    name: "a flow module and a module of its nodes that import each other",
    body: `import { Square } from "./nodes.ts";
export class Base extends ProcessorNode { process(x: number) { return x; } }
export default new Flow([new JsonlSink({ name: "sink", path: "o.jsonl" }).from(new Square({ name: "sq" }).from(new Count({ name: "count", n: 3 })))]);`,
    says: [
      /VF_CONFIG: flow file .*flow\.ts failed while loading.*: ReferenceError: Cannot access 'Base' before initialization/,
      /remedy: two of the flow's modules import each other/,
    ],
  },
  {
    name: "a flow file that calls Deno.exit at top level",
    body: `Deno.exit(0);`,
    says: [
      /VF_CONFIG: flow file .*flow\.ts calls Deno\.exit\(0\) while loading \(line 5\)/,
      /remedy: remove the call/,
    ],
  },
  {
    name: "a processor whose process() is misspelt",
    body: `export class Square extends ProcessorNode { proces(x: number) { return x * x; } }
export default new Flow([new JsonlSink({ name: "sink", path: "o.jsonl" }).from(new Square({ name: "sq" }).from(new Count({ name: "count", n: 3 })))]);`,
    says: [/error VF_NODE_CONTRACT sq: node sq is a processor, but Square has no process\(\) method/],
  },
  {
    name: "a getter of a node's class that throws",
    body: `export class Square extends ProcessorNode {
  override get nbTasks(): number { throw new Error("no replica count yet"); }
  process(x: number) { return x * x; }
}
export default new Flow([new JsonlSink({ name: "sink", path: "o.jsonl" }).from(new Square({ name: "sq" }).from(new Count({ name: "count", n: 3 })))]);`,
    says: [/error VF_NODE_CONTRACT sq: node sq: reading its nbTasks threw Error: no replica count yet/],
  },
  {
    name: "preloadModules() returning something that is not a list of URLs",
    body: `export class Square extends ProcessorNode {
  override preloadModules(): string[] { return "./model.ts" as never; }
  process(x: number) { return x * x; }
}
export default new Flow([new JsonlSink({ name: "sink", path: "o.jsonl" }).from(new Square({ name: "sq" }).from(new Count({ name: "count", n: 3 })))]);`,
    says: [
      /error VF_NODE_CONTRACT sq: node sq: preloadModules\(\) returned "\.\/model\.ts", not a list of module URLs/,
    ],
  },
  {
    name: "null for the Flow's options",
    body:
      `export default new Flow([new JsonlSink({ name: "sink", path: "o.jsonl" }).from(new Count({ name: "count", n: 3 }))], null as never);`,
    says: [/VF_CONFIG: a Flow's options must be an object, got null/],
  },
  {
    name: "a flow with five kinds of problem, a cycle among them",
    body: `export class Relay extends ProcessorNode { process(x: unknown) { return x; } }
const count = new Count({ name: "count", n: 3 });
const a = new Relay({ name: "a", nbTasks: 0 });
const b = new Relay({ name: "b", deviceType: "tpu" } as never).from(a);
a.from(count, b);
export default new Flow([
  new JsonlSink({ name: "sink", path: "" }).from(b),
  new JsonlSink({ name: "sink", path: "o.jsonl" }).from(count),
]);`,
    says: [
      /error VF_GRAPH b: nodes b, a form a cycle/,
      /error VF_GRAPH sink: 2 nodes are named "sink"/,
      /error VF_CONFIG sink: node sink: path must be a non-empty string/,
      /error VF_CONFIG b: node b: deviceType must be one of cpu, gpu, got "tpu"/,
      /error VF_CONFIG a: node a: nbTasks must be an integer >= 1, got 0/,
    ],
  },
];

Deno.test("every mistake in a flow file is a typed error with its remedy, from vf validate and vf run-local: exit 2", async () => {
  const failures: string[] = [];
  for (const mistake of FLOW_MISTAKES) {
    const dir = await Deno.makeTempDir({ prefix: "vf-mistake-" });
    try {
      const source = [
        `import { ConsumerNode, END, Flow, JsonlSink, ProcessorNode, ProducerNode } from ${
          JSON.stringify(modUrl)
        };`,
        `import { Count } from ${JSON.stringify(countUrl)};`,
        "export { Count };",
        "",
        // A sink's file goes to the story's directory, should a regression let the flow run.
        mistake.body.replaceAll('"o.jsonl"', JSON.stringify(`${dir}/o.jsonl`)),
      ].join("\n");
      await Deno.writeTextFile(`${dir}/flow.ts`, source);
      await Deno.writeTextFile(
        `${dir}/nodes.ts`,
        'import { Base } from "./flow.ts";\nexport class Square extends Base {}\n',
      );
      for (const args of [["validate"], ["run-local", "--state", `${dir}/state`]]) {
        const run = await vf(args[0], `${dir}/flow.ts`, ...args.slice(1));
        const text = run.stdout + run.stderr;
        const missed = mistake.says.filter((pattern) => !pattern.test(text));
        if (run.code !== 2 || missed.length > 0 || /VF_UNKNOWN|running flow|^\s+at /m.test(text)) {
          failures.push(
            `${mistake.name}, ${args[0]}: exit ${run.code}, missing ${missed.join(" ")}:\n${text}`,
          );
        }
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
  assert.deepEqual(failures, [], failures.join("\n\n"));
});

Deno.test("the first deno task vf of a fresh checkout prints no warning about protobufjs's build script", async () => {
  const checkout = await Deno.makeTempDir({ prefix: "vf-checkout-" });
  try {
    for (const name of ["deno.json", "deno.lock", "mod.ts", "src"]) {
      await new Deno.Command("cp", { args: ["-r", new URL(name, root).pathname, checkout] }).output();
    }
    // A fresh node_modules is made from Deno's cache: the moment Deno decides about lifecycle scripts.
    const output = await new Deno.Command(Deno.execPath(), {
      args: ["task", "vf", "--help"],
      cwd: checkout,
      env: { NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(output.stderr);
    assert.equal(output.code, 0, stderr);
    assert.ok((await Deno.stat(`${checkout}/node_modules`)).isDirectory, "the task made node_modules");
    assert.doesNotMatch(stderr, /Ignored build scripts|approve-scripts/, stderr);
    assert.match(new TextDecoder().decode(output.stdout), /^usage: vf <command>/);
  } finally {
    await Deno.remove(checkout, { recursive: true });
  }
});
