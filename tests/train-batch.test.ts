// The trainer's pure batch steps: routing, credit per estimator, normalisation, engine data alignment.
import { describe, expect, it } from "vitest";
import { actionGae, type Credit, ESTIMATORS, normalizeCredit } from "../src/algo/index.ts";
import { Rng } from "../src/rng.ts";
import type { Episode, Turn } from "../src/rollout/types.ts";
import { creditBatch, policyDatum, type Step, toSteps, valueDatum } from "../src/train/steps.ts";

const params = (gamma: number, lambda: number) => ({ gamma, lambda, groupStd: false });
/** Critic values over prompt + response of each step, with V(o) = values[P - 1] set to `v[i]`. */
const atObservation = (steps: Step[], v: number[]) =>
  steps.map((s, i) =>
    Array.from({ length: s.turn.promptIds.length + s.turn.responseIds.length }, (_, t) =>
      t === s.turn.promptIds.length - 1 ? v[i]! : 0,
    ),
  );

function turn(agent: string, order: number, promptIds: number[], responseIds: number[]): Turn {
  return {
    order,
    step: 0,
    agent,
    parents: [],
    adapter: agent,
    adapterVersion: 0,
    temperature: 1,
    promptIds,
    responseIds,
    logprobs: responseIds.map((_, j) => -1 - j),
    text: "x",
    finishReason: "stop",
    reward: 0, // the env's per-action rewards: none here
  };
}

function episode(
  index: number,
  group: number,
  team: number,
  turns: Turn[],
  extra: Record<string, unknown> = {},
): Episode {
  return {
    index,
    taskId: `t${group}`,
    group,
    seed: 0,
    turns,
    terminated: true,
    truncated: false,
    outcome: { correct: team >= 1, score: team, teamReward: team, roleRewards: {}, ...extra },
    info: {},
    transcript: [],
  };
}

const roleOf = (a: string) => ({ a: "speaker", b: "listener" })[a]!;

describe("reward routing into steps", () => {
  it("team / last / per-role route the outcome's team reward", () => {
    const ep = episode(0, 0, 1, [turn("a", 0, [1, 2], [3]), turn("b", 1, [1, 2, 3], [4])], {
      roleRewards: { speaker: 0.5 },
    });
    expect(toSteps([ep], roleOf, { kind: "team" }).map((s) => s.reward)).toEqual([1, 1]);
    expect(toSteps([ep], roleOf, { kind: "last" }).map((s) => s.reward)).toEqual([0, 1]);
    expect(
      toSteps([ep], roleOf, { kind: "per-role", roles: { speaker: "speaker", listener: "none" } }).map(
        (s) => s.reward,
      ),
    ).toEqual([0.5, 0]);
  });

  it("the env's per-action rewards are added to the routed reward, never replaced", () => {
    const ep = episode(0, 0, 1, [turn("a", 0, [1, 2], [3]), turn("b", 1, [1, 2, 3], [4])]);
    ep.turns[0]!.reward = -0.25; // e.g. a format penalty the env gave agent a for this action
    expect(toSteps([ep], roleOf, { kind: "last" }).map((s) => s.reward)).toEqual([-0.25, 1]);
    expect(toSteps([ep], roleOf, { kind: "team" }).map((s) => s.reward)).toEqual([0.75, 1]);
  });
});

describe("advantages", () => {
  it("MARFT-A is actionGae over each episode's actions, broadcast to the action's tokens", () => {
    const ep = episode(0, 0, 1, [turn("a", 0, [1, 2], [3, 4, 5]), turn("b", 1, [1, 2, 3], [6])]);
    const steps = toSteps([ep], roleOf, { kind: "last" });
    const credit = ESTIMATORS["marft-a"](
      creditBatch(steps, [ep], atObservation(steps, [0.3, 0.6])),
      params(0.9, 0.8),
    );
    const ref = actionGae([0, 1], [0.3, 0.6], 0, 0.9, 0.8);
    expect(credit.level).toBe("action");
    expect(policyDatum(steps[0]!, credit.advantages[0]!).advantages.slice(2)).toEqual([
      ref.advantages[0],
      ref.advantages[0],
      ref.advantages[0],
    ]);
    expect(credit.advantages[1]).toEqual([ref.advantages[1]]);
    expect(credit.returns.map((r) => r[0])).toEqual(ref.returns);
  });

  it("MARFT-A bootstraps a truncated episode from the critic's value after its last action", () => {
    const ep = episode(0, 0, 1, [turn("a", 0, [1, 2], [3]), turn("b", 1, [1, 2, 3], [4])]);
    ep.terminated = false;
    ep.truncated = true;
    const steps = toSteps([ep], roleOf, { kind: "last" });
    const values = [
      [0, 0.3, 0],
      [0, 0, 0.6, 0.9], // V after b's action: 0.9
    ];
    const credit = ESTIMATORS["marft-a"](creditBatch(steps, [ep], values), params(0.9, 0.8));
    expect(credit.advantages.map((a) => a[0])).toEqual(
      actionGae([0, 1], [0.3, 0.6], 0.9, 0.9, 0.8).advantages,
    );
  });

  it("MARFT-T runs over action tokens; the critic's values are read at the states before each token", () => {
    const ep = episode(0, 0, 1, [turn("a", 0, [1, 2], [3, 4]), turn("b", 1, [1, 2, 3, 4], [5])]);
    const steps = toSteps([ep], roleOf, { kind: "last" });
    // values[i] = V(tokens[: i + 1]): the state before response token j is values[P + j - 1]
    const values = [
      [0, 10, 11, 12],
      [0, 0, 0, 20, 21],
    ];
    const credit = ESTIMATORS["marft-t"](creditBatch(steps, [ep], values), params(1, 1));
    expect(credit.level).toBe("token");
    expect(credit.values).toEqual([[10, 11], [20]]);
    // gamma = lambda = 1: advantages are Monte-Carlo returns (1 at the end) minus values
    expect(credit.advantages[0]).toEqual([1 - 10, 1 - 11]);
    expect(credit.advantages[1]).toEqual([1 - 20]);
    const v = valueDatum(steps[0]!, credit, 0);
    expect(v.weights).toEqual([0, 1, 1, 0]);
    expect(v.returns).toEqual([0, 1, 1, 0]);
    expect(v.old_values).toEqual([0, 10, 11, 0]);
  });

  it("critic-free: return-to-go minus the mean of the same agent in the same group", () => {
    const eps = [
      episode(0, 0, 1, [turn("a", 0, [1, 2], [3]), turn("b", 1, [1, 2], [4])]),
      episode(1, 0, 0, [turn("a", 0, [1, 2], [3]), turn("b", 1, [1, 2], [4])]),
      episode(2, 1, 1, [turn("a", 0, [1, 2], [3]), turn("b", 1, [1, 2], [4])]),
      episode(3, 1, 1, [turn("a", 0, [1, 2], [3]), turn("b", 1, [1, 2], [4])]),
    ];
    const steps = toSteps(eps, roleOf, { kind: "last" });
    const credit = ESTIMATORS["critic-free"](creditBatch(steps, eps, null), params(1, 1));
    expect(credit.advantages.map((a) => a[0])).toEqual([0.5, 0.5, -0.5, -0.5, 0, 0, 0, 0]);
    expect(steps.map((s) => s.turn.agent)).toEqual(["a", "b", "a", "b", "a", "b", "a", "b"]);
  });

  it("per-agent normalisation: one agent's scale does not swamp another's, zero agents stay zero", () => {
    const eps = [0, 1, 2, 3].map((i) =>
      episode(i, i, 0, [turn("a", 0, [1, 2], [3, 4]), turn("b", 1, [1, 2], [5])]),
    );
    const steps = toSteps(eps, roleOf, { kind: "last" });
    const agents = steps.map((s) => s.turn.agent);
    const raw = steps.map((s, i) => [s.turn.agent === "a" ? 1000 * (i % 4) : 0]);
    const { advantages, zeroAgents } = normalizeCredit(raw, agents);
    expect(zeroAgents).toEqual(["b"]);
    const a = advantages.filter((_, i) => agents[i] === "a").map((x) => x[0]!);
    expect(a.reduce((x, y) => x + y, 0)).toBeCloseTo(0, 9);
    expect(advantages.filter((_, i) => agents[i] === "b").every((xs) => xs.every((x) => x === 0))).toBe(true);
    // the action's tokens share its advantage
    for (const [i, s] of steps.entries()) {
      expect(new Set(policyDatum(s, advantages[i]!).advantages.slice(s.turn.promptIds.length)).size).toBe(1);
    }
  });

  it("normalisation of the listed agents only: the others keep their raw advantages", () => {
    const eps = [0, 1, 2, 3].map((i) =>
      episode(i, i, 0, [turn("a", 0, [1, 2], [3]), turn("b", 1, [1, 2], [5])]),
    );
    const steps = toSteps(eps, roleOf, { kind: "last" });
    const agents = steps.map((s) => s.turn.agent);
    const given = steps.map((s, i) => [s.turn.agent === "a" ? 10 * i : i / 100]);
    const ofAgent = (xs: number[][], agent: string) =>
      xs.filter((_, i) => agents[i] === agent).map((x) => x[0]!);
    const rawA = ofAgent(given, "a");
    const scaled = normalizeCredit(given, agents, { only: new Set(["b"]) });
    expect(scaled.zeroAgents).toEqual([]);
    expect(ofAgent(scaled.advantages, "a")).toEqual(rawA);
    const b = ofAgent(scaled.advantages, "b");
    expect(b.reduce((x, y) => x + y, 0)).toBeCloseTo(0, 9);
    expect(Math.sqrt(b.reduce((x, y) => x + y * y, 0) / b.length)).toBeCloseTo(1, 9);
    // centre only: the listed agent's deviations from its mean, at their own scale
    const centred = ofAgent(
      normalizeCredit(given, agents, { only: new Set(["b"]), scale: false }).advantages,
      "b",
    );
    const raw = steps.filter((s) => s.turn.agent === "b").map((_, j) => (2 * j + 1) / 100);
    const rawMean = raw.reduce((x, y) => x + y, 0) / raw.length;
    centred.forEach((x, j) => {
      expect(x).toBeCloseTo(raw[j]! - rawMean, 12);
    });
  });
});

describe("engine data", () => {
  it("policy datum: weights, old log-probs and advantages only on the response tokens", () => {
    const ep = episode(0, 0, 1, [turn("a", 0, [7, 8, 9], [10, 11])]);
    const [s] = toSteps([ep], roleOf, { kind: "team" });
    expect(policyDatum(s!, [0.5, 0.5])).toEqual({
      tokens: [7, 8, 9, 10, 11],
      weights: [0, 0, 0, 1, 1],
      old_logprobs: [0, 0, 0, -1, -2],
      advantages: [0, 0, 0, 0.5, 0.5],
    });
    const credit: Credit = { level: "action", advantages: [[0.5]], returns: [[0.75]], values: [[0.25]] };
    expect(valueDatum(s!, credit, 0)).toEqual({
      tokens: [7, 8, 9],
      weights: [0, 0, 1],
      returns: [0, 0, 0.75],
      old_values: [0, 0, 0.25],
    });
  });
});

describe("seeded PRNG", () => {
  it("restores its stream from its state", () => {
    const a = new Rng(42);
    a.next();
    const b = new Rng(a.state());
    expect(Array.from({ length: 5 }, () => a.nextUint32())).toEqual(
      Array.from({ length: 5 }, () => b.nextUint32()),
    );
    expect(new Rng(1).shuffle([1, 2, 3, 4, 5, 6]).sort()).toEqual([1, 2, 3, 4, 5, 6]);
    const xs = Array.from({ length: 1000 }, () => a.next());
    expect(Math.min(...xs)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...xs)).toBeLessThan(1);
  });
});
