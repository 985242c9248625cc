// PPO reference losses on plain arrays: hand-computed cases (these are what the engine's reported
// loss values are cross-checked against).
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { huber, klEstimate, type PpoDatum, ppoLoss, valueLoss } from "./oracles/ppo.ts";

const one = (logRatio: number, advantage: number): PpoDatum => ({
  logprobs: [0, -1 + logRatio],
  oldLogprobs: [0, -1],
  advantages: [0, advantage],
  weights: [0, 1],
});

describe("ppoLoss", () => {
  it("at ratio 1 is minus the weighted mean advantage, with no clipping and no KL", () => {
    const num = fc.double({ min: -5, max: 5, noNaN: true, noDefaultInfinity: true });
    fc.assert(
      fc.property(fc.array(fc.tuple(num, num, fc.boolean()), { minLength: 1, maxLength: 20 }), (toks) => {
        const d: PpoDatum = {
          logprobs: toks.map((t) => t[1]),
          oldLogprobs: toks.map((t) => t[1]),
          advantages: toks.map((t) => t[0]),
          weights: toks.map((t) => (t[2] ? 1 : 0)),
        };
        const r = ppoLoss([d]);
        const w = d.weights.reduce((s, x) => s + x, 0);
        const expected = w === 0 ? 0 : -toks.reduce((s, t) => s + (t[2] ? t[0] : 0), 0) / w;
        expect(r.loss).toBeCloseTo(expected, 10);
        expect(r.clipfrac).toBe(0);
        expect(r.approxKl).toBeCloseTo(0, 12);
      }),
    );
  });

  it("clips the surrogate only where it would gain from moving further", () => {
    // A > 0, ρ = 1.5: min(1.5, 1.2) → loss −1.2, clipped
    let r = ppoLoss([one(Math.log(1.5), 1)]);
    expect(r.loss).toBeCloseTo(-1.2, 12);
    expect(r.clipfrac).toBe(1);
    expect(r.ratioMean).toBeCloseTo(1.5, 12);
    expect(r.approxKl).toBeCloseTo(0.5 - Math.log(1.5), 12);
    // A < 0, ρ = 1.5: min(−1.5, −1.2) = −1.5 → loss 1.5, not clipped (the pessimistic branch)
    r = ppoLoss([one(Math.log(1.5), -1)]);
    expect(r.loss).toBeCloseTo(1.5, 12);
    expect(r.clipfrac).toBe(0);
    // A < 0, ρ = 0.5: min(−0.5, −0.8) → loss 0.8, clipped
    r = ppoLoss([one(Math.log(0.5), -1)]);
    expect(r.loss).toBeCloseTo(0.8, 12);
    expect(r.clipfrac).toBe(1);
    // asymmetric clip: clipHigh 0.28
    expect(ppoLoss([one(Math.log(1.5), 1)], { clipHigh: 0.28 }).loss).toBeCloseTo(-1.28, 12);
  });

  it("ignores tokens with weight 0 entirely", () => {
    const a = ppoLoss([one(0.3, 2)]);
    const b = ppoLoss([{ ...one(0.3, 2), logprobs: [7, -0.7], advantages: [99, 2] }]);
    expect(b).toEqual(a);
  });

  it("sequence ratio uses the action's summed (or mean) log-prob for every token", () => {
    const d: PpoDatum = {
      logprobs: [0, -0.9, -0.9],
      oldLogprobs: [0, -1, -1],
      advantages: [0, -1, -1],
      weights: [0, 1, 1],
    };
    // sum: ρ = e^0.2 on both tokens, A = −1 → loss = e^0.2 (unclipped branch is the pessimistic one)
    expect(ppoLoss([d], { ratio: "sequence" }).ratioMean).toBeCloseTo(Math.exp(0.2), 12);
    expect(ppoLoss([d], { ratio: "sequence" }).loss).toBeCloseTo(Math.exp(0.2), 12);
    expect(ppoLoss([d], { ratio: "sequence", sequenceLogprob: "mean" }).loss).toBeCloseTo(Math.exp(0.1), 12);
  });

  it("aggregation: token-mean over the call's tokens vs token-sum per datum", () => {
    const two: PpoDatum = {
      logprobs: [0, 0, 0],
      oldLogprobs: [0, 0, 0],
      advantages: [0, 1, 1],
      weights: [0, 1, 1],
    };
    const single = one(0, 4);
    // token-mean: −(1 + 1 + 4) / 3; token-sum: −((1 + 1) + 4) / 2
    expect(ppoLoss([two, single]).loss).toBeCloseTo(-2, 12);
    expect(ppoLoss([two, single], { aggregation: "token-sum" }).loss).toBeCloseTo(-3, 12);
  });

  it("adds the KL penalty and the entropy bonus", () => {
    expect(klEstimate(Math.log(0.5), Math.log(0.25), "k3")).toBeCloseTo(0.5 + Math.log(0.5) * -1 - 1, 12);
    expect(klEstimate(Math.log(0.5), Math.log(0.25), "k1")).toBeCloseTo(Math.log(2), 12);
    expect(klEstimate(Math.log(0.5), Math.log(0.25), "k2")).toBeCloseTo(0.5 * Math.log(2) ** 2, 12);
    const d: PpoDatum = {
      logprobs: [0, Math.log(0.5)],
      oldLogprobs: [0, Math.log(0.5)],
      advantages: [0, 1],
      weights: [0, 1],
      entropies: [0, 2],
      refLogprobs: [0, Math.log(0.25)],
    };
    const k3 = 0.5 - Math.log(0.5) - 1;
    const r = ppoLoss([d], { klCoef: 0.1, entropyCoef: 0.01 });
    expect(r.loss).toBeCloseTo(-1 - 0.01 * 2 + 0.1 * k3, 12);
    expect(r.klRef).toBeCloseTo(k3, 12);
    expect(r.entropy).toBe(2);
    expect(() => ppoLoss([one(0, 1)], { klCoef: 0.1 })).toThrow(/data\[0\]\.refLogprobs needed/);
    expect(() => ppoLoss([{ ...one(0, 1), advantages: [1] }])).toThrow(
      /data\[0\]\.advantages has 1 entries, expected 2/,
    );
  });
});

describe("valueLoss", () => {
  it("mse, clipped and Huber by hand", () => {
    const d = { values: [0, 1], returns: [0, 3], weights: [0, 1] };
    expect(valueLoss([d], { clip: null })).toEqual({ loss: 2, clipfrac: 0 });
    // old = 0, clip 0.2 → v_clip = 0.2, ½(2.8)² = 3.92 > 2: the clipped branch wins
    const clipped = valueLoss([{ ...d, oldValues: [0, 0] }]);
    expect(clipped.loss).toBeCloseTo(3.92, 12);
    expect(clipped.clipfrac).toBe(1);
    // the reference's Huber (δ = 10) is quadratic here; δ = 1 is linear: 1·(2 − 0.5)
    expect(valueLoss([d], { loss: "huber", clip: null }).loss).toBe(2);
    expect(valueLoss([d], { loss: "huber", huberDelta: 1, clip: null }).loss).toBe(1.5);
    expect(huber(-3, 1)).toBe(2.5);
  });
});
