import assert from "node:assert/strict";
import { type StopSignal, StopSignals } from "../../../src/engines/stop_signals.ts";

/** Resolves after the signal listeners had a turn to run. */
function settle(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 100));
}

Deno.test("a stop signal that comes before any handler is kept and handed to the first one attached; after detaching, signals change nothing and end nothing", async () => {
  using signals = StopSignals.listen();
  Deno.kill(Deno.pid, "SIGTERM");
  await settle();
  const seen: StopSignal[] = [];
  const detach = signals.attach((signal) => seen.push(signal));
  assert.deepEqual(seen, ["SIGTERM"], "the signal that came first");
  // SIGTERM only: the test runner answers a SIGINT of its own.
  Deno.kill(Deno.pid, "SIGTERM");
  await settle();
  assert.deepEqual(seen, ["SIGTERM", "SIGTERM"]);
  detach();
  Deno.kill(Deno.pid, "SIGTERM");
  await settle();
  assert.deepEqual(seen, ["SIGTERM", "SIGTERM"], "caught, and handed to no one");
  assert.throws(() => signals.attach(() => {}), Error, "handled once");
});
