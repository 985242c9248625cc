import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parse as parseYaml } from "yaml";
import { adapterOf } from "../src/config/derived.ts";
import { SCHEMA_FILE, schemaText } from "../src/config/json-schema.ts";
import { applySets, configToYaml, loadRunConfig, parseRunConfig, parseSetPath } from "../src/config/load.ts";
import { replicaArgs } from "../src/client/launcher.ts";
import { ConfigError } from "../src/errors.ts";

const minimal = () => ({
  name: "t",
  bases: { tiny: { source: "tiny:llama" } },
  agents: [
    { id: "a", role: "speaker", base: "tiny" },
    { id: "b", role: "listener", base: "tiny" },
  ],
  task: { kind: "secret" },
  critic: { base: "tiny" },
});

function issuesOf(value: unknown): string[] {
  try {
    parseRunConfig(value);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return (e as ConfigError).issues;
  }
  throw new Error("expected the config to be rejected");
}

describe("run config validation", () => {
  it("fills documented defaults", () => {
    const c = parseRunConfig(minimal());
    expect(c.seed).toBe(0);
    expect(c.graph).toEqual({ kind: "sequential" });
    expect(c.agents[0]!.adapter).toEqual({
      r: 8,
      alpha: 16,
      dropout: 0,
      targetModules: ["q_proj", "v_proj"],
      layers: null,
    });
    expect(c.agents[0]!.sampling.temperature).toBe(1);
    expect(c.algo).toMatchObject({
      estimator: "marft-a",
      gamma: 0.99,
      lambda: 0.95,
      rewardRouting: { kind: "last" },
    });
    expect(c.ppo.clipLow).toBe(0.2);
    expect(c.train.schedule).toBe("joint");
  });

  it("names the exact path and what was expected", () => {
    const v = minimal();
    (v.agents[1] as Record<string, unknown>)["adapter"] = { r: "eight" };
    expect(issuesOf(v)).toEqual(['agents[1].adapter.r: expected a positive integer, got "eight"']);
    (v.agents[1] as Record<string, unknown>)["adapter"] = { layers: [-1, 1.5] };
    expect(issuesOf(v)).toEqual(["agents[1].adapter.layers[1]: expected an integer, got 1.5"]);
    (v.agents[1] as Record<string, unknown>)["adapter"] = {};
    (v as Record<string, unknown>)["ppo"] = { recomputeLogprobs: "sometimes" };
    expect(issuesOf(v)[0]).toMatch(/^ppo\.recomputeLogprobs: /);
  });

  it("rejects unknown keys at any depth", () => {
    const v = minimal() as Record<string, unknown>;
    v["lerning_rate"] = 1;
    (v["agents"] as Array<Record<string, unknown>>)[0]!["sampling"] = { temprature: 0.5 };
    expect(issuesOf(v).sort()).toEqual([
      "agents[0].sampling.temprature: unknown key",
      "lerning_rate: unknown key",
    ]);
  });

  it("explains enums, discriminators, missing fields and wrong types", () => {
    const v = minimal() as Record<string, unknown>;
    v["algo"] = { estimator: "ppo" };
    v["graph"] = { kind: "ring" };
    v["task"] = { kind: "math" };
    v["seed"] = -1;
    (v["agents"] as Array<Record<string, unknown>>)[0]!["trainable"] = "yes";
    expect(issuesOf(v).sort()).toEqual([
      'agents[0].trainable: expected true or false, got "yes"',
      'algo.estimator: expected "marft-a" | "marft-t" | "critic-free", got "ppo"',
      'graph.kind: expected one of "sequential" | "parallel" | "edges" | "dynamic", got "ring"',
      "seed: expected a non-negative integer, got -1",
      "task.trainFile: required (expected a non-empty string)",
    ]);
  });

  it("checks that names refer to things that exist", () => {
    const v = minimal() as Record<string, unknown>;
    const agents = v["agents"] as Array<Record<string, unknown>>;
    agents[0]!["base"] = "big";
    agents[1]!["adapter"] = { shared: "c" };
    v["graph"] = { kind: "edges", edges: [["a", "z"]] };
    v["algo"] = { ...(v["algo"] as object), normalize: ["a", "q"] };
    expect(issuesOf(v)).toEqual([
      'agents[0].base: unknown base "big" (bases: tiny)',
      'agents[1].adapter.shared: unknown agent "c"',
      'graph.edges[0][1]: unknown agent "z"',
      'algo.normalize[1]: unknown agent "q"',
    ]);
  });

  it("checks that the choices fit together", () => {
    const v = minimal() as Record<string, unknown>;
    delete v["critic"];
    const agents = v["agents"] as Array<Record<string, unknown>>;
    agents[1]!["sampling"] = { temperature: 0 };
    agents.push({ id: "a", role: "x", base: "tiny" });
    expect(issuesOf(v)).toEqual([
      'agents[2].id: duplicate agent id "a" (also agents[0])',
      "agents[1].sampling.temperature: expected a temperature > 0 for a trainable agent (greedy actions have no policy gradient)",
      'critic: expected a critic section for estimator "marft-a" (or set algo.estimator: critic-free)',
    ]);
    const cf = minimal() as Record<string, unknown>;
    cf["algo"] = { estimator: "critic-free" };
    expect(issuesOf(cf)).toEqual([
      "train.samplesPerTask: expected at least 2 samples per task for group-relative (critic-free) baselines",
    ]);
  });

  it("shared adapters resolve to their owner", () => {
    const v = minimal();
    (v.agents[1] as Record<string, unknown>)["adapter"] = { shared: "a" };
    const c = parseRunConfig(v);
    expect(c.agents.map(adapterOf)).toEqual(["a", "a"]);
  });

  it("round-trips through the resolved YAML", () => {
    const c = parseRunConfig(minimal());
    expect(parseRunConfig(parseYaml(configToYaml(c)))).toEqual(c);
  });
});

describe("--set overrides", () => {
  it("parses paths with indices", () => {
    expect(parseSetPath("agents[1].sampling.temperature")).toEqual(["agents", 1, "sampling", "temperature"]);
    expect(parseSetPath("train.iterations")).toEqual(["train", "iterations"]);
    expect(() => parseSetPath("a..b[")).toThrow(/bad path/);
  });

  it("applies YAML scalars and flow collections, then validates", () => {
    const raw = applySets(minimal(), [
      "train.iterations=5",
      "agents[1].sampling.temperature=0.25",
      "graph={kind: parallel}",
      "agents[0].adapter.targetModules=[q_proj]",
      "name=other",
    ]);
    const c = parseRunConfig(raw);
    expect(c.train.iterations).toBe(5);
    expect(c.agents[1]!.sampling.temperature).toBe(0.25);
    expect(c.graph).toEqual({ kind: "parallel" });
    expect(c.agents[0]!.adapter).toMatchObject({ targetModules: ["q_proj"] });
    expect(c.name).toBe("other");
    // the original is untouched
    expect(minimal().name).toBe("t");
  });

  it("reports a bad override with the same path message", () => {
    expect(issuesOf(applySets(minimal(), ["agents[1].adapter.r=eight"]))).toEqual([
      'agents[1].adapter.r: expected a positive integer, got "eight"',
    ]);
    expect(() => applySets(minimal(), ["novalue"])).toThrow(ConfigError);
  });
});

describe("shipped configs and schema", () => {
  const dir = join(import.meta.dirname, "..", "configs");
  // compare-*.yaml are comparison specs, not run configs (tests/compare.test.ts checks them)
  const files = readdirSync(dir).filter((f) => f.endsWith(".yaml") && !f.startsWith("compare-"));

  it("ships the documented configs", () => {
    for (const f of [
      "math-duo.yaml",
      "math-trio.yaml",
      "code-duo.yaml",
      "parallel-team.yaml",
      "dynamic-team.yaml",
      "tiny-secret.yaml",
    ]) {
      expect(files).toContain(f);
    }
  });

  it.each(files)("%s validates", (f) => {
    const c = loadRunConfig(join(dir, f));
    expect(c.name).toBe(f.replace(/\.yaml$/, ""));
  });

  it("a missing file is a ConfigError naming it", () => {
    expect(() => loadRunConfig(join(dir, "nope.yaml"))).toThrow(
      /nope\.yaml: invalid run config\n {2}cannot read the file \(ENOENT\)/,
    );
  });

  it("schemas/run-config.json matches the zod schema (run: npx tsx src/config/json-schema.ts)", () => {
    expect(readFileSync(SCHEMA_FILE, "utf8")).toBe(schemaText());
  });
});

describe("engine replicas in the run config", () => {
  it("default to one engine, and reach the engine as its --replicas flags", () => {
    const one = parseRunConfig(minimal()).engine;
    expect(one.replicas).toBe(1);
    expect(replicaArgs({ count: one.replicas, rayAddress: one.ray.address })).toEqual([]);
    const c = parseRunConfig({
      ...minimal(),
      engine: { replicas: 4, ray: { address: "head:6379" }, replica: { gpus: 0.5, threads: 2 } },
    }).engine;
    const r = { count: c.replicas, rayAddress: c.ray.address, ...c.replica };
    expect(replicaArgs(r)).toEqual([
      ...["--replicas", "4", "--ray-address", "head:6379"],
      ...["--replica-cpus", "1", "--replica-gpus", "0.5", "--replica-threads", "2"],
    ]);
    // one replica on an existing cluster still goes through Ray
    expect(replicaArgs({ count: 1, rayAddress: "head:6379" })).toEqual([
      "--replicas",
      "1",
      "--ray-address",
      "head:6379",
    ]);
  });

  it("are refused with a remote engine (it has its own) and must be positive", () => {
    expect(issuesOf({ ...minimal(), engine: { url: "http://gpu:8000", replicas: 2 } })).toEqual([
      "engine.replicas: replicas are set where the CLI starts the engine; the engine at engine.url has its own",
    ]);
    expect(issuesOf({ ...minimal(), engine: { replicas: 0 } })[0]).toMatch(/^engine\.replicas: /);
  });
});
