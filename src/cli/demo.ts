// `marft demo`: the main job. Trains a real team (configs/demo.yaml, MARFT-A) and a single agent
// (configs/demo-baseline.yaml) on the same generated word problems, the single agent until it has
// sampled as many training tokens as the team did; evaluates the team before and after and the single
// agent after on the same held-out problems (and, when the team spends more test-time tokens, the
// single agent's majority vote at those tokens); compares them with paired tests per seed and across
// seeds; writes runs/demo/summary.json and runs/demo/report.html.
import { existsSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";
import { loadRunConfig } from "../config/load.ts";
import type { RunConfig } from "../config/schema.ts";
import { type ArithKind, arithmeticSplits } from "../envs/math/arith.ts";
import { createMathSuite, type MathProblem } from "../envs/math/env.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import { type EvalResult, evaluate, majorityVote } from "../train/evaluate.ts";
import type { MetricsRow } from "../train/phases.ts";
import { RunDir, type TrainerState, writeFileAtomic } from "../train/rundir.ts";
import { type Summary, train } from "../train/run.ts";
import { setupEngine } from "../train/setup.ts";
import { parseCommand } from "./args.ts";
import { voteSamples } from "./demo-compare.ts";
import { finishedJob, type JobEvals, readJobEvals, writeJobEvals } from "./demo-resume.ts";
import { demoExtras, type Job, printTable, type SeedRun, summarize } from "./demo-report.ts";
import { onInterrupt } from "./interrupt.ts";
import { formatNumber, Progress } from "./progress.ts";
import { renderReport } from "./report.ts";
import { engineConnector, reportError } from "./train.ts";

const REPO = resolve(import.meta.dirname, "../..");

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
  --out DIR              where the runs and summary go (default runs/demo; a new demo replaces it)
  --resume               keep the jobs (a seed's team or single agent) that the last demo in --out
                         finished with the same settings, and their evaluations; train the rest
  -h, --help             this text

Ctrl-C finishes the current iteration, saves a checkpoint and stops; a second Ctrl-C quits at once.
`;

/** Ctrl-C during the demo: the running job checkpoints and stops, and no further job starts. */
let interrupt: ReturnType<typeof onInterrupt> | undefined;

/** The demo stops after the job that a Ctrl-C interrupted. */
class Interrupted extends Error {}

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
    connect: engineConnector(config, join(runDir, "engine.log")),
    log: (line) => process.stderr.write(`\n${label}: ${line}\n`),
    signal: interrupt ? AbortSignal.any([stop.signal, interrupt.signal]) : stop.signal,
    onProgress: (e) => {
      p.onProgress(e);
      if (e.kind !== "iteration" || maxTokens === undefined) return;
      tokens += e.row["tokens/sampled"] ?? 0;
      if (tokens >= maxTokens) stop.abort();
    },
  });
  p.bar.finish(`${summary.tokensSampled} tokens sampled`);
  if (interrupt?.signal.aborted) {
    throw new Interrupted(`${label}: stopped by Ctrl-C; its checkpoint: ${summary.checkpoint ?? "none"}`);
  }
  return { summary, evals: p.evals, metrics: new RunDir(runDir).readMetrics() as MetricsRow[] };
}

/**
 * Greedy evaluation of a run's last checkpoint, and of its untrained adapters first with `before`
 * (the team's evaluation at iteration 0, when --resume keeps a team whose evaluations were lost);
 * with a `voteFor` k > 0, also a majority vote of k samples.
 */
async function evaluateRun(
  label: string,
  config: RunConfig,
  runDir: string,
  suite: TaskSuite<MathProblem>,
  o: { before?: boolean; voteFor?: (greedy: EvalResult) => number },
): Promise<JobEvals> {
  const handle = await engineConnector(config, join(runDir, "engine-eval.log"))();
  try {
    await setupEngine(handle.client, config);
    const common = {
      engine: handle.client,
      suite: suite as TaskSuite<unknown>,
      config,
      tasks: suite.eval,
      seed: config.seed + 7919,
    };
    const greedy = async (what: string) => {
      const bar = new Progress(`${label} eval${what}`, suite.eval.length);
      const r = await evaluate({ ...common, greedy: true, onProgress: (d, t) => bar.update(d, "greedy", t) });
      bar.finish(`accuracy ${formatNumber(r.accuracy)}`);
      return r;
    };
    const before = o.before ? await greedy(" (untrained)") : undefined;
    const ckpt = new RunDir(runDir).latestCheckpoint();
    if (!ckpt) throw new Error(`${runDir}: no checkpoint to evaluate`);
    await handle.client.loadCheckpoint({ path: join(ckpt.path, "engine") });
    const after = await greedy("");
    const k = o.voteFor?.(after) ?? 0;
    if (k === 0) return { before, after };
    const vbar = new Progress(`${label} vote@${k}`, suite.eval.length * k);
    const vote = await majorityVote({ ...common, k, onProgress: (d, t) => vbar.update(d, undefined, t) });
    vbar.finish(`accuracy ${formatNumber(vote.accuracy)}`);
    return { after, vote };
  } finally {
    await handle.stop();
  }
}

/**
 * With --resume, a job an earlier demo finished under the same config: its summary, metrics and
 * the evaluations it wrote (none when it stopped before writing them). Undefined: train it.
 */
function keptJob(
  label: string,
  runDir: string,
  config: RunConfig,
  done: (s: TrainerState) => boolean,
): { summary: Job["summary"]; metrics: MetricsRow[]; evals?: JobEvals } | undefined {
  const f = finishedJob(runDir, config, done);
  if (typeof f === "string") {
    if (f !== "not started") process.stderr.write(`${label}: ${f}: training it again from the beginning\n`);
    return undefined;
  }
  const evals = readJobEvals(runDir);
  process.stderr.write(
    `${label}: kept from the earlier run, ${f.checkpoint}` +
      (evals ? ", with its evaluations\n" : "; evaluating it again\n"),
  );
  return { summary: f.summary, metrics: new RunDir(runDir).readMetrics() as MetricsRow[], evals };
}

/** The team: trained, evaluated before and after; or kept (--resume). */
async function teamJob(
  label: string,
  config: RunConfig,
  runDir: string,
  suite: TaskSuite<MathProblem>,
  resume: boolean,
): Promise<Job & { kept: boolean }> {
  const k = resume
    ? keptJob(label, runDir, config, (s) => s.iteration >= config.train.iterations)
    : undefined;
  if (k?.evals?.before) {
    const { before, after } = k.evals;
    return { summary: k.summary, metrics: k.metrics, before, after, kept: true };
  }
  let job: Job;
  if (k) {
    const { before, after } = await evaluateRun(label, config, runDir, suite, { before: true });
    job = { summary: k.summary, metrics: k.metrics, before, after };
  } else {
    const t = await trainJob(label, config, runDir, suite);
    if (t.evals.length < 2) throw new Error(`${label}: expected the evaluations before and after`);
    job = { summary: t.summary, metrics: t.metrics, before: t.evals[0], after: t.evals.at(-1)! };
  }
  writeJobEvals(runDir, { before: job.before, after: job.after });
  return { ...job, kept: k !== undefined };
}

/** The single agent: trained to `budget` sampled tokens and evaluated; or kept (--resume). */
async function baselineJob(
  label: string,
  config: RunConfig,
  runDir: string,
  suite: TaskSuite<MathProblem>,
  budget: number,
  teamTokensPerProblem: number,
  resume: boolean,
): Promise<Job> {
  const done = (s: TrainerState) =>
    (s.sampledTokens ?? 0) >= budget || s.iteration >= config.train.iterations;
  const k = resume ? keptJob(label, runDir, config, done) : undefined;
  if (k?.evals) return { summary: k.summary, metrics: k.metrics, ...k.evals };
  const trained = k ?? (await trainJob(label, config, runDir, suite, budget));
  const evals = await evaluateRun(label, config, runDir, suite, {
    voteFor: (g) => voteSamples(teamTokensPerProblem, g.tokensSampled / g.n),
  });
  writeJobEvals(runDir, evals);
  return { summary: trained.summary, metrics: trained.metrics, ...evals };
}

async function runSeed(
  seed: number,
  team0: RunConfig,
  baseline0: RunConfig,
  suites: { team: TaskSuite<MathProblem>; baseline: TaskSuite<MathProblem> },
  root: string,
  resume: boolean,
): Promise<SeedRun> {
  const dir = join(root, `seed-${seed}`);
  const teamConfig: RunConfig = {
    ...team0,
    seed,
    train: { ...team0.train, evalAtStart: true, evalEvery: 0 },
  };
  const { kept, ...team } = await teamJob(
    `seed ${seed} team`,
    teamConfig,
    join(dir, "team"),
    suites.team,
    resume,
  );

  // The single agent trains until it has sampled the team's training tokens; the iteration cap only
  // bounds a run that never gets there.
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
  const baseline = await baselineJob(
    `seed ${seed} single agent`,
    baselineConfig,
    join(dir, "baseline"),
    suites.baseline,
    team.summary.tokensSampled,
    team.after.tokensSampled / team.after.n,
    // its budget is the team's tokens: a team trained again means a single agent trained again
    resume && kept,
  );
  return { seed, team, baseline };
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

export async function demoCommand(args: string[]): Promise<void> {
  const values = parseCommand("demo", USAGE, args, {
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
    resume: { type: "boolean" },
  })?.values;
  if (!values) return;
  interrupt = onInterrupt();
  try {
    await demo(values);
  } catch (e) {
    if (e instanceof Interrupted) process.stdout.write(`${e.message}\n`);
    else reportError("demo", e);
  } finally {
    interrupt.dispose();
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
  const team0 = loadRunConfig(resolve(str("team") ?? join(REPO, "configs/demo.yaml")), sets);
  const baselineSets = [...((values["set-baseline"] as string[] | undefined) ?? [])];
  if (evalN) baselineSets.push(`eval.n=${evalN}`);
  const baseline0 = loadRunConfig(
    resolve(str("baseline") ?? join(REPO, "configs/demo-baseline.yaml")),
    baselineSets,
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
  const resume = values.resume === true;
  // a fresh demo replaces the directory's last one; --resume keeps what it finished on these problems
  if (!resume) rmSync(root, { recursive: true, force: true });
  mkdirSync(dataDir, { recursive: true });
  const jsonl = (ps: MathProblem[]) => `${ps.map((p) => JSON.stringify(p)).join("\n")}\n`;
  for (const [file, problems] of [
    ["train.jsonl", data.train],
    ["eval.jsonl", data.eval],
  ] as const) {
    const path = join(dataDir, file);
    if (resume && existsSync(path) && readFileSync(path, "utf8") !== jsonl(problems)) {
      throw new Error(
        `--resume: ${path} holds other problems than these options generate (--problems, --train-problems, --eval, the team config's seed); run the demo with the earlier run's options, or without --resume`,
      );
    }
    writeFileAtomic(path, jsonl(problems));
  }
  const suite = createMathSuite({
    train: data.train,
    eval: data.eval,
    ...(team0.task?.kind === "math" ? { attempts: team0.task.attempts, ...team0.task.options } : {}),
  });
  // The single agent answers alone: only its own task options apply (no step roles).
  const baselineSuite = createMathSuite({
    train: data.train,
    eval: data.eval,
    ...(baseline0.task?.kind === "math"
      ? { attempts: baseline0.task.attempts, ...baseline0.task.options }
      : {}),
  });
  const taskName = `${kind} arithmetic word problems (generated, seed ${team0.seed})`;
  process.stderr.write(
    `marft demo: team ${team0.agents.map((a) => a.role).join(" -> ")} vs a single agent on ${data.train.length} ` +
      `${taskName}; seeds ${seeds.join(", ")}; ${team0.train.iterations} team iterations; ` +
      `evaluation on ${data.eval.length} held-out problems\n`,
  );

  const runs: SeedRun[] = [];
  const suites = { team: suite, baseline: baselineSuite };
  for (const seed of seeds) runs.push(await runSeed(seed, team0, baseline0, suites, root, resume));

  const s = summarize(runs, team0, taskName, (performance.now() - t0) / 1000);
  writeFileAtomic(join(root, "summary.json"), `${JSON.stringify(s, null, 2)}\n`);
  const first = runs[0]!;
  writeFileAtomic(
    join(root, "report.html"),
    renderReport({
      root,
      runs: [`seed-${first.seed}/team`, `seed-${first.seed}/baseline`],
      title: "MARFT demo report",
      extras: demoExtras(s, team0, first),
    }),
  );
  printTable(s, data.eval.length);
  process.stdout.write(`wrote ${join(root, "summary.json")} and ${join(root, "report.html")}\n`);
}
