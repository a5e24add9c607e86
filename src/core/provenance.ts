/**
 * Provenance-aware resolution of a node's GPU requirement (spec core.provenance, RFC 0003 / RFC 0004).
 *
 * A node's `device_type`, `gpu_count`, `gpu_memory_gib` and, at deploy time, its extended-resource name can
 * be declared in several places: the node's own options, a remote component's descriptor, a GPU strategy's
 * resolution and the deploy CLI's default. Each candidate arrives as a {@link Declaration} naming its field,
 * its source and whether it is hard (a requirement) or soft (a default another source may override), and
 * {@link resolveGpuRequirements} is one pure function over them:
 *
 * 1. A hard declaration beats a soft one; among equals {@link SOURCE_PRECEDENCE} decides (node, strategy,
 *    descriptor, cli-default, default).
 * 2. Two hard declarations of one field from different sources that disagree are a
 *    {@link GpuRequirementConflict} whose remedy names both. A single-entry descriptor device list is a hard
 *    `device_type`.
 * 3. A GPU-only requirement (`gpu_count > 1`, or a memory demand) on a node whose device resolves to CPU is
 *    a conflict when the two come from different sources, except that a soft memory demand is set aside
 *    (recorded in `dropped`) on a CPU run. A descriptor's count default is never dropped.
 * 4. `gpu_count > 1` and a memory demand from different sources are a conflict (a model cannot span MIG
 *    slices).
 *
 * Contradictions within one source are the node constructor's to report, not this module's. The result,
 * values plus `{field: source}` provenance, lives beside NodeSpec, never on it, so spec bytes are unchanged.
 *
 * @module
 */

import { ConfigError, GpuRequirementConflict } from "./errors.ts";
import { camelCase, show } from "./_policy_fields.ts";

/** An explicit option on the node or on `component(...)`. */
export const SOURCE_NODE = "node";
/** A GPU strategy's own resolution at deploy time (`mix` stamping a MIG profile). */
export const SOURCE_STRATEGY = "strategy";
/** A remote component's `component.yaml`: `spec.resources.gpu` and `spec.device`. */
export const SOURCE_DESCRIPTOR = "descriptor";
/** A deploy-level default from the CLI (`--gpu-resource-name`). */
export const SOURCE_CLI_DEFAULT = "cli-default";
/** What the framework assumes when nobody says anything. */
export const SOURCE_DEFAULT = "default";
/** Precedence among declarations of equal hardness, highest first; hard beats soft regardless. */
export const SOURCE_PRECEDENCE = [
  SOURCE_NODE,
  SOURCE_STRATEGY,
  SOURCE_DESCRIPTOR,
  SOURCE_CLI_DEFAULT,
  SOURCE_DEFAULT,
] as const;
/** One of {@link SOURCE_PRECEDENCE}. */
export type DeclarationSource = typeof SOURCE_PRECEDENCE[number];

/** `cpu` or `gpu`. */
export const FIELD_DEVICE_TYPE = "device_type";
/** Whole physical GPUs per replica. */
export const FIELD_GPU_COUNT = "gpu_count";
/** GPU memory demand in GiB, or null for none. */
export const FIELD_GPU_MEMORY_GIB = "gpu_memory_gib";
/** The Kubernetes extended-resource name, resolved at deploy time. */
export const FIELD_GPU_RESOURCE_NAME = "gpu_resource_name";
/** Every field of a GPU requirement, in the order a resolution lists them. */
export const FIELDS = [
  FIELD_DEVICE_TYPE,
  FIELD_GPU_COUNT,
  FIELD_GPU_MEMORY_GIB,
  FIELD_GPU_RESOURCE_NAME,
] as const;
/** One of {@link FIELDS}. */
export type GpuField = typeof FIELDS[number];

const CPU = "cpu";
const GPU = "gpu";

/** The fields that only mean something on a GPU node. */
const GPU_ONLY_FIELDS = [FIELD_GPU_COUNT, FIELD_GPU_MEMORY_GIB] as const;

/** One candidate value for one field of a node's GPU requirement. */
export class Declaration {
  /**
   * A declaration that `source` gives `field` the value `value`.
   *
   * @param field one of {@link FIELDS}
   * @param value the declared value (`null` is a legitimate `gpu_memory_gib`: "no memory demand")
   * @param source one of {@link SOURCE_PRECEDENCE}
   * @param hard true for a requirement, false for a default another source may override
   */
  constructor(
    readonly field: GpuField,
    readonly value: unknown,
    readonly source: DeclarationSource,
    readonly hard: boolean = true,
  ) {}
}

/** A field → value or source map over the GPU requirement fields. */
export type GpuFieldMap<V> = Readonly<Partial<Record<GpuField, V>>>;

/** The resolver's answer: the winning value per field and where it came from. */
export interface GpuResolution {
  /** Field → resolved value, in {@link FIELDS} order. */
  readonly values: GpuFieldMap<unknown>;
  /** Field → the source of the winning declaration. */
  readonly provenance: GpuFieldMap<DeclarationSource>;
  /** Field → the source of a soft GPU-only default set aside because the node runs on CPU; empty if none. */
  readonly dropped: GpuFieldMap<DeclarationSource>;
}

/** The soft declarations a node makes by saying nothing: CPU, one device, no memory demand. */
export function builtinDefaults(): Declaration[] {
  return [
    new Declaration(FIELD_DEVICE_TYPE, CPU, SOURCE_DEFAULT, false),
    new Declaration(FIELD_GPU_COUNT, 1, SOURCE_DEFAULT, false),
    new Declaration(FIELD_GPU_MEMORY_GIB, null, SOURCE_DEFAULT, false),
  ];
}

/**
 * The hard declarations an explicit node or `component()` call makes. `deviceType` is always declared (the
 * node API has no "unspecified" device); `gpuCount` and `gpuMemoryGib` only when given: `null` or
 * `undefined` means "I did not say", not zero.
 */
export function nodeDeclarations(
  deviceType: string,
  gpuCount?: number | null,
  gpuMemoryGib?: number | null,
): Declaration[] {
  const declarations = [new Declaration(FIELD_DEVICE_TYPE, deviceType, SOURCE_NODE)];
  if (gpuCount !== null && gpuCount !== undefined) {
    declarations.push(new Declaration(FIELD_GPU_COUNT, gpuCount, SOURCE_NODE));
  }
  if (gpuMemoryGib !== null && gpuMemoryGib !== undefined) {
    declarations.push(new Declaration(FIELD_GPU_MEMORY_GIB, gpuMemoryGib, SOURCE_NODE));
  }
  return declarations;
}

/**
 * What a component descriptor declares. `spec.resources.gpu.count` / `memoryGiB` are soft (defaults, not
 * floors). A single-entry `spec.device` list is a hard `device_type`: a component that only ships a GPU
 * flavor requires a GPU; a two-entry list declares nothing.
 */
export function descriptorDeclarations(
  device: readonly string[],
  gpuCount?: number | null,
  gpuMemoryGib?: number | null,
): Declaration[] {
  const declarations: Declaration[] = [];
  if (device.length === 1) {
    declarations.push(new Declaration(FIELD_DEVICE_TYPE, device[0], SOURCE_DESCRIPTOR));
  }
  if (gpuCount !== null && gpuCount !== undefined) {
    declarations.push(new Declaration(FIELD_GPU_COUNT, gpuCount, SOURCE_DESCRIPTOR, false));
  }
  if (gpuMemoryGib !== null && gpuMemoryGib !== undefined) {
    declarations.push(new Declaration(FIELD_GPU_MEMORY_GIB, gpuMemoryGib, SOURCE_DESCRIPTOR, false));
  }
  return declarations;
}

const DESCRIPTOR_KEYS: Readonly<Record<GpuField, string>> = {
  device_type: "spec.device",
  gpu_count: "spec.resources.gpu.count",
  gpu_memory_gib: "spec.resources.gpu.memoryGiB",
  gpu_resource_name: "spec.resources.gpu",
};

/** Where a reader changes what `source` declared for `field`. */
function where(source: DeclarationSource, field: GpuField): string {
  switch (source) {
    case SOURCE_NODE:
      return `the ${camelCase(field)} option on the node`;
    case SOURCE_STRATEGY:
      return `the GPU strategy's resolved ${field}`;
    case SOURCE_DESCRIPTOR:
      return `${DESCRIPTOR_KEYS[field]} in the component descriptor`;
    case SOURCE_CLI_DEFAULT:
      return field === FIELD_GPU_RESOURCE_NAME
        ? "--gpu-resource-name on the deploy command line"
        : `the deploy command line's default for ${field}`;
    case SOURCE_DEFAULT:
      return `the built-in default for ${field}`;
  }
}

function rank(declaration: Declaration): number {
  return SOURCE_PRECEDENCE.indexOf(declaration.source);
}

/** Sorts by precedence; the sort is stable, so declaration order decides among equals. */
function byPrecedence(declarations: readonly Declaration[]): Declaration[] {
  return [...declarations].sort((a, b) => rank(a) - rank(b));
}

/** Whether a value of a GPU-only field is an actual GPU demand. */
function requiresGpu(field: GpuField, value: unknown): boolean {
  if (field === FIELD_GPU_COUNT) return typeof value === "number" && Number.isInteger(value) && value > 1;
  if (field === FIELD_GPU_MEMORY_GIB) return value !== null && value !== undefined;
  return false;
}

function conflict(
  message: string,
  remedy: string,
  field: GpuField,
  subject: string,
  sources: readonly DeclarationSource[],
): GpuRequirementConflict {
  return new GpuRequirementConflict(message, remedy, { subject, field, sources: [...sources] });
}

function disagreement(subject: string, field: GpuField, first: Declaration, other: Declaration): string {
  if (
    field === FIELD_DEVICE_TYPE && (first.source === SOURCE_DESCRIPTOR || other.source === SOURCE_DESCRIPTOR)
  ) {
    const [asked, supports] = other.source === SOURCE_DESCRIPTOR ? [first, other] : [other, first];
    return `${subject}: device_type ${
      show(asked.value)
    } (${asked.source}) is not supported: spec.device in the ` +
      `component descriptor declares ${show(supports.value)} as the only device the component runs on`;
  }
  return `${subject}: ${field} is declared twice with different values: ${first.source} says ` +
    `${show(first.value)} and ${other.source} says ${
      show(other.value)
    }, and neither is a default the other ` +
    `may override`;
}

/** Rules 1 and 2: the winning candidate of one field, or a conflict between two hard ones. */
function select(
  field: GpuField,
  candidates: readonly Declaration[],
  subject: string,
): Declaration | undefined {
  const hard = byPrecedence(candidates.filter((c) => c.hard));
  if (hard.length === 0) return byPrecedence(candidates)[0];
  const [first, ...rest] = hard;
  for (const other of rest) {
    if (other.source !== first.source && other.value !== first.value) {
      throw conflict(
        disagreement(subject, field, first, other),
        `make the two agree: change ${where(first.source, field)} or ${where(other.source, field)}`,
        field,
        subject,
        [first.source, other.source],
      );
    }
  }
  return first;
}

function groupByField(declarations: Iterable<Declaration>): Map<GpuField, Declaration[]> {
  const byField = new Map<GpuField, Declaration[]>();
  for (const declaration of declarations) {
    if (!(FIELDS as readonly string[]).includes(declaration.field)) {
      throw new ConfigError(
        `unknown GPU requirement field ${show(declaration.field)}`,
        `declare one of ${FIELDS.join(", ")}`,
      );
    }
    if (!(SOURCE_PRECEDENCE as readonly string[]).includes(declaration.source)) {
      throw new ConfigError(
        `unknown declaration source ${show(declaration.source)}`,
        `use one of ${SOURCE_PRECEDENCE.join(", ")}`,
      );
    }
    const list = byField.get(declaration.field) ?? [];
    list.push(declaration);
    byField.set(declaration.field, list);
  }
  return byField;
}

/** Rule 3: GPU-only requirements against a device that resolved to CPU, across sources. */
function settleCpuDevice(
  winners: Map<GpuField, Declaration>,
  byField: Map<GpuField, Declaration[]>,
  subject: string,
): Partial<Record<GpuField, DeclarationSource>> {
  const dropped: Partial<Record<GpuField, DeclarationSource>> = {};
  const device = winners.get(FIELD_DEVICE_TYPE);
  if (device === undefined || device.value === GPU) return dropped;
  for (const field of GPU_ONLY_FIELDS) {
    const winner = winners.get(field);
    if (winner === undefined || !requiresGpu(field, winner.value) || winner.source === device.source) {
      continue;
    }
    if (!winner.hard && field === FIELD_GPU_MEMORY_GIB) {
      dropped[field] = winner.source;
      const applicable = (byField.get(field) ?? []).filter((c) => c.hard || !requiresGpu(field, c.value));
      const replacement = select(field, applicable, subject);
      if (replacement === undefined) winners.delete(field);
      else winners.set(field, replacement);
      continue;
    }
    throw conflict(
      `${subject}: ${field} ${show(winner.value)} (${winner.source}) requires device_type "gpu", but ` +
        `device_type ${show(device.value)} comes from ${device.source}`,
      `set deviceType: "gpu" on the node, or change ${where(winner.source, field)} so it no longer asks ` +
        `for a GPU (gpu_count 1, no gpu_memory_gib)`,
      field,
      subject,
      [device.source, winner.source],
    );
  }
  return dropped;
}

/** Rule 4: whole devices and a memory slice are mutually exclusive, across sources. */
function checkCountAgainstMemory(winners: Map<GpuField, Declaration>, subject: string): void {
  const count = winners.get(FIELD_GPU_COUNT);
  const memory = winners.get(FIELD_GPU_MEMORY_GIB);
  if (count === undefined || memory === undefined || count.source === memory.source) return;
  if (!requiresGpu(FIELD_GPU_COUNT, count.value) || !requiresGpu(FIELD_GPU_MEMORY_GIB, memory.value)) return;
  throw conflict(
    `${subject}: gpu_count ${show(count.value)} (${count.source}) and gpu_memory_gib ${show(memory.value)} ` +
      `(${memory.source}) are mutually exclusive: a model cannot span MIG slices, so a node declares either ` +
      `a fraction of one device or whole devices, never both`,
    `change ${where(count.source, FIELD_GPU_COUNT)} (gpu_count 1 keeps the memory demand) or ` +
      `${where(memory.source, FIELD_GPU_MEMORY_GIB)}`,
    FIELD_GPU_MEMORY_GIB,
    subject,
    [count.source, memory.source],
  );
}

/**
 * Resolves a node's GPU requirement from every declaration made about it, in any order. Every field the
 * caller cares about should carry a soft {@link SOURCE_DEFAULT} declaration (see {@link builtinDefaults})
 * so its provenance is always recorded. `subject` names the node in an error (`component "acme/x"`).
 *
 * Throws {@link GpuRequirementConflict} (code `VF_CAPABILITY`) when two sources make incompatible
 * declarations (the module rules 2–4; the remedy names both sources), and {@link ConfigError} for a
 * declaration with an unknown field or source.
 */
export function resolveGpuRequirements(declarations: Iterable<Declaration>, subject = "node"): GpuResolution {
  const byField = groupByField(declarations);
  const winners = new Map<GpuField, Declaration>();
  for (const [field, candidates] of byField) {
    const winner = select(field, candidates, subject);
    if (winner !== undefined) winners.set(field, winner);
  }
  const dropped = settleCpuDevice(winners, byField, subject);
  checkCountAgainstMemory(winners, subject);
  const values: Partial<Record<GpuField, unknown>> = {};
  const provenance: Partial<Record<GpuField, DeclarationSource>> = {};
  for (const field of FIELDS) {
    const winner = winners.get(field);
    if (winner === undefined) continue;
    values[field] = winner.value;
    provenance[field] = winner.source;
  }
  return { values, provenance, dropped };
}
