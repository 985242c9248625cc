// The dashboard in a real browser: Debian's Chromium driven by playwright-core. `marft dashboard`
// serves an empty runs folder; a tiny training run starts; the page lists it, its reward chart
// gains points while it trains without a reload, its transcripts colour tokens by advantage with
// the log-prob on hover, and its report.html shows the same views with the network cut off.
// Screenshots go to test-artifacts/ (git-ignored).
import type { ChildProcess } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Browser, chromium, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { marft } from "./helpers/cli.ts";

const ROOT = join(import.meta.dirname, "..");
const CHROMIUM = "/usr/bin/chromium";
const ARTIFACTS = join(ROOT, "test-artifacts");
const ITERATIONS = 6;

/** Output of a child so far, and a promise of its exit. */
function watch(child: ChildProcess) {
  const out = { text: "" };
  child.stdout?.on("data", (d) => (out.text += d));
  child.stderr?.on("data", (d) => (out.text += d));
  const exit = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  return { out, exit };
}

/** Is a socket listening on `port` bound to 127.0.0.1 only? (/proc/net/tcp: local address in hex.) */
function listeningAddress(port: number): string | undefined {
  const hexPort = port.toString(16).toUpperCase().padStart(4, "0");
  const line = readFileSync("/proc/net/tcp", "utf8")
    .split("\n")
    .map((l) => l.trim().split(/\s+/))
    .find((f) => f[1]?.endsWith(`:${hexPort}`) && f[3] === "0A");
  return line?.[1]?.split(":")[0];
}

const points = (page: Page, chart: string) =>
  page.locator(`[data-chart="${chart}"]`).getAttribute("data-points").then(Number);

describe("marft dashboard in Chromium", () => {
  const runs = join(mkdtempSync(join(tmpdir(), "marft-dashboard-")), "runs");
  let dashboard: ChildProcess;
  let url = "";
  let port = 0;
  let browser: Browser;
  let page: Page;

  beforeAll(async () => {
    if (!existsSync(CHROMIUM))
      throw new Error(`${CHROMIUM} is missing: make test installs it (apt-get install chromium)`);
    mkdirSync(join(runs, "compare", "estimators"), { recursive: true });
    cpSync(
      join(ROOT, "tests", "fixtures", "compare", "compare.json"),
      join(runs, "compare", "estimators", "compare.json"),
    );
    mkdirSync(ARTIFACTS, { recursive: true });
    dashboard = marft(["dashboard", runs, "--port", "0"]);
    const d = watch(dashboard);
    const t0 = Date.now();
    while (!/http:\/\/\S+token=\w+/.test(d.out.text)) {
      if (Date.now() - t0 > 30_000 || dashboard.exitCode !== null)
        throw new Error(`no URL from marft dashboard:\n${d.out.text}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    url = /http:\/\/\S+token=\w+/.exec(d.out.text)![0];
    port = Number(new URL(url).port);
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
      ],
    });
    page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  });

  afterAll(async () => {
    await browser?.close();
    if (dashboard?.pid && dashboard.exitCode === null) dashboard.kill("SIGTERM");
  });

  it("binds to loopback and refuses a request without its token", async () => {
    expect(new URL(url).hostname).toBe("127.0.0.1");
    expect(listeningAddress(port)).toBe("0100007F"); // 127.0.0.1, not 0.0.0.0
    const bare = await fetch(`http://127.0.0.1:${port}/`);
    expect(bare.status).toBe(401);
    expect((await fetch(`http://127.0.0.1:${port}/api/runs`)).status).toBe(401);
    const res = await page.goto(`http://127.0.0.1:${port}/`);
    expect(res?.status()).toBe(401);
  });

  it("shows a training run live: listed, points added without a reload, tokens coloured by advantage", async () => {
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(url);
    await page.locator("text=no runs yet").waitFor();
    await page.evaluate("window.marker = 42"); // a reload would lose it

    const sets = [
      `train.iterations=${ITERATIONS}`,
      "train.tasksPerIter=4",
      "train.schedule=joint",
      "eval.n=4",
    ];
    const train = marft([
      "train",
      join(ROOT, "configs", "tiny-secret.yaml"),
      "--quiet",
      "--run-dir",
      join(runs, "tiny"),
      ...sets.flatMap((x) => ["--set", x]),
    ]);
    const t = watch(train);
    /** Polls `cond` until it holds; fails at once if the training run failed. */
    const until = async (cond: () => Promise<boolean>, what: string, ms = 180_000) => {
      const t0 = Date.now();
      while (!(await cond())) {
        if (train.exitCode !== null && train.exitCode !== 0)
          throw new Error(`training failed:\n${t.out.text}`);
        if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    };

    await until(() => page.locator('.sidebar [data-run="tiny"]').isVisible(), "the run in the list");
    await page.locator('.sidebar [data-run="tiny"] a').click();
    await until(async () => (await points(page, "reward")) >= 1, "a first point");
    const seen = [await points(page, "reward")];
    await until(async () => {
      const n = await points(page, "reward");
      if (n !== seen.at(-1)) seen.push(n);
      return n >= ITERATIONS;
    }, "every iteration's point");
    expect(seen[0]).toBeLessThan(ITERATIONS);
    expect(seen.length).toBeGreaterThan(1);
    expect(seen).toEqual([...seen].sort((a, b) => a - b)); // only ever more points
    expect(await page.evaluate("window.marker")).toBe(42);
    // the other per-agent charts follow the same rows
    for (const chart of ["kl", "entropy", "clipfrac", "loss", "grad_norm", "critic", "time"]) {
      expect(await points(page, chart), chart).toBe(ITERATIONS);
    }

    // the dependency graph: speaker -> listener
    expect(await page.locator(".graph .node").count()).toBe(2);
    expect(await page.locator('.graph .edge[data-from="speaker"][data-to="listener"]').count()).toBe(1);

    // transcripts of the latest iteration: each token coloured by its advantage's sign
    await until(
      () => page.locator(`.transcripts .iteration[data-iteration="${ITERATIONS}"]`).isVisible(),
      "the last iteration's transcripts",
    );
    const tokens = (await page.evaluate(
      `[...document.querySelectorAll(".episode .tok")].map((e) => ({ adv: Number(e.dataset.adv), bg: getComputedStyle(e).backgroundColor }))`,
    )) as Array<{ adv: number; bg: string }>;
    expect(tokens.length).toBeGreaterThanOrEqual(17); // speaker 16 tokens + listener 1
    for (const { adv, bg } of tokens) {
      const [r, g] = (bg.match(/\d+/g) ?? []).map(Number);
      if (Math.abs(adv) < 1e-6) continue;
      if (adv > 0) expect(g!, bg).toBeGreaterThan(r!);
      else expect(r!, bg).toBeGreaterThan(g!);
    }
    expect(new Set(tokens.map((x) => x.bg)).size).toBeGreaterThan(1);
    // hover: the token's id, advantage and log-prob
    await page.locator(".episode .tok").first().hover();
    expect(await page.locator(".tip.shown").textContent()).toMatch(
      /id \d+[\s\S]*advantage [+-]?\d[\s\S]*log-prob -\d/,
    );

    expect(await t.exit, t.out.text).toBe(0);
    await page.locator('.run-head [data-state="finished"]').waitFor({ timeout: 10_000 });
    await page.evaluate("window.scrollTo(0, 0)");
    await page.screenshot({ path: join(ARTIFACTS, "dashboard.png"), fullPage: true });
    await page.locator(".episode .tok").first().hover();
    await page.screenshot({ path: join(ARTIFACTS, "dashboard-transcript.png") });
    expect(errors).toEqual([]);
  }, 300_000);

  it("overlays another run's curves on the same charts", async () => {
    cpSync(join(runs, "tiny"), join(runs, "tiny-again"), { recursive: true });
    await page.locator('.sidebar [data-run="tiny-again"]').waitFor();
    await page.locator('.sidebar [data-run="tiny-again"] input[type="checkbox"]').check();
    await page.waitForFunction(`location.hash.includes("with=tiny-again")`);
    const legend = page.locator('[data-chart="reward"] .u-legend', { hasText: "tiny-again · team" });
    await legend.waitFor();
    expect(await legend.textContent()).toMatch(/tiny · team[\s\S]*tiny-again · team/);
  });

  it("lists compare results and shows their table and bars", async () => {
    await page.locator('.sidebar [data-compare="compare/estimators"] a').click();
    await page.locator('[data-compare="compare/estimators"] table').waitFor();
    expect(await page.locator("[data-variant]").count()).toBe(3);
    expect(await page.locator('[data-variant="marft-t"]').textContent()).toContain("-8.5");
    expect(await page.locator('[data-chart="compare"] canvas').count()).toBeGreaterThan(0);
    await page.screenshot({ path: join(ARTIFACTS, "dashboard-compare.png") });
  });

  it("the run's report.html shows the same views offline", async () => {
    const report = join(runs, "tiny", "report.html");
    expect(existsSync(report)).toBe(true);
    const offline = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    const requests: string[] = [];
    await offline.route("**/*", (route) => {
      const u = route.request().url();
      if (u.startsWith("file:")) return route.continue();
      requests.push(u);
      return route.abort();
    });
    const errors: string[] = [];
    offline.on("pageerror", (e) => errors.push(e.message));
    await offline.goto(`file://${report}`);
    await offline.locator('[data-chart="reward"] canvas').first().waitFor();
    expect(await points(offline, "reward")).toBe(ITERATIONS);
    expect(await offline.locator(".episode .tok").count()).toBeGreaterThan(0);
    expect(await offline.locator(".graph .node").count()).toBe(2);
    await offline.screenshot({ path: join(ARTIFACTS, "report.png") });
    expect(requests).toEqual([]);
    expect(errors).toEqual([]);
    await offline.close();
  });
});
