// The run directory survives what a crash leaves: a torn last metrics line, temporary files, a stale
// lock (and its orphan engine); a live trainer's lock refuses a second one, naming its PID.
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { DataError, RunLockedError } from "../src/errors.ts";
import { RunDir } from "../src/train/rundir.ts";

const fresh = () => new RunDir(join(mkdtempSync(join(tmpdir(), "marft-rundir-")), "run"));

describe("metrics.jsonl after a crash", () => {
  it("a torn last line is no line: readers skip it, truncation cuts it", () => {
    const run = fresh();
    run.create();
    writeFileSync(run.metricsPath, '{"reward/mean":0.5}\n{"reward/mean":0.7}\n{"reward/me');
    expect(run.readMetrics()).toEqual([{ "reward/mean": 0.5 }, { "reward/mean": 0.7 }]);
    expect(run.metricsLineCount()).toBe(2);
    run.truncateMetrics(1);
    expect(readFileSync(run.metricsPath, "utf8")).toBe('{"reward/mean":0.5}\n');
    // a bad line that is not the last is damage, not a crash: named, never skipped
    writeFileSync(run.metricsPath, '{"reward/mean":0.5}\n{"reward/me\n{"reward/mean":0.7}\n');
    expect(() => run.readMetrics()).toThrow(DataError);
    expect(() => run.readMetrics()).toThrow(/metrics\.jsonl:2: not JSON/);
    // a checkpoint that vouches for lines the file does not have
    writeFileSync(run.metricsPath, '{"reward/mean":0.5}\n');
    expect(() => run.truncateMetrics(3)).toThrow(/1 lines, but the checkpoint vouches for 3/);
  });

  it("a non-finite metric is left out of its line, which stays readable", () => {
    const run = fresh();
    run.create();
    run.appendMetrics({ "reward/mean": 0.5, "value/explained_variance": Number.NaN, "x/y": Infinity });
    expect(readFileSync(run.metricsPath, "utf8")).toBe('{"reward/mean":0.5}\n');
    expect(run.readMetrics()).toEqual([{ "reward/mean": 0.5 }]);
  });

  it("removes temporary checkpoint directories and the temporary files of atomic writes", () => {
    const run = fresh();
    run.create();
    mkdirSync(join(run.checkpointsDir, ".tmp-iter_2-abcd", "engine.tmp-1234"), { recursive: true });
    writeFileSync(join(run.checkpointsDir, "latest.tmp-99-ffff"), "iter_2");
    writeFileSync(join(run.root, "metrics.jsonl.tmp-99-eeee"), "x");
    mkdirSync(join(run.checkpointsDir, "iter_1"));
    writeFileSync(run.metricsPath, "");
    expect(run.removeLeftovers()).toHaveLength(3);
    expect(existsSync(join(run.checkpointsDir, "iter_1"))).toBe(true);
    expect(existsSync(run.metricsPath)).toBe(true);
    expect(run.removeLeftovers()).toEqual([]);
  });
});

describe("the lock", () => {
  it("refuses a second trainer while the holder lives, naming its PID", async () => {
    const run = fresh();
    const holder = spawn("sleep", ["30"]);
    try {
      run.create();
      writeFileSync(
        run.lockPath,
        JSON.stringify({
          pid: holder.pid,
          started: procStart(holder.pid!),
          host: (await import("node:os")).hostname(),
        }),
      );
      await expect(run.lock()).rejects.toThrow(RunLockedError);
      await expect(run.lock()).rejects.toThrow(`is in use by another trainer (PID ${holder.pid} on`);
    } finally {
      holder.kill("SIGKILL");
    }
  });

  it("takes over a stale lock (holder gone, or its PID reused), and releases its own", async () => {
    const run = fresh();
    const dead = spawn("true");
    await new Promise((r) => dead.on("exit", r));
    const host = (await import("node:os")).hostname();
    run.create();
    writeFileSync(run.lockPath, JSON.stringify({ pid: dead.pid, started: "1", host }));
    const release = await run.lock();
    expect(JSON.parse(readFileSync(run.lockPath, "utf8")).pid).toBe(process.pid);
    await expect(run.lock()).rejects.toThrow(`PID ${process.pid}`); // our own live lock holds too
    release();
    expect(existsSync(run.lockPath)).toBe(false);
    // a live process whose start time is not the holder's: the PID was reused
    writeFileSync(run.lockPath, JSON.stringify({ pid: process.pid, started: "1", host }));
    (await run.lock())();
    // torn (a crash while it was written): nobody's
    writeFileSync(run.lockPath, '{"pid": 12');
    (await run.lock())();
  });

  it("stops the engine a dead trainer left running before taking over", async () => {
    const run = fresh();
    // stands in for an orphan engine: the lock check looks for this in its command line
    const orphan = spawn("python3", ["-c", "import time; time.sleep(60)", "marft_engine.server"]);
    await new Promise((r) => setTimeout(r, 200));
    const dead = spawn("true");
    await new Promise((r) => dead.on("exit", r));
    run.create();
    const host = (await import("node:os")).hostname();
    writeFileSync(run.lockPath, JSON.stringify({ pid: dead.pid, started: "1", host, enginePid: orphan.pid }));
    const lines: string[] = [];
    const exited = new Promise((r) => orphan.on("exit", (_c, s) => r(s)));
    (await run.lock((l) => lines.push(l)))();
    expect(await exited).toBe("SIGKILL");
    expect(lines).toEqual([
      `stopped engine ${orphan.pid}, left running by trainer ${dead.pid}, which is gone`,
    ]);
  });
});

function procStart(pid: number): string {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]!;
}
