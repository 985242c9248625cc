// Off-policy correction for replayed turns (experience replay) and for the turns an asynchronous
// rollout sampled while the adapter was updating (train.async), decoupled-PPO style (Hilton et al.
// 2022, "Batch size-invariance for policy optimization"), with truncated importance weights as in
// V-trace (Espeholt et al. 2018).
//
// A replayed action y was sampled by an older version of its adapter, the behaviour policy μ. The
// update keeps PPO's clipped surrogate, but around the PROXIMAL policy π_prox, the adapter as it is
// now, before this iteration's optimizer steps (its log-probs come from one forward pass), and
// corrects the data's distribution with a per-token weight:
//
//   L(θ) = − Σ_t w_t · min(r_t A_t, clip(r_t, 1 − ε_low, 1 + ε_high) A_t),
//   r_t = π_θ(y_t | ·) / π_prox(y_t | ·),   w_t = min(c, π_prox(y_t | ·) / μ(y_t | ·)).
//
// w_t does not depend on θ and is >= 0, so w_t · min(r A, clip(r) A) = min(r (w A), clip(r) (w A)):
// the engine's ordinary PPO loss with old log-probs = π_prox and advantages w_t · A_t is this loss
// exactly. Truncating at c bounds the variance a turn that the policy has since made much likelier
// would add (w is biased low there, as V-trace's ρ̄); per-token weights instead of the product over
// the action's tokens keep the variance of long actions bounded, at the price of that bias.

/**
 * Truncated importance weights of one replayed action, per token.
 *   proxLogprobs [L]  log π_prox(y_t | ·), the adapter now (a forward pass)
 *   behaviourLogprobs [L]  log μ(y_t | ·), the sampler's when the turn was played
 *   → w [L],  w_t = min(cap, exp(proxLogprobs_t − behaviourLogprobs_t))
 */
export function truncatedImportanceWeights(
  proxLogprobs: readonly number[],
  behaviourLogprobs: readonly number[],
  cap: number,
): number[] {
  if (proxLogprobs.length !== behaviourLogprobs.length) {
    throw new Error(
      `truncatedImportanceWeights: ${proxLogprobs.length} proximal and ${behaviourLogprobs.length} behaviour log-probs`,
    );
  }
  if (!(cap > 0)) throw new Error(`truncatedImportanceWeights: cap must be positive, got ${cap}`);
  return proxLogprobs.map((lp, t) => Math.min(cap, Math.exp(lp - behaviourLogprobs[t]!)));
}

/**
 * Decoupled PPO's behaviour weights with AReaL's cap, per token: the untruncated ratio where it is at
 * most `cap`, and 0 (the token is left out) where the policy has moved further from the sampler:
 * unbiased where kept, instead of truncation's bias towards tokens that became less likely.
 *   proxLogprobs [L], behaviourLogprobs [L] → w [L],  w_t = r_t if r_t <= cap else 0,
 *   r_t = exp(proxLogprobs_t − behaviourLogprobs_t)
 */
export function cappedImportanceWeights(
  proxLogprobs: readonly number[],
  behaviourLogprobs: readonly number[],
  cap: number,
): number[] {
  // the same checks and ratios as truncation; a ratio above the cap is what differs
  const truncated = truncatedImportanceWeights(proxLogprobs, behaviourLogprobs, Number.POSITIVE_INFINITY);
  if (!(cap > 0)) throw new Error(`cappedImportanceWeights: cap must be positive, got ${cap}`);
  return truncated.map((r) => (r <= cap ? r : 0));
}

/**
 * Advantages of a replayed action scaled by its weights.
 *   advantages [1] (one per action, broadcast) or [L] (per token), weights [L] → [L]
 */
export function weightedAdvantages(advantages: readonly number[], weights: readonly number[]): number[] {
  const L = weights.length;
  if (advantages.length !== 1 && advantages.length !== L) {
    throw new Error(`weightedAdvantages: ${advantages.length} advantages for ${L} tokens`);
  }
  return weights.map((w, t) => w * (advantages.length === 1 ? advantages[0]! : advantages[t]!));
}
