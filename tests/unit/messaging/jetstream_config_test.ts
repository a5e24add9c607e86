/** The read-back comparison of requested and effective JetStream configurations. */

import assert from "node:assert/strict";
import { configMismatches } from "../../../src/messaging/jetstream_config.ts";

Deno.test("read-back: a false or zero field the server leaves out is what was asked; a true one left out is a mismatch", () => {
  const requested = { discard_new_per_subject: false, max_age: 0, max_msgs: 10 };
  assert.deepEqual(configMismatches(requested, { max_msgs: 10 }), []);
  assert.deepEqual(
    configMismatches({ ...requested, discard_new_per_subject: true }, { max_msgs: 10 }),
    ["discard_new_per_subject: requested true, effective false"],
  );
  assert.deepEqual(configMismatches(requested, { max_msgs: 20 }), [
    "max_msgs: requested 10, effective 20",
  ]);
});

Deno.test("read-back: subjects compare as sets and metadata key by key", () => {
  assert.deepEqual(configMismatches({ subjects: ["a", "b"] }, { subjects: ["b", "a"] }), []);
  assert.equal(configMismatches({ subjects: ["a", "b"] }, { subjects: ["a"] }).length, 1);
  assert.deepEqual(
    configMismatches({ metadata: { owner: "x" } }, { metadata: { owner: "x", other: "y" } }),
    [],
  );
  assert.equal(configMismatches({ metadata: { owner: "x" } }, {}).length, 1);
});
