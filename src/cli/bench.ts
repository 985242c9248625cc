// `marft bench`: the speed and memory figures, each a ratio against a baseline measured in the same
// run (these machines are noisy; absolute numbers from another run mean little). Writes
// bench/results.json and prints a table.
//
//   engine   bench/engine_bench.py: sampling vs plain `generate`, mixed-adapter batch vs per-adapter
//            calls, memory of N agents on one base vs a model copy per agent, training tokens/s
//   sandbox  bench/sandbox.ts: MBPP test executions per second under full isolation
//   rollout  bench/rollout.ts: MARFT's rollout vs the reference's scheme, 2 and 4 agents
//   replicas bench/replicas.ts: one rollout on 2 engine replicas of 1 thread (Ray) vs 1 engine of 2
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { join, resolve } from "node:path";
import { writeFileAtomic } from "../train/rundir.ts";

const REPO = resolve(import.meta.dirname, "../..");

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

export async function benchCommand(args: string[]): Promise<void> {
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

  if (want("engine")) {
    process.stderr.write("bench: engine (sampling, mixed adapters, memory, training)...\n");
    const engineOut = join(REPO, "bench/.engine-results.json");
    execFileSync(
      join(REPO, ".venv/bin/python"),
      [join(REPO, "bench/engine_bench.py"), "--out", engineOut, ...(quick ? ["--quick"] : [])],
      { stdio: ["ignore", "inherit", "inherit"] },
    );
    results["engine"] = JSON.parse(readFileSync(engineOut, "utf8"));
  }
  if (want("sandbox")) {
    process.stderr.write("bench: sandbox (MBPP executions under isolation)...\n");
    const { benchSandbox } = await import("../../bench/sandbox.ts");
    results["sandbox"] = await benchSandbox({ quick });
  }
  if (want("rollout")) {
    process.stderr.write("bench: rollout (MARFT vs the reference scheme)...\n");
    const { benchRollout } = await import("../../bench/rollout.ts");
    results["rollout"] = await benchRollout({ quick, ...(episodes ? { episodes } : {}) });
  }

  if (want("replicas")) {
    process.stderr.write("bench: replicas (one rollout on 2 engine replicas vs 1 engine)...\n");
    const { benchReplicas } = await import("../../bench/replicas.ts");
    results["replicas"] = await benchReplicas({ quick, ...(episodes ? { episodes } : {}) });
  }

  // The headline keys, flat, as the README and the issues name them.
  const engine = (results["engine"] ?? {}) as Record<string, unknown>;
  const sandbox = (results["sandbox"] ?? {}) as Record<string, unknown>;
  const roll = (results["rollout"] ?? {}) as Record<string, unknown>;
  const replicas = (results["replicas"] ?? {}) as Record<string, unknown>;
  const headline: Record<string, unknown> = {
    rollout_speedup_2_agents: roll["rollout_speedup_2_agents"],
    rollout_speedup_4_agents: roll["rollout_speedup_4_agents"],
    engine_vs_generate_ratio: engine["engine_vs_generate_ratio"],
    mixed_adapter_speedup: engine["mixed_adapter_speedup"],
    memory_ratio_4_agents: engine["memory_ratio_4_agents"],
    sandbox_runs_per_s: sandbox["sandbox_runs_per_s"],
    train_tokens_per_s: engine["train_tokens_per_s"],
    ray_rollout_scaling_2_replicas: replicas["ray_rollout_scaling_2_replicas"],
  };
  Object.assign(results, headline, { seconds: (Date.now() - t0) / 1000 });
  writeFileAtomic(out, `${JSON.stringify(results, null, 2)}\n`);

  const targets: Record<string, string> = {
    rollout_speedup_2_agents: ">= 2",
    rollout_speedup_4_agents: ">= 3",
    engine_vs_generate_ratio: ">= 0.9",
    mixed_adapter_speedup: ">= 1.5",
    memory_ratio_4_agents: "<= 0.3",
    sandbox_runs_per_s: "",
    train_tokens_per_s: "",
    ray_rollout_scaling_2_replicas: "",
  };
  const rows = Object.entries(headline).map(([k, v]) => ({
    figure: k,
    value: typeof v === "number" ? Number(v.toFixed(3)) : "not measured",
    target: targets[k] ?? "",
  }));
  console.table(rows);
  process.stdout.write(`wrote ${out}\n`);
}
