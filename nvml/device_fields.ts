/**
 * The fields NVML reads the same way for a card and for a MIG device: its UUID, product name and memory.
 *
 * @module
 */

import { mapKnown, type Observation } from "../src/backends/outcomes.ts";
import { NAME_BUFFER_SIZE, nvmlMemory_t, UUID_BUFFER_SIZE } from "../ffi/nvml_types.ts";
import {
  type DeviceHandle,
  exactNumber,
  notSeen,
  type NvmlRead,
  readStruct,
  readText,
  seen,
} from "./_reads.ts";

/** Device (or MIG device) memory, in bytes, as `nvmlMemory_t` reports it. */
export interface GpuMemory {
  /** All of it. */
  readonly totalBytes: number;
  /** What is not allocated. */
  readonly freeBytes: number;
  /** What is allocated. */
  readonly usedBytes: number;
}

/** The UUID of `handle`, checked to start with `prefix` (`GPU-`, `MIG-`): anything else is malformed. */
export function readUuid(
  read: NvmlRead,
  handle: DeviceHandle,
  prefix: string,
  what: string,
): Observation<string> {
  const uuid = readText(read, "nvmlDeviceGetUUID", handle, UUID_BUFFER_SIZE, `${what}'s UUID`);
  if (uuid.kind === "known" && !uuid.value.startsWith(prefix)) {
    return notSeen(
      read,
      "malformed",
      `${what}'s UUID ${JSON.stringify(uuid.value)} does not start with ${prefix}`,
    );
  }
  return uuid;
}

/** The product name of `handle`; an empty name is malformed. */
export function readName(read: NvmlRead, handle: DeviceHandle, what: string): Observation<string> {
  const name = readText(read, "nvmlDeviceGetName", handle, NAME_BUFFER_SIZE, `${what}'s name`);
  if (name.kind === "known" && name.value.trim() === "") {
    return notSeen(read, "malformed", `${what}'s name is empty`);
  }
  return name;
}

/** The memory of `handle`; a total of zero, or used or free beyond the total, is malformed. */
export function readMemory(read: NvmlRead, handle: DeviceHandle, what: string): Observation<GpuMemory> {
  const raw = readStruct<{ total: unknown; free: unknown; used: unknown }>(
    read,
    "nvmlDeviceGetMemoryInfo",
    nvmlMemory_t,
    handle,
  );
  if (raw.kind === "unknown") return raw;
  const total = exactNumber(read, raw.value.total, `${what}'s total memory`);
  if (total.kind === "unknown") return total;
  const free = exactNumber(read, raw.value.free, `${what}'s free memory`);
  if (free.kind === "unknown") return free;
  const used = exactNumber(read, raw.value.used, `${what}'s used memory`);
  if (used.kind === "unknown") return used;
  if (total.value === 0 || free.value > total.value || used.value > total.value) {
    return notSeen(
      read,
      "malformed",
      `${what}'s memory does not add up (total ${total.value}, free ${free.value}, used ${used.value} bytes)`,
    );
  }
  return seen(read, Object.freeze({ totalBytes: total.value, freeBytes: free.value, usedBytes: used.value }));
}

/** The total bytes of a memory read, keeping it Unknown when the read was. */
export function totalOf(memory: Observation<GpuMemory>): Observation<number> {
  return mapKnown(memory, (m) => m.totalBytes);
}
