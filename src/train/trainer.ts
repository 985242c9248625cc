// The MARFT training loop. One iteration, each phase named and timed:
//
//   rollout      N episodes of the team on tasks from the train split (src/rollout)
//   guard        refuse turns sampled by an adapter version older than the current one
//   values       the centralized critic's V(o) for every action (MARFT-A), or V at every action token (MARFT-T)
//   advantages   reward routing -> GAE / group baselines (src/algo) -> per-agent normalisation
//   policy       per adapter: old log-probs recomputed by a forward pass when the base runs in bf16,
//                then PPO epochs x minibatches, one optim_step per minibatch, target-KL early stop
//   critic       clipped value loss towards the returns
//   log          one metrics.jsonl line
//   eval         every train.evalEvery iterations and at the end
//   checkpoint   every train.checkpointEvery iterations and at the end
//
// All randomness of the loop (task order, sample seeds, minibatch order) comes from one seeded PRNG
// whose state is checkpointed, so on CPU a resumed run reproduces the uninterrupted run's metrics.
import { join } from "node:path";
import { explainedVariance, mean, std, ZeroAdvantageDetector } from "../algo/index.ts";
import { type EngineClient, EngineError } from "../client/client.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import { checkStaleness } from "../rollout/index.ts";
import {
  advantageEntries,
  assignValues,
  computeAdvantages,
  makeSteps,
  normalizeSteps,
  policyDatum,
  type Step,
  valueDatum,
} from "./batch.ts";
import { type AgentConfig, adapterOf, CRITIC_ADAPTER, configToYaml, type RunConfig } from "./config.ts";
import { type EvalResult, evaluate } from "./evaluate.ts";
import { Rng } from "./rng.ts";
import { runRollout } from "./rollout.ts";
import { RunDir, type TrainerState, writeFileAtomic } from "./rundir.ts";
import { adapterOwners, adapterVersions, profileOf, setupEngine, usesCritic } from "./setup.ts";

/** A connection to an engine; `restart` (local engines only) starts a fresh one after a crash. */
export interface EngineHandle {
  client: EngineClient;
  stop(): Promise<void>;
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
  suite: TaskSuite<unknown>;
  /** One line of news for a person (engine restarts, zero-advantage warnings, eval results). */
  log?: (line: string) => void;
  /** Called after each phase, for progress bars. */
  onProgress?: (e: ProgressEvent) => void;
  /** When aborted (Ctrl-C), the loop saves a checkpoint after the current iteration and returns. */
  signal?: AbortSignal;
  /** Restarts allowed after engine deaths (default 3). */
  maxRestarts?: number;
}

export type ProgressEvent =
  | { kind: "phase"; iteration: number; phase: string; done?: number; total?: number }
  | { kind: "iteration"; iteration: number; total: number; row: MetricsRow }
  | { kind: "eval"; iteration: number; result: EvalResult };

export type MetricsRow = Record<string, number>;

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

/** Phase timer: time/<phase> in seconds. */
class Timer {
  readonly times: Record<string, number> = {};
  async phase<T>(name: string, fn: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      this.times[`time/${name}`] = (this.times[`time/${name}`] ?? 0) + (performance.now() - t0) / 1000;
    }
  }
}

/** The adapters that update in iteration `it` under the schedule (critic warm-up: none). */
export function updatingAdapters(c: RunConfig, it: number): string[] {
  const warmup = usesCritic(c) ? (c.critic?.warmupIters ?? 0) : 0;
  if (it < warmup) return [];
  const trainable = adapterOwners(c)
    .filter((a) => a.trainable)
    .map((a) => a.id);
  if (trainable.length === 0) return [];
  if (c.train.schedule === "joint") return trainable;
  // A turn may hold several agents (e.g. parallel solvers that learn together before their
  // aggregator); an agent that shares an adapter names its owner's adapter.
  const turns =
    c.train.turns?.map((ids) =>
      [...new Set(ids.map((id) => adapterOf(c.agents.find((a) => a.id === id)!)))].filter((adapter) =>
        trainable.includes(adapter),
      ),
    ) ?? trainable.map((adapter) => [adapter]);
  const turn = Math.floor((it - warmup) / c.train.roundRobinEvery) % turns.length;
  return turns[turn]!;
}

/** Task indices of the endless stream: epoch e is a permutation drawn from (seed, e) alone. */
export function tasksAt(seed: number, n: number, cursor: number, count: number): number[] {
  const out: number[] = [];
  let perm: number[] = [];
  let permEpoch = -1;
  for (let i = cursor; i < cursor + count; i++) {
    const epoch = Math.floor(i / n);
    if (epoch !== permEpoch) {
      perm = new Rng((seed ^ Math.imul(epoch + 1, 0x9e3779b1)) >>> 0).shuffle(
        Array.from({ length: n }, (_, j) => j),
      );
      permEpoch = epoch;
    }
    out.push(perm[i % n]!);
  }
  return out;
}

/** Steps by the temperature they were sampled at: an engine call scores at one temperature. */
function byTemperature(steps: Step[]): Map<number, Step[]> {
  const out = new Map<number, Step[]>();
  for (const s of steps) {
    const list = out.get(s.turn.temperature);
    if (list) list.push(s);
    else out.set(s.turn.temperature, [s]);
  }
  return out;
}

/** The trainer proper. `train()` below wires it to a run directory and an engine. */
export class Trainer {
  state: TrainerState;
  readonly detector = new ZeroAdvantageDetector();
  private rng: Rng;
  private versions: Record<string, number> = {};
  private bf16Bases = new Set<string>();
  tokensSampled = 0;

  constructor(
    readonly config: RunConfig,
    readonly suite: TaskSuite<unknown>,
    public client: EngineClient,
    state?: TrainerState,
    private readonly log: (line: string) => void = () => {},
    private readonly onProgress: (e: ProgressEvent) => void = () => {},
  ) {
    if (suite.train.length === 0) throw new Error(`task ${suite.name}: the train split is empty`);
    this.state = state ?? {
      iteration: 0,
      dataCursor: 0,
      rng: new Rng(config.seed).state(),
      zeroAdvantageBatches: {},
      metricsLines: 0,
      adapterVersions: {},
    };
    this.rng = new Rng(this.state.rng);
    for (const [a, n] of Object.entries(this.state.zeroAdvantageBatches)) this.detector.zeroBatches[a] = n;
  }

  private roleOf = (agent: string): string => {
    const a = this.config.agents.find((x) => x.id === agent);
    if (!a) throw new Error(`rollout returned a turn of unknown agent "${agent}"`);
    return a.role;
  };

  async syncVersions(): Promise<void> {
    this.versions = await adapterVersions(this.client);
    const bases = (await this.client.listBases()).bases;
    this.bf16Bases = new Set(bases.filter((b) => b.dtype === "bfloat16").map((b) => b.name));
  }

  /** Whether PPO's old log-probs of `agent`'s adapter come from a forward pass (see ppo.recomputeLogprobs). */
  private recomputes(agent: AgentConfig): boolean {
    const r = this.config.ppo.recomputeLogprobs;
    return r === "auto" ? this.bf16Bases.has(agent.base) : r;
  }

  /**
   * Old log-probs from the trainer's own forward pass, before any update of this adapter. In bf16 the
   * sampler's incremental decode and a full forward differ (about 0.03 per token, up to 0.3 on this
   * project's CPU): PPO's ratio would start off 1 and clip on noise. One forward per temperature.
   * Returns the mean absolute difference to the sampler's log-probs, a health figure.
   */
  private async recomputeLogprobs(adapter: string, mine: Step[]): Promise<number> {
    let diff = 0;
    let n = 0;
    for (const [temperature, group] of byTemperature(mine)) {
      const res = await this.client.forward({
        adapter,
        // weights: only the response's log-probs are computed (the prompt's are not needed)
        data: group.map((s) => {
          const d = policyDatum(s);
          return { tokens: d.tokens, weights: d.weights };
        }),
        temperature: temperature > 0 ? temperature : 1,
      });
      group.forEach((s, i) => {
        const all = res.results[i]!.logprobs;
        if (!all) throw new Error("engine: forward returned no log-probs");
        const lp = all.slice(s.turn.promptIds.length);
        s.oldLogprobs = lp;
        lp.forEach((x, j) => {
          diff += Math.abs(x - s.turn.logprobs[j]!);
          n++;
        });
      });
    }
    return n > 0 ? diff / n : 0;
  }

  /** One full iteration; returns its metrics row (already appended by the caller). */
  async iteration(): Promise<MetricsRow> {
    const c = this.config;
    const it = this.state.iteration;
    const timer = new Timer();
    const row: MetricsRow = { iteration: it + 1 };
    const phase = (name: string) => this.onProgress({ kind: "phase", iteration: it, phase: name });

    // ---- rollout
    phase("rollout");
    const taskIdx = tasksAt(c.seed, this.suite.train.length, this.state.dataCursor, c.train.tasksPerIter);
    this.state.dataCursor += c.train.tasksPerIter;
    const rolloutSeed = this.rng.seed();
    const { episodes, stats } = await timer.phase("rollout", () =>
      runRollout({
        client: this.client,
        suite: this.suite,
        config: c,
        tasks: taskIdx.map((i) => this.suite.train[i]),
        samplesPerTask: c.train.samplesPerTask,
        seed: rolloutSeed,
        onProgress: (done, total) =>
          this.onProgress({ kind: "phase", iteration: it, phase: "rollout", done, total }),
      }),
    );
    this.tokensSampled += stats.tokensSampled;
    row["tokens/sampled"] = stats.tokensSampled;
    row["throughput/sample_tokens_per_s"] = stats.tokensSampled / Math.max(stats.seconds, 1e-9);

    row["rollout/engine_calls"] = stats.engineCalls;
    row["rollout/mean_decode_batch"] = stats.meanDecodeBatch;

    // ---- stale-data guard
    row["rollout/stale_turns"] = checkStaleness(episodes, this.versions, {
      offPolicy: c.train.offPolicy,
    }).staleTurns;

    // ---- rewards
    const steps = makeSteps(episodes, this.roleOf, c.algo.rewardRouting);
    const teamRewards = episodes.map((e) =>
      typeof e.info["teamReward"] === "number"
        ? (e.info["teamReward"] as number)
        : (e.info["score"] as number),
    );
    row["reward/mean"] = mean(teamRewards);
    row["reward/std"] = std(teamRewards);
    row["episodes/correct_frac"] = mean(episodes.map((e) => (e.info["correct"] === true ? 1 : 0)));
    row["episodes/turns_mean"] = mean(episodes.map((e) => e.turns.length));
    for (const a of c.agents) {
      const perEp = episodes.map((e) =>
        steps.filter((s) => s.episode === e.index && s.turn.agent === a.id).reduce((x, s) => x + s.reward, 0),
      );
      row[`reward/${a.id}`] = mean(perEp);
      const mine = steps.filter((s) => s.turn.agent === a.id);
      if (mine.length > 0) row[`response_len/${a.id}`] = mean(mine.map((s) => s.turn.responseIds.length));
    }

    // ---- critic values
    const perToken = c.algo.estimator === "marft-t";
    if (usesCritic(c)) {
      phase("values");
      await timer.phase("values", async () => {
        const res = await this.client.forward({
          adapter: CRITIC_ADAPTER,
          data: steps.map((s) => ({ tokens: [...s.turn.promptIds, ...s.turn.responseIds] })),
          temperature: 1,
        });
        res.results.forEach((r, i) => {
          if (!r.values) throw new Error("engine: forward with the critic returned no values");
          assignValues(steps[i]!, r.values);
        });
      });
    }

    // ---- advantages
    phase("advantages");
    await timer.phase("advantages", async () => {
      const lastStep = new Map<number, Step>();
      for (const s of steps) {
        const prev = lastStep.get(s.episode);
        if (!prev || s.k > prev.k) lastStep.set(s.episode, s);
      }
      const epByIndex = new Map(episodes.map((e) => [e.index, e]));
      const bootstrap = (ep: number) => {
        const e = epByIndex.get(ep)!;
        // terminated: nothing follows; truncated: the critic's value of the state the episode was cut at
        return e.terminated || !e.truncated ? 0 : (lastStep.get(ep)?.finalValue ?? 0);
      };
      computeAdvantages(
        steps,
        episodes,
        c.algo.estimator,
        c.algo.gamma,
        c.algo.lambda,
        bootstrap,
        c.algo.groupStd,
      );
    });
    const raw = advantageEntries(steps, perToken);
    const zero = this.detector.check(raw.adv, raw.agents);
    if (zero.warning) this.log(`iteration ${it + 1}: ${zero.warning}`);
    for (const a of c.agents) {
      const xs = raw.adv.filter((_, i) => raw.agents[i] === a.id);
      if (xs.length === 0) continue;
      row[`adv/${a.id}/mean`] = mean(xs);
      row[`adv/${a.id}/std`] = std(xs);
      row[`adv/${a.id}/zero_frac`] = xs.filter((x) => Math.abs(x) <= this.detector.eps).length / xs.length;
      row[`adv/${a.id}/zero_batches`] = this.detector.zeroBatches[a.id] ?? 0;
    }
    const norm = c.algo.normalize;
    if (norm !== false) {
      normalizeSteps(steps, perToken, {
        ...(norm === true ? {} : { only: new Set(norm) }),
        scale: c.algo.normalizeStd,
      });
    }

    // ---- policy updates
    const updating = updatingAdapters(c, it);
    for (const adapter of updating) {
      phase(`policy/${adapter}`);
      await timer.phase("policy", () => this.updatePolicy(adapter, steps, row));
    }

    // ---- critic update
    if (usesCritic(c) && c.critic) {
      const values = perToken ? steps.flatMap((s) => s.tokenValues) : steps.map((s) => s.value);
      const returns = perToken ? steps.flatMap((s) => s.returns) : steps.map((s) => s.returns[0]!);
      row["value/explained_variance"] = explainedVariance(values, returns);
      row["value/mean"] = mean(values);
      row["value/return_mean"] = mean(returns);
      phase("critic");
      await timer.phase("critic", () => this.updateCritic(steps, perToken, row));
    }

    this.state.iteration = it + 1;
    this.state.rng = this.rng.state();
    this.state.zeroAdvantageBatches = { ...this.detector.zeroBatches };
    this.state.adapterVersions = { ...this.versions };
    Object.assign(row, timer.times);
    return row;
  }

  /** Split `xs` into `k` nearly equal, non-empty chunks (fewer if there are fewer items). */
  private chunks<T>(xs: T[], k: number): T[][] {
    const n = Math.min(k, xs.length);
    const out: T[][] = [];
    for (let i = 0; i < n; i++)
      out.push(xs.slice(Math.floor((i * xs.length) / n), Math.floor(((i + 1) * xs.length) / n)));
    return out;
  }

  private async updatePolicy(adapter: string, steps: Step[], row: MetricsRow): Promise<void> {
    const c = this.config;
    const owner = c.agents.find((a) => a.id === adapter)!;
    const mine = steps.filter((s) => adapterOf(c.agents.find((a) => a.id === s.turn.agent)!) === adapter);
    if (mine.length === 0) return;
    if (this.recomputes(owner)) {
      row[`logprob_mismatch/${owner.id}`] = await this.recomputeLogprobs(adapter, mine);
    }
    const acc: Record<string, number[]> = {
      loss: [],
      clipfrac: [],
      approx_kl: [],
      entropy: [],
      kl_ref: [],
      grad_norm: [],
    };
    let steppedOut = false;
    let optimSteps = 0;
    for (let epoch = 0; epoch < c.ppo.epochs && !steppedOut; epoch++) {
      const order = this.rng.shuffle(mine);
      for (const mb of this.chunks(order, c.ppo.minibatches)) {
        // One forward_backward per sampling temperature (agents sharing an adapter may differ), each
        // weighted by its share of the minibatch's action tokens: together one token-mean loss.
        const total = mb.reduce((n, s) => n + s.turn.responseIds.length, 0);
        const stats: Record<string, number> = {};
        for (const [temperature, group] of byTemperature(mb)) {
          const share = group.reduce((n, s) => n + s.turn.responseIds.length, 0) / total;
          const r = await this.client.forwardBackward({
            adapter,
            loss: "ppo",
            data: group.map(policyDatum),
            temperature,
            loss_scale: share,
            ppo: {
              clip_low: c.ppo.clipLow,
              clip_high: c.ppo.clipHigh,
              entropy_coef: c.ppo.entropyCoef,
              kl_coef: c.ppo.klCoef,
              kl_estimator: c.ppo.klEstimator,
              ratio: c.ppo.ratio,
              sequence_logprob: c.ppo.sequenceLogprob,
              aggregation: "token-mean",
            },
          });
          stats["loss"] = (stats["loss"] ?? 0) + share * r.loss;
          for (const k of ["clipfrac", "approx_kl", "entropy", "kl_ref"]) {
            const v = r.stats[k];
            if (typeof v === "number") stats[k] = (stats[k] ?? 0) + share * v;
          }
        }
        const step = await this.client.optimStep({ adapter, max_grad_norm: c.ppo.maxGradNorm });
        this.versions[adapter] = step.version;
        optimSteps++;
        stats["grad_norm"] = step.grad_norm;
        for (const [k, v] of Object.entries(stats)) acc[k]?.push(v);
        // Target-KL early stop: the minibatch that crossed the line has been applied (its gradients
        // were already accumulated); no further updates for this adapter in this iteration.
        if (c.ppo.targetKl !== null && (stats["approx_kl"] ?? 0) > c.ppo.targetKl) {
          steppedOut = true;
          break;
        }
      }
    }
    const key = owner.id;
    row[`loss/policy/${key}`] = mean(acc["loss"]!);
    if (acc["clipfrac"]!.length) row[`clipfrac/${key}`] = mean(acc["clipfrac"]!);
    if (acc["approx_kl"]!.length) row[`kl/${key}`] = mean(acc["approx_kl"]!);
    if (acc["entropy"]!.length) row[`entropy/${key}`] = mean(acc["entropy"]!);
    if (c.ppo.klCoef > 0 && acc["kl_ref"]!.length) row[`kl_ref/${key}`] = mean(acc["kl_ref"]!);
    row[`grad_norm/${key}`] = mean(acc["grad_norm"]!);
    row[`optim_steps/${key}`] = optimSteps;
    row[`early_stop/${key}`] = steppedOut ? 1 : 0;
  }

  private async updateCritic(steps: Step[], perToken: boolean, row: MetricsRow): Promise<void> {
    const c = this.config;
    const critic = c.critic!;
    const losses: number[] = [];
    for (let epoch = 0; epoch < c.ppo.epochs; epoch++) {
      const order = this.rng.shuffle(steps);
      for (const mb of this.chunks(order, c.ppo.minibatches)) {
        const r = await this.client.forwardBackward({
          adapter: CRITIC_ADAPTER,
          loss: "value",
          data: mb.map((s) => valueDatum(s, perToken)),
          temperature: 1,
          value: { loss: critic.valueLoss, huber_delta: 10, clip: critic.valueClip },
        });
        losses.push(r.loss);
        const step = await this.client.optimStep({
          adapter: CRITIC_ADAPTER,
          max_grad_norm: critic.maxGradNorm,
        });
        this.versions[CRITIC_ADAPTER] = step.version;
      }
    }
    row["loss/value"] = mean(losses);
  }

  /** Evaluate the current adapters on the held-out split. */
  async evaluate(): Promise<EvalResult> {
    const c = this.config;
    const tasks = c.eval.n > 0 ? this.suite.eval.slice(0, c.eval.n) : this.suite.eval;
    return evaluate({
      client: this.client,
      suite: this.suite,
      config: c,
      tasks,
      greedy: c.eval.greedy,
      k: c.eval.k,
      // eval seeds are fixed, not drawn from the loop's PRNG: evaluating must not change training
      seed: c.seed + 7919,
    });
  }

  profiles() {
    return this.config.agents.map(profileOf);
  }
}

/** Is the engine gone (process died, connection refused)? Engine 4xx/5xx answers are not that. */
async function engineDown(client: EngineClient, e: unknown): Promise<boolean> {
  if (e instanceof EngineError && e.status !== 0) return false;
  try {
    await client.health({ timeoutMs: 5000 });
    return false;
  } catch {
    return true;
  }
}

/** Train a run end to end: run directory, engine setup, resume, the loop, eval, checkpoints, summary. */
export async function train(opts: TrainOptions): Promise<Summary> {
  const c = opts.config;
  const log = opts.log ?? (() => {});
  const onProgress = opts.onProgress ?? (() => {});
  const run = new RunDir(opts.runDir);
  const t0 = performance.now();
  let handle = await opts.connect();
  let restarts = 0;

  /** Set up a fresh engine and bring it (and the trainer state) to the latest checkpoint, if any. */
  const restore = async (client: EngineClient, required: boolean): Promise<TrainerState | undefined> => {
    await setupEngine(client, c);
    const ckpt = run.latestCheckpoint();
    if (!ckpt) {
      if (required) throw new Error(`${run.root}: no complete checkpoint to resume from`);
      return undefined;
    }
    await client.loadCheckpoint({ path: join(ckpt.path, "engine") });
    run.truncateMetrics(ckpt.state.metricsLines);
    return ckpt.state;
  };

  let state: TrainerState | undefined;
  if (opts.resume) {
    state = await restore(handle.client, true);
    log(`resuming ${run.root} from iteration ${state!.iteration}`);
  } else {
    if (run.listCheckpoints().length > 0 || run.metricsLineCount() > 0) {
      throw new Error(
        `${run.root} already holds a run: resume it with --resume ${run.root}, or choose another name`,
      );
    }
    run.create();
    await setupEngine(handle.client, c);
  }
  run.create();
  writeFileAtomic(run.configPath, configToYaml(c));

  let trainer = new Trainer(c, opts.suite, handle.client, state, log, onProgress);
  await trainer.syncVersions();
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
    const client = trainer.client;
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
    const r = await trainer.evaluate();
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
    while (trainer.state.iteration < c.train.iterations) {
      if (opts.signal?.aborted) {
        summary.stoppedEarly = true;
        break;
      }
      const it = trainer.state.iteration;
      let row: MetricsRow;
      try {
        row = await trainer.iteration();
      } catch (e) {
        if (!(await engineDown(trainer.client, e)) || restarts >= (opts.maxRestarts ?? 3)) throw e;
        restarts++;
        log(`the engine died during iteration ${it + 1} (${(e as Error).message}); restarting it`);
        await handle.stop().catch(() => {});
        handle = await opts.connect();
        const restored = await restore(handle.client, false);
        if (restored) log(`continuing from the checkpoint at iteration ${restored.iteration}`);
        else {
          log("no checkpoint yet: starting over from iteration 0");
          run.truncateMetrics(0);
        }
        const tokens = trainer.tokensSampled;
        trainer = new Trainer(c, opts.suite, handle.client, restored, log, onProgress);
        trainer.tokensSampled = tokens;
        await trainer.syncVersions();
        continue;
      }
      const iteration = trainer.state.iteration;
      const isLast = iteration === c.train.iterations;
      if ((c.train.evalEvery > 0 && iteration % c.train.evalEvery === 0) || isLast) {
        const t = performance.now();
        const r = await runEval(iteration);
        if (isLast) summary.eval.after = evalSummary(iteration, r);
        row["eval/accuracy"] = r.accuracy;
        row["eval/ci95_low"] = r.ci95[0];
        row["eval/ci95_high"] = r.ci95[1];
        if (r.passAtK !== undefined) row[`eval/pass@${c.eval.k}`] = r.passAtK;
        row["time/eval"] = (performance.now() - t) / 1000;
      }
      run.appendMetrics(row);
      onProgress({ kind: "iteration", iteration, total: c.train.iterations, row });
      if (c.train.checkpointEvery > 0 && iteration % c.train.checkpointEvery === 0 && !isLast) {
        const t = performance.now();
        await checkpoint();
        log(`checkpoint iteration ${iteration} (${((performance.now() - t) / 1000).toFixed(1)}s)`);
      }
    }
    summary.iterations = trainer.state.iteration;
    await checkpoint();
  } finally {
    summary.engineRestarts = restarts;
    summary.tokensSampled = trainer.tokensSampled;
    summary.wallSeconds = (performance.now() - t0) / 1000;
    const rewards = run.readMetrics().map((r) => r["reward/mean"] as number);
    summary.firstRewards = rewards.slice(0, 3);
    summary.lastRewards = rewards.slice(-3);
    writeFileAtomic(run.summaryPath, `${JSON.stringify(summary, null, 2)}\n`);
    await handle.stop().catch(() => {});
  }
  return summary;
}
