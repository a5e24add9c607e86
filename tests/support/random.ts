/**
 * The seeded pseudo-random source every randomized test uses, so a failure reproduces: a test takes its
 * seed from {@link testSeed} (VF_TEST_SEED when set, else a fresh one) and names it in its assertion
 * messages.
 *
 * @module
 */

/** A deterministic random source (mulberry32) with the helpers randomized tests need. */
export class SeededRandom {
  #state: number;

  constructor(readonly seed: number) {
    this.#state = seed >>> 0;
  }

  /** A float in [0, 1). */
  next(): number {
    this.#state = (this.#state + 0x6d2b79f5) >>> 0;
    let t = this.#state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** An integer in [min, max], both inclusive. */
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }

  /** True with probability `p`. */
  chance(p: number): boolean {
    return this.next() < p;
  }

  /** One element of a non-empty list. */
  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new RangeError("pick from an empty list");
    return items[this.int(0, items.length - 1)];
  }

  /** A shuffled copy (Fisher-Yates). */
  shuffle<T>(items: readonly T[]): T[] {
    const out = [...items];
    for (let i = out.length - 1; i > 0; i--) {
      const j = this.int(0, i);
      [out[i], out[j]] = [out[j], out[i]];
    }
    return out;
  }

  /** `n` random bytes. */
  bytes(n: number): Uint8Array {
    return Uint8Array.from({ length: n }, () => this.int(0, 255));
  }

  /** A function form of {@link next}, for APIs that take `() => number`. */
  get source(): () => number {
    return () => this.next();
  }
}

/** The seed of this run: `VF_TEST_SEED` when set (to replay a failure), else a fresh random one. */
export function testSeed(): number {
  const fixed = Deno.env.get("VF_TEST_SEED");
  if (fixed !== undefined && fixed !== "") {
    const seed = Number(fixed);
    if (!Number.isSafeInteger(seed)) throw new RangeError(`VF_TEST_SEED must be an integer, got ${fixed}`);
    return seed;
  }
  return crypto.getRandomValues(new Uint32Array(1))[0];
}
