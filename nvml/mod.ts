/**
 * Typed NVML over ffi/: this host's GPU inventory, read as Known or Unknown field by field.
 *
 * - {@link readInventory}: the driver version, every card ({@link PhysicalGpu}: UUID, name, memory, PCI,
 *   MIG mode, GPU-instance profiles with placements, MIG devices) with its `DeviceIdentity`, and the P2P
 *   matrix ({@link P2pMatrix}).
 * - {@link sharedNvml} / {@link closeNvml}: the process's one NVML session (`nvmlInit_v2` once, then
 *   `nvmlShutdown`); {@link openNvml} for a session of its own.
 *
 * @module
 */

export { type InventoryOptions, type NvmlInventory, readInventory } from "./inventory.ts";
export type { GpuMemory } from "./device_fields.ts";
export type { GpuInstancePlacement, GpuInstanceProfile } from "./gpu_instance_profiles.ts";
export type { MigDevice } from "./mig_devices.ts";
export { migMemoryGb, migProfileName } from "./mig_profile_name.ts";
export type { P2pLink, P2pMatrix, P2pStatus } from "./p2p_matrix.ts";
export type { MigMode, PciInfo, PhysicalGpu } from "./physical_device.ts";
export { closeNvml, type NvmlSession, openNvml, sharedNvml } from "./session.ts";
