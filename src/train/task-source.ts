// Where each iteration's training tasks come from.
//
// One task: its endless shuffled stream (`tasksAt`), the run's data cursor moving along it.
// Several (a multi-task run, `tasks:`): at the start of an iteration the task scheduler chooses the
// iteration's mix, a probability per task; each task slot is then drawn from that mix, and each task
// has its own endless stream and cursor. Schedulers (`train.taskScheduler`):
//   fixed              p_k = w_k / Σ w
//   round-robin        a whole iteration per task, chosen by smooth weighted round robin (nginx's):
//                      over Σ w iterations task k gets exactly w_k of them, evenly spread
//   learning-progress  p_k = (1 − ε) LP_k / Σ LP + ε w_k / Σ w, LP_k = |fast_k − slow_k|, two moving
//                      averages of task k's mean reward per iteration (Portelas et al. 2019's absolute
//                      learning progress): tasks whose reward is still moving get more of the draws,
//                      solved or hopeless ones less; ε keeps every task in the mix
// The scheduler's state (its PRNG, the cursors, the averages, the round-robin credit) is checkpointed,
// so a resumed run draws the same mix.
import { mean } from "../algo/index.ts";
import type { RunConfig } from "../config/schema.ts";
import { MultiTaskSuite, partName } from "../envs/multi.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import { mixSeed, Rng, type RngState } from "../rng.ts";
import type { Episode } from "../rollout/index.ts";
import type { EpisodeSource } from "./episodes.ts";
import type { MetricsRow } from "./phases.ts";
import { tasksAt } from "./schedule.ts";

export interface SchedulerState {
  rng: RngState;
  /** Per task: position in its stream. */
  cursors: number[];
  /** Per task: learning progress' fast and slow averages of its reward (null until it is played). */
  fast: Array<number | null>;
  slow: Array<number | null>;
  /** Per task: smooth weighted round robin's running credit. */
  credit: number[];
}

type SchedulerConfig = NonNullable<RunConfig["train"]["taskScheduler"]>;

/** The learning-progress mix: p_k ∝ LP_k (a task never played counts as the most moving), ε of it by weight. */
export function learningProgressMix(
  weights: readonly number[],
  fast: ReadonlyArray<number | null>,
  slow: ReadonlyArray<number | null>,
  explore: number,
): number[] {
  const w = normalized(weights);
  const seen = fast.map((f, k) => (f === null ? null : Math.abs(f - slow[k]!)));
  const top = Math.max(0, ...seen.filter((x): x is number => x !== null));
  const lp = seen.map((x) => x ?? top);
  const total = lp.reduce((s, x) => s + x, 0);
  if (!(total > 0)) return w; // nothing moves (or nothing seen yet): the weights alone
  return lp.map((x, k) => (1 - explore) * (x / total) + explore * w[k]!);
}

/**
 * Smooth weighted round robin: every task gains its weight, the richest is chosen and pays the total.
 *   credit [K], weights [K] → the chosen task and the new credit
 */
export function weightedRoundRobin(
  credit: readonly number[],
  weights: readonly number[],
): { pick: number; credit: number[] } {
  const total = weights.reduce((s, x) => s + x, 0);
  const next = credit.map((c, k) => c + weights[k]!);
  let pick = 0;
  next.forEach((c, k) => {
    if (c > next[pick]!) pick = k;
  });
  next[pick]! -= total;
  return { pick, credit: next };
}

function normalized(xs: readonly number[]): number[] {
  const s = xs.reduce((a, b) => a + b, 0);
  return xs.map((x) => x / s);
}

export class TaskSource {
  private cursor: number;
  private readonly multi: MultiTaskSuite | null;
  private readonly scheduler: SchedulerConfig;
  private s: SchedulerState | null = null;
  private rng: Rng | null = null;
  /** This iteration's mix (multi-task). */
  private mix: number[] = [];

  constructor(
    private readonly c: RunConfig,
    private readonly suite: TaskSuite<unknown> | EpisodeSource,
    state: { dataCursor: number; scheduler?: SchedulerState },
  ) {
    this.cursor = state.dataCursor;
    this.multi = suite instanceof MultiTaskSuite ? suite : null;
    this.scheduler = c.train.taskScheduler ?? { kind: "fixed" };
    if (this.multi) {
      const K = this.multi.parts.length;
      for (const p of this.multi.parts)
        if (p.suite.train.length === 0) throw new Error(`task ${p.name}: the train split is empty`);
      this.s = structuredClone(state.scheduler) ?? {
        rng: new Rng(mixSeed(c.seed, 0x7a5c)).state(),
        cursors: new Array<number>(K).fill(0),
        fast: new Array<number | null>(K).fill(null),
        slow: new Array<number | null>(K).fill(null),
        credit: new Array<number>(K).fill(0),
      };
      this.rng = new Rng(this.s.rng);
    }
  }

  /** At the start of an iteration: the scheduler chooses its mix. */
  begin(): void {
    if (!this.multi || !this.s) return;
    const weights = this.multi.parts.map((p) => p.weight);
    const k = this.scheduler;
    if (k.kind === "fixed") this.mix = normalized(weights);
    else if (k.kind === "round-robin") {
      const r = weightedRoundRobin(this.s.credit, weights);
      this.s.credit = r.credit;
      this.mix = weights.map((_, i) => (i === r.pick ? 1 : 0));
    } else this.mix = learningProgressMix(weights, this.s.fast, this.s.slow, k.explore);
  }

  /** The next `count` training tasks (refills of dynamic sampling draw from the same mix). */
  next(count: number): unknown[] {
    const start = this.cursor;
    this.cursor += count;
    if (!this.multi || !this.s || !this.rng) {
      return tasksAt(this.c.seed, this.suite.train.length, start, count).map((i) => this.suite.train[i]);
    }
    const out: unknown[] = [];
    for (let j = 0; j < count; j++) {
      const k = this.draw();
      const part = this.multi.parts[k]!;
      const [i] = tasksAt(mixSeed(this.c.seed, k + 1), part.suite.train.length, this.s.cursors[k]!, 1);
      this.s.cursors[k]!++;
      out.push({ part: k, task: part.suite.train[i!] });
    }
    return out;
  }

  /** After the rollout: learning progress updates each played task's averages with its mean reward. */
  observe(episodes: readonly Episode[]): void {
    if (!this.multi || !this.s || this.scheduler.kind !== "learning-progress") return;
    const { fast, slow } = this.scheduler;
    this.multi.parts.forEach((p, k) => {
      const r = mean(episodes.filter((e) => partName(e.taskId) === p.name).map((e) => e.outcome.teamReward));
      if (Number.isNaN(r)) return;
      const s = this.s!;
      s.fast[k] = s.fast[k] === null ? r : s.fast[k]! + fast * (r - s.fast[k]!);
      s.slow[k] = s.slow[k] === null ? r : s.slow[k]! + slow * (r - s.slow[k]!);
    });
  }

  /** Multi-task runs: per task, its episodes and mean reward in this iteration, and its share of the mix. */
  metrics(episodes: readonly Episode[]): MetricsRow {
    if (!this.multi) return {};
    const row: MetricsRow = {};
    this.multi.parts.forEach((p, k) => {
      const mine = episodes.filter((e) => partName(e.taskId) === p.name);
      row[`task/${p.name}/episodes`] = mine.length;
      if (mine.length > 0) row[`task/${p.name}/reward`] = mean(mine.map((e) => e.outcome.teamReward));
      row[`task/${p.name}/mix`] = this.mix[k] ?? 0;
    });
    return row;
  }

  /** What a checkpoint keeps: the data cursor, and the scheduler's state in a multi-task run. */
  save(): { dataCursor: number; scheduler?: SchedulerState } {
    if (!this.s || !this.rng) return { dataCursor: this.cursor };
    return { dataCursor: this.cursor, scheduler: structuredClone({ ...this.s, rng: this.rng.state() }) };
  }

  /** One draw from this iteration's mix (inverse CDF). */
  private draw(): number {
    if (this.mix.length === 0) throw new Error("TaskSource: begin() the iteration before drawing tasks");
    const u = this.rng!.next();
    let acc = 0;
    for (let k = 0; k < this.mix.length; k++) {
      acc += this.mix[k]!;
      if (u < acc) return k;
    }
    return this.mix.length - 1 - [...this.mix].reverse().findIndex((p) => p > 0);
  }
}
