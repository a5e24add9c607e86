/**
 * The memory broker's duplicate windows and archive: keys remembered for a window of seconds within a
 * byte bound.
 *
 * @module
 */

/** The fewest cells an {@link ExpiringMap}'s index table has (a power of two). */
const MIN_CELLS = 16;
/** Marks a removed entry in an {@link ExpiringMap}'s index table (an empty cell holds 0). */
const REMOVED = -1;

/** FNV-1a over a string's UTF-16 code units, folded to 30 bits (a small integer to V8). */
function hashKey(key: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) hash = Math.imul(hash ^ key.charCodeAt(i), 0x01000193);
  return (hash ^ (hash >>> 15)) & 0x3fffffff;
}

/**
 * What an {@link ExpiringMap} charges one entry against its byte bound: the key's UTF-16 code units and the
 * fixed bookkeeping of an entry (its slots in the parallel arrays and its share of the index table).
 */
function entryBytes(key: string): number {
  return 2 * key.length + ENTRY_BOOKKEEPING_BYTES;
}

/** The fixed bytes an {@link ExpiringMap} entry costs besides its key (see {@link entryBytes}). */
const ENTRY_BOOKKEEPING_BYTES = 64;

/**
 * Keys remembered for a window of seconds and at most `maxBytes` (see {@link entryBytes}), pruned lazily
 * from the oldest: an entry the byte bound pushes out is forgotten as if its time had passed. A duplicate
 * window holds every
 * publication id of the last minutes, so this keeps them in its own open-addressing table rather than a
 * Map: entries lie in insertion order in parallel arrays (key, time, value), and an Int32Array indexes
 * them, each cell a pair (entry index + 1, or 0 empty, or {@link REMOVED}; the key's hash), so a lookup
 * compares hashes within one run of cells and reads a key only on a hash match, growing never rehashes a
 * string, and the collector scans no record per key. Pruning walks the entries from the oldest; an entry
 * a later `set` or a `delete` replaced is skipped when its turn comes. The table is rebuilt (dropping dead
 * entries) once its empty cells run low or its entries outnumber its cells.
 */
export class ExpiringMap<V> {
  #keys: (string | undefined)[] = [];
  /** Monotonic readings, non-decreasing: a plain array of doubles keeps them unboxed. */
  #times: number[] = [];
  #values: (V | undefined)[] = [];
  /** Each entry's cell. */
  #cells: number[] = [];
  /** Index of the oldest entry not pruned yet. */
  #head = 0;
  /** Cell `c` is `[2c]` (entry index + 1, 0 or REMOVED) and `[2c + 1]` (its key's hash). */
  #table = new Int32Array(2 * MIN_CELLS);
  /** Cells not empty (live or removed). */
  #used = 0;
  #live = 0;
  /** The last key hashed and its hash: a publish looks its id up, then inserts it. */
  #hashed = "";
  #hash = hashKey("");
  /** What the entries from the oldest not pruned on take (superseded ones too: their keys are still held). */
  #bytes = 0;

  constructor(public seconds: number, readonly maxBytes = Infinity) {}

  get(key: string, now: number): V | undefined {
    const cell = this.#find(key, this.#hashOf(key));
    if (cell < 0) return undefined;
    const index = this.#table[2 * cell] - 1;
    return now - this.#times[index] < this.seconds ? this.#values[index] : undefined;
  }

  set(key: string, value: V, now: number): void {
    if (this.seconds <= 0) return;
    this.#prune(now);
    const bytes = entryBytes(key);
    while (this.#head < this.#keys.length && this.#bytes + bytes > this.maxBytes) this.#dropOldest();
    if ((this.#used + 1) * 4 > this.#table.length || this.#keys.length * 2 >= this.#table.length) {
      this.#rebuild();
    }
    const hash = this.#hashOf(key);
    let cell = this.#find(key, hash);
    if (cell < 0) {
      cell = -cell - 1;
      if (this.#table[2 * cell] === 0) this.#used++;
      this.#table[2 * cell + 1] = hash;
      this.#live++;
    }
    this.#table[2 * cell] = this.#keys.length + 1;
    this.#keys.push(key);
    this.#times.push(now);
    this.#values.push(value);
    this.#cells.push(cell);
    this.#bytes += bytes;
  }

  delete(key: string): void {
    if (this.#live === 0) return;
    const cell = this.#find(key, this.#hashOf(key));
    if (cell < 0) return;
    this.#table[2 * cell] = REMOVED;
    this.#live--;
  }

  #hashOf(key: string): number {
    if (key !== this.#hashed) {
      this.#hashed = key;
      this.#hash = hashKey(key);
    }
    return this.#hash;
  }

  /** The cell holding `key`, or `-(cell + 1)` for the cell where it would go. */
  #find(key: string, hash: number): number {
    const table = this.#table;
    const mask = (table.length >> 1) - 1;
    let free = -1;
    for (let cell = hash & mask;; cell = (cell + 1) & mask) {
      const slot = table[2 * cell];
      if (slot === 0) return -((free < 0 ? cell : free) + 1);
      if (slot === REMOVED) {
        if (free < 0) free = cell;
      } else if (table[2 * cell + 1] === hash && this.#keys[slot - 1] === key) {
        return cell;
      }
    }
  }

  #prune(now: number): void {
    const times = this.#times;
    while (this.#head < times.length && now - times[this.#head] >= this.seconds) this.#dropOldest();
  }

  /** Forgets the oldest entry not pruned yet (a no-op on its cell when a later `set` or `delete` replaced it). */
  #dropOldest(): void {
    const head = this.#head;
    const cell = this.#cells[head];
    if (this.#table[2 * cell] === head + 1) {
      this.#table[2 * cell] = REMOVED;
      this.#live--;
    }
    this.#bytes -= entryBytes(this.#keys[head] as string);
    this.#keys[head] = undefined;
    this.#values[head] = undefined;
    this.#head = head + 1;
  }

  /**
   * Keeps only the live entries, in order (moved down in place), indexed in a new table of at least four
   * cells per entry.
   */
  #rebuild(): void {
    const old = this.#table;
    const keys = this.#keys;
    const times = this.#times;
    const values = this.#values;
    const cells = this.#cells;
    let size = MIN_CELLS;
    while (size < (this.#live + 1) * 4) size *= 2;
    const table = new Int32Array(2 * size);
    const mask = size - 1;
    let to = 0;
    let bytes = 0;
    for (let index = this.#head; index < keys.length; index++) {
      const from = cells[index];
      if (old[2 * from] !== index + 1) continue;
      bytes += entryBytes(keys[index] as string);
      const hash = old[2 * from + 1];
      let cell = hash & mask;
      while (table[2 * cell] !== 0) cell = (cell + 1) & mask;
      table[2 * cell] = to + 1;
      table[2 * cell + 1] = hash;
      if (to !== index) {
        keys[to] = keys[index];
        times[to] = times[index];
        values[to] = values[index];
      }
      cells[to++] = cell;
    }
    keys.length = to;
    times.length = to;
    values.length = to;
    cells.length = to;
    this.#head = 0;
    this.#table = table;
    this.#used = to;
    this.#bytes = bytes;
  }
}
