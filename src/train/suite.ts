// A run config's tasks as the trainer sees them: one task's suite, or, for a multi-task run
// (`tasks:`), a MultiTaskSuite over each task's suite with its weight and graph.
import type { RunConfig } from "../config/schema.ts";
import type { TaskSuite } from "../flexmg/types.ts";
import { MultiTaskSuite } from "../envs/multi.ts";
import { makeSuite, resolveTaskFiles } from "../envs/tasks.ts";

/** The suite of a run config; task file paths are relative to `baseDir` (the config file's directory). */
export function runSuite(c: RunConfig, baseDir: string): TaskSuite<unknown> {
  if (c.tasks) {
    return new MultiTaskSuite(
      c.tasks.map((t) => ({
        name: t.name,
        weight: t.weight,
        suite: makeSuite(t.task, baseDir),
        ...(t.graph ? { graph: t.graph } : {}),
      })),
    ) as TaskSuite<unknown>;
  }
  if (!c.task) throw new Error(`run config ${c.name}: no task`);
  return makeSuite(c.task, baseDir);
}

/** The config with every task file path made absolute, so the resolved config stands alone. */
export function resolveRunPaths(c: RunConfig, baseDir: string): RunConfig {
  return {
    ...c,
    ...(c.task ? { task: resolveTaskFiles(c.task, baseDir) } : {}),
    ...(c.tasks ? { tasks: c.tasks.map((t) => ({ ...t, task: resolveTaskFiles(t.task, baseDir) })) } : {}),
  };
}
