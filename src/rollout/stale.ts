// The stale-data guard (DESIGN §5): data sampled by an adapter version older than the adapter's
// current one is refused, unless the trainer corrects for off-policy data (train.offPolicy).
import { BASE_ADAPTER } from "../client/compute.ts";
import type { Episode } from "./types.ts";

/**
 * Throws on the first turn whose adapter version is not the adapter's current version, unless
 * `offPolicy` (any age is accepted: the trainer corrects for it) or the turn is at most `maxAge`
 * versions old (experience replay, whose importance weights correct for it); returns the number of
 * turns not sampled by the current version. Turns of the bare base (BASE_ADAPTER) never go stale.
 */
export function checkStaleness(
  episodes: ReadonlyArray<Pick<Episode, "index" | "turns">>,
  versions: Readonly<Record<string, number>>,
  opts: { offPolicy?: boolean; maxAge?: number } = {},
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
      if (opts.offPolicy || (opts.maxAge !== undefined && age > 0 && age <= opts.maxAge)) continue;
      const why =
        opts.maxAge !== undefined
          ? ` older than train.replay.maxAge = ${opts.maxAge} versions`
          : "; set train.offPolicy to allow it";
      throw new Error(
        `turn ${turn.order} of episode ${ep.index} (agent ${turn.agent}) was sampled by adapter ${turn.adapter} v${turn.adapterVersion}, but it is now v${now}: refusing stale data${why}`,
      );
    }
  }
  return { staleTurns };
}
