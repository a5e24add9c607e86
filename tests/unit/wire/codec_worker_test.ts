import assert from "node:assert/strict";
import { decodeEnvelope, encodeEnvelope } from "../../../src/wire/codec.ts";

Deno.test("the codec loads and round-trips inside a Worker that has no permissions at all", async () => {
  const codec = import.meta.resolve("../../../src/wire/codec.ts");
  const source = `import { decodeEnvelope, encodeEnvelope, envelopeToJson } from ${JSON.stringify(codec)};
    self.onmessage = (event) => {
      const env = decodeEnvelope(event.data);
      self.postMessage({ bytes: encodeEnvelope(env), json: envelopeToJson(env) });
    };`;
  const worker = new Worker(`data:application/typescript,${encodeURIComponent(source)}`, {
    type: "module",
    deno: { permissions: "none" },
  });
  try {
    const bytes = Deno.readFileSync(
      new URL("../../fixtures/vectors/envelope/data_value_map.bin", import.meta.url),
    );
    const reply = new Promise<{ bytes: Uint8Array; json: { trace_id: string } }>((resolve, reject) => {
      worker.onmessage = (event) => resolve(event.data);
      worker.onerror = (event) => {
        event.preventDefault();
        reject(new Error(event.message));
      };
    });
    worker.postMessage(bytes);
    const { bytes: back, json } = await reply;
    assert.deepEqual(back, bytes);
    assert.equal(json.trace_id, decodeEnvelope(bytes).traceId);
    assert.deepEqual(encodeEnvelope(decodeEnvelope(back)), bytes);
  } finally {
    worker.terminate();
  }
});
