// The built-in variants of `marft compare`: the paper's comparisons and ablations as transforms of a
// validated run config. Each changes only what its name says; the compare job then sets the seed,
// the budget and the evaluation the same way for all, and validates the result again.
import { adapterOf } from "../config/derived.ts";
import { applyOverrides, parseRunConfig } from "../config/load.ts";
import { type AgentConfig, type RunConfig, RunConfigObject } from "../config/schema.ts";
import { ConfigError } from "../errors.ts";

interface Builtin {
  /** One line for the report. */
  about: string;
  apply: (c: RunConfig, o: { neutralPrompt: string }) => RunConfig;
}

/** A graph variant applied to the run's graph and to every task's own graph. */
function withGraph(c: RunConfig, kind: "parallel" | "sequential"): RunConfig {
  return {
    ...c,
    graph: { kind },
    ...(c.tasks ? { tasks: c.tasks.map((t) => ({ ...t, graph: { kind } })) } : {}),
  };
}

function withCritic(c: RunConfig): RunConfig["critic"] {
  return c.critic ?? RunConfigObject.shape.critic.unwrap().parse({ base: c.agents[0]!.base });
}

/** The last agent alone: its prompt, model, LoRA, sampling and learning rate; the rest of the run as is. */
function singleAgent(c: RunConfig): RunConfig {
  const last = c.agents.at(-1)!;
  const owner = c.agents.find((a) => a.id === adapterOf(last))!;
  const hasSteps = (t: RunConfig["task"]) => t?.kind === "math" && t.options.stepRoles !== undefined;
  // where other roles computed steps, the single agent writes them all: a step agent's stop at a
  // newline would cut it after the first (configs/demo-baseline.yaml says what that costs)
  const steps = [c.task, ...(c.tasks ?? []).map((t) => t.task)].some(hasSteps);
  const sampling = steps ? { ...last.sampling, stop: [] } : last.sampling;
  const agent: AgentConfig = { ...last, adapter: owner.adapter, sampling };
  const r = c.algo.rewardRouting;
  const routing =
    r.kind === "per-role" && last.role in r.roles
      ? { kind: "per-role" as const, roles: { [last.role]: r.roles[last.role]! } }
      : r.kind === "per-role"
        ? { kind: "team" as const }
        : r;
  const normalize = Array.isArray(c.algo.normalize) ? c.algo.normalize.includes(last.id) : c.algo.normalize;
  const graph = (g: RunConfig["graph"]): RunConfig["graph"] =>
    g.kind === "dynamic" ? g : { kind: "sequential" };
  const { turns: _turns, ...train } = c.train;
  // the single agent answers alone: step rewards for the roles that computed intermediate results go,
  // and it sees the whole problem, not a part of it
  const solo = <T extends RunConfig["task"]>(t: T): T => {
    if (t?.kind !== "math" || !hasSteps(t)) return t;
    const { stepRoles: _steps, splitParts: _parts, ...options } = t.options;
    return { ...t, options };
  };
  return {
    ...c,
    agents: [agent],
    graph: graph(c.graph),
    ...(c.task ? { task: solo(c.task) } : {}),
    ...(c.tasks
      ? {
          tasks: c.tasks.map((t) => ({
            ...t,
            task: solo(t.task),
            ...(t.graph ? { graph: graph(t.graph) } : {}),
          })),
        }
      : {}),
    algo: { ...c.algo, rewardRouting: routing, normalize },
    train: { ...train, schedule: "joint" },
  };
}

/** One LoRA for the whole team: every agent shares the first agent's adapter. */
function sharedAdapter(c: RunConfig): RunConfig {
  const owner = c.agents[0]!;
  for (const a of c.agents) {
    if (a.base !== owner.base || a.trainable !== owner.trainable) {
      throw new ConfigError("variant shared-adapter", [
        `agent ${a.id} is on base ${a.base}${a.trainable ? "" : " (frozen)"} and agent ${owner.id} on ${owner.base}${owner.trainable ? "" : " (frozen)"}: one adapter needs one base and one trainable setting`,
      ]);
    }
  }
  return {
    ...c,
    agents: c.agents.map((a, i) => (i === 0 ? a : { ...a, adapter: { shared: owner.id } })),
  };
}

export const BUILTIN_VARIANTS = {
  team: { about: "the base config as it is", apply: (c) => c },
  "single-agent": {
    about: "the last agent alone: same model, LoRA, PPO settings and budget",
    apply: singleAgent,
  },
  untrained: { about: "no training: the team as initialised, evaluated", apply: (c) => c },
  "marft-a": {
    about: "action-level GAE with the centralized critic (MARFT-A)",
    apply: (c) => ({ ...c, algo: { ...c.algo, estimator: "marft-a" }, critic: withCritic(c) }),
  },
  "marft-t": {
    about: "token-level GAE with the centralized critic (MARFT-T)",
    apply: (c) => ({ ...c, algo: { ...c.algo, estimator: "marft-t" }, critic: withCritic(c) }),
  },
  "critic-free": {
    about: "group-relative baselines, no critic (at least 2 samples per task)",
    apply: (c) => ({
      ...c,
      algo: { ...c.algo, estimator: "critic-free" },
      train: { ...c.train, samplesPerTask: Math.max(2, c.train.samplesPerTask) },
    }),
  },
  anonymous: {
    about: "profiles off: one neutral system prompt for every agent, agents named by position, not role",
    apply: (c, o) => ({
      ...c,
      agents: c.agents.map((a, i) => ({ ...a, systemPrompt: o.neutralPrompt, label: `agent ${i + 1}` })),
    }),
  },
  parallel: {
    about: "every agent acts at once, seeing nobody's action",
    apply: (c) => withGraph(c, "parallel"),
  },
  sequential: { about: "each agent sees the agents before it", apply: (c) => withGraph(c, "sequential") },
  lockstep: {
    about: "the rollout in lock step (all ready agents, one call, acts in order) instead of asynchronous",
    apply: (c) => ({ ...c, train: { ...c.train, deterministic: true } }),
  },
  async: {
    about: "the asynchronous rollout (each agent as soon as its parents are done)",
    apply: (c) => ({ ...c, train: { ...c.train, deterministic: false } }),
  },
  "shared-adapter": { about: "one LoRA adapter for all agents", apply: sharedAdapter },
} satisfies Record<string, Builtin>;

export type BuiltinName = keyof typeof BUILTIN_VARIANTS;
export const BUILTIN_NAMES = Object.keys(BUILTIN_VARIANTS) as [BuiltinName, ...BuiltinName[]];

/** A variant as the compare job runs it. */
export interface ResolvedVariant {
  name: string;
  about: string;
  /** No training: the cell only evaluates the initial team. */
  untrained: boolean;
  /** The variant's config before the compare job's seed, budget and evaluation. */
  config: RunConfig;
}

/** Built-in transform, then the variant's own overrides; validated, errors naming the variant. */
export function resolveVariant(
  base: RunConfig,
  v: { name: string; builtin: BuiltinName; set: Readonly<Record<string, unknown>> },
  o: { neutralPrompt: string },
): ResolvedVariant {
  const b = BUILTIN_VARIANTS[v.builtin];
  const where = `variant ${v.name}`;
  const transformed = b.apply(base, o);
  const config = parseRunConfig(applyOverrides(transformed, v.set), where);
  const sets = Object.entries(v.set).map(([k, x]) => `${k}=${JSON.stringify(x)}`);
  return {
    name: v.name,
    about: [v.builtin === "team" && sets.length > 0 ? "" : b.about, ...sets].filter(Boolean).join("; "),
    untrained: v.builtin === "untrained",
    config,
  };
}

/** The fields two configs differ in, `path: a -> b`, for the report (what a variant changed). */
export function configDiff(a: unknown, b: unknown, path = ""): string[] {
  if (JSON.stringify(a) === JSON.stringify(b)) return [];
  const isObj = (x: unknown): x is Record<string, unknown> => typeof x === "object" && x !== null;
  if (isObj(a) && isObj(b) && Array.isArray(a) === Array.isArray(b)) {
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])];
    return keys.flatMap((k) =>
      configDiff(a[k], b[k], Array.isArray(a) ? `${path}[${k}]` : path ? `${path}.${k}` : k),
    );
  }
  const show = (x: unknown) => (x === undefined ? "(none)" : JSON.stringify(x));
  return [`${path}: ${show(a)} -> ${show(b)}`];
}
