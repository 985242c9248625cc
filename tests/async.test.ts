// Asynchronous training (train.async) against the in-memory engine: the next iteration's rollout is
// issued while this iteration's update runs, no turn beyond its agent's staleness bound is trained
// on (by the policy or the critic), the kept stale turns are trained around pi_prox with the
// configured importance weights, and a checkpoint iteration drains the pipeline. The learning test
// against the real engine is in async-engine.test.ts.
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import type { Schemas } from "../src/client/compute.ts";
import { loadRunConfig } from "../src/config/load.ts";
import { mixSeed } from "../src/rng.ts";
import type { Turn } from "../src/rollout/index.ts";
import { correctStale, RolloutPipeline } from "../src/train/async.ts";
import { setupEngine } from "../src/train/setup.ts";
import type { Step } from "../src/train/steps.ts";
import { runSuite } from "../src/train/suite.ts";
import { Trainer } from "../src/train/trainer.ts";
import { FakeEngine, seededLetter } from "./helpers/fake-engine.ts";

const CONFIGS = join(import.meta.dirname, "..", "configs");
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** optim_step takes `ms` and records when it returned (an "optimStep returned" call). */
class SlowOptimEngine extends FakeEngine {
  constructor(readonly ms: number) {
    super();
  }
  override async optimStep(body: Schemas["OptimStepRequest"]): Promise<Schemas["OptimStepResponse"]> {
    await sleep(this.ms);
    const r = await super.optimStep(body);
    this.calls.push({ endpoint: "optimStep returned" });
    return r;
  }
}

/**
 * Sample answers that claim to come from older adapter versions: `lagOf(req)` versions behind the
 * adapter now, each lag with its own text (so the training data shows which turns it holds) and,
 * when behind, a behaviour log-prob of -1.5 per token (the fake's forward scores -1: pi_prox / mu =
 * e^0.5).
 */
class LaggingEngine extends FakeEngine {
  constructor(
    readonly lagOf: (req: Schemas["SampleRequest"]) => number,
    readonly textOfLag: (adapter: string, lag: number) => string,
  ) {
    super();
    this.textFor = (req) => this.textOfLag(req.adapter, this.lagOf(req));
  }
  override async sample(body: Schemas["SampleBatch"]): Promise<Schemas["SampleResponse"]> {
    const res = await super.sample(body);
    res.results.forEach((r, i) => {
      const lag = this.lagOf(body.requests[i]!);
      r.adapter_version -= lag;
      if (lag > 0) for (const c of r.completions) c.logprobs = c.logprobs.map(() => -1.5);
    });
    return res;
  }
}

async function trainerOn<E extends FakeEngine>(engine: E, sets: string[], before?: (e: E) => Promise<void>) {
  const c = loadRunConfig(join(CONFIGS, "tiny-secret.yaml"), [
    "train.tasksPerIter=4",
    "train.samplesPerTask=2",
    "train.schedule=joint",
    ...sets,
  ]);
  await setupEngine(engine, c);
  if (before) await before(engine);
  const trainer = new Trainer(c, runSuite(c, CONFIGS), engine);
  await trainer.syncVersions();
  engine.calls.length = 0;
  return trainer;
}

/** The response tokens of each datum a forward_backward call of `adapter` trained on. */
function trainedResponses(e: FakeEngine, adapter: string): number[][] {
  return (e.trained.get(adapter) ?? []).flatMap((call) =>
    call.data.map((d) => d.tokens.filter((_, t) => (d.weights?.[t] ?? 0) > 0)),
  );
}

describe("train.async config", () => {
  const load = (sets: string[]) => loadRunConfig(join(CONFIGS, "tiny-secret.yaml"), sets);
  it("defaults, per-agent bounds, and errors that name the field", () => {
    expect(load([]).train.async).toBeNull();
    expect(load(["train.async={}"]).train.async).toEqual({
      maxStaleness: 4,
      correction: "decoupled",
      clip: 2,
    });
    expect(load(["train.async={}", "agents[1].maxStaleness=0"]).agents[1]!.maxStaleness).toBe(0);
    expect(() => load(["agents[0].maxStaleness=1"])).toThrow(
      /agents\[0\]\.maxStaleness: a staleness bound needs asynchronous training/,
    );
    expect(() => load(["train.async={correction: vtrace}"])).toThrow(
      /train\.async\.correction: expected "decoupled" or "truncated-is"/,
    );
    expect(() => load(["train.async={maxStaleness: -1}"])).toThrow(
      /train\.async\.maxStaleness: expected a non-negative integer/,
    );
    expect(() => load(["train.async={clip: 0}"])).toThrow(/train\.async\.clip: expected a positive number/);
    expect(() => load(["train.async={}", "train.offPolicy=true"])).toThrow(
      /train\.offPolicy: train\.async bounds/,
    );
  });
});

describe("train.async (in-memory engine)", () => {
  it("prefetch overlaps: the next rollout's first sample call is issued before the first optim_step returns", async () => {
    const engine = new SlowOptimEngine(30);
    engine.textFor = seededLetter("ab");
    const trainer = await trainerOn(engine, ["train.async={}"]);
    const row = await trainer.iteration();
    const trace = engine.trace();
    const firstReturn = trace.indexOf("optimStep returned");
    const samplesBefore = trace.slice(0, firstReturn).filter((t) => t.startsWith("sample")).length;
    const perRollout = 4 * 2 * 2; // 8 episodes x 2 agents
    expect(samplesBefore).toBeGreaterThan(perRollout);
    // the second iteration takes that rollout instead of playing its own, and prefetches the third:
    // three rollouts in all, not four
    await trainer.iteration();
    await trainer.settle();
    expect(engine.trace().filter((t) => t.startsWith("sample")).length).toBe(3 * perRollout);
    for (const k of ["async/trainer_wait_s", "async/rollout_wait_s", "async/rollout_s", "async/sync_s"])
      expect(row).toHaveProperty([k]);
    expect(row["async/sync_s"]).toBe(0); // one engine: the rollout samples with the adapters trained
  });

  it("synchronous (train.async null): nothing is sampled while the update runs", async () => {
    const engine = new SlowOptimEngine(5);
    engine.textFor = seededLetter("ab");
    const trainer = await trainerOn(engine, []);
    const row = await trainer.iteration();
    const trace = engine.trace();
    expect(trace.slice(trace.indexOf("optimStep returned")).some((t) => t.startsWith("sample"))).toBe(false);
    expect(Object.keys(row).some((k) => k.startsWith("async/"))).toBe(false);
  });

  it("the staleness bound per agent: a turn K+1 behind is never trained on, K behind is corrected", async () => {
    // speaker: K = 2 (train.async), lag 0 / 2 / 3 by seed; listener: K = 0 (its own), lag 0 / 1
    const lagOf = (req: Schemas["SampleRequest"]) =>
      req.adapter === "speaker"
        ? [0, 2, 3][mixSeed(req.seed ?? 0) % 3]!
        : [0, 1][mixSeed(req.seed ?? 0) % 2]!;
    const text: Record<string, Record<number, string>> = {
      speaker: { 0: "a", 2: "b", 3: "z" },
      listener: { 0: "a", 1: "y" },
    };
    const engine = new LaggingEngine(lagOf, (adapter, lag) => text[adapter]![lag]!);
    const trainer = await trainerOn(
      engine,
      ["train.async={maxStaleness: 2, correction: truncated-is, clip: 1.5}", "agents[1].maxStaleness=0"],
      async (e) => {
        for (const a of ["speaker", "listener"])
          for (let i = 0; i < 5; i++) await e.optimStep({ adapter: a });
      },
    );
    const row = await trainer.iteration();
    const code = (ch: string) => ch.charCodeAt(0);
    const speaker = trainedResponses(engine, "speaker");
    const listener = trainedResponses(engine, "listener");
    // what the rollout played, and that every lag occurred (else the test would prove nothing)
    const played = trainer.lastBatch!.episodes.flatMap((ep) => ep.turns);
    const count = (agent: string, t: string) =>
      played.filter((x) => x.agent === agent && x.text === t).length;
    for (const [agent, t] of [
      ["speaker", "z"],
      ["speaker", "b"],
      ["listener", "y"],
      ["listener", "a"],
    ] as const)
      expect(count(agent, t), `${agent} "${t}"`).toBeGreaterThan(0);
    expect(speaker.some((r) => r.includes(code("z")))).toBe(false);
    expect(listener.some((r) => r.includes(code("y")))).toBe(false);
    expect(speaker.some((r) => r.includes(code("b")))).toBe(true); // 2 behind: within K, kept
    expect(row["async/dropped/speaker"]).toBe(count("speaker", "z"));
    expect(row["async/dropped/listener"]).toBe(count("listener", "y"));
    expect(row["async/staleness/speaker/3"]).toBe(count("speaker", "z"));
    expect(row["async/staleness/speaker/2"]).toBe(count("speaker", "b"));
    expect(row["async/staleness/listener/0"]).toBe(count("listener", "a"));
    // the critic trains on the kept steps only (2 epochs x 1 minibatch: each epoch sees them all)
    const criticRows = engine.trained.get("critic")![0]!.data.length;
    expect(criticRows).toBe(played.length - count("speaker", "z") - count("listener", "y"));
    // the kept stale turns went through the correction: PPO's old log-probs are pi_prox (-1), not mu
    for (const call of engine.trained.get("speaker")!)
      for (const d of call.data) {
        const resp = d.tokens.flatMap((_tok, t) => ((d.weights?.[t] ?? 0) > 0 ? [t] : []));
        if (d.tokens[resp[0]!] === code("b"))
          expect(resp.map((t) => d.old_logprobs![t])).toEqual(resp.map(() => -1));
      }
    expect(row["async/speaker/iw_mean"]).toBeCloseTo(1.5, 12); // min(1.5, e^0.5 = 1.65)
    expect(row["async/speaker/iw_capped"]).toBe(1);
  });

  it("the correction weights: truncated-is is min(clip, pi_prox/mu), decoupled leaves out tokens above the cap", async () => {
    const engine = new FakeEngine(); // forward scores every response token -1: pi_prox = e^-1
    await engine.createBase({ name: "b", source: "tiny:llama" });
    await engine.createAdapter({ name: "pi", base: "b" });
    for (let i = 0; i < 3; i++) await engine.optimStep({ adapter: "pi" });
    const mu = [-1.5, -0.2, -1, -3];
    const turn = {
      order: 0,
      step: 0,
      agent: "pi",
      parents: [],
      adapter: "pi",
      adapterVersion: 1,
      temperature: 1,
      promptIds: [1, 2],
      responseIds: [97, 98, 97, 98],
      logprobs: mu,
      text: "abab",
      finishReason: "stop",
      reward: 0,
    } satisfies Turn;
    const step: Step = { episode: 0, group: 0, k: 0, turn, reward: 1 };
    const late = [{ step, advantages: [2] }];
    for (const clip of [0.5, 1, 2, 10]) {
      const ratios = mu.map((m) => Math.exp(-1 - m));
      const t = await correctStale(
        engine,
        "pi",
        late,
        { pi: 3 },
        { maxStaleness: 4, correction: "truncated-is", clip },
      );
      expect(t.items[0]!.oldLogprobs).toEqual([-1, -1, -1, -1]);
      for (const [i, a] of t.items[0]!.advantages.entries())
        expect(a).toBeCloseTo(2 * Math.min(clip, ratios[i]!), 12);
      const d = await correctStale(
        engine,
        "pi",
        late,
        { pi: 3 },
        { maxStaleness: 4, correction: "decoupled", clip },
      );
      for (const [i, a] of d.items[0]!.advantages.entries())
        expect(a).toBeCloseTo(ratios[i]! <= clip ? 2 * ratios[i]! : 0, 12);
    }
  });

  it("drains at a checkpoint iteration and at the end: nothing in flight, the state is the played one", async () => {
    const engine = new FakeEngine();
    engine.textFor = seededLetter("ab");
    const trainer = await trainerOn(engine, [
      "train.async={}",
      "train.checkpointEvery=2",
      "train.iterations=3",
    ]);
    const samples = () => engine.trace().filter((t) => t.startsWith("sample")).length;
    await trainer.iteration(); // prefetches iteration 2
    expect(trainer.state.dataCursor).toBe(4); // iteration 2's tasks are not in the state yet
    await sleep(50); // let the prefetch finish: its tasks still are not
    expect(trainer.state.dataCursor).toBe(4);
    const afterFirst = samples();
    await trainer.iteration(); // takes it; iteration 2 ends in a checkpoint: no prefetch
    expect(samples()).toBe(afterFirst);
    expect(trainer.state.dataCursor).toBe(8);
    await trainer.iteration(); // played now; the last: no prefetch
    expect(samples()).toBe(afterFirst + 16);
    expect(trainer.state.dataCursor).toBe(12);
  });

  it("a stop with a prefetch in flight: the saved state plays that rollout again (same tasks, same seeds)", async () => {
    const sets = ["train.async={}", "train.iterations=5"];
    const a = new FakeEngine();
    a.textFor = seededLetter("ab");
    const uninterrupted = await trainerOn(a, sets);
    await uninterrupted.iteration(); // prefetches iteration 2
    const saved = structuredClone(uninterrupted.state); // what a checkpoint now would write
    await uninterrupted.iteration();
    // resumed: a fresh trainer from the saved state, its engine's adapters where the run's were
    const b = new FakeEngine();
    b.textFor = seededLetter("ab");
    const c = loadRunConfig(join(CONFIGS, "tiny-secret.yaml"), [
      "train.tasksPerIter=4",
      "train.samplesPerTask=2",
      "train.schedule=joint",
      ...sets,
    ]);
    await setupEngine(b, c);
    for (const [name, v] of Object.entries(saved.adapterVersions)) b.adapters.get(name)!.version = v;
    const resumed = new Trainer(c, runSuite(c, CONFIGS), b, { state: saved });
    await resumed.syncVersions();
    await resumed.iteration();
    const played = (t: Trainer) => t.lastBatch!.episodes.map((e) => [e.taskId, e.seed]);
    expect(played(resumed)).toEqual(played(uninterrupted));
    expect(resumed.state.dataCursor).toBe(uninterrupted.state.dataCursor);
    expect(resumed.state.adapterVersions).toEqual(uninterrupted.state.adapterVersions);
    await uninterrupted.settle();
    await resumed.settle();
  });

  it("RolloutPipeline: who waited for whom", async () => {
    const p = new RolloutPipeline<number, string>();
    const a = await p.take(async () => {
      await sleep(40);
      return 1;
    });
    expect(a.batch).toBe(1);
    expect(a.timing.trainerWait).toBeGreaterThanOrEqual(0.035); // nothing prefetched: it waited the rollout
    p.prefetch(async () => {
      await sleep(20);
      return 2;
    }, "before");
    expect(p.before).toBe("before");
    await sleep(60); // the trainer's update, longer than the rollout
    const b = await p.take(async () => 0);
    expect(b.batch).toBe(2);
    expect(b.timing.trainerWait).toBeLessThan(0.01);
    expect(b.timing.rollout).toBeGreaterThanOrEqual(0.015);
    expect(p.before).toBeUndefined();
  });
});
