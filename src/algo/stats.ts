// Statistics for logging and evaluation: explained variance of the critic, accuracy with a 95%
// confidence interval, tests that say whether a change is more than chance, and unbiased pass@k.
import { chiSquareSurvival, studentTCdf, studentTQuantile } from "./distributions.ts";

/** Arithmetic mean; NaN for an empty array (as numpy). */
export function mean(xs: readonly number[]): number {
  if (xs.length === 0) return Number.NaN;
  return xs.reduce((s, x) => s + x, 0) / xs.length;
}

/** Standard deviation with divisor n − ddof (ddof = 0: population, the default, as numpy). */
export function std(xs: readonly number[], ddof = 0): number {
  const n = xs.length;
  if (n - ddof <= 0) return Number.NaN;
  const m = mean(xs);
  return Math.sqrt(xs.reduce((s, x) => s + (x - m) ** 2, 0) / (n - ddof));
}

/**
 * Explained variance of the critic: 1 − Var(returns − values) / Var(returns).
 * 1: perfect; 0: no better than predicting the mean return; < 0: worse than that.
 * NaN when the returns have no variance (nothing to explain), as in CleanRL.
 *   values [B], returns [B]
 */
export function explainedVariance(values: readonly number[], returns: readonly number[]): number {
  if (values.length !== returns.length) {
    throw new Error(
      `explainedVariance: values and returns must have the same length, got ${values.length} and ${returns.length}`,
    );
  }
  const varY = std(returns) ** 2;
  if (!(varY > 0)) return Number.NaN;
  const residual = returns.map((r, i) => r - values[i]!);
  return 1 - std(residual) ** 2 / varY;
}

/**
 * Wilson score interval for a binomial proportion: unlike the normal approximation it stays inside
 * [0, 1] and behaves at 0/n and n/n. z = 1.96 gives 95%. n = 0 gives [0, 1] (nothing is known).
 */
export function wilsonInterval(successes: number, n: number, z = 1.959963984540054): [number, number] {
  if (!(Number.isInteger(n) && n >= 0))
    throw new Error(`wilsonInterval: n must be an integer >= 0, got ${n}`);
  if (!(Number.isInteger(successes) && successes >= 0 && successes <= n)) {
    throw new Error(`wilsonInterval: successes must be an integer in [0, n = ${n}], got ${successes}`);
  }
  if (n === 0) return [0, 1];
  const p = successes / n;
  const z2 = z * z;
  const denom = 1 + z2 / n;
  const center = (p + z2 / (2 * n)) / denom;
  const half = (z * Math.sqrt((p * (1 - p)) / n + z2 / (4 * n * n))) / denom;
  // At 0/n and n/n the bound is exactly 0 (resp. 1) analytically; avoid a rounding residue there.
  const lo = successes === 0 ? 0 : Math.max(0, center - half);
  const hi = successes === n ? 1 : Math.min(1, center + half);
  return [lo, hi];
}

/** Accuracy over evaluation results with a 95% Wilson interval. */
export function accuracyCi95(correct: readonly boolean[]): {
  accuracy: number;
  ci95: [number, number];
  n: number;
} {
  const n = correct.length;
  if (n === 0) throw new Error("accuracyCi95: no results (n = 0); an accuracy needs at least one problem");
  const c = correct.filter(Boolean).length;
  return { accuracy: c / n, ci95: wilsonInterval(c, n), n };
}

/**
 * Complementary error function, Numerical Recipes' erfcc (Chebyshev fit): fractional error below
 * 1.2e-7 everywhere, which is plenty for p-values.
 */
const ERFC_COEFFS = [
  -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
  -0.82215223, 0.17087277,
];
function erfc(x: number): number {
  const z = Math.abs(x);
  const t = 1 / (1 + 0.5 * z);
  let poly = 0; // Horner: c0 + t·(c1 + t·(c2 + ...))
  for (let i = ERFC_COEFFS.length - 1; i >= 0; i--) poly = ERFC_COEFFS[i]! + t * poly;
  const r = t * Math.exp(-z * z + poly);
  return x >= 0 ? r : 2 - r;
}

/** Standard normal CDF Φ(x). */
export function normalCdf(x: number): number {
  return 0.5 * erfc(-x / Math.SQRT2);
}

/**
 * Two-proportion z-test (pooled), for two INDEPENDENT samples (e.g. two models on different problem
 * sets). z > 0 when a's success rate is higher; p is two-sided. For before/after on the SAME problems
 * use `pairedTest`, which is the right (and more powerful) test there.
 */
export function twoProportionZTest(a: readonly boolean[], b: readonly boolean[]): { z: number; p: number } {
  const na = a.length;
  const nb = b.length;
  if (na === 0 || nb === 0) {
    throw new Error(`twoProportionZTest: both samples need at least one result, got ${na} and ${nb}`);
  }
  const ca = a.filter(Boolean).length;
  const cb = b.filter(Boolean).length;
  const pooled = (ca + cb) / (na + nb);
  const se = Math.sqrt(pooled * (1 - pooled) * (1 / na + 1 / nb));
  if (se === 0) return { z: 0, p: 1 }; // both all-correct or both all-wrong: no evidence of a difference
  const z = (ca / na - cb / nb) / se;
  return { z, p: Math.min(1, 2 * (1 - normalCdf(Math.abs(z)))) };
}

/** log C(n, k) summed term by term (n is an evaluation-set size, so this is cheap). */
function logChoose(n: number, k: number): number {
  let s = 0;
  for (let i = 1; i <= k; i++) s += Math.log(n - k + i) - Math.log(i);
  return s;
}

/**
 * Exact McNemar test (a two-sided sign test on the discordant pairs) for before/after results on the
 * SAME problems: before[i] and after[i] are problem i. Only problems that changed carry information:
 * `improved` went wrong → right, `worsened` right → wrong; under "no change" each is Binomial(m, 1/2)
 * with m = improved + worsened.
 */
export function pairedTest(
  before: readonly boolean[],
  after: readonly boolean[],
): { p: number; improved: number; worsened: number; n: number } {
  if (before.length !== after.length) {
    throw new Error(
      `pairedTest: before and after must score the same problems, got ${before.length} and ${after.length} results`,
    );
  }
  let improved = 0;
  let worsened = 0;
  before.forEach((b, i) => {
    if (!b && after[i]) improved++;
    if (b && !after[i]) worsened++;
  });
  const m = improved + worsened;
  const k = Math.min(improved, worsened);
  // P(X <= k) for X ~ Binomial(m, 1/2), summed in log space so m in the thousands does not underflow.
  const logs: number[] = [];
  for (let i = 0; i <= k; i++) logs.push(logChoose(m, i) - m * Math.LN2);
  const top = Math.max(...logs);
  const tail = Math.exp(top) * logs.reduce((s, l) => s + Math.exp(l - top), 0);
  return { p: Math.min(1, 2 * tail), improved, worsened, n: before.length };
}

/**
 * Unbiased pass@k estimator (Chen et al. 2021): with n samples of which c are correct, the probability
 * that at least one of k samples drawn without replacement is correct: 1 − C(n−c, k) / C(n, k),
 * computed as a product so large n does not overflow.
 */
export function passAtK(n: number, c: number, k: number): number {
  if (!(Number.isInteger(n) && n >= 1)) throw new Error(`passAtK: n must be an integer >= 1, got ${n}`);
  if (!(Number.isInteger(c) && c >= 0 && c <= n)) {
    throw new Error(`passAtK: c must be an integer in [0, n = ${n}], got ${c}`);
  }
  if (!(Number.isInteger(k) && k >= 1 && k <= n)) {
    throw new Error(`passAtK: k must be an integer in [1, n = ${n}], got ${k}`);
  }
  if (n - c < k) return 1;
  let missAll = 1;
  for (let i = n - c + 1; i <= n; i++) missAll *= 1 - k / i;
  return 1 - missAll;
}

// ---------------------------------------------------------------------------------------------------
// Comparing variants (marft compare): a mean over seeds with its t-interval, paired tests between two
// variants, and a goodness-of-fit test (the task scheduler's tests).

const Z95 = 1.959963984540054;

/**
 * Mean of per-seed results with a two-sided 95% t-interval, mean ± t(0.975, n − 1) · s / √n, s the
 * sample standard deviation (divisor n − 1). With one value there is no interval (null): the spread
 * between seeds is unknown, and a single run must not look certain.
 *   xs [S] → { mean, ci95, sd, n }
 */
export function meanInterval(xs: readonly number[]): {
  mean: number;
  ci95: [number, number] | null;
  sd: number;
  n: number;
} {
  const n = xs.length;
  if (n === 0) throw new Error("meanInterval: no values");
  const m = mean(xs);
  if (n < 2) return { mean: m, ci95: null, sd: Number.NaN, n };
  const sd = std(xs, 1);
  const half = (studentTQuantile(0.975, n - 1) * sd) / Math.sqrt(n);
  return { mean: m, ci95: [m - half, m + half], sd, n };
}

/**
 * Paired t-test of b − a (e.g. per-seed accuracies of a variant and of the first variant, seed with
 * seed): t = mean(d) / (s_d / √n) with n − 1 degrees of freedom, two-sided p, and the t-interval of
 * mean(d). Needs n >= 2. All differences equal: p = 1 if they are 0, else 0 (no spread at all).
 *   a [S], b [S]
 */
export function pairedTTest(
  a: readonly number[],
  b: readonly number[],
): { diff: number; ci95: [number, number]; t: number; p: number; n: number } {
  if (a.length !== b.length) throw new Error(`pairedTTest: ${a.length} and ${b.length} values`);
  if (a.length < 2) throw new Error(`pairedTTest: needs at least 2 pairs, got ${a.length}`);
  const d = b.map((x, i) => x - a[i]!);
  const { mean: m, ci95, sd, n } = meanInterval(d);
  if (!(sd > 0))
    return { diff: m, ci95: [m, m], t: m === 0 ? 0 : Math.sign(m) * Infinity, p: m === 0 ? 1 : 0, n };
  const t = m / (sd / Math.sqrt(n));
  return { diff: m, ci95: ci95!, t, p: Math.min(1, 2 * (1 - studentTCdf(Math.abs(t), n - 1))), n };
}

/**
 * Paired difference of two success rates on the SAME problems, b − a: `improved` problems b solved
 * and a did not, `worsened` the reverse; diff = (improved − worsened) / n. The interval is Agresti
 * and Min's (2005): the Wald interval after adding 1/2 to each of the four cells of the 2x2 table
 * (n + 2 pairs), which keeps its coverage near 95% at small counts; p is the exact McNemar test.
 *   a [N], b [N] → diff, ci95, p
 */
export function pairedDifference(
  a: readonly boolean[],
  b: readonly boolean[],
): { diff: number; ci95: [number, number]; p: number; improved: number; worsened: number; n: number } {
  const { p, improved, worsened, n } = pairedTest(a, b);
  if (n === 0) throw new Error("pairedDifference: no pairs");
  const m = n + 2;
  const pi = (improved + 0.5) / m;
  const pw = (worsened + 0.5) / m;
  const d = pi - pw;
  const half = Z95 * Math.sqrt((pi + pw - d * d) / m);
  return {
    diff: (improved - worsened) / n,
    ci95: [Math.max(-1, d - half), Math.min(1, d + half)],
    p,
    improved,
    worsened,
    n,
  };
}

/**
 * Pearson's chi-square goodness of fit of category counts to probabilities:
 * X² = Σ (O − E)² / E with E = N p, df = K − 1 (categories with p = 0 must have no counts).
 *   observed [K], probs [K] (summing to 1)
 */
export function chiSquareGoodnessOfFit(
  observed: readonly number[],
  probs: readonly number[],
): { stat: number; df: number; p: number } {
  if (observed.length !== probs.length || observed.length < 2) {
    throw new Error(`chiSquareGoodnessOfFit: ${observed.length} counts for ${probs.length} probabilities`);
  }
  const total = observed.reduce((s, x) => s + x, 0);
  let stat = 0;
  let k = 0;
  observed.forEach((o, i) => {
    const e = total * probs[i]!;
    if (e === 0) {
      if (o > 0) stat = Infinity;
      return;
    }
    stat += (o - e) ** 2 / e;
    k++;
  });
  const df = k - 1;
  return { stat, df, p: stat === Infinity ? 0 : chiSquareSurvival(stat, df) };
}
