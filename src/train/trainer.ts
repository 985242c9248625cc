// The MARFT training loop: `Trainer.iteration()` is one iteration of the algorithm, top to bottom.
// `train()` (run.ts) wires it to a run directory, an engine, evaluation and checkpoints.
//
// All randomness of the loop (task order, sample seeds, minibatch order) comes from one seeded PRNG
// whose state is checkpointed, so on CPU a resumed run reproduces the uninterrupted run's metrics.
import { type Credit, ESTIMATORS, normalizeCredit, ZeroAdvantageDetector } from "../algo/index.ts";
import { adapterVersions, type ComputeEngine } from "../client/compute.ts";
import { adapterOf, usesCritic } from "../config/derived.ts";
import { CRITIC_ADAPTER, type RunConfig } from "../config/schema.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import { Rng } from "../rng.ts";
import { checkStaleness, type RolloutResult } from "../rollout/index.ts";
import { asSource, type EpisodeSource } from "./episodes.ts";
import { type EvalResult, evaluate } from "./evaluate.ts";
import * as metrics from "./metrics.ts";
import { type MetricsRow, Phases, type ProgressEvent } from "./phases.ts";
import type { TrainerState } from "./rundir.ts";
import { tasksAt, updatingAdapters } from "./schedule.ts";
import { creditBatch, type Step, toSteps } from "./steps.ts";
import { criticValues, type PolicyItem, recomputeLogprobs, updateCritic, updatePolicy } from "./update.ts";

export interface TrainerOptions {
  /** Where to continue from (a checkpoint's trainer state); default: iteration 0. */
  state?: TrainerState;
  /** One line of news for a person (zero-advantage warnings). */
  log?: (line: string) => void;
  /** Called at each phase, for progress bars. */
  onProgress?: (e: ProgressEvent) => void;
}

export class Trainer {
  state: TrainerState;
  readonly detector = new ZeroAdvantageDetector();
  private readonly rng: Rng;
  private versions: Record<string, number> = {};
  private bf16Bases = new Set<string>();
  tokensSampled = 0;
  private readonly log: (line: string) => void;
  private readonly onProgress: (e: ProgressEvent) => void;

  /** The tasks, and where the episodes of the rollout come from (an env suite, an app). */
  readonly suite: EpisodeSource;

  constructor(
    readonly config: RunConfig,
    suite: TaskSuite<unknown> | EpisodeSource,
    readonly engine: ComputeEngine,
    opts: TrainerOptions = {},
  ) {
    this.suite = asSource(suite);
    if (this.suite.train.length === 0) throw new Error(`task ${this.suite.name}: the train split is empty`);
    this.state = opts.state ?? {
      iteration: 0,
      dataCursor: 0,
      rng: new Rng(config.seed).state(),
      zeroAdvantageBatches: {},
      metricsLines: 0,
      adapterVersions: {},
    };
    this.rng = new Rng(this.state.rng);
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

    // 1. rollout: the team plays this iteration's tasks; no turn may come from an outdated adapter
    const { episodes, stats } = await phases.run("rollout", (progress) => this.rollout(progress));
    const stale = checkStaleness(episodes, this.versions, { offPolicy: c.train.offPolicy });

    // 2. steps: every action, with the env's per-action rewards and its routed share of the outcome
    const steps = toSteps(episodes, this.roleOf, c.algo.rewardRouting);
    const agents = steps.map((s) => s.turn.agent);

    // 3. credit: the critic's values, then GAE or group baselines, then per-agent normalisation
    const values = usesCritic(c) ? await phases.run("values", () => criticValues(this.engine, steps)) : null;
    const raw = ESTIMATORS[c.algo.estimator](creditBatch(steps, episodes, values), c.algo);
    this.checkZero(raw, agents);
    const advantages = normalizeAdvantages(raw, agents, c.algo);

    // 4. PPO on each adapter the schedule updates
    const policy: MetricsRow = {};
    for (const adapter of updatingAdapters(c, it)) {
      const mine = this.itemsOf(adapter, steps, advantages);
      const update = () => this.updatePolicy(adapter, mine);
      if (mine.length > 0) Object.assign(policy, await phases.run("policy", update, `policy/${adapter}`));
    }

    // 5. the critic towards the returns
    const critic = usesCritic(c)
      ? await phases.run("critic", () => updateCritic(this.engine, steps, raw, c, this.rng))
      : null;
    if (critic) this.versions[CRITIC_ADAPTER] = critic.version;

    // 6. the state a checkpoint keeps, and the metrics
    this.advance();
    const ids = c.agents.map((a) => a.id);
    return {
      iteration: it + 1,
      ...metrics.rolloutMetrics(stats, stale.staleTurns),
      ...metrics.rewardMetrics(episodes, steps, ids),
      ...metrics.advantageMetrics(raw, agents, ids, this.detector.zeroBatches, this.detector.eps),
      ...policy,
      ...(critic ? metrics.valueMetrics(raw, critic.loss) : {}),
      ...phases.times,
    };
  }

  /** The rollout of this iteration: the next tasks of the data stream, a fresh seed from the loop's PRNG. */
  private async rollout(onProgress: (done: number, total: number) => void): Promise<RolloutResult> {
    const c = this.config;
    const tasks = tasksAt(c.seed, this.suite.train.length, this.state.dataCursor, c.train.tasksPerIter);
    this.state.dataCursor += c.train.tasksPerIter;
    const r = await this.suite.play({
      engine: this.engine,
      config: c,
      tasks: tasks.map((i) => this.suite.train[i]),
      samplesPerTask: c.train.samplesPerTask,
      seed: this.rng.seed(),
      onProgress,
    });
    this.tokensSampled += r.stats.tokensSampled;
    return r;
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
      iteration: this.state.iteration + 1,
      rng: this.rng.state(),
      zeroAdvantageBatches: { ...this.detector.zeroBatches },
      adapterVersions: { ...this.versions },
    };
  }

  /** PPO for one adapter, its old log-probs first recomputed where the base computes in bf16. */
  private async updatePolicy(adapter: string, items: PolicyItem[]): Promise<MetricsRow> {
    const c = this.config;
    const owner = c.agents.find((a) => a.id === adapter)!;
    const r = c.ppo.recomputeLogprobs;
    const row: MetricsRow = {};
    if (r === "auto" ? this.bf16Bases.has(owner.base) : r) {
      const re = await recomputeLogprobs(
        this.engine,
        adapter,
        items.map((x) => x.step),
      );
      row[`logprob_mismatch/${adapter}`] = re.mismatch;
      items = items.map((x, i) => ({ ...x, oldLogprobs: re.oldLogprobs[i]! }));
    }
    const u = await updatePolicy(this.engine, adapter, items, c.ppo, this.rng);
    this.versions[adapter] = u.version;
    return { ...row, ...metrics.policyMetrics(adapter, u, c.ppo.klCoef) };
  }

  /** The actions whose turns `adapter` sampled, with their advantages. */
  private itemsOf(adapter: string, steps: readonly Step[], advantages: number[][]): PolicyItem[] {
    return steps.flatMap((step, i) =>
      this.adapterOf(step) === adapter ? [{ step, advantages: advantages[i]! }] : [],
    );
  }

  /** Evaluate the current adapters on the held-out split. */
  evaluate(): Promise<EvalResult> {
    const c = this.config;
    return evaluate({
      engine: this.engine,
      suite: this.suite,
      config: c,
      tasks: c.eval.n > 0 ? this.suite.eval.slice(0, c.eval.n) : this.suite.eval,
      greedy: c.eval.greedy,
      k: c.eval.k,
      // eval seeds are fixed, not drawn from the loop's PRNG: evaluating must not change training
      seed: c.seed + 7919,
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
