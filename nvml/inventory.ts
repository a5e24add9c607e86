/**
 * The GPU inventory of this host through NVML: the driver, every card (with its MIG devices and
 * GPU-instance profiles) and the P2P matrix, each part Known or Unknown with its reason. A host without
 * NVML reads as Unknown everywhere, never as zero GPUs.
 *
 * @example
 * ```ts
 * import { readInventory } from "./inventory.ts";
 * const inventory = readInventory();
 * if (inventory.devices.kind === "known") {
 *   for (const gpu of inventory.devices.value) console.log(gpu.index, gpu.name, gpu.migDevices);
 * } else {
 *   console.log(`GPUs unknown: ${inventory.devices.detail}`);
 * }
 * ```
 *
 * @module
 */

import { known, mapKnown, type Observation, unknown } from "../src/backends/outcomes.ts";
import { DRIVER_VERSION_BUFFER_SIZE } from "../ffi/nvml_types.ts";
import { readHandle, readText, readUint } from "./_reads.ts";
import { type P2pMatrix, readP2pMatrix } from "./p2p_matrix.ts";
import { type PhysicalGpu, readPhysicalDevice } from "./physical_device.ts";
import { type NvmlSession, sharedNvml } from "./session.ts";

/** What NVML showed of this host's GPUs. */
export interface NvmlInventory {
  /** The library read (its name or path). */
  readonly library: Observation<string>;
  /** `nvmlSystemGetDriverVersion` (`550.54.15`). */
  readonly driverVersion: Observation<string>;
  /** Every card NVML counts, in its index order; Unknown when NVML or its count could not be read. */
  readonly devices: Observation<readonly PhysicalGpu[]>;
  /** Peer reach between the cards; Unknown exactly when `devices` is. */
  readonly p2p: Observation<P2pMatrix>;
}

/** What {@link readInventory} reads through and stamps. */
export interface InventoryOptions {
  /** The session to read through; the process's {@link sharedNvml} by default. */
  readonly session?: Observation<NvmlSession>;
  /** The host name put on every identity (`DeviceIdentity.node`); null by default. */
  readonly host?: string | null;
}

/** The most cards a count is believed for; a larger count is malformed (NVML supports far fewer). */
const MAX_DEVICES = 256;

/** Reads the whole inventory now (synchronously: NVML answers from the driver). */
export function readInventory(options: InventoryOptions = {}): NvmlInventory {
  const session = options.session ?? sharedNvml();
  if (session.kind === "unknown") {
    return Object.freeze({ library: session, driverVersion: session, devices: session, p2p: session });
  }
  const nvml = session.value;
  const driverVersion = readText(
    nvml,
    "nvmlSystemGetDriverVersion",
    null,
    DRIVER_VERSION_BUFFER_SIZE,
    "the driver version",
  );
  const count = readUint(nvml, "nvmlDeviceGetCount_v2");
  const library = known(nvml.library);
  if (count.kind === "unknown") return Object.freeze({ library, driverVersion, devices: count, p2p: count });
  if (count.value > MAX_DEVICES) {
    const implausible = unknown("malformed", undefined, `nvmlDeviceGetCount_v2 claims ${count.value} GPUs`);
    return Object.freeze({ library, driverVersion, devices: implausible, p2p: implausible });
  }
  const host = options.host ?? null;
  const read = Array.from(
    { length: count.value },
    (_, index) =>
      readPhysicalDevice(nvml, index, readHandle(nvml, "nvmlDeviceGetHandleByIndex_v2", index), host),
  );
  const devices = known(Object.freeze(read.map((r) => r.gpu)));
  return Object.freeze({
    library,
    driverVersion,
    devices,
    p2p: mapKnown(devices, () => readP2pMatrix(nvml, read.map((r) => r.handle))),
  });
}
