// The engine's answers that the rollout and the trainer rely on, validated at the client with zod:
// a wrong or truncated answer fails at the call that got it, naming the field, instead of surfacing
// as NaN in a loss three functions later. Each schema `satisfies` the type generated from the
// engine's OpenAPI document, so the two cannot drift apart silently (the build fails).
import { z } from "zod";
import type { Schemas } from "./compute.ts";

const int = () => z.number().int();
const finite = () => z.number().refine(Number.isFinite, { error: "expected a finite number" });

const Completion = z.object({
  response_ids: z.array(int()),
  logprobs: z.array(finite()),
  sampler_logprobs: z.array(finite()),
  text: z.string(),
  finish_reason: z.enum(["stop", "eos", "length"]),
}) satisfies z.ZodType<Schemas["Completion"]>;

export const SampleResponse = z.object({
  results: z.array(
    z.object({
      prompt_ids: z.array(int()),
      retokenized: z.array(int()).optional(),
      adapter: z.string(),
      adapter_version: int(),
      completions: z.array(Completion),
    }),
  ),
  tokens_sampled: int(),
  seconds: z.number(),
}) satisfies z.ZodType<Schemas["SampleResponse"]>;

export const ForwardResponse = z.object({
  results: z.array(
    z.object({
      logprobs: z.array(finite()).nullish(),
      entropies: z.array(finite()).nullish(),
      values: z.array(finite()).nullish(),
    }),
  ),
}) satisfies z.ZodType<Schemas["ForwardResponse"]>;

export const ForwardBackwardResponse = z.object({
  loss: finite(),
  stats: z.record(z.string(), z.number()),
  num_data: int(),
  num_tokens: int(),
}) satisfies z.ZodType<Schemas["ForwardBackwardResponse"]>;

export const ForwardBackwardBatchResponse = z.object({
  results: z.array(ForwardBackwardResponse),
  fused_passes: int(),
}) satisfies z.ZodType<Schemas["ForwardBackwardBatchResponse"]>;

export const RetokenizeResponse = z.object({
  ids: z.array(z.array(int())),
}) satisfies z.ZodType<Schemas["RetokenizeResponse"]>;

export const OptimStepResponse = z.object({
  adapter: z.string(),
  version: int(),
  grad_norm: z.number(),
  lr: z.number(),
}) satisfies z.ZodType<Schemas["OptimStepResponse"]>;

// For the lists and the stats, the fields the framework reads (the rest passes through unchecked).
export const AdapterList = z.object({
  adapters: z.array(
    z.looseObject({ name: z.string(), base: z.string(), version: int() }) satisfies z.ZodType<
      Pick<Schemas["AdapterInfo"], "name" | "base" | "version">
    >,
  ),
});

export const BaseList = z.object({
  bases: z.array(
    z.looseObject({ name: z.string(), dtype: z.string() }) satisfies z.ZodType<
      Pick<Schemas["BaseInfo"], "name" | "dtype">
    >,
  ),
});

export const Stats = z.looseObject({
  decode_steps: int(),
  decode_rows: int(),
  prefill_seconds: z.number(),
  decode_seconds: z.number(),
  tokens_sampled: int(),
  tokens_trained: int(),
}) satisfies z.ZodType<
  Pick<
    Schemas["Stats"],
    | "decode_steps"
    | "decode_rows"
    | "prefill_seconds"
    | "decode_seconds"
    | "tokens_sampled"
    | "tokens_trained"
  >
>;
