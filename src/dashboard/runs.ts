// A runs folder as the dashboard sees it: the run directories and compare results below it, each read
// again only when its files change (size, mtime and inode: truncation on resume replaces a file).
// transcripts.jsonl is indexed incrementally (byte offsets per record) and read one iteration at a
// time, so a long run's transcripts are never all in memory.
import { closeSync, existsSync, openSync, readdirSync, readFileSync, readSync, statSync } from "node:fs";
import { join, relative, sep } from "node:path";
import type {
  CompareData,
  ObservedEdge,
  RunData,
  RunListItem,
  RunsList,
  RunState,
  TranscriptIteration,
  TranscriptRecord,
} from "./api.ts";
import {
  type ConfigView,
  parseMetrics,
  parseTranscript,
  readCompare,
  readConfig,
  readSummary,
  type SummaryView,
} from "./files.ts";

/** Folders never searched for runs: what a run directory holds besides its files. */
const SKIP = new Set(["checkpoints", "tensorboard", "node_modules", "data"]);
/** runs/compare/<spec>/<cell>: compare results keep their runs three levels down. */
const MAX_DEPTH = 4;

/** Run directories (a config.yaml or metrics.jsonl) and compare results (compare.json) below `root`. */
export function discover(root: string): { runs: string[]; compares: string[] } {
  const runs: string[] = [];
  const compares: string[] = [];
  const name = (dir: string) => relative(root, dir).split(sep).join("/") || ".";
  const walk = (dir: string, depth: number) => {
    let entries: string[];
    try {
      entries = readdirSync(dir);
    } catch {
      return; // vanished or unreadable: not a run
    }
    if (entries.includes("compare.json")) compares.push(name(dir));
    if (entries.includes("config.yaml") || entries.includes("metrics.jsonl")) {
      runs.push(name(dir));
      return;
    }
    if (depth >= MAX_DEPTH) return;
    for (const e of entries.sort()) {
      if (e.startsWith(".") || SKIP.has(e)) continue;
      const p = join(dir, e);
      if (statSync(p, { throwIfNoEntry: false })?.isDirectory()) walk(p, depth + 1);
    }
  };
  walk(root, 0);
  return { runs, compares };
}

/** What identifies a version of a file: it changed when this did. */
function stamp(path: string): string {
  const s = statSync(path, { throwIfNoEntry: false });
  return s ? `${s.ino}:${s.size}:${s.mtimeMs}` : "-";
}

function mtime(path: string): number {
  return statSync(path, { throwIfNoEntry: false })?.mtimeMs ?? 0;
}

/** A value computed from some files, recomputed when one of them changes. */
class Cached<T> {
  private key = "";
  private value: T | undefined;
  constructor(
    private readonly paths: string[],
    private readonly compute: () => T,
  ) {}
  get(): T {
    const key = this.paths.map(stamp).join("|");
    if (key !== this.key || this.value === undefined) {
      this.value = this.compute();
      this.key = key;
    }
    return this.value;
  }
}

interface IndexEntry {
  iteration: number;
  episode: number;
  taskId: string;
  teamReward: number;
  correct: boolean;
  offset: number;
  length: number;
}

/** The records of transcripts.jsonl by byte range; appended lines are indexed as they come. */
class TranscriptIndex {
  entries: IndexEntry[] = [];
  edges = new Map<string, ObservedEdge>();
  private ino = -1;
  private offset = 0;

  constructor(private readonly path: string) {}

  update(): void {
    const s = statSync(this.path, { throwIfNoEntry: false });
    if (!s) {
      this.reset(-1);
      return;
    }
    if (s.ino !== this.ino || s.size < this.offset) this.reset(s.ino);
    if (s.size === this.offset) return;
    const buf = this.read(this.offset, s.size - this.offset);
    let start = 0;
    for (let nl = buf.indexOf(10); nl >= 0; start = nl + 1, nl = buf.indexOf(10, start)) {
      const line = buf.subarray(start, nl).toString("utf8");
      if (line.trim() === "") continue;
      const r = parseTranscript(line, `${this.path} (byte ${this.offset + start})`);
      this.entries.push({
        iteration: r.iteration,
        episode: r.episode,
        taskId: r.taskId,
        teamReward: r.outcome.teamReward,
        correct: r.outcome.correct,
        offset: this.offset + start,
        length: nl - start,
      });
      for (const t of r.turns) {
        for (const p of t.parents) {
          const key = `${p}\u0000${t.agent}`;
          const e = this.edges.get(key) ?? { from: p, to: t.agent, count: 0 };
          e.count++;
          this.edges.set(key, e);
        }
      }
    }
    this.offset += start; // a torn last line is read again once it is complete
  }

  iterations(): TranscriptIteration[] {
    const by = new Map<number, TranscriptIteration>();
    for (const e of this.entries) {
      const it = by.get(e.iteration) ?? { iteration: e.iteration, episodes: [] };
      it.episodes.push({
        episode: e.episode,
        taskId: e.taskId,
        teamReward: e.teamReward,
        correct: e.correct,
      });
      by.set(e.iteration, it);
    }
    return [...by.values()].sort((a, b) => a.iteration - b.iteration);
  }

  records(iteration: number): TranscriptRecord[] {
    return this.entries
      .filter((e) => e.iteration === iteration)
      .map((e) =>
        parseTranscript(this.read(e.offset, e.length).toString("utf8"), `${this.path} (byte ${e.offset})`),
      );
  }

  private reset(ino: number): void {
    this.entries = [];
    this.edges = new Map();
    this.offset = 0;
    this.ino = ino;
  }

  private read(offset: number, length: number): Buffer {
    const fd = openSync(this.path, "r");
    try {
      const buf = Buffer.alloc(length);
      const n = readSync(fd, buf, 0, length, offset);
      return buf.subarray(0, n);
    } finally {
      closeSync(fd);
    }
  }
}

/** One run directory: its config, metrics, summary and transcripts, read when they change. */
export class RunReader {
  private readonly config: Cached<ConfigView>;
  private readonly metrics: Cached<RunData["rows"]>;
  private readonly summary: Cached<SummaryView | null>;
  private readonly transcripts: TranscriptIndex;

  constructor(
    readonly name: string,
    readonly dir: string,
  ) {
    const f = (n: string) => join(dir, n);
    this.config = new Cached([f("config.yaml")], () => readConfig(f("config.yaml")));
    this.metrics = new Cached([f("metrics.jsonl")], () =>
      existsSync(f("metrics.jsonl"))
        ? parseMetrics(readFileSync(f("metrics.jsonl"), "utf8"), f("metrics.jsonl"))
        : [],
    );
    this.summary = new Cached([f("summary.json")], () =>
      existsSync(f("summary.json")) ? readSummary(f("summary.json")) : null,
    );
    this.transcripts = new TranscriptIndex(f("transcripts.jsonl"));
  }

  /** Changes whenever a file the views read changes. */
  signature(): string {
    return ["config.yaml", "metrics.jsonl", "summary.json", "transcripts.jsonl"]
      .map((n) => stamp(join(this.dir, n)))
      .join("|");
  }

  private get updated(): number {
    return Math.max(
      ...["config.yaml", "metrics.jsonl", "transcripts.jsonl", "summary.json"].map((n) =>
        mtime(join(this.dir, n)),
      ),
    );
  }

  /** running until a summary.json at least as new as the last metrics line says how it ended. */
  private state(rows: number, total: number | null, summary: SummaryView | null): RunState {
    if (!summary || mtime(join(this.dir, "summary.json")) < mtime(join(this.dir, "metrics.jsonl")))
      return "running";
    return summary.stoppedEarly || (total !== null && rows < total) ? "stopped" : "finished";
  }

  listItem(): RunListItem {
    const errors: string[] = [];
    const attempt = <T>(fn: () => T, fallback: T): T => {
      try {
        return fn();
      } catch (e) {
        errors.push((e as Error).message);
        return fallback;
      }
    };
    const config = attempt(() => this.config.get(), null);
    const rows = attempt(() => this.metrics.get(), []);
    const summary = attempt(() => this.summary.get(), null);
    const total = config?.totalIterations ?? null;
    return {
      name: this.name,
      agents: config?.agents.map((a) => a.id) ?? [],
      estimator: config?.estimator ?? "?",
      iterations: rows.length,
      totalIterations: total,
      state: this.state(rows.length, total, summary),
      updated: this.updated,
      lastReward: rows.at(-1)?.["reward/mean"] ?? null,
      ...(errors.length ? { error: errors.join("\n") } : {}),
    };
  }

  /** Everything the run's page shows, with the metrics rows from line `from` on (0-based). */
  data(from = 0): RunData {
    const item = this.listItem();
    let config: ConfigView = {
      agents: item.agents.map((id) => ({ id, role: id, trainable: true })),
      graph: { kind: "sequential", edges: [] },
      estimator: item.estimator,
      klCoef: 0,
      totalIterations: item.totalIterations,
    };
    const errors = item.error ? [item.error] : [];
    try {
      config = this.config.get();
    } catch {
      // already in item.error
    }
    let rows: RunData["rows"] = [];
    let summary: SummaryView | null = null;
    try {
      rows = this.metrics.get();
      summary = this.summary.get();
    } catch {
      // already in item.error
    }
    try {
      this.transcripts.update();
    } catch (e) {
      errors.push((e as Error).message);
    }
    const start = from <= rows.length ? from : 0;
    return {
      name: this.name,
      ...config,
      state: item.state,
      updated: item.updated,
      total: rows.length,
      from: start,
      rows: rows.slice(start),
      eval: summary?.eval ?? {},
      transcripts: this.transcripts.iterations(),
      observedEdges: [...this.transcripts.edges.values()],
      ...(errors.length ? { error: [...new Set(errors)].join("\n") } : {}),
    };
  }

  transcriptsOf(iteration: number): TranscriptRecord[] {
    this.transcripts.update();
    return this.transcripts.records(iteration);
  }
}

/** The runs folder: its runs and compare results, found again on each `list()`. */
export class RunsFolder {
  private readonly runs = new Map<string, RunReader>();
  private compareNames: string[] = [];

  constructor(readonly root: string) {}

  list(): RunsList {
    const found = discover(this.root);
    for (const name of found.runs) {
      if (!this.runs.has(name)) this.runs.set(name, new RunReader(name, join(this.root, name)));
    }
    for (const name of [...this.runs.keys()]) if (!found.runs.includes(name)) this.runs.delete(name);
    this.compareNames = found.compares;
    const compares = found.compares.map((name) => {
      try {
        return { name, variants: this.compare(name)!.variants.map((v) => v.name) };
      } catch {
        return { name, variants: [] };
      }
    });
    return { root: this.root, runs: [...this.runs.values()].map((r) => r.listItem()), compares };
  }

  /** A run by its name in the list (names come from the listing, never from a path a request made up). */
  run(name: string): RunReader | undefined {
    if (!this.runs.has(name)) this.list();
    return this.runs.get(name);
  }

  compare(name: string): CompareData | undefined {
    if (!this.compareNames.includes(name)) return undefined;
    return readCompare(join(this.root, name, "compare.json"), name);
  }

  /** Signatures of the listing and of every run, to tell watchers what changed. */
  signatures(): { list: string; runs: Map<string, string> } {
    const found = discover(this.root);
    const runs = new Map(found.runs.map((n) => [n, this.run(n)?.signature() ?? ""]));
    const compares = found.compares.map((n) => `${n}=${stamp(join(this.root, n, "compare.json"))}`);
    return { list: [...found.runs, ...compares].join("\n"), runs };
  }
}
