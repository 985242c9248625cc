// Resume: a run killed with SIGKILL after its first checkpoint and resumed with --resume writes the
// same metrics.jsonl as an uninterrupted run with the same seed (ignoring time/* and throughput/*),
// and the same transcripts.jsonl.
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { RunDir } from "../src/train/rundir.ts";
import { TEST_ENGINE_ENV } from "./helpers/engine.ts";

const ROOT = join(import.meta.dirname, "..");
const SETS = [
  "--set",
  "train.iterations=4",
  "--set",
  "train.checkpointEvery=1",
  "--set",
  "train.tasksPerIter=4",
  "--set",
  "eval.n=4",
  "--set",
  "train.evalEvery=2",
  // both agents update every iteration (the config's curriculum trains the speaker alone for 30)
  "--set",
  "train.schedule=joint",
];

function marft(args: string[]): ChildProcess {
  return spawn(process.execPath, [join(ROOT, "bin", "marft.mjs"), ...args], {
    cwd: ROOT,
    env: { ...process.env, ...TEST_ENGINE_ENV },
    stdio: ["ignore", "pipe", "pipe"],
  });
}

function finish(
  child: ChildProcess,
): Promise<{ code: number | null; signal: NodeJS.Signals | null; out: string }> {
  let out = "";
  child.stdout?.on("data", (d) => (out += d));
  child.stderr?.on("data", (d) => (out += d));
  return new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal, out })));
}

const transcripts = (dir: string) => readFileSync(new RunDir(dir).transcriptsPath, "utf8");

const comparable = (rows: Array<Record<string, unknown>>) =>
  rows.map((r) =>
    Object.fromEntries(
      Object.entries(r).filter(([k]) => !k.startsWith("time/") && !k.startsWith("throughput/")),
    ),
  );

const config = join(ROOT, "configs", "tiny-secret.yaml");
const tmp = mkdtempSync(join(tmpdir(), "marft-resume-"));
const whole = join(tmp, "whole");

/** Resolves when `cond()` holds (polling), rejects if the child exits first. */
function when(child: ChildProcess, cond: () => boolean, what: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const t = setInterval(() => {
      if (cond()) {
        clearInterval(t);
        resolve();
      } else if (child.exitCode !== null) {
        clearInterval(t);
        reject(new Error(`the run ended before ${what}`));
      }
    }, 20);
  });
}

const latestIs = (dir: string, name: string) => {
  const latest = join(dir, "checkpoints", "latest");
  return existsSync(latest) && readFileSync(latest, "utf8").trim() === name;
};

describe("resume and recovery reproduce the uninterrupted run", () => {
  beforeAll(async () => {
    const a = await finish(marft(["train", config, "--run-dir", whole, "--quiet", ...SETS]));
    expect(a.code, a.out).toBe(0);
  });

  it("after SIGKILL, --resume reproduces the uninterrupted run's metrics exactly", async () => {
    const killed = join(tmp, "killed");

    // checkpoints every 2 iterations (the metrics do not depend on it), killed after the third
    // iteration: resume must drop that iteration's lines and write them again
    const every2 = ["--set", "train.checkpointEvery=2"];
    const child = marft(["train", config, "--run-dir", killed, "--quiet", ...SETS, ...every2]);
    const done = finish(child);
    const third = () => latestIs(killed, "iter_2") && new RunDir(killed).metricsLineCount() >= 3;
    await when(child, third, "its third iteration");
    child.kill("SIGKILL");
    const k = await done;
    expect(k.signal).toBe("SIGKILL");
    expect(new RunDir(killed).latestCheckpoint()!.state.iteration).toBe(2);
    expect(new RunDir(killed).metricsLineCount()).toBeGreaterThanOrEqual(3);

    const b = await finish(marft(["train", "--resume", killed, "--quiet"]));
    expect(b.code, b.out).toBe(0);
    expect(b.out).toMatch(/resuming .* from iteration 2/);

    const ra = new RunDir(whole).readMetrics();
    const rb = new RunDir(killed).readMetrics();
    expect(rb).toHaveLength(4);
    expect(comparable(rb)).toEqual(comparable(ra));
    // truncated to the checkpoint like metrics.jsonl, the replayed iterations written again, exactly
    expect(transcripts(killed).split("\n").length).toBeGreaterThan(4);
    expect(transcripts(killed)).toBe(transcripts(whole));
    const sa = JSON.parse(readFileSync(new RunDir(whole).summaryPath, "utf8"));
    const sb = JSON.parse(readFileSync(new RunDir(killed).summaryPath, "utf8"));
    expect(sb.eval.after).toEqual(sa.eval.after);
  });

  it("an engine killed mid-run is restarted from the last checkpoint, same metrics", async () => {
    const dir = join(tmp, "engine-killed");
    const child = marft(["train", config, "--run-dir", dir, "--quiet", ...SETS]);
    const done = finish(child);
    await when(child, () => latestIs(dir, "iter_1"), "its first checkpoint");
    // the engine is the CLI's only python child
    const kids = readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, "utf8").trim().split(/\s+/);
    const engine = kids
      .map(Number)
      .find((pid) => readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("marft_engine.server"));
    expect(engine).toBeDefined();
    process.kill(engine!, "SIGKILL");
    const r = await done;
    expect(r.code, r.out).toBe(0);
    expect(r.out).toMatch(/the engine died during iteration \d+ .*; restarting it/);
    expect(r.out).toMatch(/continuing from the checkpoint at iteration \d+/);
    expect(comparable(new RunDir(dir).readMetrics())).toEqual(comparable(new RunDir(whole).readMetrics()));
    expect(transcripts(dir)).toBe(transcripts(whole));
  });

  it("Ctrl-C saves a checkpoint and exits cleanly; --resume finishes the run", async () => {
    const dir = join(tmp, "interrupted");
    const child = marft([
      "train",
      config,
      "--run-dir",
      dir,
      "--quiet",
      ...SETS,
      "--set",
      "train.checkpointEvery=0",
    ]);
    const done = finish(child);
    await when(child, () => new RunDir(dir).metricsLineCount() >= 1, "its first iteration");
    child.kill("SIGINT");
    const r = await done;
    expect(r.code, r.out).toBe(0);
    expect(r.out).toContain("stopped early; continue with: marft train --resume");
    const ckpt = new RunDir(dir).latestCheckpoint()!;
    expect(ckpt.state.iteration).toBe(new RunDir(dir).metricsLineCount());
    expect(ckpt.state.iteration).toBeLessThan(4);
    const b = await finish(marft(["train", "--resume", dir, "--quiet"]));
    expect(b.code, b.out).toBe(0);
    expect(comparable(new RunDir(dir).readMetrics())).toEqual(comparable(new RunDir(whole).readMetrics()));
  });

  it("--resume on a directory without a checkpoint is a clear error", async () => {
    const dir = mkdtempSync(join(tmpdir(), "marft-noresume-"));
    const r = await finish(marft(["train", "--resume", dir, "--quiet"]));
    expect(r.code).not.toBe(0);
    expect(r.out).toMatch(/config\.yaml: invalid run config\n {2}cannot read the file \(ENOENT\)/);
  });
});
