// The train / eval / engine commands as a user runs them: `node bin/marft.mjs ...`.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it, vi } from "vitest";
import { formatNumber, Progress, table } from "../src/cli/progress.ts";
import { TEST_ENGINE_ENV } from "./helpers/engine.ts";

const ROOT = join(import.meta.dirname, "..");
const CONFIG = join(ROOT, "configs", "tiny-secret.yaml");

function marft(args: string[], timeout = 120_000) {
  return spawnSync(process.execPath, [join(ROOT, "bin", "marft.mjs"), ...args], {
    cwd: ROOT,
    env: { ...process.env, ...TEST_ENGINE_ENV },
    encoding: "utf8",
    timeout,
  });
}

describe("config errors", () => {
  it("exit 2 with the zod path message and no stack trace", () => {
    const r = marft(["train", CONFIG, "--set", "agents[1].adapter.r=eight", "--set", "train.bogus=1"]);
    expect(r.status).toBe(2);
    expect(r.stderr).toBe(
      `${CONFIG}: invalid run config\n` +
        '  agents[1].adapter.r: expected a positive integer, got "eight"\n' +
        "  train.bogus: unknown key\n",
    );
  });

  it("bad usage exits 2 with the usage text", () => {
    const r = marft(["train"]);
    expect(r.status).toBe(2);
    expect(r.stderr).toContain("usage: marft train");
    expect(marft(["eval", CONFIG, "--n", "x"]).stderr).toContain(
      '--n: expected a non-negative integer, got "x"',
    );
    // checked before any benchmark starts
    const bench = marft(["bench", "--episodes=0"]);
    expect(bench.status).not.toBe(0);
    expect(bench.stderr).toContain('--episodes: expected a positive integer, got "0"');
  });
});

describe("every subcommand answers --help with its usage", () => {
  const commands = [
    ["train"],
    ["eval"],
    ["demo"],
    ["bench"],
    ["engine"],
    ["engine", "serve"],
    ["grade"],
    ["grade", "math"],
    ["sandbox"],
    ["sandbox", "run"],
  ];
  it.each(commands)("marft %s ... --help", (...cmd) => {
    for (const flag of ["--help", "-h"]) {
      const r = marft([...cmd, flag]);
      expect(r.status, r.stderr).toBe(0);
      expect(r.stdout).toMatch(new RegExp(`^usage: marft ${cmd[0]}`));
      expect(r.stderr).toBe("");
    }
  });
  it("an unknown option is a usage error, not a stack trace", () => {
    for (const cmd of [["demo"], ["bench"], ["train", CONFIG]]) {
      const r = marft([...cmd, "--bogus"]);
      expect(r.status).toBe(2);
      expect(r.stderr).toMatch(/--bogus/);
      expect(r.stderr).toContain(`usage: marft ${cmd[0]}`);
      expect(r.stderr).not.toContain("    at ");
    }
  });
  it("a path that is not there is a message, not a stack trace", () => {
    const r = marft(["serve", "/nonexistent/team.yaml"]);
    expect(r.status).toBe(1);
    expect(r.stderr).toBe("marft serve: /nonexistent/team.yaml does not exist\n");
  });
});

describe("config errors are caught before an engine starts or a run directory is made", () => {
  it.each([
    [
      "a cycle",
      'graph={"kind": "edges", "edges": [["speaker", "listener"], ["listener", "speaker"]]}',
      "  graph.edges: the graph has a cycle speaker -> listener -> speaker; an agent cannot see an action that depends on its own",
    ],
    [
      "a missing base directory",
      "bases.tiny.source=hf:/nonexistent/model",
      "  bases.tiny.source: hf:/nonexistent/model: no such directory /nonexistent/model",
    ],
  ])("%s", (_what, set, line) => {
    const dir = join(mkdtempSync(join(tmpdir(), "marft-early-")), "run");
    const t0 = Date.now();
    const r = marft(["train", CONFIG, "--run-dir", dir, "--set", set]);
    expect(r.status, r.stderr).toBe(2);
    expect(r.stderr).toBe(`${CONFIG}: invalid run config\n${line}\n`);
    expect(existsSync(dir)).toBe(false);
    expect(Date.now() - t0).toBeLessThan(30_000); // no engine was started
  });
});

describe("train and eval from the command line", () => {
  it("trains, prints a summary table, and evaluates the run's checkpoint", () => {
    const dir = join(mkdtempSync(join(tmpdir(), "marft-cli-")), "run");
    const t = marft([
      "train",
      CONFIG,
      "--run-dir",
      dir,
      "--set",
      "train.iterations=1",
      "--set",
      "train.tasksPerIter=4",
      "--set",
      "eval.n=4",
    ]);
    expect(t.status, t.stderr).toBe(0);
    expect(t.stdout).toMatch(/summary\s+value/);
    expect(t.stdout).toMatch(/eval accuracy after\s+[\d.]+/);
    expect(t.stdout).toContain(`run directory: ${dir}`);
    const summary = JSON.parse(readFileSync(join(dir, "summary.json"), "utf8"));

    const out = join(dir, "eval.json");
    const e = marft(["eval", dir, "--n", "4", "--json", out]);
    expect(e.status, e.stderr).toBe(0);
    expect(e.stdout).toMatch(/team\s+checkpoint .*iter_1 \(iteration 1\)/);
    const r = JSON.parse(readFileSync(out, "utf8"));
    expect(r.problems).toHaveLength(4);
    expect(r.problems[0].transcript.length).toBeGreaterThan(0);
    // greedy evaluation of the same checkpoint on the same problems gives the training run's figure
    expect(r.accuracy).toBe(summary.eval.after.accuracy);

    const again = marft(["train", CONFIG, "--run-dir", dir, "--set", "train.iterations=1"]);
    expect(again.status).toBe(1);
    expect(again.stderr).toContain("already holds a run: resume it with --resume");
  });

  it("--data is refused for generated tasks", () => {
    const r = marft(["eval", CONFIG, "--data", "x.jsonl"]);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('--data: task "secret" generates its problems');
  });
});

describe("marft demo", () => {
  it("trains a team and a single agent on the same token budget and writes the comparison", () => {
    // The demo's own configs on the tiny random-init model: the whole path, in a minute or two.
    const out = join(mkdtempSync(join(tmpdir(), "marft-demo-")), "demo");
    // the random-init model writes until its token limit: short limits keep the rollouts cheap
    const tiny = (flag: string, agents: number) => [
      flag,
      "bases.smol.source=tiny:llama",
      flag,
      "critic.layers=[-1]",
      flag,
      "train.tasksPerIter=4",
      ...Array.from({ length: agents }, (_, i) => [flag, `agents[${i}].sampling.maxNewTokens=4`]).flat(),
    ];
    const args = [
      "demo",
      "--iterations",
      "1",
      "--eval",
      "3",
      "--train-problems",
      "20",
      "--out",
      out,
      ...tiny("--set", 2),
      ...tiny("--set-baseline", 1),
    ];
    // three engine starts (team, single agent, its evaluation); minutes on a loaded machine
    const r = marft(args, 400_000);
    expect(r.status, r.stderr).toBe(0);
    const s = JSON.parse(readFileSync(join(out, "summary.json"), "utf8"));
    expect(s.team).toEqual(["stepper", "actor"]);
    expect(s.eval.before.n).toBe(3);
    expect(s.baseline.after.n).toBe(3);
    // the single agent trained until it had sampled at least the team's tokens
    expect(s.baseline.sampled_tokens).toBeGreaterThanOrEqual(s.sampled_tokens);
    expect(Object.keys(s.comparison).sort()).toEqual(
      ["ci95", "method", "paired_p", "per_seed", "same_sign", "seeds", "team_minus_baseline"].sort(),
    );
    expect(s.comparison.seeds).toEqual([1]);
    expect(s.test_tokens_per_problem.team).toBeGreaterThan(0);
    // off a terminal, progress comes as plain lines, the evaluations included (the heartbeat of a
    // silent phase is tested with the Progress class below)
    expect(r.stderr).toMatch(/^seed 1 team \[/m);
    expect(r.stderr).toMatch(/^seed 1 single agent eval \[/m);
    expect(r.stdout).toMatch(/team - single agent \(1 seed\)/);
    const bad = marft(["demo", "--seeds", "1,x"]);
    expect(bad.status).toBe(1);
    expect(bad.stderr).toContain('--seeds: expected a list like 1,2,3, got "1,x"');

    // --resume keeps what the demo finished: the single agent with its evaluation as it was, and
    // the team, whose evaluations are deleted here, evaluated again from its checkpoint, not trained
    rmSync(join(out, "seed-1", "team", "demo-evals.json"));
    const again = marft([...args, "--resume"], 200_000);
    expect(again.status, again.stderr).toBe(0);
    expect(again.stderr).toMatch(/^seed 1 team: kept from the earlier run, .*iter_1; evaluating it again$/m);
    expect(again.stderr).toMatch(
      /^seed 1 single agent: kept from the earlier run, .*, with its evaluations$/m,
    );
    expect(again.stderr).not.toMatch(/^seed 1 (team|single agent) \[/m); // no training
    expect(again.stderr).toMatch(/^seed 1 team eval \(untrained\) \[/m);
    const s2 = JSON.parse(readFileSync(join(out, "summary.json"), "utf8"));
    expect(s2.baseline).toEqual(s.baseline);
    expect(s2.sampled_tokens).toBe(s.sampled_tokens);
    expect(s2.eval.before.n).toBe(3);
    expect(s2.eval.after.n).toBe(3);
    expect(existsSync(join(out, "seed-1", "team", "demo-evals.json"))).toBe(true);
    // other settings or other problems are refused before anything runs, naming the file
    const changed = marft([...args, "--resume", "--set", "ppo.epochs=2"]);
    expect(changed.status).toBe(1);
    expect(changed.stderr).toMatch(
      /--resume: .*seed-1\/team\/config\.yaml differs from the config this demo trains, at line \d+/,
    );
    const other = marft([...args, "--resume", "--eval", "4"]);
    expect(other.status).toBe(1);
    expect(other.stderr).toMatch(/--resume: .*data\/(train|eval)\.jsonl holds other problems/);
  }, 630_000);
});

describe("marft engine serve", () => {
  it("prints the URL and token, and stops on SIGTERM", async () => {
    const child = spawn(
      process.execPath,
      [join(ROOT, "bin", "marft.mjs"), "engine", "serve", "--port", "0", "--device", "cpu"],
      {
        cwd: ROOT,
        env: { ...process.env, ...TEST_ENGINE_ENV, MARFT_ENGINE_TOKEN: "" },
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    await new Promise<void>((resolve, reject) => {
      const t = setInterval(() => {
        if (/token: \S+/.test(out)) {
          clearInterval(t);
          resolve();
        }
        if (child.exitCode !== null) reject(new Error(`engine serve exited: ${out}`));
      }, 50);
    });
    const url = /url: +(\S+)/.exec(out)![1]!;
    const token = /token: +(\S+)/.exec(out)![1]!;
    const health = await fetch(`${url}/v1/health`, { headers: { authorization: `Bearer ${token}` } });
    expect(health.status).toBe(200);
    child.kill("SIGTERM");
    const code = await new Promise((resolve) => child.on("exit", (c, s) => resolve(c ?? s)));
    expect(code).not.toBeNull();
  });
});

describe("progress and tables", () => {
  it("plain lines for non-TTY streams, a bar on a TTY", () => {
    const lines: string[] = [];
    const plain = new Progress("train", 4, {
      stream: { write: (s: string) => lines.push(s) },
      plainEveryMs: 1e9,
    });
    plain.update(1);
    plain.update(2, "reward 0.5");
    plain.finish();
    // the first update prints (lastPlain starts at 0), then only the final line
    expect(lines).toHaveLength(2);
    expect(lines[1]).toMatch(/^train \[#{12}\.{12}\] 2\/4 {2}[\d.]+s {2}reward 0\.5\n$/);
    const tty: string[] = [];
    const bar = new Progress("eval", 2, {
      stream: { write: (s: string) => tty.push(s), isTTY: true, columns: 80 },
    });
    bar.tick();
    expect(tty[0]!.startsWith("\r\u001b[2Keval [############............] 1/2")).toBe(true);
  });

  it("plain lines keep coming while nothing reports progress (a heartbeat), and stop at the end", () => {
    vi.useFakeTimers();
    try {
      const lines: string[] = [];
      const bar = new Progress("eval", 200, {
        stream: { write: (s: string) => lines.push(s) },
        plainEveryMs: 30_000,
      });
      bar.update(3, "team after");
      expect(lines).toHaveLength(1);
      vi.advanceTimersByTime(10 * 60_000); // ten silent minutes
      // one line per 30 s at least, never more often than that
      expect(lines.length).toBeGreaterThanOrEqual(20);
      expect(lines.length).toBeLessThanOrEqual(21);
      expect(lines.at(-1)).toMatch(/^eval \[.*\] 3\/200 {2}600\.0s {2}team after\n$/);
      bar.finish();
      const n = lines.length;
      vi.advanceTimersByTime(5 * 60_000);
      expect(lines.length).toBe(n);
    } finally {
      vi.useRealTimers();
    }
  });

  it("aligns a table", () => {
    expect(
      table(
        [
          ["a", 1],
          ["bb", 0.5],
        ],
        ["k", "v"],
      ),
    ).toBe("k        v\n--  ------\na        1\nbb  0.5000\n");
    expect(formatNumber(1e-5)).toBe("1.00e-5");
  });
});
