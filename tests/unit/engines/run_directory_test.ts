import assert from "node:assert/strict";
import { ConfigError, ResourceUnavailable } from "../../../src/core/errors.ts";
import {
  checkRunNames,
  clearRunEnd,
  lockRun,
  readRunEnd,
  runDirectory,
  RunEnd,
  writeRunEnd,
} from "../../../src/engines/run_directory.ts";

Deno.test("a run's end record is read back as written, cleared, and a damaged one is a typed error", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-run-" });
  try {
    assert.equal(await readRunEnd(dir), null);
    await writeRunEnd(dir, RunEnd.stopped);
    assert.equal((await readRunEnd(dir))?.end, RunEnd.stopped);
    await clearRunEnd(dir);
    assert.equal(await readRunEnd(dir), null);
    await clearRunEnd(dir);
    for (const damaged of ["{ torn", "null", '{"end":"exploded","at":"now"}']) {
      await Deno.writeTextFile(`${dir}/end.json`, damaged);
      await assert.rejects(readRunEnd(dir), ResourceUnavailable, damaged);
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("one lock per run directory; run names must stay inside the state directory", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-run-" });
  try {
    const held = await lockRun(dir, "f", "r");
    await assert.rejects(lockRun(dir, "f", "r"), ResourceUnavailable);
    held.close();
    (await lockRun(dir, "f", "r")).close();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  assert.equal(runDirectory("/state", "flow-1", "run_2"), "/state/flow-1/run_2");
  assert.throws(() => checkRunNames("../x", "r"), ConfigError);
  assert.throws(() => checkRunNames("f", ""), ConfigError);
});
