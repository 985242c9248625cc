import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";

const ROOT = new URL("..", import.meta.url).pathname;

function grade(args: string[], stdin: string) {
  const r = spawnSync("node", ["bin/marft.mjs", "grade", ...args], {
    cwd: ROOT,
    input: stdin,
    encoding: "utf8",
  });
  const lines = r.stdout.split("\n").filter((l) => l !== "");
  return {
    status: r.status,
    stderr: r.stderr,
    out: lines.map((l) => JSON.parse(l) as Record<string, unknown>),
  };
}

describe("marft grade math", () => {
  it("prints one verdict per line, errors for malformed lines, and exits 0", () => {
    const input = [
      JSON.stringify({ pred: "\\frac12", gold: "0.5" }),
      "not json",
      JSON.stringify({ pred: "x^2-1", gold: "(x-1)(x+1)" }),
      "",
      JSON.stringify({ gold: "3" }),
      JSON.stringify({ pred: "(3,4]", gold: "(3,4)" }),
      JSON.stringify({ pred: 72, gold: "72" }),
      JSON.stringify({ pred: "So the answer is $\\boxed{\\dfrac{3}{4}}$.", gold: "0.75" }),
    ].join("\n");
    const { status, out } = grade(["math"], input);
    expect(status).toBe(0);
    expect(out).toHaveLength(7);
    expect(out[0]).toMatchObject({ equal: true, pred_normalized: "\\frac12", gold_normalized: "0.5" });
    expect(out[1]).toMatchObject({ line: 2 });
    expect(String(out[1]!.error)).toMatch(/^line 2: invalid JSON/);
    expect(out[2]).toMatchObject({ equal: true, reason: "symbolic" });
    expect(out[3]).toEqual({ line: 5, error: 'line 5: missing field "pred"' });
    expect(out[4]).toMatchObject({ equal: false, pred_normalized: "(3,4]", gold_normalized: "(3,4)" });
    expect(out[5]).toMatchObject({ equal: true });
    expect(out[6]).toMatchObject({ equal: true, pred_normalized: "\\frac{3}{4}" });
  });

  it("--extract grades the answer a response commits to, --last-number falls back to the last number", () => {
    const input = [
      JSON.stringify({ pred: "first \\boxed{41}, no wait: the answer is 42.", gold: "42" }),
      JSON.stringify({ pred: "Thus the answer is $\\frac{1}{2}$.", gold: "0.5" }),
      JSON.stringify({ pred: "she pays 42 dollars", gold: "42" }),
    ].join("\n");
    const plain = grade(["math", "--extract"], input).out;
    expect(plain.map((v) => v.equal)).toEqual([false, true, false]);
    expect(plain.map((v) => v.pred_extracted)).toEqual(["41", "\\frac{1}{2}", null]);
    expect(plain[2]).toMatchObject({ reason: "no answer found" });
    const last = grade(["math", "--extract", "--last-number"], input).out;
    expect(last.map((v) => v.equal)).toEqual([false, true, true]);
  });

  it("rejects unknown tasks and options with exit code 2", () => {
    expect(grade(["code"], "").status).toBe(2);
    const r = grade(["math", "--bogus"], "");
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/unknown option "--bogus"/);
  });
});
