// The comparison as a text table (what `marft compare` prints): one row per variant.
import type { CompareReport } from "./aggregate.ts";

const pct = (x: number) => (100 * x).toFixed(1);
const p = (x: number) => (x < 1e-3 ? x.toExponential(1) : x.toFixed(3));

/** Header and rows; the CLI lays them out with its table(). */
export function compareRows(r: CompareReport): { header: string[]; rows: string[][] } {
  const header = [
    "variant",
    "accuracy % [95% CI]",
    "per seed",
    "vs first: diff [95% CI]",
    "McNemar p",
    "seeds t p",
    "sampled tokens",
    "iters",
    "wall s",
  ];
  const rows = r.variants.map((v) => {
    const vs = v.vs_first;
    const tok = v.budget.sampled_tokens;
    const its = v.budget.iterations;
    const under = v.budget.under_budget.length
      ? ` (under budget: seeds ${v.budget.under_budget.join(", ")})`
      : "";
    return [
      v.name + (v.missing.length ? ` (${v.missing.length} to run)` : ""),
      v.mean === null ? "-" : `${pct(v.mean)}${v.ci95 ? ` [${pct(v.ci95[0])}, ${pct(v.ci95[1])}]` : ""}`,
      v.seeds.map((s) => pct(s.accuracy)).join(" "),
      vs ? `${pct(vs.diff)} [${pct(vs.ci95[0])}, ${pct(vs.ci95[1])}]` : v.note ? "n/a" : "",
      vs ? p(vs.paired_p) : "",
      vs?.seeds_t ? p(vs.seeds_t.p) : "",
      tok ? (tok.min === tok.max ? `${tok.min}` : `${tok.min}-${tok.max}`) + under : "-",
      its ? (its.min === its.max ? `${its.min}` : `${its.min}-${its.max}`) : "-",
      v.wall_s ? v.wall_s.mean.toFixed(1) : "-",
    ];
  });
  return { header, rows };
}

/** Multi-task comparisons: each task's held-out accuracy per variant (mean over seeds, t-interval). */
export function perTaskRows(r: CompareReport): { header: string[]; rows: string[][] } | null {
  const tasks = [...new Set(r.variants.flatMap((v) => Object.keys(v.per_task ?? {})))];
  if (tasks.length === 0) return null;
  const rows = r.variants.map((v) => [
    v.name,
    ...tasks.map((t) => {
      const x = v.per_task?.[t];
      return x ? `${pct(x.mean)}${x.ci95 ? ` [${pct(x.ci95[0])}, ${pct(x.ci95[1])}]` : ""}` : "-";
    }),
  ]);
  return { header: ["variant", ...tasks.map((t) => `${t} %`)], rows };
}
