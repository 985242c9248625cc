// The training loop against a real engine with the tiny random-init model: every estimator and
// schedule runs and writes its metrics; frozen agents never change; checkpoints are complete.
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { loadRunConfig } from "../src/config/load.ts";
import type { RunConfig } from "../src/config/schema.ts";
import type { MetricsRow } from "../src/train/phases.ts";
import { RunDir } from "../src/train/rundir.ts";
import { tasksAt, updatingAdapters } from "../src/train/schedule.ts";
import { setupEngine } from "../src/train/setup.ts";
import { Trainer } from "../src/train/trainer.ts";
import { createTinyBase, trainLocally, useEngine } from "./helpers/engine.ts";
import { runSuite } from "../src/train/suite.ts";

const CONFIG = join(import.meta.dirname, "..", "configs", "tiny-secret.yaml");

function tinyConfig(sets: string[] = []): RunConfig {
  return loadRunConfig(CONFIG, [
    "train.iterations=2",
    "train.tasksPerIter=4",
    "train.samplesPerTask=2",
    "train.checkpointEvery=1",
    "eval.n=4",
    // the mechanics under test, not the config's speaker-first curriculum
    "train.schedule=joint",
    "train.roundRobinEvery=1",
    ...sets,
  ]);
}

async function runTiny(sets: string[] = []): Promise<{ rows: MetricsRow[]; dir: string; config: RunConfig }> {
  const config = tinyConfig(sets);
  const dir = join(mkdtempSync(join(tmpdir(), "marft-train-")), config.name);
  return { rows: await trainLocally(config, dir), dir, config };
}

const AGENT_KEYS = ["reward", "loss/policy", "kl", "clipfrac", "entropy"];

function expectAgentKeys(row: MetricsRow, agent: string): void {
  for (const k of AGENT_KEYS) expect(row, `${k}/${agent}`).toHaveProperty([`${k}/${agent}`]);
  for (const k of ["mean", "std", "zero_frac"]) expect(row).toHaveProperty([`adv/${agent}/${k}`]);
  for (const [k, v] of Object.entries(row)) expect(Number.isFinite(v), `${k} = ${v}`).toBe(true);
}

describe("schedules and data order (pure)", () => {
  it("joint, agent-by-agent round robin and critic warm-up pick the right adapters", () => {
    const joint = tinyConfig();
    expect([0, 1, 2].map((i) => updatingAdapters(joint, i))).toEqual([
      ["speaker", "listener"],
      ["speaker", "listener"],
      ["speaker", "listener"],
    ]);
    const rr = tinyConfig([
      "train.schedule=agent-by-agent",
      "train.roundRobinEvery=2",
      "critic.warmupIters=1",
    ]);
    expect([0, 1, 2, 3, 4, 5].map((i) => updatingAdapters(rr, i))).toEqual([
      [],
      ["speaker"],
      ["speaker"],
      ["listener"],
      ["listener"],
      ["speaker"],
    ]);
    const frozen = tinyConfig(["agents[1].trainable=false"]);
    expect(updatingAdapters(frozen, 0)).toEqual(["speaker"]);
  });

  it("agent-by-agent turns: agents of one turn update together; a shared adapter is its owner's", () => {
    const vote = join(import.meta.dirname, "..", "configs", "tiny-vote.yaml");
    const grouped = loadRunConfig(vote, ["train.roundRobinEvery=2"]);
    expect(grouped.train.turns).toEqual([["s1", "s2"], ["agg"]]);
    expect([0, 1, 2, 3, 4].map((i) => updatingAdapters(grouped, i))).toEqual([
      ["s1", "s2"],
      ["s1", "s2"],
      ["agg"],
      ["agg"],
      ["s1", "s2"],
    ]);
    const shared = loadRunConfig(vote, ['agents[1].adapter={"shared":"s1"}']);
    expect(updatingAdapters(shared, 0)).toEqual(["s1"]);
    expect(() => loadRunConfig(vote, ['train.turns=[["s1","nobody"]]'])).toThrow(
      'train.turns[0][1]: unknown agent "nobody"',
    );
  });

  it("metrics.jsonl: a non-finite metric is left out of its line; a string is refused", () => {
    const dir = mkdtempSync(join(tmpdir(), "marft-metrics-"));
    const run = new RunDir(dir);
    run.create();
    run.appendMetrics({ iteration: 1, "value/explained_variance": Number.NaN });
    const [row] = run.readMetrics();
    expect(row!["iteration"]).toBe(1);
    expect(row!["value/explained_variance"]).toBeUndefined();
    writeFileSync(run.metricsPath, '{"iteration": "one"}\n');
    expect(() => run.readMetrics()).toThrow(/metrics.jsonl:1: not a metrics row of numbers/);
  });

  it("the task stream visits every task once per epoch, reproducibly", () => {
    const a = tasksAt(3, 10, 0, 30);
    expect(tasksAt(3, 10, 0, 30)).toEqual(a);
    for (let e = 0; e < 3; e++)
      expect([...a.slice(e * 10, e * 10 + 10)].sort((x, y) => x - y)).toEqual([...Array(10).keys()]);
    // a cursor in the middle continues the same stream (what resume relies on)
    expect(tasksAt(3, 10, 7, 9)).toEqual(a.slice(7, 16));
    expect(tasksAt(4, 10, 0, 10)).not.toEqual(a.slice(0, 10));
  });
});

describe("one run per estimator and schedule (real engine, tiny model)", () => {
  it("MARFT-A, joint: writes every metric, checkpoints, summary", async () => {
    const { rows, dir } = await runTiny();
    expect(rows).toHaveLength(2);
    for (const row of rows) {
      for (const a of ["speaker", "listener"]) expectAgentKeys(row, a);
      for (const k of [
        "reward/mean",
        "value/explained_variance",
        "loss/value",
        "time/rollout",
        "time/policy",
        "time/critic",
        "throughput/sample_tokens_per_s",
        "tokens/sampled",
      ]) {
        expect(row).toHaveProperty([k]);
      }
      expect(row["optim_steps/speaker"]).toBe(2); // epochs 2 x minibatches 1
    }
    expect(rows[1]).toHaveProperty(["eval/accuracy"]);
    const run = new RunDir(dir);
    expect(run.listCheckpoints().map((c) => c.iteration)).toEqual([1, 2]);
    const latest = run.latestCheckpoint()!;
    expect(latest.state.iteration).toBe(2);
    expect(latest.state.metricsLines).toBe(2);
    expect(existsSync(join(latest.path, "engine", "manifest.json"))).toBe(true);
    // speaker, listener: 2 optimizer steps per iteration; critic likewise
    expect(latest.state.adapterVersions).toMatchObject({ speaker: 4, listener: 4, critic: 4 });
    const summary = JSON.parse(readFileSync(run.summaryPath, "utf8"));
    expect(summary.iterations).toBe(2);
    expect(summary.eval.after.n).toBe(4);
    expect(readFileSync(run.configPath, "utf8")).toContain("name: tiny-secret");
  });

  it("MARFT-T: token-level values and advantages", async () => {
    const { rows } = await runTiny(["algo.estimator=marft-t", "train.iterations=1"]);
    expectAgentKeys(rows[0]!, "listener");
    expect(rows[0]).not.toHaveProperty(["logprob_mismatch/listener"]); // fp32 + auto: the sampler's
    expect(rows[0]).toHaveProperty(["value/explained_variance"]);
  });

  it("critic-free: group baselines, no critic", async () => {
    const { rows } = await runTiny(["algo.estimator=critic-free", "train.iterations=1", "ppo.klCoef=0.05"]);
    expectAgentKeys(rows[0]!, "speaker");
    expect(rows[0]).not.toHaveProperty(["loss/value"]);
    expect(rows[0]).toHaveProperty(["kl_ref/speaker"]);
  });

  it("PPO's old log-probs: recomputed by a forward pass in bf16 (auto) or when asked, else the sampler's", async () => {
    const fp32 = await runTiny(["train.iterations=1", "ppo.recomputeLogprobs=true"]);
    // fp32 on CPU: the forward pass reproduces the sampler's log-probs
    expect(fp32.rows[0]!["logprob_mismatch/speaker"]).toBeLessThan(1e-4);
    const bf16 = await runTiny(["train.iterations=1", "bases.tiny.dtype=bfloat16"]);
    // bf16: they differ (which is why auto recomputes), by bf16 rounding only
    const m = bf16.rows[0]!["logprob_mismatch/listener"]!;
    expect(m).toBeGreaterThan(0);
    expect(m).toBeLessThan(0.2);
    expectAgentKeys(bf16.rows[0]!, "listener");
  });

  it("agent-by-agent after a critic warm-up: one agent per iteration, the critic always", async () => {
    const { rows } = await runTiny([
      "train.schedule=agent-by-agent",
      "critic.warmupIters=1",
      "train.iterations=3",
      "train.checkpointEvery=0",
    ]);
    expect(rows.map((r) => ["speaker", "listener"].filter((a) => `loss/policy/${a}` in r))).toEqual([
      [],
      ["speaker"],
      ["listener"],
    ]);
    for (const r of rows) expect(r).toHaveProperty(["loss/value"]);
  });
});

describe("frozen agents", () => {
  const eng = useEngine();

  it("a frozen agent's adapter stays bit-identical while the others train", async () => {
    const config = tinyConfig(["agents[1].trainable=false"]);
    await createTinyBase(eng.client, "tiny", 0);
    await setupEngine(eng.client, config);
    const probe = { data: [{ tokens: [10, 20, 30, 40, 50, 60, 70] }], temperature: 1 };
    const before = await Promise.all(
      ["speaker", "listener"].map((a) => eng.client.forward({ adapter: a, ...probe })),
    );
    const trainer = new Trainer(config, runSuite(config, "."), eng.client);
    await trainer.syncVersions();
    const row = await trainer.iteration();
    expect(row).toHaveProperty(["loss/policy/speaker"]);
    expect(row).not.toHaveProperty(["loss/policy/listener"]);
    const after = await Promise.all(
      ["speaker", "listener"].map((a) => eng.client.forward({ adapter: a, ...probe })),
    );
    expect(after[1]!.results[0]!.logprobs).toEqual(before[1]!.results[0]!.logprobs);
    expect(after[0]!.results[0]!.logprobs).not.toEqual(before[0]!.results[0]!.logprobs);
    const versions = Object.fromEntries(
      (await eng.client.listAdapters()).adapters.map((a) => [a.name, a.version]),
    );
    expect(versions).toMatchObject({ listener: 0, speaker: 2 });
  });
});
