// The run's curves, drawn with uPlot: one chart per quantity, one line per agent (and the team), and
// the same lines of every overlaid run (dashed) on the same axes. A chart keeps its uPlot instance
// and only gets new data (`setData`) while the lines stay the same, so live points appear in place.
import uPlot from "uplot";
import type { AgentView, MetricsRow } from "../api.ts";
import { colorOf, h, TEAM_COLOR } from "./dom.ts";

/** What the charts need of a run. */
export interface RunCurves {
  name: string;
  agents: AgentView[];
  rows: MetricsRow[];
  klCoef: number;
  estimator: string;
}

interface Line {
  label: string;
  key: string;
  color: string;
  /** Sparse series (evaluations): draw points. */
  points?: boolean;
}

interface ChartSpec {
  id: string;
  title: string;
  lines(run: RunCurves): Line[];
  /** Why a chart is empty for this run, when it is empty by design. */
  why?(run: RunCurves): string | undefined;
}

const perAgent =
  (prefix: string, suffix = "") =>
  (run: RunCurves) =>
    run.agents.map((a, i) => ({ label: a.id, key: `${prefix}/${a.id}${suffix}`, color: colorOf(i) }));

/** Keys of the run's rows that start with `prefix`, in first-seen order. */
function keysWith(rows: MetricsRow[], prefix: string): string[] {
  const keys = new Set<string>();
  for (const r of rows) for (const k of Object.keys(r)) if (k.startsWith(prefix)) keys.add(k);
  return [...keys];
}

export const CHARTS: ChartSpec[] = [
  {
    id: "reward",
    title: "reward per episode: team and each agent's credited share",
    lines: (run) => [{ label: "team", key: "reward/mean", color: TEAM_COLOR }, ...perAgent("reward")(run)],
  },
  {
    id: "success",
    title: "success: training episodes solved, held-out accuracy (95% CI)",
    lines: () => [
      { label: "train solved", key: "episodes/correct_frac", color: TEAM_COLOR },
      { label: "eval accuracy", key: "eval/accuracy", color: colorOf(3), points: true },
      { label: "eval CI low", key: "eval/ci95_low", color: "#e1575966", points: true },
      { label: "eval CI high", key: "eval/ci95_high", color: "#e1575966", points: true },
    ],
  },
  {
    id: "kl_ref",
    title: "KL to the reference (base model) per agent",
    lines: perAgent("kl_ref"),
    why: (run) =>
      run.klCoef > 0 ? undefined : "logged only with a KL penalty (ppo.klCoef > 0); this run has none",
  },
  { id: "kl", title: "approx. KL of each update (old ‖ new) per agent", lines: perAgent("kl") },
  { id: "entropy", title: "entropy per agent", lines: perAgent("entropy") },
  { id: "clipfrac", title: "clip fraction per agent", lines: perAgent("clipfrac") },
  { id: "loss", title: "policy loss per agent", lines: perAgent("loss/policy") },
  { id: "grad_norm", title: "gradient norm (before clipping) per agent", lines: perAgent("grad_norm") },
  {
    id: "critic",
    title: "critic: explained variance of the returns",
    lines: () => [{ label: "explained variance", key: "value/explained_variance", color: TEAM_COLOR }],
    why: (run) => (run.estimator === "critic-free" ? "critic-free: no critic" : undefined),
  },
  {
    id: "value",
    title: "critic: mean value vs mean return, value loss",
    lines: () => [
      { label: "value", key: "value/mean", color: colorOf(0) },
      { label: "return", key: "value/return_mean", color: colorOf(1) },
      { label: "loss", key: "loss/value", color: colorOf(3) },
    ],
    why: (run) => (run.estimator === "critic-free" ? "critic-free: no critic" : undefined),
  },
  {
    id: "zero_adv",
    title: "share of zero advantages per agent (no gradient)",
    lines: perAgent("adv", "/zero_frac"),
  },
  { id: "response_len", title: "response length (tokens) per agent", lines: perAgent("response_len") },
  {
    id: "time",
    title: "seconds per phase of an iteration",
    lines: (run) =>
      keysWith(run.rows, "time/").map((k, i) => ({ label: k.slice(5), key: k, color: colorOf(i) })),
  },
  {
    id: "throughput",
    title: "throughput: sampled tokens per second",
    lines: () => [{ label: "sample tokens/s", key: "throughput/sample_tokens_per_s", color: TEAM_COLOR }],
  },
];

const DASHES: number[][] = [[], [6, 4], [2, 3], [10, 3, 2, 3]];

/** The x values (iterations) of all runs, and each line's values on them (null where a run has none). */
function align(runs: RunCurves[], lines: Array<{ run: number; key: string }>): uPlot.AlignedData {
  const xs = [...new Set(runs.flatMap((r) => r.rows.map((row, i) => row["iteration"] ?? i + 1)))].sort(
    (a, b) => a - b,
  );
  const at = runs.map((r) => new Map(r.rows.map((row, i) => [row["iteration"] ?? i + 1, row])));
  return [
    xs,
    ...lines.map(({ run, key }) =>
      xs.map((x) => {
        const v = at[run]!.get(x)?.[key];
        return typeof v === "number" && Number.isFinite(v) ? v : null;
      }),
    ),
  ];
}

/** One chart: a uPlot instance rebuilt only when its lines change. */
class Chart {
  readonly el: HTMLDivElement;
  private plot: uPlot | undefined;
  private signature = "";

  constructor(private readonly spec: ChartSpec) {
    this.el = h("div", { class: "chart", "data-chart": spec.id, "data-points": 0 });
  }

  update(runs: RunCurves[]): void {
    const lines = runs.flatMap((run, r) =>
      this.spec
        .lines(run)
        .map((l) => ({ ...l, run: r, label: runs.length > 1 ? `${run.name} · ${l.label}` : l.label })),
    );
    const data = align(runs, lines);
    // lines without a single value are left out (an agent that never trained, a metric not logged)
    const keep = lines.map((_, i) => data[i + 1]!.some((v) => v !== null));
    const shown = lines.filter((_, i) => keep[i]);
    const shownData = [data[0], ...data.slice(1).filter((_, i) => keep[i])] as uPlot.AlignedData;
    const points = shownData.length > 1 ? shownData[0].length : 0;
    this.el.dataset["points"] = String(points);
    if (shown.length === 0) {
      this.destroy();
      const why = this.spec.why?.(runs[0]!) ?? "no data yet";
      this.el.replaceChildren(
        h("div", { class: "chart-title" }, this.spec.title),
        h("p", { class: "empty" }, why),
      );
      return;
    }
    const signature = JSON.stringify(shown.map((l) => [l.label, l.color, l.run, l.points]));
    if (this.plot && signature === this.signature) {
      this.plot.setData(shownData);
      return;
    }
    this.destroy();
    this.el.replaceChildren();
    this.signature = signature;
    const width = Math.max(320, this.el.clientWidth || 420);
    this.plot = new uPlot(
      {
        title: this.spec.title,
        width,
        height: 200,
        scales: {
          x: { time: false },
          // a flat line (all zeros, one point) would otherwise get a 0..100 axis
          y: {
            range: (_u, lo, hi) => (hi - lo < 1e-12 ? [lo - 1, hi + 1] : uPlot.rangeNum(lo, hi, 0.1, true)),
          },
        },
        // iterations are whole numbers: no ticks between them
        axes: [
          {
            label: "iteration",
            size: 36,
            labelSize: 16,
            incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000],
          },
          { size: 52 },
        ],
        cursor: { drag: { x: true, y: false } },
        series: [
          { label: "iteration" },
          ...shown.map((l) => ({
            label: l.label,
            stroke: l.color,
            width: 1.5,
            dash: DASHES[l.run % DASHES.length]!,
            spanGaps: true,
            points: { show: l.points || points < 30, size: l.points ? 6 : 4 },
          })),
        ],
      },
      shownData,
      this.el,
    );
  }

  resize(): void {
    if (this.plot && this.el.clientWidth > 0) this.plot.setSize({ width: this.el.clientWidth, height: 200 });
  }

  destroy(): void {
    this.plot?.destroy();
    this.plot = undefined;
    this.signature = "";
  }
}

/** The grid of charts of the run view. */
export class ChartGrid {
  readonly el = h("div", { class: "charts" });
  private readonly charts = CHARTS.map((s) => new Chart(s));
  private readonly observer = new ResizeObserver(() => {
    for (const c of this.charts) c.resize();
  });

  constructor() {
    this.el.append(...this.charts.map((c) => c.el));
    this.observer.observe(this.el);
  }

  /** The first run is the main one; the others are drawn dashed on the same axes. */
  update(runs: RunCurves[]): void {
    for (const c of this.charts) c.update(runs);
  }

  destroy(): void {
    this.observer.disconnect();
    for (const c of this.charts) c.destroy();
  }
}
