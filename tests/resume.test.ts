// Resume: a run killed with SIGKILL (after a checkpoint, during its first checkpoint write, during an
// evaluation, at a random moment) and resumed with --resume writes the same metrics.jsonl (ignoring
// time/* and throughput/*) and transcripts.jsonl as an uninterrupted run with the same seed, and
// leaves no partial file.
import { appendFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { RunDir } from "../src/train/rundir.ts";
import { comparable, finish, latestIs, marft, when } from "./helpers/cli.ts";

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

const transcripts = (dir: string) => readFileSync(new RunDir(dir).transcriptsPath, "utf8");

const config = join(ROOT, "configs", "tiny-secret.yaml");
const tmp = mkdtempSync(join(tmpdir(), "marft-resume-"));
const whole = join(tmp, "whole");

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

  it("kill -9 during the first checkpoint write, an evaluation and at a random moment; a torn metrics line; a second trainer refused: --resume reproduces the run, nothing partial is left", async () => {
    const dir = join(tmp, "chain");
    const log = join(dir, "engine.log");
    const logSize = () => (existsSync(log) ? statSync(log).size : 0);
    const logSince = (from: number) => (existsSync(log) ? readFileSync(log, "utf8").slice(from) : "");
    // The moments to kill at, made wide on purpose: checkpoint saves and evaluation's (greedy)
    // sample calls each wait 0.8 s in the engine. Timing does not change a deterministic run.
    const slow = { MARFT_ENGINE_TEST_DELAY: "save_checkpoint=0.8:stall,sample_greedy=0.8:stall" };
    const killWhen = async (args: string[], cond: (since: number) => boolean, what: string) => {
      const from = logSize();
      const child = marft(args, slow);
      const done = finish(child);
      await when(child, () => cond(from), what);
      child.kill("SIGKILL");
      const r = await done;
      expect(r.signal, r.out).toBe("SIGKILL");
      return r;
    };
    const resume = ["train", "--resume", dir, "--quiet"];

    // 1. during the first checkpoint write: no complete checkpoint, a temporary directory left
    await killWhen(
      ["train", config, "--run-dir", dir, "--quiet", ...SETS],
      (from) => logSince(from).includes("test delay: save_checkpoint"),
      "its first checkpoint write",
    );
    expect(new RunDir(dir).latestCheckpoint()).toBeUndefined();
    expect(readdirSync(join(dir, "checkpoints")).some((n) => n.startsWith(".tmp-iter_1"))).toBe(true);

    // 2. resumed: starts over, says so, clears the leftovers; killed during the evaluation at iteration 2
    const r2 = await killWhen(
      resume,
      (from) => logSince(from).includes("test delay: sample_greedy"),
      "the evaluation at iteration 2",
    );
    expect(r2.out).toContain("has no complete checkpoint: starting the run from the beginning");
    expect(r2.out).toMatch(/removed 1 temporary file\(s\) an interrupted trainer left: .*\.tmp-iter_1-/);
    expect(new RunDir(dir).latestCheckpoint()!.state.iteration).toBe(1);

    // 3. resumed from iteration 1; killed at a random moment once its engine is up
    const wait = 300 + Math.floor(Math.random() * 3000);
    let startedAt: number | undefined;
    await killWhen(
      resume,
      (from) => {
        const since = logSince(from);
        if (!since.includes("computes in")) return false;
        startedAt ??= performance.now();
        return performance.now() - startedAt > wait;
      },
      `${wait} ms after its engine started`,
    );
    // a crash in the middle of appending a metrics line
    appendFileSync(new RunDir(dir).metricsPath, '{"reward/mean":0.2');

    // 4. resumed to the end; meanwhile a second trainer on the same directory is refused
    const last = marft(resume);
    const lastDone = finish(last);
    const lock = join(dir, "trainer.lock");
    await when(
      last,
      () => existsSync(lock) && readFileSync(lock, "utf8").includes(`"pid":${last.pid},`),
      "its lock",
    );
    const second = await finish(marft(resume));
    expect(second.code).toBe(1);
    expect(second.out).toContain(`is in use by another trainer (PID ${last.pid} on`);
    const b = await lastDone;
    expect(b.code, b.out).toBe(0);

    expect(comparable(new RunDir(dir).readMetrics())).toEqual(comparable(new RunDir(whole).readMetrics()));
    const sa = JSON.parse(readFileSync(new RunDir(whole).summaryPath, "utf8"));
    const sb = JSON.parse(readFileSync(new RunDir(dir).summaryPath, "utf8"));
    expect(sb.eval.after).toEqual(sa.eval.after);
    // no partial file anywhere: no temporary or moved-aside files, no lock, every metrics line whole
    const all = (d: string): string[] =>
      readdirSync(d).flatMap((n) => (statSync(join(d, n)).isDirectory() ? [n, ...all(join(d, n))] : [n]));
    expect(all(dir).filter((n) => /\.tmp-|\.old-|trainer\.lock/.test(n))).toEqual([]);
    expect(readFileSync(new RunDir(dir).metricsPath, "utf8").endsWith("}\n")).toBe(true);
  }, 600_000);

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
    // one Ctrl-C under make / npx arrives twice: the terminal's SIGINT and npm's forwarded copy
    child.kill("SIGINT");
    await new Promise((r) => setTimeout(r, 30));
    child.kill("SIGINT");
    const r = await done;
    expect(r.code, r.out).toBe(0);
    expect(r.out.match(/Ctrl-C: finishing this iteration, then saving a checkpoint/g)).toHaveLength(1);
    expect(r.out).not.toContain("second Ctrl-C");
    expect(r.out).toMatch(
      /stopped early after iteration \d, checkpoint saved \(.*iter_\d\); continue with: marft train --resume/,
    );
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
