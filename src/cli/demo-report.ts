// The demo's results: summary.json (per seed and across seeds), the table it prints, and what its
// report.html shows above the runs.
import { pairedTest, twoProportionZTest } from "../algo/index.ts";
import type { RunConfig } from "../config/schema.ts";
import type { ReportExtras } from "../dashboard/api.ts";
import type { EvalResult, VoteResult } from "../train/evaluate.ts";
import type { MetricsRow } from "../train/phases.ts";
import type { Summary } from "../train/run.ts";
import { type Comparison, compareSeeds } from "./demo-compare.ts";
import { formatNumber, table } from "./progress.ts";

export interface Job {
  /** What the report takes from the job's training summary (also all that --resume reads back). */
  summary: Pick<Summary, "iterations" | "tokensSampled" | "wallSeconds">;
  before?: EvalResult;
  after: EvalResult;
  metrics: MetricsRow[];
  /** The single agent's majority vote at the team's test-time tokens (when the team spends more). */
  vote?: VoteResult;
}

export interface SeedRun {
  seed: number;
  team: Job;
  baseline: Job;
}

const accuracyOf = (r: { accuracy: number; ci95: [number, number]; n: number }) => ({
  accuracy: r.accuracy,
  ci95: r.ci95,
  n: r.n,
});
const perProblem = (tokens: number, n: number) => Math.round((10 * tokens) / n) / 10;
export function summarize(runs: SeedRun[], team: RunConfig, task: string, wall: number) {
  const first = runs[0]!;
  const before = first.team.before!;
  const paired = pairedTest(
    before.problems.map((p) => p.correct),
    first.team.after.problems.map((p) => p.correct),
  );
  const z = twoProportionZTest(
    before.problems.map((p) => p.correct),
    first.team.after.problems.map((p) => p.correct),
  );
  const teamCorrect = (r: SeedRun) => r.team.after.problems.map((p) => p.correct);
  const comparison = compareSeeds(
    runs.map((r) => ({
      seed: r.seed,
      team: teamCorrect(r),
      baseline: r.baseline.after.problems.map((p) => p.correct),
    })),
  );
  const voted = runs.every((r) => r.baseline.vote !== undefined);
  const comparisonVote: Comparison | null = voted
    ? compareSeeds(
        runs.map((r) => ({ seed: r.seed, team: teamCorrect(r), baseline: r.baseline.vote!.correct })),
      )
    : null;
  const b = first.baseline;
  return {
    task,
    model: Object.values(team.bases)[0]?.source,
    models: Object.fromEntries(Object.entries(team.bases).map(([k, v]) => [k, v.source])),
    // auto: bf16 only on a CPU with native bf16 (AVX512_BF16 / AMX); each engine.log says which
    dtype: Object.fromEntries(Object.entries(team.bases).map(([k, v]) => [k, v.dtype])),
    team: team.agents.map((a) => a.role),
    estimator: team.algo.estimator,
    seed: first.seed,
    eval: { before: accuracyOf(before), after: accuracyOf(first.team.after) },
    significance: {
      paired_mcnemar_p: paired.p,
      improved: paired.improved,
      worsened: paired.worsened,
      two_proportion_z: z.z,
      two_proportion_p: z.p,
    },
    baseline: {
      after: accuracyOf(b.after),
      vote: b.vote ? { k: b.vote.k, ...accuracyOf(b.vote) } : null,
      sampled_tokens: b.summary.tokensSampled,
      iterations: b.summary.iterations,
      wall_s: b.summary.wallSeconds,
    },
    test_tokens_per_problem: {
      team: perProblem(first.team.after.tokensSampled, first.team.after.n),
      baseline: perProblem(b.after.tokensSampled, b.after.n),
      baseline_vote: b.vote ? perProblem(b.vote.tokensSampled, b.vote.n) : null,
    },
    iterations: first.team.summary.iterations,
    wall_s: wall,
    sampled_tokens: first.team.summary.tokensSampled,
    team_wall_s: first.team.summary.wallSeconds,
    comparison,
    comparison_vote: comparisonVote,
    seeds: runs.map((r) => ({
      seed: r.seed,
      team_before: r.team.before!.accuracy,
      team_after: r.team.after.accuracy,
      baseline_after: r.baseline.after.accuracy,
      baseline_vote: r.baseline.vote?.accuracy ?? null,
      sampled_tokens: { team: r.team.summary.tokensSampled, baseline: r.baseline.summary.tokensSampled },
      test_tokens_per_problem: {
        team: perProblem(r.team.after.tokensSampled, r.team.after.n),
        baseline: perProblem(r.baseline.after.tokensSampled, r.baseline.after.n),
        baseline_vote: r.baseline.vote ? perProblem(r.baseline.vote.tokensSampled, r.baseline.vote.n) : null,
      },
      wall_s: { team: r.team.summary.wallSeconds, baseline: r.baseline.summary.wallSeconds },
    })),
  };
}

export type DemoSummary = ReturnType<typeof summarize>;

/** What the demo's report shows above the runs: the accuracies, the tests, held-out transcripts. */
export function demoExtras(s: DemoSummary, config: RunConfig, first: SeedRun): ReportExtras {
  const pct = (r: { accuracy: number; ci95: [number, number]; n: number }) =>
    `${(100 * r.accuracy).toFixed(1)}% [${(100 * r.ci95[0]).toFixed(1)}, ${(100 * r.ci95[1]).toFixed(1)}] (n=${r.n})`;
  const signed = (x: number) => `${x >= 0 ? "+" : ""}${(100 * x).toFixed(1)}`;
  const c = s.comparison;
  const before = first.team.before!;
  const after = new Map(first.team.after.problems.map((p) => [p.taskId, p]));
  const bar = (name: string, r: { accuracy: number; ci95: [number, number] }) => ({
    name,
    value: r.accuracy,
    ci95: r.ci95,
  });
  return {
    title: `MARFT demo: ${config.agents.map((a) => a.role).join(" → ")} (${config.algo.estimator}) vs a single agent`,
    summary: [
      ["model", String(s.model)],
      [`team before (greedy, 95% CI; seed ${s.seed})`, pct(s.eval.before)],
      ["team after", pct(s.eval.after)],
      ["single agent after (same training tokens)", pct(s.baseline.after)],
      ...(s.baseline.vote
        ? [[`single agent, majority of ${s.baseline.vote.k}`, pct(s.baseline.vote)] as [string, string]]
        : []),
      [
        `team − single agent (${s.seeds.length} seed${s.seeds.length > 1 ? "s" : ""})`,
        `${signed(c.team_minus_baseline)} pts [${signed(c.ci95[0])}, ${signed(c.ci95[1])}], p = ${formatNumber(c.paired_p)}`,
      ],
      ["training tokens: team / single", `${s.sampled_tokens} / ${s.baseline.sampled_tokens}`],
      ["wall time", `${Math.round(s.wall_s)} s`],
    ],
    bars: {
      title: `held-out accuracy (greedy, 95% CI; seed ${s.seed})`,
      bars: [
        bar("team before", s.eval.before),
        bar("team after", s.eval.after),
        bar("single agent after", s.baseline.after),
        ...(s.baseline.vote ? [bar(`single agent vote@${s.baseline.vote.k}`, s.baseline.vote)] : []),
      ],
    },
    comparison: {
      title: "the same held-out problems before and after training (the team, greedy)",
      columns: ["before", "after"],
      rows: before.problems
        .filter((p) => after.has(p.taskId))
        .slice(0, 6)
        .map((p) => [p, after.get(p.taskId)!].map((q) => ({ messages: q.transcript, correct: q.correct }))),
    },
  };
}

export function printTable(s: DemoSummary, n: number): void {
  const pct = (r: { accuracy: number; ci95: [number, number] }) =>
    `${(100 * r.accuracy).toFixed(1)}% [${(100 * r.ci95[0]).toFixed(1)}, ${(100 * r.ci95[1]).toFixed(1)}]`;
  const signed = (x: number) => `${x >= 0 ? "+" : ""}${(100 * x).toFixed(1)}`;
  const diff = (c: Comparison) =>
    `${signed(c.team_minus_baseline)} pts [${signed(c.ci95[0])}, ${signed(c.ci95[1])}], p = ${formatNumber(c.paired_p)}`;
  const rows: Array<Array<string | number>> = [
    [`team before (greedy, 95% CI; seed ${s.seed})`, pct(s.eval.before)],
    ["team after", pct(s.eval.after)],
    ["  before -> after, paired test p", formatNumber(s.significance.paired_mcnemar_p)],
    ["single agent after (same training tokens)", pct(s.baseline.after)],
  ];
  if (s.baseline.vote)
    rows.push([`single agent, majority of ${s.baseline.vote.k} samples`, pct(s.baseline.vote)]);
  const tt = s.test_tokens_per_problem;
  rows.push([
    "test-time tokens per problem: team / single" + (tt.baseline_vote !== null ? " / vote" : ""),
    [tt.team, tt.baseline, ...(tt.baseline_vote !== null ? [tt.baseline_vote] : [])].join(" / "),
  ]);
  rows.push(["training tokens sampled: team / single", `${s.sampled_tokens} / ${s.baseline.sampled_tokens}`]);
  if (s.seeds.length > 1) {
    for (const r of s.seeds) {
      rows.push([
        `seed ${r.seed}: team before / after / single` + (r.baseline_vote !== null ? " / vote" : ""),
        [
          r.team_before,
          r.team_after,
          r.baseline_after,
          ...(r.baseline_vote !== null ? [r.baseline_vote] : []),
        ]
          .map((x) => `${(100 * x).toFixed(1)}%`)
          .join(" / "),
      ]);
    }
  }
  rows.push([
    `team - single agent (${s.seeds.length} seed${s.seeds.length > 1 ? "s" : ""})`,
    diff(s.comparison),
  ]);
  if (s.comparison_vote) rows.push(["team - single agent's vote", diff(s.comparison_vote)]);
  rows.push(["wall time (s)", Math.round(s.wall_s)]);
  process.stdout.write(`\n${table(rows, ["marft demo", `n=${n} held-out problems`])}`);
}
