// `marft demo`: the main job. Trains a real two-agent team (SmolLM2-135M-Instruct, reasoner -> actor,
// MARFT-A) on short arithmetic word problems, and a single-agent PPO baseline with the same sampled
// token budget; evaluates both before and after on held-out problems; writes runs/demo/summary.json
// and runs/demo/report.html.
//
//   marft demo [--iterations N] [--eval N] [--no-baseline] [--set k=v ...]
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { pairedTest, twoProportionZTest } from "../algo/index.ts";
import { arithmeticSplits } from "../envs/math/arith.ts";
import { createMathSuite } from "../envs/math/env.ts";
import { loadRunConfig } from "../config/load.ts";
import type { RunConfig } from "../config/schema.ts";
import type { EvalResult } from "../train/evaluate.ts";
import { RunDir, writeFileAtomic } from "../train/rundir.ts";
import type { MetricsRow } from "../train/phases.ts";
import { type Summary, train } from "../train/run.ts";
import { onInterrupt } from "./interrupt.ts";
import { formatNumber, Progress, table } from "./progress.ts";
import { renderReport } from "./report.ts";
import type { ReportExtras } from "../dashboard/api.ts";
import { engineConnector, reportError } from "./train.ts";

const REPO = resolve(import.meta.dirname, "../..");

const USAGE = `usage: marft demo [--iterations N] [--eval N] [--no-baseline] [--set path=value ...]

Trains the two-agent team of configs/demo.yaml (SmolLM2-135M, reasoner -> actor) on generated
arithmetic word problems, and a single-agent baseline with the same sampled-token budget; evaluates
both on held-out problems; writes runs/demo/summary.json and runs/demo/report.html.

options:
  --iterations N     training iterations (default: the config's)
  --eval N           held-out problems (default: the config's eval.n)
  --no-baseline      skip the single-agent baseline
  --set path=value   override a field of configs/demo.yaml (repeatable)
  -h, --help         this text

Ctrl-C finishes the current iteration, saves a checkpoint and stops; a second Ctrl-C quits at once.
`;

/** Ctrl-C during the demo: the running job checkpoints and stops, and no further job starts. */
let interrupt: ReturnType<typeof onInterrupt> | undefined;

interface Outcome {
  summary: Summary;
  /** Missing for the baseline: it starts from the same base model the team's "before" measured. */
  before?: EvalResult;
  after: EvalResult;
  metrics: MetricsRow[];
}

function accuracyOf(r: EvalResult) {
  return { accuracy: r.accuracy, ci95: r.ci95, n: r.n };
}

/** Runs one training job with a progress bar; collects the first and last evaluation in full. */
async function runJob(
  label: string,
  config: RunConfig,
  runDir: string,
  data: ReturnType<typeof arithmeticSplits>,
): Promise<Outcome> {
  rmSync(runDir, { recursive: true, force: true });
  const suite = createMathSuite({
    train: data.train,
    eval: data.eval,
    attempts: config.task?.kind === "math" ? config.task.attempts : 1,
    extract: "last-number",
  });
  const evals: EvalResult[] = [];
  const bar = new Progress(label, config.train.iterations);
  let last = "";
  const summary = await train({
    config,
    configDir: join(REPO, "configs"),
    runDir,
    suite: suite as Parameters<typeof train>[0]["suite"],
    connect: engineConnector(config, join(runDir, "engine.log")),
    signal: interrupt?.signal,
    log: (line) => process.stderr.write(`\n${label}: ${line}\n`),
    onProgress: (e) => {
      if (e.kind === "eval") evals.push(e.result);
      else if (e.kind === "iteration") {
        last = `reward ${formatNumber(e.row["reward/mean"] ?? Number.NaN)}`;
        bar.update(e.iteration, last);
      } else bar.update(e.iteration, `${e.phase}${e.total ? ` ${e.done}/${e.total}` : ""}  ${last}`);
    },
  });
  bar.finish();
  if (evals.length === 0) throw new Error(`${label}: expected an evaluation after training`);
  return {
    summary,
    before: config.train.evalAtStart ? evals[0] : undefined,
    after: evals.at(-1)!,
    metrics: new RunDir(runDir).readMetrics() as MetricsRow[],
  };
}

/** What the demo's report shows above the runs: the accuracies, the test, and held-out transcripts. */
function demoExtras(
  config: RunConfig,
  summary: { significance: { paired_mcnemar_p: number; improved: number; worsened: number }; wall_s: number },
  team: { before: EvalResult; after: EvalResult },
  baseline: EvalResult | undefined,
): ReportExtras {
  const pct = (r: EvalResult) =>
    `${(100 * r.accuracy).toFixed(1)}% [${(100 * r.ci95[0]).toFixed(1)}, ${(100 * r.ci95[1]).toFixed(1)}] (n=${r.n})`;
  const bar = (name: string, r: EvalResult) => ({ name, value: r.accuracy, ci95: r.ci95 });
  const after = new Map(team.after.problems.map((p) => [p.taskId, p]));
  const s = summary.significance;
  return {
    title: `MARFT demo: ${config.agents.map((a) => a.role).join(" → ")} (${config.algo.estimator})`,
    summary: [
      ["model", String(Object.values(config.bases)[0]?.source)],
      ["team before (greedy pass@1, 95% CI)", pct(team.before)],
      ["team after", pct(team.after)],
      [
        "paired test (McNemar)",
        `p = ${formatNumber(s.paired_mcnemar_p)}: ${s.improved} improved, ${s.worsened} worsened`,
      ],
      ...(baseline ? [["single-agent baseline after", pct(baseline)] as [string, string]] : []),
      ["wall time", `${Math.round(summary.wall_s)} s`],
    ],
    bars: {
      title: "held-out accuracy (greedy pass@1, 95% CI)",
      bars: [
        bar("team before", team.before),
        bar("team after", team.after),
        ...(baseline ? [bar("single agent after", baseline)] : []),
      ],
    },
    comparison: {
      title: "the same held-out problems before and after training (greedy)",
      columns: ["before", "after"],
      rows: team.before.problems
        .filter((p) => after.has(p.taskId))
        .slice(0, 6)
        .map((p) => [p, after.get(p.taskId)!].map((q) => ({ messages: q.transcript, correct: q.correct }))),
    },
  };
}

/** The baseline: the actor alone (same prompt, model, LoRA and PPO settings), critic-based PPO. */
function baselineConfig(team: RunConfig): RunConfig {
  const actor = team.agents.find((a) => a.role === "actor") ?? team.agents.at(-1)!;
  return {
    ...team,
    name: `${team.name}-baseline`,
    agents: [{ ...actor, id: "solo", role: "actor" }],
    // One action per episode instead of two: twice the episodes, so the baseline samples at least the
    // team's tokens, a comparison that favours the baseline (summary.json reports both counts).
    // No evaluation before training: the budget goes to the team's before/after comparison.
    train: {
      ...team.train,
      tasksPerIter: team.train.tasksPerIter * team.agents.length,
      evalAtStart: false,
    },
  };
}

export async function demoCommand(args: string[]): Promise<void> {
  let values: ReturnType<typeof parseDemoArgs>["values"];
  try {
    ({ values } = parseDemoArgs(args));
  } catch (e) {
    process.stderr.write(`marft demo: ${(e as Error).message}\n\n${USAGE}`);
    process.exitCode = 2;
    return;
  }
  if (values.help) {
    process.stdout.write(USAGE);
    return;
  }
  interrupt = onInterrupt();
  try {
    await demo(values);
  } catch (e) {
    reportError("demo", e);
  } finally {
    interrupt.dispose();
  }
}

function parseDemoArgs(args: string[]) {
  return parseArgs({
    args,
    options: {
      iterations: { type: "string" },
      eval: { type: "string" },
      "no-baseline": { type: "boolean" },
      set: { type: "string", multiple: true },
      help: { type: "boolean", short: "h" },
    },
  });
}

async function demo(values: ReturnType<typeof parseDemoArgs>["values"]): Promise<void> {
  const t0 = performance.now();
  const root = join(REPO, "runs/demo");
  const dataDir = join(root, "data");
  mkdirSync(dataDir, { recursive: true });

  const sets = [...(values.set ?? [])];
  if (values.iterations) sets.push(`train.iterations=${values.iterations}`);
  if (values.eval) sets.push(`eval.n=${values.eval}`);
  const config0 = loadRunConfig(join(REPO, "configs/demo.yaml"), sets);
  const evalN = config0.eval.n || 200;
  // Problems are generated from the seed; eval texts never appear in the training set.
  const data = arithmeticSplits(config0.seed, 4000, evalN);
  const jsonl = (ps: typeof data.train) =>
    ps.map((p) => JSON.stringify({ id: p.id, problem: p.problem, answer: p.answer })).join("\n") + "\n";
  writeFileSync(join(dataDir, "train.jsonl"), jsonl(data.train));
  writeFileSync(join(dataDir, "eval.jsonl"), jsonl(data.eval));
  const config: RunConfig = {
    ...config0,
    train: { ...config0.train, evalAtStart: true },
    task:
      config0.task?.kind === "math"
        ? { ...config0.task, trainFile: join(dataDir, "train.jsonl"), evalFile: join(dataDir, "eval.jsonl") }
        : config0.task,
  };

  process.stderr.write(
    `marft demo: ${config.agents.map((a) => a.role).join(" -> ")} on ${data.train.length} arithmetic word problems, ` +
      `${config.train.iterations} iterations; evaluation on ${data.eval.length} held-out problems\n`,
  );
  const team = await runJob("team", config, join(root, "team"), data);
  if (team.summary.stoppedEarly) {
    process.stdout.write(`stopped early; the team's checkpoint: ${team.summary.checkpoint}\n`);
    return;
  }
  const baseline = values["no-baseline"]
    ? undefined
    : await runJob("baseline", baselineConfig(config), join(root, "baseline"), data);

  const before = team.before!;
  const paired = pairedTest(
    before.problems.map((p) => p.correct),
    team.after.problems.map((p) => p.correct),
  );
  const z = twoProportionZTest(
    before.problems.map((p) => p.correct),
    team.after.problems.map((p) => p.correct),
  );
  const wall = (performance.now() - t0) / 1000;
  const summary = {
    task: "arithmetic word problems (generated, seed " + config.seed + ")",
    model: Object.values(config.bases)[0]?.source,
    team: config.agents.map((a) => a.role),
    estimator: config.algo.estimator,
    eval: { before: accuracyOf(before), after: accuracyOf(team.after) },
    significance: {
      paired_mcnemar_p: paired.p,
      improved: paired.improved,
      worsened: paired.worsened,
      two_proportion_z: z.z,
      two_proportion_p: z.p,
    },
    baseline: baseline
      ? {
          after: accuracyOf(baseline.after),
          sampled_tokens: baseline.summary.tokensSampled,
          wall_s: baseline.summary.wallSeconds,
        }
      : null,
    iterations: team.summary.iterations,
    wall_s: wall,
    sampled_tokens: team.summary.tokensSampled,
    team_wall_s: team.summary.wallSeconds,
  };
  writeFileAtomic(join(root, "summary.json"), `${JSON.stringify(summary, null, 2)}\n`);
  writeFileAtomic(
    join(root, "report.html"),
    renderReport({
      root,
      runs: baseline ? ["team", "baseline"] : ["team"],
      title: "MARFT demo report",
      extras: demoExtras(config, summary, { before, after: team.after }, baseline?.after),
    }),
  );

  const pct = (r: EvalResult) =>
    `${(100 * r.accuracy).toFixed(1)}% [${(100 * r.ci95[0]).toFixed(1)}, ${(100 * r.ci95[1]).toFixed(1)}]`;
  const rows: Array<Array<string | number>> = [
    ["team before (greedy pass@1, 95% CI)", pct(before)],
    ["team after", pct(team.after)],
    ["paired test (McNemar) p", formatNumber(paired.p)],
  ];
  if (baseline) {
    rows.push(["single-agent baseline after", pct(baseline.after)]);
    rows.push([
      "sampled tokens team / baseline",
      `${team.summary.tokensSampled} / ${baseline.summary.tokensSampled}`,
    ]);
  }
  rows.push(["wall time (s)", Math.round(wall)]);
  process.stdout.write(`\n${table(rows, ["marft demo", `n=${team.after.n} held-out problems`])}`);
  process.stdout.write(`wrote ${join(root, "summary.json")} and ${join(root, "report.html")}\n`);
}
