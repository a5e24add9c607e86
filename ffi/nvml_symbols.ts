/**
 * The NVML symbols videoflow calls, with their exact C signatures (nvml.h), versioned names where NVML
 * has versions (`_v2`, `_v3`). Each parameter carries its C declaration beside it. Output pointers are
 * plain pointers: the caller passes a typed array it owns (ffi/out_buffers.ts) and reads it after the
 * call, and character buffers are decoded within their length (ffi/c_string.ts).
 *
 * @module
 */

import koffi from "koffi";
import {
  nvmlDevice_t,
  nvmlDeviceAttributes_t,
  nvmlGpuInstancePlacement_t,
  nvmlGpuInstanceProfileInfo_t,
  nvmlMemory_t,
  nvmlPciInfo_t,
  nvmlReturn_t,
} from "./nvml_types.ts";
import type { SymbolSignature } from "./symbols.ts";

const uint = "unsigned int";
const outUint = koffi.pointer(uint);
const outDevice = koffi.pointer(nvmlDevice_t);
const charBuffer = koffi.pointer("char");

/** The symbol table: name → result and parameters, each with its C declaration. */
export const NVML_SYMBOLS = {
  /** `nvmlReturn_t nvmlInit_v2(void)` */
  nvmlInit_v2: { result: nvmlReturn_t, parameters: [] },
  /** `nvmlReturn_t nvmlShutdown(void)` */
  nvmlShutdown: { result: nvmlReturn_t, parameters: [] },
  /** `const char *nvmlErrorString(nvmlReturn_t result)` */
  nvmlErrorString: {
    result: "const char *",
    parameters: [
      nvmlReturn_t, // nvmlReturn_t result
    ],
  },
  /** `nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)` */
  nvmlSystemGetDriverVersion: {
    result: nvmlReturn_t,
    parameters: [
      charBuffer, // char *version
      uint, // unsigned int length
    ],
  },
  /** `nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)` */
  nvmlDeviceGetCount_v2: {
    result: nvmlReturn_t,
    parameters: [
      outUint, // unsigned int *deviceCount
    ],
  },
  /** `nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)` */
  nvmlDeviceGetHandleByIndex_v2: {
    result: nvmlReturn_t,
    parameters: [
      uint, // unsigned int index
      outDevice, // nvmlDevice_t *device
    ],
  },
  /** `nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)` */
  nvmlDeviceGetUUID: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device
      charBuffer, // char *uuid
      uint, // unsigned int length
    ],
  },
  /** `nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)` */
  nvmlDeviceGetName: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device
      charBuffer, // char *name
      uint, // unsigned int length
    ],
  },
  /** `nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)` */
  nvmlDeviceGetMemoryInfo: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device
      koffi.pointer(nvmlMemory_t), // nvmlMemory_t *memory
    ],
  },
  /** `nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)` */
  nvmlDeviceGetPciInfo_v3: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device
      koffi.pointer(nvmlPciInfo_t), // nvmlPciInfo_t *pci
    ],
  },
  /**
   * `nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
   * unsigned int *pendingMode)`
   */
  nvmlDeviceGetMigMode: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device
      outUint, // unsigned int *currentMode
      outUint, // unsigned int *pendingMode
    ],
  },
  /** `nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)` */
  nvmlDeviceGetMaxMigDeviceCount: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device
      outUint, // unsigned int *count
    ],
  },
  /**
   * `nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
   * nvmlDevice_t *migDevice)`
   */
  nvmlDeviceGetMigDeviceHandleByIndex: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device
      uint, // unsigned int index
      outDevice, // nvmlDevice_t *migDevice
    ],
  },
  /** `nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)` */
  nvmlDeviceGetDeviceHandleFromMigDeviceHandle: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t migDevice
      outDevice, // nvmlDevice_t *device
    ],
  },
  /** `nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)` */
  nvmlDeviceGetGpuInstanceId: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device
      outUint, // unsigned int *id
    ],
  },
  /** `nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)` */
  nvmlDeviceGetAttributes_v2: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device
      koffi.pointer(nvmlDeviceAttributes_t), // nvmlDeviceAttributes_t *attributes
    ],
  },
  /**
   * `nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
   * nvmlGpuInstanceProfileInfo_t *info)`
   */
  nvmlDeviceGetGpuInstanceProfileInfo: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device
      uint, // unsigned int profile (an NVML_GPU_INSTANCE_PROFILE_* index)
      koffi.pointer(nvmlGpuInstanceProfileInfo_t), // nvmlGpuInstanceProfileInfo_t *info
    ],
  },
  /**
   * `nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device,
   * unsigned int profileId, nvmlGpuInstancePlacement_t *placements, unsigned int *count)`
   */
  nvmlDeviceGetGpuInstancePossiblePlacements_v2: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device
      uint, // unsigned int profileId
      koffi.pointer(nvmlGpuInstancePlacement_t), // nvmlGpuInstancePlacement_t *placements (room for all, or NULL)
      outUint, // unsigned int *count (out: how many placements were written)
    ],
  },
  /**
   * `nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
   * nvmlGpuP2PCapsIndex_t p2pIndex, nvmlGpuP2PStatus_t *p2pStatus)`
   */
  nvmlDeviceGetP2PStatus: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device1
      nvmlDevice_t, // nvmlDevice_t device2
      uint, // nvmlGpuP2PCapsIndex_t p2pIndex (an enum)
      outUint, // nvmlGpuP2PStatus_t *p2pStatus (an enum)
    ],
  },
  /**
   * `nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
   * nvmlGpuTopologyLevel_t *pathInfo)`
   */
  nvmlDeviceGetTopologyCommonAncestor: {
    result: nvmlReturn_t,
    parameters: [
      nvmlDevice_t, // nvmlDevice_t device1
      nvmlDevice_t, // nvmlDevice_t device2
      outUint, // nvmlGpuTopologyLevel_t *pathInfo (an enum)
    ],
  },
} as const satisfies Readonly<Record<string, SymbolSignature>>;

/** The name of one NVML symbol the binding declares. */
export type NvmlSymbol = keyof typeof NVML_SYMBOLS;

/** Where NVML is looked for: `VF_NVML_LIBRARY`, else the driver's soname, else its usual paths. */
export const NVML_LIBRARY_SEARCH = {
  overrideVariable: "VF_NVML_LIBRARY",
  candidates: [
    "libnvidia-ml.so.1",
    "libnvidia-ml.so",
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64/libnvidia-ml.so.1",
    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
    "/usr/lib/wsl/lib/libnvidia-ml.so.1",
  ],
} as const;
