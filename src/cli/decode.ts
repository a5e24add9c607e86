/**
 * `vf decode FILE`: an envelope's bytes (a golden vector, a dead letter) printed as JSON with the wire's
 * field names. Bytes that are not a v4 envelope are a `DecodeError` (VF_POISON_DECODE).
 *
 * @module
 */

import { ConfigError } from "../core/errors.ts";
import { decodeEnvelope, envelopeToJson } from "../wire/codec.ts";
import type { CommandOutput } from "./command_output.ts";

async function readBytes(path: string): Promise<Uint8Array> {
  try {
    return await Deno.readFile(path);
  } catch (error) {
    const reason = error instanceof Deno.errors.NotFound ? "does not exist" : "cannot be read";
    throw new ConfigError(`envelope file ${path} ${reason}`, "pass the path of a file holding one envelope", {
      path,
    });
  }
}

/** Decodes the envelope in the file at `path` and prints its JSON view; resolves with the exit code. */
export async function decodeCommand(path: string, io: CommandOutput): Promise<number> {
  const envelope = decodeEnvelope(await readBytes(path));
  io.out(JSON.stringify(envelopeToJson(envelope), null, 2));
  return 0;
}
