// The engine client: one typed method per endpoint of the engine's HTTP API (DESIGN §5), the HTTP
// implementation of `ComputeEngine`. Request and answer types come from the OpenAPI paths
// (openapi.d.ts, generated from the engine's pydantic models): the HTTP layer knows which body goes
// to which endpoint and what comes back; the answers the framework relies on are also checked with
// zod (responses.ts).
//
// Failure policy (errors: src/errors.ts):
// - No call has a fixed deadline: a long sample or training call on a slow CPU is work, not failure.
//   While calls are in flight, one watcher polls /v1/health, whose `progress` moves whenever the
//   engine finishes a call or a decode step or its compute thread uses CPU time. A call fails only
//   when the engine is gone (no connection) or shows no progress for `stallMs`
//   (`EngineStalledError`, naming the call and how long). A per-call `timeoutMs` is a hard limit for
//   short probes (health checks), nothing else.
// - A call is retried, with exponential backoff, only when the connection failed. If the failure
//   means the request never reached the engine (connection refused, DNS failure, connect timeout),
//   any call is retried. If it may have reached it (connection reset mid-call), only calls that change
//   nothing on the engine (GETs, sample, forward) are retried: re-sending forward_backward would
//   accumulate gradients twice, optim_step would step twice.
// - No answer (connection failure after the retries, a stall) raises `EngineUnreachableError` or
//   `EngineStalledError`; an HTTP error answer (4xx/5xx) raises `EngineRefusedError` carrying the
//   engine's status, error kind and message (which names the offending field). None is retried.
import { Agent, fetch, type Response } from "undici";
import type { z } from "zod";
import { EngineError, EngineRefusedError, EngineStalledError, EngineUnreachableError } from "../errors.ts";
import type { CallOptions, ComputeEngine, Schemas } from "./compute.ts";
import type { paths } from "./openapi.d.ts";
import * as answers from "./responses.ts";

export { EngineError, EngineRefusedError, EngineStalledError, EngineUnreachableError } from "../errors.ts";
export type { CallOptions, ComputeEngine, Schemas } from "./compute.ts";

// Node's built-in fetch gives up on any answer that takes over 300 s to start (undici's
// headersTimeout), and a long sample or training call on CPU can. The liveness watch is the only
// limit we want, so this dispatcher has none of its own.
const NO_IDLE_LIMITS = new Agent({ headersTimeout: 0, bodyTimeout: 0 });

type Method = "get" | "post" | "delete";
/** The operation at `path` for `method`, as the OpenAPI document describes it. */
type Operation<P extends keyof paths, M extends Method> = NonNullable<paths[P][M]>;
type RequestBody<O> = O extends { requestBody: { content: { "application/json": infer B } } } ? B : undefined;
type Answer<O> = O extends { responses: { 200: { content: { "application/json": infer R } } } } ? R : never;

export interface EngineClientOptions {
  /** Base URL, e.g. http://127.0.0.1:8123 (no trailing /v1). */
  url: string;
  /** Bearer token (the engine's MARFT_ENGINE_TOKEN). */
  token: string;
  /**
   * A call fails when the engine shows no progress for this long (ms; default 300 000): no call or
   * decode step finished and its compute thread used no CPU time. A slow engine that works never
   * reaches it.
   */
  stallMs?: number;
  /** How often the watcher asks /v1/health while calls are in flight (default min(5 s, stallMs / 4)). */
  pollMs?: number;
  /** Retries after a connection failure (default 4), with backoff starting at `backoffMs` (default 200). */
  retries?: number;
  backoffMs?: number;
}

/** Error codes that mean the request never left this machine or never got a connection. */
const NOT_SENT = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);
/** Error codes of a connection that broke after it was made: the request may have been processed. */
const MAYBE_SENT = new Set(["ECONNRESET", "EPIPE", "UND_ERR_SOCKET", "UND_ERR_CLOSED"]);

function errorCode(e: unknown): string | undefined {
  // fetch wraps network errors: TypeError("fetch failed", { cause: { code } }), sometimes nested.
  let cur: unknown = e;
  for (let depth = 0; depth < 4 && cur && typeof cur === "object"; depth++) {
    const code = (cur as { code?: unknown }).code;
    if (typeof code === "string") return code;
    const errors = (cur as { errors?: unknown }).errors;
    if (Array.isArray(errors) && errors.length > 0) cur = errors[0];
    else cur = (cur as { cause?: unknown }).cause;
  }
  return undefined;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A call in flight that the liveness watcher may fail. */
interface Watched {
  endpoint: string;
  started: number;
  fail(e: EngineError): void;
}

export class EngineClient implements ComputeEngine {
  readonly url: string;
  readonly stallMs: number;
  private readonly token: string;
  private readonly pollMs: number;
  private readonly retries: number;
  private readonly backoffMs: number;
  private readonly inFlight = new Set<Watched>();
  private watcher: NodeJS.Timeout | undefined;
  /** The engine's last progress counters, and when (performance.now()) they last moved. */
  private seen: { beats: number; cpu: number } | undefined;
  private progressAt = 0;
  private polling = false;

  constructor(opts: EngineClientOptions) {
    this.url = opts.url.replace(/\/+$/, "");
    this.token = opts.token;
    this.stallMs = opts.stallMs ?? 300_000;
    this.pollMs = opts.pollMs ?? Math.min(5000, this.stallMs / 4);
    this.retries = opts.retries ?? 4;
    this.backoffMs = opts.backoffMs ?? 200;
  }

  health(o?: CallOptions): Promise<Schemas["Health"]> {
    return this.call("get", "/v1/health", undefined, true, o);
  }

  stats(o?: CallOptions): Promise<Schemas["Stats"]> {
    return this.call("get", "/v1/stats", undefined, true, o, answers.Stats);
  }

  listBases(o?: CallOptions): Promise<Schemas["BaseList"]> {
    return this.call("get", "/v1/bases", undefined, true, o, answers.BaseList);
  }

  createBase(body: Schemas["BaseCreate"], o?: CallOptions): Promise<Schemas["BaseInfo"]> {
    return this.call("post", "/v1/bases", body, false, o);
  }

  listAdapters(o?: CallOptions): Promise<Schemas["AdapterList"]> {
    return this.call("get", "/v1/adapters", undefined, true, o, answers.AdapterList);
  }

  createAdapter(body: Schemas["AdapterCreate"], o?: CallOptions): Promise<Schemas["AdapterInfo"]> {
    return this.call("post", "/v1/adapters", body, false, o);
  }

  deleteAdapter(name: string, o?: CallOptions): Promise<Schemas["AdapterInfo"]> {
    const path = `/v1/adapters/${encodeURIComponent(name)}` as "/v1/adapters/{name}";
    return this.call("delete", path, undefined, false, o);
  }

  /** Sampling changes no weights, so it is safe to re-send after a broken connection. */
  sample(body: Schemas["SampleBatch"], o?: CallOptions): Promise<Schemas["SampleResponse"]> {
    return this.call("post", "/v1/sample", body, true, o, answers.SampleResponse);
  }

  forward(body: Schemas["ForwardRequest"], o?: CallOptions): Promise<Schemas["ForwardResponse"]> {
    return this.call("post", "/v1/forward", body, true, o, answers.ForwardResponse);
  }

  /** Accumulates gradients: never re-sent once it may have reached the engine. */
  forwardBackward(
    body: Schemas["ForwardBackwardRequest"],
    o?: CallOptions,
  ): Promise<Schemas["ForwardBackwardResponse"]> {
    return this.call("post", "/v1/forward_backward", body, false, o, answers.ForwardBackwardResponse);
  }

  /** Accumulates gradients: never re-sent once it may have reached the engine. */
  forwardBackwardBatch(
    body: Schemas["ForwardBackwardBatch"],
    o?: CallOptions,
  ): Promise<Schemas["ForwardBackwardBatchResponse"]> {
    return this.call(
      "post",
      "/v1/forward_backward_batch",
      body,
      false,
      o,
      answers.ForwardBackwardBatchResponse,
    );
  }

  /** Changes nothing: safe to re-send. */
  retokenize(body: Schemas["RetokenizeRequest"], o?: CallOptions): Promise<Schemas["RetokenizeResponse"]> {
    return this.call("post", "/v1/retokenize", body, true, o, answers.RetokenizeResponse);
  }

  optimStep(body: Schemas["OptimStepRequest"], o?: CallOptions): Promise<Schemas["OptimStepResponse"]> {
    return this.call("post", "/v1/optim_step", body, false, o, answers.OptimStepResponse);
  }

  saveCheckpoint(
    body: Schemas["CheckpointRequest"],
    o?: CallOptions,
  ): Promise<Schemas["CheckpointResponse"]> {
    return this.call("post", "/v1/checkpoint/save", body, false, o);
  }

  loadCheckpoint(
    body: Schemas["CheckpointRequest"],
    o?: CallOptions,
  ): Promise<Schemas["CheckpointResponse"]> {
    return this.call("post", "/v1/checkpoint/load", body, false, o);
  }

  /**
   * One call of `method path` with its typed body; `check` validates the answer (the fields the
   * framework relies on) before it is returned as the endpoint's type.
   */
  private async call<P extends keyof paths, M extends Method>(
    method: M,
    path: P,
    body: RequestBody<Operation<P, M>>,
    idempotent: boolean,
    o: CallOptions = {},
    check?: z.ZodType,
  ): Promise<Answer<Operation<P, M>>> {
    const json = await this.send(method.toUpperCase(), path, body, idempotent, o);
    if (check) {
      const r = check.safeParse(json);
      if (!r.success) {
        const issue = r.error.issues[0]!;
        throw new EngineRefusedError(
          200,
          "bad_response",
          `the answer does not match the protocol at ${issue.path.join(".") || "(root)"}: ${issue.message}`,
          `${method.toUpperCase()} ${path}`,
        );
      }
    }
    return json as Answer<Operation<P, M>>;
  }

  private async send(
    method: string,
    path: string,
    body: unknown,
    idempotent: boolean,
    o: CallOptions,
  ): Promise<unknown> {
    const endpoint = `${method} ${path}`;
    for (let attempt = 0; ; attempt++) {
      // A hard limit only where the caller gives one (short probes); every other call is watched.
      const limit = o.timeoutMs === undefined ? undefined : AbortSignal.timeout(o.timeoutMs);
      const watch = new AbortController();
      const signal = AbortSignal.any([
        watch.signal,
        ...(limit ? [limit] : []),
        ...(o.signal ? [o.signal] : []),
      ]);
      let failure: EngineError | undefined;
      const watched: Watched | undefined =
        limit === undefined
          ? {
              endpoint,
              started: performance.now(),
              fail: (e) => {
                failure = e;
                watch.abort();
              },
            }
          : undefined;
      if (watched) this.watch(watched);
      let res: Response;
      let text: string;
      try {
        res = await fetch(this.url + path, {
          dispatcher: NO_IDLE_LIMITS,
          method,
          headers: {
            authorization: `Bearer ${this.token}`,
            ...(body === undefined ? {} : { "content-type": "application/json" }),
          },
          body: body === undefined ? undefined : JSON.stringify(body),
          signal,
        });
        text = await res.text();
      } catch (e) {
        if (failure) throw failure;
        if (limit?.aborted)
          throw new EngineUnreachableError("timeout", `no answer within ${o.timeoutMs} ms`, endpoint);
        if (o.signal?.aborted) throw new EngineError(0, "aborted", "the call was aborted", endpoint);
        const code = errorCode(e) ?? "unknown";
        const retryable = NOT_SENT.has(code) || (idempotent && MAYBE_SENT.has(code));
        if (retryable && attempt < this.retries) {
          await sleep(this.backoffMs * 2 ** attempt);
          continue;
        }
        const why = NOT_SENT.has(code) || MAYBE_SENT.has(code) ? "" : ` (${(e as Error).message})`;
        const tries = attempt + 1;
        throw new EngineUnreachableError(
          "connection",
          `cannot reach the engine at ${this.url}: ${code}${why} after ${tries} attempt${tries > 1 ? "s" : ""}` +
            (retryable || NOT_SENT.has(code) ? "" : "; not retried: the request may have reached the engine"),
          endpoint,
        );
      } finally {
        if (watched) this.unwatch(watched);
      }
      let json: unknown;
      try {
        json = text === "" ? undefined : JSON.parse(text);
      } catch {
        throw new EngineRefusedError(res.status, "bad_response", `not JSON: ${text.slice(0, 200)}`, endpoint);
      }
      if (!res.ok) {
        const err = json as Partial<Schemas["ErrorBody"]> | undefined;
        throw new EngineRefusedError(
          res.status,
          typeof err?.error === "string" ? err.error : "http_error",
          typeof err?.message === "string" ? err.message : text.slice(0, 500) || res.statusText,
          endpoint,
        );
      }
      return json;
    }
  }

  // -------------------------------------------------------------------------------------------------
  // Liveness: one watcher for all calls in flight (a rollout has hundreds), polling /v1/health.

  private watch(w: Watched): void {
    if (this.inFlight.size === 0) this.progressAt = performance.now();
    this.inFlight.add(w);
    if (this.watcher === undefined) {
      this.watcher = setInterval(() => void this.poll(), this.pollMs);
      this.watcher.unref(); // the calls keep the process alive, not their watcher
    }
  }

  private unwatch(w: Watched): void {
    this.inFlight.delete(w);
    if (this.inFlight.size === 0 && this.watcher !== undefined) {
      clearInterval(this.watcher);
      this.watcher = undefined;
      this.seen = undefined;
    }
  }

  private async poll(): Promise<void> {
    if (this.polling) return; // the previous poll is still waiting for its answer
    this.polling = true;
    try {
      const h = await this.probe();
      const now = performance.now();
      if (h === "gone") {
        for (const w of [...this.inFlight]) {
          w.fail(
            new EngineUnreachableError(
              "connection",
              `the engine at ${this.url} stopped accepting connections while this call waited`,
              w.endpoint,
            ),
          );
        }
        return;
      }
      if (h !== "no answer") {
        const p = h.progress;
        // an engine that reports no progress counters (an older one) counts as alive when it answers
        const moved =
          !p || !this.seen || p.beats !== this.seen.beats || p.compute_cpu_seconds - this.seen.cpu >= 0.01;
        if (p) this.seen = { beats: p.beats, cpu: p.compute_cpu_seconds };
        if (moved) this.progressAt = now;
      }
      for (const w of [...this.inFlight]) {
        const idle = now - Math.max(w.started, this.progressAt);
        if (idle > this.stallMs) {
          const answered = h === "no answer" ? "it does not answer /v1/health" : "it answers /v1/health";
          w.fail(new EngineStalledError(w.endpoint, idle / 1000, this.stallMs / 1000, answered));
        }
      }
    } finally {
      this.polling = false;
    }
  }

  /** One health request, no retries: the answer, "gone" (connection refused), or "no answer". */
  private async probe(): Promise<Schemas["Health"] | "gone" | "no answer"> {
    try {
      const res = await fetch(`${this.url}/v1/health`, {
        dispatcher: NO_IDLE_LIMITS,
        headers: { authorization: `Bearer ${this.token}` },
        signal: AbortSignal.timeout(Math.max(this.pollMs, Math.min(this.stallMs, 30_000))),
      });
      const text = await res.text();
      if (!res.ok) return "no answer";
      return JSON.parse(text) as Schemas["Health"];
    } catch (e) {
      return NOT_SENT.has(errorCode(e) ?? "") ? "gone" : "no answer";
    }
  }
}
