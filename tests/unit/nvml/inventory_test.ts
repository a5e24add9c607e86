import assert from "node:assert/strict";
import type { Known, Observation, Unknown } from "../../../src/backends/outcomes.ts";
import { FakeClock } from "../../../src/backends/memory/clock.ts";
import { NvmlError } from "../../../ffi/nvml_error.ts";
import { readInventory } from "../../../nvml/inventory.ts";
import { closeNvml, openNvml, sharedNvml } from "../../../nvml/session.ts";
import {
  a100Mig,
  type FakeFixture,
  type FakeVariant,
  FIXTURES,
  h100,
  useFakeNvml,
} from "../../support/fake_nvml.ts";

function value<T>(observation: Observation<T>, what = "observation"): T {
  assert.equal(observation.kind, "known", `${what}: ${JSON.stringify(observation)}`);
  return (observation as Known<T>).value;
}

function why(observation: Observation<unknown>, what = "observation"): Unknown {
  assert.equal(observation.kind, "unknown", `${what} should be unknown: ${JSON.stringify(observation)}`);
  return observation as Unknown;
}

/** The inventory the fake serves for `fixture`, read through a fresh process session. */
async function inventoryOf(fixture: FakeFixture, variant: FakeVariant = "current") {
  closeNvml();
  await useFakeNvml(fixture, variant);
  try {
    return readInventory({ host: "box-1" });
  } finally {
    closeNvml();
  }
}

Deno.test("a library that cannot be loaded is Unknown everywhere with every path tried, never zero GPUs", () => {
  closeNvml();
  Deno.env.set("VF_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
  const inventory = readInventory();
  const devices = why(inventory.devices, "devices");
  assert.equal(devices.reason, "missing");
  assert.match(devices.detail, /NVML could not be loaded: .*\/nonexistent\/libnvidia-ml\.so\.1: /);
  assert.equal(why(inventory.p2p).detail, devices.detail);
  assert.equal(inventory.driverVersion.kind, "unknown");
});

Deno.test("a host whose driver serves no GPU reads as zero GPUs, known, and an empty P2P matrix", async () => {
  const inventory = await inventoryOf(FIXTURES.noGpu);
  assert.deepEqual(value(inventory.devices), []);
  assert.deepEqual(value(inventory.p2p).links, []);
  assert.equal(value(inventory.driverVersion), "550.54.15");
});

Deno.test("one H100 80GB without MIG: every field known, its identity whole; its profiles wait for MIG", async () => {
  const inventory = await inventoryOf(FIXTURES.oneH100);
  const [gpu] = value(inventory.devices);
  assert.equal(value(inventory.devices).length, 1);
  assert.equal(value(gpu.name), "NVIDIA H100 80GB HBM3");
  assert.match(value(gpu.uuid), /^GPU-a1b2c3d4-/);
  assert.deepEqual(value(gpu.memory), {
    totalBytes: 85520809984,
    freeBytes: 84983939072,
    usedBytes: 536870912,
  });
  assert.deepEqual(value(gpu.pci), {
    busId: "00000000:18:00.0",
    domain: 0,
    bus: 0x18,
    device: 0,
    pciDeviceId: 0x233010de,
    pciSubSystemId: 0x16c110de,
  });
  assert.deepEqual(value(gpu.migMode), { current: false, pending: false });
  assert.deepEqual(value(gpu.migDevices), []);
  assert.deepEqual(value(gpu.identity), {
    node: "box-1",
    ordinal: 0,
    uuid: value(gpu.uuid),
    migUuid: null,
    product: "NVIDIA H100 80GB HBM3",
    memoryBytes: 85520809984,
    migProfile: null,
  });
  const profiles = why(gpu.gpuInstanceProfiles);
  assert.equal(profiles.reason, "unsupported");
  assert.match(
    profiles.detail,
    /GPU 0 has MIG off, and NVML lists GPU-instance profiles only while MIG is on/,
  );
});

Deno.test("an A100 40GB in MIG mode lists its 3g.20gb, 2g.10gb and 1g.5gb devices with their identities", async () => {
  const inventory = await inventoryOf(FIXTURES.a100Mig);
  const [gpu] = value(inventory.devices);
  assert.deepEqual(value(gpu.migMode), { current: true, pending: true });
  const slices = value(gpu.migDevices);
  assert.deepEqual(slices.map((s) => value(s.profile)), ["3g.20gb", "2g.10gb", "1g.5gb"]);
  assert.deepEqual(slices.map((s) => value(s.gpuInstanceId)), [1, 5, 13]);
  assert.deepEqual(
    slices.map((s) => value(s.memory).totalBytes),
    [19968, 9984, 4864].map((mb) => mb * 2 ** 20),
  );
  for (const slice of slices) {
    const identity = value(slice.identity);
    assert.equal(identity.uuid, value(gpu.uuid));
    assert.equal(identity.migUuid, value(slice.uuid));
    assert.match(identity.migUuid ?? "", /^MIG-/);
    assert.equal(identity.ordinal, 0);
    assert.equal(identity.product, "NVIDIA A100-SXM4-40GB");
    assert.equal(identity.migProfile, value(slice.profile));
    assert.equal(value(slice.parentConfirmed), true);
  }
  assert.deepEqual(value(gpu.gpuInstanceProfiles).map((p) => value(p.name)), [
    "1g.5gb",
    "2g.10gb",
    "3g.20gb",
    "4g.20gb",
    "7g.40gb",
    "1g.5gb+me",
    "1g.10gb",
  ]);
});

Deno.test("an H100 in MIG mode offers seven GPU-instance profiles with their placements", async () => {
  const [gpu] = value((await inventoryOf(FIXTURES.eightH100Mig)).devices);
  const profiles = value(gpu.gpuInstanceProfiles);
  assert.deepEqual(profiles.map((p) => value(p.name)), [
    "1g.10gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
    "1g.10gb+me",
    "1g.20gb",
  ]);
  const threeG = profiles.find((p) => p.sliceCount === 3)!;
  assert.equal(threeG.id, 9);
  assert.equal(threeG.instanceCount, 2);
  assert.equal(threeG.memoryBytes, 40192 * 2 ** 20);
  assert.deepEqual(value(threeG.placements), [{ start: 0, size: 4 }, { start: 4, size: 4 }]);
});

Deno.test("eight H100s on NVLink: 56 links, every one OK for read, write, NVLink and atomics", async () => {
  const inventory = await inventoryOf(FIXTURES.eightH100);
  assert.equal(value(inventory.devices).length, 8);
  const links = value(inventory.p2p).links;
  assert.equal(links.length, 56);
  for (const link of links) {
    for (const field of ["read", "write", "nvlink", "atomics"] as const) {
      assert.equal(value(link[field], `${link.from}→${link.to} ${field}`), "OK");
    }
    const sameHalf = Math.floor(link.from / 4) === Math.floor(link.to / 4);
    assert.equal(value(link.commonAncestor), sameHalf ? "node" : "system");
  }
  assert.equal(new Set(value(inventory.devices).map((g) => value(g.uuid))).size, 8, "eight distinct UUIDs");
});

Deno.test("an init that fails is Unknown with NVML's own words for it, never zero GPUs", async () => {
  const inventory = await inventoryOf(FIXTURES.initFails);
  const devices = why(inventory.devices);
  assert.equal(devices.reason, "unreachable");
  assert.match(
    devices.detail,
    /did not start: nvmlInit_v2 returned NVML_ERROR_DRIVER_NOT_LOADED \(9\): Driver Not Loaded/,
  );
});

Deno.test("a device whose memory query fails has its memory Unknown and the rest known", async () => {
  const inventory = await inventoryOf(FIXTURES.memoryFails);
  const [gpu] = value(inventory.devices);
  const memory = why(gpu.memory);
  assert.equal(memory.reason, "unreachable");
  assert.match(memory.detail, /nvmlDeviceGetMemoryInfo returned NVML_ERROR_GPU_IS_LOST \(15\): GPU is lost/);
  assert.equal(value(gpu.name), "NVIDIA H100 80GB HBM3");
  assert.equal(value(gpu.pci).busId, "00000000:18:00.0");
  assert.equal(value(gpu.identity).memoryBytes, null, "the identity says the memory is not known");

  const [card] = value(
    (await inventoryOf({ devices: [{ ...a100Mig(0), returns: { nvmlDeviceGetMemoryInfo: 15 } }] })).devices,
  );
  assert.ok(
    value(card.gpuInstanceProfiles).every((p) => why(p.name).reason === "unread"),
    "names need the card's memory",
  );
  for (const slice of value(card.migDevices)) {
    assert.match(why(slice.profile).detail, /profile needs its card's memory: .*NVML_ERROR_GPU_IS_LOST/);
    assert.equal(slice.identity.kind, "unknown");
    assert.equal(value(slice.memory).totalBytes > 0, true, "a slice's own memory is its own read");
  }
});

Deno.test("a count larger than the handles served leaves the missing card Unknown, with its links", async () => {
  const inventory = await inventoryOf(FIXTURES.countLies);
  const devices = value(inventory.devices);
  assert.equal(devices.length, 3);
  assert.equal(value(devices[1].name), "NVIDIA H100 80GB HBM3");
  const ghost = devices[2];
  for (const field of ["uuid", "name", "memory", "pci", "migMode", "migDevices", "identity"] as const) {
    assert.match(why(ghost[field], field).detail, /GPU 2 has no handle: .*NVML_ERROR_INVALID_ARGUMENT/);
  }
  const links = value(inventory.p2p).links;
  assert.equal(links.length, 6);
  assert.ok(links.filter((l) => l.from === 2 || l.to === 2).every((l) => l.read.kind === "unknown"));
});

Deno.test("a UUID without a terminator and a name filled to its buffer are malformed, not read past", async () => {
  const uuidless = value((await inventoryOf(FIXTURES.uuidUnterminated)).devices)[0];
  assert.equal(why(uuidless.uuid).reason, "malformed");
  assert.match(why(uuidless.uuid).detail, /GPU 0's UUID has no terminator within its 96-byte buffer/);
  assert.match(why(uuidless.identity).detail, /GPU 0 has no identity: its UUID is unknown/);
  assert.equal(value(uuidless.name), "NVIDIA H100 80GB HBM3");

  const long = value((await inventoryOf(FIXTURES.nameFilled)).devices)[0];
  assert.match(why(long.name).detail, /GPU 0's name has no terminator within its 96-byte buffer/);
  assert.equal(long.identity.kind, "unknown");
});

Deno.test("a MIG device whose parent query fails has no identity; its siblings keep theirs", async () => {
  const [gpu] = value((await inventoryOf(FIXTURES.migParentFails)).devices);
  const slices = value(gpu.migDevices);
  assert.equal(slices.length, 3);
  assert.match(
    why(slices[1].parentConfirmed).detail,
    /nvmlDeviceGetDeviceHandleFromMigDeviceHandle returned NVML_ERROR_UNKNOWN \(999\): Unknown Error/,
  );
  assert.match(why(slices[1].identity).detail, /MIG device 1 of GPU 0 has no identity: its card is unknown/);
  assert.equal(value(slices[1].profile), "2g.10gb", "what was read is still reported");
  assert.equal(value(slices[0].identity).migProfile, "3g.20gb");
  assert.equal(value(slices[2].identity).migProfile, "1g.5gb");
});

Deno.test("a return code NVML does not define is a malformed field and a typed error naming the code", async () => {
  const [gpu] = value((await inventoryOf(FIXTURES.unknownReturnCode)).devices);
  const pci = why(gpu.pci);
  assert.equal(pci.reason, "malformed");
  assert.match(
    pci.detail,
    /nvmlDeviceGetPciInfo_v3 returned a code NVML does not define \(12345\): Unknown Error/,
  );
  assert.equal(value(gpu.name), "NVIDIA H100 80GB HBM3");

  await useFakeNvml(FIXTURES.oneH100);
  const session = value(openNvml());
  try {
    const error = session.errorFor("nvmlDeviceGetPciInfo_v3", 12345);
    assert.ok(error instanceof NvmlError);
    assert.equal(error.code, "VF_NVML");
    assert.equal(error.exitCode, 3);
    assert.equal(error.returnName, null);
    assert.equal(session.errorFor("nvmlDeviceGetUUID", 3).returnName, "NVML_ERROR_NOT_SUPPORTED");
  } finally {
    session.close();
  }
});

Deno.test("an older driver without nvmlDeviceGetPciInfo_v3 or placements has those Unknown, the rest known", async () => {
  const [gpu] = value((await inventoryOf(FIXTURES.a100Mig, "old-driver")).devices);
  const pci = why(gpu.pci);
  assert.equal(pci.reason, "unsupported");
  assert.match(pci.detail, /has no symbol nvmlDeviceGetPciInfo_v3 \(an older driver\?\)/);
  const profiles = value(gpu.gpuInstanceProfiles);
  assert.ok(profiles.length > 0);
  assert.ok(profiles.every((p) => p.placements.kind === "unknown"));
  assert.deepEqual(value(gpu.migDevices).map((s) => value(s.profile)), ["3g.20gb", "2g.10gb", "1g.5gb"]);
});

Deno.test("the process holds one NVML session until it is closed; the next read starts a new one", async () => {
  closeNvml();
  await useFakeNvml(FIXTURES.oneH100);
  const first = value(sharedNvml());
  assert.equal(value(sharedNvml()), first, "the same session while it is held");
  await useFakeNvml({ devices: [h100(0), h100(1)] });
  assert.equal(
    value(readInventory().devices).length,
    1,
    "the held session still reads what it was opened on",
  );
  closeNvml();
  const closed = first.call("nvmlDeviceGetCount_v2", [0]);
  assert.equal(
    typeof closed === "number" ? closed : closed.reason,
    "unread",
    "a closed session calls nothing",
  );
  assert.equal(value(readInventory().devices).length, 2, "a new session after the close");
  closeNvml();
});

Deno.test("every observation of one read, known or not, carries the instant the read began", async () => {
  closeNvml();
  await useFakeNvml(FIXTURES.countLies);
  const clock = new FakeClock(1234);
  const inventory = readInventory({ clock });
  closeNvml();
  const stamps = new Set<number>();
  let observations = 0;
  JSON.stringify(inventory, (key, v) => {
    if (key === "observedAt") {
      stamps.add(v);
      observations++;
    }
    return v;
  });
  assert.ok(observations > 50, `read ${observations} observations`);
  assert.deepEqual([...stamps], [clock.monotonic()]);
});
