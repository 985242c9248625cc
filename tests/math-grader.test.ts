import { readFileSync } from "node:fs";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { datasetsDir } from "../src/envs/datasets.ts";
import { gradeAnswer } from "../src/envs/math/grader.ts";
import { orderPrescribed } from "../src/envs/math/list-order.ts";
import { closeSharedSymbolicPool, SymbolicPool } from "../src/envs/math/pool.ts";
import { GRADER_TABLE } from "./fixtures/math/grader-table.ts";

afterAll(() => closeSharedSymbolicPool());

describe("gradeAnswer: table of real MATH answer forms", () => {
  it("has at least 150 pairs, both equal and not equal", () => {
    expect(GRADER_TABLE.length).toBeGreaterThanOrEqual(150);
    expect(GRADER_TABLE.filter((r) => r[2]).length).toBeGreaterThan(60);
    expect(GRADER_TABLE.filter((r) => !r[2]).length).toBeGreaterThan(60);
  });

  it("gives the expected verdict on every pair", async () => {
    const got = await Promise.all(GRADER_TABLE.map(([p, g]) => gradeAnswer(p, g)));
    const wrong = GRADER_TABLE.map((row, k) => ({ row, r: got[k]! })).filter(
      ({ row, r }) => r.equal !== row[2],
    );
    expect(
      wrong.map(
        ({ row, r }) => `${JSON.stringify(row)} -> ${r.predNormalized} | ${r.goldNormalized} (${r.reason})`,
      ),
    ).toEqual([]);
  });

  it("is symmetric on the table", async () => {
    const got = await Promise.all(GRADER_TABLE.map(([p, g]) => gradeAnswer(g, p)));
    const wrong = GRADER_TABLE.filter((row, k) => got[k]!.equal !== row[2]);
    expect(wrong).toEqual([]);
  });
});

describe("gradeAnswer: adversarial input", () => {
  const LIMIT_MS = 1000;
  const nest = (n: number, open: string, close: string, core = "1") =>
    open.repeat(n) + core + close.repeat(n);
  const cases: Array<[string, string, string]> = [
    ["deeply nested braces", nest(1500, "{", "}"), "1"],
    ["very deeply nested braces", nest(100_000, "{", "}"), "1"],
    ["nested \\frac", nest(400, "\\frac{1}{", "}"), "1"],
    ["nested parentheses", nest(1500, "(", ")"), "2"],
    ["nested \\sqrt", nest(300, "\\sqrt{", "}", "2"), "\\sqrt{2}"],
    ["tower of powers", "10^{10^{10}}", "10^{10^{11}}"],
    ["power tower without braces", "9^9^9^9^9^9^9^9", "9^9^9^9^9^9^9^8"],
    ["huge factorial", "100000000!", "99999999!"],
    ["huge string", "1".repeat(2_000_000), "1".repeat(1_999_999) + "2"],
    ["huge integer", "9".repeat(3000), "9".repeat(2999) + "8"],
    ["long list", Array.from({ length: 2000 }, (_, k) => String(k)).join(","), "1,2"],
    ["many variables", Array.from({ length: 300 }, () => "x^{x^{x}}").join("+"), "x"],
    ["unbalanced braces", "\\frac{{{{1}{2", "\\frac{1}{2}"],
    ["backslash soup", "\\".repeat(3000), "\\frac{1}{2}"],
    ["unit regex bait", `5 ${"m ".repeat(3000)}x`, "5"],
    ["boxed bait", "\\boxed{".repeat(1000), "5"],
  ];

  it("warms the worker pool", async () => {
    expect((await gradeAnswer("x^2-1", "(x-1)(x+1)")).equal).toBe(true);
  });

  for (const [name, pred, gold] of cases) {
    it(`${name}: returns within the time limit with equal=false`, async () => {
      const t0 = performance.now();
      const r = await gradeAnswer(pred, gold, { timeoutMs: LIMIT_MS });
      const ms = performance.now() - t0;
      expect(r.equal).toBe(false);
      expect(ms).toBeLessThan(LIMIT_MS + 500);
    });
  }

  it("a worker that never answers is terminated at the time limit and replaced", async () => {
    const pool = new SymbolicPool(1, new URL("./fixtures/math/hang-worker.mjs", import.meta.url));
    try {
      const t0 = performance.now();
      const r = await gradeAnswer("x^2", "x \\cdot x", { timeoutMs: 200, pool, mathVerify: false });
      expect(r).toMatchObject({ equal: false, reason: "timeout after 200 ms" });
      expect(performance.now() - t0).toBeLessThan(5000);
      // the next job gets a fresh worker (which hangs too, and is stopped again)
      const r2 = await gradeAnswer("y^2", "y \\cdot y", { timeoutMs: 200, pool, mathVerify: false });
      expect(r2.reason).toBe("timeout after 200 ms");
    } finally {
      await pool.close();
    }
  });

  it("many checks at once share the pool and all finish", async () => {
    const jobs = Array.from({ length: 60 }, (_, k) => gradeAnswer(`(x+${k})^2`, `x^2+${2 * k}x+${k * k}`));
    const rs = await Promise.all(jobs);
    expect(rs.every((r) => r.equal)).toBe(true);
  });
});

describe("gradeAnswer: properties", () => {
  const answers = readFileSync(join(datasetsDir(), "math/test500.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => (JSON.parse(l) as { answer: string }).answer);

  it("every MATH-500 answer equals itself", async () => {
    const rs = await Promise.all(answers.map((a) => gradeAnswer(a, a)));
    expect(answers.filter((_, k) => !rs[k]!.equal)).toEqual([]);
  });

  /** Spaces around punctuation, \left/\right on parentheses, \dfrac or \tfrac for \frac, $...$. */
  const variant = fc.record({
    spaces: fc.array(fc.boolean(), { minLength: 64, maxLength: 64 }),
    leftRight: fc.boolean(),
    frac: fc.constantFrom("\\frac", "\\dfrac", "\\tfrac"),
    dollars: fc.boolean(),
  });
  function reformat(
    a: string,
    v: { spaces: boolean[]; leftRight: boolean; frac: string; dollars: boolean },
  ): string {
    let k = 0;
    let s = a.replace(/(?<!\\)([,+=(){}[\]])/g, (m) => (v.spaces[k++ % 64] ? ` ${m} ` : m));
    if (v.leftRight)
      s = s.replace(/(?<!\\left|\\right)\(/g, "\\left(").replace(/(?<!\\right)\)/g, "\\right)");
    s = s.replace(/\\frac(?![a-z])/g, v.frac);
    return v.dollars ? `$${s}$` : s;
  }

  it("formatting variations keep equality", async () => {
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...answers), variant, async (a, v) => {
        const b = reformat(a, v);
        const r = await gradeAnswer(b, a);
        if (!r.equal) throw new Error(`${JSON.stringify(b)} vs ${JSON.stringify(a)}: ${r.reason}`);
      }),
      { numRuns: 300, seed: 4 },
    );
  });
});

describe("gradeAnswer: bare lists and the question", () => {
  const opts = { mathVerify: false } as const;
  const roots =
    "Find the roots of $6x^4+19x^3-51x^2+20x$. Enter your answer as a list of numbers separated by commas.";
  const scores = "List Trisha's five test scores from the greatest to the least, separated by commas.";

  it("a question that asks for no order makes a bare list a set", async () => {
    const [pred, gold] = ["-5, 0, \\frac12, \\frac43", "0, \\frac{1}{2}, \\frac{4}{3}, -5"];
    expect((await gradeAnswer(pred, gold, { ...opts, question: roots })).equal).toBe(true);
    // without it, a gold written in no sorted order is read in order
    expect((await gradeAnswer(pred, gold, opts)).equal).toBe(false);
  });

  it("a question that prescribes an order makes it a sequence", async () => {
    const [pred, gold] = ["70, 73, 85, 88, 89", "89, 88, 85, 73, 70"];
    expect((await gradeAnswer(pred, gold, { ...opts, question: scores })).equal).toBe(false);
    expect((await gradeAnswer(gold, gold, { ...opts, question: scores })).equal).toBe(true);
    expect((await gradeAnswer(pred, gold, opts)).equal).toBe(true);
  });

  it("reads an order only from what the question says about the answer", () => {
    expect(orderPrescribed("List your answers in increasing order separated by commas.")).toBe(true);
    expect(
      orderPrescribed("Answer by listing your choices in alphabetical order, separated by commas."),
    ).toBe(true);
    expect(
      orderPrescribed(
        "When writing your answer, first write the length of $BP$, then a comma, and then $QT$.",
      ),
    ).toBe(true);
    expect(orderPrescribed("Enter the values $a,$ $b,$ $c,$ separated by commas, in any order.")).toBe(false);
    expect(
      orderPrescribed(
        "Find all $a$ such that $\\cos a,$ $\\cos 2a,$ and $\\cos 3a$ form an arithmetic sequence, in that order. Enter the solutions, separated by commas, in degrees.",
      ),
    ).toBe(false);
    expect(orderPrescribed(roots)).toBe(false);
  });
});
