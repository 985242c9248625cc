// The dashboard page: a list of runs and compare results on the left, the chosen one on the right.
// The address says what is shown (#run=<name>&with=<a>,<b> overlays runs; #compare=<name>), so a
// view can be bookmarked and the back button works. Live, each change event the server sends
// refreshes only what changed; report.html shows the same page from its embedded data.
import type { RunsList, StaticData } from "../api.ts";
import { compareView } from "./bars.ts";
import { ago, fmt, h } from "./dom.ts";
import { extrasView, RunPage } from "./run.ts";
import { HttpSource, type Source, StaticSource } from "./source.ts";

type View =
  | { kind: "run"; name: string; overlay: string[] }
  | { kind: "compare"; name: string }
  | { kind: "none" };

function parseHash(): View {
  const p = new URLSearchParams(location.hash.slice(1));
  const run = p.get("run");
  if (run)
    return {
      kind: "run",
      name: run,
      overlay: (p.get("with") ?? "").split(",").filter((x) => x && x !== run),
    };
  const compare = p.get("compare");
  if (compare) return { kind: "compare", name: compare };
  return { kind: "none" };
}

function hashOf(v: View): string {
  if (v.kind === "run")
    return `#run=${encodeURIComponent(v.name)}${v.overlay.length ? `&with=${v.overlay.map(encodeURIComponent).join(",")}` : ""}`;
  if (v.kind === "compare") return `#compare=${encodeURIComponent(v.name)}`;
  return "";
}

class App {
  private list: RunsList = { root: "", runs: [], compares: [] };
  private view: View = { kind: "none" };
  private page: RunPage | undefined;
  private readonly nav = h("nav", { class: "sidebar" });
  private readonly main = h("main", { class: "main" });
  private readonly column = h("div", { class: "column" }, this.main);
  private readonly status = h("span", { class: "status" });
  private started = false;

  constructor(
    private readonly source: Source,
    private readonly data?: StaticData,
  ) {}

  async start(root: HTMLElement): Promise<void> {
    root.replaceChildren(
      h("header", { class: "top" }, h("b", {}, "MARFT"), " dashboard ", this.status),
      h("div", { class: "layout" }, this.nav, this.column),
    );
    if (this.data) {
      const omitted = this.data.transcriptsOmitted;
      this.status.textContent =
        `report written ${new Date(this.data.generated).toLocaleString()}` +
        (omitted
          ? ` · the transcripts of ${omitted} iterations are left out (see the run's transcripts.jsonl)`
          : "");
      if (this.data.extras) {
        // a report's summary and bars above the runs, its held-out transcripts below them
        const { top, bottom } = extrasView(this.data.extras);
        this.main.before(top);
        if (bottom) this.main.after(bottom);
      }
    }
    window.addEventListener("hashchange", () => void this.show(parseHash()));
    this.source.watch(
      (c) => void (c.kind === "runs" ? this.refreshList() : this.changed(c.name)),
      (connected) => {
        this.status.textContent = connected ? "● live" : "○ reconnecting…";
        this.status.className = `status ${connected ? "live" : "down"}`;
      },
    );
    await this.refreshList();
    const fromHash = parseHash();
    const first =
      this.data?.overlay?.[0] ?? [...this.list.runs].sort((a, b) => b.updated - a.updated)[0]?.name;
    const initial: View =
      fromHash.kind !== "none"
        ? fromHash
        : first
          ? { kind: "run", name: first, overlay: this.data?.overlay?.slice(1) ?? [] }
          : this.list.compares[0]
            ? { kind: "compare", name: this.list.compares[0].name }
            : { kind: "none" };
    this.started = true;
    await this.show(initial);
  }

  private async refreshList(): Promise<void> {
    this.list = await this.source.list();
    this.renderNav();
    // an empty folder's first run: show it as soon as it appears
    const first = this.list.runs[0];
    if (this.view.kind === "none" && first && this.started)
      this.go({ kind: "run", name: first.name, overlay: [] });
  }

  private async changed(name: string): Promise<void> {
    await this.refreshList();
    const v = this.view;
    if (this.page && v.kind === "run" && (v.name === name || v.overlay.includes(name)))
      await this.page.refresh(name);
  }

  private go(v: View): void {
    location.hash = hashOf(v);
  }

  private renderNav(): void {
    const v = this.view;
    const current = v.kind === "run" ? v : undefined;
    const runs = this.list.runs.map((r) => {
      const overlaid = current?.overlay.includes(r.name) ?? false;
      const isMain = current?.name === r.name;
      const toggle = h("input", {
        type: "checkbox",
        title: "draw on the charts of the run shown",
        checked: overlaid || isMain,
        disabled: isMain || !current,
        onchange: () => {
          if (!current) return;
          const overlay = overlaid
            ? current.overlay.filter((n) => n !== r.name)
            : [...current.overlay, r.name];
          this.go({ kind: "run", name: current.name, overlay });
        },
      });
      return h(
        "div",
        { class: `item ${isMain ? "active" : ""}`, "data-run": r.name, "data-state": r.state },
        toggle,
        h(
          "a",
          { href: hashOf({ kind: "run", name: r.name, overlay: [] }) },
          h("span", { class: "name" }, r.name),
          h(
            "small",
            {},
            h("span", { class: `state ${r.state}` }, r.state),
            ` ${r.iterations}${r.totalIterations ? `/${r.totalIterations}` : ""} · reward ${fmt(r.lastReward)}` +
              (this.source.live ? ` · ${ago(r.updated)}` : ""),
          ),
          r.error ? h("small", { class: "error" }, "cannot read part of it") : null,
        ),
      );
    });
    const compares = this.list.compares.map((c) =>
      h(
        "div",
        {
          class: `item ${v.kind === "compare" && v.name === c.name ? "active" : ""}`,
          "data-compare": c.name,
        },
        h(
          "a",
          { href: hashOf({ kind: "compare", name: c.name }) },
          h("span", { class: "name" }, c.name),
          h("small", {}, c.variants.join(" · ")),
        ),
      ),
    );
    this.nav.replaceChildren(
      h("h3", {}, "Runs"),
      h("p", { class: "hint" }, this.list.root),
      ...(runs.length ? runs : [h("p", { class: "empty" }, "no runs yet")]),
      h("h3", {}, "Compare results"),
      ...(compares.length
        ? compares
        : [h("p", { class: "empty" }, "none (marft compare writes compare.json)")]),
    );
  }

  private async show(v: View): Promise<void> {
    this.view = v;
    this.renderNav();
    this.page?.destroy();
    this.page = undefined;
    if (v.kind === "run") {
      this.page = new RunPage(this.source, v.name, v.overlay);
      this.main.replaceChildren(this.page.el);
      await this.page.refresh();
    } else if (v.kind === "compare") {
      this.main.replaceChildren(compareView(await this.source.compare(v.name)));
    } else {
      this.main.replaceChildren(
        h("p", { class: "empty" }, `no runs in ${this.list.root} yet; they appear here when they start`),
      );
    }
  }
}

function boot(): void {
  const root = document.getElementById("app")!;
  const embedded = document.getElementById("marft-data");
  const data = embedded ? (JSON.parse(embedded.textContent ?? "{}") as StaticData) : undefined;
  const app = new App(data ? new StaticSource(data) : new HttpSource(), data);
  app.start(root).catch((e: unknown) => {
    root.append(h("pre", { class: "error" }, `the dashboard failed: ${(e as Error).message}`));
  });
}

boot();
