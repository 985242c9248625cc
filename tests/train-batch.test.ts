// The trainer's pure batch steps: routing, advantages per estimator, engine data alignment.
import { describe, expect, it } from "vitest";
import { actionGae } from "../src/algo/index.ts";
import type { Episode, Turn } from "../src/rollout/types.ts";
import {
  advantageEntries,
  assignValues,
  computeAdvantages,
  makeSteps,
  normalizeSteps,
  policyDatum,
  teamReward,
  valueDatum,
} from "../src/train/batch.ts";
import { Rng } from "../src/rng.ts";

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
    reward: 1, // the env's echo of the team reward: routing replaces it
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
    info: { teamReward: team, score: team, ...extra },
    transcript: [],
  };
}

const roleOf = (a: string) => ({ a: "speaker", b: "listener" })[a]!;

describe("reward routing into steps", () => {
  it("team / last / per-role replace the env's echo of the team reward", () => {
    const ep = episode(0, 0, 1, [turn("a", 0, [1, 2], [3]), turn("b", 1, [1, 2, 3], [4])], {
      roleRewards: { speaker: 0.5 },
    });
    expect(makeSteps([ep], roleOf, { kind: "team" }).map((s) => s.reward)).toEqual([1, 1]);
    expect(makeSteps([ep], roleOf, { kind: "last" }).map((s) => s.reward)).toEqual([0, 1]);
    expect(
      makeSteps([ep], roleOf, { kind: "per-role", roles: { speaker: "speaker", listener: "none" } }).map(
        (s) => s.reward,
      ),
    ).toEqual([0.5, 0]);
  });

  it("an episode without a team reward is a clear error", () => {
    const ep = episode(3, 0, 0, []);
    ep.info = {};
    expect(() => teamReward(ep)).toThrow(
      /episode 3 \(task t0\): the task set neither info\(\)\.teamReward nor info\(\)\.score/,
    );
  });
});

describe("advantages", () => {
  it("MARFT-A is actionGae over each episode's actions, broadcast to the action's tokens", () => {
    const ep = episode(0, 0, 1, [turn("a", 0, [1, 2], [3, 4, 5]), turn("b", 1, [1, 2, 3], [6])]);
    const steps = makeSteps([ep], roleOf, { kind: "last" });
    steps[0]!.value = 0.3;
    steps[1]!.value = 0.6;
    computeAdvantages(steps, [ep], "marft-a", 0.9, 0.8, () => 0);
    const ref = actionGae([0, 1], [0.3, 0.6], 0, 0.9, 0.8);
    expect(steps[0]!.advantages).toEqual([ref.advantages[0], ref.advantages[0], ref.advantages[0]]);
    expect(steps[1]!.advantages).toEqual([ref.advantages[1]]);
    expect(steps.map((s) => s.returns[0])).toEqual(ref.returns);
  });

  it("MARFT-T runs over action tokens; the critic's values are read at the states before each token", () => {
    const ep = episode(0, 0, 1, [turn("a", 0, [1, 2], [3, 4]), turn("b", 1, [1, 2, 3, 4], [5])]);
    const steps = makeSteps([ep], roleOf, { kind: "last" });
    // values[i] = V(tokens[: i + 1]): the state before response token j is values[P + j - 1]
    assignValues(steps[0]!, [0, 10, 11, 12]);
    assignValues(steps[1]!, [0, 0, 0, 20, 21]);
    expect(steps[0]!.tokenValues).toEqual([10, 11]);
    expect(steps[0]!.value).toBe(10);
    expect(steps[0]!.finalValue).toBe(12);
    expect(steps[1]!.tokenValues).toEqual([20]);
    computeAdvantages(steps, [ep], "marft-t", 1, 1, () => 0);
    // gamma = lambda = 1: advantages are Monte-Carlo returns (1 at the end) minus values
    expect(steps[0]!.advantages).toEqual([1 - 10, 1 - 11]);
    expect(steps[1]!.advantages).toEqual([1 - 20]);
    const v = valueDatum(steps[0]!, true);
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
    const steps = makeSteps(eps, roleOf, { kind: "last" });
    computeAdvantages(steps, eps, "critic-free", 1, 1, () => 0);
    expect(steps.map((s) => s.advantages[0])).toEqual([0.5, 0.5, -0.5, -0.5, 0, 0, 0, 0]);
    const raw = advantageEntries(steps, false);
    expect(raw.agents).toEqual(["a", "b", "a", "b", "a", "b", "a", "b"]);
  });

  it("per-agent normalisation: one agent's scale does not swamp another's, zero agents stay zero", () => {
    const eps = [0, 1, 2, 3].map((i) =>
      episode(i, i, 0, [turn("a", 0, [1, 2], [3, 4]), turn("b", 1, [1, 2], [5])]),
    );
    const steps = makeSteps(eps, roleOf, { kind: "last" });
    steps.forEach((s, i) => {
      const a = s.turn.agent === "a" ? 1000 * (i % 4) : 0;
      s.advantages = s.turn.responseIds.map(() => a);
    });
    expect(normalizeSteps(steps, false)).toEqual(["b"]);
    const a = steps.filter((s) => s.turn.agent === "a").map((s) => s.advantages[0]!);
    expect(a.reduce((x, y) => x + y, 0)).toBeCloseTo(0, 9);
    expect(steps.filter((s) => s.turn.agent === "b").every((s) => s.advantages.every((x) => x === 0))).toBe(
      true,
    );
    // the action's tokens share its advantage
    for (const s of steps) expect(new Set(s.advantages).size).toBe(1);
  });

  it("normalisation of the listed agents only: the others keep their raw advantages", () => {
    const eps = [0, 1, 2, 3].map((i) =>
      episode(i, i, 0, [turn("a", 0, [1, 2], [3]), turn("b", 1, [1, 2], [5])]),
    );
    const steps = makeSteps(eps, roleOf, { kind: "last" });
    steps.forEach((s, i) => {
      s.advantages = [s.turn.agent === "a" ? 10 * i : i / 100];
    });
    const rawA = steps.filter((s) => s.turn.agent === "a").map((s) => s.advantages[0]!);
    expect(normalizeSteps(steps, false, { only: new Set(["b"]) })).toEqual([]);
    expect(steps.filter((s) => s.turn.agent === "a").map((s) => s.advantages[0]!)).toEqual(rawA);
    const b = steps.filter((s) => s.turn.agent === "b").map((s) => s.advantages[0]!);
    expect(b.reduce((x, y) => x + y, 0)).toBeCloseTo(0, 9);
    expect(Math.sqrt(b.reduce((x, y) => x + y * y, 0) / b.length)).toBeCloseTo(1, 9);
    // centre only: the listed agent's deviations from its mean, at their own scale
    steps.forEach((s, i) => {
      s.advantages = [s.turn.agent === "a" ? 10 * i : i / 100];
    });
    normalizeSteps(steps, false, { only: new Set(["b"]), scale: false });
    const centred = steps.filter((s) => s.turn.agent === "b").map((s) => s.advantages[0]!);
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
    const [s] = makeSteps([ep], roleOf, { kind: "team" });
    s!.advantages = [0.5, 0.5];
    expect(policyDatum(s!)).toEqual({
      tokens: [7, 8, 9, 10, 11],
      weights: [0, 0, 0, 1, 1],
      old_logprobs: [0, 0, 0, -1, -2],
      advantages: [0, 0, 0, 0.5, 0.5],
    });
    s!.value = 0.25;
    s!.returns = [0.75];
    expect(valueDatum(s!, false)).toEqual({
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
