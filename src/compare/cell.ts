// One cell of a comparison: one variant trained at one seed, in its own run directory
// (<out>/cells/<variant>/seed-<s>/: config.yaml, metrics.jsonl, checkpoints/, summary.json), and its
// result in cell.json once it is finished. A finished cell is never recomputed: cell.json is read
// back (and must be of the same config). An unfinished one continues from its last checkpoint; one
// whose training finished but whose evaluation did not is evaluated from its final checkpoint.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { cpus, hostname } from "node:os";
import { join } from "node:path";
import { configToYaml } from "../config/load.ts";
import type { RunConfig } from "../config/schema.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import type { EvalResult } from "../train/evaluate.ts";
import type { MetricsRow } from "../train/phases.ts";
import { type EngineHandle, train } from "../train/run.ts";
import { RunDir, type TrainerState, writeFileAtomic } from "../train/rundir.ts";
import { trainingDone } from "../train/schedule.ts";
import { setupEngine } from "../train/setup.ts";
import { Trainer } from "../train/trainer.ts";

export interface Cell {
  variant: string;
  seed: number;
  /** The cell's full run config (seed, budget and evaluation already set). */
  config: RunConfig;
  untrained: boolean;
  dir: string;
}

/** A finished cell, as cell.json holds it. */
export interface CellResult {
  variant: string;
  seed: number;
  /** sha256 of the resolved config.yaml: a finished cell is reused only for the same config. */
  config_sha: string;
  accuracy: number;
  ci95: [number, number];
  n: number;
  /** Per held-out problem: solved or not (the paired comparisons read these). */
  problems: Array<{ id: string; correct: boolean }>;
  per_task?: Record<string, { accuracy: number; ci95: [number, number]; n: number }>;
  /** Tokens the training rollouts sampled (what the budget counts). */
  sampled_tokens: number;
  iterations: number;
  /** Seconds of the iterations (their rollout, update and evaluation phases, from metrics.jsonl). */
  wall_s: number;
  /** The same without evaluation. */
  train_s: number;
  /** [sampled tokens so far, team reward] after each iteration. */
  curve: Array<[number, number]>;
  untrained: boolean;
  /** What computed it: the code's commit (with "-dirty" for uncommitted changes), the machine, when. */
  provenance?: Provenance;
}

export interface Provenance {
  commit: string | null;
  host: string;
  cpus: number;
  node: string;
  finished: string;
}

/** The commit of this checkout and the machine, recorded with every cell. */
export function provenance(): Provenance {
  let commit: string | null = null;
  try {
    const git = (args: string[]) =>
      execFileSync("git", args, {
        cwd: import.meta.dirname,
        encoding: "utf8",
        stdio: ["ignore", "pipe", "ignore"],
      }).trim();
    commit =
      git(["rev-parse", "--short=12", "HEAD"]) +
      (git(["status", "--porcelain", "--untracked-files=no"]) ? "-dirty" : "");
  } catch {
    commit = null; // not a git checkout
  }
  return {
    commit,
    host: hostname(),
    cpus: cpus().length,
    node: process.version,
    finished: new Date().toISOString(),
  };
}

export interface CellHooks {
  /** Starts (or connects to) an engine for the cell; `logFile` is its engine.log. */
  connect: (config: RunConfig, logFile: string) => () => Promise<EngineHandle>;
  suite: TaskSuite<unknown>;
  configDir: string;
  log?: (line: string) => void;
  /** After each iteration: the tokens sampled so far (for progress and the ETA). */
  onIteration?: (iteration: number, sampledTokens: number) => void;
  signal?: AbortSignal;
}

export const configSha = (c: RunConfig): string => createHash("sha256").update(configToYaml(c)).digest("hex");

export function cellResultPath(dir: string): string {
  return join(dir, "cell.json");
}

/** cell.json if the cell is finished (and of this config; a different one is an error, never reused). */
export function finishedCell(cell: Cell): CellResult | null {
  const path = cellResultPath(cell.dir);
  if (!existsSync(path)) return null;
  const r = JSON.parse(readFileSync(path, "utf8")) as CellResult;
  if (r.config_sha !== configSha(cell.config)) {
    throw new Error(
      `${path}: this cell was computed with another config (the spec or its base changed); delete ${cell.dir} to recompute it, or compare into another --out`,
    );
  }
  return r;
}

/** Trains (or resumes, or only evaluates) a cell and writes its cell.json; returns the result. */
export async function runCell(cell: Cell, h: CellHooks): Promise<CellResult | null> {
  const done = finishedCell(cell);
  if (done) return done;
  const run = new RunDir(cell.dir);
  if (existsSync(run.configPath) && readFileSync(run.configPath, "utf8") !== configToYaml(cell.config)) {
    throw new Error(
      `${run.configPath}: the cell's run directory holds a run of another config; delete ${cell.dir} to recompute it`,
    );
  }
  mkdirSync(cell.dir, { recursive: true });
  const connect = h.connect(cell.config, run.engineLogPath);
  let evalResult: EvalResult;
  const ckpt = run.latestCheckpoint();
  if (cell.untrained) {
    writeFileAtomic(run.configPath, configToYaml(cell.config));
    evalResult = await evaluateAt(cell.config, h.suite, connect, undefined);
  } else if (ckpt && trainingDone(cell.config, ckpt.state)) {
    h.log?.(`${cell.variant} seed ${cell.seed}: trained; evaluating its final checkpoint`);
    evalResult = await evaluateAt(cell.config, h.suite, connect, ckpt);
  } else {
    if (ckpt) h.log?.(`${cell.variant} seed ${cell.seed}: resuming from iteration ${ckpt.state.iteration}`);
    else clear(cell.dir); // a start that crashed before its first checkpoint: start over
    let tokens = ckpt?.state.sampledTokens ?? 0;
    let last: EvalResult | undefined;
    const summary = await train({
      config: cell.config,
      configDir: h.configDir,
      runDir: cell.dir,
      resume: ckpt !== undefined,
      connect,
      suite: h.suite,
      log: h.log,
      signal: h.signal,
      onProgress: (e) => {
        if (e.kind === "eval") last = e.result;
        if (e.kind === "iteration") {
          tokens += e.row["tokens/sampled"] ?? 0;
          h.onIteration?.(e.iteration, tokens);
        }
      },
    });
    if (summary.stoppedEarly || !last) return null; // interrupted: the checkpoint is where to go on
    evalResult = last;
  }
  const result = cellResult(cell, evalResult, run.readMetrics() as MetricsRow[]);
  writeFileAtomic(cellResultPath(cell.dir), `${JSON.stringify(result, null, 1)}\n`);
  return result;
}

/** The held-out evaluation of the team at a checkpoint (or as initialised). */
async function evaluateAt(
  config: RunConfig,
  suite: TaskSuite<unknown>,
  connect: () => Promise<EngineHandle>,
  ckpt: { path: string; state: TrainerState } | undefined,
): Promise<EvalResult> {
  const handle = await connect();
  try {
    await setupEngine(handle.client, config);
    if (ckpt) await handle.client.loadCheckpoint({ path: join(ckpt.path, "engine") });
    return await new Trainer(config, suite, handle.client, { state: ckpt?.state }).evaluate();
  } finally {
    await handle.stop().catch(() => {});
  }
}

/** A cell's result from its final evaluation and its metrics. */
export function cellResult(cell: Cell, r: EvalResult, rows: readonly MetricsRow[]): CellResult {
  let tokens = 0;
  const curve: Array<[number, number]> = rows.map((row) => {
    tokens += row["tokens/sampled"] ?? 0;
    // under dynamic sampling reward/mean is the kept batch's; the curve shows what was sampled
    return [tokens, row["reward/sampled_mean"] ?? row["reward/mean"] ?? Number.NaN];
  });
  const seconds = (keep: (k: string) => boolean) =>
    rows.reduce(
      (s, row) =>
        s + Object.entries(row).reduce((t, [k, v]) => (k.startsWith("time/") && keep(k) ? t + v : t), 0),
      0,
    );
  return {
    variant: cell.variant,
    seed: cell.seed,
    config_sha: configSha(cell.config),
    accuracy: r.accuracy,
    ci95: r.ci95,
    n: r.n,
    problems: r.problems.map((p) => ({ id: p.taskId, correct: p.correct })),
    ...(r.perTask ? { per_task: r.perTask } : {}),
    sampled_tokens: tokens,
    iterations: rows.length,
    wall_s: seconds(() => true),
    train_s: seconds((k) => k !== "time/eval"),
    curve,
    untrained: cell.untrained,
    provenance: provenance(),
  };
}

function clear(dir: string): void {
  if (!existsSync(dir)) return;
  for (const name of readdirSync(dir)) rmSync(join(dir, name), { recursive: true, force: true });
}
