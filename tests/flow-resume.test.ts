// Resume restores the task scheduler and the replay buffer exactly: a multi-task run with the
// learning-progress scheduler, dynamic sampling and experience replay, killed with SIGKILL after a
// checkpoint and resumed, writes the metrics of the uninterrupted run (task mix, drops, replayed
// turns and their importance weights included), ignoring time/* and throughput/*.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { RunDir } from "../src/train/rundir.ts";
import { comparable, finish, latestIs, marft, when } from "./helpers/cli.ts";

const ROOT = join(import.meta.dirname, "..");
const CONFIG = join(ROOT, "configs", "tiny-multitask.yaml");
const SETS = [
  "train.iterations=4",
  "train.tasksPerIter=4",
  "train.checkpointEvery=1",
  "train.taskScheduler={kind: learning-progress, fast: 0.5, slow: 0.1, explore: 0.2}",
  "train.dynamicSampling={maxExtraRollouts: 2}",
  "train.replay={capacity: 64, reuse: 1, maxAge: 4}",
  "eval.n=4",
].flatMap((s) => ["--set", s]);

describe("resume with the training flow on", () => {
  it("a killed run resumes with the scheduler's state and the replay buffer exactly", async () => {
    const tmp = mkdtempSync(join(tmpdir(), "marft-flow-resume-"));
    const whole = join(tmp, "whole");
    const a = await finish(marft(["train", CONFIG, "--run-dir", whole, "--quiet", ...SETS]));
    expect(a.code, a.out).toBe(0);
    const rows = new RunDir(whole).readMetrics();
    // the features are on and do something
    expect(rows.at(-1)!["replay/ratio"]).toBeGreaterThan(0);
    expect(rows.some((r) => (r["dynamic/dropped_groups"] as number) > 0)).toBe(true);
    expect(rows.at(-1)!).toHaveProperty(["task/easy/mix"]);

    const killed = join(tmp, "killed");
    const child = marft(["train", CONFIG, "--run-dir", killed, "--quiet", ...SETS]);
    const done = finish(child);
    await when(child, () => latestIs(killed, "iter_2"), "its second checkpoint");
    child.kill("SIGKILL");
    expect((await done).signal).toBe("SIGKILL");
    const ckpt = new RunDir(killed).latestCheckpoint()!;
    expect(ckpt.state.scheduler).toBeDefined();
    expect(ckpt.state.replay!.items.length).toBeGreaterThan(0);

    const b = await finish(marft(["train", "--resume", killed, "--quiet"]));
    expect(b.code, b.out).toBe(0);
    expect(comparable(new RunDir(killed).readMetrics())).toEqual(comparable(rows));
    expect(new RunDir(killed).latestCheckpoint()!.state.scheduler).toEqual(
      new RunDir(whole).latestCheckpoint()!.state.scheduler,
    );
  }, 900_000); // two short runs of the tiny model on 2 shared cores
});
