// Critic-free credit assignment (GRPO-style): sample several episodes of the same task and use the
// group's mean reward as the baseline. No value network, so no critic to warm up or to be wrong.

/**
 * Group-relative advantages.
 *
 *   rewards [B]  one scalar per episode (or per turn, after routing)
 *   groups  [B]  group id of each entry: entries sharing an id were sampled from the same task
 *   →       [B]  r − mean(group)           (default)
 *                (r − mean(group)) / (std(group) + eps)   with { std: true }
 *
 * std is the population standard deviation (divide by n), so a group of one is defined (its advantage
 * is 0). A group whose rewards are all equal gets all zeros: it carries no learning signal, and
 * normalize.ts's detector reports such batches.
 */
export function groupRelative(
  rewards: readonly number[],
  groups: readonly number[],
  opts: { std?: boolean; eps?: number } = {},
): number[] {
  const eps = opts.eps ?? 1e-6;
  if (rewards.length !== groups.length) {
    throw new Error(
      `groupRelative: rewards and groups must have the same length, got ${rewards.length} and ${groups.length}`,
    );
  }
  for (let i = 0; i < rewards.length; i++) {
    if (!Number.isFinite(rewards[i])) {
      throw new Error(`groupRelative: rewards[${i}] must be a finite number, got ${rewards[i]}`);
    }
  }
  if (!(eps > 0)) throw new Error(`groupRelative: eps must be positive, got ${eps}`);

  const members = new Map<number, number[]>();
  groups.forEach((g, i) => {
    const list = members.get(g);
    if (list) list.push(i);
    else members.set(g, [i]);
  });

  const out = new Array<number>(rewards.length).fill(0);
  for (const idx of members.values()) {
    const n = idx.length;
    const mean = idx.reduce((s, i) => s + rewards[i]!, 0) / n;
    const dev = idx.map((i) => rewards[i]! - mean);
    // Exactly-equal rewards can leave a rounding residue after subtracting the mean; force the
    // documented "all-equal group → zeros" instead of dividing noise by eps.
    const allEqual = idx.every((i) => rewards[i] === rewards[idx[0]!]);
    const scale = opts.std ? Math.sqrt(dev.reduce((s, d) => s + d * d, 0) / n) + eps : 1;
    idx.forEach((i, j) => {
      out[i] = allEqual ? 0 : dev[j]! / scale;
    });
  }
  return out;
}

/**
 * The groups whose episodes all got the same rewards: the same agents acted in the same order and
 * each action was credited the same reward. Under group baselines every advantage of such a group is
 * zero, so it carries no policy gradient (dynamic sampling drops it). A group of one episode counts
 * as flat: it has nothing to compare with.
 *   steps [N], listed episode by episode in action order → the flat groups' ids
 */
export function flatGroups(
  steps: ReadonlyArray<{ episode: number; group: number; agent: string; reward: number }>,
): Set<number> {
  const signature = new Map<number, { group: number; actions: Array<[string, number]> }>();
  for (const s of steps) {
    const e = signature.get(s.episode) ?? { group: s.group, actions: [] };
    e.actions.push([s.agent, s.reward]);
    signature.set(s.episode, e);
  }
  const first = new Map<number, string>();
  const mixed = new Set<number>();
  for (const { group, actions } of signature.values()) {
    const sig = JSON.stringify(actions); // exact: rewards equal as numbers print equal
    const seen = first.get(group);
    if (seen === undefined) first.set(group, sig);
    else if (seen !== sig) mixed.add(group);
  }
  return new Set([...first.keys()].filter((g) => !mixed.has(g)));
}
