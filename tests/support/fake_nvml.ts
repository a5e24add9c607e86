/**
 * The fake NVML for tests and benchmarks: tests/fixtures/fake_nvml/fake_nvml.c compiled with gcc into a
 * temporary `libnvidia-ml.so.1` (once per process and variant), fixtures written as JSON beside it, and
 * builders for the cards the stories use (H100 80GB, A100 40GB with MIG, an eight-card NVLink board).
 *
 * @module
 */

import { join } from "node:path";

const SOURCE = new URL("../fixtures/fake_nvml/fake_nvml.c", import.meta.url).pathname;

/** Which symbols the compiled fake exports: all, or those of an older driver (no `_v3` PCI, no placements). */
export type FakeVariant = "current" | "old-driver";

const built = new Map<FakeVariant, Promise<string>>();

/** The path of the fake library compiled for `variant` (compiled on first use, then reused). */
export function fakeNvmlLibrary(variant: FakeVariant = "current"): Promise<string> {
  let path = built.get(variant);
  if (path === undefined) {
    path = compile(variant);
    built.set(variant, path);
  }
  return path;
}

async function compile(variant: FakeVariant): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: `fake_nvml_${variant}_` });
  const out = join(dir, "libnvidia-ml.so.1");
  const flags = variant === "old-driver" ? ["-DFAKE_NVML_OLD_DRIVER"] : [];
  const result = await new Deno.Command("gcc", {
    args: ["-shared", "-fPIC", "-O2", "-Wall", "-Werror", ...flags, "-o", out, SOURCE],
    stderr: "piped",
  }).output();
  if (!result.success) throw new Error(`gcc failed on ${SOURCE}: ${new TextDecoder().decode(result.stderr)}`);
  return out;
}

/** A fixture as fake_nvml.c reads it (see the comment at its top). */
export type FakeFixture = Record<string, unknown>;

/** Writes `fixture` to a temporary JSON file and returns its path. */
export async function writeFixture(fixture: FakeFixture): Promise<string> {
  const path = await Deno.makeTempFile({ prefix: "fake_nvml_fixture_", suffix: ".json" });
  await Deno.writeTextFile(path, JSON.stringify(fixture));
  return path;
}

/**
 * Points the process at the fake (`VF_NVML_LIBRARY`) serving `fixture` (`FAKE_NVML_FIXTURE`), for the
 * NVML sessions opened from now on, and returns both paths, for a subprocess's environment too.
 */
export async function useFakeNvml(
  fixture: FakeFixture,
  variant: FakeVariant = "current",
): Promise<{ readonly VF_NVML_LIBRARY: string; readonly FAKE_NVML_FIXTURE: string }> {
  const env = {
    VF_NVML_LIBRARY: await fakeNvmlLibrary(variant),
    FAKE_NVML_FIXTURE: await writeFixture(fixture),
  };
  for (const [name, value] of Object.entries(env)) Deno.env.set(name, value);
  return env;
}

const MIB = 2 ** 20;

/** One GPU-instance profile of a card, in the fixture's shape. */
function profile(
  index: number,
  id: number,
  slices: number,
  instances: number,
  memoryMB: number,
  sms: number,
  starts: readonly number[],
  size: number,
) {
  return {
    index,
    id,
    slices,
    instances,
    memoryMB,
    sms,
    copyEngines: slices,
    decoders: slices,
    jpegs: 1,
    ofas: index === 7 ? 1 : 0,
    p2p: 0,
    placements: starts.map((start) => [start, size]),
  };
}

const H100_PROFILES = [
  profile(0, 19, 1, 7, 9856, 16, [0, 1, 2, 3, 4, 5, 6], 1),
  profile(1, 14, 2, 3, 19968, 32, [0, 2, 4], 2),
  profile(2, 9, 3, 2, 40192, 60, [0, 4], 4),
  profile(3, 5, 4, 1, 40192, 64, [0], 4),
  profile(4, 0, 7, 1, 80896, 132, [0], 8),
  profile(7, 20, 1, 1, 9856, 16, [0, 1, 2, 3, 4, 5, 6], 1),
  profile(9, 15, 1, 4, 19968, 26, [0, 2, 4, 6], 2),
];

const A100_PROFILES = [
  profile(0, 19, 1, 7, 4864, 14, [0, 1, 2, 3, 4, 5, 6], 1),
  profile(1, 14, 2, 3, 9984, 28, [0, 2, 4], 2),
  profile(2, 9, 3, 2, 19968, 42, [0, 4], 4),
  profile(3, 5, 4, 1, 19968, 56, [0], 4),
  profile(4, 0, 7, 1, 40192, 98, [0], 8),
  profile(7, 20, 1, 1, 4864, 14, [0, 1, 2, 3, 4, 5, 6], 1),
  profile(9, 15, 1, 4, 9984, 14, [0, 2, 4, 6], 2),
];

/** H100 80GB HBM3's memory as NVML reports it (81559 MiB). */
export const H100_TOTAL_BYTES = 81559 * MIB;
/** A100-SXM4-40GB's memory as NVML reports it (40960 MiB). */
export const A100_TOTAL_BYTES = 40960 * MIB;

const BUSES = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

function uuidOf(kind: "GPU" | "MIG", card: number, slot = 0): string {
  const hex = (n: number, width: number) => n.toString(16).padStart(width, "0");
  return `${kind}-${hex(0xa1b2c3d4 + card, 8)}-${hex(slot, 4)}-4e5f-8a9b-${hex(card * 16 + slot, 12)}`;
}

function memory(total: number, used: number) {
  return { total, used, free: total - used };
}

function pci(card: number, deviceId: number) {
  const bus = BUSES[card % BUSES.length];
  return {
    domain: 0,
    bus,
    device: 0,
    pciDeviceId: deviceId,
    pciSubSystemId: 0x16c110de,
    busId: `00000000:${bus.toString(16).toUpperCase().padStart(2, "0")}:00.0`,
  };
}

/** One MIG device in the fixture's shape: `gi` its GPU-instance id, its slices and memory. */
function migDevice(card: number, slot: number, gi: number, slices: number, memoryMB: number) {
  return {
    uuid: uuidOf("MIG", card, slot),
    gi,
    giSlices: slices,
    ciSlices: slices,
    memoryMB,
    memory: memory(memoryMB * MIB, 0),
  };
}

/** An H100 80GB HBM3 at index `card`; with `mig`, in MIG mode with a 3g.40gb, 2g.20gb and 1g.10gb layout. */
export function h100(card: number, mig = false): Record<string, unknown> {
  return {
    uuid: uuidOf("GPU", card),
    name: "NVIDIA H100 80GB HBM3",
    memory: memory(H100_TOTAL_BYTES, 1 * MIB * 512),
    pci: pci(card, 0x233010de),
    mig: mig ? [1, 1] : [0, 0],
    maxMig: 7,
    profiles: H100_PROFILES,
    migDevices: mig
      ? [migDevice(card, 0, 2, 3, 40192), migDevice(card, 1, 5, 2, 19968), migDevice(card, 2, 13, 1, 9856)]
      : [],
  };
}

/** An A100-SXM4-40GB in MIG mode with a 3g.20gb, 2g.10gb and 1g.5gb layout. */
export function a100Mig(card = 0): Record<string, unknown> {
  return {
    uuid: uuidOf("GPU", card),
    name: "NVIDIA A100-SXM4-40GB",
    memory: memory(A100_TOTAL_BYTES, 0),
    pci: pci(card, 0x20b010de),
    mig: [1, 1],
    maxMig: 7,
    profiles: A100_PROFILES,
    migDevices: [
      migDevice(card, 0, 1, 3, 19968),
      migDevice(card, 1, 5, 2, 9984),
      migDevice(card, 2, 13, 1, 4864),
    ],
  };
}

/**
 * Eight H100s on one NVLink board: every pair OK for read, write, NVLink and atomics; the common
 * ancestor is the NUMA node within each half of the board, the system across them.
 */
export function eightH100(mig = false): FakeFixture {
  const n = 8;
  const ok = Array.from({ length: n }, () => Array.from({ length: n }, () => 0));
  return {
    driver: "550.54.15",
    devices: Array.from({ length: n }, (_, card) => h100(card, mig)),
    p2p: { read: ok, write: ok, nvlink: ok, atomics: ok },
    topology: Array.from(
      { length: n },
      (_, a) =>
        Array.from({ length: n }, (_, b) => a === b ? 0 : Math.floor(a / 4) === Math.floor(b / 4) ? 40 : 50),
    ),
  };
}

/** The fixtures the stories are told on. */
export const FIXTURES = {
  noGpu: { driver: "550.54.15", devices: [] },
  oneH100: { driver: "550.54.15", devices: [h100(0)] },
  a100Mig: { driver: "550.54.15", devices: [a100Mig(0)] },
  eightH100: eightH100(),
  eightH100Mig: eightH100(true),
  initFails: { returns: { nvmlInit_v2: 9 }, devices: [h100(0)] },
  memoryFails: {
    driver: "550.54.15",
    devices: [{ ...h100(0), returns: { nvmlDeviceGetMemoryInfo: 15 } }],
  },
  countLies: { driver: "550.54.15", count: 3, devices: [h100(0), h100(1)] },
  uuidUnterminated: { driver: "550.54.15", devices: [{ ...h100(0), unterminated: ["uuid"] }] },
  nameFilled: { driver: "550.54.15", devices: [{ ...h100(0), name: `NVIDIA ${"H".repeat(120)}` }] },
  migParentFails: {
    driver: "550.54.15",
    devices: [{
      ...a100Mig(0),
      migDevices: (a100Mig(0).migDevices as Record<string, unknown>[]).map((device, slot) =>
        slot === 1 ? { ...device, returns: { nvmlDeviceGetDeviceHandleFromMigDeviceHandle: 999 } } : device
      ),
    }],
  },
  unknownReturnCode: {
    driver: "550.54.15",
    devices: [{ ...h100(0), returns: { nvmlDeviceGetPciInfo_v3: 12345 } }],
  },
} as const satisfies Record<string, FakeFixture>;
