// The distribution functions the comparison statistics need (Student's t for intervals of a mean
// over seeds and paired t-tests, chi-square for goodness of fit): regularized incomplete beta and
// gamma functions, evaluated as in Numerical Recipes (Lentz continued fractions, series), accurate
// to about 1e-10 where p-values and 95% quantiles are read. No dependency: these are ~100 lines.

const LANCZOS = [
  676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059, 12.507343278686905,
  -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7,
];

/** log Γ(x) for x > 0 (Lanczos, g = 7, n = 9: relative error about 1e-15). */
export function logGamma(x: number): number {
  if (!(x > 0)) throw new Error(`logGamma: expected x > 0, got ${x}`);
  if (x < 0.5) return Math.log(Math.PI / Math.sin(Math.PI * x)) - logGamma(1 - x); // reflection
  const z = x - 1;
  let a = 0.99999999999980993;
  const t = z + 7.5;
  LANCZOS.forEach((c, i) => {
    a += c / (z + i + 1);
  });
  return 0.5 * Math.log(2 * Math.PI) + (z + 0.5) * Math.log(t) - t + Math.log(a);
}

const EPS = 1e-15;
const TINY = 1e-300;

/** Continued fraction of the incomplete beta function (modified Lentz), NR's betacf. */
function betaFraction(a: number, b: number, x: number): number {
  const qab = a + b;
  const qap = a + 1;
  const qam = a - 1;
  let c = 1;
  let d = 1 - (qab * x) / qap;
  if (Math.abs(d) < TINY) d = TINY;
  d = 1 / d;
  let h = d;
  for (let m = 1; m <= 10_000; m++) {
    const m2 = 2 * m;
    let aa = (m * (b - m) * x) / ((qam + m2) * (a + m2));
    d = 1 + aa * d;
    if (Math.abs(d) < TINY) d = TINY;
    c = 1 + aa / c;
    if (Math.abs(c) < TINY) c = TINY;
    d = 1 / d;
    h *= d * c;
    aa = (-(a + m) * (qab + m) * x) / ((a + m2) * (qap + m2));
    d = 1 + aa * d;
    if (Math.abs(d) < TINY) d = TINY;
    c = 1 + aa / c;
    if (Math.abs(c) < TINY) c = TINY;
    d = 1 / d;
    const del = d * c;
    h *= del;
    if (Math.abs(del - 1) < EPS) return h;
  }
  throw new Error(`incompleteBeta: no convergence for a=${a}, b=${b}, x=${x}`);
}

/** Regularized incomplete beta I_x(a, b) for a, b > 0 and x in [0, 1]. */
export function incompleteBeta(x: number, a: number, b: number): number {
  if (!(a > 0 && b > 0)) throw new Error(`incompleteBeta: expected a, b > 0, got ${a}, ${b}`);
  if (!(x >= 0 && x <= 1)) throw new Error(`incompleteBeta: expected x in [0, 1], got ${x}`);
  if (x === 0 || x === 1) return x;
  const front = Math.exp(logGamma(a + b) - logGamma(a) - logGamma(b) + a * Math.log(x) + b * Math.log(1 - x));
  // The fraction converges fast for x < (a + 1) / (a + b + 2); otherwise use the symmetry.
  if (x < (a + 1) / (a + b + 2)) return (front * betaFraction(a, b, x)) / a;
  return 1 - (front * betaFraction(b, a, 1 - x)) / b;
}

/** Regularized lower incomplete gamma P(a, x) for a > 0, x >= 0 (series below a + 1, fraction above). */
export function incompleteGamma(a: number, x: number): number {
  if (!(a > 0)) throw new Error(`incompleteGamma: expected a > 0, got ${a}`);
  if (!(x >= 0)) throw new Error(`incompleteGamma: expected x >= 0, got ${x}`);
  if (x === 0) return 0;
  const lead = -x + a * Math.log(x) - logGamma(a);
  if (x < a + 1) {
    let ap = a;
    let sum = 1 / a;
    let del = sum;
    for (let n = 0; n < 10_000; n++) {
      ap += 1;
      del *= x / ap;
      sum += del;
      if (Math.abs(del) < Math.abs(sum) * EPS) return sum * Math.exp(lead);
    }
    throw new Error(`incompleteGamma: no convergence for a=${a}, x=${x}`);
  }
  let b = x + 1 - a;
  let c = 1 / TINY;
  let d = 1 / b;
  let h = d;
  for (let i = 1; i <= 10_000; i++) {
    const an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (Math.abs(d) < TINY) d = TINY;
    c = b + an / c;
    if (Math.abs(c) < TINY) c = TINY;
    d = 1 / d;
    const del = d * c;
    h *= del;
    if (Math.abs(del - 1) < EPS) return 1 - Math.exp(lead) * h;
  }
  throw new Error(`incompleteGamma: no convergence for a=${a}, x=${x}`);
}

/** CDF of Student's t with `df` degrees of freedom: P(T <= t). */
export function studentTCdf(t: number, df: number): number {
  if (!(df > 0)) throw new Error(`studentTCdf: expected df > 0, got ${df}`);
  if (t === Number.POSITIVE_INFINITY) return 1;
  if (t === Number.NEGATIVE_INFINITY) return 0;
  const tail = 0.5 * incompleteBeta(df / (df + t * t), df / 2, 0.5); // P(T > |t|)
  return t >= 0 ? 1 - tail : tail;
}

/** The p-quantile of Student's t (bisection on the CDF; |error| below 1e-12). */
export function studentTQuantile(p: number, df: number): number {
  if (!(p > 0 && p < 1)) throw new Error(`studentTQuantile: expected p in (0, 1), got ${p}`);
  if (p < 0.5) return -studentTQuantile(1 - p, df);
  let lo = 0;
  let hi = 1;
  while (studentTCdf(hi, df) < p) hi *= 2;
  for (let i = 0; i < 200 && hi - lo > 1e-13 * Math.max(1, hi); i++) {
    const mid = (lo + hi) / 2;
    if (studentTCdf(mid, df) < p) lo = mid;
    else hi = mid;
  }
  return (lo + hi) / 2;
}

/** Upper tail of the chi-square distribution with `df` degrees of freedom: P(X >= x). */
export function chiSquareSurvival(x: number, df: number): number {
  if (!(df > 0)) throw new Error(`chiSquareSurvival: expected df > 0, got ${df}`);
  if (x <= 0) return 1;
  return 1 - incompleteGamma(df / 2, x / 2);
}
