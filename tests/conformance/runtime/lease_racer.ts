/**
 * A process that races for one partition lease of a file-store ledger (file_lease_race_test.ts spawns two).
 *
 * `deno run -A lease_racer.ts <root> turns <count> <leaseSeconds> <seed>`: acquires the partition `count`
 * times without waiting (an OwnershipConflict is retried after a short random pause), holds each lease for a
 * few renewals with an authority check after each, then releases it gracefully. Prints one JSON line per
 * ownership, `{"epoch", "token", "from", "to"}` (wall milliseconds: `from` after the acquisition returned,
 * `to` before the release began), then `{"done": true, "conflicts": n}`.
 *
 * `deno run -A lease_racer.ts <root> hold <leaseSeconds>`: acquires (waiting), prints its ownership line
 * with `to: null`, then keeps the lease (`keepLease`: a renewal every third of a lease) until killed.
 *
 * `deno run -A lease_racer.ts <root> wait <leaseSeconds>`: acquires once, waiting for the lease to lapse;
 * prints `{"conflict": true}` each time a live holder refuses it, then its ownership line, then exits.
 *
 * @module
 */

import { OwnershipConflict } from "../../../src/core/errors.ts";
import { FlowRuntime, type OwnershipToken } from "../../../src/backends/runtime.ts";
import { FileRuntimeStore } from "../../../src/runtime/file_store.ts";
import { SeededRandom } from "../../support/random.ts";

const [root, mode, ...rest] = Deno.args;
const print = (line: Record<string, unknown>) => console.log(JSON.stringify(line));
const pause = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const owned = (token: OwnershipToken, from: number, to: number | null) =>
  print({ epoch: token.epoch, token: token.fencingToken, from, to });

const store = await FileRuntimeStore.open(root);
const leaseSeconds = Number(mode === "turns" ? rest[1] : rest[0]);
const runtime = new FlowRuntime({ store, flowId: "race", runId: "r1", node: "singleton", leaseSeconds });

/** Acquires the partition, calling `onConflict` after each refusal before it tries again. */
async function acquire(wait: boolean, onConflict: () => Promise<void>): Promise<OwnershipToken> {
  for (;;) {
    try {
      return await runtime.acquirePartition(undefined, { wait });
    } catch (error) {
      if (!(error instanceof OwnershipConflict)) throw error;
      await onConflict();
    }
  }
}

if (mode === "turns") {
  const random = new SeededRandom(Number(rest[2]));
  let conflicts = 0;
  for (let turn = 0; turn < Number(rest[0]); turn++) {
    const token = await acquire(false, () => {
      conflicts++;
      return pause(random.int(2, 15));
    });
    const from = Date.now();
    for (let renewal = 0; renewal < 3; renewal++) {
      await pause(random.int(1, 10));
      await runtime.renewPartition(token);
      await runtime.checkAuthority(token);
    }
    owned(token, from, Date.now());
    await runtime.releasePartition(token);
    await pause(random.int(5, 30));
  }
  print({ done: true, conflicts });
} else if (mode === "hold") {
  const token = await acquire(true, () => Promise.resolve());
  owned(token, Date.now(), null);
  runtime.keepLease(token, (error) => {
    console.error(error);
    Deno.exit(3);
  });
  await new Promise<never>(() => {});
} else if (mode === "wait") {
  const token = await acquire(true, () => Promise.resolve(print({ conflict: true })));
  owned(token, Date.now(), null);
} else {
  throw new Error(`unknown mode ${mode}`);
}
await store.close();
