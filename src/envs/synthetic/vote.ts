// `parallel-vote`: n solvers (all agents but the last) act concurrently; solver i sees one bit b_i as
// a letter of its OWN pair, letters[2i + b_i] (solver 1: a/b, solver 2: c/d, ...). The aggregator (the
// last agent) sees the solvers' actions and must state the letter the bits encode, answer letter
// number b_1 b_2 ... b_n in binary ("a" for 00, "b" for 01, "c" for 10, "d" for 11), so it needs
// every solver. Use a graph where the solvers do not see each other and the aggregator sees them all,
// e.g. `{ kind: "edges", edges: [["s1", "agg"], ["s2", "agg"]] }` (a sequential graph works too).
//
// Why a pair of letters per solver: a random-init model behaves roughly like a mean of its context's
// embeddings, so it cannot tell WHICH solver said what, only which characters were said. With one
// alphabet for all solvers (each says "0" or "1"), bits 01 and 10 look the same to it; with a pair
// per solver, each bit of the answer is a presence test (did someone say a or b?), which it can learn
// as the `secret` listener does.
//
// Matching (common.ts): solvers over their 2n letters ("class": char code mod 2n, so the pairs'
// classes are disjoint too), the aggregator over the 2^n answer letters. Special tokens' text
// (`<|endoftext|>`) counts as one character that matches nothing.
// Team reward: the share of the n bits the aggregator's answer gets right (its class read as n bits;
// no letter: 0); outcome().correct when all are. An aggregator that ignores the solvers gets each bit
// right with probability at most 1/2, so at most 1/2 in expectation, and all n right at most 1/2^n.
// Per-role rewards (outcome().roleRewards), for each solver role: the share of its first `solverChars`
// characters that state its letter MINUS `penalty` (default 1) times the share that state the other
// letter of its pair. Without the penalty a solver that always says one letter earns 1/2 and tends
// to settle there (it learns its pair long before it learns to read its bit); with it, that solver
// earns 0 in expectation, no more than one saying nothing, so the only way up is to read the bit
// (the price: with no unconditional signal left, a solver can also fail to get started;
// configs/tiny-vote.yaml has the measured seeds).
import { z } from "zod";
import type { AgentId, AgentSpec, GraphSpec, TaskSuite } from "../../flexmg/types.ts";
import { parseOptions, posInt, unit } from "../../fields.ts";
import {
  generateTasks,
  type MatchMode,
  matches,
  matchFraction,
  SyntheticEnv,
  syntheticOptionFields,
  withoutSpecialTokens,
} from "./common.ts";

export interface VoteTask {
  id: string;
  /** One bit per solver: solver i sees letters[2i + bits[i]]. */
  bits: number[];
}

export const VoteOptionsSchema = z.strictObject({
  ...syntheticOptionFields,
  solvers: z
    .number({ error: "expected an integer in 1..4" })
    .int({ error: "expected an integer in 1..4" })
    .min(1, { error: "expected an integer in 1..4" })
    .max(4, { error: "expected an integer in 1..4" })
    .optional()
    .describe("number of solvers (default 2); they use the first 2n letters, the answer the first 2^n"),
  repeat: posInt().optional().describe("how many times a solver's prompt repeats its letter (default 1)"),
  solverChars: posInt()
    .optional()
    .describe("a solver's shaping reward counts this many of its characters (default 1: the first only)"),
  penalty: unit()
    .optional()
    .describe("weight of the other-letter share subtracted from a solver's shaping reward (default 1)"),
});
export type VoteOptions = z.input<typeof VoteOptionsSchema>;

/** The first `count` letters: "a", "b", ... (consecutive, so "class" matching is well defined). */
export function voteLetters(count: number): string {
  return Array.from({ length: count }, (_, i) => String.fromCharCode(97 + i)).join("");
}

export function voteTasks(opts: VoteOptions = {}): { train: VoteTask[]; eval: VoteTask[] } {
  const o = parseOptions(VoteOptionsSchema, opts, "parallel-vote");
  const n = o.solvers ?? 2;
  return generateTasks(o, (rng, id) => ({
    id,
    bits: Array.from({ length: n }, () => (rng() < 0.5 ? 0 : 1)),
  }));
}

export class VoteEnv extends SyntheticEnv<VoteTask> {
  private readonly solverLetters: string;
  private readonly answerLetters: string;
  private readonly match: MatchMode;
  private readonly solvers: AgentId[];
  private readonly repeat: number;
  private readonly solverChars: number;
  private readonly penalty: number;

  constructor(agents: AgentSpec[], graph: GraphSpec, opts: VoteOptions = {}) {
    const o = parseOptions(VoteOptionsSchema, opts, "parallel-vote");
    const n = o.solvers ?? 2;
    super(agents, graph, n + 1, "parallel-vote");
    if (agents.length !== n + 1) {
      throw new Error(`parallel-vote: expected ${n} solvers and 1 aggregator, got ${agents.length} agents`);
    }
    this.solverLetters = voteLetters(2 * n);
    this.answerLetters = voteLetters(2 ** n);
    this.match = o.match ?? "class";
    this.solvers = agents.slice(0, n).map((a) => a.id);
    this.repeat = o.repeat ?? 1;
    this.solverChars = o.solverChars ?? 1;
    this.penalty = o.penalty ?? 1;
  }

  private get aggregator(): AgentId {
    return this.specs[this.specs.length - 1]!.id;
  }

  /** Solver i's letter for bit b. */
  private letter(i: number, b: number): string {
    return this.solverLetters[2 * i + b]!;
  }

  protected start(task: VoteTask): void {
    if (task.bits.length !== this.solvers.length) {
      throw new Error(
        `parallel-vote task ${task.id}: expected ${this.solvers.length} bits, got ${task.bits.length}`,
      );
    }
    const texts: Record<AgentId, string> = { [this.aggregator]: "letter?" };
    this.solvers.forEach((s, i) => {
      texts[s] = `letter: ${this.letter(i, task.bits[i]!).repeat(this.repeat)}`;
    });
    this.begin(texts);
  }

  protected afterAct(): void {
    if (!this.team.stepComplete()) return;
    const bits = this.task!.bits;
    const n = bits.length;
    const expected = this.answerLetters[bits.reduce((acc, b) => acc * 2 + b, 0)]!;
    const answer = withoutSpecialTokens(this.team.actionOf(this.aggregator) ?? "");
    // The index of the letter the answer states, read as n bits (most significant: solver 1).
    const k = [...this.answerLetters].findIndex((l) => matches(answer, l, this.answerLetters, this.match));
    const rightBits = k < 0 ? 0 : bits.filter((b, i) => ((k >> (n - 1 - i)) & 1) === b).length;
    const roleRewards: Record<string, number> = {};
    this.solvers.forEach((s, i) => {
      const said = withoutSpecialTokens(this.team.actionOf(s) ?? "");
      const share = (l: string) => matchFraction(said, l, this.solverLetters, this.match, this.solverChars);
      roleRewards[this.team.role(s)] =
        share(this.letter(i, bits[i]!)) - this.penalty * share(this.letter(i, 1 - bits[i]!));
    });
    this.finish(rightBits / n, { expected, answer, bitsRight: rightBits }, roleRewards);
  }
}

export function voteSuite(opts: VoteOptions = {}): TaskSuite<VoteTask> {
  const { train, eval: evalTasks } = voteTasks(opts);
  return {
    name: "parallel-vote",
    train,
    eval: evalTasks,
    taskId: (t) => t.id,
    makeEnv: (agents, graph) => new VoteEnv(agents, graph, opts),
  };
}
