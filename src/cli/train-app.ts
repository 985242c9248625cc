// `marft train-app <config> --app ./app.ts [--resume DIR] [--set k=v ...]`: train the agents of an
// unmodified app module (src/app/module.ts says what it exports) through the gateway.
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { loadAppModule } from "../app/module.ts";
import { appRunConfig, trainApp } from "../app/train-app.ts";
import type { MetricsRow } from "../train/phases.ts";
import { RunDir } from "../train/rundir.ts";
import { parseCommand } from "./args.ts";
import { formatNumber, Progress } from "./progress.ts";
import { RUN_OPTIONS, reportError, summaryTable } from "./train.ts";

const USAGE = `usage: marft train-app <config.yaml> --app ./app.ts [options]
       marft train-app --resume runs/<name> --app ./app.ts [options]

The app module exports run(task, { baseURL, apiKey, headers, episode, signal }), which runs the
unmodified app once against the gateway (baseURL and apiKey go to its OpenAI client, headers to
every call) and returns its reward: a number or { teamReward, roleRewards }. It also exports
\`tasks\` (a list, or { train, eval }) unless the config's task section names trainFile / evalFile.

options:
  --app FILE               the app module (.js, .mjs, or .ts with tsx installed)
  --resume DIR             continue the run in DIR from its last complete checkpoint
  --set path=value         override a config field (repeatable), e.g. --set train.iterations=5
  --run-dir DIR            where the run goes (default: runs/<name>)
  --engine-url URL         use a running engine instead of starting one
  --engine-token-env VAR   environment variable with that engine's token (default MARFT_ENGINE_TOKEN)
  --quiet                  no progress bars
`;

export async function trainAppCommand(args: string[]): Promise<void> {
  const parsed = parseCommand(
    "train-app",
    USAGE,
    args,
    { app: { type: "string" }, ...RUN_OPTIONS },
    {
      positionals: ({ values, positionals }) =>
        !values.app || positionals.length > 1 || (positionals.length === 0 && !values.resume)
          ? "expected one config file (or --resume DIR) and --app FILE"
          : undefined,
    },
  );
  if (!parsed) return;
  const { values, positionals } = parsed;
  try {
    if (values.resume && !existsSync(values.resume))
      throw new Error(`--resume: ${values.resume} does not exist`);
    const configFile = positionals[0] ?? join(values.resume!, "config.yaml");
    const sets = values.set ?? [];
    const { config } = appRunConfig(configFile, sets);
    const app = await loadAppModule(values.app!);
    const runDir = resolve(values.resume ?? values["run-dir"] ?? join("runs", config.name));
    const quiet = values.quiet || !process.stderr.isTTY;
    const engineUrl = values["engine-url"];
    let engine: { url: string; token: string } | undefined;
    if (engineUrl) {
      const v = values["engine-token-env"] ?? config.engine.tokenEnv;
      const token = process.env[v];
      if (!token) throw new Error(`--engine-url: set ${v} to that engine's token`);
      engine = { url: engineUrl, token };
    }
    const abort = new AbortController();
    const onSignal = () => {
      if (abort.signal.aborted) process.exit(130);
      process.stderr.write("\nfinishing this iteration, then saving a checkpoint (again to quit now)\n");
      abort.abort();
    };
    process.on("SIGINT", onSignal);
    process.on("SIGTERM", onSignal);
    const bar = new Progress("train-app", config.train.iterations, { silent: values.quiet });
    let lastReward = "";
    const summary = await trainApp({
      config: configFile,
      set: sets,
      tasks: app.tasks,
      run: app.run,
      taskId: app.taskId,
      runDir,
      resume: Boolean(values.resume),
      engine,
      signal: abort.signal,
      log: (line) => process.stderr.write(`${quiet ? "" : "\n"}${line}\n`),
      onProgress: (e) => {
        if (e.kind === "iteration") {
          const errors = e.row["episodes/errors"] ? `, ${e.row["episodes/errors"]} failed episodes` : "";
          lastReward = `reward ${formatNumber(e.row["reward/mean"] ?? Number.NaN)}${errors}`;
          bar.update(e.iteration, lastReward);
        } else if (e.kind === "phase") {
          const count = e.total ? ` ${e.done}/${e.total}` : "";
          bar.update(e.iteration, `${e.phase}${count}  ${lastReward}`);
        }
      },
    });
    bar.finish();
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    process.stdout.write(`\n${summaryTable(summary, new RunDir(runDir).readMetrics() as MetricsRow[])}`);
    process.stdout.write(`run directory: ${runDir}\nserve it: marft serve ${runDir}\n`);
    if (summary.stoppedEarly)
      process.stdout.write(
        `stopped early; continue with: marft train-app --resume ${runDir} --app ${values.app}\n`,
      );
  } catch (e) {
    reportError("train-app", e);
  }
}
