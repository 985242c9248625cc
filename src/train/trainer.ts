// The MARFT training loop: `Trainer.iteration()` is one iteration of the algorithm, top to bottom.
// `train()` (run.ts) wires it to a run directory, an engine, evaluation and checkpoints.
//
// All randomness of the loop (task order, sample seeds, minibatch order) comes from one seeded PRNG
// whose state is checkpointed, so on CPU a resumed run reproduces the uninterrupted run's metrics.
// Under train.async the next iteration's rollout runs during this one's update (async.ts); its
// seeds then come from a PRNG of their own, and timing decides which adapter version a turn sees.
import {
  type Credit,
  ESTIMATORS,
  flatGroups,
  normalizeCredit,
  ZeroAdvantageDetector,
} from "../algo/index.ts";
import { adapterVersions, type ComputeEngine } from "../client/compute.ts";
import { adapterOf, adapterOwners, usesCritic } from "../config/derived.ts";
import { CRITIC_ADAPTER, type RunConfig } from "../config/schema.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import { mixSeed, Rng, type RngState } from "../rng.ts";
import { checkStaleness, type Episode, type Turn } from "../rollout/index.ts";
import {
  type AsyncConfig,
  boundStaleness,
  correctStale,
  RolloutPipeline,
  type StalenessCheck,
  splitByAge,
  stalenessBound,
  timeOptimSteps,
} from "./async.ts";
import { type Batch, sampleBatch } from "./dynamic.ts";
import { asSource, type EpisodeSource } from "./episodes.ts";
import { type EvalResult, evalTasks, evaluate } from "./evaluate.ts";
import * as metrics from "./metrics.ts";
import { type MetricsRow, Phases, type ProgressEvent } from "./phases.ts";
import { correctReplayed, ReplayBuffer, replayAdapterMetrics } from "./replay.ts";
import type { TrainerState } from "./rundir.ts";
import { criticView, valuesInAgentLayout } from "./critic-view.ts";
import { trainingDone, updatingAdapters } from "./schedule.ts";
import { creditBatch, type Step, toSteps } from "./steps.ts";
import { TaskSource } from "./task-source.ts";
import type { TrainedBatch } from "./transcripts.ts";
import {
  criticValues,
  type PolicyItem,
  recomputeLogprobs,
  updateCritic,
  updatePolicies,
  updatePolicy,
} from "./update.ts";

export interface TrainerOptions {
  /** Where to continue from (a checkpoint's trainer state); default: iteration 0. */
  state?: TrainerState;
  /** One line of news for a person (zero-advantage warnings). */
  log?: (line: string) => void;
  /** Called at each phase, for progress bars. */
  onProgress?: (e: ProgressEvent) => void;
}

type RolloutBatch = Batch & { sampling: MetricsRow };
/** What a checkpoint keeps of the rollout side: the task stream and the rollout seeds (async). */
type RolloutState = ReturnType<TaskSource["save"]> & { rolloutRng?: RngState };

export class Trainer {
  state: TrainerState;
  readonly engine: ComputeEngine;
  readonly detector = new ZeroAdvantageDetector();
  private readonly rng: Rng;
  private versions: Record<string, number> = {};
  private bf16Bases = new Set<string>();
  tokensSampled = 0;
  /** The last iteration's episodes, steps and advantages as trained (for transcripts.jsonl). */
  lastBatch: TrainedBatch | undefined;
  private readonly tasks: TaskSource;
  private readonly replay: ReplayBuffer | null;
  /** Fresh and replayed actions trained this iteration (the replay ratio). */
  private trainedCounts = { fresh: 0, replayed: 0 };
  private readonly log: (line: string) => void;
  private readonly onProgress: (e: ProgressEvent) => void;
  /** train.async: the rollout in flight ahead of the trainer, its seeds, and optim_step's time. */
  private readonly async: AsyncConfig | null;
  private readonly pipeline = new RolloutPipeline<RolloutBatch, RolloutState>();
  private readonly seeds: Rng;
  private readonly optimTime: (() => number) | null = null;

  /** The tasks, and where the episodes of the rollout come from (an env suite, an app). */
  readonly suite: EpisodeSource;
  /** The suite as given: a multi-task suite keeps its parts for the scheduler and evaluation. */
  private readonly given: TaskSuite<unknown> | EpisodeSource;

  constructor(
    readonly config: RunConfig,
    suite: TaskSuite<unknown> | EpisodeSource,
    engine: ComputeEngine,
    opts: TrainerOptions = {},
  ) {
    this.async = config.train.async;
    if (this.async) {
      const timed = timeOptimSteps(engine);
      engine = timed.engine;
      this.optimTime = timed.take;
    }
    this.engine = engine;
    this.given = suite;
    this.suite = asSource(suite);
    if (this.suite.train.length === 0) throw new Error(`task ${this.suite.name}: the train split is empty`);
    this.state = opts.state ?? {
      iteration: 0,
      dataCursor: 0,
      rng: new Rng(config.seed).state(),
      zeroAdvantageBatches: {},
      metricsLines: 0,
      adapterVersions: {},
      sampledTokens: 0,
    };
    this.rng = new Rng(this.state.rng);
    // synchronous: the rollout draws its seeds from the loop's PRNG, as it always did
    this.seeds = this.async ? new Rng(this.state.rolloutRng ?? mixSeed(config.seed, 0xa5c)) : this.rng;
    this.tasks = new TaskSource(config, suite, this.state);
    this.replay = config.train.replay ? new ReplayBuffer(config.train.replay, this.state.replay) : null;
    for (const [a, n] of Object.entries(this.state.zeroAdvantageBatches)) this.detector.zeroBatches[a] = n;
    this.log = opts.log ?? (() => {});
    this.onProgress = opts.onProgress ?? (() => {});
  }

  /** Reads the adapters' versions and the bases' compute dtypes from the engine. */
  async syncVersions(): Promise<void> {
    this.versions = await adapterVersions(this.engine);
    const { bases } = await this.engine.listBases();
    this.bf16Bases = new Set(bases.filter((b) => b.dtype === "bfloat16").map((b) => b.name));
  }

  /** One iteration; returns its metrics row. */
  async iteration(): Promise<MetricsRow> {
    const c = this.config;
    const it = this.state.iteration;
    const phases = new Phases(it, this.onProgress);

    // 1. rollout: the team plays this iteration's tasks (under dynamic sampling, groups without signal
    //    are replaced by fresh tasks); no turn may come from an outdated adapter, or under train.async
    //    (played during the last update) none more than its agent's bound behind: those are dropped
    const { episodes, stats, sampling } = await phases.run("rollout", (progress) => this.rollout(progress));
    const stale = this.guard(episodes);

    // 2. steps: every action, with the env's per-action rewards and its routed share of the outcome
    const steps = toSteps(episodes, this.roleOf, c.algo.rewardRouting);
    const agents = steps.map((s) => s.turn.agent);

    // 3. credit: the critic's values, then GAE or group baselines, then per-agent normalisation
    const { seen, values } = await this.criticValues(phases, steps);
    const raw = ESTIMATORS[c.algo.estimator](creditBatch(steps, episodes, values), c.algo);
    this.checkZero(raw, agents);
    const advantages = normalizeAdvantages(raw, agents, c.algo);

    // 4. PPO on each adapter the schedule updates (with replayed actions under experience replay)
    const todo = updatingAdapters(c, it)
      .map((adapter) => ({ adapter, items: this.itemsOf(adapter, steps, advantages, stale.dropped) }))
      .filter((w) => w.items.length > 0);
    const policy = await this.ppo(phases, todo);
    const replay = this.replay ? this.remember(steps, advantages) : {};

    // 5. the critic towards the returns
    const critic = usesCritic(c)
      ? await phases.run("critic", () => updateCritic(this.engine, seen, raw, c, this.rng, stale.dropped))
      : null;
    if (critic) this.versions[CRITIC_ADAPTER] = critic.version;

    // 6. the state a checkpoint keeps, the batch for transcripts, and the metrics
    this.advance();
    this.lastBatch = { episodes, steps, advantages };
    const ids = c.agents.map((a) => a.id);
    return {
      iteration: it + 1,
      ...metrics.rolloutMetrics(stats, stale.staleTurns),
      ...metrics.rewardMetrics(episodes, steps, ids),
      ...sampling,
      ...metrics.advantageMetrics(raw, agents, ids, this.detector.zeroBatches, this.detector.eps),
      ...policy,
      ...replay,
      ...(critic ? metrics.valueMetrics(raw, critic.loss) : {}),
      ...stale.row,
      ...(this.optimTime ? { "async/sync_s": c.engine.replicas > 1 ? this.optimTime() : 0 } : {}),
      ...phases.times,
    };
  }

  /**
   * The rollout of this iteration: under train.async the one prefetched during the last iteration
   * (when there was one), after which the next iteration's starts, unless a checkpoint or the end of
   * the run comes first (a checkpoint must not hold a half-played rollout).
   */
  private async rollout(onProgress: (done: number, total: number) => void): Promise<RolloutBatch> {
    if (!this.async) return this.account(await this.play(onProgress));
    const { batch, timing } = await this.pipeline.take(() => this.play(onProgress));
    this.account(batch);
    // the run's state once this iteration is done: is it the last, or followed by a checkpoint?
    const after = { iteration: this.state.iteration + 1, sampledTokens: this.state.sampledTokens };
    const c = this.config;
    const checkpoint = c.train.checkpointEvery > 0 && after.iteration % c.train.checkpointEvery === 0;
    // the prefetch reports no progress: the bars show the phases of the iteration being trained
    if (!trainingDone(c, after) && !checkpoint)
      this.pipeline.prefetch(() => this.play(() => {}), this.rolloutState());
    batch.sampling["async/trainer_wait_s"] = timing.trainerWait;
    batch.sampling["async/rollout_wait_s"] = timing.rolloutWait;
    batch.sampling["async/rollout_s"] = timing.rollout;
    return batch;
  }

  /**
   * Plays the next tasks of the data stream (or the task scheduler's mix), a fresh seed per rollout;
   * refilled under dynamic sampling.
   */
  private async play(onProgress: (done: number, total: number) => void): Promise<RolloutBatch> {
    const c = this.config;
    this.tasks.begin();
    const batch = await sampleBatch({
      tasksPerIter: c.train.tasksPerIter,
      dynamic: c.train.dynamicSampling,
      next: (count) => this.tasks.next(count),
      play: (tasks) =>
        this.suite.play({
          engine: this.engine,
          config: c,
          tasks,
          samplesPerTask: c.train.samplesPerTask,
          seed: this.seeds.seed(),
          onProgress,
        }),
      flat: (episodes) =>
        flatGroups(creditBatch(toSteps(episodes, this.roleOf, c.algo.rewardRouting), episodes, null).steps),
    });
    this.tasks.observe(batch.sampled);
    return { ...batch, sampling: { ...batch.metrics, ...this.tasks.metrics(batch.sampled) } };
  }

  /** The batch's tokens count once it is trained on (a prefetched rollout's when it is taken). */
  private account(batch: RolloutBatch): RolloutBatch {
    this.tokensSampled += batch.stats.tokensSampled;
    this.state.sampledTokens = (this.state.sampledTokens ?? 0) + batch.stats.tokensSampled;
    return batch;
  }

  /** The rollout side's state now: the task stream and, under train.async, the rollout seeds. */
  private rolloutState(): RolloutState {
    return { ...this.tasks.save(), ...(this.async ? { rolloutRng: this.seeds.state() } : {}) };
  }

  /** The stale-data guard: refuse outdated turns, or under train.async drop those beyond the bound. */
  private guard(episodes: readonly Episode[]): Pick<StalenessCheck, "staleTurns" | "dropped" | "row"> {
    const c = this.config;
    if (!this.async)
      return {
        ...checkStaleness(episodes, this.versions, { offPolicy: c.train.offPolicy }),
        dropped: new Set(),
        row: {},
      };
    const ids = c.agents.map((a) => a.id);
    return boundStaleness(episodes, this.versions, ids, stalenessBound(c, this.async));
  }

  /** Waits for a rollout still in flight and discards it (the run is stopping). */
  settle(): Promise<void> {
    return this.pipeline.settle();
  }

  /** Counts (and warns about) agents whose raw advantages are all zero: they get no gradient. */
  private checkZero(raw: Credit, agents: readonly string[]): void {
    const zero = this.detector.check(
      raw.advantages.flat(),
      raw.advantages.flatMap((xs, i) => xs.map(() => agents[i]!)),
    );
    if (zero.warning) this.log(`iteration ${this.state.iteration + 1}: ${zero.warning}`);
  }

  /** After an iteration: the counters and PRNG state a checkpoint stores to continue exactly here. */
  private advance(): void {
    this.state = {
      ...this.state,
      // a prefetched rollout in flight is not part of the state: a resume plays it again
      ...(this.pipeline.before ?? this.rolloutState()),
      ...(this.replay ? { replay: this.replay.state() } : {}),
      iteration: this.state.iteration + 1,
      rng: this.rng.state(),
      zeroAdvantageBatches: { ...this.detector.zeroBatches },
      adapterVersions: { ...this.versions },
    };
  }

  /** The critic's values of every step (agents on other bases re-tokenized for it), in each agent's layout. */
  private async criticValues(
    phases: Phases,
    steps: Step[],
  ): Promise<{ seen: Step[]; values: number[][] | null }> {
    if (!usesCritic(this.config)) return { seen: steps, values: null };
    const seen = await criticView(this.engine, steps, this.config);
    const values = await phases.run("values", async () =>
      (await criticValues(this.engine, seen)).map((v, i) => valuesInAgentLayout(steps[i]!, seen[i]!, v)),
    );
    return { seen, values };
  }

  /** PPO on each adapter of `todo`: one phase per adapter, or shared passes (`train.batchAdapters`). */
  private async ppo(phases: Phases, todo: { adapter: string; items: PolicyItem[] }[]): Promise<MetricsRow> {
    const policy: MetricsRow = {};
    if (this.config.train.batchAdapters && todo.length > 1) {
      const label = `policy/${todo.map((w) => w.adapter).join("+")}`;
      Object.assign(policy, await phases.run("policy", () => this.updatePolicies(todo), label));
    } else
      for (const { adapter, items } of todo) {
        const update = () => this.updatePolicy(adapter, items);
        Object.assign(policy, await phases.run("policy", update, `policy/${adapter}`));
      }
    return policy;
  }

  /** PPO for one adapter, its old log-probs first recomputed where the base computes in bf16. */
  private async updatePolicy(adapter: string, items: PolicyItem[]): Promise<MetricsRow> {
    const row: MetricsRow = {};
    items = await this.prepare(adapter, items, row);
    const u = await updatePolicy(this.engine, adapter, items, this.config.ppo, this.rng);
    this.versions[adapter] = u.version;
    return { ...row, ...metrics.policyMetrics(adapter, u, this.config.ppo.klCoef) };
  }

  /** PPO for several adapters in shared engine passes (`train.batchAdapters`). */
  private async updatePolicies(todo: { adapter: string; items: PolicyItem[] }[]): Promise<MetricsRow> {
    const row: MetricsRow = {};
    const work = [];
    for (const { adapter, items } of todo)
      work.push({ adapter, items: await this.prepare(adapter, items, row) });
    const us = await updatePolicies(this.engine, work, this.config.ppo, this.rng);
    work.forEach(({ adapter }, k) => {
      this.versions[adapter] = us[k]!.version;
      Object.assign(row, metrics.policyMetrics(adapter, us[k]!, this.config.ppo.klCoef));
    });
    return row;
  }

  /** An adapter's update batch: old log-probs as PPO needs them, then replayed actions (if on). */
  private async prepare(adapter: string, items: PolicyItem[], row: MetricsRow): Promise<PolicyItem[]> {
    let fresh: PolicyItem[];
    if (this.async) {
      // turns an older version sampled (during the last update) are corrected around pi_prox
      const { onPolicy, late } = splitByAge(items, this.versions);
      const corrected = await correctStale(this.engine, adapter, late, this.versions, this.async);
      Object.assign(row, corrected.row);
      fresh = [...(await this.oldLogprobs(adapter, onPolicy, row)), ...corrected.items];
    } else fresh = await this.oldLogprobs(adapter, items, row);
    if (!this.replay) return fresh;
    const replayed = await this.replayed(adapter, fresh.length);
    Object.assign(row, replayed.row);
    return [...fresh, ...replayed.items];
  }

  /** The items with PPO's old log-probs recomputed by a forward pass where the base computes in bf16. */
  private async oldLogprobs(adapter: string, items: PolicyItem[], row: MetricsRow): Promise<PolicyItem[]> {
    const c = this.config;
    const owner = c.agents.find((a) => a.id === adapter)!;
    const r = c.ppo.recomputeLogprobs;
    if (!(r === "auto" ? this.bf16Bases.has(owner.base) : r)) return items;
    const re = await recomputeLogprobs(
      this.engine,
      adapter,
      items.map((x) => x.step),
    );
    row[`logprob_mismatch/${adapter}`] = re.mismatch;
    return items.map((x, i) => ({ ...x, oldLogprobs: re.oldLogprobs[i]! }));
  }

  /** Experience replay: `reuse` replayed actions of `adapter` per fresh one, IS-corrected. */
  private async replayed(adapter: string, fresh: number): Promise<{ items: PolicyItem[]; row: MetricsRow }> {
    const opts = this.config.train.replay!;
    const drawn = this.replay!.draw(adapter, Math.round(opts.reuse * fresh), this.versions, this.rng);
    const r = await correctReplayed(this.engine, adapter, drawn, this.versions, opts);
    this.trainedCounts.fresh += fresh;
    this.trainedCounts.replayed += r.items.length;
    return { items: r.items, row: replayAdapterMetrics(adapter, r, opts.clip) };
  }

  /** After the updates: this batch's actions of trainable adapters join the replay buffer. */
  private remember(steps: readonly Step[], advantages: number[][]): MetricsRow {
    const trainable = new Set(
      adapterOwners(this.config)
        .filter((a) => a.trainable)
        .map((a) => a.id),
    );
    const items = steps.flatMap((step, i) => {
      const adapter = this.adapterOf(step);
      return trainable.has(adapter) ? [{ step, advantages: advantages[i]!, adapter }] : [];
    });
    this.replay!.add(items);
    const { fresh, replayed } = this.trainedCounts;
    this.trainedCounts = { fresh: 0, replayed: 0 };
    return {
      "replay/ratio": fresh + replayed > 0 ? replayed / (fresh + replayed) : 0,
      "replay/size": this.replay!.size,
    };
  }

  /** The actions whose turns `adapter` sampled, with their advantages (not those dropped as too stale). */
  private itemsOf(
    adapter: string,
    steps: readonly Step[],
    advantages: number[][],
    dropped: ReadonlySet<Turn>,
  ): PolicyItem[] {
    return steps.flatMap((step, i) =>
      this.adapterOf(step) === adapter && !dropped.has(step.turn)
        ? [{ step, advantages: advantages[i]! }]
        : [],
    );
  }

  /** Evaluate the current adapters on the held-out split. */
  evaluate(onProgress?: (done: number, total: number) => void): Promise<EvalResult> {
    const c = this.config;
    return evaluate({
      engine: this.engine,
      suite: this.given,
      config: c,
      tasks: evalTasks(this.given, c.eval.n),
      greedy: c.eval.greedy,
      k: c.eval.k,
      // eval seeds are fixed, not drawn from the loop's PRNG: evaluating must not change training
      seed: c.seed + 7919,
      onProgress,
    });
  }

  private adapterOf(s: Step): string {
    return adapterOf(this.config.agents.find((a) => a.id === s.turn.agent)!);
  }

  private roleOf = (agent: string): string => {
    const a = this.config.agents.find((x) => x.id === agent);
    if (!a) throw new Error(`rollout returned a turn of unknown agent "${agent}"`);
    return a.role;
  };
}

/** Per-agent normalisation as the config asks (algo.normalize: all agents, none, or the listed ones). */
function normalizeAdvantages(raw: Credit, agents: readonly string[], algo: RunConfig["algo"]): number[][] {
  if (algo.normalize === false) return raw.advantages;
  const only = algo.normalize === true ? undefined : new Set(algo.normalize);
  return normalizeCredit(raw.advantages, agents, { only, scale: algo.normalizeStd }).advantages;
}
