// Asynchronous against synchronous training: `async_speedup` is the wall time per iteration of
// configs/tiny-secret.yaml trained synchronously over that of the same config with train.async on
// (same seed, iterations and engine settings), measured in one run, with both reward curves (the
// speedup must not cost learning) and the phase timings that say where the time went. Both sides run
// on an engine of 2 replicas of 1 thread each (engine.replicas: 2, a local Ray cluster), as issue 14
// asks; `async/sync_s` is then the wall time of the all-reduced optim_step calls of an iteration,
// which is when the replicas' adapters are brought to the same update.
//
// Wall time per iteration: between consecutive iteration ends, the first (engine warm-up) and the
// last (it includes the final evaluation) left out. The rollout and the update share the replicas'
// compute threads (sample calls are spread over both, and so is a data-parallel update), so what
// overlap can save is what is not engine compute: the trainer's own work between calls (credit,
// metrics, JSON), HTTP round trips, and the rollout's idle tails; on these CPUs a decode step costs
// about in proportion to its batch, so little is hidden.
//
// `npx tsx bench/async.ts [--quick]` prints the figures; `benchAsync()` is what `marft bench` calls.
import { rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { mean } from "../src/algo/index.ts";
import { engineConnector } from "../src/cli/train.ts";
import { loadRunConfig } from "../src/config/load.ts";
import { RunDir } from "../src/train/rundir.ts";
import { train } from "../src/train/run.ts";
import { runSuite } from "../src/train/suite.ts";

const ROOT = join(import.meta.dirname, "..");

export interface AsyncBenchSide {
  async: boolean;
  iterations: number;
  /** mean wall seconds per iteration (first and last left out) */
  secondsPerIteration: number;
  wallSeconds: number;
  /** reward/mean per iteration */
  reward: number[];
  /** mean seconds per iteration of each phase (time/*) and of the async/* timings */
  phases: Record<string, number>;
  /** async: turns trained on by their age in versions, summed over the run and the agents */
  staleness?: Record<string, number>;
  /** the wall seconds between iteration ends that were measured */
  gaps: number[];
  /** several runs of a side: each run's seconds per iteration, and each run's reward curve */
  runs?: number[];
  rewardRuns?: number[][];
}

async function runSide(isAsync: boolean, iterations: number, replicas: number): Promise<AsyncBenchSide> {
  const name = `bench-async-${isAsync ? "on" : "off"}`;
  const config = loadRunConfig(join(ROOT, "configs", "tiny-secret.yaml"), [
    `name=${name}`,
    `train.iterations=${iterations}`,
    "train.checkpointEvery=0",
    "eval.n=8",
    `engine.replicas=${replicas}`,
    "engine.replica.threads=1",
    "engine.replica.cpus=1",
    ...(isAsync ? ["train.async={}"] : []),
  ]);
  const dir = join(tmpdir(), name);
  rmSync(dir, { recursive: true, force: true });
  const ends: number[] = [];
  const summary = await train({
    config,
    configDir: join(ROOT, "configs"),
    runDir: dir,
    suite: runSuite(config, "."),
    // the engine `marft train` starts for this config: a local Ray cluster of `replicas` replicas
    connect: engineConnector(config, join(dir, "engine.log")),
    onProgress: (e) => {
      if (e.kind === "iteration") ends.push(performance.now());
    },
  });
  const rows = new RunDir(dir).readMetrics();
  const gaps = ends.slice(1, -1).map((t, i) => (t - ends[i]!) / 1000);
  const keys = [...new Set(rows.flatMap((r) => Object.keys(r)))].filter(
    (k) => k.startsWith("time/") || /^async\/(trainer_wait|rollout_wait|rollout|sync)_s$/.test(k),
  );
  const phases = Object.fromEntries(keys.map((k) => [k, mean(rows.map((r) => r[k] ?? 0))]));
  const side: AsyncBenchSide = {
    async: isAsync,
    iterations: rows.length,
    secondsPerIteration: mean(gaps),
    wallSeconds: summary.wallSeconds,
    reward: rows.map((r) => r["reward/mean"] ?? Number.NaN),
    phases,
    gaps,
  };
  if (isAsync) {
    const staleness: Record<string, number> = {};
    for (const r of rows)
      for (const [k, v] of Object.entries(r)) {
        const m = /^async\/staleness\/[^/]+\/(\d+)$/.exec(k);
        if (m) staleness[m[1]!] = (staleness[m[1]!] ?? 0) + v;
      }
    side.staleness = staleness;
  }
  rmSync(dir, { recursive: true, force: true });
  return side;
}

/** A side measured in several runs: the iteration gaps and the phase means pooled, the first run's curve. */
function pooled(runs: AsyncBenchSide[], gaps: number[][]): AsyncBenchSide {
  const keys = [...new Set(runs.flatMap((r) => Object.keys(r.phases)))];
  return {
    ...runs[0]!,
    secondsPerIteration: mean(gaps.flat()),
    phases: Object.fromEntries(keys.map((k) => [k, mean(runs.map((r) => r.phases[k] ?? 0))])),
    runs: runs.map((r) => r.secondsPerIteration),
    rewardRuns: runs.map((r) => r.reward),
  };
}

export async function benchAsync(opts: { quick?: boolean; log?: (s: string) => void } = {}): Promise<{
  settings: {
    config: string;
    iterations: number;
    replicas: number;
    threadsPerReplica: number;
    order: string;
  };
  sync: AsyncBenchSide;
  async: AsyncBenchSide;
  async_speedup: number;
  /** the async side's mean async/sync_s: seconds per iteration of the all-reduced optim_step calls */
  weight_sync_s_per_iteration: number;
}> {
  const log = opts.log ?? ((s: string) => process.stderr.write(`${s}\n`));
  // runs in the order sync, async, async, sync, so a slow spell of this shared machine falls on both
  // sides; --quick: 6 iterations each; the full bench: the whole recipe (60), whose curves show learning
  const iterations = opts.quick ? 6 : 60;
  const order = [false, true, true, false];
  const replicas = 2;
  const runs: Record<"sync" | "async", AsyncBenchSide[]> = { sync: [], async: [] };
  const gaps: Record<"sync" | "async", number[][]> = { sync: [], async: [] };
  for (const isAsync of order) {
    const r = await runSide(isAsync, iterations, replicas);
    const key = isAsync ? "async" : "sync";
    runs[key].push(r);
    gaps[key].push(r.gaps);
    log(`async bench: ${key.padEnd(5)} ${r.secondsPerIteration.toFixed(3)} s/iteration`);
  }
  const sync = pooled(runs.sync, gaps.sync);
  const asyncSide = pooled(runs.async, gaps.async);
  return {
    settings: {
      config: "configs/tiny-secret.yaml",
      iterations,
      replicas,
      threadsPerReplica: 1,
      order: order.map((a) => (a ? "async" : "sync")).join(","),
    },
    sync,
    async: asyncSide,
    async_speedup: sync.secondsPerIteration / asyncSide.secondsPerIteration,
    weight_sync_s_per_iteration: asyncSide.phases["async/sync_s"] ?? Number.NaN,
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const r = await benchAsync({ quick: process.argv.includes("--quick") });
  console.log(JSON.stringify(r, null, 2));
}
