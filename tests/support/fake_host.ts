/**
 * The host GPUs the fake NVML serves for a fixture, read once through a session of its own, for the
 * tests of what reads the inventory (gpucheck, the local allocator).
 *
 * @module
 */

import { type NvmlInventory, readInventory } from "../../nvml/inventory.ts";
import { closeNvml } from "../../nvml/session.ts";
import { type FakeFixture, useFakeNvml } from "./fake_nvml.ts";

/** The inventory the fake serves for `fixture` (the process's NVML session is closed before and after). */
export async function fakeHost(fixture: FakeFixture): Promise<NvmlInventory> {
  closeNvml();
  await useFakeNvml(fixture);
  try {
    return readInventory();
  } finally {
    closeNvml();
  }
}
