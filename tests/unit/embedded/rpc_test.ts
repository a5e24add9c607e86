/**
 * The embedded broker's RPC protocol, end to end against a scripted peer: frames, batching and order,
 * replies and errors, what a lost connection makes of waiting calls, transfers, packed bytes, large bytes
 * moved to a MessagePort peer as a copy (never shared, never the caller's array), id tables and the socket
 * link's length-prefixed framing.
 *
 * @module
 */

import assert from "node:assert/strict";
import { serialize } from "node:v8";
import { ENVELOPE_HEADROOM, ENVELOPE_TAILROOM, giveWhole } from "../../../src/core/bytes.ts";
import * as taxonomy from "../../../src/core/errors.ts";
import {
  BrokerUnavailable,
  ConfigError,
  Diagnostic,
  GraphError,
  IncompatibleProfile,
  VideoflowError,
  VideoflowRuntimeError,
} from "../../../src/core/errors.ts";
import { UnobservableComposition } from "../../../src/backends/capabilities.ts";
import { Barrier, InjectedFault, SimulatedCrash } from "../../../src/backends/faults.ts";
import { rejected } from "../../../src/backends/outcomes.ts";
import { PayloadBudgetExceeded } from "../../../src/backends/payload.ts";
import {
  ARENA_LIMIT,
  connectionLost,
  DeferredFlush,
  EMBEDDED_PROTOCOL_VERSION,
  EmbeddedConnection,
  encodeMovedPublication,
  errorFromWire,
  errorToWire,
  FLUSH_BYTES,
  FLUSH_HOPS,
  FLUSH_MAX_DELAY_MS,
  Frame,
  FrameArena,
  FrameBuilder,
  type FrameLink,
  IdTable,
  Op,
  PACK_LIMIT,
  parseBrokerAddress,
  PLAIN_REPLY,
  portLink,
  type Reply,
  secretMatches,
  SOCKET_DRAIN_SECONDS,
  socketLink,
  spansBuffer,
  unpack,
} from "../../../src/embedded/rpc.ts";
import { SeededRandom, testSeed } from "../../support/random.ts";

/** A scripted server end: records every frame, welcomes the hello, and answers as the test says. */
class Peer {
  readonly frames: unknown[][] = [];
  readonly link: FrameLink;
  #arrived: (() => void) | null = null;

  constructor(port: MessagePort) {
    this.link = portLink(port);
    this.link.start((frame) => {
      this.frames.push(frame);
      if (frame[0] === Frame.hello) this.link.send([Frame.welcome, EMBEDDED_PROTOCOL_VERSION], []);
      this.#arrived?.();
    }, () => {});
  }

  /** The `calls` frames received so far. */
  calls(): unknown[][] {
    return this.frames.filter((frame) => frame[0] === Frame.calls);
  }

  /** Resolves once a frame of `kind` has arrived. */
  async untilFrame(kind: Frame): Promise<void> {
    while (!this.frames.some((frame) => frame[0] === kind)) {
      await new Promise<void>((resolve) => this.#arrived = resolve);
    }
  }

  /** Resolves once `count` calls frames have arrived. */
  async untilCalls(count: number): Promise<unknown[][]> {
    while (this.calls().length < count) await new Promise<void>((resolve) => this.#arrived = resolve);
    return this.calls();
  }
}

async function pair(): Promise<{ peer: Peer; connection: EmbeddedConnection }> {
  const { port1, port2 } = new MessageChannel();
  const peer = new Peer(port1);
  const connection = await EmbeddedConnection.connect(port2, { label: "test" });
  return { peer, connection };
}

async function closeBoth(peer: Peer, connection: EmbeddedConnection): Promise<void> {
  await connection.close();
  await peer.link.close();
}

const ECHO = PLAIN_REPLY as Reply<null, unknown>;

Deno.test("calls made in one turn leave in one frame, in call order, each with its own id", async () => {
  const { peer, connection } = await pair();
  const replies = [0, 1, 2].map((n) => connection.call(Op.storeGet, [`k${n}`], null, ECHO));
  connection.send(Op.supersede, ["no reply"]);
  const [frame] = await peer.untilCalls(1);
  assert.deepEqual(frame.slice(2), [
    Op.storeGet,
    1,
    ["k0"],
    Op.storeGet,
    2,
    ["k1"],
    Op.storeGet,
    3,
    ["k2"],
    Op.supersede,
    0,
    ["no reply"],
  ]);
  peer.link.send([Frame.results, null, 3, 1, "c", 1, 1, "a", 2, 1, "b"], []);
  assert.deepEqual(await Promise.all(replies), ["a", "b", "c"], "replies are matched by id, in any order");
  await closeBoth(peer, connection);
});

Deno.test("calls a few microtask turns apart share a frame; a call after a real wait starts another", async () => {
  const { peer, connection } = await pair();
  connection.call(Op.storeGet, ["a"], null, ECHO).catch(() => {});
  await null;
  connection.call(Op.storeGet, ["b"], null, ECHO).catch(() => {});
  const [first] = await peer.untilCalls(1);
  assert.equal((first.length - 2) / 3, 2, "an await of a settled value does not split the frame");
  connection.call(Op.storeGet, ["c"], null, ECHO).catch(() => {});
  const frames = await peer.untilCalls(2);
  assert.equal((frames[1].length - 2) / 3, 1);
  await closeBoth(peer, connection);
});

Deno.test("a server error comes back as the same taxonomy class with its remedy, context and code", async () => {
  const { peer, connection } = await pair();
  const call = connection.call(Op.storeGet, ["k"], null, ECHO);
  await peer.untilCalls(1);
  const error = new ConfigError("bad key", "use a good key", { key: "k" });
  peer.link.send([Frame.results, null, 1, 0, errorToWire(error)], []);
  await assert.rejects(call, (thrown: unknown) => {
    assert.ok(thrown instanceof ConfigError);
    assert.deepEqual([thrown.message, thrown.remedy, thrown.context, thrown.code], [
      "bad key",
      "use a good key",
      { key: "k" },
      "VF_CONFIG",
    ]);
    return true;
  });
  await closeBoth(peer, connection);
});

Deno.test("every taxonomy class survives the wire as itself, disposition included", () => {
  for (const value of [...Object.values(taxonomy), UnobservableComposition, PayloadBudgetExceeded]) {
    if (typeof value !== "function" || !(value.prototype instanceof VideoflowError)) continue;
    const cls = value as unknown as new (...args: unknown[]) => VideoflowError;
    const diagnostics = [new Diagnostic("error", "VF_X", "n", "d", null)];
    const original = cls === UnobservableComposition
      ? new cls("m", "r", diagnostics)
      : cls === GraphError || cls === IncompatibleProfile
      ? new cls("m", "r", diagnostics, { at: 1 })
      : new cls("m", "r", { at: 1 });
    if (original instanceof VideoflowRuntimeError) original.withDisposition("poison");
    const rebuilt = errorFromWire(structuredClone(errorToWire(original)));
    assert.equal(rebuilt.constructor, original.constructor, `${cls.name} is rebuilt as itself`);
    const again = rebuilt as VideoflowError;
    assert.deepEqual(
      [again.message, again.remedy, again.context, again.code, again.disposition],
      [original.message, original.remedy, original.context, original.code, original.disposition],
      cls.name,
    );
  }
});

Deno.test("diagnostics, fault-harness errors, built-in errors and unknown codes cross the wire faithfully", () => {
  const diagnostics = [new Diagnostic("error", "VF_GRAPH", "detect", "cycle", "break it")];
  const graph = errorFromWire(errorToWire(new GraphError("invalid", "fix", diagnostics, { n: 1 })));
  assert.ok(graph instanceof GraphError);
  assert.deepEqual(graph.diagnostics.map((d) => d.render()), diagnostics.map((d) => d.render()));
  const profile = errorFromWire(errorToWire(new IncompatibleProfile("no", null, diagnostics)));
  assert.ok(profile instanceof IncompatibleProfile && profile.diagnostics.length === 1);

  const crash = errorFromWire(errorToWire(new SimulatedCrash(137, Barrier.payloadWriteAfter)));
  assert.ok(crash instanceof SimulatedCrash);
  assert.deepEqual([crash.exitCode, crash.barrier], [137, Barrier.payloadWriteAfter]);

  const injected = errorFromWire(
    errorToWire(new InjectedFault("VF_NO_SUCH", "boom").withDisposition("poison")),
  );
  assert.ok(injected instanceof InjectedFault);
  assert.deepEqual([injected.code, injected.disposition], ["VF_NO_SUCH", "poison"]);

  const builtin = errorFromWire(errorToWire(new RangeError("out of range")));
  assert.ok(builtin instanceof RangeError && builtin.message === "out of range");

  const foreign = errorFromWire([
    { ...new BrokerUnavailable("gone").toDict(), type: "SomeAdapterError", code: "VF_SOME_ADAPTER" },
    null,
  ]);
  assert.ok(foreign instanceof taxonomy.VideoflowEnvironmentError, "an unknown code keeps its branch");
  assert.equal((foreign as VideoflowError).code, "VF_SOME_ADAPTER", "and its code");
  assert.ok(errorFromWire("garbage") instanceof BrokerUnavailable, "a malformed error is not a success");
});

Deno.test("a closed connection decides waiting calls by their reply: sent ones and unsent ones apart", async () => {
  const { peer, connection } = await pair();
  const outcomes: string[] = [];
  const reply: Reply<string, string> = {
    decode: () => "decoded",
    lost: (context, sent) => `${context}:${sent ? "sent" : "unsent"}`,
  };
  const waiting = connection.call(Op.storeGet, ["k"], "first", reply);
  const raising = connection.call(Op.storeGet, ["k"], null, ECHO);
  await peer.untilCalls(1);
  peer.link.send([Frame.bye, "supervisor gave up"], []);
  outcomes.push(await waiting);
  await assert.rejects(raising, (error: unknown) => {
    assert.ok(error instanceof BrokerUnavailable);
    assert.match(error.message, /supervisor gave up/);
    return true;
  });
  outcomes.push(await connection.call(Op.storeGet, ["k"], "later", reply));
  assert.deepEqual(outcomes, ["first:sent", "later:unsent"]);
  assert.ok(connection.lostReason instanceof BrokerUnavailable);
  await closeBoth(peer, connection);
});

Deno.test("a client's own close fails what it still waits for and tells the server", async () => {
  const { peer, connection } = await pair();
  const call = connection.call(Op.storeGet, ["k"], null, ECHO);
  await connection.close();
  await assert.rejects(call, BrokerUnavailable);
  await peer.untilFrame(Frame.bye);
  assert.equal(peer.calls().length, 1, "what was queued left before the bye");
  await peer.link.close();
});

Deno.test("a refused hello rejects the connect with the server's error", async () => {
  const { port1, port2 } = new MessageChannel();
  const link = portLink(port1);
  link.start((frame) => {
    if (frame[0] !== Frame.hello) return;
    link.send([Frame.refused, errorToWire(new BrokerUnavailable("a wrong secret"))], []);
    link.close();
  }, () => {});
  await assert.rejects(EmbeddedConnection.connect(port2), /a wrong secret/);
});

Deno.test("a port nobody serves fails the connect with BrokerUnavailable once the welcome is overdue", async () => {
  const { port1, port2 } = new MessageChannel();
  await assert.rejects(
    EmbeddedConnection.connect(port2, { timeoutSeconds: 0.05 }),
    (error: unknown) => error instanceof BrokerUnavailable && /no welcome/.test(error.message),
  );
  port1.close();
});

Deno.test("a transferred buffer moves: the caller's view is detached and the peer holds the bytes", async () => {
  const { peer, connection } = await pair();
  const data = new Uint8Array([1, 2, 3, 4]);
  const call = connection.call(Op.payloadPut, [data], null, ECHO, data.buffer);
  const [frame] = await peer.untilCalls(1);
  assert.equal(data.buffer.detached, true, "no copy stayed behind");
  assert.deepEqual([...(frame[4] as unknown[])[0] as Uint8Array], [1, 2, 3, 4]);
  peer.link.send([Frame.results, null, 1, 1, "ok"], []);
  assert.equal(await call, "ok");
  await closeBoth(peer, connection);
});

Deno.test("a call whose arguments cannot be cloned fails alone, as a ConfigError, and sends nothing", async () => {
  const { peer, connection } = await pair();
  await assert.rejects(connection.call(Op.storeGet, [() => 1], null, ECHO), ConfigError);
  const next = connection.call(Op.storeGet, ["k"], null, ECHO);
  const [frame] = await peer.untilCalls(1);
  assert.deepEqual(frame.slice(2), [Op.storeGet, 2, ["k"]]);
  peer.link.send([Frame.results, null, 2, 1, "v"], []);
  assert.equal(await next, "v");
  await closeBoth(peer, connection);
});

Deno.test("packed bytes round-trip at random sizes; large ones travel alone and views never overlap", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let round = 0; round < 20; round++) {
    const arena = new FrameArena();
    const originals: Uint8Array[] = [];
    const fields: (number | Uint8Array)[] = [];
    for (let i = random.int(0, 40); i > 0; i--) {
      const size = random.chance(0.1)
        ? random.int(PACK_LIMIT + 1, PACK_LIMIT * 3)
        : random.int(0, PACK_LIMIT);
      const bytes = random.bytes(size);
      const backing = random.chance(0.3) ? new Uint8Array(size + 8) : null;
      const view = backing === null ? bytes : backing.subarray(4, 4 + size);
      view.set(bytes);
      originals.push(bytes.slice());
      fields.push(arena.pack(view));
      view.fill(0xee);
    }
    const packed = arena.take();
    assert.ok(packed === null || packed.byteLength <= ARENA_LIMIT, `seed ${seed}: the arena stays bounded`);
    fields.forEach((field, i) => {
      const out = unpack(field, packed);
      if (typeof field !== "number") {
        assert.equal(
          out.byteLength,
          out.buffer.byteLength,
          `seed ${seed}: a large array spans its own buffer`,
        );
      }
      if (typeof field !== "number") return;
      assert.deepEqual(out, originals[i], `seed ${seed}, round ${round}, field ${i}: the bytes as packed`);
    });
  }
  assert.throws(() => unpack(5, null), ConfigError);
  assert.throws(() => unpack(1 * 8192 + 4, new Uint8Array(2)), ConfigError, "a reference past the arena");
});

/** `bytes` copied into a SharedArrayBuffer `before + bytes.length + after` long, at offset `before`. */
function inShared(bytes: Uint8Array, before = 0, after = 0): Uint8Array {
  const view = new Uint8Array(
    new SharedArrayBuffer(before + bytes.byteLength + after),
    before,
    bytes.byteLength,
  );
  view.set(bytes);
  return view;
}

/** Whether `bytes` lie in a SharedArrayBuffer. */
function inSharedMemory(bytes: Uint8Array): boolean {
  return bytes.buffer instanceof SharedArrayBuffer;
}

/** Whether `bytes` are a plain array spanning an ordinary ArrayBuffer of their own. */
function ownPlain(bytes: Uint8Array): boolean {
  return bytes.buffer instanceof ArrayBuffer && spansBuffer(bytes);
}

/** Whether `buffer` is, by identity, one of `buffers` (deepEqual would compare contents). */
function listed(buffers: readonly ArrayBuffer[], buffer: ArrayBufferLike): boolean {
  return buffers.some((candidate) => candidate === buffer);
}

Deno.test("a frame that moves large bytes packs each as a fresh copy taken at the call and moves that copy, never the caller's array; small bytes are still packed", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (let round = 0; round < 20; round++) {
    const moving = new FrameBuilder(Frame.calls, "port");
    const size = random.int(PACK_LIMIT + 1, PACK_LIMIT * 4);
    const bytes = random.bytes(size);
    const backing = new Uint8Array(size + 16);
    const view = backing.subarray(8, 8 + size);
    view.set(bytes);
    const fromView = moving.pack(view) as Uint8Array;
    assert.ok(
      fromView instanceof Uint8Array && fromView.buffer !== backing.buffer && ownPlain(fromView),
      `seed ${seed}: a large view becomes a copy spanning an ordinary ArrayBuffer of its own`,
    );
    assert.deepEqual(view, bytes, `seed ${seed}: the caller's view is untouched`);
    view.fill(0);
    assert.deepEqual(fromView, bytes, `seed ${seed}: the copy was taken at the call`);
    const exact = bytes.slice();
    const fromExact = moving.pack(exact) as Uint8Array;
    assert.ok(
      fromExact instanceof Uint8Array && fromExact !== exact && fromExact.buffer !== exact.buffer &&
        ownPlain(fromExact),
      `seed ${seed}: a caller's array spanning its buffer is copied too, not moved`,
    );
    exact.fill(0);
    assert.deepEqual(fromExact, bytes, `seed ${seed}: before the caller reused its array`);
    const userShared = inShared(bytes, 4, 4);
    const fromShared = moving.pack(userShared) as Uint8Array;
    assert.ok(
      fromShared instanceof Uint8Array && !inSharedMemory(fromShared) && ownPlain(fromShared),
      `seed ${seed}: a caller's bytes in shared memory travel as an ordinary copy, never shared`,
    );
    assert.deepEqual(fromShared, bytes);
    const small = random.bytes(random.int(0, PACK_LIMIT));
    assert.equal(typeof moving.pack(small), "number", `seed ${seed}: small bytes are packed`);

    const { frame, transfer } = moving.take("port");
    const arena = frame[1] as Uint8Array;
    assert.equal(transfer.length, 4, `seed ${seed}: the three copies and the arena move`);
    for (const copy of [fromView, fromExact, fromShared]) {
      assert.ok(listed(transfer, copy.buffer), `seed ${seed}: each copy moves with its frame`);
    }
    assert.ok(listed(transfer, arena.buffer), `seed ${seed}: so does the arena over a port`);
    for (const callers of [backing.buffer, exact.buffer, userShared.buffer]) {
      assert.ok(!listed(transfer, callers), `seed ${seed}: a caller's buffer is never moved`);
    }

    const overTcp = new FrameBuilder(Frame.calls, "tcp");
    const mine = bytes.slice();
    const called = overTcp.pack(mine) as Uint8Array;
    assert.ok(called !== mine && ownPlain(called), `seed ${seed}: a call over TCP copies at the call too`);
    mine.fill(0);
    assert.deepEqual(called, bytes, `seed ${seed}: so the caller may reuse its array at once`);
    assert.deepEqual(overTcp.take("tcp").transfer, [], `seed ${seed}: nothing moves over TCP`);

    const plain = new FrameBuilder(Frame.results, "tcp");
    const spanning = bytes.slice();
    assert.equal(plain.pack(spanning), spanning, `seed ${seed}: results over TCP hand a spanning array on`);
    const copied = plain.pack(view) as Uint8Array;
    assert.ok(
      copied !== view && copied.buffer !== backing.buffer && ownPlain(copied),
      `seed ${seed}: a view is copied`,
    );
    assert.deepEqual(plain.take("port").transfer, [], `seed ${seed}: nothing moves: the link copies`);
    const serving = new FrameArena();
    assert.equal(
      serving.pack(spanning),
      spanning,
      `seed ${seed}: an arena hands a spanning array on as it is`,
    );
    const exactCopy = serving.pack(view) as Uint8Array;
    assert.ok(exactCopy !== view && exactCopy.buffer !== backing.buffer && ownPlain(exactCopy));
    assert.deepEqual(exactCopy, view, `seed ${seed}: an arena copies just a view's bytes`);
  }
  const boundary = new FrameBuilder(Frame.calls, "port");
  assert.equal(
    typeof boundary.pack(new Uint8Array(PACK_LIMIT)),
    "number",
    "PACK_LIMIT bytes are still packed",
  );
  assert.equal(typeof boundary.pack(new Uint8Array(PACK_LIMIT + 1)), "object", "one byte more moves");
});

Deno.test("small bytes a full arena cannot take are copied at the call as well, and moved over a port", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  for (const link of ["port", "tcp"] as const) {
    const frame = new FrameBuilder(Frame.calls, link);
    const bodies = Array.from({ length: 2 * ARENA_LIMIT / PACK_LIMIT }, () => random.bytes(PACK_LIMIT));
    const originals = bodies.map((body) => body.slice());
    const packed = bodies.map((body) => frame.pack(body));
    assert.ok(packed.some((field) => typeof field !== "number"), `seed ${seed}: the arena filled up`);
    for (const body of bodies) body.fill(0);
    const { frame: sent, transfer } = frame.take(link);
    const arena = sent[1] as Uint8Array;
    packed.forEach((field, i) => {
      assert.deepEqual(
        unpack(field, arena),
        originals[i],
        `seed ${seed}, ${link}, body ${i}: as at the call`,
      );
      if (field instanceof Uint8Array) {
        assert.equal(
          listed(transfer, field.buffer),
          link === "port",
          `seed ${seed}, ${link}: moved on a port`,
        );
      }
    });
  }
});

Deno.test("over a MessagePort a large packed body moves to the peer as a copy: the peer owns its bytes, the sender's copy is gone, the caller's body is intact", async () => {
  const { peer, connection } = await pair();
  const seed = testSeed();
  const body = new SeededRandom(seed).bytes(PACK_LIMIT * 2 + 3);
  const original = body.slice();
  const field = connection.pack(body) as Uint8Array;
  assert.ok(field instanceof Uint8Array && field !== body && field.buffer !== body.buffer, `seed ${seed}`);
  const call = connection.call(Op.storeGet, [field], null, ECHO);
  const [frame] = await peer.untilCalls(1);
  const received = (frame[4] as unknown[])[0] as Uint8Array;
  assert.ok(ownPlain(received) && !inSharedMemory(received), "the peer holds an ordinary array of its own");
  assert.deepEqual(received, original, `seed ${seed}: the body's bytes`);
  assert.equal(
    unpack(received, frame[1] as Uint8Array | null),
    received,
    "the peer keeps the array that arrived: unpacking it copies nothing",
  );
  assert.equal(
    (field.buffer as ArrayBuffer).detached,
    true,
    "the sender's copy moved with the frame: nothing stayed behind",
  );
  assert.equal((body.buffer as ArrayBuffer).detached, false, "the caller's array was never moved");
  assert.deepEqual(body, original, `seed ${seed}: and is intact`);
  received.fill(77);
  assert.deepEqual(body, original, "the peer's writes never reach the caller");
  peer.link.send([Frame.results, null, 1, 1, "ok"], []);
  assert.equal(await call, "ok");
  await closeBoth(peer, connection);
});

Deno.test("over a MessagePort bytes in a buffer given up whole move with their buffer, uncopied, and the peer keeps them as they came", async () => {
  const { peer, connection } = await pair();
  const seed = testSeed();
  const bytes = new SeededRandom(seed).bytes(PACK_LIMIT * 3 + 5);
  const buffer = new ArrayBuffer(ENVELOPE_HEADROOM + bytes.byteLength + ENVELOPE_TAILROOM);
  const view = new Uint8Array(buffer, ENVELOPE_HEADROOM - 100, bytes.byteLength);
  view.set(bytes);
  giveWhole(buffer);
  const field = connection.giver.pack(view);
  assert.equal(field, view, `seed ${seed}: the caller's view itself goes, not a copy`);
  const call = connection.call(Op.storeGet, [field], null, ECHO);
  const [frame] = await peer.untilCalls(1);
  const received = (frame[4] as unknown[])[0] as Uint8Array;
  assert.equal(buffer.detached, true, "the whole buffer moved with the frame");
  assert.deepEqual(received, bytes, `seed ${seed}: the bytes arrived`);
  assert.equal(received.byteOffset, ENVELOPE_HEADROOM - 100, "at the offset they had");
  assert.equal(
    unpack(received, frame[1] as Uint8Array | null),
    received,
    "the peer keeps the view that arrived: unpacking it copies nothing",
  );
  const roomy = new Uint8Array(
    new ArrayBuffer(bytes.byteLength + ENVELOPE_HEADROOM * 2),
    8,
    bytes.byteLength,
  );
  roomy.set(bytes);
  const kept = unpack(roomy, null);
  assert.ok(kept !== roomy && spansBuffer(kept), "a view in a much larger buffer is kept as an exact copy");
  assert.deepEqual(kept, bytes);
  peer.link.send([Frame.results, null, 1, 1, "ok"], []);
  assert.equal(await call, "ok");
  await closeBoth(peer, connection);
});

Deno.test("a refused moved publication's body goes back with its whole buffer, uncopied, even as a view of part of it", () => {
  const results = new FrameBuilder(Frame.results, "port");
  const buffer = new ArrayBuffer(ENVELOPE_HEADROOM + PACK_LIMIT * 2);
  const body = new Uint8Array(buffer, 100, PACK_LIMIT * 2);
  const [, back] = encodeMovedPublication(rejected("p-1", "full", true), body, results);
  assert.equal(back, body, "the very view that came, not a copy");
  assert.ok(listed(results.take("port").transfer, buffer), "moved back with its buffer");
});

Deno.test("bytes not given up whole that a caller gives are copied when they do not span their buffer", () => {
  const moving = new FrameBuilder(Frame.calls, "port");
  const buffer = new ArrayBuffer(PACK_LIMIT * 2 + 16);
  const view = new Uint8Array(buffer, 8, PACK_LIMIT * 2);
  const given = moving.packGiven(view) as Uint8Array;
  assert.ok(given !== view && spansBuffer(given), "an exact copy of the view, moved");
  assert.ok(listed(moving.take("port").transfer, given.buffer));
  assert.equal(buffer.detached, false, "the caller's buffer stays");
});

Deno.test("over a socket link shared bytes cross as a plain copy of just their bytes", async () => {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0, transport: "tcp" });
  const dialed = Deno.connect({ hostname: "127.0.0.1", port: (listener.addr as Deno.NetAddr).port });
  const [accepted, conn] = await Promise.all([listener.accept(), dialed]);
  listener.close();
  const sender = socketLink(conn);
  const receiver = socketLink(accepted);
  const arrived = Promise.withResolvers<unknown[]>();
  receiver.start((frame) => arrived.resolve(frame), () => {});
  sender.start(() => {}, () => {});
  const body = new Uint8Array(300_000).map((_, i) => i * 7);
  sender.send(
    [Frame.calls, null, Op.storeGet, 1, [inShared(body), inShared(body.subarray(0, 10), 3, 5)]],
    [],
  );
  const frame = await arrived.promise;
  const [whole, part] = (frame[4] as unknown[]) as Uint8Array[];
  assert.ok(whole instanceof Uint8Array && !inSharedMemory(whole), "a plain array arrives");
  assert.deepEqual(whole, body);
  assert.ok(!inSharedMemory(part) && part.byteLength === 10, "a shared view arrives as its own bytes");
  assert.deepEqual(part, body.subarray(0, 10));
  await Promise.all([sender.close(), receiver.close()]);
});

Deno.test("an id table agrees with a map under random adds and removals, stragglers included", () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const table = new IdTable<string>();
  const model = new Map<number, string>();
  let next = 1;
  for (let step = 0; step < 30_000; step++) {
    const op = random.int(0, 9);
    if (op < 5 || model.size === 0) {
      next += random.chance(0.1) ? random.int(1, 5) : 1;
      table.add(next, `v${next}`);
      model.set(next, `v${next}`);
    } else {
      const keys = [...model.keys()];
      const id = random.chance(0.8) ? keys[0] : random.pick(keys);
      assert.equal(table.get(id), model.get(id), `seed ${seed}, step ${step}: get ${id}`);
      assert.equal(table.take(id), model.get(id), `seed ${seed}, step ${step}: take ${id}`);
      model.delete(id);
      assert.equal(table.take(id), undefined, `seed ${seed}, step ${step}: taken twice`);
    }
  }
  assert.deepEqual(table.drain().sort(), [...model.values()].sort(), `seed ${seed}: drain returns the rest`);
  assert.deepEqual(table.drain(), []);
});

Deno.test("a deferred flush runs once per schedule burst, and a cancelled one not at all", async () => {
  let runs = 0;
  const flush = new DeferredFlush(() => runs++);
  flush.schedule();
  flush.schedule();
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.equal(runs, 1);
  flush.schedule();
  flush.cancel();
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.equal(runs, 1);
  flush.schedule();
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.equal(runs, 2, "a cancel does not wedge later schedules");
});

/** Lets `n` microtask turns pass. */
async function turns(n: number): Promise<void> {
  for (let i = 0; i < n; i++) await Promise.resolve();
}

Deno.test("a deferred flush waits FLUSH_HOPS quiet turns after the latest schedule, so a steady caller fills one frame", async () => {
  let runs = 0;
  // A clock that stands still: on a loaded host ten rounds of turns can outlast FLUSH_MAX_DELAY_MS.
  const flush = new DeferredFlush(() => runs++, () => 0);
  flush.schedule();
  for (let call = 0; call < 10; call++) {
    await turns(FLUSH_HOPS - 2);
    assert.equal(runs, 0, `call ${call}: a schedule within FLUSH_HOPS turns keeps the frame open`);
    flush.schedule();
  }
  await turns(FLUSH_HOPS + 2);
  assert.equal(runs, 1, "sent once the calls stopped");
});

Deno.test("a frame stops growing FLUSH_MAX_DELAY_MS after its first entry, however steadily calls keep coming", async () => {
  let runs = 0;
  const flush = new DeferredFlush(() => runs++);
  flush.schedule();
  const started = performance.now();
  while (performance.now() - started < FLUSH_MAX_DELAY_MS * 2) {
    // a node's long synchronous work: no microtask turn passes
  }
  for (let call = 0; call < 3; call++) {
    flush.schedule();
    await turns(FLUSH_HOPS - 2);
  }
  assert.equal(runs, 1, "sent although a call came every few turns");
});

Deno.test("a frame counts the bytes packed into it and moved with it, and is full at FLUSH_BYTES", () => {
  const frame = new FrameBuilder(Frame.calls, "tcp");
  assert.equal(frame.full, false);
  frame.pack(new Uint8Array(100));
  frame.move(new ArrayBuffer(FLUSH_BYTES / 2));
  assert.equal(frame.bytes, FLUSH_BYTES / 2 + 100);
  assert.equal(frame.full, false);
  frame.pack(new Uint8Array(FLUSH_BYTES / 2));
  assert.equal(frame.full, true);
  frame.take("port");
  assert.equal(frame.bytes, 0, "a taken frame starts empty");
});

/** A Deno.Conn stand-in that reads a byte stream in the chunk sizes a seeded random picks. */
function chunkedConn(stream: Uint8Array, random: SeededRandom): Deno.Conn {
  let at = 0;
  let closed = false;
  return {
    read(buffer: Uint8Array): Promise<number | null> {
      if (closed || at >= stream.byteLength) return Promise.resolve(null);
      const n = Math.min(buffer.byteLength, random.int(1, 97), stream.byteLength - at);
      buffer.set(stream.subarray(at, at + n));
      at += n;
      return Promise.resolve(n);
    },
    write(bytes: Uint8Array): Promise<number> {
      return Promise.resolve(bytes.byteLength);
    },
    close() {
      closed = true;
    },
  } as unknown as Deno.Conn;
}

function lengthPrefixed(frame: unknown[]): Uint8Array {
  const body = serialize(frame);
  const out = new Uint8Array(4 + body.byteLength);
  new DataView(out.buffer).setUint32(0, body.byteLength);
  out.set(body, 4);
  return out;
}

Deno.test("the socket link reassembles length-prefixed frames split at any byte", async () => {
  const seed = testSeed();
  const random = new SeededRandom(seed);
  const frames = Array.from(
    { length: 30 },
    (_, i) => [Frame.calls, null, Op.storeGet, i, [random.bytes(i * 7), 2n ** 70n, new Map([["k", i]])]],
  );
  const stream = new Uint8Array(frames.reduce((n, f) => n + lengthPrefixed(f).byteLength, 0));
  let offset = 0;
  for (const frame of frames) {
    const bytes = lengthPrefixed(frame);
    stream.set(bytes, offset);
    offset += bytes.byteLength;
  }
  const link = socketLink(chunkedConn(stream, random));
  const received: unknown[][] = [];
  const ended = Promise.withResolvers<string>();
  link.start((frame) => received.push(frame), ended.resolve);
  assert.equal(await ended.promise, "the peer closed the socket");
  assert.deepEqual(received, frames, `seed ${seed}: every frame, whole and in order`);
  await link.close();
});

Deno.test("the socket link ends on a frame longer than its limit instead of allocating it", async () => {
  const stream = new Uint8Array([0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
  const link = socketLink(chunkedConn(stream, new SeededRandom(1)));
  const ended = Promise.withResolvers<string>();
  link.start(() => assert.fail("no frame"), ended.resolve);
  assert.match(await ended.promise, /exceeds/);
  await link.close();
});

Deno.test("closing a socket link whose peer stopped reading gives up on the queued frames after the drain limit", async () => {
  let fail: ((error: Error) => void) | null = null;
  const stuck = {
    read: () => new Promise<number | null>((resolve) => fail = () => resolve(null)),
    write: () =>
      new Promise<number>((_, reject) => {
        const previous = fail;
        fail = (error) => {
          previous?.(error);
          reject(error);
        };
      }),
    close: () => fail?.(new Error("closed")),
  } as unknown as Deno.Conn;
  const link = socketLink(stuck);
  link.start(() => {}, () => {});
  link.send([Frame.bye, "never written"], []);
  const started = performance.now();
  await link.close();
  const waited = (performance.now() - started) / 1000;
  assert.ok(waited >= SOCKET_DRAIN_SECONDS * 0.9 && waited < SOCKET_DRAIN_SECONDS + 2, `waited ${waited} s`);
});

Deno.test("addresses and secrets are checked strictly", () => {
  assert.deepEqual(parseBrokerAddress("tcp://127.0.0.1:4222"), { hostname: "127.0.0.1", port: 4222 });
  for (
    const bad of ["127.0.0.1:4222", "tcp://127.0.0.1", "tcp://127.0.0.1:0", "tcp://h:99999", "nats://h:1"]
  ) {
    assert.throws(() => parseBrokerAddress(bad), ConfigError, bad);
  }
  assert.equal(secretMatches("s3cret", "s3cret"), true);
  assert.equal(secretMatches("s3cre", "s3cret"), false);
  assert.equal(secretMatches(null, "s3cret"), false);
  assert.match(connectionLost("eof", "w1").message, /eof/);
});

Deno.test("a TCP link sends its frames at once: it turns Nagle's delay off on the connection it is given", () => {
  const calls: (boolean | undefined)[] = [];
  const conn = { setNoDelay: (noDelay?: boolean) => calls.push(noDelay) } as unknown as Deno.TcpConn;
  socketLink(conn);
  assert.deepEqual(calls, [true], "a small call's frame must not wait for the peer's delayed ACK");
  assert.doesNotThrow(
    () => socketLink({} as Deno.Conn),
    "a connection with no such option is taken as it is",
  );
});
