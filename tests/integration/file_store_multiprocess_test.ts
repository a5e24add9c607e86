/**
 * The file store across real processes: `deno run` subprocesses (tests/support/file_store_hammer.ts)
 * racing compare-and-swap on one key, and writers killed with SIGKILL mid-write. No timing assertion:
 * every check is about what the directory holds afterwards.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Barrier, crash, FaultSchedule, nth } from "../../src/backends/faults.ts";
import { FileRuntimeStore } from "../../src/runtime/file_store.ts";
import { verifyValue } from "../support/file_store_hammer.ts";
import { SeededRandom } from "../support/random.ts";

const HAMMER = new URL("../support/file_store_hammer.ts", import.meta.url).pathname;
const REPO = new URL("../../", import.meta.url).pathname;
const WRITER_KEYS = 4;
/** How long a writer may take to land its first write; a limit against hangs, not a timing check. */
const READY_LIMIT_MS = 60_000;

function hammer(args: string[], env: Record<string, string> = {}): Deno.ChildProcess {
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "--no-lock", HAMMER, ...args],
    cwd: REPO,
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
}

async function withRoot(body: (root: string) => Promise<void>): Promise<void> {
  const root = await Deno.makeTempDir({ prefix: "vf-file-store-mp-" });
  try {
    await body(root);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
}

/** Resolves when the child prints `ready`; rejects if it ends first or takes past the limit. */
async function untilReady(
  child: Deno.ChildProcess,
  stdout: ReadableStreamDefaultReader<string>,
): Promise<void> {
  let seen = "";
  let timer: ReturnType<typeof setTimeout> | undefined;
  const limit = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error("the writer never reported ready")), READY_LIMIT_MS);
  });
  try {
    while (!seen.includes("ready\n")) {
      const chunk = await Promise.race([stdout.read(), limit]);
      if (chunk.done) {
        const status = await child.status;
        throw new Error(`the writer ended before it was ready (exit ${status.code})`);
      }
      seen += chunk.value;
    }
  } finally {
    clearTimeout(timer);
  }
}

async function stderrText(child: Deno.ChildProcess): Promise<string> {
  return new TextDecoder().decode(await new Response(child.stderr).arrayBuffer());
}

/** Every key and log record the writers left must verify, and no key's sequence may go backwards. */
async function checkIntact(root: string, lastSeq: Map<string, number>, lastLogLength: { value: number }) {
  const store = await FileRuntimeStore.open(root);
  try {
    for (let k = 0; k < WRITER_KEYS; k++) {
      const key = `k${k}`;
      const entry = await store.get(key);
      if (entry.kind === "absent") {
        assert.equal(lastSeq.get(key), undefined, `${key} vanished`);
        continue;
      }
      const { seq } = verifyValue(entry.value, key);
      assert.ok(seq >= (lastSeq.get(key) ?? 0), `${key} went back from ${lastSeq.get(key)} to ${seq}`);
      lastSeq.set(key, seq);
    }
    const records = await store.logEntries("log");
    records.forEach((record, i) => verifyValue(record, `log record ${i + 1}`));
    assert.ok(records.length >= lastLogLength.value, "log records were lost");
    lastLogLength.value = records.length;
  } finally {
    await store.close();
  }
}

/** The journal's current (highest-numbered) segment. */
async function currentSegment(root: string): Promise<string> {
  const names = (await Array.fromAsync(Deno.readDir(join(root, "journal")))).map((entry) => entry.name)
    .filter((name) => name.endsWith(".log")).sort();
  return join(root, "journal", names.at(-1)!);
}

/**
 * What a killed writer left half done: a torn journal tail (bytes after the last whole line, which the
 * next writer cuts off) or a log's temporary file (removed here). True when there was either.
 */
async function leftHalfDone(root: string): Promise<boolean> {
  const journal = await Deno.readFile(await currentSegment(root));
  let found = journal.length > 0 && journal.at(-1) !== 0x0a;
  const dir = join(root, "logs", "log");
  try {
    for await (const entry of Deno.readDir(dir)) {
      if (!entry.name.endsWith(".tmp")) continue;
      await Deno.remove(join(dir, entry.name));
      found = true;
    }
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  return found;
}

Deno.test("processes racing CAS increments on one key never win one version twice and lose no update", async () => {
  await withRoot(async (root) => {
    const processes = 4;
    const attempts = 600;
    const children = Array.from(
      { length: processes },
      () => hammer(["increment", root, "counter", String(attempts)]),
    );
    const outputs = await Promise.all(children.map((child) => child.output()));
    const won: number[][] = outputs.map((output, i) => {
      const stderr = new TextDecoder().decode(output.stderr);
      assert.equal(output.code, 0, `process ${i} failed: ${stderr}`);
      return JSON.parse(new TextDecoder().decode(output.stdout)).won;
    });
    const all = won.flat().sort((a, b) => a - b);
    assert.equal(new Set(all).size, all.length, "a counter value was written by two winning swaps");
    const store = await FileRuntimeStore.open(root);
    try {
      const entry = await store.get("counter");
      assert.ok(entry.kind === "present");
      const final = Number(new TextDecoder().decode(entry.value));
      assert.equal(final, all.length, "the final count equals the number of successful swaps");
      assert.deepEqual(
        all,
        Array.from({ length: final }, (_, i) => i + 1),
        "every increment 1..final won once",
      );
      assert.equal(entry.version.split(".")[0], String(final), "one version minted per successful swap");
    } finally {
      await store.close();
    }
    // A failed attempt needs a win by another process between its read and its swap, and one win falls
    // inside at most one attempt of each other process: so wins >= attempts of all / processes.
    assert.ok(all.length >= attempts, `at least one process's worth of swaps won (${all.length})`);
  });
});

Deno.test("writers killed with SIGKILL at random instants leave every key whole, old or new", async () => {
  const seed = 0xc0ffee;
  const random = new SeededRandom(seed);
  const kills = 36;
  const lastSeq = new Map<string, number>();
  const logLength = { value: 0 };
  let killedMidWrite = 0;
  await withRoot(async (root) => {
    try {
      for (let round = 0; round < kills; round++) {
        const child = hammer(["write", root, String(WRITER_KEYS), String(seed + round), "0.25"]);
        const stdout = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
        try {
          await untilReady(child, stdout);
        } catch (error) {
          child.kill("SIGKILL");
          await child.status;
          throw new Error(`round ${round}: ${(error as Error).message}\n${await stderrText(child)}`);
        }
        await new Promise((resolve) => setTimeout(resolve, random.next() * 40));
        child.kill("SIGKILL");
        const status = await child.status;
        await stdout.cancel();
        const stderr = await stderrText(child);
        assert.equal(status.signal, "SIGKILL", `round ${round}: the writer ended on its own: ${stderr}`);
        await checkIntact(root, lastSeq, logLength);
        if (await leftHalfDone(root)) killedMidWrite++;
      }
    } catch (error) {
      console.error(`kill schedule seed ${seed}`);
      throw error;
    }
  });
  assert.ok(
    killedMidWrite > 0,
    "no kill landed between a temporary write and its rename: the fault never fired",
  );
});

Deno.test("a writer crashed with half a commit written leaves the value before it, and the lock free", async () => {
  await withRoot(async (root) => {
    const markerDir = join(root, "faults");
    const schedule = new FaultSchedule({ [Barrier.ledgerWriteMid]: nth(5, crash()) }, { markerDir });
    const child = hammer(["write", root, "1", "7", "0"], schedule.toEnv());
    const [status, stderr] = await Promise.all([child.status, stderrText(child), child.stdout.cancel()]);
    assert.equal(status.signal, "SIGKILL", `the writer was not crashed at the barrier: ${stderr}`);
    schedule.assertAllFired();
    const torn = await Deno.readFile(await currentSegment(root));
    assert.notEqual(torn.at(-1), 0x0a, "the crash left half a line at the journal's end");
    const store = await FileRuntimeStore.open(root);
    try {
      const entry = await store.get("k0");
      assert.ok(entry.kind === "present");
      const kept = verifyValue(entry.value, "k0");
      assert.equal(
        kept.seq,
        4,
        "the key holds the fourth write: the fifth, crashed mid-line, never happened",
      );
      assert.equal(
        await store.cas("k0", entry.version, new TextEncoder().encode("after")),
        true,
        "the lock was freed",
      );
    } finally {
      await store.close();
    }
    const mended = await Deno.readFile(await currentSegment(root));
    assert.equal(mended.at(-1), 0x0a, "the next writer cut the torn tail off");
  });
});
