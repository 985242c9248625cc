// The task families a run config may name, each defined in its own folder with the schema of its
// config entry. The config's `task` section is this union, so adding a task kind touches src/envs
// only: its folder, and one line in each list below.
import { z } from "zod";
import type { TaskSuite } from "../flexmg/types.ts";
import { AppTaskSchema, appNeedsTrainApp } from "./app/task.ts";
import { CodeTaskSchema, codeSuite } from "./code/task.ts";
import { resolveFrom } from "./datasets.ts";
import { MathTaskSchema, mathSuite } from "./math/task.ts";
import {
  OrchestratedTaskSchema,
  SecretTaskSchema,
  syntheticSuite,
  VoteTaskSchema,
} from "./synthetic/task.ts";

export const TaskSchema = z
  .discriminatedUnion("kind", [
    SecretTaskSchema,
    VoteTaskSchema,
    OrchestratedTaskSchema,
    MathTaskSchema,
    CodeTaskSchema,
    AppTaskSchema,
  ])
  .describe("the task family the team trains on");

export type TaskConfig = z.output<typeof TaskSchema>;

/** The suite of a config's task; file paths are relative to `baseDir` (the config file's directory). */
export function makeSuite(task: TaskConfig, baseDir: string): TaskSuite<unknown> {
  switch (task.kind) {
    case "secret":
    case "parallel-vote":
    case "orchestrated":
      return syntheticSuite(task);
    case "math":
      return mathSuite(task, baseDir);
    case "code":
      return codeSuite(task, baseDir);
    case "app":
      return appNeedsTrainApp();
  }
}

/** The task with its file paths made absolute, so a resolved config in a run directory stands alone. */
export function resolveTaskFiles(t: TaskConfig, baseDir: string): TaskConfig {
  if (t.kind === "app") {
    return {
      ...t,
      ...(t.trainFile !== undefined ? { trainFile: resolveFrom(baseDir, t.trainFile) } : {}),
      ...(t.evalFile !== undefined ? { evalFile: resolveFrom(baseDir, t.evalFile) } : {}),
    };
  }
  if (t.kind !== "math" && t.kind !== "code") return t;
  return {
    ...t,
    trainFile: resolveFrom(baseDir, t.trainFile),
    ...(t.evalFile !== undefined ? { evalFile: resolveFrom(baseDir, t.evalFile) } : {}),
  };
}
