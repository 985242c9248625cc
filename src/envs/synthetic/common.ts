// Shared pieces of the synthetic tasks: tiny cooperative problems a random-init byte-level model can
// learn in about a minute on CPU (DESIGN §9). Answers are judged on their FIRST character only.
//
// Rewards (the same for every synthetic task):
// - `takeRewards()` gives the TEAM reward (1 solved, 0 not) to every agent when the episode ends;
//   routing it (to every agent, to the last one only, per role) is the trainer's business (src/algo).
// - `info().teamReward` repeats it; `info().roleRewards` (role -> number) carries the optional
//   per-role rewards a task documents, for per-role routing. They are never mixed into takeRewards().
// - `info().correct` and `info().score` follow the TaskSuite contract.
//
// Matching modes:
// - "exact": the answer's first character must be the expected letter.
// - "class": characters are grouped by char code modulo k (k = the number of letters); the answer is
//   right when its first character is in the expected letter's class. The letter itself always is,
//   and a random policy over a byte vocabulary is right about 1/(2k) of the time (half the bytes are
//   not valid UTF-8 on their own and decode to U+FFFD, which is never right), so the reward signal
//   exists from the first iteration. This is the default: it is what makes the tasks learnable from
//   random init; use "exact" for models that can already spell.
import { seededRng } from "../../flexmg/rng.ts";
import { TeamEnv } from "../../flexmg/team.ts";
import type { AgentId, AgentSpec, GraphSpec, Rewards } from "../../flexmg/types.ts";

export type MatchMode = "exact" | "class";

export interface SyntheticOptions {
  /** The letters answers are drawn from (default "abcd"); their char codes must differ modulo their count. */
  letters?: string;
  match?: MatchMode;
  /** Number of training / held-out tasks generated (defaults 64 / 32). */
  trainSize?: number;
  evalSize?: number;
  /** Seed of the task generator (default 0). Train and eval tasks never share an id. */
  seed?: number;
}

export function resolveLetters(letters = "abcd"): string {
  const chars = [...letters];
  if (chars.length < 2) throw new Error(`letters: expected at least 2 letters, got "${letters}"`);
  const classes = new Set(chars.map((c) => c.charCodeAt(0) % chars.length));
  if (classes.size !== chars.length || new Set(chars).size !== chars.length) {
    throw new Error(
      `letters: "${letters}" must be distinct characters whose char codes differ modulo ${chars.length} (consecutive letters do)`,
    );
  }
  return letters;
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

/** A task option that must be a positive integer: `value`, or `fallback` when absent. */
export function positiveIntOption(
  task: string,
  name: string,
  value: number | undefined,
  fallback: number,
): number {
  const x = value ?? fallback;
  if (!Number.isInteger(x) || x < 1)
    throw new Error(`${task}.${name}: expected a positive integer, got ${value}`);
  return x;
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
 * The Env plumbing the synthetic tasks share: the TeamEpisode, rewards, the over flags. A task
 * implements `start` (texts per agent, scheduling) and `afterAct` (judging, scheduling, finishing).
 */
export abstract class SyntheticEnv<Task> extends TeamEnv<Task> {
  protected task: Task | undefined;
  protected pendingRewards: Rewards = {};
  protected facts: Record<string, unknown> = {};
  private done = false;

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
    this.pendingRewards = {};
    this.facts = {};
    this.done = false;
    this.start(task);
  }

  async act(agent: AgentId, text: string): Promise<void> {
    this.team.record(agent, text);
    this.afterAct(agent, text);
  }

  takeRewards(): Rewards {
    const r = this.pendingRewards;
    this.pendingRewards = {};
    return r;
  }

  get terminated(): boolean {
    return this.done;
  }

  get truncated(): boolean {
    return false;
  }

  info(): Record<string, unknown> {
    return { ...this.facts };
  }

  /** Ends the episode with a team reward to every agent, plus optional per-role rewards in info(). */
  protected end(
    teamReward: number,
    facts: Record<string, unknown>,
    roleRewards: Record<string, number> = {},
  ) {
    for (const a of this.agents) this.pendingRewards[a] = (this.pendingRewards[a] ?? 0) + teamReward;
    this.facts = { ...facts, correct: teamReward >= 1, score: teamReward, teamReward, roleRewards };
    this.done = true;
    this.team.finish();
  }
}
