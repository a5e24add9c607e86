import assert from "node:assert/strict";
import { decodeEnvelope } from "../../../src/wire/codec.ts";
import type { MsgType } from "../../../src/wire/identities.ts";
import { deriveMessageId, envelopeMessageId } from "../../../src/wire/message_id.ts";

interface IdVector {
  readonly flow_id: string;
  readonly run_id: string;
  readonly producer_name: string;
  readonly trace_id: string;
  readonly seq: number;
  readonly msg_type: MsgType;
  readonly expected_id: string;
}

const FIXTURES = new URL("../../fixtures/vectors/", import.meta.url);

Deno.test("WIRE.md's example: flow-A, run-1, cam, cam:1, 1, data", () => {
  assert.equal(
    deriveMessageId("flow-A", "run-1", "cam", "cam:1", 1, "data"),
    "745708c2eeaf98a60fdbebafe1d04eff",
  );
});

Deno.test("a golden envelope's id is the reference's id for its flow, run, producer, trace, seq and type", () => {
  const ids: IdVector[] = JSON.parse(Deno.readTextFileSync(new URL("message_id/vectors.json", FIXTURES)));
  const folder = new URL("envelope/", FIXTURES);
  let matched = 0;
  for (const entry of Deno.readDirSync(folder)) {
    if (!entry.name.endsWith(".bin")) continue;
    const env = decodeEnvelope(Deno.readFileSync(new URL(entry.name, folder)));
    const vector = ids.find((v) =>
      v.flow_id === env.flowId && v.run_id === env.runId && v.producer_name === env.producerName &&
      v.trace_id === env.traceId && v.seq === env.seq && v.msg_type === env.type
    );
    if (vector === undefined) continue;
    assert.equal(envelopeMessageId(env), vector.expected_id, entry.name);
    matched++;
  }
  assert.ok(matched >= 3, `only ${matched} golden envelopes have a reference id`);
});

Deno.test("an ABORT envelope's id differs from the clean EOS's with the same fields", () => {
  const eos = decodeEnvelope(Deno.readFileSync(new URL("envelope/eos.bin", FIXTURES)));
  const abort = envelopeMessageId({ ...eos, type: "abort" });
  assert.match(abort, /^[0-9a-f]{32}$/);
  assert.notEqual(abort, envelopeMessageId(eos));
});
