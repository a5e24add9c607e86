/**
 * videoflow for Deno: graph-based video and stream analytics.
 *
 * Build a flow of producer, processor and consumer nodes, validate it (every problem at once), and
 * compile it to the JSON document of node specs that workers are rebuilt from. For other runtimes on the
 * same wire, the protobuf envelope v4 codec, the identities every runtime derives alike (message ids,
 * producer traces, group identities, partition owners) and the node rebuilding of a worker
 * ({@link loadNodeClass}, {@link rebuildNode}) are exported too.
 *
 * ```ts
 * import { ConsumerNode, END, Flow, ProducerNode } from "jsr:@videoflow/cli";
 *
 * export class Count extends ProducerNode<{ n: number }> {
 *   #i = 0;
 *   next() { return this.#i < this.params.n ? ++this.#i : END; }
 * }
 * export class Print extends ConsumerNode { consume(x: number) { console.log(x); } }
 * const print = new Print({ name: "print" }).from(new Count({ name: "count", n: 3 }));
 * export default new Flow([print], { flowType: "batch" }); // realtime keeps only the freshest item
 * ```
 *
 * Run as the main module, this file is the `vf` command line (`validate`, `explain`, `compile`, `decode`,
 * `run-local`, `dlq`).
 *
 * @module
 */

import * as api from "./mod.ts";
import { registerNodeModule } from "./src/core/node_class.ts";
import type { LocalFlowRunOptions } from "./src/cli/run_local.ts";
import type { LocalRunResult } from "./src/engines/local.ts";

export * from "./src/core/node.ts";
export * from "./src/core/flow.ts";
export * from "./src/core/errors.ts";
export * from "./src/core/policies.ts";
export * from "./src/core/provenance.ts";
export * from "./src/core/context.ts";
export * from "./src/core/messenger.ts";
export {
  isNodeClass,
  loadNodeClass,
  ModuleIndex,
  rebuildNode,
  registerNodeModule,
} from "./src/core/node_class.ts";
export type { ModuleEntry, NodeClass } from "./src/core/node_class.ts";
export {
  batchingPolicies,
  blobReaderIds,
  blobReaders,
  compileFlow,
  compileToDict,
  executionGroups,
  gpuProvenance,
  hasNativeComponents,
  hasRemoteComponents,
  nodePermissions,
  NodeSpec,
  parentReplicas,
  sinkGuarantees,
  specsFromDicts,
  validateWireCompatibility,
} from "./src/core/compiler.ts";
export type {
  CompiledDocument,
  CompileDocumentOptions,
  CompileOptions,
  NodeSpecDict,
  NodeSpecInit,
  RequirementsDocument,
} from "./src/core/compiler.ts";
export { validate } from "./src/core/graph.ts";
export type { ValidateOptions } from "./src/core/graph.ts";
export {
  abortPayload,
  createEnvelope,
  decodeEnvelope,
  decodePayload,
  encodeEnvelope,
  encodePayload,
  ENVELOPE_VERSION,
  envelopeFromJson,
  envelopeToJson,
  PayloadType,
  readAbortPayload,
} from "./src/wire/codec.ts";
export type { AbortMarker, EncodedPayload, Envelope, EnvelopeInit, EnvelopeJson } from "./src/wire/codec.ts";
export { deriveMessageId, envelopeMessageId } from "./src/wire/message_id.ts";
export {
  groupIdentity,
  MsgType,
  partitionKeyOf,
  partitionOwner,
  producerTrace,
  timeGroupIdentity,
  traceGroupIdentity,
} from "./src/wire/identities.ts";
export type {
  GroupTraceIdentity,
  MemberId,
  MembersByParent,
  Seq,
  TimeGroupMember,
  TraceGroupMember,
  TraceIdentity,
} from "./src/wire/identities.ts";
export {
  BlobRef,
  Detections,
  Frame,
  OpaquePayload,
  Tensor,
  Tracks,
  WireDouble,
  wireMap,
} from "./src/wire/value.ts";
export type {
  TensorSource,
  TensorView,
  ViewDtype,
  WireMap,
  WirePayload,
  WireValue,
} from "./src/wire/value.ts";
export { openRuntimeStore } from "./src/runtime/runtime_stores.ts";
export type { LocalFlowRunOptions } from "./src/cli/run_local.ts";
export {
  type Isolation,
  type LocalRunResult,
  STOP_REQUESTED,
  type StopRequester,
} from "./src/engines/local.ts";
export type { NodeSnapshot, NodeState, ViewOutput } from "./src/engines/live_view.ts";
export type {
  AbsentEntry,
  PresentEntry,
  RuntimeCapabilities,
  RuntimeStore,
  StoredRecord,
  StoreEntry,
} from "./src/backends/runtime_store.ts";
export { UNKNOWN_REASONS } from "./src/backends/outcomes.ts";
export { isLiveSource, VideoFileReader } from "./src/nodes/video_file_reader.ts";
export type { VideoFileReaderParams } from "./src/nodes/video_file_reader.ts";
export type { RawFormat } from "./src/nodes/_ffmpeg.ts";
export { FrameWriter } from "./src/nodes/frame_writer.ts";
export type { FrameWriterParams } from "./src/nodes/frame_writer.ts";
export { JsonlSink, toJsonLine } from "./src/nodes/jsonl_sink.ts";
export type { JsonlRecord, JsonlSinkParams } from "./src/nodes/jsonl_sink.ts";
export type { Known, Observation, Unknown, UnknownReason } from "./src/backends/outcomes.ts";

/**
 * Runs the flow file at `path` (its default export is the `Flow`) on this machine as `vf run-local` does,
 * and resolves with how the run ended: its exit code, outcome and per-node summary. A flow or option that
 * is wrong rejects with a typed error before anything starts; `options.signal` stops the run the clean way.
 * The engine is loaded on the first call, so a node worker importing this module never loads it.
 *
 * @example
 * ```ts
 * const result = await runLocal("examples/hello.ts", { stateDir: "/tmp/state" });
 * if (result.exitCode !== 0) console.error(result.outcome);
 * ```
 */
export async function runLocal(path: string, options: LocalFlowRunOptions = {}): Promise<LocalRunResult> {
  const engine = await import("./src/cli/run_local.ts");
  return await engine.runLocal(path, options);
}

registerNodeModule(import.meta.url, api);

// The command line is loaded only when this file runs as the program: a node worker importing the API
// never loads the CLI and the engines behind it.
if (import.meta.main) (await import("./src/cli/main.ts")).main();
