// MathEnv: a team solves a math problem; the reward is the fraction of answering agents whose
// extracted answer is correct (the MARFT reference).
//
// Team: any agents and any graph (sequential: the reference's reasoner -> actor chain; parallel;
// explicit edges; dynamic, see below). Every agent sees the problem and the shared history.
// Answering agents: those whose role is in `answerRoles`; by default every agent except planning
// roles (reasoner, planner, orchestrator), or every agent when that leaves none.
//
// Attempts (the reference's judge loop): after each step (= one attempt of the whole team) the
// attempt's actions and a judge line "The answer is correct." / "The answer is incorrect." are
// appended to the shared history. The episode ends when an attempt is judged correct (all answering
// agents correct) or after `attempts` attempts; both are `terminated` (the rules of the game ended it:
// no reward can follow, so no bootstrap). `cutAfter` < attempts cuts the episode earlier, as a
// rollout limit: that end is `truncated` (the game would have gone on; the trainer bootstraps).
//
// Outcome: correct, score and teamReward of the last attempt, and roleRewards (per role, for
// per-role routing):
//   answering role: 1 when its last action had an extractable answer (a format reward: \boxed{}),
//   planning role:  1 when none of its actions stated a final answer (\boxed{}) (plan, don't solve).
//   step<i> (with `stepRoles`): 1 when the i-th step role's last answer is the problem's i-th
//   intermediate result (`steps`), so a team that splits a problem can train each agent for its step.
//   With `splitParts` each step role sees only its step's part of the problem text (`parts`) and the
//   other agents the last part: every agent gets the one operation that is its own, as in a pipeline
//   whose stages each receive their piece of the work. A part may name earlier steps' results as
//   `{step1}`, `{step2}`, ...: the env writes in the number that step's agent stated (`?` if none),
//   and an agent whose part does so sees that filled-in text instead of its parents' raw actions (a
//   135M model reads "Tom has 15 pens. Tom loses 2 pens." far better than the stepper's sentence
//   after the question: docs/MEASUREMENTS.md, "The split demo").
// info() (diagnostics): gold, answers (per agent, last attempt), attempts, rewards (per attempt).
//
// Dynamic graphs: each attempt starts with the first agent (profile order); an agent's action that
// names another agent (its id, as a word) who has not acted in this attempt schedules that agent
// next, seeing everyone who acted so far in the attempt; the attempt ends when nobody is scheduled.
//
// Answer checking starts inside each answering agent's `act` (it overlaps with the sampling of the
// other agents); the last `act` of the attempt awaits the checks.
import { TeamEnv } from "../../flexmg/team.ts";
import type { AgentId, AgentSpec, ChatMessage, GraphSpec, TaskSuite } from "../../flexmg/types.ts";
import { loadMathSplits, type MathProblem } from "./data.ts";
import { extractAnswer, extractBoxed } from "./extract.ts";
import { type GradeResult, gradeAnswer, gradeResponse } from "./grader.ts";

export type { MathProblem } from "./data.ts";

/** How an answer is taken from a response: \boxed only; boxed, else "the answer is"; or also the last number. */
export type ExtractMode = "boxed" | "answer" | "last-number";

export interface MathEnvOptions {
  /** Attempts per problem, with judge feedback after each (default 1; the reference uses 3). */
  attempts?: number;
  /** Cut the episode (truncated) after this many attempts, if fewer than `attempts`. */
  cutAfter?: number;
  /** Answer extraction (default "answer"; "last-number" suits GSM8K). */
  extract?: ExtractMode;
  /** Roles whose answers count for the reward (default: every role but reasoner/planner/orchestrator). */
  answerRoles?: string[];
  /** Time limit of one answer check in ms (default 2000). */
  timeoutMs?: number;
  /** Roles that compute the problem's intermediate results, in order (roleRewards step1, step2, ...). */
  stepRoles?: string[];
  /** Step role i sees `parts[i]` of the problem, every other agent the last part (needs stepRoles). */
  splitParts?: boolean;
}

export interface MathSuiteOptions extends MathEnvOptions {
  /** Problems: the MARFT reference's JSON, GSM8K JSONL or MATH-500 JSONL. */
  trainFile?: string;
  /** Held-out problems; omitted: the last `evalSplit` rows of trainFile. */
  evalFile?: string;
  evalSplit?: number;
  limit?: number;
  evalLimit?: number;
  /** Problems given directly instead of files (tests, programmatic use). */
  train?: MathProblem[];
  eval?: MathProblem[];
}

const PLANNING_ROLES = new Set(["reasoner", "planner", "orchestrator"]);

export function extractWith(mode: ExtractMode, text: string): string | null {
  if (mode === "boxed") return extractBoxed(text);
  return extractAnswer(text, { lastNumber: mode === "last-number" });
}

interface Check {
  agent: AgentId;
  answer: string | null;
  result: Promise<GradeResult | null>;
}

export class MathEnv extends TeamEnv<MathProblem> {
  private readonly answering: ReadonlySet<AgentId>;
  private readonly roles: Map<AgentId, string>;
  private readonly attempts: number;
  private readonly cutAfter: number;
  private readonly extract: ExtractMode;
  private readonly timeoutMs: number;
  private readonly stepRoles: string[];
  private readonly splitParts: boolean;
  private problem: MathProblem | undefined;
  /** splitParts: each agent's part of the current problem, set at reset. */
  private texts: Record<AgentId, string> = {};
  private checks: Check[] = [];
  private attemptRewards: number[] = [];
  private answers: Record<AgentId, string | null> = {};

  constructor(agents: AgentSpec[], graph: GraphSpec, opts: MathEnvOptions = {}) {
    if (agents.length === 0) throw new Error("math: expected at least one agent");
    super(agents, graph);
    this.roles = new Map(agents.map((a) => [a.id, a.role]));
    const answerRoles = opts.answerRoles ? new Set(opts.answerRoles.map((r) => r.toLowerCase())) : null;
    let answering = agents.filter((a) =>
      answerRoles ? answerRoles.has(a.role.toLowerCase()) : !PLANNING_ROLES.has(a.role.toLowerCase()),
    );
    if (answerRoles && answering.length === 0) {
      throw new Error(`math.answerRoles: no agent has one of the roles ${[...answerRoles].join(", ")}`);
    }
    if (answering.length === 0) answering = agents;
    this.answering = new Set(answering.map((a) => a.id));
    this.attempts = opts.attempts ?? 1;
    if (!Number.isInteger(this.attempts) || this.attempts < 1) {
      throw new Error(`math.attempts: expected a positive integer, got ${opts.attempts}`);
    }
    this.cutAfter = opts.cutAfter ?? this.attempts;
    if (!Number.isInteger(this.cutAfter) || this.cutAfter < 1) {
      throw new Error(`math.cutAfter: expected a positive integer, got ${opts.cutAfter}`);
    }
    this.extract = opts.extract ?? "answer";
    if (!["boxed", "answer", "last-number"].includes(this.extract)) {
      throw new Error(
        `math.extract: expected "boxed", "answer" or "last-number", got "${String(opts.extract)}"`,
      );
    }
    this.timeoutMs = opts.timeoutMs ?? 2000;
    this.stepRoles = (opts.stepRoles ?? []).map((r) => r.toLowerCase());
    const known = new Set(agents.map((a) => a.role.toLowerCase()));
    const unknown = this.stepRoles.find((r) => !known.has(r));
    if (unknown !== undefined) throw new Error(`math.stepRoles: no agent has the role "${unknown}"`);
    this.splitParts = opts.splitParts ?? false;
    if (this.splitParts && this.stepRoles.length === 0) {
      throw new Error("math.splitParts: expected stepRoles (whose steps the parts are)");
    }
  }

  async reset(problem: MathProblem, _seed: number): Promise<void> {
    // Deterministic given the problem: sampling randomness lives in the engine, not here.
    if (this.stepRoles.length > (problem.steps?.length ?? 0)) {
      throw new Error(
        `math.stepRoles: ${this.stepRoles.length} step roles, but problem ${problem.id} has ${problem.steps?.length ?? 0} intermediate results`,
      );
    }
    this.problem = problem;
    this.checks = [];
    this.attemptRewards = [];
    this.answers = {};
    this.texts = this.splitParts ? this.partsFor(problem) : {};
    this.begin(this.splitParts ? this.texts : problem.problem);
    this.scheduleFirst();
  }

  async act(agent: AgentId, text: string): Promise<void> {
    const problem = this.problem;
    if (!problem) throw new Error("act: reset() was not called");
    this.team.record(agent, text); // synchronous, before any await (TeamEpisode's contract)
    if (this.answering.has(agent)) {
      const answer = extractWith(this.extract, text);
      this.checks.push({ agent, answer, result: this.grade(text, answer, problem) });
    }
    if (this.team.graph.kind === "dynamic") this.scheduleNamed(text);
    if (!this.team.stepComplete()) return;

    // The attempt is complete: judge it.
    const checks = this.checks;
    this.checks = [];
    const results = await Promise.all(checks.map((c) => c.result));
    const right = results.filter((r) => r?.equal === true).length;
    const score = checks.length > 0 ? right / checks.length : 0;
    const correct = checks.length > 0 && right === checks.length;
    this.answers = Object.fromEntries(checks.map((c) => [c.agent, c.answer]));
    this.attemptRewards.push(score);

    const attempt = this.team.step + 1;
    const lines = this.team.stepActions().map((x) => `${x.label}: ${x.text}`);
    this.team.addHistory(`Attempt ${attempt}:\n${lines.join("\n")}`);
    this.team.addHistory(`The answer is ${correct ? "correct" : "incorrect"}.`);
    const over = correct || attempt >= this.attempts;
    if (over || attempt >= this.cutAfter) {
      const outcome = { correct, score, teamReward: score, roleRewards: this.roleRewards() };
      this.end(outcome, over ? "terminated" : "truncated");
    } else {
      this.team.nextStep();
      this.scheduleFirst();
    }
  }

  override info(): Record<string, unknown> {
    return {
      gold: this.problem?.answer,
      answers: { ...this.answers },
      attempts: this.attemptRewards.length,
      rewards: [...this.attemptRewards],
    };
  }

  /** splitParts: a part that names `{step<i>}` is shown with the step roles' stated numbers in it. */
  override observe(agent: AgentId): ChatMessage[] {
    const text = this.texts[agent];
    if (text === undefined || !/\{step\d+\}/.test(text)) return super.observe(agent);
    const actions = this.team.stepActions();
    const filled = text.replace(
      /\{step(\d+)\}/g,
      (_m, i: string) => this.stepAnswer(this.stepRoles[Number(i) - 1]!, actions) ?? "?",
    );
    return this.team.observe(agent, filled);
  }

  /** The answer stated in the last of `actions` by the agent with this step role, if any. */
  private stepAnswer(role: string, actions: readonly { agent: AgentId; text: string }[]): string | null {
    const last = actions.filter((x) => this.roles.get(x.agent)!.toLowerCase() === role).at(-1);
    return last === undefined ? null : extractWith(this.extract, last.text);
  }

  /** splitParts: each agent's own text, step role i's `parts[i]` and everyone else's the last part. */
  private partsFor(problem: MathProblem): Record<AgentId, string> {
    const parts = problem.parts ?? [];
    if (parts.length !== this.stepRoles.length + 1) {
      throw new Error(
        `math.splitParts: problem ${problem.id} has ${parts.length} parts, expected ${this.stepRoles.length + 1} (one per step role, then the rest)`,
      );
    }
    for (const m of parts.join(" ").matchAll(/\{step(\d+)\}/g)) {
      if (Number(m[1]) < 1 || Number(m[1]) > this.stepRoles.length) {
        throw new Error(
          `math.splitParts: problem ${problem.id} names ${m[0]}, but there are ${this.stepRoles.length} step roles`,
        );
      }
    }
    return Object.fromEntries(
      this.agents.map((a) => {
        const i = this.stepRoles.indexOf(this.roles.get(a)!.toLowerCase());
        return [a, parts[i === -1 ? this.stepRoles.length : i]!];
      }),
    );
  }

  /** Per role: a format reward for answering roles, "no final answer" for planning roles. */
  private roleRewards(): Record<string, number> {
    const sum: Record<string, number> = {};
    const count: Record<string, number> = {};
    const actions = this.team.actions();
    const lastStep = this.team.step;
    for (const a of this.agents) {
      const role = this.roles.get(a)!;
      const mine = actions.filter((x) => x.agent === a);
      let r: number;
      if (this.answering.has(a)) {
        const last = mine.filter((x) => x.step === lastStep).at(-1);
        r = last !== undefined && extractWith(this.extract, last.text) !== null ? 1 : 0;
      } else {
        r = mine.length > 0 && mine.every((x) => extractBoxed(x.text) === null) ? 1 : 0;
      }
      sum[role] = (sum[role] ?? 0) + r;
      count[role] = (count[role] ?? 0) + 1;
    }
    // several agents with one role: the role's reward is their mean
    const out = Object.fromEntries(Object.keys(sum).map((role) => [role, sum[role]! / count[role]!]));
    this.stepRoles.forEach((role, i) => {
      const answer = this.stepAnswer(role, actions);
      out[`step${i + 1}`] = answer !== null && sameNumber(answer, this.problem!.steps![i]!) ? 1 : 0;
    });
    return out;
  }

  /**
   * The reward's judge. "boxed": the boxed answer alone. Otherwise the whole response: the TypeScript
   * checker on the answer it commits to, and Math-Verify on the response where that is not certain
   * (src/envs/math/grader.ts), given the question; no answer in the form asked for is never rewarded.
   */
  private grade(text: string, answer: string | null, problem: MathProblem): Promise<GradeResult | null> {
    if (answer === null && this.extract !== "last-number") return Promise.resolve(null);
    // the question says whether a bare list's order counts ("Enter all the solutions" does not)
    const opts = { timeoutMs: this.timeoutMs, question: problem.problem };
    if (this.extract === "boxed") return gradeAnswer(answer!, problem.answer, opts);
    return gradeResponse(text, problem.answer, {
      ...opts,
      lastNumber: this.extract === "last-number",
    });
  }

  /** Dynamic graphs: each attempt starts with the first agent in profile order. */
  private scheduleFirst(): void {
    if (this.team.graph.kind === "dynamic") this.team.schedule(this.agents[0]!);
  }

  /** Dynamic graphs: the first agent named in `text` that has not acted in this attempt acts next. */
  private scheduleNamed(text: string): void {
    const acted = new Set(this.team.stepActions().map((x) => x.agent));
    let best: AgentId | null = null;
    let bestAt = Number.POSITIVE_INFINITY;
    for (const a of this.agents) {
      if (acted.has(a) || this.team.isReady(a)) continue;
      const m = new RegExp(`(?<![\\w-])${escapeRegExp(a)}(?![\\w-])`).exec(text);
      if (m && m.index < bestAt) {
        best = a;
        bestAt = m.index;
      }
    }
    if (best !== null) this.team.schedule(best, [...acted]);
  }
}

/** Intermediate results are plain numbers: compared as numbers ("8" and "8.0" are one result). */
function sameNumber(a: string, b: string): boolean {
  const x = Number(a.replace(/,/g, ""));
  return a.trim() !== "" && Number.isFinite(x) && x === Number(b.replace(/,/g, ""));
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

/** Math problems as a TaskSuite (files or problems given directly). */
export function createMathSuite(opts: MathSuiteOptions): TaskSuite<MathProblem> {
  let train: MathProblem[];
  let evalSet: MathProblem[];
  if (opts.train) {
    train = opts.train;
    evalSet = opts.eval ?? [];
  } else {
    if (opts.trainFile === undefined) throw new Error("math: expected trainFile (or train problems)");
    const split = loadMathSplits({
      trainFile: opts.trainFile,
      evalFile: opts.evalFile,
      // with an evalFile nothing of trainFile is held out
      evalSplit: opts.evalFile === undefined ? (opts.evalSplit ?? 100) : 0,
    });
    train = split.train;
    evalSet = split.eval;
  }
  if (opts.limit !== undefined) train = train.slice(0, opts.limit);
  if (opts.evalLimit !== undefined) evalSet = evalSet.slice(0, opts.evalLimit);
  const envOpts: MathEnvOptions = {
    attempts: opts.attempts,
    cutAfter: opts.cutAfter,
    extract: opts.extract,
    answerRoles: opts.answerRoles,
    timeoutMs: opts.timeoutMs,
    stepRoles: opts.stepRoles,
    splitParts: opts.splitParts,
  };
  return {
    name: "math",
    train,
    eval: evalSet,
    taskId: (p) => p.id,
    makeEnv: (agents, graph) => new MathEnv(agents, graph, envOpts),
  };
}
