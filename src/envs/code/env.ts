// CodeEnv: a team writes a Python function; the reward is the fraction of hidden tests it passes.
//
// Roles (matched on AgentSpec.role, case-insensitive):
// - coder (required; the first agent if no agent has that role): writes the solution. The solution
//   is the LAST fenced code block of its reply (```python ... ``` or ``` ... ```, an unclosed final
//   fence included); without any fence, the whole reply if it defines the entry point, else nothing.
// - reviewer (optional): sees the coder's reply (give it a graph in which it does: sequential, or an
//   edge coder -> reviewer). A reply starting with "REVISE" sends the code back with the rest of the
//   reply as feedback; anything else (e.g. "APPROVE") ends the episode.
// - tester (optional): writes assert statements (in a fenced block, or lines starting with
//   "assert"); they run against the coder's code in the sandbox and failures go back to the coder.
// - any other role: acts in the graph like everyone else; its text reaches whoever sees it.
// Sending back needs a round left: `attempts` rounds of the whole team (default 2 when the team has
// a reviewer or a tester, so it may send the code back once; 1 otherwise).
//
// Outcome: the team reward is the fraction of hidden tests the final code passes (routing it is the
// trainer's business); correct when all pass; roleRewards (for per-role routing): coder = 1 when its
// final reply had a fenced code block (a format reward); reviewer = the fraction of rounds in which
// its verdict agreed with the hidden tests (REVISE on failing code, anything else on passing code).
// info() (diagnostics): passed, total, status (sandbox status of the final run), rounds.
//
// The hidden tests of the coder's code start in the sandbox pool inside the coder's `act`, so they
// run while the reviewer or tester is being sampled; the step's last `act` awaits them.
// The reference solution is never read here: observations hold the prompt, the function name and
// signature, and (only if `visibleTests` > 0) that many of the tests.
import { join } from "node:path";
import { datasetsDir, holdOutLast } from "../datasets.ts";
import { TeamEnv } from "../../flexmg/team.ts";
import type { AgentId, AgentSpec, GraphSpec, TaskSuite } from "../../flexmg/types.ts";
import { type CodeProblem, loadCodeProblems, MBPP_FILE } from "./data.ts";
import { passedTests, testProgram } from "./harness.ts";
import { SandboxPool, type SandboxStatus } from "./sandbox.ts";

export interface CodeEnvOptions {
  /** Rounds of the team per problem; see the header. */
  attempts?: number;
  /** Wall-clock limit of one test run (all tests of a solution), default 5000. */
  timeoutMs?: number;
  /** Memory limit of one test run, default 512. */
  memoryMb?: number;
  /** How many of the tests the coder sees as examples (default 0: all hidden). */
  visibleTests?: number;
  /** The pool test runs go through (default: one per suite, as many slots as cores). */
  pool?: SandboxPool;
}

export interface CodeSuiteOptions extends CodeEnvOptions {
  /** Problems (MBPP JSON or user JSON/JSONL); default the MBPP file of ../shared/datasets. */
  trainFile?: string;
  /** Held-out problems; omitted: the last `evalSplit` rows of trainFile. */
  evalFile?: string;
  evalSplit?: number;
  limit?: number;
  evalLimit?: number;
  /** Problems given directly instead of files (tests, programmatic use). */
  train?: CodeProblem[];
  eval?: CodeProblem[];
}

export interface TestOutcome {
  passed: number;
  total: number;
  status: SandboxStatus | "no_code";
  stderr: string;
}

/** The solution in a reply: the last fenced code block; see the header for the fallbacks. */
export function extractCode(text: string, entryPoint?: string): string | null {
  const blocks = [...text.matchAll(/```[^\n`]*\n([\s\S]*?)```/g)].map((m) => m[1]!);
  // A fence opened after the last closed block and never closed (the reply hit its length limit).
  const closedEnd = text.lastIndexOf("```") >= 0 ? lastClosedEnd(text) : 0;
  const open = /```[^\n`]*\n([\s\S]*)$/.exec(text.slice(closedEnd));
  if (open && !open[1]!.includes("```")) return open[1]!;
  if (blocks.length > 0) return blocks[blocks.length - 1]!;
  if (entryPoint && new RegExp(`^\\s*def\\s+${entryPoint}\\s*\\(`, "m").test(text)) return text;
  return null;
}

function lastClosedEnd(text: string): number {
  let end = 0;
  for (const m of text.matchAll(/```[^\n`]*\n[\s\S]*?```/g)) end = m.index! + m[0].length;
  return end;
}

/** Runs `code` against `problem`'s tests (one sandboxed process) and counts the passes. */
export async function runTests(
  pool: SandboxPool,
  code: string | null,
  problem: CodeProblem,
  limits: { timeoutMs: number; memoryMb: number },
): Promise<TestOutcome> {
  if (code === null) return { passed: 0, total: problem.tests.length, status: "no_code", stderr: "" };
  const prog = testProgram(code, problem);
  const r = await pool.run({ lang: "python", code: prog.code, stdin: prog.stdin, ...limits });
  const passed = passedTests(r.stdout, prog.tokens).filter(Boolean).length;
  return { passed, total: problem.tests.length, status: r.status, stderr: r.stderr };
}

function coderTask(p: CodeProblem, visibleTests: number): string {
  const parts = [p.prompt.trim()];
  parts.push(
    p.signature
      ? `Write a Python function with this signature:\n${p.signature}`
      : `Write a Python function named \`${p.entryPoint}\`.`,
  );
  const shown = p.tests.slice(0, visibleTests);
  if (shown.length > 0) parts.push(`It must pass tests such as:\n${shown.join("\n")}`);
  parts.push("Give the complete solution in one ```python code block.");
  return parts.join("\n\n");
}

function reviewerTask(p: CodeProblem): string {
  return [
    `The coder was asked:\n${p.prompt.trim()}\nThe function must be named \`${p.entryPoint}\`.`,
    'Review the coder\'s code. Reply "APPROVE" if it is correct, or "REVISE" followed by what to fix.',
  ].join("\n\n");
}

function testerTask(p: CodeProblem): string {
  return [
    `The coder was asked:\n${p.prompt.trim()}\nThe function must be named \`${p.entryPoint}\`.`,
    `Write up to 5 assert statements that test \`${p.entryPoint}\`, in one \`\`\`python code block.`,
  ].join("\n\n");
}

/** Assert statements in a tester's reply (fenced block if any, else the whole text), at most 10. */
export function testerAsserts(text: string): string[] {
  const body = [...text.matchAll(/```[^\n`]*\n([\s\S]*?)```/g)].map((m) => m[1]!).join("\n") || text;
  return body
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => /^assert\b/.test(l))
    .slice(0, 10);
}

export class CodeEnv extends TeamEnv<CodeProblem> {
  private readonly coder: AgentId;
  private readonly reviewer: AgentId | undefined;
  private readonly tester: AgentId | undefined;
  private readonly attempts: number;
  private readonly limits: { timeoutMs: number; memoryMb: number };
  private readonly visibleTests: number;
  private readonly pool: SandboxPool;
  private problem: CodeProblem | undefined;
  private facts: Record<string, unknown> = {};
  /** The hidden-test run of the current step's code, started in the coder's act. */
  private hidden: Promise<TestOutcome> | undefined;
  private code: string | null = null;
  private fenced = false;
  /** Per round: 1 when the reviewer's verdict agreed with the hidden tests. */
  private reviewerRight: number[] = [];

  constructor(agents: AgentSpec[], graph: GraphSpec, opts: CodeEnvOptions = {}) {
    if (agents.length === 0) throw new Error("code: expected at least one agent (a coder)");
    if (graph.kind === "dynamic") {
      throw new Error('code: the graph "dynamic" is not supported; use sequential, parallel or edges');
    }
    super(agents, graph);
    const byRole = (role: string) => agents.find((a) => a.role.toLowerCase() === role)?.id;
    this.coder = byRole("coder") ?? agents[0]!.id;
    this.reviewer = byRole("reviewer");
    this.tester = byRole("tester");
    this.attempts = opts.attempts ?? (this.reviewer || this.tester ? 2 : 1);
    if (!Number.isInteger(this.attempts) || this.attempts < 1) {
      throw new Error(`code.attempts: expected a positive integer, got ${opts.attempts}`);
    }
    this.limits = { timeoutMs: opts.timeoutMs ?? 5000, memoryMb: opts.memoryMb ?? 512 };
    this.visibleTests = opts.visibleTests ?? 0;
    this.pool = opts.pool ?? new SandboxPool();
  }

  async reset(problem: CodeProblem, _seed: number): Promise<void> {
    // Deterministic given the problem: nothing to randomise with the seed.
    this.problem = problem;
    this.facts = {};
    this.hidden = undefined;
    this.code = null;
    this.fenced = false;
    this.reviewerRight = [];
    const texts: Record<AgentId, string> = {};
    for (const a of this.agents) {
      texts[a] =
        a === this.reviewer
          ? reviewerTask(problem)
          : a === this.tester
            ? testerTask(problem)
            : coderTask(problem, this.visibleTests);
    }
    this.begin(texts);
  }

  async act(agent: AgentId, text: string): Promise<void> {
    const problem = this.problem;
    if (!problem) throw new Error("act: reset() was not called");
    this.team.record(agent, text); // synchronous, before any await (TeamEpisode's contract)
    if (agent === this.coder) {
      this.code = extractCode(text, problem.entryPoint);
      this.fenced = text.includes("```");
      const run = runTests(this.pool, this.code, problem, this.limits);
      run.catch(() => {}); // awaited below; a setup failure must not be an unhandled rejection meanwhile
      this.hidden = run;
    }
    if (!this.team.stepComplete()) return;

    const round = this.team.step + 1;
    const feedback = round < this.attempts ? await this.feedback(problem) : null;
    const outcome = await (this.hidden ?? runTests(this.pool, null, problem, this.limits));
    if (this.reviewer !== undefined) {
      // The reviewer was right when it sent back code that fails a hidden test, or passed code that passes all.
      const revise = /^revise\b/i.test((this.team.actionOf(this.reviewer) ?? "").trim());
      const failing = outcome.passed < outcome.total;
      this.reviewerRight.push(revise === failing ? 1 : 0);
    }
    if (feedback === null) {
      this.finishWith(outcome, round);
      return;
    }
    this.team.addHistory(`Round ${round}, the coder's code:\n\`\`\`python\n${this.code ?? ""}\n\`\`\``);
    this.team.addHistory(feedback);
    this.hidden = undefined;
    this.team.nextStep();
  }

  /** Feedback that sends the code back, or null when the reviewer / tester lets it pass. */
  private async feedback(problem: CodeProblem): Promise<string | null> {
    if (this.reviewer !== undefined) {
      const review = (this.team.actionOf(this.reviewer) ?? "").trim();
      if (/^revise\b/i.test(review))
        return `The reviewer asks for a revision: ${review.replace(/^revise\b[:\s]*/i, "")}`;
    }
    if (this.tester !== undefined) {
      const asserts = testerAsserts(this.team.actionOf(this.tester) ?? "");
      if (asserts.length > 0) {
        const own: CodeProblem = { ...problem, tests: asserts, reference: undefined };
        const r = await runTests(this.pool, this.code, own, this.limits);
        if (r.passed < r.total) {
          const prog =
            r.status === "no_code" ? "no code block was found" : `${r.passed} of ${r.total} passed`;
          const lines = r.stderr.trim().split("\n").slice(-5).join("\n");
          return `The tester's tests: ${prog}.\n${lines}`.trim();
        }
      }
    }
    return null;
  }

  private finishWith(tests: TestOutcome, rounds: number): void {
    const score = tests.total > 0 ? tests.passed / tests.total : 0;
    this.facts = { passed: tests.passed, total: tests.total, status: tests.status, rounds };
    const roleRewards: Record<string, number> = { coder: this.fenced ? 1 : 0 };
    if (this.reviewer !== undefined) {
      roleRewards["reviewer"] = this.reviewerRight.reduce((a, b) => a + b, 0) / this.reviewerRight.length;
    }
    this.end({
      correct: tests.total > 0 && tests.passed === tests.total,
      score,
      teamReward: score,
      roleRewards,
    });
  }

  override info(): Record<string, unknown> {
    return { ...this.facts };
  }
}

/** The MBPP file of the project's shared datasets, as an absolute path. */
export function defaultMbppFile(): string {
  return join(datasetsDir(), MBPP_FILE);
}

/** Code problems as a TaskSuite: MBPP by default; one sandbox pool shared by all its envs. */
export function createCodeSuite(opts: CodeSuiteOptions = {}): TaskSuite<CodeProblem> {
  let train: CodeProblem[];
  let evalSet: CodeProblem[];
  if (opts.train) {
    train = opts.train;
    evalSet = opts.eval ?? [];
  } else {
    const all = loadCodeProblems(opts.trainFile ?? defaultMbppFile());
    if (opts.evalFile) {
      train = all;
      evalSet = loadCodeProblems(opts.evalFile);
    } else {
      const split = holdOutLast(all, opts.evalSplit ?? 100);
      train = split.train;
      evalSet = split.dev;
    }
  }
  if (opts.limit !== undefined) train = train.slice(0, opts.limit);
  if (opts.evalLimit !== undefined) evalSet = evalSet.slice(0, opts.evalLimit);
  const envOpts: CodeEnvOptions = { ...opts, pool: opts.pool ?? new SandboxPool() };
  return {
    name: "code",
    train,
    eval: evalSet,
    taskId: (p) => p.id,
    makeEnv: (agents, graph) => new CodeEnv(agents, graph, envOpts),
  };
}
