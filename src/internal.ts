/**
 * The wider surface behind `mod.ts`, for other runtimes on the same wire and for tests: everything
 * `mod.ts` exports, and the compiler with its NodeSpec documents, the node class registry and a worker's
 * node rebuilding, the protobuf envelope v4 codec, the identities every runtime derives alike (message
 * ids, producer traces, group identities, partition owners), the whole error taxonomy and the policies'
 * constants, the messenger seam and the runtime store contract. What is here may change between minor
 * versions; what `mod.ts` exports does not.
 *
 * @example
 * ```ts
 * import { deriveMessageId, MsgType } from "./internal.ts";
 * console.log(deriveMessageId("flow-A", "run-1", "cam", "cam:1", 1, MsgType.data));
 * ```
 *
 * @module
 */

export * from "../mod.ts";
export * from "./core/node.ts";
export * from "./core/flow.ts";
export * from "./core/errors.ts";
export * from "./core/policies.ts";
export * from "./core/provenance.ts";
export * from "./core/context.ts";
export * from "./core/messenger.ts";
export {
  isNodeClass,
  loadNodeClass,
  ModuleIndex,
  rebuildNode,
  registerNodeModule,
} from "./core/node_class.ts";
export type { ModuleEntry, NodeClass } from "./core/node_class.ts";
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
} from "./core/compiler.ts";
export type {
  CompiledDocument,
  CompileDocumentOptions,
  CompileOptions,
  NodeSpecDict,
  NodeSpecInit,
  RequirementsDocument,
} from "./core/compiler.ts";
export { validate } from "./core/graph.ts";
export type { ValidateOptions } from "./core/graph.ts";
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
} from "./wire/codec.ts";
export type { AbortMarker, EncodedPayload, Envelope, EnvelopeInit, EnvelopeJson } from "./wire/codec.ts";
export { deriveMessageId, envelopeMessageId } from "./wire/message_id.ts";
export {
  groupIdentity,
  MsgType,
  partitionKeyOf,
  partitionOwner,
  producerTrace,
  timeGroupIdentity,
  traceGroupIdentity,
} from "./wire/identities.ts";
export type {
  GroupTraceIdentity,
  MemberId,
  MembersByParent,
  Seq,
  TimeGroupMember,
  TraceGroupMember,
  TraceIdentity,
} from "./wire/identities.ts";
export {
  BlobRef,
  Detections,
  Frame,
  OpaquePayload,
  Tensor,
  Tracks,
  WireDouble,
  wireMap,
} from "./wire/value.ts";
export type { TensorSource, TensorView, ViewDtype, WireMap, WirePayload, WireValue } from "./wire/value.ts";
export { openRuntimeStore } from "./runtime/runtime_stores.ts";
export type { LocalFlowRunOptions } from "./cli/run_local.ts";
export { type Isolation, type LocalRunResult, STOP_REQUESTED, type StopRequester } from "./engines/local.ts";
export type { NodeSnapshot, NodeState, ViewOutput } from "./engines/live_view.ts";
export type {
  AbsentEntry,
  PresentEntry,
  RuntimeCapabilities,
  RuntimeStore,
  StoredRecord,
  StoreEntry,
} from "./backends/runtime_store.ts";
export { UNKNOWN_REASONS } from "./backends/outcomes.ts";
export { isLiveSource, VideoFileReader } from "./nodes/video_file_reader.ts";
export type { VideoFileReaderParams } from "./nodes/video_file_reader.ts";
export type { RawFormat } from "./nodes/_ffmpeg.ts";
export { FrameWriter } from "./nodes/frame_writer.ts";
export type { FrameWriterParams } from "./nodes/frame_writer.ts";
export { JsonlSink, toJsonLine } from "./nodes/jsonl_sink.ts";
export type { JsonlRecord, JsonlSinkParams } from "./nodes/jsonl_sink.ts";
export type { Known, Observation, Unknown, UnknownReason } from "./backends/outcomes.ts";
