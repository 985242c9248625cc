// Facts the trainer derives from a validated run config.
import type { AgentSpec } from "../flexmg/types.ts";
import type { AgentConfig, RunConfig } from "./schema.ts";

/** The adapter an agent samples with and trains: its own id, or the owner of a shared adapter. */
export function adapterOf(agent: AgentConfig): string {
  return "shared" in agent.adapter ? agent.adapter.shared : agent.id;
}

/** Whether the run has a centralized critic (MARFT-A, MARFT-T) or not (critic-free). */
export function usesCritic(c: RunConfig): boolean {
  return c.algo.estimator !== "critic-free";
}

/** Adapter owners (agents with their own adapter), in profile order. */
export function adapterOwners(c: RunConfig): AgentConfig[] {
  return c.agents.filter((a) => !("shared" in a.adapter));
}

/** What a task needs to know of the team. */
export function agentSpecs(c: RunConfig): AgentSpec[] {
  return c.agents.map((a) => ({
    id: a.id,
    role: a.role,
    systemPrompt: a.systemPrompt,
    ...(a.label !== undefined ? { label: a.label } : {}),
  }));
}
