// The dashboard's reading of a runs folder and its HTTP API, without a browser: discovery of runs
// and compare results, errors that name the file and line, lines still being written, transcripts
// indexed as they are appended and again after a resume rewrote the file; the token on every
// request; change events. tests/dashboard.test.ts drives the page in Chromium.
import { appendFileSync, copyFileSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunData, RunsList } from "../src/dashboard/api.ts";
import { RunsFolder } from "../src/dashboard/runs.ts";
import { type Dashboard, startDashboard } from "../src/dashboard/server.ts";
import { writeFileAtomic } from "../src/train/rundir.ts";
import { appendIteration, metricsRow, transcript, writeRun } from "./helpers/run-fixture.ts";

const COMPARE = join(import.meta.dirname, "fixtures", "compare", "compare.json");

function folder(): string {
  const root = join(mkdtempSync(join(tmpdir(), "marft-dash-")), "runs");
  writeRun(join(root, "alpha"), 3, { finished: true });
  writeRun(join(root, "beta"), 2, { total: 10 });
  mkdirSync(join(root, "compare", "estimators", "marft-a-seed0", "checkpoints"), { recursive: true });
  copyFileSync(COMPARE, join(root, "compare", "estimators", "compare.json"));
  writeRun(join(root, "compare", "estimators", "marft-a-seed0"), 1);
  return root;
}

describe("the runs folder", () => {
  it("lists runs (compare cells too) and compare results, with state and progress", () => {
    const f = new RunsFolder(folder());
    const list = f.list();
    expect(list.runs.map((r) => [r.name, r.state, r.iterations, r.totalIterations])).toEqual([
      ["alpha", "finished", 3, 3],
      ["beta", "running", 2, 10],
      ["compare/estimators/marft-a-seed0", "running", 1, 1],
    ]);
    expect(list.runs[0]!.agents).toEqual(["speaker", "listener"]);
    expect(list.runs[0]!.lastReward).toBeCloseTo(0.3);
    expect(list.compares).toEqual([
      { name: "compare/estimators", variants: ["marft-a", "marft-t", "critic-free"] },
    ]);
    expect(f.compare("compare/estimators")!.variants[1]!.vs_first!.paired_p).toBe(0.004);
    expect(f.compare("../../etc")).toBeUndefined();
  });

  it("a run's data: the graph from the config, rows from a line on, NaN as null, eval from summary.json", () => {
    const f = new RunsFolder(folder());
    const d = f.run("alpha")!.data(1);
    expect(d.graph).toEqual({ kind: "sequential", edges: [["speaker", "listener"]] });
    expect(d.agents.map((a) => a.role)).toEqual(["speaker", "listener"]);
    expect([d.total, d.from, d.rows.map((r) => r["iteration"])]).toEqual([3, 1, [2, 3]]);
    expect(d.rows[0]!["value/explained_variance"]).toBeNull();
    expect(d.eval.after?.accuracy).toBe(0.5);
    expect(d.transcripts.map((t) => [t.iteration, t.episodes.length])).toEqual([
      [1, 2],
      [2, 2],
      [3, 2],
    ]);
    expect(d.observedEdges).toEqual([{ from: "speaker", to: "listener", count: 6 }]);
    expect(f.run("alpha")!.transcriptsOf(2)).toEqual([transcript(2, 0), transcript(2, 1)]);
  });

  it("a line still being written waits; a bad line is an error naming the file and line", () => {
    const root = folder();
    const f = new RunsFolder(root);
    const dir = join(root, "beta");
    appendFileSync(join(dir, "metrics.jsonl"), `{"iteration": 3, "reward/me`);
    appendFileSync(join(dir, "transcripts.jsonl"), `{"iteration": 3, "epis`);
    expect(f.run("beta")!.data().total).toBe(2);
    expect(f.run("beta")!.data().transcripts).toHaveLength(2);
    appendFileSync(join(dir, "metrics.jsonl"), `an": "high"}\n`);
    const item = f.list().runs.find((r) => r.name === "beta")!;
    expect(item.error).toContain(
      `${join(dir, "metrics.jsonl")}:3: ["reward/mean"]: expected a number, got "high"`,
    );
  });

  it("transcripts appended later are indexed; a file rewritten by a resume is read anew", () => {
    const root = folder();
    const f = new RunsFolder(root);
    const dir = join(root, "beta");
    expect(
      f
        .run("beta")!
        .data()
        .transcripts.map((t) => t.iteration),
    ).toEqual([1, 2]);
    appendIteration(dir, 3);
    expect(
      f
        .run("beta")!
        .data()
        .transcripts.map((t) => t.iteration),
    ).toEqual([1, 2, 3]);
    // resume from iteration 1: the file is replaced (new inode), then grows again
    const one = [transcript(1, 0), transcript(1, 1, "resumed")].map((r) => `${JSON.stringify(r)}\n`).join("");
    writeFileAtomic(join(dir, "transcripts.jsonl"), one);
    writeFileAtomic(join(dir, "metrics.jsonl"), `${JSON.stringify(metricsRow(1))}\n`);
    const d = f.run("beta")!.data();
    expect(d.transcripts.map((t) => t.iteration)).toEqual([1]);
    expect(d.total).toBe(1);
    expect(f.run("beta")!.transcriptsOf(1)[1]!.turns[0]!.text).toBe("resumed");
  });

  it("a broken config.yaml is reported with its file; the metrics still show", () => {
    const root = folder();
    writeFileSync(join(root, "alpha", "config.yaml"), "agents: []\n");
    const d = new RunsFolder(root).run("alpha")!.data();
    expect(d.error).toContain(`${join(root, "alpha", "config.yaml")}: agents: expected at least 1 item(s)`);
    expect(d.total).toBe(3);
  });
});

describe("the dashboard's HTTP API", () => {
  let dash: Dashboard;
  let root: string;
  beforeAll(async () => {
    root = folder();
    dash = await startDashboard({ root, port: 0, pollMs: 50 });
  });
  afterAll(() => dash.close());

  const get = (path: string, headers: Record<string, string> = {}) =>
    fetch(`http://127.0.0.1:${dash.port}${path}`, { headers });

  it("binds to loopback and prints a URL with a fresh random token", () => {
    expect(dash.host).toBe("127.0.0.1");
    expect(dash.url).toBe(`http://127.0.0.1:${dash.port}/?token=${dash.token}`);
    expect(dash.token).toMatch(/^[0-9a-f]{32}$/);
  });

  it("answers 401 without the token or with a wrong one, on the page and on the API", async () => {
    for (const path of [
      "/",
      "/api/runs",
      "/api/run?name=alpha",
      "/api/events",
      `/?token=${"0".repeat(32)}`,
    ]) {
      const r = await get(path);
      expect(r.status, path).toBe(401);
      expect(await r.text()).toContain("needs its token");
    }
    expect((await get("/api/runs", { authorization: "Bearer wrong" })).status).toBe(401);
  });

  it("the page with the token sets a cookie that authorizes the API; bearer tokens work too", async () => {
    const page = await get(`/?token=${dash.token}`);
    expect(page.status).toBe(200);
    expect(page.headers.get("content-security-policy")).toMatch(/default-src 'none'; script-src 'sha256-/);
    const cookie = page.headers.get("set-cookie")!.split(";")[0]!;
    expect(cookie).toBe(`marft_dashboard_${dash.port}=${dash.token}`);
    const list = (await (await get("/api/runs", { cookie })).json()) as RunsList;
    expect(list.runs.map((r) => r.name)).toContain("alpha");
    const run = (await (
      await get("/api/run?name=alpha&from=2", { authorization: `Bearer ${dash.token}` })
    ).json()) as RunData;
    expect(run.rows.map((r) => r["iteration"])).toEqual([3]);
    expect((await get("/api/run?name=nope", { cookie })).status).toBe(404);
    expect((await get(`/api/transcripts?name=alpha&iteration=1`, { cookie })).status).toBe(200);
  });

  it("sends a change event when a run's files change", async () => {
    const r = await get(`/api/events?token=${dash.token}`);
    expect(r.headers.get("content-type")).toBe("text/event-stream");
    const reader = r.body!.getReader();
    const seen: string[] = [];
    const until = async (want: string) => {
      const t0 = Date.now();
      while (!seen.join("").includes(want)) {
        if (Date.now() - t0 > 5000) throw new Error(`no "${want}" in ${seen.join("")}`);
        const { value } = await reader.read();
        seen.push(new TextDecoder().decode(value));
      }
    };
    await until("retry:");
    appendIteration(join(root, "beta"), 3);
    await until(`event: run\ndata: {"name":"beta"}`);
    writeRun(join(root, "gamma"), 1);
    await until("event: runs");
    await reader.cancel();
  });
});
