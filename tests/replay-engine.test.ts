// Experience replay against the real engine (tiny model): the importance weights of replayed turns
// equal the policy ratio recomputed by a separate forward pass of the adapter as it is now, over the
// behaviour log-probs the sampler recorded, capped; PPO gets the proximal log-probs and the weighted
// advantages; and a turn older than maxAge is refused.
import { beforeAll, describe, expect, it } from "vitest";
import type { Turn } from "../src/rollout/index.ts";
import { correctReplayed, type ReplayItem } from "../src/train/replay.ts";
import { createTinyBase, useEngine } from "./helpers/engine.ts";

const eng = useEngine();
const T = 0.9; // a temperature other than 1: the ratio is of the tempered policy the turn was sampled with
let items: ReplayItem[] = [];

beforeAll(async () => {
  await createTinyBase(eng.client);
  // a learning rate that moves a random-init tiny model visibly in two steps
  await eng.client.createAdapter({
    name: "pi",
    base: "tiny",
    kind: "policy",
    seed: 0,
    lora: { r: 4, alpha: 8 },
    optimizer: { lr: 2e-2 },
  });
  // 6 turns sampled at version 0: the behaviour policy
  const res = await eng.client.sample({
    requests: ["aab", "bca", "cab", "abc", "ccc", "bab"].map((text, i) => ({
      adapter: "pi",
      messages: [{ role: "user" as const, content: `say ${text}` }],
      sampling: { temperature: T, max_new_tokens: 6, n: 1 },
      seed: 11 + i,
    })),
    seed: 1,
  });
  items = res.results.map((r, i) => {
    const c = r.completions[0]!;
    const turn: Turn = {
      order: 0,
      step: 0,
      agent: "pi",
      parents: [],
      adapter: "pi",
      adapterVersion: r.adapter_version,
      temperature: T,
      promptIds: r.prompt_ids,
      responseIds: c.response_ids,
      logprobs: c.logprobs,
      text: c.text,
      finishReason: c.finish_reason,
      reward: 0,
    };
    return {
      step: { episode: i, group: i, k: 0, turn, reward: 0 },
      advantages: [i % 2 === 0 ? 1 : -0.5],
      adapter: "pi",
    };
  });
  // two optimizer steps towards half of the turns: the policy moves, up on some tokens, down on others
  const data = items.slice(0, 3).map(({ step: { turn } }) => ({
    tokens: [...turn.promptIds, ...turn.responseIds],
    weights: [...turn.promptIds.map(() => 0), ...turn.responseIds.map(() => 1)],
  }));
  for (let i = 0; i < 2; i++) {
    await eng.client.forwardBackward({ adapter: "pi", loss: "cross_entropy", data, temperature: T });
    await eng.client.optimStep({ adapter: "pi" });
  }
});

describe("replayed turns: truncated importance weights", () => {
  it("w = min(cap, pi_now / pi_behaviour) per token, pi_now from a separate forward pass", async () => {
    // the ratio by hand: a forward pass of the adapter now, at the turns' temperature
    const fwd = await eng.client.forward({
      adapter: "pi",
      data: items.map(({ step: { turn } }) => ({
        tokens: [...turn.promptIds, ...turn.responseIds],
        weights: [...turn.promptIds.map(() => 0), ...turn.responseIds.map(() => 1)],
      })),
      temperature: T,
    });
    const now = fwd.results.map((r, i) => r.logprobs!.slice(items[i]!.step.turn.promptIds.length));
    const ratios = now.flatMap((lp, i) => lp.map((x, t) => Math.exp(x - items[i]!.step.turn.logprobs[t]!)));
    const cap = [...ratios].sort((a, b) => a - b)[Math.floor(ratios.length / 2)]!; // half of them capped
    expect(Math.max(...ratios) - Math.min(...ratios)).toBeGreaterThan(0.2); // the policy did move

    const r = await correctReplayed(
      eng.client,
      "pi",
      items,
      { pi: 2 },
      { capacity: 8, reuse: 1, maxAge: 2, clip: cap },
    );
    const w = r.weights.flat();
    expect(w).toHaveLength(ratios.length);
    for (const [k, x] of w.entries()) expect(x).toBeCloseTo(Math.min(cap, ratios[k]!), 9);
    expect(w.filter((x) => x === cap).length).toBeGreaterThan(0);
    expect(w.filter((x) => x < cap).length).toBeGreaterThan(0);
    r.items.forEach((it, i) => {
      // PPO's old log-probs are the proximal policy's; the advantage is scaled per token
      for (const [t, x] of it.oldLogprobs!.entries()) expect(x).toBeCloseTo(now[i]![t]!, 9);
      expect(it.advantages).toEqual(r.weights[i]!.map((x) => x * items[i]!.advantages[0]!));
    });
    expect(r.ages).toEqual(items.map(() => 2));
  });

  it("refuses a turn older than maxAge", async () => {
    await expect(
      correctReplayed(eng.client, "pi", items, { pi: 2 }, { capacity: 8, reuse: 1, maxAge: 1, clip: 1 }),
    ).rejects.toThrow(
      /was sampled by adapter pi v0, but it is now v2: refusing stale data older than train\.replay\.maxAge = 1/,
    );
  });
});
