// Rollout speed: MARFT's concurrent, batched rollout against the MARFT reference's scheme
// (bench/reference_rollout.py: a model copy per agent, agents one after another, plain `generate`
// per agent over the batch of episodes), on the same model, prompts, sampling settings and token
// limits, measured in the same run. Both sides exclude model loading.
//
// `npx tsx bench/rollout.ts [--quick]` prints a table; `benchRollout()` is what `marft bench` calls.
import { execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type { ComputeEngine } from "../src/client/compute.ts";
import { engineAllocatorEnv, startLocalEngine } from "../src/client/launcher.ts";
import { datasetsDir } from "../src/envs/datasets.ts";
import { loadMathProblems } from "../src/envs/math/data.ts";
import { MathEnv } from "../src/envs/math/env.ts";
import type { AgentSpec, GraphSpec } from "../src/flexmg/types.ts";
import { type RolloutStats, rollout } from "../src/rollout/rollout.ts";

const REPO = resolve(import.meta.dirname, "..");
export const MODEL = "pkg:smollm2-135m-instruct";
// The reference's own sampling settings (temperature 0.5, top-k 50) and a token limit long enough
// that most answers end by themselves, as they do in real runs (the reference allows 512): response
// lengths then vary, which is where refilling the batch pays and padding to the longest does not.
const TEMPERATURE = 0.5;
const TOP_K = 50;

// MARFT's engine runs the base as the demo does (dtype auto: bf16 on a GPU or a CPU with native bf16,
// else fp32). The reference's scheme runs in fp32 and, where the CPU has native bf16 (auto chose it),
// also in bf16 as Hugging Face runs a bf16 model; the faster one is the baseline. Without native bf16
// a bf16 matmul runs dozens of times slower than fp32 (docs/MEASUREMENTS.md), so it is never the
// baseline's best setting there.
const REFERENCE_DTYPES = ["float32", "bfloat16"] as const;
type Dtype = (typeof REFERENCE_DTYPES)[number];

// What the baseline measures, named: the reference's real iteration also runs a critic pass and two
// full-vocabulary log-prob forwards per agent, which this does not model (docs/MEASUREMENTS.md).
const BASELINE =
  "the MARFT reference's sampling scheme only: a model copy per agent, HF generate per agent over the batch of episodes (its critic and log-prob passes are not included)";

export interface RolloutBenchCase {
  seed: number;
  agents: number;
  graph: "sequential" | "parallel";
  marftSeconds: number;
  marftDtype: string; // what dtype auto chose for MARFT's engine
  referenceSeconds: number; // the faster of referenceSecondsByDtype
  referenceSecondsByDtype: Partial<Record<Dtype, number>>; // after the first seed: the faster dtype only
  marftTokens: number;
  referenceTokens: number; // of the faster reference run
  referenceTokensByDtype: Partial<Record<Dtype, number>>;
  speedup: number;
  // Where the time goes. MARFT's engine: decode steps, and its sampler's wall seconds in prefills and
  // in decode steps; the reference: `generate`'s steps. The longest episode's response tokens bound
  // from below the decode steps any sampler that emits one token per row per step needs, whatever
  // its batching: a sequential team's episode is a chain of its agents' answers.
  marftDecodeSteps: number;
  marftPrefillSeconds: number;
  marftDecodeSeconds: number;
  referenceDecodeSteps: number;
  longestEpisodeTokens: number;
  // Prompt tokens admitted and prefilled: MARFT's engine (the rest came from its prefix cache, which
  // starts empty) and the reference's padded batches.
  marftPromptTokens: number;
  marftPrefillTokens: number;
  referencePrefillTokens: number;
  // The reference's model FLOPs over those of a sampler that pads nothing, stops each answer at its
  // end and prefills each agent's shared prompt prefix once, on the reference's own draw: what such a
  // sampler gains over `generate` where time is FLOPs, with no faster kernels or steps.
  referenceWorkRatio: number;
  // Response tokens per step of prompt-lookup drafting, from MARFT's sampled text (promptLookupRate).
  promptLookupTokensPerStep: number;
  // MARFT with speculative decoding (sampling.draft_tokens = DRAFT_TOKENS, speculative.py): the same
  // distribution of answers, another draw of them; its seconds, tokens and decode steps, and the
  // reference's time over its time.
  draftSeconds: number;
  draftTokens: number;
  draftDecodeSteps: number;
  speedupDrafts: number;
}

// Drafted tokens a step for MARFT's second run of each case: 8 did best of 4 and 8 in the prompt-
// lookup rates of this rollout's text (docs/MEASUREMENTS.md).
const DRAFT_TOKENS = 8;

/**
 * Tokens per decode step that speculative decoding with prompt-lookup drafts would take on these
 * turns: at each step, draft the `k` tokens that followed the latest earlier occurrence of the last
 * `n` tokens of prompt + response so far, and count the draft's tokens that match the sampled ones,
 * plus the step's own token. Matching the sampled text estimates acceptance: with exact speculative
 * sampling a drafted token is accepted with the probability that it is the one drawn.
 */
export function promptLookupRate(
  turns: { promptIds: number[]; responseIds: number[] }[],
  n = 2,
  k = 8,
): number {
  let steps = 0;
  let tokens = 0;
  for (const { promptIds, responseIds: r } of turns) {
    const ctx = [...promptIds];
    let i = 0;
    while (i < r.length) {
      let accepted = 0;
      search: for (let at = ctx.length - n - 1; at >= 0 && ctx.length >= n; at--) {
        for (let j = 0; j < n; j++) if (ctx[at + j] !== ctx[ctx.length - n + j]) continue search;
        while (accepted < k && at + n + accepted < ctx.length && i + accepted < r.length) {
          if (ctx[at + n + accepted] !== r[i + accepted]) break;
          accepted++;
        }
        break;
      }
      const take = Math.min(accepted + 1, r.length - i);
      ctx.push(...r.slice(i, i + take));
      i += take;
      steps++;
    }
    tokens += r.length;
  }
  return steps > 0 ? tokens / steps : 0;
}

export function team(n: number): AgentSpec[] {
  const roles = ["reasoner", "actor", "verifier", "summarizer"];
  return Array.from({ length: n }, (_, i) => ({
    id: `agent${i}`,
    role: roles[i] ?? `agent${i}`,
    systemPrompt: `You are the ${roles[i] ?? "helper"} of a team solving math word problems. Be brief.`,
  }));
}

export async function marftRollout(
  client: ComputeEngine,
  agents: AgentSpec[],
  graph: GraphSpec,
  problems: ReturnType<typeof loadMathProblems>,
  maxNewTokens: number,
  seed: number,
  draftTokens = 0,
): Promise<{
  seconds: number;
  tokens: number;
  stats: RolloutStats;
  promptTokens: number;
  prefillTokens: number;
  longestEpisodeTokens: number;
  promptLookupTokensPerStep: number;
}> {
  const run = (maxTokens: number, adapter: (a: AgentSpec) => string) =>
    rollout({
      engine: client,
      makeEnv: () => new MathEnv(agents, graph, { extract: "last-number" }),
      tasks: problems,
      taskId: (p) => p.id,
      profiles: Object.fromEntries(
        agents.map((a) => [
          a.id,
          {
            adapter: adapter(a),
            sampling: {
              temperature: TEMPERATURE,
              top_k: TOP_K,
              max_new_tokens: maxTokens,
              draft_tokens: draftTokens,
            },
          },
        ]),
      ),
      seed,
      maxConcurrentEpisodes: problems.length,
    });
  await run(4, (a) => a.id); // warm-up, as the reference's side does (kernels for these shapes), not timed
  // Timed on fresh adapters: their prefix cache starts empty, as it does in training after every
  // update (an entry holds one adapter's keys at one set of weights). On the warm-up's adapters the
  // cache would already hold every agent's prompt up to the problem's end, which the reference's
  // side has to prefill.
  // Each a copy of its agent's adapter in base and LoRA shape, so a step costs what it did.
  const cold = (a: AgentSpec) => `${a.id}-cold`;
  const standing = new Map((await client.listAdapters()).adapters.map((x) => [x.name, x]));
  for (const a of agents) {
    const { base, lora } = standing.get(a.id)!;
    await client.createAdapter({ name: cold(a), base, lora });
  }
  const admitted = async () => {
    const p = (await client.stats()).prefix_cache;
    return { prompt: p?.prompt_tokens ?? 0, prefill: p?.prefill_tokens ?? 0 };
  };
  const before = await admitted();
  let r: Awaited<ReturnType<typeof run>>;
  try {
    r = await run(maxNewTokens, cold);
  } finally {
    for (const a of agents) await client.deleteAdapter(cold(a));
  }
  const after = await admitted();
  const turns = r.episodes.flatMap((e) => e.turns);
  return {
    seconds: r.stats.seconds,
    tokens: r.stats.tokensSampled,
    stats: r.stats,
    promptTokens: after.prompt - before.prompt,
    prefillTokens: after.prefill - before.prefill,
    longestEpisodeTokens: Math.max(
      ...r.episodes.map((e) => e.turns.reduce((n, t) => n + t.responseIds.length, 0)),
    ),
    promptLookupTokensPerStep: promptLookupRate(turns),
  };
}

interface ReferenceRun {
  seconds: number;
  tokens: number;
  steps: number;
  promptTokens: number;
  prefillTokens: number; // positions its prefills computed, padding included
  workRatio: number; // its model FLOPs over an unpadded sampler's on the same draw (reference_rollout.py)
}

function referenceRollout(
  agents: AgentSpec[],
  graph: "sequential" | "parallel",
  problems: string[],
  maxNewTokens: number,
  modelDir: string,
  seed: number,
  dtype: (typeof REFERENCE_DTYPES)[number],
): ReferenceRun {
  const dir = mkdtempSync(join(tmpdir(), "marft-bench-"));
  const spec = join(dir, "spec.json");
  writeFileSync(
    spec,
    JSON.stringify({
      agents: agents.map((a) => ({ role: a.role, system_prompt: a.systemPrompt })),
      graph,
      problems,
      max_new_tokens: maxNewTokens,
      temperature: TEMPERATURE,
      top_k: TOP_K,
      seed,
      model_dir: modelDir,
      dtype,
    }),
  );
  const out = execFileSync(join(REPO, ".venv/bin/python"), [join(REPO, "bench/reference_rollout.py"), spec], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "ignore"],
    env: { ...process.env, ...engineAllocatorEnv() }, // the allocator MARFT's engine runs on: a fair pair
  });
  const r = JSON.parse(out.trim().split("\n").at(-1)!) as {
    seconds: number;
    response_tokens: number;
    decode_steps: number;
    prompt_tokens: number;
    prefill_tokens: number;
    flops: number;
    flops_unpadded: number;
  };
  return {
    seconds: r.seconds,
    tokens: r.response_tokens,
    steps: r.decode_steps,
    promptTokens: r.prompt_tokens,
    prefillTokens: r.prefill_tokens,
    workRatio: r.flops / r.flops_unpadded,
  };
}

/**
 * Episodes per rollout: by default what RL training batches (the demo samples 64 episodes per
 * iteration; --quick: 32). With few episodes both sides wait on the slowest episode's chain of agents
 * and the comparison measures little more than one decode step against another (README: 8 episodes).
 */
export async function benchRollout(
  opts: {
    quick?: boolean;
    episodes?: number;
    seeds?: number[];
    agents?: number[];
    graphs?: ("sequential" | "parallel")[];
    log?: (s: string) => void;
  } = {},
): Promise<{
  settings: { episodes: number; maxNewTokens: number; temperature: number; topK: number; seeds: number[] };
  baseline: string;
  cases: RolloutBenchCase[];
  rollout_speedup_2_agents?: number;
  rollout_speedup_4_agents?: number;
  rollout_speedup_4_agents_by_seed?: number[];
  rollout_speedup_4_agents_drafts?: number;
  rollout_speedup_4_agents_drafts_by_seed?: number[];
  rollout_work_ratio_4_agents?: number;
}> {
  const log = opts.log ?? ((s: string) => process.stderr.write(`${s}\n`));
  const episodes = opts.episodes ?? (opts.quick ? 32 : 64);
  const maxNewTokens = opts.quick ? 128 : 256;
  const problems = loadMathProblems(join(datasetsDir(), "gsm8k/train.jsonl")).slice(0, episodes);
  const engine = await startLocalEngine({ logFile: join(tmpdir(), "marft-bench-engine.log"), device: "cpu" });
  const cases: RolloutBenchCase[] = [];
  const seeds = opts.seeds ?? [1];
  const fastest = new Map<string, Dtype>();
  try {
    const client = engine.client;
    // as the demo runs it: dtype auto, the prefix cache on (each agent's system prompt is the same in
    // every episode; an agent's prompt holds the problem the earlier agents' prompts began with)
    const base = await client.createBase({
      name: "smol",
      source: MODEL,
      dtype: "auto",
      prefix_cache_mb: 1024,
    });
    const candidates: Dtype[] = base.dtype === "bfloat16" ? [...REFERENCE_DTYPES] : ["float32"];
    log(
      `rollout bench: MARFT's base in ${base.dtype} (${base.dtype_reason}); reference in ${candidates.join(", ")}`,
    );
    for (const a of team(4)) await client.createAdapter({ name: a.id, base: "smol" });
    const modelDir = join(
      process.env["MARFT_CACHE_DIR"] ?? join(REPO, ".cache"),
      "models/smollm2-135m-instruct",
    );
    for (const seed of seeds)
      for (const n of opts.agents ?? [2, 4]) {
        for (const graph of opts.graphs ?? (["sequential", "parallel"] as const)) {
          const agents = team(n);
          log(`rollout bench: ${n} agents, ${graph}, ${episodes} episodes, seed ${seed}`);
          log("  marft start");
          const m = await marftRollout(client, agents, { kind: graph }, problems, maxNewTokens, seed);
          log(`  marft ${m.seconds.toFixed(1)}s ${m.tokens} tokens; with drafts start`);
          const d = await marftRollout(
            client,
            agents,
            { kind: graph },
            problems,
            maxNewTokens,
            seed,
            DRAFT_TOKENS,
          );
          log(`  marft with drafts ${d.seconds.toFixed(1)}s ${d.tokens} tokens; reference start`);
          // both precisions at the first seed; later seeds run the one that was faster there
          const key = `${n} ${graph}`;
          const dtypes = fastest.has(key) ? [fastest.get(key)!] : candidates;
          const refs = dtypes.map((dtype) =>
            referenceRollout(
              agents,
              graph,
              problems.map((p) => p.problem),
              maxNewTokens,
              modelDir,
              seed,
              dtype,
            ),
          );
          const ref = refs.reduce((a, b) => (b.seconds < a.seconds ? b : a));
          fastest.set(key, dtypes[refs.indexOf(ref)]!);
          log(
            `  reference ${refs.map((r, i) => `${dtypes[i]} ${r.seconds.toFixed(1)}s ${r.tokens} tokens`).join(", ")}`,
          );
          cases.push({
            seed,
            agents: n,
            graph,
            marftSeconds: m.seconds,
            marftDtype: base.dtype,
            referenceSeconds: ref.seconds,
            referenceSecondsByDtype: Object.fromEntries(dtypes.map((d, i) => [d, refs[i]!.seconds])),
            referenceTokensByDtype: Object.fromEntries(dtypes.map((d, i) => [d, refs[i]!.tokens])),
            marftTokens: m.tokens,
            referenceTokens: ref.tokens,
            speedup: ref.seconds / m.seconds,
            marftDecodeSteps: m.stats.decodeSteps,
            marftPrefillSeconds: m.stats.prefillSeconds,
            marftDecodeSeconds: m.stats.decodeSeconds,
            referenceDecodeSteps: ref.steps,
            longestEpisodeTokens: m.longestEpisodeTokens,
            marftPromptTokens: m.promptTokens,
            marftPrefillTokens: m.prefillTokens,
            referencePrefillTokens: ref.prefillTokens,
            referenceWorkRatio: ref.workRatio,
            promptLookupTokensPerStep: m.promptLookupTokensPerStep,
            draftSeconds: d.seconds,
            draftTokens: d.tokens,
            draftDecodeSteps: d.stats.decodeSteps,
            speedupDrafts: ref.seconds / d.seconds,
          });
        }
      }
  } finally {
    await engine.stop();
  }
  // per seed, sequential teams; the headline is the mean over the seeds
  const sequential = (n: number) => cases.filter((c) => c.agents === n && c.graph === "sequential");
  const bySeed = (n: number, drafts = false) =>
    sequential(n).map((c) => (drafts ? c.speedupDrafts : c.speedup));
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : undefined);
  return {
    settings: { episodes, maxNewTokens, temperature: TEMPERATURE, topK: TOP_K, seeds },
    baseline: BASELINE,
    cases,
    rollout_speedup_2_agents: mean(bySeed(2)),
    rollout_speedup_4_agents: mean(bySeed(4)),
    rollout_speedup_4_agents_by_seed: bySeed(4),
    rollout_speedup_4_agents_drafts: mean(bySeed(4, true)),
    rollout_speedup_4_agents_drafts_by_seed: bySeed(4, true),
    rollout_work_ratio_4_agents: mean(sequential(4).map((c) => c.referenceWorkRatio)),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const arg = (k: string) => process.argv.find((a) => a.startsWith(`--${k}=`))?.slice(k.length + 3);
  const ints = (k: string) => arg(k)?.split(",").map(Number);
  const r = await benchRollout({
    quick: process.argv.includes("--quick"),
    ...(ints("seeds") ? { seeds: ints("seeds") } : {}),
    ...(ints("agents") ? { agents: ints("agents") } : {}),
    ...(arg("graphs") ? { graphs: arg("graphs")!.split(",") as ("sequential" | "parallel")[] } : {}),
    ...(ints("episodes") ? { episodes: ints("episodes")![0]! } : {}),
  });
  console.table(r.cases);
  console.log(
    JSON.stringify({
      rollout_speedup_2_agents: r.rollout_speedup_2_agents,
      rollout_speedup_4_agents: r.rollout_speedup_4_agents,
      rollout_speedup_4_agents_by_seed: r.rollout_speedup_4_agents_by_seed,
      rollout_speedup_4_agents_drafts: r.rollout_speedup_4_agents_drafts,
      rollout_speedup_4_agents_drafts_by_seed: r.rollout_speedup_4_agents_drafts_by_seed,
      rollout_work_ratio_4_agents: r.rollout_work_ratio_4_agents,
    }),
  );
}
