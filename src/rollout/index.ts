export {
  type AgentProfile,
  mixSeed,
  type RolloutOptions,
  type RolloutProgress,
  type RolloutResult,
  type RolloutStats,
  rollout,
} from "./rollout.ts";
export { adapterVersions, checkStaleness } from "./stale.ts";
export type { Episode, Turn } from "./types.ts";
