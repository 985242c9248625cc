// From finished cells to the comparison's answer (compare.json): per variant and seed the held-out
// accuracy with its Wilson interval, the budget used and the reward curve; across seeds the mean
// with a t-interval; against the first variant the paired difference on the same held-out problems.
//
// The paired comparison pools per-problem pairs across seeds: problem i of seed s of the variant is
// paired with problem i of seed s of the first variant (the same seed: the same task order and
// initialisation for both). `diff` is the mean of (variant − first) over all pairs (= the mean of the
// per-seed accuracy differences), its interval Agresti-Min's, `paired_p` the exact McNemar test on
// the pooled discordant pairs. Pooling treats the seed x problem pairs as independent: it says
// whether the difference is more than evaluation noise for these trained models. Whether it is more
// than training noise is `seeds_t`, a paired t-test over the per-seed accuracy differences (needs 2
// seeds or more; with 3 it has little power). A claim should pass both.
import { meanInterval, pairedDifference, pairedTTest } from "../algo/index.ts";
import type { CellResult } from "./cell.ts";

export interface SeedReport {
  seed: number;
  accuracy: number;
  ci95: [number, number];
  n: number;
  sampled_tokens: number;
  iterations: number;
  wall_s: number;
  train_s: number;
  per_task?: Record<string, number>;
}

export interface VsFirst {
  diff: number;
  ci95: [number, number];
  paired_p: number;
  improved: number;
  worsened: number;
  pairs: number;
  seeds_t: { diff: number; ci95: [number, number]; p: number } | null;
}

export interface VariantReport {
  name: string;
  about: string;
  /** What the variant's config changes from the first variant's (seed aside). */
  changes: string[];
  untrained: boolean;
  seeds: SeedReport[];
  /** Seeds still to run (the report is partial while it is not empty). */
  missing: number[];
  mean: number | null;
  ci95: [number, number] | null;
  per_task?: Record<string, { mean: number; ci95: [number, number] | null }>;
  budget: {
    sampled_tokens: { min: number; max: number; mean: number } | null;
    iterations: { min: number; max: number } | null;
    /** Cells that stopped on maxIterations below the token budget. */
    under_budget: number[];
  };
  wall_s: { mean: number; ci95: [number, number] | null } | null;
  vs_first: VsFirst | null;
  /** Why vs_first is null when it could be expected. */
  note?: string;
  curves: Array<{ seed: number; points: Array<[number, number]> }>;
}

export interface CompareReport {
  spec: string;
  base: string;
  budget: { sampledTokens?: number; iterations?: number; maxIterations?: number };
  seeds: number[];
  eval: { n: number | null; greedy: boolean };
  complete: boolean;
  method: string;
  /** The commits and machines the cells were computed with (more than one: say so in a paper). */
  provenance: { commits: string[]; hosts: string[] };
  variants: VariantReport[];
}

export interface VariantCells {
  name: string;
  about: string;
  changes: string[];
  untrained: boolean;
  /** Seed -> its cell result, if finished. */
  cells: Map<number, CellResult>;
}

export const METHOD =
  "per seed: Wilson 95% interval of held-out pass@1; across seeds: mean with a t 95% interval (n-1 df, cut to [0, 1]); vs the first variant: per-problem pairs of the same seed pooled over seeds, diff = mean(variant - first), Agresti-Min 95% interval, exact McNemar p; seeds_t: paired t-test over per-seed accuracy differences";

/** An interval of an accuracy, cut to [0, 1] (a t-interval over few seeds can reach beyond). */
const clip01 = (ci: [number, number] | null): [number, number] | null =>
  ci ? [Math.max(0, ci[0]), Math.min(1, ci[1])] : null;

function minMax(xs: readonly number[]): { min: number; max: number } | null {
  return xs.length ? { min: Math.min(...xs), max: Math.max(...xs) } : null;
}

/** The paired comparison of a variant with the first over the seeds both have finished. */
export function versusFirst(
  first: ReadonlyMap<number, CellResult>,
  other: ReadonlyMap<number, CellResult>,
  seeds: readonly number[],
): { vs: VsFirst | null; note?: string } {
  const both = seeds.filter((s) => first.has(s) && other.has(s));
  if (both.length === 0) return { vs: null, note: "no seed finished for both" };
  const a: boolean[] = [];
  const b: boolean[] = [];
  for (const s of both) {
    const x = first.get(s)!.problems;
    const y = other.get(s)!.problems;
    if (x.length !== y.length || x.some((p, i) => p.id !== y[i]!.id)) {
      return {
        vs: null,
        note: `seed ${s}: the held-out problems differ from the first variant's; no paired test`,
      };
    }
    a.push(...x.map((p) => p.correct));
    b.push(...y.map((p) => p.correct));
  }
  const d = pairedDifference(a, b);
  const accA = both.map((s) => first.get(s)!.accuracy);
  const accB = both.map((s) => other.get(s)!.accuracy);
  const t = both.length >= 2 ? pairedTTest(accA, accB) : null;
  return {
    vs: {
      diff: d.diff,
      ci95: d.ci95,
      paired_p: d.p,
      improved: d.improved,
      worsened: d.worsened,
      pairs: d.n,
      seeds_t: t ? { diff: t.diff, ci95: t.ci95, p: t.p } : null,
    },
  };
}

/** One variant's report; `first` is the first variant's cells (null for the first itself). */
export function variantReport(
  v: VariantCells,
  seeds: readonly number[],
  first: VariantCells | null,
  budget: CompareReport["budget"],
): VariantReport {
  const done = seeds.filter((s) => v.cells.has(s)).map((s) => v.cells.get(s)!);
  const perTask = (c: CellResult) =>
    c.per_task ? Object.fromEntries(Object.entries(c.per_task).map(([k, t]) => [k, t.accuracy])) : undefined;
  const seedReports: SeedReport[] = done.map((c) => ({
    seed: c.seed,
    accuracy: c.accuracy,
    ci95: c.ci95,
    n: c.n,
    sampled_tokens: c.sampled_tokens,
    iterations: c.iterations,
    wall_s: c.wall_s,
    train_s: c.train_s,
    ...(c.per_task ? { per_task: perTask(c) } : {}),
  }));
  const acc = done.length ? meanInterval(done.map((c) => c.accuracy)) : null;
  const tasks = done[0]?.per_task ? Object.keys(done[0].per_task) : [];
  const tokens = done.map((c) => c.sampled_tokens);
  const vs = first ? versusFirst(first.cells, v.cells, seeds) : { vs: null };
  const wall = done.length ? meanInterval(done.map((c) => c.wall_s)) : null;
  const under =
    budget.sampledTokens !== undefined && !v.untrained
      ? done.filter((c) => c.sampled_tokens < budget.sampledTokens!).map((c) => c.seed)
      : [];
  return {
    name: v.name,
    about: v.about,
    changes: v.changes,
    untrained: v.untrained,
    seeds: seedReports,
    missing: seeds.filter((s) => !v.cells.has(s)),
    mean: acc?.mean ?? null,
    ci95: clip01(acc?.ci95 ?? null),
    ...(tasks.length
      ? {
          per_task: Object.fromEntries(
            tasks.map((k) => {
              const m = meanInterval(done.map((c) => c.per_task![k]!.accuracy));
              return [k, { mean: m.mean, ci95: clip01(m.ci95) }];
            }),
          ),
        }
      : {}),
    budget: {
      sampled_tokens: tokens.length
        ? { ...minMax(tokens)!, mean: tokens.reduce((s, x) => s + x, 0) / tokens.length }
        : null,
      iterations: minMax(done.map((c) => c.iterations)),
      under_budget: under,
    },
    wall_s: wall ? { mean: wall.mean, ci95: wall.ci95 } : null,
    vs_first: vs.vs,
    ...(vs.note ? { note: vs.note } : {}),
    curves: done.map((c) => ({ seed: c.seed, points: c.curve })),
  };
}
