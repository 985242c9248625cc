// `marft bench`: the speed and memory figures, each a ratio against a baseline measured in the same
// run (these machines are noisy; absolute numbers from another run mean little). Writes
// bench/results.json and prints a table.
//
//   engine   bench/engine_bench.py: sampling vs plain `generate`, mixed-adapter batch vs per-adapter
//            calls, memory of N agents on one base vs a model copy per agent, training tokens/s
//   sandbox  bench/sandbox.ts: MBPP test executions per second under full isolation
//   speed    bench/speed_bench.py: decode and training against a matmul probe, prefix reuse, several
//            adapters' PPO in shared passes, short answers at batch 64 vs plain `generate`
//   rollout  bench/rollout.ts: MARFT's rollout vs the reference's sampling scheme, 2 and 4 agents,
//            seeds 1-3
//   replicas bench/replicas.ts: one rollout on 2 engine replicas of 1 thread (Ray) vs 1 engine of 2
//   async    bench/async.ts: wall time per iteration of tiny-secret, synchronous vs train.async, with
//            both reward curves and the phase timings
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { engineAllocatorEnv } from "../client/launcher.ts";
import { writeFileAtomic } from "../train/rundir.ts";

const REPO = resolve(import.meta.dirname, "../..");

/** bench/ is in the repository, not in the npm package: its scripts are found at run time. */
const benchScript = (name: string) => pathToFileURL(join(REPO, "bench", name)).href;

function machine(): Record<string, unknown> {
  let torch = "";
  try {
    torch = execFileSync(join(REPO, ".venv/bin/python"), ["-c", "import torch; print(torch.__version__)"], {
      encoding: "utf8",
    }).trim();
  } catch {
    torch = "unknown";
  }
  return {
    cpu: cpus()[0]?.model ?? "unknown",
    cores: cpus().length,
    memory_gib: Math.round(totalmem() / 2 ** 30),
    node: process.version,
    torch,
    gpu: "none",
  };
}

const USAGE = `usage: marft bench [--quick] [--only=engine,sandbox,speed,rollout,replicas,async] [--episodes=N]

Measures the speed and memory figures (each a ratio against a baseline measured in the same run) and
writes bench/results.json.

options:
  --quick            shorter measurements
  --only=PARTS       some of engine, sandbox, speed, rollout, replicas, async (default: all)
  --episodes=N       episodes of the rollout comparison
  -h, --help         this text
`;

export async function benchCommand(args: string[]): Promise<void> {
  if (args.includes("--help") || args.includes("-h")) {
    process.stdout.write(USAGE);
    return;
  }
  const unknown = args.find((a) => a !== "--quick" && !/^--(only|episodes)=/.test(a));
  if (unknown !== undefined) {
    process.stderr.write(`marft bench: unknown option "${unknown}"\n\n${USAGE}`);
    process.exitCode = 2;
    return;
  }
  const quick = args.includes("--quick");
  const only = args
    .find((a) => a.startsWith("--only="))
    ?.slice("--only=".length)
    .split(",");
  const want = (part: string) => only === undefined || only.includes(part);
  const episodesArg = args.find((a) => a.startsWith("--episodes="))?.slice("--episodes=".length);
  const episodes = episodesArg === undefined ? undefined : Number(episodesArg);
  if (episodes !== undefined && !(Number.isInteger(episodes) && episodes > 0)) {
    throw new Error(`--episodes: expected a positive integer, got "${episodesArg}"`);
  }
  const out = join(REPO, "bench/results.json");
  // --only: the parts not measured now keep their figures from the last run (each part's ratios are
  // still measured within one run of that part)
  const previous: Record<string, unknown> =
    only !== undefined && existsSync(out) ? JSON.parse(readFileSync(out, "utf8")) : {};
  const results: Record<string, unknown> = {
    ...previous,
    machine: machine(),
    date: new Date().toISOString(),
    quick,
  };
  const t0 = Date.now();
  // the Python benches run engines in their own process: on the allocator the launcher gives engines
  const benchEnv = { ...process.env, ...engineAllocatorEnv() };

  if (want("engine")) {
    process.stderr.write("bench: engine (sampling, mixed adapters, memory, training)...\n");
    const engineOut = join(REPO, "bench/.engine-results.json");
    execFileSync(
      join(REPO, ".venv/bin/python"),
      [join(REPO, "bench/engine_bench.py"), "--out", engineOut, ...(quick ? ["--quick"] : [])],
      { stdio: ["ignore", "inherit", "inherit"], env: benchEnv },
    );
    results["engine"] = JSON.parse(readFileSync(engineOut, "utf8"));
  }
  if (want("sandbox")) {
    process.stderr.write("bench: sandbox (MBPP executions under isolation)...\n");
    const { benchSandbox } = (await import(benchScript("sandbox.ts"))) as {
      benchSandbox: (o: { quick: boolean }) => Promise<unknown>;
    };
    results["sandbox"] = await benchSandbox({ quick });
  }
  if (want("speed")) {
    process.stderr.write("bench: speed (roofline, prefix reuse, shared training passes, short answers)...\n");
    const speedOut = join(REPO, "bench/.speed-results.json");
    execFileSync(
      join(REPO, ".venv/bin/python"),
      [join(REPO, "bench/speed_bench.py"), "--out", speedOut, ...(quick ? ["--quick"] : [])],
      { stdio: ["ignore", "inherit", "inherit"], env: benchEnv },
    );
    const { readFileSync } = await import("node:fs");
    results["speed"] = JSON.parse(readFileSync(speedOut, "utf8"));
  }
  if (want("rollout")) {
    process.stderr.write("bench: rollout (MARFT vs the reference scheme)...\n");
    const { benchRollout } = (await import(benchScript("rollout.ts"))) as {
      benchRollout: (o: {
        quick: boolean;
        seeds?: number[];
        graphs?: Array<"sequential">;
        episodes?: number;
      }) => Promise<unknown>;
    };
    // three seeds (the ratio moves with the sampled answers); --quick: sequential teams only
    results["rollout"] = await benchRollout({
      quick,
      seeds: [1, 2, 3],
      ...(quick ? { graphs: ["sequential" as const] } : {}),
      ...(episodes ? { episodes } : {}),
    });
  }

  if (want("replicas")) {
    process.stderr.write("bench: replicas (one rollout on 2 engine replicas vs 1 engine)...\n");
    const { benchReplicas } = (await import(benchScript("replicas.ts"))) as {
      benchReplicas: (o: { quick: boolean; episodes?: number }) => Promise<Record<string, unknown>>;
    };
    results["replicas"] = await benchReplicas({ quick, ...(episodes ? { episodes } : {}) });
  }

  if (want("async")) {
    process.stderr.write("bench: async (tiny-secret, synchronous vs train.async, 2 engine replicas)...\n");
    const { benchAsync } = (await import(benchScript("async.ts"))) as {
      benchAsync: (o: { quick: boolean }) => Promise<Record<string, unknown>>;
    };
    results["async"] = await benchAsync({ quick });
  }

  // The headline keys, flat, as the README and the issues name them.
  const engine = (results["engine"] ?? {}) as Record<string, unknown>;
  const sandbox = (results["sandbox"] ?? {}) as Record<string, unknown>;
  const roll = (results["rollout"] ?? {}) as Record<string, unknown>;
  const speed = (results["speed"] ?? {}) as Record<string, unknown>;
  const replicas = (results["replicas"] ?? {}) as Record<string, unknown>;
  const asyncPart = (results["async"] ?? {}) as Record<string, unknown>;
  const headline: Record<string, unknown> = {
    rollout_speedup_2_agents: roll["rollout_speedup_2_agents"],
    rollout_speedup_4_agents: roll["rollout_speedup_4_agents"],
    rollout_work_ratio_4_agents: roll["rollout_work_ratio_4_agents"],
    prefix_reuse_speedup: speed["prefix_reuse_speedup"],
    mixed_adapter_train_speedup: speed["mixed_adapter_train_speedup"],
    decode_roofline_fraction: speed["decode_roofline_fraction"],
    train_flops_fraction: speed["train_flops_fraction"],
    engine_vs_generate_ratio_short: speed["engine_vs_generate_ratio_short"],
    engine_vs_generate_ratio: engine["engine_vs_generate_ratio"],
    mixed_adapter_speedup: engine["mixed_adapter_speedup"],
    memory_ratio_4_agents: engine["memory_ratio_4_agents"],
    sandbox_runs_per_s: sandbox["sandbox_runs_per_s"],
    train_tokens_per_s: engine["train_tokens_per_s"],
    ray_rollout_scaling_2_replicas: replicas["ray_rollout_scaling_2_replicas"],
    async_speedup: asyncPart["async_speedup"],
    weight_sync_s_per_iteration: asyncPart["weight_sync_s_per_iteration"],
  };
  Object.assign(results, headline, { seconds: (Date.now() - t0) / 1000 });
  writeFileAtomic(out, `${resultsJson(results)}\n`);

  const targets: Record<string, string> = {
    rollout_speedup_2_agents: ">= 2",
    rollout_speedup_4_agents: ">= 5 (issue 17; mean of seeds 1-3)",
    rollout_work_ratio_4_agents: "context: the reference's FLOPs over an unpadded sampler's",
    prefix_reuse_speedup: ">= 2",
    mixed_adapter_train_speedup: ">= 1.5",
    decode_roofline_fraction: ">= 0.4",
    train_flops_fraction: ">= 0.3",
    engine_vs_generate_ratio_short: ">= 2 (batch 64, 12-20 tokens)",
    engine_vs_generate_ratio: ">= 0.9",
    mixed_adapter_speedup: ">= 1.5",
    memory_ratio_4_agents: "<= 0.3",
    sandbox_runs_per_s: "",
    train_tokens_per_s: "",
    ray_rollout_scaling_2_replicas: "",
    async_speedup: ">= 1.25 (issue 14; 2 replicas of 1 thread; sampling and training share them)",
    weight_sync_s_per_iteration: "",
  };
  const rows = Object.entries(headline).map(([k, v]) => ({
    figure: k,
    value: typeof v === "number" ? Number(v.toFixed(3)) : "not measured",
    target: targets[k] ?? "",
  }));
  console.table(rows);
  process.stdout.write(`wrote ${out}\n`);
}

/** Indented JSON with each array of numbers on one line: the per-iteration curves stay readable. */
export function resultsJson(results: unknown): string {
  return JSON.stringify(results, null, 2).replace(
    /\[\s*(-?[\d.eE+-]+(?:,\s*-?[\d.eE+-]+)*)\s*\]/g,
    (_m, xs: string) => `[${xs.split(/,\s*/).join(", ")}]`,
  );
}
