/**
 * Capability records, flow requirements and the composition planner, including the admission side of
 * the SPEC-MAP stories 12, 42, 43 and 44.
 */
import assert from "node:assert/strict";
import {
  ConfigError,
  type Diagnostic,
  IncompatibleProfile,
  UnobservableState,
} from "../../../src/core/errors.ts";
import {
  ADMISSION_TIMEOUT_ENV,
  admissionTimeoutFromEnv,
  combinedLimit,
  type Composition,
  defaultRequirements,
  FlowRequirements,
  graphLimitsFromEnv,
  kubernetesExecutionCapabilities,
  localExecutionCapabilities,
  MAX_CONSUMERS_ENV,
  MAX_STREAMS_ENV,
  type MessagingCapabilities,
  messagingCapabilities,
  MessagingProfile,
  type PayloadCapabilities,
  payloadCapabilities,
  planComposition,
  PROFILE_REQUESTS_ENV,
  profileForEdge,
  ProfileRequest,
  realtimeDefaultCapabilitiesNote,
  requestsEnv,
  requestsFromEnv,
  retentionShortfall,
  runtimeCapabilities,
  UnobservableComposition,
} from "../../../src/backends/capabilities.ts";
import { type AllocationCapabilities, allocationCapabilities } from "../../../src/backends/allocation.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { MemoryRuntimeStore } from "../../../src/backends/memory/runtime_store.ts";
import { known, unknown } from "../../../src/backends/outcomes.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const clock = new FakeClock();
const yes = known(true, clock);
const no = known(false, clock);

function jetstream(overrides: Partial<MessagingCapabilities> = {}): MessagingCapabilities {
  return messagingCapabilities({
    adapter: "jetstream",
    version: "2.10",
    retainedBacklog: true,
    recoverableDelivery: true,
    latestPerKey: true,
    dedupWindowSeconds: 120,
    publicationLedger: "window",
    replicationFactor: known(3, clock),
    persistentStorage: yes,
    maxPayloadBytes: known(8 << 20, clock),
    creditResizable: true,
    controlSharesDataSlot: false,
    ...overrides,
  });
}

const coreNats = () =>
  jetstream({
    adapter: "core-nats",
    retainedBacklog: false,
    recoverableDelivery: false,
    latestPerKey: false,
    dedupWindowSeconds: null,
    publicationLedger: "none",
  });

function redisPayload(overrides: Partial<PayloadCapabilities> = {}): PayloadCapabilities {
  return payloadCapabilities({
    adapter: "redis",
    durable: yes,
    evictable: no,
    atomicMultikey: yes,
    maxObjectBytes: 512 << 20,
    readerIdentities: true,
    persistentStorage: yes,
    ...overrides,
  }, clock);
}

const fileLedger = runtimeCapabilities("file", yes, true, true, true);

function gpuAllocator(overrides: Partial<AllocationCapabilities> = {}): AllocationCapabilities {
  return allocationCapabilities({
    adapter: "kubernetes",
    authority: "device-plugin",
    exclusiveDevice: true,
    isolatedMig: true,
    cooperativeSharing: false,
    memoryEnforcement: "scheduler",
    multiDevice: true,
    topologyVerification: false,
    elastic: false,
    admissionBoundary: false,
    versionMatrix: { version: "1.31", features: [] },
    ...overrides,
  });
}

const reliable = (channel: string, options = {}) => new ProfileRequest(channel, "reliable_work", options);

/** The diagnostics the planner raised, or fails the test when it admitted. */
function rejection(requirements: FlowRequirements, composition: Composition): {
  error: IncompatibleProfile | UnobservableComposition;
  messages: string[];
} {
  try {
    planComposition(requirements, composition);
  } catch (error) {
    if (error instanceof IncompatibleProfile || error instanceof UnobservableComposition) {
      return { error, messages: error.diagnostics.map((d: Diagnostic) => d.message) };
    }
    throw error;
  }
  assert.fail("the planner admitted a composition it should have rejected");
}

function hasMessage(messages: readonly string[], pattern: RegExp): void {
  assert.ok(
    messages.some((m) => pattern.test(m)),
    `no diagnostic matches ${pattern}:\n${messages.join("\n")}`,
  );
}

Deno.test("a profile request checks its profile and options and round-trips through its document", () => {
  const request = new ProfileRequest("camera", "live_latest", {
    latestPerKey: true,
    key: "cam",
    horizonSeconds: 60,
  });
  assert.deepEqual(request.toDict(), {
    channel: "camera",
    profile: "live_latest",
    options: { latest_per_key: true, horizon_seconds: 60, key: "cam" },
  });
  assert.deepEqual(ProfileRequest.fromDict(request.toDict()), request);
  assert.deepEqual(new ProfileRequest("a", "reliable_work").toDict(), {
    channel: "a",
    profile: "reliable_work",
  });
  assert.throws(() => new ProfileRequest("a", "exactly_once"), ConfigError);
  assert.throws(() => new ProfileRequest("", "live_latest"), ConfigError);
  assert.throws(() => new ProfileRequest("a", "live_latest", { horizonSeconds: -1 }), ConfigError);
  assert.throws(
    () => ProfileRequest.fromDict({ channel: "a", profile: "live_latest", options: { ttl: 1 } }),
    ConfigError,
  );
  assert.throws(
    () => ProfileRequest.fromDict({ channel: "a", profile: "live_latest", extra: 1 }),
    ConfigError,
  );
  assert.throws(() => ProfileRequest.fromDict("a"), ConfigError);
});

Deno.test("empty requirements serialize to nothing; set fields serialize in the spec's order and read back", () => {
  const empty = new FlowRequirements();
  assert.equal(empty.isEmpty(), true);
  assert.deepEqual(empty.toDict(), {});
  assert.deepEqual(FlowRequirements.fromDict(null), empty);
  const full = new FlowRequirements({
    profiles: [reliable("a", { horizonSeconds: 600 })],
    restartSafe: true,
    exactlyOnceEffects: ["sink"],
    resources: { detector: { sharing: "mig", memory_enforcement: "hardware", cpu: "2" } },
    priorityClass: "high",
    rolloutPolicy: "drain",
    toleratedFailures: 1,
    sinkGuarantees: { sink: "idempotent_key" },
    effectRetentionSeconds: 7200,
    replayHorizonSeconds: 3600,
    executionGroups: { fused: ["a", "b"] },
    batching: { detector: { max_batch: 8, max_wait_ms: 5 } },
  });
  const document = full.toDict();
  assert.deepEqual(Object.keys(document), [
    "profiles",
    "restart_safe",
    "exactly_once_effects",
    "resources",
    "priority_class",
    "rollout_policy",
    "tolerated_failures",
    "sink_guarantees",
    "effect_retention_seconds",
    "replay_horizon_seconds",
    "execution_groups",
    "batching",
  ]);
  const reread = FlowRequirements.fromDict(JSON.parse(JSON.stringify(document)));
  assert.deepEqual(reread.toDict(), document);
  assert.equal(reread.isEmpty(), false);
  assert.deepEqual(new FlowRequirements({ restartSafe: true }).toDict(), { restart_safe: true });
});

Deno.test("invalid requirements are refused with every problem in one ConfigError", () => {
  let error: unknown = null;
  try {
    new FlowRequirements({
      toleratedFailures: -1,
      resources: { n: { sharing: "shared-ish", gpu_flavour: "x" } },
      sinkGuarantees: { s: "exactly_once" },
      replayHorizonSeconds: -5,
    });
  } catch (caught) {
    error = caught;
  }
  if (!(error instanceof ConfigError)) throw new Error(`expected a ConfigError, got ${error}`);
  for (
    const part of [
      "tolerated_failures",
      "gpu_flavour",
      "resources.n.sharing",
      "sink_guarantees.s",
      "replay_horizon",
    ]
  ) {
    assert.ok(error.message.includes(part), `${part} missing from: ${error.message}`);
  }
  assert.throws(() => FlowRequirements.fromDict({ restart_safe: true, nonsense: 1 }), ConfigError);
  assert.throws(() => FlowRequirements.fromDict({ profiles: "reliable_work" }), ConfigError);
});

Deno.test("an edge's profile follows the flow type, and a consumer's delivery override flips its own inputs", () => {
  assert.equal(profileForEdge("batch", null), "reliable_work");
  assert.equal(profileForEdge("realtime", null), "live_latest");
  assert.equal(profileForEdge("realtime", { delivery: "at-least-once" }), "reliable_work");
  assert.equal(profileForEdge("batch", { delivery: "best-effort" }), "live_latest");
  assert.equal(profileForEdge("realtime", { on_error: "poison" }), "live_latest");
  assert.throws(() => profileForEdge("streaming", null), ConfigError);
  const specs = [
    { parents: [], delivery: null },
    { parents: ["camera"], delivery: null },
    { parents: ["camera", "detector"], delivery: { delivery: "at-least-once" } },
  ];
  const defaults = defaultRequirements("realtime", specs);
  assert.deepEqual(defaults.profiles.map((p) => [p.channel, p.profile]), [
    ["camera", "live_latest"],
    ["camera", "reliable_work"],
    ["detector", "reliable_work"],
  ]);
  assert.match(realtimeDefaultCapabilitiesNote("realtime"), /live_latest/);
  assert.match(realtimeDefaultCapabilitiesNote("batch"), /reliable_work/);
});

Deno.test("explicit requests travel in VF_PROFILE_REQUESTS_JSON only when there are any", () => {
  assert.deepEqual(requestsEnv([]), {});
  const explicit = [reliable("a"), new ProfileRequest("b", "live_latest", { latestPerKey: true })];
  const env = requestsEnv(explicit);
  assert.deepEqual(Object.keys(env), [PROFILE_REQUESTS_ENV]);
  assert.deepEqual(requestsFromEnv(env[PROFILE_REQUESTS_ENV]), explicit);
  assert.deepEqual(requestsFromEnv(undefined), []);
  assert.deepEqual(requestsFromEnv(""), []);
  assert.throws(() => requestsFromEnv("{not json"), ConfigError);
  assert.throws(() => requestsFromEnv('{"channel":"a"}'), ConfigError);
});

Deno.test("environment knobs: admission timeout, declared graph limits, and the tighter of two limits", () => {
  assert.equal(admissionTimeoutFromEnv(undefined), 60);
  assert.equal(admissionTimeoutFromEnv(" "), 60);
  assert.equal(admissionTimeoutFromEnv("2.5"), 2.5);
  for (const bad of ["0", "-3", "soon", "Infinity"]) {
    assert.throws(() => admissionTimeoutFromEnv(bad), ConfigError, `${ADMISSION_TIMEOUT_ENV}=${bad}`);
  }
  assert.deepEqual(graphLimitsFromEnv({}), [null, null]);
  assert.deepEqual(graphLimitsFromEnv({ [MAX_STREAMS_ENV]: "200", [MAX_CONSUMERS_ENV]: "900" }), [200, 900]);
  assert.throws(() => graphLimitsFromEnv({ [MAX_STREAMS_ENV]: "2.5" }), ConfigError);
  assert.throws(() => graphLimitsFromEnv({ [MAX_CONSUMERS_ENV]: "lots" }), ConfigError);
  assert.equal(combinedLimit(null, null), null);
  const limit = (account: number | null, declared: number | null) => {
    const out = combinedLimit(account === null ? null : known(account, clock), declared, clock);
    return out?.kind === "known" ? out.value : out;
  };
  assert.equal(limit(null, 50), 50);
  assert.equal(limit(-1, 50), 50, "-1 is unlimited");
  assert.equal(limit(-1, null), -1);
  assert.equal(limit(30, 50), 30);
  assert.equal(limit(80, 50), 50);
  const unread = unknown("auth", clock, "account info denied");
  assert.equal(combinedLimit(unread, 50)?.kind, "unknown", "an unread account limit may be tighter");
});

Deno.test("both shipped engines refuse fusion and batching; KEDA is advertised only when asked for", () => {
  for (const engine of [localExecutionCapabilities(), kubernetesExecutionCapabilities(true)]) {
    assert.equal(engine.executionGroups, false);
    assert.equal(engine.dynamicBatching, false);
  }
  assert.deepEqual(kubernetesExecutionCapabilities().autoscalingControllers, []);
  assert.deepEqual(kubernetesExecutionCapabilities(true).autoscalingControllers, ["keda"]);
  assert.deepEqual(localExecutionCapabilities().autoscalingControllers, []);
});

Deno.test("an admissible composition gets a profile and one retention class per channel, with notes", () => {
  const requirements = new FlowRequirements({
    profiles: [reliable("decoder"), new ProfileRequest("camera", "live_latest")],
    restartSafe: true,
  });
  const plan = planComposition(requirements, {
    messaging: jetstream(),
    payload: redisPayload(),
    runtime: fileLedger,
    payloadRefsInUse: true,
  });
  assert.deepEqual(plan.channelProfiles, { decoder: "reliable_work", camera: "live_latest" });
  assert.deepEqual(plan.channelRetention, { decoder: "interest", camera: "limits" });
  assert.equal(plan.restartSafe, true);
  assert.ok(plan.notes.length >= 2);
  assert.match(plan.render(), /channel decoder: reliable_work \(interest retention\)/);
  assert.match(plan.render(), /restart-safe: yes/);
});

Deno.test("story 42 (admission): reliable_work on a transport without retained backlog is refused by name", () => {
  const { error, messages } = rejection(new FlowRequirements({ profiles: [reliable("camera")] }), {
    messaging: coreNats(),
  });
  assert.ok(error instanceof IncompatibleProfile);
  assert.equal(error.exitCode, 2);
  hasMessage(messages, /channel camera requests reliable_work, but core-nats 2\.10 has no retained_backlog/);
  hasMessage(messages, /no recoverable_delivery/);
  assert.equal(error.diagnostics[0].node, "camera");
  assert.ok(
    planComposition(new FlowRequirements({ profiles: [new ProfileRequest("camera", "live_latest")] }), {
      messaging: coreNats(),
    }),
    "live_latest needs no retained backlog",
  );
});

Deno.test("every problem of one pass is listed at once, never one per retry", () => {
  const requirements = new FlowRequirements({
    profiles: [
      reliable("a"),
      new ProfileRequest("b", "durable_control"),
      new ProfileRequest("c", "replay_archive"),
      new ProfileRequest("d", "live_latest", { latestPerKey: true }),
    ],
    restartSafe: true,
    exactlyOnceEffects: ["sink"],
    executionGroups: { fused: ["a", "b"] },
    batching: { e: { max_batch: 4, max_wait_ms: 1 } },
    resources: { gpu_node: { sharing: "exclusive" } },
  });
  const { error, messages } = rejection(requirements, {
    messaging: coreNats(),
    execution: localExecutionCapabilities(),
    payloadRefsInUse: true,
  });
  assert.ok(error instanceof IncompatibleProfile);
  for (
    const pattern of [
      /no retained_backlog/,
      /no recoverable_delivery/,
      /no durable_control records \(MSG-018\)/,
      /durable_control\) needs a durable shared runtime store/,
      /keeps no archive \(MSG-024\)/,
      /no latest_per_key slots/,
      /restart_safe needs a durable shared runtime store/,
      /effect_guarantee at_least_once/,
      /execution group fused .* \(RUN-035\)/,
      /no dynamic batching \(RUN-036\)/,
      /no allocator is composed/,
      /no payload store is composed/,
    ]
  ) hasMessage(messages, pattern);
  assert.equal(messages.length, 12, messages.join("\n"));
  assert.match(error.render(), /\n {2}- error VF_INCOMPATIBLE_PROFILE a: /);
});

Deno.test("story 12 (admission): an evictable payload store is refused for reliable_work, fine for live_latest", () => {
  const evictable = redisPayload({ evictable: yes });
  const { messages } = rejection(new FlowRequirements({ profiles: [reliable("camera")] }), {
    messaging: jetstream(),
    payload: evictable,
    payloadRefsInUse: true,
  });
  hasMessage(
    messages,
    /channel camera \(reliable_work\) offloads payloads: store redis eviction policy.*evictable/,
  );
  const live = new FlowRequirements({ profiles: [new ProfileRequest("camera", "live_latest")] });
  planComposition(live, { messaging: jetstream(), payload: evictable, payloadRefsInUse: true });
  planComposition(new FlowRequirements({ profiles: [reliable("camera")] }), {
    messaging: jetstream(),
    payload: evictable,
    payloadRefsInUse: false,
  });
  const unread = rejection(new FlowRequirements({ profiles: [reliable("camera")] }), {
    messaging: jetstream(),
    payload: redisPayload({ durable: unknown("auth", clock, "CONFIG denied") }),
    payloadRefsInUse: true,
  });
  assert.ok(unread.error instanceof UnobservableState, "an unread durability is not a pass");
  hasMessage(unread.messages, /durability could not be observed \(unknown \(auth: CONFIG denied\)\)/);
});

Deno.test("story 43: tolerated failures need persistent storage and 2f+1 copies, read back; Unknown is unobservable", () => {
  const requirements = new FlowRequirements({ profiles: [reliable("camera")], toleratedFailures: 1 });
  const unread = rejection(requirements, {
    messaging: jetstream({ replicationFactor: unknown("timeout", clock, "stream info timed out") }),
  });
  assert.ok(unread.error instanceof UnobservableState);
  assert.ok(unread.error instanceof UnobservableComposition);
  assert.equal(unread.error.exitCode, 3);
  hasMessage(unread.messages, /MSG-021.*replication \(3 copies needed\) could not be observed/);
  const single = rejection(requirements, { messaging: jetstream({ replicationFactor: known(1, clock) }) });
  assert.ok(single.error instanceof IncompatibleProfile);
  hasMessage(single.messages, /keeps 1 stream copies; surviving 1 losses needs 3/);
  const ephemeral = rejection(requirements, { messaging: jetstream({ persistentStorage: no }) });
  hasMessage(ephemeral.messages, /persistent storage: streams do not outlive a broker pod/);
  planComposition(requirements, { messaging: jetstream() });
  const twoLosses = rejection(new FlowRequirements({ profiles: [reliable("a")], toleratedFailures: 2 }), {
    messaging: jetstream(),
  });
  hasMessage(twoLosses.messages, /needs 5/);
  const payloadPod = rejection(requirements, {
    messaging: jetstream(),
    payload: payloadCapabilities({
      adapter: "redis",
      durable: yes,
      evictable: no,
      atomicMultikey: yes,
      maxObjectBytes: null,
      readerIdentities: true,
    }, clock),
    payloadRefsInUse: true,
  });
  assert.ok(
    payloadPod.error instanceof UnobservableState,
    "an emptyDir cannot be told from a volume on the wire",
  );
  hasMessage(payloadPod.messages, /payload store redis persistent storage could not be observed/);
});

Deno.test("story 43: a payload TTL shorter than the horizon is refused unless obligations pin the object (PAY-009)", () => {
  const requirements = new FlowRequirements({ profiles: [reliable("camera", { horizonSeconds: 7200 })] });
  const base = { messaging: jetstream(), payload: redisPayload(), payloadRefsInUse: true };
  const { error, messages } = rejection(requirements, { ...base, payloadTtlSeconds: 3600 });
  assert.ok(error instanceof IncompatibleProfile);
  hasMessage(
    messages,
    /payload TTL 3600 s is shorter than the 7200 s horizon and no obligation pins the object \(PAY-009\)/,
  );
  planComposition(requirements, { ...base, payloadTtlSeconds: 3600, payloadObligations: true });
  planComposition(requirements, { ...base, payloadTtlSeconds: 7200 });
  planComposition(requirements, { ...base, payloadTtlSeconds: null });
  const archive = new FlowRequirements({
    profiles: [new ProfileRequest("camera", "replay_archive")],
    replayHorizonSeconds: 86400,
  });
  hasMessage(
    rejection(archive, { ...base, messaging: jetstream({ archive: true }), payloadTtlSeconds: 3600 })
      .messages,
    /86400 s horizon/,
  );
  assert.equal(retentionShortfall(10, 5, false), null);
  assert.equal(retentionShortfall(5, 10, true), null);
  assert.match(retentionShortfall(5, 10, false) ?? "", /PAY-009/);
});

Deno.test("story 44 (admission): restart_safe is refused on an unobservable, volatile or unshared ledger", async () => {
  const requirements = new FlowRequirements({ restartSafe: true });
  const base = { messaging: jetstream() };
  const redisDenied = runtimeCapabilities(
    "redis",
    unknown("auth", clock, "CONFIG GET denied"),
    true,
    true,
    true,
  );
  const denied = rejection(requirements, { ...base, runtime: redisDenied });
  assert.ok(denied.error instanceof UnobservableState);
  hasMessage(
    denied.messages,
    /restart_safe: runtime store redis durability could not be observed \(unknown \(auth/,
  );
  const memory = await new MemoryRuntimeStore(clock).capabilities();
  const volatile = rejection(requirements, { ...base, runtime: memory });
  assert.ok(volatile.error instanceof IncompatibleProfile);
  hasMessage(volatile.messages, /runtime store memory durability: the ledger does not survive its process/);
  hasMessage(volatile.messages, /not shared across processes/);
  hasMessage(volatile.messages, /does not keep join groups across restarts/);
  hasMessage(rejection(requirements, base).messages, /restart_safe needs a durable shared runtime store/);
  assert.equal(planComposition(requirements, { ...base, runtime: fileLedger }).restartSafe, true);
});

Deno.test("a channel asked for two profiles needs mixed retention, and is then served as the stronger", () => {
  const requirements = new FlowRequirements({
    profiles: [new ProfileRequest("camera", "live_latest"), reliable("camera")],
  });
  hasMessage(rejection(requirements, { messaging: jetstream() }).messages, /one retention class/);
  const plan = planComposition(requirements, { messaging: jetstream({ mixedRetentionPerChannel: true }) });
  assert.deepEqual(plan.channelProfiles, { camera: "reliable_work" });
  assert.ok(plan.notes.some((n) => /requested live_latest, reliable_work; served as reliable_work/.test(n)));
});

Deno.test("optional profiles are admitted only when the adapter advertises them", () => {
  const control = new FlowRequirements({ profiles: [new ProfileRequest("ctl", "durable_control")] });
  planComposition(control, { messaging: jetstream({ durableControl: true }), runtime: fileLedger });
  const archive = new FlowRequirements({ profiles: [new ProfileRequest("cam", "replay_archive")] });
  assert.deepEqual(planComposition(archive, { messaging: jetstream({ archive: true }) }).channelRetention, {
    cam: "archive",
  });
  const latest = new FlowRequirements({
    profiles: [new ProfileRequest("cam", "live_latest", { latestPerKey: true })],
  });
  planComposition(latest, { messaging: jetstream() });
});

Deno.test("exactly-once effects need an idempotent_key sink and markers kept past the replay horizon (RUN-017)", () => {
  const base = { messaging: jetstream() };
  const sink = (guarantee: string, retention: number | null) =>
    new FlowRequirements({
      exactlyOnceEffects: ["sink"],
      sinkGuarantees: { sink: guarantee },
      effectRetentionSeconds: retention,
      replayHorizonSeconds: 3600,
    });
  planComposition(sink("idempotent_key", 3600), base);
  hasMessage(
    rejection(sink("idempotent_key", 600), base).messages,
    /kept 600 s expire inside the 3600 s replay horizon/,
  );
  hasMessage(rejection(sink("idempotent_key", null), base).messages, /undeclared time/);
  hasMessage(
    rejection(sink("at_least_once", 3600), base).messages,
    /sink sink declares effect_guarantee at_least_once/,
  );
});

Deno.test("GPU resources are checked against what the allocator grants and enforces", () => {
  const ask = (resources: Record<string, string>) =>
    new FlowRequirements({ resources: { detector: resources } });
  const shareOnly = gpuAllocator({
    exclusiveDevice: false,
    cooperativeSharing: true,
    authority: "time-slicing",
  });
  hasMessage(
    rejection(ask({ sharing: "exclusive" }), { messaging: jetstream(), allocation: shareOnly }).messages,
    /node detector requests exclusive devices; allocator kubernetes \(authority time-slicing\) does not grant them/,
  );
  hasMessage(
    rejection(ask({ memory_enforcement: "hardware" }), { messaging: jetstream(), allocation: gpuAllocator() })
      .messages,
    /enforces it by scheduler/,
  );
  const single = gpuAllocator({ multiDevice: false });
  hasMessage(
    rejection(ask({ devices: "2" }), { messaging: jetstream(), allocation: single }).messages,
    /grants one/,
  );
  hasMessage(
    rejection(ask({ peer_access: "required", elasticity: "elastic" }), {
      messaging: jetstream(),
      allocation: gpuAllocator(),
    }).messages,
    /cannot verify topology/,
  );
  planComposition(ask({ sharing: "mig", memory_enforcement: "hardware" }), {
    messaging: jetstream(),
    allocation: gpuAllocator({ memoryEnforcement: "hardware" }),
  });
  planComposition(ask({ cpu: "2", memory: "4Gi" }), { messaging: jetstream() });
});

Deno.test("definite and unobservable problems together raise IncompatibleProfile carrying both", () => {
  const requirements = new FlowRequirements({ profiles: [reliable("camera")], restartSafe: true });
  const { error, messages } = rejection(requirements, {
    messaging: coreNats(),
    runtime: runtimeCapabilities("redis", unknown("auth", clock), true, true, true),
  });
  assert.ok(error instanceof IncompatibleProfile);
  assert.deepEqual(
    [...new Set(error.diagnostics.map((d) => d.code))].sort(),
    ["VF_INCOMPATIBLE_PROFILE", "VF_STATE_UNKNOWN"],
  );
  hasMessage(messages, /could not be observed/);
});

/** A random messaging record: each boolean guarantee and each observation drawn independently. */
function randomMessaging(random: SeededRandom): MessagingCapabilities {
  const observed = <T>(value: T) => random.chance(0.2) ? unknown("timeout", clock) : known(value, clock);
  return jetstream({
    retainedBacklog: random.chance(0.6),
    recoverableDelivery: random.chance(0.6),
    latestPerKey: random.chance(0.5),
    durableControl: random.chance(0.5),
    archive: random.chance(0.5),
    mixedRetentionPerChannel: random.chance(0.5),
    replicationFactor: observed(random.int(1, 5)),
    persistentStorage: observed(random.chance(0.6)),
  });
}

/** The same record with every guarantee granted: nothing can be missing from it. */
function strongest(m: MessagingCapabilities): MessagingCapabilities {
  return jetstream({
    ...m,
    retainedBacklog: true,
    recoverableDelivery: true,
    latestPerKey: true,
    durableControl: true,
    archive: true,
    mixedRetentionPerChannel: true,
    replicationFactor: known(9, clock),
    persistentStorage: yes,
  });
}

Deno.test("random compositions: admission never downgrades, and more capability never turns it into a rejection", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const channels = ["a", "b", "c"];
  for (let round = 0; round < 400; round++) {
    const profiles = Array.from(
      { length: random.int(1, 5) },
      () =>
        new ProfileRequest(random.pick(channels), random.pick(Object.values(MessagingProfile)), {
          latestPerKey: random.chance(0.3),
        }),
    );
    const requirements = new FlowRequirements({
      profiles,
      restartSafe: random.chance(0.3),
      toleratedFailures: random.int(0, 2),
    });
    const messaging = randomMessaging(random);
    const composition = { messaging, runtime: random.chance(0.5) ? fileLedger : null };
    const where = `seed ${seed} round ${round}: ${JSON.stringify(requirements.toDict())}`;
    let admitted = true;
    try {
      const plan = planComposition(requirements, composition);
      for (const [channel, served] of Object.entries(plan.channelProfiles)) {
        const asked = profiles.filter((p) => p.channel === channel).map((p) => p.profile);
        assert.ok(asked.includes(served), `${where}: ${channel} served as ${served}, asked ${asked}`);
      }
    } catch (error) {
      if (!(error instanceof IncompatibleProfile || error instanceof UnobservableComposition)) throw error;
      assert.ok(error.diagnostics.length > 0, where);
      admitted = false;
    }
    const upgraded = { messaging: strongest(messaging), runtime: fileLedger };
    planComposition(requirements, upgraded);
    if (admitted) {
      planComposition(new FlowRequirements({ profiles: profiles.slice(1) }), composition);
    }
  }
});
