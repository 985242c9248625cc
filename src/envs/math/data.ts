// Math problems from the files in ../shared/datasets, as they are:
//   MARFT reference (math/train.json):  JSON array of {problem, final_answer}
//   GSM8K (gsm8k/train.jsonl):          JSONL {problem, final_answer, solution}
//   MATH-500 (math/test500.jsonl):      JSONL {problem, solution, answer, subject, level, unique_id}
//   any of them may carry `steps`: the intermediate results in order (step rewards, env.ts), and
//   `parts`: the problem's text cut at its steps (one part per step, then the rest; `splitParts`)
import { basename, dirname } from "node:path";
import { z } from "zod";
import { DatasetError, holdOutLast, readJsonRecords } from "../datasets.ts";

export interface MathProblem {
  /** Stable across runs: `<dir>/<file>#<row>` (row = 0-based record index in the file). */
  id: string;
  problem: string;
  /** The gold answer as written in the data (LaTeX for MATH, a plain number for GSM8K). */
  answer: string;
  /** Intermediate results in order (the answer not included), where the data has them. */
  steps?: string[];
  /** The problem's text cut at its steps: part i states step i, the last part what follows. */
  parts?: string[];
}

// Answers are strings in all three datasets; a number is accepted too (user files often have them).
const Answer = z.union([z.string(), z.number()]);
const MathRow = z.object({
  problem: z.string(),
  answer: Answer.optional(),
  final_answer: Answer.optional(),
  steps: z.array(Answer).optional(),
  parts: z.array(z.string()).optional(),
});

/** A short, stable name for a data file: its folder and file name, e.g. `gsm8k/train.jsonl`. */
export function datasetName(file: string): string {
  return `${basename(dirname(file))}/${basename(file)}`;
}

/**
 * Loads the problems of a JSON/JSONL file; throws `<file>:<line>: missing field "..."` on a bad row.
 * Rows whose answer is empty (4 of the 7,500 in math/train.json) can never be graded correct, so they
 * are skipped; ids keep the row index, so skipping never renames a problem.
 */
export function loadMathProblems(file: string): MathProblem[] {
  const name = datasetName(file);
  const all = readJsonRecords(file).map((rec, row) => {
    const { value, line } = rec;
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
      throw new DatasetError(file, line, "expected a JSON object");
    }
    const parsed = MathRow.safeParse(value);
    if (!parsed.success) {
      const issue = parsed.error.issues[0]!;
      const field = issue.path.map(String).join(".");
      if (!(field in value)) throw new DatasetError(file, line, `missing field "${field}"`);
      throw new DatasetError(file, line, `field "${field}": ${issue.message}`);
    }
    const answer = parsed.data.answer ?? parsed.data.final_answer;
    if (answer === undefined) {
      throw new DatasetError(file, line, `missing field "answer" (or "final_answer")`);
    }
    const steps = parsed.data.steps?.map((x) => String(x).trim());
    return {
      id: `${name}#${row}`,
      problem: parsed.data.problem,
      answer: String(answer).trim(),
      ...(steps ? { steps } : {}),
      ...(parsed.data.parts ? { parts: parsed.data.parts } : {}),
    };
  });
  return all.filter((p) => p.answer !== "");
}

export interface MathSplitOptions {
  trainFile: string;
  /** Held-out file; without it, the last `evalSplit` rows of the training file are held out. */
  evalFile?: string;
  /** Rows of the training file held out for evaluation when there is no evalFile (default 0). */
  evalSplit?: number;
  /** Keep at most this many problems of each split (from the start), for quick runs. */
  limit?: number;
}

/** Train and eval problems; the eval rows are never in train. */
export function loadMathSplits(opts: MathSplitOptions): { train: MathProblem[]; eval: MathProblem[] } {
  const all = loadMathProblems(opts.trainFile);
  let train = all;
  let evalSet: MathProblem[] = [];
  if (opts.evalFile !== undefined) {
    evalSet = loadMathProblems(opts.evalFile);
    if (opts.evalSplit) train = holdOutLast(all, opts.evalSplit).train;
  } else if (opts.evalSplit) {
    const split = holdOutLast(all, opts.evalSplit);
    train = split.train;
    evalSet = split.dev;
  }
  if (opts.limit !== undefined) {
    train = train.slice(0, opts.limit);
    evalSet = evalSet.slice(0, opts.limit);
  }
  return { train, eval: evalSet };
}
