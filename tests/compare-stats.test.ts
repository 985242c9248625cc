// The statistics `marft compare` reports, against values computed by hand (or from closed forms and
// published tables): Student's t quantiles and CDF, the t-interval of a mean over seeds, the paired
// t-test, the paired difference of success rates (Agresti-Min interval, exact McNemar), chi-square.
import { describe, expect, it } from "vitest";
import {
  chiSquareGoodnessOfFit,
  chiSquareSurvival,
  meanInterval,
  pairedDifference,
  pairedTTest,
  studentTCdf,
  studentTQuantile,
} from "../src/algo/index.ts";

describe("distributions", () => {
  it("t quantiles match the published table", () => {
    // t(0.975, df) from any statistics table
    const table: Array<[number, number]> = [
      [1, 12.706204736],
      [2, 4.30265273],
      [4, 2.776445105],
      [9, 2.262157163],
      [29, 2.045229642],
    ];
    for (const [df, t] of table) expect(studentTQuantile(0.975, df)).toBeCloseTo(t, 8);
    expect(studentTQuantile(0.025, 4)).toBeCloseTo(-2.776445105, 8);
  });

  it("t CDF: the closed form at df = 2 and a table value", () => {
    // df 2: P(T <= t) = 1/2 + t / (2 sqrt(2 + t^2))
    for (const t of [-3, -0.5, 0, 1, 2.6457513110645907, 10])
      expect(studentTCdf(t, 2)).toBeCloseTo(0.5 + t / (2 * Math.sqrt(2 + t * t)), 12);
    // df 1 is Cauchy: 1/2 + atan(t) / pi
    expect(studentTCdf(1.5, 1)).toBeCloseTo(0.5 + Math.atan(1.5) / Math.PI, 12);
  });

  it("chi-square survival at the 5% critical values", () => {
    expect(chiSquareSurvival(3.841458820694124, 1)).toBeCloseTo(0.05, 10);
    expect(chiSquareSurvival(5.991464547107979, 2)).toBeCloseTo(0.05, 10);
    expect(chiSquareSurvival(11.070497693516351, 5)).toBeCloseTo(0.05, 10);
    // df 2 is exponential: P(X >= x) = exp(-x / 2)
    expect(chiSquareSurvival(7.3, 2)).toBeCloseTo(Math.exp(-3.65), 12);
  });
});

describe("comparison statistics, by hand", () => {
  it("meanInterval: mean ± t(0.975, n-1) s / sqrt(n); one seed has no interval", () => {
    // 0.5 0.6 0.7: mean 0.6, s = 0.1, t(0.975, 2) = 4.30265273 -> half width 0.248414
    const r = meanInterval([0.5, 0.6, 0.7]);
    expect(r.mean).toBeCloseTo(0.6, 12);
    expect(r.sd).toBeCloseTo(0.1, 12);
    expect(r.ci95![0]).toBeCloseTo(0.6 - (4.30265273 * 0.1) / Math.sqrt(3), 7);
    expect(r.ci95![1]).toBeCloseTo(0.6 + 0.248414, 6);
    expect(meanInterval([0.4]).ci95).toBeNull();
  });

  it("pairedTTest: d = 0.1 0.2 0.05 gives t = sqrt(7), p = 1 - sqrt(7)/3 (df 2)", () => {
    const r = pairedTTest([0.5, 0.6, 0.7], [0.6, 0.8, 0.75]);
    expect(r.diff).toBeCloseTo(0.35 / 3, 12);
    expect(r.t).toBeCloseTo(Math.sqrt(7), 10);
    expect(r.p).toBeCloseTo(1 - Math.sqrt(7) / 3, 10);
    // s_d = sqrt(0.0058333), se = 0.0440959, half = 4.30265273 * se = 0.189733
    expect(r.ci95[0]).toBeCloseTo(0.116667 - 0.189733, 5);
    expect(r.ci95[1]).toBeCloseTo(0.116667 + 0.189733, 5);
    expect(pairedTTest([0.1, 0.2], [0.1, 0.2]).p).toBe(1);
  });

  it("pairedDifference: 4 improved, 1 worsened of 10 problems", () => {
    const a = [1, 1, 0, 0, 1, 0, 0, 0, 1, 1].map(Boolean);
    const b = [1, 0, 1, 1, 1, 1, 0, 1, 1, 1].map(Boolean);
    const r = pairedDifference(a, b);
    expect(r).toMatchObject({ improved: 4, worsened: 1, n: 10 });
    expect(r.diff).toBeCloseTo(0.3, 12);
    // exact McNemar: 2 P(X <= 1), X ~ Bin(5, 1/2) = 2 (1 + 5) / 32
    expect(r.p).toBeCloseTo(0.375, 12);
    // Agresti-Min: (4.5 - 1.5) / 12 = 0.25, var = (0.5 - 0.0625) / 12, half = 1.959964 * 0.190941
    expect(r.ci95[0]).toBeCloseTo(0.25 - 0.374236, 5);
    expect(r.ci95[1]).toBeCloseTo(0.25 + 0.374236, 5);
  });

  it("chi-square goodness of fit: a hand-computed statistic", () => {
    // counts 30 50 20 against 0.25 0.5 0.25 of 100: (5^2 / 25) + 0 + (5^2 / 25) = 2, df 2: p = e^-1
    const r = chiSquareGoodnessOfFit([30, 50, 20], [0.25, 0.5, 0.25]);
    expect(r.stat).toBeCloseTo(2, 12);
    expect(r.df).toBe(2);
    expect(r.p).toBeCloseTo(Math.exp(-1), 10);
  });
});
