// Credit assignment (DESIGN §4): from a batch of actions with their rewards (and the critic's values)
// to advantages and critic targets. Pure functions, no I/O; they return new arrays and mutate nothing.
//
// The three estimators share one signature and are chosen from one table (`ESTIMATORS`), in the style
// of verl's advantage estimators. Whether credit is per action or per token is carried by the result
// (`Credit.level`), not by flags passed around:
//   marft-a      level "action": one advantage per action (broadcast to its tokens by the update),
//                the critic trained at the observation (the last prompt token).
//   marft-t      level "token": one advantage per action token, the critic trained at the state
//                before each action token.
//   critic-free  level "action": the group-relative return, no critic.
import { groupRelative } from "./baselines.ts";
import { actionGae, tokenGae } from "./gae.ts";
import { normalizePerAgent } from "./normalize.ts";

/** One action of the batch, as credit assignment sees it. */
export interface CreditStep {
  /** The episode it belongs to; a batch lists its actions episode by episode, in the order taken. */
  episode: number;
  /** Episodes of one group sampled the same task (group-relative baselines). */
  group: number;
  agent: string;
  /** The reward credited to this action (routed outcome reward plus the env's per-action rewards). */
  reward: number;
  /** Tokens of the acting agent's observation (P) and of its action (L). */
  promptLength: number;
  responseLength: number;
}

export interface CreditBatch {
  steps: readonly CreditStep[];
  /** Episodes cut off by a limit (truncated, not terminated): GAE bootstraps from the critic there. */
  cutOff: ReadonlySet<number>;
  /**
   * Per step, the critic's values over its prompt and response [P + L]: values[i] = V(tokens[: i + 1]),
   * so V(o) = values[P - 1], the state before action token j is values[P + j - 1], and the state after
   * the action is values[P + L - 1]. Null without a critic.
   */
  values: ReadonlyArray<readonly number[]> | null;
}

export interface CreditParams {
  gamma: number;
  lambda: number;
  /** critic-free: divide by the group's reward std too. */
  groupStd: boolean;
}

/**
 * Per step: `advantages` ([1] at level "action", [L] at level "token"), and the critic's regression
 * targets `returns` with the values they were computed from (`values`, for value clipping and the
 * explained variance), of the same length (empty arrays without a critic).
 */
export interface Credit {
  level: "action" | "token";
  advantages: number[][];
  returns: number[][];
  values: number[][];
}

export type Estimator = (batch: CreditBatch, p: CreditParams) => Credit;

/** The steps of each episode, in action order, with their indices in the batch. */
function byEpisode(steps: readonly CreditStep[]): number[][] {
  const m = new Map<number, number[]>();
  steps.forEach((s, i) => {
    const list = m.get(s.episode);
    if (list) list.push(i);
    else m.set(s.episode, [i]);
  });
  return [...m.values()];
}

function needValues(batch: CreditBatch, estimator: string): ReadonlyArray<readonly number[]> {
  if (batch.values === null) throw new Error(`${estimator}: needs the critic's values`);
  return batch.values;
}

/** V after an episode's last action when it was cut off, else 0 (nothing follows a terminated episode). */
function bootstrapValue(batch: CreditBatch, values: ReadonlyArray<readonly number[]>, last: number): number {
  const s = batch.steps[last]!;
  return batch.cutOff.has(s.episode) ? values[last]![s.promptLength + s.responseLength - 1]! : 0;
}

/** MARFT-A: one GAE step per action over each episode's actions, V(o) from the last prompt token. */
export const marftA: Estimator = (batch, p) => {
  const values = needValues(batch, "marft-a");
  const n = batch.steps.length;
  const credit: Credit = {
    level: "action",
    advantages: new Array(n),
    returns: new Array(n),
    values: new Array(n),
  };
  for (const idx of byEpisode(batch.steps)) {
    const v = idx.map((i) => values[i]![batch.steps[i]!.promptLength - 1]!);
    const r = actionGae(
      idx.map((i) => batch.steps[i]!.reward),
      v,
      bootstrapValue(batch, values, idx[idx.length - 1]!),
      p.gamma,
      p.lambda,
    );
    idx.forEach((i, j) => {
      credit.advantages[i] = [r.advantages[j]!];
      credit.returns[i] = [r.returns[j]!];
      credit.values[i] = [v[j]!];
    });
  }
  return credit;
};

/** MARFT-T: GAE over each episode's action tokens, V at the state before each token. */
export const marftT: Estimator = (batch, p) => {
  const values = needValues(batch, "marft-t");
  const n = batch.steps.length;
  const credit: Credit = {
    level: "token",
    advantages: new Array(n),
    returns: new Array(n),
    values: new Array(n),
  };
  for (const idx of byEpisode(batch.steps)) {
    const turns = idx.map((i) => {
      const s = batch.steps[i]!;
      const P = s.promptLength;
      return {
        values: Array.from({ length: s.responseLength }, (_, j) => values[i]![P + j - 1]!),
        reward: s.reward,
      };
    });
    const r = tokenGae(turns, bootstrapValue(batch, values, idx[idx.length - 1]!), p.gamma, p.lambda);
    idx.forEach((i, j) => {
      credit.advantages[i] = r.advantages[j]!;
      credit.returns[i] = r.returns[j]!;
      credit.values[i] = turns[j]!.values;
    });
  }
  return credit;
};

/**
 * Critic-free: each action's discounted return-to-go minus the mean of the same agent's over the
 * episodes of the same group (GRPO's baseline, kept per agent).
 */
export const criticFree: Estimator = (batch, p) => {
  const n = batch.steps.length;
  const rtg = new Array<number>(n);
  const keys = new Array<number>(n);
  const agentIds = new Map<string, number>();
  for (const idx of byEpisode(batch.steps)) {
    let G = 0;
    for (let j = idx.length - 1; j >= 0; j--) {
      G = batch.steps[idx[j]!]!.reward + p.gamma * G;
      rtg[idx[j]!] = G;
    }
  }
  batch.steps.forEach((s, i) => {
    if (!agentIds.has(s.agent)) agentIds.set(s.agent, agentIds.size);
    keys[i] = s.group * 1_000_003 + agentIds.get(s.agent)!;
  });
  const adv = groupRelative(rtg, keys, { std: p.groupStd });
  return {
    level: "action",
    advantages: adv.map((a) => [a]),
    returns: batch.steps.map(() => []),
    values: batch.steps.map(() => []),
  };
};

export const ESTIMATORS = { "marft-a": marftA, "marft-t": marftT, "critic-free": criticFree } as const;
export type EstimatorName = keyof typeof ESTIMATORS;

/**
 * Per-agent normalisation over every advantage entry of the batch (per action, or per token at level
 * "token"), for the agents in `only` (all when absent); the others keep their raw advantages.
 * `scale` false: centre only. Returns the new advantages and the agents whose advantages were
 * degenerate (left at zero).
 */
export function normalizeCredit(
  advantages: readonly (readonly number[])[],
  agents: readonly string[],
  opts: { only?: ReadonlySet<string>; scale?: boolean } = {},
): { advantages: number[][]; zeroAgents: string[] } {
  const chosen = agents.map((a) => opts.only === undefined || opts.only.has(a));
  const flat: number[] = [];
  const flatAgents: string[] = [];
  advantages.forEach((xs, i) => {
    if (!chosen[i]) return;
    for (const x of xs) {
      flat.push(x);
      flatAgents.push(agents[i]!);
    }
  });
  const { advantages: normed, zeroAgents } = normalizePerAgent(flat, flatAgents, { scale: opts.scale });
  let k = 0;
  const out = advantages.map((xs, i) => (chosen[i] ? xs.map(() => normed[k++]!) : [...xs]));
  return { advantages: out, zeroAgents };
}
