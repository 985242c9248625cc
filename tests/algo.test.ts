// Credit assignment: GAE (MARFT-A, MARFT-T, masked), group baselines, reward routing, normalisation.
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  actionGae,
  groupRelative,
  normalizePerAgent,
  type RewardRouting,
  routeRewards,
  tokenGae,
  ZeroAdvantageDetector,
} from "../src/algo/index.ts";
import { referenceAgentChainGae } from "./oracles/reference-gae.ts";

const num = fc.double({ min: -10, max: 10, noNaN: true, noDefaultInfinity: true });
const unit = fc.double({ min: 0, max: 1, noNaN: true, noDefaultInfinity: true });

function expectClose(actual: readonly number[], expected: readonly number[], tol = 1e-9): void {
  expect(actual.length).toBe(expected.length);
  actual.forEach((a, i) => {
    expect(Math.abs(a - expected[i]!)).toBeLessThanOrEqual(tol * (1 + Math.abs(expected[i]!)));
  });
}

describe("actionGae (MARFT-A)", () => {
  it("matches a hand-computed two-action episode", () => {
    // δ1 = 1 − 0.8 = 0.2, A1 = 0.2; δ0 = 0.9·0.8 − 0.5 = 0.22, A0 = 0.22 + 0.9·0.5·0.2 = 0.31
    const { advantages, returns } = actionGae([0, 1], [0.5, 0.8], 0, 0.9, 0.5);
    expectClose(advantages, [0.31, 0.2]);
    expectClose(returns, [0.81, 1.0]);
  });

  it("γ = λ = 1 gives Monte-Carlo returns (plus bootstrap) minus values", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(num, num), { minLength: 1, maxLength: 12 }), num, (rv, boot) => {
        const rewards = rv.map((x) => x[0]);
        const values = rv.map((x) => x[1]);
        const { advantages, returns } = actionGae(rewards, values, boot, 1, 1);
        const mc = rewards.map((_, k) => rewards.slice(k).reduce((s, r) => s + r, 0) + boot);
        expectClose(returns, mc);
        expectClose(
          advantages,
          mc.map((g, k) => g - values[k]!),
        );
      }),
    );
  });

  it("λ = 0 gives one-step TD errors", () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(num, num), { minLength: 1, maxLength: 12 }),
        num,
        unit,
        (rv, boot, gamma) => {
          const rewards = rv.map((x) => x[0]);
          const values = rv.map((x) => x[1]);
          const { advantages } = actionGae(rewards, values, boot, gamma, 0);
          const td = rewards.map(
            (r, k) => r + gamma * (k + 1 < values.length ? values[k + 1]! : boot) - values[k]!,
          );
          expectClose(advantages, td);
        },
      ),
    );
  });

  it("truncated and terminated differ exactly by the (γλ)-discounted bootstrap", () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(num, num), { minLength: 1, maxLength: 12 }),
        num,
        unit,
        unit,
        (rv, boot, gamma, lambda) => {
          const rewards = rv.map((x) => x[0]);
          const values = rv.map((x) => x[1]);
          const K = rewards.length;
          const term = actionGae(rewards, values, 0, gamma, lambda);
          const trunc = actionGae(rewards, values, boot, gamma, lambda);
          expectClose(
            trunc.advantages.map((a, k) => a - term.advantages[k]!),
            rewards.map((_, k) => (gamma * lambda) ** (K - 1 - k) * gamma * boot),
            1e-7,
          );
        },
      ),
    );
  });

  it("handles an empty episode and rejects bad input with the field named", () => {
    expect(actionGae([], [], 0, 0.99, 0.95)).toEqual({ advantages: [], returns: [] });
    expect(() => actionGae([1], [], 0, 0.99, 0.95)).toThrow(/1 rewards and 0 values/);
    expect(() => actionGae([1, Number.NaN], [0, 0], 0, 0.99, 0.95)).toThrow(/rewards\[1\]/);
    expect(() => actionGae([1], [0], 0, 1.5, 0.95)).toThrow(/gamma/);
  });
});

// A rollout buffer of the reference: T steps × N sequential agents, possibly several episodes (the
// buffer auto-resets after an episode ends), possibly cut off mid-episode at the end.
const referenceBuffer = fc
  .record({ T: fc.integer({ min: 1, max: 6 }), N: fc.integer({ min: 1, max: 5 }) })
  .chain(({ T, N }) =>
    fc.record({
      rewards: fc.array(fc.array(num, { minLength: N, maxLength: N }), { minLength: T, maxLength: T }),
      values: fc.array(fc.array(num, { minLength: N, maxLength: N }), { minLength: T + 1, maxLength: T + 1 }),
      // done[t]: the episode ended at step t (terminated: no bootstrap)
      done: fc.array(fc.boolean(), { minLength: T, maxLength: T }),
      gamma: unit,
      lambda: unit,
    }),
  );

describe("MARFT-A equals the reference's agent chain on a sequential team", () => {
  it("flattening [step][agent] into the action order gives the same advantages and returns", () => {
    fc.assert(
      fc.property(referenceBuffer, ({ rewards, values, done, gamma, lambda }) => {
        const T = rewards.length;
        const N = rewards[0]!.length;
        // The reference's masks: masks[t+1][0] = 1 − done[t] carries the episode boundary; the
        // within-step links are 1 (see referenceAgentChainGae's note on its first-step-after-reset quirk).
        const masks = Array.from({ length: T + 1 }, (_, t) =>
          Array.from({ length: N }, (_, a) => (a === 0 && t > 0 && done[t - 1] ? 0 : 1)),
        );
        const ref = referenceAgentChainGae(rewards, values, masks, gamma, lambda);

        // Ours: split the buffer into episodes, flatten each in action order, one actionGae call each.
        const ourAdv: number[] = [];
        const ourRet: number[] = [];
        let start = 0;
        for (let t = 0; t < T; t++) {
          if (!done[t] && t < T - 1) continue;
          const steps = rewards.slice(start, t + 1);
          const vals = values.slice(start, t + 1);
          // terminated → 0; cut off by the buffer's end → the critic's value of the next observation
          const bootstrap = done[t] ? 0 : values[T]![0]!;
          const out = actionGae(steps.flat(), vals.flat(), bootstrap, gamma, lambda);
          ourAdv.push(...out.advantages);
          ourRet.push(...out.returns);
          start = t + 1;
        }
        expectClose(ourAdv, ref.advantages.flat());
        expectClose(ourRet, ref.returns.flat());
      }),
    );
  });

  it("a single episode with the reference's own mask layout (every agent's mask a copy) agrees too", () => {
    // values[T][0] is ignored when the episode terminated (masks[T] = 0)
    const rewards = [
      [0, 0.5],
      [0, 1],
    ];
    const values = [
      [0.1, 0.2],
      [0.3, 0.4],
      [9, 9],
    ];
    const masks = [
      [1, 1],
      [1, 1],
      [0, 0],
    ];
    const ref = referenceAgentChainGae(rewards, values, masks, 0.99, 0.95);
    const ours = actionGae(rewards.flat(), values.slice(0, 2).flat(), 0, 0.99, 0.95);
    expectClose(ours.advantages, ref.advantages.flat());
    expectClose(ours.returns, ref.returns.flat());
  });

  it("documents the reference's quirk: after an auto-reset its copied masks also cut the first step's chain", () => {
    // Two one-step episodes of a duo in one buffer; the reference stores masks[1] = [0, 0].
    const rewards = [
      [0, 1],
      [0, 1],
    ];
    const values = [
      [0.5, 0.5],
      [0.5, 0.5],
      [0, 0],
    ];
    const masks = [
      [1, 1],
      [0, 0],
      [0, 0],
    ];
    const ref = referenceAgentChainGae(rewards, values, masks, 1, 1);
    // Second episode: agent 0's δ drops V(o^1) in the reference: 0 + 0 − 0.5 = −0.5, and its GAE
    // does not include agent 1's advantage; actionGae keeps the link: 0 + 0.5 − 0.5 + 0.5 = 0.5.
    expect(ref.advantages[1]).toEqual([-0.5, 0.5]);
    expectClose(actionGae([0, 1], [0.5, 0.5], 0, 1, 1).advantages, [0.5, 0.5]);
    // The first episode (t = 0, masks all 1 inside it) agrees.
    expectClose(actionGae([0, 1], [0.5, 0.5], 0, 1, 1).advantages, ref.advantages[0]!);
  });
});

describe("tokenGae (MARFT-T)", () => {
  it("one token per turn reduces to actionGae", () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(num, num), { minLength: 1, maxLength: 10 }),
        num,
        unit,
        unit,
        (rv, boot, gamma, lambda) => {
          const turns = rv.map(([reward, v]) => ({ values: [v], reward }));
          const tok = tokenGae(turns, boot, gamma, lambda);
          const act = actionGae(
            rv.map((x) => x[0]),
            rv.map((x) => x[1]),
            boot,
            gamma,
            lambda,
          );
          expect(tok.advantages.map((a) => a.length)).toEqual(turns.map(() => 1));
          expectClose(tok.advantages.flat(), act.advantages);
          expectClose(tok.returns.flat(), act.returns);
        },
      ),
    );
  });

  it("puts the reward on each turn's last token", () => {
    const { advantages } = tokenGae([{ values: [0, 0, 0], reward: 1 }], 0, 0.5, 1);
    expectClose(advantages[0]!, [0.25, 0.5, 1]);
    // the second turn's first token is the step after the first turn's last token
    const two = tokenGae(
      [
        { values: [0, 0], reward: 0 },
        { values: [0], reward: 1 },
      ],
      0,
      1,
      1,
    );
    expect(two.advantages).toEqual([[1, 1], [1]]);
    expect(() => tokenGae([{ values: [], reward: 1 }], 0, 1, 1)).toThrow(/turns\[0\] has no action tokens/);
  });
});

describe("groupRelative (critic-free)", () => {
  const groupedRewards = fc.array(fc.tuple(fc.integer({ min: 0, max: 3 }), num), {
    minLength: 1,
    maxLength: 24,
  });

  it("sums to zero within each group", () => {
    fc.assert(
      fc.property(groupedRewards, fc.boolean(), (rg, useStd) => {
        const groups = rg.map((x) => x[0]);
        const adv = groupRelative(
          rg.map((x) => x[1]),
          groups,
          { std: useStd },
        );
        for (const g of new Set(groups)) {
          const s = adv.filter((_, i) => groups[i] === g).reduce((a, b) => a + b, 0);
          expect(Math.abs(s)).toBeLessThan(1e-6);
        }
        expect(adv.every(Number.isFinite)).toBe(true);
      }),
    );
  });

  it("is invariant to adding a constant to one group's rewards", () => {
    fc.assert(
      fc.property(groupedRewards, num, fc.integer({ min: 0, max: 3 }), (rg, c, target) => {
        const groups = rg.map((x) => x[0]);
        const rewards = rg.map((x) => x[1]);
        const shifted = rewards.map((r, i) => (groups[i] === target ? r + c : r));
        expectClose(groupRelative(shifted, groups), groupRelative(rewards, groups), 1e-8);
      }),
    );
  });

  it("hand case, std option, and an all-equal group gives zeros", () => {
    expect(groupRelative([1, 0, 0, 1, 0.5, 0.5, 0.5], [0, 0, 0, 0, 1, 1, 1])).toEqual([
      0.5, -0.5, -0.5, 0.5, 0, 0, 0,
    ]);
    expectClose(groupRelative([1, 0, 0, 1], [0, 0, 0, 0], { std: true, eps: 1e-12 }), [1, -1, -1, 1]);
    expect(groupRelative([0.1, 0.1, 0.1], [7, 7, 7], { std: true })).toEqual([0, 0, 0]);
    expect(() => groupRelative([1], [0, 1])).toThrow(/same length/);
  });
});

describe("routeRewards", () => {
  // reasoner → actor, two attempts; the env itself gave a 0.1 format bonus to the first actor turn
  const turns = [
    { agent: "r", role: "reasoner", reward: 0 },
    { agent: "a", role: "actor", reward: 0.1 },
    { agent: "r", role: "reasoner", reward: 0 },
    { agent: "a", role: "actor", reward: 0 },
    { agent: "v", role: "verifier", reward: 0 },
  ];

  it("team: every agent's last action gets the team reward", () => {
    expect(routeRewards(turns, 1, { kind: "team" })).toEqual([0, 0.1, 1, 1, 1]);
  });

  it("last: only the episode's last action (the reference)", () => {
    expect(routeRewards(turns, 1, { kind: "last" })).toEqual([0, 0.1, 0, 0, 1]);
  });

  it("per-role: team, none, or a named per-role reward", () => {
    const routing: RewardRouting = {
      kind: "per-role",
      roles: { reasoner: "none", actor: "team", verifier: "verifier_accuracy" },
    };
    expect(routeRewards(turns, 1, routing, { verifier_accuracy: 0.25 })).toEqual([0, 0.1, 0, 1, 0.25]);
  });

  it("per-role errors name the role or the missing reward", () => {
    expect(() =>
      routeRewards(turns, 1, { kind: "per-role", roles: { reasoner: "none", actor: "team" } }),
    ).toThrow(/role "verifier" \(agent "v"\) has no entry/);
    expect(() =>
      routeRewards(turns, 1, {
        kind: "per-role",
        roles: { reasoner: "none", actor: "team", verifier: "acc" },
      }),
    ).toThrow(/roleRewards\["acc"\] is missing/);
    expect(routeRewards([], 1, { kind: "last" })).toEqual([]);
  });
});

describe("normalizePerAgent", () => {
  const batch = fc.array(fc.tuple(fc.constantFrom("a", "b", "c"), num), { minLength: 1, maxLength: 40 });

  it("gives each non-degenerate agent mean 0 and std 1", () => {
    fc.assert(
      fc.property(batch, (xs) => {
        const agents = xs.map((x) => x[0]);
        const { advantages, zeroAgents } = normalizePerAgent(
          xs.map((x) => x[1]),
          agents,
        );
        for (const a of new Set(agents)) {
          const mine = advantages.filter((_, i) => agents[i] === a);
          if (zeroAgents.includes(a)) {
            expect(mine.every((v) => v === 0)).toBe(true);
            continue;
          }
          const m = mine.reduce((s, v) => s + v, 0) / mine.length;
          const v = mine.reduce((s, x) => s + (x - m) ** 2, 0) / mine.length;
          expect(Math.abs(m)).toBeLessThan(1e-9);
          expect(Math.abs(v - 1)).toBeLessThan(1e-9);
        }
      }),
    );
  });

  it("scaling one agent's advantages by 1000 does not change another's", () => {
    fc.assert(
      fc.property(batch, (xs) => {
        const agents = xs.map((x) => x[0]);
        const adv = xs.map((x) => x[1]);
        const scaled = adv.map((v, i) => (agents[i] === "a" ? v * 1000 : v));
        const before = normalizePerAgent(adv, agents).advantages;
        const after = normalizePerAgent(scaled, agents).advantages;
        agents.forEach((a, i) => {
          if (a !== "a") expect(after[i]).toBe(before[i]);
        });
      }),
    );
  });

  it("an all-zero agent is reported and left zero; output is always finite", () => {
    const out = normalizePerAgent([0, 0, 0, 1, 3], ["a", "a", "a", "b", "b"]);
    expect(out.zeroAgents).toEqual(["a"]);
    expect(out.advantages).toEqual([0, 0, 0, -1, 1]);
    // near zero (rounding noise) and constant-but-nonzero are degenerate too: never divided by ~0
    const near = normalizePerAgent([1e-9, -1e-9, 0.5, 0.5, 2, 4], ["a", "a", "b", "b", "c", "c"]);
    expect(near.zeroAgents).toEqual(["a", "b"]);
    expect(near.advantages).toEqual([0, 0, 0, 0, -1, 1]);
    const wide = fc.double({ min: -1e300, max: 1e300, noNaN: true, noDefaultInfinity: true });
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.constantFrom("a", "b"), wide), { maxLength: 30 }), (xs) => {
        const { advantages } = normalizePerAgent(
          xs.map((x) => x[1]),
          xs.map((x) => x[0]),
        );
        expect(advantages.every(Number.isFinite)).toBe(true);
      }),
    );
    expect(() => normalizePerAgent([Number.NaN], ["a"])).toThrow(/adv\[0\] \(agent "a"\)/);
  });

  it("scale = false centres each agent without dividing by its std", () => {
    // a critic that overshoots on a perfect batch: every raw advantage about -0.2
    const out = normalizePerAgent([-0.21, -0.19, -0.2, 3, 5], ["a", "a", "a", "b", "b"], { scale: false });
    expect(out.zeroAgents).toEqual([]);
    out.advantages.forEach((x, i) => {
      expect(x).toBeCloseTo([-0.01, 0.01, 0, -1, 1][i]!, 12);
    });
    // degenerate agents still stay exactly zero
    expect(normalizePerAgent([0.3, 0.3], ["a", "a"], { scale: false })).toEqual({
      advantages: [0, 0],
      zeroAgents: ["a"],
    });
  });
});

describe("ZeroAdvantageDetector", () => {
  it("counts all-zero batches per agent and warns", () => {
    const d = new ZeroAdvantageDetector();
    const first = d.check([0, 0, 0.5, -0.5], ["a", "a", "b", "b"]);
    expect(first.zeroAgents).toEqual(["a"]);
    expect(first.warning).toMatch(/all advantages are zero for a \(1\/1 batches, 1 in a row\)/);
    d.check([0, 0, 0, 0], ["a", "a", "b", "b"]);
    const third = d.check([1, 0, 0, 0], ["a", "a", "b", "b"]);
    expect(third.zeroAgents).toEqual(["b"]);
    expect(d.batches).toBe(3);
    expect(d.zeroBatches).toEqual({ a: 2, b: 2 });
    expect(d.streak).toEqual({ a: 0, b: 2 });
    expect(d.check([1, -1], ["a", "b"]).warning).toBeNull();
    // NaN is never reported as "zero"
    expect(d.check([Number.NaN], ["a"]).zeroAgents).toEqual([]);
  });
});
