/**
 * What a Worker replica holds inside its node, shared with its supervisor through memory instead of a
 * message per call: the replica writes the message ids of the input group it hands its node, and an empty
 * list once the node returned; the supervisor reads the board after the replica died, to charge the death
 * to those inputs (issue 13's poison by crash or hang). Two `postMessage` reports per input cost the local
 * path about a fifth of its CPU per small item (`deno task bench --sections items`: 290 → 217 µs per item
 * without them, on 2 cores); a board write is two atomic stores and, while the node is called, one short
 * encode.
 *
 * @module
 */

/** The most bytes a board grows to: far past any input group's ids (one id per parent, 64 characters). */
export const IN_NODE_BOARD_MAX_BYTES = 1 << 20;

/** Header: `[version, length]` as 32-bit integers; the version is odd while a write is under way. */
const HEADER_BYTES = 8;
const VERSION = 0;
const LENGTH = 1;
const INITIAL_BYTES = 1024;

/**
 * A board over a growable `SharedArrayBuffer` that one thread writes and another reads. A read sees a whole
 * write: what was last written, or nothing (`[]`) when the writer stopped in the middle of one, which is a
 * moment its node was not inside a call (about to be called, or just returned).
 */
export class InNodeBoard {
  readonly #buffer: SharedArrayBuffer;
  readonly #header: Int32Array;
  readonly #encoder = new TextEncoder();
  readonly #decoder = new TextDecoder();

  private constructor(buffer: SharedArrayBuffer) {
    this.#buffer = buffer;
    this.#header = new Int32Array(buffer, 0, 2);
  }

  /** A new, empty board (the supervisor's side): hand {@link buffer} to the replica. */
  static create(): InNodeBoard {
    return new InNodeBoard(new SharedArrayBuffer(INITIAL_BYTES, { maxByteLength: IN_NODE_BOARD_MAX_BYTES }));
  }

  /** The board another thread created, over its buffer (the replica's side). */
  static over(buffer: SharedArrayBuffer): InNodeBoard {
    if (!buffer.growable || buffer.byteLength < HEADER_BYTES) {
      throw new TypeError("an in-node board is a growable SharedArrayBuffer made by InNodeBoard.create()");
    }
    return new InNodeBoard(buffer);
  }

  /** The shared memory, to post to the replica. */
  get buffer(): SharedArrayBuffer {
    return this.#buffer;
  }

  /**
   * Records `messageIds` as what the node holds now (empty: nothing). Throws a RangeError, writing nothing,
   * when they need more than {@link IN_NODE_BOARD_MAX_BYTES}.
   */
  write(messageIds: readonly string[]): void {
    const text = messageIds.length === 0 ? "" : JSON.stringify(messageIds);
    const worst = HEADER_BYTES + text.length * 3;
    if (worst > this.#buffer.byteLength) {
      if (worst > IN_NODE_BOARD_MAX_BYTES) {
        throw new RangeError(
          `the ${messageIds.length} message ids inside the node need more than ${IN_NODE_BOARD_MAX_BYTES} bytes`,
        );
      }
      this.#buffer.grow(Math.min(IN_NODE_BOARD_MAX_BYTES, Math.max(worst, 2 * this.#buffer.byteLength)));
    }
    const version = Atomics.load(this.#header, VERSION);
    Atomics.store(this.#header, VERSION, version + 1);
    const length = text.length === 0
      ? 0
      : this.#encoder.encodeInto(text, new Uint8Array(this.#buffer, HEADER_BYTES)).written;
    Atomics.store(this.#header, LENGTH, length);
    Atomics.store(this.#header, VERSION, version + 2);
  }

  /**
   * The message ids last written: `[]` when none, or when the writer stopped (or is) in the middle of a
   * write. Meant for a board whose writer has ended; one racing a live writer sees a whole write or `[]`.
   */
  read(): readonly string[] {
    for (;;) {
      const before = Atomics.load(this.#header, VERSION);
      if (before % 2 === 1) return [];
      const length = Atomics.load(this.#header, LENGTH);
      const bytes = new Uint8Array(this.#buffer, HEADER_BYTES, length).slice();
      if (Atomics.load(this.#header, VERSION) !== before) continue;
      return length === 0 ? [] : JSON.parse(this.#decoder.decode(bytes));
    }
  }
}
