// Shared pieces of the synthetic tasks: tiny cooperative problems a random-init byte-level model can
// learn in about a minute on CPU (DESIGN §9). Answers are judged on their FIRST character only.
//
// Rewards (the same for every synthetic task): the outcome's team reward (1 solved, 0 not, or a
// share) and the per-role rewards a task documents; routing them is the trainer's business
// (src/algo). No per-action rewards: takeRewards() stays empty.
//
// Matching modes:
// - "exact": the answer's first character must be the expected letter.
// - "class": characters are grouped by char code modulo k (k = the number of letters); the answer is
//   right when its first character is in the expected letter's class. The letter itself always is,
//   and a random policy over a byte vocabulary is right about 1/(2k) of the time (half the bytes are
//   not valid UTF-8 on their own and decode to U+FFFD, which is never right), so the reward signal
//   exists from the first iteration. This is the default: it is what makes the tasks learnable from
//   random init; use "exact" for models that can already spell.
import { z } from "zod";
import { TeamEnv } from "../../flexmg/team.ts";
import type { AgentId, AgentSpec, GraphSpec } from "../../flexmg/types.ts";
import { nonNegInt, posInt } from "../../fields.ts";
import { seededRng } from "../../rng.ts";

export type MatchMode = "exact" | "class";

/** Why `letters` cannot be a task's alphabet, or null when it can. */
function lettersProblem(letters: string): string | null {
  const chars = [...letters];
  if (chars.length < 2) return `expected at least 2 letters, got "${letters}"`;
  const classes = new Set(chars.map((c) => c.charCodeAt(0) % chars.length));
  if (classes.size !== chars.length || new Set(chars).size !== chars.length) {
    return `"${letters}" must be distinct characters whose char codes differ modulo ${chars.length} (consecutive letters do)`;
  }
  return null;
}

/** The letters answers are drawn from; their char codes must differ modulo their count. */
export const lettersField = () =>
  z
    .string({ error: "expected a string of letters" })
    .superRefine((letters, ctx) => {
      const problem = lettersProblem(letters);
      if (problem) ctx.addIssue({ code: "custom", message: problem, input: letters });
    })
    .describe(
      'the letters answers are drawn from (default "abcd"); their char codes must differ modulo their count',
    );

/** Options every synthetic task takes (each task's schema extends these). */
export const syntheticOptionFields = {
  match: z
    .enum(["exact", "class"])
    .optional()
    .describe(
      '"class" (default): an answer is right when its first character is in the expected letter\'s class (char code mod the number of letters); "exact": the letter itself',
    ),
  seed: nonNegInt()
    .optional()
    .describe("seed of the task generator (default 0); train and eval tasks never share an id"),
  trainSize: posInt()
    .optional()
    .describe(
      "number of generated training tasks (default 64 in code; a run config sets it at task.trainSize)",
    ),
  evalSize: posInt()
    .optional()
    .describe("number of generated held-out tasks (default 32 in code; task.evalSize in a run config)"),
};

export interface SyntheticOptions {
  letters?: string;
  match?: MatchMode;
  seed?: number;
  trainSize?: number;
  evalSize?: number;
}

/**
 * The answer's first character, or undefined when there is none or it is U+FFFD: a byte-level model's
 * bytes that are not valid UTF-8 all decode to U+FFFD, and letting that one character stand for half
 * the vocabulary would make "say any high byte" a cheap attractor for one class.
 */
function firstChar(answer: string): string | undefined {
  const first = answer.trimStart()[0];
  return first === "\uFFFD" ? undefined : first;
}

/**
 * `text` with every special token's markup (`<|endoftext|>`, `<|pad|>`, ...) replaced by U+FFFD, one
 * character that matches nothing. The engine returns such tokens as their text; judged character by
 * character, one sampled token would count as a dozen characters, most of them in one class mod 4
 * ('<', '|', 'p', 'd'), a cheap attractor for that class.
 */
export function withoutSpecialTokens(text: string): string {
  return text.replace(/<\|[^|<>]*\|>/g, "\uFFFD");
}

/** Whether `answer` states `expected` under the matching mode (first character only). */
export function matches(answer: string, expected: string, letters: string, mode: MatchMode): boolean {
  const first = firstChar(answer);
  if (first === undefined) return false;
  if (mode === "exact") return first === expected;
  return first.charCodeAt(0) % letters.length === expected.charCodeAt(0) % letters.length;
}

/**
 * The share of `upTo` character slots that `answer`'s first `upTo` characters fill with `expected`
 * (under the matching mode): characters not said count as wrong, so "aa" earns 0.5 for upTo 4. A
 * shaping reward for agents that say several characters: one that repeats the secret is paid more
 * than one that says it once.
 */
export function matchFraction(
  answer: string,
  expected: string,
  letters: string,
  mode: MatchMode,
  upTo: number,
): number {
  const chars = [...answer.trim()].slice(0, upTo);
  return chars.filter((c) => matches(c, expected, letters, mode)).length / upTo;
}

/** Index of the class of `answer`'s first character among `n` classes (char code mod n), or -1 if empty. */
export function classOf(answer: string, n: number): number {
  const first = firstChar(answer);
  return first === undefined ? -1 : first.charCodeAt(0) % n;
}

/** Deterministic task lists: `make(rng, i)` builds task i; train and eval use disjoint generator streams. */
export function generateTasks<T>(
  opts: SyntheticOptions,
  make: (rng: () => number, id: string) => T,
): { train: T[]; eval: T[] } {
  const seed = opts.seed ?? 0;
  const trainRng = seededRng(seed * 2 + 1);
  const evalRng = seededRng(seed * 2 + 2);
  const train = Array.from({ length: opts.trainSize ?? 64 }, (_, i) => make(trainRng, `train-${i}`));
  const evalTasks = Array.from({ length: opts.evalSize ?? 32 }, (_, i) => make(evalRng, `eval-${i}`));
  return { train, eval: evalTasks };
}

export function pick<T>(rng: () => number, xs: readonly T[]): T {
  return xs[Math.floor(rng() * xs.length)]!;
}

/**
 * The Env plumbing the synthetic tasks share. A task implements `start` (texts per agent,
 * scheduling) and `afterAct` (judging, scheduling, and `finish` when the episode is over).
 */
export abstract class SyntheticEnv<Task> extends TeamEnv<Task> {
  protected task: Task | undefined;
  private facts: Record<string, unknown> = {};

  constructor(
    protected readonly specs: AgentSpec[],
    graph: GraphSpec,
    minAgents: number,
    name: string,
  ) {
    if (specs.length < minAgents) {
      throw new Error(`${name}: expected at least ${minAgents} agents, got ${specs.length}`);
    }
    super(specs, graph);
  }

  protected abstract start(task: Task): void;
  protected abstract afterAct(agent: AgentId, text: string): void;

  async reset(task: Task, _seed: number): Promise<void> {
    // The synthetic tasks are deterministic given the task: the seed has nothing to randomise.
    this.task = task;
    this.facts = {};
    this.start(task);
  }

  async act(agent: AgentId, text: string): Promise<void> {
    this.team.record(agent, text);
    this.afterAct(agent, text);
  }

  override info(): Record<string, unknown> {
    return { ...this.facts };
  }

  /** Ends the episode: the team reward (correct when it is 1), per-role rewards, and diagnostics. */
  protected finish(
    teamReward: number,
    facts: Record<string, unknown>,
    roleRewards: Record<string, number> = {},
  ): void {
    this.facts = facts;
    this.end({ correct: teamReward >= 1, score: teamReward, teamReward, roleRewards });
  }
}
