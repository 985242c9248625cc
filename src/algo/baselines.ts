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
