export {
  type AgentProfile,
  type RolloutOptions,
  type RolloutProgress,
  type RolloutResult,
  type RolloutStats,
  rollout,
  samplerShare,
} from "./rollout.ts";
export { checkStaleness, turnAge } from "./stale.ts";
export type { Episode, Turn } from "./types.ts";
