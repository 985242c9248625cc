// The one PRNG module: every random choice of the framework (task generation, task order, sample
// seeds, minibatch order, conformance checks) comes from here.
//
// - `Rng`: sfc32 (Chris Doty-Humphrey's Small Fast Counting generator), seeded through splitmix32.
//   Its whole state is four 32-bit integers, so a checkpoint can store it and a resumed run draws
//   exactly the numbers the uninterrupted run would have drawn.
// - `mixSeed(...parts)`: the one seeding scheme. A seed for a sub-stream (an epoch, an episode, an
//   agent's k-th request) is a hash of the integers that name it, never a draw whose value depends
//   on how many draws came before; so a stream does not move when another stream is used more.

export type RngState = [number, number, number, number];

function splitmix32(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x9e3779b9) >>> 0;
    let z = s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  };
}

export class Rng {
  private s: RngState;

  constructor(seed: number | RngState) {
    if (Array.isArray(seed)) {
      this.s = [seed[0] >>> 0, seed[1] >>> 0, seed[2] >>> 0, seed[3] >>> 0];
    } else {
      const sm = splitmix32(seed);
      this.s = [sm(), sm(), sm(), sm()];
      for (let i = 0; i < 12; i++) this.nextUint32(); // warm up away from the seed
    }
  }

  /** The full state; `new Rng(state)` continues the same stream. */
  state(): RngState {
    return [...this.s];
  }

  nextUint32(): number {
    let [a, b, c, d] = this.s;
    const t = (((a + b) >>> 0) + d) >>> 0;
    d = (d + 1) >>> 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) >>> 0;
    c = ((c << 21) | (c >>> 11)) >>> 0;
    c = (c + t) >>> 0;
    this.s = [a >>> 0, b, c, d];
    return t;
  }

  /** Uniform in [0, 1). */
  next(): number {
    return this.nextUint32() / 4294967296;
  }

  /** Uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  /** A seed for an engine call or an episode (31 bits, so it is a safe JSON integer everywhere). */
  seed(): number {
    return this.nextUint32() >>> 1;
  }

  /** Fisher-Yates shuffle of a copy. */
  shuffle<T>(xs: readonly T[]): T[] {
    const out = [...xs];
    for (let i = out.length - 1; i > 0; i--) {
      const j = this.int(i + 1);
      [out[i], out[j]] = [out[j]!, out[i]!];
    }
    return out;
  }
}

/** A well-mixed 31-bit seed from a list of integers (splitmix-style). */
export function mixSeed(...parts: number[]): number {
  let h = 0x9e3779b9;
  for (const p of parts) {
    h = Math.imul(h ^ (p >>> 0), 0x85ebca6b);
    h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
    h ^= h >>> 16;
    h = (h + Math.imul(Math.floor(p / 4294967296) | 0, 0x27d4eb2f)) | 0;
  }
  return (h >>> 0) & 0x7fffffff;
}

/**
 * Uniform numbers in [0, 1) from a seed (mulberry32): the generator of the synthetic and arithmetic
 * task lists and of checkEnv's random actions. Why not `Rng`: the shipped tiny configs' learning
 * recipes were tuned on the tasks this stream draws, and they are not robust to other draws (with
 * `Rng` streams, seed 0 of tiny-secret and tiny-vote no longer learned; docs/MEASUREMENTS.md).
 */
export function seededRng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
