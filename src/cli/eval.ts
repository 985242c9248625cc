// `marft eval <config.yaml | run dir> [--data FILE] [--n N] [--k K] [--set k=v ...] [--json OUT]`
// A config: evaluate its team as configured (fresh, untrained adapters). A run directory: evaluate
// the team of its latest checkpoint.
import { existsSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { loadRunConfig } from "../config/load.ts";
import { evalTasks, evaluate } from "../train/evaluate.ts";
import { RunDir } from "../train/rundir.ts";
import { setupEngine } from "../train/setup.ts";
import { resolveRunPaths, runSuite } from "../train/suite.ts";
import { parseCommand } from "./args.ts";
import { formatNumber, Progress, table } from "./progress.ts";
import { engineConnector, reportError } from "./train.ts";

const USAGE = `usage: marft eval <config.yaml | runs/<name>> [options]

options:
  --data FILE              held-out problems to evaluate on (math / code tasks; default: the task's eval split)
  --n N                    evaluate the first N problems (default: all)
  --k K                    also pass@k from K sampled attempts per problem
  --sampled                pass@1 from one sampled attempt instead of greedy decoding
  --set path=value         override a config field (repeatable)
  --json FILE              write per-problem results (correctness, transcripts) as JSON
  --engine-url URL         use a running engine instead of starting one
  --engine-token-env VAR   environment variable with that engine's token
`;

export async function evalCommand(args: string[]): Promise<void> {
  const parsed = parseCommand(
    "eval",
    USAGE,
    args,
    {
      data: { type: "string" },
      n: { type: "string" },
      k: { type: "string" },
      sampled: { type: "boolean" },
      set: { type: "string", multiple: true },
      json: { type: "string" },
      "engine-url": { type: "string" },
      "engine-token-env": { type: "string" },
      quiet: { type: "boolean" },
    },
    { positionals: "expected one config file or run directory" },
  );
  if (!parsed) return;
  const { values, positionals } = parsed;
  const intOpt = (name: string, v: string | undefined): number | undefined => {
    if (v === undefined) return undefined;
    if (!/^\d+$/.test(v)) throw new Error(`--${name}: expected a non-negative integer, got "${v}"`);
    return Number(v);
  };
  try {
    const target = resolve(positionals[0]!);
    const isRun = existsSync(target) && statSync(target).isDirectory();
    const configFile = isRun ? join(target, "config.yaml") : target;
    const sets = [...(values.set ?? [])];
    const n = intOpt("n", values.n);
    const k = intOpt("k", values.k);
    const config = resolveRunPaths(loadRunConfig(configFile, sets), dirname(configFile));
    if (values.data !== undefined) {
      if (config.task?.kind !== "math" && config.task?.kind !== "code") {
        throw new Error(
          `--data: task "${config.task?.kind ?? "multi-task"}" generates its problems; --data is for one math or code task`,
        );
      }
      config.task = { ...config.task, evalFile: resolve(values.data), evalLimit: undefined };
    }
    const suite = runSuite(config, dirname(configFile));
    const tasks = evalTasks(suite, n ?? 0);
    const logDir = isRun ? target : join("runs", config.name);
    const connect = engineConnector(config, join(logDir, "engine-eval.log"), {
      url: values["engine-url"],
      tokenEnv: values["engine-token-env"],
    });
    const engine = await connect();
    try {
      await setupEngine(engine.client, config);
      let source = "untrained adapters (from the config)";
      if (isRun) {
        const ckpt = new RunDir(target).latestCheckpoint();
        if (!ckpt) throw new Error(`${target}: no complete checkpoint to evaluate`);
        await engine.client.loadCheckpoint({ path: join(ckpt.path, "engine") });
        source = `checkpoint ${ckpt.path} (iteration ${ckpt.state.iteration})`;
      }
      const bar = new Progress("eval", tasks.length, { silent: values.quiet });
      const r = await evaluate({
        engine: engine.client,
        suite,
        config,
        tasks,
        greedy: !values.sampled,
        k: k ?? config.eval.k,
        seed: config.seed + 7919,
        onProgress: (done, total) => bar.update(done, undefined, total),
      });
      bar.finish();
      const rows: Array<Array<string | number>> = [
        ["team", source],
        ["task", `${suite.name} (${tasks.length} held-out problems)`],
        [values.sampled ? "pass@1 (sampled)" : "pass@1 (greedy)", r.accuracy],
        ["  95% CI (Wilson)", `[${formatNumber(r.ci95[0])}, ${formatNumber(r.ci95[1])}]`],
        ["mean score", r.meanScore],
      ];
      if (r.passAtK !== undefined) rows.push([`pass@${r.k}`, r.passAtK]);
      rows.push(["seconds", Math.round(r.seconds * 10) / 10]);
      process.stdout.write(table(rows, ["eval", "value"]));
      if (values.json) {
        writeFileSync(values.json, `${JSON.stringify({ source, ...r }, null, 1)}\n`);
        process.stdout.write(`per-problem results: ${values.json}\n`);
      }
    } finally {
      await engine.stop();
    }
  } catch (e) {
    reportError("eval", e);
  }
}
