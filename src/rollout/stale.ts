// The stale-data guard (DESIGN §5): data sampled by an adapter version older than the adapter's
// current one is refused, unless the trainer corrects for off-policy data (train.offPolicy), replays
// it with importance weights (train.replay.maxAge), or trains asynchronously within a per-agent
// bound (train.async.maxStaleness, agents[i].maxStaleness).
import { BASE_ADAPTER } from "../client/compute.ts";
import type { Episode, Turn } from "./types.ts";

/** Versions of its adapter since the turn was sampled (0 for the bare base, which never changes). */
export function turnAge(turn: Turn, versions: Readonly<Record<string, number>>): number {
  if (turn.adapter === BASE_ADAPTER) return 0;
  const now = versions[turn.adapter];
  if (now === undefined)
    throw new Error(`adapter ${turn.adapter} of agent ${turn.agent} is not on the engine`);
  return now - turn.adapterVersion;
}

/**
 * Throws on the first turn whose adapter version is not the adapter's current version, unless
 * `offPolicy` (any age is accepted: the trainer corrects for it) or the turn is at most `maxAge`
 * versions old (experience replay, whose importance weights correct for it; asynchronous training,
 * whose bound is per agent: `maxAge` may then be a function of the turn's agent); returns the number
 * of turns not sampled by the current version. Turns of the bare base (BASE_ADAPTER) never go stale.
 */
export function checkStaleness(
  episodes: ReadonlyArray<Pick<Episode, "index" | "turns">>,
  versions: Readonly<Record<string, number>>,
  opts: { offPolicy?: boolean; maxAge?: number | ((agent: string) => number); what?: string } = {},
): { staleTurns: number } {
  let staleTurns = 0;
  for (const ep of episodes) {
    for (const turn of ep.turns) {
      if (turn.adapter === BASE_ADAPTER) continue;
      const now = versions[turn.adapter];
      if (now === undefined) {
        throw new Error(
          `turn ${turn.order} of episode ${ep.index} (agent ${turn.agent}) was sampled by adapter ${turn.adapter}, which no longer exists`,
        );
      }
      if (turn.adapterVersion === now) continue;
      staleTurns++;
      const age = now - turn.adapterVersion;
      const maxAge = typeof opts.maxAge === "function" ? opts.maxAge(turn.agent) : opts.maxAge;
      if (opts.offPolicy || (maxAge !== undefined && age > 0 && age <= maxAge)) continue;
      const why =
        maxAge !== undefined
          ? ` older than ${opts.what ?? "train.replay.maxAge"} = ${maxAge} versions`
          : "; set train.offPolicy to allow it";
      throw new Error(
        `turn ${turn.order} of episode ${ep.index} (agent ${turn.agent}) was sampled by adapter ${turn.adapter} v${turn.adapterVersion}, but it is now v${now}: refusing stale data${why}`,
      );
    }
  }
  return { staleTurns };
}
