// report.html: one self-contained file (no request of any kind: its CSP forbids them, and nothing
// in it points outside), the runs' data embedded (metrics, graph, transcripts), text from a
// transcript unable to end the script it is embedded in. tests/dashboard.test.ts opens a real
// run's report in Chromium with the network cut off.
import { appendFileSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { renderReport, writeRunReport } from "../src/cli/report.ts";
import type { StaticData } from "../src/dashboard/api.ts";
import { metricsRow, transcript, writeRun } from "./helpers/run-fixture.ts";

/** The JSON the report embeds for its page. */
function embedded(html: string): StaticData {
  const m = /<script type="application\/json" id="marft-data">([\s\S]*?)<\/script>/.exec(html);
  expect(m).not.toBeNull();
  return JSON.parse(m![1]!) as StaticData;
}

describe("report.html", () => {
  const root = mkdtempSync(join(tmpdir(), "marft-report-"));
  writeRun(join(root, "team"), 4, { finished: true });
  writeRun(join(root, "baseline"), 2, { finished: true });

  it("is self-contained: no external resource, a CSP that allows no request, the chart library inline", () => {
    const html = readFileSync(writeRunReport(join(root, "team")), "utf8");
    expect(html).not.toMatch(/<link\b/i);
    expect(html).not.toMatch(/\b(src|href)\s*=\s*["']?(https?:)?\/\//i);
    expect(html).not.toMatch(/url\(\s*["']?(https?:)?\/\//i);
    expect(html).not.toMatch(/@import/);
    const csp = /<meta http-equiv="Content-Security-Policy" content="([^"]+)">/.exec(html)?.[1];
    expect(csp).toMatch(/default-src 'none'/);
    expect(csp).toMatch(/connect-src 'none'/);
    expect(html).toContain("uPlot");
    expect(html.length).toBeLessThan(400_000);
  });

  it("embeds the runs' metrics, dependency graph and transcripts", () => {
    const data = embedded(readFileSync(join(root, "team", "report.html"), "utf8"));
    const team = data.runs["team"]!;
    expect(team.rows).toEqual([1, 2, 3, 4].map(metricsRow));
    expect(team.graph.edges).toEqual([["speaker", "listener"]]);
    expect(team.eval.after?.accuracy).toBe(0.5);
    expect(data.transcripts["team"]![3]).toEqual([transcript(3, 0), transcript(3, 1)]);
    expect(data.list.runs.map((r) => [r.name, r.state])).toEqual([["team", "finished"]]);
  });

  it("several runs overlay; extras (a demo's accuracies) come along", () => {
    const html = renderReport({
      root,
      runs: ["team", "baseline"],
      title: "demo",
      extras: {
        title: "demo",
        summary: [["model", "tiny"]],
        bars: { title: "acc", bars: [{ name: "after", value: 0.5, ci95: [0.4, 0.6] }] },
      },
    });
    const data = embedded(html);
    expect(data.overlay).toEqual(["team", "baseline"]);
    expect(data.runs["baseline"]!.rows).toHaveLength(2);
    expect(data.extras?.bars?.bars[0]?.value).toBe(0.5);
  });

  it("text that looks like markup stays data", () => {
    const dir = join(root, "markup");
    writeRun(dir, 1);
    const evil = "</script><script>alert(1)</script><!--";
    appendFileSync(join(dir, "transcripts.jsonl"), `${JSON.stringify(transcript(1, 2, evil))}\n`);
    const html = readFileSync(writeRunReport(dir), "utf8");
    expect(html.match(/<script\b/g)).toHaveLength(2); // the data and the page's code
    expect(html).not.toContain(evil);
    expect(embedded(html).transcripts["markup"]![1]![2]!.turns[0]!.text).toBe(evil);
  });
});
