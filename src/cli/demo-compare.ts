// The demo's comparison of a trained team with a trained single agent on the same held-out problems:
// per seed a paired difference (exact McNemar, Agresti-Min interval), across seeds a paired t-test
// over problems of the seed-averaged differences (the problems are the independent units; the same
// problem under three seeds is not three independent pairs). Pure functions, tested on their own.
import { pairedDifference, pairedTTest } from "../algo/index.ts";

export interface SeedComparison {
  seed: number;
  team_after: number;
  baseline_after: number;
  /** team − baseline accuracy */
  diff: number;
  ci95: [number, number];
  /** exact McNemar test */
  paired_p: number;
  /** problems the team solved and the baseline did not */
  team_only: number;
  baseline_only: number;
}

export interface Comparison {
  team_minus_baseline: number;
  ci95: [number, number];
  paired_p: number;
  seeds: number[];
  per_seed: SeedComparison[];
  /** Every seed's difference has the sign of the mean (and none is 0). */
  same_sign: boolean;
  method: string;
}

export interface SeedOutcome {
  seed: number;
  /** Per held-out problem, the same problems in the same order on both sides and for every seed. */
  team: readonly boolean[];
  baseline: readonly boolean[];
}

const rate = (xs: readonly boolean[]) => xs.filter(Boolean).length / xs.length;

export function compareSeed(o: SeedOutcome): SeedComparison {
  const d = pairedDifference(o.baseline, o.team);
  return {
    seed: o.seed,
    team_after: rate(o.team),
    baseline_after: rate(o.baseline),
    diff: d.diff,
    ci95: d.ci95,
    paired_p: d.p,
    team_only: d.improved,
    baseline_only: d.worsened,
  };
}

export function compareSeeds(outcomes: readonly SeedOutcome[]): Comparison {
  if (outcomes.length === 0) throw new Error("compareSeeds: no seeds");
  const n = outcomes[0]!.team.length;
  for (const o of outcomes) {
    if (o.team.length !== n || o.baseline.length !== n) {
      throw new Error(`compareSeeds: seed ${o.seed} scored a different number of problems than ${n}`);
    }
  }
  const perSeed = outcomes.map(compareSeed);
  const seeds = outcomes.map((o) => o.seed);
  const meanDiff = perSeed.reduce((s, x) => s + x.diff, 0) / perSeed.length;
  const sameSign = meanDiff !== 0 && perSeed.every((x) => Math.sign(x.diff) === Math.sign(meanDiff));
  if (outcomes.length === 1) {
    const only = perSeed[0]!;
    return {
      team_minus_baseline: only.diff,
      ci95: only.ci95,
      paired_p: only.paired_p,
      seeds,
      per_seed: perSeed,
      same_sign: sameSign,
      method: "one seed: exact McNemar test, Agresti-Min interval",
    };
  }
  const perProblem = (side: "team" | "baseline") =>
    Array.from(
      { length: n },
      (_, i) => outcomes.reduce((s, o) => s + (o[side][i] ? 1 : 0), 0) / outcomes.length,
    );
  const t = pairedTTest(perProblem("baseline"), perProblem("team"));
  return {
    team_minus_baseline: t.diff,
    ci95: t.ci95,
    paired_p: t.p,
    seeds,
    per_seed: perSeed,
    same_sign: sameSign,
    method: `${outcomes.length} seeds: paired t-test over the ${n} problems of the seed-averaged differences`,
  };
}

/**
 * Samples per problem for a single agent's majority vote to spend at least the team's test-time
 * tokens: 0 when the single agent already spends as many; otherwise the smallest odd k >= 3 whose k
 * answers cost at least the team's (an even vote can tie, and a vote of one is no vote).
 */
export function voteSamples(teamTokensPerProblem: number, baselineTokensPerProblem: number): number {
  if (!(baselineTokensPerProblem > 0) || teamTokensPerProblem <= baselineTokensPerProblem) return 0;
  let k = Math.max(3, Math.ceil(teamTokensPerProblem / baselineTokensPerProblem));
  if (k % 2 === 0) k++;
  return k;
}
