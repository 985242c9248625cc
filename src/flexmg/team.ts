// TeamEpisode: the bookkeeping every task environment shares (math, code, synthetic).
//
// It knows, for the current step, which agents are ready (their parents in D_t have acted and they
// have not), builds each agent's observation, records actions and the shared history, and moves to
// the next step. It knows nothing of answers or rewards: the task env owns those and calls
// `record`, `addHistory` and `nextStep`, and ends the episode through TeamEnv's `end(outcome)`.
//
// Observation of agent i (DESIGN §3):
//   system: agent i's system prompt
//   user:   the task text (shared, or this agent's own)
//           + the shared history of earlier steps (e.g. earlier attempts, judge feedback)
//           + the actions of i's parents in this step, each labelled "<parent's label>: <action>" (the
//             label is the role unless the profile names another, e.g. to hide roles in an ablation)
//
// Concurrency: several agents of one step may be acting at once. `record` is synchronous and must be
// called at the start of the env's async `act`, before any await, so that two concurrent acts never
// see a half-updated step. A typical env:
//
//   async act(agent, text) {
//     this.team.record(agent, text);             // throws if the agent is not ready
//     if (!this.team.stepComplete()) return;     // siblings still acting: nothing else to do
//     const ok = await check(...);               // slow work: ready() is empty meanwhile
//     this.team.addHistory(`The answer is ${ok ? "correct" : "incorrect"}.`);
//     if (ok || this.team.step + 1 >= attempts) this.end({ correct: ok, score: ..., teamReward: ..., roleRewards: {} });
//     else this.team.nextStep();
//   }
//
// Dynamic graphs: no agent is scheduled at the start of a step; the env calls `schedule(agent, sees)`
// (e.g. the orchestrator first, then whoever the orchestrator's output names, seeing it). A step is
// complete when every scheduled agent has acted, so schedule the next agent inside `act` before
// testing `stepComplete()`.
import { buildGraph, type DependencyGraph } from "./graph.ts";
import { EnvContractError } from "../errors.ts";
import type { AgentId, AgentSpec, ChatMessage, Env, GraphSpec, Outcome, Rewards } from "./types.ts";

export interface Action {
  agent: AgentId;
  role: string;
  /** What the other agents see it called (the role unless the profile sets a label). */
  label: string;
  text: string;
  step: number;
}

export class TeamEpisode {
  readonly agents: readonly AgentId[];
  readonly graph: DependencyGraph;
  private readonly specs: Map<AgentId, AgentSpec>;
  private task: string | Record<AgentId, string> = "";
  private stepIndex = 0;
  private isOver = false;
  private history: string[] = [];
  private log: ChatMessage[] = [];
  /** Agents scheduled in the current step, with the agents each one sees. */
  private scheduled = new Map<AgentId, AgentId[]>();
  /** Actions of the current step, in the order taken. */
  private acted = new Map<AgentId, string>();
  private all: Action[] = [];

  constructor(agents: AgentSpec[], graph: GraphSpec) {
    this.graph = buildGraph(
      agents.map((a) => a.id),
      graph,
    );
    this.agents = this.graph.agents;
    this.specs = new Map(agents.map((a) => [a.id, a]));
  }

  /**
   * Starts an episode at step 0. `task` is the text every agent sees, or one text per agent (e.g.
   * only the speaker sees the secret); a per-agent map must name every agent.
   */
  reset(task: string | Record<AgentId, string>): void {
    if (typeof task !== "string") {
      for (const a of this.agents) {
        if (typeof task[a] !== "string") throw new Error(`task: no text for agent "${a}"`);
      }
    }
    this.task = task;
    this.stepIndex = 0;
    this.isOver = false;
    this.history = [];
    this.all = [];
    this.log =
      typeof task === "string"
        ? [{ role: "user", content: task }]
        : this.agents.map((a) => ({ role: "user", content: `${this.label(a)} sees: ${task[a]}` }));
    this.startStep();
  }

  get step(): number {
    return this.stepIndex;
  }

  get over(): boolean {
    return this.isOver;
  }

  role(agent: AgentId): string {
    const spec = this.specs.get(agent);
    if (!spec) throw new Error(`unknown agent "${agent}"`);
    return spec.role;
  }

  /** The name observations and transcripts show for the agent: its label, or else its role. */
  label(agent: AgentId): string {
    const spec = this.specs.get(agent);
    if (!spec) throw new Error(`unknown agent "${agent}"`);
    return spec.label ?? spec.role;
  }

  /** Agents that may act now, in topological (then profile) order. Empty once the episode is over. */
  ready(): AgentId[] {
    if (this.isOver) return [];
    return this.graph.order.filter((a) => this.isReady(a));
  }

  isReady(agent: AgentId): boolean {
    if (this.isOver || this.acted.has(agent)) return false;
    const sees = this.scheduled.get(agent);
    return sees?.every((p) => this.acted.has(p)) ?? false;
  }

  /** The agents whose actions `agent` sees in the current step, in profile order. */
  parents(agent: AgentId): AgentId[] {
    this.role(agent);
    return [...(this.scheduled.get(agent) ?? [])];
  }

  /**
   * `filled`: the agent's task text with its parents' results already written into it (a task whose
   * text is a template, e.g. math's `splitParts`); the parents' actions are then not appended again.
   */
  observe(agent: AgentId, filled?: string): ChatMessage[] {
    this.mustBeReady(agent, "observe");
    const spec = this.specs.get(agent)!;
    const parts = [filled ?? (typeof this.task === "string" ? this.task : this.task[agent]!)];
    if (this.history.length > 0) parts.push(this.history.join("\n"));
    const seen = this.parents(agent).map((p) => `${this.label(p)}: ${this.acted.get(p)}`);
    if (seen.length > 0 && filled === undefined) parts.push(seen.join("\n"));
    return [
      { role: "system", content: spec.systemPrompt },
      { role: "user", content: parts.join("\n\n") },
    ];
  }

  /** Records a ready agent's action. Synchronous: call it before any await in the env's `act`. */
  record(agent: AgentId, text: string): void {
    this.mustBeReady(agent, "act");
    this.acted.set(agent, text);
    this.all.push({ agent, role: this.role(agent), label: this.label(agent), text, step: this.stepIndex });
    this.log.push({ role: "assistant", content: `${this.label(agent)}: ${text}` });
  }

  /** The current step's actions, in the order they were taken. */
  stepActions(): Action[] {
    return this.all.filter((a) => a.step === this.stepIndex);
  }

  /** Every action of the episode, in the order taken. */
  actions(): Action[] {
    return [...this.all];
  }

  /** The current step's action of `agent`, if it has acted. */
  actionOf(agent: AgentId): string | undefined {
    return this.acted.get(agent);
  }

  /** True when every agent scheduled in this step has acted (and at least one was scheduled). */
  stepComplete(): boolean {
    if (this.scheduled.size === 0) return false;
    for (const a of this.scheduled.keys()) if (!this.acted.has(a)) return false;
    return true;
  }

  /**
   * Dynamic graphs only: lets `agent` act in this step, seeing the actions of `sees` (agents already
   * scheduled in this step; it becomes ready once they have acted). An agent acts at most once a step.
   */
  schedule(agent: AgentId, sees: AgentId[] = []): void {
    if (this.graph.kind !== "dynamic") {
      throw new Error(`schedule: the graph is "${this.graph.kind}"; only dynamic graphs schedule agents`);
    }
    if (this.isOver) throw new Error("schedule: the episode is over");
    this.role(agent);
    if (this.scheduled.has(agent)) {
      throw new Error(`schedule: agent "${agent}" is already scheduled in step ${this.stepIndex}`);
    }
    for (const p of sees) {
      if (!this.scheduled.has(p)) {
        throw new Error(`schedule: agent "${agent}" cannot see "${p}", which is not scheduled in this step`);
      }
    }
    const rank = new Map(this.agents.map((a, i) => [a, i]));
    this.scheduled.set(
      agent,
      [...new Set(sees)].sort((a, b) => rank.get(a)! - rank.get(b)!),
    );
  }

  /** Appends a line to the shared history every agent sees from now on (e.g. judge feedback). */
  addHistory(line: string): void {
    this.history.push(line);
    this.log.push({ role: "user", content: line });
  }

  /** Moves to the next step; the current one must be complete. */
  nextStep(): void {
    if (this.isOver) throw new Error("nextStep: the episode is over");
    if (!this.stepComplete()) {
      const waiting = [...this.scheduled.keys()].filter((a) => !this.acted.has(a));
      throw new Error(`nextStep: step ${this.stepIndex} is not complete (waiting for ${waiting.join(", ")})`);
    }
    this.stepIndex++;
    this.startStep();
  }

  /** Ends the episode: nobody is ready any more. */
  finish(): void {
    this.isOver = true;
  }

  /** The full transcript: task, actions labelled by label (role), history lines, in the order they happened. */
  transcript(): ChatMessage[] {
    return this.log.map((m) => ({ ...m }));
  }

  private startStep(): void {
    this.acted = new Map();
    this.scheduled = new Map();
    if (this.graph.kind === "dynamic") return;
    for (const a of this.agents) this.scheduled.set(a, this.graph.parents(a));
  }

  private mustBeReady(agent: AgentId, what: string): void {
    this.role(agent);
    if (this.isOver) throw new Error(`${what}: agent "${agent}" is not ready: the episode is over`);
    if (this.acted.has(agent)) {
      throw new Error(`${what}: agent "${agent}" is not ready: it already acted in step ${this.stepIndex}`);
    }
    if (!this.isReady(agent)) {
      const sees = this.scheduled.get(agent);
      const why =
        sees === undefined
          ? "it is not scheduled in this step"
          : `waiting for ${sees.filter((p) => !this.acted.has(p)).join(", ")}`;
      throw new Error(`${what}: agent "${agent}" is not ready: ${why}`);
    }
  }
}

/**
 * The Env methods every shipped task shares: what its TeamEpisode answers (who is ready, what they
 * see, their parents, the step, the transcript) and the ending (terminated or truncated, the
 * outcome, per-action rewards). A task writes what is its own: reset (calling `begin`), act (calling
 * `end` when the episode is over), and its diagnostics.
 */
export abstract class TeamEnv<Task> implements Env<Task> {
  readonly agents: readonly AgentId[];
  protected readonly team: TeamEpisode;
  private ended: { outcome: Outcome; truncated: boolean } | null = null;
  private pending: Rewards = {};

  constructor(agents: AgentSpec[], graph: GraphSpec) {
    this.team = new TeamEpisode(agents, graph);
    this.agents = this.team.agents;
  }

  abstract reset(task: Task, seed: number): Promise<void>;
  abstract act(agent: AgentId, text: string): Promise<void>;

  ready(): AgentId[] {
    return this.team.ready();
  }

  observe(agent: AgentId): ChatMessage[] {
    return this.team.observe(agent);
  }

  parents(agent: AgentId): AgentId[] {
    return this.team.parents(agent);
  }

  step(): number {
    return this.team.step;
  }

  state(): ChatMessage[] {
    return this.team.transcript();
  }

  get terminated(): boolean {
    return this.ended !== null && !this.ended.truncated;
  }

  get truncated(): boolean {
    return this.ended?.truncated ?? false;
  }

  outcome(): Outcome {
    if (this.ended === null) {
      throw new EnvContractError("outcome(): the episode is not over (neither terminated nor truncated)");
    }
    const o = this.ended.outcome;
    return { ...o, roleRewards: { ...o.roleRewards } };
  }

  takeRewards(): Rewards {
    const r = this.pending;
    this.pending = {};
    return r;
  }

  /** Diagnostics; a task overrides it with what a person debugging its rewards wants to see. */
  info(): Record<string, unknown> {
    return {};
  }

  /** Starts an episode: clears the ending and pending rewards, and resets the TeamEpisode on `task`. */
  protected begin(task: string | Record<AgentId, string>): void {
    this.ended = null;
    this.pending = {};
    this.team.reset(task);
  }

  /** A per-action reward for `agent`'s latest action (shaping, penalties; never the team reward). */
  protected reward(agent: AgentId, r: number): void {
    this.pending[agent] = (this.pending[agent] ?? 0) + r;
  }

  /**
   * Ends the episode with its outcome: `terminated` when the task is over by its rules, `truncated`
   * when a limit cut it off (the trainer then bootstraps from the critic).
   */
  protected end(outcome: Outcome, how: "terminated" | "truncated" = "terminated"): void {
    this.ended = { outcome, truncated: how === "truncated" };
    this.team.finish();
  }
}
