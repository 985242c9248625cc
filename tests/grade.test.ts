import { spawn, spawnSync } from "node:child_process";
import { createInterface } from "node:readline";
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

  it("--help prints usage and exits 0, for the task and for grade itself", () => {
    for (const args of [
      ["math", "--help"],
      ["math", "-h"],
      ["--help"],
      ["math", "--last-number", "--help"],
    ]) {
      const r = spawnSync("node", ["bin/marft.mjs", "grade", ...args], { cwd: ROOT, encoding: "utf8" });
      expect(r.status, args.join(" ")).toBe(0);
      expect(r.stderr).toBe("");
      expect(r.stdout).toMatch(/^usage: marft grade math/);
    }
  });

  it("streams: each verdict comes as soon as its line is graded, before stdin closes", async () => {
    const child = spawn("node", ["bin/marft.mjs", "grade", "math"], {
      cwd: ROOT,
      stdio: ["pipe", "pipe", "pipe"],
    });
    const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
    const next = async (ms: number) => {
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no verdict within ${ms} ms`)), ms);
      });
      try {
        const r = await Promise.race([lines.next(), timeout]);
        return JSON.parse(String(r.value)) as Record<string, unknown>;
      } finally {
        clearTimeout(timer);
      }
    };
    try {
      // one line, then wait for its verdict with stdin still open; then the next
      child.stdin.write(`${JSON.stringify({ pred: "\\frac12", gold: "0.5" })}\n`);
      expect(await next(30_000)).toMatchObject({ equal: true });
      child.stdin.write(`${JSON.stringify({ pred: "2^{31}-1", gold: "2147483648" })}\n`);
      expect(await next(10_000)).toMatchObject({ equal: false });
      child.stdin.write("not json\n");
      expect(await next(10_000)).toMatchObject({ line: 3 });
    } finally {
      child.stdin.end();
      child.kill();
    }
  }, 60_000);

  it("keeps input order when a later line is graded first", () => {
    // the first line needs the symbolic worker, the second is decided at once
    const input = [
      JSON.stringify({ pred: "(x+1)^2", gold: "x^2+2x+1" }),
      JSON.stringify({ pred: "3", gold: "4" }),
    ].join("\n");
    const { out } = grade(["math", "--no-math-verify"], input);
    expect(out.map((v) => v.equal)).toEqual([true, false]);
  });
});
