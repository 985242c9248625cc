// The run config: one YAML file describes the team, the task, the algorithm and the schedule.
// Validated with zod at the edge; every field has a help line (CleanRL-style), unknown keys are
// errors, and an error names the exact path and what was expected:
//   agents[1].adapter.r: expected a positive integer, got "eight"
import { readFileSync } from "node:fs";
import { parse as parseYaml, parseDocument, stringify as stringifyYaml } from "yaml";
import { z } from "zod";

// ---------------------------------------------------------------------------------------------------
// small field helpers with human error messages

const posInt = (what = "a positive integer") =>
  z
    .number({ error: `expected ${what}` })
    .int({ error: `expected ${what}` })
    .positive({ error: `expected ${what}` });
const nonNegInt = () =>
  z
    .number({ error: "expected a non-negative integer" })
    .int({ error: "expected a non-negative integer" })
    .min(0, { error: "expected a non-negative integer" });
const posNum = () =>
  z.number({ error: "expected a positive number" }).positive({ error: "expected a positive number" });
const nonNegNum = () =>
  z.number({ error: "expected a non-negative number" }).min(0, { error: "expected a non-negative number" });
const unit = () =>
  z
    .number({ error: "expected a number in [0, 1]" })
    .min(0, { error: "expected a number in [0, 1]" })
    .max(1, { error: "expected a number in [0, 1]" });
const name = () =>
  z.string({ error: "expected a non-empty string" }).min(1, { error: "expected a non-empty string" });

// ---------------------------------------------------------------------------------------------------
// sections

const Engine = z
  .strictObject({
    url: z
      .url({ error: "expected a URL like http://host:port" })
      .optional()
      .describe(
        "URL of a running engine (e.g. on a GPU server); omitted: the CLI starts a local engine on loopback",
      ),
    tokenEnv: name()
      .default("MARFT_ENGINE_TOKEN")
      .describe("environment variable holding the bearer token of the engine at `url`"),
    device: z.enum(["auto", "cpu", "cuda"]).default("auto").describe("device of a locally started engine"),
    threads: posInt()
      .optional()
      .describe("torch CPU threads of a locally started engine (default: torch's choice)"),
  })
  .describe("where the compute engine runs");

const Base = z
  .strictObject({
    source: name().describe(
      "tiny:<preset> (random init, tests), hf:<local dir>, gguf:<file>, or pkg:smollm2-135m-instruct",
    ),
    dtype: z
      .enum(["auto", "float32", "bfloat16"])
      .default("auto")
      .describe(
        "auto: float32 on CPU, bf16 autocast on GPU; bfloat16: bf16 on either (fast on CPUs with AVX512_BF16/AMX)",
      ),
    seed: nonNegInt().default(0).describe("seed of a random-init (tiny:) base"),
  })
  .describe("a base model that agents (and the critic) put their LoRA adapters on");

/** LoRA on some transformer layers only (0-based, negative from the last); null: all layers. */
const layerList = (description: string) =>
  z
    .array(z.number({ error: "expected an integer" }).int({ error: "expected an integer" }))
    .min(1, { error: "expected at least one layer index" })
    .nullable()
    .default(null)
    .describe(description);

const Lora = z
  .strictObject({
    r: posInt().default(8).describe("LoRA rank"),
    alpha: posNum().default(16).describe("LoRA alpha (scale = alpha / r)"),
    dropout: z
      .number({ error: "expected a number in [0, 1)" })
      .min(0)
      .lt(1, { error: "expected a number in [0, 1)" })
      .default(0)
      .describe("LoRA dropout (keep 0 for bit-reproducible resume)"),
    targetModules: z
      .array(name())
      .min(1, { error: "expected at least one module name" })
      .default(["q_proj", "v_proj"])
      .describe("modules that get LoRA weights"),
    layers: layerList(
      "only these transformer layers get LoRA weights (0-based, negative from the last); null: all",
    ),
  })
  .describe("the agent's own LoRA adapter");

const SharedAdapter = z
  .strictObject({
    shared: name().describe("id of the agent whose adapter this agent shares (they train it together)"),
  })
  .describe("share another agent's adapter");

const Sampling = z
  .strictObject({
    temperature: nonNegNum()
      .default(1)
      .describe("sampling temperature (0 = greedy; a trainable agent needs > 0)"),
    topP: z
      .number({ error: "expected a number in (0, 1]" })
      .gt(0, { error: "expected a number in (0, 1]" })
      .max(1, { error: "expected a number in (0, 1]" })
      .default(1)
      .describe("nucleus sampling mass"),
    topK: nonNegInt().default(0).describe("top-k truncation (0 = off)"),
    maxNewTokens: posInt().default(64).describe("most tokens per action"),
    stop: z.array(z.string()).default([]).describe("stop strings; the action is cut before one"),
  })
  .describe("how the agent samples its actions");

const Agent = z
  .strictObject({
    id: z
      .string({ error: 'expected an agent id like "actor"' })
      .regex(/^[A-Za-z][A-Za-z0-9_-]*$/, {
        error: "expected an agent id of letters, digits, _ or - (starting with a letter)",
      })
      .describe("unique agent id (also its adapter's name)"),
    role: name().describe("the agent's role; tasks label its messages with it, per-role rewards key on it"),
    systemPrompt: z.string({ error: "expected a string" }).default("").describe("the agent's system prompt"),
    base: name().describe("name of the base model (a key of `bases`)"),
    adapter: z
      .union([SharedAdapter, Lora])
      .prefault({})
      .describe("own LoRA settings, or {shared: <agent id>}"),
    trainable: z
      .boolean({ error: "expected true or false" })
      .default(true)
      .describe("false: the agent acts but never updates"),
    sampling: Sampling.prefault({}),
    lr: posNum().default(1e-5).describe("policy learning rate (AdamW)"),
  })
  .describe("an agent profile (DESIGN §3)");

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

const SyntheticTask = <K extends string>(kind: K, what: string) =>
  z
    .strictObject({
      kind: z.literal(kind),
      trainSize: posInt().default(256).describe("number of generated training tasks"),
      evalSize: posInt().default(64).describe("number of generated held-out tasks"),
      options: z
        .record(z.string(), z.unknown())
        .default({})
        .describe("extra options passed to the task generator as they are"),
    })
    .describe(what);

const FileTask = <K extends string, E extends z.core.$ZodLooseShape>(kind: K, what: string, extra: E) =>
  z
    .strictObject({
      kind: z.literal(kind),
      trainFile: name().describe(
        "training problems (JSON / JSONL), relative to the config file's directory or absolute",
      ),
      evalFile: name()
        .optional()
        .describe("held-out problems; omitted: the last `evalSplit` training rows are held out"),
      evalSplit: nonNegInt().default(100).describe("rows held out of trainFile when there is no evalFile"),
      limit: posInt().optional().describe("use at most this many training problems"),
      evalLimit: posInt().optional().describe("evaluate on at most this many held-out problems"),
      ...extra,
    })
    .describe(what);

const Task = z
  .discriminatedUnion("kind", [
    SyntheticTask("secret", "synthetic: agent A sees a secret, agent B must state it"),
    SyntheticTask("parallel-vote", "synthetic: two solvers act concurrently, an aggregator answers"),
    SyntheticTask("orchestrated", "synthetic: an orchestrator names who acts, that agent answers"),
    FileTask("math", "math word problems with a LaTeX-aware answer check", {
      attempts: posInt()
        .default(1)
        .describe("attempts per problem; judge feedback after each (the reference: 3)"),
      options: z.record(z.string(), z.unknown()).default({}).describe("extra options of the math suite"),
    }),
    FileTask("code", "Python function tasks run against hidden tests in a sandbox", {
      attempts: posInt().default(1).describe("rounds per problem (e.g. reviewer may send the code back)"),
      timeoutMs: posInt().default(5000).describe("wall-clock limit per test run"),
      memoryMb: posInt().default(512).describe("memory limit per test run"),
      options: z.record(z.string(), z.unknown()).default({}).describe("extra options of the code suite"),
    }),
  ])
  .describe("the task family the team trains on");

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
        "take PPO's old log-probs from a forward pass instead of the sampler; auto: when the agent's base computes in bf16 (sampler and trainer then differ by about 0.03 per token)",
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
    evalEvery: nonNegInt().default(0).describe("evaluate every N iterations (0: only at the end)"),
    evalAtStart: z
      .boolean({ error: "expected true or false" })
      .default(false)
      .describe("evaluate before the first update too"),
    checkpointEvery: nonNegInt().default(0).describe("checkpoint every N iterations (0: only at the end)"),
    keepCheckpoints: posInt().default(3).describe("newest checkpoints kept on disk"),
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

const RunConfigObject = z.strictObject({
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
  task: Task,
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
  if (c.graph.kind === "edges") knownIds(c.graph.edges, ["graph", "edges"]);
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
  }
  if (c.algo.estimator === "critic-free" && c.train.samplesPerTask < 2)
    ctx.addIssue({
      code: "custom",
      path: ["train", "samplesPerTask"],
      message: "expected at least 2 samples per task for group-relative (critic-free) baselines",
      input: c.train.samplesPerTask,
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

export type RunConfig = z.output<typeof RunConfigSchema>;
export type RunConfigInput = z.input<typeof RunConfigSchema>;
export type AgentConfig = RunConfig["agents"][number];
export type TaskConfig = RunConfig["task"];

// ---------------------------------------------------------------------------------------------------
// errors

/** A config that does not validate; `issues` are one line each, `path: what was expected, got X`. */
export class ConfigError extends Error {
  constructor(
    readonly source: string,
    readonly issues: string[],
  ) {
    super(`${source}: invalid run config\n${issues.map((l) => `  ${l}`).join("\n")}`);
    this.name = "ConfigError";
  }
}

/** `agents[1].adapter.r` from ["agents", 1, "adapter", "r"]. */
export function formatPath(path: ReadonlyArray<PropertyKey>): string {
  let out = "";
  for (const p of path) {
    if (typeof p === "number") out += `[${p}]`;
    else if (typeof p === "string" && /^[A-Za-z_$][\w$-]*$/.test(p)) out += out ? `.${p}` : p;
    else out += `[${JSON.stringify(String(p))}]`;
  }
  return out || "(root)";
}

function show(v: unknown): string {
  if (v === undefined) return "nothing";
  if (v === null) return "null";
  if (Array.isArray(v)) return "a list";
  if (typeof v === "object") return "an object";
  const s = JSON.stringify(v);
  return s.length > 60 ? `${s.slice(0, 57)}...` : s;
}

type Issue = z.core.$ZodIssue;

/** One readable line per issue; for unions, the branch that came closest explains the error. */
function issueLines(issue: Issue, prefix: ReadonlyArray<PropertyKey> = []): string[] {
  const path = [...prefix, ...issue.path];
  const input = (issue as { input?: unknown }).input;
  switch (issue.code) {
    case "unrecognized_keys":
      return issue.keys.map((k) => `${formatPath([...path, k])}: unknown key`);
    case "invalid_union": {
      if ("discriminator" in issue && issue.discriminator !== undefined) {
        const opts = (issue as { options?: unknown[] }).options ?? [];
        const got =
          input && typeof input === "object"
            ? (input as Record<string, unknown>)[issue.discriminator]
            : input;
        return [
          `${formatPath(path)}: expected one of ${opts.map((o) => JSON.stringify(o)).join(" | ")}, got ${show(got)}`,
        ];
      }
      const branches = issue.errors.filter((b) => b.length > 0);
      if (branches.length === 0) return [`${formatPath(path)}: ${issue.message}`];
      const best = branches.reduce((a, b) => (b.length < a.length ? b : a));
      return best.flatMap((i) => issueLines(i, path));
    }
    case "invalid_type":
      if (input === undefined)
        return [
          `${formatPath(path)}: required (${issue.message.startsWith("expected") ? issue.message : `expected ${issue.expected}`})`,
        ];
      return [`${formatPath(path)}: ${issue.message}, got ${show(input)}`];
    case "custom":
      return [`${formatPath(path)}: ${issue.message}`];
    default:
      return [`${formatPath(path)}: ${issue.message}${input !== undefined ? `, got ${show(input)}` : ""}`];
  }
}

/** zod's generic messages, rephrased for the ones our schema does not customise. */
const errorMap: z.core.$ZodErrorMap = (iss) => {
  switch (iss.code) {
    case "invalid_type":
      return `expected ${iss.expected === "object" ? "a mapping" : iss.expected === "array" ? "a list" : `a ${iss.expected}`}`;
    case "invalid_value":
      return `expected ${iss.values.map((v) => JSON.stringify(v)).join(" | ")}`;
    case "too_small":
      return iss.origin === "array"
        ? `expected at least ${iss.minimum} item(s)`
        : `expected ${iss.inclusive ? ">=" : ">"} ${iss.minimum}`;
    case "too_big":
      return iss.origin === "array"
        ? `expected at most ${iss.maximum} item(s)`
        : `expected ${iss.inclusive ? "<=" : "<"} ${iss.maximum}`;
    case "invalid_format":
      return `expected a ${iss.format}`;
    default:
      return undefined;
  }
};

/** Validate a parsed YAML value; throws ConfigError naming every bad path. */
export function parseRunConfig(value: unknown, source = "config"): RunConfig {
  const r = RunConfigSchema.safeParse(value, { reportInput: true, error: errorMap });
  if (r.success) return r.data;
  throw new ConfigError(
    source,
    r.error.issues.flatMap((i) => issueLines(i)),
  );
}

// ---------------------------------------------------------------------------------------------------
// --set overrides

/** `agents[1].sampling.temperature` -> ["agents", 1, "sampling", "temperature"]. */
export function parseSetPath(path: string): Array<string | number> {
  const out: Array<string | number> = [];
  const re = /([^.[\]]+)|\[(\d+)\]/g;
  let consumed = "";
  for (let m = re.exec(path); m; m = re.exec(path)) {
    if (m[1] !== undefined) out.push(/^\d+$/.test(m[1]) ? Number(m[1]) : m[1]);
    else out.push(Number(m[2]));
    consumed += m[0];
  }
  if (out.length === 0 || consumed.length !== path.replaceAll(".", "").length)
    throw new Error(`--set: bad path "${path}"`);
  return out;
}

/**
 * Apply `path=value` overrides to a raw (unvalidated) config; values are YAML scalars or flow
 * collections (`--set train.iterations=5`, `--set graph={kind: parallel}`). Validation comes after.
 */
export function applySets(raw: unknown, sets: string[]): unknown {
  const root = structuredClone(raw ?? {}) as Record<string | number, unknown>;
  for (const s of sets) {
    const eq = s.indexOf("=");
    if (eq <= 0) throw new ConfigError("--set", [`expected path=value, got ${JSON.stringify(s)}`]);
    const path = parseSetPath(s.slice(0, eq));
    let value: unknown;
    try {
      value = parseYaml(s.slice(eq + 1));
    } catch (e) {
      throw new ConfigError("--set", [
        `${s.slice(0, eq)}: the value is not valid YAML (${(e as Error).message.split("\n")[0]})`,
      ]);
    }
    let node: Record<string | number, unknown> = root;
    for (let i = 0; i < path.length - 1; i++) {
      const k = path[i]!;
      const next = node[k];
      if (next === undefined || next === null || typeof next !== "object") {
        node[k] = typeof path[i + 1] === "number" ? [] : {};
      }
      node = node[k] as Record<string | number, unknown>;
    }
    node[path[path.length - 1]!] = value;
  }
  return root;
}

/** Read a YAML run config, apply overrides, validate. */
export function loadRunConfig(file: string, sets: string[] = []): RunConfig {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    throw new ConfigError(file, [
      `cannot read the file (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`,
    ]);
  }
  const doc = parseDocument(text, { prettyErrors: true });
  if (doc.errors.length > 0) {
    throw new ConfigError(
      file,
      doc.errors.map((e) => `YAML: ${e.message.split("\n")[0]}`),
    );
  }
  return parseRunConfig(applySets(doc.toJS(), sets), file);
}

/** The resolved config (defaults filled in) as YAML, for runs/<name>/config.yaml. */
export function configToYaml(c: RunConfig): string {
  return stringifyYaml(c, { lineWidth: 0 });
}

/** The JSON Schema of the run config, for editors (schemas/run-config.json). */
export function runConfigJsonSchema(): Record<string, unknown> {
  return z.toJSONSchema(RunConfigObject.describe("MARFT run config"), {
    io: "input",
    unrepresentable: "any",
  }) as Record<string, unknown>;
}

// ---------------------------------------------------------------------------------------------------
// derived facts the trainer needs

/** The adapter an agent samples with and trains: its own id, or the owner of a shared adapter. */
export function adapterOf(agent: AgentConfig): string {
  return "shared" in agent.adapter ? agent.adapter.shared : agent.id;
}

export const CRITIC_ADAPTER = "critic";
