/**
 * The RuntimeStore contract, written once and run against every provider the registry opens (memory://
 * and file://), plus the registry's own behaviour.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { ConfigError, ResourceUnavailable, UnobservableState } from "../../../src/core/errors.ts";
import { Barrier, dropResponse, FaultSchedule, nth, pause } from "../../../src/backends/faults.ts";
import { MemoryRuntimeStore } from "../../../src/backends/memory/runtime_store.ts";
import type { RuntimeStore } from "../../../src/backends/runtime_store.ts";
import { FileRuntimeStore } from "../../../src/runtime/file_store.ts";
import {
  DEFAULT_RUNTIME_STORE_URL,
  knownRuntimeStoreSchemes,
  openRuntimeStore,
  registerRuntimeStore,
} from "../../../src/runtime/runtime_stores.ts";
import { SeededRandom } from "../../support/random.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();
const bytes = (text: string) => encoder.encode(text);
const text = (value: Uint8Array) => decoder.decode(value);

interface Provider {
  readonly name: string;
  /** A fresh, empty store and what removes it afterwards. */
  open(): Promise<{ store: RuntimeStore; dispose(): Promise<void> }>;
  readonly durable: boolean;
  readonly shared: boolean;
}

const PROVIDERS: readonly Provider[] = [
  {
    name: "memory://",
    open: async () => ({ store: await openRuntimeStore("memory://"), dispose: () => Promise.resolve() }),
    durable: false,
    shared: false,
  },
  {
    name: "file://",
    open: async () => {
      const dir = await Deno.makeTempDir({ prefix: "vf-store-contract-" });
      return {
        store: await openRuntimeStore(`file://${dir}`),
        dispose: () => Deno.remove(dir, { recursive: true }),
      };
    },
    durable: true,
    shared: true,
  },
];

async function present(store: RuntimeStore, key: string): Promise<{ value: string; version: string }> {
  const entry = await store.get(key);
  assert.equal(entry.kind, "present", `expected ${key} to be present`);
  if (entry.kind !== "present") throw new Error("unreachable");
  return { value: text(entry.value), version: entry.version };
}

type Scenario = readonly [name: string, run: (store: RuntimeStore, provider: Provider) => Promise<void>];

const SCENARIOS: readonly Scenario[] = [
  ["get of a key never written is absent", async (store) => {
    assert.deepEqual(await store.get("vf/f/r/n/nothing"), { kind: "absent" });
  }],
  [
    "a value or record given as a pooled Node Buffer is kept as a copy: the caller reusing the pool changes nothing",
    async (store) => {
      const value = Buffer.from("kept value");
      const record = Buffer.from("kept record");
      assert.equal(await store.cas("k", null, value), true);
      assert.equal(await store.append("l", record), 1);
      value.fill(0x21);
      record.fill(0x21);
      assert.equal((await present(store, "k")).value, "kept value");
      assert.deepEqual((await store.logEntries("l")).map(text), ["kept record"]);
    },
  ],
  ["cas with null creates a key once; a second create loses", async (store) => {
    assert.equal(await store.cas("k", null, bytes("first")), true);
    assert.equal(await store.cas("k", null, bytes("second")), false);
    assert.equal((await present(store, "k")).value, "first");
  }],
  ["cas with the current version replaces the value and mints a new version", async (store) => {
    await store.cas("k", null, bytes("v1"));
    const first = await present(store, "k");
    assert.equal(await store.cas("k", first.version, bytes("v2")), true);
    const second = await present(store, "k");
    assert.equal(second.value, "v2");
    assert.notEqual(second.version, first.version);
    assert.equal(await store.cas("k", first.version, bytes("v3")), false, "a superseded version must lose");
    assert.deepEqual(await present(store, "k"), second);
  }],
  ["cas with a fabricated version never creates a key", async (store) => {
    assert.equal(await store.cas("k", "1", bytes("x")), false);
    assert.equal(await store.cas("k", "", bytes("x")), false);
    assert.equal((await store.get("k")).kind, "absent");
  }],
  ["delete honours the expected version, and null removes whatever is there", async (store) => {
    assert.equal(await store.delete("k", null), false, "nothing to delete");
    await store.cas("k", null, bytes("x"));
    const { version } = await present(store, "k");
    assert.equal(await store.delete("k", `${version}-other`), false);
    assert.equal((await store.get("k")).kind, "present");
    assert.equal(await store.delete("k", version), true);
    assert.equal((await store.get("k")).kind, "absent");
    assert.equal(await store.delete("k", version), false);
    await store.cas("k", null, bytes("y"));
    assert.equal(await store.delete("k", null), true);
    assert.equal((await store.get("k")).kind, "absent");
  }],
  ["a version read before a delete never wins after the key is created again (no ABA)", async (store) => {
    await store.cas("k", null, bytes("a"));
    const old = await present(store, "k");
    assert.equal(await store.delete("k", old.version), true);
    assert.equal(await store.cas("k", null, bytes("b")), true);
    assert.notEqual((await present(store, "k")).version, old.version);
    assert.equal(await store.cas("k", old.version, bytes("c")), false);
    assert.equal((await present(store, "k")).value, "b");
  }],
  ["versions are never minted twice for one key", async (store) => {
    const seen = new Set<string>();
    let version: string | null = null;
    for (let i = 0; i < 40; i++) {
      if (i % 10 === 9 && version !== null) {
        assert.equal(await store.delete("k", version), true);
        version = null;
      }
      assert.equal(await store.cas("k", version, bytes(String(i))), true);
      version = (await present(store, "k")).version;
      assert.ok(!seen.has(version), `version ${version} minted twice`);
      seen.add(version);
    }
  }],
  ["stored bytes are copies: mutating the caller's buffers changes nothing", async (store) => {
    const value = bytes("abc");
    await store.cas("k", null, value);
    value[0] = 0x7a;
    const entry = await store.get("k");
    assert.ok(entry.kind === "present");
    entry.value[1] = 0x7a;
    assert.equal((await present(store, "k")).value, "abc");
    const record = bytes("rec");
    await store.append("log", record);
    record[0] = 0x7a;
    const [read] = await store.logEntries("log");
    read[1] = 0x7a;
    assert.equal(text((await store.logEntries("log"))[0]), "rec");
  }],
  ["empty values and binary bytes round-trip exactly", async (store) => {
    const binary = Uint8Array.from({ length: 256 }, (_, i) => i);
    await store.cas("empty", null, new Uint8Array());
    await store.cas("binary", null, binary);
    const empty = await store.get("empty");
    assert.ok(empty.kind === "present");
    assert.equal(empty.value.length, 0);
    const back = await store.get("binary");
    assert.ok(back.kind === "present");
    assert.deepEqual(back.value, binary);
  }],
  [
    "scan returns exactly the keys under a prefix, sorted, with their current values and versions",
    async (store) => {
      const keys = [
        "vf/f/r/a/1",
        "vf/f/r/a/2",
        "vf/f/r/a",
        "vf/f/r/ab",
        "vf/f/r/b/1",
        "other",
        "vf/f/r/a/é/😀",
      ];
      for (const key of keys) await store.cas(key, null, bytes(`value of ${key}`));
      const under = await store.scan("vf/f/r/a");
      assert.deepEqual(under.map((r) => r.key), [
        "vf/f/r/a",
        "vf/f/r/a/1",
        "vf/f/r/a/2",
        "vf/f/r/a/é/😀",
        "vf/f/r/ab",
      ]);
      for (const record of under) {
        const entry = await present(store, record.key);
        assert.equal(text(record.value), `value of ${record.key}`);
        assert.equal(record.version, entry.version);
      }
      assert.deepEqual((await store.scan("vf/f/r/a/")).map((r) => r.key), [
        "vf/f/r/a/1",
        "vf/f/r/a/2",
        "vf/f/r/a/é/😀",
      ]);
      assert.deepEqual((await store.scan("")).map((r) => r.key), [...keys].sort());
      assert.deepEqual(await store.scan("zzz"), []);
      await store.delete("vf/f/r/a/1", null);
      assert.deepEqual((await store.scan("vf/f/r/a/")).map((r) => r.key), ["vf/f/r/a/2", "vf/f/r/a/é/😀"]);
    },
  ],
  ["appends return the log's length and read back whole, oldest first", async (store) => {
    assert.deepEqual(await store.logEntries("terminal"), [], "an unknown log is empty");
    for (let i = 1; i <= 12; i++) assert.equal(await store.append("terminal", bytes(`entry ${i}`)), i);
    assert.equal(await store.append("other", bytes("x")), 1);
    const entries = (await store.logEntries("terminal")).map(text);
    assert.deepEqual(entries, Array.from({ length: 12 }, (_, i) => `entry ${i + 1}`));
    assert.deepEqual((await store.logEntries("other")).map(text), ["x"]);
  }],
  ["logs and keys are separate namespaces", async (store) => {
    await store.append("vf/log", bytes("r"));
    assert.deepEqual(await store.scan("vf/"), []);
    assert.equal((await store.get("vf/log")).kind, "absent");
    await store.cas("vf/log", null, bytes("k"));
    assert.deepEqual((await store.logEntries("vf/log")).map(text), ["r"]);
  }],
  ["concurrent racing swaps from one expected version: exactly one wins", async (store) => {
    await store.cas("counter", null, bytes("0"));
    const { version } = await present(store, "counter");
    const results = await Promise.all(
      Array.from({ length: 24 }, (_, i) => store.cas("counter", version, bytes(`winner ${i}`))),
    );
    assert.equal(results.filter(Boolean).length, 1);
    assert.equal((await present(store, "counter")).value, `winner ${results.indexOf(true)}`);
  }],
  ["concurrent appends each get a distinct length and none is lost", async (store) => {
    const lengths = await Promise.all(
      Array.from({ length: 20 }, (_, i) => store.append("log", bytes(`r${i}`))),
    );
    assert.deepEqual([...lengths].sort((a, b) => a - b), Array.from({ length: 20 }, (_, i) => i + 1));
    const entries = (await store.logEntries("log")).map(text);
    assert.deepEqual([...entries].sort(), Array.from({ length: 20 }, (_, i) => `r${i}`).sort());
    lengths.forEach((length, i) => assert.equal(entries[length - 1], `r${i}`));
  }],
  ["names must be non-empty, well-formed Unicode; an empty scan prefix is allowed", async (store) => {
    await assert.rejects(store.get(""), ConfigError);
    await assert.rejects(store.cas("bad\uD800", null, bytes("x")), ConfigError);
    await assert.rejects(store.append("", bytes("x")), ConfigError);
    await assert.rejects(store.scan("\uDC00"), ConfigError);
    await assert.rejects(store.delete("\uD83D", null), ConfigError);
    await assert.rejects(store.logEntries("x\uDFFFy"), ConfigError);
    assert.deepEqual(await store.scan(""), []);
  }],
  ["capabilities report what the provider guarantees", async (store, provider) => {
    const capabilities = await store.capabilities();
    assert.equal(capabilities.durable.kind, "known");
    assert.ok(capabilities.durable.kind === "known");
    assert.equal(capabilities.durable.value, provider.durable);
    assert.equal(capabilities.sharedAcrossProcesses, provider.shared);
    assert.equal(capabilities.restartSafeJoins, provider.durable && provider.shared);
    assert.equal(capabilities.store, provider.name.replace("://", ""));
  }],
  ["a closed store refuses every operation with ResourceUnavailable", async (store) => {
    await store.cas("k", null, bytes("x"));
    await store.close();
    await store.close();
    await assert.rejects(store.get("k"), ResourceUnavailable);
    await assert.rejects(store.cas("k", null, bytes("x")), ResourceUnavailable);
    await assert.rejects(store.delete("k", null), ResourceUnavailable);
    await assert.rejects(store.scan(""), ResourceUnavailable);
    await assert.rejects(store.append("l", bytes("x")), ResourceUnavailable);
    await assert.rejects(store.logEntries("l"), ResourceUnavailable);
    await assert.rejects(store.capabilities(), ResourceUnavailable);
  }],
  ["a dropped write receipt throws UnobservableState, though the write took effect", async (store) => {
    using schedule = new FaultSchedule({ [Barrier.ledgerWriteAfter]: nth(2, dropResponse()) }).install();
    assert.equal(await store.cas("k", null, bytes("a")), true);
    const { version } = await present(store, "k");
    await assert.rejects(store.cas("k", version, bytes("b")), UnobservableState);
    schedule.assertAllFired();
    assert.equal((await present(store, "k")).value, "b");
  }],
  ["a writer paused before its swap loses to the writer that went first", async (store) => {
    await store.cas("owner", null, bytes("epoch 0"));
    const { version } = await present(store, "owner");
    using schedule = new FaultSchedule({ [Barrier.ledgerWriteBefore]: nth(1, pause("slow", 10)) }).install();
    const slow = store.cas("owner", version, bytes("slow epoch 1"));
    await schedule.untilFired(Barrier.ledgerWriteBefore, 1);
    assert.equal(await store.cas("owner", version, bytes("fast epoch 1")), true);
    schedule.release("slow");
    assert.equal(await slow, false);
    schedule.assertAllFired();
    assert.equal((await present(store, "owner")).value, "fast epoch 1");
  }],
  ["random operation sequences agree with a model of the contract", async (store) => {
    const seed = 0x5eed_0001;
    const random = new SeededRandom(seed);
    const keys = ["a", "a/b", "a/c", "b", "ü/1", "ü/2"];
    const model = new Map<string, { value: string; version: string }>();
    const logs = new Map<string, string[]>();
    const seenVersions: string[] = [];
    try {
      for (let step = 0; step < 300; step++) {
        const key = random.pick(keys);
        const current = model.get(key);
        const op = random.pick(["cas", "cas", "delete", "get", "scan", "append"] as const);
        if (op === "cas") {
          const expected = random.pick([current?.version ?? null, null, ...seenVersions.slice(-3)]);
          const won = await store.cas(key, expected, bytes(`s${step}`));
          assert.equal(won, expected === (current?.version ?? null), `cas ${key} at step ${step}`);
          if (won) {
            const { version } = await present(store, key);
            model.set(key, { value: `s${step}`, version });
            seenVersions.push(version);
          }
        } else if (op === "delete") {
          const expected = random.pick([current?.version ?? null, null, ...seenVersions.slice(-2)]);
          const removed = await store.delete(key, expected);
          assert.equal(removed, current !== undefined && (expected === null || expected === current.version));
          if (removed) model.delete(key);
        } else if (op === "get") {
          const entry = await store.get(key);
          if (current === undefined) assert.equal(entry.kind, "absent");
          else assert.deepEqual(await present(store, key), current);
        } else if (op === "scan") {
          const prefix = random.pick(["", "a", "a/", "ü", "x"]);
          const scanned = (await store.scan(prefix)).map((r) => [r.key, text(r.value), r.version]);
          const expected = [...model].filter(([k]) => k.startsWith(prefix)).sort((
            [x],
            [y],
          ) => (x < y ? -1 : 1))
            .map(([k, v]) => [k, v.value, v.version]);
          assert.deepEqual(scanned, expected);
        } else {
          const log = random.pick(["l1", "l2"]);
          const records = logs.get(log) ?? [];
          records.push(`s${step}`);
          logs.set(log, records);
          assert.equal(await store.append(log, bytes(`s${step}`)), records.length);
          assert.deepEqual((await store.logEntries(log)).map(text), records);
        }
      }
    } catch (error) {
      console.error(`model check failed with seed ${seed}`);
      throw error;
    }
  }],
];

for (const provider of PROVIDERS) {
  for (const [name, run] of SCENARIOS) {
    Deno.test(`${provider.name} ${name}`, async () => {
      const { store, dispose } = await provider.open();
      try {
        await run(store, provider);
      } finally {
        await store.close();
        await dispose();
      }
    });
  }
}

Deno.test("no URL, null or an empty string opens the default memory:// store", async () => {
  assert.equal(DEFAULT_RUNTIME_STORE_URL, "memory://");
  for (const url of [undefined, null, ""]) {
    const store = await openRuntimeStore(url);
    assert.ok(store instanceof MemoryRuntimeStore);
    await store.close();
  }
});

Deno.test("each memory:// store is its own: nothing is shared between two opens", async () => {
  const first = await openRuntimeStore("memory://");
  const second = await openRuntimeStore("MEMORY://");
  await first.cas("k", null, bytes("x"));
  assert.equal((await second.get("k")).kind, "absent");
});

Deno.test("file://<dir> opens a file store in that directory, and a second open sees the first's keys", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-store-registry-" });
  try {
    const first = await openRuntimeStore(`file://${dir}/ledger`);
    assert.ok(first instanceof FileRuntimeStore);
    assert.equal(first.root, `${dir}/ledger`);
    await first.cas("k", null, bytes("persisted"));
    await first.close();
    const second = await openRuntimeStore(`File://${dir}/ledger`);
    assert.equal((await present(second, "k")).value, "persisted");
    await second.close();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("file:// without a directory is a ConfigError", async () => {
  await assert.rejects(openRuntimeStore("file://"), ConfigError);
});

Deno.test("an unregistered scheme is refused, naming the known schemes, without its password", async () => {
  await assert.rejects(openRuntimeStore("etcd://:s3cret@ledger.local:2379/0"), (error: unknown) => {
    assert.ok(error instanceof ConfigError);
    assert.match(
      error.message,
      /unknown scheme etcd:\/\/; known schemes are file:\/\/, memory:\/\/, redis:\/\/, rediss:\/\//,
    );
    assert.match(error.remedy ?? "", /registerRuntimeStore/);
    assert.doesNotMatch(error.render(), /s3cret/);
    return true;
  });
});

Deno.test("a URL without a scheme is refused, naming the known schemes", async () => {
  await assert.rejects(openRuntimeStore("/var/lib/ledger"), (error: unknown) => {
    assert.ok(error instanceof ConfigError);
    assert.match(error.message, /has no scheme; known schemes are /);
    return true;
  });
});

Deno.test("registerRuntimeStore adds a scheme, case-insensitively, whose factory gets the full URL", async () => {
  assert.throws(() => registerRuntimeStore("not a scheme", () => new MemoryRuntimeStore()), ConfigError);
  assert.throws(() => registerRuntimeStore("x://", () => new MemoryRuntimeStore()), ConfigError);
  const urls: string[] = [];
  const made = new MemoryRuntimeStore();
  registerRuntimeStore("Test-Ledger", (url) => {
    urls.push(url);
    return made;
  });
  assert.ok(knownRuntimeStoreSchemes().includes("test-ledger"));
  assert.equal(await openRuntimeStore("TEST-LEDGER://host/db"), made);
  assert.deepEqual(urls, ["TEST-LEDGER://host/db"]);
});
