/**
 * The NVIDIA MIG manager's side of a node's geometry, as the Kubernetes allocator drives it: the node
 * labels it watches and answers (`nvidia.com/mig.config`, the name of a configuration;
 * `nvidia.com/mig.config.state`, `pending` → `success` or `failed`), the mig-parted configuration
 * document those names resolve in (`version: v1`, `mig-configs:` name → device filters with
 * `mig-enabled` and `mig-devices`), and what a GPU's published MIG geometry (NVML's profiles and
 * placements, {@link NodeMigGeometry}) says of a layout: the profile that holds a demand, and whether a
 * layout fits an empty GPU, both answered by the planner of `mig.ts`.
 *
 * @module
 */

import { parse as parseYaml, stringify as stringifyYaml } from "yaml";
import { UnobservableState } from "../core/errors.ts";
import { type MigDeviceGeometry, migLayoutFits, type MigProfileInfo, planMigLayout } from "./mig.ts";

/** The MIG manager's node labels. */
export const MigLabel = {
  /** The configuration the node is asked to apply (written by whoever owns the node's geometry). */
  config: "nvidia.com/mig.config",
  /** What the manager reports of the last configuration it saw: `pending`, `success`, `failed`. */
  state: "nvidia.com/mig.config.state",
} as const;

/** What `nvidia.com/mig.config.state` says. */
export const MigState = { pending: "pending", success: "success", failed: "failed" } as const;

/** The configuration that turns MIG off: always present in the document. */
export const MIG_DISABLED = "all-disabled";

/** The key of the mig-parted document in its ConfigMap. */
export const MIG_PARTED_KEY = "config.yaml";

/** A GPU's MIG geometry as a node agent publishes it from NVML: {@link MigDeviceGeometry} without instances. */
export type NodeMigGeometry = Omit<MigDeviceGeometry, "device" | "instances">;

/** Configuration name → the layout each GPU of a node gets (profile → instances; empty: MIG off). */
export type MigConfigs = Readonly<Record<string, Readonly<Record<string, number>>>>;

/** The mig-parted document of `configs`, with {@link MIG_DISABLED} always in it. */
export function migPartedDocument(configs: MigConfigs): string {
  const entries: Record<string, unknown> = { [MIG_DISABLED]: [{ devices: "all", "mig-enabled": false }] };
  for (const name of Object.keys(configs).sort()) {
    if (name === MIG_DISABLED) continue;
    entries[name] = [{ devices: "all", "mig-enabled": true, "mig-devices": { ...configs[name] } }];
  }
  return stringifyYaml({ version: "v1", "mig-configs": entries });
}

/**
 * The configurations of a mig-parted document (each one's first entry, which applies to all devices);
 * throws {@link UnobservableState} for a document that is not one.
 */
export function parseMigParted(text: string): Record<string, Record<string, number>> {
  const bad = () =>
    new UnobservableState("the mig-parted configuration cannot be read", "fix the ConfigMap's config.yaml");
  let document: unknown;
  try {
    document = parseYaml(text);
  } catch {
    throw bad();
  }
  const configs = (document as { "mig-configs"?: unknown } | null)?.["mig-configs"];
  if (typeof configs !== "object" || configs === null) throw bad();
  const out: Record<string, Record<string, number>> = {};
  for (const [name, entries] of Object.entries(configs)) {
    const first = Array.isArray(entries) ? entries[0] : undefined;
    if (typeof first !== "object" || first === null) throw bad();
    const devices = (first as { "mig-devices"?: unknown })["mig-devices"] ?? {};
    if (typeof devices !== "object" || devices === null) throw bad();
    out[name] = Object.fromEntries(Object.entries(devices).map(([p, n]) => [p, Number(n)]));
  }
  return out;
}

function asDevice(geometry: NodeMigGeometry): MigDeviceGeometry {
  return { ...geometry, device: "gpu", instances: [] };
}

/** The profile an empty GPU of `geometry` gives a demand of `gib` (the smallest that holds it), or null. */
export function profileFor(geometry: NodeMigGeometry, gib: number): MigProfileInfo | null {
  const plan = planMigLayout([asDevice(geometry)], [{ id: "demand", gpuMemoryGib: gib }]);
  if (plan.kind !== "planned") return null;
  const name = plan.devices[0].created[0].profile;
  return geometry.profiles.find((p) => p.name === name) ?? null;
}

/** Whether an empty GPU of `geometry` can hold all of `layout` (profile → instances). */
export function layoutFits(geometry: NodeMigGeometry, layout: Readonly<Record<string, number>>): boolean {
  return migLayoutFits(asDevice(geometry), layout);
}
