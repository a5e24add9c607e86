/**
 * What a reference worker sees on a real `nats-server -js` (WIRE.md "Names", "Streams and consumers",
 * "Identities"), read through the raw JetStream API (`@nats-io/jetstream`), never through this project's
 * model of it:
 *
 * - the streams and durables `provisionRun` makes carry exactly WIRE.md's names and settings; a stream a
 *   reference worker made first is taken unchanged, one with another immutable setting is refused
 *   (VF_INCOMPATIBLE_PROFILE); teardown deletes the run's streams and nothing else;
 * - the reference's golden envelope bytes, published raw with a reference producer's headers, are processed
 *   by Deno replicas as their own; what a Deno producer publishes is, byte for byte, the vectors' layout
 *   with the headers and message id WIRE.md names.
 *
 * @module
 */

import assert from "node:assert/strict";
import {
  type ConsumerInfo,
  DiscardPolicy,
  jetstream,
  type JetStreamManager,
  jetstreamManager,
  RetentionPolicy,
  StorageType,
  type StreamConfig,
} from "@nats-io/jetstream";
import { headers as natsHeaders, type NatsConnection } from "@nats-io/nats-core";
import { connect } from "@nats-io/transport-node";
import { compileFlow, type NodeSpec } from "../../src/core/compiler.ts";
import { IncompatibleProfile } from "../../src/core/errors.ts";
import { Flow } from "../../src/core/flow.ts";
import { type JsonValue, ProcessorNode } from "../../src/core/node.ts";
import { ModuleIndex } from "../../src/core/node_class.ts";
import { JetStreamMessagingBackend } from "../../src/messaging/jetstream_backend.ts";
import { provisionRun } from "../../src/runtime/provision.ts";
import { createEnvelope, decodeEnvelope, encodeEnvelope, envelopeToJson } from "../../src/wire/codec.ts";
import { MsgType } from "../../src/wire/identities.ts";
import { deriveMessageId } from "../../src/wire/message_id.ts";
import { Tensor } from "../../src/wire/value.ts";
import * as storyNodes from "../fixtures/e2e/story_nodes.ts";
import { AppendingSink, Count, Poison, ReplayableCount } from "../fixtures/e2e/story_nodes.ts";
import { runReplicas } from "../support/replicas.ts";
import { startNatsServer, startRedisServer } from "../support/services.ts";

/** A value as the vectors' manifest tags it (`{"i": 7}`, `{"tensor": {...}}`, `{"list": [...]}`). */
function tagged(value: unknown): JsonValue {
  if (value instanceof Tensor) {
    return { tensor: { shape: [...value.shape], dtype: value.dtype, data_b64: value.data.toBase64() } };
  }
  if (Array.isArray(value)) return { list: value.map(tagged) };
  if (typeof value === "number" && Number.isSafeInteger(value)) return { i: value };
  if (typeof value === "string") return { s: value };
  throw new Error(`Describe has no tag for ${String(value)}`);
}

/**
 * Describes each input as the vectors' manifest writes a payload (`{"tensor": ...}` for a bare array,
 * `{"value": ...}` otherwise), as a JSON line: what it was handed, decoded as it decodes its own inputs.
 */
export class Describe extends ProcessorNode {
  process(input: unknown): string {
    return JSON.stringify(input instanceof Tensor ? tagged(input) : { value: tagged(input) });
  }
}

const MODULES = new ModuleIndex()
  .add(new URL("../fixtures/e2e/story_nodes.ts", import.meta.url).href, storyNodes)
  .add(import.meta.url, { Describe });

const SECOND = 1_000_000_000;
const VECTORS = new URL("../fixtures/vectors/envelope/", import.meta.url);

/** One entry of the vectors' manifest.json (the fields these tests read). */
interface VectorEntry {
  readonly name: string;
  readonly file: string;
  readonly version: number;
  readonly type: "data" | "eos";
  readonly producer_name: string;
  readonly flow_id: string;
  readonly run_id: string;
  readonly trace_id: string;
  readonly seq: number;
  readonly replica_id: number;
  readonly payload: JsonValue;
}

async function vector(name: string): Promise<{ entry: VectorEntry; bytes: Uint8Array }> {
  const manifest = JSON.parse(await Deno.readTextFile(new URL("manifest.json", VECTORS))) as VectorEntry[];
  const entry = manifest.find((e) => e.name === name);
  assert.ok(entry, `manifest.json has ${name}`);
  return { entry, bytes: await Deno.readFile(new URL(entry.file, VECTORS)) };
}

/** WIRE.md's message id of a manifest entry (`Nats-Msg-Id`). */
function idOf(entry: VectorEntry): string {
  return deriveMessageId(
    entry.flow_id,
    entry.run_id,
    entry.producer_name,
    entry.trace_id,
    entry.seq,
    entry.type,
  );
}

/**
 * The batch flow of the read-back: `count` → `shared` (2 competing replicas) → `keyed` (2 replicas, each
 * reading every message on its own durable, partitioned by trace id, taking 64 inputs ahead) → `sink`.
 */
function batchSpecs(flowId: string): NodeSpec[] {
  const count = new Count({ name: "count", n: 3 });
  const shared = new Poison({ name: "shared", poison: [], nbTasks: 2 }).from(count);
  const keyed = new Poison({ name: "keyed", poison: [], nbTasks: 2, partitionBy: "trace_id", prefetch: 64 })
    .from(shared);
  const sink = new AppendingSink({ name: "sink", path: "out.txt" }).from(keyed);
  return compileFlow(new Flow([sink], { flowType: "batch", flowId }), { modules: MODULES });
}

/** The realtime flow of the read-back: `count` → `sink`. */
function realtimeSpecs(flowId: string): NodeSpec[] {
  const count = new Count({ name: "count", n: 3 });
  const sink = new AppendingSink({ name: "sink", path: "out.txt" }).from(count);
  return compileFlow(new Flow([sink], { flowType: "realtime", flowId }), { modules: MODULES });
}

/** Opens a raw connection and JetStream manager on `url`, runs `body`, and closes the connection. */
async function withRaw<T>(url: string, body: (jsm: JetStreamManager, nc: NatsConnection) => Promise<T>) {
  const nc = await connect({ servers: url });
  try {
    return await body(await jetstreamManager(nc), nc);
  } finally {
    await nc.close();
  }
}

/** The stream settings WIRE.md names, as the server reads them back. */
function streamFacts(config: StreamConfig) {
  return {
    name: config.name,
    subjects: [...config.subjects].sort(),
    retention: config.retention,
    max_msgs: config.max_msgs,
    max_msgs_per_subject: config.max_msgs_per_subject,
    discard: config.discard,
    duplicate_window: config.duplicate_window,
    max_age: config.max_age,
  };
}

/** A data durable's settings WIRE.md names, as the server reads them back. */
function durableFacts(info: ConsumerInfo) {
  const c = info.config;
  return {
    durable_name: c.durable_name,
    deliver_subject: c.deliver_subject,
    filter_subject: c.filter_subject,
    ack_policy: c.ack_policy,
    ack_wait: c.ack_wait,
    max_deliver: c.max_deliver,
    max_ack_pending: c.max_ack_pending,
  };
}

/** The durables on `stream`, by name. */
async function durablesOf(jsm: JetStreamManager, stream: string): Promise<Map<string, ConsumerInfo>> {
  const infos = await jsm.consumers.list(stream).next();
  return new Map(infos.map((info) => [info.name, info]));
}

/** A node stream exactly as WIRE.md has a reference worker make it. */
function referenceStream(
  flow: string,
  run: string,
  node: string,
  batch: boolean,
): Partial<StreamConfig> & { name: string } {
  return {
    name: `vf-${flow}-${run}-${node}`,
    subjects: [`vf.${flow}.${run}.${node}`, `vf.${flow}.${run}.${node}._eos`],
    retention: batch ? RetentionPolicy.Interest : RetentionPolicy.Limits,
    max_msgs: batch ? 10_000 : 1,
    discard: batch ? DiscardPolicy.New : DiscardPolicy.Old,
    duplicate_window: 120 * SECOND,
    storage: StorageType.File,
    num_replicas: 1,
  };
}

Deno.test("provisioned streams and durables read back through the raw JetStream API as WIRE.md names and sets them", async (t) => {
  const nats = await startNatsServer();
  try {
    // No runtime store: the memory ledger keeps no retry budget, so the broker's delivery caps are
    // WIRE.md's (with a durable shared ledger they are the ledger's instead, decision D11).
    await provisionRun({
      natsUrl: nats.url,
      flowId: "wb",
      runId: "r1",
      flowType: "batch",
      specs: batchSpecs("wb"),
    });
    await provisionRun({
      natsUrl: nats.url,
      flowId: "wr",
      runId: "r1",
      flowType: "realtime",
      specs: realtimeSpecs("wr"),
    });
    await withRaw(nats.url, async (jsm) => {
      await t.step("batch node streams: interest, 10000 messages, discard new, 120 s window", async () => {
        for (const node of ["count", "shared", "keyed", "sink"]) {
          const info = await jsm.streams.info(`vf-wb-r1-${node}`);
          assert.deepEqual(streamFacts(info.config), {
            name: `vf-wb-r1-${node}`,
            subjects: [`vf.wb.r1.${node}`, `vf.wb.r1.${node}._eos`],
            retention: "interest",
            max_msgs: 10_000,
            max_msgs_per_subject: -1,
            discard: "new",
            duplicate_window: 120 * SECOND,
            max_age: 0,
          }, node);
        }
      });
      await t.step(
        "realtime node streams: limits, 1 message a subject, discard old, 120 s window",
        async () => {
          // WIRE.md's realtime stream is one message for data and terminators together. This project keeps
          // WIRE.md's 1 for each subject (max_msgs twice it): a later frame of another producer replica
          // would otherwise evict a replica's end marker from the one slot, and its consumer would wait for
          // that end for ever. A stream a reference worker made first is kept as it made it (the next test).
          for (const node of ["count", "sink"]) {
            const info = await jsm.streams.info(`vf-wr-r1-${node}`);
            assert.deepEqual(streamFacts(info.config), {
              name: `vf-wr-r1-${node}`,
              subjects: [`vf.wr.r1.${node}`, `vf.wr.r1.${node}._eos`],
              retention: "limits",
              max_msgs: 2,
              max_msgs_per_subject: 1,
              discard: "old",
              duplicate_window: 120 * SECOND,
              max_age: 0,
            }, node);
          }
        },
      );
      await t.step("the dead-letter stream: limits, discard old, 7 days", async () => {
        // WIRE.md names it vf-{flow}-{run}-dlq binding vf.{flow}.{run}._dlq.>; the code (and spec/
        // messaging.topology dlq_stream_name) keeps one per flow, outside every run, so teardown never
        // deletes a run's dead letters: vf-{flow}-dlq binding vf.{flow}._dlq.> (node subjects
        // vf.{flow}._dlq.{run}.{node}).
        for (const flow of ["wb", "wr"]) {
          const info = await jsm.streams.info(`vf-${flow}-dlq`);
          assert.deepEqual(
            [info.config.subjects, info.config.retention, info.config.discard, info.config.max_age],
            [[`vf.${flow}._dlq.>`], "limits", "old", 7 * 24 * 3600 * SECOND],
          );
        }
      });
      await t.step("every durable of the batch flow, by stream", async () => {
        // Beside WIRE.md's data durables, each stream has a never-read `{node}--eos--anchor` on its EOS
        // subject, so an EOS published before a slow child bound its own EOS durable is retained.
        const names = async (node: string) => [...(await durablesOf(jsm, `vf-wb-r1-${node}`)).keys()].sort();
        assert.deepEqual(await names("count"), ["count--eos--anchor", "shared--from--count"]);
        assert.deepEqual(await names("shared"), [
          "keyed--from--shared--p0",
          "keyed--from--shared--p1",
          "shared--eos--anchor",
        ]);
        assert.deepEqual(await names("keyed"), ["keyed--eos--anchor", "sink--from--keyed"]);
        assert.deepEqual(await names("sink"), ["sink--eos--anchor"]);
      });
      await t.step(
        "batch data durables: pull, filtered, explicit ack, 60 s, 4 deliveries, the credit",
        async () => {
          const data = (durable: string, parent: string, credit: number) => ({
            durable_name: durable,
            deliver_subject: undefined,
            filter_subject: `vf.wb.r1.${parent}`,
            ack_policy: "explicit",
            ack_wait: 60 * SECOND,
            max_deliver: 4,
            max_ack_pending: credit,
          });
          const on = async (node: string, durable: string) =>
            durableFacts((await durablesOf(jsm, `vf-wb-r1-${node}`)).get(durable) as ConsumerInfo);
          // consumerCredit: (item credit 1 + the spec's prefetch 4) × 2 competing replicas on the shared
          // durable, as a reference worker derives it.
          assert.deepEqual(
            await on("count", "shared--from--count"),
            data("shared--from--count", "count", 10),
          );
          // A partitioned replica's own durable is not multiplied by the replica count, and keyed raised
          // its prefetch: 1 + 64.
          for (const p of [0, 1]) {
            const durable = `keyed--from--shared--p${p}`;
            assert.deepEqual(await on("shared", durable), data(durable, "shared", 65));
          }
          assert.deepEqual(await on("keyed", "sink--from--keyed"), data("sink--from--keyed", "keyed", 5));
        },
      );
      await t.step("the realtime data durable: 1 delivery, the credit", async () => {
        const info = (await durablesOf(jsm, "vf-wr-r1-count")).get("sink--from--count") as ConsumerInfo;
        assert.deepEqual(durableFacts(info), {
          durable_name: "sink--from--count",
          deliver_subject: undefined,
          filter_subject: "vf.wr.r1.count",
          ack_policy: "explicit",
          ack_wait: 60 * SECOND,
          max_deliver: 1,
          // consumerCredit: item credit 1 + the spec's prefetch 4, one replica.
          max_ack_pending: 5,
        });
      });
    });
  } finally {
    await nats.stop();
  }
});

Deno.test("a stream a reference worker made first is taken unchanged by provisioning", async () => {
  const nats = await startNatsServer();
  try {
    await withRaw(nats.url, async (jsm) => {
      for (const [flow, batch] of [["wb", true], ["wr", false]] as const) {
        const before = await jsm.streams.add(referenceStream(flow, "r1", "count", batch));
        const specs = batch ? batchSpecs(flow) : realtimeSpecs(flow);
        const flowType = batch ? "batch" : "realtime";
        await provisionRun({ natsUrl: nats.url, flowId: flow, runId: "r1", flowType, specs });
        const after = await jsm.streams.info(`vf-${flow}-r1-count`);
        assert.deepEqual(after.config, before.config, flow);
        assert.equal(after.created, before.created, `${flow}: the same stream, not a new one`);
      }
    });
  } finally {
    await nats.stop();
  }
});

Deno.test("a stream made first with another immutable setting fails provisioning as VF_INCOMPATIBLE_PROFILE", async () => {
  const nats = await startNatsServer();
  try {
    await withRaw(nats.url, async (jsm) => {
      const differing: [string, Partial<StreamConfig>][] = [
        ["r-limits", { retention: RetentionPolicy.Limits }],
        ["r-memory", { storage: StorageType.Memory }],
      ];
      for (const [run, change] of differing) {
        const before = await jsm.streams.add({ ...referenceStream("wb", run, "count", true), ...change });
        await assert.rejects(
          provisionRun({
            natsUrl: nats.url,
            flowId: "wb",
            runId: run,
            flowType: "batch",
            specs: batchSpecs("wb"),
          }),
          (error: unknown) => {
            assert.ok(error instanceof IncompatibleProfile, String(error));
            assert.equal(error.code, "VF_INCOMPATIBLE_PROFILE");
            assert.match(error.message, new RegExp(`stream vf-wb-${run}-count exists with settings`));
            return true;
          },
          run,
        );
        const after = await jsm.streams.info(`vf-wb-${run}-count`);
        assert.deepEqual(after.config, before.config, `${run}: the refused stream is left as it was`);
        assert.equal(await jsm.streams.info(`vf-wb-${run}-shared`).catch(() => null), null, run);
      }
    });
  } finally {
    await nats.stop();
  }
});

Deno.test("teardown deletes the run's streams, never the dead-letter stream nor run r10's", async () => {
  const nats = await startNatsServer();
  try {
    const specs = batchSpecs("wb");
    const r1 = await provisionRun({ natsUrl: nats.url, flowId: "wb", runId: "r1", flowType: "batch", specs });
    await provisionRun({ natsUrl: nats.url, flowId: "wb", runId: "r10", flowType: "batch", specs });
    await withRaw(nats.url, async (jsm, nc) => {
      // One message each, on r10's count stream and in the flow's dead letters, that must survive.
      await jetstream(nc).publish("vf.wb.r10.count", "kept", { msgID: "kept-r10" });
      await jetstream(nc).publish("vf.wb._dlq.r1.shared", "letter", { msgID: "dlq:wb:r1:shared:1" });
      const backend = await JetStreamMessagingBackend.connect({ url: nats.url });
      try {
        const done = await backend.close(r1.topology.channels.map((c) => c.spec.id), "");
        assert.deepEqual([done.complete, [...done.removed].sort(), done.remaining], [
          true,
          ["vf-wb-r1-count", "vf-wb-r1-keyed", "vf-wb-r1-shared", "vf-wb-r1-sink"],
          [],
        ]);
      } finally {
        await backend.shutdown();
      }
      const left = (await jsm.streams.names().next()).sort();
      assert.deepEqual(left, [
        "vf-wb-dlq",
        "vf-wb-r10-count",
        "vf-wb-r10-keyed",
        "vf-wb-r10-shared",
        "vf-wb-r10-sink",
      ]);
      assert.equal((await jsm.streams.info("vf-wb-r10-count")).state.messages, 1);
      assert.equal((await jsm.streams.info("vf-wb-dlq")).state.messages, 1);
    });
  } finally {
    await nats.stop();
  }
});

Deno.test("the reference's golden envelopes, published raw as a reference cam would, are processed by Deno replicas as their own", async () => {
  const nats = await startNatsServer();
  const redis = await startRedisServer();
  const dir = await Deno.makeTempDir();
  try {
    const out = `${dir}/out.txt`;
    // cam is never run: its spec only names the parent the processor reads.
    const cam = new Count({ name: "cam", n: 1 });
    const describe = new Describe({ name: "describe" }).from(cam);
    const sink = new AppendingSink({ name: "sink", path: out }).from(describe);
    const flow = new Flow([sink], { flowType: "batch", flowId: "flow-A" });
    const specs = compileFlow(flow, { modules: MODULES });
    await provisionRun({
      natsUrl: nats.url,
      flowId: "flow-A",
      runId: "run-1",
      flowType: "batch",
      specs,
      blobStoreUrl: redis.url,
      runtimeStoreUrl: redis.url,
    });
    const frame = await vector("data_tensor_frame");
    const nested = await vector("data_value_nested_tensor");
    const eos = await vector("eos");
    // eos.bin is cam's replica 0 EOS with seq 9: under the EOS-7 barrier (a batch parent over the durable
    // shared Redis ledger) a replica's EOS seq is how many data messages it published, so eos.bin promises
    // 9 and the two data vectors (seq 1 and 2) would leave the barrier 7 short for good (the processor
    // would not end cleanly).
    // The EOS published is therefore cam's replica 0 EOS for 2 messages, encoded by this project's codec
    // with eos.bin's fields but the seq.
    assert.deepEqual([eos.entry.trace_id, eos.entry.seq, eos.entry.replica_id], ["eos-r0", 9, 0]);
    const endOfTwo = createEnvelope({
      type: MsgType.eos,
      producerName: "cam",
      flowId: "flow-A",
      runId: "run-1",
      traceId: "eos-r0",
      seq: 2,
    });
    await withRaw(nats.url, async (_jsm, nc) => {
      const js = jetstream(nc);
      const send = async (subject: string, bytes: Uint8Array, id: string) => {
        const h = natsHeaders();
        h.set("Nats-Msg-Id", id);
        h.set("VF-Env", "4");
        const ack = await js.publish(subject, bytes, { headers: h });
        assert.deepEqual([ack.stream, ack.duplicate], ["vf-flow-A-run-1-cam", false], subject);
      };
      assert.equal(idOf(frame.entry), "745708c2eeaf98a60fdbebafe1d04eff", "WIRE.md's example id");
      await send("vf.flow-A.run-1.cam", frame.bytes, idOf(frame.entry));
      await send("vf.flow-A.run-1.cam", nested.bytes, idOf(nested.entry));
      await send(
        "vf.flow-A.run-1.cam._eos",
        encodeEnvelope(endOfTwo),
        deriveMessageId("flow-A", "run-1", "cam", "eos-r0", 2, MsgType.eos),
      );
    });
    const codes = await runReplicas(
      specs,
      { flowId: "flow-A", flowType: "batch" },
      "run-1",
      {
        nats: nats.url,
        redis: redis.url,
      },
      dir,
      ["describe", "sink"],
    );
    assert.deepEqual(codes, { "describe/0": 0, "sink/0": 0 });
    const lines = (await Deno.readTextFile(out)).trim().split("\n").map((line) => JSON.parse(line));
    const byText = (a: unknown, b: unknown) => JSON.stringify(a).localeCompare(JSON.stringify(b));
    assert.deepEqual(lines.sort(byText), [frame.entry.payload, nested.entry.payload].sort(byText));
    // Two messages (two message ids: seq 1 and seq 2, though both carry trace id cam:1), each delivered
    // once: neither was taken for a redelivery of the other and held back until its ack wait ran out.
    await withRaw(nats.url, async (jsm) => {
      const durable = await jsm.consumers.info("vf-flow-A-run-1-cam", "describe--from--cam");
      assert.equal(durable.delivered.consumer_seq, 2, "deliveries on describe--from--cam");
    });
  } finally {
    await nats.stop();
    await redis.stop();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("what a Deno producer publishes is the vectors' layout, with VF-Env 4 and WIRE.md's message id", async () => {
  const nats = await startNatsServer();
  const redis = await startRedisServer();
  const dir = await Deno.makeTempDir();
  try {
    // A replayable cam mints trace id `cam:{offset}` and seq = offset even over a durable ledger, so its
    // first item is WIRE.md's example identity (a live source there mints `cam:{epoch}:{n}`, MSGID-5).
    const cam = new ReplayableCount({ name: "cam", n: 1 });
    const sink = new AppendingSink({ name: "sink", path: `${dir}/out.txt` }).from(cam);
    const specs = compileFlow(new Flow([sink], { flowType: "batch", flowId: "flow-A" }), {
      modules: MODULES,
    });
    await provisionRun({
      natsUrl: nats.url,
      flowId: "flow-A",
      runId: "run-1",
      flowType: "batch",
      specs,
      blobStoreUrl: redis.url,
      runtimeStoreUrl: redis.url,
    });
    const codes = await runReplicas(
      specs,
      { flowId: "flow-A", flowType: "batch" },
      "run-1",
      {
        nats: nats.url,
        redis: redis.url,
      },
      dir,
      ["cam"],
    );
    assert.deepEqual(codes, { "cam/0": 0 });
    const frame = await vector("data_tensor_frame");
    const eos = await vector("eos");
    await withRaw(nats.url, async (jsm) => {
      // Nobody read the stream: interest retention keeps both for the sink's durable and the EOS anchor.
      const data = await jsm.streams.getMessage("vf-flow-A-run-1-cam", { seq: 1 });
      const end = await jsm.streams.getMessage("vf-flow-A-run-1-cam", { seq: 2 });
      assert.ok(data && end, "both messages are still on the stream");
      assert.deepEqual([data.subject, end.subject], ["vf.flow-A.run-1.cam", "vf.flow-A.run-1.cam._eos"]);
      assert.deepEqual(
        [data.header.get("VF-Env"), data.header.get("Nats-Msg-Id")],
        ["4", "745708c2eeaf98a60fdbebafe1d04eff"],
      );
      assert.deepEqual(
        [end.header.get("VF-Env"), end.header.get("Nats-Msg-Id")],
        ["4", deriveMessageId("flow-A", "run-1", "cam", "eos-r0", 1, MsgType.eos)],
      );
      // The bytes decode, field for field, into the layout of the reference's frame and EOS vectors.
      const decoded = envelopeToJson(decodeEnvelope(data.data));
      assert.deepEqual(
        [decoded.v, decoded.type, decoded.producer_name, decoded.flow_id, decoded.run_id],
        [frame.entry.version, frame.entry.type, "cam", "flow-A", "run-1"],
      );
      assert.deepEqual([decoded.trace_id, decoded.seq, decoded.replica_id], ["cam:1", 1, 0]);
      assert.deepEqual([decoded.payload_type, decoded.payload], ["videoflow.v1.Value", { value: { i: 1 } }]);
      const decodedEnd = envelopeToJson(decodeEnvelope(end.data));
      assert.deepEqual(
        [decodedEnd.v, decodedEnd.type, decodedEnd.trace_id, decodedEnd.seq, decodedEnd.payload],
        [eos.entry.version, eos.entry.type, "eos-r0", 1, eos.entry.payload],
      );
    });
  } finally {
    await nats.stop();
    await redis.stop();
    await Deno.remove(dir, { recursive: true });
  }
});
