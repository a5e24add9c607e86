import assert from "node:assert/strict";
import { EXIT_USER, ProcessorNode, WORKER_FATAL } from "../../../mod.ts";
import { guardPermissions, undeclaredPermission } from "../../../src/runtime/undeclared_permission.ts";

Deno.test("a refused read names the node, the permission and the path, with the declaration to add", () => {
  const refusal = new Deno.errors.NotCapable(
    'Requires read access to "/data/clip.mp4", run again with the --allow-read flag',
  );
  const error = undeclaredPermission(refusal, "decode");
  assert.ok(error !== null);
  assert.equal(error.code, "VF_NODE_CONTRACT");
  assert.equal(error.exitCode, EXIT_USER);
  assert.equal(error.disposition, WORKER_FATAL);
  assert.equal(
    error.message,
    'node decode needs read permission for "/data/clip.mp4", which it does not declare',
  );
  assert.match(error.remedy ?? "", /static permissions = \{ read: \["\/data\/clip.mp4"\] \}/);
  assert.deepEqual(error.context, { node: "decode", permission: "read", target: "/data/clip.mp4" });
  assert.equal((error as { cause?: unknown }).cause, refusal);
});

Deno.test("a refusal without a target, or in words it does not know, still names the node", () => {
  const bare = undeclaredPermission(new Deno.errors.NotCapable("Requires ffi access"), "gpu");
  assert.equal(bare?.message, "node gpu needs ffi permission, which it does not declare");
  assert.match(bare?.remedy ?? "", /static permissions = \{ ffi: \[\] \}/);
  const odd = undeclaredPermission(new Deno.errors.NotCapable("no"), "gpu");
  assert.equal(odd?.message, "node gpu needs a permission, which it does not declare (no)");
});

Deno.test("anything but Deno's refusal is not a permission error", () => {
  assert.equal(undeclaredPermission(new Deno.errors.PermissionDenied("EACCES"), "n"), null);
  assert.equal(undeclaredPermission(new Error("Requires read access"), "n"), null);
  assert.equal(undeclaredPermission("Requires read access", "n"), null);
});

class Reader extends ProcessorNode<{ fail: "refused" | "other" | "none" }> {
  process(x: number): number {
    if (this.params.fail === "refused") {
      throw new Deno.errors.NotCapable('Requires env access to "HOME", run again with the --allow-env flag');
    }
    if (this.params.fail === "other") throw new RangeError("bad item");
    return x + 1;
  }
}

Deno.test("a guarded node's refusal becomes the typed error; its results and other errors pass unchanged", async () => {
  const ok = new Reader({ name: "ok", fail: "none" });
  guardPermissions(ok);
  assert.equal(await ok.process(1), 2);
  const refused = new Reader({ name: "env-reader", fail: "refused" });
  guardPermissions(refused);
  await assert.rejects(async () => await refused.process(1), (error: Error & { code?: string }) => {
    assert.equal(error.code, "VF_NODE_CONTRACT");
    assert.match(error.message, /^node env-reader needs env permission for "HOME"/);
    return true;
  });
  const other = new Reader({ name: "other", fail: "other" });
  guardPermissions(other);
  await assert.rejects(async () => await other.process(1), RangeError);
});
