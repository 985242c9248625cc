// The `marft` package: what `import { ... } from "marft"` gives.
//
// - Train an existing app: trainApp (with AppRun / AppContext / AppReward), the gateway it trains
//   through (Gateway, gatewayAgents) for serving a team yourself.
// - Write a task as an environment: Env, TeamEnv, checkEnv, TaskSuite and friends, then train().
// - The run config (loadRunConfig, parseRunConfig, RunConfig), the engine (EngineClient,
//   startLocalEngine, connectEngine), evaluation and the errors.
export type { AppContext, AppReward, AppRun } from "./app/source.ts";
export { appSource, defaultTaskId } from "./app/source.ts";
export { type AppTasks, appRunConfig, type TrainAppOptions, trainApp } from "./app/train-app.ts";
export { EngineClient, type EngineClientOptions } from "./client/client.ts";
export { BASE_ADAPTER, type CallOptions, type ComputeEngine, type Schemas } from "./client/compute.ts";
export {
  connectEngine,
  type Engine,
  type LocalEngineOptions,
  type RemoteEngineOptions,
  startLocalEngine,
} from "./client/launcher.ts";
export { configToYaml, loadRunConfig, parseRunConfig } from "./config/load.ts";
export type { AgentConfig, RunConfig, RunConfigInput } from "./config/schema.ts";
export { makeSuite } from "./envs/tasks.ts";
export {
  ConfigError,
  DataError,
  EngineError,
  EngineRefusedError,
  EngineUnreachableError,
  EnvContractError,
  MarftError,
} from "./errors.ts";
export { type CheckEnvOptions, checkEnv } from "./flexmg/check.ts";
export { TeamEnv, TeamEpisode } from "./flexmg/team.ts";
export type {
  AgentId,
  AgentSpec,
  ChatMessage,
  Env,
  GraphSpec,
  Outcome,
  Rewards,
  TaskSuite,
} from "./flexmg/types.ts";
export { gatewayAgents } from "./gateway/agents.ts";
export { type EpisodeOptions, EpisodeStore, type RecordedTurn } from "./gateway/episodes.ts";
export { EPISODE_HEADER, Gateway, type GatewayAgent, type GatewayOptions } from "./gateway/server.ts";
export type { Episode, Turn } from "./rollout/types.ts";
export { type EpisodeSource, envSource } from "./train/episodes.ts";
export { type EvalResult, evaluate } from "./train/evaluate.ts";
export { type EngineHandle, type Summary, type TrainOptions, train } from "./train/run.ts";
export { Trainer } from "./train/trainer.ts";
