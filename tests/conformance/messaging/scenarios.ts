/**
 * The MessagingBackend contract's fault stories (SPEC-MAP section 5: 2, 5, 6, 7, 13, 26, 27, 28, 29, 30,
 * 31, 49 and the shared credit of STREAM-15), written once against the contract and run against every
 * provider: `memory_test.ts` today, a NATS provider later, without changing a scenario. Each test is named
 * "<provider> <REQ-ID> <story>: <behaviour>"; a story the spec gives no requirement id is labelled by the
 * spec text it comes from in brackets. Faults are driven through the barriers of `faults.ts` and time
 * through the provider's clock; a scheduled fault that never fired fails the test (assertAllFired).
 *
 * A randomized run interleaves publish, retry, receive by competing and partitioned replicas, settle
 * (current and stale tokens), renew and lease expiry, and checks every step against an independent model:
 * no accepted message vanishes (each ends settled or unresolved), none is stored twice within the dedup
 * window, attempts grow by one up to max_deliver, a stale token never settles, and the broker's counters
 * match the model's at every observation.
 *
 * @module
 */

import assert from "node:assert/strict";
import { BrokerUnavailable, ConfigError } from "../../../src/core/errors.ts";
import type { Clock } from "../../../src/backends/clock.ts";
import {
  Barrier,
  dropResponse,
  type FaultAction,
  FaultSchedule,
  nth,
  pause,
  raiseTyped,
} from "../../../src/backends/faults.ts";
import { ownerLabels } from "../../../src/backends/identity.ts";
import {
  type ChannelId,
  channelId,
  type ChannelSpec,
  channelSpec,
  completed,
  creditRequest,
  type Delivery,
  type DeliveryToken,
  type Envelope,
  envelope,
  MessageKind,
  type MessagingBackend,
  Overflow,
  retry,
  type SubscriptionId,
  subscriptionId,
  type SubscriptionKind,
  type SubscriptionObservation,
  type SubscriptionSpec,
  subscriptionSpec,
  type Terminal,
  terminal,
} from "../../../src/backends/messaging.ts";
import { streamNameFor } from "../../../src/backends/names.ts";
import { type Observation, requireKnown } from "../../../src/backends/outcomes.ts";
import { type MessagingProfile, Retention } from "../../../src/backends/capabilities.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

/** What a scenario asks of a fresh backend. */
export interface MessagingHarnessOptions {
  /** Model Core NATS: no retention, no leases (story 30). */
  readonly coreOnly: boolean;
  /** The most leased bytes the client holds before it stops receiving (RUN-025); null: unbounded. */
  readonly byteBudget: number | null;
}

/** A fresh backend and the time it runs on. */
export interface MessagingHarness {
  readonly backend: MessagingBackend;
  /** The backend's clock (what deadlines are read from). */
  readonly clock: Clock;
  /** The backend's monotonic time. */
  now(): number;
  /** Moves the backend's time forward by `seconds`, letting everything due run. */
  advance(seconds: number): Promise<void>;
  /** Releases whatever the backend holds. */
  dispose(): Promise<void>;
}

/** A MessagingBackend implementation under test. */
export interface MessagingProvider {
  /** Prefixes every test name. */
  readonly name: string;
  /** Whether it can model Core NATS (story 30 runs only then). */
  readonly coreOnly: boolean;
  /** The core-only client queue bound its core backends apply. */
  readonly clientQueueLimit: number;
  /** Whether it accepts a byte budget (story 49 runs only then). */
  readonly byteBudget: boolean;
  /**
   * Whether its time is simulated, so `advance` moves it at once: the randomized interleavings advance
   * hundreds of seconds of lease expiry per run, which a real server spends on the wall clock.
   */
  readonly simulatedTime: boolean;
  /**
   * The duplicate window of the channels whose window's end a story reaches (120 s by default; a provider
   * on a real server shortens it so the story waits seconds, not minutes).
   */
  readonly dedupWindowSeconds: number;
  /**
   * Whether credit is a reservation: while it is held, a publication outside it finds no room (memory,
   * embedded). JetStream keeps none: its adapter grants from the stream's observed room.
   */
  readonly creditReserves: boolean;
  /**
   * Whether a channel's byte limit counts envelope sizes exactly. JetStream's `max_bytes` counts each
   * stored record's subject, headers and overhead beside the body, so a limit in envelope bytes is not one
   * the server applies.
   */
  readonly exactByteLimits: boolean;
  /**
   * Whether two channels whose broker names collide (run `r` node `x-n`, run `r-x` node `n`) can both
   * exist. On JetStream they are one stream name, which the identity check refuses before provisioning.
   */
  readonly collidingChannelNames: boolean;
  create(options: MessagingHarnessOptions): Promise<MessagingHarness>;
}

type Needs = "retained" | "core" | "budget";
/** A provider capability a story needs beyond its {@link Needs}. */
type Requirement = "simulatedTime" | "exactByteLimits" | "collidingChannelNames";
type Scenario = readonly [
  name: string,
  needs: Needs,
  run: (h: MessagingHarness, p: MessagingProvider) => Promise<void>,
  requires?: readonly Requirement[],
];

/** Why a story needing `requirement` is ignored for a provider that lacks it. */
const LACKING: Readonly<Record<Requirement, string>> = {
  simulatedTime: "needs simulated time: it advances hundreds of seconds of lease expiry",
  exactByteLimits:
    "needs byte limits in envelope bytes: the broker also counts subjects, headers and overhead",
  collidingChannelNames: "needs two channels of one broker name: the identity check refuses that pair",
};

const FLOW = "flow-A";
const RUN = "run-1";
const BIG = 1 << 30;
const DEDUP_SECONDS = 120;
/** The byte budget story 49's backends get. */
const BUDGET = 250;

/** A schedule installed for the scope of `using`. */
function faults(actions: Readonly<Record<string, FaultAction>>): FaultSchedule {
  return new FaultSchedule(actions).install();
}

interface ChannelOptions {
  readonly retention?: Retention;
  readonly profile?: MessagingProfile;
  readonly maxMsgs?: number;
  readonly maxBytes?: number | null;
  readonly overflow?: Overflow;
  readonly required?: readonly SubscriptionId[];
  readonly perSubjectLimits?: boolean;
  readonly runId?: string;
  readonly generation?: string;
  readonly dedupWindowSeconds?: number;
}

function channel(node: string, options: ChannelOptions = {}): ChannelSpec {
  const runId = options.runId ?? RUN;
  const retention = options.retention ?? Retention.interest;
  return channelSpec({
    id: channelId(FLOW, runId, node),
    profile: options.profile ?? (retention === Retention.interest ? "reliable_work" : "live_latest"),
    retention,
    maxMsgs: options.maxMsgs ?? 10_000,
    maxBytes: options.maxBytes ?? null,
    maxAgeSeconds: null,
    overflow: options.overflow ?? (retention === Retention.interest ? Overflow.reject : Overflow.evictOldest),
    dedupWindowSeconds: options.dedupWindowSeconds ?? DEDUP_SECONDS,
    replicas: 1,
    persistence: false,
    requiredSubscriptions: options.required ?? [],
    ownerLabels: ownerLabels(FLOW, runId, node, "stream", options.generation ?? "g1"),
    perSubjectLimits: options.perSubjectLimits ?? false,
  });
}

interface SubscriptionOptions {
  readonly partition?: number | null;
  readonly kind?: SubscriptionKind;
  readonly instance?: string | null;
  readonly ackWaitSeconds?: number;
  readonly maxDeliver?: number;
  readonly itemCredit?: number;
}

function subscription(
  channel: ChannelId,
  consumer: string,
  options: SubscriptionOptions = {},
): SubscriptionSpec {
  const partition = options.partition ?? null;
  return subscriptionSpec({
    id: subscriptionId(channel, consumer, { partition, kind: options.kind, instance: options.instance }),
    competing: partition === null,
    ackWaitSeconds: options.ackWaitSeconds ?? 30,
    maxDeliver: options.maxDeliver ?? 4,
    itemCredit: options.itemCredit ?? 8,
    byteCredit: BIG,
  });
}

function publication(
  channel: ChannelId,
  publicationId: string,
  kind: MessageKind = MessageKind.data,
  size = 1,
): Envelope {
  return envelope({
    channel,
    publicationId,
    eventId: publicationId,
    body: new Uint8Array(size),
    schemaVersion: 4,
    kind,
  });
}

async function provision(
  h: MessagingHarness,
  spec: ChannelSpec,
  subs: readonly SubscriptionSpec[],
): Promise<void> {
  await h.backend.ensureChannel(spec, `ensure-${spec.id.runId}-${spec.id.node}`);
  for (const sub of subs) await h.backend.ensureSubscription(sub, `bind-${sub.id.consumerNode}`);
}

/** An interest channel "cam" with one required consumer, bound: the shape most stories start from. */
async function workChannel(
  h: MessagingHarness,
  consumer: string,
  options: SubscriptionOptions = {},
  channelOptions: ChannelOptions = {},
): Promise<{ spec: ChannelSpec; sub: SubscriptionSpec }> {
  const spec = channel("cam", {
    ...channelOptions,
    required: [subscriptionId(channelId(FLOW, RUN, "cam"), consumer)],
  });
  const sub = subscription(spec.id, consumer, options);
  await provision(h, spec, [sub]);
  return { spec, sub };
}

async function publishAccepted(h: MessagingHarness, env: Envelope): Promise<number> {
  const outcome = await h.backend.publish(env, h.now() + 5);
  assert.equal(outcome.kind, "accepted", `publish ${env.publicationId}: ${JSON.stringify(outcome)}`);
  assert.ok(outcome.kind === "accepted" && outcome.sequence !== null);
  return outcome.sequence;
}

/** Whatever is deliverable right now (a deadline of now never waits). */
function receiveNow(h: MessagingHarness, sub: SubscriptionId, credit = 64): Promise<readonly Delivery[]> {
  return h.backend.receive(sub, credit, BIG, h.now());
}

async function counts(h: MessagingHarness, sub: SubscriptionId): Promise<SubscriptionObservation> {
  return requireKnown(await h.backend.observeSubscription(sub), `subscription ${sub.consumerNode}`);
}

async function retained(h: MessagingHarness, channel: ChannelId): Promise<number> {
  return requireKnown(await h.backend.observeChannel(channel), `channel ${channel.node}`).messages;
}

/** Waits (real time, bounded) for work the backend finishes off the caller's turn. */
async function eventually(check: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  assert.fail(`${what} never happened`);
}

function assertUnknown<T>(observation: Observation<T>, what: string): void {
  assert.equal(observation.kind, "unknown", `${what} must be Unknown, got ${JSON.stringify(observation)}`);
}

/** A rejecting interest channel "cam" of `maxMsgs` (and `maxBytes`) with one required consumer "sink", bound. */
async function boundedChannel(
  h: MessagingHarness,
  maxMsgs: number,
  maxBytes: number | null = null,
): Promise<{ spec: ChannelSpec; sink: SubscriptionSpec }> {
  const spec = channel("cam", {
    maxMsgs,
    maxBytes,
    required: [subscriptionId(channelId(FLOW, RUN, "cam"), "sink")],
  });
  const sink = subscription(spec.id, "sink", { itemCredit: 64 });
  await provision(h, spec, [sink]);
  return { spec, sink };
}

async function credit(
  h: MessagingHarness,
  channel: ChannelId,
  items: number,
  bytes: number,
  minBytes: number,
  deadline = h.now(),
) {
  return requireKnown(
    await h.backend.reserveCredit(channel, creditRequest(items, bytes, minBytes), deadline),
    `credit on ${channel.node}`,
  );
}

const SCENARIOS: readonly Scenario[] = [
  [
    "[flow control by credit] a grant is the room beside what is stored; publications within it are " +
    "accepted and nothing else fits; a request waits for a consumer's settle, and a deadline ends it with none",
    "retained",
    async (h, p) => {
      const { spec, sink } = await boundedChannel(h, 4);
      await publishAccepted(h, publication(spec.id, "a"));
      assert.deepEqual(await credit(h, spec.id, 10, 100, 1), { items: 3, bytes: null }, "3 of 4 are free");
      assert.deepEqual(await credit(h, spec.id, 10, 100, 1), { items: 0, bytes: 0 }, "nothing more is free");
      if (p.creditReserves) {
        const eos = await h.backend.publish(publication(spec.id, "end", MessageKind.eos), h.now() + 5);
        assert.ok(eos.kind === "rejected" && eos.retryable, "a publication without credit finds no room");
      }
      const batch = await h.backend.publishBatch(
        [publication(spec.id, "b"), publication(spec.id, "c"), publication(spec.id, "d")],
        h.now() + 5,
      );
      assert.deepEqual(batch.map((o) => o.kind), ["accepted", "accepted", "accepted"], "within the credit");
      const past = await h.backend.publish(publication(spec.id, "e"), h.now() + 5);
      assert.ok(past.kind === "rejected" && past.retryable, "the credit is used up and the channel full");

      const expiring = h.backend.reserveCredit(spec.id, creditRequest(2, 100, 1), h.now() + 2);
      await h.advance(3);
      assert.deepEqual(requireKnown(await expiring, "expired request"), { items: 0, bytes: 0 });

      const waiting = h.backend.reserveCredit(spec.id, creditRequest(2, 100, 1), h.now() + 10);
      const [first] = await receiveNow(h, sink.id, 1);
      assert.equal((await h.backend.settle(first.token, completed(), "s-a")).kind, "settle_confirmed");
      assert.deepEqual(requireKnown(await waiting, "granted request"), { items: 1, bytes: null });
      await publishAccepted(h, publication(spec.id, "e"));
    },
  ],
  [
    "[flow control by credit] bytes: a grant never goes below the asked minimum and no publication within " +
    "it is refused; released credit is room for anyone; an evicting channel grants at once, a missing one is " +
    "Unknown and a minimum the channel could never hold is no grant",
    "retained",
    async (h) => {
      const { spec } = await boundedChannel(h, 100, 100);
      await publishAccepted(h, publication(spec.id, "a", MessageKind.data, 30));
      assert.deepEqual(await credit(h, spec.id, 10, 50, 10), { items: 10, bytes: 50 });
      assert.deepEqual(await credit(h, spec.id, 10, 50, 30), { items: 0, bytes: 0 }, "20 bytes are free");
      await publishAccepted(h, publication(spec.id, "b", MessageKind.data, 40));
      await publishAccepted(h, publication(spec.id, "c", MessageKind.data, 30));
      const over = await h.backend.publish(publication(spec.id, "d", MessageKind.data, 1), h.now() + 5);
      assert.ok(over.kind === "rejected" && over.retryable, "100 of 100 bytes are stored");
      assert.deepEqual(await credit(h, spec.id, 1, 200, 101), { items: 0, bytes: 0 }, "never fits");

      const other = channel("other", { maxMsgs: 100, maxBytes: 100, overflow: Overflow.reject });
      await provision(h, other, []);
      assert.deepEqual(await credit(h, other.id, 5, 80, 1), { items: 5, bytes: 80 });
      h.backend.releaseCredit(other.id);
      assert.deepEqual(
        await credit(h, other.id, 5, 100, 1),
        { items: 5, bytes: 100 },
        "released, free again",
      );

      const live = channel("live", { retention: Retention.limits, maxMsgs: 2 });
      await provision(h, live, []);
      assert.deepEqual(await credit(h, live.id, 64, 1000, 1), { items: 64, bytes: null }, "never refuses");
      assertUnknown(
        await h.backend.reserveCredit(channelId(FLOW, RUN, "nowhere"), creditRequest(1, 1, 1), h.now()),
        "credit on a missing channel",
      );
    },
    ["exactByteLimits"],
  ],
  [
    "[calls that carry many] a publish batch answers each entry in order: accepted, a duplicate, and behind " +
    "an entry refused for room the channel's later entries refused too; a lost receipt makes that entry " +
    "Unknown, never the batch accepted",
    "retained",
    async (h) => {
      const { spec, sink } = await boundedChannel(h, 100, 100);
      const first = await h.backend.publishBatch(
        [
          publication(spec.id, "a", MessageKind.data, 30),
          publication(spec.id, "b", MessageKind.data, 30),
          publication(spec.id, "a", MessageKind.data, 30),
          publication(spec.id, "c", MessageKind.data, 50),
          publication(spec.id, "d", MessageKind.data, 10),
        ],
        h.now() + 5,
      );
      assert.deepEqual(
        first.map((o) => o.kind === "accepted" && o.duplicate ? "duplicate" : o.kind),
        ["accepted", "accepted", "duplicate", "rejected", "rejected"],
      );
      assert.deepEqual(first.map((o) => o.publicationId), ["a", "b", "a", "c", "d"]);
      assert.ok(first[4].kind === "rejected" && first[4].retryable, "d would fit, but c is ahead of it");
      assert.equal(await retained(h, spec.id), 2);
      for (const delivery of await receiveNow(h, sink.id)) {
        await h.backend.settle(delivery.token, completed(), `s-${delivery.token.messageId}`);
      }
      const again = await h.backend.publishBatch(
        [publication(spec.id, "c", MessageKind.data, 50), publication(spec.id, "d", MessageKind.data, 10)],
        h.now() + 5,
      );
      assert.deepEqual(
        again.map((o) => o.kind),
        ["accepted", "accepted"],
        "the refused tail, once there is room",
      );

      using schedule = faults({ [Barrier.messagePublishAfter]: nth(2, dropResponse()) });
      const second = await h.backend.publishBatch(
        [publication(spec.id, "e"), publication(spec.id, "f"), publication(spec.id, "g")],
        h.now() + 5,
      );
      assert.deepEqual(second.map((o) => o.kind), ["accepted", "publication_unknown", "accepted"]);
      assert.equal(await retained(h, spec.id), 5, "the entry whose receipt was lost was stored");
      assert.deepEqual((await receiveNow(h, sink.id)).map((d) => d.token.messageId), [
        "c",
        "d",
        "e",
        "f",
        "g",
      ]);
      schedule.assertAllFired();
    },
    ["exactByteLimits"],
  ],
  [
    "[calls that carry many] a settle batch answers each entry in order: confirmed, or stale for a retired " +
    "token; a lost confirmation is SettleUnknown for that entry alone; a malformed entry refuses the whole " +
    "batch before any is settled (DELIV-15)",
    "retained",
    async (h) => {
      const { spec, sink } = await boundedChannel(h, 100);
      for (const id of ["a", "b", "c", "d", "e"]) await publishAccepted(h, publication(spec.id, id));
      const [a, b, c, d, e] = await receiveNow(h, sink.id);
      const unreferenced = { kind: "terminal", recordRef: "" } as Terminal;
      await assert.rejects(
        h.backend.settleBatch([
          { token: a.token, outcome: completed(), settlementId: "s-a" },
          { token: b.token, outcome: unreferenced, settlementId: "s-b" },
        ]),
        ConfigError,
      );
      assert.equal((await counts(h, sink.id)).leased, 5, "nothing of the refused batch was settled");
      assert.equal(h.backend.supersede(b.token), true);
      const settled = await h.backend.settleBatch([
        { token: a.token, outcome: completed(), settlementId: "s-a" },
        { token: b.token, outcome: completed(), settlementId: "s-b" },
        { token: c.token, outcome: retry(), settlementId: "s-c" },
      ]);
      assert.deepEqual(settled.map((o) => o.kind), ["settle_confirmed", "settle_stale", "settle_confirmed"]);
      assert.deepEqual(settled.map((o) => o.token.messageId), ["a", "b", "c"]);

      using schedule = faults({ [Barrier.messageSettleAfter]: nth(1, dropResponse()) });
      const lost = await h.backend.settleBatch([
        { token: d.token, outcome: completed(), settlementId: "s-d" },
        { token: e.token, outcome: completed(), settlementId: "s-e" },
      ]);
      assert.deepEqual(lost.map((o) => o.kind), ["settle_unknown", "settle_confirmed"]);
      schedule.assertAllFired();
    },
  ],
  [
    "MSG-013 5: a publication held past its deadline is PublicationUnknown; it is stored late, observed as " +
    "one copy inside the dedup window and Unresolvable past it",
    "retained",
    async (h, p) => {
      const window = p.dedupWindowSeconds;
      const { spec, sub: sink } = await workChannel(h, "sink", {}, { dedupWindowSeconds: window });
      using schedule = faults({ [Barrier.messagePublishBefore]: pause("accept") });
      const env = publication(spec.id, "pub-1");
      const pending = h.backend.publish(env, h.now() + 2);
      await schedule.untilFired(Barrier.messagePublishBefore);
      await h.advance(3);
      assert.equal(
        (await pending).kind,
        "publication_unknown",
        "a deadline that passed while held is unknown",
      );
      schedule.release("accept");
      await eventually(async () => await retained(h, spec.id) === 1, "the late store");
      const observed = await h.backend.observePublication(env);
      assert.equal(observed.kind, "accepted");
      assert.ok(
        observed.kind === "accepted" && observed.duplicate,
        "within the window: found, not stored again",
      );
      assert.equal(await retained(h, spec.id), 1, "one copy");
      const deliveries = await receiveNow(h, sink.id);
      assert.deepEqual(deliveries.map((d) => d.token.messageId), ["pub-1"]);
      await h.advance(window + 1);
      assert.equal((await h.backend.observePublication(env)).kind, "publication_unresolvable");
      schedule.assertAllFired();
    },
  ],
  [
    "MSG-013 5: a lost receipt is PublicationUnknown, never Rejected; the retry under the same id is a " +
    "duplicate of the one stored copy",
    "retained",
    async (h) => {
      const { spec, sub: sink } = await workChannel(h, "sink");
      using schedule = faults({ [Barrier.messagePublishAfter]: nth(1, dropResponse()) });
      const env = publication(spec.id, "pub-1");
      assert.equal((await h.backend.publish(env, h.now() + 5)).kind, "publication_unknown");
      const retried = await h.backend.publish(env, h.now() + 5);
      assert.ok(retried.kind === "accepted" && retried.duplicate, `the retry: ${JSON.stringify(retried)}`);
      assert.equal(await retained(h, spec.id), 1);
      assert.equal((await receiveNow(h, sink.id)).length, 1);
      schedule.assertAllFired();
    },
  ],
  [
    "MSG-014: a publication no channel captures is Rejected and not retryable; a full rejecting channel " +
    "refuses retryably and counts the refusal",
    "retained",
    async (h) => {
      const spec = channel("cam", {
        maxMsgs: 2,
        required: [subscriptionId(channelId(FLOW, RUN, "cam"), "sink")],
      });
      const sink = subscription(spec.id, "sink");
      await provision(h, spec, [sink]);
      await publishAccepted(h, publication(spec.id, "a"));
      await publishAccepted(h, publication(spec.id, "b"));
      const full = await h.backend.publish(publication(spec.id, "c"), h.now() + 5);
      assert.ok(full.kind === "rejected" && full.retryable, `a full channel: ${JSON.stringify(full)}`);
      assert.equal((await counts(h, sink.id)).rejectedPublications, 1);
      const nowhere = await h.backend.publish(publication(channelId(FLOW, RUN, "ghost"), "d"), h.now() + 5);
      assert.ok(nowhere.kind === "rejected" && !nowhere.retryable, `no channel: ${JSON.stringify(nowhere)}`);
    },
  ],
  [
    "MSG-011 6: a redelivery supersedes the earlier token: settling it is SettleStale without reaching the " +
    "broker, and the current token still settles",
    "retained",
    async (h) => {
      const { spec, sub: sink } = await workChannel(h, "sink", { ackWaitSeconds: 10 });
      await publishAccepted(h, publication(spec.id, "pub-1"));
      const [first] = await receiveNow(h, sink.id);
      await h.advance(11);
      const [second] = await receiveNow(h, sink.id);
      assert.equal(
        second.token.attempt,
        first.token.attempt + 1,
        "the lapsed lease redelivered with attempt + 1",
      );
      using schedule = faults({ [Barrier.messageSettleAfter]: dropResponse() });
      const stale = await h.backend.settle(first.token, terminal("dlq:stale"), "settle-stale");
      assert.equal(stale.kind, "settle_stale");
      assert.ok(stale.kind === "settle_stale" && stale.currentAttempt === second.token.attempt);
      assert.equal(
        schedule.fired()[Barrier.messageSettleAfter],
        undefined,
        "the stale settle reached the broker",
      );
      assert.equal((await counts(h, sink.id)).leased, 1, "the stale Terminal decided nothing");
      const current = await h.backend.settle(second.token, completed(), "settle-current");
      assert.equal(
        current.kind,
        "settle_unknown",
        "the current token reached the broker (its receipt dropped)",
      );
      schedule.assertAllFired();
    },
  ],
  [
    "MSG-011 6: a token its receiver retired is live no longer: settling it is SettleStale, and its lease " +
    "still lapses into a redelivery",
    "retained",
    async (h) => {
      const { spec, sub: sink } = await workChannel(h, "sink", { ackWaitSeconds: 10 });
      await publishAccepted(h, publication(spec.id, "pub-1"));
      const [delivery] = await receiveNow(h, sink.id);
      assert.equal(h.backend.supersede(delivery.token), true, "a live token retires");
      assert.equal(h.backend.supersede(delivery.token), false, "a retired token is not live");
      assert.equal((await h.backend.settle(delivery.token, completed(), "s-1")).kind, "settle_stale");
      await h.advance(11);
      const [again] = await receiveNow(h, sink.id);
      assert.equal(again.token.attempt, delivery.token.attempt + 1);
      assert.equal((await h.backend.settle(again.token, completed(), "s-2")).kind, "settle_confirmed");
    },
  ],
  [
    "MSG-012 7: an observation that could not be made is Unknown, never zero; once the broker answers, the " +
    "real counts come back",
    "retained",
    async (h) => {
      const { spec, sub: sink } = await workChannel(h, "sink");
      await publishAccepted(h, publication(spec.id, "a"));
      await publishAccepted(h, publication(spec.id, "b"));
      {
        using schedule = faults({ [Barrier.brokerObserveAfter]: dropResponse() });
        assertUnknown(await h.backend.observeSubscription(sink.id), "pending");
        assertUnknown(await h.backend.observeChannel(spec.id), "the channel");
        assertUnknown(await h.backend.observeAckFloor(sink.id), "the ack floor");
        schedule.assertAllFired();
      }
      const pending = await counts(h, sink.id);
      assert.equal(pending.available, 2);
      assert.equal(await retained(h, spec.id), 2);
      assert.equal(requireKnown(await h.backend.observeAckFloor(sink.id), "ack floor"), 0);
    },
  ],
  [
    "PAY-004 2: a settlement whose confirmation is lost is SettleUnknown, never confirmed",
    "retained",
    async (h) => {
      const { spec, sub: sink } = await workChannel(h, "sink", { ackWaitSeconds: 10 });
      await publishAccepted(h, publication(spec.id, "pub-1"));
      const [delivery] = await receiveNow(h, sink.id);
      using schedule = faults({ [Barrier.messageSettleAfter]: dropResponse() });
      const outcome = await h.backend.settle(delivery.token, completed(), "s-1");
      assert.equal(outcome.kind, "settle_unknown");
      schedule.assertAllFired();
      await h.advance(11);
      const after = await counts(h, sink.id);
      const redelivered = await receiveNow(h, sink.id);
      assert.ok(
        (after.available === 0 && after.leased === 0 && redelivered.length === 0) ||
          redelivered.map((d) => d.token.messageId).join() === "pub-1",
        "the message is either settled or redelivered, never lost in between",
      );
    },
  ],
  [
    "MSG-012 29: an expired lease redelivers with attempt + 1 up to max_deliver; past it the message is " +
    "unresolved: retained, undeliverable, never 0 pending",
    "retained",
    async (h) => {
      const { spec, sub: sink } = await workChannel(h, "sink", { ackWaitSeconds: 5, maxDeliver: 3 });
      await publishAccepted(h, publication(spec.id, "pub-1"));
      for (let attempt = 1; attempt <= 3; attempt++) {
        const deliveries = await receiveNow(h, sink.id);
        assert.deepEqual(deliveries.map((d) => d.token.attempt), [attempt]);
        await h.advance(6);
      }
      assert.equal((await receiveNow(h, sink.id)).length, 0, "no fourth attempt");
      const observed = await counts(h, sink.id);
      assert.deepEqual(
        [observed.available, observed.leased, observed.unresolved],
        [0, 0, 1],
        "unresolved, not zero pending",
      );
      assert.equal(await retained(h, spec.id), 1, "still retained");
      assert.equal(requireKnown(await h.backend.observeAckFloor(sink.id), "ack floor"), 0, "not settled");
    },
  ],
  [
    "MSG-012 29: a retry of the last permitted attempt leaves the message unresolved; its current token " +
    "still terminates it against a durable record",
    "retained",
    async (h) => {
      const { spec, sub: sink } = await workChannel(h, "sink", { maxDeliver: 1 });
      await publishAccepted(h, publication(spec.id, "pub-1"));
      const [delivery] = await receiveNow(h, sink.id);
      assert.equal((await h.backend.settle(delivery.token, retry(), "s-1")).kind, "settle_confirmed");
      assert.equal((await counts(h, sink.id)).unresolved, 1);
      assert.equal((await receiveNow(h, sink.id)).length, 0);
      const ended = await h.backend.settle(delivery.token, terminal("dlq:flow-A:run-1:cam:1"), "s-2");
      assert.equal(ended.kind, "settle_confirmed");
      assert.equal((await counts(h, sink.id)).unresolved, 0);
      assert.equal(await retained(h, spec.id), 0, "an interest channel lets it go once nobody owes it");
    },
  ],
  [
    "BLOB-14 28: a full limits channel evicts its oldest message, records a drop for each subscription that " +
    "had not settled it, and first_seq moves past it",
    "retained",
    async (h) => {
      const spec = channel("cam", { retention: Retention.limits, maxMsgs: 2 });
      const fast = subscription(spec.id, "fast");
      const slow = subscription(spec.id, "slow");
      await provision(h, spec, [fast, slow]);
      const first = await publishAccepted(h, publication(spec.id, "m1"));
      const second = await publishAccepted(h, publication(spec.id, "m2"));
      for (const delivery of await receiveNow(h, fast.id, 1)) {
        await h.backend.settle(delivery.token, completed(), "s-1");
      }
      await publishAccepted(h, publication(spec.id, "m3"));
      assert.equal((await counts(h, fast.id)).dropped, 0, "settled before the eviction: nothing lost");
      assert.equal((await counts(h, slow.id)).dropped, 1, "never settled: a recorded drop");
      const range = requireKnown(await h.backend.observeChannel(spec.id), "channel");
      assert.equal(range.firstSeq, second, `m1 (seq ${first}) was evicted`);
      assert.deepEqual((await receiveNow(h, slow.id)).map((d) => d.token.messageId), ["m2", "m3"]);
    },
  ],
  [
    "BLOB-14 28: data and EOS share the run's slot, so a terminator evicts data, unless per_subject_limits",
    "retained",
    async (h) => {
      for (const perSubjectLimits of [false, true]) {
        const spec = channel(`cam-${perSubjectLimits}`, {
          retention: Retention.limits,
          maxMsgs: 1,
          perSubjectLimits,
        });
        const data = subscription(spec.id, "child");
        const eos = subscription(spec.id, "child", { kind: MessageKind.eos, instance: "i-1" });
        await provision(h, spec, [data, eos]);
        await publishAccepted(h, publication(spec.id, "d1"));
        await publishAccepted(h, publication(spec.id, "eos-r0", MessageKind.eos));
        const dataDropped = (await counts(h, data.id)).dropped;
        assert.equal(dataDropped, perSubjectLimits ? 0 : 1, `per_subject_limits=${perSubjectLimits}`);
        assert.equal(await retained(h, spec.id), perSubjectLimits ? 2 : 1);
        assert.deepEqual((await receiveNow(h, eos.id)).map((d) => d.token.messageId), ["eos-r0"]);
        assert.deepEqual(
          (await receiveNow(h, data.id)).map((d) => d.token.messageId),
          perSubjectLimits ? ["d1"] : [],
          "a data subscription never receives the terminator",
        );
      }
    },
  ],
  [
    "DELIV-8 28: a dead letter addressed by the origin's channel never occupies, evicts or fills the run's slot",
    "retained",
    async (h) => {
      const evicting = channel("evicting", { retention: Retention.limits, maxMsgs: 1 });
      const rejecting = channel("rejecting", {
        retention: Retention.limits,
        maxMsgs: 1,
        overflow: Overflow.reject,
      });
      for (const spec of [evicting, rejecting]) {
        const sink = subscription(spec.id, "sink");
        await provision(h, spec, [sink]);
        await publishAccepted(h, publication(spec.id, `${spec.id.node}-d1`));
        const letter = await h.backend.publish(
          publication(spec.id, `dlq:${FLOW}:${RUN}:${spec.id.node}:1`, MessageKind.dlq),
          h.now() + 5,
        );
        assert.equal(letter.kind, "accepted", `${spec.id.node}: the dead letter is kept apart`);
        assert.equal(await retained(h, spec.id), 1, `${spec.id.node}: the slot holds the data message only`);
        assert.equal((await counts(h, sink.id)).dropped, 0, `${spec.id.node}: nothing was evicted for it`);
        assert.deepEqual(
          (await receiveNow(h, sink.id)).map((d) => d.token.messageId),
          [`${spec.id.node}-d1`],
          "a run subscription never receives dead letters",
        );
      }
    },
  ],
  [
    "DELIV-15 26: while its dead letter cannot be recorded a delivery is not terminated and shows as " +
    "unresolved; the dead letter republished under its id is stored once and then terminates it",
    "retained",
    async (h) => {
      const { spec, sub: sink } = await workChannel(h, "sink", { ackWaitSeconds: 10, maxDeliver: 1 });
      const seq = await publishAccepted(h, publication(spec.id, "poison"));
      const [delivery] = await receiveNow(h, sink.id);
      const letter = publication(spec.id, `dlq:${FLOW}:${RUN}:cam:${seq}`, MessageKind.dlq);
      {
        using schedule = faults({
          [Barrier.dlqPublishBefore]: nth(1, raiseTyped("VF_BROKER_UNAVAILABLE", "the DLQ stream is down")),
        });
        await assert.rejects(h.backend.publish(letter, h.now() + 5), BrokerUnavailable);
        schedule.assertAllFired();
      }
      await h.advance(11);
      const meanwhile = await counts(h, sink.id);
      assert.equal(meanwhile.unresolved, 1, "the handoff is pending: unresolved, not settled");
      const stored = await h.backend.publish(letter, h.now() + 5);
      assert.ok(
        stored.kind === "accepted" && !stored.duplicate,
        `after the restart: ${JSON.stringify(stored)}`,
      );
      const again = await h.backend.publish(letter, h.now() + 5);
      assert.ok(again.kind === "accepted" && again.duplicate, "the same id again: one copy");
      const record = `dlq:${stored.kind === "accepted" ? stored.sequence : "?"}`;
      assert.equal(
        (await h.backend.settle(delivery.token, terminal(record), "s-1")).kind,
        "settle_confirmed",
      );
      assert.equal((await counts(h, sink.id)).unresolved, 0);
    },
  ],
  [
    "DELIV-15 27: a terminal settlement without a durable record reference is refused and changes nothing",
    "retained",
    async (h) => {
      const { spec, sub: sink } = await workChannel(h, "sink");
      await publishAccepted(h, publication(spec.id, "pub-1"));
      const [delivery] = await receiveNow(h, sink.id);
      assert.throws(() => terminal(""), ConfigError);
      const unreferenced: Terminal = { kind: "terminal", recordRef: " " };
      await assert.rejects(h.backend.settle(delivery.token, unreferenced, "s-1"), ConfigError);
      assert.equal((await counts(h, sink.id)).leased, 1, "still leased, still owed");
    },
  ],
  [
    "[topology] 13: an anchor subscription retains an EOS published before any EOS consumer exists, and a " +
    "late consumer receives it; without the anchor it is not retained",
    "retained",
    async (h) => {
      for (const anchored of [true, false]) {
        const id = channelId(FLOW, RUN, `parent-${anchored}`);
        const anchor = subscriptionId(id, "child", { kind: MessageKind.eos, instance: "anchor" });
        const spec = channel(id.node, { required: anchored ? [anchor] : [] });
        await provision(h, spec, []);
        await publishAccepted(h, publication(id, `eos-${anchored}`, MessageKind.eos));
        const late = subscription(id, "child", { kind: MessageKind.eos, instance: "replica-0" });
        await h.backend.ensureSubscription(late, "bind-late");
        const seen = (await receiveNow(h, late.id)).map((d) => d.token.messageId);
        assert.deepEqual(seen, anchored ? [`eos-${anchored}`] : [], `anchored=${anchored}`);
      }
    },
  ],
  [
    "STREAM-15: competing replicas share their subscription's item credit, and one receive's bytes stop at " +
    "its byte credit, overshooting by one message at most",
    "retained",
    async (h) => {
      const { spec, sub: work } = await workChannel(h, "work", { itemCredit: 3 });
      for (let i = 0; i < 6; i++) {
        await publishAccepted(h, publication(spec.id, `m${i}`, MessageKind.data, 100));
      }
      const replicaA = await h.backend.receive(work.id, 8, BIG, h.now());
      const replicaB = await h.backend.receive(work.id, 8, BIG, h.now());
      assert.deepEqual([replicaA.length, replicaB.length], [3, 0], "three leased in all, whoever asks");
      await h.backend.settle(replicaA[0].token, completed(), "s-1");
      assert.equal((await h.backend.receive(work.id, 8, BIG, h.now())).length, 1, "one settled, one more");
      for (const delivery of [...replicaA.slice(1)]) await h.backend.settle(delivery.token, completed(), "s");
      const bounded = await h.backend.receive(work.id, 8, 150, h.now());
      assert.equal(
        bounded.length,
        2,
        "150 bytes of credit: the second 100-byte message overshoots, a third never",
      );
    },
  ],
  [
    "RUN-025 49: a full byte budget pauses receiving, the bytes held exceed it by one message at most, and " +
    "settling resumes it",
    "budget",
    async (h) => {
      const { spec, sub: work } = await workChannel(h, "work", { itemCredit: 100 });
      for (let i = 0; i < 10; i++) {
        await publishAccepted(h, publication(spec.id, `m${i}`, MessageKind.data, 100));
      }
      const held = [...await receiveNow(h, work.id, 10)];
      const bytes = held.reduce((sum, d) => sum + d.size, 0);
      assert.ok(bytes >= BUDGET && bytes - 100 < BUDGET, `${bytes} bytes held against a budget of ${BUDGET}`);
      assert.equal((await receiveNow(h, work.id, 10)).length, 0, "paused while the budget is full");
      await h.backend.settle(held[0].token, completed(), "s-1");
      await h.backend.settle(held[1].token, completed(), "s-2");
      const resumed = await receiveNow(h, work.id, 10);
      assert.ok(resumed.length >= 1, "settling made room");
      const after = held.slice(2).concat(resumed).reduce((sum, d) => sum + d.size, 0);
      assert.ok(after - 100 < BUDGET, `${after} bytes held after resuming`);
    },
  ],
  [
    "[core-only] 30: a subscriber attached after a publication gets nothing, and a slow consumer beyond its " +
    "client queue drops, every drop counted",
    "core",
    async (h, provider) => {
      const capabilities = await h.backend.capabilities();
      assert.deepEqual([capabilities.retainedBacklog, capabilities.recoverableDelivery], [false, false]);
      const spec = channel("cam", { retention: Retention.limits });
      const early = subscription(spec.id, "early");
      await provision(h, spec, [early]);
      const limit = provider.clientQueueLimit;
      for (let i = 0; i < limit + 5; i++) {
        assert.equal((await h.backend.publish(publication(spec.id, `m${i}`), h.now() + 5)).kind, "accepted");
      }
      const slow = await counts(h, early.id);
      assert.deepEqual([slow.available, slow.dropped], [limit, 5], "the queue bound, then drops");
      const late = subscription(spec.id, "late");
      await h.backend.ensureSubscription(late, "bind-late");
      assert.equal((await receiveNow(h, late.id)).length, 0, "nothing retained for a late subscriber");
      assert.equal((await receiveNow(h, early.id, limit + 5)).length, limit);
    },
  ],
  [
    "RFC-0006 31: teardown removes exactly the run's channels, never run r-x's nor the flow's dead letters; " +
    "a listing that failed removes nothing and is incomplete",
    "retained",
    async (h) => {
      const ours = channel("x-n", { runId: "r" });
      const theirs = channel("n", { runId: "r-x", retention: Retention.limits });
      assert.equal(streamNameFor(FLOW, "r", "x-n"), streamNameFor(FLOW, "r-x", "n"), "the names collide");
      await provision(h, ours, []);
      await provision(h, theirs, []);
      await publishAccepted(h, publication(theirs.id, "theirs-1"));
      const letter = publication(ours.id, `dlq:${FLOW}:r:x-n:1`, MessageKind.dlq);
      await publishAccepted(h, letter);
      {
        using schedule = faults({ [Barrier.brokerObserveAfter]: nth(1, dropResponse()) });
        const failed = await h.backend.close([ours.id], "g1");
        assert.equal(failed.complete, false);
        assert.deepEqual(failed.removed, []);
        assert.deepEqual(failed.remaining, [streamNameFor(FLOW, "r", "x-n")]);
        schedule.assertAllFired();
      }
      assert.equal((await h.backend.observeChannel(ours.id)).kind, "known", "nothing was deleted");
      const done = await h.backend.close([ours.id], "g1");
      assert.deepEqual([done.complete, done.removed, done.remaining], [true, [
        streamNameFor(FLOW, "r", "x-n"),
      ], []]);
      assert.equal((await h.backend.observeChannel(ours.id)).kind, "unknown", "ours is gone");
      assert.equal(await retained(h, theirs.id), 1, "r-x keeps its channel and its message");
      const kept = await h.backend.observePublication(letter);
      assert.ok(kept.kind === "accepted" && kept.duplicate, "the dead letter outlives the run's teardown");
    },
    ["collidingChannelNames"],
  ],
];

/** Runs `run` on a fresh harness and disposes it whatever happens. */
async function withHarness(
  provider: MessagingProvider,
  needs: Needs,
  run: (h: MessagingHarness, p: MessagingProvider) => Promise<void>,
): Promise<void> {
  const h = await provider.create({
    coreOnly: needs === "core",
    byteBudget: needs === "budget" ? BUDGET : null,
  });
  try {
    await run(h, provider);
  } finally {
    await h.dispose();
  }
}

/** What the model knows of one (subscription, message). */
interface Owed {
  attempt: number;
  /** Monotonic expiry of the current lease; null when not leased. */
  leaseUntil: number | null;
  settled: boolean;
  unresolved: boolean;
  /** Every token handed out for it, oldest first. */
  readonly tokens: DeliveryToken[];
}

/** How often the randomized runs met the paths worth meeting; a run that met none proves nothing. */
interface Coverage {
  duplicates: number;
  redeliveries: number;
  staleSettles: number;
  renewals: number;
  unresolved: number;
}

/**
 * One randomized interleaving against the model (see the module doc). Two logical consumers read one
 * interest channel: a competing one served by two replicas, and a per-replica one. Nothing is ever evicted
 * (the channel is large), so every accepted message must end settled or unresolved for each consumer.
 */
async function randomizedRun(provider: MessagingProvider, seed: number, coverage: Coverage): Promise<void> {
  const random = new SeededRandom(seed);
  const where = (step: number, what: string) => `seed ${seed}, step ${step}: ${what}`;
  const h = await provider.create({ coreOnly: false, byteBudget: null });
  try {
    const ackWait = 10;
    const maxDeliver = random.int(1, 4);
    const itemCredit = random.int(1, 4);
    const id = channelId(FLOW, RUN, "cam");
    const consumers = [
      subscription(id, "work", { ackWaitSeconds: ackWait, maxDeliver, itemCredit }),
      subscription(id, "audit", { partition: 0, ackWaitSeconds: ackWait, maxDeliver, itemCredit }),
    ];
    await provision(h, channel("cam", { required: consumers.map((c) => c.id) }), consumers);
    const seqOf = new Map<string, { seq: number; at: number }>();
    const owed = consumers.map(() => new Map<number, Owed>());
    let published = 0;
    const live = (step: number, c: number, seq: number): Owed => {
      const entry = owed[c].get(seq);
      assert.ok(entry !== undefined, where(step, `a delivery of unknown seq ${seq}`));
      return entry;
    };
    const expire = (now: number) => {
      for (const byConsumer of owed) {
        for (const entry of byConsumer.values()) {
          if (entry.leaseUntil !== null && entry.leaseUntil <= now) {
            entry.leaseUntil = null;
            if (entry.attempt >= maxDeliver) entry.unresolved = true;
          }
        }
      }
    };
    for (let step = 0; step < 160; step++) {
      const now = h.now();
      const op = random.int(0, 9);
      if (op <= 1) {
        const retryOld = seqOf.size > 0 && random.chance(0.3);
        const pubId = retryOld ? random.pick([...seqOf.keys()]) : `pub-${++published}`;
        const outcome = await h.backend.publish(publication(id, pubId), now + 5);
        assert.equal(outcome.kind, "accepted", where(step, `publish ${pubId}`));
        if (outcome.kind !== "accepted" || outcome.sequence === null) continue;
        const known = seqOf.get(pubId);
        if (known !== undefined && now - known.at < DEDUP_SECONDS) {
          assert.ok(
            outcome.duplicate && outcome.sequence === known.seq,
            where(step, `${pubId} stored twice`),
          );
          coverage.duplicates++;
        } else {
          assert.ok(!outcome.duplicate, where(step, `${pubId} is new`));
          seqOf.set(pubId, { seq: outcome.sequence, at: now });
          for (const byConsumer of owed) {
            byConsumer.set(outcome.sequence, {
              attempt: 0,
              leaseUntil: null,
              settled: false,
              unresolved: false,
              tokens: [],
            });
          }
        }
      } else if (op <= 4) {
        const c = random.int(0, consumers.length - 1);
        expire(now);
        const deliveries = await h.backend.receive(consumers[c].id, random.int(1, 5), BIG, now);
        for (const delivery of deliveries) {
          const entry = live(step, c, delivery.token.streamSequence as number);
          assert.ok(
            !entry.settled && !entry.unresolved,
            where(step, "a settled or unresolved message came back"),
          );
          assert.equal(entry.leaseUntil, null, where(step, "a message leased twice at once"));
          assert.equal(delivery.token.attempt, entry.attempt + 1, where(step, "attempts grow by one"));
          assert.ok(delivery.token.attempt <= maxDeliver, where(step, "past max_deliver"));
          if (delivery.token.attempt > 1) coverage.redeliveries++;
          entry.attempt = delivery.token.attempt;
          entry.leaseUntil = now + ackWait;
          entry.tokens.push(delivery.token);
        }
        const leased = [...owed[c].values()].filter((e) => e.leaseUntil !== null).length;
        assert.ok(leased <= itemCredit, where(step, `${leased} leased past the credit of ${itemCredit}`));
      } else if (op <= 6) {
        const c = random.int(0, consumers.length - 1);
        const held = [...owed[c].values()].filter((e) => e.tokens.length > 0);
        if (held.length === 0) continue;
        const entry = random.pick(held);
        const token = random.pick(entry.tokens);
        const decision = random.pick([completed(), retry(), terminal("dlq:record")]);
        expire(now);
        const outcome = await h.backend.settle(token, decision, `s-${step}`);
        const current = token.attempt === entry.attempt;
        if (!current) {
          assert.equal(outcome.kind, "settle_stale", where(step, "a superseded token settled"));
          coverage.staleSettles++;
          continue;
        }
        assert.equal(outcome.kind, "settle_confirmed", where(step, "a current token"));
        if (entry.settled) continue;
        if (decision.kind !== "retry") {
          entry.settled = true;
          entry.unresolved = false;
          entry.leaseUntil = null;
        } else if (entry.leaseUntil !== null) {
          entry.leaseUntil = null;
          if (entry.attempt >= maxDeliver) entry.unresolved = true;
        }
      } else if (op === 7) {
        const c = random.int(0, consumers.length - 1);
        const leased = [...owed[c].values()].filter((e) => e.leaseUntil !== null && e.leaseUntil > now);
        if (leased.length === 0) continue;
        const entry = random.pick(leased);
        const lease = await h.backend.renew(entry.tokens[entry.tokens.length - 1]);
        assert.ok(lease.renewed, where(step, `a live lease was not renewed: ${lease.reason}`));
        entry.leaseUntil = lease.expiresAt;
        coverage.renewals++;
      } else if (op === 8) {
        await h.advance(random.pick([1, 4, 9, 11, 30]));
      } else {
        expire(now);
        for (let c = 0; c < consumers.length; c++) {
          const observed = await counts(h, consumers[c].id);
          const entries = [...owed[c].values()];
          const model = {
            leased: entries.filter((e) => e.leaseUntil !== null).length,
            unresolved: entries.filter((e) => e.unresolved && !e.settled).length,
            available: entries.filter((e) => !e.settled && !e.unresolved && e.leaseUntil === null).length,
          };
          assert.deepEqual(
            { leased: observed.leased, unresolved: observed.unresolved, available: observed.available },
            model,
            where(step, `${consumers[c].id.consumerNode}'s counters`),
          );
          assert.equal(observed.dropped, 0, where(step, "nothing may be dropped from an interest channel"));
        }
      }
    }
    coverage.unresolved += await drain(h, consumers, owed, seed);
  } finally {
    await h.dispose();
  }
}

/**
 * Lets every lease lapse and settles all that comes back; then each message must be settled or unresolved.
 * Returns how many ended unresolved.
 */
async function drain(
  h: MessagingHarness,
  consumers: readonly SubscriptionSpec[],
  owed: readonly Map<number, Owed>[],
  seed: number,
): Promise<number> {
  let unresolved = 0;
  for (let round = 0; round < 16; round++) {
    await h.advance(31);
    for (let c = 0; c < consumers.length; c++) {
      for (
        let batch = await receiveNow(h, consumers[c].id);
        batch.length > 0;
        batch = await receiveNow(h, consumers[c].id)
      ) {
        for (const delivery of batch) {
          await h.backend.settle(delivery.token, completed(), "drain");
          const entry = owed[c].get(delivery.token.streamSequence as number);
          assert.ok(entry !== undefined && !entry.settled, `seed ${seed}: drained a settled message`);
          entry.settled = true;
        }
      }
    }
  }
  for (let c = 0; c < consumers.length; c++) {
    const observed = await counts(h, consumers[c].id);
    const open = [...owed[c].values()].filter((e) => !e.settled);
    assert.deepEqual(
      [observed.available, observed.leased, observed.unresolved],
      [0, 0, open.length],
      `seed ${seed}: every accepted message of ${consumers[c].id.consumerNode} is settled or unresolved`,
    );
    unresolved += open.length;
  }
  const stillOwed = new Set(
    owed.flatMap((byConsumer) => [...byConsumer].filter(([, entry]) => !entry.settled).map(([seq]) => seq)),
  );
  const channel = consumers[0].id.channel;
  assert.equal(
    await retained(h, channel),
    stillOwed.size,
    `seed ${seed}: retained exactly what is still owed`,
  );
  return unresolved;
}

/**
 * Registers every scenario `provider` can play as a Deno test, named "<provider> <REQ-ID> <story>:
 * <behaviour>", and the randomized interleaving run.
 */
export function messagingScenarios(provider: MessagingProvider): void {
  for (const [name, needs, run, requires = []] of SCENARIOS) {
    if (needs === "core" && !provider.coreOnly) continue;
    if (needs === "budget" && !provider.byteBudget) continue;
    const lacking = requires.find((requirement) => !provider[requirement]);
    Deno.test({
      name: `${provider.name} ${name}${lacking === undefined ? "" : ` [ignored: ${LACKING[lacking]}]`}`,
      ignore: lacking !== undefined,
      fn: () => withHarness(provider, needs, run),
    });
  }
  Deno.test({
    name: `${provider.name} MSG-011/MSG-012 randomized: no accepted message vanishes or is duplicated, and ` +
      `stale tokens never settle${provider.simulatedTime ? "" : ` [ignored: ${LACKING.simulatedTime}]`}`,
    ignore: !provider.simulatedTime,
    fn: async () => {
      const seed = testSeed();
      const coverage: Coverage = {
        duplicates: 0,
        redeliveries: 0,
        staleSettles: 0,
        renewals: 0,
        unresolved: 0,
      };
      for (let round = 0; round < 12; round++) await randomizedRun(provider, seed + round, coverage);
      for (const [path, hits] of Object.entries(coverage)) {
        assert.ok(
          hits > 0,
          `seed ${seed}: the interleavings never met ${path} (${JSON.stringify(coverage)})`,
        );
      }
    },
  });
}
