/**
 * NVML's C types as koffi declares them, member for member as nvml.h lays them out (a test compares
 * every size and offset with what gcc computes from tests/fixtures/fake_nvml/fake_nvml.h), and the
 * constants of the enums the binding reads. Character arrays are declared `Typed` so their bytes come
 * back raw and their terminator is checked ({@link decodeCString}), never assumed.
 *
 * @module
 */

import koffi from "koffi";

/** `typedef enum nvmlReturn_enum nvmlReturn_t`: an enum without negative values, an `unsigned int`. */
export const nvmlReturn_t = koffi.alias("nvmlReturn_t", "unsigned int");

/** `typedef struct nvmlDevice_st *nvmlDevice_t`: an opaque handle (a BigInt address in koffi 3). */
export const nvmlDevice_t = koffi.pointer("nvmlDevice_t", koffi.opaque("nvmlDevice_st"));

/** `NVML_DEVICE_UUID_V2_BUFFER_SIZE`: a UUID buffer that fits every UUID form. */
export const UUID_BUFFER_SIZE = 96;
/** `NVML_DEVICE_NAME_V2_BUFFER_SIZE`: a product-name buffer that fits every name. */
export const NAME_BUFFER_SIZE = 96;
/** `NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`. */
export const DRIVER_VERSION_BUFFER_SIZE = 80;

/** `nvmlMemory_t`: bytes of device (or MIG device) memory. */
export const nvmlMemory_t = koffi.struct("nvmlMemory_t", {
  total: "unsigned long long", // unsigned long long total
  free: "unsigned long long", // unsigned long long free
  used: "unsigned long long", // unsigned long long used
});

/** `nvmlPciInfo_t`, as `nvmlDeviceGetPciInfo_v3` fills it. */
export const nvmlPciInfo_t = koffi.struct("nvmlPciInfo_t", {
  busIdLegacy: koffi.array("char", 16, "Typed"), // char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE]
  domain: "unsigned int", // unsigned int domain
  bus: "unsigned int", // unsigned int bus
  device: "unsigned int", // unsigned int device
  pciDeviceId: "unsigned int", // unsigned int pciDeviceId (device id << 16 | vendor id)
  pciSubSystemId: "unsigned int", // unsigned int pciSubSystemId
  busId: koffi.array("char", 32, "Typed"), // char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE]
});

/** `nvmlGpuInstanceProfileInfo_t`: what one GPU-instance profile of a MIG-capable card provides. */
export const nvmlGpuInstanceProfileInfo_t = koffi.struct("nvmlGpuInstanceProfileInfo_t", {
  id: "unsigned int", // unsigned int id (the profile id the placement and create calls take)
  isP2pSupported: "unsigned int", // unsigned int isP2pSupported
  sliceCount: "unsigned int", // unsigned int sliceCount
  instanceCount: "unsigned int", // unsigned int instanceCount
  multiprocessorCount: "unsigned int", // unsigned int multiprocessorCount
  copyEngineCount: "unsigned int", // unsigned int copyEngineCount
  decoderCount: "unsigned int", // unsigned int decoderCount
  encoderCount: "unsigned int", // unsigned int encoderCount
  jpegCount: "unsigned int", // unsigned int jpegCount
  ofaCount: "unsigned int", // unsigned int ofaCount
  memorySizeMB: "unsigned long long", // unsigned long long memorySizeMB
});

/** `nvmlGpuInstancePlacement_t`: where a GPU instance may start and how many memory slices it spans. */
export const nvmlGpuInstancePlacement_t = koffi.struct("nvmlGpuInstancePlacement_t", {
  start: "unsigned int", // unsigned int start
  size: "unsigned int", // unsigned int size
});

/** `nvmlDeviceAttributes_t`: what a MIG device handle has (its slices, its memory). */
export const nvmlDeviceAttributes_t = koffi.struct("nvmlDeviceAttributes_t", {
  multiprocessorCount: "unsigned int", // unsigned int multiprocessorCount
  sharedCopyEngineCount: "unsigned int", // unsigned int sharedCopyEngineCount
  sharedDecoderCount: "unsigned int", // unsigned int sharedDecoderCount
  sharedEncoderCount: "unsigned int", // unsigned int sharedEncoderCount
  sharedJpegCount: "unsigned int", // unsigned int sharedJpegCount
  sharedOfaCount: "unsigned int", // unsigned int sharedOfaCount
  gpuInstanceSliceCount: "unsigned int", // unsigned int gpuInstanceSliceCount
  computeInstanceSliceCount: "unsigned int", // unsigned int computeInstanceSliceCount
  memorySizeMB: "unsigned long long", // unsigned long long memorySizeMB
});

/** Every struct above by its C name, for the layout test. */
export const NVML_STRUCTS = {
  nvmlMemory_t,
  nvmlPciInfo_t,
  nvmlGpuInstanceProfileInfo_t,
  nvmlGpuInstancePlacement_t,
  nvmlDeviceAttributes_t,
} as const;

/** `nvmlGpuP2PCapsIndex_t` values the binding asks about. */
export const P2P_CAPS_INDEX = { read: 0, write: 1, nvlink: 2, atomics: 3 } as const;

/** `NVML_DEVICE_MIG_ENABLE` (the other mode is `NVML_DEVICE_MIG_DISABLE`, 0). */
export const MIG_ENABLE = 1;

/**
 * The `NVML_GPU_INSTANCE_PROFILE_*` indices `nvmlDeviceGetGpuInstanceProfileInfo` takes, with the
 * suffix nvidia-smi gives the profile's name (`1g.10gb+me`); a card answers NOT_SUPPORTED for the ones
 * it lacks. The index is not the profile id: the id comes back in the profile's info.
 */
export const GPU_INSTANCE_PROFILES: readonly { readonly index: number; readonly suffix: string }[] = [
  { index: 0x0, suffix: "" }, // NVML_GPU_INSTANCE_PROFILE_1_SLICE
  { index: 0x1, suffix: "" }, // NVML_GPU_INSTANCE_PROFILE_2_SLICE
  { index: 0x2, suffix: "" }, // NVML_GPU_INSTANCE_PROFILE_3_SLICE
  { index: 0x3, suffix: "" }, // NVML_GPU_INSTANCE_PROFILE_4_SLICE
  { index: 0x4, suffix: "" }, // NVML_GPU_INSTANCE_PROFILE_7_SLICE
  { index: 0x5, suffix: "" }, // NVML_GPU_INSTANCE_PROFILE_8_SLICE
  { index: 0x6, suffix: "" }, // NVML_GPU_INSTANCE_PROFILE_6_SLICE
  { index: 0x7, suffix: "+me" }, // NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
  { index: 0x8, suffix: "+me" }, // NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
  { index: 0x9, suffix: "" }, // NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 (twice the memory)
  { index: 0xa, suffix: "+gfx" }, // NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX
  { index: 0xb, suffix: "+gfx" }, // NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX
  { index: 0xc, suffix: "+gfx" }, // NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX
  { index: 0xd, suffix: "-me" }, // NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME
  { index: 0xe, suffix: "-me" }, // NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME
  { index: 0xf, suffix: "+me.all" }, // NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME
  { index: 0x10, suffix: "+me.all" }, // NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME
];

/**
 * `nvmlGpuP2PStatus_t` by value, as the codes `nvidia-smi topo -p2p` prints (`DRK`, disabled by a
 * registry key, has no nvidia-smi letter).
 */
export const P2P_STATUS: Readonly<Record<number, string>> = {
  0: "OK", // NVML_P2P_STATUS_OK
  1: "CNS", // NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED
  2: "GNS", // NVML_P2P_STATUS_GPU_NOT_SUPPORTED
  3: "TNS", // NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED
  4: "DRK", // NVML_P2P_STATUS_DISABLED_BY_REGKEY
  5: "NS", // NVML_P2P_STATUS_NOT_SUPPORTED
  6: "U", // NVML_P2P_STATUS_UNKNOWN
};

/** `nvmlGpuTopologyLevel_t` by value, as the words `nvidia-smi topo -m` abbreviates. */
export const TOPOLOGY_LEVEL: Readonly<Record<number, string>> = {
  0: "internal", // NVML_TOPOLOGY_INTERNAL: the same board
  10: "single", // NVML_TOPOLOGY_SINGLE: one PCIe switch (PIX)
  20: "multiple", // NVML_TOPOLOGY_MULTIPLE: several PCIe switches (PXB)
  30: "hostbridge", // NVML_TOPOLOGY_HOSTBRIDGE: one host bridge (PHB)
  40: "node", // NVML_TOPOLOGY_NODE: one NUMA node (NODE)
  50: "system", // NVML_TOPOLOGY_SYSTEM: across NUMA nodes (SYS)
};
