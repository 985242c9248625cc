import { afterAll, describe, expect, it } from "vitest";
import { gradeAnswer, gradeResponse } from "../src/envs/math/grader.ts";
import { MathVerifyPool } from "../src/envs/math/math-verify-pool.ts";
import { closeSharedSymbolicPool } from "../src/envs/math/pool.ts";

const HANG = new URL("./fixtures/math/hang_math_verify.py", import.meta.url).pathname;
const YES = new URL("./fixtures/math/yes_math_verify.py", import.meta.url).pathname;

afterAll(() => closeSharedSymbolicPool());

describe("MathVerifyPool", () => {
  const pool = new MathVerifyPool({ size: 1 });
  afterAll(() => pool.close());

  it("is installed by make setup and judges what the TypeScript checker cannot", async () => {
    // an equation of a line in two forms: the TS checker has no rule for it, Math-Verify has
    const own = await gradeAnswer("y=-\\frac{1}{2}x+\\frac{3}{4}", "2x+4y-3=0", { mathVerify: false });
    expect(own.equal).toBe(false);
    const r = await gradeAnswer("y=-\\frac{1}{2}x+\\frac{3}{4}", "2x+4y-3=0", {
      mathVerify: pool,
      timeoutMs: 10_000,
    });
    expect(r).toMatchObject({ equal: true, reason: "math-verify" });
    expect(pool.version).toMatch(/^\d+\.\d+/);
    const wrong = await gradeAnswer("y=-\\frac{1}{2}x+\\frac{1}{4}", "2x+4y-3=0", { mathVerify: pool });
    expect(wrong.equal).toBe(false);
  }, 60_000);

  it("is never asked where exact values decide: no false positive on large or small constants", async () => {
    // a worker that calls everything equal: whatever it is asked about comes out equal
    const yes = new MathVerifyPool({ size: 1, script: YES });
    try {
      for (const [p, g] of [
        ["2^{31}-1", "2147483648"],
        ["100!", "100!+1"],
        ["\\frac{1}{2^{40}}", "\\frac{1}{2^{41}}"],
        ["10^{-13}", "0"],
        ["1000000000.5", "1000000000"],
        ["3r^2", "3R^2"],
        ["10^{10^{10}}", "10^{10^{11}}"],
      ] as const) {
        const r = await gradeAnswer(p, g, { mathVerify: yes });
        expect(r.equal, `${p} vs ${g}`).toBe(false);
      }
      // where the TypeScript checker is unsure, it is asked (and here says yes)
      expect(await gradeAnswer("-x > -1", "x < 1", { mathVerify: yes })).toMatchObject({
        equal: true,
        reason: "math-verify",
      });
    } finally {
      await yes.close();
    }
  });

  it("gradeResponse asks Math-Verify about the whole response where ours is unsure", async () => {
    const response = "Solving, we get $-x > -1$, so the answer is $-x > -1$.";
    const r = await gradeResponse(response, "x < 1", { mathVerify: pool, timeoutMs: 10_000 });
    expect(r).toMatchObject({ equal: true, reason: "math-verify", predExtracted: "-x > -1" });
    // no answer in the asked-for form: no reward, whatever Math-Verify would find
    const none = await gradeResponse("we get 3 in the end", "3", { mathVerify: pool });
    expect(none).toMatchObject({ equal: false, reason: "no answer found", predExtracted: null });
  }, 60_000);
});

describe("MathVerifyPool failures", () => {
  it("a worker that never answers is killed at the time limit and replaced", async () => {
    const pool = new MathVerifyPool({ size: 1, script: HANG });
    try {
      const t0 = performance.now();
      const r = await pool.verify({ gold: "1", pred: "1" }, 300);
      expect(r).toEqual({ ok: false, reason: "math-verify timeout after 300 ms" });
      const r2 = await pool.verify({ gold: "2", pred: "2" }, 300);
      expect(r2).toEqual({ ok: false, reason: "math-verify timeout after 300 ms" });
      expect(performance.now() - t0).toBeLessThan(10_000);
      // the grader keeps its own verdict, with the reason
      const g = await gradeAnswer("-x > -1", "x < 1", { mathVerify: pool, timeoutMs: 300 });
      expect(g.equal).toBe(false);
      expect(g.reason).toMatch(/math-verify timeout after 300 ms$/);
    } finally {
      await pool.close();
    }
  }, 30_000);

  it("without Python the pool is unavailable at once and the TypeScript checker decides", async () => {
    const pool = new MathVerifyPool({ python: "/nonexistent/python" });
    try {
      const r = await pool.verify({ gold: "1", pred: "1" }, 1000);
      expect(r.ok).toBe(false);
      expect(pool.unavailable).toMatch(/ENOENT/);
      const t0 = performance.now();
      const g = await gradeAnswer("(x+1)^2", "x^2+2x+1", { mathVerify: pool });
      expect(g).toMatchObject({ equal: true, reason: "symbolic" });
      const n = await gradeAnswer("-x > -1", "x < 1", { mathVerify: pool });
      expect(n.equal).toBe(false);
      expect(n.reason).toMatch(/math-verify unavailable/);
      expect(performance.now() - t0).toBeLessThan(5000);
    } finally {
      await pool.close();
    }
  });

  it("a worker whose Python lacks math-verify says so, and is not restarted", async () => {
    const pool = new MathVerifyPool({ python: "python3", script: "-c" });
    try {
      // "python3 -u -c" with no program exits with an error before it is ready
      const r = await pool.verify({ gold: "1", pred: "1" }, 1000);
      expect(r.ok).toBe(false);
      expect(pool.unavailable).not.toBeNull();
      const again = await pool.verify({ gold: "1", pred: "1" }, 1000);
      expect(again).toMatchObject({ ok: false, reason: expect.stringMatching(/^math-verify unavailable/) });
    } finally {
      await pool.close();
    }
  });
});
