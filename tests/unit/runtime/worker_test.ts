import assert from "node:assert/strict";
import { ProcessorNode } from "../../../src/core/node.ts";
import { runWorker, type WorkerReport } from "../../../src/runtime/worker.ts";
import { processorEnv } from "../../support/worker_env.ts";

/** The node the environment names: never built, since the worker refuses first. */
export class Detect extends ProcessorNode {
  process(x: unknown): unknown {
    return x;
  }
}

/** A processor's required variables with the embedded broker, plus `extra`. */
function env(extra: Record<string, string>): Record<string, string> {
  return processorEnv(`${import.meta.url}#Detect`, {
    VF_EMBEDDED_BROKER: "tcp://127.0.0.1:9",
    VF_EMBEDDED_BROKER_SECRET: "a-secret-of-16-chars-or-more",
    VF_FLOW_TYPE: "batch",
    VF_REPLICA_ID: "0",
    ...extra,
  });
}

Deno.test("a worker on the embedded broker given VF_PROFILE_REQUESTS_JSON refuses to start, naming it, exit 2: only JetStream streams are read back", async () => {
  const reports: WorkerReport[] = [];
  const code = await runWorker({
    env: env({ VF_PROFILE_REQUESTS_JSON: '[{"channel":"cam","profile":"reliable_work"}]' }),
    report: (r) => reports.push(r),
    logSink: () => {},
  });
  assert.equal(code, 2);
  const exit = reports.find((r) => r.kind === "exit");
  assert.ok(exit !== undefined && exit.kind === "exit");
  const reason = exit.reason as { code: string; message: string };
  assert.equal(reason.code, "VF_CONFIG");
  assert.match(reason.message, /VF_PROFILE_REQUESTS_JSON is verified against NATS JetStream streams/);
});

/** A processor's required variables with a NATS broker at `url`, plus `extra`. */
function natsEnv(url: string, extra: Record<string, string>): Record<string, string> {
  const nats = env({ VF_NATS_URL: url, ...extra });
  delete nats.VF_EMBEDDED_BROKER;
  delete nats.VF_EMBEDDED_BROKER_SECRET;
  return nats;
}

Deno.test("a worker on NATS given the local engine's ledger refuses to start, naming the variable, exit 2", async () => {
  const reports: WorkerReport[] = [];
  const nats = natsEnv("nats://127.0.0.1:9", { VF_RUNTIME_STORE_URL: "embedded://" });
  assert.equal(await runWorker({ env: nats, report: (r) => reports.push(r), logSink: () => {} }), 2);
  assert.match(JSON.stringify(reports), /VF_RUNTIME_STORE_URL=embedded:\/\/ names the local engine's ledger/);
});

Deno.test("a worker whose NATS server cannot be reached ends with BrokerUnavailable, exit 3", async () => {
  const reports: WorkerReport[] = [];
  const nats = natsEnv("nats://127.0.0.1:9", { VF_RUNTIME_STORE_URL: "memory://" });
  assert.equal(await runWorker({ env: nats, report: (r) => reports.push(r), logSink: () => {} }), 3);
  const exit = reports.find((r) => r.kind === "exit");
  assert.ok(exit !== undefined && exit.kind === "exit");
  assert.equal((exit.reason as { code: string }).code, "VF_BROKER_UNAVAILABLE");
  assert.match(
    (exit.reason as { message: string }).message,
    /cannot reach the NATS server at nats:\/\/127\.0\.0\.1:9/,
  );
});
