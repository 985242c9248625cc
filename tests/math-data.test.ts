import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { datasetsDir } from "../src/envs/datasets.ts";
import { arithmeticSplits } from "../src/envs/math/arith.ts";
import { loadMathProblems, loadMathSplits } from "../src/envs/math/data.ts";
import { extractAnswer, extractAnswerIs, extractBoxed, extractLastNumber } from "../src/envs/math/extract.ts";

const DATA = datasetsDir();

describe("loadMathProblems on the shared datasets, as they are", () => {
  it("reads the MARFT reference format (JSON array of {problem, final_answer})", () => {
    const ps = loadMathProblems(join(DATA, "math/train.json"));
    // 4 rows have an empty final_answer: skipped, the others keep their row index as id
    expect(ps.length).toBe(7496);
    expect(ps[0]!.id).toBe("math/train.json#0");
    expect(ps.find((p) => p.id === "math/train.json#1634")).toBeUndefined();
    expect(ps[ps.length - 1]!.id).toBe("math/train.json#7499");
    expect(ps.every((p) => p.problem.length > 0 && p.answer.length > 0)).toBe(true);
  });

  it("reads GSM8K (JSONL {problem, final_answer, solution})", () => {
    const ps = loadMathProblems(join(DATA, "gsm8k/train.jsonl"));
    expect(ps.length).toBe(7473);
    expect(ps[0]).toMatchObject({ id: "gsm8k/train.jsonl#0", answer: "72" });
  });

  it("reads MATH-500 (JSONL {problem, solution, answer, ...})", () => {
    const ps = loadMathProblems(join(DATA, "math/test500.jsonl"));
    expect(ps.length).toBe(500);
    expect(ps[0]!.answer).toBe("\\left( 3, \\frac{\\pi}{2} \\right)");
  });
});

describe("loadMathProblems errors and splits", () => {
  const dir = mkdtempSync(join(tmpdir(), "marft-math-"));
  const file = (name: string, text: string) => {
    const p = join(dir, name);
    writeFileSync(p, text);
    return p;
  };

  it("names the file, the line and the missing field", () => {
    const f = file("a.jsonl", '{"problem":"1+1","answer":"2"}\n{"problem":"2+2"}\n');
    expect(() => loadMathProblems(f)).toThrow(`${f}:2: missing field "answer" (or "final_answer")`);
    const g = file("b.json", '[\n  {"problem": "1+1", "final_answer": "2"},\n  {"final_answer": "4"}\n]');
    expect(() => loadMathProblems(g)).toThrow(`${g}:3: missing field "problem"`);
    const h = file("c.jsonl", '{"problem":1,"answer":"2"}\n');
    expect(() => loadMathProblems(h)).toThrow(`${h}:1: field "problem"`);
  });

  it("accepts numeric answers", () => {
    const f = file("n.jsonl", '{"problem":"1+1","answer":2}\n');
    expect(loadMathProblems(f)[0]!.answer).toBe("2");
  });

  it("keeps intermediate results where a row has them", () => {
    const f = file(
      "t.jsonl",
      '{"problem":"5+3-2","answer":"6","steps":[8]}\n{"problem":"1+1","answer":"2"}\n',
    );
    const [a, b] = loadMathProblems(f);
    expect(a!.steps).toEqual(["8"]);
    expect(b!.steps).toBeUndefined();
  });

  it("keeps a problem's parts, and the two-step generator's parts are its two one-step problems", () => {
    const f = file("p.jsonl", '{"problem":"5+3-2","answer":"6","steps":[8],"parts":["5+3","{step1}-2"]}\n');
    expect(loadMathProblems(f)[0]!.parts).toEqual(["5+3", "{step1}-2"]);
    for (const p of arithmeticSplits(3, 50, 10, "two-step").train) {
      const [first, second] = p.parts!;
      // the first part is the problem up to its first change; the second starts from {step1}
      const sum = (text: string) => {
        const n = text.match(/\d+/g)!.map(Number);
        return /gets|buys|finds|is given/.test(text) ? n[0]! + n[1]! : n[0]! - n[1]!;
      };
      expect(sum(first!)).toBe(Number(p.steps![0]));
      expect(second).toMatch(/^\w+ has \{step1\} \w+\. /);
      expect(sum(second!.replace("{step1}", p.steps![0]!))).toBe(Number(p.answer));
      expect(p.problem.startsWith(first!.replace(/ How many .*$/, ""))).toBe(true);
    }
  });

  it("holds out the last rows for evaluation, with stable ids", () => {
    const rows = Array.from({ length: 10 }, (_, k) => JSON.stringify({ problem: `p${k}`, answer: `${k}` }));
    const f = file("s.jsonl", rows.join("\n"));
    const a = loadMathSplits({ trainFile: f, evalSplit: 3 });
    expect(a.train.map((p) => p.answer)).toEqual(["0", "1", "2", "3", "4", "5", "6"]);
    expect(a.eval.map((p) => p.id)).toEqual(
      ["s.jsonl#7", "s.jsonl#8", "s.jsonl#9"].map((x) => `${dir.split("/").pop()}/${x}`),
    );
    const b = loadMathSplits({ trainFile: f, evalFile: f, limit: 2 });
    expect(b.train.length).toBe(2);
    expect(b.eval.length).toBe(2);
  });
});

describe("answer extraction", () => {
  it("takes the last \\boxed{...} with nested braces", () => {
    expect(extractBoxed("first \\boxed{1}, then \\boxed{\\frac{1}{2}}.")).toBe("\\frac{1}{2}");
    expect(extractBoxed("$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$")).toBe(
      "\\left( 3, \\frac{\\pi}{2} \\right)",
    );
    expect(extractBoxed("\\boxed{\\{1,2\\}}")).toBe("\\{1,2\\}");
  });

  it("handles \\boxed 5, \\fbox{} and unclosed boxes", () => {
    expect(extractBoxed("so $\\boxed 5$.")).toBe("5");
    expect(extractBoxed("answer: \\fbox{42}")).toBe("42");
    // boxes standing together hold one answer; prose between them separates them
    expect(extractBoxed("\\boxed{12} and \\fbox{13}")).toBe("12, 13");
    expect(extractBoxed("\\boxed{12}. On second thought, \\fbox{13}")).toBe("13");
    expect(extractBoxed("\\boxed{\\frac{1}{2}")).toBeNull();
    expect(extractBoxed("no box here")).toBeNull();
    expect(extractBoxed("\\boxedx")).toBeNull();
  });

  it("falls back to 'the answer is ...'", () => {
    expect(extractAnswerIs("Thus the answer is 42.")).toBe("42");
    expect(extractAnswerIs("The answer is $\\frac{3}{4}$. Done")).toBe("\\frac{3}{4}");
    expect(extractAnswerIs("Final answer: 3.5")).toBe("3.5");
    expect(extractAnswerIs("the answer is 1, and the final answer is 2.")).toBe("2");
    expect(extractAnswerIs("nothing")).toBeNull();
  });

  it("optionally takes the last number", () => {
    expect(extractLastNumber("She has 1,234 apples and 5.5 pears")).toBe("5.5");
    expect(extractLastNumber("total 1,234,567")).toBe("1234567");
    expect(extractAnswer("she pays 72 dollars")).toBeNull();
    expect(extractAnswer("she pays 72 dollars", { lastNumber: true })).toBe("72");
    expect(extractAnswer("the answer is 3 but \\boxed{4}", { lastNumber: true })).toBe("4");
  });

  it("is fast on huge adversarial responses", () => {
    const t0 = performance.now();
    extractAnswer("\\boxed{".repeat(100_000) + "the answer is ".repeat(10_000), { lastNumber: true });
    extractAnswer("9".repeat(1_000_000) + ",", { lastNumber: true });
    expect(performance.now() - t0).toBeLessThan(2000);
  });
});
