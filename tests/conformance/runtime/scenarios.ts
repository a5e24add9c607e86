/**
 * The FlowRuntime stories of SPEC-MAP section 5 (ledger side), written once against the RuntimeStore
 * contract and run by every provider (memory_test.ts, file_test.ts, later redis). Each test is named
 * `<provider>: <requirement> <story>: <behaviour>`, drives its fault through a named barrier or the
 * FakeClock, and fails when a scheduled fault never fired.
 *
 * @module
 */

import assert from "node:assert/strict";
import {
  BrokerUnavailable,
  CapabilityError,
  OwnershipConflict,
  ResourceUnavailable,
  StaleAuthority,
  UnobservableState,
} from "../../../src/core/errors.ts";
import {
  Barrier,
  barrier,
  dropResponse,
  FaultSchedule,
  nth,
  pause,
  raiseTyped,
  SimulatedCrash,
} from "../../../src/backends/faults.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import {
  accepted,
  known,
  type Observation,
  publicationUnknown,
  unknown,
} from "../../../src/backends/outcomes.ts";
import {
  claimReplicaSlot,
  CompletionState,
  type FlowRuntime,
  LEASE_POLL_SECONDS,
  type OwnershipToken,
  type PendingCounts,
  type ReplayPosition,
} from "../../../src/backends/runtime.ts";
import {
  dlqMessageId,
  groupIdentity,
  type MemberId,
  messageId,
  replayableTraceId,
  sourceEpochTraceId,
} from "../../../src/wire/identities.ts";
import {
  crashAt,
  driveClock,
  FLOW,
  keepAlive,
  type LedgerFixture,
  RUN,
  runtimeOn,
  type RuntimeProvider,
} from "./support.ts";

const LEASE = 10;
const DRAINED: Observation<PendingCounts> = known<PendingCounts>([0, 0]);
const BROKER_SILENT = unknown("timeout", undefined, "the broker did not answer the consumer info request");
const encoder = new TextEncoder();

/** Runs `work` under a schedule that crashes it at the first hit of `at`; the crash must have happened. */
async function crashesAt(at: Barrier, work: () => Promise<unknown>): Promise<void> {
  using schedule = crashAt(at).install();
  await assert.rejects(work(), SimulatedCrash);
  schedule.assertAllFired();
}

/** Asserts the checkpoint a replacement restores: its state bytes (as text) and its replay position. */
async function assertRestores(runtime: FlowRuntime, state: string, position: ReplayPosition): Promise<void> {
  const restored = await runtime.restoreCheckpoint();
  assert.equal(restored.state === null ? null : new TextDecoder().decode(restored.state), state);
  assert.deepEqual(restored.replayPosition, position);
}

/** The token `runtime` holds for its own partition; fails the test when it holds none. */
function held(runtime: FlowRuntime): OwnershipToken {
  const token = runtime.heldPartition();
  assert.ok(token !== null, `replica ${runtime.replicaId} holds no partition`);
  return token;
}

/** Registers every scenario for `provider`. */
export function runtimeScenarios(provider: RuntimeProvider): void {
  /** A story: a fresh FakeClock and ledger for each test; scenarios that need durability are ignored elsewhere. */
  const story = (
    name: string,
    body: (ledger: LedgerFixture, clock: FakeClock) => Promise<void>,
    options: { readonly durableOnly?: boolean } = {},
  ) =>
    Deno.test({
      name: `${provider.name}: ${name}`,
      ignore: options.durableOnly === true && !provider.durable,
      async fn() {
        const clock = new FakeClock();
        await using ledger = await provider.create(clock);
        await body(ledger, clock);
      },
    });

  story(
    "CTRL-4 1: a crash after a join group is persisted, before its outputs publish: the replacement restores " +
      "the open group and publishes it once under the same publication id",
    async (ledger, clock) => {
      const members: Record<string, MemberId> = {
        left: { producer: "left", traceId: "left:7", seq: 7 },
        right: { producer: "right", traceId: "right:7", seq: 7 },
      };
      const groupId = groupIdentity(members, null);
      const publicationId = messageId(FLOW, RUN, "join", groupId, 7, "data");
      const join = { node: "join", parentReplicas: { left: 1, right: 1 } };
      const first = runtimeOn(ledger.store, clock, join);
      await crashesAt(
        Barrier.groupPersistAfter,
        () => first.persistGroup(groupId, members, { left: "d-1", right: "d-2" }),
      );

      const replacement = runtimeOn(await ledger.reopen(), clock, join);
      const [restored, ...others] = await replacement.openGroups();
      assert.equal(others.length, 0);
      assert.equal(restored.groupId, groupId);
      assert.deepEqual(Object.fromEntries(restored.members), members);
      assert.deepEqual(Object.fromEntries(restored.tokens), { left: "d-1", right: "d-2" });
      assert.equal(groupIdentity(restored.members, null), groupId, "the restored members rederive the id");
      await replacement.intendPublication(publicationId, "sha256:out");
      await replacement.resolvePublication(publicationId, accepted(publicationId, 1, false, "memory"));
      await replacement.settleGroup(groupId);
      assert.deepEqual(await replacement.openGroups(), []);
      assert.equal(await replacement.groupMembers(groupId), null);
      assert.equal(await replacement.publishedCount(), 1);
    },
  );

  story(
    "CTRL-4 1: a crash after the output's intent, before the send: the replacement reconciles the same " +
      "publication id and the deduplicated send counts once",
    async (ledger, clock) => {
      const members = { cam: { producer: "cam", traceId: "cam:1", seq: 1 } };
      const groupId = groupIdentity(members, null);
      const publicationId = messageId(FLOW, RUN, "detect", groupId, 1, "data");
      const first = runtimeOn(ledger.store, clock, { node: "detect" });
      await first.persistGroup(groupId, members, { cam: "d-1" });
      await crashesAt(Barrier.outboxIntendAfter, () => first.intendPublication(publicationId, "sha256:out"));

      const replacement = runtimeOn(await ledger.reopen(), clock, { node: "detect" });
      assert.deepEqual((await replacement.openGroups()).map((g) => g.groupId), [groupId]);
      assert.deepEqual((await replacement.unresolvedPublications()).map((e) => e.publicationId), [
        publicationId,
      ]);
      await replacement.intendPublication(publicationId, "sha256:out");
      await replacement.resolvePublication(publicationId, publicationUnknown(publicationId, "no PubAck"));
      assert.deepEqual((await replacement.unresolvedPublications()).map((e) => e.publicationId), [
        publicationId,
      ]);
      await replacement.resolvePublication(publicationId, accepted(publicationId, 1, true, "memory"));
      await replacement.resolvePublication(publicationId, publicationUnknown(publicationId, "late"));
      assert.equal((await replacement.outboxEntry(publicationId))?.outcome, "accepted", "accepted is final");
      assert.deepEqual(await replacement.unresolvedPublications(), []);
      assert.equal(await replacement.publishedCount(), 1);
      assert.equal((await replacement.outboxOf("detect")).length, 1);
    },
  );

  story(
    "CTRL-4 1: an intent whose receipt is lost is recorded once; the retried intent keeps it",
    async (ledger, clock) => {
      const runtime = runtimeOn(ledger.store, clock, { node: "detect" });
      {
        using schedule = new FaultSchedule({ [Barrier.ledgerWriteAfter]: dropResponse() }).install();
        await assert.rejects(
          runtime.intendPublication("p-1", "sha256:a", { payloadRefs: ["blob/1"] }),
          UnobservableState,
        );
        schedule.assertAllFired();
      }
      const version = await runtime.intendPublication("p-1", "sha256:b");
      assert.equal(typeof version, "string");
      const entry = await runtime.outboxEntry("p-1");
      assert.equal(entry?.digest, "sha256:a", "the first intent is kept");
      assert.deepEqual(entry?.payloadRefs, ["blob/1"]);
      assert.equal((await runtime.outboxOf("detect")).length, 1);
    },
  );

  story(
    "RUN-018/RUN-019 15: a second process binding a live lease is refused with OwnershipConflict as soon " +
      "as the holder renews it, within one lease",
    async (ledger, clock) => {
      const holder = runtimeOn(ledger.store, clock, { node: "singleton", leaseSeconds: LEASE });
      const token = await holder.acquirePartition();
      const second = runtimeOn(await ledger.reopen(), clock, { node: "singleton", leaseSeconds: LEASE });
      await assert.rejects(second.acquirePartition(undefined, { wait: false }), OwnershipConflict);

      const keeper = keepAlive(holder, token);
      const started = clock.now();
      await assert.rejects(driveClock(clock, second.acquirePartition(), 2), OwnershipConflict);
      const waited = clock.now() - started;
      assert.ok(waited <= LEASE / 3 + LEASE_POLL_SECONDS, `refused ${waited} s after it began to wait`);
      assert.ok(keeper.renewals >= 1, "the refusal came from a renewal");
      await keeper.stop();
      await holder.checkAuthority(token);
      assert.equal(await second.currentEpoch(), 1);
      assert.equal(second.heldPartition(), null);
    },
  );

  story(
    "RUN-018 16: a lease holder crashes: the replacement acquires once the lease lapses (after one lease, " +
      "not before); after a graceful release the next one acquires at once",
    async (ledger, clock) => {
      const first = runtimeOn(ledger.store, clock, { node: "singleton", leaseSeconds: LEASE });
      await crashesAt(Barrier.partitionAcquireAfter, () => first.acquirePartition());
      const crashedAt = clock.now();
      const replacement = runtimeOn(await ledger.reopen(), clock, { node: "singleton", leaseSeconds: LEASE });
      const token = await driveClock(clock, replacement.acquirePartition(), 1);
      const waited = clock.now() - crashedAt;
      assert.ok(
        waited > LEASE - 1e-6 && waited < LEASE + 0.01,
        `took over after ${waited} s, the lease is ${LEASE} s`,
      );
      assert.equal(token.epoch, 2);

      await replacement.releasePartition(token);
      const next = runtimeOn(await ledger.reopen(), clock, { node: "singleton", leaseSeconds: LEASE });
      const before = clock.now();
      const nextToken = await next.acquirePartition(undefined, { wait: false });
      assert.equal(clock.now(), before, "no wait after a graceful release");
      assert.equal(nextToken.epoch, 3);
      assert.ok(nextToken.fencingToken > token.fencingToken, "fencing tokens increase with the epoch");
      await assert.rejects(replacement.checkAuthority(token), StaleAuthority);
      await next.checkAuthority(nextToken);
    },
  );

  story(
    "RUN-023 17: a commit under a superseded epoch is refused with StaleAuthority; the current owner proceeds",
    async (ledger, clock) => {
      const stale = runtimeOn(ledger.store, clock, { node: "sink", leaseSeconds: LEASE });
      const staleToken = await stale.acquirePartition();
      await stale.recordTerminator("cam", 0, "eos", 3);
      clock.advance(LEASE);
      const owner = runtimeOn(await ledger.reopen(), clock, { node: "sink", leaseSeconds: LEASE });
      const token = await owner.acquirePartition(undefined, { wait: false });
      assert.equal(token.epoch, 2, "a lapsed lease is taken at once");

      await assert.rejects(stale.checkAuthority(staleToken), StaleAuthority);
      await assert.rejects(stale.commitCompletion("cam", staleToken), StaleAuthority);
      await assert.rejects(stale.commitCompletion("cam"), StaleAuthority, "the held token fences too");
      await assert.rejects(stale.renewPartition(staleToken), StaleAuthority);
      await assert.rejects(stale.acquirePartition(undefined, { expectedEpoch: 1 }), StaleAuthority);
      if (provider.durable) {
        await assert.rejects(stale.checkpoint(encoder.encode("old"), { group: "g-1" }), StaleAuthority);
      }
      await stale.releasePartition(staleToken);
      await owner.checkAuthority(token);
      const receipt = await owner.commitCompletion("cam", token);
      assert.deepEqual(
        { partitionId: receipt.partitionId, epoch: receipt.epoch, finalSequence: receipt.finalSequence },
        { partitionId: "p0", epoch: 2, finalSequence: 3 },
      );
      assert.deepEqual([...await owner.completedParents()], ["cam"]);
      if (provider.durable) await owner.checkpoint(encoder.encode("new"), { group: "g-1" });
    },
  );

  story(
    "RUN-023 17: an owner paused between its authority check and its commit loses the commit to the new owner",
    async (ledger, clock) => {
      const stale = runtimeOn(ledger.store, clock, { node: "sink", leaseSeconds: LEASE });
      const staleToken = await stale.acquirePartition();
      clock.advance(LEASE);
      const owner = runtimeOn(await ledger.reopen(), clock, { node: "sink", leaseSeconds: LEASE });
      using schedule = new FaultSchedule({ [Barrier.ledgerWriteBefore]: nth(1, pause("stale-commit")) })
        .install();
      const commit = stale.commitCompletion("cam", staleToken);
      const refused = assert.rejects(commit, StaleAuthority);
      await schedule.untilFired(Barrier.ledgerWriteBefore);
      const token = await owner.acquirePartition(undefined, { wait: false });
      schedule.release("stale-commit");
      await refused;
      schedule.assertAllFired();
      assert.equal(token.epoch, 2);
      assert.deepEqual([...await owner.completedParents()], [], "the stale commit left nothing behind");
    },
  );

  story(
    "RUN-023 17: a checkpoint paused past a takeover never overwrites the new owner's checkpoint",
    async (ledger, clock) => {
      const stale = runtimeOn(ledger.store, clock, { node: "count", leaseSeconds: LEASE });
      await stale.acquirePartition();
      clock.advance(LEASE);
      const owner = runtimeOn(await ledger.reopen(), clock, { node: "count", leaseSeconds: LEASE });
      using schedule = new FaultSchedule({ [Barrier.ledgerWriteBefore]: nth(1, pause("stale-checkpoint")) })
        .install();
      const refused = assert.rejects(
        stale.checkpoint(encoder.encode("old"), { group: "g-1" }),
        StaleAuthority,
      );
      await schedule.untilFired(Barrier.ledgerWriteBefore);
      await owner.acquirePartition(undefined, { wait: false });
      await owner.checkpoint(encoder.encode("new"), { group: "g-2" });
      schedule.release("stale-checkpoint");
      await refused;
      schedule.assertAllFired();
      const restored = await owner.restoreCheckpoint();
      assert.deepEqual({ group: restored.replayPosition.group, epoch: restored.epoch }, {
        group: "g-2",
        epoch: 2,
      });
    },
    { durableOnly: true },
  );

  story(
    "RUN-023 17: a holder whose renewal hangs past its lease is superseded; the late renewal is refused",
    async (ledger, clock) => {
      const hung = runtimeOn(ledger.store, clock, { node: "sink", leaseSeconds: LEASE });
      const hungToken = await hung.acquirePartition();
      using schedule = new FaultSchedule({ [Barrier.partitionRenewBefore]: pause("hung-renewal") }).install();
      const renewal = assert.rejects(hung.renewPartition(hungToken), StaleAuthority);
      await schedule.untilFired(Barrier.partitionRenewBefore);
      clock.advance(LEASE);
      const owner = runtimeOn(await ledger.reopen(), clock, { node: "sink", leaseSeconds: LEASE });
      const token = await owner.acquirePartition(undefined, { wait: false });
      schedule.release("hung-renewal");
      await renewal;
      schedule.assertAllFired();
      await owner.checkAuthority(token);
    },
  );

  story(
    "ENV-5 18: pods without a replica id claim distinct slots, the extra pod is refused with " +
      "OwnershipConflict, and a crashed pod's replacement resumes its slot and its intents",
    async (ledger, clock) => {
      const claim = async () =>
        claimReplicaSlot({
          store: await ledger.reopen(),
          clock,
          flowId: FLOW,
          runId: RUN,
          node: "worker",
          nbTasks: 2,
          leaseSeconds: LEASE,
        });
      const pod1 = await claim();
      const pod2 = await claim();
      assert.deepEqual([pod1.replicaId, pod2.replicaId], [0, 1]);
      await pod2.intendPublication("pod2-output", "sha256:x");
      const keeper1 = keepAlive(pod1, held(pod1));
      const keeper2 = keepAlive(pod2, held(pod2));

      const started = clock.now();
      await assert.rejects(driveClock(clock, claim(), 3), OwnershipConflict);
      assert.ok(clock.now() - started <= 2 * LEASE, "each live slot is waited on for at most one lease");

      await keeper2.stop();
      const pod4 = await driveClock(clock, claim(), 2);
      assert.equal(pod4.replicaId, 1, "the replacement resumes the crashed pod's slot");
      assert.equal(pod4.heldPartition()?.epoch, 2);
      assert.deepEqual((await pod4.unresolvedPublications()).map((e) => e.publicationId), ["pod2-output"]);
      assert.deepEqual(await pod1.unresolvedPublications(), []);
      await keeper1.stop();
    },
  );

  story(
    "EOS-7 19: a duplicate EOS marker (redelivered after a crash past its recording) is refused and counted once",
    async (ledger, clock) => {
      const child = { node: "sink", parentReplicas: { cam: 1 } };
      const first = runtimeOn(ledger.store, clock, child);
      await first.recordReceived("cam", "sink-cam", "m1");
      await crashesAt(Barrier.terminatorRecordAfter, () => first.recordTerminator("cam", 0, "eos", 1));
      const replacement = runtimeOn(await ledger.reopen(), clock, child);
      assert.equal(await replacement.recordTerminator("cam", 0, "eos", 1), false);
      assert.equal(await replacement.recordTerminator("cam", 0, "eos", 5), false);
      assert.deepEqual(await replacement.terminators("cam"), [
        { parent: "cam", replicaId: 0, kind: "eos", seq: 1, error: null },
      ]);
      assert.equal(await replacement.completionState("cam", "sink-cam", DRAINED), CompletionState.complete);
    },
  );

  story(
    "EOS-7 20: no completion until every parent replica's terminator, received >= the sum of seqs, no " +
      "halves and nothing pending; an unobservable broker is unknown, never complete",
    async (ledger, clock) => {
      const runtime = runtimeOn(ledger.store, clock, { node: "sink", parentReplicas: { cam: 2 } });
      const state = (observation = DRAINED, halves = false) =>
        runtime.completionState("cam", "sink-cam", observation, halves);
      assert.equal(await state(), CompletionState.open);
      assert.equal(await runtime.recordTerminator("cam", 0, "eos", 2), true);
      assert.equal(await state(), CompletionState.open, "one replica's terminator is missing");
      assert.equal(await runtime.recordTerminator("cam", 1, "eos", 1), true);
      assert.equal(await state(), CompletionState.draining, "nothing received of 3");
      await runtime.recordReceived("cam", "sink-cam", "m1");
      await runtime.recordReceived("cam", "sink-cam", "m2");
      {
        using schedule = new FaultSchedule({ [Barrier.ledgerWriteAfter]: dropResponse() }).install();
        await assert.rejects(runtime.recordReceived("cam", "sink-cam", "m3"), UnobservableState);
        schedule.assertAllFired();
      }
      assert.equal(
        await runtime.recordReceived("cam", "sink-cam", "m3"),
        false,
        "the lost receipt's write held",
      );
      assert.equal(await runtime.recordReceived("cam", "sink-cam", "m1"), false, "a redelivery counts once");
      assert.equal(await runtime.receivedCount("cam", "sink-cam"), 3);
      assert.equal(await state(DRAINED, true), CompletionState.draining, "a join half is held");
      assert.equal(await state(known<PendingCounts>([0, 1])), CompletionState.draining);
      assert.equal(await state(known<PendingCounts>([1, 0])), CompletionState.draining);
      assert.equal(await state(BROKER_SILENT), CompletionState.unknown);
      assert.equal(await state(), CompletionState.complete);
      assert.equal((await runtime.commitCompletion("cam")).finalSequence, 3);
      assert.deepEqual([...await runtime.completedParents()], ["cam"]);
    },
  );

  story(
    "ABORT-3 21: an ABORT outranks a sibling replica's EOS, and carries its origin error to a replacement",
    async (ledger, clock) => {
      const child = { node: "sink", parentReplicas: { cam: 2 } };
      const runtime = runtimeOn(ledger.store, clock, child);
      const origin = { code: "VF_DEVICE", message: "GPU fell off the bus", exit_code: 4 };
      await runtime.recordTerminator("cam", 0, "eos", 5);
      await runtime.recordTerminator("cam", 1, "abort", 2, origin);
      const replacement = runtimeOn(await ledger.reopen(), clock, child);
      assert.deepEqual(Object.fromEntries(await replacement.abortedParents()), { cam: origin });
      const state = (observation = DRAINED) => replacement.completionState("cam", "sink-cam", observation);
      assert.equal(await state(), CompletionState.aborted, "short of the seqs, yet aborted once drained");
      assert.equal(await state(known<PendingCounts>([2, 0])), CompletionState.draining);
      assert.equal(await state(BROKER_SILENT), CompletionState.unknown);
    },
  );

  story(
    "DELIV-15 26: a dead letter the broker refused stays a pending handoff (unresolved meanwhile) and is " +
      "republished under the same id after a restart",
    async (ledger, clock) => {
      const recordId = dlqMessageId(FLOW, RUN, "detect", 42);
      const headers = { "Nats-Msg-Id": recordId, "VF-Error": "VF_POISON_DECODE" };
      const raw = encoder.encode("original envelope bytes");
      const publishDeadLetter = async () => void await barrier(Barrier.dlqPublishBefore, { id: recordId });
      const first = runtimeOn(ledger.store, clock, { node: "detect" });
      {
        using schedule = new FaultSchedule({
          [Barrier.dlqPublishBefore]: raiseTyped("VF_BROKER_UNAVAILABLE", "the DLQ stream is unreachable"),
        }).install();
        for (let attempt = 0; attempt < 2; attempt++) {
          await assert.rejects(publishDeadLetter(), BrokerUnavailable);
          await first.recordPendingHandoff(recordId, headers, raw);
        }
        schedule.assertAllFired();
      }
      assert.equal((await first.pendingHandoffs()).length, 1, "unresolved while the handoff is pending");

      const replacement = runtimeOn(await ledger.reopen(), clock, { node: "detect" });
      const [handoff, ...more] = await replacement.pendingHandoffs();
      assert.equal(more.length, 0);
      assert.deepEqual(
        { ...handoff, raw: [...handoff.raw] },
        { recordId, headers, raw: [...raw], attempts: 2 },
      );
      await publishDeadLetter();
      await replacement.clearPendingHandoff(handoff.recordId);
      assert.deepEqual(await replacement.pendingHandoffs(), []);
    },
  );

  story(
    "DELIV-15 27: a terminal settlement needs a durable record reference; one the log does not hold is refused",
    async (ledger, clock) => {
      const runtime = runtimeOn(ledger.store, clock, { node: "detect" });
      const record = { message_id: "m-9", code: "VF_POISON", reason: "dlq off" };
      const reference = await runtime.recordTerminal(record);
      const replacement = runtimeOn(await ledger.reopen(), clock, { node: "detect" });
      assert.deepEqual(await replacement.requireTerminalRecord(reference), record);
      const otherNode = runtimeOn(await ledger.reopen(), clock, { node: "sink" });
      for (const forged of ["", "terminal#1", reference.replace("#1", "#2"), reference.replace("#1", "#0")]) {
        await assert.rejects(replacement.requireTerminalRecord(forged), ResourceUnavailable, forged);
      }
      await assert.rejects(otherNode.requireTerminalRecord(reference), ResourceUnavailable);
      {
        using schedule = new FaultSchedule({ [Barrier.ledgerWriteAfter]: dropResponse() }).install();
        await assert.rejects(runtime.recordTerminal({ message_id: "m-10" }), UnobservableState);
        schedule.assertAllFired();
      }
      assert.deepEqual(await replacement.terminalEntries(), [record, { message_id: "m-10" }]);
    },
  );

  story(
    "D11: failed attempts count against the budget across a restart; a worker_fatal failure never counts",
    async (ledger, clock) => {
      const runtime = runtimeOn(ledger.store, clock, { node: "detect" });
      assert.equal(await runtime.attemptsFor("m1"), 0);
      assert.equal(await runtime.recordAttempt("m1", "transient"), 1);
      assert.equal(await runtime.recordAttempt("m1", "worker_fatal"), 1);
      const replacement = runtimeOn(await ledger.reopen(), clock, { node: "detect", replicaId: 1 });
      assert.equal(await replacement.recordAttempt("m1", "poison"), 2);
      assert.equal(await runtime.attemptsFor("m1"), 2);
      assert.equal(await runtime.attemptsFor("m2"), 0);
    },
  );

  story(
    "a replica's death with a message inside its node counts as one of its attempts, read back with how it died until a failed attempt supersedes it",
    async (ledger, clock) => {
      const supervisor = runtimeOn(ledger.store, clock, { node: "detect" });
      assert.equal(await supervisor.replicaDeathOf("m1"), null);
      assert.equal(await supervisor.recordAttempt("m1", "transient"), 1);
      assert.equal(await supervisor.replicaDeathOf("m1"), null, "a failed attempt is no death");
      assert.equal(await supervisor.recordReplicaDeath("m1", "stalled", "VF_PROGRESS_STALLED: wedged"), 2);
      const replacement = runtimeOn(await ledger.reopen(), clock, { node: "detect", replicaId: 1 });
      assert.deepEqual(await replacement.replicaDeathOf("m1"), {
        count: 2,
        death: "stalled",
        cause: "VF_PROGRESS_STALLED: wedged",
      });
      assert.equal(await replacement.recordReplicaDeath("m1", "crashed", "VF_WORKER_FATAL: exit 9"), 3);
      assert.equal((await replacement.replicaDeathOf("m1"))?.death, "crashed");
      assert.equal(await replacement.attemptsFor("m1"), 3);
      assert.equal(await replacement.recordAttempt("m1", "transient"), 4);
      assert.equal(await replacement.replicaDeathOf("m1"), null, "the last attempt counted was a failure");
    },
  );

  story(
    "RUN-017: an effect marker is seen for its retention, by a replacement too, and may be marked again after",
    async (ledger, clock) => {
      const sink = runtimeOn(ledger.store, clock, { node: "sink" });
      assert.equal(await sink.markEffect("vf-idem-1", 60), true);
      assert.equal(await sink.markEffect("vf-idem-1", 60), false);
      const replacement = runtimeOn(await ledger.reopen(), clock, { node: "sink" });
      assert.equal(await replacement.effectSeen("vf-idem-1"), true);
      assert.equal(await replacement.effectSeen("vf-idem-2"), false);
      clock.advance(60);
      assert.equal(await replacement.effectSeen("vf-idem-1"), false);
      assert.equal(await replacement.markEffect("vf-idem-1", 60), true);
    },
  );

  story(
    "RUN-003/RUN-022 36: a checkpoint and its output commit in one write; after a crash past the commit the " +
      "covered group's redelivery is acked without re-apply",
    async (ledger, clock) => {
      const first = runtimeOn(ledger.store, clock, { node: "count" });
      await first.acquirePartition();
      await first.intendPublication("out-1", "sha256:1");
      await first.resolvePublication("out-1", accepted("out-1", 1, false, "memory"));
      await crashesAt(
        Barrier.checkpointCommitAfter,
        () => first.checkpoint(encoder.encode("n=1"), { group: "g-1", output: "out-1" }),
      );
      const replacement = runtimeOn(await ledger.reopen(), clock, { node: "count" });
      await assertRestores(replacement, "n=1", { group: "g-1", output: "out-1" });
      assert.deepEqual(await replacement.checkpointCoverage("g-1"), { kind: "covered", output: "out-1" });
      assert.deepEqual(await replacement.checkpointCoverage("g-2"), { kind: "uncovered" });
    },
    { durableOnly: true },
  );

  story(
    "RUN-003 36: a crash while the checkpoint is written leaves the previous one whole: the group is re-applied",
    async (ledger, clock) => {
      const first = runtimeOn(ledger.store, clock, { node: "count" });
      await first.checkpoint(encoder.encode("n=1"), { group: "g-1", output: "out-1" });
      await crashesAt(
        provider.midWriteBarrier ? Barrier.ledgerWriteMid : Barrier.ledgerWriteBefore,
        () => first.checkpoint(encoder.encode("n=2"), { group: "g-2", output: "out-2" }),
      );
      const replacement = runtimeOn(await ledger.reopen(), clock, { node: "count" });
      await assertRestores(replacement, "n=1", { group: "g-1", output: "out-1" });
      assert.deepEqual(await replacement.checkpointCoverage("g-2"), { kind: "uncovered" });
    },
    { durableOnly: true },
  );

  story(
    "RUN-003 36: a covered group whose committed output is unconfirmed waits for that output's reconciliation",
    async (ledger, clock) => {
      const runtime = runtimeOn(ledger.store, clock, { node: "count" });
      await runtime.intendPublication("out-1", "sha256:1");
      await runtime.resolvePublication("out-1", publicationUnknown("out-1", "deadline expired"));
      await runtime.checkpoint(encoder.encode("n=1"), { group: "g-1", output: "out-1" });
      assert.deepEqual(await runtime.checkpointCoverage("g-1"), {
        kind: "covered_unconfirmed",
        output: "out-1",
      });
      await runtime.resolvePublication("out-1", accepted("out-1", 4, true, "memory"));
      assert.deepEqual(await runtime.checkpointCoverage("g-1"), { kind: "covered", output: "out-1" });
    },
    { durableOnly: true },
  );

  story("RUN-022 37: a checkpoint is accepted only on a durable ledger", async (ledger, clock) => {
    const runtime = runtimeOn(ledger.store, clock, { node: "count" });
    assert.equal(await runtime.durableShared(), provider.durable);
    const attempt = runtime.checkpoint(encoder.encode("n=1"), { group: "g-1" });
    if (provider.durable) {
      assert.equal(typeof await attempt, "string");
      assert.deepEqual((await runtime.restoreCheckpoint()).replayPosition, { group: "g-1" });
    } else {
      await assert.rejects(attempt, CapabilityError);
      assert.deepEqual(await runtime.restoreCheckpoint(), {
        state: null,
        replayPosition: {},
        epoch: 0,
        version: null,
      });
    }
  });

  story(
    "MSGID-6 38: a replayable source restarts at its last accepted offset + 1 and re-mints identical ids",
    async (ledger, clock) => {
      const first = runtimeOn(ledger.store, clock, { node: "clip" });
      await first.checkpoint(new Uint8Array(), { offset: 41 });
      await crashesAt(
        Barrier.checkpointCommitAfter,
        () => first.checkpoint(new Uint8Array(), { offset: 42 }),
      );
      const replacement = runtimeOn(await ledger.reopen(), clock, { node: "clip" });
      const { replayPosition } = await replacement.restoreCheckpoint();
      const resumeAt = (replayPosition.offset as number) + 1;
      assert.equal(resumeAt, 43);
      assert.equal(replayableTraceId("clip", resumeAt), "clip:43");
    },
    { durableOnly: true },
  );

  story(
    "MSGID-5 38: every process of a live source mints its ids in a capture epoch of its own",
    async (ledger, clock) => {
      const first = runtimeOn(ledger.store, clock, { node: "cam" });
      const epoch = await first.sourceEpoch();
      assert.equal(await first.sourceEpoch(), epoch, "one epoch per process");
      const replacement = runtimeOn(await ledger.reopen(), clock, { node: "cam" });
      const next = await replacement.sourceEpoch();
      assert.notEqual(next, epoch);
      assert.notEqual(sourceEpochTraceId("cam", next, 1), sourceEpochTraceId("cam", epoch, 1));
      const sibling = runtimeOn(await ledger.reopen(), clock, { node: "cam", replicaId: 1 });
      assert.equal(await sibling.sourceEpoch(), "1", "replicas count their epochs apart");
    },
  );
}
