import assert from "node:assert/strict";
import { decodeCString } from "../../../ffi/c_string.ts";

Deno.test("decodeCString reads up to the first NUL inside the buffer", () => {
  const bytes = new Uint8Array(8);
  bytes.set(new TextEncoder().encode("GPU-1"));
  bytes[6] = 0x41; // after the terminator: never read
  const decoded = decodeCString(bytes, "the UUID");
  assert.equal(decoded.kind, "known");
  assert.equal(decoded.kind === "known" && decoded.value, "GPU-1");
});

Deno.test("decodeCString gives malformed for a buffer without a terminator and for bytes that are not UTF-8", () => {
  const full = decodeCString(new TextEncoder().encode("ABCDEFGH"), "the name");
  assert.equal(full.kind, "unknown");
  assert.equal(full.kind === "unknown" && full.reason, "malformed");
  assert.match(
    full.kind === "unknown" ? full.detail : "",
    /the name has no terminator within its 8-byte buffer/,
  );
  const invalid = decodeCString(new Uint8Array([0xff, 0xfe, 0]), "the name");
  assert.equal(invalid.kind === "unknown" && invalid.reason, "malformed");
});

Deno.test("decodeCString reads a signed char array (koffi's char[N]) as the same bytes", () => {
  const signed = new Int8Array([0x30, 0x3a, 0x31, 0]);
  const decoded = decodeCString(signed, "the bus id");
  assert.equal(decoded.kind === "known" && decoded.value, "0:1");
});
