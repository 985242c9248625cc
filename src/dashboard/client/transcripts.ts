// Transcripts, by iteration and episode: each agent's action with its tokens coloured by the
// advantage the update gave them (green pushed up, red pushed down) and the log-prob on hover.
//
// The engine gives a turn's text and token ids, not a string per token, so the text is shown whole
// and the tokens as their ids. MARFT-A and critic-free give one advantage per action: the whole
// text takes its colour. MARFT-T gives one per token: the token row carries the credit.
import type { AgentView, RunData, TranscriptIteration, TranscriptRecord, TranscriptTurn } from "../api.ts";
import { advantageColor, colorOf, fmt, h, signed, visible } from "./dom.ts";
import type { Source } from "./source.ts";

const tip = h("div", { class: "tip", role: "tooltip" });

function tokenTip(t: TranscriptTurn, i: number): string {
  const lp = t.logprobs[i]!;
  return [
    `${t.agent}: token ${i + 1} of ${t.tokenIds.length}, id ${t.tokenIds[i]}`,
    `advantage ${signed(t.advantages[i]!)}`,
    `log-prob ${fmt(lp)} (p = ${fmt(Math.exp(lp))})`,
  ].join("\n");
}

/** The floating tooltip of the token under the pointer (one listener for all tokens). */
function onTokenHover(e: MouseEvent, turns: Map<Element, TranscriptTurn>): void {
  const tok = (e.target as Element).closest(".tok");
  const row = tok?.parentElement;
  const turn = row ? turns.get(row) : undefined;
  if (!tok || !turn) {
    tip.classList.remove("shown");
    return;
  }
  tip.textContent = tokenTip(turn, Number((tok as HTMLElement).dataset["i"]));
  tip.style.left = `${e.clientX + 12}px`;
  tip.style.top = `${e.clientY + 14}px`;
  tip.classList.add("shown");
}

function mean(xs: number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0;
}

function turnView(
  t: TranscriptTurn,
  rec: TranscriptRecord,
  agents: AgentView[],
  scale: number,
  rows: Map<Element, TranscriptTurn>,
) {
  const color = colorOf(agents.findIndex((a) => a.id === t.agent));
  const perAction = rec.level === "action";
  const adv = mean(t.advantages);
  const tokens = h(
    "div",
    { class: "tokens" },
    t.tokenIds.map((id, i) =>
      h(
        "span",
        {
          class: "tok",
          "data-i": i,
          "data-id": id,
          "data-adv": t.advantages[i]!,
          "data-logprob": t.logprobs[i]!,
          style: `background:${advantageColor(t.advantages[i]!, scale)}`,
        },
        String(id),
      ),
    ),
  );
  rows.set(tokens, t);
  return h(
    "div",
    { class: "turn", "data-agent": t.agent, style: `border-left-color:${color}` },
    h(
      "div",
      { class: "turn-head" },
      h("b", { style: `color:${color}` }, t.agent),
      t.role !== t.agent ? ` (${t.role})` : "",
      ` · step ${t.step} · sees: ${t.parents.join(", ") || "nobody"} · reward ${fmt(t.reward)} · `,
      h(
        "span",
        { class: "adv", style: `background:${advantageColor(adv, scale)}` },
        `advantage ${signed(adv)}`,
      ),
      perAction
        ? ` (one per action, on all ${t.tokenIds.length} tokens)`
        : ` (mean of ${t.tokenIds.length} tokens)`,
      ` · ${t.trained ? "trained" : "not trained"} this iteration · adapter v${t.adapterVersion} · ended: ${t.finishReason}`,
    ),
    h(
      "pre",
      { class: "turn-text", style: perAction ? `background:${advantageColor(adv, scale)}` : undefined },
      visible(t.text) || "(empty)",
    ),
    tokens,
  );
}

function episodeView(rec: TranscriptRecord, agents: AgentView[], scale: number): HTMLElement {
  const rows = new Map<Element, TranscriptTurn>();
  const info = Object.entries(rec.info)
    .map(([k, v]) => `${k}: ${typeof v === "string" ? visible(v) : JSON.stringify(v)}`)
    .join(" · ");
  const roles = Object.entries(rec.outcome.roleRewards)
    .map(([k, v]) => `${k} ${fmt(v)}`)
    .join(", ");
  const el = h(
    "div",
    { class: "episode", "data-episode": rec.episode },
    h("pre", { class: "task" }, visible(rec.task)),
    h(
      "p",
      { class: `outcome ${rec.outcome.correct ? "ok" : "bad"}` },
      `${rec.outcome.correct ? "solved" : "not solved"} · team reward ${fmt(rec.outcome.teamReward)}`,
      roles ? ` · per-role rewards: ${roles}` : "",
      rec.truncated ? " · truncated" : "",
      info ? h("span", { class: "info" }, ` · ${info}`) : "",
    ),
    [...rec.turns].sort((a, b) => a.order - b.order).map((t) => turnView(t, rec, agents, scale, rows)),
  );
  el.addEventListener("mousemove", (e) => onTokenHover(e, rows));
  el.addEventListener("mouseleave", () => tip.classList.remove("shown"));
  return el;
}

function legend(scale: number): HTMLElement {
  const stops = [-1, -0.5, 0, 0.5, 1].map((t) => advantageColor(t * scale, scale));
  return h(
    "span",
    { class: "legend" },
    `advantage ${signed(-scale)} `,
    h("span", { class: "scale", style: `background:linear-gradient(to right, ${stops.join(", ")})` }),
    ` ${signed(scale)} (largest |advantage| of the iteration)`,
  );
}

/** The transcripts section of a run view: pickers, then the chosen episode. */
export class TranscriptView {
  readonly el = h("section", { class: "transcripts" });
  private iteration: number | undefined;
  private episode = 0;
  private follow = true;
  private index: TranscriptIteration[] = [];
  private readonly cache = new Map<number, TranscriptRecord[]>();
  private run: RunData | undefined;
  /** Renders wait for records; only the latest may draw. */
  private ticket = 0;

  constructor(
    private readonly source: Source,
    private readonly name: string,
  ) {
    if (!tip.isConnected) document.body.append(tip);
  }

  async update(run: RunData): Promise<void> {
    this.run = run;
    this.index = run.transcripts;
    const last = this.index.at(-1)?.iteration;
    if (this.iteration === undefined || (this.follow && last !== undefined)) this.iteration = last;
    // a resume rewrites iterations after its checkpoint: read them again
    for (const it of this.cache.keys())
      if (!this.index.some((x) => x.iteration === it)) this.cache.delete(it);
    await this.render();
  }

  private async choose(iteration: number, episode = 0): Promise<void> {
    this.iteration = iteration;
    this.episode = episode;
    this.follow = iteration === this.index.at(-1)?.iteration;
    await this.render();
  }

  private async records(iteration: number): Promise<TranscriptRecord[]> {
    const cached = this.cache.get(iteration);
    const expected = this.index.find((x) => x.iteration === iteration)?.episodes.length ?? 0;
    if (cached && cached.length === expected) return cached;
    const recs = await this.source.transcripts(this.name, iteration);
    this.cache.set(iteration, recs);
    return recs;
  }

  private async render(): Promise<void> {
    const run = this.run!;
    const ticket = ++this.ticket;
    const title = h("h2", {}, "Transcripts");
    if (this.index.length === 0 || this.iteration === undefined) {
      this.el.replaceChildren(
        title,
        h(
          "p",
          { class: "empty" },
          "none yet (train.transcripts episodes per iteration are written to transcripts.jsonl)",
        ),
      );
      return;
    }
    const pos = Math.max(
      0,
      this.index.findIndex((x) => x.iteration === this.iteration),
    );
    const entry = this.index[pos]!;
    const recs = await this.records(entry.iteration);
    if (ticket !== this.ticket) return;
    const rec = recs.find((r) => r.episode === this.episode) ?? recs[0];
    const scale = Math.max(1e-9, ...recs.flatMap((r) => r.turns.flatMap((t) => t.advantages.map(Math.abs))));
    const step = (d: number) => () =>
      void this.choose(this.index[Math.min(this.index.length - 1, Math.max(0, pos + d))]!.iteration);
    const slider = h("input", {
      type: "range",
      min: 0,
      max: this.index.length - 1,
      value: pos,
      "aria-label": "iteration",
      oninput: (e) => void this.choose(this.index[Number((e.target as HTMLInputElement).value)]!.iteration),
    });
    const follow = h("input", {
      type: "checkbox",
      checked: this.follow,
      onchange: (e) => {
        this.follow = (e.target as HTMLInputElement).checked;
        if (this.follow) void this.choose(this.index.at(-1)!.iteration);
      },
    });
    this.el.replaceChildren(
      title,
      h(
        "div",
        { class: "picker" },
        h("button", { onclick: step(-1), title: "previous iteration" }, "◀"),
        slider,
        h("button", { onclick: step(1), title: "next iteration" }, "▶"),
        h(
          "span",
          { class: "iteration", "data-iteration": entry.iteration },
          `iteration ${entry.iteration} (${pos + 1} of ${this.index.length} with transcripts)`,
        ),
        h("label", {}, follow, " follow the latest"),
        legend(scale),
      ),
      h(
        "div",
        { class: "episode-tabs" },
        entry.episodes.map((e) =>
          h(
            "button",
            {
              class: `${e.episode === rec?.episode ? "active" : ""} ${e.correct ? "ok" : "bad"}`,
              onclick: () => void this.choose(entry.iteration, e.episode),
              title: e.taskId,
            },
            `episode ${e.episode} ${e.correct ? "✓" : "✗"} ${fmt(e.teamReward)}`,
          ),
        ),
      ),
      rec ? episodeView(rec, run.agents, scale) : h("p", { class: "empty" }, "no records"),
    );
  }
}
