// bench/results.json's layout: indented JSON whose arrays of numbers (per-iteration curves) sit on
// one line each, so a full async bench's 60-iteration curves do not run to hundreds of lines.
import { describe, expect, it } from "vitest";
import { resultsJson } from "../src/cli/bench.ts";

describe("resultsJson", () => {
  it("keeps the content, puts number arrays on one line and leaves other arrays indented", () => {
    const r = { a: { curve: [0.25, -1e-7, 3, 1.5e21] }, names: ["x", "y"], runs: [[1, 2], [3]], n: 4 };
    const text = resultsJson(r);
    expect(JSON.parse(text)).toEqual(r);
    expect(text).toContain('"curve": [0.25, -1e-7, 3, 1.5e+21]');
    expect(text).toContain("[1, 2]");
    expect(text).toContain('"names": [\n    "x",\n    "y"\n  ]');
  });
});

describe("promptLookupRate (bench/rollout.ts)", () => {
  it("counts the sampled tokens that prompt-lookup drafts would have matched, per step", async () => {
    const { promptLookupRate } = await import("../bench/rollout.ts");
    const prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    // 2 and 3 have no earlier match of the last two tokens; then [2, 3] recurs in the prompt, and
    // the draft after it, 4 5 6 ..., matches the 3 tokens left: 5 tokens in 3 steps
    expect(promptLookupRate([{ promptIds: prompt, responseIds: [2, 3, 4, 5, 6] }])).toBeCloseTo(5 / 3);
    // the draft stops at the first token that differs from the sampled one: 4 5 match, then 0
    expect(promptLookupRate([{ promptIds: prompt, responseIds: [2, 3, 4, 5, 0, 0] }])).toBeCloseTo(6 / 4);
    // nothing recurs: one token a step
    expect(promptLookupRate([{ promptIds: prompt, responseIds: [10, 11, 12] }])).toBe(1);
    // k caps a step at k drafted tokens plus its own; turns pool their tokens and steps
    const copy = { promptIds: prompt, responseIds: [2, 3, 4, 5, 6, 7, 8, 9] };
    expect(promptLookupRate([copy], 2, 2)).toBeCloseTo(8 / 4);
    expect(promptLookupRate([copy, { promptIds: prompt, responseIds: [10, 11, 12] }], 2, 8)).toBeCloseTo(
      11 / 6,
    );
  });
});
