// `parallel-vote`: n solvers (all agents but the last) act concurrently; each sees one bit of the
// answer. The aggregator (the last agent) sees the solvers' actions and must state the letter the
// bits encode: letters[b_1 b_2 ... b_n in binary], so it needs every solver. Use a graph where the
// solvers do not see each other and the aggregator sees them all, e.g.
// `{ kind: "edges", edges: [["s1", "agg"], ["s2", "agg"]] }` (a sequential graph works too).
//
// Team reward: 1 when the aggregator's first character states the letter (common.ts matching).
// Per-role rewards (info().roleRewards): for each solver role, 1 when its first character reports its
// bit (char code parity = bit in "class" mode, the digit "0"/"1" in "exact" mode), else 0.
import type { AgentId, AgentSpec, GraphSpec, TaskSuite } from "../../flexmg/types.ts";
import {
  classOf,
  generateTasks,
  type MatchMode,
  matches,
  SyntheticEnv,
  type SyntheticOptions,
} from "./common.ts";

export interface VoteTask {
  id: string;
  /** One bit per solver. */
  bits: number[];
}

export interface VoteOptions extends Omit<SyntheticOptions, "letters"> {
  /** Number of solvers (default 2); the answer has 2^solvers letters. */
  solvers?: number;
  /** How many times a solver's prompt repeats its bit (default 1); see SecretOptions.repeat. */
  repeat?: number;
}

/** The 2^n answer letters: "a", "b", ... (consecutive, so "class" matching is well defined). */
export function voteLetters(solvers: number): string {
  return Array.from({ length: 2 ** solvers }, (_, i) => String.fromCharCode(97 + i)).join("");
}

export function voteTasks(opts: VoteOptions = {}): { train: VoteTask[]; eval: VoteTask[] } {
  const n = opts.solvers ?? 2;
  return generateTasks(opts, (rng, id) => ({
    id,
    bits: Array.from({ length: n }, () => (rng() < 0.5 ? 0 : 1)),
  }));
}

export class VoteEnv extends SyntheticEnv<VoteTask> {
  private readonly letters: string;
  private readonly match: MatchMode;
  private readonly solvers: AgentId[];
  private readonly repeat: number;

  constructor(agents: AgentSpec[], graph: GraphSpec, opts: VoteOptions = {}) {
    const n = opts.solvers ?? 2;
    if (!Number.isInteger(n) || n < 1 || n > 4) {
      throw new Error(`parallel-vote.solvers: expected an integer in 1..4, got ${opts.solvers}`);
    }
    super(agents, graph, n + 1, "parallel-vote");
    if (agents.length !== n + 1) {
      throw new Error(`parallel-vote: expected ${n} solvers and 1 aggregator, got ${agents.length} agents`);
    }
    this.letters = voteLetters(n);
    this.match = opts.match ?? "class";
    this.solvers = agents.slice(0, n).map((a) => a.id);
    this.repeat = opts.repeat ?? 1;
    if (!Number.isInteger(this.repeat) || this.repeat < 1) {
      throw new Error(`parallel-vote.repeat: expected a positive integer, got ${opts.repeat}`);
    }
  }

  private get aggregator(): AgentId {
    return this.specs[this.specs.length - 1]!.id;
  }

  protected start(task: VoteTask): void {
    if (task.bits.length !== this.solvers.length) {
      throw new Error(
        `parallel-vote task ${task.id}: expected ${this.solvers.length} bits, got ${task.bits.length}`,
      );
    }
    const texts: Record<AgentId, string> = { [this.aggregator]: "letter?" };
    this.solvers.forEach((s, i) => {
      texts[s] = `bit: ${String(task.bits[i]).repeat(this.repeat)}`;
    });
    this.team.reset(texts);
  }

  protected afterAct(): void {
    if (!this.team.stepComplete()) return;
    const task = this.task!;
    const expected = this.letters[task.bits.reduce((acc, b) => acc * 2 + b, 0)]!;
    const answer = this.team.actionOf(this.aggregator) ?? "";
    const right = matches(answer, expected, this.letters, this.match);
    const roleRewards: Record<string, number> = {};
    this.solvers.forEach((s, i) => {
      const said = this.team.actionOf(s) ?? "";
      const ok =
        this.match === "exact"
          ? said.trimStart()[0] === String(task.bits[i])
          : classOf(said, 2) === task.bits[i];
      roleRewards[this.team.role(s)] = ok ? 1 : 0;
    });
    this.end(right ? 1 : 0, { expected, answer }, roleRewards);
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
