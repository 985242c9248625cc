// A training run end to end: the run directory (locked while it runs), the engine (started, restored,
// restarted after a crash), resume, the loop, evaluation, checkpoints and the summary.
//
// Every way out settles: a failure after the run has begun is a RunStoppedError that says what went
// wrong, where the last checkpoint is and how to continue; the engine is stopped and the lock
// released on every path.
import { join } from "node:path";
import type { ComputeEngine } from "../client/compute.ts";
import { configToYaml } from "../config/load.ts";
import type { RunConfig } from "../config/schema.ts";
import { EngineUnreachableError, MarftError, RunStoppedError } from "../errors.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import type { EpisodeSource } from "./episodes.ts";
import type { EvalResult } from "./evaluate.ts";
import { evalMetrics } from "./metrics.ts";
import type { MetricsRow, ProgressEvent } from "./phases.ts";
import { RunDir, type TrainerState, writeFileAtomic } from "./rundir.ts";
import { trainingDone } from "./schedule.ts";
import { setupEngine } from "./setup.ts";
import { Trainer } from "./trainer.ts";
import { WatchFiles } from "./watch.ts";

/** A connection to an engine (a local process or a remote server) and how to let it go. */
export interface EngineHandle {
  client: ComputeEngine;
  stop(): Promise<void>;
  /** The process of a local engine (recorded in the run's lock); absent for a remote one. */
  pid?: number;
}

export interface TrainOptions {
  config: RunConfig;
  /** Directory the config file was in: task file paths are relative to it. */
  configDir: string;
  /** runs/<name> */
  runDir: string;
  resume?: boolean;
  /** Starts (or connects to) an engine; called again to restart one that died. */
  connect: () => Promise<EngineHandle>;
  /** The tasks and where episodes come from: a task suite (an Env per episode) or another source (an app). */
  suite: TaskSuite<unknown> | EpisodeSource;
  /** One line of news for a person (engine restarts, zero-advantage warnings, eval results). */
  log?: (line: string) => void;
  /** Called after each phase, for progress bars. */
  onProgress?: (e: ProgressEvent) => void;
  /** When aborted (Ctrl-C), the loop saves a checkpoint after the current iteration and returns. */
  signal?: AbortSignal;
  /** Restarts allowed after engine deaths (default 3). */
  maxRestarts?: number;
}

export interface Summary {
  name: string;
  iterations: number;
  stoppedEarly: boolean;
  wallSeconds: number;
  tokensSampled: number;
  engineRestarts: number;
  firstRewards: number[];
  lastRewards: number[];
  eval: { before?: EvalSummary; after?: EvalSummary };
  checkpoint?: string;
  /** An engine of several replicas (engine.replicas): what each did, from the engine's stats at the end. */
  replicas?: ReplicaSummary[];
}

export interface ReplicaSummary {
  index: number;
  node: string;
  restarts: number;
  sampleCalls: number;
  tokensSampled: number;
  tokensTrained: number;
}

/** The replicas' figures of the engine's stats (none for one engine, or an engine that does not answer). */
async function replicaSummary(engine: ComputeEngine): Promise<ReplicaSummary[] | undefined> {
  const stats = await engine.stats({ timeoutMs: 30_000 }).catch(() => undefined);
  return stats?.replicas?.map((r) => ({
    index: r.index,
    node: r.node,
    restarts: r.restarts,
    sampleCalls: r.sample_calls,
    tokensSampled: r.tokens_sampled,
    tokensTrained: r.tokens_trained,
  }));
}

export interface EvalSummary {
  iteration: number;
  accuracy: number;
  ci95: [number, number];
  n: number;
  passAtK?: number;
}

function evalSummary(iteration: number, r: EvalResult): EvalSummary {
  return {
    iteration,
    accuracy: r.accuracy,
    ci95: r.ci95,
    n: r.n,
    ...(r.passAtK !== undefined ? { passAtK: r.passAtK } : {}),
  };
}

/** Is the engine gone? Only a call that got no answer says it may be; a health check confirms it. */
async function engineDown(engine: ComputeEngine, e: unknown): Promise<boolean> {
  if (!(e instanceof EngineUnreachableError)) return false;
  try {
    await engine.health({ timeoutMs: 5000 });
    return false;
  } catch {
    return true;
  }
}

/** Train a run end to end: run directory, engine setup, resume, the loop, eval, checkpoints, summary. */
export async function train(opts: TrainOptions): Promise<Summary> {
  const log = opts.log ?? (() => {});
  const run = new RunDir(opts.runDir);
  // Before anything starts: a new run must not land on an old one (a locked one is refused below).
  if (!opts.resume && (run.listCheckpoints().length > 0 || run.metricsLineCount() > 0)) {
    throw new MarftError(
      `${run.root} already holds a run: resume it with --resume ${run.root}, or choose another name`,
    );
  }
  const release = await run.lock(log);
  try {
    const removed = run.removeLeftovers();
    if (removed.length > 0)
      log(`removed ${removed.length} temporary file(s) an interrupted trainer left: ${removed.join(", ")}`);
    writeFileAtomic(run.configPath, configToYaml(opts.config));
    return await trainLocked(opts, run);
  } finally {
    release();
  }
}

async function trainLocked(opts: TrainOptions, run: RunDir): Promise<Summary> {
  const c = opts.config;
  const log = opts.log ?? (() => {});
  const onProgress = opts.onProgress ?? (() => {});
  const watch = new WatchFiles(run, c);
  const t0 = performance.now();
  let handle = await opts.connect();
  run.recordEngine(handle.pid);
  let restarts = 0;

  /** Set up a fresh engine and bring it (and the trainer state) to the latest checkpoint, if any. */
  const restore = async (client: ComputeEngine): Promise<TrainerState | undefined> => {
    await setupEngine(client, c);
    const ckpt = run.latestCheckpoint();
    if (!ckpt) {
      run.truncateMetrics(0);
      watch.rewind(0);
      return undefined;
    }
    await client.loadCheckpoint({ path: join(ckpt.path, "engine") });
    run.truncateMetrics(ckpt.state.metricsLines);
    watch.rewind(ckpt.state.iteration);
    return ckpt.state;
  };

  let trainer: Trainer;
  try {
    let state: TrainerState | undefined;
    if (opts.resume) {
      state = await restore(handle.client);
      if (state) log(`resuming ${run.root} from iteration ${state.iteration}`);
      else log(`${run.root} has no complete checkpoint: starting the run from the beginning`);
    } else {
      await setupEngine(handle.client, c);
    }
    trainer = new Trainer(c, opts.suite, handle.client, { state, log, onProgress });
    await trainer.syncVersions();
  } catch (e) {
    await handle.stop().catch(() => {});
    throw e;
  }
  const summary: Summary = {
    name: c.name,
    iterations: 0,
    stoppedEarly: false,
    wallSeconds: 0,
    tokensSampled: 0,
    engineRestarts: 0,
    firstRewards: [],
    lastRewards: [],
    eval: {},
  };

  const checkpoint = async () => {
    trainer.state.metricsLines = run.metricsLineCount();
    const client = trainer.engine;
    const path = await run.writeCheckpoint(
      trainer.state,
      async (dir) => {
        await client.saveCheckpoint({ path: dir });
      },
      c.train.keepCheckpoints,
    );
    summary.checkpoint = path;
    return path;
  };

  const runEval = async (iteration: number): Promise<EvalResult> => {
    // an evaluation is a phase of its own for progress bars: it can take minutes
    onProgress({
      kind: "phase",
      iteration,
      phase: "eval",
      done: 0,
      total: c.eval.n > 0 ? Math.min(c.eval.n, opts.suite.eval.length) : opts.suite.eval.length,
    });
    const r = await trainer.evaluate((done, total) =>
      onProgress({ kind: "phase", iteration, phase: "eval", done, total }),
    );
    onProgress({ kind: "eval", iteration, result: r });
    log(
      `eval @ iteration ${iteration}: accuracy ${r.accuracy.toFixed(3)} [${r.ci95[0].toFixed(3)}, ${r.ci95[1].toFixed(3)}] (n=${r.n})` +
        (r.passAtK !== undefined ? `, pass@${c.eval.k} ${r.passAtK.toFixed(3)}` : ""),
    );
    return r;
  };

  try {
    if (c.train.evalAtStart && trainer.state.iteration === 0) {
      summary.eval.before = evalSummary(0, await runEval(0));
    }
    while (!trainingDone(c, trainer.state)) {
      if (opts.signal?.aborted) {
        summary.stoppedEarly = true;
        break;
      }
      const it = trainer.state.iteration;
      let row: MetricsRow;
      try {
        row = await trainer.iteration();
      } catch (e) {
        if (!(await engineDown(trainer.engine, e)) || restarts >= (opts.maxRestarts ?? 3)) throw e;
        restarts++;
        log(`the engine died during iteration ${it + 1} (${(e as Error).message}); restarting it`);
        await trainer.settle(); // a rollout prefetched against the dead engine (train.async)
        await handle.stop().catch(() => {});
        handle = await opts.connect();
        run.recordEngine(handle.pid);
        const restored = await restore(handle.client);
        if (restored) log(`continuing from the checkpoint at iteration ${restored.iteration}`);
        else log("no checkpoint yet: starting over from iteration 0");
        const tokens = trainer.tokensSampled;
        trainer = new Trainer(c, opts.suite, handle.client, { state: restored, log, onProgress });
        trainer.tokensSampled = tokens;
        await trainer.syncVersions();
        continue;
      }
      const iteration = trainer.state.iteration;
      const isLast = trainingDone(c, trainer.state);
      if ((c.train.evalEvery > 0 && iteration % c.train.evalEvery === 0) || isLast) {
        const t = performance.now();
        const r = await runEval(iteration);
        if (isLast) summary.eval.after = evalSummary(iteration, r);
        Object.assign(row, evalMetrics(r, c.eval.k));
        row["time/eval"] = (performance.now() - t) / 1000;
      }
      run.appendMetrics(row);
      watch.iteration(iteration, row, trainer.lastBatch);
      onProgress({ kind: "iteration", iteration, total: c.train.iterations, row });
      if (c.train.checkpointEvery > 0 && iteration % c.train.checkpointEvery === 0 && !isLast) {
        const t = performance.now();
        await checkpoint();
        log(`checkpoint iteration ${iteration} (${((performance.now() - t) / 1000).toFixed(1)}s)`);
      }
    }
    summary.iterations = trainer.state.iteration;
    await checkpoint();
  } catch (e) {
    // The cause, then where the run can continue from.
    const reason = e instanceof Error ? e : new Error(String(e));
    throw new RunStoppedError(reason, run.root, run.latestCheckpointInfo());
  } finally {
    summary.engineRestarts = restarts;
    summary.tokensSampled = trainer.tokensSampled;
    summary.wallSeconds = (performance.now() - t0) / 1000;
    const rewards = run
      .readMetrics()
      .flatMap((r) => (r["reward/mean"] === undefined ? [] : [r["reward/mean"]]));
    summary.firstRewards = rewards.slice(0, 3);
    summary.lastRewards = rewards.slice(-3);
    await trainer.settle(); // a rollout still in flight (train.async, a stop mid-run) is not trained on
    const replicas = await replicaSummary(trainer.engine);
    if (replicas) summary.replicas = replicas;
    writeFileAtomic(run.summaryPath, `${JSON.stringify(summary, null, 2)}\n`);
    await handle.stop().catch(() => {});
  }
  return summary;
}
