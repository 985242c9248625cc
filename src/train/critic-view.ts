// How the centralized critic reads turns sampled on another base (a heterogeneous team): their
// prompt and response ids re-tokenized by the critic's tokenizer (the engine decodes them with the
// agent's tokenizer, template tokens kept as text, and encodes the text with the critic's). MARFT-A
// needs the critic's values only at the last prompt token and after the action, which map back to
// the agent's token layout one for one; token-level estimators need one tokenization (the config
// refuses marft-t across bases).
import type { ComputeEngine } from "../client/compute.ts";
import type { RunConfig } from "../config/schema.ts";
import type { Step } from "./steps.ts";

/** The steps as the critic reads them: those of agents on other bases re-tokenized. */
export async function criticView(
  engine: ComputeEngine,
  steps: readonly Step[],
  c: RunConfig,
): Promise<Step[]> {
  const critic = c.critic!.base;
  const baseOf = new Map(c.agents.map((a) => [a.id, a.base]));
  const out = [...steps];
  const byBase = new Map<string, number[]>();
  steps.forEach((s, i) => {
    const b = baseOf.get(s.turn.agent)!;
    if (b !== critic) byBase.set(b, [...(byBase.get(b) ?? []), i]);
  });
  for (const [base, idx] of byBase) {
    const ids = idx.flatMap((i) => [steps[i]!.turn.promptIds, steps[i]!.turn.responseIds]);
    const r = await engine.retokenize({ from_base: base, to_base: critic, ids });
    idx.forEach((i, k) => {
      const s = steps[i]!;
      out[i] = { ...s, turn: { ...s.turn, promptIds: r.ids[2 * k]!, responseIds: r.ids[2 * k + 1]! } };
    });
  }
  return out;
}

/**
 * The critic's values over a viewed step's tokens [P' + L'] laid out over the agent's own [P + L]:
 * the prompt positions take V at the viewed prompt's end, the response positions V after the viewed
 * response (all an action-level estimator reads: values[P - 1] and values[P + L - 1]).
 */
export function valuesInAgentLayout(own: Step, viewed: Step, values: readonly number[]): number[] {
  if (viewed === own) return [...values];
  const P = own.turn.promptIds.length;
  const L = own.turn.responseIds.length;
  const atPrompt = values[viewed.turn.promptIds.length - 1]!;
  const after = values[values.length - 1]!;
  return [...new Array<number>(P).fill(atPrompt), ...new Array<number>(L).fill(after)];
}
