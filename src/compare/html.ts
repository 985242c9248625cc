// compare.html: the comparison as a person reads it. The training reward against sampled tokens
// (one line per seed, a colour per variant), the held-out accuracy per variant (the mean over seeds
// with its t-interval, a dot per seed), and the table of compare.json. Plain HTML with inline SVG,
// no scripts and no external assets.
import type { CompareReport, VariantReport } from "./aggregate.ts";

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];

function esc(s: string): string {
  return s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]!);
}

const f = (x: number, d = 3) => (Number.isFinite(x) ? x.toFixed(d) : "-");
const pct = (x: number) => (Number.isFinite(x) ? `${(100 * x).toFixed(1)}` : "-");

/** Reward against sampled tokens: every seed of every variant. */
function curveChart(variants: readonly VariantReport[]): string {
  const W = 640;
  const H = 300;
  const pad = { l: 52, r: 150, t: 28, b: 40 };
  const pts = variants.flatMap((v) => v.curves.flatMap((c) => c.points)).filter((p) => Number.isFinite(p[1]));
  if (pts.length === 0) return "<p>reward curves: no data yet</p>";
  const xMax = Math.max(...pts.map((p) => p[0]), 1);
  let yLo = Math.min(...pts.map((p) => p[1]));
  let yHi = Math.max(...pts.map((p) => p[1]));
  if (yHi - yLo < 1e-9) [yLo, yHi] = [yLo - 0.5, yHi + 0.5];
  const x = (t: number) => pad.l + (t / xMax) * (W - pad.l - pad.r);
  const y = (r: number) => H - pad.b - ((r - yLo) / (yHi - yLo)) * (H - pad.t - pad.b);
  const lines = variants.flatMap((v, i) =>
    v.curves.map((c) => {
      const d = c.points
        .filter((p) => Number.isFinite(p[1]))
        .map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`)
        .join(" ");
      return `<polyline fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-opacity="0.75" stroke-width="1.5" points="${d}"><title>${esc(v.name)} seed ${c.seed}</title></polyline>`;
    }),
  );
  const legend = variants.map(
    (v, i) =>
      `<rect x="${W - pad.r + 12}" y="${pad.t + i * 18}" width="12" height="3" fill="${COLORS[i % COLORS.length]}"/><text x="${W - pad.r + 30}" y="${pad.t + i * 18 + 5}" font-size="11">${esc(v.name)}</text>`,
  );
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((q) => {
    const t = q * xMax;
    const r = yLo + q * (yHi - yLo);
    return (
      `<text x="${x(t)}" y="${H - pad.b + 14}" font-size="10" text-anchor="middle">${Math.round(t)}</text>` +
      `<text x="${pad.l - 6}" y="${y(r) + 3}" font-size="10" text-anchor="end">${f(r, 2)}</text>` +
      `<line x1="${pad.l}" x2="${W - pad.r}" y1="${y(r)}" y2="${y(r)}" stroke="#eee"/>`
    );
  });
  return `<svg width="${W}" height="${H}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">
<text x="${pad.l}" y="16" font-size="13">training reward (team, per iteration) against sampled tokens</text>
${ticks.join("")}
<line x1="${pad.l}" x2="${W - pad.r}" y1="${H - pad.b}" y2="${H - pad.b}" stroke="#333"/>
<line x1="${pad.l}" x2="${pad.l}" y1="${pad.t}" y2="${H - pad.b}" stroke="#333"/>
<text x="${(pad.l + W - pad.r) / 2}" y="${H - 6}" font-size="11" text-anchor="middle">sampled tokens</text>
${lines.join("\n")}
${legend.join("")}
</svg>`;
}

/** Held-out accuracy per variant: mean over seeds with its t-interval, and a dot per seed. */
function accuracyBars(variants: readonly VariantReport[]): string {
  const W = 640;
  const rowH = 28;
  const pad = { l: 130, r: 20, t: 28, b: 30 };
  const H = pad.t + pad.b + rowH * variants.length;
  const x = (a: number) => pad.l + a * (W - pad.l - pad.r);
  const rows = variants.map((v, i) => {
    const yc = pad.t + i * rowH + rowH / 2;
    const color = COLORS[i % COLORS.length];
    const bar =
      v.mean === null
        ? ""
        : `<rect x="${pad.l}" y="${yc - 8}" width="${x(v.mean) - pad.l}" height="16" fill="${color}" fill-opacity="0.35"/>`;
    const ci = v.ci95
      ? `<line x1="${x(Math.max(0, v.ci95[0]))}" x2="${x(Math.min(1, v.ci95[1]))}" y1="${yc}" y2="${yc}" stroke="#000" stroke-width="1.5"/>` +
        `<line x1="${x(Math.max(0, v.ci95[0]))}" x2="${x(Math.max(0, v.ci95[0]))}" y1="${yc - 5}" y2="${yc + 5}" stroke="#000"/>` +
        `<line x1="${x(Math.min(1, v.ci95[1]))}" x2="${x(Math.min(1, v.ci95[1]))}" y1="${yc - 5}" y2="${yc + 5}" stroke="#000"/>`
      : "";
    const dots = v.seeds
      .map(
        (s) =>
          `<circle cx="${x(s.accuracy)}" cy="${yc}" r="3" fill="${color}"><title>seed ${s.seed}: ${pct(s.accuracy)}%</title></circle>`,
      )
      .join("");
    return `<text x="${pad.l - 8}" y="${yc + 4}" font-size="11" text-anchor="end">${esc(v.name)}</text>${bar}${ci}${dots}`;
  });
  const ticks = [0, 0.25, 0.5, 0.75, 1].map(
    (a) =>
      `<line x1="${x(a)}" x2="${x(a)}" y1="${pad.t}" y2="${H - pad.b}" stroke="#eee"/><text x="${x(a)}" y="${H - pad.b + 14}" font-size="10" text-anchor="middle">${a * 100}%</text>`,
  );
  return `<svg width="${W}" height="${H}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">
<text x="${pad.l}" y="16" font-size="13">held-out accuracy: mean over seeds, 95% t-interval, one dot per seed</text>
${ticks.join("")}
${rows.join("\n")}
</svg>`;
}

function table(r: CompareReport): string {
  const head =
    "<tr><th>variant</th><th>accuracy (mean, 95% CI)</th><th>per seed</th><th>vs first: diff [95% CI]</th><th>McNemar p</th><th>seeds t p</th><th>sampled tokens</th><th>iterations</th><th>wall s</th></tr>";
  const rows = r.variants.map((v) => {
    const ci = v.ci95 ? ` [${pct(v.ci95[0])}, ${pct(v.ci95[1])}]` : "";
    const vs = v.vs_first;
    const tok = v.budget.sampled_tokens;
    const its = v.budget.iterations;
    return `<tr><td title="${esc(v.about)}">${esc(v.name)}${v.missing.length ? ` (${v.missing.length} seeds to run)` : ""}</td>
<td>${v.mean === null ? "-" : `${pct(v.mean)}%${ci}`}</td>
<td>${v.seeds.map((s) => pct(s.accuracy)).join(" ")}</td>
<td>${vs ? `${pct(vs.diff)} [${pct(vs.ci95[0])}, ${pct(vs.ci95[1])}]` : esc(v.note ?? "")}</td>
<td>${vs ? f(vs.paired_p, 4) : ""}</td><td>${vs?.seeds_t ? f(vs.seeds_t.p, 4) : ""}</td>
<td>${tok ? `${tok.min}-${tok.max}` : "-"}</td><td>${its ? `${its.min}-${its.max}` : "-"}</td>
<td>${v.wall_s ? f(v.wall_s.mean, 1) : "-"}</td></tr>`;
  });
  return `<table>${head}${rows.join("\n")}</table>`;
}

export function renderCompareHtml(r: CompareReport): string {
  const budget = r.budget.sampledTokens
    ? `${r.budget.sampledTokens} sampled tokens per cell`
    : `${r.budget.iterations} iterations per cell`;
  const changes = r.variants
    .map(
      (v) =>
        `<li><b>${esc(v.name)}</b>: ${esc(v.about)}${v.changes.length ? ` <small>(${esc(v.changes.join("; "))})</small>` : ""}</li>`,
    )
    .join("\n");
  return `<!doctype html>
<html><head><meta charset="utf-8"><title>marft compare: ${esc(r.spec)}</title>
<style>body{font-family:sans-serif;max-width:1000px;margin:24px auto;color:#222}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}small{color:#666}</style>
</head><body>
<h1>marft compare: ${esc(r.spec)}</h1>
<p>base ${esc(r.base)}; seeds ${r.seeds.join(", ")}; budget: ${budget}; held-out evaluation: ${r.eval.n ?? "all"} problems${r.eval.greedy ? ", greedy" : ""}.${r.complete ? "" : " <b>Partial: some cells are still to run.</b>"}</p>
${table(r)}
<p><small>${esc(r.method)}. Computed with commit ${esc(r.provenance.commits.join(", "))} on ${esc(r.provenance.hosts.join(", "))}.</small></p>
${accuracyBars(r.variants)}
${curveChart(r.variants)}
<h2>Variants</h2><ul>${changes}</ul>
</body></html>
`;
}
