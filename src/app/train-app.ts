// trainApp: train the agents of an unmodified app. The run is an ordinary MARFT run (train() in
// src/train/run.ts: run directory, engine start and restart, --resume, evaluation, checkpoints,
// metrics); only its episodes come from somewhere else: a gateway on loopback that the app's SDK
// clients talk to, and `appSource`, which runs the app once per episode and reads back its turns.
//
//   const summary = await trainApp({
//     config: "team.yaml",              // or the config as an object; its task section may be left out
//     tasks: { train, eval },           // or a list (then evaluated on the same tasks)
//     run: async (task, { baseURL, apiKey, headers }) => { ...the app...; return reward },
//   });
import { randomBytes } from "node:crypto";
import { dirname, join, resolve } from "node:path";
import { connectEngine, startLocalEngine } from "../client/launcher.ts";
import { applySets, parseRunConfig, readYamlFile } from "../config/load.ts";
import type { RunConfig, RunConfigInput } from "../config/schema.ts";
import { ConfigError } from "../errors.ts";
import { appTaskFiles } from "../envs/app/task.ts";
import { gatewayAgents } from "../gateway/agents.ts";
import { Gateway } from "../gateway/server.ts";
import type { ProgressEvent } from "../train/phases.ts";
import { type EngineHandle, type Summary, train } from "../train/run.ts";
import { type AppRun, appSource } from "./source.ts";

export type AppTasks<Task> = Task[] | { train: Task[]; eval?: Task[] };

export interface TrainAppOptions<Task> {
  /** A YAML run config file, or the config as an object; its `task` section may be left out ({kind: app}). */
  config: string | RunConfigInput | Omit<RunConfigInput, "task">;
  /** The tasks; default: the files the config's task section names. A plain list is also the eval set. */
  tasks?: AppTasks<Task>;
  /** Runs the unmodified app once on a task against the gateway; returns its reward. */
  run: AppRun<Task>;
  /** A task's id in logs and evaluation (default: its `id` field, else its position). */
  taskId?: (task: Task, index: number) => string;
  /** `path=value` overrides of the config, as `marft train --set`. */
  set?: string[];
  /** Where the run goes (default runs/<name>). */
  runDir?: string;
  /** Continue the run in runDir from its last checkpoint. */
  resume?: boolean;
  /** A running engine (else the config's engine.url, else a local engine is started). */
  engine?: { url: string; token: string };
  log?: (line: string) => void;
  onProgress?: (e: ProgressEvent) => void;
  /** When aborted, the run saves a checkpoint after the current iteration and returns. */
  signal?: AbortSignal;
}

/**
 * The run config of an app run: validated, with `task: {kind: app}` when it has no task section.
 * `anyTask` accepts other task kinds too (`marft serve` serves the team of any config).
 */
export function appRunConfig(
  config: TrainAppOptions<unknown>["config"],
  sets: string[] = [],
  anyTask = false,
): {
  config: RunConfig;
  dir: string;
} {
  let raw: unknown = config;
  let source = "config";
  let dir = process.cwd();
  if (typeof config === "string") {
    source = config;
    dir = dirname(resolve(config));
    raw = readYamlFile(config);
  }
  const withSets = applySets(raw, sets) as Record<string, unknown>;
  const c = parseRunConfig({ task: { kind: "app" }, ...withSets }, source);
  if (c.task?.kind !== "app" && !anyTask)
    throw new ConfigError(source, [
      `task.kind: expected "app" for an app run, got "${c.task?.kind ?? "tasks"}"`,
    ]);
  return { config: c, dir };
}

function splitTasks<Task>(tasks: AppTasks<Task>): { train: Task[]; eval: Task[] } {
  return Array.isArray(tasks)
    ? { train: tasks, eval: tasks }
    : { train: tasks.train, eval: tasks.eval ?? tasks.train };
}

export async function trainApp<Task>(o: TrainAppOptions<Task>): Promise<Summary> {
  const { config, dir } = appRunConfig(o.config, o.set);
  const task = config.task;
  if (task?.kind !== "app") throw new Error("unreachable");
  const files = appTaskFiles(task, dir);
  const given = o.tasks ? splitTasks(o.tasks) : undefined;
  const trainTasks = (files.train as Task[] | undefined) ?? given?.train;
  const evalTasks = (files.eval as Task[] | undefined) ?? given?.eval ?? trainTasks;
  if (!trainTasks || trainTasks.length === 0)
    throw new ConfigError("tasks", ["no training tasks: pass tasks, or name task.trainFile in the config"]);
  const runDir = resolve(o.runDir ?? join("runs", config.name));
  const log = o.log ?? (() => {});

  const token = randomBytes(24).toString("base64url");
  const gateway = new Gateway({ engine: null, agents: gatewayAgents(config), token, log });
  await gateway.listen(0, "127.0.0.1");
  const source = appSource<Task>({
    name: config.name,
    train: trainTasks,
    eval: evalTasks!,
    run: o.run,
    gateway,
    token,
    taskId: o.taskId,
    timeoutMs: task.timeoutSeconds * 1000,
    log,
  });
  try {
    return await train({
      config,
      configDir: dir,
      runDir,
      resume: o.resume,
      suite: source,
      connect: connector(config, join(runDir, "engine.log"), o.engine),
      log,
      onProgress: o.onProgress,
      signal: o.signal,
    });
  } finally {
    await gateway.close();
  }
}

/** A remote engine (given, or the config's engine.url with its token variable) or a local one. */
export function connector(
  c: RunConfig,
  logFile: string,
  engine?: { url: string; token: string },
): () => Promise<EngineHandle> {
  if (engine) return () => connectEngine(engine);
  const url = c.engine.url;
  if (url) {
    return async () => {
      const token = process.env[c.engine.tokenEnv];
      if (!token)
        throw new Error(`engine: ${url} needs a token; set the environment variable ${c.engine.tokenEnv}`);
      return connectEngine({ url, token });
    };
  }
  const env: Record<string, string> = { TOKENIZERS_PARALLELISM: "false" };
  if (c.engine.threads) {
    env["OMP_NUM_THREADS"] = String(c.engine.threads);
    env["MKL_NUM_THREADS"] = String(c.engine.threads);
  }
  return () => startLocalEngine({ device: c.engine.device, logFile, env });
}
