// The rollout: many episodes in flight at once (DESIGN §3 "Asynchrony", §8).
//
// As soon as an agent is ready in any episode, its observation goes to the engine as its own `sample`
// call. The engine joins concurrent calls into one decode batch (adapters mixed, rows joining and
// leaving between decode steps), so batching happens there; one call per request is what lets each
// completion come back the moment it is done. (A call of many requests answers when its slowest row
// is done: the next agents of a sequential team would wait for the whole call, a "round" by another
// name.) When a completion comes back the env's `act` runs at once (answer checking, code execution),
// concurrently with the sampling of everyone else; when it finishes, newly ready agents are sent.
//
// Every action is recorded as a Turn with the exact prompt ids, response ids, log-probs and adapter
// version the engine returned. Per-action rewards read from `takeRewards()` after each act are added
// to each agent's latest turn (rewards accumulate until the agent's next action; the policy is in
// src/flexmg/types.ts); a reward for an agent that has not acted yet has no action to go to, and is
// an EnvContractError. When an episode ends, its outcome is recorded with it.
//
// Seeds: every sample request carries its own seed, derived from (rollout seed, episode, turn), and
// the engine makes a request's tokens depend on that seed alone, not on the batch it shares. With
// `deterministic: true` the rollout also fixes the grouping and order of calls and acts (lock step:
// all ready agents of all live episodes in one call, then their acts one by one in episode order),
// so that log-probs are bitwise reproducible on CPU too, at the cost of overlap.
import type { ComputeEngine, Schemas } from "../client/compute.ts";
import { EnvContractError } from "../errors.ts";
import type { AgentId, ChatMessage, Env } from "../flexmg/types.ts";
import { mixSeed } from "../rng.ts";
import type { Episode, Turn } from "./types.ts";

/** What the rollout needs to know to sample for an agent. */
export interface AgentProfile {
  /** Policy adapter name, or BASE_ADAPTER ("__base__") for the bare base (then give `base`). */
  adapter: string;
  base?: string;
  /** Engine sampling parameters (temperature 0 = greedy). `n` is ignored: one completion per turn. */
  sampling?: Schemas["SamplingParams"];
}

export interface RolloutProgress {
  episodesDone: number;
  episodes: number;
  turns: number;
  tokensSampled: number;
  engineCalls: number;
}

export interface RolloutOptions<Task> {
  engine: ComputeEngine;
  /** A fresh env per episode (e.g. `() => suite.makeEnv(agents, graph)`). */
  makeEnv: () => Env<Task>;
  tasks: readonly Task[];
  taskId: (task: Task) => string;
  /** Episodes per task; episodes of one task share a `group` (default 1). */
  samplesPerTask?: number;
  /** Sampling profile of every agent the env may make ready. */
  profiles: Record<AgentId, AgentProfile>;
  seed: number;
  /** Episodes alive at once (default 64). */
  maxConcurrentEpisodes?: number;
  /** Deterministic mode: requests per sample call (default 64). */
  maxBatchSize?: number;
  /** Lock-step mode with a fixed grouping of calls: bitwise reproducible given the seed (on CPU). */
  deterministic?: boolean;
  /** An episode that takes more actions than this is an env bug (default 1000). */
  maxActionsPerEpisode?: number;
  onProgress?: (p: RolloutProgress) => void;
}

export interface RolloutStats {
  episodes: number;
  turns: number;
  /** Response tokens sampled. */
  tokensSampled: number;
  seconds: number;
  tokensPerSecond: number;
  /** Number of `sample` calls. */
  engineCalls: number;
  /** The engine's sampler while this rollout ran (engine-wide: other clients' rows count too): rows
   * per decode step, decode steps, and wall seconds in prefills and in decode steps. */
  meanDecodeBatch: number;
  decodeSteps: number;
  prefillSeconds: number;
  decodeSeconds: number;
  /** Episodes that failed and are left out (app episodes: the app threw or timed out); absent for envs. */
  errors?: number;
}

type SamplerStats = Pick<
  Schemas["Stats"],
  "decode_steps" | "decode_rows" | "prefill_seconds" | "decode_seconds"
>;

/** What the engine's sampler did between two `stats()` readings, as RolloutStats reports it. */
export function samplerShare(
  before: SamplerStats,
  after: SamplerStats,
): Pick<RolloutStats, "meanDecodeBatch" | "decodeSteps" | "prefillSeconds" | "decodeSeconds"> {
  const steps = after.decode_steps - before.decode_steps;
  return {
    meanDecodeBatch: steps > 0 ? (after.decode_rows - before.decode_rows) / steps : 0,
    decodeSteps: steps,
    prefillSeconds: after.prefill_seconds - before.prefill_seconds,
    decodeSeconds: after.decode_seconds - before.decode_seconds,
  };
}

export interface RolloutResult {
  /** In a deterministic order: by task, then sample (index = task * samplesPerTask + sample). */
  episodes: Episode[];
  stats: RolloutStats;
}

interface Live<Task> {
  env: Env<Task>;
  episode: Episode;
  /** Agents requested or acting: not to be queued again until their act has finished. */
  busy: Set<AgentId>;
  actsInFlight: number;
  latest: Map<AgentId, Turn>;
  /** How many times each agent has been requested in this episode: part of its sample seed. */
  requested: Map<AgentId, number>;
  /** Requests queued so far in this episode: the next one's turn order. */
  queued: number;
  done: boolean;
}

interface Request<Task> {
  live: Live<Task>;
  agent: AgentId;
  messages: ChatMessage[];
  parents: AgentId[];
  step: number;
  seed: number;
  /** The turn's place in the episode: the order requests were queued (ready() order within a step). */
  order: number;
}

export async function rollout<Task>(opts: RolloutOptions<Task>): Promise<RolloutResult> {
  return new Rollout(opts).run();
}

class Rollout<Task> {
  private readonly n: number;
  private readonly total: number;
  private readonly maxEpisodes: number;
  private readonly maxBatch: number;
  private readonly maxActions: number;
  private readonly episodes: Episode[] = [];
  private next = 0;
  private active = 0;
  private doneCount = 0;
  private queue: Array<Request<Task>> = [];
  private flushScheduled = false;
  private failed = false;
  private resolve!: () => void;
  private reject!: (e: unknown) => void;
  private readonly stats = {
    turns: 0,
    tokensSampled: 0,
    engineCalls: 0,
  };

  constructor(private readonly opts: RolloutOptions<Task>) {
    this.n = opts.samplesPerTask ?? 1;
    if (!Number.isInteger(this.n) || this.n < 1) {
      throw new Error(`rollout.samplesPerTask: expected a positive integer, got ${opts.samplesPerTask}`);
    }
    this.total = opts.tasks.length * this.n;
    this.maxEpisodes = opts.maxConcurrentEpisodes ?? 64;
    this.maxBatch = opts.maxBatchSize ?? 64;
    this.maxActions = opts.maxActionsPerEpisode ?? 1000;
  }

  async run(): Promise<RolloutResult> {
    const t0 = performance.now();
    const before = await this.opts.engine.stats();
    if (this.total > 0) {
      const probe = this.opts.makeEnv();
      const missing = probe.agents.filter((a) => !this.opts.profiles[a]);
      if (missing.length > 0)
        throw new Error(`rollout.profiles: no sampling profile for agent(s) ${missing.join(", ")}`);
      if (this.opts.deterministic) await this.runLockStep();
      else await this.runAsync();
    }
    const seconds = (performance.now() - t0) / 1000;
    const after = await this.opts.engine.stats();
    const s = this.stats;
    return {
      episodes: this.episodes,
      stats: {
        episodes: this.total,
        turns: s.turns,
        tokensSampled: s.tokensSampled,
        seconds,
        tokensPerSecond: seconds > 0 ? s.tokensSampled / seconds : 0,
        engineCalls: s.engineCalls,
        ...samplerShare(before, after),
      },
    };
  }

  // ------------------------------------------------------------------------------------------------
  // episodes

  private async startEpisode(index: number): Promise<Live<Task>> {
    const taskIndex = Math.floor(index / this.n);
    const task = this.opts.tasks[taskIndex]!;
    const seed = mixSeed(this.opts.seed, index, 1);
    const env = this.opts.makeEnv();
    const episode: Episode = {
      index,
      taskId: this.opts.taskId(task),
      group: taskIndex,
      seed,
      turns: [],
      terminated: false,
      truncated: false,
      outcome: { correct: false, score: 0, teamReward: 0, roleRewards: {} },
      info: {},
      transcript: [],
    };
    this.episodes[index] = episode;
    const live: Live<Task> = {
      env,
      episode,
      busy: new Set(),
      actsInFlight: 0,
      latest: new Map(),
      requested: new Map(),
      queued: 0,
      done: false,
    };
    await env.reset(task, seed);
    this.credit(live); // a reward at reset has no action to go to: an env bug, refused
    return live;
  }

  /** Queues a request for every ready agent of the episode that is not already requested or acting. */
  private collect(live: Live<Task>): void {
    if (live.done) return;
    const { env, episode } = live;
    for (const agent of env.ready()) {
      if (live.busy.has(agent)) continue;
      live.busy.add(agent);
      // The seed depends on (episode, agent, k-th request of that agent), never on timing.
      const k = live.requested.get(agent) ?? 0;
      live.requested.set(agent, k + 1);
      this.queue.push({
        live,
        agent,
        messages: env.observe(agent),
        parents: env.parents(agent),
        step: env.step(),
        seed: mixSeed(this.opts.seed, episode.index, 2, env.agents.indexOf(agent), k),
        order: live.queued++,
      });
    }
  }

  /** Adds rewards to each agent's latest turn. */
  private credit(live: Live<Task>): void {
    const rewards = live.env.takeRewards();
    for (const [agent, r] of Object.entries(rewards)) {
      if (r === 0) continue;
      const turn = live.latest.get(agent);
      if (turn) turn.reward += r;
      else
        throw new EnvContractError(
          `episode ${live.episode.index} (task ${live.episode.taskId}): takeRewards() gave agent "${agent}" a reward of ${r} before its first action; per-action rewards are for an action the agent took`,
        );
    }
  }

  /** Finishes the episode if it is over and nothing is pending; returns whether it is done. */
  private finishIfOver(live: Live<Task>): boolean {
    if (live.done) return true;
    const { env, episode } = live;
    if (live.actsInFlight > 0 || live.busy.size > 0) return false;
    if (!(env.terminated || env.truncated)) {
      if (env.ready().length === 0) {
        throw new EnvContractError(
          `episode ${episode.index} (task ${episode.taskId}): ready() is empty with no act pending, but the episode is neither terminated nor truncated`,
        );
      }
      return false;
    }
    this.credit(live);
    // Completions of parallel agents come back in any order; turns keep the order they were queued
    // in (dependency order, then ready() order), which the estimators read as the order of actions.
    episode.turns.sort((a, b) => a.order - b.order);
    episode.terminated = env.terminated;
    episode.truncated = env.truncated;
    episode.outcome = env.outcome();
    episode.info = env.info();
    episode.transcript = env.state().map((m) => ({ role: m.role, content: m.content }));
    live.done = true;
    this.doneCount++;
    this.opts.onProgress?.({
      episodesDone: this.doneCount,
      episodes: this.total,
      turns: this.stats.turns,
      tokensSampled: this.stats.tokensSampled,
      engineCalls: this.stats.engineCalls,
    });
    return true;
  }

  // ------------------------------------------------------------------------------------------------
  // engine

  private async sample(batch: Array<Request<Task>>): Promise<Schemas["SampleResponse"]> {
    const requests = batch.map((r) => {
      const p = this.opts.profiles[r.agent]!;
      // `seed` per request: its tokens depend on it alone, whatever batch it shares.
      const req: Schemas["SampleRequest"] = {
        adapter: p.adapter,
        messages: r.messages,
        sampling: { ...p.sampling, n: 1 },
        seed: r.seed,
      };
      if (p.base !== undefined) req.base = p.base;
      return req;
    });
    this.stats.engineCalls++;
    const res = await this.opts.engine.sample({ requests, seed: batch[0]!.seed });
    if (res.results.length !== batch.length) {
      throw new Error(`sample: sent ${batch.length} requests, got ${res.results.length} results`);
    }
    return res;
  }

  /** Records the turn and starts the env's act; returns the act's promise. */
  private act(r: Request<Task>, result: Schemas["SampleResult"]): Promise<void> {
    const live = r.live;
    const c = result.completions[0];
    if (!c) throw new Error(`sample: no completion for agent ${r.agent} of episode ${live.episode.index}`);
    const temperature = this.opts.profiles[r.agent]!.sampling?.temperature ?? 1;
    const turn: Turn = {
      order: r.order,
      step: r.step,
      agent: r.agent,
      parents: r.parents,
      adapter: result.adapter,
      adapterVersion: result.adapter_version,
      // Greedy sampling reports log-probs at temperature 1 (engine schema).
      temperature: temperature > 0 ? temperature : 1,
      promptIds: result.prompt_ids,
      responseIds: c.response_ids,
      logprobs: c.logprobs,
      text: c.text,
      finishReason: c.finish_reason,
      reward: 0,
    };
    live.episode.turns.push(turn);
    live.latest.set(r.agent, turn);
    this.stats.turns++;
    this.stats.tokensSampled += c.response_ids.length;
    if (live.episode.turns.length > this.maxActions) {
      throw new Error(
        `episode ${live.episode.index} (task ${live.episode.taskId}) took more than ${this.maxActions} actions: does the env ever end?`,
      );
    }
    live.actsInFlight++;
    return live.env.act(r.agent, c.text).finally(() => {
      live.actsInFlight--;
      live.busy.delete(r.agent);
    });
  }

  // ------------------------------------------------------------------------------------------------
  // asynchronous mode

  private runAsync(): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
      this.startMore();
    });
  }

  private fail(e: unknown): void {
    if (this.failed) return;
    this.failed = true;
    this.reject(e);
  }

  private guard(f: () => void): void {
    if (this.failed) return;
    try {
      f();
    } catch (e) {
      this.fail(e);
    }
  }

  private startMore(): void {
    while (this.active < this.maxEpisodes && this.next < this.total) {
      const index = this.next++;
      this.active++;
      this.startEpisode(index).then(
        (live) => this.guard(() => this.advance(live)),
        (e) => this.fail(e),
      );
    }
    if (this.doneCount === this.total) this.resolve();
  }

  /** After a reset or an act: finish the episode, or queue its newly ready agents. */
  private advance(live: Live<Task>): void {
    if (this.finishIfOver(live)) {
      this.active--;
      this.startMore();
      return;
    }
    this.collect(live);
    this.flushSoon();
  }

  /** Everything queued in this tick goes out after it (one call per request). */
  private flushSoon(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    setImmediate(() => {
      this.flushScheduled = false;
      this.guard(() => this.flush());
    });
  }

  private flush(): void {
    for (const r of this.queue.splice(0)) {
      this.sample([r]).then(
        (res) =>
          this.guard(() =>
            this.act(r, res.results[0]!).then(
              () =>
                this.guard(() => {
                  this.credit(r.live);
                  this.advance(r.live);
                }),
              (e) => this.fail(e),
            ),
          ),
        (e) => this.fail(e),
      );
    }
  }

  // ------------------------------------------------------------------------------------------------
  // deterministic (lock-step) mode

  private async runLockStep(): Promise<void> {
    const live: Array<Live<Task>> = [];
    const refill = async () => {
      while (live.length < this.maxEpisodes && this.next < this.total) {
        const l = await this.startEpisode(this.next++);
        if (!this.finishIfOver(l)) live.push(l);
      }
    };
    await refill();
    while (live.length > 0) {
      for (const l of live) this.collect(l);
      const round = this.queue;
      this.queue = [];
      if (round.length === 0) {
        throw new EnvContractError("rollout: live episodes but no agent is ready (an env bug)");
      }
      for (let i = 0; i < round.length; i += this.maxBatch) {
        const batch = round.slice(i, i + this.maxBatch);
        const res = await this.sample(batch);
        // Acts one at a time, in episode then topological order: env work that depends on timing
        // (async answer checks) cannot reorder anything.
        for (const [j, r] of batch.entries()) {
          await this.act(r, res.results[j]!);
          this.credit(r.live);
        }
      }
      for (let i = live.length - 1; i >= 0; i--) if (this.finishIfOver(live[i]!)) live.splice(i, 1);
      await refill();
    }
  }
}
