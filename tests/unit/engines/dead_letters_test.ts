import assert from "node:assert/strict";
import { ConfigError } from "../../../src/core/errors.ts";
import {
  DEAD_LETTER_FILE,
  type DeadLetterRecord,
  dropsBesideDeadLetters,
  mergeDeadLetters,
  readDeadLetters,
  readDeadLettersIfAny,
  sharedFailures,
  writeDeadLetters,
} from "../../../src/engines/dead_letters.ts";
import { createEnvelope, encodeEnvelope } from "../../../src/wire/codec.ts";
import { MsgType } from "../../../src/wire/identities.ts";

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

/** A letter of `node` whose envelope is a data envelope of producer `count` with `fields`. */
function envelopeLetter(
  id: string,
  node: string,
  fields: { traceId: string; seq: number; replicaId?: number; spanId?: string },
): DeadLetterRecord {
  const envelope = createEnvelope({
    type: MsgType.data,
    producerName: "count",
    flowId: "f",
    runId: "r",
    ...fields,
  });
  return { ...letter(id, node, ""), envelope_b64: encodeEnvelope(envelope).toBase64() };
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
    { ...current[2], id: "dlq:f:r:mid:2#2" },
  ]);
  assert.deepEqual(mergeDeadLetters([], current), current);
  assert.deepEqual(mergeDeadLetters(earlier, []), earlier);
});

Deno.test("a message dead-lettered again after a replay is one letter, though its metadata differs", () => {
  const at = (replicaId: number) => ({
    traceId: "count:20",
    seq: 20,
    replicaId,
    spanId: `span-${replicaId}`,
  });
  const first = envelopeLetter("dlq:f:r:work:20", "work", at(0));
  const again = { ...envelopeLetter("dlq:f:r:work:20", "work", at(1)), deliveries: 5 };
  const other = envelopeLetter("dlq:f:r:sink:20", "sink", at(1));
  assert.notEqual(first.envelope_b64, again.envelope_b64);
  assert.deepEqual(mergeDeadLetters([first], [again, other]), [first, other]);
});

Deno.test("a new letter whose id an earlier, different letter holds is listed under the id with #2, #3", () => {
  const first = envelopeLetter("dlq:f:r:bad:10", "bad", { traceId: "count:1:10", seq: 10 });
  const second = envelopeLetter("dlq:f:r:bad:10", "bad", { traceId: "count:2:10", seq: 10 });
  const third = envelopeLetter("dlq:f:r:bad:10", "bad", { traceId: "count:3:10", seq: 10 });
  const once = mergeDeadLetters([first], [second]);
  assert.deepEqual(once.map((r) => r.id), ["dlq:f:r:bad:10", "dlq:f:r:bad:10#2"]);
  assert.deepEqual(mergeDeadLetters([first], [second]), once, "the same merge, the same ids");
  assert.deepEqual(
    mergeDeadLetters(once, [third, second]).map((r) => r.id),
    ["dlq:f:r:bad:10", "dlq:f:r:bad:10#2", "dlq:f:r:bad:10#3"],
    "a third run's new letter takes the next id; one already listed is not listed again",
  );
});

Deno.test("a node's drops leave out what its dead letters account for, each by the reason its code names", () => {
  const drops = { poison: 3, exhausted: 2, undecodable: 1, partition_key: 2, join_evicted: 5 };
  assert.deepEqual(
    dropsBesideDeadLetters(drops, ["VF_POISON_DECODE", "VF_POISON_PARTITION_KEY", "VF_POISON", "VF_RUNTIME"]),
    { poison: 1, exhausted: 2, partition_key: 1, join_evicted: 5 },
  );
  assert.deepEqual(dropsBesideDeadLetters({ exhausted: 3 }, ["VF_RUNTIME", "VF_RUNTIME", "VF_RUNTIME"]), {});
  assert.deepEqual(dropsBesideDeadLetters({ evicted: 4 }, []), { evicted: 4 }, "no letter, nothing off");
  assert.deepEqual(
    dropsBesideDeadLetters({ poison: 5 }, ["VF_POISON"]),
    { poison: 4 },
    "sampled: the four terminated without a letter stay drops",
  );
});

Deno.test("sharedFailures names each node whose letters all carry one code, with the first letter's error", () => {
  const other = { ...letter("dlq:f:r:b:2", "b", "z"), code: "VF_POISON_DECODE", error: "garbage" };
  const records = [
    letter("dlq:f:r:a:1", "a", "x"),
    { ...letter("dlq:f:r:a:2", "a", "y"), error: "poison again" },
    letter("dlq:f:r:b:1", "b", "y"),
    other,
    letter("dlq:f:r:b:3", "b", "w"),
  ];
  assert.deepEqual([...sharedFailures(records)], [["a", { count: 2, code: "VF_POISON", error: "poison" }]]);
  assert.deepEqual(sharedFailures([]).size, 0);
});
