// An iteration's batch of episodes, with dynamic sampling (`train.dynamicSampling`, DAPO's dynamic
// sampling): a group whose episodes all got the same rewards has all-zero advantages under group
// baselines, so it adds nothing but dilution to the per-agent normalisation. Such groups are dropped
// and fresh tasks are rolled out in their place, until the batch holds `tasksPerIter` groups with
// signal or `maxExtraRollouts` extra rollouts have been made. Every token sampled counts, the
// dropped groups' included: they are what the batch cost.
//
// No flat group is ever admitted while extra rollouts remain. When the cap is spent the batch is
// what was kept (shorter than usual); if not one group had signal, the iteration trains on its first
// rollout as sampled (`dynamic/fallback` = 1): there is nothing better to train on, and a critic
// still learns from it.
import type { Episode, RolloutResult, RolloutStats } from "../rollout/index.ts";
import type { MetricsRow } from "./phases.ts";

export interface BatchRequest {
  tasksPerIter: number;
  dynamic: { maxExtraRollouts: number } | null;
  /** The next `count` training tasks. */
  next: (count: number) => unknown[];
  /** Rolls the tasks out (samplesPerTask episodes each, grouped by task). */
  play: (tasks: unknown[]) => Promise<RolloutResult>;
  /** The ids of the groups of these episodes whose rewards are all equal. */
  flat: (episodes: readonly Episode[]) => ReadonlySet<number>;
}

export interface Batch extends RolloutResult {
  /** Every episode sampled this iteration, dropped groups included (per-task metrics, learning progress). */
  sampled: Episode[];
  /** dynamic/* metrics (only with dynamic sampling). */
  metrics: MetricsRow;
}

export async function sampleBatch(r: BatchRequest): Promise<Batch> {
  const first = await r.play(r.next(r.tasksPerIter));
  if (!r.dynamic) return { ...first, sampled: first.episodes, metrics: {} };

  const rollouts = [first];
  const kept: Episode[][] = [];
  let dropped = 0;
  const keep = (res: RolloutResult) => {
    const flat = r.flat(res.episodes);
    for (const group of groupsOf(res.episodes)) {
      if (flat.has(group[0]!.group)) dropped++;
      else kept.push(group);
    }
  };
  keep(first);
  while (kept.length < r.tasksPerIter && rollouts.length - 1 < r.dynamic.maxExtraRollouts) {
    const res = await r.play(r.next(r.tasksPerIter - kept.length));
    rollouts.push(res);
    keep(res);
  }
  const fallback = kept.length === 0;
  const episodes = fallback ? first.episodes : renumber(kept.slice(0, r.tasksPerIter));
  const extra = rollouts.slice(1);
  const sampled = rollouts.flatMap((x) => x.episodes);
  return {
    episodes,
    stats: mergeStats(rollouts.map((x) => x.stats)),
    sampled,
    metrics: {
      "dynamic/kept_groups": fallback ? 0 : Math.min(kept.length, r.tasksPerIter),
      "dynamic/dropped_groups": dropped,
      "dynamic/extra_rollouts": extra.length,
      "dynamic/extra_episodes": extra.reduce((n, x) => n + x.episodes.length, 0),
      "dynamic/extra_tokens": extra.reduce((n, x) => n + x.stats.tokensSampled, 0),
      "dynamic/fallback": fallback ? 1 : 0,
      // the reward of everything sampled: reward/mean is the kept batch's, which dropping biases
      "reward/sampled_mean": sampled.reduce((s, e) => s + e.outcome.teamReward, 0) / sampled.length,
    },
  };
}

/** The episodes of each group, groups in order of first appearance. */
function groupsOf(episodes: readonly Episode[]): Episode[][] {
  const m = new Map<number, Episode[]>();
  for (const e of episodes) {
    const list = m.get(e.group);
    if (list) list.push(e);
    else m.set(e.group, [e]);
  }
  return [...m.values()];
}

/** Groups from several rollouts as one batch: episode indices and group ids numbered afresh. */
function renumber(groups: readonly Episode[][]): Episode[] {
  let index = 0;
  return groups.flatMap((g, group) => g.map((e) => ({ ...e, index: index++, group })));
}

/** The statistics of several rollouts as one (rates over their total time). */
export function mergeStats(all: readonly RolloutStats[]): RolloutStats {
  const sum = (f: (s: RolloutStats) => number) => all.reduce((n, s) => n + f(s), 0);
  const seconds = sum((s) => s.seconds);
  const turns = sum((s) => s.turns);
  const tokensSampled = sum((s) => s.tokensSampled);
  return {
    episodes: sum((s) => s.episodes),
    turns,
    tokensSampled,
    seconds,
    tokensPerSecond: seconds > 0 ? tokensSampled / seconds : 0,
    engineCalls: sum((s) => s.engineCalls),
    meanDecodeBatch: turns > 0 ? sum((s) => s.meanDecodeBatch * s.turns) / turns : 0,
    decodeSteps: sum((s) => s.decodeSteps),
    prefillSeconds: sum((s) => s.prefillSeconds),
    decodeSeconds: sum((s) => s.decodeSeconds),
  };
}
