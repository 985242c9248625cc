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
