// transcripts.jsonl: a bounded sample of each iteration's episodes as they were trained, one JSON line
// per episode. Every action keeps its token ids with, per token, the log-prob it was sampled with and
// the (normalised) advantage the update multiplied it by, so a person can see which agent's which
// tokens were pushed up or down (the dashboard colours them). Written after the iteration's metrics
// line; resume truncates it to the checkpoint's iteration, like metrics.jsonl.
//
// Token text: the engine returns a turn's response ids and its decoded text, not a string per token
// (and text is never re-tokenized here), so a record holds the turn's text and its token ids; the
// views show the text whole and the tokens as ids.
import { z } from "zod";
import { adapterOf } from "../config/derived.ts";
import type { RunConfig } from "../config/schema.ts";
import type { Episode } from "../rollout/types.ts";
import { updatingAdapters } from "./schedule.ts";
import type { Step } from "./steps.ts";

/** What the writer needs of an iteration; the Trainer keeps it after each iteration (`lastBatch`). */
export interface TrainedBatch {
  readonly episodes: readonly Episode[];
  readonly steps: readonly Step[];
  /** Per step, the normalised advantages as trained: [1] per action, or one per response token. */
  readonly advantages: ReadonlyArray<readonly number[]>;
}

const num = z.number();

export const TranscriptTurnSchema = z.object({
  agent: z.string(),
  role: z.string(),
  /** env.step() of the action (attempt / round). */
  step: z.number().int(),
  /** Position in the episode's action order. */
  order: z.number().int(),
  /** The agents whose actions this agent saw (its parents in D_t this step). */
  parents: z.array(z.string()),
  adapterVersion: z.number().int(),
  /** Whether this iteration's update trained the turn's adapter (schedule, trainable, warm-up). */
  trained: z.boolean(),
  text: z.string(),
  finishReason: z.string(),
  /** Reward credited to this action: its routed share of the outcome plus the env's per-action rewards. */
  reward: num,
  tokenIds: z.array(z.number().int()),
  /** Per token: log-prob under the tempered policy that sampled it. */
  logprobs: z.array(num),
  /** Per token: the normalised advantage of the update (an action-level one repeated on its tokens). */
  advantages: z.array(num),
});

export const TranscriptRecordSchema = z.object({
  /** The metrics.jsonl row this episode belongs to (1-based). */
  iteration: z.number().int().positive(),
  episode: z.number().int(),
  group: z.number().int(),
  taskId: z.string(),
  /** The user messages the episode started from (the task as the agents read it). */
  task: z.string(),
  /** "action": one advantage per action (MARFT-A, critic-free); "token": one per token (MARFT-T). */
  level: z.enum(["action", "token"]),
  outcome: z.object({
    correct: z.boolean(),
    score: num,
    teamReward: num,
    roleRewards: z.record(z.string(), num),
  }),
  terminated: z.boolean(),
  truncated: z.boolean(),
  info: z.record(z.string(), z.unknown()),
  turns: z.array(TranscriptTurnSchema),
});

export type TranscriptTurn = z.infer<typeof TranscriptTurnSchema>;
export type TranscriptRecord = z.infer<typeof TranscriptRecordSchema>;

/**
 * The records of iteration `iteration` (1-based): the first `config.train.transcripts` episodes of
 * the batch, each action with its tokens, log-probs and advantages as the update saw them.
 */
export function transcriptRecords(
  config: RunConfig,
  iteration: number,
  batch: TrainedBatch,
): TranscriptRecord[] {
  const count = config.train.transcripts;
  const updated = new Set(updatingAdapters(config, iteration - 1));
  const agents = new Map(config.agents.map((a) => [a.id, a]));
  const level = config.algo.estimator === "marft-t" ? "token" : "action";
  return batch.episodes.slice(0, count).map((ep) => {
    const firstAction = ep.transcript.findIndex((m) => m.role === "assistant");
    const turns = batch.steps.flatMap((s, i) => {
      if (s.episode !== ep.index) return [];
      const agent = agents.get(s.turn.agent);
      if (!agent) throw new Error(`transcripts: turn of unknown agent "${s.turn.agent}"`);
      const L = s.turn.responseIds.length;
      const adv = batch.advantages[i]!;
      if (adv.length !== 1 && adv.length !== L) {
        throw new Error(`transcripts: ${adv.length} advantages for ${L} tokens (agent ${agent.id})`);
      }
      return [
        {
          agent: agent.id,
          role: agent.role,
          step: s.turn.step,
          order: s.turn.order,
          parents: [...s.turn.parents],
          adapterVersion: s.turn.adapterVersion,
          trained: updated.has(adapterOf(agent)),
          text: s.turn.text,
          finishReason: s.turn.finishReason,
          reward: s.reward,
          tokenIds: [...s.turn.responseIds],
          logprobs: [...s.turn.logprobs],
          advantages: adv.length === L ? [...adv] : new Array<number>(L).fill(adv[0]!),
        },
      ];
    });
    return {
      iteration,
      episode: ep.index,
      group: ep.group,
      taskId: ep.taskId,
      task: (firstAction < 0 ? ep.transcript : ep.transcript.slice(0, firstAction))
        .filter((m) => m.role === "user")
        .map((m) => m.content)
        .join("\n"),
      level,
      outcome: ep.outcome,
      terminated: ep.terminated,
      truncated: ep.truncated,
      info: ep.info,
      turns,
    };
  });
}
