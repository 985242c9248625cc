// From a rollout's episodes to the batch the update trains on, and from the batch to the engine's
// training data. No HTTP here: the trainer calls the engine with what these functions build.
//
// Engine data (a Datum): per-token arrays aligned with `tokens`; entry i is token i predicted from
// tokens[:i], so entry 0 is ignored and the response's tokens are entries P .. P+L-1.
import { type Credit, type CreditBatch, type RewardRouting, routeRewards } from "../algo/index.ts";
import type { Episode, Turn } from "../rollout/types.ts";

/** One action of the batch: the turn as sampled and the reward credited to it. */
export interface Step {
  /** Index of its episode in the rollout (the episodes of a group sampled the same task). */
  readonly episode: number;
  readonly group: number;
  /** Index of the turn within its episode. */
  readonly k: number;
  readonly turn: Turn;
  /** The routed outcome reward plus the env's per-action rewards (src/flexmg/types.ts, "Rewards"). */
  readonly reward: number;
}

/**
 * Flatten the episodes into steps, episode by episode in the order the actions were taken, each
 * credited with the env's per-action rewards and its share of the outcome under the routing.
 */
export function toSteps(
  episodes: readonly Episode[],
  roleOf: (agent: string) => string,
  routing: RewardRouting,
): Step[] {
  const steps: Step[] = [];
  for (const ep of episodes) {
    const turns = ep.turns.map((t) => ({ agent: t.agent, role: roleOf(t.agent), reward: t.reward }));
    const rewards = routeRewards(turns, ep.outcome.teamReward, routing, ep.outcome.roleRewards);
    ep.turns.forEach((turn, k) => {
      if (turn.responseIds.length === 0) {
        throw new Error(
          `episode ${ep.index} turn ${k} (agent ${turn.agent}): empty response, nothing to train on`,
        );
      }
      steps.push({ episode: ep.index, group: ep.group, k, turn, reward: rewards[k]! });
    });
  }
  return steps;
}

/** What credit assignment needs of the batch; `values` from the critic's forward over each step. */
export function creditBatch(
  steps: readonly Step[],
  episodes: readonly Episode[],
  values: ReadonlyArray<readonly number[]> | null,
): CreditBatch {
  return {
    steps: steps.map((s) => ({
      episode: s.episode,
      group: s.group,
      agent: s.turn.agent,
      reward: s.reward,
      promptLength: s.turn.promptIds.length,
      responseLength: s.turn.responseIds.length,
    })),
    cutOff: new Set(episodes.filter((e) => e.truncated && !e.terminated).map((e) => e.index)),
    values,
  };
}

/** The tokens the critic reads for a step: prompt and response. */
export function criticTokens(s: Step): number[] {
  return [...s.turn.promptIds, ...s.turn.responseIds];
}

export interface PolicyDatum {
  tokens: number[];
  weights: number[];
  old_logprobs: number[];
  advantages: number[];
}

/**
 * prompt + response; weight 1 on the response tokens; the old log-probs (the sampler's, or recomputed)
 * and the advantages there: one per token, or one per action broadcast to its tokens.
 */
export function policyDatum(
  s: Step,
  advantages: readonly number[],
  oldLogprobs?: readonly number[],
): PolicyDatum {
  const P = s.turn.promptIds.length;
  const L = s.turn.responseIds.length;
  const old = oldLogprobs ?? s.turn.logprobs;
  if (old.length !== L) {
    throw new Error(`turn of agent ${s.turn.agent}: ${old.length} log-probs for ${L} response tokens`);
  }
  const adv = advantages.length === L ? advantages : new Array<number>(L).fill(advantages[0]!);
  const zeros = new Array<number>(P).fill(0);
  return {
    tokens: [...s.turn.promptIds, ...s.turn.responseIds],
    weights: [...zeros, ...new Array<number>(L).fill(1)],
    old_logprobs: [...zeros, ...old],
    advantages: [...zeros, ...adv],
  };
}

export interface ValueDatum {
  tokens: number[];
  weights: number[];
  returns: number[];
  old_values: number[];
}

/**
 * Critic targets of step i. The engine's values[t] is V(tokens[: t + 1]) (the head reads position t).
 * Level "action": V(o) = values[P - 1], the last prompt token; the prompt alone, one weighted position.
 * Level "token": the state before action token j is tokens[: P + j], i.e. values[P + j - 1].
 */
export function valueDatum(s: Step, credit: Credit, i: number): ValueDatum {
  const P = s.turn.promptIds.length;
  const returns = credit.returns[i]!;
  const old = credit.values[i]!;
  const tokens = credit.level === "action" ? [...s.turn.promptIds] : criticTokens(s);
  const first = P - 1; // the position of the first target
  const n = tokens.length;
  const datum: ValueDatum = {
    tokens,
    weights: new Array<number>(n).fill(0),
    returns: new Array<number>(n).fill(0),
    old_values: new Array<number>(n).fill(0),
  };
  returns.forEach((r, j) => {
    datum.weights[first + j] = 1;
    datum.returns[first + j] = r;
    datum.old_values[first + j] = old[j]!;
  });
  return datum;
}
