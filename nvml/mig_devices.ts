/**
 * The MIG devices of a card in MIG mode: each slot `nvmlDeviceGetMigDeviceHandleByIndex` serves, with its
 * UUID, memory, GPU-instance id and profile, and whether NVML confirms which card it belongs to.
 *
 * @module
 */

import { type DeviceIdentity, deviceIdentity } from "../src/backends/allocation.ts";
import type { Observation, Unknown } from "../src/backends/outcomes.ts";
import { NVML_RETURN, NVML_SUCCESS } from "../ffi/nvml_error.ts";
import { nvmlDeviceAttributes_t } from "../ffi/nvml_types.ts";
import { HANDLE_OUT } from "../ffi/out_buffers.ts";
import {
  call,
  type DeviceHandle,
  exactNumber,
  failure,
  noIdentity,
  notSeen,
  type NvmlRead,
  readHandle,
  readStruct,
  readUint,
  seen,
} from "./_reads.ts";
import { type GpuMemory, readMemory, readUuid } from "./device_fields.ts";
import { migProfileName } from "./mig_profile_name.ts";

/** One MIG device (a compute instance inside a GPU instance) of a card. */
export interface MigDevice {
  /** The slot it was read from (`nvmlDeviceGetMigDeviceHandleByIndex`'s index). */
  readonly slot: number;
  /** Its `MIG-…` UUID. */
  readonly uuid: Observation<string>;
  /** Its own memory (`nvmlDeviceGetMemoryInfo` on its handle). */
  readonly memory: Observation<GpuMemory>;
  /** The id of the GPU instance it lives in. */
  readonly gpuInstanceId: Observation<number>;
  /** Its profile as nvidia-smi names it (`3g.20gb`, `1c.3g.20gb`). */
  readonly profile: Observation<string>;
  /** Known(true) once NVML names this device's card as the one it was read from. */
  readonly parentConfirmed: Observation<true>;
  /** The allocation identity; Unknown unless its UUID, profile, card and card identity are all known. */
  readonly identity: Observation<DeviceIdentity>;
}

/** What a MIG device needs from its card. */
export interface MigParent {
  readonly index: number;
  readonly handle: DeviceHandle;
  readonly uuid: Observation<string>;
  readonly name: Observation<string>;
  readonly totalBytes: Observation<number>;
  readonly host: string | null;
}

/** The most MIG slots read from one card; a driver claiming more is not believed. */
const MAX_MIG_SLOTS = 64;

/**
 * Every MIG device of `parent`, by slot (an empty slot, NOT_FOUND, is skipped); Unknown when the slot
 * count cannot be read or a slot fails otherwise (a partial list would hide devices).
 */
export function readMigDevices(read: NvmlRead, parent: MigParent): Observation<readonly MigDevice[]> {
  const slots = readUint(read, "nvmlDeviceGetMaxMigDeviceCount", parent.handle);
  if (slots.kind === "unknown") return slots;
  if (slots.value > MAX_MIG_SLOTS) {
    return notSeen(read, "malformed", `GPU ${parent.index} claims ${slots.value} MIG device slots`);
  }
  const devices: MigDevice[] = [];
  for (let slot = 0; slot < slots.value; slot++) {
    HANDLE_OUT[0] = 0n;
    const code = call(read, "nvmlDeviceGetMigDeviceHandleByIndex", parent.handle, slot, HANDLE_OUT);
    if (typeof code !== "number") return code;
    if (code === NVML_RETURN.NVML_ERROR_NOT_FOUND) continue;
    if (code !== NVML_SUCCESS) {
      return failure(read, "nvmlDeviceGetMigDeviceHandleByIndex", code);
    }
    const handle = HANDLE_OUT[0];
    if (handle === 0n) {
      return notSeen(
        read,
        "malformed",
        `MIG slot ${slot} of GPU ${parent.index} was served without a handle`,
      );
    }
    devices.push(readMigDevice(read, parent, slot, handle));
  }
  return seen(read, Object.freeze(devices));
}

function readMigDevice(
  read: NvmlRead,
  parent: MigParent,
  slot: number,
  handle: DeviceHandle,
): MigDevice {
  const what = `MIG device ${slot} of GPU ${parent.index}`;
  const uuid = readUuid(read, handle, "MIG-", what);
  const memory = readMemory(read, handle, what);
  const gpuInstanceId = readUint(read, "nvmlDeviceGetGpuInstanceId", handle);
  const profile = readProfile(read, handle, parent.totalBytes, what);
  const parentConfirmed = confirmParent(read, handle, parent, what);
  return Object.freeze({
    slot,
    uuid,
    memory,
    gpuInstanceId,
    profile,
    parentConfirmed,
    identity: migIdentity(read, parent, uuid, memory, profile, parentConfirmed, what),
  });
}

function readProfile(
  read: NvmlRead,
  handle: DeviceHandle,
  cardTotalBytes: Observation<number>,
  what: string,
): Observation<string> {
  const attributes = readStruct<
    { gpuInstanceSliceCount: number; computeInstanceSliceCount: number; memorySizeMB: unknown }
  >(
    read,
    "nvmlDeviceGetAttributes_v2",
    nvmlDeviceAttributes_t,
    handle,
  );
  if (attributes.kind === "unknown") return attributes;
  if (cardTotalBytes.kind === "unknown") {
    return notSeen(read, "unread", `${what}'s profile needs its card's memory: ${cardTotalBytes.detail}`);
  }
  const memoryMb = exactNumber(read, attributes.value.memorySizeMB, `${what}'s memory size`);
  if (memoryMb.kind === "unknown") return memoryMb;
  const { gpuInstanceSliceCount: gi, computeInstanceSliceCount: ci } = attributes.value;
  if (gi === 0 || ci === 0 || ci > gi || memoryMb.value === 0) {
    return notSeen(
      read,
      "malformed",
      `${what} reports ${ci} compute slices in ${gi} GPU slices of ${memoryMb.value} MiB`,
    );
  }
  return seen(
    read,
    migProfileName({ gpuInstance: gi, computeInstance: ci }, memoryMb.value, cardTotalBytes.value),
  );
}

function confirmParent(
  read: NvmlRead,
  handle: DeviceHandle,
  parent: MigParent,
  what: string,
): Observation<true> {
  const card = readHandle(read, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle);
  if (card.kind === "unknown") return card;
  if (card.value !== parent.handle) {
    return notSeen(read, "malformed", `${what} names another card as its parent`);
  }
  return seen(read, true);
}

function migIdentity(
  read: NvmlRead,
  parent: MigParent,
  uuid: Observation<string>,
  memory: Observation<GpuMemory>,
  profile: Observation<string>,
  parentConfirmed: Observation<true>,
  what: string,
): Observation<DeviceIdentity> {
  const missing = (field: string, observation: Unknown) => noIdentity(read, what, field, observation);
  if (uuid.kind === "unknown") return missing("UUID", uuid);
  if (profile.kind === "unknown") return missing("profile", profile);
  if (parentConfirmed.kind === "unknown") return missing("card", parentConfirmed);
  if (parent.uuid.kind === "unknown") return missing("card's UUID", parent.uuid);
  if (parent.name.kind === "unknown") return missing("card's name", parent.name);
  return seen(
    read,
    deviceIdentity({
      node: parent.host,
      ordinal: parent.index,
      uuid: parent.uuid.value,
      migUuid: uuid.value,
      product: parent.name.value,
      memoryBytes: memory.kind === "known" ? memory.value.totalBytes : null,
      migProfile: profile.value,
    }),
  );
}
