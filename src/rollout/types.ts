// What the rollout records: one Turn per action, in the order the actions were taken.
// Training uses these token ids as they were sampled; text is never re-tokenized.
import type { AgentId, Outcome } from "../flexmg/types.ts";

export interface Turn {
  /** Position of the action in its episode's action order (ties broken in topological order). */
  order: number;
  /** env.step() when the action was taken (attempt / round index). */
  step: number;
  agent: AgentId;
  /** Agents whose actions were in this agent's observation (its parents in D_t). */
  parents: AgentId[];
  adapter: string;
  adapterVersion: number;
  /** Sampling temperature: training recomputes log-probs at the same temperature. */
  temperature: number;
  promptIds: number[];
  responseIds: number[];
  /** Per response token, under the tempered policy that sampled it. */
  logprobs: number[];
  text: string;
  finishReason: "stop" | "eos" | "length";
  /** The env's per-action rewards credited to this action (they accumulate until the agent's next action). */
  reward: number;
}

export interface Episode {
  /** Index of the episode within its rollout batch. */
  index: number;
  taskId: string;
  /** Episodes that share a group sampled the same task (for group-relative baselines). */
  group: number;
  seed: number;
  turns: Turn[];
  terminated: boolean;
  truncated: boolean;
  /** How the episode ended for the team: what reward routing and evaluation read. */
  outcome: Outcome;
  /** The env's diagnostics at the end. */
  info: Record<string, unknown>;
  transcript: Array<{ role: string; content: string }>;
}
