/**
 * Capability records and the composition planner (spec backends.capabilities).
 *
 * A backend's name is not a guarantee: "JetStream" can be one server on an emptyDir or three replicas on
 * persistent disks; "Redis" an evictable cache or an append-only durable store; "GPU" a whole device, a
 * MIG slice or a time-share only the scheduler accounts for. So every adapter reports a capabilities
 * record, the flow states what it requires ({@link FlowRequirements}: profiles per channel, restart
 * safety, a fault model, exactly-once sinks, GPU resources), and {@link planComposition} compares the two
 * before a stream is provisioned, a worker starts or a label is written. What the composition cannot
 * meet is rejected with every problem listed at once, each naming the channel or node, the profile and
 * the missing guarantee; it is never quietly downgraded to what the backend does offer. A guarantee that
 * rests on something an adapter could not observe is rejected as unobservable: Unknown is not a pass.
 *
 * Messaging profiles (ARCHITECTURE §2):
 * - `live_latest`: bounded backlog and age, explicit drops, observable gaps; no offline replay promise.
 * - `reliable_work`: every accepted item stays recoverable for each required consumer until committed or
 *   durably failed; overflow backpressures or rejects, never evicts.
 * - `durable_control`: reconciled run state and durable terminal records across restarts.
 * - `replay_archive`: retention independent of working consumers, with payloads and provenance.
 *
 * {@link FlowRequirements} is deliberately not a field of NodeSpec: it travels as a side document
 * (`requirements`, emitted only when non-empty) and as environment variables set only when used.
 *
 * @example
 * ```ts
 * import { known } from "./outcomes.ts";
 * const requirements = new FlowRequirements({ profiles: [new ProfileRequest("camera", "reliable_work")] });
 * const coreNats = messagingCapabilities({
 *   adapter: "core-nats", version: "2.10", retainedBacklog: false, recoverableDelivery: false,
 *   latestPerKey: false, dedupWindowSeconds: null, publicationLedger: "none",
 *   replicationFactor: known(1), persistentStorage: known(false), maxPayloadBytes: known(1 << 20),
 *   creditResizable: false, controlSharesDataSlot: false,
 * });
 * try {
 *   planComposition(requirements, { messaging: coreNats });
 * } catch (error) {
 *   console.log((error as Error).name); // "IncompatibleProfile": no retained backlog for reliable_work
 * }
 * ```
 *
 * @module
 */

import type { NodeSpec } from "../core/compiler.ts";
import { AT_LEAST_ONCE, DeliveryPolicy } from "../core/delivery_policy.ts";
import { isRecord } from "../core/checks.ts";
import { secondsFromText, wholeNumberFromText } from "../core/variables.ts";
import { ConfigError, Diagnostic, IncompatibleProfile, UnobservableState } from "../core/errors.ts";
import { EffectGuarantee } from "../core/node.ts";
import {
  type AllocationCapabilities,
  Elasticity,
  enforcementSatisfies,
  MEMORY_ENFORCEMENTS,
  type MemoryEnforcement,
  REQUEST_SHARINGS,
  RequestSharing,
} from "./allocation.ts";
import { type Clock, systemClock } from "./clock.ts";
import { describeObservation, known, type Observation, type Unknown, unknown } from "./outcomes.ts";
import type { RuntimeCapabilities } from "./runtime_store.ts";

export type { RuntimeCapabilities } from "./runtime_store.ts";
export { runtimeCapabilities } from "./runtime_store.ts";
export { EffectGuarantee } from "../core/node.ts";

/** The four messaging profiles a channel can request. */
export const MessagingProfile = {
  liveLatest: "live_latest",
  reliableWork: "reliable_work",
  durableControl: "durable_control",
  replayArchive: "replay_archive",
} as const;
/** One of {@link MessagingProfile}. */
export type MessagingProfile = typeof MessagingProfile[keyof typeof MessagingProfile];
/** Every messaging profile. */
export const MESSAGING_PROFILES: readonly MessagingProfile[] = Object.values(MessagingProfile);

/**
 * The retention classes a channel compiles to; a channel has exactly one. `limits` keeps a bounded
 * backlog and drops by policy, `interest` keeps a message until every required consumer settled it,
 * `archive` keeps history for a horizon whatever the working consumers did.
 */
export const Retention = { limits: "limits", interest: "interest", archive: "archive" } as const;
/** One of {@link Retention}. */
export type Retention = typeof Retention[keyof typeof Retention];

/** The retention class each profile compiles to. */
export const PROFILE_RETENTION: Readonly<Record<MessagingProfile, Retention>> = Object.freeze({
  live_latest: Retention.limits,
  reliable_work: Retention.interest,
  durable_control: Retention.interest,
  replay_archive: Retention.archive,
});

/**
 * What a messaging backend can say afterwards about a publication whose receipt was lost: nothing
 * (`none`: only the runtime's own intent can reconcile it), or its fate within a dedup window (`window`).
 */
export const PublicationLedger = { none: "none", window: "window" } as const;
/** One of {@link PublicationLedger}. */
export type PublicationLedger = typeof PublicationLedger[keyof typeof PublicationLedger];

/** How long admission read-backs may take, connect included (`VF_ADMISSION_TIMEOUT_SECONDS`). */
export const ADMISSION_TIMEOUT_ENV = "VF_ADMISSION_TIMEOUT_SECONDS";
/** The admission read-back timeout when {@link ADMISSION_TIMEOUT_ENV} is unset, in seconds. */
export const DEFAULT_ADMISSION_TIMEOUT_SECONDS = 60;
/** The operator's declared supported number of streams (MSG-026). */
export const MAX_STREAMS_ENV = "VF_MAX_STREAMS";
/** The operator's declared supported number of consumers (MSG-026). */
export const MAX_CONSUMERS_ENV = "VF_MAX_CONSUMERS";
/** Per-parent replica counts (ENV-11), aligned with `VF_PARENT_NAMES`. */
export const PARENT_REPLICAS_ENV = "VF_PARENT_REPLICAS";
/** The operator's explicit channel profiles for a worker (`deploy --require-profile`; absent when none, D8). */
export const PROFILE_REQUESTS_ENV = "VF_PROFILE_REQUESTS_JSON";
/** The runtime store's URL (ENV-10): the ledger every worker of the run keeps its records in. */
export const RUNTIME_STORE_ENV = "VF_RUNTIME_STORE_URL";

/**
 * What a messaging adapter, as configured, can guarantee. Facts that depend on the deployed broker
 * (replication, storage, payload limit) are observations: an adapter that could not read them says so,
 * and the planner rejects a profile that depends on them.
 */
export interface MessagingCapabilities {
  readonly adapter: string;
  readonly version: string;
  /** Messages are retained for consumers that are slow or absent (false: Core NATS). */
  readonly retainedBacklog: boolean;
  /** A delivery that was not settled comes back (leases and redelivery). */
  readonly recoverableDelivery: boolean;
  /** Per-key latest-value slots. */
  readonly latestPerKey: boolean;
  /** The publication dedup window; null when there is none. */
  readonly dedupWindowSeconds: number | null;
  readonly publicationLedger: PublicationLedger;
  /** Stream copies, read back. */
  readonly replicationFactor: Observation<number>;
  /** Whether streams live on storage that outlives a broker pod, read back. */
  readonly persistentStorage: Observation<boolean>;
  readonly maxPayloadBytes: Observation<number>;
  readonly creditResizable: boolean;
  /** Control and EOS records share the data channel's retention slot. */
  readonly controlSharesDataSlot: boolean;
  /** Offers the durable_control profile (MSG-018). */
  readonly durableControl: boolean;
  /** Offers the replay_archive profile (MSG-024). */
  readonly archive: boolean;
  /** One channel can serve consumers under different retention classes. */
  readonly mixedRetentionPerChannel: boolean;
  /**
   * The largest graph supported, as streams and consumers (MSG-026): the account's limits read back
   * (-1 unlimited) capped by the operator's declaration ({@link combinedLimit}); null when none is declared.
   */
  readonly maxStreams: Observation<number> | null;
  readonly maxConsumers: Observation<number> | null;
}

/** The optional fields of {@link MessagingCapabilities} and their defaults. */
type MessagingOptional =
  | "durableControl"
  | "archive"
  | "mixedRetentionPerChannel"
  | "maxStreams"
  | "maxConsumers";

/** Constructs a frozen {@link MessagingCapabilities}; the optional profiles default to not offered. */
export function messagingCapabilities(
  init:
    & Omit<MessagingCapabilities, MessagingOptional>
    & Partial<Pick<MessagingCapabilities, MessagingOptional>>,
): MessagingCapabilities {
  return Object.freeze({
    durableControl: false,
    archive: false,
    mixedRetentionPerChannel: false,
    maxStreams: null,
    maxConsumers: null,
    ...init,
  });
}

/**
 * What a payload store can guarantee. `durable`: an accepted object outlives a restart of the store's
 * process and is never dropped while a reader holds it (what reliable_work asks). `persistentStorage`:
 * the data lives on a volume that outlives the store's pod (what tolerated_failures additionally asks);
 * the wire cannot tell the two apart, so a read-back may leave it Unknown. `referenceForwarding`: a stage
 * republishing an unchanged payload shares the object instead of writing a copy (PAY-017).
 */
export interface PayloadCapabilities {
  readonly adapter: string;
  readonly durable: Observation<boolean>;
  readonly evictable: Observation<boolean>;
  readonly atomicMultikey: Observation<boolean>;
  readonly maxObjectBytes: number | null;
  readonly readerIdentities: boolean;
  readonly referenceForwarding: boolean;
  readonly persistentStorage: Observation<boolean>;
}

/**
 * Constructs a frozen {@link PayloadCapabilities}. `referenceForwarding` defaults to false (neither
 * shipped store forwards); `persistentStorage`, when not given, is Unknown: the wire cannot show it.
 */
export function payloadCapabilities(
  init:
    & Omit<PayloadCapabilities, "referenceForwarding" | "persistentStorage">
    & Partial<Pick<PayloadCapabilities, "referenceForwarding" | "persistentStorage">>,
  clock: Clock = systemClock,
): PayloadCapabilities {
  return Object.freeze({
    referenceForwarding: false,
    persistentStorage: unknown(
      "unsupported",
      clock,
      "the store's wire cannot show what backs its data directory",
    ),
    ...init,
  });
}

/**
 * What an execution engine advertises. `executionGroups` (fused groups, RUN-035) and `dynamicBatching`
 * (RUN-036) are false for both shipped engines: a flow declaring either is refused at admission.
 */
export interface ExecutionCapabilities {
  readonly engine: string;
  readonly restartSupervision: boolean;
  readonly readinessStates: readonly string[];
  readonly pvcMounts: boolean;
  readonly autoscalingControllers: readonly string[];
  readonly executionGroups: boolean;
  readonly dynamicBatching: boolean;
}

/** The local engine: supervised workers, no claims, no controllers, no fusion or batching. */
export function localExecutionCapabilities(): ExecutionCapabilities {
  return Object.freeze({
    engine: "local",
    restartSupervision: true,
    readinessStates: Object.freeze(["started", "ready"]),
    pvcMounts: false,
    autoscalingControllers: Object.freeze([]),
    executionGroups: false,
    dynamicBatching: false,
  });
}

/** The Kubernetes engine: kubelet restarts, PVC mounts, KEDA when `autoscaling`; no fusion or batching. */
export function kubernetesExecutionCapabilities(autoscaling = false): ExecutionCapabilities {
  return Object.freeze({
    engine: "kubernetes",
    restartSupervision: true,
    readinessStates: Object.freeze(["scheduled", "allocated", "prepared", "ready"]),
    pvcMounts: true,
    autoscalingControllers: Object.freeze(autoscaling ? ["keda"] : []),
    executionGroups: false,
    dynamicBatching: false,
  });
}

/** Profile-specific knobs of a {@link ProfileRequest}. */
export interface ProfileOptions {
  /** live_latest: keep the latest message per key rather than the latest overall. */
  readonly latestPerKey?: boolean;
  /** The recovery or replay horizon the channel promises, in seconds. */
  readonly horizonSeconds?: number;
  /** The key latest-per-key slots are taken by. */
  readonly key?: string;
}

const OPTION_KEYS: Readonly<Record<string, keyof ProfileOptions>> = {
  latest_per_key: "latestPerKey",
  horizon_seconds: "horizonSeconds",
  key: "key",
};

function checkOptions(where: string, options: ProfileOptions): string[] {
  const problems: string[] = [];
  if (options.latestPerKey !== undefined && typeof options.latestPerKey !== "boolean") {
    problems.push(`${where}: latest_per_key must be a boolean`);
  }
  const horizon = options.horizonSeconds;
  if (horizon !== undefined && (!Number.isSafeInteger(horizon) || horizon < 1)) {
    problems.push(`${where}: horizon_seconds must be a positive integer, got ${horizon}`);
  }
  if (options.key !== undefined && (typeof options.key !== "string" || options.key === "")) {
    problems.push(`${where}: key must be a non-empty string`);
  }
  return problems;
}

/** One channel's requested profile: the producing node whose output channel it applies to. */
export class ProfileRequest {
  readonly channel: string;
  readonly profile: MessagingProfile;
  readonly options: Readonly<ProfileOptions>;

  /** Throws {@link ConfigError} for an empty channel, an unknown profile or a malformed option. */
  constructor(channel: string, profile: string, options: ProfileOptions = {}) {
    const problems: string[] = [];
    if (typeof channel !== "string" || channel === "") problems.push("channel must be a non-empty node name");
    if (!(MESSAGING_PROFILES as readonly string[]).includes(profile)) {
      problems.push(
        `profile must be one of ${MESSAGING_PROFILES.join(", ")}, got ${JSON.stringify(profile)}`,
      );
    }
    problems.push(...checkOptions(`channel ${channel}`, options));
    if (problems.length > 0) {
      throw new ConfigError(
        `invalid profile request: ${problems.join("; ")}`,
        "fix the --require-profile value",
        {
          channel,
        },
      );
    }
    this.channel = channel;
    this.profile = profile as MessagingProfile;
    this.options = Object.freeze({ ...options });
    Object.freeze(this);
  }

  /** Reads `{channel, profile, options?}` with snake_case option keys; throws {@link ConfigError}. */
  static fromDict(d: unknown): ProfileRequest {
    if (!isRecord(d)) {
      throw new ConfigError("a profile request must be an object {channel, profile, options}");
    }
    const extra = Object.keys(d).filter((key) => !["channel", "profile", "options"].includes(key));
    const rawOptions = d.options ?? {};
    if (extra.length > 0 || !isRecord(rawOptions)) {
      throw new ConfigError(
        `a profile request has ${
          extra.length > 0 ? `unknown keys ${extra.join(", ")}` : "options that are not an object"
        }`,
        "write it as {channel, profile, options}",
      );
    }
    const options: Record<string, unknown> = {};
    for (const [key, value] of Object.entries(rawOptions)) {
      const prop = OPTION_KEYS[key];
      if (prop === undefined) {
        throw new ConfigError(
          `a profile request has unknown option ${key}`,
          `use ${Object.keys(OPTION_KEYS).join(", ")}`,
        );
      }
      options[prop] = value;
    }
    return new ProfileRequest(d.channel as string, d.profile as string, options as ProfileOptions);
  }

  /** `{channel, profile}`, plus `options` (snake_case keys) when any is set. */
  toDict(): Record<string, unknown> {
    const options: Record<string, unknown> = {};
    for (const [key, prop] of Object.entries(OPTION_KEYS)) {
      if (this.options[prop] !== undefined) options[key] = this.options[prop];
    }
    return Object.keys(options).length > 0
      ? { channel: this.channel, profile: this.profile, options }
      : { channel: this.channel, profile: this.profile };
  }
}

/**
 * The GPU resource vocabulary of {@link FlowRequirements.resources} (node → key → value), checked against
 * the allocator's capabilities; `cpu` and `memory` are host requests, carried and not planned against.
 */
export const ResourceKey = {
  /** `exclusive` (whole devices), `mig` (an isolated slice), `time-sliced` or `mps`. */
  sharing: "sharing",
  /** Devices per replica, a positive integer. */
  devices: "devices",
  /** The weakest acceptable memory enforcement: `hardware`, `runtime`, `scheduler` or `none`. */
  memoryEnforcement: "memory_enforcement",
  /** `required` when granted devices must be verified peers; `optional` otherwise. */
  peerAccess: "peer_access",
  /** `fixed` or `elastic`. */
  elasticity: "elasticity",
  cpu: "cpu",
  memory: "memory",
} as const;
/** One of {@link ResourceKey}. */
export type ResourceKey = typeof ResourceKey[keyof typeof ResourceKey];

const RESOURCE_VALUES: Readonly<Record<ResourceKey, (value: string) => boolean>> = {
  sharing: (v) => (REQUEST_SHARINGS as readonly string[]).includes(v),
  devices: (v) => /^[1-9][0-9]*$/.test(v),
  memory_enforcement: (v) => (MEMORY_ENFORCEMENTS as readonly string[]).includes(v),
  peer_access: (v) => v === "required" || v === "optional",
  elasticity: (v) => v === Elasticity.fixed || v === Elasticity.elastic,
  cpu: (v) => v !== "",
  memory: (v) => v !== "",
};

/** The camelCase fields of {@link FlowRequirements}; every one is optional. */
export interface FlowRequirementsInit {
  readonly profiles?: readonly ProfileRequest[];
  readonly restartSafe?: boolean;
  readonly exactlyOnceEffects?: readonly string[];
  readonly resources?: Readonly<Record<string, Readonly<Record<string, string>>>>;
  readonly priorityClass?: string | null;
  readonly rolloutPolicy?: string | null;
  readonly toleratedFailures?: number;
  readonly sinkGuarantees?: Readonly<Record<string, string>>;
  readonly effectRetentionSeconds?: number | null;
  readonly replayHorizonSeconds?: number | null;
  readonly executionGroups?: Readonly<Record<string, readonly string[]>>;
  readonly batching?: Readonly<Record<string, Readonly<Record<string, unknown>>>>;
}

/** Serialized key ↔ property, in the spec's field order (the order of `toDict`). */
const REQUIREMENT_KEYS = [
  ["profiles", "profiles"],
  ["restart_safe", "restartSafe"],
  ["exactly_once_effects", "exactlyOnceEffects"],
  ["resources", "resources"],
  ["priority_class", "priorityClass"],
  ["rollout_policy", "rolloutPolicy"],
  ["tolerated_failures", "toleratedFailures"],
  ["sink_guarantees", "sinkGuarantees"],
  ["effect_retention_seconds", "effectRetentionSeconds"],
  ["replay_horizon_seconds", "replayHorizonSeconds"],
  ["execution_groups", "executionGroups"],
  ["batching", "batching"],
] as const satisfies readonly (readonly [string, keyof FlowRequirementsInit])[];

function nonNegativeSeconds(value: number | null): boolean {
  return value === null || (typeof value === "number" && Number.isFinite(value) && value >= 0);
}

/**
 * Everything a flow asks of its backends beyond the graph. Construction checks every field and throws
 * one {@link ConfigError} listing every problem. Serialized only when non-empty, so a flow that never
 * touches it compiles to the same bytes.
 */
export class FlowRequirements {
  readonly profiles: readonly ProfileRequest[];
  readonly restartSafe: boolean;
  /** Sinks whose external effects must occur once (RUN-017). */
  readonly exactlyOnceEffects: readonly string[];
  /** Node → resource key ({@link ResourceKey}) → value. */
  readonly resources: Readonly<Record<string, Readonly<Record<string, string>>>>;
  readonly priorityClass: string | null;
  readonly rolloutPolicy: string | null;
  /** Broker pod losses accepted work must survive (MSG-021): needs persistent storage and 2f + 1 copies. */
  readonly toleratedFailures: number;
  /** Sink → its declared effect guarantee (only non-default declarations). */
  readonly sinkGuarantees: Readonly<Record<string, string>>;
  /** How long effect markers are kept, in seconds. */
  readonly effectRetentionSeconds: number | null;
  /** How far back a replay may reach, in seconds. */
  readonly replayHorizonSeconds: number | null;
  /** Fused execution groups the nodes declare (RUN-035): group → members. */
  readonly executionGroups: Readonly<Record<string, readonly string[]>>;
  /** Dynamic-batching contracts the nodes declare (RUN-036): node → policy. */
  readonly batching: Readonly<Record<string, Readonly<Record<string, unknown>>>>;

  constructor(init: FlowRequirementsInit = {}) {
    const problems: string[] = [];
    this.profiles = Object.freeze([...(init.profiles ?? [])]);
    if (!this.profiles.every((p) => p instanceof ProfileRequest)) {
      problems.push("profiles must be ProfileRequests");
    }
    this.restartSafe = init.restartSafe ?? false;
    this.exactlyOnceEffects = Object.freeze([...(init.exactlyOnceEffects ?? [])]);
    this.resources = Object.freeze(
      Object.fromEntries(
        Object.entries(init.resources ?? {}).map(([node, r]) => [node, Object.freeze({ ...r })]),
      ),
    );
    for (const [node, resources] of Object.entries(this.resources)) {
      for (const [key, value] of Object.entries(resources)) {
        const accepts = (RESOURCE_VALUES as Record<string, (v: string) => boolean>)[key];
        if (accepts === undefined) problems.push(`resources.${node}: unknown key ${key}`);
        else if (typeof value !== "string" || !accepts(value)) {
          problems.push(`resources.${node}.${key}: invalid value ${JSON.stringify(value)}`);
        }
      }
    }
    this.priorityClass = init.priorityClass ?? null;
    this.rolloutPolicy = init.rolloutPolicy ?? null;
    this.toleratedFailures = init.toleratedFailures ?? 0;
    if (!Number.isSafeInteger(this.toleratedFailures) || this.toleratedFailures < 0) {
      problems.push(`tolerated_failures must be a non-negative integer, got ${this.toleratedFailures}`);
    }
    this.sinkGuarantees = Object.freeze({ ...(init.sinkGuarantees ?? {}) });
    for (const [sink, guarantee] of Object.entries(this.sinkGuarantees)) {
      if (!(Object.values(EffectGuarantee) as string[]).includes(guarantee)) {
        problems.push(`sink_guarantees.${sink}: unknown guarantee ${JSON.stringify(guarantee)}`);
      }
    }
    this.effectRetentionSeconds = init.effectRetentionSeconds ?? null;
    this.replayHorizonSeconds = init.replayHorizonSeconds ?? null;
    for (
      const [key, value] of [
        ["effect_retention_seconds", this.effectRetentionSeconds],
        ["replay_horizon_seconds", this.replayHorizonSeconds],
      ] as const
    ) {
      if (!nonNegativeSeconds(value)) {
        problems.push(`${key} must be a non-negative number of seconds, got ${value}`);
      }
    }
    this.executionGroups = Object.freeze(
      Object.fromEntries(
        Object.entries(init.executionGroups ?? {}).map(([g, m]) => [g, Object.freeze([...m])]),
      ),
    );
    this.batching = Object.freeze({ ...(init.batching ?? {}) });
    if (problems.length > 0) {
      throw new ConfigError(
        `invalid flow requirements: ${problems.join("; ")}`,
        "fix the flow's requirements",
      );
    }
    Object.freeze(this);
  }

  /** Reads the document {@link toDict} writes; `null`/`undefined` is the empty requirements. */
  static fromDict(d: unknown): FlowRequirements {
    if (d === null || d === undefined) return new FlowRequirements();
    if (!isRecord(d)) throw new ConfigError("flow requirements must be an object");
    const known = new Map<string, string>(REQUIREMENT_KEYS);
    const unknownKeys = Object.keys(d).filter((key) => !known.has(key));
    if (unknownKeys.length > 0) {
      throw new ConfigError(`flow requirements have unknown keys: ${unknownKeys.join(", ")}`);
    }
    const init: Record<string, unknown> = {};
    for (const [key, prop] of REQUIREMENT_KEYS) if (Object.hasOwn(d, key)) init[prop] = d[key];
    if (init.profiles !== undefined) {
      if (!Array.isArray(init.profiles)) throw new ConfigError("flow requirements: profiles must be a list");
      init.profiles = init.profiles.map((p) => ProfileRequest.fromDict(p));
    }
    return new FlowRequirements(init as FlowRequirementsInit);
  }

  /** Whether every field has its default (nothing is serialized for it). */
  isEmpty(): boolean {
    return Object.keys(this.toDict()).length === 0;
  }

  /** The snake_case document, in the spec's field order, with only the fields that differ from default. */
  toDict(): Record<string, unknown> {
    const out: Record<string, unknown> = {};
    for (const [key, prop] of REQUIREMENT_KEYS) {
      const value = prop === "profiles" ? this.profiles.map((p) => p.toDict()) : this[prop];
      const isDefault = value === null || value === false || value === 0 ||
        (Array.isArray(value) && value.length === 0) ||
        (isRecord(value) && Object.keys(value).length === 0);
      if (!isDefault) out[key] = value;
    }
    return out;
  }
}

/** The admitted composition: each channel's profile and retention class, and why, for a human. */
export class CompositionPlan {
  /** Channel → the profile it is served as. */
  readonly channelProfiles: Readonly<Record<string, MessagingProfile>>;
  /** Channel → its one retention class. */
  readonly channelRetention: Readonly<Record<string, Retention>>;
  readonly restartSafe: boolean;
  readonly notes: readonly string[];

  constructor(
    channelProfiles: Readonly<Record<string, MessagingProfile>>,
    channelRetention: Readonly<Record<string, Retention>>,
    restartSafe: boolean,
    notes: readonly string[] = [],
  ) {
    this.channelProfiles = Object.freeze({ ...channelProfiles });
    this.channelRetention = Object.freeze({ ...channelRetention });
    this.restartSafe = restartSafe;
    this.notes = Object.freeze([...notes]);
    Object.freeze(this);
  }

  /** Lines for `explain`: one per channel, then restart safety, then the notes. */
  render(): string {
    const channels = Object.keys(this.channelProfiles).map((channel) =>
      `channel ${channel}: ${this.channelProfiles[channel]} (${this.channelRetention[channel]} retention)`
    );
    return [
      ...channels,
      `restart-safe: ${this.restartSafe ? "yes" : "no"}`,
      ...this.notes.map((n) => `note: ${n}`),
    ]
      .join("\n");
  }
}

/**
 * A composition whose requested guarantees rest on capabilities an adapter could not observe; carries
 * every such diagnostic, as IncompatibleProfile does for definite incompatibilities.
 */
export class UnobservableComposition extends UnobservableState {
  readonly diagnostics: readonly Diagnostic[];

  constructor(message: string, remedy: string | null, diagnostics: readonly Diagnostic[]) {
    super(message, remedy, { problems: diagnostics.length });
    this.diagnostics = Object.freeze([...diagnostics]);
  }

  override render(): string {
    return [super.render(), ...this.diagnostics.map((d) => `  - ${d.render()}`)].join("\n");
  }

  override toDict() {
    return { ...super.toDict(), diagnostics: this.diagnostics.map((d) => d.toDict()) };
  }
}

/** The backends a flow is composed with, as {@link planComposition} reads them. */
export interface Composition {
  readonly messaging: MessagingCapabilities;
  /** null/absent: no payload store is part of the composition. */
  readonly payload?: PayloadCapabilities | null;
  readonly runtime?: RuntimeCapabilities | null;
  readonly allocation?: AllocationCapabilities | null;
  readonly execution?: ExecutionCapabilities | null;
  /** Whether any channel offloads payloads to the store (its durability is then part of the channel's). */
  readonly payloadRefsInUse?: boolean;
  /** The TTL offloaded payloads are written with, in seconds; null when they carry none. */
  readonly payloadTtlSeconds?: number | null;
  /** Whether reader obligations pin every offloaded payload until its readers release it. */
  readonly payloadObligations?: boolean;
}

const INCOMPATIBLE = "VF_INCOMPATIBLE_PROFILE";
const UNOBSERVABLE = "VF_STATE_UNKNOWN";

/** Profiles by how much they keep, most first: the one a multi-profile channel is served as. */
const PROFILE_STRENGTH: readonly MessagingProfile[] = [
  MessagingProfile.durableControl,
  MessagingProfile.replayArchive,
  MessagingProfile.reliableWork,
  MessagingProfile.liveLatest,
];

/** Profiles whose accepted items must survive consumers and restarts (their payloads included). */
const KEEPS_PAYLOADS: ReadonlySet<MessagingProfile> = new Set([
  MessagingProfile.reliableWork,
  MessagingProfile.replayArchive,
]);

/**
 * The PAY-009 rule in one place: why a TTL cannot cover a promised horizon, or null when it can (a TTL
 * of null never expires; obligations extend a pinned object's life to the horizon, making the TTL a
 * backstop rather than the bound).
 */
export function retentionShortfall(
  ttlSeconds: number | null,
  horizonSeconds: number,
  obligations: boolean,
): string | null {
  if (ttlSeconds === null || obligations || ttlSeconds >= horizonSeconds) return null;
  return `payload TTL ${ttlSeconds} s is shorter than the ${horizonSeconds} s horizon and no obligation ` +
    `pins the object (PAY-009)`;
}

/** Collects every finding of one planning pass. */
class Findings {
  readonly incompatible: Diagnostic[] = [];
  readonly unobservable: Diagnostic[] = [];
  readonly notes: string[] = [];

  refuse(node: string | null, message: string, remedy: string): void {
    this.incompatible.push(new Diagnostic("error", INCOMPATIBLE, node, message, remedy));
  }

  /** Records that `subject` could not be observed: Unknown is not a pass. */
  unobserved(node: string | null, subject: string, observation: Unknown): void {
    this.unobservable.push(
      new Diagnostic(
        "error",
        UNOBSERVABLE,
        node,
        `${subject} could not be observed (${describeObservation(observation)}): Unknown is not a pass`,
        "restore the read-back (permissions, reachability) or declare the capability on the service",
      ),
    );
  }

  /** `observation` must be Known(`wanted`): another known value is refused, Unknown is unobservable. */
  require(
    node: string | null,
    observation: Observation<boolean>,
    wanted: boolean,
    subject: string,
    refusal: string,
    remedy: string,
  ): void {
    if (observation.kind === "unknown") this.unobserved(node, subject, observation);
    else if (observation.value !== wanted) this.refuse(node, `${subject}: ${refusal}`, remedy);
  }
}

interface ChannelDemand {
  readonly profiles: MessagingProfile[];
  latestPerKey: boolean;
  horizonSeconds: number | null;
}

function channelDemands(profiles: readonly ProfileRequest[]): Map<string, ChannelDemand> {
  const demands = new Map<string, ChannelDemand>();
  for (const request of profiles) {
    const demand = demands.get(request.channel) ??
      { profiles: [], latestPerKey: false, horizonSeconds: null };
    if (!demand.profiles.includes(request.profile)) demand.profiles.push(request.profile);
    demand.latestPerKey ||= request.options.latestPerKey === true;
    const horizon = request.options.horizonSeconds;
    if (horizon !== undefined) demand.horizonSeconds = Math.max(demand.horizonSeconds ?? 0, horizon);
    demands.set(request.channel, demand);
  }
  return demands;
}

function adapterName(m: MessagingCapabilities): string {
  return `${m.adapter} ${m.version}`;
}

function checkMessagingProfile(
  f: Findings,
  channel: string,
  profile: MessagingProfile,
  demand: ChannelDemand,
  m: MessagingCapabilities,
): void {
  const on = `channel ${channel} requests ${profile}, but ${adapterName(m)}`;
  switch (profile) {
    case MessagingProfile.liveLatest:
      if (demand.latestPerKey && !m.latestPerKey) {
        f.refuse(
          channel,
          `${on} has no latest_per_key slots`,
          "drop latest_per_key or use an adapter with per-key slots",
        );
      }
      return;
    case MessagingProfile.reliableWork:
      if (!m.retainedBacklog) {
        f.refuse(
          channel,
          `${on} has no retained_backlog: accepted work would be lost to a slow or absent consumer`,
          "use a retaining transport (JetStream), or request live_latest",
        );
      }
      if (!m.recoverableDelivery) {
        f.refuse(
          channel,
          `${on} has no recoverable_delivery: an unsettled delivery never comes back`,
          "use a transport with leases and redelivery",
        );
      }
      return;
    case MessagingProfile.durableControl:
      if (!m.durableControl) {
        f.refuse(
          channel,
          `${on} offers no durable_control records (MSG-018)`,
          "use an adapter that advertises durable_control",
        );
      }
      return;
    case MessagingProfile.replayArchive:
      if (!m.archive) {
        f.refuse(channel, `${on} keeps no archive (MSG-024)`, "use an adapter that advertises an archive");
      }
      return;
  }
}

function checkPayloadFor(
  f: Findings,
  channel: string,
  profile: MessagingProfile,
  horizonSeconds: number | null,
  c: Composition,
): void {
  const payload = c.payload ?? null;
  if (payload === null) return; // Reported once for the whole composition.
  const subject = `channel ${channel} (${profile}) offloads payloads: store ${payload.adapter}`;
  f.require(
    channel,
    payload.durable,
    true,
    `${subject} durability`,
    "an accepted object may not outlive a restart of the store",
    "turn persistence on with noeviction, or keep payloads inline",
  );
  f.require(
    channel,
    payload.evictable,
    false,
    `${subject} eviction policy`,
    "the store is evictable: a needed object can be evicted under pressure",
    "set maxmemory-policy noeviction, or use the durable store",
  );
  if (horizonSeconds !== null) {
    const shortfall = retentionShortfall(
      c.payloadTtlSeconds ?? null,
      horizonSeconds,
      c.payloadObligations ?? false,
    );
    if (shortfall !== null) {
      f.refuse(
        channel,
        `channel ${channel} (${profile}): ${shortfall}`,
        "attach reader obligations, or raise the payload TTL to the horizon",
      );
    }
  }
}

function checkDurableLedger(
  f: Findings,
  node: string | null,
  purpose: string,
  runtime: RuntimeCapabilities | null,
): void {
  if (runtime === null) {
    f.refuse(
      node,
      `${purpose} needs a durable shared runtime store, and none is composed`,
      "set VF_RUNTIME_STORE_URL to file:// (one host) or redis://",
    );
    return;
  }
  f.require(
    node,
    runtime.durable,
    true,
    `${purpose}: runtime store ${runtime.store} durability`,
    "the ledger does not survive its process",
    "use a durable store (file://, or redis:// with persistence and noeviction)",
  );
  if (!runtime.sharedAcrossProcesses) {
    f.refuse(
      node,
      `${purpose}: runtime store ${runtime.store} is not shared across processes`,
      "use file:// (one host) or redis:// (many)",
    );
  }
}

function checkFaultModel(f: Findings, r: FlowRequirements, c: Composition): void {
  const tolerated = r.toleratedFailures;
  if (tolerated === 0) return;
  const m = c.messaging;
  const subject = `tolerated_failures=${tolerated} (MSG-021): ${adapterName(m)}`;
  f.require(
    null,
    m.persistentStorage,
    true,
    `${subject} persistent storage`,
    "streams do not outlive a broker pod",
    "put the broker's streams on persistent volumes",
  );
  const copies = 2 * tolerated + 1;
  if (m.replicationFactor.kind === "unknown") {
    f.unobserved(null, `${subject} replication (${copies} copies needed)`, m.replicationFactor);
  } else if (m.replicationFactor.value < copies) {
    f.refuse(
      null,
      `${subject} keeps ${m.replicationFactor.value} stream copies; surviving ${tolerated} losses needs ${copies}`,
      `set VF_STREAM_REPLICAS to ${copies} on a cluster of at least ${copies} brokers`,
    );
  }
  if (c.payloadRefsInUse && c.payload) {
    f.require(
      null,
      c.payload.persistentStorage,
      true,
      `tolerated_failures=${tolerated}: payload store ${c.payload.adapter} persistent storage`,
      "its data does not outlive the store's pod",
      "back the store's data directory with a persistent volume and declare it",
    );
  }
}

function checkEffects(f: Findings, r: FlowRequirements): void {
  for (const sink of r.exactlyOnceEffects) {
    const declared = r.sinkGuarantees[sink] ?? EffectGuarantee.atLeastOnce;
    if (declared !== EffectGuarantee.idempotentKey) {
      f.refuse(
        sink,
        `sink ${sink} declares effect_guarantee ${declared}; only an idempotent_key sink can promise exactly-once effects (RUN-017)`,
        "key the sink's external effect on ctx.inputKey and declare effect_guarantee idempotent_key",
      );
    }
  }
  if (r.exactlyOnceEffects.length > 0 && r.replayHorizonSeconds !== null) {
    const kept = r.effectRetentionSeconds;
    if (kept === null || kept < r.replayHorizonSeconds) {
      f.refuse(
        null,
        `effect markers kept ${
          kept === null ? "for an undeclared time" : `${kept} s`
        } expire inside the ${r.replayHorizonSeconds} s replay horizon (RUN-017)`,
        "set effect_retention_seconds to at least replay_horizon_seconds",
      );
    }
  }
}

function checkExecution(f: Findings, r: FlowRequirements, execution: ExecutionCapabilities | null): void {
  const engine = execution === null ? "no composed engine" : `engine ${execution.engine}`;
  if (!execution?.executionGroups) {
    for (const [group, members] of Object.entries(r.executionGroups)) {
      f.refuse(
        null,
        `execution group ${group} (${
          members.join(", ")
        }) cannot be fused: ${engine} has no execution groups (RUN-035)`,
        "remove executionGroup (execution_group) from the nodes: no engine runs them fused",
      );
    }
  }
  if (!execution?.dynamicBatching) {
    for (const node of Object.keys(r.batching)) {
      f.refuse(
        node,
        `node ${node} declares a batching policy: ${engine} has no dynamic batching (RUN-036)`,
        "remove batchingPolicy (batching_policy); transport fetch batching still applies",
      );
    }
  }
}

/**
 * What `execution` refuses of the execution groups and batching contracts in `requirements` (RUN-035,
 * RUN-036): one `VF_INCOMPATIBLE_PROFILE` error diagnostic per group or batched node the engine cannot
 * honour, none when it honours them all. An engine never runs such a flow as ordinary nodes.
 */
export function executionRefusals(
  requirements: FlowRequirements,
  execution: ExecutionCapabilities,
): readonly Diagnostic[] {
  const f = new Findings();
  checkExecution(f, requirements, execution);
  return f.incompatible;
}

function checkResources(f: Findings, r: FlowRequirements, allocation: AllocationCapabilities | null): void {
  for (const [node, resources] of Object.entries(r.resources)) {
    const gpuKeys = Object.keys(resources).filter((key) =>
      key !== ResourceKey.cpu && key !== ResourceKey.memory
    );
    if (gpuKeys.length === 0) continue;
    if (allocation === null) {
      f.refuse(
        node,
        `node ${node} requests accelerators (${gpuKeys.join(", ")}), and no allocator is composed`,
        "compose an allocation backend",
      );
      continue;
    }
    const by = `allocator ${allocation.adapter} (authority ${allocation.authority})`;
    const sharing = resources[ResourceKey.sharing];
    const offers: Record<string, boolean> = {
      [RequestSharing.exclusive]: allocation.exclusiveDevice,
      [RequestSharing.mig]: allocation.isolatedMig,
      [RequestSharing.timeSliced]: allocation.cooperativeSharing,
      [RequestSharing.mps]: allocation.cooperativeSharing,
    };
    if (sharing !== undefined && !offers[sharing]) {
      f.refuse(
        node,
        `node ${node} requests ${sharing} devices; ${by} does not grant them`,
        "request a sharing kind the allocator grants, or compose another allocator",
      );
    }
    const devices = Number(resources[ResourceKey.devices] ?? "1");
    if (devices > 1 && !allocation.multiDevice) {
      f.refuse(
        node,
        `node ${node} requests ${devices} devices per replica; ${by} grants one`,
        "request one device, or compose a multi-device allocator",
      );
    }
    const enforcement = resources[ResourceKey.memoryEnforcement] as MemoryEnforcement | undefined;
    if (enforcement !== undefined && !enforcementSatisfies(allocation.memoryEnforcement, enforcement)) {
      f.refuse(
        node,
        `node ${node} needs memory enforced by ${enforcement}; ${by} enforces it by ${allocation.memoryEnforcement}`,
        "use MIG (hardware) or MPS (runtime) sharing, or relax the requirement",
      );
    }
    if (resources[ResourceKey.peerAccess] === "required" && !allocation.topologyVerification) {
      f.refuse(
        node,
        `node ${node} requires verified peer access; ${by} cannot verify topology`,
        "compose an allocator that reads the P2P topology",
      );
    }
    if (resources[ResourceKey.elasticity] === Elasticity.elastic && !allocation.elastic) {
      f.refuse(
        node,
        `node ${node} asks for an elastic device set; ${by} grants fixed sets`,
        "request elasticity fixed",
      );
    }
  }
}

function strongest(profiles: readonly MessagingProfile[]): MessagingProfile {
  return PROFILE_STRENGTH.find((p) => profiles.includes(p))!;
}

/**
 * Admits the composition or rejects it, never downgrading it. `requirements` is what the flow asks
 * ({@link defaultRequirements} when it says nothing); `composition` is what the composed backends
 * advertise (an absent backend makes every guarantee that needs it a rejection).
 *
 * Throws {@link IncompatibleProfile} when any requested guarantee is definitely not provided; its
 * diagnostics list every problem of the pass, the unobservable ones included. Throws
 * {@link UnobservableComposition} (an UnobservableState) when nothing is definitely missing but some
 * guarantee rests on a capability that could not be observed (replication, persistence, durability).
 */
export function planComposition(requirements: FlowRequirements, composition: Composition): CompositionPlan {
  const f = new Findings();
  const m = composition.messaging;
  const channelProfiles: Record<string, MessagingProfile> = {};
  const channelRetention: Record<string, Retention> = {};
  if (composition.payloadRefsInUse && !composition.payload) {
    f.refuse(
      null,
      "payloads are offloaded by reference, but no payload store is composed",
      "compose a payload store, or keep payloads inline",
    );
  }
  for (const [channel, demand] of channelDemands(requirements.profiles)) {
    const served = strongest(demand.profiles);
    const retentions = new Set(demand.profiles.map((p) => PROFILE_RETENTION[p]));
    if (retentions.size > 1 && !m.mixedRetentionPerChannel) {
      f.refuse(
        channel,
        `channel ${channel} is requested as ${demand.profiles.join(" and ")}, but ${
          adapterName(m)
        } gives a channel one retention class`,
        "request one profile for every consumer of the channel",
      );
    } else if (demand.profiles.length > 1) {
      f.notes.push(`channel ${channel}: requested ${demand.profiles.join(", ")}; served as ${served}`);
    }
    for (const profile of demand.profiles) {
      checkMessagingProfile(f, channel, profile, demand, m);
      if (profile === MessagingProfile.durableControl) {
        checkDurableLedger(f, channel, `channel ${channel} (durable_control)`, composition.runtime ?? null);
      }
      if (composition.payloadRefsInUse && KEEPS_PAYLOADS.has(profile)) {
        const horizon = profile === MessagingProfile.replayArchive
          ? Math.max(demand.horizonSeconds ?? 0, requirements.replayHorizonSeconds ?? 0) || null
          : demand.horizonSeconds;
        checkPayloadFor(f, channel, profile, horizon, composition);
      }
    }
    channelProfiles[channel] = served;
    channelRetention[channel] = PROFILE_RETENTION[served];
    f.notes.push(
      `channel ${channel}: ${served} on ${adapterName(m)} as ${PROFILE_RETENTION[served]} retention`,
    );
  }
  if (requirements.restartSafe) {
    const runtime = composition.runtime ?? null;
    checkDurableLedger(f, null, "restart_safe", runtime);
    if (runtime !== null && !runtime.restartSafeJoins) {
      f.refuse(
        null,
        `restart_safe: runtime store ${runtime.store} does not keep join groups across restarts`,
        "use a store with restart-safe joins",
      );
    }
  }
  checkFaultModel(f, requirements, composition);
  checkEffects(f, requirements);
  checkExecution(f, requirements, composition.execution ?? null);
  checkResources(f, requirements, composition.allocation ?? null);
  const all = [...f.incompatible, ...f.unobservable];
  if (f.incompatible.length > 0) {
    throw new IncompatibleProfile(
      `the composed backends cannot meet ${all.length} requested guarantee(s)`,
      "fix every problem listed (or compose backends that provide them); nothing was provisioned",
      all,
    );
  }
  if (f.unobservable.length > 0) {
    throw new UnobservableComposition(
      `${all.length} requested guarantee(s) rest on capabilities that could not be observed`,
      "restore the read-backs named below and admit again; nothing was provisioned",
      all,
    );
  }
  return new CompositionPlan(channelProfiles, channelRetention, requirements.restartSafe, f.notes);
}

/**
 * The profile an edge requests under the presets: BATCH is reliable_work, REALTIME live_latest, and a
 * consuming node's delivery override flips its own inputs (an at-least-once sink in a REALTIME flow asks
 * reliable_work). Throws {@link ConfigError} for an unknown flow type or a malformed override.
 */
export function profileForEdge(flowType: string, delivery: unknown): MessagingProfile {
  return DeliveryPolicy.resolve(flowType, delivery).delivery === AT_LEAST_ONCE
    ? MessagingProfile.reliableWork
    : MessagingProfile.liveLatest;
}

/**
 * The requirements a flow makes without saying anything: one profile request per edge (parent channel →
 * consuming node), in spec order, from {@link profileForEdge}. Two consumers of one channel may ask for
 * different profiles; whether one channel can serve both is the planner's decision.
 */
export function defaultRequirements(
  flowType: string,
  specs: readonly Pick<NodeSpec, "parents" | "delivery">[],
): FlowRequirements {
  const profiles = specs.flatMap((spec) => {
    const profile = profileForEdge(flowType, spec.delivery);
    return spec.parents.map((parent) => new ProfileRequest(parent, profile));
  });
  return new FlowRequirements({ profiles });
}

/** The worker environment entry for explicit requests: empty when there are none (D8). */
export function requestsEnv(explicit: readonly ProfileRequest[]): Record<string, string> {
  if (explicit.length === 0) return {};
  return { [PROFILE_REQUESTS_ENV]: JSON.stringify(explicit.map((r) => r.toDict())) };
}

/** The inverse of {@link requestsEnv}: `[]` when unset or empty; {@link ConfigError} when malformed. */
export function requestsFromEnv(value: string | null | undefined): ProfileRequest[] {
  if (value === null || value === undefined || value === "") return [];
  let parsed: unknown;
  try {
    parsed = JSON.parse(value);
  } catch (error) {
    throw new ConfigError(
      `${PROFILE_REQUESTS_ENV} is not JSON: ${(error as Error).message}`,
      "set it from requestsEnv",
    );
  }
  if (!Array.isArray(parsed)) {
    throw new ConfigError(`${PROFILE_REQUESTS_ENV} must be a JSON list`, "set it from requestsEnv");
  }
  return parsed.map((d) => ProfileRequest.fromDict(d));
}

/** `VF_ADMISSION_TIMEOUT_SECONDS` as seconds: the default when unset or empty; ConfigError unless positive. */
export function admissionTimeoutFromEnv(value: string | null | undefined): number {
  if (value === null || value === undefined || value.trim() === "") return DEFAULT_ADMISSION_TIMEOUT_SECONDS;
  const fallback = String(DEFAULT_ADMISSION_TIMEOUT_SECONDS);
  return secondsFromText(
    ADMISSION_TIMEOUT_ENV,
    value.trim(),
    false,
    fallback,
    `or unset it for the default of ${fallback}`,
  );
}

function declaredLimit(environ: Readonly<Record<string, string | undefined>>, name: string): number | null {
  const value = environ[name];
  if (value === undefined || value.trim() === "") return null;
  return wholeNumberFromText(name, value.trim(), 1, null, "the size the MSG-026 benchmark established");
}

/** `[maxStreams, maxConsumers]` declared in `environ` (null each when unset); ConfigError unless positive integers. */
export function graphLimitsFromEnv(
  environ: Readonly<Record<string, string | undefined>>,
): [number | null, number | null] {
  return [declaredLimit(environ, MAX_STREAMS_ENV), declaredLimit(environ, MAX_CONSUMERS_ENV)];
}

/**
 * The tighter of an account limit (read back; -1 unlimited) and a declared cap: null when neither says
 * anything, Unknown when the account could not be read (its limit may be tighter than the cap).
 */
export function combinedLimit(
  account: Observation<number> | null,
  declared: number | null,
  clock: Clock = systemClock,
): Observation<number> | null {
  if (account === null) return declared === null ? null : known(declared, clock);
  if (account.kind === "unknown" || declared === null) return account;
  const limit = account.value < 0 ? declared : Math.min(account.value, declared);
  return Object.freeze({ ...account, value: limit });
}

/** One line for `explain`: what the flow type's preset implies for its channels. */
export function realtimeDefaultCapabilitiesNote(flowType: string): string {
  const preset = profileForEdge(flowType, null);
  return preset === MessagingProfile.reliableWork
    ? `${flowType}: every edge requests reliable_work (retained until settled; overflow backpressures, never evicts)`
    : `${flowType}: every edge requests live_latest (bounded backlog, explicit drops, observable gaps, no replay); ` +
      `a consumer with delivery at-least-once requests reliable_work for its inputs`;
}
