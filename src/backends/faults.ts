/**
 * Named fault barriers for deterministic failure injection (spec backends.faults).
 *
 * A conformance case is a story with a fault in the middle: "crash after the group is persisted but
 * before its outputs are published", "drop the acknowledgment of the settlement", "let a second owner
 * write between the read and the update". Adapters and the runtime call {@link barrier} at each named
 * point of {@link Barrier}; a test installs a {@link FaultSchedule} that maps barrier names to actions,
 * and afterwards asks which barriers fired: a scheduled fault that never fired makes the test invalid
 * ({@link FaultSchedule.assertAllFired}, which leaving a `using` schedule's scope runs), never a pass.
 *
 * The hot path. With no schedule installed, `barrier()` reads one module variable and returns one shared,
 * already-resolved promise: no allocation, no name check. `await barrier(...)` then costs one microtask
 * turn. A call site that would have to build a context object only for the barrier writes
 * `if (faultsInstalled()) await barrier(name, { ... })`, which skips both the object and the await.
 * Where no await is possible, {@link barrierSync} offers the same for the actions that need no waiting.
 * `bench/faults_bench.ts` measures the three forms.
 *
 * Across threads and processes. {@link FaultSchedule.toEnv} serialises the schedule into
 * `VF_FAULT_SCHEDULE_JSON` and names a marker directory in `VF_FAULT_MARKER_DIR`; a worker (a `deno run`
 * subprocess, a pod, or a Deno Worker handed the same environment record) calls {@link installFromEnv}.
 * With a marker directory every hit of a scheduled barrier claims the next file `<barrier>#<n>.hit`
 * there (created exclusively, so `n` is the hit's ordinal among all processes sharing the directory), the
 * parent's {@link FaultSchedule.fired} counts those files, and `Pause` waits for `<pause>.release`.
 *
 * How a call site uses the {@link Hit}: RaiseError and Crash need nothing (the error propagates, the
 * process ends); DropResponse means "the operation happened, but report its outcome as unknown":
 *
 * ```ts
 * import { barrier } from "./faults.ts";
 * async function settle(): Promise<"confirmed" | "unknown"> {
 *   // ... the broker applies the ack ...
 *   const hit = await barrier("message.settle.after", { settlement_id: "s-1" });
 *   return hit.dropResponse ? "unknown" : "confirmed";
 * }
 * ```
 *
 * @module
 */

import { requireCount, requireSeconds } from "../core/checks.ts";
import * as taxonomy from "../core/errors.ts";
import {
  ConfigError,
  type Disposition,
  isDisposition,
  VideoflowError,
  VideoflowRuntimeError,
} from "../core/errors.ts";
import { type Clock, systemClock } from "./clock.ts";

/**
 * Every barrier the adapters and the runtime may call, as `<subject>.<operation>.<before|after>`. A
 * `before` barrier sits before the effect is attempted; an `after` barrier sits after the effect took
 * place and before the caller learns of it, which is where DropResponse models a lost receipt and Crash
 * a death between the effect and the next step. Story numbers refer to SPEC-MAP section 5.
 */
export const Barrier = {
  /** A publication is about to reach the broker; nothing is stored yet. */
  messagePublishBefore: "message.publish.before",
  /** The broker stored a publication whose receipt has not reached the caller (stories 1, 5, 38). */
  messagePublishAfter: "message.publish.after",
  /** Deliveries are leased to a receiver and not yet returned to it (a crash here lets leases lapse, 29). */
  messageReceiveAfter: "message.receive.after",
  /** The node has processed its input; the ack, nak or term is about to reach the broker (23, 24, 36). */
  messageSettleBefore: "message.settle.before",
  /** The broker applied a settlement whose confirmation has not reached the caller (stories 2, 10). */
  messageSettleAfter: "message.settle.after",
  /** A delivery's lease renewal is about to reach the broker (a delay here lets the lease lapse, 29). */
  messageRenewBefore: "message.renew.before",
  /** The broker answered a subscription, channel, ack-floor or publication observation (stories 7, 20). */
  brokerObserveAfter: "broker.observe.after",
  /** A dead-letter record is about to be published (story 26: the DLQ publish fails). */
  dlqPublishBefore: "dlq.publish.before",
  /** The dead-letter record is stored; the input's terminal settle has not happened (stories 23, 26). */
  dlqPublishAfter: "dlq.publish.after",
  /** An EOS or ABORT marker is about to be published (stories 13, 21, 22). */
  terminatorPublishBefore: "terminator.publish.before",
  /** Payload bytes are about to be stored (an error here is a refused put). */
  payloadWriteBefore: "payload.write.before",
  /** The bytes are stored and no obligation is attached yet (story 8, PAY-007). */
  payloadWriteAfter: "payload.write.after",
  /** The contract's obligations are attached to a stored payload (story 8, PAY-007). */
  obligationAcquireAfter: "obligation.acquire.after",
  /** A payload read is about to reach the store (story 45: a transient read is retried). */
  payloadReadBefore: "payload.read.before",
  /** A reader's obligation release is about to reach the store (story 10: acked, never released). */
  obligationReleaseBefore: "obligation.release.before",
  /** The store released an obligation whose reply has not reached the caller (story 46). */
  obligationReleaseAfter: "obligation.release.after",
  /** A reserver read a node's ownership record, before deciding (story 3). */
  ownerReadAfter: "owner.read.after",
  /** A reserver's compare-and-swap on a node's ownership record is about to be sent (story 3). */
  ownerUpdateBefore: "owner.update.before",
  /** The ownership write applied; its reply has not reached the reserver. */
  ownerUpdateAfter: "owner.update.after",
  /** A compare-and-swap is about to reach the RuntimeStore (a pause here lets another owner write, 17). */
  ledgerWriteBefore: "ledger.write.before",
  /** A file store write is part done: half a journal line written, or a log record not yet renamed in. */
  ledgerWriteMid: "ledger.write.mid",
  /** The RuntimeStore took a write whose outcome has not reached the caller. */
  ledgerWriteAfter: "ledger.write.after",
  /** A join group is persisted in the ledger; its outputs are not yet published (story 1). */
  groupPersistAfter: "group.persist.after",
  /** A publication intent is in the outbox; the publication is not yet sent (stories 1, 38). */
  outboxIntendAfter: "outbox.intend.after",
  /** A checkpoint and its output are committed; the input is not yet acked (story 36). */
  checkpointCommitAfter: "checkpoint.commit.after",
  /** A parent replica's EOS or ABORT terminator is recorded in the ledger (stories 19, 20). */
  terminatorRecordAfter: "terminator.record.after",
  /** A partition lease is acquired; its holder has not started work (stories 16, 18). */
  partitionAcquireAfter: "partition.acquire.after",
  /** A partition lease renewal is about to be written (a pause here lets the lease lapse, 15, 16). */
  partitionRenewBefore: "partition.renew.before",
  /** A producer is about to be asked for its next record (stories 22, 38). */
  producerNextBefore: "producer.next.before",
  /** A node is about to process an input group (stories 24, 25, 40). */
  nodeProcessBefore: "node.process.before",
  /** A node processed an input group; its output is not yet published (story 1). */
  nodeProcessAfter: "node.process.after",
} as const;
/** The name of one barrier: one of the values of {@link Barrier}. */
export type Barrier = typeof Barrier[keyof typeof Barrier];

/** Every barrier name; a schedule or an installed-path call naming anything else is {@link UnknownBarrier}. */
export const BARRIERS: ReadonlySet<string> = new Set<string>(Object.values(Barrier));

/** Whether `name` is one of {@link BARRIERS}. */
export function isBarrier(name: string): name is Barrier {
  return BARRIERS.has(name);
}

/** The environment variable carrying a serialised schedule to a worker (ENV-16). */
export const FAULT_SCHEDULE_ENV = "VF_FAULT_SCHEDULE_JSON";
/** The environment variable naming the shared marker directory (ENV-17). */
export const FAULT_MARKER_DIR_ENV = "VF_FAULT_MARKER_DIR";
/** The exit status of a Crash that names none: 128 + SIGKILL, what a kill -9 produces. */
export const CRASH_EXIT_CODE = 137;
/** How long a Pause waits for its release when the schedule names no other timeout, in seconds. */
export const DEFAULT_PAUSE_TIMEOUT_SECONDS = 60;
/** Version of the `VF_FAULT_SCHEDULE_JSON` document this module writes and reads. */
export const FAULT_SCHEDULE_VERSION = 1;

/** End the process (or, inside a Deno Worker, the worker) at once; see {@link crashProcess}. */
export interface Crash {
  readonly kind: "crash";
  readonly exitCode: number;
}

/** The serialisable description of a taxonomy error, so a RaiseError can travel to a worker. */
export interface TypedFault {
  readonly code: string;
  readonly message: string;
  readonly disposition: Disposition;
}

/** Throw `factory()` at the barrier. */
export interface RaiseError {
  readonly kind: "raise";
  readonly factory: () => Error;
  /** The serialisable form; `null` for an in-process factory that cannot travel. */
  readonly typed: TypedFault | null;
}

/** Sleep `seconds` on the schedule's clock, then continue. */
export interface Delay {
  readonly kind: "delay";
  readonly seconds: number;
}

/** Continue, but tell the call site to report the call's outcome as Unknown (a lost receipt). */
export interface DropResponse {
  readonly kind: "drop_response";
}

/** Block until `release(name)` or the marker `<dir>/<name>.release`; fail after `timeoutSeconds`. */
export interface Pause {
  readonly kind: "pause";
  readonly name: string;
  readonly timeoutSeconds: number;
}

/** Apply `action` on the `n`-th hit of the barrier only (counted across processes with a marker dir). */
export interface Nth {
  readonly kind: "nth";
  readonly n: number;
  readonly action: SimpleAction;
}

/** An action that applies on the hit itself. */
export type SimpleAction = Crash | RaiseError | Delay | DropResponse | Pause;
/** What a schedule does when its barrier is hit. */
export type FaultAction = SimpleAction | Nth;

/** What a barrier call returns: whether an action applied, and whether the outcome must read as Unknown. */
export interface Hit {
  readonly fired: boolean;
  readonly dropResponse: boolean;
}

/** A barrier with no action for this hit. */
export const NOT_FIRED: Hit = Object.freeze({ fired: false, dropResponse: false });
const FIRED: Hit = Object.freeze({ fired: true, dropResponse: false });
const DROPPED: Hit = Object.freeze({ fired: true, dropResponse: true });
const NOT_FIRED_PROMISE: Promise<Hit> = Promise.resolve(NOT_FIRED);

/** Identities a barrier call passes along (written into its marker file); keep values JSON-safe. */
export type BarrierContext = Readonly<Record<string, unknown>>;
const NO_CONTEXT: BarrierContext = Object.freeze({});

/** A schedule or a call named a barrier that is not in {@link BARRIERS}. */
export class UnknownBarrier extends ConfigError {
  static override readonly code: string = "VF_UNKNOWN_BARRIER";
}

/** A Pause was not released within its timeout: the interleaving the test scripted never completed. */
export class PauseTimeout extends VideoflowRuntimeError {
  static override readonly code: string = "VF_FAULT_PAUSE_TIMEOUT";
  static override readonly defaultDisposition: Disposition = taxonomy.WORKER_FATAL;
}

/** The error {@link raiseTyped} throws when its code names no class of the taxonomy. */
export class InjectedFault extends VideoflowRuntimeError {
  readonly #code: string;

  constructor(code: string, message: string) {
    super(message, null, { injected: true });
    this.#code = code;
  }

  /** The code the schedule named. */
  override get code(): string {
    return this.#code;
  }
}

/** A scheduled fault never fired, or never fired in time: the test proves nothing (INVALID_TEST). */
export class InvalidTest extends Error {
  /** The barriers whose scheduled action never applied. */
  readonly unfired: readonly string[];

  constructor(message: string, unfired: readonly string[]) {
    super(message);
    this.name = "InvalidTest";
    this.unfired = unfired;
  }
}

/** Thrown by {@link throwSimulatedCrash}: an in-process stand-in for a Crash. */
export class SimulatedCrash extends Error {
  constructor(readonly exitCode: number, readonly barrier: Barrier) {
    super(`simulated crash (exit ${exitCode}) at barrier ${barrier}`);
    this.name = "SimulatedCrash";
  }
}

/** What a schedule calls for a Crash; it must not return. */
export type CrashHandler = (exitCode: number, barrier: Barrier) => never;

function inWorkerThread(): boolean {
  const scope = (globalThis as { WorkerGlobalScope?: abstract new () => unknown }).WorkerGlobalScope;
  return scope !== undefined && globalThis instanceof scope;
}

/**
 * The default {@link CrashHandler}: the death a kill produces. Inside a Deno Worker, `Deno.exit` ends that
 * worker only (no event reaches the parent). In a process, exit code 137 is a real SIGKILL of itself (no
 * `finally`, no `unload` listener runs); any other code is `Deno.exit(code)`, which skips `finally` blocks
 * but does run `unload` listeners, the closest Deno offers to `os._exit` with a chosen status.
 */
export function crashProcess(exitCode: number): never {
  if (!inWorkerThread() && exitCode === CRASH_EXIT_CODE) {
    try {
      Deno.kill(Deno.pid, "SIGKILL");
    } catch {
      // Not allowed to signal itself: fall through to a plain exit with the same status.
    }
  }
  return Deno.exit(exitCode);
}

/** A {@link CrashHandler} for in-process tests: throws {@link SimulatedCrash} instead of exiting. */
export function throwSimulatedCrash(exitCode: number, barrier: Barrier): never {
  throw new SimulatedCrash(exitCode, barrier);
}

const PAUSE_NAME = /^[A-Za-z0-9_.-]+$/;

/** A Crash action; `exitCode` defaults to {@link CRASH_EXIT_CODE}. */
export function crash(exitCode: number = CRASH_EXIT_CODE): Crash {
  return { kind: "crash", exitCode: requireCount(exitCode, "Crash exit code", 0) };
}

/** A RaiseError action that throws what `factory` returns (in-process only: it cannot be serialised). */
export function raiseError(factory: () => Error): RaiseError;
/** A RaiseError action that throws `new errorClass(message)` (in-process only). */
export function raiseError(errorClass: new (message: string) => Error, message: string): RaiseError;
export function raiseError(
  make: (() => Error) | (new (message: string) => Error),
  message?: string,
): RaiseError {
  const factory = message === undefined
    ? make as () => Error
    : () => new (make as new (message: string) => Error)(message);
  return { kind: "raise", factory, typed: null };
}

/** The taxonomy class whose own code is `code`, if any. */
function taxonomyClass(code: string): (new (message: string) => VideoflowError) | null {
  for (const value of Object.values(taxonomy)) {
    if (
      typeof value === "function" && value.prototype instanceof VideoflowError &&
      Object.hasOwn(value, "code") && (value as unknown as { code: string }).code === code
    ) {
      return value as unknown as new (message: string) => VideoflowError;
    }
  }
  return null;
}

/** The error a {@link TypedFault} describes: its taxonomy class (or {@link InjectedFault}), its disposition. */
export function typedFaultError(fault: TypedFault): Error {
  const cls = taxonomyClass(fault.code);
  const error = cls === null ? new InjectedFault(fault.code, fault.message) : new cls(fault.message);
  return error instanceof VideoflowRuntimeError ? error.withDisposition(fault.disposition) : error;
}

/**
 * A RaiseError built from the error taxonomy, serialisable into a worker's environment. The thrown error
 * is the taxonomy class whose code is `code` (else an {@link InjectedFault} carrying it); a runtime-branch
 * error takes `disposition`, user and environment errors keep their branch's handling.
 */
export function raiseTyped(
  code: string,
  message: string,
  disposition: string = taxonomy.TRANSIENT,
): RaiseError {
  if (!isDisposition(disposition)) {
    throw new ConfigError(
      `unknown disposition ${JSON.stringify(disposition)} for a raised fault`,
      `use one of ${taxonomy.DISPOSITIONS.join(", ")}`,
    );
  }
  const typed: TypedFault = { code, message, disposition };
  return { kind: "raise", factory: () => typedFaultError(typed), typed };
}

/** A Delay action: sleep `seconds` on the schedule's clock, then continue. */
export function delay(seconds: number): Delay {
  return { kind: "delay", seconds: requireSeconds(seconds, "Delay") };
}

/** A DropResponse action: the call proceeds, and its caller must report the outcome as Unknown. */
export function dropResponse(): DropResponse {
  return { kind: "drop_response" };
}

/** A Pause action named `name` (letters, digits, `_`, `.`, `-`: it becomes a marker file name). */
export function pause(name: string, timeoutSeconds: number = DEFAULT_PAUSE_TIMEOUT_SECONDS): Pause {
  if (!PAUSE_NAME.test(name)) {
    throw new ConfigError(
      `pause name ${JSON.stringify(name)} cannot name a marker file`,
      "use letters, digits, '_', '.' and '-' only",
    );
  }
  return { kind: "pause", name, timeoutSeconds: requireSeconds(timeoutSeconds, "Pause timeout") };
}

/** An Nth action: `action` applies on the `n`-th hit only (n ≥ 1); other hits pass untouched. */
export function nth(n: number, action: SimpleAction): Nth {
  if ((action as FaultAction).kind === "nth") {
    throw new ConfigError("Nth cannot wrap another Nth", "schedule one Nth with the hit number you mean");
  }
  return { kind: "nth", n: requireCount(n, "Nth hit number", 1), action };
}

function unknownBarrier(name: string): UnknownBarrier {
  return new UnknownBarrier(
    `no barrier is named ${JSON.stringify(name)}`,
    "use a name from Barrier in src/backends/faults.ts",
    { barrier: name },
  );
}

function actionToJson(barrierName: string, action: FaultAction): Record<string, unknown> {
  switch (action.kind) {
    case "crash":
      return { kind: "crash", exit_code: action.exitCode };
    case "raise":
      if (action.typed === null) {
        throw new ConfigError(
          `the RaiseError at ${barrierName} wraps an in-process factory and cannot reach another process`,
          "build it with raiseTyped(code, message, disposition)",
          { barrier: barrierName },
        );
      }
      return { kind: "raise", ...action.typed };
    case "delay":
      return { kind: "delay", seconds: action.seconds };
    case "drop_response":
      return { kind: "drop_response" };
    case "pause":
      return { kind: "pause", name: action.name, timeout_seconds: action.timeoutSeconds };
    case "nth":
      return { kind: "nth", n: action.n, action: actionToJson(barrierName, action.action) };
  }
}

function badSchedule(detail: string): ConfigError {
  return new ConfigError(
    `${FAULT_SCHEDULE_ENV} is not a fault schedule: ${detail}`,
    "set it from FaultSchedule.toEnv() of the same videoflow version",
  );
}

function field(json: Record<string, unknown>, key: string, type: "string"): string;
function field(json: Record<string, unknown>, key: string, type: "number"): number;
function field(json: Record<string, unknown>, key: string, type: "string" | "number"): string | number {
  const value = json[key];
  const matches = type === "string" ? typeof value === "string" : typeof value === "number";
  if (!matches) throw badSchedule(`field ${key} of a ${json.kind} action is not a ${type}`);
  return value as string | number;
}

function actionFromJson(json: unknown): FaultAction {
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw badSchedule("an action is not an object");
  }
  const record = json as Record<string, unknown>;
  switch (record.kind) {
    case "crash":
      return crash(field(record, "exit_code", "number"));
    case "raise":
      return raiseTyped(
        field(record, "code", "string"),
        field(record, "message", "string"),
        field(record, "disposition", "string"),
      );
    case "delay":
      return delay(field(record, "seconds", "number"));
    case "drop_response":
      return dropResponse();
    case "pause":
      return pause(field(record, "name", "string"), field(record, "timeout_seconds", "number"));
    case "nth": {
      const inner = actionFromJson(record.action);
      if (inner.kind === "nth") throw badSchedule("an nth action wraps another nth");
      return nth(field(record, "n", "number"), inner);
    }
    default:
      throw badSchedule(`unknown action kind ${JSON.stringify(record.kind)}`);
  }
}

const HIT_MARKER = /^(.+)#(\d+)\.hit$/;
const PAUSE_POLL_MS = 10;
const FIRED_POLL_MS = 5;

/** Options of a {@link FaultSchedule}. */
export interface FaultScheduleOptions {
  /** Directory for cross-process markers; created on install and by `toEnv`. */
  readonly markerDir?: string | null;
  /** The clock a Delay sleeps on (default: the system clock). */
  readonly clock?: Clock;
  /** What a Crash calls after writing its marker (default {@link crashProcess}). */
  readonly onCrash?: CrashHandler;
}

let active: FaultSchedule | null = null;

/**
 * A mapping from barrier names to actions, with the hit counts that prove each one fired. Install one per
 * test (`using schedule = new FaultSchedule({...}).install()` uninstalls it at the end of the scope).
 */
export class FaultSchedule implements Disposable {
  /** Barrier name → action, as scheduled. */
  readonly actions: ReadonlyMap<Barrier, FaultAction>;
  /** The shared marker directory, or `null` for an in-process schedule. */
  readonly markerDir: string | null;
  readonly #clock: Clock;
  readonly #onCrash: CrashHandler;
  /** In-process hit counts (the whole truth without a marker dir). */
  readonly #hits = new Map<Barrier, number>();
  /** Next marker ordinal worth trying per barrier (ordinals below it are known taken). */
  readonly #nextOrdinal = new Map<Barrier, number>();
  readonly #released = new Set<string>();
  readonly #releaseWaiters = new Map<string, Set<() => void>>();

  /** Throws {@link UnknownBarrier} when a key is not a barrier name. */
  constructor(actions: Readonly<Record<string, FaultAction>>, options: FaultScheduleOptions = {}) {
    const checked = new Map<Barrier, FaultAction>();
    for (const [name, action] of Object.entries(actions)) {
      if (!isBarrier(name)) throw unknownBarrier(name);
      checked.set(name, action);
    }
    this.actions = checked;
    this.markerDir = options.markerDir ?? null;
    this.#clock = options.clock ?? systemClock;
    this.#onCrash = options.onCrash ?? crashProcess;
  }

  /**
   * The schedule `env` carries, or `null` when `VF_FAULT_SCHEDULE_JSON` is unset or empty. `env` defaults
   * to the process environment (reading it needs `--allow-env` for the two variables). A malformed
   * document is a {@link ConfigError}; an unknown barrier name an {@link UnknownBarrier}.
   */
  static fromEnv(
    env?: Readonly<Record<string, string | undefined>>,
    options: Omit<FaultScheduleOptions, "markerDir"> = {},
  ): FaultSchedule | null {
    const read = (key: string) => env === undefined ? Deno.env.get(key) : env[key];
    const text = read(FAULT_SCHEDULE_ENV);
    if (text === undefined || text === "") return null;
    let document: unknown;
    try {
      document = JSON.parse(text);
    } catch (error) {
      throw badSchedule(`not JSON (${(error as Error).message})`);
    }
    if (typeof document !== "object" || document === null) throw badSchedule("not an object");
    const { version, actions } = document as Record<string, unknown>;
    if (version !== FAULT_SCHEDULE_VERSION) {
      throw badSchedule(`unsupported version ${JSON.stringify(version)}`);
    }
    if (typeof actions !== "object" || actions === null || Array.isArray(actions)) {
      throw badSchedule("actions is not an object");
    }
    const parsed: Record<string, FaultAction> = {};
    for (const [name, action] of Object.entries(actions)) parsed[name] = actionFromJson(action);
    const markerDir = read(FAULT_MARKER_DIR_ENV);
    return new FaultSchedule(parsed, { ...options, markerDir: markerDir === "" ? null : markerDir });
  }

  /**
   * The environment a worker needs to install the same schedule: `VF_FAULT_SCHEDULE_JSON` and
   * `VF_FAULT_MARKER_DIR` (created here, so a child may start before this schedule is installed). A
   * schedule without a marker dir, or with an in-process RaiseError factory, is a {@link ConfigError}:
   * its hits in the worker could not be counted, or the action could not travel.
   */
  toEnv(): Record<string, string> {
    if (this.markerDir === null) {
      throw new ConfigError(
        "a fault schedule sent to another process needs a marker directory to count its hits",
        "construct the FaultSchedule with { markerDir: await Deno.makeTempDir() }",
      );
    }
    const actions: Record<string, unknown> = {};
    for (const [name, action] of this.actions) actions[name] = actionToJson(name, action);
    Deno.mkdirSync(this.markerDir, { recursive: true });
    return {
      [FAULT_SCHEDULE_ENV]: JSON.stringify({ version: FAULT_SCHEDULE_VERSION, actions }),
      [FAULT_MARKER_DIR_ENV]: this.markerDir,
    };
  }

  /** Makes this the schedule every `barrier()` consults; throws {@link ConfigError} if another is installed. */
  install(): this {
    if (active !== null && active !== this) {
      throw new ConfigError(
        "another fault schedule is already installed",
        "uninstall the previous schedule (or declare it with `using`) before installing the next",
      );
    }
    if (this.markerDir !== null) Deno.mkdirSync(this.markerDir, { recursive: true });
    active = this;
    return this;
  }

  /** Stops this schedule from applying; a no-op when it is not the installed one. */
  uninstall(): void {
    if (active === this) active = null;
  }

  /**
   * {@link uninstall}, then {@link assertAllFired}: a schedule declared with `using` makes its scope fail
   * with {@link InvalidTest} when a fault it scheduled never fired (a worker's {@link installFromEnv}
   * schedule is only uninstalled: its faults may fire in another process).
   */
  [Symbol.dispose](): void {
    this.uninstall();
    this.assertAllFired();
  }

  /**
   * Hit counts per scheduled barrier that was hit at least once: with a marker dir, the marker files of
   * every process sharing it (this one included); without one, this process's hits.
   */
  fired(): Record<string, number> {
    const counts: Record<string, number> = {};
    if (this.markerDir === null) {
      for (const [name, count] of this.#hits) counts[name] = count;
      return counts;
    }
    let entries: Iterable<Deno.DirEntry>;
    try {
      entries = Deno.readDirSync(this.markerDir);
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return counts;
      throw error;
    }
    for (const entry of entries) {
      const match = HIT_MARKER.exec(entry.name);
      if (match !== null && this.actions.has(match[1] as Barrier)) {
        counts[match[1]] = (counts[match[1]] ?? 0) + 1;
      }
    }
    return counts;
  }

  /** Scheduled barriers whose action never applied (an Nth(n) barrier hit fewer than n times), sorted. */
  unfired(): string[] {
    const counts = this.fired();
    return [...this.actions]
      .filter(([name, action]) => (counts[name] ?? 0) < (action.kind === "nth" ? action.n : 1))
      .map(([name]) => name)
      .sort();
  }

  /** Throws {@link InvalidTest} naming every barrier in {@link unfired}: a fault that never fired proves nothing. */
  assertAllFired(): void {
    const unfired = this.unfired();
    if (unfired.length > 0) {
      throw new InvalidTest(`scheduled faults never fired: ${unfired.join(", ")}`, unfired);
    }
  }

  /**
   * Resolves once `name` has been hit `times` times (counted as {@link fired} counts); throws
   * {@link InvalidTest} after `timeoutSeconds` of real time. How a test waits for a worker to reach a Pause.
   */
  async untilFired(name: Barrier, times = 1, timeoutSeconds = 10): Promise<void> {
    const deadline = performance.now() + timeoutSeconds * 1000;
    while ((this.fired()[name] ?? 0) < times) {
      if (performance.now() >= deadline) {
        throw new InvalidTest(`barrier ${name} was not hit ${times} time(s) within ${timeoutSeconds} s`, [
          name,
        ]);
      }
      await new Promise((resolve) => setTimeout(resolve, FIRED_POLL_MS));
    }
  }

  /**
   * Lets every Pause named `name` continue, now and in future hits, in this process and (through the
   * marker `<dir>/<name>.release`) in every process sharing the marker dir.
   */
  release(name: string): void {
    this.#released.add(name);
    if (this.markerDir !== null) {
      Deno.mkdirSync(this.markerDir, { recursive: true });
      Deno.writeFileSync(`${this.markerDir}/${name}.release`, new Uint8Array());
    }
    const waiters = this.#releaseWaiters.get(name);
    this.#releaseWaiters.delete(name);
    for (const wake of waiters ?? []) wake();
  }

  /**
   * Applies this schedule to one hit of `name` (what {@link barrier} delegates to): counts it, then runs
   * its action. Rejects with {@link UnknownBarrier} for a name outside {@link BARRIERS}.
   */
  async hit(name: Barrier, context: BarrierContext = NO_CONTEXT): Promise<Hit> {
    const action = this.#resolve(name, context);
    if (action === null) return NOT_FIRED;
    switch (action.kind) {
      case "delay":
        await this.#clock.sleep(action.seconds);
        return FIRED;
      case "pause":
        await this.#waitForRelease(action);
        return FIRED;
      default:
        return this.#applyNow(name, action);
    }
  }

  /**
   * {@link hit} for a call site that cannot await. A Delay or Pause scheduled on a barrier that is hit this
   * way is a {@link ConfigError} at the hit: nothing can wait synchronously.
   */
  hitSync(name: Barrier, context: BarrierContext = NO_CONTEXT): Hit {
    const action = this.#resolve(name, context);
    if (action === null) return NOT_FIRED;
    if (action.kind === "delay" || action.kind === "pause") {
      throw new ConfigError(
        `barrier ${name} is hit synchronously and cannot ${action.kind}`,
        "schedule Crash, RaiseError or DropResponse there, or make the call site await barrier()",
        { barrier: name },
      );
    }
    return this.#applyNow(name, action);
  }

  #applyNow(name: Barrier, action: Crash | RaiseError | DropResponse): Hit {
    switch (action.kind) {
      case "crash":
        return this.#onCrash(action.exitCode, name);
      case "raise":
        throw action.factory();
      case "drop_response":
        return DROPPED;
    }
  }

  /** Validates, counts (writing the marker first, so a Crash is still counted) and picks the action. */
  #resolve(name: Barrier, context: BarrierContext): SimpleAction | null {
    if (!BARRIERS.has(name)) throw unknownBarrier(name);
    const action = this.actions.get(name);
    if (action === undefined) return null;
    const ordinal = this.markerDir === null ? this.#countInProcess(name) : this.#claimMarker(name, context);
    if (action.kind !== "nth") return action;
    return ordinal === action.n ? action.action : null;
  }

  #countInProcess(name: Barrier): number {
    const ordinal = (this.#hits.get(name) ?? 0) + 1;
    this.#hits.set(name, ordinal);
    return ordinal;
  }

  /** Creates the first free `<name>#<n>.hit` exclusively; `n` is this hit's ordinal across processes. */
  #claimMarker(name: Barrier, context: BarrierContext): number {
    const body = new TextEncoder().encode(
      JSON.stringify(
        { barrier: name, pid: Deno.pid, context },
        (_key, value) => typeof value === "bigint" ? value.toString() : value,
      ),
    );
    for (let ordinal = this.#nextOrdinal.get(name) ?? 1;; ordinal++) {
      try {
        Deno.writeFileSync(`${this.markerDir}/${name}#${ordinal}.hit`, body, { createNew: true });
      } catch (error) {
        if (error instanceof Deno.errors.AlreadyExists) continue;
        throw error;
      }
      this.#nextOrdinal.set(name, ordinal + 1);
      return ordinal;
    }
  }

  #releaseMarkerExists(name: string): boolean {
    if (this.markerDir === null) return false;
    try {
      Deno.statSync(`${this.markerDir}/${name}.release`);
      return true;
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) return false;
      throw error;
    }
  }

  /** Resolves on release (in process or by marker file); rejects with {@link PauseTimeout} past its timeout. */
  #waitForRelease(action: Pause): Promise<void> {
    if (this.#released.has(action.name) || this.#releaseMarkerExists(action.name)) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const waiters = this.#releaseWaiters.get(action.name) ?? new Set<() => void>();
      this.#releaseWaiters.set(action.name, waiters);
      const finish = (error: PauseTimeout | null) => {
        clearTimeout(timeout);
        clearInterval(poll);
        waiters.delete(wake);
        if (error === null) resolve();
        else reject(error);
      };
      const wake = () => finish(null);
      waiters.add(wake);
      const timeout = setTimeout(() =>
        finish(
          new PauseTimeout(
            `pause ${action.name} was not released within ${action.timeoutSeconds} s`,
            "release it with FaultSchedule.release(name) once the interleaving is set up",
            { pause: action.name },
          ),
        ), action.timeoutSeconds * 1000);
      const poll = this.markerDir === null ? undefined : setInterval(() => {
        if (this.#releaseMarkerExists(action.name)) wake();
      }, PAUSE_POLL_MS);
    });
  }
}

/** The schedule every barrier consults, or `null` (production). */
export function installed(): FaultSchedule | null {
  return active;
}

/** Whether a schedule is installed: the guard for call sites that build a context only for the barrier. */
export function faultsInstalled(): boolean {
  return active !== null;
}

/**
 * The production-side call at a named point. With nothing installed: one variable read and a shared,
 * resolved promise of {@link NOT_FIRED}, nothing allocated. Otherwise {@link FaultSchedule.hit}. Call sites
 * check `.dropResponse` where the lost-receipt model applies and let RaiseError and Crash propagate.
 */
export function barrier(name: Barrier, context?: BarrierContext): Promise<Hit> {
  const schedule = active;
  return schedule === null ? NOT_FIRED_PROMISE : schedule.hit(name, context);
}

/** {@link barrier} for call sites that cannot await (no Delay or Pause there): {@link FaultSchedule.hitSync}. */
export function barrierSync(name: Barrier, context?: BarrierContext): Hit {
  const schedule = active;
  return schedule === null ? NOT_FIRED : schedule.hitSync(name, context);
}

/**
 * Installs the schedule the environment carries (what a worker does first), returning it, or `null` when
 * `VF_FAULT_SCHEDULE_JSON` is unset. `env` defaults to the process environment.
 */
export function installFromEnv(
  env?: Readonly<Record<string, string | undefined>>,
  options: Omit<FaultScheduleOptions, "markerDir"> = {},
): FaultSchedule | null {
  return FaultSchedule.fromEnv(env, options)?.install() ?? null;
}
