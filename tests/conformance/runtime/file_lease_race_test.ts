/**
 * Two FlowRuntimes over one file-store ledger in two real `deno` processes (lease_racer.ts), racing for
 * one partition lease (RUN-018, RUN-019): at any time exactly one owns it, every acquisition gets its own
 * epoch, and fencing tokens strictly increase. The ownership intervals each process reports are wall-clock
 * readings of one host, taken so that a later owner's start can only be after an earlier owner's end.
 */
import assert from "node:assert/strict";
import { testSeed } from "../../support/random.ts";

const RACER = new URL("./lease_racer.ts", import.meta.url).pathname;
const REPO = new URL("../../../", import.meta.url).pathname;
const TURNS = 15;
/** How long a racer may take to print its next line; a limit against hangs, not a timing check. */
const LINE_LIMIT_MS = 60_000;

interface Ownership {
  readonly epoch: number;
  readonly token: string;
  readonly from: number;
  readonly to: number | null;
}

/** A racer process and a reader of its JSON output lines. */
class Racer implements AsyncDisposable {
  readonly #child: Deno.ChildProcess;
  readonly #lines: ReadableStreamDefaultReader<string>;
  #buffer = "";

  constructor(args: readonly string[]) {
    this.#child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "--no-lock", RACER, ...args],
      cwd: REPO,
      stdin: "null",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    this.#lines = this.#child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  }

  /** The next output line, parsed; throws when the process ends first or stays silent past the limit. */
  async next(): Promise<Record<string, unknown>> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const limit = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error("the racer printed nothing in time")), LINE_LIMIT_MS);
    });
    try {
      while (!this.#buffer.includes("\n")) {
        const chunk = await Promise.race([this.#lines.read(), limit]);
        if (chunk.done) throw new Error(`the racer ended early (exit ${(await this.#child.status).code})`);
        this.#buffer += chunk.value;
      }
    } finally {
      clearTimeout(timer);
    }
    const end = this.#buffer.indexOf("\n");
    const line = this.#buffer.slice(0, end);
    this.#buffer = this.#buffer.slice(end + 1);
    return JSON.parse(line);
  }

  /** Every line up to and including the first one that has `key`. */
  async until(key: string): Promise<Record<string, unknown>[]> {
    const lines = [];
    for (let line = await this.next();; line = await this.next()) {
      lines.push(line);
      if (key in line) return lines;
    }
  }

  kill(): void {
    this.#child.kill("SIGKILL");
  }

  /** The exit status, once the process ended. */
  get status(): Promise<Deno.CommandStatus> {
    return this.#child.status;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    try {
      this.#child.kill("SIGKILL");
    } catch {
      // Already exited.
    }
    await this.#child.status;
    await this.#lines.cancel();
  }
}

async function withLedger(body: (root: string) => Promise<void>): Promise<void> {
  const root = await Deno.makeTempDir({ prefix: "vf-lease-race-" });
  try {
    await body(root);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
}

/** Exactly one owner at a time: sorted by epoch, epochs are 1..n and each ownership ends before the next begins. */
function assertOneOwnerAtATime(ownerships: readonly Ownership[], what: string): void {
  const sorted = [...ownerships].sort((a, b) => a.epoch - b.epoch);
  assert.deepEqual(
    sorted.map((o) => o.epoch),
    sorted.map((_, i) => i + 1),
    `${what}: every epoch granted once`,
  );
  for (let i = 1; i < sorted.length; i++) {
    const [before, after] = [sorted[i - 1], sorted[i]];
    assert.ok(after.token > before.token, `${what}: token of epoch ${after.epoch} does not increase`);
    assert.ok(
      before.to !== null && before.to <= after.from,
      `${what}: epoch ${before.epoch} (until ${before.to}) overlaps epoch ${after.epoch} (from ${after.from})`,
    );
  }
}

Deno.test("RUN-018/RUN-019: two processes taking turns on one lease never own it at once; tokens increase", async () => {
  const seed = testSeed();
  await withLedger(async (root) => {
    await using first = new Racer([root, "turns", String(TURNS), "5", String(seed)]);
    await using second = new Racer([root, "turns", String(TURNS), "5", String(seed + 1)]);
    const [a, b] = await Promise.all([first.until("done"), second.until("done")]);
    assert.equal((await first.status).code, 0);
    assert.equal((await second.status).code, 0);
    const ownerships = [...a, ...b].filter((line) => "epoch" in line) as unknown as Ownership[];
    assert.equal(ownerships.length, 2 * TURNS);
    assertOneOwnerAtATime(ownerships, `seed ${seed}`);
    const conflicts = [...a, ...b].reduce((sum, line) => sum + (Number(line.conflicts) || 0), 0);
    assert.ok(conflicts > 0, `seed ${seed}: the processes never met at the lease, so nothing raced`);
  });
});

Deno.test("RUN-018: a waiter is refused while the holder process renews, and takes over once it is killed", async () => {
  await withLedger(async (root) => {
    await using holder = new Racer([root, "hold", "3"]);
    const [held] = await holder.until("epoch") as unknown as Ownership[];
    await using waiter = new Racer([root, "wait", "3"]);
    await waiter.next().then((line) => assert.deepEqual(line, { conflict: true }, "refused while renewed"));
    const killedAt = Date.now();
    holder.kill();
    assert.equal((await holder.status).signal, "SIGKILL");
    const lines = await waiter.until("epoch");
    const taken = lines.at(-1) as unknown as Ownership;
    assert.equal(taken.epoch, held.epoch + 1);
    assert.ok(taken.token > held.token);
    assert.ok(taken.from >= killedAt, "the waiter never owned the lease while the holder lived");
    assert.equal((await waiter.status).code, 0);
  });
});
