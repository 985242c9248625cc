// A literal port of the MARFT reference's action-level GAE, a test oracle: tests/algo.test.ts shows
// that `actionGae` (src/algo/gae.ts) reproduces it. The trainer never calls it.

function checkGaeParams(fn: string, gamma: number, lambda: number): void {
  if (!(Number.isFinite(gamma) && gamma >= 0 && gamma <= 1)) {
    throw new Error(`${fn}: gamma must be a number in [0, 1], got ${gamma}`);
  }
  if (!(Number.isFinite(lambda) && lambda >= 0 && lambda <= 1)) {
    throw new Error(`${fn}: lambda must be a number in [0, 1], got ${lambda}`);
  }
}

/**
 * A literal port of the MARFT reference's action-level GAE (ActionBuffer.compute_gae_and_returns),
 * for ONE rollout thread.
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
