// The trainer's view of a rollout: the team of a run config plays a list of tasks, n samples each,
// driven by src/rollout. Deterministic (lock-step) mode is used when the run needs bit-exact resume
// on CPU; otherwise the rollout overlaps calls freely.
import type { ComputeEngine } from "../client/compute.ts";
import { adapterOf, agentSpecs } from "../config/derived.ts";
import type { RunConfig } from "../config/schema.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import { type AgentProfile, type RolloutResult, rollout } from "../rollout/index.ts";

export interface PlayRequest {
  engine: ComputeEngine;
  suite: TaskSuite<unknown>;
  config: RunConfig;
  tasks: unknown[];
  samplesPerTask: number;
  seed: number;
  /** Greedy decoding for every agent (evaluation). */
  greedy?: boolean;
  onProgress?: (done: number, total: number) => void;
}

/** How the rollout samples for each agent of the config: its adapter and its sampling settings. */
export function agentProfiles(c: RunConfig, greedy = false): Record<string, AgentProfile> {
  const profiles: Record<string, AgentProfile> = {};
  for (const a of c.agents) {
    profiles[a.id] = {
      adapter: adapterOf(a),
      base: a.base,
      sampling: {
        temperature: greedy ? 0 : a.sampling.temperature,
        top_p: a.sampling.topP,
        top_k: a.sampling.topK,
        max_new_tokens: a.sampling.maxNewTokens,
        stop: a.sampling.stop,
      },
    };
  }
  return profiles;
}

export function playEpisodes(r: PlayRequest): Promise<RolloutResult> {
  const specs = agentSpecs(r.config);
  return rollout({
    engine: r.engine,
    makeEnv: () => r.suite.makeEnv(specs, r.config.graph),
    tasks: r.tasks,
    taskId: (t) => r.suite.taskId(t),
    samplesPerTask: r.samplesPerTask,
    profiles: agentProfiles(r.config, r.greedy),
    seed: r.seed,
    maxConcurrentEpisodes: r.config.train.maxConcurrentEpisodes,
    deterministic: r.config.train.deterministic,
    onProgress: (p) => r.onProgress?.(p.episodesDone, p.episodes),
  });
}
