// `marft train <config> [--resume DIR] [--set k=v ...] [--engine-url URL --engine-token-env VAR]`
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { connectEngine, ENGINE_CWD, startLocalEngine } from "../client/launcher.ts";
import { checkBaseFiles, loadRunConfig } from "../config/load.ts";
import type { RunConfig } from "../config/schema.ts";
import { ConfigError, MarftError } from "../errors.ts";
import type { MetricsRow } from "../train/phases.ts";
import { type EngineHandle, type ReplicaSummary, type Summary, train } from "../train/run.ts";
import { resolveRunPaths, runSuite } from "../train/suite.ts";
import { parseCommand } from "./args.ts";
import { onInterrupt } from "./interrupt.ts";
import { formatNumber, Progress, table } from "./progress.ts";
import { writeRunReport } from "./report.ts";

const USAGE = `usage: marft train <config.yaml> [options]
       marft train --resume runs/<name> [options]

options:
  --resume DIR             continue the run in DIR from its last complete checkpoint
  --set path=value         override a config field (repeatable), e.g. --set train.iterations=5
  --run-dir DIR            where the run goes (default: runs/<name>)
  --engine-url URL         use a running engine (e.g. on a GPU server) instead of starting one
  --engine-token-env VAR   environment variable with that engine's token (default MARFT_ENGINE_TOKEN)
  --quiet                  no progress bars
  -h, --help               this text

Ctrl-C finishes the current iteration, saves a checkpoint and stops; a second Ctrl-C quits at once.
An engine call fails only when the engine is gone or makes no progress for engine.stallSeconds
(default 300); the error then names the last checkpoint and the --resume command.
`;

export interface EngineChoice {
  url?: string;
  tokenEnv?: string;
}

/**
 * Connect to the configured remote engine, or start a local one logging into the run directory;
 * its checkpoints are confined to `checkpointRoot` (default: the run directory's parent).
 */
export function engineConnector(
  c: RunConfig,
  logFile: string,
  override: EngineChoice = {},
  checkpointRoot: string = dirname(dirname(resolve(logFile))),
): () => Promise<EngineHandle> {
  const url = override.url ?? c.engine.url;
  const tokenEnv = override.tokenEnv ?? c.engine.tokenEnv;
  const stallMs = c.engine.stallSeconds * 1000;
  if (url) {
    return async () => {
      const token = process.env[tokenEnv];
      if (!token) throw new Error(`engine: ${url} needs a token; set the environment variable ${tokenEnv}`);
      return connectEngine({ url, token, stallMs });
    };
  }
  const env: Record<string, string> = { TOKENIZERS_PARALLELISM: "false" };
  if (c.engine.threads) {
    env["OMP_NUM_THREADS"] = String(c.engine.threads);
    env["MKL_NUM_THREADS"] = String(c.engine.threads);
  }
  const { replicas, ray, replica } = c.engine;
  const replicaOptions = {
    count: replicas,
    rayAddress: ray.address,
    cpus: replica.cpus,
    gpus: replica.gpus,
    threads: replica.threads ?? c.engine.threads,
  };
  return async () => {
    const e = await startLocalEngine({
      device: c.engine.device,
      logFile,
      env,
      stallMs,
      checkpointRoot,
      replicas: replicaOptions,
    });
    return { client: e.client, stop: e.stop, pid: e.process?.pid };
  };
}

/** Print a config error (exit 2) or any other error (exit 1): its message, and a stack only for a bug. */
export function reportError(cmd: string, e: unknown): void {
  if (e instanceof ConfigError) {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 2;
    return;
  }
  const detail = e instanceof MarftError || !(e instanceof Error) ? "" : `\n${e.stack ?? ""}`;
  process.stderr.write(`marft ${cmd}: ${e instanceof Error ? e.message : String(e)}${detail}\n`);
  process.exitCode = 1;
}

export function summaryTable(s: Summary, rows: MetricsRow[]): string {
  const out: Array<Array<string | number>> = [];
  const pick = (k: string) => rows.map((r) => r[k]).filter((v): v is number => typeof v === "number");
  const rewards = pick("reward/mean");
  out.push(["iterations", s.iterations]);
  if (rewards.length) {
    out.push(["reward (first iteration)", rewards[0]!]);
    out.push(["reward (last iteration)", rewards.at(-1)!]);
  }
  if (s.eval.before) out.push(["eval accuracy before", s.eval.before.accuracy]);
  if (s.eval.after) {
    out.push(["eval accuracy after", s.eval.after.accuracy]);
    out.push([
      "  95% CI",
      `[${formatNumber(s.eval.after.ci95[0])}, ${formatNumber(s.eval.after.ci95[1])}] n=${s.eval.after.n}`,
    ]);
  }
  out.push(["tokens sampled", s.tokensSampled]);
  out.push(["wall time (s)", Math.round(s.wallSeconds * 10) / 10]);
  if (s.engineRestarts) out.push(["engine restarts", s.engineRestarts]);
  const replicas = s.replicas;
  if (replicas) {
    const each = (f: (r: ReplicaSummary) => number) => replicas.map(f).join(" / ");
    out.push(["replicas", replicas.length]);
    out.push(["  sample calls", each((r) => r.sampleCalls)]);
    out.push(["  tokens trained", each((r) => r.tokensTrained)]);
    if (replicas.some((r) => r.restarts > 0)) out.push(["  replica restarts", each((r) => r.restarts)]);
  }
  if (s.checkpoint) out.push(["checkpoint", s.checkpoint]);
  return table(out, ["summary", "value"]);
}

/** The options of a training run: `marft train`'s, and `marft train-app`'s besides --app. */
export const RUN_OPTIONS = {
  resume: { type: "string" },
  set: { type: "string", multiple: true },
  "run-dir": { type: "string" },
  "engine-url": { type: "string" },
  "engine-token-env": { type: "string" },
  quiet: { type: "boolean" },
} as const;

export async function trainCommand(args: string[]): Promise<void> {
  const parsed = parseCommand("train", USAGE, args, RUN_OPTIONS, {
    positionals: ({ values, positionals }) =>
      positionals.length > 1 || (positionals.length === 0 && !values.resume)
        ? "expected one config file (or --resume DIR)"
        : undefined,
  });
  if (!parsed) return;
  const { values, positionals } = parsed;
  try {
    let configFile = positionals[0];
    if (!configFile && values.resume) configFile = join(values.resume, "config.yaml");
    if (values.resume && !existsSync(values.resume))
      throw new Error(`--resume: ${values.resume} does not exist`);
    const config = resolveRunPaths(
      loadRunConfig(configFile!, values.set ?? []),
      dirname(resolve(configFile!)),
    );
    if (!(values["engine-url"] ?? config.engine.url)) checkBaseFiles(config, configFile!, ENGINE_CWD);
    const runDir = resolve(values.resume ?? values["run-dir"] ?? join("runs", config.name));
    const quiet = values.quiet || !process.stderr.isTTY;
    const suite = runSuite(config, dirname(resolve(configFile!)));

    const interrupt = onInterrupt();

    // with a token budget the bar counts sampled tokens (the iterations it takes are not known)
    const budget = config.train.maxSampledTokens;
    const { RunDir } = await import("../train/rundir.ts");
    let tokens = values.resume ? (new RunDir(runDir).latestCheckpoint()?.state.sampledTokens ?? 0) : 0;
    const bar = new Progress(budget ? "train tokens" : "train", budget ?? config.train.iterations, {
      silent: values.quiet,
    });
    const at = (iteration: number) => (budget ? tokens : iteration);
    let lastReward = "";
    const summary = await train({
      config,
      configDir: dirname(resolve(configFile!)),
      runDir,
      resume: Boolean(values.resume),
      suite,
      connect: engineConnector(config, join(runDir, "engine.log"), {
        url: values["engine-url"],
        tokenEnv: values["engine-token-env"],
      }),
      signal: interrupt.signal,
      log: (line) => process.stderr.write(`${quiet ? "" : "\n"}${line}\n`),
      onProgress: (e) => {
        if (e.kind === "iteration") {
          tokens += e.row["tokens/sampled"] ?? 0;
          lastReward = `reward ${formatNumber(e.row["reward/mean"] ?? Number.NaN)}`;
          bar.update(at(e.iteration), budget ? `iteration ${e.iteration}  ${lastReward}` : lastReward);
        } else if (e.kind === "phase") {
          const count = e.total ? ` ${e.done}/${e.total}` : "";
          bar.update(at(e.iteration), `${e.phase}${count}  ${lastReward}`);
        }
      },
    });
    bar.finish();
    interrupt.dispose();
    process.stdout.write(`\n${summaryTable(summary, new RunDir(runDir).readMetrics() as MetricsRow[])}`);
    process.stdout.write(`run directory: ${runDir}\n`);
    process.stdout.write(`report: ${writeRunReport(runDir)} (live: marft dashboard ${dirname(runDir)})\n`);
    if (summary.stoppedEarly)
      process.stdout.write(
        `stopped early after iteration ${summary.iterations}, checkpoint saved (${summary.checkpoint}); ` +
          `continue with: marft train --resume ${runDir}\n`,
      );
  } catch (e) {
    reportError("train", e);
  }
}
