// The run config's schema: one YAML file describes the team, the task, the algorithm and the
// schedule. Every field has a help line (CleanRL-style; they become schemas/run-config.json for
// editors), unknown keys are errors, and cross-field checks name the path they are about. The task
// section is the union of the task families' own schemas (src/envs/tasks.ts).
import { z } from "zod";
import { TaskSchema } from "../envs/tasks.ts";
import { Async, checkTrainingFlow, DynamicSampling, Replay, TaskScheduler } from "./flow.ts";
import { name, nonNegInt, nonNegNum, posInt, posNum, unit } from "../fields.ts";
import { findCycle } from "../flexmg/graph.ts";
import { Agent, Base, Engine, layerList } from "./parts.ts";

const Graph = z
  .discriminatedUnion("kind", [
    z.strictObject({ kind: z.literal("sequential") }).describe("agent i sees agents 1..i-1 of the same step"),
    z.strictObject({ kind: z.literal("parallel") }).describe("nobody sees anybody within a step"),
    z
      .strictObject({
        kind: z.literal("edges"),
        edges: z
          .array(z.tuple([name(), name()], { error: "expected a pair [from, to]" }))
          .describe("[from, to]: `to` sees `from`; must be acyclic"),
      })
      .describe("explicit dependency edges"),
    z
      .strictObject({ kind: z.literal("dynamic") })
      .describe("the task (or an orchestrator) decides who acts and whom they see"),
  ])
  .describe("the dependency function D_t over the agents of a step");

const Critic = z
  .strictObject({
    base: name().describe("base model of the centralized critic (a key of `bases`)"),
    r: posInt().default(8).describe("critic LoRA rank"),
    alpha: posNum().default(16).describe("critic LoRA alpha"),
    targetModules: z
      .array(name())
      .min(1)
      .default(["q_proj", "v_proj"])
      .describe("modules with critic LoRA weights"),
    layers: layerList(
      "only these layers get critic LoRA weights (negative from the last), e.g. [-8, -7, -6, -5, -4, -3, -2, -1]: the critic's backward then stops below them (about 2x cheaper); null: all",
    ),

    lr: posNum().default(5e-5).describe("critic learning rate"),
    headHidden: z
      .array(posInt())
      .default([1024, 512])
      .describe("hidden sizes of the MLP value head (the reference: 1024, 512)"),
    warmupIters: nonNegInt().default(0).describe("critic-only iterations before the policies start updating"),
    valueLoss: z
      .enum(["mse", "huber"])
      .default("huber")
      .describe("value loss (the reference: clipped Huber, delta 10)"),
    valueClip: nonNegNum().nullable().default(0.2).describe("clip new values to old ± this; null: unclipped"),
    maxGradNorm: posNum().default(0.5).describe("gradient clipping of the critic"),
  })
  .describe("the centralized critic (MARFT-A / MARFT-T)");

const RewardRouting = z
  .discriminatedUnion("kind", [
    z.strictObject({ kind: z.literal("team") }).describe("the team reward goes to every agent's last action"),
    z
      .strictObject({ kind: z.literal("last") })
      .describe("the team reward goes to the last action only (the reference)"),
    z
      .strictObject({
        kind: z.literal("per-role"),
        roles: z
          .record(z.string(), name())
          .describe('role -> "team", "none", or the name of a per-role reward the task emits'),
      })
      .describe("per-role reward functions"),
  ])
  .describe("which actions the rewards are credited to");

const Algo = z
  .strictObject({
    estimator: z
      .enum(["marft-a", "marft-t", "critic-free"])
      .default("marft-a")
      .describe(
        "marft-a: action-level GAE with a centralized critic; marft-t: token-level GAE; critic-free: group-relative baselines",
      ),
    gamma: unit().default(0.99).describe("discount"),
    lambda: unit().default(0.95).describe("GAE lambda"),
    rewardRouting: RewardRouting.prefault({ kind: "last" }),
    normalize: z
      .union([z.boolean(), z.array(z.string().min(1))], {
        error: "expected true, false or a list of agent ids",
      })
      .default(true)
      .describe(
        "normalise advantages per agent per batch: every agent (true), none (false), or the listed agents only",
      ),
    normalizeStd: z
      .boolean({ error: "expected true or false" })
      .default(true)
      .describe(
        "normalize: divide by the agent's std after centring (false: centre only, which removes a critic's bias without blowing up near-constant advantages)",
      ),
    groupStd: z
      .boolean({ error: "expected true or false" })
      .default(false)
      .describe("critic-free: also divide by the group's reward std"),
  })
  .describe("credit assignment");

const Ppo = z
  .strictObject({
    clipLow: nonNegNum().default(0.2).describe("ratio clip below: 1 - clipLow"),
    clipHigh: nonNegNum().default(0.2).describe("ratio clip above: 1 + clipHigh"),
    entropyCoef: nonNegNum().default(0.01).describe("entropy bonus"),
    klCoef: nonNegNum().default(0).describe("KL penalty to the reference policy (base with adapters off)"),
    klEstimator: z.enum(["k1", "k2", "k3"]).default("k3").describe("estimator of the KL penalty"),
    epochs: posInt().default(1).describe("passes over the batch per iteration"),
    minibatches: posInt().default(1).describe("optimizer steps per epoch per agent"),
    targetKl: posNum()
      .nullable()
      .default(null)
      .describe("stop an agent's updates this iteration once approx-KL exceeds it; null: never"),
    ratio: z
      .enum(["token", "sequence"])
      .default("token")
      .describe("per-token ratios, or one ratio per action"),
    sequenceLogprob: z
      .enum(["sum", "mean"])
      .default("sum")
      .describe("ratio=sequence: action log-prob is the token sum or mean"),
    maxGradNorm: posNum().default(0.5).describe("gradient clipping of the policies"),
    recomputeLogprobs: z
      .union([z.literal("auto"), z.boolean({ error: 'expected true, false or "auto"' })])
      .default("auto")
      .describe(
        "take PPO's old log-probs from a forward pass instead of the sampler; auto: when the agent's base computes in bf16 (the sampler's incremental decode and a full forward pass then differ)",
      ),
  })
  .describe("the PPO update");

const Train = z
  .strictObject({
    iterations: posInt().default(10).describe("training iterations (rollout + update)"),
    tasksPerIter: posInt().default(8).describe("distinct tasks per rollout"),
    samplesPerTask: posInt().default(1).describe("episodes per task (>= 2 for critic-free group baselines)"),
    maxConcurrentEpisodes: posInt().default(64).describe("episodes in flight at once"),
    schedule: z
      .enum(["joint", "agent-by-agent"])
      .default("joint")
      .describe("joint: all trainable agents update every iteration; agent-by-agent: round robin"),
    roundRobinEvery: posInt()
      .default(1)
      .describe("agent-by-agent: iterations each agent trains before the next one"),
    turns: z
      .array(z.array(name()).min(1, { error: "expected at least one agent id" }))
      .optional()
      .describe(
        "agent-by-agent: the turns of the round robin, each a list of agents whose adapters update together (e.g. [[s1, s2], [agg]]: both solvers, then the aggregator; an agent in no turn does not update); default: one turn per adapter, in profile order",
      ),
    deterministic: z
      .boolean({ error: "expected true or false" })
      .default(true)
      .describe(
        "lock-step rollout: bit-reproducible on CPU (needed for exact resume); false overlaps more calls",
      ),
    offPolicy: z
      .boolean({ error: "expected true or false" })
      .default(false)
      .describe("accept turns sampled by an older adapter version"),
    batchAdapters: z
      .boolean({ error: "expected true or false" })
      .default(false)
      .describe(
        "agents that update in the same iteration share engine passes: each minibatch of all of them is one forward_backward_batch (each row through its own adapter), then one optimizer step per adapter; faster with several agents, and off by default because the shared pass rounds differently (metrics move in the last digits)",
      ),
    evalEvery: nonNegInt().default(0).describe("evaluate every N iterations (0: only at the end)"),
    evalAtStart: z
      .boolean({ error: "expected true or false" })
      .default(false)
      .describe("evaluate before the first update too"),
    checkpointEvery: nonNegInt().default(0).describe("checkpoint every N iterations (0: only at the end)"),
    keepCheckpoints: posInt().default(3).describe("newest checkpoints kept on disk"),
    transcripts: nonNegInt()
      .default(4)
      .describe(
        "episodes per iteration written to transcripts.jsonl with per-token advantages and log-probs, for the dashboard (0: none)",
      ),
    tensorboard: z
      .boolean({ error: "expected true or false" })
      .default(false)
      .describe("also write the metrics as TensorBoard event files under runs/<name>/tensorboard/"),
    maxSampledTokens: posInt()
      .nullable()
      .default(null)
      .describe(
        "stop once the training rollouts have sampled this many tokens (checked after each iteration: a run ends within one iteration's tokens of it; train.iterations stays an upper bound); null: iterations only",
      ),
    dynamicSampling: DynamicSampling.nullable().default(null),
    replay: Replay.nullable().default(null),
    async: Async.nullable().default(null),
    taskScheduler: TaskScheduler.optional(),
  })
  .describe("the schedule of the run");

const Eval = z
  .strictObject({
    n: nonNegInt().default(0).describe("held-out tasks to evaluate (0: all)"),
    greedy: z
      .boolean({ error: "expected true or false" })
      .default(true)
      .describe("pass@1 with greedy decoding"),
    k: nonNegInt().default(0).describe("pass@k with k sampled attempts per task (0: off)"),
  })
  .describe("held-out evaluation");

const TaskEntry = z
  .strictObject({
    name: z
      .string({ error: "expected a task name" })
      .regex(/^[A-Za-z0-9][A-Za-z0-9_-]*$/, {
        error: "expected a task name of letters, digits, _ or - (it names metrics: task/<name>/...)",
      })
      .describe("the task's name in metrics and evaluation (task/<name>/reward, eval/<name>/accuracy)"),
    weight: posNum().default(1).describe("the task's share of the draws (relative to the others)"),
    task: TaskSchema,
    graph: Graph.optional().describe("this task's dependency graph (default: the run's `graph`)"),
  })
  .describe("one task of a multi-task run");

export const RunConfigObject = z.strictObject({
  name: z
    .string({ error: "expected a run name" })
    .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, {
      error: "expected a run name of letters, digits, '.', '_' or '-'",
    })
    .describe("run name: the run directory is runs/<name>"),
  seed: nonNegInt().default(0).describe("seed of every random choice (task order, sample seeds)"),
  engine: Engine.prefault({}),
  bases: z.record(z.string().regex(/^[A-Za-z0-9_.-]+$/), Base).describe("base models by name"),
  agents: z
    .array(Agent)
    .min(1, { error: "expected at least one agent" })
    .describe("the team, in profile order"),
  graph: Graph.prefault({ kind: "sequential" }),
  task: TaskSchema.optional(),
  tasks: z
    .array(TaskEntry)
    .min(1, { error: "expected at least one task" })
    .optional()
    .describe("a multi-task run: several tasks with weights (instead of `task`); see train.taskScheduler"),
  critic: Critic.optional(),
  algo: Algo.prefault({}),
  ppo: Ppo.prefault({}),
  train: Train.prefault({}),
  eval: Eval.prefault({}),
});

/** Cross-field checks: names refer to things that exist, and the choices fit together. */
export const RunConfigSchema = RunConfigObject.superRefine((c, ctx) => {
  const ids = new Map<string, number>();
  c.agents.forEach((a, i) => {
    if (ids.has(a.id))
      ctx.addIssue({
        code: "custom",
        path: ["agents", i, "id"],
        message: `duplicate agent id "${a.id}" (also agents[${ids.get(a.id)}])`,
        input: a.id,
      });
    ids.set(a.id, i);
    if (a.id === CRITIC_ADAPTER && c.algo.estimator !== "critic-free")
      ctx.addIssue({
        code: "custom",
        path: ["agents", i, "id"],
        message: `"${CRITIC_ADAPTER}" is the critic adapter's name; choose another agent id`,
        input: a.id,
      });
  });
  const baseNames = Object.keys(c.bases);
  c.agents.forEach((a, i) => {
    if (!(a.base in c.bases))
      ctx.addIssue({
        code: "custom",
        path: ["agents", i, "base"],
        message: `unknown base "${a.base}" (bases: ${baseNames.join(", ") || "none"})`,
        input: a.base,
      });
    if ("shared" in a.adapter) {
      const j = ids.get(a.adapter.shared);
      const owner = j === undefined ? undefined : c.agents[j];
      if (!owner)
        ctx.addIssue({
          code: "custom",
          path: ["agents", i, "adapter", "shared"],
          message: `unknown agent "${a.adapter.shared}"`,
          input: a.adapter.shared,
        });
      else if ("shared" in owner.adapter)
        ctx.addIssue({
          code: "custom",
          path: ["agents", i, "adapter", "shared"],
          message: `agent "${owner.id}" shares an adapter itself; name the agent that owns it`,
          input: a.adapter.shared,
        });
      else if (owner.base !== a.base)
        ctx.addIssue({
          code: "custom",
          path: ["agents", i, "adapter", "shared"],
          message: `agent "${owner.id}" is on base "${owner.base}", not "${a.base}"`,
          input: a.adapter.shared,
        });
      else if (owner.trainable !== a.trainable)
        ctx.addIssue({
          code: "custom",
          path: ["agents", i, "trainable"],
          message: `agents sharing an adapter must agree on trainable (agent "${owner.id}" has ${owner.trainable})`,
          input: a.trainable,
        });
    }
    if (a.trainable && a.sampling.temperature === 0)
      ctx.addIssue({
        code: "custom",
        path: ["agents", i, "sampling", "temperature"],
        message: "expected a temperature > 0 for a trainable agent (greedy actions have no policy gradient)",
        input: 0,
      });
  });
  // Agent ids in lists of lists (graph edges, train turns) must name agents of the team.
  const knownIds = (lists: ReadonlyArray<readonly string[]>, path: Array<string | number>) =>
    lists.forEach((list, k) => {
      list.forEach((id, m) => {
        if (!ids.has(id))
          ctx.addIssue({
            code: "custom",
            path: [...path, k, m],
            message: `unknown agent "${id}"`,
            input: id,
          });
      });
    });
  if (c.graph.kind === "edges") {
    knownIds(c.graph.edges, ["graph", "edges"]);
    const cycle = findCycle(
      c.agents.map((a) => a.id),
      c.graph.edges,
    );
    if (cycle)
      ctx.addIssue({
        code: "custom",
        path: ["graph", "edges"],
        message: `the graph has a cycle ${cycle.join(" -> ")}; an agent cannot see an action that depends on its own`,
        input: c.graph.edges,
      });
  }
  knownIds(c.train.turns ?? [], ["train", "turns"]);
  if (Array.isArray(c.algo.normalize)) {
    c.algo.normalize.forEach((id, k) => {
      if (!ids.has(id))
        ctx.addIssue({
          code: "custom",
          path: ["algo", "normalize", k],
          message: `unknown agent "${id}"`,
          input: id,
        });
    });
  }
  if (c.algo.estimator !== "critic-free") {
    if (!c.critic)
      ctx.addIssue({
        code: "custom",
        path: ["critic"],
        message: `expected a critic section for estimator "${c.algo.estimator}" (or set algo.estimator: critic-free)`,
        input: undefined,
      });
    else if (!(c.critic.base in c.bases))
      ctx.addIssue({
        code: "custom",
        path: ["critic", "base"],
        message: `unknown base "${c.critic.base}" (bases: ${baseNames.join(", ") || "none"})`,
        input: c.critic.base,
      });
    else if (c.algo.estimator === "marft-t") {
      // token-level values need the agents' tokens: a critic reads other bases' turns re-tokenized
      const other = c.agents.findIndex((a) => a.base !== c.critic!.base);
      if (other >= 0)
        ctx.addIssue({
          code: "custom",
          path: ["agents", other, "base"],
          message: `marft-t needs every agent on the critic's base "${c.critic.base}" (token-level values); marft-a takes agents on other bases`,
          input: c.agents[other]!.base,
        });
    }
  }
  checkTrainingFlow(c, ctx, knownIds);
  if (c.algo.estimator === "critic-free" && c.train.samplesPerTask < 2)
    ctx.addIssue({
      code: "custom",
      path: ["train", "samplesPerTask"],
      message: "expected at least 2 samples per task for group-relative (critic-free) baselines",
      input: c.train.samplesPerTask,
    });
  if (c.engine.url && (c.engine.replicas > 1 || c.engine.ray.address))
    ctx.addIssue({
      code: "custom",
      path: ["engine", c.engine.replicas > 1 ? "replicas" : "ray"],
      message: "replicas are set where the CLI starts the engine; the engine at engine.url has its own",
      input: c.engine.replicas,
    });
  if (c.algo.rewardRouting.kind === "per-role") {
    const roles = new Set(c.agents.map((a) => a.role));
    for (const role of Object.keys(c.algo.rewardRouting.roles)) {
      if (!roles.has(role))
        ctx.addIssue({
          code: "custom",
          path: ["algo", "rewardRouting", "roles", role],
          message: `no agent has role "${role}" (roles: ${[...roles].join(", ")})`,
          input: role,
        });
    }
  }
});

/** The critic adapter's name on the engine (an agent may not take it unless the run has no critic). */
export const CRITIC_ADAPTER = "critic";

export type RunConfig = z.output<typeof RunConfigSchema>;
export type RunConfigInput = z.input<typeof RunConfigSchema>;
export type AgentConfig = RunConfig["agents"][number];
export type TaskConfig = NonNullable<RunConfig["task"]>;
export type TaskEntryConfig = NonNullable<RunConfig["tasks"]>[number];
