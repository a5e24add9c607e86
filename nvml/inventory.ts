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

import { mapKnown, type Observation } from "../src/backends/outcomes.ts";
import { type Clock, systemClock } from "../src/backends/clock.ts";
import { DRIVER_VERSION_BUFFER_SIZE } from "../ffi/nvml_types.ts";
import { notSeen, readHandle, readText, readUint, seen, snapshotRead } from "./_reads.ts";
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
  /** The clock observations are stamped with; the system clock by default. */
  readonly clock?: Clock;
}

/** The most cards a count is believed for; a larger count is malformed (NVML supports far fewer). */
const MAX_DEVICES = 256;

/**
 * Reads the whole inventory now (synchronously: NVML answers from the driver). Every observation carries
 * the instant the read began, by `options.clock` (the system clock by default).
 */
export function readInventory(options: InventoryOptions = {}): NvmlInventory {
  const session = options.session ?? sharedNvml();
  if (session.kind === "unknown") {
    return Object.freeze({ library: session, driverVersion: session, devices: session, p2p: session });
  }
  const read = snapshotRead(session.value, options.clock ?? systemClock);
  const driverVersion = readText(
    read,
    "nvmlSystemGetDriverVersion",
    null,
    DRIVER_VERSION_BUFFER_SIZE,
    "the driver version",
  );
  const count = readUint(read, "nvmlDeviceGetCount_v2");
  const library = seen(read, session.value.library);
  if (count.kind === "unknown") return Object.freeze({ library, driverVersion, devices: count, p2p: count });
  if (count.value > MAX_DEVICES) {
    const implausible = notSeen(read, "malformed", `nvmlDeviceGetCount_v2 claims ${count.value} GPUs`);
    return Object.freeze({ library, driverVersion, devices: implausible, p2p: implausible });
  }
  const host = options.host ?? null;
  const cards = Array.from(
    { length: count.value },
    (_, index) =>
      readPhysicalDevice(read, index, readHandle(read, "nvmlDeviceGetHandleByIndex_v2", index), host),
  );
  const devices = seen(read, Object.freeze(cards.map((card) => card.gpu)));
  return Object.freeze({
    library,
    driverVersion,
    devices,
    p2p: mapKnown(devices, () => readP2pMatrix(read, cards.map((card) => card.handle))),
  });
}
