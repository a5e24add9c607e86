/**
 * videoflow for Deno: graph-based video and stream analytics.
 *
 * Build a flow of producer, processor and consumer nodes, validate it (every problem at once), and
 * compile it to the JSON document of node specs that workers are rebuilt from. For other runtimes on the
 * same wire, the protobuf envelope v4 codec and the message-id derivation are exported too.
 *
 * ```ts
 * import { ConsumerNode, END, Flow, ProducerNode } from "jsr:@videoflow/cli";
 *
 * export class Count extends ProducerNode<{ n: number }> {
 *   #i = 0;
 *   next() { return this.#i < this.params.n ? ++this.#i : END; }
 * }
 * export class Print extends ConsumerNode { consume(x: number) { console.log(x); } }
 * export default new Flow([new Print({ name: "print" }).from(new Count({ name: "count", n: 3 }))]);
 * ```
 *
 * Run as the main module, this file is the `vf` command line (`validate`, `compile`, `decode`).
 *
 * @module
 */

import * as api from "./mod.ts";
import { main } from "./src/cli/main.ts";
import { registerNodeModule } from "./src/core/node_class.ts";

export * from "./src/core/node.ts";
export * from "./src/core/flow.ts";
export * from "./src/core/errors.ts";
export * from "./src/core/policies.ts";
export * from "./src/core/provenance.ts";
export * from "./src/core/context.ts";
export * from "./src/core/messenger.ts";
export { ModuleIndex, registerNodeModule } from "./src/core/node_class.ts";
export {
  blobReaderIds,
  blobReaders,
  compileFlow,
  compileToDict,
  gpuProvenance,
  NodeSpec,
  parentReplicas,
  validateWireCompatibility,
} from "./src/core/compiler.ts";
export type {
  CompiledDocument,
  CompileDocumentOptions,
  CompileOptions,
  NodeSpecDict,
} from "./src/core/compiler.ts";
export { validate } from "./src/core/graph.ts";
export {
  abortPayload,
  decodeEnvelope,
  decodePayload,
  encodeEnvelope,
  encodePayload,
  ENVELOPE_VERSION,
  envelopeToJson,
  readAbortPayload,
} from "./src/wire/codec.ts";
export type { Envelope } from "./src/wire/codec.ts";
export { deriveMessageId } from "./src/wire/message_id.ts";
export { BlobRef, Detections, Frame, OpaquePayload, Tensor, Tracks, WireDouble } from "./src/wire/value.ts";
export type { WirePayload, WireValue } from "./src/wire/value.ts";
export { openRuntimeStore } from "./src/runtime/runtime_stores.ts";

registerNodeModule(import.meta.url, api);

if (import.meta.main) main();
