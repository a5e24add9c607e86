/**
 * Writes `src/wire/envelope.json`, the protobufjs JSON descriptor the codec loads, from
 * `src/wire/envelope.proto` (field names as the .proto spells them). The runtime loads the descriptor
 * rather than the .proto so that a worker loads neither protobufjs's parser nor any file at run time;
 * `tests/unit/wire/schema_test.ts` fails while the two disagree.
 *
 * Run: `deno run --allow-read=src/wire --allow-write=src/wire/envelope.json tasks/envelope_json.ts`.
 *
 * @module
 */

import protobuf from "protobufjs";

const proto = await Deno.readTextFile(new URL("../src/wire/envelope.proto", import.meta.url));
const descriptor = protobuf.parse(proto, { keepCase: true }).root.toJSON();
await Deno.writeTextFile(
  new URL("../src/wire/envelope.json", import.meta.url),
  `${JSON.stringify(descriptor, null, 2)}\n`,
);
