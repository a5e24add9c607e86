/**
 * The messenger's fault stories (SPEC-MAP section 5: 1, 2, 13, 14, 19, 20, 21, 22, 23, 24, 26, 27, 36, 38,
 * 41, 45, 49, 50, messenger side), written once against the contracts and run over every provider's
 * MessagingBackend and PayloadStore: `memory_test.ts` today. Each test is named
 * "<provider> <REQ-ID> <story>: <behaviour>"; a story the spec gives no requirement id is labelled by the
 * spec text it comes from in brackets. Faults are driven through the barriers of `faults.ts` and time
 * through the fake clock; every scheduled fault must have fired (assertAllFired). A crash is a
 * SimulatedCrash at a barrier, then the messenger closed without handing anything back, then a replacement
 * opened over the same (reopened) ledger.
 *
 * @module
 */

import { DropReason } from "../../../src/core/metrics.ts";
import assert from "node:assert/strict";
import {
  Barrier,
  crash,
  dropResponse,
  type FaultAction,
  FaultSchedule,
  installed,
  pause,
  raiseTyped,
  SimulatedCrash,
  throwSimulatedCrash,
} from "../../../src/backends/faults.ts";
import {
  channelId,
  type Envelope,
  envelope,
  MessageKind,
  type SubscriptionObservation,
} from "../../../src/backends/messaging.ts";
import type { Observation } from "../../../src/backends/outcomes.ts";
import { DeviceError, PoisonMessage, TransientFailure, UpstreamAborted } from "../../../src/core/errors.ts";
import type { InputEntry, InputGroup } from "../../../src/core/messenger.ts";
import { PartitionKeyPolicy } from "../../../src/core/partition_key_policy.ts";
import type { EnvelopeEntry } from "../../../src/messaging/grouping.ts";
import { type BrokerMessenger, DeadLetterHeader } from "../../../src/messaging/messenger.ts";
import { dataSubscriptionId } from "../../../src/messaging/topology.ts";
import {
  createEnvelope,
  decodeEnvelope,
  decodePayload,
  encodeEnvelope,
  ENVELOPE_VERSION,
} from "../../../src/wire/codec.ts";
import type { BlobRef } from "../../../src/wire/value.ts";
import { dlqMessageId, messageId, partitionOwner } from "../../../src/wire/identities.ts";
import {
  consume,
  FLOW,
  type FlowOptions,
  isTerminal,
  MessengerFlow,
  type MessengerProvider,
  produce,
  RUN,
  settlesWithin,
} from "./support.ts";

type Story = readonly [name: string, run: (provider: MessengerProvider) => Promise<void>];

/** Registers every messenger story against `provider`. */
export function messengerScenarios(provider: MessengerProvider): void {
  for (const [name, run] of STORIES) Deno.test(`${provider.name} ${name}`, () => run(provider));
}

async function story(
  provider: MessengerProvider,
  options: FlowOptions,
  body: (flow: MessengerFlow) => Promise<void>,
): Promise<void> {
  const flow = await MessengerFlow.create(provider, options);
  try {
    await body(flow);
  } finally {
    installed()?.uninstall();
    await flow.dispose();
  }
}

/** A schedule installed now, whose crashes throw SimulatedCrash in this process. */
function faults(actions: Readonly<Record<string, FaultAction>>): FaultSchedule {
  return new FaultSchedule(actions, { onCrash: throwSimulatedCrash }).install();
}

/** Awaits `schedule`'s scheduled faults, uninstalls it and fails unless every one fired. */
function finish(schedule: FaultSchedule): void {
  schedule.uninstall();
  schedule.assertAllFired();
}

const CHAIN: FlowOptions = {
  flowType: "batch",
  nodes: [{ name: "cam" }, { name: "det", parents: ["cam"] }, { name: "sink", parents: ["det"] }],
};

function dataOn(flow: MessengerFlow, node: string): Envelope[] {
  return storedOn(flow, node).filter((e) => e.kind === MessageKind.data);
}

function deadLetters(flow: MessengerFlow, node: string): Envelope[] {
  return storedOn(flow, node).filter((e) => e.kind === MessageKind.dlq);
}

function storedOn(flow: MessengerFlow, node: string): Envelope[] {
  return flow.stored(node);
}

async function observed(flow: MessengerFlow, parent: string, child: string, partition: number | null = null) {
  const observation: Observation<SubscriptionObservation> = await flow.drive(
    flow.backend.observeSubscription(dataSubscriptionId(channelId(FLOW, RUN, parent), child, partition)),
  );
  assert.equal(observation.kind, "known");
  return observation.kind === "known" ? observation.value : null as never;
}

/** A crashed worker: nothing handed back, nothing flushed; its replacement reopens the ledger. */
async function crashed(flow: MessengerFlow, messenger: BrokerMessenger): Promise<void> {
  await messenger.close({ handBack: false });
  await flow.reopenStore();
}

/** `relay` relays the ABORT it received in `entry`, as its task does; `child`'s entry for it, an ABORT. */
async function relayAbort(
  flow: MessengerFlow,
  entry: InputEntry | null | undefined,
  relay: BrokerMessenger,
  child: BrokerMessenger,
  relayName: string,
): Promise<InputEntry> {
  await flow.drive(relay.publishAbort(entry?.abortError));
  const relayed = (await flow.drive(child.receiveMessage()))[relayName];
  assert.equal(relayed?.isAbort, true);
  return relayed as InputEntry;
}

function blobKeyOf(entry: InputEntry | null | undefined): string {
  const key = (entry as EnvelopeEntry | null | undefined)?.blobRef ?? null;
  assert.ok(key !== null, "the payload was offloaded");
  return key;
}

const BIG = 4096;
const SMALL_INLINE = { maxInlinePayloadBytes: 256 };

function frame(fill: number): Uint8Array {
  return new Uint8Array(BIG).fill(fill);
}

const TIME_JOIN = (extra: Record<string, unknown> = {}) => ({
  mode: "time",
  tolerance_ms: 50,
  missing: "wait",
  ...extra,
});

const STORIES: readonly Story[] = [
  [
    "CTRL-4 1: a join group persisted before its output was acked is re-formed by the replacement, whose output dedups",
    (provider) =>
      story(provider, {
        flowType: "batch",
        durableLedger: true,
        nodes: [
          { name: "a" },
          { name: "b" },
          { name: "fuse", parents: ["a", "b"], joinPolicy: TIME_JOIN() },
          { name: "out", parents: ["fuse"] },
        ],
      }, async (flow) => {
        const a = await flow.open("a");
        const b = await flow.open("b");
        a.setOutputEventTimestamp(100);
        await produce(flow, a, ["a1"], false);
        b.setOutputEventTimestamp(100.02);
        await produce(flow, b, ["b1"], false);
        const first = await flow.open("fuse");
        const group = await flow.drive(first.receiveMessage());
        assert.deepEqual([group.a?.message, group.b?.message], ["a1", "b1"]);
        const key = first.lastInputKey();
        assert.equal((await flow.drive(flow.runtime("fuse").openGroups())).length, 1);
        const schedule = faults({ [Barrier.messagePublishAfter]: crash() });
        await flow.drive(first.publishMessage("a1+b1"));
        await assert.rejects(flow.drive(first.awaitInFlight()), SimulatedCrash);
        await assert.rejects(flow.drive(first.ackInputs()), SimulatedCrash, "a later call reports it too");
        finish(schedule);
        await crashed(flow, first);
        assert.equal((await flow.drive(flow.runtime("fuse").openGroups())).length, 1);
        const replacement = await flow.open("fuse");
        const again = await flow.drive(replacement.receiveMessage());
        assert.deepEqual([again.a?.message, again.b?.message], ["a1", "b1"]);
        assert.equal(replacement.lastInputKey(), key);
        await flow.drive(replacement.publishMessage("a1+b1"));
        await flow.drive(replacement.ackInputs());
        await flow.drive(replacement.awaitInFlight());
        assert.equal(replacement.publicationStats.duplicate, 1);
        assert.equal(dataOn(flow, "fuse").length, 1);
        await flow.drive(flow.clock.sleep(1));
        assert.equal((await flow.drive(flow.runtime("fuse").openGroups())).length, 0);
      }),
  ],
  [
    "PAY-004 2: a reader's obligation is released after a confirmed ack, never after one whose receipt was lost",
    (provider) =>
      story(provider, CHAIN, async (flow) => {
        const det = await flow.open("det", 0, SMALL_INLINE);
        const cam = await flow.open("cam", 0, SMALL_INLINE);
        await produce(flow, cam, [frame(1), frame(2)], false);
        const confirmed = await flow.drive(det.receiveMessage());
        assert.deepEqual(confirmed.cam?.message, frame(1));
        const released = blobKeyOf(confirmed.cam);
        await flow.drive(det.ackInputs());
        // The release follows the confirmed settlement over the payload store's own link: under a loaded
        // host it may land a driver step or more after the ack resolved.
        let gone = await flow.drive(flow.payloads.read(await flow.payloads.refForKey(released)));
        for (let step = 0; step < 100 && gone.kind !== "missing"; step++) {
          await flow.drive(flow.clock.sleep(0.01));
          gone = await flow.drive(flow.payloads.read(await flow.payloads.refForKey(released)));
        }
        assert.equal(gone.kind, "missing", "the last obligation released reclaims the payload");
        const lost = await flow.drive(det.receiveMessage());
        const kept = blobKeyOf(lost.cam);
        const schedule = faults({ [Barrier.messageSettleAfter]: dropResponse() });
        await flow.drive(det.ackInputs());
        // The ack goes on without the node: its settlement has its (lost) outcome once nothing is in flight.
        await flow.drive(det.awaitInFlight());
        finish(schedule);
        const still = await flow.drive(flow.payloads.read(await flow.payloads.refForKey(kept)));
        assert.equal(still.kind, "bytes", "an unconfirmed settlement releases nothing");
      }),
  ],
  [
    "[topology.eos_anchor] 13: a parent's EOS published before a slow child bound its own EOS subscription still ends it",
    (provider) =>
      story(provider, CHAIN, async (flow) => {
        const cam = await flow.open("cam");
        await produce(flow, cam, [1, 2, 3]);
        await flow.drive(flow.clock.sleep(30));
        const det = await flow.open("det");
        const seen = await consume(flow, det);
        assert.deepEqual(seen.groups.map((g) => g.cam?.message), [1, 2, 3]);
        assert.equal(seen.end.cam?.isStopSignal, true);
      }),
  ],
  [
    "RUN-005 14: a join fed all of one parent before the other completes within its provisioned credit",
    (provider) =>
      story(provider, {
        flowType: "batch",
        nodes: [
          { name: "cam" },
          { name: "left", parents: ["cam"] },
          { name: "right", parents: ["cam"] },
          { name: "fuse", parents: ["left", "right"], joinPolicy: { max_pending: 6, missing: "wait" } },
        ],
      }, async (flow) => {
        const cam = await flow.open("cam");
        await produce(flow, cam, [1, 2, 3, 4, 5, 6]);
        const fuse = await flow.open("fuse", 0, { prefetch: 1 });
        await consume(flow, await flow.open("left"), (g) => `L${g.cam?.message}`);
        const waiting = fuse.receiveMessage();
        assert.equal(await settlesWithin(flow, waiting, 5), false);
        assert.equal((await observed(flow, "left", "fuse")).leased, 6, "every left half is held");
        await consume(flow, await flow.open("right"), (g) => `R${g.cam?.message}`);
        const first = await flow.drive(waiting);
        await flow.drive(fuse.ackInputs());
        const rest = await consume(flow, fuse);
        const pairs = [first, ...rest.groups].map((g) => `${g.left?.message}${g.right?.message}`);
        assert.deepEqual(pairs, ["L1R1", "L2R2", "L3R3", "L4R4", "L5R5", "L6R6"]);
        assert.deepEqual(fuse.takeDrops(), {});
      }),
  ],
  [
    "EOS-7 19: a duplicate EOS marker is recorded once and counted once",
    (provider) =>
      story(provider, { ...CHAIN, durableLedger: true }, async (flow) => {
        const cam = await flow.open("cam");
        await produce(flow, cam, ["x", "y"]);
        const duplicate = encodeEnvelope(createEnvelope({
          type: "eos",
          producerName: "cam",
          flowId: FLOW,
          runId: RUN,
          traceId: "eos-r0",
          seq: 2,
          replicaId: 0,
        }));
        const outcome = await flow.drive(flow.backend.publish(
          envelope({
            channel: channelId(FLOW, RUN, "cam"),
            publicationId: "eos-republished-by-a-restarted-cam",
            body: duplicate,
            eventId: "eos-republished-by-a-restarted-cam",
            schemaVersion: ENVELOPE_VERSION,
            kind: MessageKind.eos,
          }),
          flow.clock.monotonic() + 5,
        ));
        assert.equal(outcome.kind, "accepted");
        const det = await flow.open("det");
        const seen = await consume(flow, det);
        assert.deepEqual(seen.groups.map((g) => g.cam?.message), ["x", "y"]);
        const terminators = await flow.drive(flow.runtime("det").terminators("cam"));
        assert.deepEqual(terminators.map((t) => [t.replicaId, t.kind, t.seq]), [[0, "eos", 2]]);
        assert.deepEqual([...await flow.drive(flow.runtime("det").completedParents())], ["cam"]);
      }),
  ],
  [
    "EOS-7 20: no completion until every parent replica ended and the broker is observed idle; Unknown never completes",
    (provider) =>
      story(provider, {
        flowType: "batch",
        durableLedger: true,
        nodes: [{ name: "cam" }, { name: "mid", parents: ["cam"], nbTasks: 2 }, {
          name: "sink",
          parents: ["mid"],
        }],
      }, async (flow) => {
        const cam = await flow.open("cam");
        await produce(flow, cam, [1, 2, 3]);
        const mid0 = await flow.open("mid", 0, { prefetch: 0 });
        const mid1 = await flow.open("mid", 1, { prefetch: 0 });
        const one = await flow.drive(mid1.receiveMessage());
        await flow.drive(mid1.publishMessage(one.cam?.message));
        await flow.drive(mid1.ackInputs());
        const rest = await consume(flow, mid0, (g) => g.cam?.message);
        assert.equal(rest.groups.length, 2);
        const sink = await flow.open("sink");
        for (let i = 0; i < 3; i++) {
          await flow.drive(sink.receiveMessage());
          await flow.drive(sink.ackInputs());
        }
        const ending = sink.receiveMessage();
        assert.equal(await settlesWithin(flow, ending, 10), false, "replica 1 of mid has not ended");
        assert.equal(
          await flow.drive(
            flow.runtime("sink").completionState("mid", "sink--from--mid", {
              kind: "known",
              value: [0, 0],
              observedAt: 0,
              generation: null,
            }),
          ),
          "open",
        );
        await consume(flow, mid1, (g) => g.cam?.message);
        for (let tick = 0; (await flow.drive(flow.runtime("sink").terminators("mid"))).length < 2; tick++) {
          assert.ok(tick < 200, "the sink records the EOS of both replicas of mid");
          await flow.drive(flow.clock.sleep(0.05));
        }
        const schedule = faults({ [Barrier.brokerObserveAfter]: dropResponse() });
        const subscription = dataSubscriptionId(channelId(FLOW, RUN, "mid"), "sink", null);
        const unobserved = await flow.drive(flow.backend.observeSubscription(subscription));
        finish(schedule);
        assert.equal(unobserved.kind, "unknown", "a broker reading that failed is Unknown, never 0 pending");
        const pending = unobserved.kind === "unknown" ? unobserved : null as never;
        assert.equal(
          await flow.drive(flow.runtime("sink").completionState("mid", "sink--from--mid", pending)),
          "unknown",
          "an unobservable broker never completes, though every replica of mid has ended",
        );
        const end = await flow.drive(ending);
        assert.equal(end.mid?.isStopSignal, true);
        assert.deepEqual([...await flow.drive(flow.runtime("sink").completedParents())], ["mid"]);
        const terminators = await flow.drive(flow.runtime("sink").terminators("mid"));
        assert.deepEqual(terminators.map((t) => [t.replicaId, t.seq]), [[0, 2], [1, 1]]);
      }),
  ],
  [
    "ABORT-3 21: a parent's ABORT outranks a sibling's EOS and relays downstream with its origin error",
    (provider) =>
      story(provider, {
        flowType: "batch",
        nodes: [
          { name: "a" },
          { name: "b" },
          { name: "fuse", parents: ["a", "b"] },
          { name: "out", parents: ["fuse"] },
        ],
      }, async (flow) => {
        const a = await flow.open("a");
        const b = await flow.open("b");
        const fuse = await flow.open("fuse");
        const out = await flow.open("out");
        await produce(flow, b, ["b-half"]);
        await produce(flow, a, ["a-half-without-partner"], false);
        await flow.drive(a.publishAbort(new DeviceError("the GPU fell off the bus")));
        const aborted = await flow.drive(fuse.receiveMessage());
        assert.equal(aborted.a?.isAbort, true);
        assert.equal(aborted.a?.abortOrigin, "a");
        assert.equal(aborted.a?.abortError?.code, "VF_DEVICE");
        assert.equal(isTerminal(aborted), true);
        const relayed = await relayAbort(flow, aborted.a, fuse, out, "fuse");
        assert.equal(relayed.abortOrigin, "a");
        assert.equal(relayed.abortError?.message, "the GPU fell off the bus");
      }),
  ],
  [
    "ABORT-3 22: a producer's ABORT ends every downstream node, on an id distinct from its EOS",
    (provider) =>
      story(provider, CHAIN, async (flow) => {
        const cam = await flow.open("cam");
        const det = await flow.open("det");
        const sink = await flow.open("sink");
        await produce(flow, cam, [1], false);
        await flow.drive(cam.publishAbort(new UpstreamAborted("next() raised: the camera is gone")));
        const markers = storedOn(flow, "cam").filter((e) => e.kind === MessageKind.eos);
        assert.deepEqual(markers.map((e) => e.publicationId), [
          messageId(FLOW, RUN, "cam", "abort-r0", 1, "abort"),
        ]);
        const first = await flow.drive(det.receiveMessage());
        assert.equal(first.cam?.isAbort, true, "ABORT surfaces ahead of the data still queued");
        const last = await relayAbort(flow, first.cam, det, sink, "det");
        assert.equal(last.abortOrigin, "cam");
        assert.equal(last.abortError?.code, "VF_UPSTREAM_ABORTED");
      }),
  ],
  [
    "DELIV-15 23: poison is dead-lettered on its first failure, then terminated against the accepted dead letter",
    (provider) =>
      story(provider, CHAIN, async (flow) => {
        const cam = await flow.open("cam");
        const det = await flow.open("det");
        await produce(flow, cam, ["bad"], false);
        // A publication is pipelined: the channel holds it once its acceptance is in.
        await flow.drive(cam.awaitInFlight());
        const original = dataOn(flow, "cam")[0];
        await flow.drive(det.receiveMessage());
        const schedule = faults({ [Barrier.messageSettleBefore]: pause("term") });
        const failing = det.failInputs(new PoisonMessage("the frame header is garbage"));
        await schedule.untilFired(Barrier.messageSettleBefore);
        const [letter] = deadLetters(flow, "det");
        assert.ok(letter !== undefined, "the dead letter was accepted before the terminal settle");
        schedule.release("term");
        await flow.drive(failing);
        finish(schedule);
        assert.equal(letter.publicationId, dlqMessageId(FLOW, RUN, "det", 1));
        assert.deepEqual(letter.body, original.body);
        assert.equal(letter.headers[DeadLetterHeader.originNode], "det");
        assert.equal(letter.headers[DeadLetterHeader.error], "VF_POISON: the frame header is garbage");
        assert.equal(letter.headers[DeadLetterHeader.numDelivered], "1");
        const after = await observed(flow, "cam", "det");
        assert.deepEqual([after.available, after.leased, after.unresolved], [0, 0, 0]);
      }),
  ],
  [
    "[PROTOCOL §7.3] 24: a worker-fatal failure is naked at once, never dead-lettered; another replica takes it",
    (provider) =>
      story(provider, {
        flowType: "batch",
        nodes: [{ name: "cam" }, { name: "det", parents: ["cam"], nbTasks: 2 }],
      }, async (flow) => {
        const cam = await flow.open("cam");
        const sick = await flow.open("det", 0, { prefetch: 0 });
        await produce(flow, cam, ["frame"], false);
        await flow.drive(sick.receiveMessage());
        await flow.drive(sick.failInputs(new DeviceError("CUDA error: an illegal memory access")));
        await sick.close();
        const healthy = await flow.open("det", 1, { prefetch: 0 });
        const taken = await flow.drive(healthy.receiveMessage());
        assert.equal(taken.cam?.message, "frame");
        await flow.drive(healthy.ackInputs());
        assert.deepEqual(deadLetters(flow, "det"), []);
        assert.deepEqual(sick.takeDrops(), {});
      }),
  ],
  [
    "DELIV-15 26: a dead letter the broker refused keeps its delivery alive and is re-published under its id after a restart",
    (provider) =>
      story(provider, { ...CHAIN, durableLedger: true }, async (flow) => {
        const cam = await flow.open("cam");
        await produce(flow, cam, ["bad"], false);
        const first = await flow.open("det");
        await flow.drive(first.receiveMessage());
        const schedule = faults({
          [Barrier.dlqPublishBefore]: raiseTyped(
            "VF_BROKER_UNAVAILABLE",
            "the DLQ stream is gone",
            "transient",
          ),
        });
        await flow.drive(first.failInputs(new PoisonMessage("undecodable detections")));
        finish(schedule);
        const id = dlqMessageId(FLOW, RUN, "det", 1);
        const handoffs = await flow.drive(flow.runtime("det").pendingHandoffs());
        assert.deepEqual(handoffs.map((h) => h.recordId), [id]);
        assert.equal(handoffs[0].headers[DeadLetterHeader.error], "VF_POISON: undecodable detections");
        assert.deepEqual(deadLetters(flow, "det"), []);
        const alive = await observed(flow, "cam", "det");
        assert.equal(alive.available + alive.leased, 1, "the delivery was not terminated");
        await crashed(flow, first);
        const replacement = await flow.open("det");
        assert.deepEqual(deadLetters(flow, "det").map((e) => e.publicationId), [id]);
        assert.deepEqual(await flow.drive(flow.runtime("det").pendingHandoffs()), []);
        await flow.drive(replacement.receiveMessage());
        await flow.drive(replacement.failInputs(new PoisonMessage("undecodable detections")));
        assert.equal(deadLetters(flow, "det").length, 1, "the same dead letter, deduplicated");
        const done = await observed(flow, "cam", "det");
        assert.deepEqual([done.available, done.leased, done.unresolved], [0, 0, 0]);
      }),
  ],
  [
    "DELIV-15 27: a delivery ended without a dead letter is terminated against a terminal-log record",
    (provider) =>
      story(provider, {
        flowType: "realtime",
        nodes: [{ name: "cam" }, { name: "det", parents: ["cam"], delivery: { dlq: "off" } }],
      }, async (flow) => {
        const cam = await flow.open("cam");
        const det = await flow.open("det");
        await produce(flow, cam, ["late"], false);
        await flow.drive(det.receiveMessage());
        await flow.drive(det.failInputs(new TransientFailure("the tracker timed out")));
        const [record] = await flow.drive(det.terminalEntries());
        assert.equal(record.action, "term");
        assert.equal(record.code, "VF_TRANSIENT");
        assert.equal(record.message_id, messageId(FLOW, RUN, "cam", "cam:1", 1, "data"));
        const runtime = flow.runtime("det");
        const reference = `${runtime.key("terminal")}#1`;
        assert.deepEqual(await flow.drive(runtime.requireTerminalRecord(reference)), record);
        assert.deepEqual(deadLetters(flow, "det"), []);
        const after = await observed(flow, "cam", "det");
        assert.deepEqual([after.available, after.leased, after.unresolved], [0, 0, 0]);
      }),
  ],
  [
    "RUN-022 36: a checkpoint commits with its output; the covered group's redelivery is acked without reaching the node",
    (provider) =>
      story(provider, { ...CHAIN, durableLedger: true }, async (flow) => {
        const cam = await flow.open("cam");
        await produce(flow, cam, [41], false);
        const first = await flow.open("det");
        const group = await flow.drive(first.receiveMessage());
        const schedule = faults({ [Barrier.checkpointCommitAfter]: crash() });
        await assert.rejects(
          flow.drive(
            first.publishMessage((group.cam?.message as number) + 1, { _checkpoint: new Uint8Array([7]) }),
          ),
          SimulatedCrash,
        );
        finish(schedule);
        assert.deepEqual(dataOn(flow, "det"), [], "the crash came between the commit and the publish");
        await crashed(flow, first);
        const replacement = await flow.open("det");
        assert.deepEqual(await flow.drive(replacement.restoreCheckpoint()), new Uint8Array([7]));
        await flow.drive(cam.publishStopSignal());
        const seen = await consume(flow, replacement);
        assert.deepEqual(seen.groups, [], "the covered group never reached the node again");
        const outputs = dataOn(flow, "det").map((e) => decodeEnvelope(e.body));
        assert.deepEqual(outputs.map((e) => e.traceId), [(group.cam as EnvelopeEntry).traceId]);
        assert.deepEqual(outputs.map((e) => decodePayload(e.payloadType, e.payload)), [42]);
        assert.equal(
          replacement.publicationStats.accepted,
          1,
          "the committed output was sent from the ledger",
        );
      }),
  ],
  [
    "MSGID-6 38: a replayable producer resumes after its last accepted offset with identical ids; downstream dedups",
    (provider) =>
      story(provider, { ...CHAIN, durableLedger: true }, async (flow) => {
        const first = await flow.open("cam", 0, { replayable: true });
        assert.equal(await flow.drive(first.resumeOffset()), 0);
        await produce(flow, first, ["f1", "f2", "f3"], false);
        await flow.drive(flow.clock.sleep(2));
        await produce(flow, first, ["f4"], false);
        await flow.drive(first.awaitInFlight());
        await produce(flow, first, ["f5"], false);
        await crashed(flow, first);
        const second = await flow.open("cam", 0, { replayable: true });
        const resumed = await flow.drive(second.resumeOffset());
        assert.equal(resumed, 4, "offset 4 was the last one noted in the ledger");
        await produce(flow, second, ["f5", "f6"]);
        assert.deepEqual(second.publicationStats, {
          accepted: 1,
          duplicate: 1,
          unknown: 0,
          dropped: 0,
          rejected: 0,
        });
        const seen = await consume(flow, await flow.open("det"));
        assert.deepEqual(seen.groups.map((g) => g.cam?.message), ["f1", "f2", "f3", "f4", "f5", "f6"]);
      }),
  ],
  [
    "RUN-020 41: an unusable partition key is dead-lettered by replica 0 (reject) or routed to the fallback partition",
    (provider) =>
      story(provider, {
        flowType: "batch",
        nodes: [{ name: "cam" }, { name: "det", parents: ["cam"], nbTasks: 2, partitionBy: "camera" }],
      }, async (flow) => {
        const cam = await flow.open("cam");
        const r0 = await flow.open("det", 0);
        const r1 = await flow.open("det", 1);
        await flow.drive(cam.publishMessage("keyed", { camera: "north" }));
        await flow.drive(cam.publishMessage("absent"));
        await flow.drive(cam.publishMessage("empty", { camera: "" }));
        await flow.drive(cam.publishStopSignal());
        const [seen0, seen1] = await Promise.all([consume(flow, r0), consume(flow, r1)]);
        const owner = partitionOwner("north", 2);
        assert.deepEqual([seen0, seen1][owner].groups.map((g) => g.cam?.message), ["keyed"]);
        assert.deepEqual([seen0, seen1][1 - owner].groups, []);
        const letters = deadLetters(flow, "det");
        assert.equal(letters.length, 2);
        assert.ok(
          letters.every((e) => e.headers[DeadLetterHeader.error].startsWith("VF_POISON_PARTITION_KEY:")),
        );
        assert.deepEqual(r0.takeDrops(), { [DropReason.partitionKey]: 2 });
        assert.deepEqual(r1.takeDrops(), {});
      }),
  ],
  [
    "RUN-020 41: with a fallback policy an unusable key is processed by the fallback partition, never dead-lettered",
    (provider) =>
      story(provider, {
        flowType: "batch",
        nodes: [{ name: "cam" }, { name: "det", parents: ["cam"], nbTasks: 2, partitionBy: "camera" }],
      }, async (flow) => {
        const fallback = new PartitionKeyPolicy({ invalid: "fallback", fallbackPartition: 1 });
        const cam = await flow.open("cam");
        const r0 = await flow.open("det", 0, { partitionKeyPolicy: fallback });
        const r1 = await flow.open("det", 1, { partitionKeyPolicy: fallback });
        await flow.drive(cam.publishMessage("absent"));
        await flow.drive(cam.publishMessage("null", { camera: null }));
        await flow.drive(cam.publishStopSignal());
        const [seen0, seen1] = await Promise.all([consume(flow, r0), consume(flow, r1)]);
        assert.deepEqual(seen0.groups, []);
        assert.deepEqual(seen1.groups.map((g) => g.cam?.message), ["absent", "null"]);
        assert.deepEqual(deadLetters(flow, "det"), []);
      }),
  ],
  [
    "BLOB-15 45: a transient payload read is retried; a missing or corrupt payload is dead-lettered naming its ref",
    (provider) =>
      story(provider, CHAIN, async (flow) => {
        const cam = await flow.open("cam", 0, SMALL_INLINE);
        const det = await flow.open("det", 0, SMALL_INLINE);
        await produce(flow, cam, [frame(9)], false);
        const schedule = faults({ [Barrier.payloadReadBefore]: dropResponse() });
        const retried = det.receiveMessage();
        await flow.drive(flow.clock.sleep(0.5));
        finish(schedule);
        const group = await flow.drive(retried);
        assert.deepEqual(group.cam?.message, frame(9));
        await flow.drive(det.ackInputs());
        assert.deepEqual(deadLetters(flow, "det"), []);
        await produce(flow, cam, [frame(10)], false);
        await flow.drive(cam.awaitInFlight());
        const [letterless] = dataOn(flow, "cam");
        const wire = decodeEnvelope(letterless.body);
        const refKey = decodePayload(wire.payloadType, wire.payload) as BlobRef;
        const deleted = await flow.drive(
          flow.payloads.releaseObligation(
            await flow.payloads.refForKey(refKey.ref),
            "det",
            "test-removes-it",
          ),
        );
        assert.equal(deleted.reclaimed, true);
        const waiting = det.receiveMessage();
        assert.equal(
          await settlesWithin(flow, waiting, 2),
          false,
          "a missing payload never reaches the node",
        );
        const [letter] = deadLetters(flow, "det");
        assert.match(
          letter.headers[DeadLetterHeader.error],
          /^VF_POISON_DECODE: payload vf-blob-\w+ is missing/,
        );
        assert.deepEqual(det.takeDrops(), { [DropReason.undecodable]: 1 });
        await flow.drive(det.quiesce());
        await flow.drive(waiting);
      }),
  ],
  [
    "RUN-025 49: a receive takes at most its byte credit, overshooting by one message at most",
    (provider) =>
      story(provider, CHAIN, async (flow) => {
        const cam = await flow.open("cam");
        const payload = "x".repeat(200);
        await produce(flow, cam, Array.from({ length: 10 }, () => payload), false);
        const size = dataOn(flow, "cam")[0].size;
        const credit = Math.floor(size * 2.5);
        const det = await flow.open("det", 0, { prefetchBytes: credit, prefetch: 64 });
        await flow.drive(det.receiveMessage());
        const held = await observed(flow, "cam", "det");
        assert.equal(held.leased, Math.ceil(credit / size), `leased for a credit of ${credit} bytes`);
        assert.ok(held.leased * size <= credit + size);
      }),
  ],
  [
    "JOIN-23 50: a time join emits a quorum group with null for the missing parent, evicts one below quorum, and re-forms the same id on replay",
    (provider) =>
      story(provider, {
        flowType: "batch",
        nodes: [
          { name: "a" },
          { name: "b" },
          { name: "c" },
          {
            name: "fuse",
            parents: ["a", "b", "c"],
            joinPolicy: TIME_JOIN({ timeout_seconds: 2, quorum: 2, missing: "drop", tolerance_ms: 10 }),
          },
          { name: "out", parents: ["fuse"] },
        ],
      }, async (flow) => {
        const [a, b] = [await flow.open("a"), await flow.open("b")];
        a.setOutputEventTimestamp(100);
        await produce(flow, a, ["a1"], false);
        b.setOutputEventTimestamp(100.005);
        await produce(flow, b, ["b1"], false);
        a.setOutputEventTimestamp(200);
        await produce(flow, a, ["a2"], false);
        const first = await flow.open("fuse");
        const group: InputGroup = await flow.drive(first.receiveMessage());
        assert.deepEqual([group.a?.message, group.b?.message, group.c], ["a1", "b1", null]);
        const key = first.lastInputKey();
        await flow.drive(flow.clock.sleep(3));
        assert.deepEqual(first.takeDrops(), { join_evicted: 1 });
        await crashed(flow, first);
        const replay = await flow.open("fuse");
        const again = await flow.drive(replay.receiveMessage());
        assert.deepEqual([again.a?.message, again.b?.message, again.c], ["a1", "b1", null]);
        assert.equal(replay.lastInputKey(), key);
      }),
  ],
];
