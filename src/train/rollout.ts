// The trainer's view of a rollout: the team of a run config on a list of tasks, n samples each,
// driven by src/rollout. Deterministic (lock-step) mode is used when the run needs bit-exact resume
// on CPU; otherwise the rollout overlaps calls freely.
import type { EngineClient } from "../client/client.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import { type AgentProfile, type Episode, rollout } from "../rollout/index.ts";
import type { RunConfig } from "./config.ts";
import { agentSpecs, profileOf } from "./setup.ts";

export interface RolloutRequest {
  client: EngineClient;
  suite: TaskSuite<unknown>;
  config: RunConfig;
  tasks: unknown[];
  samplesPerTask: number;
  seed: number;
  /** Greedy decoding for every agent (evaluation). */
  greedy?: boolean;
  onProgress?: (done: number, total: number) => void;
}

export interface RolloutOutcome {
  episodes: Episode[];
  stats: { tokensSampled: number; seconds: number; engineCalls: number; meanDecodeBatch: number };
}

export async function runRollout(r: RolloutRequest): Promise<RolloutOutcome> {
  const specs = agentSpecs(r.config);
  const profiles: Record<string, AgentProfile> = {};
  for (const a of r.config.agents) {
    const p = profileOf(a);
    profiles[a.id] = {
      adapter: p.adapter,
      base: p.base,
      sampling: { ...p.sampling, ...(r.greedy ? { temperature: 0 } : {}) },
    };
  }
  const res = await rollout({
    client: r.client,
    makeEnv: () => r.suite.makeEnv(specs, r.config.graph),
    tasks: r.tasks,
    taskId: (t) => r.suite.taskId(t),
    samplesPerTask: r.samplesPerTask,
    profiles,
    seed: r.seed,
    maxConcurrentEpisodes: r.config.train.maxConcurrentEpisodes,
    deterministic: r.config.train.deterministic,
    onProgress: (p) => r.onProgress?.(p.episodesDone, p.episodes),
  });
  return {
    episodes: res.episodes,
    stats: {
      tokensSampled: res.stats.tokensSampled,
      seconds: res.stats.seconds,
      engineCalls: res.stats.engineCalls,
      meanDecodeBatch: res.stats.meanDecodeBatch,
    },
  };
}
