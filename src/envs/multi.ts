// Several task suites behind one TaskSuite, for multi-task runs: the rollout plays a mix of tasks in
// one batch, and evaluation scores each task's held-out problems. A task is tagged with its part; an
// episode's env is made by that part's suite when the episode starts (reset), with the part's graph.
// Task ids are "<part name>/<the part's own id>", so metrics and evaluation can be split per task.
import type {
  AgentId,
  AgentSpec,
  ChatMessage,
  Env,
  GraphSpec,
  Outcome,
  Rewards,
  TaskSuite,
} from "../flexmg/types.ts";

export interface TaskPart {
  /** Names metrics (task/<name>/reward) and prefixes task ids; letters, digits, _ and - only. */
  name: string;
  weight: number;
  suite: TaskSuite<unknown>;
  /** This task's dependency graph; default: the run's. */
  graph?: GraphSpec;
}

/** A task of one part. */
export interface PartTask {
  part: number;
  task: unknown;
}

export class MultiTaskSuite implements TaskSuite<PartTask> {
  readonly name: string;
  readonly train: PartTask[];
  readonly eval: PartTask[];

  constructor(readonly parts: readonly TaskPart[]) {
    if (parts.length === 0) throw new Error("multi-task suite: no tasks");
    this.name = parts.map((p) => p.name).join("+");
    const tag = (split: "train" | "eval") =>
      parts.flatMap((p, part) => p.suite[split].map((task) => ({ part, task })));
    this.train = tag("train");
    this.eval = tag("eval");
  }

  taskId(t: PartTask): string {
    const p = this.part(t.part);
    return `${p.name}/${p.suite.taskId(t.task)}`;
  }

  makeEnv(agents: AgentSpec[], graph: GraphSpec): Env<PartTask> {
    return new MultiTaskEnv(this, agents, graph);
  }

  part(index: number): TaskPart {
    const p = this.parts[index];
    if (!p) throw new Error(`multi-task suite: no task number ${index} (${this.parts.length} tasks)`);
    return p;
  }
}

/** The part name of a task id made by a MultiTaskSuite. */
export function partName(taskId: string): string {
  const slash = taskId.indexOf("/");
  return slash < 0 ? taskId : taskId.slice(0, slash);
}

/** An env that becomes the env of its task's part at reset and answers as it does. */
class MultiTaskEnv implements Env<PartTask> {
  readonly agents: readonly AgentId[];
  private env: Env<unknown> | null = null;
  private name = "";

  constructor(
    private readonly suite: MultiTaskSuite,
    private readonly specs: AgentSpec[],
    private readonly graph: GraphSpec,
  ) {
    this.agents = specs.map((a) => a.id);
  }

  async reset(t: PartTask, seed: number): Promise<void> {
    const part = this.suite.part(t.part);
    const env = part.suite.makeEnv(this.specs, part.graph ?? this.graph);
    // The rollout seeds each agent's requests by its index in `agents`: it must not move with the task.
    if (env.agents.join(",") !== this.agents.join(",")) {
      throw new Error(
        `task ${part.name}: its env orders the agents ${env.agents.join(", ")}, not ${this.agents.join(", ")}`,
      );
    }
    this.env = env;
    this.name = part.name;
    await env.reset(t.task, seed);
  }

  private get inner(): Env<unknown> {
    if (!this.env) throw new Error("multi-task env: reset() first");
    return this.env;
  }

  ready(): AgentId[] {
    return this.env ? this.env.ready() : [];
  }
  observe(agent: AgentId): ChatMessage[] {
    return this.inner.observe(agent);
  }
  parents(agent: AgentId): AgentId[] {
    return this.inner.parents(agent);
  }
  step(): number {
    return this.inner.step();
  }
  act(agent: AgentId, text: string): Promise<void> {
    return this.inner.act(agent, text);
  }
  takeRewards(): Rewards {
    return this.env ? this.env.takeRewards() : {};
  }
  get terminated(): boolean {
    return this.env?.terminated ?? false;
  }
  get truncated(): boolean {
    return this.env?.truncated ?? false;
  }
  outcome(): Outcome {
    return this.inner.outcome();
  }
  state(): ChatMessage[] {
    return this.inner.state();
  }
  info(): Record<string, unknown> {
    return { task: this.name, ...this.inner.info() };
  }
}
