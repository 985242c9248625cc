// `orchestrated`: a dynamic team. The orchestrator (first agent) is told which worker is the expert;
// its output names the worker that acts next; that worker sees the orchestrator's output and answers.
// Only the expert worker sees the secret letter, so the team is right when the orchestrator routes to
// the expert (and the expert states the secret) or, by luck, a non-expert guesses it. Use
// `{ kind: "dynamic" }`.
//
// Routing: the output names a worker when it contains the worker's id or role (the earliest mention
// wins); otherwise, in "class" mode, its first character picks worker (char code mod workers), and in
// "exact" mode a digit 1..n picks worker n; an output that names nobody ends the episode with 0.
// Team reward: 1 when the chosen worker's first character states the secret (common.ts matching).
// Per-role rewards (outcome().roleRewards): the orchestrator's role gets 1 when it routed to the expert.
import { z } from "zod";
import type { AgentId, AgentSpec, GraphSpec, TaskSuite } from "../../flexmg/types.ts";
import { parseOptions, posInt } from "../../fields.ts";
import {
  classOf,
  generateTasks,
  lettersField,
  type MatchMode,
  matches,
  pick,
  SyntheticEnv,
  syntheticOptionFields,
} from "./common.ts";

export interface OrchestratedTask {
  id: string;
  /** Index of the expert among the workers (0-based). */
  expert: number;
  secret: string;
}

export const OrchestratedOptionsSchema = z.strictObject({
  letters: lettersField().optional(),
  ...syntheticOptionFields,
  workers: posInt().optional().describe("number of workers (default 2)"),
});
export type OrchestratedOptions = z.input<typeof OrchestratedOptionsSchema>;

export function orchestratedTasks(opts: OrchestratedOptions = {}): {
  train: OrchestratedTask[];
  eval: OrchestratedTask[];
} {
  const o = parseOptions(OrchestratedOptionsSchema, opts, "orchestrated");
  const letters = [...(o.letters ?? "abcd")];
  const workers = o.workers ?? 2;
  return generateTasks(o, (rng, id) => ({
    id,
    expert: Math.floor(rng() * workers),
    secret: pick(rng, letters),
  }));
}

export class OrchestratedEnv extends SyntheticEnv<OrchestratedTask> {
  private readonly letters: string;
  private readonly match: MatchMode;
  private readonly workers: AgentSpec[];

  constructor(agents: AgentSpec[], graph: GraphSpec, opts: OrchestratedOptions = {}) {
    const o = parseOptions(OrchestratedOptionsSchema, opts, "orchestrated");
    super(agents, graph, 2, "orchestrated");
    if (graph.kind !== "dynamic") {
      throw new Error(`orchestrated: expected graph kind "dynamic", got "${graph.kind}"`);
    }
    const n = o.workers ?? 2;
    if (agents.length !== n + 1) {
      throw new Error(`orchestrated: expected 1 orchestrator and ${n} workers, got ${agents.length} agents`);
    }
    this.letters = o.letters ?? "abcd";
    this.match = o.match ?? "class";
    this.workers = agents.slice(1);
  }

  private get orchestrator(): AgentId {
    return this.specs[0]!.id;
  }

  /** The worker an orchestrator's output names, or undefined. */
  route(text: string): AgentSpec | undefined {
    let best: { at: number; worker: AgentSpec } | undefined;
    for (const w of this.workers) {
      for (const name of [w.id, w.role]) {
        const at = text.indexOf(name);
        if (at >= 0 && (best === undefined || at < best.at)) best = { at, worker: w };
      }
    }
    if (best) return best.worker;
    if (this.match === "class") {
      const c = classOf(text, this.workers.length);
      return c < 0 ? undefined : this.workers[c];
    }
    const digit = Number.parseInt(text.trimStart()[0] ?? "", 10);
    return this.workers[digit - 1];
  }

  protected start(task: OrchestratedTask): void {
    if (!(task.expert >= 0 && task.expert < this.workers.length)) {
      throw new Error(`orchestrated task ${task.id}: expert ${task.expert} is not a worker index`);
    }
    const texts: Record<AgentId, string> = { [this.orchestrator]: `expert: ${task.expert + 1}` };
    this.workers.forEach((w, i) => {
      texts[w.id] = i === task.expert ? `secret: ${task.secret}` : "secret?";
    });
    this.begin(texts);
    this.team.schedule(this.orchestrator);
  }

  protected afterAct(agent: AgentId, text: string): void {
    const task = this.task!;
    const expert = this.workers[task.expert]!;
    if (agent === this.orchestrator) {
      const chosen = this.route(text);
      if (chosen === undefined) {
        this.finish(0, { expert: expert.id, chosen: null, answer: null }, { [this.team.role(agent)]: 0 });
        return;
      }
      this.team.schedule(chosen.id, [this.orchestrator]);
      return;
    }
    const right = matches(text, task.secret, this.letters, this.match);
    this.finish(
      right ? 1 : 0,
      { expert: expert.id, chosen: agent, answer: text, secret: task.secret },
      { [this.team.role(this.orchestrator)]: agent === expert.id ? 1 : 0 },
    );
  }
}

export function orchestratedSuite(opts: OrchestratedOptions = {}): TaskSuite<OrchestratedTask> {
  const { train, eval: evalTasks } = orchestratedTasks(opts);
  return {
    name: "orchestrated",
    train,
    eval: evalTasks,
    taskId: (t) => t.id,
    makeEnv: (agents, graph) => new OrchestratedEnv(agents, graph, opts),
  };
}
