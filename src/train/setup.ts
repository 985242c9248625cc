// Put a run config's team on an engine: bases, one policy adapter per adapter owner, the critic.
// Used at the start of a run, on resume (a fresh engine gets the same adapters, then the checkpoint
// is loaded into them), after an engine restart, and by `marft eval`.
import type { EngineClient, Schemas } from "../client/client.ts";
import type { AgentSpec } from "../flexmg/types.ts";
import { type AgentConfig, adapterOf, CRITIC_ADAPTER, type RunConfig } from "./config.ts";

/** What the rollout needs to sample for an agent. */
export interface AgentProfile {
  id: string;
  role: string;
  adapter: string;
  base: string;
  trainable: boolean;
  sampling: {
    temperature: number;
    top_p: number;
    top_k: number;
    max_new_tokens: number;
    stop: string[];
  };
}

export function agentSpecs(c: RunConfig): AgentSpec[] {
  return c.agents.map((a) => ({ id: a.id, role: a.role, systemPrompt: a.systemPrompt }));
}

export function profileOf(a: AgentConfig): AgentProfile {
  return {
    id: a.id,
    role: a.role,
    adapter: adapterOf(a),
    base: a.base,
    trainable: a.trainable,
    sampling: {
      temperature: a.sampling.temperature,
      top_p: a.sampling.topP,
      top_k: a.sampling.topK,
      max_new_tokens: a.sampling.maxNewTokens,
      stop: a.sampling.stop,
    },
  };
}

export function usesCritic(c: RunConfig): boolean {
  return c.algo.estimator !== "critic-free";
}

/** Adapter owners (agents with their own adapter), in profile order. */
export function adapterOwners(c: RunConfig): AgentConfig[] {
  return c.agents.filter((a) => !("shared" in a.adapter));
}

/** Bases, policy adapters and the critic, created deterministically from the config's seeds. */
export async function setupEngine(
  client: EngineClient,
  c: RunConfig,
): Promise<Record<string, Schemas["BaseInfo"]>> {
  const bases: Record<string, Schemas["BaseInfo"]> = {};
  const existing = new Set((await client.listBases()).bases.map((b) => b.name));
  for (const [name, b] of Object.entries(c.bases)) {
    if (existing.has(name)) continue;
    bases[name] = await client.createBase({ name, source: b.source, dtype: b.dtype, seed: b.seed });
  }
  for (const b of (await client.listBases()).bases) bases[b.name] ??= b;
  const adapters = new Set((await client.listAdapters()).adapters.map((a) => a.name));
  for (const [i, a] of adapterOwners(c).entries()) {
    if (adapters.has(a.id) || "shared" in a.adapter) continue;
    await client.createAdapter({
      name: a.id,
      base: a.base,
      kind: "policy",
      lora: {
        r: a.adapter.r,
        alpha: a.adapter.alpha,
        dropout: a.adapter.dropout,
        target_modules: a.adapter.targetModules,
        layers: a.adapter.layers,
      },
      optimizer: { lr: a.lr },
      seed: c.seed * 1000 + i,
    });
  }
  if (usesCritic(c) && c.critic && !adapters.has(CRITIC_ADAPTER)) {
    await client.createAdapter({
      name: CRITIC_ADAPTER,
      base: c.critic.base,
      kind: "critic",
      lora: {
        r: c.critic.r,
        alpha: c.critic.alpha,
        dropout: 0,
        target_modules: c.critic.targetModules,
        layers: c.critic.layers,
      },
      optimizer: { lr: c.critic.lr },
      value_head_hidden: c.critic.headHidden,
      seed: c.seed * 1000 + 999,
    });
  }
  return bases;
}

/** Current version of every adapter on the engine. */
export async function adapterVersions(client: EngineClient): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const a of (await client.listAdapters()).adapters) out[a.name] = a.version;
  return out;
}
