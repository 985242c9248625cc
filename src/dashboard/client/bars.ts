// Bars with 95% intervals (uPlot's bar paths; the interval whiskers and per-seed points drawn in a
// draw hook on the same canvas), and the view of a `marft compare` result: its table and its bars.
import uPlot from "uplot";
import type { Bar, CompareData } from "../api.ts";
import { colorOf, fmt, h } from "./dom.ts";

const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
const interval = (ci: [number, number]) => `[${pct(ci[0])}, ${pct(ci[1])}]`;
/** A difference of fractions in percentage points, signed. */
const points = (d: number) => `${d > 0 ? "+" : ""}${(100 * d).toFixed(1)}`;

/** A bar chart of accuracies (fractions) with their intervals, one bar per entry. */
export function barChart(title: string, bars: Bar[], id = "bars"): HTMLElement {
  const el = h("div", { class: "chart bar-chart", "data-chart": id, "data-points": bars.length });
  const xs = bars.map((_, i) => i);
  const top =
    Math.min(1, Math.max(...bars.flatMap((b) => [b.ci95[1], b.value, ...(b.points ?? [])])) * 1.15) || 1;
  const whiskers = (u: uPlot) => {
    const ctx = u.ctx;
    ctx.save();
    bars.forEach((b, i) => {
      const x = u.valToPos(i, "x", true);
      const [lo, hi] = [u.valToPos(b.ci95[0], "y", true), u.valToPos(b.ci95[1], "y", true)];
      const w = 8 * devicePixelRatio;
      ctx.strokeStyle = "#222";
      ctx.lineWidth = 1.5 * devicePixelRatio;
      ctx.beginPath();
      ctx.moveTo(x, lo);
      ctx.lineTo(x, hi);
      ctx.moveTo(x - w, lo);
      ctx.lineTo(x + w, lo);
      ctx.moveTo(x - w, hi);
      ctx.lineTo(x + w, hi);
      ctx.stroke();
      ctx.fillStyle = "#222";
      (b.points ?? []).forEach((p, k, all) => {
        const dx = (k - (all.length - 1) / 2) * 6 * devicePixelRatio;
        ctx.beginPath();
        ctx.arc(
          x + dx + 14 * devicePixelRatio,
          u.valToPos(p, "y", true),
          3 * devicePixelRatio,
          0,
          2 * Math.PI,
        );
        ctx.fill();
      });
      ctx.font = `${11 * devicePixelRatio}px sans-serif`;
      ctx.textAlign = "center";
      ctx.fillText(
        `${pct(b.value)} ${interval(b.ci95)}`,
        x,
        Math.min(hi, u.valToPos(b.value, "y", true)) - 6 * devicePixelRatio,
      );
    });
    ctx.restore();
  };
  // one colour per bar (the colours of the table's swatches); unit 3: the values are colours
  const colors = bars.map((_, i) => `${colorOf(i)}c0`);
  const bar = uPlot.paths.bars!({
    size: [0.6, 90],
    disp: { fill: { unit: 3 as uPlot.Series.BarsPathBuilderFacetUnit, values: () => colors } },
  });
  new uPlot(
    {
      title,
      width: Math.max(360, Math.min(900, 130 * bars.length + 120)),
      height: 260,
      legend: { show: false },
      cursor: { show: false },
      scales: { x: { time: false, range: [-0.5, bars.length - 0.5] }, y: { range: [0, top] } },
      axes: [
        { splits: () => xs, values: (_u, splits) => splits.map((i) => bars[i]?.name ?? ""), size: 40 },
        { values: (_u, splits) => splits.map((v) => pct(v)), size: 56 },
      ],
      series: [
        {},
        {
          label: "mean",
          paths: bar,
          points: { show: false },
          fill: `${colorOf(0)}b0`,
          stroke: colorOf(0),
        },
      ],
      hooks: { draw: [whiskers] },
    },
    [xs, bars.map((b) => b.value)],
    el,
  );
  return el;
}

/** A `marft compare` result: a table of variants (accuracy over seeds, difference to the first) and bars. */
export function compareView(c: CompareData): HTMLElement {
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : Number.NaN);
  const rows = c.variants.map((v, i) =>
    h(
      "tr",
      { "data-variant": v.name },
      h("td", {}, h("span", { class: "swatch", style: `background:${colorOf(i)}` }), v.name),
      h("td", { class: "num" }, String(v.seeds.length)),
      h("td", { class: "num" }, v.mean === null ? "–" : pct(v.mean)),
      h("td", { class: "num" }, v.ci95 === null ? "–" : interval(v.ci95)),
      h(
        "td",
        { class: "num" },
        v.vs_first
          ? `${points(v.vs_first.diff)} [${points(v.vs_first.ci95[0])}, ${points(v.vs_first.ci95[1])}] pts`
          : "–",
      ),
      h("td", { class: "num" }, v.vs_first ? fmt(v.vs_first.paired_p) : "–"),
      h("td", { class: "num" }, Math.round(mean(v.seeds.map((s) => s.sampled_tokens))).toLocaleString("en")),
      h("td", { class: "num" }, fmt(mean(v.seeds.map((s) => s.wall_s)))),
      h("td", {}, v.seeds.map((s) => `${s.seed}: ${pct(s.accuracy)}`).join(", ")),
    ),
  );
  return h(
    "div",
    { class: "compare", "data-compare": c.name },
    h("h1", {}, `compare: ${c.name}`),
    h(
      "table",
      { class: "table" },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          [
            "variant",
            "seeds",
            "accuracy",
            "95% CI",
            "vs first",
            "paired p",
            "sampled tokens",
            "wall s",
            "per seed",
          ].map((t) => h("th", {}, t)),
        ),
      ),
      h("tbody", {}, rows),
    ),
    barChart(
      "held-out accuracy per variant: mean over seeds, 95% CI, one dot per seed",
      c.variants.flatMap((v) =>
        v.mean === null || v.ci95 === null
          ? []
          : [{ name: v.name, value: v.mean, ci95: v.ci95, points: v.seeds.map((s) => s.accuracy) }],
      ),
      "compare",
    ),
  );
}
