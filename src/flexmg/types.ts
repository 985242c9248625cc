// Flex-MG in code: the environment interface every task implements (DESIGN §3).
// Nothing here knows tensors or HTTP.

export type AgentId = string;

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

/** What a task needs to know of an agent. The full profile (model, adapter, sampling) lives in the config. */
export interface AgentSpec {
  id: AgentId;
  role: string;
  systemPrompt: string;
  /** How other agents' observations and transcripts name it (default: the role, which tasks key on). */
  label?: string;
}

/**
 * The dependency function D_t as a graph over the agents acting in a step.
 * - sequential: agent i sees agents 1..i-1 of the same step (the MARFT reference).
 * - parallel: nobody sees anybody within a step; all act concurrently.
 * - edges: explicit [from, to] pairs ("to sees from"); must be acyclic.
 * - dynamic: the environment decides at run time who acts next and whom they see.
 */
export type GraphSpec =
  | { kind: "sequential" }
  | { kind: "parallel" }
  | { kind: "edges"; edges: Array<[AgentId, AgentId]> }
  | { kind: "dynamic" };

/** Per-agent rewards for actions, emitted by the environment since the last `takeRewards()` call. */
export type Rewards = Record<AgentId, number>;

/** How an episode ended for the team: what evaluation and reward routing read. */
export interface Outcome {
  /** The team solved the task (evaluation's pass@1). */
  correct: boolean;
  /** How well it did, in [0, 1] (evaluation's mean score). */
  score: number;
  /** What the team earned; the run config routes it to the agents' actions (`algo.rewardRouting`). */
  teamReward: number;
  /** Per-role rewards the task documents (role -> reward), for per-role routing; {} when none. */
  roleRewards: Record<string, number>;
}

/**
 * An AEC-style text environment adapted to concurrency (PettingZoo semantics).
 *
 * Contract (checked by `checkEnv`):
 * - `reset` starts an episode on a task; the same task and seed give the same episode.
 * - `ready()` lists the agents whose dependencies are satisfied now. Several at once may act
 *   concurrently; an agent listed must be acted for exactly once before it is listed again.
 *   `ready()` is empty exactly when the episode is over (terminated or truncated) or when the
 *   environment is waiting for pending `act` promises.
 * - `observe(agent)` is only valid for a ready agent: its system prompt, the shared history and the
 *   actions of its parents in the current step.
 * - `act(agent, text)` records the action; it may do slow work (answer checking, running code), so it
 *   is async.
 * - `terminated` (the task ended: no bootstrap) and `truncated` (cut off by a limit: bootstrap) are
 *   kept apart. Once either is true, `outcome()` is valid (before, it throws).
 *
 * Rewards, the one policy (the trainer reads nothing else):
 * - The team's reward for the episode is `outcome().teamReward` (and `outcome().roleRewards` for
 *   per-role routing). The run config decides which actions it is credited to (src/algo/rewards.ts).
 * - `takeRewards()` carries per-action rewards only: shaping or penalties the task gives one agent
 *   for one action (a format penalty, a tool-call cost). Rewards given to an agent accumulate until
 *   its next action; the rollout adds them to the agent's latest turn, and the trainer adds the
 *   routed outcome rewards on top. So an env never emits the team reward through `takeRewards()`:
 *   it would be counted twice.
 * - `info()` is diagnostics for logs and transcripts (the extracted answer, tests passed, ...).
 */
export interface Env<Task = unknown> {
  /** All agents of the team, in profile order. */
  readonly agents: readonly AgentId[];
  reset(task: Task, seed: number): Promise<void>;
  ready(): AgentId[];
  observe(agent: AgentId): ChatMessage[];
  /** The agents whose actions this agent's current observation contains (its parents in D_t). */
  parents(agent: AgentId): AgentId[];
  /** Index of the current step (attempt / round), starting at 0. */
  step(): number;
  act(agent: AgentId, text: string): Promise<void>;
  takeRewards(): Rewards;
  readonly terminated: boolean;
  readonly truncated: boolean;
  /** The episode's outcome; valid once it is terminated or truncated. */
  outcome(): Outcome;
  /** The full transcript, for logging and for a critic that reads the global state. */
  state(): ChatMessage[];
  /** Task-specific diagnostics of the episode so far, e.g. { answer: "42", attempts: 2 }. */
  info(): Record<string, unknown>;
}

/** A task family as the trainer sees it: problems to train and evaluate on, and an Env factory for a team. */
export interface TaskSuite<Task = unknown> {
  name: string;
  train: Task[];
  /** Held-out problems, never trained on. */
  eval: Task[];
  taskId(task: Task): string;
  makeEnv(agents: AgentSpec[], graph: GraphSpec): Env<Task>;
}
