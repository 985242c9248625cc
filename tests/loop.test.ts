// Unit tests of the training loop against an in-memory engine (tests/helpers/fake-engine.ts): the
// phases call the engine in the algorithm's order, the data they send has the right shape, and the
// schedule, the stale-data guard and the critic-free path hold. The same loop runs against the real
// engine in train.test.ts, golden.test.ts and e2e.test.ts.
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { loadRunConfig } from "../src/config/load.ts";
import { setupEngine } from "../src/train/setup.ts";
import { Trainer } from "../src/train/trainer.ts";
import { FakeEngine, seededLetter } from "./helpers/fake-engine.ts";
import { runSuite } from "../src/train/suite.ts";

const CONFIGS = join(import.meta.dirname, "..", "configs");

async function trainerFor(config: string, sets: string[]): Promise<{ trainer: Trainer; engine: FakeEngine }> {
  const c = loadRunConfig(join(CONFIGS, config), [
    "train.tasksPerIter=4",
    "train.samplesPerTask=2",
    "train.deterministic=true",
    ...sets,
  ]);
  const engine = new FakeEngine();
  engine.textFor = seededLetter("ab");
  await setupEngine(engine, c);
  const trainer = new Trainer(c, runSuite(c, CONFIGS), engine);
  await trainer.syncVersions();
  engine.calls.length = 0;
  return { trainer, engine };
}

/** The trace with consecutive repeats of one call folded: ["sample x16", "forward critic", ...]. */
function folded(trace: string[]): string[] {
  const out: string[] = [];
  for (const t of trace) {
    const last = out.at(-1);
    const m = last ? /^(.*) x(\d+)$/.exec(last) : null;
    if (m && m[1] === t) out[out.length - 1] = `${t} x${Number(m[2]) + 1}`;
    else if (last === t) out[out.length - 1] = `${t} x2`;
    else out.push(t);
  }
  return out;
}

describe("one iteration, phase by phase (in-memory engine)", () => {
  it("MARFT-A, joint: rollout, critic values, PPO per adapter, critic update, in that order", async () => {
    const { trainer, engine } = await trainerFor("tiny-secret.yaml", ["train.schedule=joint"]);
    const row = await trainer.iteration();
    const trace = engine.trace().filter((t) => !t.startsWith("sample"));
    expect(
      engine
        .trace()
        .slice(0, 16)
        .every((t) => t.startsWith("sample")),
    ).toBe(true); // 8 episodes x 2 agents
    // epochs 2 x minibatches 1: two optimizer steps per adapter, each after its forward_backward
    expect(folded(trace)).toEqual([
      "forward critic",
      ...["forwardBackward speaker", "optimStep speaker", "forwardBackward speaker", "optimStep speaker"],
      ...["forwardBackward listener", "optimStep listener", "forwardBackward listener", "optimStep listener"],
      ...["forwardBackward critic", "optimStep critic", "forwardBackward critic", "optimStep critic"],
    ]);
    expect(trainer.state).toMatchObject({
      iteration: 1,
      dataCursor: 4,
      adapterVersions: { speaker: 2, listener: 2, critic: 2 },
    });
    for (const k of [
      "reward/mean",
      "loss/policy/speaker",
      "loss/policy/listener",
      "loss/value",
      "time/rollout",
    ])
      expect(row).toHaveProperty([k]);
    expect(row["optim_steps/speaker"]).toBe(2);
  });

  it("sends PPO data with advantages on the action's tokens only, one value per action (MARFT-A)", async () => {
    const { trainer, engine } = await trainerFor("tiny-secret.yaml", ["train.schedule=joint"]);
    await trainer.iteration();
    for (const call of engine.trained.get("speaker")!) {
      expect(call.loss).toBe("ppo");
      for (const d of call.data) {
        const P = d.weights!.indexOf(1);
        expect(d.advantages!.slice(0, P).every((a) => a === 0)).toBe(true);
        expect(new Set(d.advantages!.slice(P)).size).toBe(1); // broadcast: one advantage per action
        expect(d.old_logprobs!.slice(P).every((x) => x === -1)).toBe(true); // the sampler's
      }
    }
    // the critic is trained at one position per action: the last prompt token
    for (const call of engine.trained.get("critic")!) {
      for (const d of call.data) expect(d.weights!.reduce((a, b) => a + b, 0)).toBe(1);
    }
  });

  it("train.batchAdapters: each minibatch of both agents in one batch call, then one step per adapter; same data, same PRNG draws", async () => {
    const sets = ["train.schedule=joint", "ppo.minibatches=2", "ppo.epochs=1"];
    const one = await trainerFor("tiny-secret.yaml", sets);
    const both = await trainerFor("tiny-secret.yaml", [...sets, "train.batchAdapters=true"]);
    const rowOne = await one.trainer.iteration();
    const rowBoth = await both.trainer.iteration();
    const policy = (e: FakeEngine) =>
      e.trace().filter((t) => !t.startsWith("sample") && !t.endsWith(" critic"));
    expect(folded(policy(both.engine))).toEqual([
      ...["forwardBackwardBatch speaker+listener", "optimStep speaker", "optimStep listener"],
      ...["forwardBackwardBatch speaker+listener", "optimStep speaker", "optimStep listener"],
    ]);
    // one epoch: the same shuffles, so each adapter trains on the same minibatches in the same order
    for (const a of ["speaker", "listener"])
      expect(both.engine.trained.get(a)!.map((c) => c.data)).toEqual(
        one.engine.trained.get(a)!.map((c) => c.data),
      );
    expect(both.trainer.state.adapterVersions).toEqual(one.trainer.state.adapterVersions);
    const timed = (k: string) => k.startsWith("time/") || k.startsWith("throughput/");
    for (const k of Object.keys(rowOne).filter((k) => !timed(k)))
      expect([k, rowBoth[k]]).toEqual([k, rowOne[k]]);
  });

  it("MARFT-T trains the critic at every action token", async () => {
    const { trainer, engine } = await trainerFor("tiny-secret.yaml", [
      "train.schedule=joint",
      "algo.estimator=marft-t",
      "agents[0].sampling.maxNewTokens=4",
    ]);
    engine.textFor = () => "abab";
    await trainer.iteration();
    const d = engine.trained.get("critic")![0]!.data.find((x) => x.weights!.reduce((a, b) => a + b, 0) === 4);
    expect(d).toBeDefined(); // a speaker turn of 4 tokens: 4 targets
  });

  it("agent-by-agent: only the turn's adapter updates; the critic always does", async () => {
    const { trainer, engine } = await trainerFor("tiny-secret.yaml", []); // speaker first, 30 iterations
    await trainer.iteration();
    expect(engine.trained.has("speaker")).toBe(true);
    expect(engine.trained.has("listener")).toBe(false);
    expect(engine.trained.has("critic")).toBe(true);
  });

  it("critic-free: no critic pass at all", async () => {
    const { trainer, engine } = await trainerFor("tiny-vote.yaml", []);
    const row = await trainer.iteration();
    expect(engine.trace().some((t) => t.endsWith(" critic"))).toBe(false);
    expect(row).not.toHaveProperty(["loss/value"]);
    expect(row).toHaveProperty(["loss/policy/s1"]);
  });

  it("refuses turns sampled by an adapter version the trainer did not expect", async () => {
    const { trainer, engine } = await trainerFor("tiny-secret.yaml", ["train.schedule=joint"]);
    await engine.optimStep({ adapter: "listener" }); // behind the trainer's back
    await expect(trainer.iteration()).rejects.toThrow(/refusing stale data/);
  });
});
