// Code as a run config entry: `task: { kind: code, trainFile, ..., attempts, timeoutMs, memoryMb, options }`.
import { z } from "zod";
import type { TaskSuite } from "../../flexmg/types.ts";
import { nonNegInt, posInt } from "../../fields.ts";
import { fileTaskFields, resolveFrom } from "../datasets.ts";
import { createCodeSuite } from "./env.ts";
import type { SandboxPool } from "./sandbox.ts";

export const CodeTaskSchema = z
  .strictObject({
    kind: z.literal("code"),
    ...fileTaskFields,
    attempts: posInt().default(1).describe("rounds per problem (e.g. reviewer may send the code back)"),
    timeoutMs: posInt().default(5000).describe("wall-clock limit per test run"),
    memoryMb: posInt().default(512).describe("memory limit per test run"),
    options: z
      .strictObject({
        visibleTests: nonNegInt()
          .optional()
          .describe("how many of the tests the coder sees as examples (default 0: all hidden)"),
      })
      .prefault({})
      .describe("extra options of the code suite"),
  })
  .describe("Python function tasks run against hidden tests in a sandbox");

export type CodeTaskConfig = z.output<typeof CodeTaskSchema>;

export function codeSuite(task: CodeTaskConfig, baseDir: string, pool?: SandboxPool): TaskSuite<unknown> {
  return createCodeSuite({
    trainFile: resolveFrom(baseDir, task.trainFile),
    ...(task.evalFile !== undefined ? { evalFile: resolveFrom(baseDir, task.evalFile) } : {}),
    evalSplit: task.evalSplit,
    limit: task.limit,
    evalLimit: task.evalLimit,
    attempts: task.attempts,
    timeoutMs: task.timeoutMs,
    memoryMb: task.memoryMb,
    ...task.options,
    ...(pool ? { pool } : {}),
  }) as TaskSuite<unknown>;
}
