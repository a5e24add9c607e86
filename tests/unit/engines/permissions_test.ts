import assert from "node:assert/strict";
import { ConfigError } from "../../../src/core/errors.ts";
import {
  checkFlagPermissions,
  mergePermissions,
  permissionFlags,
  workerPermissions,
} from "../../../src/engines/permissions.ts";

Deno.test("a node that declares nothing gets nothing, in both forms", () => {
  assert.deepEqual(workerPermissions({}), {
    import: false,
    read: false,
    write: false,
    net: false,
    env: false,
    run: false,
    ffi: false,
    sys: false,
  });
  assert.deepEqual(permissionFlags({}), []);
});

Deno.test("declared kinds become exactly their lists, in a stable order", () => {
  const granted = { write: ["out/events.jsonl"], read: ["clips/a.mp4", "clips/b.mp4"], run: ["ffmpeg"] };
  const worker = workerPermissions(granted);
  assert.deepEqual(worker.read, ["clips/a.mp4", "clips/b.mp4"]);
  assert.deepEqual(worker.write, ["out/events.jsonl"]);
  assert.deepEqual(worker.run, ["ffmpeg"]);
  assert.equal(worker.net, false);
  assert.deepEqual(permissionFlags(granted), [
    "--allow-read=clips/a.mp4,clips/b.mp4",
    "--allow-write=out/events.jsonl",
    "--allow-run=ffmpeg",
  ]);
});

Deno.test("an engine's own needs merge in without duplicates", () => {
  const merged = mergePermissions({ net: ["127.0.0.1:4222"], read: ["a"] }, {
    net: ["127.0.0.1:4222", "127.0.0.1:9"],
  });
  assert.deepEqual(merged, { read: ["a"], net: ["127.0.0.1:4222", "127.0.0.1:9"] });
  assert.deepEqual(mergePermissions({ read: [] }), {});
});

Deno.test("a path holding a comma cannot become a subprocess flag: refused by name, anything else passes", () => {
  checkFlagPermissions("sink", { read: ["/data/in.mp4"], write: ["/out/a b.jsonl"], env: ["HOME"] });
  assert.throws(
    () => checkFlagPermissions("src", { read: ["/data/ok.mp4", "/data/a,b.mp4"] }),
    (e: unknown) =>
      e instanceof ConfigError && e.exitCode === 2 &&
      e.message === 'node src declares read permission for "/data/a,b.mp4", which holds a comma: ' +
          "a subprocess replica's --allow-read flag cannot name it" &&
      /--isolation worker/.test(e.remedy ?? ""),
  );
});
