// The synthetic tasks as run config entries: `task: { kind: secret | parallel-vote | orchestrated,
// trainSize, evalSize, options }`, each validated by its env's own options schema.
import { z } from "zod";
import type { TaskSuite } from "../../flexmg/types.ts";
import { posInt } from "../../fields.ts";
import { OrchestratedOptionsSchema, orchestratedSuite } from "./orchestrated.ts";
import { SecretOptionsSchema, secretSuite } from "./secret.ts";
import { VoteOptionsSchema, voteSuite } from "./vote.ts";

function syntheticTask<K extends string, O extends z.ZodObject>(kind: K, what: string, options: O) {
  return z
    .strictObject({
      kind: z.literal(kind),
      trainSize: posInt().default(256).describe("number of generated training tasks"),
      evalSize: posInt().default(64).describe("number of generated held-out tasks"),
      options: options
        .omit({ trainSize: true, evalSize: true })
        .prefault({})
        .describe("options of the task generator and env"),
    })
    .describe(what);
}

export const SecretTaskSchema = syntheticTask(
  "secret",
  "synthetic: agent A sees a secret, agent B must state it",
  SecretOptionsSchema,
);
export const VoteTaskSchema = syntheticTask(
  "parallel-vote",
  "synthetic: two solvers act concurrently, an aggregator answers",
  VoteOptionsSchema,
);
export const OrchestratedTaskSchema = syntheticTask(
  "orchestrated",
  "synthetic: an orchestrator names who acts, that agent answers",
  OrchestratedOptionsSchema,
);

type SyntheticTaskConfig =
  | z.output<typeof SecretTaskSchema>
  | z.output<typeof VoteTaskSchema>
  | z.output<typeof OrchestratedTaskSchema>;

export function syntheticSuite(task: SyntheticTaskConfig): TaskSuite<unknown> {
  const sizes = { trainSize: task.trainSize, evalSize: task.evalSize };
  switch (task.kind) {
    case "secret":
      return secretSuite({ ...task.options, ...sizes }) as TaskSuite<unknown>;
    case "parallel-vote":
      return voteSuite({ ...task.options, ...sizes }) as TaskSuite<unknown>;
    case "orchestrated":
      return orchestratedSuite({ ...task.options, ...sizes }) as TaskSuite<unknown>;
  }
}
