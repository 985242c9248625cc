// Put a run config's team on an engine: bases, one policy adapter per adapter owner, the critic.
// Used at the start of a run, on resume (a fresh engine gets the same adapters, then the checkpoint
// is loaded into them), after an engine restart, and by `marft eval`.
import type { ComputeEngine } from "../client/compute.ts";
import { adapterOwners, usesCritic } from "../config/derived.ts";
import { CRITIC_ADAPTER, type RunConfig } from "../config/schema.ts";

/** Bases, policy adapters and the critic, created deterministically from the config's seeds. */
export async function setupEngine(client: ComputeEngine, c: RunConfig): Promise<void> {
  const existing = new Set((await client.listBases()).bases.map((b) => b.name));
  for (const [name, b] of Object.entries(c.bases)) {
    if (existing.has(name)) continue;
    await client.createBase({
      name,
      source: b.source,
      dtype: b.dtype,
      seed: b.seed,
      ...(b.prefixCacheMb > 0 ? { prefix_cache_mb: b.prefixCacheMb } : {}),
    });
  }
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
}
