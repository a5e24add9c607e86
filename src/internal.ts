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
export * from "./core/flow_type.ts";
export * from "./core/errors.ts";
export * from "./core/policies.ts";
export * from "./core/provenance.ts";
export * from "./core/context.ts";
export * from "./core/messenger.ts";
export {
  isNodeClass,
  loadNodeClass,
  type NodeClass,
  rebuildNode,
  registerNodeModule,
} from "./core/node_class.ts";
export {
  batchingPolicies,
  blobReaderIds,
  blobReaders,
  type CompiledDocument,
  type CompileDocumentOptions,
  compileFlow,
  type CompileOptions,
  compileToDict,
  executionGroups,
  gpuProvenance,
  hasNativeComponents,
  hasRemoteComponents,
  nodePermissions,
  NodeSpec,
  type NodeSpecDict,
  type NodeSpecInit,
  parentReplicas,
  type RequirementsDocument,
  sinkGuarantees,
  specsFromDicts,
  validateWireCompatibility,
} from "./core/compiler.ts";
export {
  type AbortMarker,
  abortPayload,
  createEnvelope,
  decodeEnvelope,
  decodePayload,
  type EncodedPayload,
  encodeEnvelope,
  encodePayload,
  type Envelope,
  ENVELOPE_VERSION,
  envelopeFromJson,
  type EnvelopeInit,
  type EnvelopeJson,
  envelopeToJson,
  PayloadType,
  readAbortPayload,
} from "./wire/codec.ts";
export { deriveMessageId, envelopeMessageId } from "./wire/message_id.ts";
export {
  groupIdentity,
  type GroupTraceIdentity,
  type MemberId,
  type MembersByParent,
  MsgType,
  partitionKeyOf,
  partitionOwner,
  producerTrace,
  type Seq,
  timeGroupIdentity,
  type TimeGroupMember,
  traceGroupIdentity,
  type TraceGroupMember,
  type TraceIdentity,
} from "./wire/identities.ts";
export { openRuntimeStore } from "./runtime/runtime_stores.ts";
export type {
  AbsentEntry,
  PresentEntry,
  RuntimeCapabilities,
  RuntimeStore,
  StoredRecord,
  StoreEntry,
} from "./backends/runtime_store.ts";
export { isLiveSource } from "./nodes/video_file_reader.ts";
export { toJsonLine } from "./nodes/jsonl_sink.ts";
