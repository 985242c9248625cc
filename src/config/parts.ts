// The run config's parts that describe where things run and who acts: the engine, the bases, LoRA,
// sampling and the agent profiles. src/config/schema.ts puts them together with the graph, the
// algorithm, the schedule and the task.
import { z } from "zod";
import { name, nonNegInt, nonNegNum, posInt, posNum } from "../fields.ts";

const Replica = z
  .strictObject({
    cpus: posNum()
      .default(1)
      .describe("CPUs Ray reserves for each replica (a local cluster gets replicas x cpus)"),
    gpus: nonNegNum()
      .optional()
      .describe("GPUs per replica (default: 1 where the cluster has one for each replica, else 0)"),
    threads: posInt()
      .optional()
      .describe("torch CPU threads per replica (default: engine.threads, else the replica's cpus)"),
  })
  .describe("resources of each engine replica (engine.replicas > 1)");

const Ray = z
  .strictObject({
    address: name()
      .optional()
      .describe(
        "address of an existing Ray cluster for the replicas (e.g. head-node:6379); omitted: the engine starts a local one",
      ),
  })
  .describe("the Ray cluster the engine's replicas run on");

export const Engine = z
  .strictObject({
    url: z
      .url({ error: "expected a URL like http://host:port" })
      .optional()
      .describe(
        "URL of a running engine (e.g. on a GPU server); omitted: the CLI starts a local engine on loopback",
      ),
    tokenEnv: name()
      .default("MARFT_ENGINE_TOKEN")
      .describe("environment variable holding the bearer token of the engine at `url`"),
    device: z.enum(["auto", "cpu", "cuda"]).default("auto").describe("device of a locally started engine"),
    threads: posInt()
      .optional()
      .describe("torch CPU threads of a locally started engine (default: torch's choice)"),
    stallSeconds: posNum()
      .default(300)
      .describe(
        "a call fails when the engine shows no progress for this long: no call or decode step finished and its compute thread used no CPU time (a slow engine that works never fails)",
      ),
    replicas: posInt()
      .default(1)
      .describe(
        "engine replicas (Ray actors) behind one engine API, each holding every base and adapter: sample calls go to the least-loaded one, training is data-parallel over all; 1: one engine process, no Ray",
      ),
    ray: Ray.prefault({}),
    replica: Replica.prefault({}),
  })
  .describe("where the compute engine runs");

export const Base = z
  .strictObject({
    source: name().describe(
      "tiny:<preset> (random init, tests), hf:<local dir>, gguf:<file>, or pkg:smollm2-135m-instruct",
    ),
    dtype: z
      .enum(["auto", "float32", "bfloat16"])
      .default("auto")
      .describe(
        "auto: bf16 on a GPU, and on a CPU only where it has native bf16 (AVX512_BF16 or AMX), else float32; bfloat16: bf16 on either; float32: exact sample/forward parity (the tests' choice)",
      ),
    seed: nonNegInt().default(0).describe("seed of a random-init (tiny:) base"),
    prefixCacheMb: z
      .number({ error: "expected a number of MiB" })
      .nonnegative({ error: "expected a number of MiB >= 0" })
      .default(0)
      .describe(
        "memory (MiB) for the engine's shared-prefix KV cache on this base: prompts that start like an earlier one of the same adapter (system prompt, header, few-shot examples) prefill only the rest; 0: off (reuse changes fp32 rounding, so sampled log-probs match a forward pass within tolerance, not bit for bit)",
      ),
  })
  .describe("a base model that agents (and the critic) put their LoRA adapters on");

/** LoRA on some transformer layers only (0-based, negative from the last); null: all layers. */
export const layerList = (description: string) =>
  z
    .array(z.number({ error: "expected an integer" }).int({ error: "expected an integer" }))
    .min(1, { error: "expected at least one layer index" })
    .nullable()
    .default(null)
    .describe(description);

const Lora = z
  .strictObject({
    r: posInt().default(8).describe("LoRA rank"),
    alpha: posNum().default(16).describe("LoRA alpha (scale = alpha / r)"),
    dropout: z
      .number({ error: "expected a number in [0, 1)" })
      .min(0)
      .lt(1, { error: "expected a number in [0, 1)" })
      .default(0)
      .describe("LoRA dropout (keep 0 for bit-reproducible resume)"),
    targetModules: z
      .array(name())
      .min(1, { error: "expected at least one module name" })
      .default(["q_proj", "v_proj"])
      .describe("modules that get LoRA weights"),
    layers: layerList(
      "only these transformer layers get LoRA weights (0-based, negative from the last); null: all",
    ),
  })
  .describe("the agent's own LoRA adapter");

const SharedAdapter = z
  .strictObject({
    shared: name().describe("id of the agent whose adapter this agent shares (they train it together)"),
  })
  .describe("share another agent's adapter");

const Sampling = z
  .strictObject({
    temperature: nonNegNum()
      .default(1)
      .describe("sampling temperature (0 = greedy; a trainable agent needs > 0)"),
    topP: z
      .number({ error: "expected a number in (0, 1]" })
      .gt(0, { error: "expected a number in (0, 1]" })
      .max(1, { error: "expected a number in (0, 1]" })
      .default(1)
      .describe("nucleus sampling mass"),
    topK: nonNegInt().default(0).describe("top-k truncation (0 = off)"),
    maxNewTokens: posInt().default(64).describe("most tokens per action"),
    stop: z.array(z.string()).default([]).describe("stop strings; the action is cut before one"),
    draftTokens: nonNegInt()
      .max(32, { error: "expected an integer from 0 to 32" })
      .default(0)
      .describe(
        "speculative decoding: up to this many tokens a decode step drafts from the agent's own prompt and answer (prompt lookup) and keeps where exact speculative sampling accepts them; the same distribution, fewer steps for agents that restate what they see (0 = off)",
      ),
  })
  .describe("how the agent samples its actions");

export const Agent = z
  .strictObject({
    id: z
      .string({ error: 'expected an agent id like "actor"' })
      .regex(/^[A-Za-z][A-Za-z0-9_-]*$/, {
        error: "expected an agent id of letters, digits, _ or - (starting with a letter)",
      })
      .describe("unique agent id (also its adapter's name)"),
    role: name().describe("the agent's role; tasks label its messages with it, per-role rewards key on it"),
    label: name()
      .optional()
      .describe(
        "how the other agents' observations and the transcripts name this agent (default: its role); the role stays what tasks and rewards key on",
      ),
    systemPrompt: z.string({ error: "expected a string" }).default("").describe("the agent's system prompt"),
    base: name().describe("name of the base model (a key of `bases`)"),
    adapter: z
      .union([SharedAdapter, Lora])
      .prefault({})
      .describe("own LoRA settings, or {shared: <agent id>}"),
    trainable: z
      .boolean({ error: "expected true or false" })
      .default(true)
      .describe("false: the agent acts but never updates"),
    sampling: Sampling.prefault({}),
    lr: posNum().default(1e-5).describe("policy learning rate (AdamW)"),
    maxStaleness: nonNegInt()
      .optional()
      .describe(
        "train.async: this agent's bound on the versions a trained turn may lag its adapter (default train.async.maxStaleness)",
      ),
  })
  .describe("an agent profile (DESIGN §3)");
