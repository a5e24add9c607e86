/**
 * videoflow for Deno: graph-based video and stream analytics.
 *
 * Build a flow of producer, processor and consumer nodes from the payloads they pass (frames, tensors,
 * detections), the policies that join, order, partition and deliver them, and the built-in video and JSONL
 * nodes; validate it (every problem at once) and run it on this machine ({@link runLocal}). Errors are the
 * typed taxonomy a node throws and a caller catches. Other runtimes on the same wire, and tests, import the
 * wider surface from `./src/internal.ts` (the package's `./internal` export): the compiler and its NodeSpec
 * documents, the protobuf envelope v4 codec, the identities every runtime derives alike, node rebuilding
 * and the runtime store contract.
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

export {
  AssetRequirement,
  type BatchingPolicy,
  ConsumerNode,
  type ConsumerParams,
  DeviceType,
  EffectGuarantee,
  END,
  type End,
  FunctionProcessorNode,
  GpuFallback,
  type JoinPolicyArg,
  type JsonObject,
  type JsonValue,
  Leaf,
  ModuleNode,
  Node,
  type NodeArgs,
  NodeKind,
  type NodeParams,
  type NodePermissions,
  OneTaskProcessorNode,
  type OrderingPolicyArg,
  type PartitionKeyPolicyDeclaration,
  PERMISSION_KINDS,
  type PermissionDeclaration,
  type PermissionKind,
  type ProcessFunction,
  ProcessorNode,
  type ProcessorParams,
  ProducerNode,
  type ProducerParams,
  ReceiverNode,
  type ReceiverParams,
  ReplayPolicy,
  TaskModuleNode,
  type Upstream,
} from "./src/core/node.ts";
export { Flow, type FlowOptions, type TaskData } from "./src/core/flow.ts";
export { FlowType } from "./src/core/flow_type.ts";
export { type Logger, RuntimeContext, type RuntimeIdentity } from "./src/core/context.ts";
export type { InputInfo } from "./src/core/messenger.ts";
export { type ModuleEntry, ModuleIndex } from "./src/core/node_class.ts";
export {
  type DeclarationSource,
  FIELDS,
  type GpuField,
  type GpuFieldMap,
  SOURCE_PRECEDENCE,
} from "./src/core/provenance.ts";
export {
  ACTIONS,
  DELIVERY_MODES,
  type DeliveryAction,
  type DeliveryMode,
  type DeliveryOverride,
  DeliveryPolicy,
  type DeliveryPolicyDict,
  type DeliveryPolicyInit,
  DLQ_MODES,
  type DlqMode,
  INVALID_KEY_POLICIES,
  type InvalidKeyPolicy,
  JOIN_MODES,
  type JoinMode,
  JoinPolicy,
  type JoinPolicyDict,
  type JoinPolicyInit,
  LATE_POLICIES,
  type LatePolicy,
  MISSING_POLICIES,
  type MissingPolicy,
  ORDERING_MODES,
  type OrderingMode,
  OrderingPolicy,
  type OrderingPolicyDict,
  type OrderingPolicyInit,
  PartitionKeyPolicy,
  type PartitionKeyPolicyDict,
  type PartitionKeyPolicyInit,
} from "./src/core/policies.ts";
export {
  CapabilityError,
  ConfigError,
  DecodeError,
  DeviceError,
  Diagnostic,
  type DiagnosticRecord,
  type Disposition,
  DISPOSITIONS,
  type ErrorContext,
  type ErrorRecord,
  EXIT_ENVIRONMENT,
  EXIT_FLOW_FAILED,
  EXIT_STALLED,
  EXIT_USER,
  exitCodeOf,
  FlowFailed,
  FlowStalled,
  GraphError,
  NodeContractError,
  PartitionKeyError,
  POISON,
  PoisonMessage,
  ResourceExhausted,
  ResourceUnavailable,
  SchemaError,
  TRANSIENT,
  TransientFailure,
  UpstreamAborted,
  VideoflowEnvironmentError,
  VideoflowError,
  VideoflowRuntimeError,
  VideoflowUserError,
  WORKER_FATAL,
  WorkerFatal,
} from "./src/core/errors.ts";
export { validate, type ValidateOptions } from "./src/core/graph.ts";
export {
  BlobRef,
  Detections,
  Frame,
  OpaquePayload,
  Tensor,
  type TensorSource,
  type TensorView,
  Tracks,
  type ViewDtype,
  WireDouble,
  type WireMap,
  wireMap,
  type WirePayload,
  type WireValue,
} from "./src/wire/value.ts";
export {
  type Known,
  type Observation,
  type Unknown,
  UNKNOWN_REASONS,
  type UnknownReason,
} from "./src/backends/outcomes.ts";
export type { LocalFlowRunOptions } from "./src/cli/run_local.ts";
export type { Isolation, LocalRunResult, MetricsAddress, RunServers } from "./src/engines/local.ts";
export { STOP_REQUESTED, type StopRequester } from "./src/engines/stop_signals.ts";
export type { NodeSnapshot, NodeState, ViewOutput } from "./src/engines/live_view.ts";
export { VideoFileReader, type VideoFileReaderParams } from "./src/nodes/video_file_reader.ts";
export type { RawFormat } from "./src/nodes/_ffmpeg.ts";
export { FrameWriter, type FrameWriterParams } from "./src/nodes/frame_writer.ts";
export { type JsonlRecord, JsonlSink, type JsonlSinkParams } from "./src/nodes/jsonl_sink.ts";

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
