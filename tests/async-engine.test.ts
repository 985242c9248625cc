// Asynchronous training against the real engine: configs/tiny-secret.yaml still learns with
// train.async on (the next iteration's rollout sampling while this one's update trains, on the
// engine's one compute thread). Not reproducible: which adapter version a turn sees depends on
// timing, so each machine draws another trajectory of the recipe, whose seeds 0-7 end at 0.51-1.00
// synchronously (5 of 8 decode the speaker; the others settle on one letter class, 0.5). Measured
// under async (docs/MEASUREMENTS.md): seeds 1 and 4 decode, 2 and 3 settle at ~0.5, and one CI run of
// seed 0 decoded (0.92) and fell back to 0.25 by iteration 60. So the bar is the one
// tests/replicas.test.ts sets for trajectories that are not one engine's: what every measured one
// meets and no team that did not learn (over the 640 episodes of ten iterations, 3 standard errors
// of a team at chance are ~0.05): the last ten iterations 0.15 above the first three, and the
// speaker's shaping reward 0.15 up at its best in its 30 iterations. The curve is left in runs/e2e-async/.
import { rmSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { loadRunConfig } from "../src/config/load.ts";
import { trainLocally } from "./helpers/engine.ts";

const ROOT = join(import.meta.dirname, "..");
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

describe("train.async on the real engine (tiny model, CPU)", () => {
  it("tiny-secret still learns beyond chance, with every iteration's turns within the bound", async () => {
    const config = loadRunConfig(join(ROOT, "configs", "tiny-secret.yaml"), [
      "name=e2e-async",
      "train.async={}",
      "train.checkpointEvery=0",
    ]);
    const dir = join(ROOT, "runs", config.name);
    rmSync(dir, { recursive: true, force: true });
    const rows = await trainLocally(config, dir);
    const reward = rows.map((r) => r["reward/mean"] as number);
    console.log(`async: reward per iteration ${reward.map((x) => x.toFixed(2)).join(" ")}`);
    expect(rows.length).toBe(60);
    // the prefetch overlapped: turns sampled before the update they were trained after (2 versions
    // behind: ppo.epochs 2 x minibatches 1), none beyond the bound of 4, none dropped
    const behind = (r: Record<string, number>) =>
      Object.entries(r)
        .filter(([k]) => /^async\/staleness\/\w+\/[1-9]/.test(k))
        .reduce((n, [, v]) => n + v, 0);
    expect(rows.reduce((n, r) => n + behind(r), 0)).toBeGreaterThan(0);
    for (const r of rows) {
      expect(r["async/dropped/speaker"]! + r["async/dropped/listener"]!).toBe(0);
      expect(Object.keys(r).some((k) => /^async\/staleness\/\w+\/([5-9]|\d\d)/.test(k))).toBe(false);
    }
    const gain = mean(reward.slice(-10)) - mean(reward.slice(0, 3));
    expect(gain, `reward curve ${reward.join(", ")}`).toBeGreaterThan(0.15);
    // the speaker's best three iterations of its phase, not its last three: the lr-1e-2 recipe can
    // decode and then collapse late (a fresh-clone run on 2026-12-04 reached 0.89 at iteration 20
    // and ended its phase 0.12 up); a speaker at chance stays within a few hundredths of its start
    const speaker = rows.map((r) => r["reward/speaker"] as number);
    const windows = speaker.slice(0, 28).map((_, i) => mean(speaker.slice(i, i + 3)));
    const best = Math.max(...windows.slice(3, 28));
    expect(best - mean(speaker.slice(0, 3)), `speaker ${speaker.join(", ")}`).toBeGreaterThan(0.15);
  }, 400_000);
});
