// `marft compare` without a real engine: the spec's validation, what each built-in variant changes,
// the cells' configs, the budget (every variant stops at the same token count, within one
// iteration's worth), the paired statistics against the first variant, and that a finished cell is
// read back instead of recomputed. With the in-memory engine (tests/helpers/fake-engine.ts); a real
// `marft compare` killed and rerun: compare-resume.test.ts.
import { mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { pairedDifference, pairedTTest } from "../src/algo/index.ts";
import { versusFirst } from "../src/compare/aggregate.ts";
import type { CellResult } from "../src/compare/cell.ts";
import { planCompare, runCompare } from "../src/compare/run.ts";
import { loadCompareSpec, parseCompareSpec } from "../src/compare/spec.ts";
import { configDiff, resolveVariant } from "../src/compare/variants.ts";
import { agentSpecs } from "../src/config/derived.ts";
import { loadRunConfig } from "../src/config/load.ts";
import { arithmeticSplits } from "../src/envs/math/arith.ts";
import { runSuite } from "../src/train/suite.ts";
import { FakeEngine, seededLetter } from "./helpers/fake-engine.ts";

const CONFIGS = join(import.meta.dirname, "..", "configs");
const neutral = { neutralPrompt: "You are a helpful assistant." };
const variant = (
  base: string,
  builtin: Parameters<typeof resolveVariant>[1]["builtin"],
  sets: string[] = [],
) =>
  resolveVariant(loadRunConfig(join(CONFIGS, base), sets), { name: builtin, builtin, set: {} }, neutral)
    .config;

describe("the spec", () => {
  const ok = { base: "tiny-secret.yaml", variants: ["team"], budget: { sampledTokens: 100 } };

  it("errors name the field", () => {
    expect(() => parseCompareSpec({ ...ok, budget: { sampledTokens: 0 } })).toThrow(
      /budget\.sampledTokens: expected a positive integer/,
    );
    expect(() => parseCompareSpec({ ...ok, variants: ["team", "teams"] })).toThrow(
      /variants\[1\]: expected a built-in variant \(team, single-agent, .*\) or \{name, builtin\?, set\?\}/,
    );
    expect(() => parseCompareSpec({ ...ok, variants: ["team", { name: "team", set: {} }] })).toThrow(
      /variants\[1\]: duplicate variant name "team"/,
    );
    expect(() => parseCompareSpec({ ...ok, seeds: [1, 1] })).toThrow(/seeds: expected distinct seeds/);
    expect(() => parseCompareSpec({ ...ok, bogus: 1 })).toThrow(/bogus: unknown key/);
  });

  it("the shipped specs validate and plan (every cell's config)", async () => {
    const out = mkdtempSync(join(tmpdir(), "marft-plan-"));
    for (const f of readdirSync(CONFIGS).filter((x) => x.startsWith("compare-"))) {
      const { spec, dir } = loadCompareSpec(join(CONFIGS, f));
      if (f === "compare-paper.yaml") continue; // its base reads the data `marft demo` generates
      const plan = await planCompare(spec, dir, out);
      expect(plan.cells).toHaveLength(spec.variants.length * spec.seeds.length);
    }
  });
});

describe("built-in variants change what their name says", () => {
  it("single-agent: the last agent alone, same model, LoRA, sampling and learning rate", () => {
    const base = loadRunConfig(join(CONFIGS, "demo.yaml"));
    const c = variant("demo.yaml", "single-agent");
    // its stop strings aside (the next test)
    const { stop: _stop, ...sampling } = base.agents[1]!.sampling;
    expect(c.agents).toEqual([{ ...base.agents[1], sampling: { ...sampling, stop: [] } }]);
    expect(c.ppo).toEqual(base.ppo);
    expect(c.critic).toEqual(base.critic);
    expect(c.train.tasksPerIter).toBe(base.train.tasksPerIter);
  });

  it("single-agent keeps the last agent's per-role reward, drops the others'", () => {
    const c = variant("tiny-secret.yaml", "single-agent");
    expect(c.algo.rewardRouting).toEqual({ kind: "per-role", roles: { listener: "team" } });
    expect(c.algo.normalize).toBe(true); // normalize: [listener] named it
    expect(c.train.schedule).toBe("joint");
    // the demo's step rewards belong to the stepper, whom the single agent replaces
    const demo = variant("demo.yaml", "single-agent");
    expect(demo.task?.kind === "math" && demo.task.options.stepRoles).toBe(undefined);
    // and it writes every step: the step agents' stop at a newline goes, the rest of its sampling stays
    expect(loadRunConfig(join(CONFIGS, "demo.yaml")).agents[1]!.sampling.stop).toEqual(["\n"]);
    expect(demo.agents[0]!.sampling).toMatchObject({ stop: [], maxNewTokens: 24, temperature: 0.7 });
    expect(variant("tiny-secret.yaml", "single-agent").agents[0]!.sampling.stop).toEqual([]);
  });

  it("anonymous: one neutral prompt; the other agents see positions, not roles; rewards still by role", async () => {
    const c = variant("demo.yaml", "anonymous");
    expect(new Set(c.agents.map((a) => a.systemPrompt))).toEqual(new Set([neutral.neutralPrompt]));
    expect(c.agents.map((a) => a.role)).toEqual(["stepper", "actor"]);
    const s = variant("tiny-secret.yaml", "anonymous");
    const env = runSuite(s, CONFIGS).makeEnv(agentSpecs(s), s.graph);
    await env.reset(runSuite(s, CONFIGS).train[0], 0);
    await env.act("speaker", "aaaa");
    const seen = env
      .observe("listener")
      .map((m) => m.content)
      .join("\n");
    expect(seen).toContain("agent 1: aaaa");
    expect(seen).not.toMatch(/speaker|listener/);
  });

  it("graph, rollout, credit and adapter variants", () => {
    expect(variant("tiny-secret.yaml", "parallel").graph).toEqual({ kind: "parallel" });
    expect(variant("tiny-vote.yaml", "sequential").graph).toEqual({ kind: "sequential" });
    expect(variant("tiny-secret.yaml", "async").train.deterministic).toBe(false);
    expect(variant("demo.yaml", "lockstep").train.deterministic).toBe(true);
    const cf = variant("tiny-secret.yaml", "critic-free", ["train.samplesPerTask=1"]);
    expect([cf.algo.estimator, cf.train.samplesPerTask]).toEqual(["critic-free", 2]);
    const t = variant("tiny-vote.yaml", "marft-t"); // a critic-free base: a critic on the first agent's base
    expect([t.algo.estimator, t.critic?.base]).toEqual(["marft-t", "tiny"]);
    const shared = variant("tiny-vote.yaml", "shared-adapter");
    expect(shared.agents.map((a) => a.adapter)).toEqual([
      shared.agents[0]!.adapter,
      { shared: "s1" },
      { shared: "s1" },
    ]);
  });

  it("configDiff lists what a variant changed", () => {
    const a = loadRunConfig(join(CONFIGS, "tiny-secret.yaml"));
    expect(configDiff(a, variant("tiny-secret.yaml", "parallel"))).toEqual([
      'graph.kind: "sequential" -> "parallel"',
    ]);
  });
});

describe("planning the cells", () => {
  it("every cell: its seed, the budget, the evaluation, a checkpoint schedule", async () => {
    const spec = parseCompareSpec({
      base: "tiny-secret.yaml",
      variants: ["team", "parallel"],
      seeds: [3, 4],
      budget: { sampledTokens: 5000 },
      eval: { n: 8 },
    });
    const plan = await planCompare(spec, CONFIGS, "/tmp/x");
    expect(plan.cells.map((c) => `${c.variant}@${c.seed}`)).toEqual([
      "team@3",
      "parallel@3",
      "team@4",
      "parallel@4",
    ]);
    for (const c of plan.cells) {
      expect(c.config.seed).toBe(c.seed);
      expect(c.config.train).toMatchObject({
        maxSampledTokens: 5000,
        evalAtStart: false,
        checkpointEvery: 5,
      });
      expect(c.config.eval.n).toBe(8);
      expect(c.dir).toBe(`/tmp/x/cells/${c.variant}/seed-${c.seed}`);
    }
  });

  it("a variant the task cannot play fails before anything trains, naming the variant", async () => {
    const spec = parseCompareSpec({
      base: "tiny-secret.yaml",
      variants: ["team", "single-agent"],
      budget: { iterations: 2 },
    });
    await expect(planCompare(spec, CONFIGS, "/tmp/x")).rejects.toThrow(
      /variant single-agent: invalid variant\n {2}the task does not accept this team/,
    );
  });
});

/** A generated arithmetic math task on disk, and a spec over the demo team on it. */
function mathSpecDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "marft-cmp-"));
  const d = arithmeticSplits(0, 64, 8, "two-step"); // the demo team's stepper is paid for the first step
  const jsonl = (ps: typeof d.train) => ps.map((p) => JSON.stringify(p)).join("\n");
  writeFileSync(join(dir, "train.jsonl"), jsonl(d.train));
  writeFileSync(join(dir, "eval.jsonl"), jsonl(d.eval));
  writeFileSync(
    join(dir, "spec.yaml"),
    `base: ${join(CONFIGS, "demo.yaml")}
set: { task.trainFile: ${join(dir, "train.jsonl")}, task.evalFile: ${join(dir, "eval.jsonl")}, train.tasksPerIter: 4 }
variants: [team, single-agent, parallel, untrained]
seeds: [0, 1]
budget: { sampledTokens: 90 }
eval: { n: 8 }
checkpointEvery: 2
`,
  );
  return dir;
}

describe("runCompare with the in-memory engine", () => {
  const fake = () => async () => {
    const engine = new FakeEngine();
    engine.textFor = seededLetter("123");
    return { client: engine, stop: async () => {} };
  };

  it("the budget stops every variant at the same token count, within one iteration's worth", async () => {
    const dir = mathSpecDir();
    const { spec } = loadCompareSpec(join(dir, "spec.yaml"));
    const out = join(dir, "out");
    const r = await runCompare(spec, { specDir: dir, specName: "spec.yaml", outDir: out, connect: fake });
    expect(r.report.complete).toBe(true);
    for (const v of r.report.variants.filter((x) => !x.untrained)) {
      for (const s of v.seeds) {
        const rows = readFileSync(join(out, "cells", v.name, `seed-${s.seed}`, "metrics.jsonl"), "utf8")
          .trim()
          .split("\n")
          .map((l) => JSON.parse(l) as Record<string, number>);
        const last = rows.at(-1)!["tokens/sampled"]!;
        expect(s.sampled_tokens, `${v.name} seed ${s.seed}`).toBeGreaterThanOrEqual(90);
        expect(s.sampled_tokens - last, `${v.name} seed ${s.seed}`).toBeLessThan(90);
      }
    }
    // one action per episode instead of two: the single agent trains on about twice the iterations
    const its = (n: string) => r.report.variants.find((v) => v.name === n)!.seeds[0]!.iterations;
    expect(its("single-agent")).toBeGreaterThan(its("team"));
    expect(r.report.variants.find((v) => v.name === "untrained")!.seeds[0]!.sampled_tokens).toBe(0);
    const json = JSON.parse(readFileSync(r.jsonPath, "utf8"));
    expect(Object.keys(json.variants[1].seeds[0])).toEqual(
      expect.arrayContaining(["seed", "accuracy", "ci95", "sampled_tokens", "wall_s"]),
    );
    expect(json.variants[0].vs_first).toBeNull();
    expect(Object.keys(json.variants[1].vs_first)).toEqual(
      expect.arrayContaining(["diff", "ci95", "paired_p"]),
    );
    expect(readFileSync(r.htmlPath, "utf8")).toContain("<svg");

    // run again: every cell is read back, nothing trains
    const before = statSync(join(out, "cells", "team", "seed-0", "metrics.jsonl")).mtimeMs;
    let connects = 0;
    const again = await runCompare(spec, {
      specDir: dir,
      specName: "spec.yaml",
      outDir: out,
      connect: () => {
        connects++;
        return fake();
      },
    });
    expect(connects).toBe(0);
    expect(statSync(join(out, "cells", "team", "seed-0", "metrics.jsonl")).mtimeMs).toBe(before);
    expect(again.report.variants.map((v) => v.mean)).toEqual(r.report.variants.map((v) => v.mean));
  });

  it("--only runs those variants' cells; the report lists the others as still to run", async () => {
    const dir = mathSpecDir();
    const { spec } = loadCompareSpec(join(dir, "spec.yaml"));
    const r = await runCompare(spec, {
      specDir: dir,
      specName: "s",
      outDir: join(dir, "out"),
      connect: fake,
      only: ["parallel"],
    });
    expect(r.report.complete).toBe(false);
    expect(r.report.variants.map((v) => v.missing.length)).toEqual([2, 2, 0, 2]);
    await expect(
      runCompare(spec, {
        specDir: dir,
        specName: "s",
        outDir: join(dir, "out"),
        connect: fake,
        only: ["paralel"],
      }),
    ).rejects.toThrow(/--only: invalid option\n {2}no variant paralel in the spec/);
  });

  it("a finished cell of another config is refused, not reused", async () => {
    const dir = mathSpecDir();
    const { spec } = loadCompareSpec(join(dir, "spec.yaml"));
    const out = join(dir, "out");
    const one = { ...spec, variants: ["team" as const], seeds: [0] };
    await runCompare(one, { specDir: dir, specName: "s", outDir: out, connect: fake });
    const changed = { ...one, eval: { n: 4 } };
    await expect(
      runCompare(changed, { specDir: dir, specName: "s", outDir: out, connect: fake }),
    ).rejects.toThrow(/this cell was computed with another config/);
  });
});

describe("the paired comparison with the first variant, by hand", () => {
  const cell = (seed: number, correct: number[]): CellResult => ({
    variant: "v",
    seed,
    config_sha: "",
    accuracy: correct.reduce((a, b) => a + b, 0) / correct.length,
    ci95: [0, 1],
    n: correct.length,
    problems: correct.map((c, i) => ({ id: `p${i}`, correct: c === 1 })),
    sampled_tokens: 0,
    iterations: 0,
    wall_s: 0,
    train_s: 0,
    curve: [],
    untrained: false,
  });

  it("pools the per-problem pairs of the same seed; seeds_t is over per-seed accuracies", () => {
    const first = new Map([
      [1, cell(1, [1, 0, 0, 0, 1])],
      [2, cell(2, [0, 0, 1, 0, 0])],
    ]);
    const other = new Map([
      [1, cell(1, [1, 1, 1, 0, 0])],
      [2, cell(2, [1, 0, 0, 1, 1])],
    ]);
    const { vs } = versusFirst(first, other, [1, 2]);
    // pooled: improved = 2 + 3, worsened = 1 + 1 of 10 pairs; diff = 0.3; McNemar p = 2 (1 + 7 + 21) / 128
    expect(vs).toMatchObject({ improved: 5, worsened: 2, pairs: 10 });
    expect(vs!.paired_p).toBeCloseTo(58 / 128, 12);
    expect(vs!.diff).toBeCloseTo(0.3, 12);
    const pooled = pairedDifference(
      [1, 0, 0, 0, 1, 0, 0, 1, 0, 0].map(Boolean),
      [1, 1, 1, 0, 0, 1, 0, 0, 1, 1].map(Boolean),
    );
    expect(vs!.ci95).toEqual(pooled.ci95);
    // per seed: 0.4 -> 0.6 and 0.2 -> 0.6: d = 0.2, 0.4
    expect(vs!.seeds_t).toEqual({ ...pairedTTest([0.4, 0.2], [0.6, 0.6]), t: undefined, n: undefined });
    expect(vs!.seeds_t!.diff).toBeCloseTo(0.3, 12);
  });

  it("no paired test when the held-out problems differ", () => {
    const other = new Map([
      [
        1,
        {
          ...cell(1, [1, 0]),
          problems: [
            { id: "q0", correct: true },
            { id: "p1", correct: false },
          ],
        },
      ],
    ]);
    const r = versusFirst(new Map([[1, cell(1, [1, 0])]]), other, [1]);
    expect(r.vs).toBeNull();
    expect(r.note).toMatch(/held-out problems differ/);
  });
});
