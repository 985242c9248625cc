// One run's page: what it is and how far it got, its dependency graph, the latest value of every
// per-agent quantity, the curves (with any overlaid runs), and the transcripts. `refresh()` fetches
// only the metrics lines it does not have yet.
import type { MetricsRow, ReportExtras, RunData } from "../api.ts";
import { barChart } from "./bars.ts";
import { ChartGrid, type RunCurves } from "./charts.ts";
import { ago, colorOf, fmt, h, visible } from "./dom.ts";
import { graphView } from "./graph.ts";
import type { Source } from "./source.ts";
import { TranscriptView } from "./transcripts.ts";

const curves = (d: RunData): RunCurves => ({
  name: d.name,
  agents: d.agents,
  rows: d.rows,
  klCoef: d.klCoef,
  estimator: d.estimator,
});

/** The latest row's per-agent quantities, as a table (what a person checks first). */
function latestTable(d: RunData): HTMLElement {
  const last: MetricsRow = d.rows.at(-1) ?? {};
  const cols: Array<[string, (a: string) => string]> = [
    ["reward", (a) => `reward/${a}`],
    ["KL (update)", (a) => `kl/${a}`],
    ["KL (reference)", (a) => `kl_ref/${a}`],
    ["entropy", (a) => `entropy/${a}`],
    ["clip frac", (a) => `clipfrac/${a}`],
    ["policy loss", (a) => `loss/policy/${a}`],
    ["grad norm", (a) => `grad_norm/${a}`],
    ["resp. tokens", (a) => `response_len/${a}`],
    ["zero adv.", (a) => `adv/${a}/zero_frac`],
  ];
  const shown = cols.filter(([, key]) => d.agents.some((a) => typeof last[key(a.id)] === "number"));
  return h(
    "table",
    { class: "table latest" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        h("th", {}, `iteration ${last["iteration"] ?? "–"}`),
        shown.map(([t]) => h("th", {}, t)),
      ),
    ),
    h(
      "tbody",
      {},
      h(
        "tr",
        {},
        h("td", {}, h("b", {}, "team")),
        shown.map(([t]) => h("td", { class: "num" }, t === "reward" ? fmt(last["reward/mean"]) : "")),
      ),
      d.agents.map((a, i) =>
        h(
          "tr",
          {},
          h("td", {}, h("span", { class: "swatch", style: `background:${colorOf(i)}` }), a.id),
          shown.map(([, key]) => h("td", { class: "num" }, fmt(last[key(a.id)]))),
        ),
      ),
    ),
  );
}

function header(d: RunData, live: boolean): HTMLElement {
  const it = d.total;
  const total = d.totalIterations;
  const evals = (["before", "after"] as const)
    .map((k) => {
      const e = d.eval[k];
      return e
        ? `${k} ${(100 * e.accuracy).toFixed(1)}% [${(100 * e.ci95[0]).toFixed(1)}, ${(100 * e.ci95[1]).toFixed(1)}] (n=${e.n})`
        : "";
    })
    .filter(Boolean);
  const lastRow = d.rows.at(-1);
  return h(
    "div",
    { class: "run-head" },
    h("h1", {}, d.name, " ", h("span", { class: `state ${d.state}`, "data-state": d.state }, d.state)),
    h(
      "p",
      {},
      `iteration ${it}${total ? ` of ${total}` : ""} · ${d.estimator} · ${d.agents.map((a) => a.id).join(", ")} · updated ${live ? ago(d.updated) : new Date(d.updated).toLocaleString()}`,
      lastRow?.["tokens/sampled"] !== undefined
        ? ` · ${fmt(lastRow["tokens/sampled"])} tokens sampled last iteration`
        : "",
    ),
    total ? h("progress", { max: total, value: it }) : null,
    evals.length ? h("p", {}, `held-out accuracy: ${evals.join(" → ")}`) : null,
    d.error ? h("pre", { class: "error" }, d.error) : null,
  );
}

export class RunPage {
  readonly el = h("div", { class: "run" });
  private data: RunData | undefined;
  private readonly overlays = new Map<string, RunData>();
  private readonly charts = new ChartGrid();
  private readonly transcripts: TranscriptView;
  private readonly head = h("div");
  private readonly team = h("div", { class: "team" });

  constructor(
    private readonly source: Source,
    readonly name: string,
    readonly overlay: string[],
  ) {
    this.transcripts = new TranscriptView(source, name);
    this.el.append(
      this.head,
      this.team,
      h("h2", {}, "Curves", overlay.length ? h("small", {}, ` (dashed: ${overlay.join(", ")})`) : ""),
      this.charts.el,
      this.transcripts.el,
    );
  }

  /** Fetches what is new for `changed` (default: the run and every overlaid run) and redraws. */
  async refresh(changed?: string): Promise<void> {
    const names = [this.name, ...this.overlay].filter((n) => changed === undefined || n === changed);
    for (const n of names) {
      const have = n === this.name ? this.data : this.overlays.get(n);
      const got = await this.source.run(n, have?.rows.length ?? 0);
      // from 0: the file was rewritten (a resume truncated it) or this is the first fetch
      const merged = have && got.from > 0 ? { ...got, rows: [...have.rows, ...got.rows] } : got;
      if (n === this.name) this.data = merged;
      else this.overlays.set(n, merged);
    }
    const d = this.data;
    if (!d) return;
    this.head.replaceChildren(header(d, this.source.live));
    this.team.replaceChildren(graphView(d.agents, d.graph, d.observedEdges), latestTable(d));
    const others = this.overlay.flatMap((n) => {
      const o = this.overlays.get(n);
      return o ? [curves(o)] : [];
    });
    this.charts.update([curves(d), ...others]);
    if (changed === undefined || changed === this.name) await this.transcripts.update(d);
  }

  destroy(): void {
    this.charts.destroy();
  }
}

/** What a report adds to the runs: its summary and accuracy bars (top), its held-out transcripts (bottom). */
export function extrasView(x: ReportExtras): { top: HTMLElement; bottom?: HTMLElement } {
  const top = h(
    "section",
    { class: "extras" },
    h("h1", {}, x.title),
    h(
      "table",
      { class: "table summary" },
      h(
        "tbody",
        {},
        x.summary.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v))),
      ),
    ),
    x.bars ? barChart(x.bars.title, x.bars.bars, "accuracy") : null,
  );
  const c = x.comparison;
  if (!c) return { top };
  const cell = (m: { messages: Array<{ role: string; content: string }>; correct: boolean }) =>
    h(
      "td",
      {},
      m.messages.map((msg) => h("div", { class: "msg" }, h("b", {}, msg.role), " ", visible(msg.content))),
      h("p", { class: m.correct ? "ok" : "bad" }, m.correct ? "correct" : "wrong"),
    );
  const bottom = h(
    "section",
    { class: "extras" },
    h("h2", {}, c.title),
    h(
      "table",
      { class: "table side-by-side" },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          c.columns.map((col) => h("th", {}, col)),
        ),
      ),
      h(
        "tbody",
        {},
        c.rows.map((row) => h("tr", {}, row.map(cell))),
      ),
    ),
  );
  return { top, bottom };
}
