// `marft grade math`: the math answer checker on the command line, for people who debug rewards.
// stdin: JSONL {"pred": ..., "gold": ...}; stdout: one JSON verdict per non-blank input line, in order.
import { createInterface } from "node:readline";
import { z } from "zod";
import { extractAnswer, extractBoxed } from "../envs/math/extract.ts";
import { gradeAnswer } from "../envs/math/grader.ts";
import { normalizeAnswer } from "../envs/math/normalize.ts";
import { closeSharedSymbolicPool } from "../envs/math/pool.ts";

const USAGE = `usage: marft grade math [--extract] [--last-number] [--timeout-ms MS]

Reads JSONL lines {"pred": ..., "gold": ...} on stdin and prints one JSON verdict per line:
  {"equal": true|false, "pred_normalized": ..., "gold_normalized": ..., "reason": ...}
A malformed line prints {"line": N, "error": "..."} and grading goes on; the exit code is 0.
A pred that contains \\boxed{...} is graded on the content of its last box.

options:
  --extract        pred is a full model response: grade the answer it commits to (the last
                   \\boxed{...}/\\fbox{...}, else "the answer is ..."), as the training reward does;
                   the verdict then also has "pred_extracted" (null when no answer was found)
  --last-number    with --extract, fall back to the last number in the response (GSM8K style)
  --timeout-ms MS  time limit of each symbolic check (default 2000)
`;

const Line = z.object({
  pred: z.union([z.string(), z.number()]),
  gold: z.union([z.string(), z.number()]),
});

interface GradeCliOptions {
  extract: boolean;
  lastNumber: boolean;
  timeoutMs: number;
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
  const rl = createInterface({ input: process.stdin, crlfDelay: Number.POSITIVE_INFINITY });
  const pending: Array<Promise<string>> = [];
  let lineNo = 0;
  try {
    for await (const line of rl) {
      lineNo++;
      if (line.trim() === "") continue;
      pending.push(gradeLine(line, lineNo, opts));
      if (pending.length >= IN_FLIGHT) await write(await pending.shift()!);
    }
    while (pending.length > 0) await write(await pending.shift()!);
  } finally {
    await closeSharedSymbolicPool();
  }
}

function parseOptions(args: string[]): GradeCliOptions | string {
  const opts: GradeCliOptions = { extract: false, lastNumber: false, timeoutMs: 2000 };
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (a === "--extract") opts.extract = true;
    else if (a === "--last-number") opts.lastNumber = true;
    else if (a === "--timeout-ms") {
      const v = Number(args[++i]);
      if (!Number.isFinite(v) || v <= 0) return `--timeout-ms needs a positive number of milliseconds`;
      opts.timeoutMs = v;
    } else return `unknown option "${a}"`;
  }
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
  let pred = String(parsed.data.pred);
  let extracted: { pred_extracted: string | null } | Record<string, never> = {};
  if (opts.extract) {
    const found = extractAnswer(pred, { lastNumber: opts.lastNumber });
    extracted = { pred_extracted: found };
    if (found === null) {
      return JSON.stringify({
        equal: false,
        pred_normalized: "",
        gold_normalized: normalizeAnswer(gold),
        reason: "no answer found",
        ...extracted,
      });
    }
    pred = found;
  } else {
    // a pasted response with a box is graded on the box even without --extract (gold answers never box)
    pred = extractBoxed(pred) ?? pred;
  }
  const r = await gradeAnswer(pred, gold, { timeoutMs: opts.timeoutMs });
  return JSON.stringify({
    equal: r.equal,
    pred_normalized: r.predNormalized,
    gold_normalized: r.goldNormalized,
    reason: r.reason,
    ...extracted,
  });
}

function write(line: string): Promise<void> {
  return new Promise((resolve) => {
    if (process.stdout.write(`${line}\n`)) resolve();
    else process.stdout.once("drain", resolve);
  });
}
