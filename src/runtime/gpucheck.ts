/**
 * Worker-side verification of a GPU node's grant (spec runtime.gpucheck; RUN-043, RUN-044), decided
 * before the node is opened: what the node asks for against what the worker can be shown to have. It
 * never allocates (the launcher does: `src/deploy/allocation_local.ts` for `run-local`).
 *
 * What the worker has comes from, in order: the launcher's grant (`VF_GPU_GRANT_JSON`, a
 * {@link DeliveredGrant} that observed the host), checked against the worker's `CUDA_VISIBLE_DEVICES`
 * and, where this worker can read it, the NVML inventory; else the CUDA-visible namespace enumerated
 * through the mask over NVML (by ordinal, card UUID or MIG UUID, never by counting integers); else
 * nothing (`unobserved`). What could not be read stays Unknown: a worker that cannot load NVML has not
 * seen zero devices.
 *
 * `CUDA_VISIBLE_DEVICES` is read as the CUDA runtime documents it: unset, every device; set, exactly the
 * devices its comma-separated entries name, in that order, each an ordinal, a `GPU-` or `MIG-` UUID or a
 * unique prefix of one; the first entry that names no device ends the list (`0,2,-1,1` is devices 0 and
 * 2), so an empty mask, `-1` or `NoDevFiles` is none. Ordinals are CUDA's, which are NVML's (PCI bus
 * order) only under `CUDA_DEVICE_ORDER=PCI_BUS_ID` or on a host with one card: elsewhere an ordinal names
 * no card this module can tell (Unknown). A card in MIG mode is addressed only through its MIG UUIDs here:
 * which of its MIG devices CUDA shows for the card named whole, or with no mask, is not read (Unknown).
 *
 * @example
 * ```ts
 * const report = verifyGrant(
 *   { node: "detect", requested: 1, fallback: "cpu", requiresPeerAccess: false },
 *   { environ: { CUDA_VISIBLE_DEVICES: "GPU-a1b2c3d4" }, grant: null, host: await readHostGpus() },
 * );
 * report.execution; // "gpu" when NVML shows the card the mask names
 * ```
 *
 * @module
 */

import { fileURLToPath } from "node:url";
import { type DeliveredGrant, type DeviceIdentity, deviceKey, GrantHost } from "../backends/allocation.ts";
import { type Clock, systemClock } from "../backends/clock.ts";
import { known, type Observation, unknown } from "../backends/outcomes.ts";
import { LASTING_FAILURE_KEY, ResourceUnavailable } from "../core/errors.ts";
import { DeviceType, GpuFallback, type Node, ProcessorNode } from "../core/node.ts";
import type { NvmlInventory } from "../../nvml/inventory.ts";
import type { PhysicalGpu } from "../../nvml/physical_device.ts";

/** The mask the CUDA runtime reads: which devices a process may address. */
export const CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES";
/** The order CUDA numbers devices in; `PCI_BUS_ID` makes its ordinals NVML's. */
export const CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER";

/** Where a GPU node runs after its grant was checked. */
export const GpuExecution = {
  /** Every requested device was delivered. */
  gpu: "gpu",
  /** The grant was short and the node's declared CPU fallback is taken. */
  cpu: "cpu",
  /** The grant could not be read: whether the node has its devices is not known. */
  unknown: "unknown",
} as const;
/** One of {@link GpuExecution}. */
export type GpuExecution = typeof GpuExecution[keyof typeof GpuExecution];

/** Where a report's devices come from. */
export const GrantSource = {
  /** A launcher-recorded {@link DeliveredGrant} that observed the host. */
  grant: "grant",
  /** The CUDA-visible namespace, enumerated through the mask over NVML. */
  enumeration: "enumeration",
  /** Neither answered. */
  unobserved: "unobserved",
} as const;
/** One of {@link GrantSource}. */
export type GrantSource = typeof GrantSource[keyof typeof GrantSource];

/** What a GPU node declares about its grant. */
export interface GrantDemand {
  /** The node's name, for messages. */
  readonly node: string;
  /** Whole devices the node asks for (its `gpuCount`). */
  readonly requested: number;
  /** `cpu`: a short or unverifiable grant still opens; `none`: it refuses to open (RUN-044). */
  readonly fallback: GpuFallback;
  /** Whether the node's devices must be verified peers (RUN-043). */
  readonly requiresPeerAccess: boolean;
}

/** The parts of the NVML inventory a grant is checked against. */
export type HostGpus = Pick<NvmlInventory, "devices" | "p2p">;

/** The environment a grant is read from (the worker's `VF_*` settings and `CUDA_VISIBLE_DEVICES`). */
export type GrantEnviron = Readonly<Record<string, string | undefined>>;

/** What a grant is judged on: the environment, the launcher's grant (or null) and the host's GPUs. */
export interface GrantEvidence {
  /** The worker's environment: its settings and `CUDA_VISIBLE_DEVICES`. */
  readonly environ: GrantEnviron;
  /** The launcher's grant (`VF_GPU_GRANT_JSON`), or null. */
  readonly grant: DeliveredGrant | null;
  /** The host's GPUs as this worker could read them. */
  readonly host: HostGpus;
  /** The clock Unknowns are stamped with; the system clock by default. */
  readonly clock?: Clock;
}

/** What the worker found for one GPU node's grant (spec `GrantReport`). */
export interface GrantReport {
  /** Whole devices the node asked for. */
  readonly requested: number;
  /** The devices the worker can use, in CUDA index order; Unknown when they could not be read. */
  readonly delivered: Observation<readonly DeviceIdentity[]>;
  /** Where `delivered` comes from. */
  readonly source: GrantSource;
  /** Where the node runs: `gpu`, `cpu` (the declared fallback) or `unknown`. */
  readonly execution: GpuExecution;
  /** Whether the launcher promised exclusive devices (false without a grant: never assumed). */
  readonly exclusive: boolean;
  /** `CUDA_VISIBLE_DEVICES` as the worker has it; null when unset. */
  readonly mask: string | null;
  /** Whether the delivered devices are verified peers; null when the node does not require it. */
  readonly peerAccess: Observation<boolean> | null;
  /** Every shortfall and disagreement found, in words; empty when the grant is whole. */
  readonly problems: readonly string[];
  /** What the report rests on (the NVML read, the grant's policy), for logs and explain. */
  readonly evidence: Readonly<Record<string, unknown>>;
}

/** The devices a mask shows, and the entries CUDA would not read (they end the list). */
export interface Enumeration {
  /** The devices, in CUDA index order; Unknown when the host or an entry cannot be read. */
  readonly devices: Observation<readonly DeviceIdentity[]>;
  /** The entries from the first that names no device on: CUDA ignores them. */
  readonly ignored: readonly string[];
}

/** Every device NVML shows: each card with MIG off, and each MIG device of the cards with MIG on. */
function presentDevices(cards: readonly PhysicalGpu[], clock: Clock): Observation<DeviceIdentity[]> {
  const out: DeviceIdentity[] = [];
  for (const card of cards) {
    const whole = wholeCard(card, clock);
    if (whole.kind === "unknown") return whole;
    if (whole.value !== null) {
      out.push(whole.value);
      continue;
    }
    if (card.migDevices.kind === "unknown") return card.migDevices;
    for (const mig of card.migDevices.value) {
      if (mig.identity.kind === "unknown") return mig.identity;
      out.push(mig.identity.value);
    }
  }
  return known(out, clock);
}

/** The card as one device when its MIG is off; Known(null) when MIG is on (only its MIG devices are used). */
function wholeCard(card: PhysicalGpu, clock: Clock): Observation<DeviceIdentity | null> {
  if (card.migMode.kind === "unknown") {
    return unknown(card.migMode.reason, clock, `GPU ${card.index}'s MIG mode: ${card.migMode.detail}`);
  }
  if (card.migMode.value !== null && card.migMode.value.current) return known(null, clock);
  return card.identity;
}

/**
 * What CUDA addresses when a card is named whole (by ordinal, card UUID, or no mask at all): the card
 * with MIG off; with MIG on, which of its MIG devices CUDA then shows is not read here (Unknown).
 */
function cudaUnitsOf(card: PhysicalGpu, clock: Clock): Observation<DeviceIdentity[]> {
  const whole = wholeCard(card, clock);
  if (whole.kind === "unknown") return whole;
  if (whole.value !== null) return known([whole.value], clock);
  return unknown(
    "unsupported",
    clock,
    `GPU ${card.index} has MIG on: which of its MIG devices CUDA shows for the whole card is not read here; ` +
      "name them by MIG UUID",
  );
}

/** The devices CUDA addresses with no mask: every card, each as {@link cudaUnitsOf} reads it. */
function addressable(cards: readonly PhysicalGpu[], clock: Clock): Observation<DeviceIdentity[]> {
  const out: DeviceIdentity[] = [];
  for (const card of cards) {
    const units = cudaUnitsOf(card, clock);
    if (units.kind === "unknown") return units;
    out.push(...units.value);
  }
  return known(out, clock);
}

/** Entries CUDA reads as "no device" outright. */
const NO_DEVICE_ENTRIES: ReadonlySet<string> = new Set(["", "-1", "NoDevFiles"]);

/** One mask entry against the host: the devices it names, null when it names none (the list ends). */
function resolveEntry(
  entry: string,
  cards: readonly PhysicalGpu[],
  ordinalsAreNvml: boolean,
  clock: Clock,
): Observation<DeviceIdentity[]> | null {
  if (NO_DEVICE_ENTRIES.has(entry)) return null;
  if (/^\d+$/.test(entry)) {
    const ordinal = Number(entry);
    if (ordinal >= cards.length) return null;
    if (!ordinalsAreNvml) {
      return unknown(
        "unsupported",
        clock,
        `CUDA_VISIBLE_DEVICES entry ${entry} is a CUDA ordinal, which names a particular card only under ` +
          `${CUDA_DEVICE_ORDER}=PCI_BUS_ID (this host has ${cards.length} cards)`,
      );
    }
    return cudaUnitsOf(cards[ordinal], clock);
  }
  if (entry.startsWith("GPU-")) {
    const matches = cards.filter((card) => card.uuid.kind === "known" && card.uuid.value.startsWith(entry));
    const unread = cards.find((card) => card.uuid.kind === "unknown");
    if (matches.length > 1) {
      return unknown("malformed", clock, `CUDA_VISIBLE_DEVICES entry ${entry} is a prefix of several UUIDs`);
    }
    if (matches.length === 0) {
      return unread !== undefined && unread.uuid.kind === "unknown"
        ? unknown(unread.uuid.reason, clock, `GPU ${unread.index}'s UUID: ${unread.uuid.detail}`)
        : null;
    }
    return cudaUnitsOf(matches[0], clock);
  }
  if (entry.startsWith("MIG-GPU-")) {
    return unknown(
      "unsupported",
      clock,
      `CUDA_VISIBLE_DEVICES entry ${entry} is the older MIG-GPU-<uuid>/<gi>/<ci> form, not read here: ` +
        "name MIG devices by their MIG UUID",
    );
  }
  if (entry.startsWith("MIG-")) {
    const found: DeviceIdentity[] = [];
    for (const card of cards) {
      if (card.migDevices.kind === "unknown") {
        return unknown(
          card.migDevices.reason,
          clock,
          `GPU ${card.index}'s MIG devices: ${card.migDevices.detail}`,
        );
      }
      for (const mig of card.migDevices.value) {
        if (mig.uuid.kind === "known" && mig.uuid.value.startsWith(entry)) {
          if (mig.identity.kind === "unknown") return mig.identity;
          found.push(mig.identity.value);
        }
      }
    }
    if (found.length > 1) {
      return unknown("malformed", clock, `CUDA_VISIBLE_DEVICES entry ${entry} is a prefix of several UUIDs`);
    }
    return found.length === 0 ? null : known(found, clock);
  }
  return null;
}

/**
 * The devices this process can address through its mask (module doc: the CUDA semantics read), in CUDA
 * index order, with the entries that ended the list; Unknown when the host cannot be read, or the mask
 * names a device it cannot tell (an ordinal without PCI order, an ambiguous UUID prefix, a device named
 * twice).
 */
export function enumerateDevices(
  environ: GrantEnviron,
  host: Pick<HostGpus, "devices">,
  clock: Clock = systemClock,
): Enumeration {
  if (host.devices.kind === "unknown") return { devices: host.devices, ignored: [] };
  const cards = host.devices.value;
  const mask = environ[CUDA_VISIBLE_DEVICES];
  if (mask === undefined) return { devices: addressable(cards, clock), ignored: [] };
  const entries = mask.split(",").map((entry) => entry.trim());
  const ordinalsAreNvml = environ[CUDA_DEVICE_ORDER] === "PCI_BUS_ID" || cards.length <= 1;
  const devices: DeviceIdentity[] = [];
  for (const [at, entry] of entries.entries()) {
    const named = resolveEntry(entry, cards, ordinalsAreNvml, clock);
    if (named === null) return { devices: known(devices, clock), ignored: entries.slice(at) };
    if (named.kind === "unknown") return { devices: named, ignored: [] };
    for (const device of named.value) {
      if (devices.some((seen) => deviceKey(seen) === deviceKey(device))) {
        return {
          devices: unknown("malformed", clock, `CUDA_VISIBLE_DEVICES names ${deviceKey(device)} twice`),
          ignored: [],
        };
      }
      devices.push(device);
    }
  }
  return { devices: known(devices, clock), ignored: [] };
}

/**
 * Whether every ordered pair of `devices` reports P2P reads OK in the NVML matrix: Known(true) for fewer
 * than two devices, Known(false) when a device is a MIG slice (slices are never peers) or a pair is not
 * OK, Unknown when the matrix or a pair's status cannot be read (or NVML answers `U`) or a device has no
 * host ordinal.
 */
export function peerAccessObserved(
  devices: readonly DeviceIdentity[],
  host: Pick<HostGpus, "p2p">,
  clock: Clock = systemClock,
): Observation<boolean> {
  if (devices.length < 2) return known(true, clock);
  if (devices.some((device) => device.migUuid !== null)) return known(false, clock);
  const ordinals = devices.map((device) => device.ordinal);
  if (ordinals.some((ordinal) => ordinal === null)) {
    return unknown("unread", clock, "a granted device has no host ordinal to read its P2P status by");
  }
  if (host.p2p.kind === "unknown") return host.p2p;
  const links = host.p2p.value.links;
  for (const from of ordinals) {
    for (const to of ordinals) {
      if (from === to) continue;
      const link = links.find((l) => l.from === from && l.to === to);
      if (link === undefined) {
        return unknown("missing", clock, `NVML lists no P2P link from GPU ${from} to ${to}`);
      }
      if (link.read.kind === "unknown") return link.read;
      if (link.read.value === "U") {
        return unknown("unread", clock, `NVML reports the P2P status from GPU ${from} to ${to} as unknown`);
      }
      if (link.read.value !== "OK") return known(false, clock);
    }
  }
  return known(true, clock);
}

/** How a device is named in a mask: its MIG UUID, else its card UUID, else its ordinal. */
export function maskEntryOf(device: DeviceIdentity): string {
  return device.migUuid ?? device.uuid ?? String(device.ordinal);
}

/** What the grant shows once checked against the mask and the host. */
function fromGrant(
  grant: DeliveredGrant,
  evidence: GrantEvidence,
  clock: Clock,
): { delivered: DeviceIdentity[]; problems: string[]; checks: Record<string, unknown> } {
  const problems: string[] = [];
  const checks: Record<string, unknown> = { policy: grant.policy, workload: grant.workloadId };
  let delivered = [...grant.devices];
  const mask = evidence.environ[CUDA_VISIBLE_DEVICES];
  if (mask === undefined) {
    problems.push(`the grant names ${delivered.length} device(s) but ${CUDA_VISIBLE_DEVICES} is unset`);
  } else {
    const entries = mask.split(",").map((entry) => entry.trim()).filter((entry) => entry !== "");
    const confirmed = delivered.filter((device) => entries.includes(maskEntryOf(device)));
    if (confirmed.length !== delivered.length || entries.length !== delivered.length) {
      problems.push(
        `${CUDA_VISIBLE_DEVICES}=${JSON.stringify(mask)} is not the grant's devices ` +
          `(${delivered.map(maskEntryOf).join(",") || "none"})`,
      );
    }
    delivered = confirmed;
  }
  if (evidence.host.devices.kind === "unknown") {
    checks.nvml = `not read: ${evidence.host.devices.detail}`;
    return { delivered, problems, checks };
  }
  const present = presentDevices(evidence.host.devices.value, clock);
  if (present.kind === "unknown") {
    checks.nvml = `incomplete: ${present.detail}`;
    return { delivered, problems, checks };
  }
  const keys = new Set(present.value.map(deviceKey));
  const missing = delivered.filter((device) => !keys.has(deviceKey(device)));
  for (const device of missing) {
    problems.push(`granted device ${deviceKey(device)} is not one NVML shows on this host`);
  }
  checks.nvml = "checked";
  return { delivered: delivered.filter((device) => !missing.includes(device)), problems, checks };
}

/**
 * What this worker really has (spec `report_backend`): the launcher's grant when it recorded one that
 * observed the host (checked against the mask and NVML), else the enumerated namespace, else
 * `unobserved`. Never throws; {@link verifyGrant} turns it into a decision.
 */
export function reportBackend(demand: GrantDemand, evidence: GrantEvidence): GrantReport {
  const clock = evidence.clock ?? systemClock;
  const mask = evidence.environ[CUDA_VISIBLE_DEVICES] ?? null;
  const problems: string[] = [];
  let details: Record<string, unknown> = {};
  let delivered: Observation<readonly DeviceIdentity[]>;
  let source: GrantSource;
  const grant = evidence.grant;
  if (grant !== null && grant.host === GrantHost.observed) {
    const checked = fromGrant(grant, evidence, clock);
    problems.push(...checked.problems);
    details = checked.checks;
    if (grant.requested !== demand.requested) {
      problems.push(
        `the grant was made for ${grant.requested} GPU(s), the node asks for ${demand.requested}`,
      );
    }
    delivered = known(checked.delivered, clock);
    source = GrantSource.grant;
  } else {
    if (grant !== null) details.grant = `the launcher recorded no host read (${grant.policy})`;
    const enumeration = enumerateDevices(evidence.environ, evidence.host, clock);
    if (enumeration.ignored.length > 0) {
      problems.push(
        `${CUDA_VISIBLE_DEVICES} entries ${enumeration.ignored.join(",")} name no device: CUDA ignores them`,
      );
    }
    delivered = enumeration.devices;
    source = delivered.kind === "known" ? GrantSource.enumeration : GrantSource.unobserved;
  }
  if (delivered.kind === "unknown") {
    problems.push(`its grant of ${demand.requested} GPU(s) cannot be verified: ${delivered.detail}`);
  } else if (delivered.value.length < demand.requested) {
    problems.push(`it was granted ${delivered.value.length} of the ${demand.requested} GPU(s) it asks for`);
  }
  const whole = delivered.kind === "known" && delivered.value.length >= demand.requested;
  const execution = whole
    ? GpuExecution.gpu
    : delivered.kind === "unknown"
    ? GpuExecution.unknown
    : GpuExecution.cpu;
  const peerAccess = !demand.requiresPeerAccess
    ? null
    : delivered.kind === "unknown"
    ? delivered
    : peerAccessObserved(delivered.value, evidence.host, clock);
  return Object.freeze({
    requested: demand.requested,
    delivered,
    source,
    execution,
    exclusive: source === GrantSource.grant && grant !== null && grant.exclusive,
    mask,
    peerAccess,
    problems: Object.freeze(problems),
    evidence: Object.freeze(details),
  });
}

/**
 * The decision before a GPU node opens. Returns the report when the node may open: a whole grant, or a
 * short or unverifiable one under `fallback: "cpu"` (the report names the shortfall). Throws
 * {@link ResourceUnavailable} naming the node and why when `fallback` is `none` and the grant is short,
 * empty or unverifiable, and when peer access is required between more than one device and the grant is
 * not whole or its devices are not verified peers through NVML, whatever the fallback (a node that needs
 * peers is not run on fewer devices).
 */
export function verifyGrant(demand: GrantDemand, evidence: GrantEvidence): GrantReport {
  const report = reportBackend(demand, evidence);
  // The same host refuses the same grant again: no restart mends it.
  const context = {
    node: demand.node,
    requested: demand.requested,
    fallback: demand.fallback,
    source: report.source,
    [LASTING_FAILURE_KEY]: true,
  };
  if (report.execution !== GpuExecution.gpu && demand.fallback === GpuFallback.none) {
    throw new ResourceUnavailable(
      `node ${demand.node} refuses to open: ${report.problems.join("; ")} (gpuFallback "none")`,
      'run it where its GPUs are granted and verifiable, or declare gpuFallback "cpu" to let it open ' +
        "without them",
      context,
    );
  }
  const peer = report.peerAccess;
  if (demand.requested > 1 && peer !== null && !(report.execution === GpuExecution.gpu && isTrue(peer))) {
    // Peers are verified among the devices a node runs on: a short grant has no such set to verify.
    const why = report.execution !== GpuExecution.gpu
      ? `cannot be verified: ${report.problems.join("; ")}`
      : peer.kind === "unknown"
      ? `cannot be verified: ${peer.detail}`
      : "is not there: NVML reports a pair of them without P2P reads (or a MIG slice, which has no peers)";
    throw new ResourceUnavailable(
      `node ${demand.node} refuses to open: peer access between its ${demand.requested} GPUs ${why}`,
      "run it on devices NVML shows as P2P peers, or remove requiresPeerAccess",
      context,
    );
  }
  return report;
}

function isTrue(observation: Observation<boolean>): boolean {
  return observation.kind === "known" && observation.value;
}

/**
 * Whether this worker may load the NVML binding: FFI permission for koffi's module (under the project's
 * `node_modules`, where a pod's command grants it) or for every path. Asked before loading, since koffi
 * once loaded opens a library without asking Deno.
 */
function mayLoadNvmlBinding(): boolean {
  try {
    const binding = new URL(import.meta.resolve("koffi"));
    const path = binding.protocol === "file:" ? fileURLToPath(binding) : undefined;
    return Deno.permissions.querySync({ name: "ffi", path }).state === "granted";
  } catch {
    return false;
  }
}

/**
 * This worker's view of the host's GPUs through NVML, loaded on use: Unknown (never zero devices) when
 * the binding cannot be loaded or the library read here (a sandbox without `--allow-ffi`, no driver).
 */
export async function readHostGpus(clock: Clock = systemClock): Promise<HostGpus> {
  const refused = (detail: string): HostGpus => {
    const none = unknown("unsupported", clock, detail);
    return { devices: none, p2p: none };
  };
  if (!mayLoadNvmlBinding()) return refused("this worker has no FFI permission to load NVML");
  try {
    const { readInventory } = await import("../../nvml/inventory.ts");
    return readInventory({ clock });
  } catch (error) {
    return refused(
      `the NVML binding could not be loaded here: ${error instanceof Error ? error.message : error}`,
    );
  }
}

/** What a worker checks a GPU node's grant with. */
export interface NodeGrantOptions {
  /** The worker's environment: its settings and `CUDA_VISIBLE_DEVICES`. */
  readonly environ: GrantEnviron;
  /** The launcher's grant (`VF_GPU_GRANT_JSON`), or null. */
  readonly grant: DeliveredGrant | null;
  /** Reads the host's GPUs; {@link readHostGpus} by default. Called only for a GPU node. */
  readonly readHost?: () => Promise<HostGpus>;
  /** The clock Unknowns are stamped with; the system clock by default. */
  readonly clock?: Clock;
}

/**
 * The worker's entry point: `null` for a node that does not run on GPU, else {@link verifyGrant} of the
 * node's declarations against the grant, its mask and the host's GPUs.
 */
export async function verifyNodeGrant(node: Node, options: NodeGrantOptions): Promise<GrantReport | null> {
  if (!(node instanceof ProcessorNode) || node.deviceType !== DeviceType.gpu) return null;
  const clock = options.clock ?? systemClock;
  const host = await (options.readHost ?? (() => readHostGpus(clock)))();
  return verifyGrant(
    {
      node: node.name,
      requested: node.gpuCount,
      fallback: node.gpuFallback,
      requiresPeerAccess: node.requiresPeerAccess,
    },
    { environ: options.environ, grant: options.grant, host, clock },
  );
}
