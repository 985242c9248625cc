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
import { startLocalEngine } from "../src/client/launcher.ts";
import { datasetsDir } from "../src/envs/datasets.ts";
import { loadMathProblems } from "../src/envs/math/data.ts";
import { MathEnv } from "../src/envs/math/env.ts";
import type { AgentSpec, GraphSpec } from "../src/flexmg/types.ts";
import { rollout } from "../src/rollout/rollout.ts";

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
): Promise<{ seconds: number; tokens: number }> {
  const run = (maxTokens: number) =>
    rollout({
      engine: client,
      makeEnv: () => new MathEnv(agents, graph, { extract: "last-number" }),
      tasks: problems,
      taskId: (p) => p.id,
      profiles: Object.fromEntries(
        agents.map((a) => [
          a.id,
          { adapter: a.id, sampling: { temperature: TEMPERATURE, top_k: TOP_K, max_new_tokens: maxTokens } },
        ]),
      ),
      seed,
      maxConcurrentEpisodes: problems.length,
    });
  await run(4); // warm-up, as the reference's side does (kernels for these shapes), not timed
  const r = await run(maxNewTokens);
  return { seconds: r.stats.seconds, tokens: r.stats.tokensSampled };
}

function referenceRollout(
  agents: AgentSpec[],
  graph: "sequential" | "parallel",
  problems: string[],
  maxNewTokens: number,
  modelDir: string,
  seed: number,
  dtype: (typeof REFERENCE_DTYPES)[number],
): { seconds: number; tokens: number } {
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
  });
  const r = JSON.parse(out.trim().split("\n").at(-1)!) as { seconds: number; response_tokens: number };
  return { seconds: r.seconds, tokens: r.response_tokens };
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
          log(`  marft ${m.seconds.toFixed(1)}s ${m.tokens} tokens; reference start`);
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
          });
        }
      }
  } finally {
    await engine.stop();
  }
  // per seed, sequential teams; the headline is the mean over the seeds
  const bySeed = (n: number) =>
    cases.filter((c) => c.agents === n && c.graph === "sequential").map((c) => c.speedup);
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : undefined);
  return {
    settings: { episodes, maxNewTokens, temperature: TEMPERATURE, topK: TOP_K, seeds },
    baseline: BASELINE,
    cases,
    rollout_speedup_2_agents: mean(bySeed(2)),
    rollout_speedup_4_agents: mean(bySeed(4)),
    rollout_speedup_4_agents_by_seed: bySeed(4),
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
    }),
  );
}
