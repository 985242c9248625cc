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
        draft_tokens: a.sampling.draftTokens,
      },
    };
  }
  return profiles;
}

/**
 * Where a run's episodes come from: its tasks, and a way to play some of them with the engine's
 * current adapters. An env suite (`envSource`) drives an `Env` per episode through the rollout; an
 * app source (src/app) runs an unmodified agent app against the gateway and reads back the turns it
 * recorded. Either way the trainer gets the same `Episode` records, and everything after the rollout
 * (steps, credit, updates, evaluation) is the same code.
 */
export interface EpisodeSource {
  readonly name: string;
  readonly train: unknown[];
  /** Held-out tasks, never trained on. */
  readonly eval: unknown[];
  /** Plays `tasks`, `samplesPerTask` episodes each, in task-major order (index = task * n + sample). */
  play(r: Omit<PlayRequest, "suite">): Promise<RolloutResult>;
}

/** A task suite's episodes: one `Env` per episode, driven by the rollout. */
export function envSource(suite: TaskSuite<unknown>): EpisodeSource {
  return {
    name: suite.name,
    train: suite.train,
    eval: suite.eval,
    play: (r) => playEpisodes({ ...r, suite }),
  };
}

/** The trainer takes a suite (the common case) or any other source of episodes. */
export function asSource(s: TaskSuite<unknown> | EpisodeSource): EpisodeSource {
  return "play" in s ? s : envSource(s);
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
