import assert from "node:assert/strict";
import type { DeliveredGrant, DeviceIdentity } from "../../../src/backends/allocation.ts";
import type { Known, Observation, Unknown } from "../../../src/backends/outcomes.ts";
import { EXIT_ENVIRONMENT, ResourceUnavailable } from "../../../src/core/errors.ts";
import { ConsumerNode, GpuFallback, ProcessorNode } from "../../../src/core/node.ts";
import { closeNvml } from "../../../nvml/session.ts";
import {
  enumerateDevices,
  GpuExecution,
  type GrantDemand,
  type GrantEnviron,
  GrantSource,
  type HostGpus,
  peerAccessObserved,
  readHostGpus,
  verifyGrant,
  verifyNodeGrant,
} from "../../../src/runtime/gpucheck.ts";
import { fakeHost } from "../../support/fake_host.ts";
import { a100Mig, eightH100, FIXTURES, h100, useFakeNvml } from "../../support/fake_nvml.ts";

function value<T>(observation: Observation<T>): T {
  assert.equal(observation.kind, "known", JSON.stringify(observation));
  return (observation as Known<T>).value;
}

function why(observation: Observation<unknown>): Unknown {
  assert.equal(observation.kind, "unknown", JSON.stringify(observation));
  return observation as Unknown;
}

function cards(host: HostGpus): DeviceIdentity[] {
  return value(host.devices).map((card) => value(card.identity));
}

function migs(host: HostGpus): DeviceIdentity[] {
  return value(host.devices).flatMap((card) => value(card.migDevices).map((mig) => value(mig.identity)));
}

const ordinals = (devices: Observation<readonly DeviceIdentity[]>) => value(devices).map((d) => d.ordinal);

const demand = (fields: Partial<GrantDemand> = {}): GrantDemand => ({
  node: "detect",
  requested: 1,
  fallback: GpuFallback.cpu,
  requiresPeerAccess: false,
  ...fields,
});

function grantOf(devices: readonly DeviceIdentity[], more: Partial<DeliveredGrant> = {}): DeliveredGrant {
  return {
    workloadId: "detect/0",
    devices,
    exclusive: true,
    requested: devices.length,
    policy: "local-exclusive",
    host: "observed",
    ...more,
  };
}

const maskOf = (devices: readonly DeviceIdentity[]) => devices.map((d) => d.migUuid ?? d.uuid).join(",");

function assertRefused(body: () => unknown, ...patterns: RegExp[]): void {
  assert.throws(body, (error) => {
    assert.ok(error instanceof ResourceUnavailable, String(error));
    assert.equal(error.exitCode, EXIT_ENVIRONMENT);
    for (const pattern of patterns) assert.match(error.message, pattern);
    return true;
  });
}

const eight = await fakeHost(FIXTURES.eightH100);
const a100 = await fakeHost(FIXTURES.a100Mig);
const one = await fakeHost(FIXTURES.oneH100);
const unread = await fakeHost(FIXTURES.initFails);

Deno.test("an unset mask shows every card; a host NVML cannot read is Unknown, never zero devices", () => {
  assert.deepEqual(ordinals(enumerateDevices({}, eight).devices), [0, 1, 2, 3, 4, 5, 6, 7]);
  const none = why(enumerateDevices({}, unread).devices);
  assert.match(none.detail, /did not start/);
  assert.match(why(enumerateDevices({ CUDA_VISIBLE_DEVICES: "0" }, unread).devices).detail, /did not start/);
});

Deno.test("a mask of card UUIDs (or unique prefixes) names those cards in the mask's order, not a count of entries", () => {
  const all = cards(eight);
  const mask = `${all[5].uuid},${all[2].uuid}`;
  assert.deepEqual(ordinals(enumerateDevices({ CUDA_VISIBLE_DEVICES: mask }, eight).devices), [5, 2]);
  const prefix = all[3].uuid!.slice(0, 14);
  assert.deepEqual(ordinals(enumerateDevices({ CUDA_VISIBLE_DEVICES: prefix }, eight).devices), [3]);
  const ambiguous = enumerateDevices({ CUDA_VISIBLE_DEVICES: "GPU-a1b2c3d" }, eight).devices;
  assert.match(why(ambiguous).detail, /prefix of several UUIDs/);
});

Deno.test("an empty mask, -1 or NoDevFiles shows no device; the first entry naming none ends the list, as CUDA reads it", () => {
  for (const mask of ["", "-1", "NoDevFiles"]) {
    assert.deepEqual(value(enumerateDevices({ CUDA_VISIBLE_DEVICES: mask }, eight).devices), [], mask);
  }
  const pci = { CUDA_DEVICE_ORDER: "PCI_BUS_ID" };
  const cut = enumerateDevices({ ...pci, CUDA_VISIBLE_DEVICES: "0,2,-1,1" }, eight);
  assert.deepEqual(ordinals(cut.devices), [0, 2]);
  assert.deepEqual(cut.ignored, ["-1", "1"]);
  const stranger = enumerateDevices(
    { CUDA_VISIBLE_DEVICES: `${cards(eight)[1].uuid},GPU-ffffffff,0` },
    eight,
  );
  assert.deepEqual(ordinals(stranger.devices), [1]);
  assert.deepEqual(stranger.ignored, ["GPU-ffffffff", "0"]);
  assert.deepEqual(ordinals(enumerateDevices({ ...pci, CUDA_VISIBLE_DEVICES: "9" }, eight).devices), []);
});

Deno.test("ordinals are read as NVML's only under CUDA_DEVICE_ORDER=PCI_BUS_ID or on a one-card host", () => {
  const bare = why(enumerateDevices({ CUDA_VISIBLE_DEVICES: "1,3" }, eight).devices);
  assert.equal(bare.reason, "unsupported");
  assert.match(bare.detail, /CUDA_DEVICE_ORDER=PCI_BUS_ID/);
  const pci = enumerateDevices({ CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: "3,1" }, eight);
  assert.deepEqual(ordinals(pci.devices), [3, 1]);
  assert.deepEqual(ordinals(enumerateDevices({ CUDA_VISIBLE_DEVICES: "0" }, one).devices), [0]);
  const twice = enumerateDevices({ CUDA_VISIBLE_DEVICES: `0,${cards(one)[0].uuid}` }, one).devices;
  assert.match(why(twice).detail, /twice/);
});

Deno.test("a MIG card is addressed through its MIG UUIDs; named whole, or with no mask, it is Unknown", () => {
  const slices = migs(a100);
  const named = enumerateDevices({ CUDA_VISIBLE_DEVICES: `${slices[2].migUuid},${slices[0].migUuid}` }, a100);
  assert.deepEqual(value(named.devices).map((d) => d.migProfile), ["1g.5gb", "3g.20gb"]);
  assert.match(why(enumerateDevices({}, a100).devices).detail, /GPU 0 has MIG on/);
  const legacy = enumerateDevices({ CUDA_VISIBLE_DEVICES: `MIG-${cards(a100)[0].uuid}/1/0` }, a100).devices;
  assert.match(why(legacy).detail, /older MIG-GPU-<uuid>\/<gi>\/<ci> form/);
  assert.match(why(enumerateDevices({ CUDA_VISIBLE_DEVICES: "0" }, a100).devices).detail, /MIG on/);
});

Deno.test("peer access: every ordered pair OK is true; one pair NS is false; MIG slices never; an unread pair is Unknown", async () => {
  const all = cards(eight);
  assert.deepEqual(value(peerAccessObserved(all.slice(0, 4), eight)), true);
  const ns = eightH100() as { p2p: { read: number[][] } };
  const read = ns.p2p.read.map((row) => [...row]);
  read[1][2] = 5;
  const partial = await fakeHost({ ...ns, p2p: { ...ns.p2p, read } });
  assert.equal(value(peerAccessObserved(all.slice(0, 2), partial)), true);
  assert.equal(value(peerAccessObserved(all.slice(1, 3), partial)), false, "1 → 2 is NS");
  assert.equal(value(peerAccessObserved(migs(a100).slice(0, 2), a100)), false);
  const failing = await fakeHost({ ...eightH100(), returns: { nvmlDeviceGetP2PStatus: 999 } });
  assert.equal(peerAccessObserved(all.slice(0, 2), failing).kind, "unknown");
  assert.equal(value(peerAccessObserved(all.slice(0, 1), unread)), true, "one device has no pair to reach");
});

Deno.test("a launcher's grant is the source, checked against the mask and NVML: a device not on the host is a shortfall", () => {
  const [a, b] = cards(eight);
  const whole = verifyGrant(demand({ requested: 2 }), {
    environ: { CUDA_VISIBLE_DEVICES: maskOf([a, b]) },
    grant: grantOf([a, b]),
    host: eight,
  });
  assert.equal(whole.source, GrantSource.grant);
  assert.equal(whole.execution, GpuExecution.gpu);
  assert.equal(whole.exclusive, true);
  assert.deepEqual(whole.problems, []);
  assert.equal(whole.evidence.nvml, "checked");
  const stranger = { ...a, uuid: "GPU-00000000-0000-0000-0000-000000000000" };
  const missing = verifyGrant(demand(), {
    environ: { CUDA_VISIBLE_DEVICES: maskOf([stranger]) },
    grant: grantOf([stranger]),
    host: eight,
  });
  assert.equal(missing.execution, GpuExecution.cpu);
  assert.match(missing.problems.join(";"), /GPU-00000000-0000-0000-0000-000000000000 is not one NVML shows/);
  assertRefused(
    () =>
      verifyGrant(demand({ fallback: GpuFallback.none }), {
        environ: { CUDA_VISIBLE_DEVICES: maskOf([stranger]) },
        grant: grantOf([stranger]),
        host: eight,
      }),
    /node detect refuses to open: granted device GPU-0+/,
  );
});

Deno.test("a grant whose mask disagrees delivers only what both name; NVML unread in the worker is said, not counted as zero", () => {
  const [a, b] = cards(eight);
  const report = verifyGrant(demand({ requested: 2 }), {
    environ: { CUDA_VISIBLE_DEVICES: maskOf([a]) },
    grant: grantOf([a, b]),
    host: unread,
  });
  assert.deepEqual(value(report.delivered), [a]);
  assert.equal(report.execution, GpuExecution.cpu);
  assert.match(report.problems.join(";"), /CUDA_VISIBLE_DEVICES=.* is not the grant's devices/);
  assert.match(String(report.evidence.nvml), /^not read: .*did not start/);
});

Deno.test("an unobserved grant falls back to the enumeration; nothing readable is 'unobserved' with execution unknown", () => {
  const [a] = cards(one);
  const fromMask = verifyGrant(demand(), {
    environ: { CUDA_VISIBLE_DEVICES: a.uuid! },
    grant: grantOf([], { host: "unobserved", requested: 1 }),
    host: one,
  });
  assert.equal(fromMask.source, GrantSource.enumeration);
  assert.equal(fromMask.exclusive, false, "never assumed without a grant");
  assert.equal(fromMask.execution, GpuExecution.gpu);
  const blind = verifyGrant(demand(), { environ: {}, grant: null, host: unread });
  assert.equal(blind.source, GrantSource.unobserved);
  assert.equal(blind.execution, GpuExecution.unknown);
  assert.match(blind.problems.join(), /grant of 1 GPU\(s\) cannot be verified/);
});

Deno.test('gpuFallback "none" refuses a grant that is unverifiable, empty or short; "cpu" opens naming it', () => {
  const none = demand({ fallback: GpuFallback.none, requested: 2 });
  const [a, b] = cards(eight);
  const env = (devices: DeviceIdentity[]): GrantEnviron => ({ CUDA_VISIBLE_DEVICES: maskOf(devices) });
  assertRefused(() => verifyGrant(none, { environ: {}, grant: null, host: unread }), /cannot be verified/);
  assertRefused(
    () => verifyGrant(none, { environ: env([]), grant: null, host: eight }),
    /granted 0 of the 2/,
  );
  assertRefused(
    () => verifyGrant(none, { environ: env([a]), grant: null, host: eight }),
    /granted 1 of the 2/,
  );
  const whole = verifyGrant(none, { environ: env([a, b]), grant: null, host: eight });
  assert.deepEqual([whole.execution, whole.problems], [GpuExecution.gpu, []]);
  const short = verifyGrant(demand({ requested: 2 }), { environ: env([a]), grant: null, host: eight });
  assert.equal(short.execution, GpuExecution.cpu);
});

Deno.test("requiresPeerAccess is verified through the P2P matrix: peers open; non-peers, an unread matrix and a short grant refuse, whatever the fallback", async () => {
  const peer = demand({ requested: 2, requiresPeerAccess: true });
  const [a, b] = cards(eight);
  const environ = { CUDA_VISIBLE_DEVICES: maskOf([a, b]) };
  assert.equal(value(verifyGrant(peer, { environ, grant: null, host: eight }).peerAccess!), true);
  const failing = await fakeHost({ ...eightH100(), returns: { nvmlDeviceGetP2PStatus: 999 } });
  assertRefused(() => verifyGrant(peer, { environ, grant: null, host: failing }), /cannot be verified/);
  const short = { CUDA_VISIBLE_DEVICES: maskOf([a]) };
  assertRefused(
    () => verifyGrant(peer, { environ: short, grant: null, host: eight }),
    /peer access between its 2 GPUs cannot be verified: it was granted 1 of the 2/,
  );
  const split = await fakeHost({
    driver: "550.54.15",
    devices: [h100(0), h100(1)],
    p2p: { read: [[0, 5], [5, 0]] },
  });
  assertRefused(
    () => verifyGrant(peer, { environ, grant: null, host: split }),
    /peer access between its 2 GPUs is not there/,
  );
});

class Detect extends ProcessorNode {
  process(x: unknown) {
    return x;
  }
}
class Print extends ConsumerNode {
  consume() {}
}

Deno.test("verifyNodeGrant checks only GPU nodes, reading the host only for them", async () => {
  let reads = 0;
  const readHost = () => {
    reads++;
    return Promise.resolve(one);
  };
  assert.equal(await verifyNodeGrant(new Print({ name: "p" }), { environ: {}, grant: null, readHost }), null);
  assert.equal(
    await verifyNodeGrant(new Detect({ name: "c" }), { environ: {}, grant: null, readHost }),
    null,
  );
  assert.equal(reads, 0);
  const report = await verifyNodeGrant(new Detect({ name: "g", deviceType: "gpu" }), {
    environ: { CUDA_VISIBLE_DEVICES: "0" },
    grant: null,
    readHost,
  });
  assert.equal(report?.execution, GpuExecution.gpu);
  assert.equal(reads, 1);
});

// Last in this file: it revokes this process's FFI permission.
Deno.test("readHostGpus reads NVML where this process may load it, and is Unknown without FFI permission", async () => {
  closeNvml();
  await useFakeNvml({ driver: "550.54.15", devices: [a100Mig(0)] });
  try {
    assert.equal(value((await readHostGpus()).devices).length, 1);
  } finally {
    closeNvml();
  }
  Deno.permissions.revokeSync({ name: "ffi" });
  const sandboxed = await readHostGpus();
  assert.match(why(sandboxed.devices).detail, /no FFI permission to load NVML/);
  assert.equal(why(sandboxed.p2p).reason, "unsupported");
});
