// The trainer's view of a rollout: the team of a run config, on a list of tasks, n samples each.
import type { EngineClient } from "../client/client.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import type { Episode, Turn } from "../rollout/types.ts";
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
  stats: { tokensSampled: number; seconds: number };
}

/**
 * Drives all episodes in lock step: each tick, every agent that is ready in any episode joins one
 * `sample` call (mixed adapters), seeded from `seed` and the tick, so the same seed gives the same
 * episodes on CPU.
 */
export async function runRollout(r: RolloutRequest): Promise<RolloutOutcome> {
  const t0 = performance.now();
  const profiles = new Map(r.config.agents.map((a) => [a.id, profileOf(a)]));
  const specs = agentSpecs(r.config);
  const live: Array<{
    env: ReturnType<TaskSuite<unknown>["makeEnv"]>;
    ep: Episode;
    last: Map<string, Turn>;
  }> = [];
  let index = 0;
  for (const [g, task] of r.tasks.entries()) {
    for (let s = 0; s < r.samplesPerTask; s++) {
      const env = r.suite.makeEnv(specs, r.config.graph);
      const seed = (r.seed + index * 7919) >>> 0;
      await env.reset(task, seed);
      live.push({
        env,
        ep: {
          index,
          taskId: r.suite.taskId(task),
          group: g,
          seed,
          turns: [],
          terminated: false,
          truncated: false,
          info: {},
          transcript: [],
        },
        last: new Map(),
      });
      index++;
    }
  }
  let tokens = 0;
  let tick = 0;
  let done = 0;
  const total = live.length;
  for (;;) {
    const requests: Array<{ slot: (typeof live)[number]; agent: string }> = [];
    for (const slot of live) for (const agent of slot.env.ready()) requests.push({ slot, agent });
    if (requests.length === 0) break;
    const res = await r.client.sample({
      seed: (r.seed + tick * 104729) % 2147483647,
      requests: requests.map(({ slot, agent }) => {
        const p = profiles.get(agent)!;
        return {
          adapter: p.adapter,
          messages: slot.env.observe(agent),
          sampling: { ...p.sampling, ...(r.greedy ? { temperature: 0 } : {}) },
        };
      }),
    });
    tick++;
    tokens += res.tokens_sampled;
    for (const [i, { slot, agent }] of requests.entries()) {
      const out = res.results[i]!;
      const c = out.completions[0]!;
      const p = profiles.get(agent)!;
      const turn: Turn = {
        order: slot.ep.turns.length,
        step: slot.env.step(),
        agent,
        parents: slot.env.parents(agent),
        adapter: out.adapter,
        adapterVersion: out.adapter_version,
        temperature: r.greedy ? 1 : p.sampling.temperature,
        promptIds: out.prompt_ids,
        responseIds: c.response_ids,
        logprobs: c.logprobs,
        text: c.text,
        finishReason: c.finish_reason,
        reward: 0,
      };
      slot.ep.turns.push(turn);
      slot.last.set(agent, turn);
      await slot.env.act(agent, c.text);
    }
    for (const slot of live) {
      for (const [agent, rew] of Object.entries(slot.env.takeRewards())) {
        const t = slot.last.get(agent);
        if (t) t.reward += rew;
      }
    }
    const finished = live.filter((s) => s.env.ready().length === 0).length;
    if (finished !== done) {
      done = finished;
      r.onProgress?.(done, total);
    }
  }
  for (const slot of live) {
    slot.ep.terminated = slot.env.terminated;
    slot.ep.truncated = slot.env.truncated;
    slot.ep.info = slot.env.info();
    slot.ep.transcript = slot.env.state();
  }
  return {
    episodes: live.map((s) => s.ep),
    stats: { tokensSampled: tokens, seconds: (performance.now() - t0) / 1000 },
  };
}
