/**
 * The worker entry over real servers, as a pod runs it: a flow is provisioned on a real `nats-server -js`
 * (`provisionRun`), then every replica is started as its own `deno run` process configured only by its
 * `VF_*` environment (`VF_NATS_URL`, a `redis://` `VF_RUNTIME_STORE_URL`, `VF_BLOB_REDIS_URL`), and the
 * sink's file holds exactly the flow's results.
 *
 * @module
 */

import assert from "node:assert/strict";
import { compileFlow } from "../../src/core/compiler.ts";
import { Flow } from "../../src/core/flow.ts";
import { startNatsServer, startRedisServer } from "../support/services.ts";
import { provisionOnServers, runReplicas, type StartedReplica, startReplica } from "../support/replicas.ts";
import * as storyNodes from "../fixtures/e2e/story_nodes.ts";
import { AppendingSink, Blobs, Count, KillMeAt } from "../fixtures/e2e/story_nodes.ts";
import { ModuleIndex } from "../../src/core/node_class.ts";
import { ProcessorNode } from "../../src/core/node.ts";
import { JetStreamMessagingBackend } from "../../src/messaging/jetstream_backend.ts";

/** Squares a number. */
export class Square extends ProcessorNode {
  process(x: number): number {
    return x * x;
  }
}

const MODULES = new ModuleIndex()
  .add(new URL("../fixtures/e2e/story_nodes.ts", import.meta.url).href, storyNodes)
  .add(import.meta.url, { Square });

Deno.test("a provisioned batch flow runs to its end with every worker on JetStream and Redis", async () => {
  const nats = await startNatsServer();
  const redis = await startRedisServer();
  const dir = await Deno.makeTempDir();
  try {
    const out = `${dir}/out.txt`;
    const count = new Count({ name: "count", n: 60 });
    const square = new Square({ name: "square", nbTasks: 2 }).from(count);
    const flow = new Flow([new AppendingSink({ name: "sink", path: out, idempotent: true }).from(square)], {
      flowType: "batch",
      flowId: "squares-over-servers",
    });
    const specs = compileFlow(flow, { modules: MODULES });
    const runId = "r1";
    const servers = { nats: nats.url, redis: redis.url };
    const runFlow = { flowId: flow.flowId, flowType: "batch" } as const;
    const provisioned = await provisionOnServers(servers, runFlow, runId, specs);
    assert.deepEqual(provisioned.topology.channels.length, 3);
    assert(provisioned.ledgerBudget, "redis-server --appendonly yes reads back durable and shared");
    const codes = await runReplicas(specs, runFlow, runId, servers, dir);
    assert.deepEqual(codes, { "count/0": 0, "square/0": 0, "square/1": 0, "sink/0": 0 });
    const lines = (await Deno.readTextFile(out)).trim().split("\n").map(Number).sort((a, b) => a - b);
    assert.deepEqual(lines, Array.from({ length: 60 }, (_, i) => (i + 1) * (i + 1)));
    // The streams are the broker's, named as WIRE.md names them.
    const backend = await JetStreamMessagingBackend.connect({ url: nats.url });
    try {
      const observed = await backend.observeChannel({ flowId: flow.flowId, runId, node: "square" });
      assert.deepEqual(observed.kind, "known", JSON.stringify(observed));
    } finally {
      await backend.shutdown();
    }
  } finally {
    await nats.stop();
    await redis.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("payloads above the inline limit travel through Redis between workers on JetStream", async () => {
  const nats = await startNatsServer();
  const redis = await startRedisServer();
  const dir = await Deno.makeTempDir();
  try {
    const out = `${dir}/out.txt`;
    const blobs = new Blobs({ name: "blobs", n: 8, bytes: 64 * 1024 });
    const flow = new Flow([new AppendingSink({ name: "sink", path: out }).from(blobs)], {
      flowType: "batch",
      flowId: "blobs-over-servers",
    });
    const specs = compileFlow(flow, { modules: MODULES });
    const servers = { nats: nats.url, redis: redis.url };
    const runFlow = { flowId: flow.flowId, flowType: "batch" } as const;
    await provisionOnServers(servers, runFlow, "r1", specs);
    const codes = await runReplicas(specs, runFlow, "r1", servers, dir);
    assert.deepEqual(codes, { "blobs/0": 0, "sink/0": 0 });
    const expected = Array.from(
      { length: 8 },
      (_, i) => Array.from({ length: 64 * 1024 }, (_, k) => (i + 1 + k) % 256).join(","),
    );
    assert.deepEqual((await Deno.readTextFile(out)).trim().split("\n").sort(), expected.sort());
    const client = await Deno.connect({ hostname: "127.0.0.1", port: redis.port });
    try {
      await client.write(new TextEncoder().encode("INFO commandstats\r\n"));
      const reply = new Uint8Array(64 * 1024);
      const n = await client.read(reply) ?? 0;
      assert.match(new TextDecoder().decode(reply.subarray(0, n)), /cmdstat_set:calls=\d+/);
    } finally {
      client.close();
    }
  } finally {
    await nats.stop();
    await redis.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a SIGTERMed replica hung in process() hands its prefetched inputs to the other replica at once and dies with 143 (story 39, RUN-030)", async () => {
  const nats = await startNatsServer();
  const redis = await startRedisServer();
  const dir = await Deno.makeTempDir();
  const ackWaitSeconds = 12;
  const started: StartedReplica[] = [];
  try {
    const out = `${dir}/out.txt`;
    const pidFile = `${dir}/hung.pid`;
    const count = new Count({ name: "count", n: 40 });
    const hang = new KillMeAt({ name: "hang", nbTasks: 2, at: 10, pidFile, prefetch: 8 }).from(count);
    const flow = new Flow([new AppendingSink({ name: "sink", path: out }).from(hang)], {
      flowType: "batch",
      flowId: "sigterm-hand-back",
    });
    const specs = compileFlow(flow, { modules: MODULES });
    const runFlow = { flowId: flow.flowId, flowType: "batch" } as const;
    const servers = { nats: nats.url, redis: redis.url };
    await provisionOnServers(servers, runFlow, "r1", specs, { ackWaitSeconds });
    const settings = { ackWaitSeconds };
    const start = (name: string, index: number) =>
      startReplica(specs.find((s) => s.name === name)!, specs, runFlow, "r1", servers, dir, index, settings);
    const others = [start("count", 0), start("sink", 0)];
    const replicas = [start("hang", 0), start("hang", 1)];
    started.push(...others, ...replicas);
    const sinkLines = async () =>
      (await Deno.readTextFile(out).catch(() => "")).trim().split("\n").filter(Boolean);
    const hungPid = Number(await waitFor(async () => await Deno.readTextFile(pidFile).catch(() => null), 60));
    const hung = replicas.findIndex((r) => r.child.pid === hungPid);
    assert(hung >= 0, `the pid file names replica process ${hungPid}`);
    // The other replica finishes what it was given; what is left is held by the hung one.
    await waitFor(async () => {
      const before = (await sinkLines()).length;
      await new Promise((resolve) => setTimeout(resolve, 1000));
      return (await sinkLines()).length === before ? true : null;
    }, 30);
    const heldBack = 39 - (await sinkLines()).length;
    assert(heldBack > 0, "the hung replica holds prefetched inputs besides the one in its node");
    replicas[hung].child.kill("SIGTERM");
    const code = await waitFor(() => Promise.race([replicas[hung].exited, Promise.resolve(null)]), 7);
    assert.equal(code, 143, "it dies of SIGTERM, not after the call in hand, within the hand-back's grace");
    // Everything but the input in the hung call reaches the sink well before the ack wait would return it.
    await waitFor(async () => (await sinkLines()).length >= 39 ? true : null, ackWaitSeconds / 2);
    assert(!(await sinkLines()).includes("10"), "the input in the hung call waits for its ack wait");
    // A replacement takes its place (as a Deployment would); the flow then ends with every item once.
    const replacement = start("hang", hung);
    started.push(replacement);
    assert.deepEqual(
      await Promise.all([...others, replicas[1 - hung], replacement].map((r) => r.exited)),
      [0, 0, 0, 0],
    );
    const lines = (await sinkLines()).map(Number).sort((a, b) => a - b);
    assert.deepEqual(lines, Array.from({ length: 40 }, (_, i) => i + 1));
  } finally {
    for (const replica of started) {
      try {
        replica.child.kill("SIGKILL");
      } catch {
        // already exited
      }
    }
    await Promise.all(started.map((r) => r.exited));
    await nats.stop();
    await redis.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

/** Polls `probe` every 0.1 s until it returns a value other than null; fails after `seconds`. */
async function waitFor<T>(probe: () => Promise<T | null>, seconds: number): Promise<T> {
  const deadline = performance.now() + seconds * 1000;
  while (performance.now() < deadline) {
    const value = await probe();
    if (value !== null) return value;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`nothing came within ${seconds} s`);
}
