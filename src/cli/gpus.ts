/**
 * `vf gpus [DEVICE] [--json]`: this host's GPUs as NVML reports them: a table of the cards and their MIG
 * devices (index, name, UUID, memory, PCI bus, MIG mode, profile, GPU instance), then the P2P matrices
 * (read, write, NVLink, atomics) and the topology's common ancestors. What could not be read is shown
 * as `unknown[N]` with its reason in a note below the tables, never as zero; the command exits 0 with
 * Unknowns shown. DEVICE (an index, a `GPU-` UUID or a `MIG-` UUID) narrows the table to one card or MIG
 * device; one that is not there is exit 3.
 *
 * @module
 */

import { ConfigError, ResourceUnavailable, UnobservableState } from "../core/errors.ts";
import type { ClusterConnection } from "../deploy/cluster_client.ts";
import type { Observation } from "../backends/outcomes.ts";
import { type NvmlInventory, readInventory } from "../../nvml/inventory.ts";
import type { MigDevice } from "../../nvml/mig_devices.ts";
import type { P2pLink } from "../../nvml/p2p_matrix.ts";
import type { PhysicalGpu } from "../../nvml/physical_device.ts";
import type { CommandOutput } from "./command_output.ts";

/** The options `gpus` takes. */
export interface GpusOptions {
  /** Print the whole inventory as JSON instead of the tables. */
  readonly json?: boolean;
  /** `--publish-node NODE`: write the inventory on this Kubernetes node instead of printing it. */
  readonly publishNode?: string;
  /** The cluster `--publish-node` writes to (`--server`/`--token`, else a kubeconfig, else `KUBECONFIG`). */
  readonly cluster?: ClusterConnection;
}

/**
 * Publishes this host's cards on Kubernetes node `node` (the node agent's job); resolves with the exit
 * code. Throws UnobservableState (exit 3) when NVML could not read every card whole: nothing is published.
 */
async function publishCommand(
  node: string,
  connection: ClusterConnection,
  io: CommandOutput,
): Promise<number> {
  // Loaded on use: the Kubernetes client is no other use of `vf gpus`'s to load.
  const { publishedDevicesOf, publishNodeDevices } = await import("../deploy/node_agent.ts");
  const { ClusterClient } = await import("../deploy/cluster_client.ts");
  const { NodeAnnotation } = await import("../deploy/allocation_kubernetes.ts");
  const devices = publishedDevicesOf(readInventory());
  if (devices.kind === "unknown") {
    throw new UnobservableState(
      `this host's GPUs are not published on node ${node}: ${devices.reason}: ${devices.detail}`,
      "run `vf gpus` for what NVML could not read, and check the NVIDIA driver",
      { node },
    );
  }
  const cluster = ClusterClient.connect(connection);
  await publishNodeDevices(cluster, node, devices.value);
  io.out(`published ${devices.value.length} GPU(s) on node ${node} (${NodeAnnotation.devices})`);
  return 0;
}

/** Prints the inventory (or the one device `device` names), or publishes it; resolves with the exit code. */
export function gpusCommand(
  device: string | undefined,
  options: GpusOptions,
  io: CommandOutput,
): Promise<number> {
  if (options.publishNode !== undefined) {
    if (device !== undefined) {
      throw new ConfigError(
        "--publish-node publishes every card: it takes no DEVICE",
        "drop the DEVICE operand",
      );
    }
    return publishCommand(options.publishNode, options.cluster ?? {}, io);
  }
  const inventory = readInventory();
  const selected = device === undefined ? null : select(inventory, device);
  if (options.json) {
    io.out(JSON.stringify(selected ?? inventory, null, 2));
    return Promise.resolve(0);
  }
  const notes = new Notes();
  for (const line of render(inventory, selected, notes)) io.out(line);
  for (const line of notes.lines()) io.out(line);
  return Promise.resolve(0);
}

/** The card or MIG device `device` names, or a ResourceUnavailable saying it is not there (and why, if unread). */
function select(inventory: NvmlInventory, device: string): PhysicalGpu | MigDevice {
  if (inventory.devices.kind === "unknown") {
    throw new ResourceUnavailable(
      `GPU ${
        JSON.stringify(device)
      } cannot be found: this host's GPUs could not be read (${inventory.devices.reason}: ${inventory.devices.detail})`,
      "check the NVIDIA driver (`nvidia-smi`), or point VF_NVML_LIBRARY at libnvidia-ml.so.1",
      { device },
    );
  }
  for (const gpu of inventory.devices.value) {
    if (String(gpu.index) === device || knownIs(gpu.uuid, device)) return gpu;
    if (gpu.migDevices.kind === "known") {
      const slice = gpu.migDevices.value.find((m) => knownIs(m.uuid, device));
      if (slice !== undefined) return slice;
    }
  }
  throw new ResourceUnavailable(
    `GPU ${JSON.stringify(device)} is not on this host`,
    "run `vf gpus` for the indices and UUIDs NVML reports",
    { device, gpus: inventory.devices.value.length },
  );
}

function knownIs(observation: Observation<string>, text: string): boolean {
  return observation.kind === "known" && observation.value === text;
}

/** Unknowns met while rendering, each numbered once and listed with its reason below the tables. */
class Notes {
  readonly #details = new Map<string, number>();

  /** The cell for `observation`: its rendered value, or `unknown[N]` for note N. */
  cell<T>(observation: Observation<T>, render: (value: T) => string = String): string {
    if (observation.kind === "known") return render(observation.value);
    const text = `${observation.reason}: ${observation.detail}`;
    let n = this.#details.get(text);
    if (n === undefined) {
      n = this.#details.size + 1;
      this.#details.set(text, n);
    }
    return `unknown[${n}]`;
  }

  lines(): string[] {
    if (this.#details.size === 0) return [];
    return ["", "unknown:", ...[...this.#details].map(([text, n]) => `  [${n}] ${text}`)];
  }
}

function gib(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(1)} GiB`;
}

function render(inventory: NvmlInventory, selected: PhysicalGpu | MigDevice | null, notes: Notes): string[] {
  const lines = [
    `NVML ${notes.cell(inventory.library)}  driver ${notes.cell(inventory.driverVersion)}`,
  ];
  if (inventory.devices.kind === "unknown") {
    lines.push(`GPUs: ${notes.cell(inventory.devices)}`);
    return lines;
  }
  const gpus = inventory.devices.value;
  const rows: string[][] = [["GPU", "NAME", "UUID", "MEMORY", "PCI", "MIG", "PROFILE", "GI"]];
  for (const gpu of gpus) {
    const slices = gpu.migDevices.kind === "known" ? gpu.migDevices.value : [];
    const showCard = selected === null || selected === gpu;
    const shownSlices = selected === null || selected === gpu ? slices : slices.filter((s) => s === selected);
    if (!showCard && shownSlices.length === 0) continue;
    if (showCard) {
      rows.push([
        String(gpu.index),
        notes.cell(gpu.name),
        notes.cell(gpu.uuid),
        notes.cell(gpu.memory, (m) => gib(m.totalBytes)),
        notes.cell(gpu.pci, (p) => p.busId),
        notes.cell(
          gpu.migMode,
          (m) =>
            m === null
              ? "-"
              : `${m.current ? "on" : "off"}${
                m.pending !== m.current ? ` (${m.pending ? "on" : "off"} after reset)` : ""
              }`,
        ),
        "",
        "",
      ]);
      if (gpu.migDevices.kind === "unknown") {
        rows.push([`${gpu.index}:?`, "MIG devices", notes.cell(gpu.migDevices), "", "", "", "", ""]);
      }
    }
    for (const slice of shownSlices) {
      rows.push([
        `${gpu.index}:${slice.slot}`,
        "",
        notes.cell(slice.uuid),
        notes.cell(slice.memory, (m) => gib(m.totalBytes)),
        "",
        slice.identity.kind === "known" ? "slice" : `slice ${notes.cell(slice.identity)}`,
        notes.cell(slice.profile),
        notes.cell(slice.gpuInstanceId),
      ]);
    }
  }
  lines.push(...table(rows));
  if (selected !== null) return lines;
  if (gpus.length === 0) {
    lines.push("", "no GPUs: NVML answered and counts none");
    return lines;
  }
  for (const gpu of gpus) {
    if (gpu.gpuInstanceProfiles.kind === "known" && gpu.gpuInstanceProfiles.value.length === 0) continue;
    const profiles = notes.cell(
      gpu.gpuInstanceProfiles,
      (list) => list.map((p) => `${notes.cell(p.name)}×${p.instanceCount}`).join(" "),
    );
    lines.push(`GPU ${gpu.index} profiles: ${profiles}`);
  }
  if (inventory.p2p.kind === "unknown") {
    lines.push("", `P2P: ${notes.cell(inventory.p2p)}`);
    return lines;
  }
  if (gpus.length === 1) {
    lines.push("", "P2P: one GPU, no pairs");
    return lines;
  }
  const links = inventory.p2p.value.links;
  for (const field of ["read", "write", "nvlink", "atomics", "commonAncestor"] as const) {
    lines.push("", field === "commonAncestor" ? "topology (common ancestor)" : `P2P ${field}`);
    lines.push(...table(matrix(gpus.length, links, (link) => notes.cell(link[field]))));
  }
  return lines;
}

function matrix(n: number, links: readonly P2pLink[], cell: (link: P2pLink) => string): string[][] {
  const header = ["", ...Array.from({ length: n }, (_, i) => `GPU${i}`)];
  const rows = Array.from({ length: n }, (_, from) => [
    `GPU${from}`,
    ...Array.from({ length: n }, (_, to) => {
      if (from === to) return "X";
      const link = links.find((l) => l.from === from && l.to === to);
      return link === undefined ? "-" : cell(link);
    }),
  ]);
  return [header, ...rows];
}

function table(rows: readonly string[][]): string[] {
  const widths = rows[0].map((_, c) => Math.max(...rows.map((row) => row[c].length)));
  return rows.map((row) => row.map((text, c) => text.padEnd(widths[c])).join("  ").trimEnd());
}
