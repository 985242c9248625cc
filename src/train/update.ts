// The engine passes of an iteration: the critic's values, PPO's old log-probs when they are
// recomputed, the PPO update of one adapter, and the critic update. Each returns what it measured;
// the metrics are made from that afterwards (metrics.ts).
import type { Credit } from "../algo/index.ts";
import type { ComputeEngine, Schemas } from "../client/compute.ts";
import { CRITIC_ADAPTER, type RunConfig } from "../config/schema.ts";
import type { Rng } from "../rng.ts";
import type { Turn } from "../rollout/index.ts";
import { criticTokens, policyDatum, type Step, valueDatum } from "./steps.ts";

/** The critic's values over each step's prompt and response [P + L] (one forward pass). */
export async function criticValues(engine: ComputeEngine, steps: readonly Step[]): Promise<number[][]> {
  const res = await engine.forward({
    adapter: CRITIC_ADAPTER,
    data: steps.map((s) => ({ tokens: criticTokens(s) })),
    temperature: 1,
  });
  return res.results.map((r) => {
    if (!r.values) throw new Error("engine: forward with the critic returned no values");
    return r.values;
  });
}

/** Split `xs` into `k` nearly equal, non-empty chunks (fewer if there are fewer items). */
export function chunks<T>(xs: readonly T[], k: number): T[][] {
  const n = Math.min(k, xs.length);
  const out: T[][] = [];
  for (let i = 0; i < n; i++)
    out.push(xs.slice(Math.floor((i * xs.length) / n), Math.floor(((i + 1) * xs.length) / n)));
  return out;
}

/** Items by the temperature their turn was sampled at (an engine call scores at one temperature). */
function byTemperature<T extends { step: Step }>(items: readonly T[]): Map<number, T[]> {
  const out = new Map<number, T[]>();
  for (const x of items) {
    const list = out.get(x.step.turn.temperature);
    if (list) list.push(x);
    else out.set(x.step.turn.temperature, [x]);
  }
  return out;
}

/**
 * PPO's old log-probs from a forward pass of `adapter` before it updates: in bf16 the sampler's
 * incremental decode and a full forward differ enough that the ratio would start off 1 and clip on
 * noise. One forward per temperature. Also returns the mean absolute difference to the sampler's
 * log-probs, a health figure.
 */
export async function recomputeLogprobs(
  engine: ComputeEngine,
  adapter: string,
  steps: readonly Step[],
): Promise<{ oldLogprobs: number[][]; mismatch: number }> {
  const oldLogprobs = new Array<number[]>(steps.length);
  let diff = 0;
  let n = 0;
  const items = steps.map((step, i) => ({ step, i }));
  for (const [temperature, group] of byTemperature(items)) {
    const res = await engine.forward({
      adapter,
      // weights: only the response's log-probs are computed (the prompt's are not needed)
      data: group.map(({ step }) => {
        const d = policyDatum(step, [0]);
        return { tokens: d.tokens, weights: d.weights };
      }),
      temperature: temperature > 0 ? temperature : 1,
    });
    group.forEach(({ step, i }, j) => {
      const all = res.results[j]!.logprobs;
      if (!all) throw new Error("engine: forward returned no log-probs");
      const lp = all.slice(step.turn.promptIds.length);
      oldLogprobs[i] = lp;
      lp.forEach((x, t) => {
        diff += Math.abs(x - step.turn.logprobs[t]!);
        n++;
      });
    });
  }
  return { oldLogprobs, mismatch: n > 0 ? diff / n : 0 };
}

/** One action to train on: its step, its (normalised) advantages, and PPO's old log-probs if recomputed. */
export interface PolicyItem {
  step: Step;
  advantages: readonly number[];
  oldLogprobs?: readonly number[];
}

/** What one adapter's PPO update measured, one entry per optimizer step. */
export interface PolicyUpdate {
  loss: number[];
  clipfrac: number[];
  approxKl: number[];
  entropy: number[];
  klRef: number[];
  gradNorm: number[];
  /** true when the target-KL limit stopped the adapter's updates for this iteration. */
  earlyStop: boolean;
  /** The adapter's version after the last optimizer step. */
  version: number;
}

/** A fresh record of one adapter's PPO update. */
function newUpdate(): PolicyUpdate {
  return {
    loss: [],
    clipfrac: [],
    approxKl: [],
    entropy: [],
    klRef: [],
    gradNorm: [],
    earlyStop: false,
    version: -1,
  };
}

/** One minibatch's forward_backward calls for `adapter` and their shares of its action tokens. */
interface MinibatchCall {
  body: Schemas["ForwardBackwardRequest"];
  share: number;
}

/**
 * The forward_backward calls of one adapter's minibatch: one per sampling temperature (agents sharing
 * an adapter may differ), each weighted by its share of the minibatch's action tokens: together one
 * token-mean loss.
 */
function minibatchCalls(adapter: string, mb: readonly PolicyItem[], ppo: RunConfig["ppo"]): MinibatchCall[] {
  const total = mb.reduce((n, x) => n + x.step.turn.responseIds.length, 0);
  return [...byTemperature(mb)].map(([temperature, group]) => {
    const share = group.reduce((n, x) => n + x.step.turn.responseIds.length, 0) / total;
    return {
      share,
      body: {
        adapter,
        loss: "ppo",
        data: group.map((x) => policyDatum(x.step, x.advantages, x.oldLogprobs)),
        temperature,
        loss_scale: share,
        ppo: {
          clip_low: ppo.clipLow,
          clip_high: ppo.clipHigh,
          entropy_coef: ppo.entropyCoef,
          kl_coef: ppo.klCoef,
          kl_estimator: ppo.klEstimator,
          ratio: ppo.ratio,
          sequence_logprob: ppo.sequenceLogprob,
          aggregation: "token-mean",
        },
      },
    };
  });
}

/** Folds one minibatch's answers and its optimizer step into `u`; sets the target-KL stop. */
function record(
  u: PolicyUpdate,
  calls: readonly MinibatchCall[],
  answers: readonly Schemas["ForwardBackwardResponse"][],
  step: Schemas["OptimStepResponse"],
  ppo: RunConfig["ppo"],
): void {
  const stats: Record<string, number> = {};
  calls.forEach(({ share }, i) => {
    const r = answers[i]!;
    stats["loss"] = (stats["loss"] ?? 0) + share * r.loss;
    for (const k of ["clipfrac", "approx_kl", "entropy", "kl_ref"]) {
      const v = r.stats[k];
      if (typeof v === "number") stats[k] = (stats[k] ?? 0) + share * v;
    }
  });
  u.version = step.version;
  u.loss.push(stats["loss"]!);
  if (stats["clipfrac"] !== undefined) u.clipfrac.push(stats["clipfrac"]);
  if (stats["approx_kl"] !== undefined) u.approxKl.push(stats["approx_kl"]);
  if (stats["entropy"] !== undefined) u.entropy.push(stats["entropy"]);
  if (stats["kl_ref"] !== undefined) u.klRef.push(stats["kl_ref"]);
  u.gradNorm.push(step.grad_norm);
  if (ppo.targetKl !== null && (stats["approx_kl"] ?? 0) > ppo.targetKl) u.earlyStop = true;
}

/**
 * PPO for one adapter: `ppo.epochs` passes over its items in a shuffled order, `ppo.minibatches`
 * optimizer steps per pass, and the per-adapter target-KL stop (the minibatch that crosses the limit
 * is applied, then the adapter stops for the iteration).
 */
export async function updatePolicy(
  engine: ComputeEngine,
  adapter: string,
  items: readonly PolicyItem[],
  ppo: RunConfig["ppo"],
  rng: Rng,
): Promise<PolicyUpdate> {
  const u = newUpdate();
  for (let epoch = 0; epoch < ppo.epochs && !u.earlyStop; epoch++) {
    for (const mb of chunks(rng.shuffle(items), ppo.minibatches)) {
      const calls = minibatchCalls(adapter, mb, ppo);
      const answers = [];
      for (const { body } of calls) answers.push(await engine.forwardBackward(body));
      const step = await engine.optimStep({ adapter, max_grad_norm: ppo.maxGradNorm });
      record(u, calls, answers, step, ppo);
      if (u.earlyStop) break;
    }
  }
  return u;
}

/**
 * PPO for several adapters at once (`train.batchAdapters`): the same epochs, minibatches, steps and
 * per-adapter target-KL stops as `updatePolicy` for each, but the k-th minibatch of every adapter
 * still updating goes to the engine in one `forward_backward_batch` (one pass over all their rows),
 * followed by each adapter's own optimizer step (its own clipping). Each epoch shuffles the adapters'
 * items in the order given; with one epoch the PRNG is drawn exactly as by one adapter after another.
 */
export async function updatePolicies(
  engine: ComputeEngine,
  work: readonly { adapter: string; items: readonly PolicyItem[] }[],
  ppo: RunConfig["ppo"],
  rng: Rng,
): Promise<PolicyUpdate[]> {
  const us = work.map(() => newUpdate());
  for (let epoch = 0; epoch < ppo.epochs; epoch++) {
    const live = work.flatMap((_, k) => (us[k]!.earlyStop ? [] : [k]));
    if (live.length === 0) break;
    const mbs = new Map(live.map((k) => [k, chunks(rng.shuffle(work[k]!.items), ppo.minibatches)]));
    const rounds = Math.max(...live.map((k) => mbs.get(k)!.length));
    for (let j = 0; j < rounds; j++) {
      const now = live.filter((k) => !us[k]!.earlyStop && j < mbs.get(k)!.length);
      if (now.length === 0) break;
      const calls = now.map((k) => minibatchCalls(work[k]!.adapter, mbs.get(k)![j]!, ppo));
      const res = await engine.forwardBackwardBatch({ calls: calls.flat().map((c) => c.body) });
      let at = 0;
      for (const [n, k] of now.entries()) {
        const answers = res.results.slice(at, at + calls[n]!.length);
        at += calls[n]!.length;
        const step = await engine.optimStep({ adapter: work[k]!.adapter, max_grad_norm: ppo.maxGradNorm });
        record(us[k]!, calls[n]!, answers, step, ppo);
      }
    }
  }
  return us;
}

/**
 * The critic update: the clipped value loss towards the returns, `epochs` x `minibatches` steps, on
 * every step but those whose turns were `dropped` (too stale under train.async).
 */
export async function updateCritic(
  engine: ComputeEngine,
  steps: readonly Step[],
  credit: Credit,
  c: RunConfig,
  rng: Rng,
  dropped: ReadonlySet<Turn> = new Set(),
): Promise<{ loss: number[]; version: number }> {
  const critic = c.critic!;
  const out = { loss: [] as number[], version: -1 };
  const indices = steps.flatMap((s, i) => (dropped.has(s.turn) ? [] : [i]));
  for (let epoch = 0; epoch < c.ppo.epochs; epoch++) {
    for (const mb of chunks(rng.shuffle(indices), c.ppo.minibatches)) {
      const r = await engine.forwardBackward({
        adapter: CRITIC_ADAPTER,
        loss: "value",
        data: mb.map((i) => valueDatum(steps[i]!, credit, i)),
        temperature: 1,
        value: { loss: critic.valueLoss, huber_delta: 10, clip: critic.valueClip },
      });
      out.loss.push(r.loss);
      const step = await engine.optimStep({ adapter: CRITIC_ADAPTER, max_grad_norm: critic.maxGradNorm });
      out.version = step.version;
    }
  }
  return out;
}
