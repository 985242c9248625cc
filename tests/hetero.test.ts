// A heterogeneous team on two real bases (configs/hetero-team.yaml): SmolLM2 agents beside a Gemma 3
// agent, the critic on SmolLM2, the policies' minibatches in shared passes per base
// (train.batchAdapters) and the prefix cache on. Two short iterations must train every agent: each
// adapter's version moves, the metrics are finite, the engine reused cached prompt prefixes.
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { startLocalEngine } from "../src/client/launcher.ts";
import { loadRunConfig } from "../src/config/load.ts";
import { datasetsDir } from "../src/envs/datasets.ts";
import { runSuite } from "../src/train/suite.ts";
import { RunDir } from "../src/train/rundir.ts";
import { train } from "../src/train/run.ts";
import { TEST_ENGINE_ENV } from "./helpers/engine.ts";

const CONFIGS = join(import.meta.dirname, "..", "configs");

describe("a team on two real bases", () => {
  it("SmolLM2 + Gemma 3 agents with a SmolLM2 critic train for two iterations", async () => {
    const config = loadRunConfig(join(CONFIGS, "hetero-team.yaml"), [
      `task.trainFile=${join(datasetsDir(), "gsm8k/train.jsonl")}`,
      "train.iterations=2",
      "train.tasksPerIter=4",
      "eval.n=2",
      "ppo.minibatches=1",
      "agents[0].sampling.maxNewTokens=8",
      "agents[1].sampling.maxNewTokens=8",
      "agents[2].sampling.maxNewTokens=6",
    ]);
    const dir = join(mkdtempSync(join(tmpdir(), "marft-hetero-")), config.name);
    let stats: { hits?: number } | undefined;
    await train({
      config,
      configDir: CONFIGS,
      runDir: dir,
      suite: runSuite(config, CONFIGS),
      connect: async () => {
        const engine = await startLocalEngine({
          device: "cpu",
          logFile: join(dir, "engine.log"),
          env: TEST_ENGINE_ENV,
        });
        const stop = engine.stop.bind(engine);
        engine.stop = async () => {
          stats = (await engine.client.stats()).prefix_cache;
          await stop();
        };
        return engine;
      },
    });
    const rows = new RunDir(dir).readMetrics();
    expect(rows).toHaveLength(2);
    for (const row of rows) {
      for (const a of ["reasoner", "checker", "actor"]) expect(row).toHaveProperty([`loss/policy/${a}`]);
      expect(row).toHaveProperty(["loss/value"]);
      for (const [k, v] of Object.entries(row)) expect(Number.isFinite(v), `${k} = ${v}`).toBe(true);
    }
    expect(stats?.hits ?? 0).toBeGreaterThan(0); // each agent's system prompt, shared by every episode
  }, 900_000);
});
