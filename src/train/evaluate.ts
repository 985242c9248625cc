// Held-out evaluation: pass@1 with greedy decoding and, optionally, pass@k from k sampled attempts,
// with 95% Wilson intervals. `evaluate` also returns per-problem correctness and transcripts, for
// reports and the demo. `majorityVote` answers each problem with the most common of k sampled
// answers: a single agent given as many test-time tokens as a team spends.
import { accuracyCi95, mean, passAtK } from "../algo/index.ts";
import type { ComputeEngine } from "../client/compute.ts";
import type { RunConfig } from "../config/schema.ts";
import { MultiTaskSuite, partName } from "../envs/multi.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import { asSource, type EpisodeSource } from "./episodes.ts";

export interface ProblemResult {
  taskId: string;
  /** The greedy (or first sampled) attempt solved it. */
  correct: boolean;
  score: number;
  /** Sampled attempts that solved it (pass@k only). */
  samplesCorrect?: number;
  transcript: Array<{ role: string; content: string }>;
  /** The env's diagnostics at the end of the episode. */
  info: Record<string, unknown>;
}

export interface EvalResult {
  /** pass@1 (greedy when `greedy`, else the first sample of each problem). */
  accuracy: number;
  ci95: [number, number];
  n: number;
  meanScore: number;
  /** Unbiased pass@k over k samples per problem, when k > 0. */
  passAtK?: number;
  k?: number;
  problems: ProblemResult[];
  /** Response tokens the pass@1 attempts sampled (all agents; the pass@k samples not included). */
  tokensSampled: number;
  seconds: number;
  /** Multi-task runs: pass@1 of each task's problems. */
  perTask?: Record<string, { accuracy: number; ci95: [number, number]; n: number }>;
}

/** The held-out problems to score: the first `n` (0: all), of each task in a multi-task run. */
export function evalTasks(suite: TaskSuite<unknown> | EpisodeSource, n: number): unknown[] {
  const first = <T>(xs: readonly T[]) => (n > 0 ? xs.slice(0, n) : [...xs]);
  if (!(suite instanceof MultiTaskSuite)) return first(suite.eval);
  return suite.parts.flatMap((p, part) => first(p.suite.eval).map((task) => ({ part, task })));
}

export interface EvaluateOptions {
  engine: ComputeEngine;
  suite: TaskSuite<unknown> | EpisodeSource;
  config: RunConfig;
  tasks: unknown[];
  greedy?: boolean;
  /** pass@k with k sampled attempts per problem (0: off). */
  k?: number;
  seed?: number;
  onProgress?: (done: number, total: number) => void;
}

export async function evaluate(o: EvaluateOptions): Promise<EvalResult> {
  const t0 = performance.now();
  const greedy = o.greedy ?? true;
  const seed = o.seed ?? 0;
  const source = asSource(o.suite);
  if (o.tasks.length === 0) throw new Error(`evaluate: task ${source.name} has no held-out problems`);
  const first = await source.play({
    engine: o.engine,
    config: o.config,
    tasks: o.tasks,
    samplesPerTask: 1,
    seed,
    greedy,
    onProgress: o.onProgress,
  });
  const problems: ProblemResult[] = first.episodes.map((e) => ({
    taskId: e.taskId,
    correct: e.outcome.correct,
    score: e.outcome.score,
    transcript: e.transcript,
    info: e.info,
  }));
  const { accuracy, ci95, n } = accuracyCi95(problems.map((p) => p.correct));
  const result: EvalResult = {
    accuracy,
    ci95,
    n,
    meanScore: mean(problems.map((p) => p.score)),
    problems,
    tokensSampled: first.stats.tokensSampled,
    seconds: 0,
  };
  if (o.suite instanceof MultiTaskSuite) {
    result.perTask = {};
    for (const p of o.suite.parts) {
      const mine = problems.filter((x) => partName(x.taskId) === p.name);
      if (mine.length > 0) result.perTask[p.name] = accuracyCi95(mine.map((x) => x.correct));
    }
  }
  const k = o.k ?? 0;
  if (k > 0) {
    const sampled = await source.play({
      engine: o.engine,
      config: o.config,
      tasks: o.tasks,
      samplesPerTask: k,
      seed: seed + 1,
      greedy: false,
    });
    const byTask = new Map<string, number>();
    for (const e of sampled.episodes)
      byTask.set(e.taskId, (byTask.get(e.taskId) ?? 0) + (e.outcome.correct ? 1 : 0));
    for (const p of problems) p.samplesCorrect = byTask.get(p.taskId) ?? 0;
    result.passAtK = mean(problems.map((p) => passAtK(k, p.samplesCorrect!, k)));
    result.k = k;
  }
  result.seconds = (performance.now() - t0) / 1000;
  return result;
}

export interface VoteResult {
  accuracy: number;
  ci95: [number, number];
  n: number;
  k: number;
  /** Per problem, in the order of the tasks: the majority answer was right. */
  correct: boolean[];
  tokensSampled: number;
  seconds: number;
}

/**
 * Majority vote over k sampled episodes per problem. An episode's answer is its env's
 * `info().answers` (the answering agents' extracted answers); episodes without an answer do not
 * vote, ties go to the answer sampled first, and the problem counts as solved when the episodes that
 * gave the majority answer were judged correct.
 */
export async function majorityVote(o: EvaluateOptions & { k: number }): Promise<VoteResult> {
  const t0 = performance.now();
  if (!(Number.isInteger(o.k) && o.k >= 1)) throw new Error(`majorityVote: k must be >= 1, got ${o.k}`);
  const source = asSource(o.suite);
  if (o.tasks.length === 0) throw new Error(`majorityVote: task ${source.name} has no held-out problems`);
  const r = await source.play({
    engine: o.engine,
    config: o.config,
    tasks: o.tasks,
    samplesPerTask: o.k,
    seed: o.seed ?? 0,
    greedy: false,
    onProgress: o.onProgress,
  });
  // per task (episodes come task-major: index = task * k + sample), answer -> votes
  const votes = o.tasks.map(() => new Map<string, { count: number; correct: boolean }>());
  for (const [i, e] of r.episodes.entries()) {
    const answers = e.info["answers"];
    if (typeof answers !== "object" || answers === null) {
      throw new Error(`majorityVote: task ${source.name} reports no answers in info() to vote on`);
    }
    if (Object.values(answers).every((a) => a === null)) continue;
    const key = JSON.stringify(answers);
    const tally = votes[Math.floor(i / o.k)]!;
    const v = tally.get(key) ?? { count: 0, correct: e.outcome.correct };
    v.count++;
    tally.set(key, v);
  }
  const correct = votes.map((tally) => {
    let best: { count: number; correct: boolean } | undefined;
    for (const v of tally.values()) if (!best || v.count > best.count) best = v;
    return best?.correct ?? false;
  });
  const { accuracy, ci95, n } = accuracyCi95(correct);
  return {
    accuracy,
    ci95,
    n,
    k: o.k,
    correct,
    tokensSampled: r.stats.tokensSampled,
    seconds: (performance.now() - t0) / 1000,
  };
}
