// Which adapters update in an iteration, which tasks it trains on, and when the run is done.
import { adapterOf, adapterOwners, usesCritic } from "../config/derived.ts";
import type { RunConfig } from "../config/schema.ts";
import { Rng } from "../rng.ts";

/**
 * Whether training is over: `train.iterations` are done, or the rollouts have sampled
 * `train.maxSampledTokens` (checked between iterations, so a run overshoots by less than one
 * iteration's tokens; every variant of a comparison stops by the same rule).
 */
export function trainingDone(c: RunConfig, s: { iteration: number; sampledTokens?: number }): boolean {
  if (s.iteration >= c.train.iterations) return true;
  return c.train.maxSampledTokens !== null && (s.sampledTokens ?? 0) >= c.train.maxSampledTokens;
}

/** The adapters that update in iteration `it` under the schedule (critic warm-up: none). */
export function updatingAdapters(c: RunConfig, it: number): string[] {
  const warmup = usesCritic(c) ? (c.critic?.warmupIters ?? 0) : 0;
  if (it < warmup) return [];
  const trainable = adapterOwners(c)
    .filter((a) => a.trainable)
    .map((a) => a.id);
  if (trainable.length === 0) return [];
  if (c.train.schedule === "joint") return trainable;
  // A turn may hold several agents (e.g. parallel solvers that learn together before their
  // aggregator); an agent that shares an adapter names its owner's adapter.
  const turns =
    c.train.turns?.map((ids) =>
      [...new Set(ids.map((id) => adapterOf(c.agents.find((a) => a.id === id)!)))].filter((adapter) =>
        trainable.includes(adapter),
      ),
    ) ?? trainable.map((adapter) => [adapter]);
  const turn = Math.floor((it - warmup) / c.train.roundRobinEvery) % turns.length;
  return turns[turn]!;
}

/** Task indices of the endless stream: epoch e is a permutation drawn from (seed, e) alone. */
export function tasksAt(seed: number, n: number, cursor: number, count: number): number[] {
  const out: number[] = [];
  let perm: number[] = [];
  let permEpoch = -1;
  for (let i = cursor; i < cursor + count; i++) {
    const epoch = Math.floor(i / n);
    if (epoch !== permEpoch) {
      perm = new Rng((seed ^ Math.imul(epoch + 1, 0x9e3779b1)) >>> 0).shuffle(
        Array.from({ length: n }, (_, j) => j),
      );
      permEpoch = epoch;
    }
    out.push(perm[i % n]!);
  }
  return out;
}
