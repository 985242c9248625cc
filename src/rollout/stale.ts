// The stale-data guard (DESIGN §5): data sampled by an adapter version older than the adapter's
// current one is refused, unless the trainer corrects for off-policy data (train.offPolicy).
import { BASE_ADAPTER } from "../client/compute.ts";
import type { Episode } from "./types.ts";

/**
 * Throws on the first turn whose adapter version is not the adapter's current version (unless
 * `offPolicy`); returns the number of stale turns. Turns of the bare base (BASE_ADAPTER) never go stale.
 */
export function checkStaleness(
  episodes: readonly Episode[],
  versions: Record<string, number>,
  opts: { offPolicy?: boolean } = {},
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
      if (!opts.offPolicy) {
        throw new Error(
          `turn ${turn.order} of episode ${ep.index} (agent ${turn.agent}) was sampled by adapter ${turn.adapter} v${turn.adapterVersion}, but it is now v${now}: refusing stale data; set train.offPolicy to allow it`,
        );
      }
    }
  }
  return { staleTurns };
}
