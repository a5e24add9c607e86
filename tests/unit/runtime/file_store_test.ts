/**
 * What only the file store has: its name encoding, its on-disk documents, persistence across reopening,
 * leftovers of killed writers, corruption reported as UnobservableState, and two instances on one
 * directory. The contract itself is tested for every provider in runtime_stores_test.ts.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  ConfigError,
  DISK_ERROR_KEY,
  isDiskFailure,
  ResourceUnavailable,
  UnobservableState,
} from "../../../src/core/errors.ts";
import {
  Barrier,
  crash,
  FaultSchedule,
  nth,
  SimulatedCrash,
  throwSimulatedCrash,
} from "../../../src/backends/faults.ts";
import {
  decodeStoreName,
  encodeStoreName,
  FileRuntimeStore,
  MAX_READABLE_NAME_LENGTH,
} from "../../../src/runtime/file_store.ts";
import { MAY_MOUNT, mountCommand } from "../../support/mounts.ts";
import { SeededRandom } from "../../support/random.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const bytes = (text: string) => encoder.encode(text);
const text = (value: Uint8Array) => decoder.decode(value);

/** Runs `body` for `seed`, naming the seed when it fails. */
async function withSeed(seed: number, body: (random: SeededRandom) => Promise<void> | void): Promise<void> {
  try {
    await body(new SeededRandom(seed));
  } catch (error) {
    console.error(`failed with seed ${seed}`);
    throw error;
  }
}

const ALPHABET = [
  ..."abcXYZ019_-.%~/:*?\\ \t\n\"'<>|",
  "é",
  "ß",
  "İ",
  "ﬁ",
  "中",
  "😀",
  "👩‍👩‍👧",
  "\u0000",
  "\u200d",
  "\uffff",
  "\u{10ffff}",
];

/** A random well-formed key: mostly short, sometimes far past the readable limit. */
function randomKey(random: SeededRandom): string {
  const length = random.chance(0.15) ? random.int(100, 499) : random.int(1, 24);
  return Array.from({ length }, () => random.pick(ALPHABET)).join("");
}

async function withStore(body: (store: FileRuntimeStore, root: string) => Promise<void>): Promise<void> {
  const root = await Deno.makeTempDir({ prefix: "vf-file-store-" });
  const store = await FileRuntimeStore.open(root);
  try {
    await body(store, root);
  } finally {
    await store.close();
    await Deno.remove(root, { recursive: true });
  }
}

async function readValue(store: FileRuntimeStore, key: string): Promise<string> {
  const entry = await store.get(key);
  if (entry.kind === "absent") throw new assert.AssertionError({ message: `${key} is absent` });
  return text(entry.value);
}

async function versionOf(store: FileRuntimeStore, key: string): Promise<string> {
  const entry = await store.get(key);
  if (entry.kind === "absent") throw new assert.AssertionError({ message: `${key} is absent` });
  return entry.version;
}

Deno.test("store names encode to one safe, lowercase path segment and decode back exactly", async () => {
  await withSeed(20_261_129, (random) => {
    const seen = new Map<string, string>();
    for (let i = 0; i < 3000; i++) {
      const key = randomKey(random);
      const encoded = encodeStoreName(key);
      assert.match(
        encoded,
        /^(~[a-z0-9_%-]+~[0-9a-f]{64}|[a-z0-9_%-]+)$/,
        `encoding of ${JSON.stringify(key)}`,
      );
      assert.ok(encoded.length <= MAX_READABLE_NAME_LENGTH + 2 || encoded.startsWith("~"));
      assert.ok(encoder.encode(`${encoded}.json`).length <= 255);
      if (encoded.startsWith("~")) assert.equal(decodeStoreName(encoded), null);
      else assert.equal(decodeStoreName(encoded), key);
      const previous = seen.get(encoded);
      assert.ok(previous === undefined || previous === key, "two names share one encoding");
      seen.set(encoded, key);
    }
  });
});

Deno.test("names that differ only in case, dots or normalization encode differently", () => {
  const names = ["a", "A", "a.", "a%2e", "%", "~", "e\u0301", "é", "..", "."];
  const encodings = names.map(encodeStoreName);
  assert.equal(new Set(encodings).size, names.length);
  assert.deepEqual(encodings.slice(0, 4), ["a", "%41", "a%2e", "a%252e"]);
});

Deno.test("decoding refuses strings that no name encodes to", () => {
  for (const bad of ["A", "a.b", "%2F", "%zz", "%e9", "%c3", "a%2", "a b", "%61"]) {
    assert.throws(() => decodeStoreName(bad), RangeError, `decodeStoreName(${JSON.stringify(bad)})`);
  }
});

Deno.test("long keys are stored, read, swapped and scanned like short ones", async () => {
  await withStore(async (store, root) => {
    const base = "vf/flow/run/" + "node-with-a-very-long-name/".repeat(12);
    const keys = [base + "a", base + "b", base + "é".repeat(300)];
    for (const key of keys) assert.equal(await store.cas(key, null, bytes(`v:${key.length}`)), true);
    for (const key of keys) assert.equal(await readValue(store, key), `v:${key.length}`);
    const version = await versionOf(store, keys[0]);
    assert.equal(await store.cas(keys[0], version, bytes("next")), true);
    assert.deepEqual((await store.scan(base)).map((r) => r.key), [...keys].sort());
    assert.deepEqual((await store.scan(base + "b")).map((r) => r.key), [base + "b"]);
    for await (const entry of Deno.readDir(join(root, "keys"))) {
      assert.ok(encoder.encode(entry.name).length <= 255);
    }
    assert.equal(await store.append(base, bytes("log under a long name")), 1);
    assert.deepEqual((await store.logEntries(base)).map(text), ["log under a long name"]);
  });
});

Deno.test("scan finds every one of many random keys, and exactly those under each prefix", async () => {
  await withSeed(4242, async (random) => {
    await withStore(async (store) => {
      const keys = new Set<string>();
      while (keys.size < 400) keys.add(randomKey(random));
      for (const key of keys) assert.equal(await store.cas(key, null, bytes(key)), true);
      const all = await store.scan("");
      assert.deepEqual(all.map((r) => r.key), [...keys].sort());
      for (const record of all) assert.equal(text(record.value), record.key);
      const sample = [...keys].slice(0, 25);
      for (const key of sample) {
        const chars = Array.from(key);
        const prefix = chars.slice(0, Math.max(1, random.int(0, chars.length - 1))).join("");
        const expected = [...keys].filter((k) => k.startsWith(prefix)).sort();
        assert.deepEqual(
          (await store.scan(prefix)).map((r) => r.key),
          expected,
          `prefix ${JSON.stringify(prefix)}`,
        );
      }
    });
  });
});

Deno.test("each key is one JSON document with its key, version, checksum and base64 value", async () => {
  await withStore(async (store, root) => {
    await store.cas("vf/a/B", null, bytes("hello"));
    const doc = JSON.parse(await Deno.readTextFile(join(root, "keys", "vf%2fa%2f%42.json")));
    assert.deepEqual(Object.keys(doc).sort(), ["format", "key", "sha256", "value", "version"]);
    assert.equal(doc.key, "vf/a/B");
    assert.equal(doc.version, await versionOf(store, "vf/a/B"));
    assert.equal(atob(doc.value), "hello");
    assert.equal(doc.sha256, "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
  });
});

Deno.test("keys, versions and logs survive closing and reopening the store", async () => {
  await withStore(async (store, root) => {
    await store.cas("k", null, bytes("one"));
    await store.append("log", bytes("r1"));
    await store.append("log", bytes("r2"));
    const version = await versionOf(store, "k");
    await store.close();
    const reopened = await FileRuntimeStore.open(root);
    try {
      assert.equal(await readValue(reopened, "k"), "one");
      assert.equal(await reopened.cas("k", version, bytes("two")), true);
      assert.equal(await reopened.append("log", bytes("r3")), 3);
      assert.deepEqual((await reopened.logEntries("log")).map(text), ["r1", "r2", "r3"]);
    } finally {
      await reopened.close();
    }
  });
});

Deno.test("a killed writer's leftover temporary files are never read and are replaced by the next write", async () => {
  await withStore(async (store, root) => {
    await store.cas("k", null, bytes("old"));
    await store.append("log", bytes("r1"));
    const keyTemp = join(root, "keys", "k.tmp");
    const logTemp = join(root, "logs", "log", "append.tmp");
    await Deno.writeTextFile(keyTemp, '{"format":1,"key":"k","vers');
    await Deno.writeTextFile(logTemp, "torn");
    assert.equal(await readValue(store, "k"), "old");
    assert.deepEqual((await store.scan("")).map((r) => r.key), ["k"]);
    assert.deepEqual((await store.logEntries("log")).map(text), ["r1"]);
    assert.equal(await store.cas("k", await versionOf(store, "k"), bytes("new")), true);
    assert.equal(await store.append("log", bytes("r2")), 2);
    await assert.rejects(Deno.stat(keyTemp), Deno.errors.NotFound);
    await assert.rejects(Deno.stat(logTemp), Deno.errors.NotFound);
    assert.equal(await readValue(store, "k"), "new");
    assert.deepEqual((await store.logEntries("log")).map(text), ["r1", "r2"]);
  });
});

Deno.test("a crash between the temporary write and the rename leaves the old value and frees the lock", async () => {
  await withStore(async (store, root) => {
    await store.cas("k", null, bytes("old"));
    const version = await versionOf(store, "k");
    {
      using schedule = new FaultSchedule(
        { [Barrier.ledgerWriteMid]: nth(1, crash()) },
        { onCrash: throwSimulatedCrash },
      ).install();
      await assert.rejects(store.cas("k", version, bytes("new")), SimulatedCrash);
      schedule.assertAllFired();
    }
    const leftover = JSON.parse(await Deno.readTextFile(join(root, "keys", "k.tmp")));
    assert.equal(atob(leftover.value), "new", "the crash landed after the temporary file was written");
    assert.equal(await readValue(store, "k"), "old");
    assert.equal(await versionOf(store, "k"), version);
    assert.equal(await store.cas("k", version, bytes("retried")), true);
    assert.equal(await readValue(store, "k"), "retried");
  });
});

Deno.test("a damaged key file is reported as UnobservableState by get and scan, never returned", async () => {
  await withStore(async (store, root) => {
    await store.cas("k", null, bytes("value"));
    await store.cas("other", null, bytes("fine"));
    const path = join(root, "keys", "k.json");
    const doc = JSON.parse(await Deno.readTextFile(path));
    await Deno.writeTextFile(path, JSON.stringify({ ...doc, value: btoa("valuf") }));
    await assert.rejects(store.get("k"), UnobservableState);
    await assert.rejects(store.scan(""), UnobservableState);
    assert.equal(await readValue(store, "other"), "fine");
    await Deno.writeTextFile(path, JSON.stringify(doc).slice(0, 20));
    await assert.rejects(store.get("k"), (error: unknown) => {
      assert.ok(error instanceof UnobservableState);
      assert.equal(error.context.reason, "malformed");
      return true;
    });
    await assert.rejects(store.cas("k", doc.version, bytes("x")), UnobservableState);
    await Deno.writeTextFile(path, JSON.stringify({ ...doc, key: "someone else" }));
    await assert.rejects(store.get("k"), UnobservableState);
  });
});

Deno.test("a damaged or gapped log is reported as UnobservableState, and nothing is appended to it", async () => {
  await withStore(async (store, root) => {
    for (const record of ["r1", "r2", "r3"]) await store.append("log", bytes(record));
    const dir = join(root, "logs", "log");
    const second = join(dir, "0000000000000002.rec");
    const saved = await Deno.readFile(second);
    await Deno.writeTextFile(second, "{}");
    await assert.rejects(store.logEntries("log"), UnobservableState);
    await Deno.remove(second);
    await assert.rejects(store.logEntries("log"), UnobservableState);
    await assert.rejects(store.append("log", bytes("r4")), UnobservableState);
    await Deno.writeFile(second, saved);
    assert.deepEqual((await store.logEntries("log")).map(text), ["r1", "r2", "r3"]);
    await Deno.copyFile(join(dir, "0000000000000001.rec"), join(dir, "0000000000000003.rec"));
    await assert.rejects(store.logEntries("log"), UnobservableState, "a record names its own index");
  });
});

Deno.test("two store instances on one directory race through the lock: exactly one swap wins", async () => {
  await withStore(async (first, root) => {
    const second = await FileRuntimeStore.open(root);
    try {
      await first.cas("k", null, bytes("0"));
      for (let round = 0; round < 20; round++) {
        const version = await versionOf(first, "k");
        const results = await Promise.all([
          first.cas("k", version, bytes(`first ${round}`)),
          second.cas("k", version, bytes(`second ${round}`)),
          first.cas("k", version, bytes(`first again ${round}`)),
          second.cas("k", version, bytes(`second again ${round}`)),
        ]);
        assert.equal(results.filter(Boolean).length, 1, `round ${round}: ${results}`);
      }
    } finally {
      await second.close();
    }
  });
});

Deno.test("a directory holding another format's marker is refused with ConfigError", async () => {
  const root = await Deno.makeTempDir({ prefix: "vf-file-store-" });
  try {
    await Deno.writeTextFile(join(root, "store.json"), JSON.stringify({ kind: "something-else", format: 1 }));
    await assert.rejects(FileRuntimeStore.open(root), ConfigError);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("a damaged marker (not JSON) is the store's own damage: UnobservableState, with a remedy", async () => {
  const root = await Deno.makeTempDir({ prefix: "vf-file-store-" });
  try {
    await Deno.writeTextFile(join(root, "store.json"), "\u0000garbage");
    await assert.rejects(FileRuntimeStore.open(root), (error: unknown) => {
      assert.ok(error instanceof UnobservableState, String(error));
      assert.match(
        error.message,
        /its marker store.json in the file runtime store is malformed: it is not JSON/,
      );
      assert.match(error.remedy ?? "", /damaged outside videoflow/);
      return true;
    });
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("a root that cannot be a directory is ResourceUnavailable with a remedy", async () => {
  const root = await Deno.makeTempDir({ prefix: "vf-file-store-" });
  try {
    await Deno.writeTextFile(join(root, "plain-file"), "");
    await assert.rejects(FileRuntimeStore.open(join(root, "plain-file", "ledger")), (error: unknown) => {
      assert.ok(error instanceof ResourceUnavailable);
      assert.match(error.remedy ?? "", /writable directory/);
      return true;
    });
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test({
  name:
    "a store whose disk turns read-only refuses each write with the typed disk failure, tells its observer, " +
    "and still reads what it held (needs root to mount, ignored otherwise)",
  ignore: !MAY_MOUNT,
  fn: async () => {
    const root = await Deno.makeTempDir({ prefix: "vf-file-store-" });
    const told: ResourceUnavailable[] = [];
    const store = await FileRuntimeStore.open(root, undefined, {
      onDiskFailure: (error) => told.push(error),
    });
    let mounted = false;
    try {
      assert.ok(await store.cas("k", null, bytes("v1")));
      await store.append("log", bytes("r1"));
      await mountCommand("mount", ["--bind", "-o", "ro", root, root]);
      mounted = true;
      const version = (await store.get("k")) as { version: string };
      for (
        const write of [
          () => store.cas("k", version.version, bytes("v2")),
          () => store.append("log", bytes("r2")),
        ]
      ) {
        await assert.rejects(write(), (error: unknown) => {
          assert.ok(error instanceof ResourceUnavailable && isDiskFailure(error), String(error));
          assert.equal(error.exitCode, 3);
          assert.equal(error.context[DISK_ERROR_KEY], "EROFS");
          assert.match(
            error.message,
            new RegExp(
              `^cannot write the file runtime store at ${root} \\((cas|append)\\): its filesystem is read-only \\(EROFS\\)$`,
            ),
          );
          return true;
        });
      }
      assert.equal(told.length, 2, "the observer is told of each");
      assert.equal(text(((await store.get("k")) as { value: Uint8Array }).value), "v1");
      assert.deepEqual((await store.logEntries("log")).map(text), ["r1"]);
    } finally {
      if (mounted) await mountCommand("umount", [root]);
      await store.close();
      await Deno.remove(root, { recursive: true });
    }
  },
});
