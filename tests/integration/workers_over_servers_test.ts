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
import { provisionRun } from "../../src/runtime/provision.ts";
import { startNatsServer, startRedisServer } from "../support/services.ts";
import { runReplicas } from "../support/replicas.ts";
import * as storyNodes from "../fixtures/e2e/story_nodes.ts";
import { AppendingSink, Blobs, Count } from "../fixtures/e2e/story_nodes.ts";
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
    const provisioned = await provisionRun({
      natsUrl: nats.url,
      flowId: flow.flowId,
      runId,
      flowType: "batch",
      specs,
      blobStoreUrl: redis.url,
      runtimeStoreUrl: redis.url,
    });
    assert.deepEqual(provisioned.topology.channels.length, 3);
    assert(provisioned.ledgerBudget, "redis-server --appendonly yes reads back durable and shared");
    const codes = await runReplicas(specs, { flowId: flow.flowId, flowType: "batch" }, runId, {
      nats: nats.url,
      redis: redis.url,
    }, dir);
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
    await provisionRun({
      natsUrl: nats.url,
      flowId: flow.flowId,
      runId: "r1",
      flowType: "batch",
      specs,
      blobStoreUrl: redis.url,
      runtimeStoreUrl: redis.url,
    });
    const codes = await runReplicas(specs, { flowId: flow.flowId, flowType: "batch" }, "r1", {
      nats: nats.url,
      redis: redis.url,
    }, dir);
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
