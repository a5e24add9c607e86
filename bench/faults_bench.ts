/**
 * The cost of a fault barrier on the production path, where no schedule is installed, beside the floors
 * it is measured against: awaiting an already-resolved promise (the cheapest thing an awaited call can
 * be) and an empty loop (for the synchronous form). Each iteration makes 1,000 calls.
 *
 * Run: `deno bench bench/faults_bench.ts`.
 *
 * @module
 */

import {
  Barrier,
  barrier,
  barrierSync,
  dropResponse,
  FaultSchedule,
  faultsInstalled,
} from "../src/backends/faults.ts";

const CALLS = 1000;
const NAME = Barrier.messagePublishBefore;
const RESOLVED = Promise.resolve();
let sink = 0;

Deno.bench({
  name: "await a resolved promise (floor)",
  group: "awaited, nothing installed",
  baseline: true,
  async fn() {
    for (let i = 0; i < CALLS; i++) await RESOLVED;
  },
});

Deno.bench({
  name: "await barrier(name)",
  group: "awaited, nothing installed",
  async fn() {
    for (let i = 0; i < CALLS; i++) await barrier(NAME);
  },
});

Deno.bench({
  name: "if (faultsInstalled()) await barrier(name, context)",
  group: "awaited, nothing installed",
  async fn() {
    for (let i = 0; i < CALLS; i++) {
      if (faultsInstalled()) await barrier(NAME, { step: i });
    }
    await RESOLVED;
  },
});

Deno.bench({
  name: "empty loop (floor)",
  group: "synchronous, nothing installed",
  baseline: true,
  fn() {
    for (let i = 0; i < CALLS; i++) sink += i;
  },
});

Deno.bench({
  name: "barrierSync(name)",
  group: "synchronous, nothing installed",
  fn() {
    for (let i = 0; i < CALLS; i++) sink += barrierSync(NAME).fired ? 1 : i;
  },
});

Deno.bench({
  name: "await barrier(name) with a schedule installed that does not name it",
  group: "installed, barrier not scheduled",
  async fn(b) {
    const schedule = new FaultSchedule({ [Barrier.messageSettleAfter]: dropResponse() }).install();
    b.start();
    for (let i = 0; i < CALLS; i++) await barrier(NAME);
    b.end();
    schedule.uninstall();
  },
});
