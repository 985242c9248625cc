// Experience replay (`train.replay`): a buffer of past actions with their behaviour log-probs and
// adapter versions, mixed into each adapter's PPO batch. A replayed action is corrected with
// truncated importance weights around the adapter as it is now (src/algo/offpolicy.ts has the math);
// one older than `maxAge` versions of its adapter is never used, and the stale-data guard
// (checkStaleness) refuses one that slips through. The buffer is part of the checkpoint.
//
// What is stored: each trained action of a trainable adapter, after its update, with the advantages
// it was trained on when fresh (normalised within its own batch). The critic never trains on
// replayed actions: its targets would need values of states the current critic has not scored.
import { mean, truncatedImportanceWeights, weightedAdvantages } from "../algo/index.ts";
import type { ComputeEngine } from "../client/compute.ts";
import type { RunConfig } from "../config/schema.ts";
import type { Rng } from "../rng.ts";
import { checkStaleness } from "../rollout/index.ts";
import type { MetricsRow } from "./phases.ts";
import type { Step } from "./steps.ts";
import { type PolicyItem, recomputeLogprobs } from "./update.ts";

export type ReplayConfig = NonNullable<RunConfig["train"]["replay"]>;

export interface ReplayItem {
  /** The action as played: its turn keeps the behaviour log-probs and the adapter version. */
  step: Step;
  /** The advantages it was trained with when fresh: [1] per action or [L] per token. */
  advantages: number[];
  adapter: string;
}

export interface ReplayState {
  items: ReplayItem[];
}

export class ReplayBuffer {
  private items: ReplayItem[];

  constructor(
    readonly opts: ReplayConfig,
    state?: ReplayState,
  ) {
    this.items = structuredClone(state?.items ?? []);
  }

  get size(): number {
    return this.items.length;
  }

  /** Versions of its adapter since the item's turn was sampled. */
  age(item: ReplayItem, versions: Readonly<Record<string, number>>): number {
    const now = versions[item.adapter];
    if (now === undefined) throw new Error(`replay: adapter ${item.adapter} is not on the engine`);
    return now - item.step.turn.adapterVersion;
  }

  /** After an update: the iteration's actions join; beyond capacity the oldest leave. */
  add(items: readonly ReplayItem[]): void {
    this.items.push(...items);
    const over = this.items.length - this.opts.capacity;
    if (over > 0) this.items.splice(0, over);
  }

  /** Drops every turn more than maxAge versions old; returns how many. */
  evict(versions: Readonly<Record<string, number>>): number {
    const before = this.items.length;
    this.items = this.items.filter((x) => this.age(x, versions) <= this.opts.maxAge);
    return before - this.items.length;
  }

  /** Up to `n` of `adapter`'s turns, uniformly without replacement, none older than maxAge. */
  draw(adapter: string, n: number, versions: Readonly<Record<string, number>>, rng: Rng): ReplayItem[] {
    this.evict(versions);
    if (n <= 0) return [];
    return rng.shuffle(this.items.filter((x) => x.adapter === adapter)).slice(0, n);
  }

  state(): ReplayState {
    return { items: structuredClone(this.items) };
  }
}

/** What the correction of one adapter's replayed actions measured. */
export interface ReplayCorrection {
  items: PolicyItem[];
  /** Per item, the truncated weights [L]. */
  weights: number[][];
  /** Per item, the untruncated ratio π_prox / μ [L]. */
  ratios: number[][];
  ages: number[];
}

/**
 * Replayed actions as PPO items: π_prox from one forward pass of the adapter now (its version is
 * `versions[adapter]`), PPO's old log-probs = π_prox, advantages scaled by w = min(clip, π_prox / μ).
 */
export async function correctReplayed(
  engine: ComputeEngine,
  adapter: string,
  replayed: readonly ReplayItem[],
  versions: Readonly<Record<string, number>>,
  opts: ReplayConfig,
): Promise<ReplayCorrection> {
  // the guard: a replayed turn must be at most maxAge versions old (the buffer evicts the others)
  checkStaleness(
    replayed.map((x) => ({ index: x.step.episode, turns: [x.step.turn] })),
    versions,
    { maxAge: opts.maxAge },
  );
  return proximalCorrection(engine, adapter, replayed, versions, (prox, mu) =>
    truncatedImportanceWeights(prox, mu, opts.clip),
  );
}

/**
 * Off-policy actions (replayed, or sampled by an older version during an asynchronous update) as PPO
 * items around the proximal policy: π_prox from one forward pass of `adapter` now, PPO's old
 * log-probs = π_prox, advantages scaled by the per-token weights `weigh(π_prox, μ)` [L].
 */
export async function proximalCorrection(
  engine: ComputeEngine,
  adapter: string,
  actions: ReadonlyArray<{ step: Step; advantages: readonly number[] }>,
  versions: Readonly<Record<string, number>>,
  weigh: (prox: readonly number[], behaviour: readonly number[]) => number[],
): Promise<ReplayCorrection> {
  const out: ReplayCorrection = { items: [], weights: [], ratios: [], ages: [] };
  if (actions.length === 0) return out;
  const prox = await recomputeLogprobs(
    engine,
    adapter,
    actions.map((x) => x.step),
  );
  actions.forEach((x, i) => {
    const lp = prox.oldLogprobs[i]!;
    const w = weigh(lp, x.step.turn.logprobs);
    out.items.push({ step: x.step, advantages: weightedAdvantages(x.advantages, w), oldLogprobs: lp });
    out.weights.push(w);
    out.ratios.push(lp.map((l, t) => Math.exp(l - x.step.turn.logprobs[t]!)));
    out.ages.push(versions[adapter]! - x.step.turn.adapterVersion);
  });
  return out;
}

/** Per adapter: replayed actions, their age, and their importance weights (mean, min, truncated share). */
export function replayAdapterMetrics(adapter: string, r: ReplayCorrection, clip: number): MetricsRow {
  const row: MetricsRow = { [`replay/${adapter}/turns`]: r.items.length };
  if (r.items.length === 0) return row;
  const w = r.weights.flat();
  row[`replay/${adapter}/age_mean`] = mean(r.ages);
  row[`replay/${adapter}/iw_mean`] = mean(w);
  row[`replay/${adapter}/iw_min`] = Math.min(...w);
  row[`replay/${adapter}/iw_truncated`] = r.ratios.flat().filter((x) => x > clip).length / w.length;
  return row;
}
