// What the gateway remembers of the completions it served: the turns of each episode (a request
// with `x-marft-episode: <id>` is a turn of that episode), and, for token-in / token-out, the exact
// ids behind every assistant output it returned.
//
// Parents (the dependency function D_t as the app ran it). A turn's parents are the earlier turns of
// its episode whose output is in its prompt. "Earlier" means finished before this request arrived
// (an app cannot pass on what it has not received). An earlier turn's output is in the prompt when
//   - an assistant message of the prompt is that output (same content, or the same tool call ids):
//     its sampled ids are then spliced into the prompt (token-in, token-out), or
//   - its content (trimmed, non-empty) appears verbatim inside the text of any message of the
//     prompt (the app quoted it: "The solver said: ..."), or
//   - a tool message of the prompt answers one of its tool calls.
// The text rule can see a parent that is not one: an output so short or so common that it occurs in
// the prompt by chance (one letter, "yes"). Apps whose agents answer in a word should quote them in
// a way that makes them unique, or accept the extra edges; they only add context to credit
// assignment, never remove any.
import { randomBytes } from "node:crypto";
import type { ToolCall } from "./openai.ts";

export interface SamplingRecord {
  temperature: number;
  top_p: number;
  top_k: number;
  max_tokens: number;
  stop: string[];
  seed: number | null;
}

export interface RecordedTurn {
  /** Position in the episode, in the order turns finished (a topological order of the parents). */
  index: number;
  agent: string;
  base: string;
  adapter: string;
  adapterVersion: number;
  promptIds: number[];
  responseIds: number[];
  /** Per response token, under the tempered policy that sampled it (at temperature 1 when greedy). */
  logprobs: number[];
  /** The completion's text (without eos, cut before a stop string). */
  text: string;
  /** What the app got: content and tool calls. */
  content: string | null;
  toolCalls: ToolCall[];
  finishReason: "stop" | "eos" | "length";
  parents: number[];
  sampling: SamplingRecord;
  /** Assistant messages of the prompt that went in as re-tokenized text (no output of ours matched). */
  retokenized: number;
  /** The answer was streamed (server-sent events). */
  streamed: boolean;
}

export interface EpisodeOptions {
  /** Greedy decoding for every request of the episode (evaluation). */
  greedy?: boolean;
  /** Seeds requests that bring none, by (seed, agent, k-th request of that agent): reproducible episodes. */
  seed?: number;
}

export class Episode {
  readonly turns: RecordedTurn[] = [];
  /** Requests per agent so far (part of a derived seed). */
  readonly requests = new Map<string, number>();
  closed = false;
  constructor(
    readonly id: string,
    readonly options: EpisodeOptions = {},
  ) {}
}

/** An output the gateway returned, by what an app sends back as an assistant message. */
interface Output {
  base: string;
  ids: number[];
  episode: string | null;
  turn: number | null;
}

export class EpisodeClosedError extends Error {}

const ID = /^[A-Za-z0-9._:@/-]{1,200}$/;

export function validEpisodeId(id: string): boolean {
  return ID.test(id);
}

function contentKey(base: string, content: string): string {
  return `${base}\u0000c\u0000${content}`;
}
function callKey(base: string, ids: readonly string[]): string {
  return `${base}\u0000t\u0000${ids.join("\u0000")}`;
}

/** The assistant message an app sends back, as far as matching it to an output goes. */
export interface AssistantMessage {
  content: string | null;
  toolCallIds: string[];
}

export class EpisodeStore {
  private readonly episodes = new Map<string, Episode>();
  /** Recent outputs by content or tool call ids (insertion order: the oldest are dropped first). */
  private readonly outputs = new Map<string, Output>();

  constructor(
    private readonly maxEpisodes = 10_000,
    private readonly maxOutputs = 20_000,
  ) {}

  /** Starts (or restarts) an episode; the trainer opens its episodes before the app runs. */
  open(id: string, options: EpisodeOptions = {}): Episode {
    const ep = new Episode(id, options);
    this.episodes.delete(id);
    this.episodes.set(id, ep);
    this.trim();
    return ep;
  }

  /** A fresh unique episode id (for callers that do not choose their own). */
  static newId(prefix = "ep"): string {
    return `${prefix}-${randomBytes(9).toString("base64url")}`;
  }

  get(id: string): Episode | undefined {
    return this.episodes.get(id);
  }

  /** The episode a request belongs to: created on first use; a closed one refuses new turns. */
  forRequest(id: string): Episode {
    const ep = this.episodes.get(id) ?? this.open(id);
    if (ep.closed) throw new EpisodeClosedError(`episode ${id} is closed; it records no more turns`);
    return ep;
  }

  /** Stops recording the episode (late requests of a timed-out app are refused) and returns its turns. */
  close(id: string): RecordedTurn[] {
    const ep = this.episodes.get(id);
    if (!ep) return [];
    ep.closed = true;
    return ep.turns;
  }

  /** Closes the episode and frees its turns; the id stays known, so late calls are still refused. */
  retire(id: string): void {
    const ep = this.episodes.get(id);
    if (!ep) return;
    ep.closed = true;
    ep.turns.length = 0;
  }

  delete(id: string): boolean {
    return this.episodes.delete(id);
  }

  /** The sampled ids of an output of ours that an assistant message repeats, with its turn if it was one. */
  lookup(base: string, m: AssistantMessage, episode: Episode | null): Output | undefined {
    const key = m.toolCallIds.length > 0 ? callKey(base, m.toolCallIds) : contentKey(base, m.content ?? "");
    if (episode) {
      // the episode's own turns first, newest first: the same text may have been sampled twice
      for (let i = episode.turns.length - 1; i >= 0; i--) {
        const t = episode.turns[i]!;
        if (t.base !== base) continue;
        const k =
          t.toolCalls.length > 0
            ? callKey(
                base,
                t.toolCalls.map((c) => c.id),
              )
            : contentKey(base, t.content ?? "");
        if (k === key) return { base, ids: t.responseIds, episode: episode.id, turn: t.index };
      }
    }
    const hit = this.outputs.get(key);
    return hit && (hit.episode === null || hit.episode === episode?.id) ? hit : undefined;
  }

  /** Remembers an output for token-in / token-out, and records it as a turn when it is one. */
  remember(turn: Omit<RecordedTurn, "index">, episode: Episode | null): RecordedTurn | null {
    const key =
      turn.toolCalls.length > 0
        ? callKey(
            turn.base,
            turn.toolCalls.map((c) => c.id),
          )
        : contentKey(turn.base, turn.content ?? "");
    let recorded: RecordedTurn | null = null;
    if (episode && !episode.closed) {
      recorded = { ...turn, index: episode.turns.length };
      episode.turns.push(recorded);
    }
    this.outputs.delete(key);
    this.outputs.set(key, {
      base: turn.base,
      ids: turn.responseIds,
      episode: episode?.id ?? null,
      turn: recorded?.index ?? null,
    });
    while (this.outputs.size > this.maxOutputs) this.outputs.delete(this.outputs.keys().next().value!);
    return recorded;
  }

  private trim(): void {
    while (this.episodes.size > this.maxEpisodes) {
      const oldest = this.episodes.keys().next().value!;
      this.episodes.delete(oldest);
    }
  }
}

/** What of a request's prompt the parent rule reads. */
export interface PromptView {
  /** The text of every message (content, and tool call arguments), in order. */
  texts: string[];
  /** Tool call ids that tool messages of the prompt answer. */
  answeredCalls: Set<string>;
  /** Turns whose output an assistant message of the prompt is (spliced). */
  spliced: Set<number>;
}

/** The earlier turns of `episode` whose output is in the prompt (the rule at the top of this file). */
export function parentsOf(episode: Episode, prompt: PromptView): number[] {
  const out: number[] = [];
  for (const t of episode.turns) {
    const said = (t.content ?? "").trim();
    if (
      prompt.spliced.has(t.index) ||
      (said !== "" && prompt.texts.some((x) => x.includes(said))) ||
      t.toolCalls.some((c) => prompt.answeredCalls.has(c.id))
    )
      out.push(t.index);
  }
  return out;
}

/** GET /v1/episodes/<id>: the recorded turns, with the exact ids and the parents. */
export function episodeJson(ep: Episode) {
  return {
    id: ep.id,
    object: "episode",
    closed: ep.closed,
    turns: ep.turns.map((t) => ({
      index: t.index,
      agent: t.agent,
      adapter: t.adapter,
      adapter_version: t.adapterVersion,
      prompt_ids: t.promptIds,
      response_ids: t.responseIds,
      logprobs: t.logprobs,
      parents: t.parents,
      text: t.text,
      content: t.content,
      tool_calls: t.toolCalls,
      finish_reason: t.finishReason,
      sampling: t.sampling,
      retokenized: t.retokenized,
      streamed: t.streamed,
    })),
  };
}
