import assert from "node:assert/strict";
import { ArrivalLog } from "../../../tasks/_bench_flows/arrivals.ts";
import { processCpuMs } from "../../../tasks/_bench_flows/clock.ts";

Deno.test("an arrival log reads the CPU time at the first and the expected-th arrival, and divides by the items between", () => {
  const readings = [100, 150];
  let reads = 0;
  const log = new ArrivalLog(3, () => readings[reads++]);
  log.record(1000, 990);
  log.record(1010, 1000);
  assert.equal(log.summary().cpuUsPerItem, null, "not before the expected-th item");
  log.record(1020, 1000);
  assert.equal(reads, 2, "read twice, not per item");
  assert.equal(log.summary().cpuUsPerItem, (150 - 100) * 1000 / 2);
  assert.equal(log.summary().itemsPerSecond, 2 / 0.02);
  const unmeasured = new ArrivalLog(2);
  unmeasured.record(1, null);
  unmeasured.record(2, null);
  assert.equal(unmeasured.summary().cpuUsPerItem, null, "no CPU reader, no figure");
});

Deno.test("the process's CPU time counts what its Workers spend", async () => {
  const before = processCpuMs();
  const spinner = new Worker(
    "data:application/typescript," +
      encodeURIComponent(
        "const t = performance.now(); while (performance.now() - t < 300); self.postMessage(0);",
      ),
    { type: "module" },
  );
  await new Promise((resolve) => spinner.onmessage = resolve);
  spinner.terminate();
  const after = processCpuMs();
  // The main thread only waited: what was counted is the Worker's 300 ms (less when it was descheduled).
  assert.ok(after - before >= 30, `${after - before} ms of CPU while a Worker spun for 300 ms`);
});
