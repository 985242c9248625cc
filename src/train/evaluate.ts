// Held-out evaluation: pass@1 with greedy decoding and, optionally, pass@k from k sampled attempts,
// with 95% Wilson intervals. `evaluate` also returns per-problem correctness and transcripts, for
// reports and the demo.
import { accuracyCi95, mean, passAtK } from "../algo/index.ts";
import type { ComputeEngine } from "../client/compute.ts";
import type { RunConfig } from "../config/schema.ts";
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
  seconds: number;
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
    seconds: 0,
  };
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
