import assert from "node:assert/strict";
import { CoalescedRun } from "../../../src/core/coalesced_run.ts";

/** Lets the microtasks and timers due now run. */
function settle(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 0));
}

Deno.test("requests before a run starts share it; one run at a time; a failed run does not stop the next", async () => {
  let started = 0;
  const gates: PromiseWithResolvers<void>[] = [];
  const runs = new CoalescedRun(() => {
    started++;
    const gate = Promise.withResolvers<void>();
    gates.push(gate);
    return gate.promise;
  });
  const first = runs.request();
  assert.equal(runs.request(), first, "a request before the run started shares it");
  await settle();
  assert.equal(started, 1);
  const second = runs.request();
  const third = runs.request();
  assert.notEqual(second, first, "a request while a run goes on queues the next");
  assert.equal(third, second, "the requests while that one waits share it");
  await settle();
  assert.equal(started, 1, "one run at a time");
  gates[0].reject(new Error("the disk hiccupped"));
  await assert.rejects(first, /hiccupped/);
  await settle();
  assert.equal(started, 2, "the queued run starts once the first ended, failed or not");
  gates[1].resolve();
  await second;
  assert.equal(started, 2);
});
