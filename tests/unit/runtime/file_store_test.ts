/**
 * What only the file store has: its name encoding, its on-disk documents, persistence across reopening,
 * leftovers of killed writers, corruption reported as UnobservableState, and two instances on one
 * directory. The contract itself is tested for every provider in runtime_stores_test.ts.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
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
  FILE_STORE_FORMAT,
  FileRuntimeStore,
  MAX_READABLE_NAME_LENGTH,
} from "../../../src/runtime/file_store.ts";
import { COMPACT_MIN_BYTES } from "../../../src/runtime/file_journal.ts";
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

/** The SHA-256 of `value`'s UTF-8 bytes, hex. */
function sha256(value: string): string {
  return createHash("sha256").update(value).digest("hex");
}

/** The journal's segment file names, lowest first. */
async function segments(root: string): Promise<string[]> {
  return (await Array.fromAsync(Deno.readDir(join(root, "journal"))))
    .map((entry) => entry.name)
    .filter((name) => name.endsWith(".log"))
    .sort();
}

/** The path of the journal's current (highest-numbered) segment. */
async function currentSegment(root: string): Promise<string> {
  const names = await segments(root);
  assert.ok(names.length > 0, "the journal has a segment");
  return join(root, "journal", names.at(-1)!);
}

/** The whole lines of the current segment. */
async function journalLines(root: string): Promise<string[]> {
  return (await Deno.readTextFile(await currentSegment(root))).split("\n").filter((line) => line !== "");
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
    assert.equal(await store.append(base, bytes("log under a long name")), 1);
    assert.deepEqual((await store.logEntries(base)).map(text), ["log under a long name"]);
    for await (const entry of Deno.readDir(join(root, "logs"))) {
      assert.ok(encoder.encode(entry.name).length <= 255);
    }
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

Deno.test("each commit is one line of the journal: its checksum, then JSON with each key's version and base64 value", async () => {
  await withStore(async (store, root) => {
    await store.cas("vf/a/B", null, bytes("hello"));
    const lines = await journalLines(root);
    assert.equal(lines.length, 1);
    const [hash, json] = [lines[0].slice(0, 64), lines[0].slice(65)];
    assert.equal(hash, sha256(json));
    assert.deepEqual(JSON.parse(json), {
      set: [["vf/a/B", await versionOf(store, "vf/a/B"), btoa("hello")]],
    });
    assert.equal(await store.delete("vf/a/B", null), true);
    assert.deepEqual(JSON.parse((await journalLines(root))[1].slice(65)), { unset: ["vf/a/B"] });
    assert.deepEqual(
      JSON.parse(await Deno.readTextFile(join(root, "store.json"))),
      { kind: "videoflow-file-runtime-store", format: FILE_STORE_FORMAT },
    );
  });
});

Deno.test("swaps that arrive while a commit is on its way go together in one line, each with its own outcome", async () => {
  await withStore(async (store, root) => {
    await store.cas("hot", null, bytes("0"));
    const version = await versionOf(store, "hot");
    const outcomes = await Promise.all([
      ...Array.from({ length: 16 }, (_, i) => store.cas(`k${i}`, null, bytes(`v${i}`))),
      store.cas("hot", version, bytes("first")),
      store.cas("hot", version, bytes("second")),
      store.cas("k0", null, bytes("again")),
      store.delete("absent", null),
    ]);
    assert.deepEqual(outcomes, [...Array(16).fill(true), true, false, false, false]);
    const lines = await journalLines(root);
    assert.equal(lines.length, 2, "one line for the first swap, one for the twenty that came together");
    assert.equal(JSON.parse(lines[1].slice(65)).set.length, 17);
    assert.equal(await readValue(store, "hot"), "first");
    assert.equal(await readValue(store, "k0"), "v0");
    assert.equal((await versionOf(store, "hot")).split(".")[0], "2");
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

Deno.test("a torn journal tail (a writer killed mid-line) is never read, and the next commit cuts it off", async () => {
  await withStore(async (store, root) => {
    await store.cas("k", null, bytes("old"));
    await store.append("log", bytes("r1"));
    const segment = await currentSegment(root);
    const whole = await Deno.readFile(segment);
    const logTemp = join(root, "logs", "log", "append.tmp");
    await Deno.writeTextFile(segment, `${sha256("{}")} {"set":[["k","9.00","bmV`, { append: true });
    await Deno.writeTextFile(logTemp, "torn");
    const reopened = await FileRuntimeStore.open(root);
    try {
      assert.equal(await readValue(reopened, "k"), "old");
      assert.deepEqual((await reopened.scan("")).map((r) => r.key), ["k"]);
      assert.deepEqual((await reopened.logEntries("log")).map(text), ["r1"]);
    } finally {
      await reopened.close();
    }
    await Deno.writeTextFile(segment, `${sha256("{}")} {"set":[["k","9.00","bmV`, { append: true });
    assert.equal(await readValue(store, "k"), "old");
    assert.equal(await store.cas("k", await versionOf(store, "k"), bytes("new")), true);
    assert.equal(await store.append("log", bytes("r2")), 2);
    const after = await Deno.readFile(segment);
    assert.deepEqual(after.subarray(0, whole.length), whole, "the committed lines are kept");
    assert.equal((await journalLines(root)).length, 2, "the torn tail gave way to the new line");
    await assert.rejects(Deno.stat(logTemp), Deno.errors.NotFound);
    assert.equal(await readValue(store, "k"), "new");
    assert.deepEqual((await store.logEntries("log")).map(text), ["r1", "r2"]);
  });
});

Deno.test("a crash with half a commit written leaves every key of it at its old version, and frees the lock", async () => {
  await withStore(async (store, root) => {
    await store.cas("k", null, bytes("old"));
    const version = await versionOf(store, "k");
    {
      using schedule = new FaultSchedule(
        { [Barrier.ledgerWriteMid]: nth(1, crash()) },
        { onCrash: throwSimulatedCrash },
      ).install();
      const attempts = [store.cas("k", version, bytes("new")), store.cas("other", null, bytes("x"))];
      for (const attempt of attempts) await assert.rejects(attempt, SimulatedCrash);
      schedule.assertAllFired();
    }
    const tail = await Deno.readTextFile(await currentSegment(root));
    assert.ok(!tail.endsWith("\n"), "the crash left half a line");
    const replacement = await FileRuntimeStore.open(root);
    try {
      assert.equal(await readValue(replacement, "k"), "old");
      assert.equal((await replacement.get("other")).kind, "absent");
      assert.equal(await versionOf(replacement, "k"), version);
      assert.equal(await replacement.cas("k", version, bytes("retried")), true);
    } finally {
      await replacement.close();
    }
    assert.equal(
      await readValue(store, "k"),
      "retried",
      "the crashed handle reads what the replacement wrote",
    );
    assert.equal((await journalLines(root)).length, 2);
  });
});

Deno.test("a journal line damaged from outside, with lines after it, is UnobservableState: never skipped", async () => {
  await withStore(async (store, root) => {
    await store.cas("k", null, bytes("value"));
    await store.cas("other", null, bytes("fine"));
    const segment = await currentSegment(root);
    const saved = await Deno.readTextFile(segment);
    await Deno.writeTextFile(segment, saved.replace(btoa("value"), btoa("valuf")));
    const second = await FileRuntimeStore.open(root).catch((error) => error);
    assert.ok(second instanceof UnobservableState, String(second));
    assert.equal(second.context.reason, "malformed");
    assert.match(second.remedy ?? "", /damaged outside videoflow/);
    await Deno.writeTextFile(segment, saved);
    const third = await FileRuntimeStore.open(root);
    try {
      assert.equal(await readValue(third, "k"), "value");
    } finally {
      await third.close();
    }
    assert.equal(await readValue(store, "other"), "fine");
  });
});

Deno.test("a format 1 directory (a file per key) is migrated on open: values, versions and logs kept", async () => {
  const root = await Deno.makeTempDir({ prefix: "vf-file-store-" });
  try {
    await Deno.mkdir(join(root, "keys"));
    await Deno.mkdir(join(root, "logs"));
    await Deno.writeTextFile(
      join(root, "store.json"),
      JSON.stringify({ kind: "videoflow-file-runtime-store", format: 1 }),
    );
    const formatOne = (key: string, version: string, value: string) =>
      JSON.stringify({ format: 1, key, version, sha256: sha256(value), value: btoa(value) });
    await Deno.writeTextFile(join(root, "keys", "vf%2fa.json"), formatOne("vf/a", "3.0011223344556677", "A"));
    await Deno.writeTextFile(join(root, "keys", "b.json"), formatOne("b", "1.8899aabbccddeeff", "B"));
    await Deno.writeTextFile(join(root, "keys", "b.tmp"), "torn");
    const store = await FileRuntimeStore.open(root);
    try {
      assert.deepEqual(
        (await store.scan("")).map((r) => [r.key, text(r.value), r.version]),
        [["b", "B", "1.8899aabbccddeeff"], ["vf/a", "A", "3.0011223344556677"]],
      );
      assert.equal(await store.cas("vf/a", "3.0011223344556677", bytes("A2")), true);
      assert.equal((await versionOf(store, "vf/a")).split(".")[0], "4");
      await assert.rejects(Deno.stat(join(root, "keys")), Deno.errors.NotFound);
      assert.equal(JSON.parse(await Deno.readTextFile(join(root, "store.json"))).format, FILE_STORE_FORMAT);
      assert.equal(await store.append("log", bytes("r1")), 1);
    } finally {
      await store.close();
    }
    const again = await FileRuntimeStore.open(root);
    try {
      assert.equal(await readValue(again, "vf/a"), "A2");
      assert.deepEqual((await again.logEntries("log")).map(text), ["r1"]);
    } finally {
      await again.close();
    }
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("the journal compacts: its size stays bounded by the live keys, and a reader of the old segment follows", async () => {
  await withStore(async (store, root) => {
    const reader = await FileRuntimeStore.open(root);
    try {
      const value = "x".repeat(4096);
      let written = 0;
      let round = 0;
      while (written < 3 * COMPACT_MIN_BYTES) {
        await Promise.all(Array.from({ length: 8 }, async (_, k) => {
          const entry = await store.get(`k${k}`);
          const expected = entry.kind === "present" ? entry.version : null;
          assert.equal(await store.cas(`k${k}`, expected, bytes(`${round}:${value}`)), true);
        }));
        written += 8 * value.length;
        round++;
      }
      const names = await segments(root);
      assert.equal(names.length, 1, `one segment left: ${names}`);
      assert.ok(names[0] > "0000000000000001.log", `compacted at least once: ${names}`);
      assert.ok((await Deno.stat(await currentSegment(root))).size <= COMPACT_MIN_BYTES + 8 * 6000);
      for (let k = 0; k < 8; k++) {
        assert.equal((await readValue(reader, `k${k}`)).split(":")[0], String(round - 1));
      }
      assert.equal(await reader.cas("k0", await versionOf(reader, "k0"), bytes("from the reader")), true);
      assert.equal(await readValue(store, "k0"), "from the reader");
    } finally {
      await reader.close();
    }
    await store.close();
    const kept = (await Deno.stat(await currentSegment(root))).size;
    assert.ok(kept < 8 * 6000, `closing compacted the journal to its live keys: ${kept} bytes`);
    const reopened = await FileRuntimeStore.open(root);
    try {
      assert.equal(await readValue(reopened, "k0"), "from the reader");
      assert.equal((await reopened.scan("")).length, 8);
    } finally {
      await reopened.close();
    }
  });
});

Deno.test("a segment sealed by a compactor killed before its rename is compacted again by the next writer", async () => {
  await withStore(async (store, root) => {
    await store.cas("k", null, bytes("kept"));
    const segment = await currentSegment(root);
    const seal = JSON.stringify({ sealed: 2 });
    await Deno.writeTextFile(segment, `${sha256(seal)} ${seal}\n`, { append: true });
    await Deno.writeTextFile(join(root, "journal", "0000000000000002.log.tmp"), "half a snapshot");
    const other = await FileRuntimeStore.open(root);
    try {
      assert.equal(await readValue(other, "k"), "kept");
      assert.deepEqual(await segments(root), ["0000000000000002.log"], "the opener compacted it");
      await assert.rejects(
        Deno.stat(join(root, "journal", "0000000000000002.log.tmp")),
        Deno.errors.NotFound,
      );
      assert.equal(await other.cas("k", await versionOf(other, "k"), bytes("next")), true);
    } finally {
      await other.close();
    }
    assert.equal(await readValue(store, "k"), "next", "the first handle followed the seal");
    assert.equal(await store.cas("k", await versionOf(store, "k"), bytes("last")), true);
    const reopened = await FileRuntimeStore.open(root);
    try {
      assert.equal(await readValue(reopened, "k"), "last");
    } finally {
      await reopened.close();
    }
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
      const reader = await FileRuntimeStore.open(root);
      try {
        assert.equal(
          text(((await reader.get("k")) as { value: Uint8Array }).value),
          "v1",
          "opened read-only",
        );
      } finally {
        await reader.close();
      }
      assert.equal(text(((await store.get("k")) as { value: Uint8Array }).value), "v1");
      assert.deepEqual((await store.logEntries("log")).map(text), ["r1"]);
    } finally {
      if (mounted) await mountCommand("umount", [root]);
      await store.close();
      await Deno.remove(root, { recursive: true });
    }
  },
});

Deno.test("a handle opened before another's write reads that write at once, and decides its swaps on it", async () => {
  await withStore(async (first, root) => {
    const second = await FileRuntimeStore.open(root);
    try {
      assert.equal((await second.get("k")).kind, "absent");
      assert.equal(await first.cas("k", null, bytes("from first")), true);
      assert.equal(await readValue(second, "k"), "from first");
      assert.equal(await second.cas("k", null, bytes("stale")), false, "decided on the first's write");
      assert.equal(await second.cas("k", await versionOf(second, "k"), bytes("from second")), true);
      assert.deepEqual((await first.scan("")).map((r) => text(r.value)), ["from second"]);
    } finally {
      await second.close();
    }
  });
});

Deno.test({
  name:
    "a full disk refuses a commit with the typed disk failure (ENOSPC); freed, the next commit cuts off " +
    "what the short write left and every earlier key is whole (needs root to mount, ignored otherwise)",
  ignore: !MAY_MOUNT,
  fn: async () => {
    const root = await Deno.makeTempDir({ prefix: "vf-file-store-" });
    await mountCommand("mount", ["-t", "tmpfs", "-o", "size=1M", "tmpfs", root]);
    const told: ResourceUnavailable[] = [];
    let store: FileRuntimeStore | null = null;
    try {
      store = await FileRuntimeStore.open(root, undefined, { onDiskFailure: (error) => told.push(error) });
      assert.equal(await store.cas("small", null, bytes("kept")), true);
      const filler = await Deno.open(join(root, "filler"), { write: true, create: true });
      const block = new Uint8Array(4096);
      try {
        for (;;) await filler.write(block);
      } catch (error) {
        assert.ok(error instanceof Error && /No space left/.test(error.message), String(error));
      } finally {
        filler.close();
      }
      await assert.rejects(store.cas("big", null, new Uint8Array(64 * 1024)), (error: unknown) => {
        assert.ok(error instanceof ResourceUnavailable && isDiskFailure(error), String(error));
        assert.equal(error.context[DISK_ERROR_KEY], "ENOSPC");
        assert.equal(error.exitCode, 3);
        return true;
      });
      assert.equal(told.length, 1);
      const torn = await Deno.readFile(await currentSegment(root));
      assert.notEqual(torn.at(-1), 0x0a, "the short write left part of its line");
      await Deno.remove(join(root, "filler"));
      assert.equal(await store.cas("big", null, bytes("after")), true);
      const lines = await journalLines(root);
      assert.equal(lines.length, 2, "the short write's bytes were cut off before the next line");
      await store.close();
      store = await FileRuntimeStore.open(root);
      assert.equal(await readValue(store, "small"), "kept");
      assert.equal(await readValue(store, "big"), "after");
    } finally {
      await store?.close();
      await mountCommand("umount", [root]);
      await Deno.remove(root, { recursive: true });
    }
  },
});
