/** The allocation stories against the in-memory cluster (device plugin, or managed MIG for geometry). */
import { AllocationAuthority, MemoryAllocationBackend } from "../../../src/backends/memory/allocation.ts";
import { allocationScenarios } from "./scenarios.ts";

allocationScenarios({
  name: "memory",
  geometry: true,
  create: (options) => {
    const backend = new MemoryAllocationBackend(options.nodes, {
      clock: options.clock,
      authority: options.geometry ? AllocationAuthority.managedMig : AllocationAuthority.devicePlugin,
      migApplySeconds: options.migApplySeconds ?? 0,
    });
    return Promise.resolve({ backend, hooks: backend });
  },
});
