// `marft grade math`: the math answer checker on the command line, for people who debug rewards.
// stdin: JSONL {"pred": ..., "gold": ...}; stdout: one JSON verdict per non-blank input line, in input
// order, each written as soon as it and the lines before it are graded (a caller may write one line
// and wait for its verdict).
import { createInterface } from "node:readline";
import { z } from "zod";
import { extractBoxed } from "../envs/math/extract.ts";
import { gradeAnswer, gradeResponse } from "../envs/math/grader.ts";
import { closeSharedMathVerifyPool, sharedMathVerifyPool } from "../envs/math/math-verify-pool.ts";
import { closeSharedSymbolicPool } from "../envs/math/pool.ts";

const USAGE = `usage: marft grade math [--extract] [--last-number] [--timeout-ms MS] [--no-math-verify]

Reads JSONL lines {"pred": ..., "gold": ...} on stdin and prints one JSON verdict per line:
  {"equal": true|false, "pred_normalized": ..., "gold_normalized": ..., "reason": ...}
Each verdict is printed as soon as it is graded, in input order. A malformed line prints
{"line": N, "error": "..."} and grading goes on; the exit code is 0.
A pred that contains \\boxed{...} is graded on the content of its last box(es).
Where the TypeScript checker is not certain, Math-Verify (Python, from the repository's .venv or
$MARFT_PYTHON) gives the verdict; without Python the TypeScript verdict stands (docs/MATH-JUDGE.md).

options:
  --extract        pred is a full model response: grade the answer it commits to (the last
                   \\boxed{...}/\\fbox{...}, else "the answer is ..."), as the training reward does;
                   the verdict then also has "pred_extracted" (null when no answer was found)
  --last-number    with --extract, fall back to the last number in the response (GSM8K style)
  --timeout-ms MS  time limit of each slow check, symbolic or Math-Verify (default 2000)
  --no-math-verify the TypeScript checker alone
  -h, --help       this text
`;

const Line = z.object({
  pred: z.union([z.string(), z.number()]),
  gold: z.union([z.string(), z.number()]),
});

interface GradeCliOptions {
  extract: boolean;
  lastNumber: boolean;
  timeoutMs: number;
  mathVerify: boolean;
  help: boolean;
}

/** Lines graded at once: enough to keep the worker pool busy, bounded so stdin is read as a stream. */
const IN_FLIGHT = 64;

export async function gradeCommand(args: string[]): Promise<void> {
  const [task, ...rest] = args;
  if (task === "-h" || task === "--help" || task === undefined) {
    (task === undefined ? process.stderr : process.stdout).write(USAGE);
    if (task === undefined) process.exitCode = 2;
    return;
  }
  if (task !== "math") {
    process.stderr.write(`marft grade: unknown task "${task}" (only "math")\n\n${USAGE}`);
    process.exitCode = 2;
    return;
  }
  const opts = parseOptions(rest);
  if (typeof opts === "string") {
    process.stderr.write(`marft grade math: ${opts}\n\n${USAGE}`);
    process.exitCode = 2;
    return;
  }
  if (opts.help) {
    process.stdout.write(USAGE);
    return;
  }
  const rl = createInterface({ input: process.stdin, crlfDelay: Number.POSITIVE_INFINITY });
  // Lines are graded concurrently; `written` chains the writes so that verdicts leave in input order,
  // each as soon as it and every line before it are done.
  let written: Promise<void> = Promise.resolve();
  let inFlight = 0;
  let lineNo = 0;
  try {
    for await (const line of rl) {
      lineNo++;
      if (line.trim() === "") continue;
      const verdict = gradeLine(line, lineNo, opts);
      inFlight++;
      written = written.then(async () => {
        await write(await verdict);
        inFlight--;
      });
      // bounded: stop reading while too many lines wait (stdin is read as a stream)
      if (inFlight >= IN_FLIGHT) await written;
    }
    await written;
  } finally {
    await Promise.all([closeSharedSymbolicPool(), closeSharedMathVerifyPool()]);
  }
}

function parseOptions(args: string[]): GradeCliOptions | string {
  const opts: GradeCliOptions = {
    extract: false,
    lastNumber: false,
    timeoutMs: 2000,
    mathVerify: true,
    help: false,
  };
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === "-h" || a === "--help") opts.help = true;
    else if (a === "--no-math-verify") opts.mathVerify = false;
    else if (a === "--extract") opts.extract = true;
    else if (a === "--last-number") opts.lastNumber = true;
    else if (a === "--timeout-ms") {
      const v = Number(args[++i]);
      if (!Number.isFinite(v) || v <= 0) return `--timeout-ms needs a positive number of milliseconds`;
      opts.timeoutMs = v;
    } else return `unknown option "${a}"`;
  }
  if (opts.help) return opts;
  if (opts.lastNumber && !opts.extract) return "--last-number only makes sense with --extract";
  return opts;
}

async function gradeLine(line: string, lineNo: number, opts: GradeCliOptions): Promise<string> {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch (e) {
    return JSON.stringify({ line: lineNo, error: `line ${lineNo}: invalid JSON: ${(e as Error).message}` });
  }
  const parsed = Line.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const field = issue.path.join(".");
    const missing =
      typeof value === "object" && value !== null && field !== "" && !(field in value)
        ? "missing field"
        : "field";
    const what = field
      ? `${missing} "${field}"${missing === "field" ? `: ${issue.message}` : ""}`
      : issue.message;
    return JSON.stringify({ line: lineNo, error: `line ${lineNo}: ${what}` });
  }
  const gold = String(parsed.data.gold);
  const pred = String(parsed.data.pred);
  const grading = {
    timeoutMs: opts.timeoutMs,
    mathVerify: opts.mathVerify ? sharedMathVerifyPool() : false,
  } as const;
  if (opts.extract) {
    const r = await gradeResponse(pred, gold, { ...grading, lastNumber: opts.lastNumber });
    return JSON.stringify({
      equal: r.equal,
      pred_normalized: r.predExtracted === null ? "" : r.predNormalized,
      gold_normalized: r.goldNormalized,
      reason: r.reason,
      pred_extracted: r.predExtracted,
    });
  }
  // a pasted response with a box is graded on the box even without --extract (gold answers never box)
  const r = await gradeAnswer(extractBoxed(pred) ?? pred, gold, grading);
  return JSON.stringify({
    equal: r.equal,
    pred_normalized: r.predNormalized,
    gold_normalized: r.goldNormalized,
    reason: r.reason,
  });
}

function write(line: string): Promise<void> {
  return new Promise((resolve) => {
    if (process.stdout.write(`${line}\n`)) resolve();
    else process.stdout.once("drain", resolve);
  });
}
