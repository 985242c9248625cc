// Statistics: explained variance, Wilson intervals, significance tests, pass@k.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  accuracyCi95,
  explainedVariance,
  mean,
  normalCdf,
  pairedTest,
  passAtK,
  std,
  twoProportionZTest,
  wilsonInterval,
} from "../src/algo/index.ts";

const bools = (trues: number, falses: number): boolean[] => [
  ...Array<boolean>(trues).fill(true),
  ...Array<boolean>(falses).fill(false),
];

describe("mean / std", () => {
  it("match hand values", () => {
    expect(mean([1, 2, 3, 4])).toBe(2.5);
    expect(std([2, 4, 4, 4, 5, 5, 7, 9])).toBe(2);
    expect(std([1, 3], 1)).toBeCloseTo(Math.SQRT2, 12);
    expect(mean([])).toBeNaN();
  });
});

describe("explainedVariance", () => {
  it("is 1 for perfect values and 0 for predicting the mean return", () => {
    const returns = [1, 2, 3, 4];
    expect(explainedVariance(returns, returns)).toBe(1);
    expect(explainedVariance([2.5, 2.5, 2.5, 2.5], returns)).toBeCloseTo(0, 12);
    // residual variance 0.25·Var... hand: values = returns/2 → residual = returns/2 → EV = 1 − 1/4
    expect(explainedVariance([0.5, 1, 1.5, 2], returns)).toBeCloseTo(0.75, 12);
    // a constant offset is not penalised (variance of the residual), anti-correlation is: 1 − 5/1.25
    expect(explainedVariance([0, 0, 0, 0], returns)).toBeCloseTo(0, 12);
    expect(explainedVariance([4, 3, 2, 1], returns)).toBeCloseTo(-3, 12);
    expect(explainedVariance([1, 2], [3, 3])).toBeNaN();
  });
});

describe("wilsonInterval / accuracyCi95", () => {
  it("matches known values", () => {
    const [lo, hi] = wilsonInterval(50, 100);
    expect(lo).toBeCloseTo(0.4038, 4);
    expect(hi).toBeCloseTo(0.5962, 4);
    const [lo0, hi0] = wilsonInterval(0, 10);
    expect(lo0).toBe(0);
    expect(hi0).toBeCloseTo(0.2775, 4);
    const [lo10, hi10] = wilsonInterval(10, 10);
    expect(lo10).toBeCloseTo(0.7225, 4);
    expect(hi10).toBe(1);
    expect(wilsonInterval(0, 0)).toEqual([0, 1]);
    expect(() => wilsonInterval(11, 10)).toThrow(/successes must be an integer in \[0, n = 10\]/);
  });

  it("contains the point estimate and narrows with n", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 5000 }),
        fc.double({ min: 0, max: 1, noNaN: true }),
        (n, frac) => {
          const s = Math.round(frac * n);
          const [lo, hi] = wilsonInterval(s, n);
          expect(lo).toBeLessThanOrEqual(s / n);
          expect(hi).toBeGreaterThanOrEqual(s / n);
          expect(lo).toBeGreaterThanOrEqual(0);
          expect(hi).toBeLessThanOrEqual(1);
          const [lo4, hi4] = wilsonInterval(4 * s, 4 * n);
          expect(hi4 - lo4).toBeLessThan(hi - lo);
        },
      ),
    );
  });

  it("accuracyCi95 reports accuracy, interval and n", () => {
    const r = accuracyCi95(bools(50, 50));
    expect(r.accuracy).toBe(0.5);
    expect(r.n).toBe(100);
    expect(r.ci95[0]).toBeCloseTo(0.4038, 4);
    expect(() => accuracyCi95([])).toThrow(/n = 0/);
  });
});

describe("significance tests", () => {
  it("normalCdf matches the table", () => {
    expect(normalCdf(0)).toBeCloseTo(0.5, 7);
    expect(normalCdf(1.959963984540054)).toBeCloseTo(0.975, 6);
    expect(normalCdf(-1)).toBeCloseTo(0.158655254, 6);
  });

  it("two-proportion z-test: 60/100 vs 40/100 gives z = 2.828, p = 0.0047", () => {
    const { z, p } = twoProportionZTest(bools(60, 40), bools(40, 60));
    expect(z).toBeCloseTo(2.8284, 4);
    expect(p).toBeCloseTo(0.004678, 5);
    expect(twoProportionZTest(bools(40, 60), bools(60, 40)).z).toBeCloseTo(-2.8284, 4);
    const same = twoProportionZTest(bools(5, 5), bools(50, 50));
    expect(same.z).toBe(0);
    expect(same.p).toBeCloseTo(1, 6);
    expect(twoProportionZTest(bools(3, 0), bools(4, 0))).toEqual({ z: 0, p: 1 });
  });

  it("paired (exact McNemar) test counts only the problems that changed", () => {
    // 10 fixed, 0 broken: p = 2·0.5^10
    const before = bools(20, 10);
    const after = [...bools(20, 0), ...bools(10, 0)];
    const r = pairedTest(before, after);
    expect(r).toMatchObject({ improved: 10, worsened: 0, n: 30 });
    expect(r.p).toBeCloseTo(2 / 1024, 12);
    // 8 fixed, 2 broken: p = 2·(1 + 10 + 45)/1024
    const b2 = [...bools(2, 8), ...bools(5, 5)];
    const a2 = [...bools(0, 2), ...bools(8, 0), ...bools(5, 5)];
    const r2 = pairedTest(b2, a2);
    expect(r2).toMatchObject({ improved: 8, worsened: 2 });
    expect(r2.p).toBeCloseTo(112 / 1024, 12);
    // no change at all, or balanced change: p = 1
    expect(pairedTest(bools(3, 3), bools(3, 3)).p).toBe(1);
    expect(pairedTest([true, false], [false, true]).p).toBe(1);
    // thousands of discordant pairs do not underflow
    // 1600 fixed vs 1400 broken: z = 100/√750 = 3.65, p ≈ 2.6e-4 (normal approximation)
    const big = pairedTest([...bools(1400, 1600)], [...bools(0, 1400), ...bools(1600, 0)]);
    expect(big).toMatchObject({ improved: 1600, worsened: 1400 });
    expect(big.p).toBeGreaterThan(0);
    expect(big.p).toBeGreaterThan(1e-4);
    expect(big.p).toBeLessThan(5e-4);
    expect(() => pairedTest([true], [])).toThrow(/same problems/);
  });
});

describe("passAtK", () => {
  it("matches known values", () => {
    expect(passAtK(10, 1, 1)).toBeCloseTo(0.1, 12);
    expect(passAtK(10, 3, 5)).toBeCloseTo(1 - 21 / 252, 12);
    expect(passAtK(5, 0, 3)).toBe(0);
    expect(passAtK(5, 5, 1)).toBe(1);
    expect(passAtK(5, 3, 3)).toBe(1); // only 2 wrong samples: any 3 contain a right one
    expect(() => passAtK(5, 1, 6)).toThrow(/k must be an integer in \[1, n = 5\]/);
  });

  it("pass@1 is c/n and pass@k grows with k", () => {
    fc.assert(
      fc.property(
        fc
          .integer({ min: 1, max: 200 })
          .chain((n) => fc.tuple(fc.constant(n), fc.integer({ min: 0, max: n }))),
        ([n, c]) => {
          expect(passAtK(n, c, 1)).toBeCloseTo(c / n, 12);
          for (let k = 2; k <= n; k++)
            expect(passAtK(n, c, k)).toBeGreaterThanOrEqual(passAtK(n, c, k - 1) - 1e-12);
        },
      ),
    );
  });
});
