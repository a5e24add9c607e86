/**
 * Reading what `nvidia-smi` prints (`-q -x`, `-L`, `topo -p2p r|w|n|a`) and comparing it, field by
 * field, with the NVML inventory: the checks behind tasks/gpu_check.ts. A field NVML could not read is a
 * difference, never an agreement.
 *
 * @module
 */

import { describeObservation, type Observation } from "../src/backends/outcomes.ts";
import type { NvmlInventory } from "../nvml/inventory.ts";
import type { P2pLink } from "../nvml/p2p_matrix.ts";

/** One card as `nvidia-smi -q -x` describes it. */
export interface SmiGpu {
  /** The `<gpu id>`: its PCI bus id. */
  readonly pciBusId: string;
  /** `<product_name>`; null when not printed. */
  readonly name: string | null;
  /** `<uuid>`; null when not printed. */
  readonly uuid: string | null;
  /** `<fb_memory_usage><total>` in MiB; null when not printed as MiB. */
  readonly memoryTotalMib: number | null;
  /** `<current_mig>` (`Enabled`, `Disabled`, `N/A`); null when not printed. */
  readonly migCurrent: string | null;
  /** `<pending_mig>`; null when not printed. */
  readonly migPending: string | null;
}

/** What `nvidia-smi -q -x` says: the driver and the cards, in its order. */
export interface SmiQuery {
  /** `<driver_version>`; null when not printed. */
  readonly driverVersion: string | null;
  /** Every `<gpu>`, in nvidia-smi's order. */
  readonly gpus: readonly SmiGpu[];
}

const ENTITIES: Readonly<Record<string, string>> = { amp: "&", lt: "<", gt: ">", quot: '"', apos: "'" };

function text(raw: string): string {
  return raw.replace(/&(amp|lt|gt|quot|apos);/g, (_, name: string) => ENTITIES[name]).trim();
}

/** The text of the first `<name>` element directly holding text in `xml`, or null. */
function tag(xml: string, name: string): string | null {
  const found = new RegExp(`<${name}>([^<]*)</${name}>`).exec(xml);
  return found === null ? null : text(found[1]);
}

/** The inside of the first `<name>…</name>` in `xml`, or null. */
function section(xml: string, name: string): string | null {
  const found = new RegExp(`<${name}>([\\s\\S]*?)</${name}>`).exec(xml);
  return found === null ? null : found[1];
}

function mib(value: string | null): number | null {
  const found = value === null ? null : /^(\d+) MiB$/.exec(value);
  return found === null ? null : Number(found[1]);
}

/** Parses `nvidia-smi -q -x`. */
export function parseSmiQuery(xml: string): SmiQuery {
  const gpus: SmiGpu[] = [];
  for (const match of xml.matchAll(/<gpu id="([^"]+)">([\s\S]*?)<\/gpu>/g)) {
    const body = match[2].replace(/<mig_devices>[\s\S]*?<\/mig_devices>/, "");
    const mig = section(body, "mig_mode") ?? "";
    gpus.push({
      pciBusId: text(match[1]),
      name: tag(body, "product_name"),
      uuid: tag(body, "uuid"),
      memoryTotalMib: mib(tag(section(body, "fb_memory_usage") ?? "", "total")),
      migCurrent: tag(mig, "current_mig"),
      migPending: tag(mig, "pending_mig"),
    });
  }
  return { driverVersion: tag(xml, "driver_version"), gpus };
}

/** Parses `nvidia-smi -L`: card UUID → its MIG devices' UUIDs and profiles, in order. */
export function parseSmiList(
  output: string,
): Map<string, { readonly uuid: string; readonly profile: string }[]> {
  const cards = new Map<string, { uuid: string; profile: string }[]>();
  let current: { uuid: string; profile: string }[] | null = null;
  for (const line of output.split("\n")) {
    const card = /^GPU \d+: .*\(UUID: (GPU-[^)]+)\)/.exec(line);
    if (card !== null) {
      current = [];
      cards.set(card[1], current);
      continue;
    }
    const slice = /^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)/.exec(line);
    if (slice !== null && current !== null) current.push({ profile: slice[1], uuid: slice[2] });
  }
  return cards;
}

/** Parses a `nvidia-smi topo -p2p` matrix: `from,to` → its code (OK, NS, CNS, GNS, TNS, U). */
export function parseSmiP2p(output: string): Map<string, string> {
  const cells = new Map<string, string>();
  for (const line of output.split("\n")) {
    const row = /^\s*GPU(\d+)\s+(.*)$/.exec(line);
    if (row === null) continue;
    const codes = row[2].trim().split(/\s+/);
    if (!codes.includes("X")) continue;
    codes.forEach((code, to) => cells.set(`${row[1]},${to}`, code));
  }
  return cells;
}

/** One field compared: what NVML read and what nvidia-smi printed. */
export interface FieldComparison {
  /** What was compared (`GPU 0 name`). */
  readonly field: string;
  /** NVML's value, or its Unknown described. */
  readonly nvml: string;
  /** nvidia-smi's value, or `(not printed)`. */
  readonly nvidiaSmi: string;
  /** Both known and equal. */
  readonly agree: boolean;
}

/** What nvidia-smi printed, parsed, for {@link compareWithSmi}. */
export interface SmiReport {
  /** `nvidia-smi -q -x`. */
  readonly query: SmiQuery;
  /** `nvidia-smi -L`. */
  readonly list: Map<string, { readonly uuid: string; readonly profile: string }[]>;
  /** By capability (`read`, `write`, `nvlink`, `atomics`): the parsed matrix. */
  readonly p2p: Readonly<Record<string, Map<string, string>>>;
}

function compared(field: string, nvml: Observation<string>, smi: string | null): FieldComparison {
  const smiText = smi ?? "(not printed)";
  return {
    field,
    nvml: describeObservation(nvml, (v) => v),
    nvidiaSmi: smiText,
    agree: nvml.kind === "known" && smi !== null && nvml.value === smi,
  };
}

function mapped<T>(observation: Observation<T>, f: (value: T) => string): Observation<string> {
  return observation.kind === "known" ? { ...observation, value: f(observation.value) } : observation;
}

/** Every field of `inventory` that nvidia-smi also prints, compared. */
export function compareWithSmi(inventory: NvmlInventory, smi: SmiReport): FieldComparison[] {
  const out: FieldComparison[] = [
    compared("driver version", inventory.driverVersion, smi.query.driverVersion),
  ];
  out.push(
    compared("GPU count", mapped(inventory.devices, (d) => String(d.length)), String(smi.query.gpus.length)),
  );
  if (inventory.devices.kind === "unknown") return out;
  for (const gpu of inventory.devices.value) {
    const busId = gpu.pci.kind === "known" ? gpu.pci.value.busId : null;
    const card = smi.query.gpus.find((g) => g.pciBusId === busId) ?? smi.query.gpus[gpu.index];
    const at = `GPU ${gpu.index}`;
    if (card === undefined) {
      out.push(compared(`${at}`, mapped(gpu.uuid, (u) => u), null));
      continue;
    }
    out.push(compared(`${at} PCI bus id`, mapped(gpu.pci, (p) => p.busId), card.pciBusId));
    out.push(compared(`${at} UUID`, gpu.uuid, card.uuid));
    out.push(compared(`${at} name`, gpu.name, card.name));
    out.push(compared(
      `${at} memory total (MiB)`,
      mapped(gpu.memory, (m) => String(Math.round(m.totalBytes / 2 ** 20))),
      card.memoryTotalMib === null ? null : String(card.memoryTotalMib),
    ));
    const mode = (on: boolean) => on ? "Enabled" : "Disabled";
    out.push(
      compared(
        `${at} MIG current`,
        mapped(gpu.migMode, (m) => m === null ? "N/A" : mode(m.current)),
        card.migCurrent,
      ),
    );
    out.push(
      compared(
        `${at} MIG pending`,
        mapped(gpu.migMode, (m) => m === null ? "N/A" : mode(m.pending)),
        card.migPending,
      ),
    );
    const listed = card.uuid === null ? undefined : smi.list.get(card.uuid);
    out.push(compared(
      `${at} MIG devices (profile UUID)`,
      mapped(
        gpu.migDevices,
        (slices) =>
          slices.map((s) =>
            `${describeObservation(s.profile, (v) => v)} ${describeObservation(s.uuid, (v) => v)}`
          )
            .join(", "),
      ),
      listed === undefined ? null : listed.map((s) => `${s.profile} ${s.uuid}`).join(", "),
    ));
  }
  if (inventory.p2p.kind === "unknown") return out;
  for (const [capability, matrix] of Object.entries(smi.p2p)) {
    for (const link of inventory.p2p.value.links) {
      const field = capability as keyof Pick<P2pLink, "read" | "write" | "nvlink" | "atomics">;
      out.push(
        compared(
          `P2P ${capability} GPU${link.from}→GPU${link.to}`,
          link[field],
          matrix.get(`${link.from},${link.to}`) ?? null,
        ),
      );
    }
  }
  return out;
}
