import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { join } from "node:path";
import {
  AssetStatus,
  checkAssets,
  sha256Of,
  verifyAssets,
  verifyNodeAssets,
} from "../../../src/runtime/assetcheck.ts";
import { AssetRequirement, ProcessorNode } from "../../../src/core/node.ts";
import { EXIT_ENVIRONMENT, ResourceUnavailable } from "../../../src/core/errors.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

const hex = (bytes: Uint8Array | string) => createHash("sha256").update(bytes).digest("hex");

async function withAssets(body: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir();
  try {
    await body(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("sha256Of hashes whole files of any size, across its 1 MiB read chunks", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  await withAssets(async (dir) => {
    for (const size of [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, random.int(2 << 20, 3 << 20)]) {
      const content = random.bytes(size);
      const path = join(dir, `f${size}`);
      await Deno.writeFile(path, content);
      assert.equal(await sha256Of(path), hex(content), `seed ${seed} size ${size}`);
    }
  });
});

Deno.test("checkAssets reports ok, missing, mismatch and unreadable, in order, and never throws", async () => {
  await withAssets(async (dir) => {
    const weights = join(dir, "weights.onnx");
    await Deno.writeTextFile(weights, "model bytes");
    const reports = await checkAssets([
      new AssetRequirement(weights, hex("model bytes").toUpperCase()),
      new AssetRequirement(join(dir, "absent.bin"), hex("x"), false),
      new AssetRequirement(weights, hex("other bytes")),
      new AssetRequirement(dir, hex("")),
    ]);
    assert.deepEqual(reports.map((r) => r.status), [
      AssetStatus.ok,
      AssetStatus.missing,
      AssetStatus.mismatch,
      AssetStatus.unreadable,
    ]);
    assert.deepEqual(reports[0], {
      path: weights,
      expected: hex("model bytes"),
      actual: hex("model bytes"),
      portable: true,
      status: "ok",
      detail: null,
    });
    assert.equal(reports[1].actual, null);
    assert.equal(reports[1].portable, false);
    assert.equal(reports[2].actual, hex("model bytes"));
    assert.ok(reports[3].detail, "an unreadable asset says why");
    assert.deepEqual(await checkAssets([]), []);
  });
});

Deno.test("verifyAssets passes when every digest matches", async () => {
  await withAssets(async (dir) => {
    const a = join(dir, "a");
    const b = join(dir, "b");
    await Deno.writeTextFile(a, "A");
    await Deno.writeTextFile(b, "B");
    const reports = await verifyAssets(
      [new AssetRequirement(a, hex("A")), new AssetRequirement(b, hex("B"))],
      "detect",
    );
    assert.deepEqual(reports.map((r) => r.status), ["ok", "ok"]);
  });
});

Deno.test("a missing local-only asset is ResourceUnavailable naming the host, the path, and pinning as the fix", async () => {
  await withAssets(async (dir) => {
    const path = join(dir, "yolo.onnx");
    await assert.rejects(
      verifyAssets([new AssetRequirement(path, hex("w"), false)], "detect"),
      (error: unknown) => {
        assert.ok(error instanceof ResourceUnavailable);
        assert.equal(error.code, "VF_RESOURCE_UNAVAILABLE");
        assert.equal(error.exitCode, EXIT_ENVIRONMENT);
        assert.equal(error.message, `node detect cannot run on ${Deno.hostname()}: ${path} is missing`);
        assert.match(error.remedy ?? "", /declared local to one host: pin the worker to the host/);
        assert.equal(error.context.host, Deno.hostname());
        assert.deepEqual(error.context.assets, [
          { path, expected: hex("w"), actual: null, status: "missing", portable: false },
        ]);
        return true;
      },
    );
  });
});

Deno.test("a portable asset with other bytes names the path and both digests, and blames the distribution", async () => {
  await withAssets(async (dir) => {
    const path = join(dir, "labels.txt");
    await Deno.writeTextFile(path, "cat\ndog\n");
    const declared = hex("cat\ndog\nbird\n");
    await assert.rejects(
      verifyAssets([new AssetRequirement(path, declared)], "classify"),
      (error: unknown) => {
        assert.ok(error instanceof ResourceUnavailable);
        assert.match(
          error.message,
          new RegExp(`${path} has sha256 ${hex("cat\ndog\n")}, declared ${declared}`),
        );
        assert.match(
          error.remedy ?? "",
          new RegExp(`did not deliver the declared bytes of ${path} \\(sha256 ${declared}\\)`),
        );
        assert.doesNotMatch(error.remedy ?? "", /pin the worker/);
        return true;
      },
    );
  });
});

Deno.test("every failing asset is reported at once, with a remedy for local and portable ones", async () => {
  await withAssets(async (dir) => {
    const good = join(dir, "good");
    await Deno.writeTextFile(good, "g");
    const requirements = [
      new AssetRequirement(good, hex("g")),
      new AssetRequirement(join(dir, "gone"), hex("x"), false),
      new AssetRequirement(good, hex("not g")),
    ];
    await assert.rejects(verifyAssets(requirements), (error: unknown) => {
      assert.ok(error instanceof ResourceUnavailable);
      assert.equal((error.context.assets as unknown[]).length, 2);
      assert.match(error.message, /^node node cannot run on .*gone is missing; .*good has sha256/);
      assert.match(error.remedy ?? "", /pin the worker.*; the distribution did not deliver/);
      return true;
    });
  });
});

Deno.test("verifyNodeAssets checks what the node declares, named by the node", async () => {
  await withAssets(async (dir) => {
    const weights = join(dir, "w.bin");
    await Deno.writeTextFile(weights, "weights v1");
    class Model extends ProcessorNode<{ weights: string; digest: string }> {
      override requiredAssets() {
        return [new AssetRequirement(this.params.weights, this.params.digest)];
      }
      process(x: unknown) {
        return x;
      }
    }
    const ok = await verifyNodeAssets(new Model({ name: "model", weights, digest: hex("weights v1") }));
    assert.equal(ok[0].status, "ok");
    await assert.rejects(
      verifyNodeAssets(new Model({ name: "model", weights, digest: hex("weights v2") })),
      (error: unknown) => error instanceof ResourceUnavailable && error.context.node === "model",
    );
  });
});
