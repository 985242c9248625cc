// The run config's keys of the sample-efficient training flow (issue 15), all off by default:
// dynamic sampling, experience replay, the task scheduler of multi-task runs, and asynchronous
// training (issue 14), with their cross-field checks. They are fields of `train` (schema.ts); they live here to keep that file short.
import { z } from "zod";
import { nonNegInt, posInt, posNum, unit } from "../fields.ts";

export const DynamicSampling = z
  .strictObject({
    maxExtraRollouts: posInt()
      .default(4)
      .describe("extra rollouts per iteration at most, each of as many fresh tasks as groups are missing"),
  })
  .describe(
    "drop groups whose episodes all got the same rewards (no gradient under group baselines) and refill the batch with fresh tasks; needs train.samplesPerTask >= 2; {} for the defaults, null: off",
  );

export const Replay = z
  .strictObject({
    capacity: posInt().default(1024).describe("turns the buffer keeps (the oldest go first)"),
    reuse: posNum()
      .default(1)
      .describe("replayed turns per fresh turn in each adapter's batch (1: half the batch is replayed)"),
    maxAge: nonNegInt()
      .default(4)
      .describe(
        "a turn sampled more than this many versions of its adapter ago is never used (one optimizer step is one version)",
      ),
    clip: posNum()
      .default(1)
      .describe("truncation of the importance weights: w = min(clip, pi_now / pi_behaviour) per token"),
  })
  .describe(
    "experience replay: past turns with their behaviour log-probs, mixed into each PPO batch with truncated importance weights; {} for the defaults, null: off",
  );

export const Async = z
  .strictObject({
    maxStaleness: nonNegInt()
      .default(4)
      .describe(
        "no turn is trained on whose adapter version is more than this many versions behind the adapter being updated (one optimizer step is one version; an agent's own agents[i].maxStaleness overrides it); such turns are dropped and counted",
      ),
    correction: z
      .enum(["decoupled", "truncated-is"], { error: 'expected "decoupled" or "truncated-is"' })
      .default("decoupled")
      .describe(
        "off-policy turns, both around pi_prox from a forward pass of the adapter now: decoupled PPO weights the advantages by pi_prox / pi_behaviour and leaves out tokens whose weight exceeds clip; truncated-is weights them by min(clip, pi_prox / pi_behaviour)",
      ),
    clip: posNum()
      .default(2)
      .describe("the cap of the importance weights pi_prox / pi_behaviour (per token)"),
  })
  .describe(
    "asynchronous training: the next iteration's rollout runs while this one's update does; {} for the defaults, null: the synchronous loop. Not bit-reproducible: timing decides which version a turn sees",
  );

export const TaskScheduler = z
  .discriminatedUnion("kind", [
    z
      .strictObject({ kind: z.literal("fixed") })
      .describe("each task of the iteration is drawn with probability proportional to its weight"),
    z
      .strictObject({ kind: z.literal("round-robin") })
      .describe("a whole iteration per task in turn, weighted (smooth weighted round robin)"),
    z
      .strictObject({
        kind: z.literal("learning-progress"),
        fast: unit().default(0.5).describe("rate of the fast moving average of a task's reward"),
        slow: unit().default(0.1).describe("rate of the slow moving average"),
        explore: unit()
          .default(0.2)
          .describe("share of the draws made by the weights alone, so no task is starved"),
      })
      .describe(
        "more of the tasks whose reward is still moving: p ∝ |fast − slow average of its reward|, mixed with the weights",
      ),
  ])
  .describe("multi-task runs (tasks): how each iteration's mix of tasks is chosen (default fixed)");

/** What the checks read of a run config (structural, so this file need not import schema.ts). */
interface FlowView {
  task?: unknown;
  agents: Array<{ maxStaleness?: number }>;
  tasks?: Array<{ name: string; graph?: { kind: string; edges?: Array<[string, string]> } }>;
  train: {
    samplesPerTask: number;
    taskScheduler?: unknown;
    dynamicSampling: unknown;
    replay: { maxAge: number } | null;
    async: unknown;
    offPolicy: boolean;
  };
  ppo: { epochs: number; minibatches: number };
}

/** The training flow's cross-field checks, each naming the field it is about. */
export function checkTrainingFlow(
  c: FlowView,
  ctx: z.RefinementCtx,
  /** Checks that agent ids in lists of lists name agents of the team (schema.ts). */
  knownIds: (lists: ReadonlyArray<readonly string[]>, path: Array<string | number>) => void,
): void {
  if (!c.task && !c.tasks)
    ctx.addIssue({
      code: "custom",
      path: ["task"],
      message: "required (expected a task section, or a tasks list for a multi-task run)",
      input: undefined,
    });
  if (c.task && c.tasks)
    ctx.addIssue({
      code: "custom",
      path: ["tasks"],
      message: "give either task (one task) or tasks (several), not both",
      input: c.tasks,
    });
  const taskNames = new Map<string, number>();
  (c.tasks ?? []).forEach((t, i) => {
    if (taskNames.has(t.name))
      ctx.addIssue({
        code: "custom",
        path: ["tasks", i, "name"],
        message: `duplicate task name "${t.name}" (also tasks[${taskNames.get(t.name)}])`,
        input: t.name,
      });
    taskNames.set(t.name, i);
    if (t.graph?.edges) knownIds(t.graph.edges, ["tasks", i, "graph", "edges"]);
  });
  if (c.train.taskScheduler && !c.tasks)
    ctx.addIssue({
      code: "custom",
      path: ["train", "taskScheduler"],
      message: "a task scheduler needs a multi-task run (a tasks list)",
      input: c.train.taskScheduler,
    });
  if (c.train.dynamicSampling && c.train.samplesPerTask < 2)
    ctx.addIssue({
      code: "custom",
      path: ["train", "dynamicSampling"],
      message: "expected train.samplesPerTask >= 2: dynamic sampling drops groups of episodes of one task",
      input: c.train.dynamicSampling,
    });
  c.agents.forEach((a, i) => {
    if (a.maxStaleness !== undefined && !c.train.async)
      ctx.addIssue({
        code: "custom",
        path: ["agents", i, "maxStaleness"],
        message: "a staleness bound needs asynchronous training (train.async)",
        input: a.maxStaleness,
      });
  });
  if (c.train.async && c.train.offPolicy)
    ctx.addIssue({
      code: "custom",
      path: ["train", "offPolicy"],
      message:
        "train.async bounds and corrects stale turns itself; train.offPolicy (accept any age) contradicts its bound",
      input: true,
    });
  const stepsPerIteration = c.ppo.epochs * c.ppo.minibatches;
  if (c.train.replay && c.train.replay.maxAge < stepsPerIteration)
    ctx.addIssue({
      code: "custom",
      path: ["train", "replay", "maxAge"],
      message: `expected at least ppo.epochs x ppo.minibatches = ${stepsPerIteration}: an adapter takes that many optimizer steps per iteration, so every stored turn would be too old before it could be replayed`,
      input: c.train.replay.maxAge,
    });
}
