// Synthetic cooperative tasks for tests and the end-to-end learning check (see common.ts for rewards).
export { classOf, type MatchMode, matchFraction, matches, type SyntheticOptions } from "./common.ts";
export {
  type OrchestratedOptions,
  OrchestratedEnv,
  type OrchestratedTask,
  orchestratedSuite,
  orchestratedTasks,
} from "./orchestrated.ts";
export { type SecretOptions, SecretEnv, type SecretTask, secretSuite, secretTasks } from "./secret.ts";
export { type VoteOptions, VoteEnv, type VoteTask, voteLetters, voteSuite, voteTasks } from "./vote.ts";
