// `secret`: the speaker (first agent in profile order) sees a secret letter; the listener (last agent)
// sees only what the agents before it said and must state the secret. Agents in between (if any)
// relay. Needs communication, so use a graph in which the listener sees the speaker (sequential, or
// edges speaker -> listener).
//
// Team reward: 1 when the listener's first character states the secret (see common.ts for "class"
// matching), else 0. With `attempts` > 1 a wrong answer appends "attempt N: wrong" to the shared
// history and the team tries again; the episode terminates when right or after the last attempt.
// Per-role rewards (outcome().roleRewards): the speaker's role gets the share of its first
// `speakerChars` characters (default 1) that state the secret (same matching): a shaping reward
// that breaks the symmetry of learning to communicate from scratch (with the team reward alone,
// neither agent's gradient carries signal until the other one already uses the channel). Route it
// with per-role reward routing. A speaker that says many characters also puts the secret many times
// into the listener's prompt (configs/tiny-secret.yaml).
import { z } from "zod";
import type { AgentId, AgentSpec, GraphSpec, TaskSuite } from "../../flexmg/types.ts";
import { parseOptions, posInt } from "../../fields.ts";
import {
  generateTasks,
  lettersField,
  type MatchMode,
  matches,
  matchFraction,
  pick,
  SyntheticEnv,
  syntheticOptionFields,
} from "./common.ts";

export interface SecretTask {
  id: string;
  secret: string;
}

export const SecretOptionsSchema = z.strictObject({
  letters: lettersField().optional(),
  ...syntheticOptionFields,
  attempts: posInt().optional().describe("attempts per episode (default 1)"),
  repeat: posInt()
    .optional()
    .describe(
      "how many times the speaker's prompt repeats the secret (default 1): a random-init model attends almost uniformly, so its last hidden state is roughly the mean of the context's embeddings; a secret that fills a good part of the context moves that mean",
    ),
  speakerChars: posInt()
    .optional()
    .describe("the speaker's shaping reward counts this many of its characters (default 1: the first only)"),
});
export type SecretOptions = z.input<typeof SecretOptionsSchema>;

export function secretTasks(opts: SecretOptions = {}): { train: SecretTask[]; eval: SecretTask[] } {
  const o = parseOptions(SecretOptionsSchema, opts, "secret");
  const letters = [...(o.letters ?? "abcd")];
  return generateTasks(o, (rng, id) => ({ id, secret: pick(rng, letters) }));
}

export class SecretEnv extends SyntheticEnv<SecretTask> {
  private readonly letters: string;
  private readonly match: MatchMode;
  private readonly attempts: number;
  private readonly repeat: number;
  private readonly speakerChars: number;

  constructor(agents: AgentSpec[], graph: GraphSpec, opts: SecretOptions = {}) {
    const o = parseOptions(SecretOptionsSchema, opts, "secret");
    super(agents, graph, 2, "secret");
    this.letters = o.letters ?? "abcd";
    this.match = o.match ?? "class";
    this.attempts = o.attempts ?? 1;
    this.repeat = o.repeat ?? 1;
    this.speakerChars = o.speakerChars ?? 1;
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
    this.begin(texts);
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
      this.finish(
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
