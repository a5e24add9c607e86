/**
 * One card as NVML reports it: handle, UUID, name, memory, PCI location, MIG mode, its GPU-instance
 * profiles and its MIG devices, each field read on its own so one failed query leaves the rest known.
 *
 * @module
 */

import { type DeviceIdentity, deviceIdentity } from "../src/backends/allocation.ts";
import { mapKnown, type Observation, type Unknown } from "../src/backends/outcomes.ts";
import { decodeCString } from "../ffi/c_string.ts";
import { NVML_RETURN, NVML_SUCCESS } from "../ffi/nvml_error.ts";
import { MIG_ENABLE, nvmlPciInfo_t } from "../ffi/nvml_types.ts";
import { UINT_OUT } from "../ffi/out_buffers.ts";
import {
  call,
  type DeviceHandle,
  failure,
  noIdentity,
  notSeen,
  type NvmlRead,
  readStruct,
  seen,
} from "./_reads.ts";
import { type GpuMemory, readMemory, readName, readUuid, totalOf } from "./device_fields.ts";
import { type GpuInstanceProfile, readGpuInstanceProfiles } from "./gpu_instance_profiles.ts";
import { type MigDevice, readMigDevices } from "./mig_devices.ts";

/** Where a card sits on the PCI bus (`nvmlPciInfo_t`). */
export interface PciInfo {
  /** `domain:bus:device.function`, as nvidia-smi prints it (`00000000:1B:00.0`). */
  readonly busId: string;
  /** The PCI domain. */
  readonly domain: number;
  /** The PCI bus. */
  readonly bus: number;
  /** The PCI device. */
  readonly device: number;
  /** The PCI device id in the high 16 bits, the vendor id (0x10de) in the low 16. */
  readonly pciDeviceId: number;
  /** The subsystem (board) id. */
  readonly pciSubSystemId: number;
}

/** A card's MIG mode now and after its next reset. */
export interface MigMode {
  /** MIG is on now. */
  readonly current: boolean;
  /** MIG will be on after the card's next reset. */
  readonly pending: boolean;
}

/** One physical GPU. */
export interface PhysicalGpu {
  /** NVML's index (the order of `nvmlDeviceGetHandleByIndex_v2`, PCI bus order; not always CUDA's). */
  readonly index: number;
  /** Its `GPU-…` UUID. */
  readonly uuid: Observation<string>;
  /** Its product name (`NVIDIA H100 80GB HBM3`). */
  readonly name: Observation<string>;
  /** Its memory (`nvmlDeviceGetMemoryInfo`). */
  readonly memory: Observation<GpuMemory>;
  /** Where it sits on the PCI bus (`nvmlDeviceGetPciInfo_v3`). */
  readonly pci: Observation<PciInfo>;
  /** Known(null) for a card without MIG (NVML answers NOT_SUPPORTED). */
  readonly migMode: Observation<MigMode | null>;
  /**
   * The GPU-instance profiles it offers; Known([]) for a card without MIG, Unknown for a card with MIG
   * off whose driver lists none until MIG is on.
   */
  readonly gpuInstanceProfiles: Observation<readonly GpuInstanceProfile[]>;
  /** Its MIG devices; Known([]) when MIG is off now or the card has none. */
  readonly migDevices: Observation<readonly MigDevice[]>;
  /** The allocation identity of the whole card; Unknown unless its UUID and name are known. */
  readonly identity: Observation<DeviceIdentity>;
}

/** A card and the handle it was read through (null when NVML gave none). */
export interface ReadGpu {
  readonly gpu: PhysicalGpu;
  readonly handle: DeviceHandle | null;
}

/** Reads card `index` through `handle`; every field Unknown with the handle's failure when there is none. */
export function readPhysicalDevice(
  read: NvmlRead,
  index: number,
  handle: Observation<DeviceHandle>,
  host: string | null,
): ReadGpu {
  if (handle.kind === "unknown") {
    const none = notSeen(read, handle.reason, `GPU ${index} has no handle: ${handle.detail}`);
    return {
      handle: null,
      gpu: Object.freeze({
        index,
        uuid: none,
        name: none,
        memory: none,
        pci: none,
        migMode: none,
        gpuInstanceProfiles: none,
        migDevices: none,
        identity: none,
      }),
    };
  }
  const what = `GPU ${index}`;
  const uuid = readUuid(read, handle.value, "GPU-", what);
  const name = readName(read, handle.value, what);
  const memory = readMemory(read, handle.value, what);
  const migMode = readMigMode(read, handle.value);
  const totalBytes = totalOf(memory);
  const gpuInstanceProfiles = profilesOf(read, handle.value, migMode, totalBytes, index);
  const migDevices = migDevicesOf(read, migMode, {
    index,
    handle: handle.value,
    uuid,
    name,
    totalBytes,
    host,
  });
  return {
    handle: handle.value,
    gpu: Object.freeze({
      index,
      uuid,
      name,
      memory,
      pci: readPci(read, handle.value, what),
      migMode,
      gpuInstanceProfiles,
      migDevices,
      identity: physicalIdentity(read, index, uuid, name, memory, host),
    }),
  };
}

function readMigMode(read: NvmlRead, handle: DeviceHandle): Observation<MigMode | null> {
  const [current, pending] = UINT_OUT;
  current[0] = 0;
  pending[0] = 0;
  const code = call(read, "nvmlDeviceGetMigMode", handle, current, pending);
  if (typeof code !== "number") return code;
  if (code === NVML_RETURN.NVML_ERROR_NOT_SUPPORTED) return seen(read, null);
  if (code !== NVML_SUCCESS) return failure(read, "nvmlDeviceGetMigMode", code);
  return seen(
    read,
    Object.freeze({ current: current[0] === MIG_ENABLE, pending: pending[0] === MIG_ENABLE }),
  );
}

/**
 * The card's GPU-instance profiles: Known([]) for a card without MIG; NVML lists them only while MIG is
 * on, so a card with MIG off that lists none is Unknown (it may well have some), not a card without any.
 */
function profilesOf(
  read: NvmlRead,
  handle: DeviceHandle,
  migMode: Observation<MigMode | null>,
  totalBytes: Observation<number>,
  index: number,
): Observation<readonly GpuInstanceProfile[]> {
  if (migMode.kind === "known" && migMode.value === null) return seen(read, Object.freeze([]));
  const profiles = readGpuInstanceProfiles(read, handle, totalBytes);
  const off = migMode.kind === "known" && migMode.value !== null && !migMode.value.current;
  if (off && profiles.kind === "known" && profiles.value.length === 0) {
    return notSeen(
      read,
      "unsupported",
      `GPU ${index} has MIG off, and NVML lists GPU-instance profiles only while MIG is on`,
    );
  }
  return profiles;
}

function migDevicesOf(
  read: NvmlRead,
  migMode: Observation<MigMode | null>,
  parent: Parameters<typeof readMigDevices>[1],
): Observation<readonly MigDevice[]> {
  if (migMode.kind === "unknown") {
    return notSeen(read, migMode.reason, `GPU ${parent.index}'s MIG mode is unknown: ${migMode.detail}`);
  }
  if (migMode.value === null || !migMode.value.current) return seen(read, Object.freeze([]));
  return readMigDevices(read, parent);
}

function readPci(read: NvmlRead, handle: DeviceHandle, what: string): Observation<PciInfo> {
  const raw = readStruct<{
    busId: Uint8Array;
    domain: number;
    bus: number;
    device: number;
    pciDeviceId: number;
    pciSubSystemId: number;
  }>(read, "nvmlDeviceGetPciInfo_v3", nvmlPciInfo_t, handle);
  if (raw.kind === "unknown") return raw;
  return mapKnown(
    decodeCString(raw.value.busId, `${what}'s PCI bus id`, read.clock),
    (busId) =>
      Object.freeze({
        busId,
        domain: raw.value.domain,
        bus: raw.value.bus,
        device: raw.value.device,
        pciDeviceId: raw.value.pciDeviceId,
        pciSubSystemId: raw.value.pciSubSystemId,
      }),
  );
}

function physicalIdentity(
  read: NvmlRead,
  index: number,
  uuid: Observation<string>,
  name: Observation<string>,
  memory: Observation<GpuMemory>,
  host: string | null,
): Observation<DeviceIdentity> {
  const missing = (field: string, observation: Unknown) =>
    noIdentity(read, `GPU ${index}`, field, observation);
  if (uuid.kind === "unknown") return missing("UUID", uuid);
  if (name.kind === "unknown") return missing("name", name);
  return seen(
    read,
    deviceIdentity({
      node: host,
      ordinal: index,
      uuid: uuid.value,
      migUuid: null,
      product: name.value,
      memoryBytes: memory.kind === "known" ? memory.value.totalBytes : null,
    }),
  );
}
