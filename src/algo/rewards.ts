// Reward routing: who gets the team's reward. A config choice, never hard-coded (DESIGN §4).
// What rewards an env gives and through which channel is the Env contract's (src/flexmg/types.ts,
// "Rewards"): the outcome's team reward is routed here; per-action rewards are added on top.

/**
 * - team:     the team reward goes to every agent's LAST action in the episode
 * - last:     only the episode's last action gets it (the MARFT reference: earlier agents are credited
 *             only through the critic's bootstrapped chain)
 * - per-role: each role maps to "team" (the team reward on its agents' last actions), "none" (nothing),
 *             or the name of a per-role reward (a key of `roleRewards`, e.g. "verifier_accuracy")
 */
export type RewardRouting =
  | { kind: "team" }
  | { kind: "last" }
  | { kind: "per-role"; roles: Record<string, "team" | "none" | string> };

/**
 * Per-turn rewards for ONE episode.
 *
 *   turns [K]  in the order the actions were taken; `reward` is what the environment itself already
 *              credited to that action (via takeRewards: shaping, format penalties...). It is kept and
 *              the routed reward is ADDED on top, so an environment must not also emit the team reward
 *              itself, or it is counted twice.
 *   team       the episode's team reward (its outcome's teamReward)
 *   →     [K]  reward per turn
 */
export function routeRewards(
  turns: ReadonlyArray<{ agent: string; role: string; reward: number }>,
  team: number,
  routing: RewardRouting,
  roleRewards: Record<string, number> = {},
): number[] {
  if (!Number.isFinite(team))
    throw new Error(`routeRewards: team reward must be a finite number, got ${team}`);
  const out = turns.map((t, k) => {
    if (!Number.isFinite(t.reward)) {
      throw new Error(`routeRewards: turns[${k}].reward must be a finite number, got ${t.reward}`);
    }
    return t.reward;
  });
  if (turns.length === 0) return out;

  if (routing.kind === "last") {
    out[out.length - 1]! += team;
    return out;
  }

  // Index of each agent's last action.
  const lastOf = new Map<string, number>();
  turns.forEach((t, k) => {
    lastOf.set(t.agent, k);
  });

  for (const k of lastOf.values()) {
    const turn = turns[k]!;
    if (routing.kind === "team") {
      out[k]! += team;
      continue;
    }
    const rule = routing.roles[turn.role];
    if (rule === undefined) {
      throw new Error(
        `routeRewards: role "${turn.role}" (agent "${turn.agent}") has no entry in routing.roles; expected "team", "none" or a reward name`,
      );
    }
    if (rule === "team") out[k]! += team;
    else if (rule !== "none") {
      const r = roleRewards[rule];
      if (r === undefined || !Number.isFinite(r)) {
        throw new Error(
          `routeRewards: role "${turn.role}" routes reward "${rule}", but roleRewards["${rule}"] is ${r === undefined ? "missing" : r}; expected a finite number`,
        );
      }
      out[k]! += r;
    }
  }
  return out;
}
