// Short arithmetic word problems, generated from a seed: the demo's task.
//
// Why generated and not GSM8K: a 135M model solves almost no GSM8K problem, so RL has no signal.
// One-step "has a, gets b more" problems sit where a small model is right sometimes (greedy) and
// far more often in some of several samples, which is where RL visibly pays.
// Train and eval problems come from different seeds and every eval problem's text is removed from
// the training set, so evaluation never sees a training problem.
import { seededRng } from "../../rng.ts";
import type { MathProblem } from "./data.ts";

const NAMES = ["Tom", "Anna", "Sam", "Lily", "Max", "Mia", "Ben", "Zoe", "Leo", "Ella"];
const ITEMS = ["apples", "books", "coins", "pens", "cards", "stamps", "marbles", "shells"];
const GAIN = ["gets", "buys", "finds", "is given"];
const LOSS = ["gives away", "loses", "sells", "uses"];

function pick<T>(rng: () => number, xs: readonly T[]): T {
  return xs[Math.floor(rng() * xs.length)]!;
}

function int(rng: () => number, lo: number, hi: number): number {
  return lo + Math.floor(rng() * (hi - lo + 1));
}

/** One problem: addition or subtraction of small numbers, answer a non-negative integer. */
export function arithmeticProblem(rng: () => number, id: string): MathProblem {
  const name = pick(rng, NAMES);
  const item = pick(rng, ITEMS);
  const b = int(rng, 1, 9);
  if (rng() < 0.5) {
    const a = int(rng, 1, 9);
    const verb = pick(rng, GAIN);
    return {
      id,
      problem: `${name} has ${a} ${item}. ${name} ${verb} ${b} more ${item}. How many ${item} does ${name} have now?`,
      answer: String(a + b),
    };
  }
  const a = b + int(rng, 1, 9);
  const verb = pick(rng, LOSS);
  return {
    id,
    problem: `${name} has ${a} ${item}. ${name} ${verb} ${b} ${item}. How many ${item} does ${name} have now?`,
    answer: String(a - b),
  };
}

/** A change of the count: a gain or a loss of `n`, as words. */
function change(rng: () => number, have: number, item: string): { n: number; text: string } {
  if (have < 2 || rng() < 0.5) {
    const n = int(rng, 1, 9);
    return { n, text: `${pick(rng, GAIN)} ${n} more ${item}` };
  }
  const n = int(rng, 1, Math.min(9, have - 1));
  return { n: -n, text: `${pick(rng, LOSS)} ${n} ${item}` };
}

/**
 * Two changes in a row ("has a, gets b more, then loses c"): the answer needs two operations, and
 * `steps` holds the count after the first, which a team can split at, and `parts` the text cut there:
 * the first change as a one-step problem, then the second as one, starting from `{step1}` (the count
 * the first step's agent states; `splitParts` in env.ts fills it in).
 */
export function twoStepProblem(rng: () => number, id: string): MathProblem {
  const name = pick(rng, NAMES);
  const item = pick(rng, ITEMS);
  const a = int(rng, 1, 9);
  const first = change(rng, a, item);
  const mid = a + first.n;
  const second = change(rng, mid, item);
  return {
    id,
    problem:
      `${name} has ${a} ${item}. ${name} ${first.text}. Then ${name} ${second.text}. ` +
      `How many ${item} does ${name} have now?`,
    answer: String(mid + second.n),
    steps: [String(mid)],
    parts: [
      `${name} has ${a} ${item}. ${name} ${first.text}. How many ${item} does ${name} have now?`,
      `${name} has {step1} ${item}. ${name} ${second.text}. How many ${item} does ${name} have now?`,
    ],
  };
}

export type ArithKind = "one-step" | "two-step";

const GENERATORS: Record<ArithKind, (rng: () => number, id: string) => MathProblem> = {
  "one-step": arithmeticProblem,
  "two-step": twoStepProblem,
};

/** `count` distinct problems from a seed. */
export function arithmeticProblems(
  seed: number,
  count: number,
  prefix = "arith",
  kind: ArithKind = "one-step",
): MathProblem[] {
  const make = GENERATORS[kind];
  const rng = seededRng(seed);
  const seen = new Set<string>();
  const out: MathProblem[] = [];
  // The problem space has tens of thousands of texts; a bounded loop still refuses to spin forever.
  for (let tries = 0; out.length < count && tries < count * 50; tries++) {
    const p = make(rng, `${prefix}-${seed}-${out.length}`);
    if (seen.has(p.problem)) continue;
    seen.add(p.problem);
    out.push(p);
  }
  if (out.length < count) throw new Error(`arithmetic: could only make ${out.length} distinct problems`);
  return out;
}

/** Disjoint train and eval sets: eval texts never appear in train. */
export function arithmeticSplits(
  seed: number,
  trainCount: number,
  evalCount: number,
  kind: ArithKind = "one-step",
): { train: MathProblem[]; eval: MathProblem[] } {
  const evalSet = arithmeticProblems(seed + 1_000_003, evalCount, "arith-eval", kind);
  const held = new Set(evalSet.map((p) => p.problem));
  const train = arithmeticProblems(seed, trainCount + evalCount, "arith-train", kind)
    .filter((p) => !held.has(p.problem))
    .slice(0, trainCount);
  if (train.length < trainCount) throw new Error("arithmetic: not enough distinct training problems");
  return { train, eval: evalSet };
}
