// `marft demo`: the main job. Trains a real team (configs/demo.yaml, MARFT-A) and a single agent
// (configs/demo-baseline.yaml) on the same generated word problems, the single agent until it has
// sampled as many training tokens as the team did; evaluates the team before and after and the single
// agent after on the same held-out problems (and, when the team spends more test-time tokens, the
// single agent's majority vote at those tokens); compares them with paired tests per seed and across
// seeds; writes runs/demo/summary.json and runs/demo/report.html.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { pairedTest, twoProportionZTest } from "../algo/index.ts";
import { loadRunConfig } from "../config/load.ts";
import type { RunConfig } from "../config/schema.ts";
import { type ArithKind, arithmeticSplits } from "../envs/math/arith.ts";
import { createMathSuite, type MathProblem } from "../envs/math/env.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import { type EvalResult, evaluate, majorityVote, type VoteResult } from "../train/evaluate.ts";
import type { MetricsRow } from "../train/phases.ts";
import { RunDir, writeFileAtomic } from "../train/rundir.ts";
import { type Summary, train } from "../train/run.ts";
import { setupEngine } from "../train/setup.ts";
import { type Comparison, compareSeeds, voteSamples } from "./demo-compare.ts";
import { formatNumber, Progress, table } from "./progress.ts";
import { renderReport } from "./report.ts";
import { engineConnector, reportError } from "./train.ts";

const REPO = resolve(import.meta.dirname, "../..");
// A sample call answers when its row is done, and a 200-problem evaluation queues every row at once:
// on a loaded 2-core machine one call waited more than the client's default 10 minutes.
const ENGINE = { timeoutMs: 3_600_000 };

const USAGE = `usage: marft demo [options]

Trains the team of configs/demo.yaml and the single agent of configs/demo-baseline.yaml on the same
problems and token budget, and compares them on the same held-out problems.

options:
  --seeds 1,2,3          training seeds, one team and one single agent each (default: the config's seed)
  --iterations N         the team's training iterations
  --eval N               held-out problems (default: the config's eval.n)
  --train-problems N     generated training problems (default 4000)
  --problems KIND        two-step (default) or one-step generated word problems
  --team FILE            the team's run config (default configs/demo.yaml)
  --baseline FILE        the single agent's run config (default configs/demo-baseline.yaml)
  --set path=value       override a field of the team's config (repeatable)
  --set-baseline p=v     override a field of the single agent's config (repeatable)
  --out DIR              where the runs and summary go (default runs/demo)
`;

interface Job {
  summary: Summary;
  before?: EvalResult;
  after: EvalResult;
  metrics: MetricsRow[];
  /** The single agent's majority vote at the team's test-time tokens (when the team spends more). */
  vote?: VoteResult;
}

interface SeedRun {
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

/**
 * Issue 18: bf16 on a CPU is fast only with AVX512_BF16 or AMX and far slower than fp32 without; the
 * demo's configs say `auto`, which the demo makes bf16 where the CPU has them (the same choice the
 * engine's `auto` makes once issue 18 lands).
 */
function cpuHasBf16(): boolean {
  try {
    return /\b(avx512_bf16|amx_bf16)\b/.test(readFileSync("/proc/cpuinfo", "utf8"));
  } catch {
    return false;
  }
}

function withDtypes(c: RunConfig, bf16: boolean): RunConfig {
  if (!bf16 || c.engine.device === "cuda") return c;
  const bases = Object.fromEntries(
    Object.entries(c.bases).map(([k, b]) => [
      k,
      b.dtype === "auto" ? { ...b, dtype: "bfloat16" as const } : b,
    ]),
  );
  return { ...c, bases };
}

/** A progress bar for one job, fed by the training loop's events (phases, iterations, evaluations). */
function progressFor(label: string, total: number, maxTokens?: number) {
  const bar = new Progress(label, total);
  let last = "";
  let tokens = 0;
  const evals: EvalResult[] = [];
  const onProgress = (e: Parameters<NonNullable<Parameters<typeof train>[0]["onProgress"]>>[0]) => {
    if (e.kind === "eval") evals.push(e.result);
    else if (e.kind === "iteration") {
      tokens += e.row["tokens/sampled"] ?? 0;
      // a budgeted job's iteration count is only a cap: the tokens say how far it is
      const budget = maxTokens === undefined ? "" : `  tokens ${tokens}/${maxTokens}`;
      last = `reward ${formatNumber(e.row["reward/mean"] ?? Number.NaN)}${budget}`;
      bar.update(e.iteration, last);
    } else bar.update(e.iteration, `${e.phase}${e.total ? ` ${e.done}/${e.total}` : ""}  ${last}`);
  };
  return { bar, evals, onProgress };
}

/** Trains one job; `maxTokens` stops it after the iteration whose rollouts reach that many tokens. */
async function trainJob(
  label: string,
  config: RunConfig,
  runDir: string,
  suite: TaskSuite<MathProblem>,
  maxTokens?: number,
): Promise<{ summary: Summary; evals: EvalResult[]; metrics: MetricsRow[] }> {
  rmSync(runDir, { recursive: true, force: true });
  const p = progressFor(label, config.train.iterations, maxTokens);
  const stop = new AbortController();
  let tokens = 0;
  const summary = await train({
    config,
    configDir: join(REPO, "configs"),
    runDir,
    suite: suite as TaskSuite<unknown>,
    connect: engineConnector(config, join(runDir, "engine.log"), ENGINE),
    log: (line) => process.stderr.write(`\n${label}: ${line}\n`),
    signal: stop.signal,
    onProgress: (e) => {
      p.onProgress(e);
      if (e.kind !== "iteration" || maxTokens === undefined) return;
      tokens += e.row["tokens/sampled"] ?? 0;
      if (tokens >= maxTokens) stop.abort();
    },
  });
  p.bar.finish(`${summary.tokensSampled} tokens sampled`);
  return { summary, evals: p.evals, metrics: new RunDir(runDir).readMetrics() as MetricsRow[] };
}

/** Greedy evaluation of a run's last checkpoint and, with `voteK`, a majority vote of k samples. */
async function evaluateRun(
  label: string,
  config: RunConfig,
  runDir: string,
  suite: TaskSuite<MathProblem>,
  voteFor: (greedy: EvalResult) => number,
): Promise<{ after: EvalResult; vote?: VoteResult }> {
  const handle = await engineConnector(config, join(runDir, "engine-eval.log"), ENGINE)();
  try {
    await setupEngine(handle.client, config);
    const ckpt = new RunDir(runDir).latestCheckpoint();
    if (!ckpt) throw new Error(`${runDir}: no checkpoint to evaluate`);
    await handle.client.loadCheckpoint({ path: join(ckpt.path, "engine") });
    const common = {
      engine: handle.client,
      suite: suite as TaskSuite<unknown>,
      config,
      tasks: suite.eval,
      seed: config.seed + 7919,
    };
    const bar = new Progress(`${label} eval`, suite.eval.length);
    const after = await evaluate({
      ...common,
      greedy: true,
      onProgress: (d, t) => bar.update(d, "greedy", t),
    });
    bar.finish(`accuracy ${formatNumber(after.accuracy)}`);
    const k = voteFor(after);
    if (k === 0) return { after };
    const vbar = new Progress(`${label} vote@${k}`, suite.eval.length * k);
    const vote = await majorityVote({ ...common, k, onProgress: (d, t) => vbar.update(d, undefined, t) });
    vbar.finish(`accuracy ${formatNumber(vote.accuracy)}`);
    return { after, vote };
  } finally {
    await handle.stop();
  }
}

async function runSeed(
  seed: number,
  team0: RunConfig,
  baseline0: RunConfig,
  suite: TaskSuite<MathProblem>,
  baselineSuite: TaskSuite<MathProblem>,
  root: string,
): Promise<SeedRun> {
  const dir = join(root, `seed-${seed}`);
  const teamConfig: RunConfig = {
    ...team0,
    seed,
    train: { ...team0.train, evalAtStart: true, evalEvery: 0 },
  };
  const t = await trainJob(`seed ${seed} team`, teamConfig, join(dir, "team"), suite);
  const team: Job = { summary: t.summary, before: t.evals[0], after: t.evals.at(-1)!, metrics: t.metrics };
  if (t.evals.length < 2) throw new Error(`seed ${seed}: expected the team's evaluations before and after`);

  // The single agent trains until it has sampled the team's training tokens (train.maxSampledTokens
  // once the experiments branch lands); the iteration cap only bounds a run that never gets there.
  const budget = t.summary.tokensSampled;
  const baselineConfig: RunConfig = {
    ...baseline0,
    seed,
    train: {
      ...baseline0.train,
      iterations: Math.max(baseline0.train.iterations, 10 * teamConfig.train.iterations),
      evalAtStart: false,
      evalEvery: 0,
    },
  };
  const bdir = join(dir, "baseline");
  const b = await trainJob(`seed ${seed} single agent`, baselineConfig, bdir, baselineSuite, budget);
  const teamTokens = team.after.tokensSampled / team.after.n;
  const { after, vote } = await evaluateRun(
    `seed ${seed} single agent`,
    baselineConfig,
    bdir,
    baselineSuite,
    (g) => voteSamples(teamTokens, g.tokensSampled / g.n),
  );
  return { seed, team, baseline: { summary: b.summary, after, vote, metrics: b.metrics } };
}

function parseSeeds(s: string | undefined, fallback: number): number[] {
  if (s === undefined) return [fallback];
  const seeds = s.split(",").map((x) => x.trim());
  if (seeds.some((x) => !/^\d+$/.test(x))) throw new Error(`--seeds: expected a list like 1,2,3, got "${s}"`);
  return [...new Set(seeds.map(Number))];
}

function posIntFlag(name: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  if (!/^[1-9]\d*$/.test(v)) throw new Error(`--${name}: expected a positive integer, got "${v}"`);
  return Number(v);
}

function summarize(runs: SeedRun[], team: RunConfig, task: string, wall: number, bf16: boolean) {
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
    dtype: bf16 ? "bfloat16 (the CPU has AVX512_BF16/AMX)" : "as configured",
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

type DemoSummary = ReturnType<typeof summarize>;

function printTable(s: DemoSummary, n: number): void {
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

export async function demoCommand(args: string[]): Promise<void> {
  let values: ReturnType<typeof parse>["values"];
  const parse = (a: string[]) =>
    parseArgs({
      args: a,
      options: {
        seeds: { type: "string" },
        iterations: { type: "string" },
        eval: { type: "string" },
        "train-problems": { type: "string" },
        problems: { type: "string" },
        team: { type: "string" },
        baseline: { type: "string" },
        set: { type: "string", multiple: true },
        "set-baseline": { type: "string", multiple: true },
        out: { type: "string" },
        help: { type: "boolean", short: "h" },
      },
    });
  try {
    values = parse(args).values;
  } catch (e) {
    process.stderr.write(`marft demo: ${(e as Error).message}\n\n${USAGE}`);
    process.exitCode = 2;
    return;
  }
  if (values.help) {
    process.stdout.write(USAGE);
    return;
  }
  try {
    await demo(values);
  } catch (e) {
    reportError("demo", e);
  }
}

async function demo(values: Record<string, string | string[] | boolean | undefined>): Promise<void> {
  const t0 = performance.now();
  const str = (k: string) => values[k] as string | undefined;
  const root = resolve(str("out") ?? join(REPO, "runs/demo"));
  const kind = (str("problems") ?? "two-step") as ArithKind;
  if (kind !== "two-step" && kind !== "one-step") {
    throw new Error(`--problems: expected two-step or one-step, got "${kind}"`);
  }
  const sets = [...((values["set"] as string[] | undefined) ?? [])];
  const iterations = posIntFlag("iterations", str("iterations"));
  if (iterations) sets.push(`train.iterations=${iterations}`);
  const evalN = posIntFlag("eval", str("eval"));
  if (evalN) sets.push(`eval.n=${evalN}`);
  const bf16 = cpuHasBf16();
  const team0 = withDtypes(
    loadRunConfig(resolve(str("team") ?? join(REPO, "configs/demo.yaml")), sets),
    bf16,
  );
  const baselineSets = [...((values["set-baseline"] as string[] | undefined) ?? [])];
  if (evalN) baselineSets.push(`eval.n=${evalN}`);
  const baseline0 = withDtypes(
    loadRunConfig(resolve(str("baseline") ?? join(REPO, "configs/demo-baseline.yaml")), baselineSets),
    bf16,
  );
  const seeds = parseSeeds(str("seeds"), team0.seed);

  // The problems come from the team config's seed, the same for every training seed: each seed's
  // team and single agent are scored on the same held-out problems, which are never trained on.
  const data = arithmeticSplits(
    team0.seed,
    posIntFlag("train-problems", str("train-problems")) ?? 4000,
    team0.eval.n || 200,
    kind,
  );
  const dataDir = join(root, "data");
  rmSync(root, { recursive: true, force: true });
  mkdirSync(dataDir, { recursive: true });
  const jsonl = (ps: MathProblem[]) => `${ps.map((p) => JSON.stringify(p)).join("\n")}\n`;
  writeFileAtomic(join(dataDir, "train.jsonl"), jsonl(data.train));
  writeFileAtomic(join(dataDir, "eval.jsonl"), jsonl(data.eval));
  const suite = createMathSuite({
    train: data.train,
    eval: data.eval,
    ...(team0.task.kind === "math" ? { attempts: team0.task.attempts, ...team0.task.options } : {}),
  });
  // The single agent answers alone: only its own task options apply (no step roles).
  const baselineSuite = createMathSuite({
    train: data.train,
    eval: data.eval,
    ...(baseline0.task.kind === "math"
      ? { attempts: baseline0.task.attempts, ...baseline0.task.options }
      : {}),
  });
  const taskName = `${kind} arithmetic word problems (generated, seed ${team0.seed})`;
  process.stderr.write(
    `marft demo: team ${team0.agents.map((a) => a.role).join(" -> ")} vs a single agent on ${data.train.length} ` +
      `${taskName}; seeds ${seeds.join(", ")}; ${team0.train.iterations} team iterations; ` +
      `evaluation on ${data.eval.length} held-out problems${bf16 ? "; bf16 (the CPU has AVX512_BF16/AMX)" : ""}\n`,
  );

  const runs: SeedRun[] = [];
  for (const seed of seeds) runs.push(await runSeed(seed, team0, baseline0, suite, baselineSuite, root));

  const s = summarize(runs, team0, taskName, (performance.now() - t0) / 1000, bf16);
  writeFileAtomic(join(root, "summary.json"), `${JSON.stringify(s, null, 2)}\n`);
  const first = runs[0]!;
  writeFileSync(
    join(root, "report.html"),
    renderReport({
      summary: s,
      team: { ...first.team, before: first.team.before! },
      baseline: first.baseline,
      config: team0,
    }),
  );
  printTable(s, data.eval.length);
  process.stdout.write(`wrote ${join(root, "summary.json")} and ${join(root, "report.html")}\n`);
}
