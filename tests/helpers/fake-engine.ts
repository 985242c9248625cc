// An in-memory ComputeEngine for fast unit tests of the loop (the integration tests use the real
// engine). It records every call in order, samples deterministic text from each request's seed,
// scores every weighted token with log-prob -1, gives the critic V = 0.5 everywhere, and answers
// training calls with fixed statistics; optim_step bumps the adapter's version as the real one does.
import {
  BASE_ADAPTER,
  type CallOptions,
  type ComputeEngine,
  type Schemas,
} from "../../src/client/compute.ts";
import { EngineRefusedError } from "../../src/errors.ts";
import { mixSeed } from "../../src/rng.ts";

export interface Call {
  endpoint: string;
  adapter?: string;
  loss?: string;
  rows?: number;
}

export class FakeEngine implements ComputeEngine {
  readonly calls: Call[] = [];
  readonly bases = new Map<string, Schemas["BaseInfo"]>();
  readonly adapters = new Map<string, Schemas["AdapterInfo"]>();
  /** The data of every forward_backward call, by adapter. */
  readonly trained = new Map<string, Schemas["ForwardBackwardRequest"][]>();
  /** What sampling answers: the text for a request (default: one of the letters "ab" by seed). */
  textFor: (req: Schemas["SampleRequest"]) => string = (req) => "ab"[(req.seed ?? 0) % 2]!;
  private decodeRows = 0;

  async health(): Promise<Schemas["Health"]> {
    return { status: "ok", version: "fake", device: "cpu" };
  }

  async stats(): Promise<Schemas["Stats"]> {
    return {
      device: "cpu",
      rss_bytes: 0,
      tokens_sampled: 0,
      tokens_trained: 0,
      decode_steps: this.decodeRows,
      decode_rows: 2 * this.decodeRows,
      prefill_seconds: 0,
      decode_seconds: 0,
      drafted_tokens: 0,
      accepted_drafts: 0,
      endpoints: {},
    };
  }

  async listBases(): Promise<Schemas["BaseList"]> {
    return { bases: [...this.bases.values()] };
  }

  async createBase(body: Schemas["BaseCreate"]): Promise<Schemas["BaseInfo"]> {
    this.calls.push({ endpoint: "createBase" });
    const info: Schemas["BaseInfo"] = {
      name: body.name,
      source: body.source,
      vocab_size: 256,
      context_length: 2048,
      num_parameters: 1,
      eos_token_ids: [0],
      pad_token_id: 0,
      device: "cpu",
      dtype: body.dtype === "bfloat16" ? "bfloat16" : "float32",
      dtype_reason: body.dtype === "bfloat16" || body.dtype === "float32" ? "requested" : "auto: fake",
    };
    this.bases.set(body.name, info);
    return info;
  }

  async listAdapters(): Promise<Schemas["AdapterList"]> {
    return { adapters: [...this.adapters.values()] };
  }

  async createAdapter(body: Schemas["AdapterCreate"]): Promise<Schemas["AdapterInfo"]> {
    this.calls.push({ endpoint: "createAdapter", adapter: body.name });
    const info: Schemas["AdapterInfo"] = {
      name: body.name,
      base: body.base,
      kind: body.kind ?? "policy",
      version: 0,
      num_trainable_parameters: 1,
      lora: { r: 8, alpha: 16, dropout: 0, target_modules: ["q_proj"], layers: null },
    };
    this.adapters.set(body.name, info);
    return info;
  }

  async deleteAdapter(name: string): Promise<Schemas["AdapterInfo"]> {
    const a = this.adapter(name);
    this.adapters.delete(name);
    return a;
  }

  async sample(body: Schemas["SampleBatch"]): Promise<Schemas["SampleResponse"]> {
    this.decodeRows += body.requests.length;
    const results = body.requests.map((req) => {
      this.calls.push({ endpoint: "sample", adapter: req.adapter, rows: 1 });
      const text = this.textFor(req);
      const ids = [...text].map((ch) => ch.charCodeAt(0) % 256);
      const prompt = (req.messages ?? []).flatMap((m) =>
        [...(m.content ?? "")].map((ch) => ch.charCodeAt(0) % 256),
      );
      return {
        prompt_ids: [1, ...prompt, 2],
        adapter: req.adapter,
        adapter_version: req.adapter === BASE_ADAPTER ? 0 : this.adapter(req.adapter).version,
        completions: [
          {
            response_ids: ids,
            logprobs: ids.map(() => -1),
            sampler_logprobs: ids.map(() => -1),
            text,
            finish_reason: "stop" as const,
          },
        ],
      };
    });
    const tokens = results.reduce((n, r) => n + r.completions[0]!.response_ids.length, 0);
    return { results, tokens_sampled: tokens, seconds: 0.01 };
  }

  async forward(body: Schemas["ForwardRequest"]): Promise<Schemas["ForwardResponse"]> {
    const a = this.adapter(body.adapter);
    this.calls.push({ endpoint: "forward", adapter: body.adapter, rows: body.data.length });
    return {
      results: body.data.map((d) =>
        a.kind === "critic"
          ? { values: d.tokens.map(() => 0.5) }
          : { logprobs: d.tokens.map((_, t) => ((d.weights?.[t] ?? 1) > 0 && t > 0 ? -1 : 0)) },
      ),
    };
  }

  async forwardBackward(
    body: Schemas["ForwardBackwardRequest"],
  ): Promise<Schemas["ForwardBackwardResponse"]> {
    this.adapter(body.adapter);
    this.calls.push({
      endpoint: "forwardBackward",
      adapter: body.adapter,
      loss: body.loss,
      rows: body.data.length,
    });
    const list = this.trained.get(body.adapter) ?? [];
    list.push(body);
    this.trained.set(body.adapter, list);
    const stats: Record<string, number> =
      body.loss === "value" ? { explained_variance: 0 } : { clipfrac: 0.1, approx_kl: 0.01, entropy: 1 };
    return { loss: 0.25, stats, num_data: body.data.length, num_tokens: 1 };
  }

  async forwardBackwardBatch(
    body: Schemas["ForwardBackwardBatch"],
  ): Promise<Schemas["ForwardBackwardBatchResponse"]> {
    const results = [];
    for (const c of body.calls) results.push(await this.forwardBackward(c));
    const inner = this.calls.splice(this.calls.length - body.calls.length);
    this.calls.push({
      endpoint: "forwardBackwardBatch",
      adapter: [...new Set(inner.map((x) => x.adapter))].join("+"),
      rows: inner.reduce((n, x) => n + (x.rows ?? 0), 0),
    });
    return { results, fused_passes: 1 };
  }

  async retokenize(body: Schemas["RetokenizeRequest"]): Promise<Schemas["RetokenizeResponse"]> {
    this.calls.push({ endpoint: "retokenize", adapter: `${body.from_base}->${body.to_base}` });
    return { ids: body.ids.map((xs) => [...xs]) };
  }

  async optimStep(body: Schemas["OptimStepRequest"]): Promise<Schemas["OptimStepResponse"]> {
    const a = this.adapter(body.adapter);
    this.calls.push({ endpoint: "optimStep", adapter: body.adapter });
    a.version += 1;
    return { adapter: a.name, version: a.version, grad_norm: 1, lr: 0.001 };
  }

  async saveCheckpoint(body: Schemas["CheckpointRequest"]): Promise<Schemas["CheckpointResponse"]> {
    return { path: body.path, adapters: [...this.adapters.keys()] };
  }

  async loadCheckpoint(body: Schemas["CheckpointRequest"]): Promise<Schemas["CheckpointResponse"]> {
    return { path: body.path, adapters: [...this.adapters.keys()] };
  }

  /** The endpoints called, in order, with the adapter when there is one (e.g. "optimStep speaker"). */
  trace(): string[] {
    return this.calls.map((c) => (c.adapter ? `${c.endpoint} ${c.adapter}` : c.endpoint));
  }

  private adapter(name: string, _o?: CallOptions): Schemas["AdapterInfo"] {
    const a = this.adapters.get(name);
    if (!a)
      throw new EngineRefusedError(
        404,
        "not_found",
        `adapter: unknown adapter ${JSON.stringify(name)}`,
        "fake",
      );
    return a;
  }
}

/** A seed-dependent letter, so a fake rollout's answers vary across episodes. */
export const seededLetter = (letters: string) => (req: Schemas["SampleRequest"]) =>
  letters[mixSeed(req.seed ?? 0) % letters.length]!;
