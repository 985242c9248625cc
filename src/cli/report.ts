// report.html for a demo run: curves a person would rather look at than read. Plain HTML with inline
// SVG, no scripts and no external assets, so it opens anywhere, offline.
import type { RunConfig } from "../config/schema.ts";
import type { EvalResult } from "../train/evaluate.ts";
import type { MetricsRow } from "../train/phases.ts";

interface Job {
  before?: EvalResult;
  after: EvalResult;
  metrics: MetricsRow[];
}

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

function esc(s: string): string {
  return s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]!);
}

/** A line chart of several series over iterations, as an SVG string. */
export function lineChart(title: string, series: Array<{ name: string; ys: number[] }>): string {
  const W = 460;
  const H = 220;
  const pad = { l: 48, r: 12, t: 28, b: 32 };
  const all = series.flatMap((s) => s.ys).filter(Number.isFinite);
  if (all.length === 0) return `<p>${esc(title)}: no data</p>`;
  let lo = Math.min(...all);
  let hi = Math.max(...all);
  if (hi - lo < 1e-9) {
    lo -= 0.5;
    hi += 0.5;
  }
  const n = Math.max(...series.map((s) => s.ys.length));
  const x = (i: number) => pad.l + (n <= 1 ? 0 : (i / (n - 1)) * (W - pad.l - pad.r));
  const y = (v: number) => pad.t + (1 - (v - lo) / (hi - lo)) * (H - pad.t - pad.b);
  const lines = series.map((s, k) => {
    const pts = s.ys
      .map((v, i) => (Number.isFinite(v) ? `${x(i).toFixed(1)},${y(v).toFixed(1)}` : ""))
      .filter(Boolean)
      .join(" ");
    const color = COLORS[k % COLORS.length];
    return `<polyline fill="none" stroke="${color}" stroke-width="2" points="${pts}"/>
      <text x="${W - pad.r - 4}" y="${pad.t + 14 * (k + 1)}" text-anchor="end" fill="${color}" font-size="12">${esc(s.name)}</text>`;
  });
  const ticks = [lo, (lo + hi) / 2, hi]
    .map(
      (v) =>
        `<text x="${pad.l - 6}" y="${y(v) + 4}" text-anchor="end" font-size="11">${v.toPrecision(3)}</text>
         <line x1="${pad.l}" x2="${W - pad.r}" y1="${y(v)}" y2="${y(v)}" stroke="#eee"/>`,
    )
    .join("");
  return `<svg width="${W}" height="${H}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">
    <text x="${pad.l}" y="16" font-size="13" font-weight="bold">${esc(title)}</text>${ticks}
    <line x1="${pad.l}" x2="${pad.l}" y1="${pad.t}" y2="${H - pad.b}" stroke="#999"/>
    <line x1="${pad.l}" x2="${W - pad.r}" y1="${H - pad.b}" y2="${H - pad.b}" stroke="#999"/>
    <text x="${(W + pad.l) / 2}" y="${H - 6}" text-anchor="middle" font-size="11">iteration (1..${n})</text>
    ${lines.join("")}</svg>`;
}

/** Accuracy bars with 95% intervals. */
export function accuracyChart(bars: Array<{ name: string; acc: number; ci: [number, number] }>): string {
  const W = 460;
  const H = 220;
  const base = 190;
  const scale = 160; // pixels for 100%
  const bw = Math.min(70, (W - 60) / bars.length - 20);
  const items = bars.map((b, i) => {
    const x = 50 + i * (bw + 20);
    const top = base - b.acc * scale;
    return `<rect x="${x}" y="${top}" width="${bw}" height="${b.acc * scale}" fill="${COLORS[i % COLORS.length]}" opacity="0.75"/>
      <line x1="${x + bw / 2}" x2="${x + bw / 2}" y1="${base - b.ci[1] * scale}" y2="${base - b.ci[0] * scale}" stroke="#000"/>
      <text x="${x + bw / 2}" y="${top - 6}" text-anchor="middle" font-size="11">${(100 * b.acc).toFixed(1)}%</text>
      <text x="${x + bw / 2}" y="${base + 14}" text-anchor="middle" font-size="10">${esc(b.name)}</text>`;
  });
  return `<svg width="${W}" height="${H}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">
    <text x="50" y="16" font-size="13" font-weight="bold">held-out accuracy (greedy pass@1, 95% CI)</text>
    <line x1="40" x2="${W - 10}" y1="${base}" y2="${base}" stroke="#999"/>${items.join("")}</svg>`;
}

function series(rows: MetricsRow[], key: string): number[] {
  return rows.map((r) => (typeof r[key] === "number" ? (r[key] as number) : Number.NaN));
}

function transcripts(job: Job & { before: EvalResult }, count: number): string {
  const after = new Map(job.after.problems.map((p) => [p.taskId, p]));
  const picked = job.before.problems.filter((p) => after.has(p.taskId)).slice(0, count);
  const show = (t: Array<{ role: string; content: string }>) =>
    t.map((m) => `<div class="msg"><b>${esc(m.role)}</b> ${esc(m.content)}</div>`).join("");
  return picked
    .map((p) => {
      const q = after.get(p.taskId)!;
      return `<tr><td>${show(p.transcript)}<p class="${p.correct ? "ok" : "bad"}">${p.correct ? "correct" : "wrong"}</p></td>
        <td>${show(q.transcript)}<p class="${q.correct ? "ok" : "bad"}">${q.correct ? "correct" : "wrong"}</p></td></tr>`;
    })
    .join("");
}

export function renderReport(r: {
  summary: Record<string, unknown>;
  team: Job & { before: EvalResult };
  baseline?: Job;
  config: RunConfig;
}): string {
  const agents = r.config.agents.map((a) => a.id);
  const rewards = [{ name: "team", ys: series(r.team.metrics, "reward/mean") }];
  if (r.baseline) rewards.push({ name: "single agent", ys: series(r.baseline.metrics, "reward/mean") });
  const perAgent = (prefix: string) =>
    agents.map((a) => ({ name: a, ys: series(r.team.metrics, `${prefix}/${a}`) }));
  const bars = [
    { name: "team before", acc: r.team.before.accuracy, ci: r.team.before.ci95 },
    { name: "team after", acc: r.team.after.accuracy, ci: r.team.after.ci95 },
  ];
  if (r.baseline)
    bars.push({ name: "single agent after", acc: r.baseline.after.accuracy, ci: r.baseline.after.ci95 });
  return `<!doctype html><html><head><meta charset="utf-8"><title>MARFT demo report</title>
<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}
.grid{display:flex;flex-wrap:wrap;gap:16px}.msg{margin:4px 0;white-space:pre-wrap;font-size:13px}
table{border-collapse:collapse;width:100%}td,th{border:1px solid #ddd;padding:6px;vertical-align:top}
.ok{color:#2a2;font-weight:bold}.bad{color:#c22;font-weight:bold}pre{background:#f6f6f6;padding:8px}</style></head><body>
<h1>MARFT demo: ${esc(agents.join(" → "))}</h1>
<pre>${esc(JSON.stringify(r.summary, null, 2))}</pre>
<div class="grid">
${accuracyChart(bars)}
${lineChart("mean team reward per iteration", rewards)}
${lineChart("KL(old ‖ new) per agent", perAgent("kl"))}
${lineChart("entropy per agent", perAgent("entropy"))}
${lineChart("policy loss per agent", perAgent("loss/policy"))}
${lineChart("critic explained variance", [{ name: "critic", ys: series(r.team.metrics, "value/explained_variance") }])}
</div>
<h2>Transcripts: the same held-out problems before and after training (greedy)</h2>
<table><tr><th>before</th><th>after</th></tr>${transcripts(r.team, 6)}</table>
</body></html>
`;
}
