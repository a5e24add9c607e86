import assert from "node:assert/strict";
import { EXIT_USER, WORKER_FATAL } from "../../../mod.ts";
import { nodeFailure } from "../../../src/core/task.ts";
import { undeclaredPermission } from "../../../src/core/undeclared_permission.ts";

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
  assert.match(bare?.remedy ?? "", /only for named targets, and this operation needs it for all of them/);
  assert.doesNotMatch(bare?.remedy ?? "", /ffi: \[\]/, "an empty list grants nothing");
  const odd = undeclaredPermission(new Deno.errors.NotCapable("no"), "gpu");
  assert.equal(odd?.message, "node gpu needs a permission, which it does not declare (no)");
});

Deno.test("a refused remote import (the loader's TypeError) is the node's contract error, with the way out", () => {
  const refusal = new TypeError(
    'Requires import access to "esm.sh:443", run again with the --allow-import flag',
  );
  const error = undeclaredPermission(refusal, "fetcher");
  assert.equal(error?.code, "VF_NODE_CONTRACT");
  assert.equal(
    error?.message,
    'node fetcher needs import permission for "esm.sh:443", which it does not declare',
  );
  assert.match(error?.remedy ?? "", /import them statically at the top of its module/);
});

Deno.test("anything but Deno's refusal is not a permission error", () => {
  assert.equal(undeclaredPermission(new Deno.errors.PermissionDenied("EACCES"), "n"), null);
  assert.equal(undeclaredPermission(new Error("Requires read access"), "n"), null);
  assert.equal(undeclaredPermission("Requires read access", "n"), null);
});

Deno.test("the task loop's failure seam turns a refusal into the typed error and passes anything else on", () => {
  const identity = { node: "env-reader", replica: 1, traceId: "cam:3", seq: 3 };
  const refused = nodeFailure(
    new Deno.errors.NotCapable('Requires env access to "HOME", run again with the --allow-env flag'),
    identity,
  );
  assert.equal(refused.code, "VF_NODE_CONTRACT");
  assert.equal(refused.exitCode, EXIT_USER);
  assert.equal(refused.disposition, WORKER_FATAL);
  assert.match(refused.message, /^node env-reader needs env permission for "HOME"/);
  assert.equal(refused.context.trace_id, "cam:3");
  const other = nodeFailure(new RangeError("bad item"), identity);
  assert.equal(other.code, "VF_RUNTIME");
  assert.equal(other.context.error_type, "RangeError");
});
