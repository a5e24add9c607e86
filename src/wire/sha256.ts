/**
 * SHA-256 (FIPS 180-4) for the short inputs the runtime hashes on every message: message ids, partition
 * and group identities, ledger key names and record checksums. Written here so a worker's module graph
 * loads no `node:crypto` (whose first load costs a worker ~15–25 ms of start-up), and because a
 * short input hashes faster in place than through a native call; bulk data (payloads, asset files) goes
 * through {@link nativeCrypto}.
 *
 * @example
 * ```ts
 * console.log(sha256Hex("abc").slice(0, 8)); // "ba7816bf"
 * ```
 *
 * @module
 */

import { hex } from "../core/hex.ts";

const ROUND_CONSTANTS = new Int32Array([
  0x428a2f98,
  0x71374491,
  0xb5c0fbcf,
  0xe9b5dba5,
  0x3956c25b,
  0x59f111f1,
  0x923f82a4,
  0xab1c5ed5,
  0xd807aa98,
  0x12835b01,
  0x243185be,
  0x550c7dc3,
  0x72be5d74,
  0x80deb1fe,
  0x9bdc06a7,
  0xc19bf174,
  0xe49b69c1,
  0xefbe4786,
  0x0fc19dc6,
  0x240ca1cc,
  0x2de92c6f,
  0x4a7484aa,
  0x5cb0a9dc,
  0x76f988da,
  0x983e5152,
  0xa831c66d,
  0xb00327c8,
  0xbf597fc7,
  0xc6e00bf3,
  0xd5a79147,
  0x06ca6351,
  0x14292967,
  0x27b70a85,
  0x2e1b2138,
  0x4d2c6dfc,
  0x53380d13,
  0x650a7354,
  0x766a0abb,
  0x81c2c92e,
  0x92722c85,
  0xa2bfe8a1,
  0xa81a664b,
  0xc24b8b70,
  0xc76c51a3,
  0xd192e819,
  0xd6990624,
  0xf40e3585,
  0x106aa070,
  0x19a4c116,
  0x1e376c08,
  0x2748774c,
  0x34b0bcb5,
  0x391c0cb3,
  0x4ed8aa4a,
  0x5b9cca4f,
  0x682e6ff3,
  0x748f82ee,
  0x78a5636f,
  0x84c87814,
  0x8cc70208,
  0x90befffa,
  0xa4506ceb,
  0xbef9a3f7,
  0xc67178f2,
]);

const INITIAL_STATE = [
  0x6a09e667,
  0xbb67ae85,
  0x3c6ef372,
  0xa54ff53a,
  0x510e527f,
  0x9b05688c,
  0x1f83d9ab,
  0x5be0cd19,
];

const encoder = new TextEncoder();
/** The message schedule, reused by every block (hashing never yields, so one is enough). */
const schedule = new Int32Array(64);
/** The working state of the digest being computed. */
const state = new Int32Array(8);
/** Where a string's UTF-8 bytes and every input's padded tail are laid out; grows when a string needs it. */
let scratch = new Uint8Array(256);

/** Runs the compression function over every whole 64-byte block of `data[offset, end)`. */
function compress(data: Uint8Array, offset: number, end: number): void {
  const w = schedule;
  const k = ROUND_CONSTANTS;
  for (let at = offset; at + 64 <= end; at += 64) {
    for (let i = 0; i < 16; i++) {
      const p = at + i * 4;
      w[i] = (data[p] << 24) | (data[p + 1] << 16) | (data[p + 2] << 8) | data[p + 3];
    }
    for (let i = 16; i < 64; i++) {
      const x = w[i - 15];
      const y = w[i - 2];
      const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
      const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
      w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0;
    }
    let a = state[0], b = state[1], c = state[2], d = state[3];
    let e = state[4], f = state[5], g = state[6], h = state[7];
    for (let i = 0; i < 64; i++) {
      const sum1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const t1 = (h + sum1 + ((e & f) ^ (~e & g)) + k[i] + w[i]) | 0;
      const sum0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const t2 = (sum0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g;
      g = f;
      f = e;
      e = (d + t1) | 0;
      d = c;
      c = b;
      b = a;
      a = (t1 + t2) | 0;
    }
    state[0] = (state[0] + a) | 0;
    state[1] = (state[1] + b) | 0;
    state[2] = (state[2] + c) | 0;
    state[3] = (state[3] + d) | 0;
    state[4] = (state[4] + e) | 0;
    state[5] = (state[5] + f) | 0;
    state[6] = (state[6] + g) | 0;
    state[7] = (state[7] + h) | 0;
  }
}

/** Hashes `length` bytes of `data` whose last partial block is laid out in `scratch` from 0 onwards. */
function digestInto(data: Uint8Array, length: number): void {
  state.set(INITIAL_STATE);
  const whole = length - (length % 64);
  compress(data, 0, whole);
  const rest = length - whole;
  const padded = rest < 56 ? 64 : 128;
  if (data !== scratch) scratch.set(data.subarray(whole, length));
  else if (whole > 0) scratch.copyWithin(0, whole, length);
  scratch[rest] = 0x80;
  scratch.fill(0, rest + 1, padded - 8);
  const high = Math.floor(length / 0x2000_0000);
  const low = (length * 8) >>> 0;
  for (let i = 0; i < 4; i++) {
    scratch[padded - 8 + i] = (high >>> (24 - 8 * i)) & 0xff;
    scratch[padded - 4 + i] = (low >>> (24 - 8 * i)) & 0xff;
  }
  compress(scratch, 0, padded);
}

/** Lays `data` out for {@link digestInto}: a string's UTF-8 bytes in `scratch`, bytes as they are. */
function prepare(data: Uint8Array | string): [Uint8Array, number] {
  if (typeof data !== "string") return [data, data.length];
  if (scratch.length < data.length * 3 + 128) scratch = new Uint8Array(data.length * 3 + 128);
  return [scratch, encoder.encodeInto(data, scratch).written];
}

/** The SHA-256 digest of `data` (or of a string's UTF-8 bytes): 32 bytes. */
export function sha256(data: Uint8Array | string): Uint8Array {
  const [bytes, length] = prepare(data);
  digestInto(bytes, length);
  const digest = new Uint8Array(32);
  for (let i = 0; i < 32; i++) digest[i] = (state[i >> 2] >>> (24 - 8 * (i & 3))) & 0xff;
  return digest;
}

/** The SHA-256 digest of `data` (or of a string's UTF-8 bytes) as 64 lower-case hex digits. */
export function sha256Hex(data: Uint8Array | string): string {
  return hex(sha256(data));
}

/**
 * `node:crypto`, loaded on first use (synchronously, through `process.getBuiltinModule`), for hashing bulk
 * data natively: only a worker that hashes a payload or an asset pays for loading it.
 */
export function nativeCrypto(): typeof import("node:crypto") {
  return process.getBuiltinModule("node:crypto");
}
