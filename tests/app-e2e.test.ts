// An unmodified two-agent app (examples/openai-duo: the `openai` package, a solver then a checker)
// trains end to end through the gateway on the synthetic cooperative task `secret`, from a tiny
// random-init model on CPU; then `marft serve` on the run directory serves the trained team, and
// the app run against it behaves as trained.
//
// The stated test, beyond chance: the untrained team is right ~1/4 of the time (its first three
// iterations). The checker trains from iteration 30 (the solver-first curriculum), so the last ten
// iterations (640 episodes) are its learned rate; a one-sided binomial test against the first three
// iterations' rate at p < 1e-6 and a gain of 0.15 (7 standard errors) say the team learned. A window
// of three (192 episodes) was too short: a CI run at ~0.5 from iteration 40 on ended 0.53, 0.50, 0.30
// and missed a +0.2 bar by 0.002. Of four runs here two ended at 1.00, one at ~0.57; one reached 1.00 at
// iteration 43, then fell to 0.25-0.69 (lr 1e-2 on a tiny model), its last ten at 0.46. So the checker
// trains at 5e-3 here (the app's config says 1e-2): on a Zen 4 (2026-12-07) at 1e-2 one fresh-clone
// run held 0.97-1.00 from iteration 45 and ended 0.69, 0.25; another reached 0.61 and fell to
// 0.08-0.28, its last ten at 0.32 (p = 4e-6, failing); at 5e-3 two runs rose past 0.9 in the
// checker's last ten iterations and ended at 1.00.
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import OpenAI from "openai";
import { afterAll, describe, expect, it } from "vitest";
import * as openaiDuo from "../examples/openai-duo/app.ts";
import { checkerPrompt, score, solverPrompt, tasks } from "../examples/secret.ts";
import { trainApp } from "../src/app/train-app.ts";
import { RunDir } from "../src/train/rundir.ts";
import { TEST_ENGINE_ENV } from "./helpers/engine.ts";

const ROOT = join(import.meta.dirname, "..");
const dir = join(mkdtempSync(join(tmpdir(), "marft-app-e2e-")), "run");
let server: ChildProcess | undefined;
afterAll(() => {
  server?.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

/** P(X >= k) for X ~ Binomial(n, p), summed in log space. */
function binomialUpperTail(k: number, n: number, p: number): number {
  const logC = (m: number, j: number) => {
    let s = 0;
    for (let i = 1; i <= j; i++) s += Math.log((m - j + i) / i);
    return s;
  };
  let total = 0;
  for (let j = k; j <= n; j++) total += Math.exp(logC(n, j) + j * Math.log(p) + (n - j) * Math.log1p(-p));
  return Math.min(1, total);
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

/** `marft serve <run dir>`: resolves to its base URL once it prints it. */
function serve(runDir: string, token: string): Promise<string> {
  server = spawn(
    process.execPath,
    [join(ROOT, "bin", "marft.mjs"), "serve", runDir, "--port", "0", "--token", token],
    {
      cwd: ROOT,
      env: { ...process.env, ...TEST_ENGINE_ENV },
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: server!.stdout! });
    lines.on("line", (line) => {
      const m = /base URL: (\S+)/.exec(line);
      if (m) resolve(m[1]!);
    });
    server!.once("exit", (code) => reject(new Error(`marft serve exited (${code}) before it was ready`)));
  });
}

describe("an unmodified app trains end to end through the gateway (tiny model, CPU)", () => {
  it("the openai-package duo learns `secret` beyond chance, and serving its checkpoint reproduces it", async () => {
    const summary = await trainApp({
      config: join(ROOT, "examples", "team.yaml"),
      tasks,
      run: openaiDuo.run,
      runDir: dir,
      set: ["train.checkpointEvery=0", "engine.threads=1", "agents[1].lr=5e-3"],
    });
    const rows = new RunDir(dir).readMetrics();
    const reward = rows.map((r) => r["reward/mean"]!);
    console.log(`app duo: reward per iteration ${reward.map((x) => x.toFixed(2)).join(" ")}`);
    const episodes = 16 * 4;
    const p0 = mean(reward.slice(0, 3));
    const last = mean(reward.slice(-10));
    const n = 10 * episodes;
    expect(rows.every((r) => r["episodes/errors"] === 0)).toBe(true);
    // Beyond chance, not to a fixed level: concurrent episodes make the log-probs differ in their last
    // bits with batch composition, so runs part early; of two fresh-clone runs of this recipe one
    // ended at 1.00 and one at 0.53 (the checker still learning). An untrained team stays at ~0.24.
    expect(binomialUpperTail(Math.round(last * n), n, p0)).toBeLessThan(1e-6);
    expect(last - p0, `reward curve ${reward.join(", ")}`).toBeGreaterThan(0.15);
    expect(summary.eval.after!.accuracy).toBeGreaterThan(p0);

    // Serve the trained team from the run directory (its checkpoint) in a fresh process and engine.
    const token = "e2e-serve-token";
    const url = await serve(dir, token);
    const client = new OpenAI({ baseURL: url, apiKey: token });
    // greedy, the app's own requests: the trainer's final evaluation, reproduced answer for answer
    let right = 0;
    for (const task of tasks.eval) {
      const ask = async (model: string, content: string) =>
        (
          await client.chat.completions.create({
            model,
            temperature: 0,
            messages: [
              { role: "system", content: "" },
              { role: "user", content },
            ],
          })
        ).choices[0]!.message.content ?? "";
      const said = await ask("solver", solverPrompt(task));
      right += score(task, said, await ask("checker", checkerPrompt(said))).teamReward;
    }
    expect(right / tasks.eval.length).toBe(summary.eval.after!.accuracy);
    // and the unmodified app, sampling as it trained, is right beyond the untrained team's chance:
    // four episodes per held-out task (128), one-sided binomial p < 1e-3 against the first iterations'
    // rate. (A fixed bar over 32 sampled episodes, one standard error ~0.09, failed now and then.)
    const served = await Promise.all(
      [...tasks.eval, ...tasks.eval, ...tasks.eval, ...tasks.eval].map((task) =>
        openaiDuo.run(task, { baseURL: url, apiKey: token, headers: {} }),
      ),
    );
    const servedRight = served.reduce((s, r) => s + r.teamReward, 0);
    console.log(
      `served: greedy accuracy ${right / tasks.eval.length}, sampled reward ${(servedRight / served.length).toFixed(2)}`,
    );
    expect(binomialUpperTail(servedRight, served.length, p0)).toBeLessThan(1e-3);
    server!.kill("SIGTERM");
    const code = await new Promise<number | null>((resolve) => server!.once("exit", resolve));
    expect(code).toBe(0);
  }, 1_800_000);
});
