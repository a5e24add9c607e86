import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { sha256, sha256Hex } from "../../../src/wire/sha256.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

function reference(data: Uint8Array | string): string {
  return createHash("sha256").update(data).digest("hex");
}

Deno.test("sha256 gives FIPS 180-4's digests of its examples and of the empty input", () => {
  assert.equal(sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  assert.equal(sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  assert.equal(
    sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
    "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
  );
  assert.equal(sha256("abc").length, 32);
});

Deno.test("sha256 agrees with node:crypto at every length around the block and padding edges, and on random input", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let length = 0; length <= 200; length++) {
    const bytes = new Uint8Array(length).map(() => random.int(0, 255));
    assert.equal(sha256Hex(bytes), reference(bytes), `length ${length}, seed ${seed}`);
  }
  for (let round = 0; round < 50; round++) {
    const length = random.int(0, 5000);
    const bytes = new Uint8Array(length).map(() => random.int(0, 255));
    const offset = random.int(0, length);
    const view = bytes.subarray(offset);
    assert.equal(sha256Hex(view), reference(view), `a view at ${offset} of ${length}, seed ${seed}`);
    const text = Array.from(
      { length: random.int(0, 80) },
      () => String.fromCodePoint(random.pick([random.int(32, 0x2fff), random.int(0x10000, 0x10ffff)])),
    ).join("") + (random.int(0, 3) === 0 ? "\ud800" : "");
    assert.equal(sha256Hex(text), reference(text), `text ${JSON.stringify(text)}, seed ${seed}`);
  }
});

Deno.test("sha256 is a plain Uint8Array, never a Buffer", () => {
  const digest = sha256("abc");
  assert.equal(Object.getPrototypeOf(digest), Uint8Array.prototype);
  assert.equal(digest.toHex(), sha256Hex("abc"));
});
