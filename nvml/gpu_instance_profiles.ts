/**
 * The GPU-instance profiles a MIG-capable card offers (`nvmlDeviceGetGpuInstanceProfileInfo` over every
 * `NVML_GPU_INSTANCE_PROFILE_*` index) and where each may be placed
 * (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`): the geometry a MIG planner works from.
 *
 * @module
 */

import type { Observation } from "../src/backends/outcomes.ts";
import { NVML_RETURN, NVML_SUCCESS } from "../ffi/nvml_error.ts";
import { GPU_INSTANCE_PROFILES, nvmlGpuInstanceProfileInfo_t } from "../ffi/nvml_types.ts";
import { decodeStruct, structOut, UINT_OUT } from "../ffi/out_buffers.ts";
import {
  attempt,
  call,
  type DeviceHandle,
  exactNumber,
  failure,
  notSeen,
  type NvmlRead,
  seen,
} from "./_reads.ts";
import { migProfileName } from "./mig_profile_name.ts";

/** Where one GPU instance may start, in memory slices, and how many it spans. */
export interface GpuInstancePlacement {
  /** The first memory slice it may start at. */
  readonly start: number;
  /** How many memory slices it spans. */
  readonly size: number;
}

/** One GPU-instance profile of a card, as NVML reports it. */
export interface GpuInstanceProfile {
  /** The `NVML_GPU_INSTANCE_PROFILE_*` index it was read by. */
  readonly index: number;
  /** The profile id (what placement and creation take). */
  readonly id: number;
  /** nvidia-smi's name for it (`3g.20gb`); Unknown when the card's memory is. */
  readonly name: Observation<string>;
  /** Compute slices. */
  readonly sliceCount: number;
  /** How many instances of it the card holds at most. */
  readonly instanceCount: number;
  /** Its memory, in bytes (NVML reports MiB). */
  readonly memoryBytes: number;
  /** Streaming multiprocessors. */
  readonly multiprocessorCount: number;
  /** Copy engines. */
  readonly copyEngineCount: number;
  /** Video decoders (NVDEC). */
  readonly decoderCount: number;
  /** Video encoders (NVENC). */
  readonly encoderCount: number;
  /** JPEG decoders (NVJPG). */
  readonly jpegCount: number;
  /** Optical-flow accelerators (OFA). */
  readonly ofaCount: number;
  /** Whether an instance of it supports P2P. */
  readonly p2pSupported: boolean;
  /** Where it may be placed; Unknown where the driver cannot say (an older driver lacks the call). */
  readonly placements: Observation<readonly GpuInstancePlacement[]>;
}

interface ProfileInfo {
  id: number;
  isP2pSupported: number;
  sliceCount: number;
  instanceCount: number;
  multiprocessorCount: number;
  copyEngineCount: number;
  decoderCount: number;
  encoderCount: number;
  jpegCount: number;
  ofaCount: number;
  memorySizeMB: number | bigint;
}

/** The most placements one profile is read with; a driver claiming more is not believed. */
const MAX_PLACEMENTS = 64;
/** Room for {@link MAX_PLACEMENTS} `nvmlGpuInstancePlacement_t` (start, size), reused by every read. */
const PLACEMENT_CELLS = new Uint32Array(2 * MAX_PLACEMENTS);

/** The answers that mean "this card has no such profile", not a failed read. */
const ABSENT: ReadonlySet<number> = new Set([
  NVML_RETURN.NVML_ERROR_NOT_SUPPORTED,
  NVML_RETURN.NVML_ERROR_INVALID_ARGUMENT,
]);

/**
 * Every profile the card at `handle` offers, in index order; Unknown when any index fails with
 * anything but "no such profile" (a partial list would mislead a planner). `cardTotalBytes` names them.
 */
export function readGpuInstanceProfiles(
  read: NvmlRead,
  handle: DeviceHandle,
  cardTotalBytes: Observation<number>,
): Observation<readonly GpuInstanceProfile[]> {
  const profiles: GpuInstanceProfile[] = [];
  for (const { index, suffix } of GPU_INSTANCE_PROFILES) {
    const buffer = structOut(nvmlGpuInstanceProfileInfo_t);
    const code = call(read, "nvmlDeviceGetGpuInstanceProfileInfo", handle, index, buffer);
    if (typeof code !== "number") return code;
    if (ABSENT.has(code)) continue;
    if (code !== NVML_SUCCESS) {
      return failure(read, "nvmlDeviceGetGpuInstanceProfileInfo", code);
    }
    const info = decodeStruct<ProfileInfo>(buffer, nvmlGpuInstanceProfileInfo_t);
    const memoryMb = exactNumber(read, info.memorySizeMB, `profile ${index}'s memory`);
    if (memoryMb.kind === "unknown") return memoryMb;
    const name: Observation<string> = cardTotalBytes.kind === "known" && cardTotalBytes.value > 0
      ? seen(
        read,
        migProfileName({ gpuInstance: info.sliceCount }, memoryMb.value, cardTotalBytes.value, suffix),
      )
      : notSeen(read, "unread", "the card's memory, which names its profiles, could not be read");
    profiles.push(Object.freeze({
      index,
      id: info.id,
      name,
      sliceCount: info.sliceCount,
      instanceCount: info.instanceCount,
      memoryBytes: memoryMb.value * 2 ** 20,
      multiprocessorCount: info.multiprocessorCount,
      copyEngineCount: info.copyEngineCount,
      decoderCount: info.decoderCount,
      encoderCount: info.encoderCount,
      jpegCount: info.jpegCount,
      ofaCount: info.ofaCount,
      p2pSupported: info.isP2pSupported !== 0,
      placements: readPlacements(read, handle, info.id),
    }));
  }
  return seen(read, Object.freeze(profiles));
}

function readPlacements(
  read: NvmlRead,
  handle: DeviceHandle,
  profileId: number,
): Observation<readonly GpuInstancePlacement[]> {
  const symbol = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
  // The array must be large enough for every placement (the count is what NVML wrote): one call with
  // room for more than a card has memory slices.
  PLACEMENT_CELLS.fill(0);
  const filled = UINT_OUT[0];
  filled[0] = MAX_PLACEMENTS;
  const failed = attempt(read, symbol, handle, profileId, PLACEMENT_CELLS, filled);
  if (failed !== null) return failed;
  if (filled[0] > MAX_PLACEMENTS) {
    return notSeen(
      read,
      "malformed",
      `${symbol} claims ${
        filled[0]
      } placements for profile ${profileId}, more than the ${MAX_PLACEMENTS} it had room for`,
    );
  }
  const placements: GpuInstancePlacement[] = [];
  for (let i = 0; i < filled[0]; i++) {
    placements.push(Object.freeze({ start: PLACEMENT_CELLS[2 * i], size: PLACEMENT_CELLS[2 * i + 1] }));
  }
  return seen(read, Object.freeze(placements));
}
