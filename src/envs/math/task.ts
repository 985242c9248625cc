// Math as a run config entry: `task: { kind: math, trainFile, evalFile, ..., attempts, options }`.
import { z } from "zod";
import type { TaskSuite } from "../../flexmg/types.ts";
import { parseOptions, posInt } from "../../fields.ts";
import { fileTaskFields, resolveFrom } from "../datasets.ts";
import { createMathSuite } from "./env.ts";

/** The math-specific options (task.options). */
export const MathOptionsSchema = z
  .strictObject({
    cutAfter: posInt()
      .optional()
      .describe("cut the episode (truncated: the trainer bootstraps) after this many attempts"),
    extract: z
      .enum(["boxed", "answer", "last-number"])
      .optional()
      .describe(
        'answer extraction: \\boxed only; "answer" (default): boxed, else "the answer is"; "last-number": also the last number (GSM8K)',
      ),
    answerRoles: z
      .array(z.string())
      .min(1)
      .optional()
      .describe(
        "roles whose answers count for the reward (default: every role but reasoner/planner/orchestrator)",
      ),
    timeoutMs: z
      .number()
      .positive()
      .optional()
      .describe("time limit of one answer check in ms (default 2000)"),
    stepRoles: z
      .array(z.string())
      .min(1)
      .optional()
      .describe(
        "roles that compute the problems' intermediate results (`steps` in the data), in order: per-role rewards step1, step2, ...",
      ),
    splitParts: z
      .boolean()
      .optional()
      .describe(
        "each step role sees only its own step's part of the problem (`parts` in the data) and every other agent the last part; needs stepRoles",
      ),
  })
  .describe("extra options of the math suite");

/** Validates math options given in code; errors name the field, e.g. `task.options.extract: ...`. */
export function parseMathOptions(
  options: unknown,
  where = "task.options",
): z.output<typeof MathOptionsSchema> {
  return parseOptions(MathOptionsSchema, options, where);
}

export const MathTaskSchema = z
  .strictObject({
    kind: z.literal("math"),
    ...fileTaskFields,
    attempts: posInt()
      .default(1)
      .describe("attempts per problem; judge feedback after each (the reference: 3)"),
    options: MathOptionsSchema.prefault({}),
  })
  .describe("math word problems with a LaTeX-aware answer check");

export type MathTaskConfig = z.output<typeof MathTaskSchema>;

export function mathSuite(task: MathTaskConfig, baseDir: string): TaskSuite<unknown> {
  return createMathSuite({
    trainFile: resolveFrom(baseDir, task.trainFile),
    ...(task.evalFile !== undefined ? { evalFile: resolveFrom(baseDir, task.evalFile) } : {}),
    evalSplit: task.evalSplit,
    limit: task.limit,
    evalLimit: task.evalLimit,
    attempts: task.attempts,
    ...task.options,
  }) as TaskSuite<unknown>;
}
