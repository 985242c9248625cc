// Rollout on engine replicas: `ray_rollout_scaling_2_replicas` is the same rollout (MARFT's, the
// rollout bench's model, team of 2 in sequence, prompts, seeds and sampling settings) on an engine of
// 2 replicas of 1 thread each (engine.replicas: 2, a local Ray cluster) against one engine of 2
// threads (engine.replicas: 1, today's process), measured in one run: sampled tokens per second on
// the replicas over those on the one engine. Tokens per second, not wall time: in bf16 a row's logits
// depend in the last bits on its batch and on the thread count, so the same seeds sample other
// tokens, and responses of other lengths, from round to round (measured: 5636-6565 tokens for one
// engine's 32 episodes). Both exclude starting the engine and loading the model, and warm up first.
//
// `npx tsx bench/replicas.ts [--quick]` prints the figures; `benchReplicas()` is what `marft bench`
// calls.
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ReplicaOptions, startLocalEngine } from "../src/client/launcher.ts";
import { datasetsDir } from "../src/envs/datasets.ts";
import { loadMathProblems } from "../src/envs/math/data.ts";
import { MODEL, marftRollout, team } from "./rollout.ts";

export interface ReplicaBenchSide {
  replicas: number;
  threadsPerReplica: number;
  /** the best round's sampled tokens per second */
  tokensPerSecond: number;
  secondsPerRound: number[];
  tokensPerRound: number[];
  /** sample calls each replica served (one engine: one entry) */
  sampleCalls: number[];
}

async function side(
  replicas: number,
  threads: number,
  problems: ReturnType<typeof loadMathProblems>,
  maxNewTokens: number,
): Promise<{ run: () => Promise<{ seconds: number; tokens: number }>; stop: () => Promise<number[]> }> {
  const env = { OMP_NUM_THREADS: String(threads), MKL_NUM_THREADS: String(threads) };
  const options: ReplicaOptions | undefined =
    replicas > 1 ? { count: replicas, cpus: threads, threads } : undefined;
  const engine = await startLocalEngine({
    logFile: join(tmpdir(), `marft-bench-replicas-${replicas}.log`),
    device: "cpu",
    env,
    ...(options ? { replicas: options } : {}),
  });
  const client = engine.client;
  const agents = team(2);
  await client.createBase({ name: "smol", source: MODEL, dtype: "bfloat16" });
  for (const a of agents) await client.createAdapter({ name: a.id, base: "smol" });
  return {
    run: () => marftRollout(client, agents, { kind: "sequential" }, problems, maxNewTokens, 1),
    stop: async () => {
      const stats = await client.stats().catch(() => undefined);
      await engine.stop();
      if (!stats) return [];
      return stats.replicas?.map((r) => r.sample_calls) ?? [stats.endpoints["POST /v1/sample"]?.calls ?? 0];
    },
  };
}

export async function benchReplicas(
  opts: { quick?: boolean; episodes?: number; log?: (s: string) => void } = {},
): Promise<{
  settings: { episodes: number; maxNewTokens: number; agents: number; rounds: number };
  one: ReplicaBenchSide;
  two: ReplicaBenchSide;
  ray_rollout_scaling_2_replicas: number;
}> {
  const log = opts.log ?? ((s: string) => process.stderr.write(`${s}\n`));
  const episodes = opts.episodes ?? (opts.quick ? 32 : 64);
  const maxNewTokens = opts.quick ? 128 : 256;
  const rounds = 2;
  const problems = loadMathProblems(join(datasetsDir(), "gsm8k/train.jsonl")).slice(0, episodes);
  // Both engines are up at once (an idle one costs nothing) and take turns, in the order
  // two, one, one, two, ...: a slow spell of this shared machine falls on both; each side's figure
  // is its best round.
  const setups = [
    { replicas: 2, threads: 1 },
    { replicas: 1, threads: 2 },
  ];
  const sides: Array<Awaited<ReturnType<typeof side>>> = [];
  const times: number[][] = [[], []];
  const tokens: number[][] = [[], []];
  const sampleCalls: number[][] = [[], []];
  try {
    for (const s of setups) sides.push(await side(s.replicas, s.threads, problems, maxNewTokens));
    for (let round = 0; round < rounds; round++) {
      for (const i of round % 2 === 0 ? [0, 1] : [1, 0]) {
        const r = await sides[i]!.run();
        times[i]!.push(r.seconds);
        tokens[i]!.push(r.tokens);
        log(
          `replica bench: ${setups[i]!.replicas} replica(s) of ${setups[i]!.threads} thread(s), ${episodes} episodes: ${r.seconds.toFixed(1)}s ${r.tokens} tokens`,
        );
      }
    }
  } finally {
    for (const [i, s] of sides.entries()) sampleCalls[i] = await s.stop();
  }
  const result = (i: number): ReplicaBenchSide => ({
    replicas: setups[i]!.replicas,
    threadsPerReplica: setups[i]!.threads,
    tokensPerSecond: Math.max(...times[i]!.map((t, k) => tokens[i]![k]! / t)),
    secondsPerRound: times[i]!,
    tokensPerRound: tokens[i]!,
    sampleCalls: sampleCalls[i]!,
  });
  const two = result(0);
  const one = result(1);
  return {
    settings: { episodes, maxNewTokens, agents: 2, rounds },
    one,
    two,
    ray_rollout_scaling_2_replicas: two.tokensPerSecond / one.tokensPerSecond,
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const r = await benchReplicas({ quick: process.argv.includes("--quick") });
  console.log(JSON.stringify(r, null, 2));
}
