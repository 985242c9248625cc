// The batch record passed between the trainer's phases, and the pure steps that fill it in:
// rewards (routing) -> advantages (MARFT-A / MARFT-T / critic-free) -> normalisation -> engine data.
// No HTTP here: the trainer calls the engine and hands the numbers to these functions.
import {
  actionGae,
  groupRelative,
  normalizePerAgent,
  type RewardRouting,
  routeRewards,
  tokenGae,
} from "../algo/index.ts";
import type { Episode, Turn } from "../rollout/types.ts";

/** One action of the batch, with everything the update needs. */
export interface Step {
  episode: number;
  /** Index of the turn within its episode. */
  k: number;
  turn: Turn;
  role: string;
  /** Routed reward credited to this action. */
  reward: number;
  /** MARFT-A: V(o) at the last prompt token. */
  value: number;
  /** MARFT-T: V at the state before each action token [L]. */
  tokenValues: number[];
  /** V after the action (the last response token): the bootstrap of a truncated episode. */
  finalValue: number;
  /** One per action (MARFT-A, critic-free) broadcast to its tokens, or one per action token (MARFT-T) [L]. */
  advantages: number[];
  returns: number[];
  /** PPO's old log-probs when recomputed by a forward pass (else the sampler's, turn.logprobs) [L]. */
  oldLogprobs?: number[];
}

export type Estimator = "marft-a" | "marft-t" | "critic-free";

/** The team reward of an episode: what the task says the team earned. */
export function teamReward(ep: Episode): number {
  const info = ep.info;
  if (typeof info["teamReward"] === "number") return info["teamReward"];
  if (typeof info["score"] === "number") return info["score"];
  throw new Error(
    `episode ${ep.index} (task ${ep.taskId}): the task set neither info().teamReward nor info().score, so there is no team reward to route`,
  );
}

function roleRewardsOf(ep: Episode): Record<string, number> {
  const rr = ep.info["roleRewards"];
  return rr && typeof rr === "object" ? (rr as Record<string, number>) : {};
}

/**
 * Flatten the episodes into steps and credit rewards by the configured routing.
 * The env echoes the team reward through takeRewards(); routing decides who really gets it, so the
 * env-credited turn rewards are replaced (not added to) by routeRewards on the team reward.
 */
export function makeSteps(
  episodes: readonly Episode[],
  roleOf: (agent: string) => string,
  routing: RewardRouting,
): Step[] {
  const steps: Step[] = [];
  for (const ep of episodes) {
    const turns = ep.turns.map((t) => ({ agent: t.agent, role: roleOf(t.agent), reward: 0 }));
    const rewards = routeRewards(turns, teamReward(ep), routing, roleRewardsOf(ep));
    ep.turns.forEach((turn, k) => {
      if (turn.responseIds.length === 0) {
        throw new Error(
          `episode ${ep.index} turn ${k} (agent ${turn.agent}): empty response, nothing to train on`,
        );
      }
      steps.push({
        episode: ep.index,
        k,
        turn,
        role: turns[k]!.role,
        reward: rewards[k]!,
        value: 0,
        tokenValues: [],
        finalValue: 0,
        advantages: [],
        returns: [],
      });
    });
  }
  return steps;
}

/** Steps of each episode, in action order. */
function byEpisode(steps: Step[]): Step[][] {
  const m = new Map<number, Step[]>();
  for (const s of steps) {
    const list = m.get(s.episode);
    if (list) list.push(s);
    else m.set(s.episode, [s]);
  }
  return [...m.values()].map((l) => l.sort((a, b) => a.k - b.k));
}

/**
 * Fill in advantages and returns.
 *   bootstrap(episode): V of the state after the last action; 0 when the episode terminated.
 * MARFT-A: one GAE step per action over the episode's actions in the order taken.
 * MARFT-T: GAE over the concatenated action tokens of the episode.
 * critic-free: discounted return-to-go per action minus the mean over the same agent's actions in
 * episodes of the same task (group): GRPO's baseline, kept per agent.
 */
export function computeAdvantages(
  steps: Step[],
  episodes: readonly Episode[],
  estimator: Estimator,
  gamma: number,
  lambda: number,
  bootstrap: (episode: number) => number,
  groupStd = false,
): void {
  const epByIndex = new Map(episodes.map((e) => [e.index, e]));
  const groups = byEpisode(steps);
  if (estimator === "marft-a") {
    for (const g of groups) {
      const r = actionGae(
        g.map((s) => s.reward),
        g.map((s) => s.value),
        bootstrap(g[0]!.episode),
        gamma,
        lambda,
      );
      g.forEach((s, i) => {
        const L = s.turn.responseIds.length;
        s.advantages = new Array<number>(L).fill(r.advantages[i]!);
        s.returns = [r.returns[i]!];
      });
    }
    return;
  }
  if (estimator === "marft-t") {
    for (const g of groups) {
      const r = tokenGae(
        g.map((s) => ({ values: s.tokenValues, reward: s.reward })),
        bootstrap(g[0]!.episode),
        gamma,
        lambda,
      );
      g.forEach((s, i) => {
        s.advantages = r.advantages[i]!;
        s.returns = r.returns[i]!;
      });
    }
    return;
  }
  // critic-free
  const agentIds = new Map<string, number>();
  const rtg: number[] = [];
  const keys: number[] = [];
  const flat: Step[] = [];
  for (const g of groups) {
    let G = 0;
    const out = new Array<number>(g.length);
    for (let i = g.length - 1; i >= 0; i--) {
      G = g[i]!.reward + gamma * G;
      out[i] = G;
    }
    const group = epByIndex.get(g[0]!.episode)!.group;
    g.forEach((s, i) => {
      if (!agentIds.has(s.turn.agent)) agentIds.set(s.turn.agent, agentIds.size);
      rtg.push(out[i]!);
      keys.push(group * 1_000_003 + agentIds.get(s.turn.agent)!);
      flat.push(s);
    });
  }
  const adv = groupRelative(rtg, keys, { std: groupStd });
  flat.forEach((s, i) => {
    s.advantages = new Array<number>(s.turn.responseIds.length).fill(adv[i]!);
    s.returns = [rtg[i]!];
  });
}

/**
 * Per-agent normalisation over every advantage entry of the batch (per token for MARFT-T, per action
 * otherwise), for the agents in `opts.only` (all when absent); the others keep their raw advantages.
 * `opts.scale` false: centre only. Returns the agents whose advantages were degenerate (left at zero).
 */
export function normalizeSteps(
  allSteps: Step[],
  perToken: boolean,
  opts: { only?: ReadonlySet<string>; scale?: boolean } = {},
): string[] {
  const { only, scale } = opts;
  const steps = only ? allSteps.filter((s) => only.has(s.turn.agent)) : allSteps;
  const values: number[] = [];
  const agents: string[] = [];
  for (const s of steps) {
    if (perToken) {
      for (const a of s.advantages) {
        values.push(a);
        agents.push(s.turn.agent);
      }
    } else {
      values.push(s.advantages[0] ?? 0);
      agents.push(s.turn.agent);
    }
  }
  const { advantages, zeroAgents } = normalizePerAgent(values, agents, { scale });
  let i = 0;
  for (const s of steps) {
    if (perToken) {
      s.advantages = s.advantages.map(() => advantages[i++]!);
    } else {
      const a = advantages[i++]!;
      s.advantages = s.advantages.map(() => a);
    }
  }
  return zeroAgents;
}

/** Raw advantage entries with their agent (one per action, or per token for MARFT-T). */
export function advantageEntries(
  steps: readonly Step[],
  perToken: boolean,
): { adv: number[]; agents: string[] } {
  const adv: number[] = [];
  const agents: string[] = [];
  for (const s of steps) {
    const xs = perToken ? s.advantages : [s.advantages[0] ?? 0];
    for (const a of xs) {
      adv.push(a);
      agents.push(s.turn.agent);
    }
  }
  return { adv, agents };
}

// ---------------------------------------------------------------------------------------------------
// engine data (Datum: per-token arrays aligned with tokens; entry i is token i predicted from tokens[:i])

export interface PolicyDatum {
  tokens: number[];
  weights: number[];
  old_logprobs: number[];
  advantages: number[];
}

/** prompt + response; weight 1 on the response tokens; the sampler's log-probs and the advantages there. */
export function policyDatum(s: Step): PolicyDatum {
  const P = s.turn.promptIds.length;
  const L = s.turn.responseIds.length;
  const old = s.oldLogprobs ?? s.turn.logprobs;
  if (old.length !== L) {
    throw new Error(`turn of agent ${s.turn.agent}: ${old.length} log-probs for ${L} response tokens`);
  }
  const zeros = new Array<number>(P).fill(0);
  return {
    tokens: [...s.turn.promptIds, ...s.turn.responseIds],
    weights: [...zeros, ...new Array<number>(L).fill(1)],
    old_logprobs: [...zeros, ...old],
    advantages: [...zeros, ...s.advantages],
  };
}

export interface ValueDatum {
  tokens: number[];
  weights: number[];
  returns: number[];
  old_values: number[];
}

/**
 * Critic targets. The engine's values[i] is V(tokens[:i+1]) (the head reads position i).
 * MARFT-A: V(o) = values[P-1], the last prompt token; one weighted position.
 * MARFT-T: the state before action token j is tokens[:P+j], i.e. values[P+j-1], j = 0..L-1.
 */
export function valueDatum(s: Step, perToken: boolean): ValueDatum {
  const P = s.turn.promptIds.length;
  if (!perToken) {
    const tokens = s.turn.promptIds;
    const weights = new Array<number>(P).fill(0);
    const returns = new Array<number>(P).fill(0);
    const old = new Array<number>(P).fill(0);
    weights[P - 1] = 1;
    returns[P - 1] = s.returns[0]!;
    old[P - 1] = s.value;
    return { tokens: [...tokens], weights, returns, old_values: old };
  }
  const L = s.turn.responseIds.length;
  const tokens = [...s.turn.promptIds, ...s.turn.responseIds];
  const n = tokens.length;
  const weights = new Array<number>(n).fill(0);
  const returns = new Array<number>(n).fill(0);
  const old = new Array<number>(n).fill(0);
  for (let j = 0; j < L; j++) {
    weights[P + j - 1] = 1;
    returns[P + j - 1] = s.returns[j]!;
    old[P + j - 1] = s.tokenValues[j]!;
  }
  return { tokens, weights, returns, old_values: old };
}

/** Read the critic's values for a step from a forward over prompt + response. */
export function assignValues(s: Step, values: readonly number[]): void {
  const P = s.turn.promptIds.length;
  const L = s.turn.responseIds.length;
  s.value = values[P - 1]!;
  s.tokenValues = Array.from({ length: L }, (_, j) => values[P + j - 1]!);
  s.finalValue = values[P + L - 1]!;
}
