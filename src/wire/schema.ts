/**
 * The videoflow.v1 protobuf schema (envelope version 4) as protobufjs reflects it: `envelope.proto`,
 * loaded from the JSON descriptor `tasks/envelope_json.ts` writes from it (`envelope.json`, field names as
 * the .proto spells them). The descriptor is a static JSON import and protobufjs's light build reads it,
 * so a worker with no permissions loads the schema with its module graph, reads no file, and loads no
 * .proto parser. Every field number, type, label and oneof the reader and the writer use comes from here.
 *
 * The light build is loaded as its one-file bundle (`dist/light/protobuf.min.js`, the same 7.5.4 sources),
 * checked against its own types: a Worker imported it in 22.5 ms, against 42.4 ms for the ~30 CommonJS
 * modules of `protobufjs/light.js` (best of 12 Workers each, 2 loaded cores). What loading it costs a
 * Worker's start-up in all is `bench/codec_bench.ts`'s "worker start-up" group.
 *
 * @module
 */

// @ts-types="protobufjs/light.d.ts"
import protobuf from "protobufjs/dist/light/protobuf.min.js";
import descriptor from "./envelope.json" with { type: "json" };

/** The protobuf package of every videoflow message type. */
export const PROTO_PACKAGE = "videoflow.v1";

/** How deep messages may nest (a Value list inside a list ...), reading or writing, as protobuf's own limit. */
export const MAX_DEPTH = 100;

/** The largest message protobuf allows (2 GiB − 1): a longer one cannot be framed or read back. */
export const MAX_MESSAGE_BYTES = 2 ** 31 - 1;

/** `envelope.proto` as protobufjs reflects it, every type resolved. */
export const SCHEMA_ROOT: protobuf.Root = protobuf.Root.fromJSON(descriptor);
SCHEMA_ROOT.resolveAll();

/** The message types a payload or an envelope can be, by their short name in {@link PROTO_PACKAGE}. */
export const MESSAGE_NAMES = [
  "Envelope",
  "Value",
  "Tensor",
  "Frame",
  "Detections",
  "Tracks",
  "BlobRef",
] as const;

/** The short name of a top-level message type. */
export type MessageName = typeof MESSAGE_NAMES[number];

/** The reflected type of each {@link MessageName}. */
export const MESSAGE_TYPES: Readonly<Record<MessageName, protobuf.Type>> = Object.fromEntries(
  MESSAGE_NAMES.map((name) => [name, SCHEMA_ROOT.lookupType(`${PROTO_PACKAGE}.${name}`)]),
) as Record<MessageName, protobuf.Type>;

/** The values of an enum of the schema, by name. @throws Error when the schema declares no such enum. */
export function enumValues(name: string): Readonly<Record<string, number>> {
  return SCHEMA_ROOT.lookupEnum(`${PROTO_PACKAGE}.${name}`).values;
}
