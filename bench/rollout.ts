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

// The reference's scheme runs in both precisions and the faster one is the baseline: in fp32, and in
// bf16 as Hugging Face runs a bf16 model. MARFT's engine runs the base as the demo does (bf16).
const REFERENCE_DTYPES = ["float32", "bfloat16"] as const;

export interface RolloutBenchCase {
  agents: number;
  graph: "sequential" | "parallel";
  marftSeconds: number;
  referenceSeconds: number; // the faster of referenceSecondsByDtype
  referenceSecondsByDtype: Record<(typeof REFERENCE_DTYPES)[number], number>;
  marftTokens: number;
  referenceTokens: number; // of the faster reference run
  referenceTokensByDtype: Record<(typeof REFERENCE_DTYPES)[number], number>;
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
  opts: { quick?: boolean; episodes?: number; log?: (s: string) => void } = {},
): Promise<{
  settings: { episodes: number; maxNewTokens: number; temperature: number; topK: number };
  cases: RolloutBenchCase[];
  rollout_speedup_2_agents: number;
  rollout_speedup_4_agents: number;
}> {
  const log = opts.log ?? ((s: string) => process.stderr.write(`${s}\n`));
  const episodes = opts.episodes ?? (opts.quick ? 32 : 64);
  const maxNewTokens = opts.quick ? 128 : 256;
  const problems = loadMathProblems(join(datasetsDir(), "gsm8k/train.jsonl")).slice(0, episodes);
  const engine = await startLocalEngine({ logFile: join(tmpdir(), "marft-bench-engine.log"), device: "cpu" });
  const cases: RolloutBenchCase[] = [];
  try {
    const client = engine.client;
    await client.createBase({ name: "smol", source: MODEL, dtype: "bfloat16" });
    for (const a of team(4)) await client.createAdapter({ name: a.id, base: "smol" });
    const modelDir = join(
      process.env["MARFT_CACHE_DIR"] ?? join(REPO, ".cache"),
      "models/smollm2-135m-instruct",
    );
    for (const n of [2, 4]) {
      for (const graph of ["sequential", "parallel"] as const) {
        const agents = team(n);
        log(`rollout bench: ${n} agents, ${graph}, ${episodes} episodes`);
        log("  marft start");
        const m = await marftRollout(client, agents, { kind: graph }, problems, maxNewTokens, 1);
        log(`  marft ${m.seconds.toFixed(1)}s ${m.tokens} tokens; reference start`);
        const refs = REFERENCE_DTYPES.map((dtype) =>
          referenceRollout(
            agents,
            graph,
            problems.map((p) => p.problem),
            maxNewTokens,
            modelDir,
            1,
            dtype,
          ),
        );
        const ref = refs.reduce((a, b) => (b.seconds < a.seconds ? b : a));
        log(
          `  reference ${refs.map((r, i) => `${REFERENCE_DTYPES[i]} ${r.seconds.toFixed(1)}s ${r.tokens} tokens`).join(", ")}`,
        );
        cases.push({
          agents: n,
          graph,
          marftSeconds: m.seconds,
          referenceSeconds: ref.seconds,
          referenceSecondsByDtype: { float32: refs[0]!.seconds, bfloat16: refs[1]!.seconds },
          referenceTokensByDtype: { float32: refs[0]!.tokens, bfloat16: refs[1]!.tokens },
          marftTokens: m.tokens,
          referenceTokens: ref.tokens,
          speedup: ref.seconds / m.seconds,
        });
      }
    }
  } finally {
    await engine.stop();
  }
  const seq = (n: number) => cases.find((c) => c.agents === n && c.graph === "sequential")!.speedup;
  return {
    settings: { episodes, maxNewTokens, temperature: TEMPERATURE, topK: TOP_K },
    cases,
    rollout_speedup_2_agents: seq(2),
    rollout_speedup_4_agents: seq(4),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const r = await benchRollout({ quick: process.argv.includes("--quick") });
  console.table(r.cases);
  console.log(
    JSON.stringify({
      rollout_speedup_2_agents: r.rollout_speedup_2_agents,
      rollout_speedup_4_agents: r.rollout_speedup_4_agents,
    }),
  );
}
