/**
 * Story 42 over a real `nats-server -js`: a worker given the operator's explicit channel profiles
 * (`VF_PROFILE_REQUESTS_JSON`) reads back the streams it touches before its node opens, and refuses one
 * that contradicts its profile (exit 2) or that it cannot read (exit 3), naming why in its termination log.
 *
 * @module
 */

import assert from "node:assert/strict";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { ProfileRequest } from "../../src/backends/capabilities.ts";
import { compileFlow } from "../../src/core/compiler.ts";
import { Flow } from "../../src/core/flow.ts";
import { ModuleIndex } from "../../src/core/node_class.ts";
import { ProcessorNode } from "../../src/core/node.ts";
import { streamNameFor } from "../../src/backends/names.ts";
import * as storyNodes from "../fixtures/e2e/story_nodes.ts";
import { AppendingSink, Count } from "../fixtures/e2e/story_nodes.ts";
import { provisionOnServers, startReplica } from "../support/replicas.ts";
import { startNatsServer, startRedisServer } from "../support/services.ts";

/** Passes items through. */
export class Relay extends ProcessorNode {
  process(x: number): number {
    return x;
  }
}

const MODULES = new ModuleIndex()
  .add(new URL("../fixtures/e2e/story_nodes.ts", import.meta.url).href, storyNodes)
  .add(import.meta.url, { Relay });

/**
 * Provisions count → relay → sink as a `flowType` flow, runs `setUp` on the server, then starts every
 * replica, the relay with `requests`, and resolves once the relay ended and the others ended or were
 * killed after `seconds`: each one's exit code (null when killed), the relay's termination record and the
 * sink's items.
 */
async function relayWithRequests(
  flowType: "batch" | "realtime",
  requests: readonly ProfileRequest[],
  setUp: (natsUrl: string) => Promise<void> = async () => {},
  seconds = 20,
): Promise<
  { codes: Record<string, number | null>; reason: Record<string, unknown> | null; items: number[] }
> {
  const nats = await startNatsServer();
  const redis = await startRedisServer();
  const dir = await Deno.makeTempDir();
  try {
    const count = new Count({ name: "count", n: 3 });
    const relay = new Relay({ name: "relay" }).from(count);
    const flow = new Flow([new AppendingSink({ name: "sink", path: `${dir}/out.txt` }).from(relay)], {
      flowType,
      flowId: `profiles-${flowType}`,
    });
    const specs = compileFlow(flow, { modules: MODULES });
    await provisionOnServers(
      { nats: nats.url, redis: redis.url },
      { flowId: flow.flowId, flowType },
      "r1",
      specs,
    );
    await setUp(nats.url);
    const started = specs.map((spec) =>
      [
        spec.name,
        startReplica(
          spec,
          specs,
          { flowId: flow.flowId, flowType },
          "r1",
          { nats: nats.url, redis: redis.url },
          dir,
          0,
          spec.name === "relay" ? { profileRequests: requests } : {},
        ),
      ] as const
    );
    const killAll = () =>
      started.forEach(([, replica]) => {
        try {
          replica.child.kill("SIGKILL");
        } catch {
          // already ended
        }
      });
    const timer = setTimeout(killAll, seconds * 1000);
    const codes: Record<string, number | null> = {};
    for (const [name, replica] of started) {
      const status = await replica.child.status;
      await replica.exited;
      codes[name] = status.signal === null ? status.code : null;
      if (name === "relay" && status.code !== 0) killAll();
    }
    clearTimeout(timer);
    const reason = await Deno.readTextFile(`${dir}/relay-0.termination.json`).then(JSON.parse, () => null);
    const out = await Deno.readTextFile(`${dir}/out.txt`).catch(() => "");
    return { codes, reason, items: out.split("\n").filter(Boolean).map(Number).sort() };
  } finally {
    await nats.stop();
    await redis.stop();
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("a worker required to carry reliable_work on a realtime flow's evicting parent stream refuses to open: exit 2, VF_INCOMPATIBLE_PROFILE naming the fields (story 42)", async () => {
  const { codes, reason } = await relayWithRequests("realtime", [
    new ProfileRequest("count", "reliable_work"),
  ]);
  assert.equal(codes.relay, 2);
  assert.equal(reason?.code, "VF_INCOMPATIBLE_PROFILE");
  assert.match(
    String(reason?.message),
    /channel count does not carry reliable_work: retention: limits .*discard: old/,
  );
});

Deno.test("a worker whose required channel's stream does not exist refuses with exit 3, VF_BROKER_UNAVAILABLE (story 42)", async () => {
  const deleteCount = async (url: string) => {
    const nc = await connect({ servers: url });
    try {
      await (await jetstreamManager(nc)).streams.delete(streamNameFor("profiles-batch", "r1", "count"));
    } finally {
      await nc.close();
    }
  };
  const { codes, reason } = await relayWithRequests(
    "batch",
    [new ProfileRequest("count", "reliable_work")],
    deleteCount,
  );
  assert.equal(codes.relay, 3);
  assert.equal(reason?.code, "VF_BROKER_UNAVAILABLE");
  assert.match(String(reason?.message), /channel count \(reliable_work\)/);
});

Deno.test("a worker whose streams carry their required profiles opens and the run ends with every item, a request for a channel it does not touch not its to judge (story 42)", async () => {
  const { codes, reason, items } = await relayWithRequests("batch", [
    new ProfileRequest("count", "reliable_work"),
    new ProfileRequest("relay", "reliable_work"),
    new ProfileRequest("sink", "live_latest"),
  ]);
  assert.deepEqual(codes, { count: 0, relay: 0, sink: 0 }, JSON.stringify(reason));
  assert.deepEqual(items, [1, 2, 3]);
});
