// The OpenAI chat-completions wire format, as far as the gateway speaks it: the request body (zod,
// so a bad field is a 400 that names it), the error body, and the completion and chunk objects.
//
// Unknown top-level fields are refused, as OpenAI refuses them ("Unrecognized request argument"),
// except fields the SDKs send that change nothing here (`user`, `metadata`, `store`, ...). Fields
// that would change the answer in a way the gateway cannot honour (`logit_bias`, penalties,
// `response_format` other than text, forced tool choice) are refused when set to anything but their
// neutral value, rather than silently ignored: an app that relies on one should know.
import { z } from "zod";
import { formatPath, show } from "../fields.ts";

// ------------------------------------------------------------------------------------------------
// request

const TextPart = z.object({ type: z.literal("text"), text: z.string() });
/** Message content: a string or a list of text parts (images and audio are not supported). */
const Content = z.union([z.string(), z.array(TextPart)], {
  error: "expected a string or a list of {type: 'text', text} parts",
});

export const ToolCallSchema = z.object({
  id: z.string(),
  type: z.literal("function").default("function"),
  function: z.object({ name: z.string(), arguments: z.string() }),
});
export type ToolCall = z.output<typeof ToolCallSchema>;

const Message = z.discriminatedUnion(
  "role",
  [
    z.object({ role: z.literal("system"), content: Content, name: z.string().optional() }),
    z.object({ role: z.literal("developer"), content: Content, name: z.string().optional() }),
    z.object({ role: z.literal("user"), content: Content, name: z.string().optional() }),
    z.object({
      role: z.literal("assistant"),
      content: Content.nullish(),
      tool_calls: z.array(ToolCallSchema).nullish(),
      name: z.string().optional(),
      refusal: z.string().nullish(),
    }),
    z.object({ role: z.literal("tool"), content: Content, tool_call_id: z.string() }),
  ],
  { error: 'expected a message with role "system", "developer", "user", "assistant" or "tool"' },
);
export type RequestMessage = z.output<typeof Message>;

const Tool = z.object({
  type: z.literal("function"),
  function: z.object({
    name: z.string().min(1),
    description: z.string().optional(),
    parameters: z.record(z.string(), z.unknown()).optional(),
    strict: z.boolean().nullish(),
  }),
});
export type ToolSpec = z.output<typeof Tool>;

const unit = (what: string) =>
  z
    .number({ error: `expected ${what}` })
    .min(0, { error: `expected ${what}` })
    .max(1, { error: `expected ${what}` });
const positiveInt = z
  .number({ error: "expected a positive integer" })
  .int({ error: "expected a positive integer" })
  .positive({ error: "expected a positive integer" });
/** A field accepted only at its neutral value: anything else would be silently wrong here. */
const neutral = <T extends z.ZodType>(schema: T, ok: (v: z.output<T>) => boolean, why: string) =>
  schema.nullish().refine((v) => v === null || v === undefined || ok(v as z.output<T>), { error: why });

export const ChatCompletionRequestSchema = z.strictObject({
  model: z.string({ error: "expected the id of an agent (GET /v1/models lists them)" }),
  messages: z.array(Message).min(1, { error: "expected at least one message" }),
  temperature: z
    .number({ error: "expected a number in [0, 2]" })
    .min(0, { error: "expected a number in [0, 2]" })
    .max(2, { error: "expected a number in [0, 2]" })
    .nullish(),
  top_p: unit("a number in (0, 1]")
    .refine((v) => v > 0, { error: "expected a number in (0, 1]" })
    .nullish(),
  max_tokens: positiveInt.nullish(),
  max_completion_tokens: positiveInt.nullish(),
  stop: z
    .union([z.string(), z.array(z.string()).max(16, { error: "expected at most 16 stop strings" })], {
      error: "expected a string or a list of strings",
    })
    .nullish(),
  n: positiveInt.max(64, { error: "expected at most 64" }).nullish(),
  seed: z.number({ error: "expected an integer" }).int({ error: "expected an integer" }).nullish(),
  stream: z.boolean({ error: "expected true or false" }).nullish(),
  stream_options: z.object({ include_usage: z.boolean().optional() }).nullish(),
  tools: z.array(Tool).nullish(),
  tool_choice: z
    .union([z.literal("auto"), z.literal("none"), z.literal("required"), z.object({ type: z.string() })])
    .nullish()
    .refine((v) => v === null || v === undefined || v === "auto" || v === "none", {
      error: 'only "auto" and "none" are supported (the gateway does not constrain decoding)',
    }),
  parallel_tool_calls: z.boolean().nullish(),
  // accepted, change nothing here
  user: z.string().nullish(),
  metadata: z.record(z.string(), z.unknown()).nullish(),
  store: z.boolean().nullish(),
  service_tier: z.string().nullish(),
  modalities: neutral(z.array(z.string()), (v) => v.every((m) => m === "text"), "only text is supported"),
  // refused unless neutral
  logprobs: neutral(
    z.boolean(),
    (v) => !v,
    "log-probs of the choices are not returned (they are recorded: GET /v1/episodes/<id>)",
  ),
  top_logprobs: neutral(z.number(), (v) => v === 0, "not supported"),
  logit_bias: neutral(z.record(z.string(), z.number()), (v) => Object.keys(v).length === 0, "not supported"),
  presence_penalty: neutral(z.number(), (v) => v === 0, "not supported (only 0)"),
  frequency_penalty: neutral(z.number(), (v) => v === 0, "not supported (only 0)"),
  response_format: neutral(
    z.object({ type: z.string() }).passthrough(),
    (v) => v.type === "text",
    'only {"type": "text"} is supported (no constrained decoding)',
  ),
});
export type ChatCompletionRequest = z.output<typeof ChatCompletionRequestSchema>;

/** The first problem of a request body as OpenAI reports it: a message and the field (`param`). */
export function firstIssue(error: z.ZodError): { message: string; param: string | null } {
  const issue = error.issues[0]!;
  if (issue.code === "unrecognized_keys") {
    const key = issue.keys[0]!;
    const path = formatPath([...issue.path, key]);
    return { message: `Unrecognized request argument supplied: ${path}`, param: path };
  }
  let cur: z.core.$ZodIssue = issue;
  let prefix: PropertyKey[] = [];
  // a union's error: report the branch that came closest (e.g. the message whose role matched)
  while (
    cur.code === "invalid_union" &&
    !("discriminator" in cur && cur.discriminator) &&
    cur.errors.length
  ) {
    const branches: z.core.$ZodIssue[][] = cur.errors.filter((b) => b.length > 0);
    if (branches.length === 0) break;
    const best = branches.reduce((a, b) => (b.length < a.length ? b : a));
    prefix = [...prefix, ...cur.path];
    cur = best[0]!;
  }
  const path = formatPath([...prefix, ...cur.path]);
  const input = (cur as { input?: unknown }).input;
  const got = cur.code === "invalid_type" && input === undefined ? "required" : undefined;
  const detail = got
    ? `required (${cur.message})`
    : `${cur.message}${input !== undefined ? `, got ${show(input)}` : ""}`;
  return { message: `${path}: ${detail}`, param: path === "(root)" ? null : path };
}

/** Text of a message's content (a string or text parts, joined). */
export function contentText(c: string | Array<{ text: string }> | null | undefined): string | null {
  if (c === null || c === undefined) return null;
  return typeof c === "string" ? c : c.map((p) => p.text).join("");
}

// ------------------------------------------------------------------------------------------------
// errors

export interface OpenAIError {
  error: { message: string; type: string; param: string | null; code: string | null };
}

export function errorBody(
  message: string,
  type: string,
  code: string | null,
  param: string | null = null,
): OpenAIError {
  return { error: { message, type, param, code } };
}

// ------------------------------------------------------------------------------------------------
// answers

export type FinishReason = "stop" | "length" | "tool_calls";

export interface Choice {
  index: number;
  content: string | null;
  toolCalls: ToolCall[];
  finishReason: FinishReason;
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export function completionObject(
  id: string,
  model: string,
  created: number,
  choices: Choice[],
  usage: Usage,
) {
  return {
    id,
    object: "chat.completion" as const,
    created,
    model,
    system_fingerprint: null,
    choices: choices.map((c) => ({
      index: c.index,
      message: {
        role: "assistant" as const,
        content: c.content,
        refusal: null,
        ...(c.toolCalls.length > 0 ? { tool_calls: c.toolCalls } : {}),
      },
      logprobs: null,
      finish_reason: c.finishReason,
    })),
    usage,
  };
}

/**
 * The server-sent chunks of a streamed completion, in OpenAI's order: per choice a role chunk, the
 * content, each tool call (name and arguments), a finish chunk; then the usage chunk when asked.
 */
export function completionChunks(
  id: string,
  model: string,
  created: number,
  choices: Choice[],
  usage: Usage | null,
): object[] {
  const chunk = (delta: object, index: number, finish: FinishReason | null) => ({
    id,
    object: "chat.completion.chunk" as const,
    created,
    model,
    system_fingerprint: null,
    choices: [{ index, delta, logprobs: null, finish_reason: finish }],
  });
  const out: object[] = [];
  for (const c of choices) {
    out.push(chunk({ role: "assistant", content: "", refusal: null }, c.index, null));
    if (c.content) out.push(chunk({ content: c.content }, c.index, null));
    c.toolCalls.forEach((t, k) => {
      out.push(
        chunk(
          {
            tool_calls: [
              { index: k, id: t.id, type: "function", function: { name: t.function.name, arguments: "" } },
            ],
          },
          c.index,
          null,
        ),
      );
      out.push(
        chunk({ tool_calls: [{ index: k, function: { arguments: t.function.arguments } }] }, c.index, null),
      );
    });
    out.push(chunk({}, c.index, c.finishReason));
  }
  if (usage)
    out.push({
      id,
      object: "chat.completion.chunk",
      created,
      model,
      system_fingerprint: null,
      choices: [],
      usage,
    });
  return out;
}
