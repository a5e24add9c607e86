import assert from "node:assert/strict";
import {
  configureLogging,
  LogFormat,
  loggingConfigFromEnv,
  LogLevel,
  NodeLogger,
  type NodeLoggerOptions,
} from "../../../src/runtime/logging.ts";
import type { Logger } from "../../../src/core/context.ts";
import { ConfigError, TransientFailure } from "../../../src/core/errors.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";

const scope = { flowId: "flow-A", runId: "run-1", node: "detect", replica: 2 };

function capture(options: NodeLoggerOptions = {}) {
  const lines: Array<{ line: string; level: string }> = [];
  const logger = new NodeLogger({
    scope,
    clock: new FakeClock(),
    sink: (line, level) => lines.push({ line, level }),
    ...options,
  });
  return { lines, logger };
}

Deno.test("JSON lines: one object per record with ts, level, msg, the node's scope, then the fields", () => {
  const { lines, logger } = capture({ format: LogFormat.json });
  const asContract: Logger = logger;
  asContract.info("model loaded", { seconds: 2.5, device: "cuda:0" });
  assert.equal(lines.length, 1);
  assert.equal(lines[0].level, "info");
  assert.ok(!lines[0].line.includes("\n"));
  assert.deepEqual(Object.entries(JSON.parse(lines[0].line)), [
    ["ts", "2023-11-14T22:13:20.000Z"],
    ["level", "info"],
    ["msg", "model loaded"],
    ["flow_id", "flow-A"],
    ["run_id", "run-1"],
    ["node", "detect"],
    ["replica", 2],
    ["seconds", 2.5],
    ["device", "cuda:0"],
  ]);
});

Deno.test("human format: ts, padded level, node[replica], message, key=value fields, flow and run last", () => {
  const { lines, logger } = capture();
  logger.warn("slow frame", { ms: 41, note: "took a while", path: "/clips/a b.mp4" });
  assert.equal(
    lines[0].line,
    '2023-11-14T22:13:20.000Z WARN  detect[2] slow frame ms=41 note="took a while" path="/clips/a b.mp4" flow=flow-A run=run-1',
  );
  const bare = new NodeLogger({ clock: new FakeClock(), sink: (line) => lines.push({ line, level: "" }) });
  bare.info("supervisor up");
  assert.equal(lines[1].line, "2023-11-14T22:13:20.000Z INFO  - supervisor up");
});

Deno.test("level: records below it are dropped, at or above it written", () => {
  const { lines, logger } = capture({ level: LogLevel.warn });
  logger.debug("d");
  logger.info("i");
  logger.warn("w");
  logger.error("e");
  assert.deepEqual(lines.map((l) => l.level), ["warn", "error"]);
  assert.equal(logger.enabled(LogLevel.info), false);
  assert.equal(logger.enabled(LogLevel.error), true);
  const all = capture({ level: LogLevel.debug });
  all.logger.debug("d");
  assert.equal(all.lines.length, 1);
});

Deno.test("with(): bound fields ride on every record, call fields win, the scope is kept", () => {
  const { lines, logger } = capture({ format: LogFormat.json });
  const traced = logger.with({ trace_id: "cam:7", partition: 1 }).with({ partition: 3 });
  traced.info("processed", { ms: 3 });
  traced.info("again", { trace_id: "cam:8" });
  logger.info("untouched");
  const [first, second, third] = lines.map((l) => JSON.parse(l.line));
  assert.equal(first.trace_id, "cam:7");
  assert.equal(first.partition, 3);
  assert.equal(first.node, "detect");
  assert.equal(second.trace_id, "cam:8");
  assert.equal(third.trace_id, undefined);
  assert.equal(traced.level, logger.level);
  assert.equal(traced.format, LogFormat.json);
});

Deno.test("fields never hide ts, level or msg, and values JSON cannot hold are written as what they are", () => {
  const { lines, logger } = capture({ format: LogFormat.json });
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  logger.error("odd values", {
    msg: "shadow",
    level: "fake",
    count: 12345678901234567890n,
    error: new TransientFailure("upstream 503", null, { url: "http://x" }),
    frame: new Uint8Array(1024),
    ids: new Set(["a", "b"]),
    nothing: undefined,
  });
  const record = JSON.parse(lines[0].line);
  assert.equal(record.msg, "odd values");
  assert.equal(record.level, "error");
  assert.equal(record.field_msg, "shadow");
  assert.equal(record.field_level, "fake");
  assert.equal(record.count, "12345678901234567890");
  assert.equal(record.error.code, "VF_TRANSIENT");
  assert.deepEqual(record.error.context, { url: "http://x" });
  assert.equal(record.frame, "<1024 bytes>");
  assert.deepEqual(record.ids, ["a", "b"]);
  assert.ok(!("nothing" in record));
  logger.error("cycle", { cyclic, fine: 1 });
  const cycle = JSON.parse(lines[1].line);
  assert.equal(cycle.msg, "cycle", "a value that cannot be serialized loses only itself");
  assert.equal(cycle.fine, 1);
  assert.match(cycle.cyclic, /^<unserializable: .*circular/i);
});

Deno.test("a sink that throws loses the line, never the caller's work", () => {
  const logger = new NodeLogger({
    sink: () => {
      throw new Error("stderr closed");
    },
  });
  logger.error("still fine");
});

Deno.test("env: VF_STRUCTURED_LOGS picks the format, VF_LOG_LEVEL the level; other values are ConfigErrors", () => {
  const env = (entries: Record<string, string>) => new Map(Object.entries(entries));
  assert.deepEqual(loggingConfigFromEnv(env({})), { format: "human", level: "info" });
  assert.deepEqual(loggingConfigFromEnv(env({ VF_STRUCTURED_LOGS: "1" })), { format: "json", level: "info" });
  assert.deepEqual(loggingConfigFromEnv(env({ VF_STRUCTURED_LOGS: "0", VF_LOG_LEVEL: "DEBUG" })), {
    format: "human",
    level: "debug",
  });
  assert.equal(loggingConfigFromEnv(env({ VF_LOG_LEVEL: "warning" })).level, "warn");
  assert.equal(loggingConfigFromEnv(env({ VF_STRUCTURED_LOGS: "true" })).format, "json");
  assert.throws(() => loggingConfigFromEnv(env({ VF_STRUCTURED_LOGS: "json" })), ConfigError);
  assert.throws(
    () => loggingConfigFromEnv(env({ VF_LOG_LEVEL: "verbose" })),
    (error: unknown) =>
      error instanceof ConfigError &&
      JSON.stringify(error.context) === JSON.stringify({ variable: "VF_LOG_LEVEL", value: "verbose" }),
    "the error names the variable that is wrong",
  );
  assert.throws(() => loggingConfigFromEnv(env({ VF_LOG_LEVEL: "toString" })), ConfigError);
  const lines: string[] = [];
  const logger = configureLogging(scope, env({ VF_STRUCTURED_LOGS: "1", VF_LOG_LEVEL: "error" }), {
    sink: (line) => lines.push(line),
  });
  logger.warn("dropped");
  logger.error("kept");
  assert.equal(lines.length, 1);
  assert.equal(JSON.parse(lines[0]).node, "detect");
});

Deno.test("a worker process configured from its environment writes JSON lines to stderr and nothing to stdout", async () => {
  const module = new URL("../../../src/runtime/logging.ts", import.meta.url).href;
  const code = `import { configureLogging } from ${JSON.stringify(module)};
const logger = configureLogging({ flowId: "f", runId: "r", node: "sink", replica: 0 });
logger.debug("hidden");
logger.info("hello %s %d", { n: 1 });
logger.error("bye");`;
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--no-lock", code],
    env: { VF_STRUCTURED_LOGS: "1", VF_LOG_LEVEL: "info", NO_COLOR: "1" },
  }).output();
  assert.equal(output.code, 0, new TextDecoder().decode(output.stderr));
  assert.equal(new TextDecoder().decode(output.stdout), "");
  const records = new TextDecoder().decode(output.stderr).trimEnd().split("\n").map((line) =>
    JSON.parse(line)
  );
  assert.deepEqual(records.map((r) => [r.level, r.msg, r.node, r.n]), [
    ["info", "hello %s %d", "sink", 1],
    ["error", "bye", "sink", undefined],
  ]);
});
