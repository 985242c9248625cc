// The engine client: one typed method per endpoint of the engine's HTTP API (DESIGN §5).
// The protocol types come from the generated `openapi.d.ts` (made by `make openapi` from the engine's
// pydantic models); nothing here re-declares them.
//
// Failure policy:
// - Every call has a timeout (per client, overridable per call).
// - A call is retried, with exponential backoff, only when the connection failed. If the failure
//   means the request never reached the engine (connection refused, DNS failure, connect timeout),
//   any call is retried. If it may have reached it (connection reset mid-call), only calls that change
//   nothing on the engine (GETs, sample, forward) are retried: re-sending forward_backward would
//   accumulate gradients twice, optim_step would step twice.
// - HTTP errors (4xx/5xx) and timeouts are never retried. They raise `EngineError` carrying the
//   engine's status, error kind and message (which names the offending field).
import { Agent, fetch, type Response } from "undici";
import type { components } from "./openapi.d.ts";

// Node's built-in fetch gives up on any answer that takes over 300 s to start (undici's
// headersTimeout), and a long sample or training call on CPU can. Our own AbortSignal timeout is the
// only limit we want, so this dispatcher has none of its own.
const NO_IDLE_LIMITS = new Agent({ headersTimeout: 0, bodyTimeout: 0 });

export type Schemas = components["schemas"];

/**
 * A request body as a caller writes it. The generator marks fields that have a server-side default as
 * required (openapi-typescript's defaultNonNullable), so at the type level every field is optional;
 * the engine validates the body and answers 422 naming any missing or wrong field.
 */
export type Input<T> = T extends readonly (infer U)[]
  ? Input<U>[]
  : T extends object
    ? { [K in keyof T]?: Input<T[K]> }
    : T;

export class EngineError extends Error {
  constructor(
    /** HTTP status; 0 when no response came (connection failure or timeout). */
    readonly status: number,
    /** The engine's error kind (bad_request, not_found, internal, unauthorized, ...), or connection / timeout. */
    readonly kind: string,
    /** The engine's message, naming the field when it is about a field. */
    readonly engineMessage: string,
    /** e.g. "POST /v1/sample". */
    readonly endpoint: string,
  ) {
    super(`${endpoint}: ${status ? `${status} ${kind}: ` : `${kind}: `}${engineMessage}`);
    this.name = "EngineError";
  }
}

export interface EngineClientOptions {
  /** Base URL, e.g. http://127.0.0.1:8123 (no trailing /v1). */
  url: string;
  /** Bearer token (the engine's MARFT_ENGINE_TOKEN). */
  token: string;
  /** Default per-call timeout in ms (default 600 000: a long sample or training call on CPU). */
  timeoutMs?: number;
  /** Retries after a connection failure (default 4), with backoff starting at `backoffMs` (default 200). */
  retries?: number;
  backoffMs?: number;
}

export interface CallOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
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

export class EngineClient {
  readonly url: string;
  private readonly token: string;
  private readonly timeoutMs: number;
  private readonly retries: number;
  private readonly backoffMs: number;

  constructor(opts: EngineClientOptions) {
    this.url = opts.url.replace(/\/+$/, "");
    this.token = opts.token;
    this.timeoutMs = opts.timeoutMs ?? 600_000;
    this.retries = opts.retries ?? 4;
    this.backoffMs = opts.backoffMs ?? 200;
  }

  health(o?: CallOptions): Promise<Schemas["Health"]> {
    return this.call("GET", "/v1/health", undefined, true, o);
  }

  stats(o?: CallOptions): Promise<Schemas["Stats"]> {
    return this.call("GET", "/v1/stats", undefined, true, o);
  }

  listBases(o?: CallOptions): Promise<Schemas["BaseList"]> {
    return this.call("GET", "/v1/bases", undefined, true, o);
  }

  createBase(body: Input<Schemas["BaseCreate"]>, o?: CallOptions): Promise<Schemas["BaseInfo"]> {
    return this.call("POST", "/v1/bases", body, false, o);
  }

  listAdapters(o?: CallOptions): Promise<Schemas["AdapterList"]> {
    return this.call("GET", "/v1/adapters", undefined, true, o);
  }

  createAdapter(body: Input<Schemas["AdapterCreate"]>, o?: CallOptions): Promise<Schemas["AdapterInfo"]> {
    return this.call("POST", "/v1/adapters", body, false, o);
  }

  deleteAdapter(name: string, o?: CallOptions): Promise<Schemas["AdapterInfo"]> {
    return this.call("DELETE", `/v1/adapters/${encodeURIComponent(name)}`, undefined, false, o);
  }

  /** Sampling changes no weights, so it is safe to re-send after a broken connection. */
  sample(body: Input<Schemas["SampleBatch"]>, o?: CallOptions): Promise<Schemas["SampleResponse"]> {
    return this.call("POST", "/v1/sample", body, true, o);
  }

  forward(body: Input<Schemas["ForwardRequest"]>, o?: CallOptions): Promise<Schemas["ForwardResponse"]> {
    return this.call("POST", "/v1/forward", body, true, o);
  }

  /** Accumulates gradients: never re-sent once it may have reached the engine. */
  forwardBackward(
    body: Input<Schemas["ForwardBackwardRequest"]>,
    o?: CallOptions,
  ): Promise<Schemas["ForwardBackwardResponse"]> {
    return this.call("POST", "/v1/forward_backward", body, false, o);
  }

  optimStep(
    body: Input<Schemas["OptimStepRequest"]>,
    o?: CallOptions,
  ): Promise<Schemas["OptimStepResponse"]> {
    return this.call("POST", "/v1/optim_step", body, false, o);
  }

  saveCheckpoint(
    body: Input<Schemas["CheckpointRequest"]>,
    o?: CallOptions,
  ): Promise<Schemas["CheckpointResponse"]> {
    return this.call("POST", "/v1/checkpoint/save", body, false, o);
  }

  loadCheckpoint(
    body: Input<Schemas["CheckpointRequest"]>,
    o?: CallOptions,
  ): Promise<Schemas["CheckpointResponse"]> {
    return this.call("POST", "/v1/checkpoint/load", body, false, o);
  }

  private async call<T>(
    method: "GET" | "POST" | "DELETE",
    path: string,
    body: unknown,
    idempotent: boolean,
    o: CallOptions = {},
  ): Promise<T> {
    const endpoint = `${method} ${path}`;
    const timeoutMs = o.timeoutMs ?? this.timeoutMs;
    for (let attempt = 0; ; attempt++) {
      const timeout = AbortSignal.timeout(timeoutMs);
      const signal = o.signal ? AbortSignal.any([timeout, o.signal]) : timeout;
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
        if (timeout.aborted)
          throw new EngineError(0, "timeout", `no answer within ${timeoutMs} ms`, endpoint);
        if (o.signal?.aborted) throw new EngineError(0, "aborted", "the call was aborted", endpoint);
        const code = errorCode(e) ?? "unknown";
        const retryable = NOT_SENT.has(code) || (idempotent && MAYBE_SENT.has(code));
        if (retryable && attempt < this.retries) {
          await sleep(this.backoffMs * 2 ** attempt);
          continue;
        }
        const why = NOT_SENT.has(code) || MAYBE_SENT.has(code) ? "" : ` (${(e as Error).message})`;
        const tries = attempt + 1;
        throw new EngineError(
          0,
          "connection",
          `cannot reach the engine at ${this.url}: ${code}${why} after ${tries} attempt${tries > 1 ? "s" : ""}` +
            (retryable || NOT_SENT.has(code) ? "" : "; not retried: the request may have reached the engine"),
          endpoint,
        );
      }
      let json: unknown;
      try {
        json = text === "" ? undefined : JSON.parse(text);
      } catch {
        throw new EngineError(res.status, "bad_response", `not JSON: ${text.slice(0, 200)}`, endpoint);
      }
      if (!res.ok) {
        const err = json as Partial<Schemas["ErrorBody"]> | undefined;
        throw new EngineError(
          res.status,
          typeof err?.error === "string" ? err.error : "http_error",
          typeof err?.message === "string" ? err.message : text.slice(0, 500) || res.statusText,
          endpoint,
        );
      }
      return json as T;
    }
  }
}
