import assert from "node:assert/strict";
import { ConfigError } from "../../../src/core/errors.ts";
import {
  checkFlagPermissions,
  mergePermissions,
  permissionFlags,
  replicaProcessFlags,
  serverAddresses,
  workerPermissions,
} from "../../../src/runtime/permissions.ts";

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

Deno.test("a replica process gets env for its settings and declared variables, its termination log and specs file, and the node's own", () => {
  assert.deepEqual(
    replicaProcessFlags({ read: ["./clips"], env: ["MODEL_DIR", "VF_A"], net: ["cam:554"] }, {
      settings: ["VF_A", "VF_B"],
      terminationLog: "/dev/termination-log",
      specsPath: "/etc/videoflow/specs.json",
    }),
    [
      "--allow-env=VF_A,VF_B,MODEL_DIR",
      "--allow-read=./clips,/etc/videoflow/specs.json",
      "--allow-write=/dev/termination-log",
      "--allow-net=cam:554",
    ],
  );
  assert.deepEqual(replicaProcessFlags({}, { settings: ["VF_A"], terminationLog: "/t" }), [
    "--allow-env=VF_A",
    "--allow-write=/t",
  ]);
});

Deno.test("a server URL's net entry is its host and port, the scheme's default port where it names none", () => {
  assert.deepEqual(serverAddresses("nats://a:4333,nats://b, tls://c"), ["a:4333", "b:4222", "c:4222"]);
  assert.deepEqual(serverAddresses("redis://redis.vision"), ["redis.vision:6379"]);
  assert.deepEqual(serverAddresses("rediss://:secret@r:7000/0"), ["r:7000"]);
});
