/**
 * `vf run-local --metrics`: one health endpoint for the whole local run, scraped with a real HTTP client
 * while the run goes on, its exposition parsed line by line as Prometheus reads it.
 *
 * @module
 */

import assert from "node:assert/strict";
import { join } from "node:path";
import { parseHistogram } from "../../src/runtime/health.ts";
import { inTempDir, startVf, writeFlow } from "../support/vf_cli.ts";

/** Every sample line of a Prometheus text exposition: `name{labels} value`, a comment, or nothing. */
const SAMPLE =
  /^([a-z_:][a-z0-9_:]*)(\{(?:[a-z_][a-z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (-?[0-9.e+]+|\+Inf|NaN)$/;

/** The families of `text`, each checked to have exactly one `# TYPE` line before its samples. */
function parseExposition(text: string): Map<string, string[]> {
  const families = new Map<string, string[]>();
  let current: string | null = null;
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("# HELP ")) continue;
    const type = /^# TYPE (\S+) (counter|histogram|gauge)$/.exec(line);
    if (type !== null) {
      assert(!families.has(type[1]), `family ${type[1]} is declared once`);
      families.set(type[1], []);
      current = type[1];
      continue;
    }
    const sample = SAMPLE.exec(line);
    assert(sample !== null, `a sample line: ${JSON.stringify(line)}`);
    assert(current !== null && sample[1].startsWith(current), `${sample[1]} is under its family ${current}`);
    families.get(current)!.push(line);
  }
  return families;
}

Deno.test("vf run-local --metrics serves every replica's metrics, /readyz and /healthz while the run goes on, and stops with it", async () => {
  await inTempDir(async (dir) => {
    const out = join(dir, "out.jsonl");
    const flow = await writeFlow(
      dir,
      ["Count", "SlowPass"],
      [
        `const count = new Count({ name: "count", n: 600 });`,
        `const slow = new SlowPass({ name: "slow", nbTasks: 2, delayMs: 10 }).from(count);`,
        `const sink = new JsonlSink({ name: "sink", path: ${JSON.stringify(out)} }).from(slow);`,
        `export default new Flow([sink], { flowType: "batch", flowId: "scraped" });`,
      ].join("\n"),
    );
    const child = startVf(["run-local", flow, "--state", join(dir, "state"), "--metrics", "0"], { cwd: dir });
    const decoder = new TextDecoder();
    let stdout = "";
    const reading = (async () => {
      for await (const chunk of child.stdout) stdout += decoder.decode(chunk, { stream: true });
    })();
    const stderr = new Response(child.stderr).text();
    const announced = async (): Promise<string> => {
      for (;;) {
        const found = /metrics at (http:\/\/127\.0\.0\.1:\d+)\/metrics/.exec(stdout);
        if (found !== null) return found[1];
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    };
    const url = await announced();
    // Scraped until the slow stage has counted work; each of its replicas has its own samples.
    const scrape = async () => {
      const response = await fetch(`${url}/metrics`);
      assert.equal(response.status, 200);
      assert.match(response.headers.get("content-type") ?? "", /^text\/plain; version=0\.0\.4/);
      return parseExposition(await response.text());
    };
    const slowProcessed = (families: Map<string, string[]>, replica: number) =>
      (families.get("videoflow_messages_processed_total") ?? [])
        .map((line) => line.match(new RegExp(`\\{node="slow",replica="${replica}"\\} (\\d+)$`))?.[1])
        .filter((value) => value !== undefined).map(Number);
    let families = await scrape();
    const counted = () =>
      slowProcessed(families, 0).length === 1 && slowProcessed(families, 1).length === 1 &&
      slowProcessed(families, 0).concat(slowProcessed(families, 1)).reduce((a, b) => a + b, 0) > 0;
    // A replica has samples from its first report on, which it sends once its node opened.
    while (!counted()) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      families = await scrape();
    }
    assert.equal(slowProcessed(families, 0).length, 1, "replica 0 of slow has its own sample");
    assert.equal(slowProcessed(families, 1).length, 1, "replica 1 of slow has its own sample");
    for (const family of ["videoflow_proctime_seconds", "videoflow_actual_proctime_seconds"]) {
      assert(families.has(family), `${family} is exported`);
    }
    // One replica's histogram, read back as a scraper does: its buckets are cumulative and end at +Inf.
    const count0 = families.get("videoflow_actual_proctime_seconds")!
      .filter((line) => line.includes('node="count",replica="0"')).join("\n");
    const histogram = parseHistogram(count0, "actual_proctime_seconds");
    assert(histogram.cumulative.length > 1 && histogram.cumulative.at(-1)! > 0, count0);
    assert.deepEqual(histogram.cumulative, [...histogram.cumulative].sort((a, b) => a - b));
    // Ready once every running replica opened its node; until then it names the ones still opening.
    for (;;) {
      const ready = await fetch(`${url}/readyz`);
      const body = await ready.text();
      if (ready.status === 200) break;
      assert.equal(ready.status, 503);
      assert.match(body, /^not ready: (\w+\[\d\](, )?)+ still opening\n$/);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.equal(await (await fetch(`${url}/healthz`)).text(), "ok\n");
    assert.equal((await fetch(`${url}/nothing`)).status, 404);
    const status = await child.status;
    await reading;
    assert.equal(status.code, 0, `${stdout}\n${await stderr}`);
    await assert.rejects(fetch(`${url}/metrics`), "the endpoint ends with the run");
  });
});

Deno.test("vf run-local --metrics refuses what is not [HOST:]PORT, exit 2", async () => {
  await inTempDir(async (dir) => {
    const flow = await writeFlow(
      dir,
      ["Count"],
      [
        `const count = new Count({ name: "count", n: 1 });`,
        `const sink = new JsonlSink({ name: "sink", path: "out.jsonl" }).from(count);`,
        `export default new Flow([sink], { flowType: "batch", flowId: "bad-metrics" });`,
      ].join("\n"),
    );
    for (const value of ["http", "70000", ":9100", "host:"]) {
      const child = startVf(["run-local", flow, "--metrics", value], { cwd: dir });
      const output = await child.output();
      const text = new TextDecoder().decode(output.stderr) + new TextDecoder().decode(output.stdout);
      assert.equal(output.code, 2, text);
      assert.match(text, /VF_CONFIG: --metrics .* is not \[HOST:\]PORT/);
    }
  });
});
