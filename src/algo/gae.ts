// Generalized advantage estimation for a team of LLM agents (DESIGN §4).
//
// MARFT-A treats each agent's whole response as ONE decision step: the episode is the sequence of
// actions in the order they were taken (ties in topological order), and a single centralized critic
// scores the acting agent's observation before each action. On a sequential team this is exactly the
// reference implementation's "agent chain" (agent i bootstraps from agent i+1, the last agent from the
// next step's first agent); tests/oracles/reference-gae.ts is a literal port of that loop, so a test
// proves the equivalence instead of asserting it.
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
