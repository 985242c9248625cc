// Agreement of the math judges with public test suites' own verdicts.
//
//   .venv/bin/python bench/judge_pairs.py --math-verify DIR --hendrycks DIR > /tmp/judge-pairs.jsonl
//   npx tsx bench/math-judge-agreement.ts /tmp/judge-pairs.jsonl [--judge ts,hybrid,math-verify] [--misses]
//
// DIR: a checkout (or the git directory `fetch` brings) of huggingface/Math-Verify and hendrycks/math.
// The pairs are the suites' data and stay outside this repository.
//
// Judges, each fed a pair the way it is used:
//   ts           the TypeScript checker alone: extractAnswer on both sides in its most lenient mode
//                (box, "the answer is", last math span, last number unless the test extracts LaTeX
//                only; a side with none is taken whole), then checkAnswer
//   hybrid       the same, and where the TypeScript checker is not certain and the response commits
//                to an answer, Math-Verify on the raw pair (gradeResponse: the training reward's
//                judge when Python is there)
//   math-verify  Math-Verify alone, run on the raw texts exactly as its own tests run it (their
//                extraction targets, float rounding, strictness), through the worker pool
import { readFileSync } from "node:fs";
import { z } from "zod";
import { extractAnswer } from "../src/envs/math/extract.ts";
import { checkAnswer } from "../src/envs/math/grader.ts";
import { MathVerifyPool } from "../src/envs/math/math-verify-pool.ts";
import { closeSharedSymbolicPool } from "../src/envs/math/pool.ts";

const Pair = z.object({
  suite: z.string(),
  test: z.string(),
  where: z.string(),
  gold: z.string(),
  pred: z.string(),
  expected: z.boolean(),
  opts: z.object({
    match_types: z.array(z.enum(["latex", "expr"])).optional(),
    precision: z.number().optional(),
    strict: z.boolean().optional(),
    allow_set_relation_comp: z.boolean().optional(),
    bare: z.boolean().optional(),
  }),
});
type Pair = z.infer<typeof Pair>;

const JUDGES = ["ts", "hybrid", "math-verify"] as const;
type Judge = (typeof JUDGES)[number];

const USAGE =
  "usage: npx tsx bench/math-judge-agreement.ts PAIRS.jsonl [--judge ts,hybrid,math-verify] [--misses]";

function parseArgs(argv: string[]): { file: string; judges: Judge[]; misses: boolean } {
  let file: string | null = null;
  let judges: Judge[] = [...JUDGES];
  let misses = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--misses") misses = true;
    else if (a === "--judge") {
      const list = (argv[++i] ?? "").split(",");
      const bad = list.filter((j) => !(JUDGES as readonly string[]).includes(j));
      if (bad.length > 0)
        throw new Error(`unknown judge ${bad.join(", ")} (known: ${JUDGES.join(", ")})\n${USAGE}`);
      judges = list as Judge[];
    } else if (a.startsWith("-")) throw new Error(`unknown option ${a}\n${USAGE}`);
    else file = a;
  }
  if (file === null) throw new Error(USAGE);
  return { file, judges, misses };
}

/**
 * The free-form extraction the suites test: box, "the answer is", last math span, last number. A test
 * that has Math-Verify extract LaTeX only (match_types ["latex"]) gets no last-number fallback either.
 */
function lenient(p: Pair): { lastMath: boolean; lastNumber: boolean } {
  return { lastMath: true, lastNumber: p.opts.match_types?.includes("expr") ?? true };
}

/** A suite of bare answers (hendrycks) is graded as answers; the others' sides are responses. */
function answerOf(text: string, p: Pair): string {
  return p.opts.bare ? text : (extractAnswer(text, lenient(p)) ?? text);
}

async function verdict(
  judge: Judge,
  p: Pair,
  pool: MathVerifyPool,
): Promise<{ equal: boolean; note: string }> {
  const { bare, ...opts } = p.opts;
  const asItsTestsRunIt = { gold: p.gold, pred: p.pred, raw: !bare, ...opts };
  if (judge === "math-verify") {
    const r = await pool.verify(asItsTestsRunIt, 20_000);
    return r.ok ? { equal: r.equal, note: "" } : { equal: false, note: r.reason };
  }
  // gradeResponse, with the gold side given as the suite gives it (often a response itself)
  const pred = answerOf(p.pred, p);
  const gold = answerOf(p.gold, p);
  const own = await checkAnswer(pred, gold, { timeoutMs: 5000 });
  const note = `${JSON.stringify(pred.slice(0, 80))} vs ${JSON.stringify(gold.slice(0, 80))}`;
  // as gradeResponse with lastNumber: Math-Verify only for a response that has an answer to find
  const committed = bare || extractAnswer(p.pred, lenient(p)) !== null;
  if (judge === "ts" || own.result.equal || own.certain || !committed) {
    return {
      equal: own.result.equal,
      note: `${note} (${own.result.reason}${own.certain ? ", certain" : ""})`,
    };
  }
  const r = await pool.verify(asItsTestsRunIt, 20_000);
  return r.ok ? { equal: r.equal, note: `${note} (math-verify)` } : { equal: false, note: r.reason };
}

async function main(): Promise<void> {
  const { file, judges, misses } = parseArgs(process.argv.slice(2));
  const pairs = readFileSync(file, "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l, k) => {
      const r = Pair.safeParse(JSON.parse(l));
      if (!r.success) throw new Error(`${file}:${k + 1}: ${r.error.issues[0]?.message}`);
      return r.data;
    });
  const pool = new MathVerifyPool();
  const rows: string[] = [];
  const summary: Record<
    string,
    Record<string, { pairs: number; agree: number; fp: number; fn: number }>
  > = {};
  try {
    for (const judge of judges) {
      const t0 = performance.now();
      const got = await Promise.all(pairs.map((p) => verdict(judge, p, pool)));
      const ms = performance.now() - t0;
      for (const [k, p] of pairs.entries()) {
        const g = got[k]!;
        const bySuite = summary[judge] ?? {};
        summary[judge] = bySuite;
        const s = bySuite[p.suite] ?? { pairs: 0, agree: 0, fp: 0, fn: 0 };
        bySuite[p.suite] = s;
        s.pairs++;
        if (g.equal === p.expected) s.agree++;
        else if (g.equal) s.fp++;
        else s.fn++;
        if (misses && g.equal !== p.expected) {
          rows.push(`${judge} ${g.equal ? "FP" : "FN"} ${p.where} ${p.test}: ${g.note}`);
        }
      }
      process.stderr.write(`${judge}: ${pairs.length} pairs in ${(ms / 1000).toFixed(1)} s\n`);
    }
  } finally {
    await pool.close();
    await closeSharedSymbolicPool();
  }
  if (rows.length > 0) process.stdout.write(`${rows.join("\n")}\n\n`);
  process.stdout.write(
    "| judge | suite | pairs | agree | agreement | FP | FN |\n|---|---|---|---|---|---|---|\n",
  );
  for (const [judge, bySuite] of Object.entries(summary)) {
    for (const [suite, s] of Object.entries(bySuite)) {
      const pct = ((100 * s.agree) / s.pairs).toFixed(1);
      process.stdout.write(
        `| ${judge} | ${suite} | ${s.pairs} | ${s.agree} | ${pct}% | ${s.fp} | ${s.fn} |\n`,
      );
    }
  }
  if (pool.version) process.stdout.write(`\nMath-Verify ${pool.version}\n`);
}

main().catch((e: unknown) => {
  process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`);
  process.exitCode = 2;
});
