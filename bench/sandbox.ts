// Sandbox throughput: MBPP reference solutions run against their tests through the full isolation
// (one sandboxed program per problem, all its tests inside), as many at once as the pool allows.
// Also a correctness check of the harness: nearly every reference solution must pass.
//
//   npx tsx bench/sandbox.ts [--quick] [--concurrency N]
//
// `marft bench` calls benchSandbox() and stores sandbox_runs_per_s.
import { availableParallelism } from "node:os";
import { parseArgs } from "node:util";
import { loadCodeProblems } from "../src/envs/code/data.ts";
import { defaultMbppFile, runTests } from "../src/envs/code/env.ts";
import { detectIsolation, SandboxPool } from "../src/envs/code/sandbox.ts";

export interface SandboxBenchOptions {
  /** 40 problems instead of all 427. */
  quick?: boolean;
  /** Programs at once (default: the number of cores). */
  concurrency?: number;
}

export interface SandboxBenchResult {
  /** Sandboxed programs (one per problem, all its tests) finished per second. */
  sandbox_runs_per_s: number;
  /** Individual assert tests executed per second. */
  sandbox_tests_per_s: number;
  runs: number;
  /** Reference solutions that passed all their tests. */
  references_passed: number;
  /** Problems whose reference failed, with the sandbox status: a harness bug or a broken reference. */
  failures: Array<{ id: string; status: string; passed: number; total: number }>;
  isolation: string;
  concurrency: number;
  wall_s: number;
}

export async function benchSandbox(opts: SandboxBenchOptions = {}): Promise<SandboxBenchResult> {
  const iso = await detectIsolation(); // probed before the clock starts
  let problems = loadCodeProblems(defaultMbppFile());
  if (opts.quick) problems = problems.slice(0, 40);
  const concurrency = opts.concurrency ?? availableParallelism();
  const pool = new SandboxPool({ concurrency });
  const t0 = performance.now();
  const outcomes = await Promise.all(
    problems.map((p) => runTests(pool, p.reference!, p, { timeoutMs: 10_000, memoryMb: 512 })),
  );
  const wall = (performance.now() - t0) / 1000;
  const failures = outcomes
    .map((o, i) => ({ id: problems[i]!.id, status: o.status, passed: o.passed, total: o.total }))
    .filter((f) => f.passed < f.total);
  const tests = outcomes.reduce((n, o) => n + o.total, 0);
  return {
    sandbox_runs_per_s: round(problems.length / wall),
    sandbox_tests_per_s: round(tests / wall),
    runs: problems.length,
    references_passed: problems.length - failures.length,
    failures,
    isolation: iso.mode,
    concurrency,
    wall_s: round(wall),
  };
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: { quick: { type: "boolean", default: false }, concurrency: { type: "string" } },
  });
  const r = await benchSandbox({
    quick: values.quick,
    concurrency: values.concurrency ? Number(values.concurrency) : undefined,
  });
  process.stdout.write(`${JSON.stringify(r, null, 2)}\n`);
}
