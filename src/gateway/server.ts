// The OpenAI-compatible gateway: an unmodified agent app (the `openai` package, the Vercel AI SDK,
// the OpenAI Agents SDK) talks to it as to OpenAI; `model` names an agent of the team and routes to
// its adapter on the engine. Requests with `x-marft-episode: <id>` are recorded as the turns of that
// episode (episodes.ts), which the trainer turns into Flex-MG episodes (src/app).
//
//   GET  /v1/models                 the team's agents
//   GET  /v1/models/<agent>
//   POST /v1/chat/completions       messages, temperature, top_p, max_tokens / max_completion_tokens,
//                                   stop, n, seed, stream (SSE, ending with [DONE]), tools
//   GET  /v1/episodes/<id>          { id, turns: [{ agent, prompt_ids, response_ids, logprobs, ... }] }
//   DELETE /v1/episodes/<id>
//
// Every request needs `Authorization: Bearer <token>` (the SDKs' apiKey). Errors are OpenAI's JSON
// (`{error: {message, type, param, code}}`): 400 a bad field (named in `param`), 401 a missing or
// wrong token, 404 an unknown agent / episode / route, 409 a closed episode, 413 a body over the
// limit, 503 no engine; the gateway keeps serving after each.
//
// Each request is its own engine `sample` call, so concurrent requests join the engine's decode
// batch (continuous batching) and each answers as soon as its rows are done. A streamed answer is
// sent when its completion is done (the engine's sample call answers whole): the chunks are in
// OpenAI's format and order, but they arrive together, not token by token.
import { timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { BASE_ADAPTER, type ComputeEngine, type Schemas } from "../client/compute.ts";
import { EngineRefusedError, EngineUnreachableError } from "../errors.ts";
import {
  type Episode,
  EpisodeClosedError,
  EpisodeStore,
  episodeJson,
  parentsOf,
  type RecordedTurn,
  validEpisodeId,
} from "./episodes.ts";
import {
  ChatCompletionRequestSchema,
  type Choice,
  completionChunks,
  completionObject,
  errorBody,
  firstIssue,
} from "./openai.ts";
import { badRequest, engineMessages, type GatewayAgent, HttpError, requestSampling } from "./request.ts";
import { parseToolCalls } from "./tools.ts";

export type { GatewayAgent } from "./request.ts";

export interface GatewayOptions {
  /** The engine to sample from; null until one is set (requests are then answered 503). */
  engine: ComputeEngine | null;
  agents: GatewayAgent[];
  /** The bearer token every request must carry. */
  token: string;
  /** Largest request body accepted (default 16 MiB). */
  maxBodyBytes?: number;
  /** One line per notable event (engine failures). */
  log?: (line: string) => void;
}

export const EPISODE_HEADER = "x-marft-episode";

export class Gateway {
  readonly episodes = new EpisodeStore();
  /** Settable: a trainer that restarts its engine points the gateway at the new one. */
  engine: ComputeEngine | null;
  private readonly agents: Map<string, GatewayAgent>;
  private readonly agentIndex: Map<string, number>;
  private readonly token: Buffer;
  private readonly maxBody: number;
  private readonly log: (line: string) => void;
  private readonly created = Math.floor(Date.now() / 1000);
  private server: Server | null = null;
  private address = "";

  constructor(opts: GatewayOptions) {
    if (!opts.token) throw new Error("gateway: a token is required");
    this.engine = opts.engine;
    this.agents = new Map(opts.agents.map((a) => [a.id, a]));
    this.agentIndex = new Map(opts.agents.map((a, i) => [a.id, i]));
    this.token = Buffer.from(`Bearer ${opts.token}`);
    this.maxBody = opts.maxBodyBytes ?? 16 * 1024 * 1024;
    this.log = opts.log ?? (() => {});
  }

  /** Listens (loopback by default; port 0 = any free port); resolves to the base URL, .../v1. */
  async listen(port = 0, host = "127.0.0.1"): Promise<string> {
    const server = createServer((req, res) => {
      this.handle(req, res).catch((e: unknown) => this.fail(res, e));
    });
    server.keepAliveTimeout = 30_000;
    server.requestTimeout = 0; // a CPU generation may take minutes; the client decides when to give up
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, host, () => resolve());
    });
    this.server = server;
    const a = server.address() as AddressInfo;
    const h = a.family === "IPv6" ? `[${a.address}]` : a.address;
    this.address = `http://${h}:${a.port}/v1`;
    return this.address;
  }

  /** The base URL the SDKs take (`baseURL`), e.g. http://127.0.0.1:8080/v1. */
  get url(): string {
    if (!this.address) throw new Error("gateway: not listening");
    return this.address;
  }

  async close(): Promise<void> {
    const s = this.server;
    this.server = null;
    if (!s) return;
    s.closeIdleConnections();
    await new Promise<void>((resolve) => s.close(() => resolve()));
  }

  // ------------------------------------------------------------------------------------------------
  // routing

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://gateway");
    const path = url.pathname.replace(/\/+$/, "");
    if (!this.authorized(req)) {
      req.resume();
      throw new HttpError(
        401,
        "Incorrect or missing API key: send Authorization: Bearer <the gateway's token>",
        "invalid_request_error",
        "invalid_api_key",
      );
    }
    const method = req.method ?? "GET";
    if (path === "/v1/chat/completions") {
      if (method !== "POST") throw this.notAllowed(req, "POST");
      return this.chat(req, res);
    }
    req.resume(); // no other route reads a body
    if (path === "/v1/models") {
      if (method !== "GET") throw this.notAllowed(req, "GET");
      return send(res, 200, { object: "list", data: [...this.agents.keys()].map((id) => this.model(id)) });
    }
    let m = /^\/v1\/models\/([^/]+)$/.exec(path);
    if (m) {
      const id = decodeURIComponent(m[1]!);
      if (!this.agents.has(id)) throw this.unknownModel(id);
      return send(res, 200, this.model(id));
    }
    m = /^\/v1\/episodes\/([^/]+)$/.exec(path);
    if (m) {
      const id = decodeURIComponent(m[1]!);
      const ep = this.episodes.get(id);
      if (!ep) throw new HttpError(404, `no episode ${id}`, "invalid_request_error", "episode_not_found");
      if (method === "DELETE") {
        this.episodes.delete(id);
        return send(res, 200, { id, object: "episode.deleted", deleted: true });
      }
      if (method !== "GET") throw this.notAllowed(req, "GET, DELETE");
      return send(res, 200, episodeJson(ep));
    }
    throw new HttpError(404, `no route ${method} ${url.pathname}`, "invalid_request_error", "not_found");
  }

  private authorized(req: IncomingMessage): boolean {
    const got = Buffer.from(req.headers.authorization ?? "");
    return got.length === this.token.length && timingSafeEqual(got, this.token);
  }

  private model(id: string) {
    return { id, object: "model", created: this.created, owned_by: "marft" };
  }

  private unknownModel(id: string): HttpError {
    return new HttpError(
      404,
      `The model \`${id}\` does not exist: models are the team's agents (${[...this.agents.keys()].join(", ")})`,
      "invalid_request_error",
      "model_not_found",
      "model",
    );
  }

  private notAllowed(req: IncomingMessage, allowed: string): HttpError {
    req.resume();
    return new HttpError(
      405,
      `${req.method} is not allowed here (${allowed})`,
      "invalid_request_error",
      "method_not_allowed",
    );
  }

  private fail(res: ServerResponse, e: unknown): void {
    let err: HttpError;
    if (e instanceof HttpError) err = e;
    else {
      this.log(`gateway: internal error: ${(e as Error)?.stack ?? String(e)}`);
      err = new HttpError(
        500,
        `internal error: ${(e as Error)?.message ?? String(e)}`,
        "server_error",
        "internal_error",
      );
    }
    if (res.headersSent) {
      res.destroy(); // mid-stream: the client sees a broken stream, not a half-valid answer
      return;
    }
    send(res, err.status, errorBody(err.message, err.type, err.code, err.param));
  }

  // ------------------------------------------------------------------------------------------------
  // chat completions

  private async chat(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await this.readJson(req);
    const parsed = ChatCompletionRequestSchema.safeParse(body, { reportInput: true });
    if (!parsed.success) {
      const { message, param } = firstIssue(parsed.error);
      throw badRequest(message, param);
    }
    const r = parsed.data;
    const agent = this.agents.get(r.model);
    if (!agent) throw this.unknownModel(r.model);

    const header = req.headers[EPISODE_HEADER];
    const episodeId = Array.isArray(header) ? header[0] : header;
    let episode: Episode | null = null;
    if (episodeId !== undefined) {
      if (!validEpisodeId(episodeId))
        throw badRequest(
          `${EPISODE_HEADER}: expected 1-200 characters of letters, digits and ._:@/-`,
          EPISODE_HEADER,
        );
      try {
        episode = this.episodes.forRequest(episodeId);
      } catch (e) {
        if (e instanceof EpisodeClosedError)
          throw new HttpError(409, e.message, "invalid_request_error", "episode_closed", EPISODE_HEADER);
        throw e;
      }
    }

    const { messages, view, retokenized } = engineMessages(r.messages, agent, episode, this.episodes);
    // parents are the turns finished before this request arrived: fixed now, not when it answers
    const parents = episode ? parentsOf(episode, view) : [];
    const sampling = requestSampling(r, agent, episode, this.agentIndex.get(agent.id)!);
    const useTools = Boolean(r.tools && r.tools.length > 0 && r.tool_choice !== "none");
    const request: Schemas["SampleRequest"] = {
      adapter: agent.adapter,
      messages,
      sampling: {
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        top_k: sampling.top_k,
        max_new_tokens: sampling.max_tokens,
        stop: sampling.stop,
        n: r.n ?? 1,
        draft_tokens: agent.sampling.draftTokens ?? 0,
      },
    };
    if (agent.adapter === BASE_ADAPTER) request.base = agent.base;
    if (sampling.seed !== null) request.seed = sampling.seed;
    if (useTools) request.tools = r.tools!.map((t) => ({ type: t.type, function: t.function }));

    let aborted = false;
    res.once("close", () => {
      if (!res.writableFinished) aborted = true;
    });
    const result = await this.sample(request);
    const choices: Choice[] = [];
    const toRecord: Array<Omit<RecordedTurn, "index">> = [];
    result.completions.forEach((c, index) => {
      const out = useTools ? parseToolCalls(c.text) : { content: c.text, toolCalls: [] };
      const finishReason =
        out.toolCalls.length > 0 ? "tool_calls" : c.finish_reason === "length" ? "length" : "stop";
      choices.push({ index, content: out.content, toolCalls: out.toolCalls, finishReason });
      toRecord.push({
        agent: agent.id,
        base: agent.base,
        adapter: result.adapter,
        adapterVersion: result.adapter_version,
        promptIds: result.prompt_ids,
        responseIds: c.response_ids,
        logprobs: c.logprobs,
        text: c.text,
        content: out.content,
        toolCalls: out.toolCalls,
        finishReason: c.finish_reason,
        parents,
        sampling,
        retokenized: retokenized + (result.retokenized?.length ?? 0),
        streamed: r.stream === true,
      });
    });
    // An answer the app never got is not a turn it took (a timed-out or cancelled call).
    if (!aborted) for (const t of toRecord) this.episodes.remember(t, episode);

    const completionTokens = result.completions.reduce((n, c) => n + c.response_ids.length, 0);
    const usage = {
      prompt_tokens: result.prompt_ids.length,
      completion_tokens: completionTokens,
      total_tokens: result.prompt_ids.length + completionTokens,
    };
    const id = `chatcmpl-${EpisodeStore.newId("").slice(1)}`;
    const created = Math.floor(Date.now() / 1000);
    if (!r.stream) return send(res, 200, completionObject(id, r.model, created, choices, usage));
    res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
    });
    const withUsage = r.stream_options?.include_usage === true;
    for (const chunk of completionChunks(id, r.model, created, choices, withUsage ? usage : null)) {
      res.write(`data: ${JSON.stringify(chunk)}\n\n`);
    }
    res.end("data: [DONE]\n\n");
  }

  private async sample(request: Schemas["SampleRequest"]): Promise<Schemas["SampleResult"]> {
    if (!this.engine)
      throw new HttpError(
        503,
        "no engine is connected to the gateway yet",
        "server_error",
        "engine_unavailable",
      );
    try {
      const res = await this.engine.sample({ requests: [request] });
      const result = res.results[0];
      if (!result) throw new Error("the engine answered no result");
      return result;
    } catch (e) {
      if (e instanceof EngineRefusedError && e.status >= 400 && e.status < 500) {
        // the engine names fields of its own request; ours are the same without the requests[0] prefix
        const msg = e.engineMessage.replace(/^requests\[0\]\./, "");
        const param = /^([A-Za-z_][\w.[\]]*):/.exec(msg)?.[1] ?? null;
        throw badRequest(msg, param?.replace(/^sampling\.max_new_tokens/, "max_tokens") ?? null);
      }
      if (e instanceof EngineUnreachableError) {
        this.log(`gateway: the engine did not answer: ${e.message}`);
        throw new HttpError(
          503,
          `the engine did not answer: ${e.engineMessage}`,
          "server_error",
          "engine_unavailable",
        );
      }
      throw e;
    }
  }

  private async readJson(req: IncomingMessage): Promise<unknown> {
    const tooLarge = () =>
      new HttpError(
        413,
        `request body is over the limit of ${this.maxBody} bytes`,
        "invalid_request_error",
        "request_too_large",
      );
    const declared = Number(req.headers["content-length"] ?? Number.NaN);
    if (declared > this.maxBody) {
      req.resume(); // drain and discard, so the connection stays usable
      throw tooLarge();
    }
    const parts: Buffer[] = [];
    let size = 0;
    for await (const chunk of req as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > this.maxBody) {
        req.resume();
        throw tooLarge();
      }
      parts.push(chunk);
    }
    try {
      return JSON.parse(Buffer.concat(parts).toString("utf8"));
    } catch (e) {
      throw badRequest(`malformed JSON body: ${(e as Error).message}`, null, "invalid_json");
    }
  }
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}
