// An iteration's metrics (one metrics.jsonl line): pure functions of what the phases produced.
// Keys are slash-namespaced: reward/mean, reward/<agent>, loss/policy/<agent>, adv/<agent>/mean, ...
import { type Credit, explainedVariance, mean, std } from "../algo/index.ts";
import type { Episode, RolloutStats } from "../rollout/index.ts";
import type { MetricsRow } from "./phases.ts";
import type { EvalResult } from "./evaluate.ts";
import type { Step } from "./steps.ts";
import type { PolicyUpdate } from "./update.ts";

export function rolloutMetrics(stats: RolloutStats, staleTurns: number): MetricsRow {
  return {
    "tokens/sampled": stats.tokensSampled,
    "throughput/sample_tokens_per_s": stats.tokensPerSecond,
    "rollout/engine_calls": stats.engineCalls,
    "rollout/mean_decode_batch": stats.meanDecodeBatch,
    "rollout/stale_turns": staleTurns,
    ...(stats.errors !== undefined ? { "episodes/errors": stats.errors } : {}),
  };
}

/** Team reward and success; per agent, the reward its actions got per episode and its action length. */
export function rewardMetrics(
  episodes: readonly Episode[],
  steps: readonly Step[],
  agents: readonly string[],
): MetricsRow {
  const team = episodes.map((e) => e.outcome.teamReward);
  const row: MetricsRow = {
    "reward/mean": mean(team),
    "reward/std": std(team),
    "episodes/correct_frac": mean(episodes.map((e) => (e.outcome.correct ? 1 : 0))),
    "episodes/turns_mean": mean(episodes.map((e) => e.turns.length)),
  };
  for (const a of agents) {
    const perEpisode = episodes.map((e) =>
      steps.filter((s) => s.episode === e.index && s.turn.agent === a).reduce((x, s) => x + s.reward, 0),
    );
    row[`reward/${a}`] = mean(perEpisode);
    const mine = steps.filter((s) => s.turn.agent === a);
    if (mine.length > 0) row[`response_len/${a}`] = mean(mine.map((s) => s.turn.responseIds.length));
  }
  return row;
}

/**
 * Per agent, statistics of its raw (unnormalised) advantage entries: mean, std, the share that is
 * zero, and the batches so far in which all were (`zeroBatches`, from the ZeroAdvantageDetector).
 */
export function advantageMetrics(
  raw: Credit,
  stepAgents: readonly string[],
  agents: readonly string[],
  zeroBatches: Readonly<Record<string, number>>,
  eps: number,
): MetricsRow {
  const row: MetricsRow = {};
  for (const a of agents) {
    const xs = raw.advantages.filter((_, i) => stepAgents[i] === a).flat();
    if (xs.length === 0) continue;
    row[`adv/${a}/mean`] = mean(xs);
    row[`adv/${a}/std`] = std(xs);
    row[`adv/${a}/zero_frac`] = xs.filter((x) => Math.abs(x) <= eps).length / xs.length;
    row[`adv/${a}/zero_batches`] = zeroBatches[a] ?? 0;
  }
  return row;
}

/** One adapter's PPO update, under its owner's id; `kl_ref` only when a KL penalty is configured. */
export function policyMetrics(agent: string, u: PolicyUpdate, klCoef: number): MetricsRow {
  const row: MetricsRow = { [`loss/policy/${agent}`]: mean(u.loss) };
  if (u.clipfrac.length) row[`clipfrac/${agent}`] = mean(u.clipfrac);
  if (u.approxKl.length) row[`kl/${agent}`] = mean(u.approxKl);
  if (u.entropy.length) row[`entropy/${agent}`] = mean(u.entropy);
  if (klCoef > 0 && u.klRef.length) row[`kl_ref/${agent}`] = mean(u.klRef);
  row[`grad_norm/${agent}`] = mean(u.gradNorm);
  row[`optim_steps/${agent}`] = u.gradNorm.length;
  row[`early_stop/${agent}`] = u.earlyStop ? 1 : 0;
  return row;
}

/** How well the critic's values (before its update) predicted the returns it was trained towards. */
export function valueMetrics(credit: Credit, criticLoss: readonly number[]): MetricsRow {
  const values = credit.values.flat();
  const returns = credit.returns.flat();
  // undefined when every return is the same (e.g. no episode rewarded): left out, since a metrics
  // row holds numbers only (JSON writes NaN as null)
  const ev = explainedVariance(values, returns);
  return {
    ...(Number.isFinite(ev) ? { "value/explained_variance": ev } : {}),
    "value/mean": mean(values),
    "value/return_mean": mean(returns),
    "loss/value": mean(criticLoss),
  };
}

/** A held-out evaluation's columns: pass@1 with its interval, pass@k, and per task in a multi-task run. */
export function evalMetrics(r: EvalResult, k: number): MetricsRow {
  const row: MetricsRow = {
    "eval/accuracy": r.accuracy,
    "eval/ci95_low": r.ci95[0],
    "eval/ci95_high": r.ci95[1],
  };
  if (r.passAtK !== undefined) row[`eval/pass@${k}`] = r.passAtK;
  for (const [name, t] of Object.entries(r.perTask ?? {})) row[`eval/${name}/accuracy`] = t.accuracy;
  return row;
}
