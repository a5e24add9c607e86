/**
 * The error taxonomy every other module classifies against (spec core.errors).
 *
 * Three branches map onto the three boundaries of the framework: {@link VideoflowUserError} (the graph
 * or its configuration is wrong, exit 2), {@link VideoflowEnvironmentError} (the world is not as
 * required, exit 3) and {@link VideoflowRuntimeError} (something failed while messages flowed; its
 * `disposition` is what the delivery ladder reads). Every error carries a stable `code`, an optional
 * `remedy` and structured `context`; `render()` is what an operator reads, never a stack trace.
 *
 * @module
 */

/** The message is bad: dead-letter it on the first failure. */
export const POISON = "poison";
/** The world was briefly unavailable: retry with backoff. */
export const TRANSIENT = "transient";
/** This worker cannot process anything: hand the input back, never blame it, and stop. */
export const WORKER_FATAL = "worker_fatal";
/** Every disposition, in the order the spec lists them. */
export const DISPOSITIONS = [POISON, TRANSIENT, WORKER_FATAL] as const;
/** What the messenger does with the input group a node just failed on. */
export type Disposition = typeof DISPOSITIONS[number];
/** Disposition of an error nothing classified: retry, then dead-letter. */
export const DEFAULT_DISPOSITION: Disposition = TRANSIENT;

/** Exit status for a flow the author can fix. */
export const EXIT_USER = 2;
/** Exit status for a world that is not as required. */
export const EXIT_ENVIRONMENT = 3;
/** Exit status for a flow that ran and failed. */
export const EXIT_FLOW_FAILED = 4;
/** Exit status for a flow that can never finish. */
export const EXIT_STALLED = 5;

/** Structured key/values that identify where an error happened; never interpolated into the message. */
export type ErrorContext = Record<string, unknown>;

/** The JSON-safe record of an error: what the ABORT marker and the termination log carry. */
export interface ErrorRecord {
  /** The error's stable code, e.g. `VF_CONFIG`. */
  readonly code: string;
  /** The error's class name. */
  readonly type: string;
  /** What went wrong, in one sentence. */
  readonly message: string;
  /** What to do about it; `null` when there is no remedy. */
  readonly remedy: string | null;
  /** The process exit status the error maps to. */
  readonly exit_code: number;
  /** `poison`, `transient` or `worker_fatal` for a runtime error; `null` otherwise. */
  readonly disposition: string | null;
  /** The error's context, made JSON-safe. */
  readonly context: Record<string, unknown>;
  /** Every diagnostic, for the errors that collect them (GraphError, IncompatibleProfile). */
  readonly diagnostics?: readonly DiagnosticRecord[];
}

/** Whether a disposition string names one of {@link DISPOSITIONS}. */
export function isDisposition(value: unknown): value is Disposition {
  return typeof value === "string" && (DISPOSITIONS as readonly string[]).includes(value);
}

function jsonSafe(value: unknown): unknown {
  if (value === null || typeof value === "string" || typeof value === "boolean") return value;
  if (typeof value === "number") return Number.isFinite(value) ? value : String(value);
  if (typeof value === "bigint") return value.toString();
  if (value === undefined) return null;
  if (Array.isArray(value)) return value.map(jsonSafe);
  if (value instanceof Error) return `${value.name}: ${value.message}`;
  if (typeof value === "object") {
    return Object.fromEntries(
      Object.entries(value as Record<string, unknown>).map(([k, v]) => [k, jsonSafe(v)]),
    );
  }
  return String(value);
}

function renderContextValue(value: unknown): string {
  return typeof value === "string" ? value : JSON.stringify(jsonSafe(value));
}

/** Base of every error videoflow raises on purpose. */
export class VideoflowError extends Error {
  /** Stable, greppable identifier; metrics and DLQ queries key on it. */
  static readonly code: string = "VF_UNKNOWN";
  /** Process exit status when this error reaches the CLI. */
  static readonly exitCode: number = 1;
  /** What the reader should do about it, kept out of `message`. */
  readonly remedy: string | null;
  /** Structured key/values (node, trace_id, replica, path). */
  readonly context: ErrorContext;

  /** An error saying `message`, with an optional `remedy` and a copy of `context`. */
  constructor(message: string, remedy?: string | null, context: ErrorContext = {}) {
    super(message);
    this.name = new.target.name;
    this.remedy = remedy ?? null;
    this.context = { ...context };
  }

  /** The class's stable code. */
  get code(): string {
    return (this.constructor as typeof VideoflowError).code;
  }

  /** The class's exit status. */
  get exitCode(): number {
    return (this.constructor as typeof VideoflowError).exitCode;
  }

  /** The disposition the delivery ladder reads; `null` outside the runtime branch. */
  get disposition(): Disposition | null {
    return null;
  }

  /** What an operator reads: the code and message, then the remedy, then the context; no stack trace. */
  render(): string {
    const lines = [`${this.code}: ${this.message}`];
    if (this.remedy) lines.push(`  remedy: ${this.remedy}`);
    const keys = Object.keys(this.context).sort();
    if (keys.length > 0) {
      lines.push(`  context: ${keys.map((k) => `${k}=${renderContextValue(this.context[k])}`).join(" ")}`);
    }
    return lines.join("\n");
  }

  /** The JSON-safe record of this error; its shape is a cross-process contract. */
  toDict(): ErrorRecord {
    return {
      code: this.code,
      type: this.name,
      message: this.message,
      remedy: this.remedy,
      exit_code: this.exitCode,
      disposition: this.disposition,
      context: jsonSafe(this.context) as Record<string, unknown>,
    };
  }

  /** `toDict()` for `JSON.stringify`. */
  toJSON(): ErrorRecord {
    return this.toDict();
  }
}

/** Something the author of the flow can fix by editing their code or config (exit 2). */
export class VideoflowUserError extends VideoflowError {
  /** Stable code of this class, `VF_USER`. */
  static override readonly code: string = "VF_USER";
  /** Exit status 2: the author can fix it. */
  static override readonly exitCode: number = EXIT_USER;
}

/** The code is fine; the machine, cluster, broker or registry is not (exit 3). */
export class VideoflowEnvironmentError extends VideoflowError {
  /** Stable code of this class, `VF_ENVIRONMENT`. */
  static override readonly code: string = "VF_ENVIRONMENT";
  /** Exit status 3: the world is not as required. */
  static override readonly exitCode: number = EXIT_ENVIRONMENT;
}

/** A failure while messages were flowing; its disposition drives the delivery ladder (exit 4). */
export class VideoflowRuntimeError extends VideoflowError {
  /** Stable code of this class, `VF_RUNTIME`. */
  static override readonly code: string = "VF_RUNTIME";
  /** Exit status 4: the flow ran and failed. */
  static override readonly exitCode: number = EXIT_FLOW_FAILED;
  /** The class's default disposition. */
  static readonly defaultDisposition: Disposition = TRANSIENT;
  #disposition: Disposition | null = null;

  /** The disposition set by {@link withDisposition}, else the class's default; never `null`. */
  override get disposition(): Disposition {
    return this.#disposition ?? (this.constructor as typeof VideoflowRuntimeError).defaultDisposition;
  }

  /** Overrides the disposition of this one error (what a classifier decided for a wrapped error). */
  withDisposition(disposition: Disposition): this {
    this.#disposition = disposition;
    return this;
  }
}

/** One problem found by validation, as the CLI prints it. */
export interface DiagnosticRecord {
  /** `error` fails validation; `warning` is reported only. */
  readonly severity: "error" | "warning";
  /** The problem's stable code. */
  readonly code: string;
  /** The node the problem is on; `null` for a flow-wide problem. */
  readonly node: string | null;
  /** What is wrong. */
  readonly message: string;
  /** What to do about it; `null` when there is no remedy. */
  readonly remedy: string | null;
}

/**
 * One problem found by `validate`: collected, never raised one at a time, so a flow with three mistakes
 * reports three.
 */
export class Diagnostic implements DiagnosticRecord {
  /** A diagnostic of `severity` and `code` on `node` (`null`: the whole flow). */
  constructor(
    readonly severity: "error" | "warning",
    readonly code: string,
    readonly node: string | null,
    readonly message: string,
    readonly remedy: string | null = null,
  ) {}

  /** One line, as the CLI prints it. */
  render(): string {
    const where = this.node === null ? "-" : this.node;
    const remedy = this.remedy ? ` (remedy: ${this.remedy})` : "";
    return `${this.severity} ${this.code} ${where}: ${this.message}${remedy}`;
  }

  /** The JSON-safe record. */
  toDict(): DiagnosticRecord {
    return {
      severity: this.severity,
      code: this.code,
      node: this.node,
      message: this.message,
      remedy: this.remedy,
    };
  }
}

function renderWithDiagnostics(error: VideoflowError, diagnostics: readonly Diagnostic[]): string {
  return [VideoflowError.prototype.render.call(error), ...diagnostics.map((d) => `  - ${d.render()}`)].join(
    "\n",
  );
}

/** An invalid configuration value: flow type, join policy, mount spec, image ref. */
export class ConfigError extends VideoflowUserError {
  /** Stable code of this class, `VF_CONFIG`. */
  static override readonly code: string = "VF_CONFIG";
}

/** The graph itself is invalid; carries every problem found in one validation pass. */
export class GraphError extends VideoflowUserError {
  /** Stable code of this class, `VF_GRAPH`. */
  static override readonly code: string = "VF_GRAPH";
  /** Every error-severity diagnostic of the pass. */
  readonly diagnostics: readonly Diagnostic[];

  /** A graph error saying `message`, carrying a copy of `diagnostics`. */
  constructor(
    message: string,
    remedy?: string | null,
    diagnostics: readonly Diagnostic[] = [],
    context?: ErrorContext,
  ) {
    super(message, remedy, context);
    this.diagnostics = [...diagnostics];
  }

  /** The base rendering, then one line per diagnostic. */
  override render(): string {
    return renderWithDiagnostics(this, this.diagnostics);
  }

  /** The base record plus every diagnostic's record. */
  override toDict(): ErrorRecord {
    return { ...super.toDict(), diagnostics: this.diagnostics.map((d) => d.toDict()) };
  }
}

/** A node violates the contract a worker relies on to rebuild and run it. */
export class NodeContractError extends VideoflowUserError {
  /** Stable code of this class, `VF_NODE_CONTRACT`. */
  static override readonly code: string = "VF_NODE_CONTRACT";
}

/** The flow asks a component for something it declares it cannot do. */
export class CapabilityError extends VideoflowUserError {
  /** Stable code of this class, `VF_CAPABILITY`. */
  static override readonly code: string = "VF_CAPABILITY";
}

/** Conflicting hard GPU requirement declarations for one node. */
export class GpuRequirementConflict extends CapabilityError {}

/** Two distinct logical names encode to the same physical broker or cluster name. */
export class IdentityCollision extends VideoflowUserError {
  /** Stable code of this class, `VF_IDENTITY_COLLISION`. */
  static override readonly code: string = "VF_IDENTITY_COLLISION";
}

/**
 * The flow requests a guarantee the composed backends cannot provide; raised by the composition planner
 * with every incompatibility at once, never a silent downgrade.
 */
export class IncompatibleProfile extends VideoflowUserError {
  /** Stable code of this class, `VF_INCOMPATIBLE_PROFILE`. */
  static override readonly code: string = "VF_INCOMPATIBLE_PROFILE";
  /** Every incompatibility found in one planning pass. */
  readonly diagnostics: readonly Diagnostic[];

  /** An incompatible-profile error saying `message`, carrying a copy of `diagnostics`. */
  constructor(
    message: string,
    remedy?: string | null,
    diagnostics: readonly Diagnostic[] = [],
    context?: ErrorContext,
  ) {
    super(message, remedy, context);
    this.diagnostics = [...diagnostics];
  }

  /** The base rendering, then one line per diagnostic. */
  override render(): string {
    return renderWithDiagnostics(this, this.diagnostics);
  }

  /** The base record plus every diagnostic's record. */
  override toDict(): ErrorRecord {
    return { ...super.toDict(), diagnostics: this.diagnostics.map((d) => d.toDict()) };
  }
}

/** Another run of the same flow already holds workloads in the namespace (RUN-047). */
export class ActiveRunConflict extends VideoflowEnvironmentError {
  /** Stable code of this class, `VF_ACTIVE_RUN`. */
  static override readonly code: string = "VF_ACTIVE_RUN";
}

/** The broker could not be reached, or a stream or consumer could not be created. */
export class BrokerUnavailable extends VideoflowEnvironmentError {
  /** Stable code of this class, `VF_BROKER_UNAVAILABLE`. */
  static override readonly code: string = "VF_BROKER_UNAVAILABLE";
}

/** The cluster is unreachable, an apply was rejected, or the cluster refused the work. */
export class ClusterError extends VideoflowEnvironmentError {
  /** Stable code of this class, `VF_CLUSTER`. */
  static override readonly code: string = "VF_CLUSTER";
}

/** The flow ran and one or more nodes failed (exit 4). */
export class FlowFailed extends VideoflowEnvironmentError {
  /** Stable code of this class, `VF_FLOW_FAILED`. */
  static override readonly code: string = "VF_FLOW_FAILED";
  /** Exit status 4: the flow ran and failed. */
  static override readonly exitCode: number = EXIT_FLOW_FAILED;
}

/** The flow can never finish: unschedulable work, or a node that stopped making progress (exit 5). */
export class FlowStalled extends VideoflowEnvironmentError {
  /** Stable code of this class, `VF_FLOW_STALLED`. */
  static override readonly code: string = "VF_FLOW_STALLED";
  /** Exit status 5: the flow can never finish. */
  static override readonly exitCode: number = EXIT_STALLED;
}

/** A compare-and-swap on shared cluster state lost to a concurrent writer; nothing was mutated. */
export class OwnershipConflict extends VideoflowEnvironmentError {
  /** Stable code of this class, `VF_OWNERSHIP_CONFLICT`. */
  static override readonly code: string = "VF_OWNERSHIP_CONFLICT";
}

/** A resource the flow needs does not exist or cannot be obtained. */
export class ResourceUnavailable extends VideoflowEnvironmentError {
  /** Stable code of this class, `VF_RESOURCE_UNAVAILABLE`. */
  static override readonly code: string = "VF_RESOURCE_UNAVAILABLE";
}

/**
 * What each OS error code of a disk that cannot take a write says about its filesystem, and what to do:
 * Deno's fs calls throw these as a plain `Error` whose `code` names them (no `Deno.errors` class).
 */
const DISK_ERRORS: Readonly<Record<string, { readonly state: string; readonly remedy: string }>> = {
  EROFS: {
    state: "is read-only",
    remedy: "make the filesystem that holds it writable again (remount it read-write)",
  },
  ENOSPC: { state: "is full", remedy: "free space on the filesystem that holds it" },
  EDQUOT: { state: "is over its quota", remedy: "free space under the quota, or raise it" },
  EIO: {
    state: "failed with an I/O error",
    remedy: "check the disk that holds it (dmesg, the device's health)",
  },
};

/** The context key a {@link diskFailure} carries its OS error code under (`EROFS`, `ENOSPC`, ...). */
export const DISK_ERROR_KEY = "disk_error";

function diskErrorCode(error: unknown): string | null {
  const code = typeof error === "object" && error !== null ? (error as { code?: unknown }).code : undefined;
  return typeof code === "string" && Object.hasOwn(DISK_ERRORS, code) ? code : null;
}

/**
 * The one mapping of a disk that cannot take a write (read-only, full, over quota, failing: EROFS, ENOSPC,
 * EDQUOT, EIO) to the environment failure it is: a {@link ResourceUnavailable} (exit 3) saying that
 * `subject` (what was being written, naming its path) cannot be written and why, with the remedy, then
 * `next` when given; its context holds `path` (when known), the OS code under {@link DISK_ERROR_KEY} and
 * the OS message (which names the file when the OS call had one). Null for any other error, ours included.
 */
export function diskFailure(
  error: unknown,
  subject: string,
  path: string | null,
  next?: string,
): ResourceUnavailable | null {
  const code = diskErrorCode(error);
  if (code === null || error instanceof VideoflowError) return null;
  const { state, remedy } = DISK_ERRORS[code];
  return new ResourceUnavailable(
    `cannot write ${subject}: its filesystem ${state} (${code})`,
    next === undefined ? remedy : `${remedy}; ${next}`,
    { ...(path === null ? {} : { path }), [DISK_ERROR_KEY]: code, os_error: errorMessage(error) },
  );
}

/**
 * Whether `failure` (an error, or the {@link ErrorRecord} of one: a replica's termination reason) is a
 * {@link diskFailure}: the same write fails the same way until an operator frees or remounts the disk.
 */
export function isDiskFailure(failure: unknown): boolean {
  const context = failureContext(failure);
  return context !== null && (failure as { code?: unknown }).code === ResourceUnavailable.code &&
    Object.hasOwn(DISK_ERRORS, String(context[DISK_ERROR_KEY]));
}

/** The context of `failure` (an error of ours, or its {@link ErrorRecord}), or null when it has none. */
function failureContext(failure: unknown): Readonly<Record<string, unknown>> | null {
  if (typeof failure !== "object" || failure === null) return null;
  const { context } = failure as { context?: unknown };
  return typeof context === "object" && context !== null ? context as Record<string, unknown> : null;
}

/**
 * The context key by which an environment failure says that a restart on the same host meets it again
 * (a GPU grant refused before `open()`): its value is `true`.
 */
export const LASTING_FAILURE_KEY = "lasting";

/**
 * Whether `failure` (an error, or its {@link ErrorRecord}) is one a restart cannot mend: a
 * {@link diskFailure}, or an environment failure marked with {@link LASTING_FAILURE_KEY}.
 */
export function isLastingFailure(failure: unknown): boolean {
  return isDiskFailure(failure) || failureContext(failure)?.[LASTING_FAILURE_KEY] === true;
}

/** A read a decision depended on could not be made; the decision is retried, never guessed. */
export class UnobservableState extends VideoflowEnvironmentError {
  /** Stable code of this class, `VF_STATE_UNKNOWN`. */
  static override readonly code: string = "VF_STATE_UNKNOWN";
}

/** The message itself is bad: dead-lettered on the first failure. */
export class PoisonMessage extends VideoflowRuntimeError {
  /** Stable code of this class, `VF_POISON`. */
  static override readonly code: string = "VF_POISON";
  /** Default disposition poison: dead-letter on the first failure. */
  static override readonly defaultDisposition: Disposition = POISON;
}

/** The envelope or payload could not be decoded off the wire. */
export class DecodeError extends PoisonMessage {
  /** Stable code of this class, `VF_POISON_DECODE`. */
  static override readonly code: string = "VF_POISON_DECODE";
}

/** The payload decoded but is not what this node requires. */
export class SchemaError extends PoisonMessage {
  /** Stable code of this class, `VF_POISON_SCHEMA`. */
  static override readonly code: string = "VF_POISON_SCHEMA";
}

/** A partitioned node received a record whose partition key is unusable (RUN-020). */
export class PartitionKeyError extends PoisonMessage {
  /** Stable code of this class, `VF_POISON_PARTITION_KEY`. */
  static override readonly code: string = "VF_POISON_PARTITION_KEY";
}

/**
 * How a replica ended while a message was inside its node, which counts as one delivery of that message
 * (as a broker counts an expired ack wait): it crashed (an exit its task did not make: `Deno.exit`, a
 * signal, an exhausted heap, a fault in native code) or it stalled (a call that never returned).
 */
export const ReplicaDeath = { crashed: "crashed", stalled: "stalled" } as const;
/** One of {@link ReplicaDeath}. */
export type ReplicaDeath = typeof ReplicaDeath[keyof typeof ReplicaDeath];

/** The message was inside the node each time its replica crashed, until its delivery budget ran out. */
export class ReplicaCrashed extends PoisonMessage {
  /** Stable code of this class, `VF_POISON_REPLICA_CRASHED`. */
  static override readonly code: string = "VF_POISON_REPLICA_CRASHED";
}

/** The message was inside the node each time its replica stalled, until its delivery budget ran out. */
export class ReplicaStalled extends PoisonMessage {
  /** Stable code of this class, `VF_POISON_REPLICA_STALLED`. */
  static override readonly code: string = "VF_POISON_REPLICA_STALLED";
}

/**
 * The dead-letter error of a message whose delivery budget replica deaths used up: {@link ReplicaStalled}
 * when the last death was a stall, else {@link ReplicaCrashed}, naming the node, the deliveries counted and
 * the last death's cause (the replica's exit reason).
 */
export function replicaDeathFailure(
  death: ReplicaDeath,
  node: string,
  deliveries: number,
  cause: string,
): PoisonMessage {
  const stalled = death === ReplicaDeath.stalled;
  const what = stalled ? "stalled (a call that never returned)" : "crashed";
  const message = `the input was inside ${node} when its replica ${what}, ${deliveries} time(s), its whole ` +
    `delivery budget; the last: ${cause}`;
  const remedy = stalled
    ? "find why the node never returns on this input (`vf dlq` holds it); the other inputs went on"
    : "find why the node kills its process on this input (`vf dlq` holds it): a Deno.exit, an exhausted " +
      "heap, a fault in native code; the other inputs went on";
  const context = { node, num_delivered: deliveries, replica_death: death };
  return stalled
    ? new ReplicaStalled(message, remedy, context)
    : new ReplicaCrashed(message, remedy, context);
}

/** Something outside the worker was briefly unavailable: retry with backoff. */
export class TransientFailure extends VideoflowRuntimeError {
  /** Stable code of this class, `VF_TRANSIENT`. */
  static override readonly code: string = "VF_TRANSIENT";
  /** Default disposition transient: retry with backoff. */
  static override readonly defaultDisposition: Disposition = TRANSIENT;
}

/** A service the node depends on is down or throttling. */
export class UpstreamUnavailable extends TransientFailure {
  /** Stable code of this class, `VF_UPSTREAM_UNAVAILABLE`. */
  static override readonly code: string = "VF_UPSTREAM_UNAVAILABLE";
}

/** This worker cannot process any message: the input goes back to a healthy replica and the worker stops. */
export class WorkerFatal extends VideoflowRuntimeError {
  /** Stable code of this class, `VF_WORKER_FATAL`. */
  static override readonly code: string = "VF_WORKER_FATAL";
  /** Default disposition worker_fatal: hand the input back and stop the worker. */
  static override readonly defaultDisposition: Disposition = WORKER_FATAL;
}

/** The accelerator is unusable: out of memory, fell off the bus, wrong driver. */
export class DeviceError extends WorkerFatal {
  /** Stable code of this class, `VF_DEVICE`. */
  static override readonly code: string = "VF_DEVICE";
}

/** The worker is out of a host resource: memory, disk, file descriptors. */
export class ResourceExhausted extends WorkerFatal {
  /** Stable code of this class, `VF_RESOURCE_EXHAUSTED`. */
  static override readonly code: string = "VF_RESOURCE_EXHAUSTED";
}

/** The circuit breaker tripped: this worker failed too many messages in a row. */
export class WorkerUnhealthy extends WorkerFatal {
  /** Stable code of this class, `VF_WORKER_UNHEALTHY`. */
  static override readonly code: string = "VF_WORKER_UNHEALTHY";
}

/** A node acked nothing for the progress deadline while work was pending (exit 5). */
export class ProgressStalled extends VideoflowRuntimeError {
  /** Stable code of this class, `VF_PROGRESS_STALLED`. */
  static override readonly code: string = "VF_PROGRESS_STALLED";
  /** Exit status 5: the flow can never finish. */
  static override readonly exitCode: number = EXIT_STALLED;
  /** Default disposition worker_fatal: hand the input back and stop the worker. */
  static override readonly defaultDisposition: Disposition = WORKER_FATAL;
}

/** A commit under an ownership epoch a newer owner superseded was refused; this writer stops. */
export class StaleAuthority extends VideoflowRuntimeError {
  /** Stable code of this class, `VF_STALE_AUTHORITY`. */
  static override readonly code: string = "VF_STALE_AUTHORITY";
  /** Default disposition worker_fatal: hand the input back and stop the worker. */
  static override readonly defaultDisposition: Disposition = WORKER_FATAL;
}

/** An upstream node published ABORT; this node stops too, carrying the originating error. */
export class UpstreamAborted extends VideoflowRuntimeError {
  /** Stable code of this class, `VF_UPSTREAM_ABORTED`. */
  static override readonly code: string = "VF_UPSTREAM_ABORTED";
  /** Default disposition worker_fatal: hand the input back and stop the worker. */
  static override readonly defaultDisposition: Disposition = WORKER_FATAL;
}

/** Any class an error classifier can be registered for: whatever its constructor takes. */
// deno-lint-ignore no-explicit-any
export type ErrorClass = abstract new (...args: any[]) => unknown;

const classifiers: Array<readonly [ErrorClass, Disposition]> = [];

function requireDisposition(disposition: string): Disposition {
  if (!isDisposition(disposition)) {
    throw new ConfigError(
      `unknown disposition ${JSON.stringify(disposition)}`,
      `use one of ${DISPOSITIONS.join(", ")}`,
    );
  }
  return disposition;
}

/**
 * Maps a third-party error class (and its subclasses) onto a disposition, so the retry ladder can reason
 * about failures from libraries videoflow does not own. Throws {@link ConfigError} for an unknown
 * disposition.
 */
export function registerErrorClassifier(errorClass: ErrorClass, disposition: string): void {
  classifiers.push([errorClass, requireDisposition(disposition)]);
}

/**
 * Registers a classifier for a class that may not be loadable; returns whether it resolved and was
 * registered.
 */
export function registerClassifierFor(
  name: string,
  disposition: string,
  resolver: () => ErrorClass | null | undefined,
): boolean {
  const checked = requireDisposition(disposition);
  let resolved: ErrorClass | null | undefined;
  try {
    resolved = resolver();
  } catch {
    resolved = null;
  }
  if (!resolved) {
    console.debug(`videoflow: classifier for ${name} not registered: the type is not available`);
    return false;
  }
  classifiers.push([resolved, checked]);
  return true;
}

/** The registered (error class, disposition) pairs, in registration order. */
export function registeredErrorClassifiers(): Array<readonly [ErrorClass, Disposition]> {
  return [...classifiers];
}

/** Removes a registration (tests and plugins that unload); returns whether one was removed. */
export function unregisterErrorClassifier(errorClass: ErrorClass): boolean {
  const index = classifiers.findLastIndex(([cls]) => cls === errorClass);
  if (index < 0) return false;
  classifiers.splice(index, 1);
  return true;
}

/**
 * The disposition of an error: its own if it is one of ours, else the most recently registered
 * classifier that matches, else `fallback`.
 */
export function classify(error: unknown, fallback: string = DEFAULT_DISPOSITION): Disposition {
  if (error instanceof VideoflowRuntimeError) return error.disposition;
  for (let i = classifiers.length - 1; i >= 0; i--) {
    const [cls, disposition] = classifiers[i];
    if (error instanceof cls) return disposition;
  }
  return requireDisposition(fallback);
}

/** What a thrown value says: an Error's message, a string, or the JSON of anything else it can be. */
function errorMessage(error: unknown): string {
  if (error instanceof Error) return error.message;
  if (typeof error === "string") return error;
  if (typeof error === "object" && error !== null) {
    try {
      const json = JSON.stringify(error);
      if (json !== undefined && json !== "{}") return json;
    } catch {
      // A value JSON cannot hold (a cycle, a bigint) says what String() says.
    }
  }
  return String(error);
}

/**
 * One of our user or environment errors raised while messages flowed: it keeps its class name, code, exit
 * status, remedy and context, and gains the disposition the delivery ladder needs.
 */
class CarriedError extends VideoflowRuntimeError {
  readonly #original: VideoflowError;

  constructor(original: VideoflowError, context: ErrorContext) {
    super(original.message, original.remedy, { ...context, ...original.context });
    this.#original = original;
    this.name = original.name;
    (this as { cause?: unknown }).cause = original;
  }

  override get code(): string {
    return this.#original.code;
  }

  override get exitCode(): number {
    return this.#original.exitCode;
  }
}

/**
 * Wraps whatever a node threw into a classified {@link VideoflowRuntimeError} carrying the message's
 * identity. A runtime error of ours is enriched in place; a user or environment error of ours keeps its
 * class name, code and exit status (worker_fatal for a user error: a misconfigured node fails every message
 * alike; and for a {@link diskFailure}, which an OS error of a full or read-only disk becomes: the input is
 * not to blame, and the next one fails the same way); anything else becomes a runtime error whose
 * disposition comes from {@link classify} and whose `cause` is the original.
 */
export function asRuntimeError(
  error: unknown,
  fallback: string = DEFAULT_DISPOSITION,
  context: ErrorContext = {},
): VideoflowRuntimeError {
  if (error instanceof VideoflowRuntimeError) {
    for (const [key, value] of Object.entries(context)) {
      if (!(key in error.context)) error.context[key] = value;
    }
    return error;
  }
  if (error instanceof VideoflowError) {
    return new CarriedError(error, context).withDisposition(
      error instanceof VideoflowUserError || isDiskFailure(error)
        ? WORKER_FATAL
        : requireDisposition(fallback),
    );
  }
  const disk = diskFailure(error, "to disk", null);
  if (disk !== null) return asRuntimeError(disk, fallback, context);
  const disposition = classify(error, fallback);
  const type = error instanceof Error ? error.name : typeof error;
  const wrapped = new VideoflowRuntimeError(errorMessage(error), null, { ...context, error_type: type });
  (wrapped as { cause?: unknown }).cause = error;
  return wrapped.withDisposition(disposition);
}

function codeForType(name: string): string {
  const snake = name.replace(/([a-z0-9])([A-Z])/g, "$1_$2").replace(/[^A-Za-z0-9]+/g, "_").toUpperCase();
  return `VF_EXC_${snake || "ERROR"}`;
}

function isErrorRecord(value: unknown): value is ErrorRecord {
  return typeof value === "object" && value !== null && !Array.isArray(value) &&
    typeof (value as Record<string, unknown>).code === "string" &&
    typeof (value as Record<string, unknown>).message === "string";
}

/**
 * Normalizes anything that describes a failure into the JSON-safe record an ABORT marker carries: one of
 * ours keeps its structure, a bare error gets a code derived from its type, and an already-normalized
 * record passes through unchanged (so an ABORT relays hop to hop without rewriting the origin).
 */
export function errorToDict(error: unknown): ErrorRecord {
  if (error instanceof VideoflowError) return error.toDict();
  if (isErrorRecord(error)) return error;
  const type = error instanceof Error ? error.name : typeof error;
  return {
    code: codeForType(type),
    type,
    message: errorMessage(error),
    remedy: null,
    exit_code: EXIT_FLOW_FAILED,
    disposition: classify(error),
    context: {},
  };
}

/** Throws one {@link GraphError} listing every error-severity diagnostic; warnings never throw. */
export function raiseForDiagnostics(diagnostics: readonly Diagnostic[]): void {
  const errors = diagnostics.filter((d) => d.severity === "error");
  if (errors.length === 0) return;
  const noun = errors.length === 1 ? "problem" : "problems";
  throw new GraphError(
    `the flow is invalid: ${errors.length} ${noun}`,
    "fix every problem listed, then run `vf validate` again",
    errors,
  );
}

/** The exit status an error maps to at the CLI: ours by class, anything else 1. */
export function exitCodeOf(error: unknown): number {
  return error instanceof VideoflowError ? error.exitCode : 1;
}
