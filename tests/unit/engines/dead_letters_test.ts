import assert from "node:assert/strict";
import { ConfigError } from "../../../src/core/errors.ts";
import {
  DEAD_LETTER_FILE,
  type DeadLetterRecord,
  mergeDeadLetters,
  readDeadLetters,
  readDeadLettersIfAny,
  writeDeadLetters,
} from "../../../src/engines/dead_letters.ts";

function letter(id: string, node: string, body: string): DeadLetterRecord {
  return {
    id,
    node,
    code: "VF_POISON",
    error: "poison",
    deliveries: 1,
    size: body.length,
    envelope_b64: btoa(body),
  };
}

Deno.test("dead letters written whole read back; a run without the file has none; no run is a ConfigError", async () => {
  const dir = await Deno.makeTempDir({ prefix: "vf-dlq-" });
  try {
    assert.equal(await readDeadLettersIfAny(dir), null);
    assert.deepEqual(await readDeadLetters(dir), [], "a run that started and wrote no dead letter yet");
    await assert.rejects(readDeadLetters(`${dir}/no-such-run`), ConfigError);
    const records = [letter("dlq:f:r:a:1", "a", "x"), letter("dlq:f:r:b:1", "b", "y")];
    await writeDeadLetters(dir, records);
    assert.deepEqual(await readDeadLetters(dir), records);
    assert.deepEqual(await readDeadLettersIfAny(dir), records);
    await Deno.writeTextFile(`${dir}/${DEAD_LETTER_FILE}`, "{ torn");
    await assert.rejects(readDeadLettersIfAny(dir), ConfigError, "a corrupt file is not taken for none");
    await Deno.writeTextFile(`${dir}/${DEAD_LETTER_FILE}`, `${JSON.stringify(records[0])}\n[1, 2]\n`);
    await assert.rejects(readDeadLettersIfAny(dir), /line 2 of the dead-letter file/);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a re-run's dead letters follow the earlier supervisor's; a message dead-lettered again by its node is kept once", () => {
  const earlier = [letter("dlq:f:r:mid:1", "mid", "five"), letter("dlq:f:r:mid:2", "mid", "six")];
  const current = [
    letter("dlq:f:r:mid:1", "mid", "six"),
    letter("dlq:f:r:other:1", "other", "six"),
    letter("dlq:f:r:mid:2", "mid", "nine"),
  ];
  assert.deepEqual(mergeDeadLetters(earlier, current), [
    earlier[0],
    earlier[1],
    current[1],
    current[2],
  ]);
  assert.deepEqual(mergeDeadLetters([], current), current);
  assert.deepEqual(mergeDeadLetters(earlier, []), earlier);
});
