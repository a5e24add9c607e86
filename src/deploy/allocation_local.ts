/**
 * The local GPU allocator for `run-local` (issue 16): partitions this host's GPUs, as NVML shows them,
 * among the replicas of a flow's GPU nodes, each replica's devices its own, and hands each replica the
 * `CUDA_VISIBLE_DEVICES` and `VF_GPU_GRANT_JSON` its worker checks before the node opens
 * (`src/runtime/gpucheck.ts`).
 *
 * What a replica gets ({@link planLocalGpus}):
 * - `gpuMemoryGib`: one existing MIG device with at least that much memory (the smallest that holds it),
 *   else one whole card (MIG off) with at least that much, the smallest first;
 * - else `gpuCount` whole cards with MIG off; with `requiresPeerAccess` and more than one card, cards whose
 *   every ordered pair NVML reports P2P reads OK (a pair whose status is Unknown is not assumed a peer).
 *
 * Nodes whose `gpuFallback` is `none` are served first, then peer sets, then the larger demands, each
 * replica taking the first devices that serve it (cards by count the ones with the least memory): a
 * greedy plan, not a search, so a fit only another order finds is refused. A replica that cannot be
 * served runs on its node's CPU fallback (`CUDA_VISIBLE_DEVICES` empty, a grant of no devices) and the
 * plan's notes say so; a `none` node, or one that requires peer access across several cards (its worker
 * refuses to run on fewer), that cannot be served refuses the whole flow before anything starts: one
 * {@link ResourceUnavailable} naming every replica and why. A host whose GPUs NVML cannot read is
 * not a host without GPUs: its grants record `host: "unobserved"`, and `none` nodes are refused.
 *
 * It plans for one run; it is not (yet) an `AcceleratorAllocationBackend`, whose contract it cannot keep
 * truthfully on a bare host: the binding reads no device's running processes, so a snapshot's occupancy
 * would be Unknown and, by the contract, partial: it could never admit; nothing on the host holds
 * claims under a compare-and-swap, so two `vf run-local` on one host do not see each other's devices; and
 * it creates no MIG instances (`reconcile` needs the driver's write calls, as root).
 *
 * @example
 * ```ts
 * const plan = planLocalGpus(gpuDemandsOf(flow), readInventory());
 * for (const note of plan.notes) console.log(note);
 * replicaGpuEnv(plan, "detect", 0); // { CUDA_VISIBLE_DEVICES: "GPU-…", VF_GPU_GRANT_JSON: "{…}" }
 * ```
 *
 * @module
 */

import {
  type DeliveredGrant,
  deliveredGrantToDict,
  type DeviceIdentity,
  GPU_GRANT_ENV,
  GrantHost,
} from "../backends/allocation.ts";
import type { Observation } from "../backends/outcomes.ts";
import { ResourceUnavailable } from "../core/errors.ts";
import type { Flow } from "../core/flow.ts";
import { DeviceType, GpuFallback, ProcessorNode } from "../core/node.ts";
import { CUDA_VISIBLE_DEVICES, type HostGpus, maskEntryOf } from "../runtime/gpucheck.ts";
import type { P2pMatrix } from "../../nvml/p2p_matrix.ts";
import type { PhysicalGpu } from "../../nvml/physical_device.ts";

const BYTES_PER_GIB = 2 ** 30;

/** What one GPU node asks of the host, for each of its replicas. */
export interface GpuDemand {
  /** The node's name. */
  readonly node: string;
  /** Its replica count (`nbTasks`). */
  readonly replicas: number;
  /** Whole devices each replica takes. */
  readonly gpuCount: number;
  /** The least memory of the one device each replica takes, or null (whole cards by count). */
  readonly gpuMemoryGib: number | null;
  /** `cpu`: a replica left without devices runs on CPU; `none`: it refuses the flow. */
  readonly fallback: GpuFallback;
  /** Whether its cards must be verified P2P peers (with more than one). */
  readonly requiresPeerAccess: boolean;
}

/** The GPU demands of `flow`: one per processor whose `deviceType` is `gpu`, in the flow's order. */
export function gpuDemandsOf(flow: Flow): GpuDemand[] {
  return flow.topologicalSort()
    .filter((node): node is ProcessorNode =>
      node instanceof ProcessorNode && node.deviceType === DeviceType.gpu
    )
    .map((node) => ({
      node: node.name,
      replicas: node.nbTasks,
      gpuCount: node.gpuCount,
      gpuMemoryGib: node.gpuMemoryGib,
      fallback: node.gpuFallback,
      requiresPeerAccess: node.requiresPeerAccess,
    }));
}

/** Where a replica runs: on its granted devices, or on its node's CPU fallback. */
export const ReplicaExecution = { gpu: "gpu", cpu: "cpu" } as const;
/** One of {@link ReplicaExecution}. */
export type ReplicaExecution = typeof ReplicaExecution[keyof typeof ReplicaExecution];

/** What one replica of a GPU node was given. */
export interface ReplicaGpus {
  /** The node's name. */
  readonly node: string;
  /** The replica's index. */
  readonly replica: number;
  /** Where it runs. */
  readonly execution: ReplicaExecution;
  /** The grant its worker checks (`VF_GPU_GRANT_JSON`); no devices on the CPU fallback. */
  readonly grant: DeliveredGrant;
  /** `CUDA_VISIBLE_DEVICES` (its devices' UUIDs, empty on the CPU fallback) and `VF_GPU_GRANT_JSON`. */
  readonly env: Readonly<Record<string, string>>;
}

/** Every GPU replica's devices, and the lines that tell the user what was decided. */
export interface LocalGpuPlan {
  /** Node name → its replicas' grants, by replica index. */
  readonly replicas: Readonly<Record<string, readonly ReplicaGpus[]>>;
  /** What the user is told before the flow starts: CPU fallbacks taken, devices left out and why. */
  readonly notes: readonly string[];
}

/** The environment replica `replica` of `node` gets from `plan`; none for a node the plan does not hold. */
export function replicaGpuEnv(
  plan: LocalGpuPlan,
  node: string,
  replica: number,
): Readonly<Record<string, string>> {
  return plan.replicas[node]?.[replica]?.env ?? {};
}

/** One device a replica may be given: a card with MIG off, or a MIG device. */
interface Unit {
  readonly identity: DeviceIdentity;
  readonly mig: boolean;
}

/** The units NVML shows whole, and a note for each card or slice left out. */
function unitsOf(cards: readonly PhysicalGpu[]): { units: Unit[]; notes: string[] } {
  const units: Unit[] = [];
  const notes: string[] = [];
  const leftOut = (what: string, why: Observation<unknown>) => {
    if (why.kind === "unknown") notes.push(`${what} is left out: ${why.detail}`);
  };
  for (const card of cards) {
    const what = `GPU ${card.index}`;
    if (card.migMode.kind === "unknown") {
      leftOut(what, card.migMode);
    } else if (card.migMode.value === null || !card.migMode.value.current) {
      if (card.identity.kind === "known") units.push({ identity: card.identity.value, mig: false });
      else leftOut(what, card.identity);
    } else if (card.migDevices.kind === "unknown") {
      leftOut(`the MIG devices of ${what}`, card.migDevices);
    } else {
      for (const device of card.migDevices.value) {
        if (device.identity.kind === "known") units.push({ identity: device.identity.value, mig: true });
        else leftOut(`MIG device ${device.slot} of ${what}`, device.identity);
      }
    }
  }
  return { units, notes };
}

/** Whether every ordered pair of `cards` has P2P reads OK; the first pair that is not, else null. */
function notPeers(cards: readonly Unit[], p2p: Observation<P2pMatrix>): string | null {
  if (p2p.kind === "unknown") return `the P2P matrix cannot be read: ${p2p.detail}`;
  for (const a of cards) {
    for (const b of cards) {
      if (a === b) continue;
      const link = p2p.value.links.find((l) => l.from === a.identity.ordinal && l.to === b.identity.ordinal);
      if (link === undefined) {
        return `NVML lists no link from GPU ${a.identity.ordinal} to ${b.identity.ordinal}`;
      }
      if (link.read.kind === "unknown") {
        return `P2P from GPU ${a.identity.ordinal} to ${b.identity.ordinal} is unknown: ${link.read.detail}`;
      }
      if (link.read.value !== "OK") {
        return `P2P reads from GPU ${a.identity.ordinal} to ${b.identity.ordinal} are ${link.read.value}`;
      }
    }
  }
  return null;
}

/** The first `size` of `pool` (in order) that are all peers, or why none are. */
function peerSet(pool: readonly Unit[], size: number, p2p: Observation<P2pMatrix>): Unit[] | string {
  let first: string | null = null;
  const pick = (from: number, chosen: Unit[]): Unit[] | null => {
    if (chosen.length === size) {
      const why = notPeers(chosen, p2p);
      if (why === null) return chosen;
      first ??= why;
      return null;
    }
    for (let i = from; i <= pool.length - (size - chosen.length); i++) {
      const found = pick(i + 1, [...chosen, pool[i]]);
      if (found !== null) return found;
    }
    return null;
  };
  return pick(0, []) ?? `no ${size} free cards are all P2P peers (the first set tried: ${first})`;
}

const memoryOf = (unit: Unit) => unit.identity.memoryBytes ?? -1;

/** The devices one replica of `demand` takes from `free`, or why it cannot be served. */
function serve(demand: GpuDemand, free: readonly Unit[], p2p: Observation<P2pMatrix>): Unit[] | string {
  if (demand.gpuMemoryGib !== null) {
    const need = demand.gpuMemoryGib * BYTES_PER_GIB;
    const fits = (mig: boolean) =>
      free.filter((u) => u.mig === mig && memoryOf(u) >= need).sort((a, b) => memoryOf(a) - memoryOf(b));
    const [unit] = [...fits(true), ...fits(false)];
    if (unit !== undefined) return [unit];
    const largest = Math.max(-1, ...free.map(memoryOf));
    return `it needs one device with ${demand.gpuMemoryGib} GiB, and ` +
      (largest < 0 ? "no free device's memory is known" : `the largest free one has ${gib(largest)} GiB`);
  }
  // Whole cards by count take the ones with the least memory first, leaving the larger for memory demands.
  const cards = free.filter((unit) => !unit.mig).sort((a, b) => memoryOf(a) - memoryOf(b));
  if (cards.length < demand.gpuCount) {
    return `it needs ${demand.gpuCount} whole card(s) with MIG off, and ${cards.length} are free`;
  }
  if (!demand.requiresPeerAccess || demand.gpuCount === 1) return cards.slice(0, demand.gpuCount);
  const peers = peerSet(cards, demand.gpuCount, p2p);
  return typeof peers === "string" ? `it needs ${demand.gpuCount} peer cards: ${peers}` : peers;
}

function gib(bytes: number): string {
  return (bytes / BYTES_PER_GIB).toFixed(1);
}

/** Whether `demand` needs peers: its worker then refuses anything but its whole grant of verified peers. */
function needsPeers(demand: GpuDemand): boolean {
  return demand.requiresPeerAccess && demand.gpuCount > 1;
}

/** Why a replica of `demand` may not run on its CPU fallback, or null when it may. */
function hardBecause(demand: GpuDemand): string | null {
  if (demand.fallback === GpuFallback.none) return 'gpuFallback "none"';
  return needsPeers(demand) ? "requiresPeerAccess" : null;
}

/** Demands served first: hard ones (`none`), then peer sets, then more devices, then more memory. */
function servingOrder(a: GpuDemand, b: GpuDemand): number {
  const hard = (d: GpuDemand) => d.fallback === GpuFallback.none ? 0 : 1;
  const peer = (d: GpuDemand) => needsPeers(d) ? 0 : 1;
  return hard(a) - hard(b) || peer(a) - peer(b) || b.gpuCount - a.gpuCount ||
    (b.gpuMemoryGib ?? 0) - (a.gpuMemoryGib ?? 0);
}

function replicaOf(
  demand: GpuDemand,
  replica: number,
  devices: readonly DeviceIdentity[],
  host: GrantHost,
  policy: string,
): ReplicaGpus {
  const grant: DeliveredGrant = Object.freeze({
    workloadId: `${demand.node}/${replica}`,
    devices: Object.freeze([...devices]),
    exclusive: devices.length > 0,
    requested: demand.gpuCount,
    policy,
    host,
  });
  return Object.freeze({
    node: demand.node,
    replica,
    execution: devices.length > 0 ? ReplicaExecution.gpu : ReplicaExecution.cpu,
    grant,
    env: Object.freeze({
      [CUDA_VISIBLE_DEVICES]: devices.map(maskEntryOf).join(","),
      [GPU_GRANT_ENV]: JSON.stringify(deliveredGrantToDict(grant)),
    }),
  });
}

/** The policies a grant records. */
export const LocalGrantPolicy = {
  /** Whole cards, each replica's own. */
  exclusive: "local-exclusive",
  /** One existing MIG device, the replica's own. */
  mig: "local-mig",
  /** No device: the node's CPU fallback. */
  cpuFallback: "local-cpu-fallback",
} as const;

/**
 * Partitions `host`'s GPUs among `demands` (module doc). Throws {@link ResourceUnavailable} (exit 3)
 * naming every replica that cannot be served and may not fall back (a `gpuFallback: "none"` node, or one
 * requiring peers across cards), and why, before anything starts; otherwise every replica has its grant,
 * and the notes name each CPU fallback taken.
 */
export function planLocalGpus(demands: readonly GpuDemand[], host: HostGpus): LocalGpuPlan {
  const replicas: Record<string, ReplicaGpus[]> = {};
  const notes: string[] = [];
  const refusals: string[] = [];
  const hold = (demand: GpuDemand, replica: ReplicaGpus) => {
    (replicas[demand.node] ??= [])[replica.replica] = replica;
  };
  if (host.devices.kind === "unknown" || host.devices.value.length === 0) {
    const why = host.devices.kind === "unknown"
      ? `this host's GPUs cannot be read (${host.devices.detail})`
      : "this host has no GPU (NVML counts none)";
    const observed = host.devices.kind === "unknown" ? GrantHost.unobserved : GrantHost.observed;
    for (const demand of demands) {
      const hard = hardBecause(demand);
      if (hard !== null) {
        refusals.push(`node ${demand.node} (${hard}): ${why}`);
        continue;
      }
      notes.push(`node ${demand.node} runs its ${demand.replicas} replica(s) on its CPU fallback: ${why}`);
      for (let r = 0; r < demand.replicas; r++) {
        hold(demand, replicaOf(demand, r, [], observed, LocalGrantPolicy.cpuFallback));
      }
    }
  } else {
    const { units, notes: leftOut } = unitsOf(host.devices.value);
    notes.push(...leftOut);
    let free = units;
    for (const demand of [...demands].sort(servingOrder)) {
      for (let r = 0; r < demand.replicas; r++) {
        const served = serve(demand, free, host.p2p);
        if (typeof served === "string") {
          const hard = hardBecause(demand);
          if (hard !== null) {
            refusals.push(`node ${demand.node} replica ${r} (${hard}): ${served}`);
          } else {
            notes.push(`node ${demand.node} replica ${r} runs on its CPU fallback: ${served}`);
            hold(demand, replicaOf(demand, r, [], GrantHost.observed, LocalGrantPolicy.cpuFallback));
          }
          continue;
        }
        free = free.filter((unit) => !served.includes(unit));
        const policy = served[0].mig ? LocalGrantPolicy.mig : LocalGrantPolicy.exclusive;
        hold(demand, replicaOf(demand, r, served.map((unit) => unit.identity), GrantHost.observed, policy));
      }
    }
  }
  if (refusals.length > 0) {
    throw new ResourceUnavailable(
      `the flow's GPU nodes do not fit this host: ${refusals.join("; ")}`,
      'run it where its GPUs are, lower their gpuCount, gpuMemoryGib or nbTasks, or declare gpuFallback "cpu"',
      { refusals },
    );
  }
  for (const list of Object.values(replicas)) Object.freeze(list);
  return Object.freeze({ replicas: Object.freeze(replicas), notes: Object.freeze(notes) });
}
