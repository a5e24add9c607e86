/**
 * The embedded broker's RPC protocol: how a node worker (a Deno Worker of the supervisor's process, or a
 * `deno run` subprocess) reaches the broker, payload store and run ledger the local engine's supervisor
 * hosts (`src/engines/embedded_broker.ts`). Both ends import this module; the client proxies are
 * `./messaging_backend.ts`, `./payload_store.ts` and `./runtime_store.ts`.
 *
 * One connection per worker carries all three services, over one of two links:
 * - a MessagePort ({@link portLink}): frames are structured-cloned; an ArrayBuffer named in a call's
 *   transfer list moves instead of being copied (the sender's buffer is detached);
 * - a TCP loopback socket ({@link socketLink}): each frame is a 4-byte big-endian length and the
 *   `node:v8` serialization of the frame (which keeps bigint, Uint8Array and Map), so bytes are always
 *   copied. The server listens on 127.0.0.1 and hands a subprocess {@link EMBEDDED_BROKER_ENV}
 *   (`tcp://127.0.0.1:PORT`) and {@link EMBEDDED_BROKER_SECRET_ENV}; the secret is checked in the hello,
 *   because any local process could connect.
 *
 * A frame is an array whose first element is its {@link Frame} kind:
 * ```
 * hello    [1, version, secret | null, label]                 client → server, first frame
 * welcome  [2, version]                                        server → client
 * refused  [3, wireError]                                      server → client, then the link closes
 * calls    [4, arena | null, op, id, args, op, id, args, ...]  client → server; id 0 expects no reply
 * results  [5, arena | null, id, ok, value, ...]               server → client; ok 0: value is a WireError
 * event    [6, name, value]                                    server → client (the flow-wide stop)
 * bye      [7, reason]                                         either way, then the link closes
 * ```
 *
 * Batching. Calls made within a few microtask turns of each other ({@link FLUSH_HOPS}) are coalesced into
 * one `calls` frame; a caller that awaits each call's reply before making the next pays a round trip per
 * call, so issue independent calls together (a publish resolves when its outcome arrives, and any number
 * may be outstanding). The server starts a frame's calls in order, so the synchronous effects of one call
 * happen before the next starts; a call that waits (a receive long-poll, a barrier pause) holds back none
 * of the calls after it, exactly as an in-process caller that does not await each call sees the same
 * backend. Results that settle within a few microtask turns of each other share one `results` frame.
 *
 * Small bytes. Structured cloning a Uint8Array, and allocating one, costs far more than a few bytes
 * themselves, so the bodies of publications and deliveries of at most {@link PACK_LIMIT} bytes are
 * copied into one arena per frame ({@link FrameArena}, at most {@link ARENA_LIMIT} bytes) and named by a
 * number; the receiver takes each as a view into that arena ({@link unpack}). So a small body kept (by
 * the broker, or by a receiver holding a delivery) keeps its frame's arena alive: at most 64 KiB each.
 * Larger bytes travel as their own Uint8Array.
 *
 * Large bytes. Over a MessagePort, bytes above {@link PACK_LIMIT} travel as a copy the sending thread
 * makes into an ArrayBuffer of their own and moves with the frame (transfer): the receiver owns them
 * outright, nothing aliases them, and the caller may reuse its array at once. So a publication's body is
 * copied by the publishing worker and kept as it arrives; a delivery's body is copied by the broker for
 * each receiver (it keeps its own for redelivery). Bytes are never put in a SharedArrayBuffer: one handed
 * across threads is freed only once every thread that saw it has collected it, and a thread with little
 * garbage of its own (the supervisor's) may not for a long time, so frames would pile up in memory. Over
 * TCP the socket copies everything.
 *
 * Identities. A channel or subscription id is sent once per connection (`defineChannel`,
 * `defineSubscription`) and named by a small integer handle afterwards; the server keeps one id object
 * per handle, so the broker's identity caches hit.
 *
 * Errors. A server-side exception is returned as its call's error, serialized with `errorToDict` and
 * rebuilt client-side as the same class ({@link errorFromWire}: by type name, then by code, then as the
 * nearest branch of the taxonomy keeping the code). A link that closes fails every call still waiting
 * with {@link BrokerUnavailable}, unless the call's {@link Reply} defines the truthful outcome of a lost
 * reply (an Unknown observation, a PublicationUnknown, a SettleUnknown).
 *
 * Time. Deadlines and timestamps cross the link unchanged: both ends must read one monotonic basis. In
 * production that is `SystemClock.monotonic()` (`performance.timeOrigin + performance.now()`, which lines
 * up across the threads and processes of one host); in-process tests share one FakeClock.
 *
 * @example
 * ```ts
 * const { port1, port2 } = new MessageChannel();
 * const link = portLink(port1);
 * link.start((frame) => console.log(frame[0] === Frame.hello), () => {});
 * portLink(port2).send([Frame.hello, EMBEDDED_PROTOCOL_VERSION, null, "demo"], []);
 * ```
 *
 * @module
 */

import { copyBytes, ENVELOPE_HEADROOM, ENVELOPE_TAILROOM, isGivenWhole } from "../core/bytes.ts";
import * as taxonomy from "../core/errors.ts";
import {
  BrokerUnavailable,
  ConfigError,
  Diagnostic,
  type DiagnosticRecord,
  type ErrorRecord,
  errorToDict,
  isDisposition,
  VideoflowError,
  VideoflowRuntimeError,
} from "../core/errors.ts";
import { UnobservableComposition } from "../backends/capabilities.ts";
import type { Barrier } from "../backends/faults.ts";
import {
  InjectedFault,
  InvalidTest,
  PauseTimeout,
  SimulatedCrash,
  UnknownBarrier,
} from "../backends/faults.ts";
import {
  type ChannelId,
  channelKey,
  completed,
  type Delivery,
  type DeliveryToken,
  type Envelope,
  type LeaseObservation,
  leaseObservation,
  MessageKind,
  type Settlement,
  type SettlementOutcome,
  type SubscriptionId,
  subscriptionKey,
} from "../backends/messaging.ts";
import {
  accepted,
  DURABILITY_MEMORY,
  type PublicationOutcome,
  publicationUnknown,
  publicationUnresolvable,
  rejected,
  settleConfirmed,
  settleStale,
  settleUnknown,
} from "../backends/outcomes.ts";
import { PayloadBudgetExceeded } from "../backends/payload.ts";

/** The protocol version a hello names; a server refuses any other. */
export const EMBEDDED_PROTOCOL_VERSION = 1;

/** The environment variable that tells a subprocess where the embedded broker listens (`tcp://HOST:PORT`). */
export const EMBEDDED_BROKER_ENV = "VF_EMBEDDED_BROKER";

/** The environment variable carrying the per-run secret a TCP client must present in its hello. */
export const EMBEDDED_BROKER_SECRET_ENV = "VF_EMBEDDED_BROKER_SECRET";

/** The largest frame a socket link accepts (a frame holds whole payloads): 1 GiB. */
export const MAX_SOCKET_FRAME_BYTES = 1 << 30;

/** The kind of a frame: its first element. */
export const Frame = {
  hello: 1,
  welcome: 2,
  refused: 3,
  calls: 4,
  results: 5,
  event: 6,
  bye: 7,
} as const;
/** One of {@link Frame}. */
export type Frame = typeof Frame[keyof typeof Frame];

/** Server-pushed events (`event` frames). */
export const EmbeddedEvent = {
  /** The run's flow-wide stop was committed on the broker's control channel. */
  controlStop: "control_stop",
} as const;
/** One of {@link EmbeddedEvent}. */
export type EmbeddedEvent = typeof EmbeddedEvent[keyof typeof EmbeddedEvent];

/**
 * Every operation a client may call, by service. The argument and result layouts are documented by the
 * codecs below (hot messaging calls) or are the contract's own records, structured-cloned (everything
 * else).
 */
export const Op = {
  /** `[handle, ChannelId]`, no reply: names a channel for the rest of the connection. */
  defineChannel: 1,
  /** `[handle, SubscriptionId]`, no reply. */
  defineSubscription: 2,
  messagingCapabilities: 10,
  ensureChannel: 11,
  ensureSubscription: 12,
  /** {@link EnvelopeWire} with its deadline; result {@link PublicationWire}. */
  publish: 13,
  /** {@link EnvelopeWire} without a deadline; result {@link PublicationWire}. */
  observePublication: 14,
  /**
   * A publish whose body the caller moved to the broker (see {@link EmbeddedConnection.movesGiven}):
   * {@link EnvelopeWire} with its deadline; result `[PublicationWire, body | null]`, the body a copy of
   * the one that came (that very body when it was rejected), handed back unless the publication was
   * accepted (the caller's own is gone). A call that fails with an error hands nothing back: its caller
   * does not send that envelope again.
   */
  publishMoved: 27,
  /** `[handle, itemCredit, byteCredit, deadline]`; result {@link DeliveriesWire}. */
  receive: 15,
  /** `[handles, itemCredit, byteCredit, deadline]`; result {@link DeliveriesWire}. */
  receiveAny: 16,
  /** {@link TokenWire}; result {@link LeaseWire}. */
  renew: 17,
  /** {@link encodeSettleCall}; result {@link SettleWire}. */
  settle: 18,
  /** {@link TokenWire}, no reply. */
  supersede: 19,
  observeSubscription: 20,
  observeChannel: 21,
  observeAckFloor: 22,
  /** No arguments, no reply: the server pushes {@link EmbeddedEvent.controlStop} when the stop commits. */
  subscribeControl: 23,
  /** No arguments, no reply: this connection's receives that complete from now on are handed back. */
  messagingShutdown: 24,
  closeChannels: 25,
  /** `[tokenId, ...]`, no reply: the client dropped these tokens, so the server forgets their broker tokens. */
  releaseTokens: 26,
  /**
   * `[deadline, EnvelopeWire, ...]` (each without its own deadline): a publish batch, taken in order as
   * that many publishes would be; result {@link PublicationBatchWire}.
   */
  publishBatch: 28,
  /** `[settle call, ...]` (each as {@link encodeSettleCall}); result {@link SettleBatchWire}. */
  settleBatch: 29,
  /** `[channelHandle, items, bytes, minBytes, deadline]`; result the `Observation<PublishCredit>` itself. */
  reserveCredit: 30,
  /** `[channelHandle]`, no reply: gives back this connection's credit on the channel. */
  releaseCredit: 31,
  payloadPut: 40,
  payloadRead: 41,
  payloadAcquire: 42,
  payloadRenew: 43,
  payloadRelease: 44,
  /** No arguments: every obligation id the store holds (null when its inventory is unreadable). */
  payloadObligationIds: 45,
  /** `[[key, ids][], authoritativeIds, operationId]`: reconcile against the client's ledger as read. */
  payloadReconcile: 46,
  payloadInventory: 47,
  payloadRefForKey: 48,
  payloadCapabilities: 49,
  storeGet: 60,
  storeCas: 61,
  storeDelete: 62,
  storeScan: 63,
  storeAppend: 64,
  storeLogEntries: 65,
  storeCapabilities: 66,
} as const;
/** One of {@link Op}. */
export type Op = typeof Op[keyof typeof Op];

// ---- links ------------------------------------------------------------------------------------------

/** A bidirectional frame pipe: one end of a connection. */
export interface FrameLink {
  /** `port` (structured clone, transfers honoured) or `tcp` (v8 serialization, always a copy). */
  readonly kind: "port" | "tcp";
  /** Starts delivering frames; `onClosed` runs once, when the link ends for any reason. */
  start(onFrame: (frame: unknown[]) => void, onClosed: (reason: string) => void): void;
  /**
   * Sends one frame; `transfer` lists buffers to move rather than copy (a socket copies them). Throws
   * when the frame cannot be serialized; a socket that fails later closes the link.
   */
  send(frame: unknown[], transfer: readonly ArrayBuffer[]): void;
  /** Ends the link (idempotent); resolves once its resources are released. */
  close(): Promise<void>;
}

/** A MessagePort as a {@link FrameLink}. A MessagePort reports no close: ends say `bye` before closing. */
export function portLink(port: MessagePort): FrameLink {
  let closed = false;
  let onClosedOnce: ((reason: string) => void) | null = null;
  return {
    kind: "port",
    start(onFrame, onClosed) {
      onClosedOnce = onClosed;
      port.onmessage = (event: MessageEvent) => onFrame(event.data as unknown[]);
      port.onmessageerror = () => {
        this.close();
        onClosed("a frame could not be deserialized");
      };
    },
    send(frame, transfer) {
      if (closed) return;
      port.postMessage(frame, transfer as ArrayBuffer[]);
    },
    close() {
      if (!closed) {
        closed = true;
        port.onmessage = null;
        port.onmessageerror = null;
        port.close();
        const notify = onClosedOnce;
        onClosedOnce = null;
        notify?.("the link was closed");
      }
      return Promise.resolve();
    },
  };
}

/** How long closing a socket link waits for its queued frames to be written. */
export const SOCKET_DRAIN_SECONDS = 1;

/**
 * A TCP connection as a {@link FrameLink}: length-prefixed `node:v8` frames, writes coalesced and sent at
 * once (no Nagle delay: a small call's frame written while an earlier one is unacknowledged would
 * otherwise wait for the peer's delayed ACK, tens of milliseconds per round trip).
 */
export function socketLink(conn: Deno.Conn): FrameLink {
  if ("setNoDelay" in conn) (conn as Deno.TcpConn).setNoDelay(true);
  return new SocketLink(conn);
}

class SocketLink implements FrameLink {
  readonly kind = "tcp";
  readonly #conn: Deno.Conn;
  #queued: Uint8Array[] = [];
  #writing: Promise<void> | null = null;
  #reading: Promise<void> = Promise.resolve();
  #closed = false;
  /** Set by close(): frames queued so far are still written, later ones are dropped. */
  #closing = false;
  #onClosed: ((reason: string) => void) | null = null;

  constructor(conn: Deno.Conn) {
    this.#conn = conn;
  }

  start(onFrame: (frame: unknown[]) => void, onClosed: (reason: string) => void): void {
    this.#onClosed = onClosed;
    this.#reading = this.#readLoop(onFrame);
  }

  send(frame: unknown[]): void {
    if (this.#closed || this.#closing) return;
    const body = v8().serialize(frame);
    const out = new Uint8Array(4 + body.byteLength);
    new DataView(out.buffer).setUint32(0, body.byteLength);
    out.set(body, 4);
    this.#queued.push(out);
    this.#writing ??= this.#writeLoop();
  }

  /** Writes what was queued (for at most {@link SOCKET_DRAIN_SECONDS}: a peer may have stopped reading), then closes. */
  async close(): Promise<void> {
    this.#closing = true;
    if (this.#writing !== null) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const drained = new Promise<void>((resolve) =>
        timer = setTimeout(resolve, SOCKET_DRAIN_SECONDS * 1000)
      );
      await Promise.race([this.#writing, drained]);
      clearTimeout(timer);
    }
    this.#shut("the link was closed");
    await this.#writing;
    await this.#reading;
  }

  #shut(reason: string): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#queued = [];
    try {
      this.#conn.close();
    } catch {
      // Already closed by the peer: nothing left to release.
    }
    const notify = this.#onClosed;
    this.#onClosed = null;
    notify?.(reason);
  }

  async #writeLoop(): Promise<void> {
    try {
      while (this.#queued.length > 0 && !this.#closed) {
        const chunks = this.#queued;
        this.#queued = [];
        const bytes = chunks.length === 1 ? chunks[0] : concat(chunks);
        for (let offset = 0; offset < bytes.byteLength;) {
          offset += await this.#conn.write(bytes.subarray(offset));
        }
      }
    } catch (error) {
      this.#shut(`the socket write failed: ${(error as Error).message}`);
    } finally {
      this.#writing = null;
    }
  }

  async #readLoop(onFrame: (frame: unknown[]) => void): Promise<void> {
    const scratch = new Uint8Array(64 * 1024);
    const header = new Uint8Array(4);
    let headerFill = 0;
    let body: Uint8Array | null = null;
    let bodyFill = 0;
    let reason = "the peer closed the socket";
    try {
      for (;;) {
        const n = await this.#conn.read(scratch);
        if (n === null) break;
        for (let at = 0; at < n;) {
          if (body === null) {
            const take = Math.min(4 - headerFill, n - at);
            header.set(scratch.subarray(at, at + take), headerFill);
            headerFill += take;
            at += take;
            if (headerFill < 4) continue;
            headerFill = 0;
            const length = new DataView(header.buffer).getUint32(0);
            if (length > MAX_SOCKET_FRAME_BYTES) {
              throw new Error(`a ${length}-byte frame exceeds ${MAX_SOCKET_FRAME_BYTES} bytes`);
            }
            body = new Uint8Array(length);
            bodyFill = 0;
          }
          const take = Math.min(body.byteLength - bodyFill, n - at);
          body.set(scratch.subarray(at, at + take), bodyFill);
          bodyFill += take;
          at += take;
          if (bodyFill < body.byteLength) continue;
          const frame = v8().deserialize(body);
          body = null;
          if (!Array.isArray(frame)) throw new Error("a frame is not an array");
          onFrame(frame);
          if (this.#closed) return;
        }
      }
    } catch (error) {
      if (!this.#closed) reason = `the socket read failed: ${(error as Error).message}`;
    }
    this.#shut(reason);
  }
}

function concat(chunks: readonly Uint8Array[]): Uint8Array {
  let total = 0;
  for (const chunk of chunks) total += chunk.byteLength;
  const out = new Uint8Array(total);
  let offset = 0;
  for (const chunk of chunks) {
    out.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return out;
}

/** Parses `tcp://HOST:PORT` (what {@link EMBEDDED_BROKER_ENV} holds); a ConfigError for anything else. */
export function parseBrokerAddress(address: string): { readonly hostname: string; readonly port: number } {
  const match = /^tcp:\/\/([^:/]+):(\d{1,5})$/.exec(address);
  const port = match === null ? NaN : Number(match[2]);
  if (match === null || port < 1 || port > 65535) {
    throw new ConfigError(
      `${JSON.stringify(address)} is not an embedded broker address`,
      `set ${EMBEDDED_BROKER_ENV} to tcp://127.0.0.1:PORT, as the local engine does`,
      { address },
    );
  }
  return { hostname: match[1], port };
}

/** Whether `presented` equals `expected`, compared in constant time. */
export function secretMatches(presented: unknown, expected: string): boolean {
  if (typeof presented !== "string") return false;
  const a = new TextEncoder().encode(presented);
  const b = new TextEncoder().encode(expected);
  if (a.byteLength !== b.byteLength) return false;
  let difference = 0;
  for (let i = 0; i < a.byteLength; i++) difference |= a[i] ^ b[i];
  return difference === 0;
}

/** `node:v8`, which only the socket link needs, loaded when a socket link is first used. */
function v8(): typeof import("node:v8") {
  return process.getBuiltinModule("node:v8");
}

// ---- errors -----------------------------------------------------------------------------------------

/** An error as it crosses the link: its `errorToDict` record and the fields its class needs to be rebuilt. */
export type WireError = readonly [record: ErrorRecord, extra: Readonly<Record<string, unknown>> | null];

/** Serializes a thrown value for the link (see {@link errorFromWire}). */
export function errorToWire(error: unknown): WireError {
  const record = errorToDict(error);
  if (error instanceof SimulatedCrash) return [record, { exit_code: error.exitCode, barrier: error.barrier }];
  if (error instanceof InvalidTest) return [record, { unfired: [...error.unfired] }];
  return [record, null];
}

// deno-lint-ignore no-explicit-any
type AnyErrorClass = new (...args: any[]) => Error;

/** Taxonomy classes by name, and by their own code (the first class that declares it). */
const CLASSES_BY_NAME = new Map<string, AnyErrorClass>();
const CLASSES_BY_CODE = new Map<string, AnyErrorClass>();
for (
  const value of [
    ...Object.values(taxonomy),
    UnobservableComposition,
    PayloadBudgetExceeded,
    UnknownBarrier,
    PauseTimeout,
  ]
) {
  if (typeof value !== "function" || !(value.prototype instanceof VideoflowError)) continue;
  const cls = value as unknown as AnyErrorClass & { readonly code: string };
  CLASSES_BY_NAME.set(cls.name, cls);
  if (Object.hasOwn(cls, "code") && !CLASSES_BY_CODE.has(cls.code)) CLASSES_BY_CODE.set(cls.code, cls);
}
const BUILTIN_ERRORS: Readonly<Record<string, new (message: string) => Error>> = {
  Error,
  TypeError,
  RangeError,
  SyntaxError,
  ReferenceError,
  URIError,
  EvalError,
};

function diagnosticsOf(record: ErrorRecord): Diagnostic[] {
  return (record.diagnostics ?? []).map((d: DiagnosticRecord) =>
    new Diagnostic(d.severity, d.code, d.node, d.message, d.remedy)
  );
}

function rebuildTaxonomy(cls: AnyErrorClass, record: ErrorRecord): VideoflowError {
  const remedy = record.remedy;
  const context = record.context ?? {};
  if (cls === taxonomy.GraphError || cls === taxonomy.IncompatibleProfile) {
    return new cls(record.message, remedy, diagnosticsOf(record), context) as VideoflowError;
  }
  if (cls === UnobservableComposition) {
    return new UnobservableComposition(record.message, remedy, diagnosticsOf(record));
  }
  return new cls(record.message, remedy, context) as VideoflowError;
}

/** The taxonomy branch an unregistered code falls back to, read from its disposition and exit code. */
function branchOf(record: ErrorRecord): AnyErrorClass {
  if (isDisposition(record.disposition)) return VideoflowRuntimeError;
  if (record.exit_code === taxonomy.EXIT_USER) return taxonomy.VideoflowUserError;
  if (record.exit_code === taxonomy.EXIT_ENVIRONMENT) return taxonomy.VideoflowEnvironmentError;
  return VideoflowError;
}

/**
 * Rebuilds what {@link errorToWire} sent: the same taxonomy class (by type name, else by code) with its
 * message, remedy, context, diagnostics and disposition; a code no class here declares becomes the nearest
 * branch of the taxonomy whose `code` reads the original; the fault harness's SimulatedCrash, InvalidTest
 * and InjectedFault, and JavaScript's built-in errors, come back as themselves.
 */
export function errorFromWire(wire: unknown): Error {
  if (!Array.isArray(wire) || typeof wire[0] !== "object" || wire[0] === null) {
    return new BrokerUnavailable("the embedded broker answered with a malformed error", null, {});
  }
  const record = wire[0] as ErrorRecord;
  const extra = (wire[1] ?? {}) as Record<string, unknown>;
  switch (record.type) {
    case "SimulatedCrash":
      return new SimulatedCrash(Number(extra.exit_code), String(extra.barrier) as Barrier);
    case "InvalidTest":
      return new InvalidTest(record.message, (extra.unfired as string[] | undefined) ?? []);
    case "InjectedFault":
      return new InjectedFault(record.code, record.message).withDisposition(
        isDisposition(record.disposition) ? record.disposition : taxonomy.TRANSIENT,
      );
  }
  const builtin = Object.hasOwn(BUILTIN_ERRORS, record.type) ? BUILTIN_ERRORS[record.type] : undefined;
  if (builtin !== undefined && record.code.startsWith("VF_EXC_")) return new builtin(record.message);
  const named = CLASSES_BY_NAME.get(record.type);
  const cls = named !== undefined && (named as unknown as { code: string }).code === record.code
    ? named
    : CLASSES_BY_CODE.get(record.code);
  const error = rebuildTaxonomy(cls ?? branchOf(record), record);
  if (error.code !== record.code) Object.defineProperty(error, "code", { value: record.code });
  if (error instanceof VideoflowRuntimeError && isDisposition(record.disposition)) {
    error.withDisposition(record.disposition);
  }
  return error;
}

/** The error every call gets once its connection is gone: BrokerUnavailable naming why. */
export function connectionLost(reason: string, label: string): BrokerUnavailable {
  return new BrokerUnavailable(
    `the connection to the embedded broker ended: ${reason}`,
    "the supervisor restarts this worker; if it keeps happening, check the supervisor's log",
    { connection: label, reason },
  );
}

// ---- packed bytes -----------------------------------------------------------------------------------

/** The largest byte array a frame packs into its arena; larger ones travel as themselves. */
export const PACK_LIMIT = 4096;
/** The most bytes one frame's arena holds; past it, arrays travel as themselves. */
export const ARENA_LIMIT = 64 * 1024;
/** A packed reference is `offset * PACK_STRIDE + length` (every length fits below the stride). */
const PACK_STRIDE = 8192;
const ARENA_START = 4 * 1024;

/** Whatever packs bytes into the frame being built: a {@link FrameArena}, or a connection's. */
export interface BytePacker {
  /** A number naming a copy of `bytes` in the frame's arena, or the bytes fit to travel alone. */
  pack(bytes: Uint8Array): number | Uint8Array;
}

/**
 * The packed bytes of one frame being built: {@link pack} copies small arrays in at call time (so a
 * caller that reuses its buffer afterwards changes nothing sent) and names them by a number.
 */
export class FrameArena implements BytePacker {
  #bytes: Uint8Array | null = null;
  #size = 0;

  /**
   * A number naming a copy of `bytes` in this arena, or, for large ones (or once the arena is full), the
   * array spanning its buffer, which the link copies when the frame leaves a few microtask turns later:
   * leave those unmodified until then.
   */
  pack(bytes: Uint8Array): number | Uint8Array {
    const length = bytes.byteLength;
    if (length > PACK_LIMIT || this.#size + length > ARENA_LIMIT) return exactBytes(bytes);
    let arena = this.#bytes;
    if (arena === null || this.#size + length > arena.byteLength) {
      const grown = new Uint8Array(Math.max(ARENA_START, 2 ** Math.ceil(Math.log2(this.#size + length))));
      if (arena !== null) grown.set(arena.subarray(0, this.#size));
      this.#bytes = arena = grown;
    }
    arena.set(bytes, this.#size);
    const reference = this.#size * PACK_STRIDE + length;
    this.#size += length;
    return reference;
  }

  /** The packed bytes (an array spanning its own buffer), or null when none; the arena starts empty again. */
  take(): Uint8Array | null {
    const arena = this.#bytes;
    const size = this.#size;
    this.#bytes = null;
    this.#size = 0;
    if (arena === null || size === 0) return null;
    return size === arena.byteLength ? arena : arena.slice(0, size);
  }
}

/** The most free bytes a carried array's buffer may hold beside it and be kept as it came. */
const ROOM = ENVELOPE_HEADROOM + ENVELOPE_TAILROOM;

/**
 * The bytes a packed field names: a view into `arena` (sharing its buffer with the frame's other small
 * byte arrays, at most {@link ARENA_LIMIT} bytes), or the array the field carries itself: as it came when
 * its buffer holds at most the room a frame's envelope is written in (it came moved, or cloned with its
 * buffer, so it is the receiver's alone), else an exact copy, so little is kept that is not its bytes.
 */
export function unpack(field: unknown, arena: Uint8Array | null): Uint8Array {
  if (field instanceof Uint8Array) {
    return field.byteLength >= field.buffer.byteLength - ROOM ? field : exactBytes(field);
  }
  if (typeof field !== "number" || arena === null) throw malformed("byte field");
  const length = field % PACK_STRIDE;
  const offset = (field - length) / PACK_STRIDE;
  if (offset + length > arena.byteLength) throw malformed("packed byte reference");
  return arena.subarray(offset, offset + length);
}

/**
 * A `calls` or `results` frame being built: its entries, the arena its small bytes are packed into, and
 * the buffers it moves. {@link take} hands out the finished frame and starts the next one.
 */
export class FrameBuilder implements BytePacker {
  readonly #kind: typeof Frame.calls | typeof Frame.results;
  #entries: unknown[];
  readonly #arena = new FrameArena();
  readonly #copy: boolean;
  readonly #move: boolean;
  #transfer: ArrayBuffer[] = [];
  #bytes = 0;

  /**
   * A frame of `kind` for a link of kind `link`. Bytes not packed into the arena (large ones, or any once
   * the arena is full): in a `calls` frame, a copy taken at call time, so a caller may reuse its array at
   * once; over a port, in a `results` frame too, and that copy is moved with the frame, so the receiver
   * owns it and nothing copies it again. In a `results` frame over TCP, the array itself, which the socket
   * copies when the frame leaves.
   */
  constructor(kind: typeof Frame.calls | typeof Frame.results, link: FrameLink["kind"]) {
    this.#kind = kind;
    this.#entries = [kind, null];
    this.#move = link === "port";
    this.#copy = this.#move || kind === Frame.calls;
  }

  /** Whether the frame holds no entry yet. */
  get empty(): boolean {
    return this.#entries.length === 2;
  }

  /** The bytes packed into or moved with the frame so far. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Whether the frame holds enough bytes ({@link FLUSH_BYTES}) to be sent now rather than grown. */
  get full(): boolean {
    return this.#bytes >= FLUSH_BYTES;
  }

  /** Appends one entry (three elements: op, id, args or id, ok, value). */
  add(first: unknown, second: unknown, third: unknown): void {
    this.#entries.push(first, second, third);
  }

  /** {@link FrameArena.pack} on this frame's arena; what the arena does not take, as the constructor says. */
  pack(bytes: Uint8Array): number | Uint8Array {
    this.#bytes += bytes.byteLength;
    const packed = this.#arena.pack(bytes);
    if (typeof packed === "number" || !this.#copy) return packed;
    const own = packed === bytes ? copyBytes(bytes) : packed;
    if (this.#move) this.#transfer.push(own.buffer as ArrayBuffer);
    return own;
  }

  /**
   * As {@link pack}, for bytes the caller gives up (it keeps no other view of them and never changes them):
   * large ones go as they are, never copied (a view of part of a buffer given up whole, `giveWhole`, with
   * the rest of its buffer); over a port they are moved, so the caller's array is detached once the frame
   * leaves. `whole`: the caller owns all of `bytes`' buffer (bytes that came moved and were kept as they
   * came, {@link unpack}), so a view of part of it goes with the rest of it too.
   */
  packGiven(bytes: Uint8Array, whole = false): number | Uint8Array {
    if (bytes.byteLength <= PACK_LIMIT) return this.pack(bytes);
    const own = whole || isGivenWhole(bytes.buffer) ? bytes : exactBytes(bytes);
    if (this.movesGiven(own)) this.move(own.buffer as ArrayBuffer);
    else this.#bytes += own.byteLength;
    return own;
  }

  /** Whether {@link packGiven} moves `bytes` away from the caller (over a port, those too large to pack). */
  movesGiven(bytes: Uint8Array): boolean {
    return this.#move && bytes.byteLength > PACK_LIMIT;
  }

  /** Moves `buffer` with this frame (once, however often it is named). */
  move(buffer: ArrayBuffer): void {
    if (this.#transfer.includes(buffer)) return;
    this.#transfer.push(buffer);
    this.#bytes += buffer.byteLength;
  }

  /**
   * The finished frame and the buffers to move with it (its arena too when `link` honours transfers);
   * the builder starts an empty frame.
   */
  take(link: FrameLink["kind"]): { readonly frame: unknown[]; readonly transfer: ArrayBuffer[] } {
    const frame = this.#entries;
    const transfer = this.#transfer;
    const arena = this.#arena.take();
    frame[1] = arena;
    if (arena !== null && link === "port") transfer.push(arena.buffer as ArrayBuffer);
    this.#entries = [this.#kind, null];
    this.#transfer = [];
    this.#bytes = 0;
    return { frame, transfer };
  }
}

// ---- coalescing -------------------------------------------------------------------------------------

/**
 * Microtask turns a frame being built waits, after its latest call (or result), for another before it is
 * sent: a node's loop that makes a call every few turns (publish, ack, publish ...) fills one frame until
 * it waits on a reply, and a lone call leaves within a few microseconds.
 */
export const FLUSH_HOPS = 16;
/**
 * The longest a frame keeps growing, in milliseconds from its first entry: past it a later entry no longer
 * holds the frame back, so a node whose work between calls is long (CPU-bound, with few microtask turns)
 * still sends each output within about this long.
 */
export const FLUSH_MAX_DELAY_MS = 1;
/** Bytes after which a frame is sent at once: a burst of frames never piles up in one message. */
export const FLUSH_BYTES = 8 * 1024 * 1024;

/**
 * Runs `send` once, {@link FLUSH_HOPS} microtask turns after the latest {@link schedule} since it last ran
 * (a schedule more than {@link FLUSH_MAX_DELAY_MS} after the first one no longer postpones it).
 */
export class DeferredFlush {
  readonly #send: () => void;
  readonly #now: () => number;
  #hopsLeft = 0;
  #armedAt = 0;
  readonly #hop = () => {
    if (this.#hopsLeft === 0) return;
    if (--this.#hopsLeft > 0) queueMicrotask(this.#hop);
    else this.#send();
  };

  /** `now` reads milliseconds on a monotonic clock (`performance.now()` unless a test fixes it). */
  constructor(send: () => void, now: () => number = () => performance.now()) {
    this.#send = send;
    this.#now = now;
  }

  /** Arranges for `send` to run a few microtask turns from now (later, if already arranged recently). */
  schedule(): void {
    if (this.#hopsLeft === 0) {
      this.#hopsLeft = FLUSH_HOPS;
      this.#armedAt = this.#now();
      queueMicrotask(this.#hop);
    } else if (this.#now() - this.#armedAt < FLUSH_MAX_DELAY_MS) {
      this.#hopsLeft = FLUSH_HOPS;
    }
  }

  /** Forgets an arranged run (the caller is sending now). */
  cancel(): void {
    this.#hopsLeft = 0;
  }
}

// ---- id tables --------------------------------------------------------------------------------------

/** How many ids an {@link IdTable} keeps in its window before the oldest unfinished one moves aside. */
const ID_WINDOW = 4096;

/**
 * Values keyed by ids handed out in increasing order (calls waiting for a reply, tokens the server
 * keeps): most are removed soon and roughly in order, so recent ids live in an array window and cost no
 * hashing; an id still present once {@link ID_WINDOW} newer ones were added moves to a Map.
 */
export class IdTable<T> {
  #window: (T | undefined)[] = [];
  /** Index in `#window` of the id `#base`. */
  #head = 0;
  /** The id at `#window[#head]`; ids below it are in `#stragglers` or gone. */
  #base = 1;
  readonly #stragglers = new Map<number, T>();

  /** Adds `value` under `id`, which must be above every id added before. */
  add(id: number, value: T): void {
    if (this.#window.length === this.#head) this.#base = id;
    else {
      for (let next = this.#base + this.#window.length - this.#head; next < id; next++) {
        this.#window.push(undefined);
      }
    }
    this.#window.push(value);
    if (this.#window.length - this.#head > ID_WINDOW) this.#evictOldest();
  }

  /** The value under `id`, if present. */
  get(id: number): T | undefined {
    const at = id - this.#base;
    return at >= 0 ? this.#window[this.#head + at] : this.#stragglers.get(id);
  }

  /** Removes and returns the value under `id`, if present. */
  take(id: number): T | undefined {
    const at = id - this.#base;
    if (at < 0) {
      const value = this.#stragglers.get(id);
      this.#stragglers.delete(id);
      return value;
    }
    const index = this.#head + at;
    const value = this.#window[index];
    if (value === undefined) return undefined;
    this.#window[index] = undefined;
    if (at === 0) this.#advance();
    return value;
  }

  /** Every value, oldest id first; the table is left empty. */
  drain(): T[] {
    const values = [...this.#stragglers.values()];
    for (let i = this.#head; i < this.#window.length; i++) {
      const value = this.#window[i];
      if (value !== undefined) values.push(value);
    }
    this.#stragglers.clear();
    this.#window = [];
    this.#head = 0;
    return values;
  }

  #advance(): void {
    const window = this.#window;
    while (this.#head < window.length && window[this.#head] === undefined) {
      this.#head++;
      this.#base++;
    }
    if (this.#head === window.length) {
      this.#window = [];
      this.#head = 0;
    } else if (this.#head > 1024 && this.#head * 2 > window.length) {
      this.#window = window.slice(this.#head);
      this.#head = 0;
    }
  }

  #evictOldest(): void {
    const oldest = this.#window[this.#head] as T;
    this.#stragglers.set(this.#base, oldest);
    this.#window[this.#head] = undefined;
    this.#advance();
  }
}

// ---- the client end ---------------------------------------------------------------------------------

/** How a caller turns a call's reply into its result. */
export interface Reply<C, T> {
  /** The result for the server's value (`arena`: its frame's packed bytes); may throw a typed error. */
  readonly decode: (value: unknown, context: C, arena: Uint8Array | null) => T;
  /**
   * The result when the connection ended first: `sent` says whether the call had left this end (its
   * effect may then have happened). Throws to reject the call.
   */
  readonly lost: (context: C, sent: boolean, error: BrokerUnavailable) => T;
}

/** The `lost` of a reply with no truthful outcome for a lost connection: rethrows its BrokerUnavailable. */
export function raiseLost(_context: unknown, _sent: boolean, error: BrokerUnavailable): never {
  throw error;
}

function asIs<T>(value: unknown): T {
  return value as T;
}

/** A reply whose value is the result as it came, and whose loss rejects with BrokerUnavailable. */
export const PLAIN_REPLY: Reply<unknown, unknown> = Object.freeze({ decode: asIs, lost: raiseLost });

/** A reply whose value is a structured-cloned record, frozen deeply; its loss rejects with BrokerUnavailable. */
export const FROZEN_REPLY: Reply<unknown, unknown> = Object.freeze({
  decode: (value: unknown) => deepFreeze(value),
  lost: raiseLost,
});

/** Freezes `value` and everything it holds (byte arrays excepted, which cannot be frozen); returns it. */
export function deepFreeze<T>(value: T): T {
  if (typeof value !== "object" || value === null || ArrayBuffer.isView(value) || Object.isFrozen(value)) {
    return value;
  }
  for (const key of Object.keys(value)) deepFreeze((value as Record<string, unknown>)[key]);
  return Object.freeze(value);
}

interface Pending {
  readonly id: number;
  readonly resolve: (value: unknown) => void;
  readonly reject: (error: unknown) => void;
  readonly context: unknown;
  readonly reply: Reply<unknown, unknown>;
}

/** How to open an {@link EmbeddedConnection}. */
export interface ConnectOptions {
  /** The per-run secret; required by a TCP server, ignored on a MessagePort. */
  readonly secret?: string | null;
  /** Names this end in the server's connection list and in errors (the worker's name). */
  readonly label?: string;
  /** How long to wait for the server's welcome, in seconds (default {@link DEFAULT_CONNECT_TIMEOUT_SECONDS}). */
  readonly timeoutSeconds?: number;
}

/** How long {@link EmbeddedConnection.connect} waits for the server's welcome by default (seconds). */
export const DEFAULT_CONNECT_TIMEOUT_SECONDS = 10;

/**
 * The client end of one connection to the embedded broker: multiplexes calls of every service over one
 * link, coalescing the calls of one turn into one frame. Created by {@link EmbeddedConnection.connect};
 * the service proxies take it as their first constructor argument.
 */
export class EmbeddedConnection implements BytePacker {
  readonly label: string;
  readonly #link: FrameLink;
  readonly #pending = new IdTable<Pending>();
  readonly #events = new Map<string, ((value: unknown) => void)[]>();
  readonly #channelHandles = new WeakMap<ChannelId, number>();
  readonly #channelKeys = new Map<string, number>();
  #channelCount = 0;
  readonly #subscriptionHandles = new WeakMap<SubscriptionId, number>();
  readonly #subscriptionKeys = new Map<string, number>();
  readonly #subscriptions: SubscriptionId[] = [];
  readonly #outbox: FrameBuilder;
  readonly #flusher = new DeferredFlush(() => this.#flushNow());
  #nextId = 1;
  /** Every call with an id at or below this one has left this end. */
  #sentThrough = 0;
  #lost: BrokerUnavailable | null = null;
  #welcome: PromiseWithResolvers<void> | null = Promise.withResolvers<void>();

  private constructor(link: FrameLink, label: string) {
    this.#link = link;
    this.label = label;
    this.#outbox = new FrameBuilder(Frame.calls, link.kind);
  }

  /**
   * Opens a connection over `target`: a MessagePort the supervisor handed this worker, or a
   * `tcp://HOST:PORT` address. Resolves once the server welcomed it; rejects with BrokerUnavailable when
   * it cannot connect, the server refused it (a wrong secret or protocol version), or no welcome came in
   * time (a port nobody serves).
   */
  static async connect(
    target: MessagePort | string,
    options: ConnectOptions = {},
  ): Promise<EmbeddedConnection> {
    const label = options.label ?? `worker-${Deno.pid}`;
    let link: FrameLink;
    if (typeof target === "string") {
      const { hostname, port } = parseBrokerAddress(target);
      try {
        link = socketLink(await Deno.connect({ hostname, port, transport: "tcp" }));
      } catch (error) {
        throw new BrokerUnavailable(
          `cannot reach the embedded broker at ${target}: ${(error as Error).message}`,
          "the supervisor that started this process is gone, or the address is stale",
          { address: target },
        );
      }
    } else {
      link = portLink(target);
    }
    const connection = new EmbeddedConnection(link, label);
    link.start((frame) => connection.#receive(frame), (reason) => connection.#end(reason));
    link.send([Frame.hello, EMBEDDED_PROTOCOL_VERSION, options.secret ?? null, label], []);
    const seconds = options.timeoutSeconds ?? DEFAULT_CONNECT_TIMEOUT_SECONDS;
    const timer = setTimeout(() => {
      connection.#end(`no welcome from the broker within ${seconds} s`);
      link.close();
    }, seconds * 1000);
    try {
      await connection.#welcome?.promise;
    } finally {
      clearTimeout(timer);
    }
    return connection;
  }

  /**
   * Connects to the broker named by {@link EMBEDDED_BROKER_ENV} and {@link EMBEDDED_BROKER_SECRET_ENV}
   * in `env` (the process environment by default, read variable by variable, so
   * `--allow-env=VF_EMBEDDED_BROKER,VF_EMBEDDED_BROKER_SECRET` and `--allow-net=127.0.0.1` suffice); a
   * ConfigError when the address is unset.
   */
  static fromEnv(
    env?: Readonly<Record<string, string | undefined>>,
    label?: string,
  ): Promise<EmbeddedConnection> {
    const read = (key: string) => env === undefined ? Deno.env.get(key) : env[key];
    const address = read(EMBEDDED_BROKER_ENV);
    if (address === undefined || address === "") {
      return Promise.reject(
        new ConfigError(
          `${EMBEDDED_BROKER_ENV} is not set`,
          "start this worker through the local engine, which sets the broker's address and secret",
        ),
      );
    }
    return EmbeddedConnection.connect(address, { secret: read(EMBEDDED_BROKER_SECRET_ENV) ?? null, label });
  }

  /** The link's kind: `port` or `tcp`. */
  get transport(): "port" | "tcp" {
    return this.#link.kind;
  }

  /** Why the connection ended, or null while it is open. */
  get lostReason(): BrokerUnavailable | null {
    return this.#lost;
  }

  /**
   * Calls `op` with `args`; `reply` turns the answer (or the loss of the connection) into the result,
   * given `context`. `transfer` lists buffers to move with the frame (the caller's views are detached
   * once the frame leaves, at the end of this turn). A call made after the connection ended is decided
   * by `reply.lost` with `sent` false.
   */
  call<C, T>(op: Op, args: unknown[], context: C, reply: Reply<C, T>, transfer?: ArrayBuffer): Promise<T> {
    if (this.#lost !== null) return this.#decideLost(reply, context, false, this.#lost);
    const id = this.#nextId++;
    const { promise, resolve, reject } = Promise.withResolvers<T>();
    this.#pending.add(id, {
      id,
      resolve: resolve as (value: unknown) => void,
      reject,
      context,
      reply: reply as Reply<unknown, unknown>,
    });
    this.#outbox.add(op, id, args);
    if (transfer !== undefined) this.#outbox.move(transfer);
    this.#queueFlush();
    return promise;
  }

  /**
   * Packs `bytes` into the frame being built (see {@link FrameBuilder.pack}; over a MessagePort large bytes
   * are a moved copy); the number or array returned is valid in the arguments of a call made in this same
   * turn.
   */
  pack(bytes: Uint8Array): number | Uint8Array {
    return this.#outbox.pack(bytes);
  }

  /** Packs bytes the caller gives up into the frame being built, as {@link FrameBuilder.packGiven}. */
  readonly giver: BytePacker = { pack: (bytes) => this.#outbox.packGiven(bytes) };

  /** Whether {@link giver} moves `bytes` away from the caller, as {@link FrameBuilder.movesGiven}. */
  movesGiven(bytes: Uint8Array): boolean {
    return this.#outbox.movesGiven(bytes);
  }

  /** Sends `op` with `args` expecting no reply (identity definitions, supersede); dropped once closed. */
  send(op: Op, args: unknown[]): void {
    if (this.#lost !== null) return;
    this.#outbox.add(op, 0, args);
    this.#queueFlush();
  }

  /** The handle naming `channel` on this connection, defined on first use. */
  channelHandle(channel: ChannelId): number {
    const cached = this.#channelHandles.get(channel);
    if (cached !== undefined) return cached;
    const key = channelKey(channel);
    let handle = this.#channelKeys.get(key);
    if (handle === undefined) {
      handle = this.#channelCount++;
      this.#channelKeys.set(key, handle);
      this.send(Op.defineChannel, [handle, channel]);
    }
    this.#channelHandles.set(channel, handle);
    return handle;
  }

  /** The handle naming `subscription` on this connection, defined on first use. */
  subscriptionHandle(subscription: SubscriptionId): number {
    const cached = this.#subscriptionHandles.get(subscription);
    if (cached !== undefined) return cached;
    const key = subscriptionKey(subscription);
    let handle = this.#subscriptionKeys.get(key);
    if (handle === undefined) {
      handle = this.#subscriptions.length;
      this.#subscriptions.push(subscription);
      this.#subscriptionKeys.set(key, handle);
      this.send(Op.defineSubscription, [handle, subscription]);
    }
    this.#subscriptionHandles.set(subscription, handle);
    return handle;
  }

  /** The subscription a handle names (the id object first defined for it); a ConfigError for a stranger. */
  subscriptionOf(handle: number): SubscriptionId {
    const subscription = this.#subscriptions[handle];
    if (subscription === undefined) throw malformed("subscription handle");
    return subscription;
  }

  /** Registers `handler` for a server-pushed event. */
  onEvent(name: EmbeddedEvent, handler: (value: unknown) => void): void {
    const handlers = this.#events.get(name) ?? [];
    handlers.push(handler);
    this.#events.set(name, handlers);
  }

  /**
   * Closes the connection: queued calls are sent, the server is told (`bye`), and every call still
   * waiting is decided by its reply's `lost`. Idempotent.
   */
  async close(): Promise<void> {
    if (this.#lost === null) {
      this.#flushNow();
      try {
        this.#link.send([Frame.bye, `closed by ${this.label}`], []);
      } catch {
        // The link is already unusable: closing it is all that is left.
      }
      this.#end("the client closed it");
    }
    await this.#link.close();
  }

  #queueFlush(): void {
    if (this.#outbox.full) this.#flushNow();
    else this.#flusher.schedule();
  }

  #flushNow(): void {
    this.#flusher.cancel();
    if (this.#outbox.empty || this.#lost !== null) return;
    const { frame, transfer } = this.#outbox.take(this.#link.kind);
    this.#sentThrough = this.#nextId - 1;
    try {
      this.#link.send(frame, transfer);
    } catch (error) {
      this.#refuseFrame(frame, error);
    }
  }

  /** A frame that could not be serialized: each of its calls fails with the reason, nothing was sent. */
  #refuseFrame(frame: unknown[], error: unknown): void {
    const refusal = new ConfigError(
      `a call to the embedded broker could not be serialized: ${(error as Error).message}`,
      "pass only structured-cloneable values (no functions, no detached buffers)",
    );
    for (let i = 2; i < frame.length; i += 3) {
      const id = frame[i + 1] as number;
      const pending = this.#pending.take(id);
      if (pending === undefined) continue;
      pending.reject(refusal);
    }
  }

  #receive(frame: unknown[]): void {
    switch (frame[0]) {
      case Frame.results: {
        const arena = frame[1] as Uint8Array | null;
        for (let i = 2; i < frame.length; i += 3) {
          this.#settle(frame[i] as number, frame[i + 1], frame[i + 2], arena);
        }
        return;
      }
      case Frame.welcome:
        this.#welcome?.resolve();
        this.#welcome = null;
        return;
      case Frame.event:
        for (const handler of this.#events.get(frame[1] as string) ?? []) handler(frame[2]);
        return;
      case Frame.refused: {
        const error = errorFromWire(frame[1]);
        this.#end(error.message, error);
        this.#link.close();
        return;
      }
      case Frame.bye:
        this.#end(`the broker closed it (${String(frame[1])})`);
        this.#link.close();
        return;
      default:
        this.#end(`the broker sent a frame of unknown kind ${String(frame[0])}`);
        this.#link.close();
    }
  }

  #settle(id: number, ok: unknown, value: unknown, arena: Uint8Array | null): void {
    const pending = this.#pending.take(id);
    if (pending === undefined) return;
    if (ok !== 1) {
      pending.reject(errorFromWire(value));
      return;
    }
    try {
      pending.resolve(pending.reply.decode(value, pending.context, arena));
    } catch (error) {
      pending.reject(error);
    }
  }

  #decideLost<C, T>(reply: Reply<C, T>, context: C, sent: boolean, error: BrokerUnavailable): Promise<T> {
    try {
      return Promise.resolve(reply.lost(context, sent, error));
    } catch (thrown) {
      return Promise.reject(thrown);
    }
  }

  #end(reason: string, cause?: Error): void {
    if (this.#lost !== null) return;
    const error = cause instanceof BrokerUnavailable ? cause : connectionLost(reason, this.label);
    this.#lost = error;
    this.#outbox.take(this.#link.kind);
    for (const call of this.#pending.drain()) {
      this.#decideLost(call.reply, call.context, call.id <= this.#sentThrough, error).then(
        call.resolve,
        call.reject,
      );
    }
    if (this.#welcome !== null) {
      this.#welcome.reject(cause ?? error);
      this.#welcome = null;
    }
  }
}

// ---- messaging codecs -------------------------------------------------------------------------------

const KINDS = [MessageKind.data, MessageKind.eos, MessageKind.dlq] as const;
const EMPTY_HEADERS: Readonly<Record<string, string>> = Object.freeze({});
const NO_REFS: Envelope["payloadRefs"] = Object.freeze([]);

function kindCode(kind: MessageKind): number {
  return kind === MessageKind.data ? 0 : kind === MessageKind.eos ? 1 : 2;
}

function hasKeys(record: Readonly<Record<string, unknown>>): boolean {
  for (const _ in record) return true;
  return false;
}

/**
 * Bytes fit to cross the link: the array itself when it spans its whole buffer, else a copy of just its
 * bytes (a view would otherwise take its entire underlying buffer along).
 */
export function exactBytes(bytes: Uint8Array): Uint8Array {
  return spansBuffer(bytes) ? bytes : copyBytes(bytes);
}

/** Whether `bytes` span their whole underlying buffer. */
export function spansBuffer(bytes: Uint8Array): boolean {
  return bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength;
}

/**
 * An envelope on the wire: `[channelHandle, publicationId, body (packed), size, schemaVersion, kindCode,
 * deadline (a publish's; null for an observation)]`, followed, only when any of them is set, by
 * `[eventId | null (same as the publication id), headers | null (none), partitionKey, eventTs,
 * sourceEpoch, sourceOffset, payloadRefs | null (none)]`.
 */
export type EnvelopeWire = unknown[];

/** Elements of an {@link EnvelopeWire} without its optional part. */
const ENVELOPE_REQUIRED = 7;

/**
 * Encodes `envelope` with `body` (its own by default) for the channel handle; the body goes through
 * `arena`: {@link FrameBuilder.pack} packs small ones and copies large ones now, so the envelope's own
 * array is never transferred; a connection's {@link EmbeddedConnection.giver} moves large ones.
 */
export function encodeEnvelope(
  envelope: Envelope,
  channelHandle: number,
  arena: BytePacker,
  deadline: number | null,
  body: Uint8Array = envelope.body,
): EnvelopeWire {
  const wire: unknown[] = [
    channelHandle,
    envelope.publicationId,
    arena.pack(body),
    envelope.size,
    envelope.schemaVersion,
    kindCode(envelope.kind),
    deadline,
  ];
  const headers = hasKeys(envelope.headers) ? envelope.headers : null;
  const refs = envelope.payloadRefs.length === 0 ? null : envelope.payloadRefs;
  const eventId = envelope.eventId === envelope.publicationId ? null : envelope.eventId;
  if (
    eventId !== null || headers !== null || refs !== null || envelope.partitionKey !== null ||
    envelope.eventTs !== null || envelope.sourceEpoch !== null || envelope.sourceOffset !== null
  ) {
    wire.push(
      eventId,
      headers,
      envelope.partitionKey,
      envelope.eventTs,
      envelope.sourceEpoch,
      envelope.sourceOffset,
      refs,
    );
  }
  return wire;
}

/** The deadline an {@link EnvelopeWire} carries. */
export function envelopeDeadline(wire: EnvelopeWire): number {
  return wire[6] as number;
}

function malformed(what: string): ConfigError {
  return new ConfigError(
    `a malformed ${what} reached the embedded broker`,
    "use the embedded client of the same videoflow version",
  );
}

/** Decodes an {@link EnvelopeWire} on `channel` (the object the handle names); `arena` is its frame's. */
export function decodeEnvelope(wire: EnvelopeWire, channel: ChannelId, arena: Uint8Array | null): Envelope {
  const publicationId = wire[1];
  if (typeof publicationId !== "string" || typeof wire[3] !== "number") throw malformed("envelope");
  const kind = KINDS[wire[5] as number];
  if (kind === undefined) throw malformed("envelope kind");
  const full = wire.length > ENVELOPE_REQUIRED;
  return {
    channel,
    publicationId,
    headers: (full ? wire[8] ?? EMPTY_HEADERS : EMPTY_HEADERS) as Envelope["headers"],
    body: unpack(wire[2], arena),
    size: wire[3],
    eventId: (full ? wire[7] ?? publicationId : publicationId) as string,
    partitionKey: (full ? wire[9] : null) as string | null,
    eventTs: (full ? wire[10] : null) as number | null,
    sourceEpoch: (full ? wire[11] : null) as string | null,
    sourceOffset: (full ? wire[12] : null) as number | null,
    schemaVersion: wire[4] as number,
    payloadRefs: (full ? wire[13] ?? NO_REFS : NO_REFS) as Envelope["payloadRefs"],
    kind,
    bodyTransferable: false,
  };
}

/**
 * A publication outcome on the wire: the sequence alone for the common case (accepted, not a duplicate,
 * memory durability), else `[0, sequence, duplicate, boundary]`, `[1, reason, retryable]`, `[2, reason]`
 * (unknown) or `[3, reason]` (unresolvable).
 */
export type PublicationWire = number | readonly unknown[];

/** Encodes a publication outcome (its publication id stays with the caller). */
export function encodePublication(outcome: PublicationOutcome): PublicationWire {
  switch (outcome.kind) {
    case "accepted":
      return !outcome.duplicate && outcome.durabilityBoundary === DURABILITY_MEMORY &&
          outcome.sequence !== null
        ? outcome.sequence
        : [0, outcome.sequence, outcome.duplicate, outcome.durabilityBoundary];
    case "rejected":
      return [1, outcome.reason, outcome.retryable];
    case "publication_unknown":
      return [2, outcome.reason];
    case "publication_unresolvable":
      return [3, outcome.reason];
  }
}

/** Decodes a {@link PublicationWire} for `publicationId`. */
export function decodePublication(wire: unknown, publicationId: string): PublicationOutcome {
  if (typeof wire === "number") return accepted(publicationId, wire, false, DURABILITY_MEMORY);
  const fields = wire as readonly unknown[];
  switch (fields[0]) {
    case 0:
      return accepted(publicationId, fields[1] as number | null, fields[2] as boolean, fields[3] as string);
    case 1:
      return rejected(publicationId, fields[1] as string, fields[2] as boolean);
    case 2:
      return publicationUnknown(publicationId, fields[1] as string);
    case 3:
      return publicationUnresolvable(publicationId, fields[1] as string);
    default:
      throw malformed("publication outcome");
  }
}

/**
 * A publish batch's outcomes on the wire: the first entry's sequence alone when every entry was accepted
 * as new at memory durability with consecutive sequences from it (the common case, one number for the
 * whole batch), else one {@link PublicationWire} per entry.
 */
export type PublicationBatchWire = number | readonly PublicationWire[];

/** Encodes a publish batch's outcomes, in entry order. */
export function encodePublicationBatch(outcomes: readonly PublicationOutcome[]): PublicationBatchWire {
  const first = outcomes.length === 0 ? null : outcomes[0];
  let plain = first !== null && first.kind === "accepted" && first.sequence !== null;
  for (let i = 0; plain && i < outcomes.length; i++) {
    const outcome = outcomes[i];
    plain = outcome.kind === "accepted" && !outcome.duplicate &&
      outcome.durabilityBoundary === DURABILITY_MEMORY &&
      outcome.sequence === (first as { sequence: number }).sequence + i;
  }
  if (plain) return (first as { sequence: number }).sequence;
  return outcomes.map(encodePublication);
}

/** Decodes a {@link PublicationBatchWire} for the entries' `publicationIds`, in order. */
export function decodePublicationBatch(
  wire: unknown,
  publicationIds: readonly string[],
): PublicationOutcome[] {
  if (typeof wire === "number") {
    return publicationIds.map((id, i) => accepted(id, wire + i, false, DURABILITY_MEMORY));
  }
  if (!Array.isArray(wire) || wire.length !== publicationIds.length) throw malformed("publication batch");
  return publicationIds.map((id, i) => decodePublication(wire[i], id));
}

/**
 * A {@link Op.publishMoved} result: the outcome, and with any outcome but accepted the publication's body
 * (packed) for the caller's retry, since its own went to the broker.
 */
export type MovedPublicationWire = readonly [outcome: PublicationWire, body: number | Uint8Array | null];

/**
 * Encodes a moved publish's outcome into `results`, with `body` (what came) for any outcome but accepted:
 * a rejected publication was not stored, so its body goes back as it came (moved, never copied); after
 * an unknown or unresolvable outcome the broker may hold it, so a copy goes back.
 */
export function encodeMovedPublication(
  outcome: PublicationOutcome,
  body: Uint8Array,
  results: FrameBuilder,
): MovedPublicationWire {
  switch (outcome.kind) {
    case "accepted":
      return [encodePublication(outcome), null];
    case "rejected":
      return [encodePublication(outcome), results.packGiven(body, true)];
    default:
      return [encodePublication(outcome), results.pack(body)];
  }
}

/** Decodes a {@link MovedPublicationWire} for `publicationId` whose frame carried `arena`. */
export function decodeMovedPublication(
  wire: unknown,
  publicationId: string,
  arena: Uint8Array | null,
): { readonly outcome: PublicationOutcome; readonly body: Uint8Array | null } {
  if (!Array.isArray(wire) || wire.length !== 2) throw malformed("moved publication outcome");
  const outcome = decodePublication(wire[0], publicationId);
  const body = wire[1] === null ? null : unpack(wire[1], arena);
  if ((body === null) !== (outcome.kind === "accepted")) throw malformed("moved publication outcome");
  return { outcome, body };
}

/**
 * A delivery token on the wire: `[tokenId, subscriptionHandle, messageId, streamSequence, attempt,
 * generation]`. `tokenId` names the broker's own token object for a delivery the server handed out on
 * this connection (0 for a token it did not), so the broker decides its staleness exactly as for an
 * in-process caller; the other fields identify it when the server no longer keeps that object.
 */
export type TokenWire = unknown[];

/** Encodes `token` for its subscription handle and server-side token id (0: none). */
export function encodeToken(token: DeliveryToken, tokenId: number, subscriptionHandle: number): TokenWire {
  return [
    tokenId,
    subscriptionHandle,
    token.messageId,
    token.streamSequence,
    token.attempt,
    token.generation,
  ];
}

/** Decodes the fields of a {@link TokenWire} into a plain token on `subscription` (the object the handle names). */
export function decodeToken(wire: readonly unknown[], subscription: SubscriptionId): DeliveryToken {
  if (typeof wire[2] !== "string" || typeof wire[4] !== "number" || typeof wire[5] !== "string") {
    throw malformed("delivery token");
  }
  return {
    subscription,
    messageId: wire[2],
    streamSequence: wire[3] as number | null,
    attempt: wire[4],
    generation: wire[5],
  };
}

/** How many elements a {@link TokenWire} has: a settle call's settlement fields follow them. */
export const TOKEN_FIELDS = 6;

/**
 * A settle call: `[tokenId, code, argument, settlementId]` for a token whose broker token the server
 * still keeps, else `[...TokenWire, code, argument, settlementId]`. Codes: 0 Completed, 1 Retry (argument:
 * its delay), 2 Terminal (argument: its record reference).
 */
export function encodeSettleCall(
  token: DeliveryToken,
  tokenId: number,
  subscriptionHandle: number | null,
  outcome: Settlement,
  settlementId: string,
): unknown[] {
  const code = outcome.kind === "completed" ? 0 : outcome.kind === "retry" ? 1 : 2;
  const argument = outcome.kind === "retry"
    ? outcome.delaySeconds
    : outcome.kind === "terminal"
    ? outcome.recordRef
    : null;
  if (subscriptionHandle === null) return [tokenId, code, argument, settlementId];
  return [...encodeToken(token, tokenId, subscriptionHandle), code, argument, settlementId];
}

/** Elements of a settle call that names its token by id alone. */
export const SHORT_SETTLE_FIELDS = 4;

/** Decodes a settlement code and its argument. */
export function decodeSettlement(code: unknown, argument: unknown): Settlement {
  switch (code) {
    case 0:
      return completed();
    case 1:
      return { kind: "retry", delaySeconds: argument as number | null };
    case 2:
      return { kind: "terminal", recordRef: argument as string };
    default:
      throw malformed("settlement");
  }
}

/** A settle outcome on the wire: `0` (confirmed), `[1, reason]` (unknown), `[2, currentAttempt, currentGeneration]`. */
export type SettleWire = 0 | readonly unknown[];

/** Encodes a settle outcome (its token and settlement id stay with the caller). */
export function encodeSettleOutcome(outcome: SettlementOutcome): SettleWire {
  switch (outcome.kind) {
    case "settle_confirmed":
      return 0;
    case "settle_unknown":
      return [1, outcome.reason];
    case "settle_stale":
      return [2, outcome.currentAttempt, outcome.currentGeneration];
  }
}

/** Decodes a {@link SettleWire} for the caller's `token` and `settlementId`. */
export function decodeSettleOutcome(
  wire: unknown,
  token: DeliveryToken,
  settlementId: string,
): SettlementOutcome {
  if (wire === 0) return settleConfirmed(token, settlementId);
  const fields = wire as readonly unknown[];
  if (fields[0] === 1) return settleUnknown(token, fields[1] as string);
  if (fields[0] === 2) return settleStale(token, fields[1] as number, fields[2] as string);
  throw malformed("settle outcome");
}

/**
 * A settle batch's outcomes on the wire: `0` when every entry was confirmed (the acks of a batch as one
 * count), else one {@link SettleWire} per entry.
 */
export type SettleBatchWire = 0 | readonly SettleWire[];

/** Encodes a settle batch's outcomes, in entry order. */
export function encodeSettleBatch(outcomes: readonly SettlementOutcome[]): SettleBatchWire {
  for (const outcome of outcomes) {
    if (outcome.kind !== "settle_confirmed") return outcomes.map(encodeSettleOutcome);
  }
  return 0;
}

/** Decodes a {@link SettleBatchWire} for the entries' tokens and settlement ids, in order. */
export function decodeSettleBatch(
  wire: unknown,
  entries: readonly { readonly token: DeliveryToken; readonly settlementId: string }[],
): SettlementOutcome[] {
  if (wire === 0) return entries.map((entry) => settleConfirmed(entry.token, entry.settlementId));
  if (!Array.isArray(wire) || wire.length !== entries.length) throw malformed("settle batch");
  return entries.map((entry, i) => decodeSettleOutcome(wire[i], entry.token, entry.settlementId));
}

/** A lease observation on the wire: `[renewed, expiresAt, reason]`. */
export type LeaseWire = readonly [boolean, number | null, string];

/** Encodes a lease observation (its token stays with the caller). */
export function encodeLease(lease: LeaseObservation): LeaseWire {
  return [lease.renewed, lease.expiresAt, lease.reason];
}

/** Decodes a {@link LeaseWire} for the caller's `token`. */
export function decodeLease(wire: unknown, token: DeliveryToken): LeaseObservation {
  const fields = wire as LeaseWire;
  return leaseObservation(token, fields[0], fields[1], fields[2]);
}

/** Fields per delivery in {@link DeliveriesWire}. */
export const DELIVERY_FIELDS = 10;

/**
 * Deliveries on the wire, flat: per delivery `[tokenId, subscriptionHandle, messageId, streamSequence,
 * attempt, generation, envelopeBytes (packed), size, receivedAt, headers | null (none)]`; a generation or
 * receivedAt equal to the previous delivery's is null.
 */
export type DeliveriesWire = unknown[];

/**
 * Encodes deliveries; `tokenIdOf` registers each broker token and names it, `handleOf` names each one's
 * subscription handle on this connection. The bytes are the broker's retained body (another subscriber
 * or a redelivery needs them): small ones are copied into `arena`, large ones as `arena` packs them (a
 * copy moved to the receiver over a MessagePort), so the receiver's bytes are its own.
 */
export function encodeDeliveries(
  deliveries: readonly Delivery[],
  tokenIdOf: (token: DeliveryToken) => number,
  handleOf: (subscription: SubscriptionId) => number,
  arena: BytePacker,
): DeliveriesWire {
  const out: unknown[] = new Array(deliveries.length * DELIVERY_FIELDS);
  let at = 0;
  let generation: string | null = null;
  let receivedAt: number | null = null;
  for (const delivery of deliveries) {
    const token = delivery.token;
    out[at++] = tokenIdOf(token);
    out[at++] = handleOf(token.subscription);
    out[at++] = token.messageId;
    out[at++] = token.streamSequence;
    out[at++] = token.attempt;
    out[at++] = token.generation === generation ? null : (generation = token.generation);
    out[at++] = arena.pack(delivery.envelopeBytes);
    out[at++] = delivery.size;
    out[at++] = delivery.receivedAt === receivedAt ? null : (receivedAt = delivery.receivedAt);
    out[at++] = hasKeys(delivery.headers) ? delivery.headers : null;
  }
  return out;
}

/** Builds one delivery from its decoded fields (see {@link DeliveriesWire} for their order). */
export type DeliveryFactory<D> = (
  tokenId: number,
  handle: number,
  messageId: string,
  streamSequence: number | null,
  attempt: number,
  generation: string,
  envelopeBytes: Uint8Array,
  size: number,
  receivedAt: number,
  headers: Readonly<Record<string, string>>,
) => D;

/** Decodes a {@link DeliveriesWire} whose frame carried `arena`, building each delivery with `make`. */
export function decodeDeliveries<D>(wire: unknown, arena: Uint8Array | null, make: DeliveryFactory<D>): D[] {
  const fields = wire as unknown[];
  const count = fields.length / DELIVERY_FIELDS;
  const out: D[] = new Array(count);
  let generation = "";
  let receivedAt = 0;
  for (let i = 0, at = 0; i < count; i++, at += DELIVERY_FIELDS) {
    generation = (fields[at + 5] ?? generation) as string;
    receivedAt = (fields[at + 8] ?? receivedAt) as number;
    out[i] = make(
      fields[at] as number,
      fields[at + 1] as number,
      fields[at + 2] as string,
      fields[at + 3] as number | null,
      fields[at + 4] as number,
      generation,
      unpack(fields[at + 6], arena),
      fields[at + 7] as number,
      receivedAt,
      (fields[at + 9] ?? EMPTY_HEADERS) as Readonly<Record<string, string>>,
    );
  }
  return out;
}
