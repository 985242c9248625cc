// Reference implementations of the PPO and value losses on plain arrays (DESIGN §4), a test oracle:
// tests/ppo-engine.test.ts sends fixed data to the real engine's forward_backward and checks that
// the loss and statistics it reports equal these, computed from the engine's own forward pass.
//
// Conventions (as the engine): per-token arrays are aligned with a datum's tokens; `weights` is 1 on
// action tokens and 0 elsewhere (position 0 always 0). One call = one list of data; the loss is
// aggregated over the whole call.

export interface PpoDatum {
  /** [T] log-probs under the current policy */
  logprobs: readonly number[];
  /** [T] log-probs under the policy that sampled */
  oldLogprobs: readonly number[];
  /** [T] advantage per token (an action's advantage broadcast to its tokens for MARFT-A) */
  advantages: readonly number[];
  /** [T] 1 on action tokens */
  weights: readonly number[];
  /** [T] entropy of the predictive distribution, needed when entropyCoef != 0 */
  entropies?: readonly number[];
  /** [T] reference-policy log-probs, needed when klCoef > 0 */
  refLogprobs?: readonly number[];
}

export interface PpoOptions {
  clipLow: number;
  clipHigh: number;
  entropyCoef: number;
  klCoef: number;
  klEstimator: "k1" | "k2" | "k3";
  /** token: a ratio per token; sequence: one ratio per datum from the action's log-prob */
  ratio: "token" | "sequence";
  /** for ratio = sequence: the action log-prob is the weighted token sum or mean */
  sequenceLogprob: "sum" | "mean";
  /** token-mean: Σ w·x / Σ w over the call; token-sum: Σ w·x / number of data */
  aggregation: "token-mean" | "token-sum";
}

export const DEFAULT_PPO: PpoOptions = {
  clipLow: 0.2,
  clipHigh: 0.2,
  entropyCoef: 0,
  klCoef: 0,
  klEstimator: "k3",
  ratio: "token",
  sequenceLogprob: "sum",
  aggregation: "token-mean",
};

function checkAligned(fn: string, k: number, d: Record<string, readonly number[] | undefined>): number {
  const T = d["weights"]!.length;
  for (const [name, xs] of Object.entries(d)) {
    if (xs !== undefined && xs.length !== T) {
      throw new Error(`${fn}: data[${k}].${name} has ${xs.length} entries, expected ${T} (one per token)`);
    }
  }
  return T;
}

function normaliser(data: ReadonlyArray<{ weights: readonly number[] }>, aggregation: string): number {
  if (aggregation === "token-sum") return data.length;
  const total = data.reduce((s, d) => s + d.weights.reduce((a, w) => a + w, 0), 0);
  return Math.max(total, 1e-8);
}

/** Per-token KL(policy ‖ reference) estimate from the policy's samples (Schulman's k1/k2/k3). */
export function klEstimate(logp: number, refLogp: number, estimator: "k1" | "k2" | "k3"): number {
  const logRatio = refLogp - logp; // log(ref / policy)
  if (estimator === "k1") return -logRatio;
  if (estimator === "k2") return 0.5 * logRatio ** 2;
  return Math.exp(logRatio) - logRatio - 1;
}

/**
 * Clipped surrogate: per token −min(ρ·A, clip(ρ, 1 − clipLow, 1 + clipHigh)·A), minus the entropy
 * bonus, plus the KL penalty, aggregated over the call's weighted tokens.
 * Stats are weighted token means: clipfrac (the clipped branch is the active one), approxKl
 * (E[(ρ − 1) − log ρ], the k3 estimate of KL(old ‖ new)), ratioMean, entropy, klRef.
 */
export function ppoLoss(
  data: readonly PpoDatum[],
  options: Partial<PpoOptions> = {},
): { loss: number; clipfrac: number; approxKl: number; ratioMean: number; entropy: number; klRef: number } {
  const o = { ...DEFAULT_PPO, ...options };
  const fn = "ppoLoss";
  const norm = normaliser(data, o.aggregation);
  let loss = 0;
  let wTotal = 0;
  let clipped = 0;
  let approxKl = 0;
  let ratioSum = 0;
  let entropy = 0;
  let klRef = 0;
  data.forEach((d, k) => {
    const T = checkAligned(fn, k, {
      logprobs: d.logprobs,
      oldLogprobs: d.oldLogprobs,
      advantages: d.advantages,
      weights: d.weights,
      entropies: d.entropies,
      refLogprobs: d.refLogprobs,
    });
    if (o.entropyCoef !== 0 && !d.entropies)
      throw new Error(`${fn}: data[${k}].entropies needed for entropyCoef`);
    if (o.klCoef > 0 && !d.refLogprobs) throw new Error(`${fn}: data[${k}].refLogprobs needed for klCoef`);
    // The sequence-level log-ratio: one number per datum from the action's log-prob.
    let seqLogRatio = 0;
    if (o.ratio === "sequence") {
      let wSum = 0;
      for (let t = 0; t < T; t++) {
        seqLogRatio += (d.logprobs[t]! - d.oldLogprobs[t]!) * d.weights[t]!;
        wSum += d.weights[t]!;
      }
      if (o.sequenceLogprob === "mean") seqLogRatio /= Math.max(wSum, 1e-8);
    }
    for (let t = 0; t < T; t++) {
      const w = d.weights[t]!;
      const logRatio = o.ratio === "sequence" ? seqLogRatio : d.logprobs[t]! - d.oldLogprobs[t]!;
      const ratio = Math.exp(logRatio);
      const a = d.advantages[t]!;
      const unclipped = ratio * a;
      const clippedObj = Math.min(Math.max(ratio, 1 - o.clipLow), 1 + o.clipHigh) * a;
      let perToken = -Math.min(unclipped, clippedObj);
      if (o.entropyCoef !== 0) perToken -= o.entropyCoef * d.entropies![t]!;
      let kl = 0;
      if (d.refLogprobs) {
        kl = klEstimate(d.logprobs[t]!, d.refLogprobs[t]!, o.klEstimator);
        if (o.klCoef > 0) perToken += o.klCoef * kl;
      }
      loss += (w * perToken) / norm;
      wTotal += w;
      if (clippedObj < unclipped) clipped += w;
      approxKl += w * (ratio - 1 - logRatio);
      ratioSum += w * ratio;
      entropy += w * (d.entropies?.[t] ?? 0);
      klRef += w * kl;
    }
  });
  const per = (x: number) => (wTotal > 0 ? x / wTotal : 0);
  return {
    loss,
    clipfrac: per(clipped),
    approxKl: per(approxKl),
    ratioMean: per(ratioSum),
    entropy: per(entropy),
    klRef: per(klRef),
  };
}

export interface ValueDatum {
  /** [T] the critic's current predictions */
  values: readonly number[];
  /** [T] targets (GAE returns) */
  returns: readonly number[];
  /** [T] predictions at sampling time, for clipping */
  oldValues?: readonly number[];
  /** [T] 1 where the value is trained */
  weights: readonly number[];
}

/** Huber loss: quadratic within ±delta, linear outside (robust to the occasional huge return). */
export function huber(x: number, delta: number): number {
  const a = Math.abs(x);
  return a <= delta ? 0.5 * x * x : delta * (a - 0.5 * delta);
}

/**
 * PPO-style clipped value loss: per token max(l(v − R), l(v_clip − R)) with
 * v_clip = old + clamp(v − old, ±clip) and l = ½x² (mse) or Huber; aggregated as ppoLoss.
 * clipfrac: weighted fraction of tokens where the clipped branch is the larger one.
 */
export function valueLoss(
  data: readonly ValueDatum[],
  options: {
    loss?: "mse" | "huber";
    huberDelta?: number;
    clip?: number | null;
    aggregation?: "token-mean" | "token-sum";
  } = {},
): { loss: number; clipfrac: number } {
  const kind = options.loss ?? "mse";
  const delta = options.huberDelta ?? 10;
  const clip = options.clip === undefined ? 0.2 : options.clip;
  const norm = normaliser(data, options.aggregation ?? "token-mean");
  const err = (x: number) => (kind === "mse" ? 0.5 * x * x : huber(x, delta));
  let loss = 0;
  let wTotal = 0;
  let active = 0;
  data.forEach((d, k) => {
    const T = checkAligned("valueLoss", k, {
      values: d.values,
      returns: d.returns,
      oldValues: d.oldValues,
      weights: d.weights,
    });
    for (let t = 0; t < T; t++) {
      const w = d.weights[t]!;
      let perToken = err(d.values[t]! - d.returns[t]!);
      if (clip !== null && d.oldValues) {
        const old = d.oldValues[t]!;
        const vClip = old + Math.min(Math.max(d.values[t]! - old, -clip), clip);
        const c = err(vClip - d.returns[t]!);
        if (c > perToken) {
          active += w;
          perToken = c;
        }
      }
      loss += (w * perToken) / norm;
      wTotal += w;
    }
  });
  return { loss, clipfrac: wTotal > 0 ? active / wTotal : 0 };
}
