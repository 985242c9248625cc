// `secret`: the speaker (first agent in profile order) sees a secret letter; the listener (last agent)
// sees only what the agents before it said and must state the secret. Agents in between (if any)
// relay. Needs communication, so use a graph in which the listener sees the speaker (sequential, or
// edges speaker -> listener).
//
// Team reward: 1 when the listener's first character states the secret (see common.ts for "class"
// matching), else 0. With `attempts` > 1 a wrong answer appends "attempt N: wrong" to the shared
// history and the team tries again; the episode terminates when right or after the last attempt.
// Per-role rewards (info().roleRewards): the speaker's role gets the share of its first
// `speakerChars` characters (default 1) that state the secret (same matching): a shaping reward
// that breaks the symmetry of learning to communicate from scratch (with the team reward alone,
// neither agent's gradient carries signal until the other one already uses the channel). Route it
// with per-role reward routing. A speaker that says many characters also puts the secret many times
// into the listener's prompt (configs/tiny-secret.yaml).
//
// Measured from random init (tiny:llama, 4 letters, class matching, group-relative policy gradient,
// 128 episodes per iteration, LoRA r 8 on q_proj/v_proj/lm_head, lr 1e-2): with the team reward
// alone the team stayed at chance for 60 iterations; with the speaker's shaping reward and
// `repeat: 16` the speaker went from ~0.15 to ~0.6 in 40 iterations while the listener lagged.
// LoRA on q_proj/v_proj alone barely moves a random-init model's near-uniform output.
import type { AgentId, AgentSpec, GraphSpec, TaskSuite } from "../../flexmg/types.ts";
import {
  generateTasks,
  type MatchMode,
  matches,
  matchFraction,
  pick,
  positiveIntOption,
  resolveLetters,
  SyntheticEnv,
  type SyntheticOptions,
} from "./common.ts";

export interface SecretTask {
  id: string;
  secret: string;
}

export interface SecretOptions extends SyntheticOptions {
  /** Attempts per episode (default 1). */
  attempts?: number;
  /**
   * How many times the speaker's prompt repeats the secret (default 1). A random-init model attends
   * almost uniformly, so its last hidden state is roughly the mean of the context's embeddings; a
   * secret that fills a good part of the context moves that mean, which makes the task learnable fast.
   */
  repeat?: number;
  /** The speaker's shaping reward counts this many of its characters (default 1: the first only). */
  speakerChars?: number;
}

export function secretTasks(opts: SecretOptions = {}): { train: SecretTask[]; eval: SecretTask[] } {
  const letters = [...resolveLetters(opts.letters)];
  return generateTasks(opts, (rng, id) => ({ id, secret: pick(rng, letters) }));
}

export class SecretEnv extends SyntheticEnv<SecretTask> {
  private readonly letters: string;
  private readonly match: MatchMode;
  private readonly attempts: number;
  private readonly repeat: number;
  private readonly speakerChars: number;

  constructor(agents: AgentSpec[], graph: GraphSpec, opts: SecretOptions = {}) {
    super(agents, graph, 2, "secret");
    this.letters = resolveLetters(opts.letters);
    this.match = opts.match ?? "class";
    this.attempts = positiveIntOption("secret", "attempts", opts.attempts, 1);
    this.repeat = positiveIntOption("secret", "repeat", opts.repeat, 1);
    this.speakerChars = positiveIntOption("secret", "speakerChars", opts.speakerChars, 1);
  }

  private get speaker(): AgentId {
    return this.specs[0]!.id;
  }

  private get listener(): AgentId {
    return this.specs[this.specs.length - 1]!.id;
  }

  protected start(task: SecretTask): void {
    const texts: Record<AgentId, string> = {};
    for (const a of this.agents)
      texts[a] = a === this.speaker ? `secret: ${task.secret.repeat(this.repeat)}` : "secret?";
    this.team.reset(texts);
  }

  protected afterAct(): void {
    if (!this.team.stepComplete()) return;
    const answer = this.team.actionOf(this.listener) ?? "";
    const right = matches(answer, this.task!.secret, this.letters, this.match);
    const attempt = this.team.step + 1;
    if (right || attempt >= this.attempts) {
      const said = this.team.actionOf(this.speaker) ?? "";
      const speakerScore = matchFraction(
        said,
        this.task!.secret,
        this.letters,
        this.match,
        this.speakerChars,
      );
      this.end(
        right ? 1 : 0,
        { secret: this.task!.secret, answer, attempts: attempt },
        { [this.team.role(this.speaker)]: speakerScore },
      );
      return;
    }
    this.team.addHistory(`attempt ${attempt}: wrong`);
    this.team.nextStep();
  }
}

export function secretSuite(opts: SecretOptions = {}): TaskSuite<SecretTask> {
  const { train, eval: evalTasks } = secretTasks(opts);
  return {
    name: "secret",
    train,
    eval: evalTasks,
    taskId: (t) => t.id,
    makeEnv: (agents, graph) => new SecretEnv(agents, graph, opts),
  };
}
