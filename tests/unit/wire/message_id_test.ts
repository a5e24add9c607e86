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

const VECTORS: IdVector[] = JSON.parse(
  Deno.readTextFileSync(new URL("../../fixtures/vectors/message_id/vectors.json", import.meta.url)),
);

Deno.test("message ids match the reference's for every golden vector", () => {
  assert.equal(VECTORS.length, 4);
  for (const v of VECTORS) {
    assert.equal(
      deriveMessageId(v.flow_id, v.run_id, v.producer_name, v.trace_id, v.seq, v.msg_type),
      v.expected_id,
    );
    assert.equal(
      deriveMessageId(v.flow_id, v.run_id, v.producer_name, v.trace_id, BigInt(v.seq), v.msg_type),
      v.expected_id,
      "a bigint seq derives the same id",
    );
  }
});

Deno.test("WIRE.md's example: flow-A, run-1, cam, cam:1, 1, data", () => {
  assert.equal(
    deriveMessageId("flow-A", "run-1", "cam", "cam:1", 1, "data"),
    "745708c2eeaf98a60fdbebafe1d04eff",
  );
});

Deno.test("an envelope's id is derived from its own fields, and an ABORT's differs from its EOS's", () => {
  const eos = decodeEnvelope(
    Deno.readFileSync(new URL("../../fixtures/vectors/envelope/eos.bin", import.meta.url)),
  );
  assert.equal(envelopeMessageId(eos), "8964c2a84d154cd86b5f42b060899f77");
  const abort = envelopeMessageId({ ...eos, type: "abort" });
  assert.match(abort, /^[0-9a-f]{32}$/);
  assert.notEqual(abort, envelopeMessageId(eos));
});
