// An unmodified agent app as a source of episodes (src/train/episodes.ts, `EpisodeSource`).
//
// One episode is one call of the app's `run(task, context)`: the app talks to the gateway with the
// context's baseURL, apiKey and headers (the `x-marft-episode` header names the episode), and
// returns its reward. The gateway recorded every call as a turn: the exact prompt and response ids,
// log-probs, adapter version and parents. Those turns, in the order they finished, become the
// episode's `Turn`s, and the reward its `Outcome`, so the trainer's steps, credit assignment and
// updates run on them unchanged.
//
// Episodes run concurrently, up to train.maxConcurrentEpisodes. A run that throws, times out
// (task.timeoutSeconds), returns something that is not a reward, or records no turn is an error
// episode: it is counted (`episodes/errors`) and logged with its message, never trained on, and the
// rollout goes on. Its episode is closed first, so calls the app still makes are refused (409) and
// cannot leak into another episode. A rollout whose episodes all failed stops the run: there is
// nothing to train on, and an app that always fails is a bug to fix, not to train through.
import { z } from "zod";
import type { Turn } from "../rollout/types.ts";
import { type Episode, type RolloutResult, samplerShare } from "../rollout/index.ts";
import { mixSeed } from "../rng.ts";
import type { EpisodeSource } from "../train/episodes.ts";
import type { RecordedTurn } from "../gateway/episodes.ts";
import { EPISODE_HEADER, type Gateway } from "../gateway/server.ts";

/** What `run` returns: the team reward, or the team reward with per-role rewards (and, optionally, success). */
export type AppReward =
  | number
  | {
      teamReward: number;
      /** role -> reward, for per-role routing (algo.rewardRouting) */
      roleRewards?: Record<string, number>;
      /** solved (evaluation's accuracy); default: teamReward >= 1 */
      correct?: boolean;
      /** in [0, 1] (evaluation's mean score); default: teamReward */
      score?: number;
    };

/** What one run of the app gets: where the gateway is and which episode it is playing. */
export interface AppContext {
  /** The gateway's base URL, e.g. http://127.0.0.1:41234/v1 (the SDKs' baseURL). */
  baseURL: string;
  /** The gateway's token (the SDKs' apiKey). */
  apiKey: string;
  /** Headers every call of this episode must carry: `x-marft-episode`. */
  headers: Record<string, string>;
  /** The episode id (the value of that header). */
  episode: string;
  /** Aborted when the episode times out; pass it on to stop waiting for calls that no longer count. */
  signal: AbortSignal;
  /** True when the episode is an evaluation (the gateway decodes greedily). */
  evaluation: boolean;
}

export type AppRun<Task> = (task: Task, context: AppContext) => AppReward | Promise<AppReward>;

const finite = z.number().refine(Number.isFinite, { error: "expected a finite number" });
const RewardSchema = z.union([
  finite,
  z.strictObject({
    teamReward: finite,
    roleRewards: z.record(z.string(), finite).optional(),
    correct: z.boolean().optional(),
    score: finite.optional(),
  }),
]);

export interface AppSourceOptions<Task> {
  name: string;
  train: Task[];
  eval: Task[];
  run: AppRun<Task>;
  gateway: Gateway;
  /** The gateway's token, handed to the app as its apiKey. */
  token: string;
  taskId?: (task: Task, index: number) => string;
  /** An app run that takes longer is an error episode. */
  timeoutMs: number;
  log?: (line: string) => void;
}

/** The default task id: the task's own `id` when it has one, else its position in its list. */
export function defaultTaskId(task: unknown, index: number): string {
  if (task && typeof task === "object" && "id" in task) {
    const id = (task as { id: unknown }).id;
    if (typeof id === "string" || typeof id === "number") return String(id);
  }
  return `task-${index}`;
}

class AppEpisodeError extends Error {}

export function appSource<Task>(o: AppSourceOptions<Task>): EpisodeSource {
  const log = o.log ?? (() => {});
  const taskId = (t: Task) => {
    const i = o.train.indexOf(t);
    return (o.taskId ?? defaultTaskId)(t, i >= 0 ? i : o.eval.indexOf(t));
  };
  let rollouts = 0;
  return {
    name: o.name,
    train: o.train,
    eval: o.eval,
    async play(r): Promise<RolloutResult> {
      const t0 = performance.now();
      o.gateway.engine = r.engine; // the trainer may have restarted the engine
      const before = await r.engine.stats();
      const tasks = r.tasks as Task[];
      const n = r.samplesPerTask;
      const total = tasks.length * n;
      const prefix = `r${rollouts++}-${Math.random().toString(36).slice(2, 8)}`;
      const limit = Math.max(1, r.config.train.maxConcurrentEpisodes);
      const results: Array<Episode | null> = new Array(total).fill(null);
      const errors: string[] = [];
      let next = 0;
      let done = 0;

      const one = async (index: number): Promise<void> => {
        const task = tasks[Math.floor(index / n)]!;
        const id = `${prefix}-${index}`;
        const seed = mixSeed(r.seed, index, 1);
        o.gateway.episodes.open(id, { greedy: r.greedy === true, seed });
        try {
          const reward = await runWithTimeout(
            o.run,
            task,
            {
              baseURL: o.gateway.url,
              apiKey: o.token,
              headers: { [EPISODE_HEADER]: id },
              episode: id,
              evaluation: r.greedy === true,
            },
            o.timeoutMs,
          );
          const turns = o.gateway.episodes.close(id);
          if (turns.length === 0)
            throw new AppEpisodeError(
              `recorded no turn: did every model call carry the ${EPISODE_HEADER} header of context.headers?`,
            );
          results[index] = toEpisode(index, Math.floor(index / n), seed, taskId(task), turns, reward);
        } catch (e) {
          o.gateway.episodes.close(id);
          const msg = `app episode ${id} (task ${taskId(task)}): ${(e as Error)?.message ?? String(e)}`;
          errors.push(msg);
          log(msg);
        } finally {
          o.gateway.episodes.retire(id);
          done++;
          r.onProgress?.(done, total);
        }
      };
      const worker = async () => {
        while (next < total) await one(next++);
      };
      await Promise.all(Array.from({ length: Math.min(limit, total) }, worker));

      const episodes = results.filter((e): e is Episode => e !== null);
      if (total > 0 && episodes.length === 0)
        throw new Error(`all ${total} app episodes of the rollout failed; the first: ${errors[0]}`);
      const after = await r.engine.stats();
      const turns = episodes.reduce((k, e) => k + e.turns.length, 0);
      const tokens = episodes.reduce((k, e) => k + e.turns.reduce((m, t) => m + t.responseIds.length, 0), 0);
      const seconds = (performance.now() - t0) / 1000;
      return {
        episodes,
        stats: {
          episodes: episodes.length,
          turns,
          tokensSampled: tokens,
          seconds,
          tokensPerSecond: seconds > 0 ? tokens / seconds : 0,
          engineCalls: turns,
          ...samplerShare(before, after),
          errors: errors.length,
        },
      };
    },
  };
}

/** One run of the app; a timeout aborts the context's signal and fails the episode. */
async function runWithTimeout<Task>(
  run: AppRun<Task>,
  task: Task,
  ctx: Omit<AppContext, "signal">,
  timeoutMs: number,
): Promise<z.output<typeof RewardSchema>> {
  const abort = new AbortController();
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      abort.abort(new AppEpisodeError(`timed out after ${timeoutMs / 1000} s`));
      reject(abort.signal.reason);
    }, timeoutMs);
  });
  try {
    const value = await Promise.race([
      Promise.resolve().then(() => run(task, { ...ctx, signal: abort.signal })),
      timeout,
    ]);
    const parsed = RewardSchema.safeParse(value);
    if (!parsed.success)
      throw new AppEpisodeError(
        `run returned ${JSON.stringify(value)}; expected a number or { teamReward, roleRewards?, correct?, score? }`,
      );
    return parsed.data;
  } finally {
    clearTimeout(timer);
  }
}

/** The recorded turns and the reward as the Episode record the trainer reads. */
function toEpisode(
  index: number,
  group: number,
  seed: number,
  taskId: string,
  recorded: readonly RecordedTurn[],
  reward: z.output<typeof RewardSchema>,
): Episode {
  const r = typeof reward === "number" ? { teamReward: reward } : reward;
  const turns: Turn[] = recorded.map((t) => ({
    order: t.index,
    step: 0,
    agent: t.agent,
    parents: [...new Set(t.parents.map((p) => recorded[p]!.agent))],
    adapter: t.adapter,
    adapterVersion: t.adapterVersion,
    // greedy decoding reports log-probs at temperature 1 (engine schema)
    temperature: t.sampling.temperature > 0 ? t.sampling.temperature : 1,
    promptIds: t.promptIds,
    responseIds: t.responseIds,
    logprobs: t.logprobs,
    text: t.text,
    finishReason: t.finishReason,
    reward: 0,
  }));
  return {
    index,
    taskId,
    group,
    seed,
    turns,
    terminated: true,
    truncated: false,
    outcome: {
      correct: r.correct ?? r.teamReward >= 1,
      score: r.score ?? r.teamReward,
      teamReward: r.teamReward,
      roleRewards: r.roleRewards ?? {},
    },
    info: { reward: r.teamReward, turns: recorded.length },
    transcript: recorded.map((t) => ({
      role: t.agent,
      content:
        t.toolCalls.length > 0 ? `${t.content ?? ""}${JSON.stringify(t.toolCalls)}` : (t.content ?? ""),
    })),
  };
}
