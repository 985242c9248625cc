// End-to-end learning: on the synthetic `secret` task (the speaker sees a secret letter, the listener
// sees only the speaker's action and must state the letter), a tiny random-init model's team reward
// rises by a margin chance cannot explain, and far enough that the listener must be decoding the
// speaker. Fixed seed, CPU. The curve is left in runs/e2e-marft-a/metrics.jsonl.
//
// Chance: the untrained team is right ~1/4 of the time (its first three iterations); a listener that
// ignores the speaker can be right at most 1/2 (one letter class; over the 192 episodes of three
// iterations, 3 standard errors reach ~0.61). So a last-three-iterations mean above 0.75 means the
// team communicates (seed 0 reaches 1.00; the bar leaves room for a late decode on another CPU's
// floating point).
// MARFT-A runs configs/tiny-secret.yaml (a speaker-first curriculum; the file explains each setting
// and gives the measured seeds 0-7: 5 of 8 decode) with the speaker's lr halved to 5e-3 and the
// listener's cut to 4e-3. At 1e-2 the recipe can learn and then fall apart: seed 0's listener on a
// Zen 5 CPU (1.00 at iteration 47, 0.27 at 59; KL 1.4-3.6 an iteration), and on an Intel CPU with AMX
// its speaker (0.77 at iteration 24, back to 0.45 by its phase's end, so the listener never decoded;
// 0.50 at the end). With both at 5e-3 seed 0 decoded smoothly on the AMX machine (speaker 0.9 by
// iteration 19, team 1.00 at the end); the listener-only halving decoded on the Zen 5 machine
// (docs/MEASUREMENTS.md, 2026-12-04 and 2026-12-05). On a Zen 4 (2026-12-07), with both at 5e-3 the
// team held 0.95-1.00 at iterations 47-53 and fell to 0.50 at 54 (the listener's entropy 1.92 ->
// 1.30, while the KL measured in its last update was 0.008: a step after the measurement moved it);
// with the listener at 4e-3 it reached 0.94 at iteration 50 and held 0.95-1.00 from 51 to the end;
// at 3e-3, 0.91 at 53 and 0.95-1.00 only from 57. The listener at 4e-3 is untested on the other CPUs.
// Critic-free does not decode `secret` reliably (README, measured results); its learning tests are
// the orchestrated and parallel-vote ones below, where the aggregator has to read the solvers.
import { rmSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { loadRunConfig } from "../src/config/load.ts";
import { trainLocally } from "./helpers/engine.ts";

const ROOT = join(import.meta.dirname, "..");

/** P(X >= k) for X ~ Binomial(n, p), summed in log space. */
function binomialUpperTail(k: number, n: number, p: number): number {
  const logC = (n: number, j: number) => {
    let s = 0;
    for (let i = 1; i <= j; i++) s += Math.log((n - j + i) / i);
    return s;
  };
  let total = 0;
  for (let j = k; j <= n; j++) total += Math.exp(logC(n, j) + j * Math.log(p) + (n - j) * Math.log1p(-p));
  return Math.min(1, total);
}

async function learn(configFile: string, overrides: string[]) {
  const config = loadRunConfig(join(ROOT, "configs", configFile), [...overrides, "train.checkpointEvery=0"]);
  const dir = join(ROOT, "runs", config.name);
  rmSync(dir, { recursive: true, force: true });
  const rows = await trainLocally(config, dir);
  const reward = rows.map((r) => r["reward/mean"] as number);
  const episodes = config.train.tasksPerIter * config.train.samplesPerTask;
  const first = reward.slice(0, 3);
  const last = reward.slice(-3);
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  // Chance level: what the untrained team earned in its first three iterations.
  const p0 = mean(first);
  const n = last.length * episodes;
  const k = Math.round(mean(last) * n);
  /** The mean of a metric over the last three iterations. */
  const lastOf = (key: string) => mean(rows.slice(-3).map((r) => r[key] as number));
  return {
    reward,
    gain: mean(last) - p0,
    p: binomialUpperTail(k, n, p0),
    lastMean: mean(last),
    speakerLast: lastOf("reward/speaker"),
    lastOf,
    rows,
    episodes,
  };
}

describe("binomial tail", () => {
  it("matches known values", () => {
    expect(binomialUpperTail(0, 10, 0.5)).toBeCloseTo(1, 12);
    expect(binomialUpperTail(10, 10, 0.5)).toBeCloseTo(1 / 1024, 12);
    expect(binomialUpperTail(8, 10, 0.5)).toBeCloseTo(56 / 1024, 12);
  });
});

describe("end-to-end learning on `secret` (tiny model, CPU)", () => {
  it("marft-a: the team learns to communicate", async () => {
    const r = await learn("tiny-secret.yaml", [
      "name=e2e-marft-a",
      "algo.estimator=marft-a",
      "agents[0].lr=5e-3",
      "agents[1].lr=4e-3",
    ]);
    console.log(`marft-a: reward per iteration ${r.reward.map((x) => x.toFixed(2)).join(" ")}`);
    expect(r.p).toBeLessThan(0.01);
    // the speaker learned to state the secret it sees (a random one states it in ~1/4 of its characters)
    expect(r.speakerLast).toBeGreaterThan(0.8);
    // communication: no team whose listener ignores the speaker gets near this
    expect(r.gain, `reward curve ${r.reward.join(", ")}`).toBeGreaterThan(0.45);
    expect(r.lastMean).toBeGreaterThan(0.75);
  }, 300_000);
});

// The dynamic graph: the orchestrator's action names the worker that acts next, and only one worker
// (the expert) sees the secret. The team can only beat chance by routing to the expert and the expert
// stating its secret (configs/tiny-orchestrated.yaml has the measured curve).
describe("end-to-end learning on `orchestrated` (tiny model, CPU)", () => {
  it("critic-free: the team reward rises beyond chance", async () => {
    const r = await learn("tiny-orchestrated.yaml", ["name=e2e-orchestrated"]);
    console.log(`orchestrated: reward per iteration ${r.reward.map((x) => x.toFixed(2)).join(" ")}`);
    expect(r.p).toBeLessThan(0.01);
    expect(r.gain, `reward curve ${r.reward.join(", ")}`).toBeGreaterThan(0.2);
  }, 300_000);
});

// The parallel team: two solvers act at once, each sees one bit as a letter of its own pair (a/b,
// c/d); the aggregator sees both and must state the letter the two bits encode, and earns the share
// of the two bits its letter gets right (configs/tiny-vote.yaml: the recipe, why each setting, the
// measured seeds). Solvers first (40 iterations), then the aggregator (40).
// Chance: the untrained team earns ~1/4 of the reward (its first three iterations). An aggregator
// that ignores the solvers gets each bit right with probability at most 1/2: at most 1/2 of the
// reward (an episode's reward is the mean of two bits, variance <= 1/8; over the 192 episodes of three
// iterations 3 standard errors reach ~0.58) and both bits at most 1/4 (3 standard errors: ~0.34).
// So a last-three-iterations reward above 0.6 with both bits right above 0.34 means the aggregator
// reads the solvers (seed 0 measured 0.68 and 0.41, ~80 s). It does not prove it reads BOTH: one
// that reads one solver perfectly reaches 0.75 and 0.5; seed 0 is not there yet after 80 iterations
// (the config's header has the seeds that are).
describe("end-to-end learning on `parallel-vote` (tiny model, CPU)", () => {
  it("critic-free, solvers first: the aggregator learns to combine the solvers' reports", async () => {
    const r = await learn("tiny-vote.yaml", ["name=e2e-vote"]);
    console.log(`parallel-vote: reward per iteration ${r.reward.map((x) => x.toFixed(2)).join(" ")}`);
    // the share of episodes with both bits right, against its own start (binomial)
    const correct = r.rows.map((row) => row["episodes/correct_frac"] as number);
    const n = 3 * r.episodes;
    const first = correct.slice(0, 3).reduce((a, b) => a + b, 0) / 3;
    const lastCorrect = r.lastOf("episodes/correct_frac");
    const p = binomialUpperTail(Math.round(lastCorrect * n), n, Math.max(first, 1 / n));
    expect(p).toBeLessThan(0.01);
    expect(r.p).toBeLessThan(0.01);
    // each solver learned to state its bit (shaping reward: right share minus wrong-letter share)
    expect(r.lastOf("reward/s1")).toBeGreaterThan(0.6);
    expect(r.lastOf("reward/s2")).toBeGreaterThan(0.6);
    // no aggregator that ignores the solvers gets near these
    expect(r.gain, `reward curve ${r.reward.join(", ")}`).toBeGreaterThan(0.3);
    expect(r.lastMean).toBeGreaterThan(0.6);
    expect(lastCorrect).toBeGreaterThan(0.34);
  }, 300_000);
});
