// task.kind -> the TaskSuite of the engineer who owns that task family. A plain switch: five kinds do
// not need a registry.
import { isAbsolute, resolve } from "node:path";
import type { TaskSuite } from "../flexmg/types.ts";
import { createCodeSuite } from "../envs/code/env.ts";
import { createMathSuite, parseMathOptions } from "../envs/math/env.ts";
import { orchestratedSuite, secretSuite, voteSuite } from "../envs/synthetic/index.ts";
import type { TaskConfig } from "./config.ts";

/** Paths in a config are relative to the config file's directory. */
export function resolveFrom(baseDir: string, p: string): string {
  return isAbsolute(p) ? p : resolve(baseDir, p);
}

export async function makeSuite(task: TaskConfig, baseDir: string): Promise<TaskSuite<unknown>> {
  switch (task.kind) {
    case "secret":
    case "parallel-vote":
    case "orchestrated": {
      const suite = { secret: secretSuite, "parallel-vote": voteSuite, orchestrated: orchestratedSuite }[
        task.kind
      ];
      return suite({
        ...task.options,
        trainSize: task.trainSize,
        evalSize: task.evalSize,
      }) as TaskSuite<unknown>;
    }
    case "math":
      return createMathSuite({
        trainFile: resolveFrom(baseDir, task.trainFile),
        ...(task.evalFile !== undefined ? { evalFile: resolveFrom(baseDir, task.evalFile) } : {}),
        evalSplit: task.evalSplit,
        limit: task.limit,
        evalLimit: task.evalLimit,
        attempts: task.attempts,
        ...parseMathOptions(task.options),
      }) as TaskSuite<unknown>;
    case "code": {
      const { visibleTests, ...rest } = task.options;
      const unknown = Object.keys(rest);
      if (unknown.length > 0)
        throw new Error(`task.options.${unknown[0]}: unknown option of code tasks (known: visibleTests)`);
      if (visibleTests !== undefined && !(Number.isInteger(visibleTests) && (visibleTests as number) >= 0)) {
        throw new Error(
          `task.options.visibleTests: expected a non-negative integer, got ${JSON.stringify(visibleTests)}`,
        );
      }
      return createCodeSuite({
        trainFile: resolveFrom(baseDir, task.trainFile),
        ...(task.evalFile !== undefined ? { evalFile: resolveFrom(baseDir, task.evalFile) } : {}),
        evalSplit: task.evalSplit,
        limit: task.limit,
        evalLimit: task.evalLimit,
        attempts: task.attempts,
        timeoutMs: task.timeoutMs,
        memoryMb: task.memoryMb,
        ...(visibleTests !== undefined ? { visibleTests: visibleTests as number } : {}),
      }) as TaskSuite<unknown>;
    }
  }
}

/** Make the task's file paths absolute, so the resolved config in the run directory stands alone. */
export function resolveTaskPaths<C extends { task: TaskConfig }>(config: C, baseDir: string): C {
  const t = config.task;
  if (t.kind !== "math" && t.kind !== "code") return config;
  return {
    ...config,
    task: {
      ...t,
      trainFile: resolveFrom(baseDir, t.trainFile),
      ...(t.evalFile !== undefined ? { evalFile: resolveFrom(baseDir, t.evalFile) } : {}),
    },
  };
}
