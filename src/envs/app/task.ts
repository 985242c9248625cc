// An unmodified agent app as a run config's task: `task: { kind: app, trainFile?, evalFile?,
// timeoutSeconds }`. There is no Env: the app runs against the gateway, which records its calls as
// episodes (src/app). This entry says where the tasks are when they come from files and how long one
// run of the app may take; `marft train-app` and `trainApp()` read it.
import { z } from "zod";
import { ConfigError } from "../../errors.ts";
import { name, posNum } from "../../fields.ts";
import { readJsonRecords, resolveFrom } from "../datasets.ts";

export const AppTaskSchema = z
  .strictObject({
    kind: z.literal("app"),
    trainFile: name()
      .optional()
      .describe(
        "training tasks, one JSON value each (JSON array or JSONL), relative to the config file; omitted: the tasks the app module exports (or trainApp's tasks)",
      ),
    evalFile: name().optional().describe("held-out tasks (same format); omitted: the module's / trainApp's"),
    timeoutSeconds: posNum()
      .default(300)
      .describe("one run of the app that takes longer is an error episode (never trained on)"),
  })
  .describe("an unmodified agent app, trained through the OpenAI-compatible gateway (marft train-app)");

export type AppTaskConfig = z.output<typeof AppTaskSchema>;

/** The tasks of the files the entry names (each record's JSON value is a task), if it names any. */
export function appTaskFiles(task: AppTaskConfig, baseDir: string): { train?: unknown[]; eval?: unknown[] } {
  const read = (f: string | undefined) =>
    f === undefined ? undefined : readJsonRecords(resolveFrom(baseDir, f)).map((r) => r.value);
  const out: { train?: unknown[]; eval?: unknown[] } = {};
  const train = read(task.trainFile);
  const held = read(task.evalFile);
  if (train) out.train = train;
  if (held) out.eval = held;
  return out;
}

/** `marft train` on an app config: it has no Env to drive. */
export function appNeedsTrainApp(): never {
  throw new ConfigError("task", [
    "task.kind: an app is trained with `marft train-app CONFIG --app FILE` (or trainApp() in code), not `marft train`",
  ]);
}
