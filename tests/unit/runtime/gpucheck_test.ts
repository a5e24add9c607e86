import assert from "node:assert/strict";
import { deviceIdentity } from "../../../src/backends/allocation.ts";
import { known } from "../../../src/backends/outcomes.ts";
import { EXIT_ENVIRONMENT, ResourceUnavailable } from "../../../src/core/errors.ts";
import { ConsumerNode, GpuFallback, ProcessorNode } from "../../../src/core/node.ts";
import {
  GpuExecution,
  type GrantDemand,
  observeGrantedDevices,
  verifyGrant,
  verifyNodeGrant,
} from "../../../src/runtime/gpucheck.ts";

const gpu = (ordinal: number) =>
  deviceIdentity({
    node: "host",
    ordinal,
    uuid: `GPU-${ordinal}`,
    migUuid: null,
    product: "NVIDIA H200",
    memoryBytes: null,
  });

const demand = (fields: Partial<GrantDemand> = {}): GrantDemand => ({
  node: "detect",
  requested: 1,
  fallback: GpuFallback.cpu,
  requiresPeerAccess: false,
  ...fields,
});

function assertRefused(body: () => unknown, ...patterns: RegExp[]): void {
  assert.throws(body, (error) => {
    assert.ok(error instanceof ResourceUnavailable, String(error));
    assert.equal(error.exitCode, EXIT_ENVIRONMENT);
    for (const pattern of patterns) assert.match(error.message, pattern);
    return true;
  });
}

Deno.test("this build cannot read a worker's devices: the grant is Unknown, never zero devices", () => {
  const delivered = observeGrantedDevices();
  assert.equal(delivered.kind, "unknown");
  assert.match(delivered.kind === "unknown" ? delivered.detail : "", /no NVML binding/);
});

Deno.test('gpuFallback "none" refuses a grant that is unverifiable, empty or short, naming the node and why', () => {
  const none = demand({ fallback: GpuFallback.none, requested: 2 });
  assertRefused(() => verifyGrant(none, observeGrantedDevices()), /node detect/, /cannot be verified/);
  assertRefused(() => verifyGrant(none, known([])), /granted 0 of the 2 GPU/);
  assertRefused(() => verifyGrant(none, known([gpu(0)])), /granted 1 of the 2 GPU/);
  const whole = verifyGrant(none, known([gpu(0), gpu(1)]));
  assert.deepEqual([whole.execution, whole.problems], [GpuExecution.gpu, []]);
});

Deno.test('gpuFallback "cpu" opens under any grant, naming the shortfall and where the node runs', () => {
  const unverifiable = verifyGrant(demand(), observeGrantedDevices());
  assert.equal(unverifiable.execution, GpuExecution.unknown);
  assert.match(unverifiable.problems.join(), /grant of 1 GPU\(s\) cannot be verified/);
  const short = verifyGrant(demand(), known([]));
  assert.equal(short.execution, GpuExecution.cpu);
  assert.match(short.problems.join(), /granted 0 of the 1 GPU/);
});

Deno.test("peer access between devices this build cannot verify refuses the node, whatever its fallback", () => {
  const peers = demand({ requested: 2, requiresPeerAccess: true });
  assertRefused(() => verifyGrant(peers, known([gpu(0), gpu(1)])), /peer access between its 2 GPUs/);
});

class Detect extends ProcessorNode {
  static override gpuFallback = GpuFallback.none;
  process(x: unknown) {
    return x;
  }
}

class Sink extends ConsumerNode {
  consume() {}
}

Deno.test("verifyNodeGrant checks only GPU nodes, with the node's own declarations", () => {
  assert.equal(verifyNodeGrant(new Detect({ name: "on_cpu" })), null);
  assert.equal(verifyNodeGrant(new Sink({ name: "sink" })), null);
  assertRefused(() => verifyNodeGrant(new Detect({ name: "detect", deviceType: "gpu" })), /node detect/);
});
