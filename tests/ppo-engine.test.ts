// The engine's losses, cross-checked: fixed data goes to the real engine's forward_backward, and the
// loss and statistics it reports must equal the plain-array oracles of tests/oracles/ppo.ts computed
// from the engine's own forward pass (current log-probs, entropies, reference log-probs, values).
import { beforeAll, describe, expect, it } from "vitest";
import { BASE_ADAPTER, type Schemas } from "../src/client/compute.ts";
import { createPolicy, createTinyBase, useEngine } from "./helpers/engine.ts";
import { type PpoDatum, ppoLoss, valueLoss } from "./oracles/ppo.ts";

const eng = useEngine();
const T = 0.8; // a temperature other than 1: training passes score the tempered policy

/** Three sequences whose last tokens are the "action" (weight 1), of different lengths. */
const data = [
  { tokens: [5, 9, 14, 3, 7, 22, 8], action: 3 },
  { tokens: [12, 4, 4, 30, 2], action: 2 },
  { tokens: [40, 41, 42, 43, 44, 45, 46, 47, 48], action: 4 },
].map(({ tokens, action }) => ({
  tokens,
  weights: tokens.map((_, i) => (i >= tokens.length - action ? 1 : 0)),
}));

/** Advantages of both signs and old log-probs shifted off the current ones, so that some ratios clip. */
const advantages = data.map((d, k) =>
  d.tokens.map((_, i) => (d.weights[i]! > 0 ? ((i + k) % 3) - 1 + 0.25 : 0)),
);
const shift = (i: number, k: number) => ((i * 7 + k * 3) % 5) * 0.2 - 0.4;
/** One shift per datum, so that a sequence-level ratio (mean over the action) moves too. */
const seqShift = (_i: number, k: number) => [0.45, -0.45, 0.1][k]!;

beforeAll(async () => {
  await createTinyBase(eng.client);
  await createPolicy(eng.client, "pi");
  // move the adapter off the base, so the KL to the reference is not zero
  await eng.client.forwardBackward({ adapter: "pi", loss: "cross_entropy", data });
  await eng.client.optimStep({ adapter: "pi" });
  await eng.client.createAdapter({
    name: "v",
    base: "tiny",
    kind: "critic",
    seed: 3,
    lora: { r: 4, alpha: 8 },
    optimizer: { lr: 1e-3 },
    value_head_hidden: [16],
  });
});

async function scores(adapter: string): Promise<Schemas["ForwardResult"][]> {
  const body: Schemas["ForwardRequest"] = { adapter, data, temperature: T };
  if (adapter === BASE_ADAPTER) body.base = "tiny";
  return (await eng.client.forward(body)).results;
}

describe("the engine's PPO loss equals the oracle's on the engine's own log-probs", () => {
  for (const ratio of ["token", "sequence"] as const) {
    it(`ratio: ${ratio}, with an entropy bonus and a KL penalty`, async () => {
      const now = await scores("pi");
      const ref = await scores(BASE_ADAPTER);
      const oracleData: PpoDatum[] = data.map((d, k) => {
        const logprobs = now[k]!.logprobs!;
        return {
          logprobs,
          oldLogprobs: logprobs.map((x, i) =>
            d.weights[i]! > 0 ? x + (ratio === "token" ? shift : seqShift)(i, k) : 0,
          ),
          advantages: advantages[k]!,
          weights: d.weights,
          entropies: now[k]!.entropies!,
          refLogprobs: ref[k]!.logprobs!,
        };
      });
      const opts = {
        clipLow: 0.2,
        clipHigh: 0.28,
        entropyCoef: 0.01,
        klCoef: 0.1,
        klEstimator: "k3" as const,
        ratio,
        sequenceLogprob: "mean" as const,
        aggregation: "token-mean" as const,
      };
      const want = ppoLoss(oracleData, opts);
      const got = await eng.client.forwardBackward({
        adapter: "pi",
        loss: "ppo",
        temperature: T,
        data: data.map((d, k) => ({
          ...d,
          old_logprobs: oracleData[k]!.oldLogprobs as number[],
          advantages: advantages[k]!,
        })),
        ppo: {
          clip_low: opts.clipLow,
          clip_high: opts.clipHigh,
          entropy_coef: opts.entropyCoef,
          kl_coef: opts.klCoef,
          kl_estimator: opts.klEstimator,
          ratio,
          sequence_logprob: opts.sequenceLogprob,
          aggregation: opts.aggregation,
        },
      });
      expect(want.clipfrac).toBeGreaterThan(0); // the data exercises the clipped branch
      expect(want.clipfrac).toBeLessThan(1);
      expect(got.loss).toBeCloseTo(want.loss, 5);
      expect(got.stats["clipfrac"]).toBeCloseTo(want.clipfrac, 6);
      expect(got.stats["entropy"]).toBeCloseTo(want.entropy, 5);
      expect(got.stats["kl_ref"]).toBeCloseTo(want.klRef, 6);
      if (ratio === "token") {
        // the engine's approx_kl and ratio_mean are token-level statistics
        expect(got.stats["approx_kl"]).toBeCloseTo(want.approxKl, 6);
        expect(got.stats["ratio_mean"]).toBeCloseTo(want.ratioMean, 5);
      }
    });
  }
});

describe("the engine's value loss equals the oracle's on the critic's own values", () => {
  for (const loss of ["mse", "huber"] as const) {
    it(`${loss}, clipped`, async () => {
      const values = (await scores("v")).map((r) => r.values!);
      const returns = data.map((d, k) =>
        d.tokens.map((_, i) => (d.weights[i]! > 0 ? 0.5 * k - 0.3 + i * 0.05 : 0)),
      );
      const oldValues = values.map((v, k) => v.map((x, i) => x + shift(i, k)));
      const want = valueLoss(
        data.map((d, k) => ({
          values: values[k]!,
          returns: returns[k]!,
          oldValues: oldValues[k]!,
          weights: d.weights,
        })),
        { loss, huberDelta: 0.4, clip: 0.1 },
      );
      const got = await eng.client.forwardBackward({
        adapter: "v",
        loss: "value",
        data: data.map((d, k) => ({ ...d, returns: returns[k]!, old_values: oldValues[k]! })),
        value: { loss, huber_delta: 0.4, clip: 0.1 },
      });
      expect(want.clipfrac).toBeGreaterThan(0);
      expect(got.loss).toBeCloseTo(want.loss, 5);
      expect(got.stats["clipfrac"]).toBeCloseTo(want.clipfrac, 6);
    });
  }
});
