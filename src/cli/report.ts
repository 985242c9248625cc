// report.html: the dashboard's page with the data of some runs embedded, one self-contained file
// (the page's script, uPlot and the styles inline; its Content-Security-Policy allows no request),
// so it opens anywhere, offline, and shows the same views as `marft dashboard`. `marft train`
// writes one per run (runs/<name>/report.html), `marft demo` one for its team and baseline.
import { basename, dirname, join, resolve } from "node:path";
import type { ReportExtras, RunData, StaticData, TranscriptRecord } from "../dashboard/api.ts";
import { renderPage } from "../dashboard/page.ts";
import { RunReader } from "../dashboard/runs.ts";
import { writeFileAtomic } from "../train/rundir.ts";

/** At most this many iterations' transcripts go into a report (evenly spaced, first and last kept). */
export const REPORT_TRANSCRIPT_ITERATIONS = 40;

/** `n` of the items, evenly spaced, the first and the last among them. */
function spread<T>(items: T[], n: number): T[] {
  if (items.length <= n) return items;
  const picked = new Set<number>();
  for (let k = 0; k < n; k++) picked.add(Math.round((k * (items.length - 1)) / (n - 1)));
  return [...picked].map((i) => items[i]!);
}

/**
 * The report's data: each run directory under `root` named in `runs` (the first is the main one,
 * the others drawn over it), with its metrics, graph and a sample of its transcripts.
 */
export function reportData(root: string, runs: string[], extras?: ReportExtras): StaticData {
  const data: StaticData = {
    generated: new Date().toISOString(),
    list: { root, runs: [], compares: [] },
    runs: {},
    transcripts: {},
    compares: {},
    overlay: runs,
    ...(extras ? { extras } : {}),
  };
  let omitted = 0;
  for (const name of runs) {
    const reader = new RunReader(name, join(root, name));
    data.list.runs.push(reader.listItem());
    const run: RunData = reader.data();
    const kept = spread(run.transcripts, REPORT_TRANSCRIPT_ITERATIONS);
    omitted += run.transcripts.length - kept.length;
    run.transcripts = kept;
    data.runs[name] = run;
    const byIteration: Record<number, TranscriptRecord[]> = {};
    for (const it of kept) byIteration[it.iteration] = reader.transcriptsOf(it.iteration);
    data.transcripts[name] = byIteration;
  }
  if (omitted > 0) data.transcriptsOmitted = omitted;
  return data;
}

/** The HTML of a report over `runs` (directories below `root`). */
export function renderReport(r: {
  root: string;
  runs: string[];
  title: string;
  extras?: ReportExtras;
}): string {
  return renderPage({ mode: "static", title: r.title, data: reportData(r.root, r.runs, r.extras) }).html;
}

/** Writes `<runDir>/report.html` for one run and returns its path. */
export function writeRunReport(runDir: string): string {
  const dir = resolve(runDir);
  const path = join(dir, "report.html");
  writeFileAtomic(
    path,
    renderReport({ root: dirname(dir), runs: [basename(dir)], title: `MARFT run ${basename(dir)}` }),
  );
  return path;
}
