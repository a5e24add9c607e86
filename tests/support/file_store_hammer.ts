/**
 * A subprocess the file store's multi-process tests spawn (tests/integration/file_store_multiprocess_test.ts).
 *
 * `deno run -A file_store_hammer.ts increment <root> <key> <attempts>`: tries `attempts` compare-and-swap
 * increments of the decimal counter at `key`, then prints one JSON line `{"won": [...]}`: the counter
 * values this process's successful swaps wrote.
 *
 * `deno run -A file_store_hammer.ts write <root> <keys> <seed> <appendShare>`: writes forever (until
 * killed) to keys `k0..k<keys-1>`, and after that share (0..1) of its writes appends to the log `log`,
 * values that carry their own SHA-256 and a per-key sequence (drawn from SeededRandom(seed), so a failing
 * writer reruns from its seed); prints `ready` once its first write landed. Every value it reads must
 * verify, or it exits 3 saying why.
 *
 * A fault schedule in the environment (VF_FAULT_SCHEDULE_JSON) is installed first, so a test can crash
 * it at a named barrier.
 */
import { createHash } from "node:crypto";
import { installFromEnv } from "../../src/backends/faults.ts";
import { FileRuntimeStore } from "../../src/runtime/file_store.ts";
import { SeededRandom } from "./random.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A value that proves its own integrity: a sequence, a payload, and the SHA-256 of both. */
export interface CheckedValue {
  readonly seq: number;
  readonly payload: string;
  readonly sha256: string;
}

function digest(seq: number, payload: string): string {
  return createHash("sha256").update(`${seq}:${payload}`).digest("hex");
}

/** Encodes a {@link CheckedValue} for `seq` and `payload`. */
export function checkedValue(seq: number, payload: string): Uint8Array {
  return encoder.encode(JSON.stringify({ seq, payload, sha256: digest(seq, payload) }));
}

/** Decodes and verifies a {@link CheckedValue}; throws an Error saying what is wrong with it. */
export function verifyValue(bytes: Uint8Array, what: string): CheckedValue {
  let value: CheckedValue;
  try {
    value = JSON.parse(decoder.decode(bytes));
  } catch {
    throw new Error(`${what} is torn: ${JSON.stringify(decoder.decode(bytes.slice(0, 80)))}`);
  }
  if (digest(value.seq, value.payload) !== value.sha256) throw new Error(`${what} fails its checksum`);
  return value;
}

async function increment(store: FileRuntimeStore, key: string, attempts: number): Promise<number[]> {
  const won: number[] = [];
  for (let i = 0; i < attempts; i++) {
    const entry = await store.get(key);
    const count = entry.kind === "present" ? Number(decoder.decode(entry.value)) : 0;
    const next = count + 1;
    const expected = entry.kind === "present" ? entry.version : null;
    if (await store.cas(key, expected, encoder.encode(String(next)))) won.push(next);
  }
  return won;
}

async function writeForever(
  store: FileRuntimeStore,
  keys: number,
  seed: number,
  appendShare: number,
): Promise<never> {
  const random = new SeededRandom(seed);
  let announced = false;
  for (;;) {
    const key = `k${random.int(0, keys - 1)}`;
    const entry = await store.get(key);
    const seq = entry.kind === "present" ? verifyValue(entry.value, key).seq + 1 : 1;
    const payload = String.fromCharCode(random.int(97, 122)).repeat(random.int(0, 47_999));
    const expected = entry.kind === "present" ? entry.version : null;
    if (!await store.cas(key, expected, checkedValue(seq, payload))) continue;
    if (random.chance(appendShare)) await store.append("log", checkedValue(seq, payload.slice(0, 2000)));
    if (!announced) {
      announced = true;
      console.log("ready");
    }
  }
}

async function main(args: string[]): Promise<void> {
  installFromEnv();
  const [mode, root, ...rest] = args;
  const store = await FileRuntimeStore.open(root);
  if (mode === "increment") {
    const won = await increment(store, rest[0], Number(rest[1]));
    await store.close();
    console.log(JSON.stringify({ won }));
  } else if (mode === "write") {
    await writeForever(store, Number(rest[0]), Number(rest[1]), Number(rest[2]));
  } else {
    throw new Error(`unknown mode ${JSON.stringify(mode)}: use increment or write`);
  }
}

if (import.meta.main) {
  try {
    await main(Deno.args);
  } catch (error) {
    console.error(error instanceof Error ? error.stack : String(error));
    Deno.exit(3);
  }
}
