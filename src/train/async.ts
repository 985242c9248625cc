// Asynchronous training (`train.async`, issue 14): while the trainer computes credit and updates on
// iteration t's batch, the rollout of iteration t+1 already runs against the engine, which joins the
// sample calls and the training calls on its compute thread (one engine: the adapters the rollout
// samples with ARE the ones being trained, so a turn sampled after an optimizer step sees the new
// weights at once; sample responses carry the adapter version each turn was sampled with).
//
// The pieces the trainer uses:
// - `RolloutPipeline`: one rollout in flight at most (a prefetch depth of one); `take()` awaits it
//   at the start of the next iteration and measures who waited for whom.
// - `boundStaleness`: per agent, the histogram of the batch's turn ages, and the turns more than the
//   agent's bound behind the adapter (they are dropped: never trained on, by the policy or critic).
// - `correctStale`: the kept turns that are behind are trained around the proximal policy with
//   importance weights (src/train/replay.ts's `proximalCorrection`, src/algo/offpolicy.ts's math).
// - `timeOptimSteps`: optim_step wall time. With engine.replicas > 1 the engine's optim_step is
//   where the replicas' adapters are made identical again (the all-reduced step), so that time is
//   the weight sync; with one engine there is nothing to sync and it is 0 by construction.
//
// Checkpoints: the trainer does not prefetch past a checkpoint iteration (it drains), and the state
// it saves while a prefetch is in flight is the task stream's and the rollout seeds' state from
// before the prefetch, so a checkpoint never holds a half-consumed rollout.
import { cappedImportanceWeights, mean, truncatedImportanceWeights } from "../algo/index.ts";
import type { ComputeEngine } from "../client/compute.ts";
import type { RunConfig } from "../config/schema.ts";
import { checkStaleness, type Episode, type Turn, turnAge } from "../rollout/index.ts";
import type { MetricsRow } from "./phases.ts";
import { proximalCorrection } from "./replay.ts";
import type { PolicyItem } from "./update.ts";

export type AsyncConfig = NonNullable<RunConfig["train"]["async"]>;

/** Per agent id, the most versions a trained turn may lag its adapter. */
export function stalenessBound(c: RunConfig, a: AsyncConfig): (agent: string) => number {
  const bounds = new Map(c.agents.map((x) => [x.id, x.maxStaleness ?? a.maxStaleness]));
  return (agent) => {
    const k = bounds.get(agent);
    if (k === undefined) throw new Error(`train.async: a turn of unknown agent "${agent}"`);
    return k;
  };
}

export interface StalenessCheck {
  /** Turns not sampled by their adapter's current version (rollout/stale_turns). */
  staleTurns: number;
  /** Turns more than their agent's bound behind: trained on by nothing. */
  dropped: ReadonlySet<Turn>;
  /** async/staleness/<agent>/<age> (turns per age, kept and dropped) and async/dropped/<agent>. */
  row: MetricsRow;
}

/**
 * The batch's turns against the adapters' versions now (each adapter's version before it updates in
 * this iteration): ages per agent, the turns beyond the agent's bound dropped; the stale-data guard
 * then checks that every kept turn is within its bound.
 */
export function boundStaleness(
  episodes: readonly Episode[],
  versions: Readonly<Record<string, number>>,
  agents: readonly string[],
  bound: (agent: string) => number,
): StalenessCheck {
  const row: MetricsRow = {};
  for (const a of agents) row[`async/dropped/${a}`] = 0;
  const dropped = new Set<Turn>();
  const kept = episodes.map((ep) => ({
    index: ep.index,
    turns: ep.turns.filter((turn) => {
      const age = turnAge(turn, versions);
      const key = `async/staleness/${turn.agent}/${age}`;
      row[key] = (row[key] ?? 0) + 1;
      if (age <= bound(turn.agent)) return true;
      dropped.add(turn);
      row[`async/dropped/${turn.agent}`]! += 1;
      return false;
    }),
  }));
  const { staleTurns } = checkStaleness(kept, versions, {
    maxAge: bound,
    what: "the agent's train.async staleness bound",
  });
  return { staleTurns: staleTurns + dropped.size, dropped, row };
}

/**
 * An adapter's items under asynchronous training: those sampled by its current version as they are
 * (`onPolicy`), the others (`late`) to be corrected.
 */
export function splitByAge(
  items: readonly PolicyItem[],
  versions: Readonly<Record<string, number>>,
): { onPolicy: PolicyItem[]; late: PolicyItem[] } {
  const onPolicy: PolicyItem[] = [];
  const late: PolicyItem[] = [];
  for (const x of items) (turnAge(x.step.turn, versions) > 0 ? late : onPolicy).push(x);
  return { onPolicy, late };
}

/** The per-token importance weights of a correction: w [L] from π_prox [L] and μ [L]. */
export function correctionWeights(
  a: AsyncConfig,
): (prox: readonly number[], behaviour: readonly number[]) => number[] {
  return a.correction === "decoupled"
    ? (prox, mu) => cappedImportanceWeights(prox, mu, a.clip)
    : (prox, mu) => truncatedImportanceWeights(prox, mu, a.clip);
}

/**
 * Turns an older version of `adapter` sampled, as PPO items around π_prox (a forward pass of the
 * adapter now) with their advantages weighted per `train.async.correction`; and their metrics.
 */
export async function correctStale(
  engine: ComputeEngine,
  adapter: string,
  late: readonly PolicyItem[],
  versions: Readonly<Record<string, number>>,
  a: AsyncConfig,
): Promise<{ items: PolicyItem[]; row: MetricsRow }> {
  const r = await proximalCorrection(engine, adapter, late, versions, correctionWeights(a));
  const row: MetricsRow = { [`async/${adapter}/offpolicy_turns`]: r.items.length };
  if (r.items.length > 0) {
    const ratios = r.ratios.flat();
    row[`async/${adapter}/iw_mean`] = mean(r.weights.flat());
    row[`async/${adapter}/iw_capped`] = ratios.filter((x) => x > a.clip).length / ratios.length;
  }
  return { items: r.items, row };
}

/** The engine with its optim_step calls timed (`take()` returns the seconds since the last take). */
export function timeOptimSteps(engine: ComputeEngine): { engine: ComputeEngine; take(): number } {
  let seconds = 0;
  const optimStep: ComputeEngine["optimStep"] = async (body, o) => {
    const t0 = performance.now();
    try {
      return await engine.optimStep(body, o);
    } finally {
      seconds += (performance.now() - t0) / 1000;
    }
  };
  const timed = new Proxy(engine, {
    get(target, key) {
      if (key === "optimStep") return optimStep;
      const v: unknown = Reflect.get(target, key, target);
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
  return {
    engine: timed,
    take() {
      const s = seconds;
      seconds = 0;
      return s;
    },
  };
}

/** Who waited for whom around one iteration's rollout (seconds). */
export interface PipelineTiming {
  /** The trainer, awaiting the batch (the whole rollout when nothing was prefetched). */
  trainerWait: number;
  /** The rollout, idle between the end of the last rollout and the start of this one. */
  rolloutWait: number;
  /** The rollout's own wall time, start to end. */
  rollout: number;
}

interface InFlight<B, S> {
  batch: Promise<B>;
  /** What the caller's state was before the prefetch began (what a checkpoint keeps meanwhile). */
  before: S;
  started: number;
  end: { at: number | null };
}

/** At most one rollout in flight ahead of the trainer: started by `prefetch`, awaited by `take`. */
export class RolloutPipeline<B, S> {
  private pending: InFlight<B, S> | null = null;
  private lastEnd: number | null = null;

  /** The state from before the rollout in flight (undefined when none is). */
  get before(): S | undefined {
    return this.pending?.before;
  }

  /** Starts the next iteration's rollout now; `before` is the caller's state from before it. */
  prefetch(play: () => Promise<B>, before: S): void {
    if (this.pending) throw new Error("RolloutPipeline: a rollout is already in flight");
    const end: { at: number | null } = { at: null };
    const started = performance.now();
    const batch = play().then((b) => {
      end.at = performance.now();
      return b;
    });
    // a prefetch nobody takes (the run stopped, the engine died) must not be an unhandled rejection;
    // take() still sees its error
    batch.catch(() => {});
    this.pending = { batch, before, started, end };
  }

  /** This iteration's batch: the prefetched one, or `play()` now when none is in flight. */
  async take(play: () => Promise<B>): Promise<{ batch: B; timing: PipelineTiming }> {
    const t0 = performance.now();
    const p = this.pending;
    this.pending = null;
    const started = p ? p.started : t0;
    const batch = p ? await p.batch : await play();
    const ended = p?.end.at ?? performance.now();
    const timing: PipelineTiming = {
      trainerWait: (performance.now() - t0) / 1000,
      rolloutWait: this.lastEnd === null ? 0 : (started - this.lastEnd) / 1000,
      rollout: (ended - started) / 1000,
    };
    this.lastEnd = ended;
    return { batch, timing };
  }

  /** Waits for a rollout in flight and discards it (the run is stopping). */
  async settle(): Promise<void> {
    const p = this.pending;
    this.pending = null;
    if (p) await p.batch.catch(() => {});
  }
}
