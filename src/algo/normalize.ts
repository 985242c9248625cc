// Per-agent advantage normalisation and the zero-advantage detector (DESIGN §4; REFERENCE failure 4).
//
// Agents differ in scale: a verifier's advantages may be 1000× an actor's. Normalising the whole batch
// at once would let the large one swamp the other's gradient, so each agent is normalised on its own.
// When an agent's advantages are all (nearly) equal there is no signal; dividing by a ~0 std would
// turn rounding noise into huge advantages, so such agents are left at exactly zero and reported.

/** An agent's advantages count as degenerate when their std is at most this. */
export const DEFAULT_ZERO_EPS = 1e-6;

/**
 * Per-agent mean/std normalisation.
 *
 *   adv    [B]  one advantage per turn (or per token)
 *   agents [B]  the agent of each entry
 *   opts.eps    std at or below which an agent counts as degenerate (default DEFAULT_ZERO_EPS)
 *   opts.scale  divide by the std after centring (default true; false: centre only)
 *   → advantages [B]: (a − mean_agent) / std_agent (population std), or 0 for degenerate agents
 *     zeroAgents: the agents whose advantages were degenerate (std ≤ eps), in first-seen order
 *
 * Output is finite for every finite input (deviations are rescaled before squaring, so even values
 * near 1e300 do not overflow).
 */
export function normalizePerAgent(
  adv: readonly number[],
  agents: readonly string[],
  opts: { eps?: number; scale?: boolean } = {},
): { advantages: number[]; zeroAgents: string[] } {
  const { eps = DEFAULT_ZERO_EPS, scale = true } = opts;
  if (adv.length !== agents.length) {
    throw new Error(
      `normalizePerAgent: adv and agents must have the same length, got ${adv.length} and ${agents.length}`,
    );
  }
  for (let i = 0; i < adv.length; i++) {
    if (!Number.isFinite(adv[i])) {
      throw new Error(
        `normalizePerAgent: adv[${i}] (agent "${agents[i]}") must be a finite number, got ${adv[i]}`,
      );
    }
  }
  if (!(eps >= 0)) throw new Error(`normalizePerAgent: eps must be >= 0, got ${eps}`);

  const byAgent = new Map<string, number[]>();
  agents.forEach((a, i) => {
    const list = byAgent.get(a);
    if (list) list.push(i);
    else byAgent.set(a, [i]);
  });

  const advantages = new Array<number>(adv.length).fill(0);
  const zeroAgents: string[] = [];
  for (const [agent, idx] of byAgent) {
    const n = idx.length;
    // x/n summed rather than Σx/n: the sum of large values could overflow.
    const mean = idx.reduce((s, i) => s + adv[i]! / n, 0);
    const dev = idx.map((i) => adv[i]! - mean);
    const big = dev.reduce((m, d) => Math.max(m, Math.abs(d)), 0);
    const std = big === 0 ? 0 : big * Math.sqrt(dev.reduce((s, d) => s + (d / big) ** 2, 0) / n);
    if (!(std > eps)) {
      zeroAgents.push(agent);
      continue; // left at 0
    }
    idx.forEach((i, j) => {
      advantages[i] = scale ? dev[j]! / std : dev[j]!;
    });
  }
  return { advantages, zeroAgents };
}

/**
 * Counts batches in which an agent's advantages are all (near) zero, i.e. batches that give that agent
 * no gradient at all (typically: every episode of a group got the same reward). One such batch is
 * normal; many in a row mean the agent is not learning, and the warning says so.
 */
export class ZeroAdvantageDetector {
  /** Batches checked so far. */
  batches = 0;
  /** Per agent: batches in which its advantages were all (near) zero. */
  readonly zeroBatches: Record<string, number> = {};
  /** Per agent: consecutive such batches up to the latest one. */
  readonly streak: Record<string, number> = {};

  constructor(readonly eps: number = DEFAULT_ZERO_EPS) {}

  /**
   * Check one batch of RAW (unnormalised) advantages.
   *   adv [B], agents [B]
   * Returns the agents with all-zero advantages in this batch and a warning line (null if none).
   */
  check(adv: readonly number[], agents: readonly string[]): { zeroAgents: string[]; warning: string | null } {
    if (adv.length !== agents.length) {
      throw new Error(
        `ZeroAdvantageDetector.check: adv and agents must have the same length, got ${adv.length} and ${agents.length}`,
      );
    }
    this.batches += 1;
    const maxAbs = new Map<string, number>();
    agents.forEach((a, i) => {
      const v = adv[i]!;
      // NaN counts as "not zero" so it is never hidden behind this detector.
      const m = Number.isNaN(v) ? Number.POSITIVE_INFINITY : Math.abs(v);
      maxAbs.set(a, Math.max(maxAbs.get(a) ?? 0, m));
    });
    const zeroAgents: string[] = [];
    for (const [agent, m] of maxAbs) {
      if (m <= this.eps) {
        zeroAgents.push(agent);
        this.zeroBatches[agent] = (this.zeroBatches[agent] ?? 0) + 1;
        this.streak[agent] = (this.streak[agent] ?? 0) + 1;
      } else {
        this.zeroBatches[agent] ??= 0;
        this.streak[agent] = 0;
      }
    }
    if (zeroAgents.length === 0) return { zeroAgents, warning: null };
    const parts = zeroAgents.map(
      (a) => `${a} (${this.zeroBatches[a]}/${this.batches} batches, ${this.streak[a]} in a row)`,
    );
    return {
      zeroAgents,
      warning:
        `all advantages are zero for ${parts.join(", ")}: these agents get no gradient from this batch ` +
        `(every sample got the same reward?)`,
    };
  }
}
