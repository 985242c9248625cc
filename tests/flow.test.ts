// The sample-efficient training flow (issue 15) without a real engine: the token budget, the
// multi-task scheduler (its weights checked statistically), dynamic sampling, the replay buffer, and
// the checkpointed state of each, with the in-memory engine (tests/helpers/fake-engine.ts) where the
// loop is involved. The importance weights against a real forward pass: replay-engine.test.ts; a
// killed run with all three on resumes exactly: flow-resume.test.ts.
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { parse as parseYaml } from "yaml";
import { chiSquareGoodnessOfFit, flatGroups } from "../src/algo/index.ts";
import { applySets, parseRunConfig } from "../src/config/load.ts";
import type { RunConfig } from "../src/config/schema.ts";
import { ConfigError } from "../src/errors.ts";
import type { Episode, RolloutResult } from "../src/rollout/index.ts";
import { sampleBatch } from "../src/train/dynamic.ts";
import { ReplayBuffer, type ReplayItem } from "../src/train/replay.ts";
import { train } from "../src/train/run.ts";
import { RunDir } from "../src/train/rundir.ts";
import { setupEngine } from "../src/train/setup.ts";
import { runSuite } from "../src/train/suite.ts";
import { learningProgressMix, TaskSource, weightedRoundRobin } from "../src/train/task-source.ts";
import { Trainer } from "../src/train/trainer.ts";
import { Rng } from "../src/rng.ts";
import { FakeEngine, seededLetter } from "./helpers/fake-engine.ts";

const CONFIGS = join(import.meta.dirname, "..", "configs");
const raw = () =>
  parseYaml(readFileSync(join(CONFIGS, "tiny-secret.yaml"), "utf8")) as Record<string, unknown>;

/** tiny-secret with overrides, on the in-memory engine's scale. */
function config(sets: string[] = [], edit: (r: Record<string, unknown>) => void = () => {}): RunConfig {
  const r = raw();
  edit(r);
  return parseRunConfig(
    applySets(r, [
      "train.tasksPerIter=4",
      "train.samplesPerTask=2",
      "train.schedule=joint",
      "train.checkpointEvery=0",
      "eval.n=4",
      ...sets,
    ]),
  );
}

/** A multi-task run of two secret tasks (letters ab and cd) with the given weights. */
function multi(weights: [number, number], sets: string[] = []): RunConfig {
  return config(sets, (r) => {
    const t = r["task"] as Record<string, unknown>;
    delete r["task"];
    r["tasks"] = [
      { name: "ab", weight: weights[0], task: t },
      {
        name: "cd",
        weight: weights[1],
        task: { ...t, options: { ...(t["options"] as object), letters: "cd" } },
      },
    ];
  });
}

async function fakeTrainer(c: RunConfig): Promise<{ trainer: Trainer; engine: FakeEngine }> {
  const engine = new FakeEngine();
  engine.textFor = seededLetter("abcd");
  await setupEngine(engine, c);
  const trainer = new Trainer(c, runSuite(c, CONFIGS), engine);
  await trainer.syncVersions();
  return { trainer, engine };
}

describe("train.maxSampledTokens: the budget", () => {
  it("stops once the budget is sampled, less than one iteration's tokens past it", async () => {
    for (const budget of [50, 137, 400]) {
      const c = config([`train.maxSampledTokens=${budget}`, "train.iterations=1000"]);
      const engine = new FakeEngine();
      engine.textFor = seededLetter("ab");
      const dir = join(mkdtempSync(join(tmpdir(), "marft-budget-")), "run");
      const s = await train({
        config: c,
        configDir: CONFIGS,
        runDir: dir,
        suite: runSuite(c, CONFIGS),
        connect: async () => ({ client: engine, stop: async () => {} }),
      });
      const rows = new RunDir(dir).readMetrics();
      const tokens = rows.map((r) => r["tokens/sampled"] as number);
      const total = tokens.reduce((a, b) => a + b, 0);
      expect(total).toBeGreaterThanOrEqual(budget);
      expect(total - tokens.at(-1)!).toBeLessThan(budget); // the last iteration crossed it
      expect(s.iterations).toBe(rows.length);
      expect(new RunDir(dir).latestCheckpoint()!.state.sampledTokens).toBe(total);
    }
  });

  it("is a validated config key", () => {
    expect(() => config(["train.maxSampledTokens=0"])).toThrow(
      /train\.maxSampledTokens: expected a positive integer/,
    );
  });
});

describe("multi-task runs: the task scheduler", () => {
  it("fixed: the draws follow the weights (chi-square), and a wrong mix is rejected", () => {
    const c = multi([3, 1]);
    const src = new TaskSource(c, runSuite(c, CONFIGS), { dataCursor: 0 });
    const counts = [0, 0];
    for (let it = 0; it < 400; it++) {
      src.begin();
      for (const t of src.next(8) as Array<{ part: number }>) counts[t.part]!++;
    }
    expect(chiSquareGoodnessOfFit(counts, [0.75, 0.25]).p).toBeGreaterThan(1e-3);
    // the test has power: 3200 draws tell 3:1 from 2:1 at once
    expect(chiSquareGoodnessOfFit(counts, [2 / 3, 1 / 3]).p).toBeLessThan(1e-6);
  });

  it("round robin: over sum(w) iterations each task gets exactly w of them, spread out", () => {
    let credit = [0, 0, 0];
    const picks: number[] = [];
    for (let i = 0; i < 12; i++) {
      const r = weightedRoundRobin(credit, [3, 2, 1]);
      credit = r.credit;
      picks.push(r.pick);
    }
    expect(picks.slice(0, 6)).toEqual([0, 1, 0, 2, 1, 0]);
    expect(picks.slice(6)).toEqual(picks.slice(0, 6));
  });

  it("learning progress: more of the task whose reward moves; never-played tasks count as the most moving", () => {
    const p = learningProgressMix([1, 1, 1], [0.5, 0.2, null], [0.3, 0.2, null], 0.2);
    // LP = 0.2, 0, (unseen: the top) 0.2: p = 0.8 * LP / 0.4 + 0.2 / 3
    expect(p[0]).toBeCloseTo(0.4 + 0.2 / 3, 12);
    expect(p[1]).toBeCloseTo(0.2 / 3, 12);
    expect(p[2]).toBeCloseTo(0.4 + 0.2 / 3, 12);
    expect(learningProgressMix([3, 1], [0.4, 0.1], [0.4, 0.1], 0.2)).toEqual([0.75, 0.25]);
  });

  it("per-task metrics and per-task evaluation", async () => {
    const c = multi([1, 1], ["train.iterations=1"]);
    const { trainer } = await fakeTrainer(c);
    const row = await trainer.iteration();
    expect(row["task/ab/episodes"]! + row["task/cd/episodes"]!).toBe(8);
    expect(row["task/ab/mix"]).toBe(0.5);
    const r = await trainer.evaluate();
    expect(Object.keys(r.perTask!)).toEqual(["ab", "cd"]);
    expect(r.perTask!["ab"]!.n).toBe(4); // eval.n problems of each task
    expect(r.problems.map((p) => p.taskId.split("/")[0])).toEqual([
      ...Array(4).fill("ab"),
      ...Array(4).fill("cd"),
    ]);
  });

  it("a scheduler without tasks, or tasks with task, are errors naming the field", () => {
    expect(() => config(["train.taskScheduler={kind: round-robin}"])).toThrow(
      /train\.taskScheduler: a task scheduler needs a multi-task run/,
    );
    const both = () => multi([1, 1]) && config([], (r) => (r["tasks"] = [{ name: "x", task: r["task"] }]));
    expect(both).toThrow(/tasks: give either task \(one task\) or tasks \(several\), not both/);
    expect(() => multi([1, 0])).toThrow(/tasks\[1\]\.weight: expected a positive number/);
  });
});

/** Synthetic rollouts for sampleBatch: task t's group is flat when flatTask(t); 10 tokens per episode. */
function fakePlay(flatTask: (t: number) => boolean, samples = 2) {
  const played: number[] = [];
  const play = async (tasks: unknown[]): Promise<RolloutResult> => {
    const episodes: Episode[] = (tasks as number[]).flatMap((t, g) => {
      played.push(t);
      return Array.from({ length: samples }, (_, j) => ({
        index: g * samples + j,
        taskId: String(t),
        group: g,
        seed: 0,
        turns: [],
        terminated: true,
        truncated: false,
        outcome: { correct: false, score: 0, teamReward: flatTask(t) ? 1 : j, roleRewards: {} },
        info: {},
        transcript: [],
      }));
    });
    const n = episodes.length;
    const stats = {
      episodes: n,
      turns: n,
      tokensSampled: 10 * n,
      seconds: 1,
      tokensPerSecond: 10 * n,
      engineCalls: 1,
      meanDecodeBatch: 1,
      decodeSteps: 1,
      prefillSeconds: 0.1,
      decodeSeconds: 0.2,
    };
    return { episodes, stats };
  };
  const flat = (eps: readonly Episode[]) => {
    const g = new Map<number, Set<number>>();
    for (const e of eps) g.set(e.group, (g.get(e.group) ?? new Set()).add(e.outcome.teamReward));
    return new Set([...g].filter(([, r]) => r.size === 1).map(([k]) => k));
  };
  return { play, flat, played };
}

describe("dynamic sampling", () => {
  it("never admits a flat group while extra rollouts remain; fills the batch; counts the cost", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.boolean(), { minLength: 64, maxLength: 64 }),
        fc.integer({ min: 1, max: 8 }),
        fc.integer({ min: 0, max: 4 }),
        async (flatness, tasksPerIter, maxExtraRollouts) => {
          let cursor = 0;
          const next = (n: number) => Array.from({ length: n }, () => cursor++);
          const { play, flat, played } = fakePlay((t) => flatness[t % 64]!);
          const b = await sampleBatch({ tasksPerIter, dynamic: { maxExtraRollouts }, next, play, flat });
          const m = b.metrics;
          const keptTasks = [...new Set(b.episodes.map((e) => Number(e.taskId)))];
          if (m["dynamic/fallback"] === 0) {
            for (const t of keptTasks) expect(flatness[t % 64], `task ${t} is flat`).toBe(false);
          } else expect(keptTasks).toEqual(played.slice(0, tasksPerIter)); // nothing had signal
          expect(m["dynamic/extra_rollouts"]).toBeLessThanOrEqual(maxExtraRollouts);
          // it stops early only when full: a short batch means the cap was spent
          if (keptTasks.length < tasksPerIter) expect(m["dynamic/extra_rollouts"]).toBe(maxExtraRollouts);
          expect(m["dynamic/dropped_groups"]).toBe(played.filter((t) => flatness[t % 64]).length);
          expect(b.stats.tokensSampled).toBe(20 * played.length); // the dropped groups cost too
          expect(b.sampled).toHaveLength(2 * played.length);
          // one batch: episodes and groups numbered afresh
          expect(b.episodes.map((e) => e.index)).toEqual(b.episodes.map((_, i) => i));
        },
      ),
      { numRuns: 200 },
    );
  });

  it("flatGroups: the same reward for every action of every episode of the group", () => {
    const s = (episode: number, group: number, agent: string, reward: number) => ({
      episode,
      group,
      agent,
      reward,
    });
    const steps = [
      ...[s(0, 0, "a", 1), s(0, 0, "b", 0), s(1, 0, "a", 1), s(1, 0, "b", 0)], // flat
      ...[s(2, 1, "a", 1), s(2, 1, "b", 0), s(3, 1, "a", 1), s(3, 1, "b", 1)], // b differs
      ...[s(4, 2, "a", 0.5), s(5, 2, "a", 0.5), s(5, 2, "a", 0)], // one more action
    ];
    expect(flatGroups(steps)).toEqual(new Set([0]));
  });

  it("runs in the loop: metrics, and the budget counts the refills", async () => {
    const c = config(["train.dynamicSampling={maxExtraRollouts: 3}", "train.iterations=2"]);
    const { trainer } = await fakeTrainer(c);
    const row = await trainer.iteration();
    for (const k of ["dynamic/dropped_groups", "dynamic/extra_tokens", "reward/sampled_mean"])
      expect(row).toHaveProperty([k]);
    expect(trainer.state.sampledTokens).toBe(row["tokens/sampled"]);
    expect(row["tokens/sampled"]).toBeGreaterThan(row["dynamic/extra_tokens"]!);
  });

  it("needs groups", () => {
    expect(() => config(["train.dynamicSampling={}", "train.samplesPerTask=1"])).toThrow(
      /train\.dynamicSampling: expected train\.samplesPerTask >= 2/,
    );
  });
});

/** A replay item of `adapter` sampled at version `v`. */
function item(adapter: string, v: number, id: number): ReplayItem {
  const turn = {
    order: 0,
    step: 0,
    agent: adapter,
    parents: [],
    adapter,
    adapterVersion: v,
    temperature: 1,
    promptIds: [1, 2],
    responseIds: [3],
    logprobs: [-1],
    text: String(id),
    finishReason: "stop" as const,
    reward: 0,
  };
  return { step: { episode: id, group: 0, k: 0, turn, reward: 0 }, advantages: [1], adapter };
}

describe("experience replay: the buffer", () => {
  const opts = { capacity: 50, reuse: 1, maxAge: 3, clip: 1 };

  it("never serves a turn older than maxAge, keeps capacity, draws only the adapter's own", () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.constantFrom("a", "b"), fc.integer({ min: 0, max: 20 })), { maxLength: 80 }),
        fc.integer({ min: 0, max: 24 }),
        fc.integer({ min: 0, max: 60 }),
        (stored, now, n) => {
          const buf = new ReplayBuffer(opts);
          buf.add(stored.filter(([, v]) => v <= now).map(([a, v], i) => item(a, v, i)));
          expect(buf.size).toBeLessThanOrEqual(opts.capacity);
          const versions = { a: now, b: now + 1 };
          const got = buf.draw("a", n, versions, new Rng(1));
          expect(got.length).toBeLessThanOrEqual(n);
          for (const x of got) {
            expect(x.adapter).toBe("a");
            expect(now - x.step.turn.adapterVersion).toBeLessThanOrEqual(opts.maxAge);
          }
        },
      ),
    );
  });

  it("state() and a buffer made from it are the same buffer", () => {
    const buf = new ReplayBuffer(opts);
    buf.add([item("a", 1, 1), item("a", 2, 2), item("b", 2, 3)]);
    const again = new ReplayBuffer(opts, JSON.parse(JSON.stringify(buf.state())));
    expect(again.state()).toEqual(buf.state());
    const v = { a: 3, b: 3 };
    expect(again.draw("a", 2, v, new Rng(5))).toEqual(buf.draw("a", 2, v, new Rng(5)));
  });

  it("in the loop: a replay ratio of reuse / (1 + reuse) once the buffer has turns", async () => {
    const c = config(["train.replay={reuse: 0.5, maxAge: 4}", "train.iterations=3"]);
    const { trainer } = await fakeTrainer(c);
    const first = await trainer.iteration();
    expect(first["replay/ratio"]).toBe(0); // nothing stored yet
    const second = await trainer.iteration();
    expect(second["replay/ratio"]).toBeCloseTo(1 / 3, 12);
    expect(second["replay/listener/age_mean"]).toBe(2); // epochs 2 x minibatches 1 steps ago
    expect(second["replay/listener/iw_mean"]).toBe(1); // the fake scores every token -1: ratio 1
  });

  it("maxAge below the optimizer steps of one iteration is an error naming the field", () => {
    expect(() => config(["train.replay={maxAge: 1}"])).toThrow(ConfigError);
    expect(() => config(["train.replay={maxAge: 1}"])).toThrow(
      /train\.replay\.maxAge: expected at least ppo\.epochs x ppo\.minibatches = 2/,
    );
  });
});

describe("checkpointed state: the scheduler and the buffer continue exactly", () => {
  it("a trainer made from a saved state draws what the original draws next", async () => {
    const c = multi(
      [2, 1],
      [
        "train.taskScheduler={kind: learning-progress}",
        "train.replay={}",
        "train.dynamicSampling={}",
        "train.iterations=6",
      ],
    );
    const a = await fakeTrainer(c);
    for (let i = 0; i < 3; i++) await a.trainer.iteration();
    const saved = JSON.parse(JSON.stringify(a.trainer.state));
    expect(saved.scheduler.fast.every((x: number | null) => x !== null)).toBe(true);
    expect(saved.replay.items.length).toBeGreaterThan(0);
    // a second in-memory engine at the same adapter versions, and a new trainer from the saved state
    const engine = new FakeEngine();
    engine.textFor = a.engine.textFor;
    await setupEngine(engine, c);
    for (const [name, info] of a.engine.adapters) engine.adapters.get(name)!.version = info.version;
    const b = new Trainer(c, runSuite(c, CONFIGS), engine, { state: saved });
    await b.syncVersions();
    const strip = (r: Record<string, number>) =>
      Object.fromEntries(
        Object.entries(r).filter(([k]) => !k.startsWith("time/") && !k.startsWith("throughput/")),
      );
    for (let i = 0; i < 3; i++)
      expect(strip(await b.iteration())).toEqual(strip(await a.trainer.iteration()));
    expect(b.state.replay).toEqual(a.trainer.state.replay);
    expect(b.state.scheduler).toEqual(a.trainer.state.scheduler);
  });
});
