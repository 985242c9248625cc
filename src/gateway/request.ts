// From an OpenAI chat-completions request to the engine's sample request: the messages (with the
// ids of our own earlier outputs spliced in: token-in, token-out), what the parent rule reads of the
// prompt, and the sampling settings (the request's, else the agent's defaults).
import type { Schemas } from "../client/compute.ts";
import { mixSeed } from "../rng.ts";
import type { AssistantMessage, Episode, EpisodeStore, PromptView, SamplingRecord } from "./episodes.ts";
import { type ChatCompletionRequest, contentText, type RequestMessage } from "./openai.ts";
import { templateToolCall } from "./tools.ts";

/** An agent as the gateway serves it: where its requests go and its default sampling settings. */
export interface GatewayAgent {
  id: string;
  /** Its policy adapter, or BASE_ADAPTER (the bare base) for a frozen agent. */
  adapter: string;
  base: string;
  /** Defaults for what a request does not set (the run config's `sampling`). */
  sampling: {
    temperature: number;
    topP: number;
    topK: number;
    maxNewTokens: number;
    stop: string[];
    /** Speculative decoding's drafted tokens a step (engine `draft_tokens`; default 0 = off). */
    draftTokens?: number;
  };
}

/** An error answer of the gateway, in OpenAI's terms. */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: string,
    readonly code: string | null,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

export const badRequest = (message: string, param: string | null = null, code: string | null = null) =>
  new HttpError(400, message, "invalid_request_error", code, param);

/** The request's messages as the engine takes them, with our own outputs' ids spliced in. */
export function engineMessages(
  messages: RequestMessage[],
  agent: GatewayAgent,
  episode: Episode | null,
  store: EpisodeStore,
): { messages: Array<Schemas["ChatMessage"]>; view: PromptView; retokenized: number } {
  const view: PromptView = { texts: [], answeredCalls: new Set(), spliced: new Set() };
  const callNames = new Map<string, string>();
  let retokenized = 0;
  const out = messages.map((m, i): Schemas["ChatMessage"] => {
    const text = contentText(m.content);
    if (text !== null) view.texts.push(text);
    switch (m.role) {
      case "system":
      case "developer":
        return { role: "system", content: text ?? "" };
      case "user":
        return { role: "user", content: text ?? "" };
      case "tool": {
        view.answeredCalls.add(m.tool_call_id);
        const msg: Schemas["ChatMessage"] = {
          role: "tool",
          content: text ?? "",
          tool_call_id: m.tool_call_id,
        };
        const name = callNames.get(m.tool_call_id);
        if (name !== undefined) msg.name = name;
        return msg;
      }
      default: {
        // assistant
        const calls = m.tool_calls ?? [];
        for (const c of calls) {
          callNames.set(c.id, c.function.name);
          view.texts.push(c.function.arguments);
        }
        if (text === null && calls.length === 0)
          throw badRequest(
            `messages[${i}]: an assistant message needs content or tool_calls`,
            `messages[${i}].content`,
          );
        const msg: Schemas["ChatMessage"] = { role: "assistant", content: text };
        if (calls.length > 0) msg.tool_calls = calls.map(templateToolCall);
        const mine: AssistantMessage = { content: text, toolCallIds: calls.map((c) => c.id) };
        const hit = store.lookup(agent.base, mine, episode);
        if (hit) {
          msg.token_ids = hit.ids;
          if (hit.turn !== null && hit.episode === episode?.id) view.spliced.add(hit.turn);
        } else retokenized++;
        return msg;
      }
    }
  });
  return { messages: out, view, retokenized };
}

/** The sampling settings of a request: its own fields, else the agent's defaults; greedy in eval episodes. */
export function requestSampling(
  r: ChatCompletionRequest,
  agent: GatewayAgent,
  episode: Episode | null,
  agentIndex: number,
): SamplingRecord {
  const stop =
    r.stop === null || r.stop === undefined
      ? agent.sampling.stop
      : typeof r.stop === "string"
        ? [r.stop]
        : r.stop;
  if (stop.some((s) => s === "")) throw badRequest("stop: empty stop string", "stop");
  let seed: number | null = r.seed ?? null;
  if (episode) {
    const k = episode.requests.get(agent.id) ?? 0;
    episode.requests.set(agent.id, k + 1);
    if (seed === null && episode.options.seed !== undefined)
      seed = mixSeed(episode.options.seed, agentIndex, k);
  }
  return {
    temperature: episode?.options.greedy ? 0 : (r.temperature ?? agent.sampling.temperature),
    top_p: r.top_p ?? agent.sampling.topP,
    top_k: agent.sampling.topK,
    max_tokens: r.max_completion_tokens ?? r.max_tokens ?? agent.sampling.maxNewTokens,
    stop,
    seed,
  };
}
