// Generalized advantage estimation for a team of LLM agents (DESIGN §4).
//
// MARFT-A treats each agent's whole response as ONE decision step: the episode is the sequence of
// actions in the order they were taken (ties in topological order), and a single centralized critic
// scores the acting agent's observation before each action. On a sequential team this is exactly the
// reference implementation's "agent chain" (agent i bootstraps from agent i+1, the last agent from the
// next step's first agent); `referenceAgentChainGae` is a literal port of that loop so a test can
// prove the equivalence instead of asserting it.
//
// MARFT-T makes every action token a step; observation tokens and other agents' text are not steps.

export interface GaeResult {
  /** [K] one advantage per step */
  advantages: number[];
  /** [K] advantage + value: the critic's regression target */
  returns: number[];
}

function checkGaeParams(fn: string, gamma: number, lambda: number): void {
  if (!(Number.isFinite(gamma) && gamma >= 0 && gamma <= 1)) {
    throw new Error(`${fn}: gamma must be a number in [0, 1], got ${gamma}`);
  }
  if (!(Number.isFinite(lambda) && lambda >= 0 && lambda <= 1)) {
    throw new Error(`${fn}: lambda must be a number in [0, 1], got ${lambda}`);
  }
}

function checkFinite(fn: string, name: string, xs: readonly number[]): void {
  for (let i = 0; i < xs.length; i++) {
    if (!Number.isFinite(xs[i]))
      throw new Error(`${fn}: ${name}[${i}] must be a finite number, got ${xs[i]}`);
  }
}

/**
 * MARFT-A: action-level GAE over ONE episode's K actions, in the order they were taken.
 *
 *   rewards   [K]  reward credited to action k (see rewards.ts for routing)
 *   values    [K]  V(o_k): the centralized critic's value of the acting agent's observation
 *   bootstrap      V of the observation after the last action: 0 if the episode terminated, the
 *                  critic's value of the last state if it was truncated (cut off by a limit)
 *
 *   δ_k = r_k + γ·V_{k+1} − V_k          (V_K = bootstrap)
 *   A_k = δ_k + γλ·A_{k+1}               (A_K = 0)
 *   returns_k = A_k + V_k
 *
 * The action's advantage is later broadcast to all of its tokens by the trainer.
 */
export function actionGae(
  rewards: readonly number[],
  values: readonly number[],
  bootstrap: number,
  gamma: number,
  lambda: number,
): GaeResult {
  const fn = "actionGae";
  checkGaeParams(fn, gamma, lambda);
  if (rewards.length !== values.length) {
    throw new Error(
      `${fn}: rewards and values must have one entry per action, got ${rewards.length} rewards and ${values.length} values`,
    );
  }
  checkFinite(fn, "rewards", rewards);
  checkFinite(fn, "values", values);
  if (!Number.isFinite(bootstrap))
    throw new Error(`${fn}: bootstrap must be a finite number, got ${bootstrap}`);

  const K = rewards.length;
  const advantages = new Array<number>(K);
  const returns = new Array<number>(K);
  let nextValue = bootstrap;
  let gae = 0;
  for (let k = K - 1; k >= 0; k--) {
    const delta = rewards[k]! + gamma * nextValue - values[k]!;
    gae = delta + gamma * lambda * gae;
    advantages[k] = gae;
    returns[k] = gae + values[k]!;
    nextValue = values[k]!;
  }
  return { advantages, returns };
}

/**
 * A literal port of the MARFT reference's action-level GAE (ActionBuffer.compute_gae_and_returns),
 * for ONE rollout thread. Kept only to test that `actionGae` reproduces it; the trainer never calls it.
 *
 *   rewards [T][N]    reward of agent i at step t
 *   values  [T+1][N]  V(o_t^i); values[T][0] is the bootstrap value (the reference's next_value)
 *   masks   [T+1][N]  1 − done, as the reference stores it: masks[t+1] is 0 when the episode ended at
 *                     step t (and the buffer auto-reset into a new episode at t+1)
 *
 *   agent i < N−1: δ = r_t^i + γ·V(o_t^{i+1})·m_t^{i+1} − V(o_t^i);  A = δ + γλ·m_t^{i+1}·A
 *   agent N−1:     δ = r_t^n + γ·V(o_{t+1}^0)·m_{t+1}^0 − V(o_t^n);  A = δ + γλ·m_{t+1}^0·A
 *
 * Note the reference's quirk: the within-step link uses masks[t] (the mask of the START of step t), so
 * in the first step after an auto-reset the chain between agents of the same step is cut as well.
 * `actionGae` never cuts inside an episode; the two agree on every buffer whose within-step masks are
 * 1, which is what a single episode (or a buffer holding whole episodes from t = 0) looks like.
 */
export function referenceAgentChainGae(
  rewards: readonly (readonly number[])[],
  values: readonly (readonly number[])[],
  masks: readonly (readonly number[])[],
  gamma: number,
  lambda: number,
): { advantages: number[][]; returns: number[][] } {
  const fn = "referenceAgentChainGae";
  checkGaeParams(fn, gamma, lambda);
  const T = rewards.length;
  const N = T > 0 ? rewards[0]!.length : 0;
  if (values.length !== T + 1 || masks.length !== T + 1) {
    throw new Error(
      `${fn}: values and masks need T+1 = ${T + 1} rows (one extra for the bootstrap), got ${values.length} and ${masks.length}`,
    );
  }
  for (let t = 0; t <= T; t++) {
    if ((t < T && rewards[t]!.length !== N) || values[t]!.length !== N || masks[t]!.length !== N) {
      throw new Error(`${fn}: row ${t} must have one entry per agent (N = ${N})`);
    }
  }
  const advantages = rewards.map((row) => row.map(() => 0));
  const returns = rewards.map((row) => row.map(() => 0));
  let gae = 0;
  for (let step = T - 1; step >= 0; step--) {
    for (let agent = N - 1; agent >= 0; agent--) {
      const v = values[step]![agent]!;
      if (agent === N - 1) {
        const m = masks[step + 1]![0]!;
        const delta = rewards[step]![agent]! + gamma * values[step + 1]![0]! * m - v;
        gae = delta + gamma * lambda * m * gae;
      } else {
        const m = masks[step]![agent + 1]!;
        const delta = rewards[step]![agent]! + gamma * values[step]![agent + 1]! * m - v;
        gae = delta + gamma * lambda * m * gae;
      }
      returns[step]![agent] = v + gae;
      advantages[step]![agent] = gae;
    }
  }
  return { advantages, returns };
}

/**
 * GAE over a token sequence in which only some positions are steps (mask = true: tokens the policy
 * wrote). Unmasked positions (observation tokens, other agents' text) are skipped entirely: they are
 * neither a step nor a value to bootstrap from, and get advantage 0 and return 0.
 *
 *   values  [L]  critic value at each position (ignored where mask is false)
 *   rewards [L]  reward at each position (must be 0 where mask is false: a reward on a token the
 *                policy did not write would be silently lost)
 *   mask    [L]
 */
export function maskedGae(
  values: readonly number[],
  rewards: readonly number[],
  mask: readonly boolean[],
  bootstrap: number,
  gamma: number,
  lambda: number,
): GaeResult {
  const fn = "maskedGae";
  if (values.length !== rewards.length || values.length !== mask.length) {
    throw new Error(
      `${fn}: values, rewards and mask must have the same length, got ${values.length}, ${rewards.length}, ${mask.length}`,
    );
  }
  const idx: number[] = [];
  for (let i = 0; i < mask.length; i++) {
    if (mask[i]) idx.push(i);
    else if (rewards[i] !== 0) {
      throw new Error(`${fn}: rewards[${i}] = ${rewards[i]} falls on a masked-out token and would be lost`);
    }
  }
  const inner = actionGae(
    idx.map((i) => rewards[i]!),
    idx.map((i) => values[i]!),
    bootstrap,
    gamma,
    lambda,
  );
  const advantages = new Array<number>(mask.length).fill(0);
  const returns = new Array<number>(mask.length).fill(0);
  idx.forEach((i, j) => {
    advantages[i] = inner.advantages[j]!;
    returns[i] = inner.returns[j]!;
  });
  return { advantages, returns };
}

/**
 * MARFT-T: token-level GAE over ONE episode. Each turn lists the critic's values at its ACTION tokens
 * only (the tokens its agent wrote); the turn's reward sits on its last token. GAE runs over the
 * concatenation of all turns' action tokens in the order taken, so the last token of a turn
 * bootstraps from the first action token of the next turn (whoever wrote it), and the last token of
 * the episode from `bootstrap` (0 if terminated).
 *
 *   turns[k].values [L_k]  →  advantages[k] [L_k], returns[k] [L_k]
 */
export function tokenGae(
  turns: ReadonlyArray<{ values: readonly number[]; reward: number }>,
  bootstrap: number,
  gamma: number,
  lambda: number,
): { advantages: number[][]; returns: number[][] } {
  const values: number[] = [];
  const rewards: number[] = [];
  turns.forEach((turn, k) => {
    if (turn.values.length === 0) {
      throw new Error(`tokenGae: turns[${k}] has no action tokens, so its reward ${turn.reward} has no step`);
    }
    for (let j = 0; j < turn.values.length; j++) {
      values.push(turn.values[j]!);
      rewards.push(j === turn.values.length - 1 ? turn.reward : 0);
    }
  });
  const flat = actionGae(rewards, values, bootstrap, gamma, lambda);
  const advantages: number[][] = [];
  const returns: number[][] = [];
  let offset = 0;
  for (const turn of turns) {
    const L = turn.values.length;
    advantages.push(flat.advantages.slice(offset, offset + L));
    returns.push(flat.returns.slice(offset, offset + L));
    offset += L;
  }
  return { advantages, returns };
}
