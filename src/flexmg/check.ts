// checkEnv: a conformance checker for the Env contract of types.ts (PettingZoo's api_test, adapted to
// concurrent agents). It drives fresh envs with seeded random (or scripted) actions and returns the
// problems it found; an empty list means conformant.
import { seededRng } from "../rng.ts";
import type { AgentId, ChatMessage, Env, Outcome } from "./types.ts";

export interface CheckEnvOptions {
  /** Seeds to run every task with (default [0, 1]). */
  seeds?: number[];
  /** An episode must end within this many actions (default 200). */
  maxActions?: number;
  /**
   * Chooses an action. Default: a random pick from `vocabulary`, plus the agent ids (so that an
   * orchestrator's output sometimes names an agent).
   */
  policy?: (ctx: { agent: AgentId; observation: ChatMessage[]; rng: () => number; env: Env }) => string;
  /** Words the default policy picks from (default: single letters, digits and a few words). */
  vocabulary?: string[];
  /** Whether an episode may end both terminated and truncated (default false). */
  allowTerminatedAndTruncated?: boolean;
}

interface Trace {
  events: string[];
  rewards: Record<AgentId, number>;
}

const DEFAULT_VOCAB = ["a", "b", "c", "d", "1", "2", "yes", "no", "\\boxed{1}", "The answer is 2."];

function isChat(x: unknown): x is ChatMessage[] {
  return (
    Array.isArray(x) &&
    x.length > 0 &&
    x.every(
      (m) =>
        typeof m === "object" &&
        m !== null &&
        ["system", "user", "assistant"].includes((m as ChatMessage).role) &&
        typeof (m as ChatMessage).content === "string",
    )
  );
}

function throws(f: () => unknown): boolean {
  try {
    f();
    return false;
  } catch {
    return true;
  }
}

async function rejects(f: () => Promise<unknown>): Promise<boolean> {
  try {
    await f();
    return false;
  } catch {
    return true;
  }
}

/**
 * Runs one episode, recording problems and a trace of everything observable (for the determinism
 * check). Acts for all ready agents concurrently, in a seeded random order of starting.
 */
async function runEpisode<T>(
  env: Env<T>,
  task: T,
  seed: number,
  opts: Required<Omit<CheckEnvOptions, "policy">> & Pick<CheckEnvOptions, "policy">,
  problems: string[],
  where: string,
): Promise<Trace> {
  const trace: Trace = { events: [], rewards: {} };
  const problem = (msg: string) => problems.push(`${where}: ${msg}`);
  const agents = new Set(env.agents);
  const rng = seededRng(seed * 7919 + 17);
  const vocab = [...opts.vocabulary, ...env.agents];
  const choose = (agent: AgentId, observation: ChatMessage[]) =>
    opts.policy
      ? opts.policy({ agent, observation, rng, env: env as Env })
      : vocab[Math.floor(rng() * vocab.length)]!;

  await env.reset(task, seed);
  const collect = (after: string) => {
    const r = env.takeRewards();
    for (const [a, v] of Object.entries(r)) {
      if (!agents.has(a)) problem(`takeRewards() after ${after} names unknown agent "${a}"`);
      if (typeof v !== "number" || !Number.isFinite(v)) problem(`reward for "${a}" is not finite: ${v}`);
      trace.rewards[a] = (trace.rewards[a] ?? 0) + v;
      trace.events.push(`reward ${a} ${v}`);
    }
    const again = env.takeRewards();
    if (Object.values(again).some((v) => v !== 0))
      problem("takeRewards() twice in a row returned rewards twice");
  };
  collect("reset");
  if (env.step() !== 0) problem(`step() after reset is ${env.step()}, expected 0`);
  if (!(env.terminated || env.truncated) && !throws(() => env.outcome()))
    problem("outcome() before the episode ended did not throw");

  let actions = 0;
  let lastState = env.state().length;
  let lastStep = env.step();
  const over = () => env.terminated || env.truncated;
  while (!over()) {
    const ready = env.ready();
    trace.events.push(`ready ${ready.join(",")} step ${env.step()}`);
    if (ready.length === 0) {
      problem("ready() is empty but the episode is neither terminated nor truncated (and no act is pending)");
      break;
    }
    if (new Set(ready).size !== ready.length) problem(`ready() has duplicates: ${ready.join(",")}`);
    for (const a of ready) if (!agents.has(a)) problem(`ready() names unknown agent "${a}"`);
    // Agents that are not ready must be refused.
    for (const a of env.agents) {
      if (ready.includes(a)) continue;
      if (!throws(() => env.observe(a))) problem(`observe("${a}") for a non-ready agent did not throw`);
      if (!(await rejects(() => env.act(a, "x")))) problem(`act("${a}") for a non-ready agent did not throw`);
    }
    if (!throws(() => env.observe("__no_such_agent__")))
      problem("observe() of an unknown agent did not throw");
    const chosen: Array<[AgentId, string]> = [];
    for (const a of ready) {
      let obs: ChatMessage[];
      try {
        obs = env.observe(a);
      } catch (e) {
        problem(`observe("${a}") of a ready agent threw: ${(e as Error).message}`);
        return trace;
      }
      if (!isChat(obs)) problem(`observe("${a}") is not a non-empty ChatMessage[]`);
      const parents = env.parents(a);
      if (parents.includes(a)) problem(`parents("${a}") contains the agent itself`);
      for (const p of parents) if (!agents.has(p)) problem(`parents("${a}") names unknown agent "${p}"`);
      trace.events.push(`obs ${a} <- [${parents.join(",")}] ${JSON.stringify(obs)}`);
      chosen.push([a, choose(a, obs)]);
    }
    // Concurrent acts, started in a seeded random order: the env must cope with any interleaving.
    const order = chosen.map((_c, i) => [rng(), i] as const).sort((x, y) => x[0] - y[0]);
    const pending = order.map(([, i]) => {
      const [a, text] = chosen[i]!;
      trace.events.push(`act ${a} ${JSON.stringify(text)}`);
      return env.act(a, text);
    });
    try {
      await Promise.all(pending);
    } catch (e) {
      problem(`act() of a ready agent threw: ${(e as Error).message}`);
      return trace;
    }
    // Acting again for the same agents in the same step must be refused unless they are ready again.
    for (const [a] of chosen) {
      if (!env.ready().includes(a) && !(await rejects(() => env.act(a, "x")))) {
        problem(`act("${a}") for an agent that is not ready did not throw`);
      }
    }
    actions += chosen.length;
    collect(`acting ${chosen.map(([a]) => a).join(",")}`);
    const s = env.state();
    if (!isChat(s)) problem("state() is not a non-empty ChatMessage[]");
    if (s.length <= lastState) problem(`state() did not grow after an act (${lastState} -> ${s.length})`);
    lastState = s.length;
    const step = env.step();
    if (!Number.isInteger(step) || step < lastStep) problem(`step() went from ${lastStep} to ${step}`);
    lastStep = step;
    if (actions > opts.maxActions) {
      problem(`the episode did not end within ${opts.maxActions} actions`);
      break;
    }
  }
  if (env.terminated && env.truncated && !opts.allowTerminatedAndTruncated) {
    problem("the episode is both terminated and truncated");
  }
  if (over()) {
    if (env.ready().length !== 0) problem("ready() is not empty after the episode ended");
    const someone = env.agents[0]!;
    if (!throws(() => env.observe(someone))) problem("observe() after the episode ended did not throw");
    if (!(await rejects(() => env.act(someone, "x")))) problem("act() after the episode ended did not throw");
    let outcome: Outcome | undefined;
    try {
      outcome = env.outcome();
    } catch (e) {
      problem(`outcome() after the episode ended threw: ${(e as Error).message}`);
    }
    if (outcome) for (const p of outcomeProblems(outcome)) problem(p);
    trace.events.push(`end ${env.terminated} ${env.truncated} ${JSON.stringify(outcome)}`);
    trace.events.push(`info ${JSON.stringify(env.info())}`);
    trace.events.push(`state ${JSON.stringify(env.state())}`);
  }
  return trace;
}

/** What is wrong with an episode's outcome (empty when nothing is). */
export function outcomeProblems(o: Outcome): string[] {
  const out: string[] = [];
  if (typeof o.correct !== "boolean") out.push(`outcome().correct is not a boolean: ${String(o.correct)}`);
  if (typeof o.score !== "number" || !(o.score >= 0 && o.score <= 1))
    out.push(`outcome().score is not a number in [0, 1]: ${String(o.score)}`);
  if (typeof o.teamReward !== "number" || !Number.isFinite(o.teamReward))
    out.push(`outcome().teamReward is not a finite number: ${String(o.teamReward)}`);
  if (typeof o.roleRewards !== "object" || o.roleRewards === null) {
    out.push("outcome().roleRewards is not an object of role -> reward");
  } else {
    for (const [role, r] of Object.entries(o.roleRewards)) {
      if (typeof r !== "number" || !Number.isFinite(r))
        out.push(`outcome().roleRewards["${role}"] is not a finite number: ${String(r)}`);
    }
  }
  return out;
}

/**
 * Checks the Env contract on every task and seed: each episode runs on a fresh env, then again on a
 * fresh env (determinism), then on the first env once more (reset must start a clean episode).
 */
export async function checkEnv<T>(
  makeEnv: () => Env<T>,
  tasks: T[],
  options: CheckEnvOptions = {},
): Promise<string[]> {
  const opts = {
    seeds: options.seeds ?? [0, 1],
    maxActions: options.maxActions ?? 200,
    vocabulary: options.vocabulary ?? DEFAULT_VOCAB,
    allowTerminatedAndTruncated: options.allowTerminatedAndTruncated ?? false,
    policy: options.policy,
  };
  const problems: string[] = [];
  if (tasks.length === 0) problems.push("no tasks to check");
  for (const [t, task] of tasks.entries()) {
    for (const seed of opts.seeds) {
      const where = `task ${t}, seed ${seed}`;
      const env = makeEnv();
      if (env.agents.length === 0) problems.push(`${where}: env.agents is empty`);
      const first = await runEpisode(env, task, seed, opts, problems, where);
      const second = await runEpisode(makeEnv(), task, seed, opts, [], where);
      const reused = await runEpisode(env, task, seed, opts, [], where);
      if (JSON.stringify(first) !== JSON.stringify(second)) {
        problems.push(`${where}: not deterministic: two fresh envs with the same task and seed differ`);
      } else if (JSON.stringify(first) !== JSON.stringify(reused)) {
        problems.push(`${where}: reset() on a used env does not reproduce a fresh env's episode`);
      }
    }
  }
  return problems;
}
