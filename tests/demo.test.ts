// The demo's comparison and its majority-vote baseline: the statistics on hand-made outcomes, the
// vote against an in-memory engine whose answers are scripted per problem.
import { describe, expect, it } from "vitest";
import { compareSeed, compareSeeds, voteSamples } from "../src/cli/demo-compare.ts";
import { loadRunConfig } from "../src/config/load.ts";
import { join } from "node:path";
import { createMathSuite, type MathProblem } from "../src/envs/math/env.ts";
import { majorityVote } from "../src/train/evaluate.ts";
import { setupEngine } from "../src/train/setup.ts";
import { FakeEngine } from "./helpers/fake-engine.ts";

const bools = (s: string) => [...s].map((c) => c === "1");

describe("compareSeeds", () => {
  it("one seed: the paired difference with McNemar's p", () => {
    // 20 problems: the team alone solves 8, the baseline alone 1, both 5
    const team = bools("11111111" + "00000000" + "1111");
    const base = bools("00000000" + "00000001" + "1111");
    const c = compareSeeds([{ seed: 1, team, baseline: base }]);
    expect(c.team_minus_baseline).toBeCloseTo(7 / 20);
    expect(c.per_seed[0]).toMatchObject({ team_only: 8, baseline_only: 1, team_after: 12 / 20 });
    // exact two-sided sign test on 8 vs 1: 2 * (1 + 9) / 512
    expect(c.paired_p).toBeCloseTo(20 / 512, 10);
    expect(c.ci95[0]).toBeGreaterThan(0);
    expect(c.same_sign).toBe(true);
    expect(compareSeed({ seed: 1, team: base, baseline: team }).diff).toBeCloseTo(-7 / 20);
  });

  it("several seeds: a t-test over problems of the seed-averaged differences; same_sign per seed", () => {
    const n = 40;
    const mk = (f: (i: number) => boolean) => Array.from({ length: n }, (_, i) => f(i));
    const seeds = [
      { seed: 1, team: mk((i) => i < 30), baseline: mk((i) => i < 20) },
      { seed: 2, team: mk((i) => i < 28), baseline: mk((i) => i < 21) },
      { seed: 3, team: mk((i) => i < 19), baseline: mk((i) => i < 20) },
    ];
    const c = compareSeeds(seeds);
    expect(c.team_minus_baseline).toBeCloseTo((10 + 7 - 1) / 3 / n);
    expect(c.per_seed.map((x) => x.diff)).toEqual([10 / n, 7 / n, -1 / n]);
    expect(c.same_sign).toBe(false);
    expect(c.paired_p).toBeLessThan(0.05);
    expect(c.ci95[0]).toBeLessThan(c.team_minus_baseline);
    expect(() => compareSeeds([seeds[0]!, { seed: 4, team: [true], baseline: [true] }])).toThrow(/seed 4/);
  });
});

describe("voteSamples", () => {
  it("an odd k >= 3 whose answers cost at least the team's tokens, or none", () => {
    expect(voteSamples(5, 6)).toBe(0);
    expect(voteSamples(6, 6)).toBe(0);
    expect(voteSamples(6.5, 6)).toBe(3);
    expect(voteSamples(13, 3)).toBe(5);
    expect(voteSamples(16, 4)).toBe(5);
  });
});

describe("majorityVote", () => {
  it("answers each problem with its most common sampled answer", async () => {
    const c = loadRunConfig(join(import.meta.dirname, "..", "configs", "demo-baseline.yaml"), [
      "bases.smol.source=tiny:llama",
      "train.deterministic=true",
    ]);
    const problems: MathProblem[] = [
      { id: "a", problem: "Has 2, gets 3 more.", answer: "5" },
      { id: "b", problem: "Has 9, loses 2.", answer: "7" },
      { id: "c", problem: "Has 1, gets 1 more.", answer: "2" },
    ];
    // per problem, the answers of its 1st, 2nd, ... sample
    const script: Record<string, string[]> = {
      "Has 2, gets 3 more.": ["5", "4", "5"], // majority right
      "Has 9, loses 2.": ["7", "6", "6"], // majority wrong although one sample is right
      "Has 1, gets 1 more.": ["no idea", "2", "no idea"], // only one sample answers: it decides
    };
    const seen = new Map<string, number>();
    const engine = new FakeEngine();
    engine.textFor = (req) => {
      const q = String(req.messages!.find((m) => m.role === "user")!.content);
      const k = seen.get(q) ?? 0;
      seen.set(q, k + 1);
      return script[q]![k]!;
    };
    await setupEngine(engine, c);
    const suite = createMathSuite({ train: problems, eval: problems, extract: "last-number" });
    const v = await majorityVote({ engine, suite: suite as never, config: c, tasks: problems, k: 3 });
    expect(v.correct).toEqual([true, false, true]);
    expect(v.accuracy).toBeCloseTo(2 / 3);
    expect(v.tokensSampled).toBe(1 + 1 + 1 + 1 + 1 + 1 + 7 + 1 + 7);
  });
});
