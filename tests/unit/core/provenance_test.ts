import assert from "node:assert/strict";
import { CapabilityError, ConfigError, GpuRequirementConflict } from "../../../src/core/errors.ts";
import {
  builtinDefaults,
  Declaration,
  type DeclarationSource,
  descriptorDeclarations,
  FIELDS,
  type GpuField,
  nodeDeclarations,
  resolveGpuRequirements,
  SOURCE_PRECEDENCE,
} from "../../../src/core/provenance.ts";
import { SeededRandom } from "../../support/random.ts";

/** Asserts `resolve` throws a GpuRequirementConflict mentioning every one of `mentions` (message or remedy). */
function assertConflict(resolve: () => unknown, ...mentions: string[]): GpuRequirementConflict {
  const conflicts: GpuRequirementConflict[] = [];
  assert.throws(resolve, (error: unknown) => {
    assert.ok(error instanceof GpuRequirementConflict, `expected a GpuRequirementConflict, got ${error}`);
    conflicts.push(error);
    return true;
  });
  const [conflict] = conflicts;
  assert.ok(conflict instanceof CapabilityError);
  assert.equal(conflict.code, "VF_CAPABILITY");
  assert.equal(conflict.exitCode, 2);
  const text = `${conflict.message} / ${conflict.remedy}`;
  for (const mention of mentions) {
    assert.ok(text.includes(mention), `${JSON.stringify(text)} mentions ${mention}`);
  }
  return conflict;
}

const soft = (field: GpuField, value: unknown, source: DeclarationSource) =>
  new Declaration(field, value, source, false);
const hard = (field: GpuField, value: unknown, source: DeclarationSource) =>
  new Declaration(field, value, source);

Deno.test("a node that says nothing resolves to CPU, one device, no memory demand, all from the default", () => {
  const resolution = resolveGpuRequirements(builtinDefaults());
  assert.deepEqual(resolution, {
    values: { device_type: "cpu", gpu_count: 1, gpu_memory_gib: null },
    provenance: { device_type: "default", gpu_count: "default", gpu_memory_gib: "default" },
    dropped: {},
  });
  assert.ok(builtinDefaults().every((d) => !d.hard));
});

Deno.test("among soft declarations the source precedence decides: node > strategy > descriptor > cli > default", () => {
  for (let i = 0; i < SOURCE_PRECEDENCE.length; i++) {
    for (let j = i + 1; j < SOURCE_PRECEDENCE.length; j++) {
      const higher = soft("gpu_resource_name", `r-${i}`, SOURCE_PRECEDENCE[i]);
      const lower = soft("gpu_resource_name", `r-${j}`, SOURCE_PRECEDENCE[j]);
      for (const declarations of [[higher, lower], [lower, higher]]) {
        const resolution = resolveGpuRequirements(declarations);
        assert.equal(resolution.values.gpu_resource_name, `r-${i}`);
        assert.equal(resolution.provenance.gpu_resource_name, SOURCE_PRECEDENCE[i]);
      }
    }
  }
});

Deno.test("a hard declaration beats a soft one from any source, however high", () => {
  for (const hardSource of SOURCE_PRECEDENCE) {
    for (const softSource of SOURCE_PRECEDENCE) {
      const declarations = [
        soft("gpu_resource_name", "soft-name", softSource),
        hard("gpu_resource_name", "hard-name", hardSource),
      ];
      const resolution = resolveGpuRequirements(declarations);
      assert.equal(
        resolution.values.gpu_resource_name,
        "hard-name",
        `${hardSource} hard vs ${softSource} soft`,
      );
      assert.equal(resolution.provenance.gpu_resource_name, hardSource);
    }
  }
});

Deno.test("hard declarations that agree are no conflict; the higher source is recorded", () => {
  const resolution = resolveGpuRequirements([
    hard("device_type", "gpu", "descriptor"),
    hard("device_type", "gpu", "node"),
    ...builtinDefaults(),
  ]);
  assert.equal(resolution.values.device_type, "gpu");
  assert.equal(resolution.provenance.device_type, "node");
});

Deno.test("two hard declarations from different sources that disagree are a conflict naming both", () => {
  for (let i = 0; i < SOURCE_PRECEDENCE.length; i++) {
    for (let j = i + 1; j < SOURCE_PRECEDENCE.length; j++) {
      const error = assertConflict(
        () =>
          resolveGpuRequirements([
            hard("gpu_resource_name", "a", SOURCE_PRECEDENCE[j]),
            hard("gpu_resource_name", "b", SOURCE_PRECEDENCE[i]),
          ], "node 'det'"),
        "node 'det'",
        '"a"',
        '"b"',
        SOURCE_PRECEDENCE[i],
        SOURCE_PRECEDENCE[j],
      );
      assert.deepEqual(error.context.sources, [SOURCE_PRECEDENCE[i], SOURCE_PRECEDENCE[j]]);
      assert.equal(error.context.field, "gpu_resource_name");
    }
  }
});

Deno.test("the remedy of a conflict says where each of the two declarations is changed", () => {
  assertConflict(
    () => resolveGpuRequirements([hard("gpu_count", 2, "node"), hard("gpu_count", 4, "strategy")]),
    "the gpuCount option on the node",
    "the GPU strategy's resolved gpu_count",
  );
  assertConflict(
    () =>
      resolveGpuRequirements([
        hard("gpu_resource_name", "nvidia.com/gpu", "cli-default"),
        hard("gpu_resource_name", "nvidia.com/mig-1g.10gb", "strategy"),
      ]),
    "--gpu-resource-name on the deploy command line",
  );
});

Deno.test("disagreement within one source is not the resolver's business: the first declaration stands", () => {
  const resolution = resolveGpuRequirements([hard("gpu_count", 2, "node"), hard("gpu_count", 3, "node")]);
  assert.equal(resolution.values.gpu_count, 2);
});

Deno.test("a single-entry descriptor device list is a hard device_type a CPU node contradicts", () => {
  assertConflict(
    () =>
      resolveGpuRequirements([
        ...builtinDefaults(),
        ...descriptorDeclarations(["gpu"]),
        ...nodeDeclarations("cpu"),
      ]),
    "not supported",
    "spec.device in the component descriptor",
    "the deviceType option on the node",
  );
  const gpu = resolveGpuRequirements([
    ...builtinDefaults(),
    ...descriptorDeclarations(["gpu"]),
    ...nodeDeclarations("gpu"),
  ]);
  assert.equal(gpu.values.device_type, "gpu");
  assert.equal(gpu.provenance.device_type, "node");
  const either = resolveGpuRequirements([
    ...builtinDefaults(),
    ...descriptorDeclarations(["cpu", "gpu"]),
    ...nodeDeclarations("cpu"),
  ]);
  assert.equal(either.values.device_type, "cpu");
});

Deno.test("declaration builders: node options are hard and only when given; descriptor resources are soft", () => {
  assert.deepEqual(nodeDeclarations("gpu"), [hard("device_type", "gpu", "node")]);
  assert.deepEqual(nodeDeclarations("gpu", null, null), [hard("device_type", "gpu", "node")]);
  assert.deepEqual(nodeDeclarations("gpu", 2, 8), [
    hard("device_type", "gpu", "node"),
    hard("gpu_count", 2, "node"),
    hard("gpu_memory_gib", 8, "node"),
  ]);
  assert.deepEqual(descriptorDeclarations(["cpu", "gpu"], 2, 8), [
    soft("gpu_count", 2, "descriptor"),
    soft("gpu_memory_gib", 8, "descriptor"),
  ]);
  assert.deepEqual(descriptorDeclarations([]), []);
  assert.deepEqual(descriptorDeclarations(["cpu"]), [hard("device_type", "cpu", "descriptor")]);
});

Deno.test("a soft memory demand is dropped on a CPU run and recorded in dropped", () => {
  const resolution = resolveGpuRequirements([
    ...builtinDefaults(),
    ...descriptorDeclarations(["cpu", "gpu"], null, 8),
    ...nodeDeclarations("cpu"),
  ]);
  assert.equal(resolution.values.gpu_memory_gib, null);
  assert.equal(resolution.provenance.gpu_memory_gib, "default");
  assert.deepEqual(resolution.dropped, { gpu_memory_gib: "descriptor" });
  const onGpu = resolveGpuRequirements([
    ...builtinDefaults(),
    ...descriptorDeclarations(["cpu", "gpu"], null, 8),
    ...nodeDeclarations("gpu"),
  ]);
  assert.equal(onGpu.values.gpu_memory_gib, 8);
  assert.equal(onGpu.provenance.gpu_memory_gib, "descriptor");
  assert.deepEqual(onGpu.dropped, {});
});

Deno.test("a dropped memory demand with no other candidate leaves the field unresolved", () => {
  const resolution = resolveGpuRequirements([
    ...descriptorDeclarations(["cpu", "gpu"], null, 8),
    ...nodeDeclarations("cpu"),
  ]);
  assert.deepEqual(resolution.values, { device_type: "cpu" });
  assert.deepEqual(resolution.dropped, { gpu_memory_gib: "descriptor" });
});

Deno.test("a descriptor's multi-GPU count is not dropped on CPU: the author must say gpuCount 1", () => {
  assertConflict(
    () =>
      resolveGpuRequirements([
        ...builtinDefaults(),
        ...descriptorDeclarations(["cpu", "gpu"], 2),
        ...nodeDeclarations("cpu"),
      ]),
    "gpu_count 2 (descriptor)",
    'device_type "cpu" comes from node',
    "spec.resources.gpu.count in the component descriptor",
  );
  const explicit = resolveGpuRequirements([
    ...builtinDefaults(),
    ...descriptorDeclarations(["cpu", "gpu"], 2),
    ...nodeDeclarations("cpu", 1),
  ]);
  assert.deepEqual(explicit.values, { device_type: "cpu", gpu_count: 1, gpu_memory_gib: null });
  assert.equal(explicit.provenance.gpu_count, "node");
});

Deno.test("a hard GPU-only requirement from another source on a CPU device is a conflict", () => {
  assertConflict(
    () =>
      resolveGpuRequirements([
        ...builtinDefaults(),
        ...nodeDeclarations("cpu"),
        hard("gpu_memory_gib", 10, "strategy"),
      ]),
    "gpu_memory_gib 10 (strategy)",
    'deviceType: "gpu"',
  );
  assertConflict(
    () =>
      resolveGpuRequirements([
        ...builtinDefaults(),
        ...descriptorDeclarations(["cpu"]),
        hard("gpu_count", 2, "strategy"),
      ]),
    "gpu_count 2 (strategy)",
    'device_type "cpu" comes from descriptor',
  );
});

Deno.test("GPU-only values from the same source as the CPU device are left to the node constructor", () => {
  const resolution = resolveGpuRequirements([...builtinDefaults(), ...nodeDeclarations("cpu", 2)]);
  assert.deepEqual(resolution.values, { device_type: "cpu", gpu_count: 2, gpu_memory_gib: null });
});

Deno.test("gpu_count > 1 and a memory demand from different sources are mutually exclusive", () => {
  assertConflict(
    () =>
      resolveGpuRequirements([
        ...builtinDefaults(),
        ...descriptorDeclarations(["gpu"], null, 8),
        ...nodeDeclarations("gpu", 2),
      ]),
    "gpu_count 2 (node)",
    "gpu_memory_gib 8 (descriptor)",
    "mutually exclusive",
    "spec.resources.gpu.memoryGiB",
  );
  const sameSource = resolveGpuRequirements([...builtinDefaults(), ...nodeDeclarations("gpu", 2, 8)]);
  assert.deepEqual(sameSource.values, { device_type: "gpu", gpu_count: 2, gpu_memory_gib: 8 });
  const oneDevice = resolveGpuRequirements([
    ...builtinDefaults(),
    ...descriptorDeclarations(["gpu"], 1, 8),
    ...nodeDeclarations("gpu"),
  ]);
  assert.deepEqual(oneDevice.values, { device_type: "gpu", gpu_count: 1, gpu_memory_gib: 8 });
});

Deno.test("a declaration with an unknown field or source is refused with a ConfigError", () => {
  assert.throws(
    () => resolveGpuRequirements([new Declaration("gpu_model" as GpuField, "h200", "node")]),
    (error: unknown) => error instanceof ConfigError && error.message.includes("gpu_model"),
  );
  assert.throws(
    () => resolveGpuRequirements([new Declaration("gpu_count", 1, "operator" as DeclarationSource)]),
    (error: unknown) => error instanceof ConfigError && error.message.includes("operator"),
  );
});

Deno.test("the resolution is the same whatever order the declarations arrive in (seeded)", () => {
  const scenarios: Declaration[][] = [
    [...builtinDefaults(), ...descriptorDeclarations(["cpu", "gpu"], 1, 8), ...nodeDeclarations("cpu")],
    [...builtinDefaults(), ...descriptorDeclarations(["gpu"], 2), ...nodeDeclarations("gpu")],
    [
      ...builtinDefaults(),
      soft("gpu_resource_name", "nvidia.com/gpu", "default"),
      soft("gpu_resource_name", "nvidia.com/mig-2g.20gb", "cli-default"),
      hard("gpu_resource_name", "nvidia.com/mig-3g.40gb", "strategy"),
      ...nodeDeclarations("gpu", null, 30),
    ],
  ];
  for (let seed = 1; seed <= 50; seed++) {
    const random = new SeededRandom(seed);
    for (const declarations of scenarios) {
      const expected = resolveGpuRequirements(declarations);
      const resolution = resolveGpuRequirements(random.shuffle(declarations));
      assert.deepEqual(resolution, expected, `seed ${seed}`);
      assert.deepEqual(
        Object.keys(resolution.values),
        FIELDS.filter((f) => f in expected.values),
        `seed ${seed}`,
      );
    }
  }
});

Deno.test("a resolution is a JSON document keyed by the spec's field names", () => {
  const resolution = resolveGpuRequirements([
    ...builtinDefaults(),
    soft("gpu_resource_name", "nvidia.com/gpu", "default"),
    ...nodeDeclarations("gpu", 2),
  ]);
  assert.deepEqual(JSON.parse(JSON.stringify(resolution)), {
    values: { device_type: "gpu", gpu_count: 2, gpu_memory_gib: null, gpu_resource_name: "nvidia.com/gpu" },
    provenance: {
      device_type: "node",
      gpu_count: "node",
      gpu_memory_gib: "default",
      gpu_resource_name: "default",
    },
    dropped: {},
  });
});
