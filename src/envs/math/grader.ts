// Math answer equivalence: would a mathematician accept `pred` for `gold`?
// Cheap checks run synchronously (normal forms, exact values of constants); what is left goes to the
// symbolic worker pool, under a time limit. Where the TypeScript checker is not certain (it found
// no equality and the answers are not plain constants), Math-Verify is consulted when its Python
// pool is available (see docs/MATH-JUDGE.md). The checker never throws and never hangs: a failure
// is `equal: false` with a reason.
import { compareValues, constantValue } from "./exact.ts";
import { type ExtractOptions, extractAnswer } from "./extract.ts";
import { type MathVerifyPool, type MathVerifyRequest, sharedMathVerifyPool } from "./math-verify-pool.ts";
import {
  type AnswerNode,
  MAX_SYMBOLIC_LENGTH,
  normalizeAnswer,
  parseAnswer,
  splitTopLevel,
} from "./normalize.ts";
import { latexToExpr } from "./latex-expr.ts";
import { readLists } from "./list-order.ts";
import { type SymbolicPair, type SymbolicPool, sharedSymbolicPool } from "./pool.ts";

export interface GradeOptions {
  /**
   * Time limit in ms of each slow check (default 2000): the symbolic check, then Math-Verify, each
   * counted from when a worker takes the job. Waiting for a free worker is bounded by the jobs ahead
   * (each under its own limit), and a worker that cannot start fails its jobs. The cheap synchronous
   * checks run on bounded input.
   */
  timeoutMs?: number;
  /** The pool to run symbolic checks in (default: the process-wide one). */
  pool?: SymbolicPool;
  /**
   * The Math-Verify pool to consult where the TypeScript checker is not certain (default: the
   * process-wide one, when $MARFT_MATH_VERIFY is not "0"), or false for the TypeScript checker alone.
   */
  mathVerify?: MathVerifyPool | false;
  /**
   * The problem the answer is for. A bare list ("1, -2") is then a set unless the question asks for
   * an order ("in increasing order"); without it, the written order decides (list-order.ts).
   */
  question?: string;
}

export interface GradeResult {
  equal: boolean;
  predNormalized: string;
  goldNormalized: string;
  /**
   * How the verdict was reached: "string", "number" (exact values), "symbolic", "math-verify",
   * "not equal", "structure", "too large", "timeout ...", ...
   */
  reason?: string;
}

/** Raw inputs longer than this are compared as trimmed strings only (normalizing them is not worth it). */
const MAX_RAW_LENGTH = 4000;
/** Longest answer Math-Verify is given (sympy on long input is slow; such answers are rare). */
const MAX_MATH_VERIFY_LENGTH = 600;
/** At most this many items in one list/tuple/set (n² pairs for unordered comparison). */
const MAX_ITEMS = 24;

function defaultMathVerify(): MathVerifyPool | false {
  return process.env.MARFT_MATH_VERIFY === "0" ? false : sharedMathVerifyPool();
}

export async function gradeAnswer(pred: string, gold: string, opts: GradeOptions = {}): Promise<GradeResult> {
  const own = await checkAnswer(pred, gold, opts);
  if (own.result.equal || own.certain) return own.result;
  return secondOpinion(own.result, { gold, pred }, opts);
}

export interface ResponseGradeResult extends GradeResult {
  /** The answer the response commits to (extractAnswer), or null when it has none. */
  predExtracted: string | null;
}

/**
 * A whole response against a gold answer: the TypeScript checker on the answer it commits to, and,
 * where that is not certain, Math-Verify on the whole response (its own extraction may find an
 * answer ours missed). This is the training reward's judge when Python is there.
 */
export async function gradeResponse(
  response: string,
  gold: string,
  opts: GradeOptions & ExtractOptions = {},
): Promise<ResponseGradeResult> {
  const predExtracted = extractAnswer(response, opts);
  const own = await checkAnswer(predExtracted ?? "", gold, opts);
  const base = {
    ...own.result,
    predExtracted,
    ...(predExtracted === null ? { reason: "no answer found" } : {}),
  };
  if (own.result.equal || (own.certain && predExtracted !== null)) return base;
  // No answer in the form asked for: not rewarded, whatever Math-Verify would dig out, unless the
  // caller accepts unmarked answers (lastNumber), as Math-Verify's own extraction does.
  if (predExtracted === null && !opts.lastNumber) return { ...base, reason: "no answer found" };
  const r = await secondOpinion(base, { gold, pred: response, pred_raw: true }, opts);
  return { ...r, predExtracted };
}

/** Math-Verify's verdict where ours is "not equal" but not certain; without it, ours stands. */
async function secondOpinion(
  own: GradeResult,
  req: MathVerifyRequest,
  opts: GradeOptions,
): Promise<GradeResult> {
  const mv = opts.mathVerify ?? defaultMathVerify();
  if (mv === false || req.pred.length > MAX_MATH_VERIFY_LENGTH * (req.pred_raw ? 20 : 1)) return own;
  if (req.gold.length > MAX_MATH_VERIFY_LENGTH) return own;
  const r = await mv.verify(req, opts.timeoutMs ?? 2000);
  if (!r.ok) return { ...own, reason: `${own.reason ?? "not equal"}; ${r.reason}` };
  return { ...own, equal: r.equal, reason: r.equal ? "math-verify" : own.reason };
}

/** The TypeScript checker alone; `certain` when its verdict needs no second opinion. */
export async function checkAnswer(
  pred: string,
  gold: string,
  opts: GradeOptions,
): Promise<{ result: GradeResult; certain: boolean }> {
  const timeoutMs = opts.timeoutMs ?? 2000;
  if (pred.length > MAX_RAW_LENGTH || gold.length > MAX_RAW_LENGTH) {
    const equal = pred.trim() === gold.trim();
    const result = {
      equal,
      predNormalized: pred.slice(0, 200),
      goldNormalized: gold.slice(0, 200),
      reason: equal ? "string" : "too long",
    };
    return { result, certain: true };
  }
  const p = normalizeAnswer(pred);
  const g = normalizeAnswer(gold);
  const base = { predNormalized: p, goldNormalized: g };
  if (p === g)
    return { result: { ...base, equal: p !== "", reason: p === "" ? "empty" : "string" }, certain: true };
  if (p === "" || g === "") return { result: { ...base, equal: false, reason: "empty" }, certain: true };
  if (p.length > MAX_SYMBOLIC_LENGTH || g.length > MAX_SYMBOLIC_LENGTH) {
    return { result: { ...base, equal: false, reason: "too long" }, certain: true };
  }

  // "25\%" for "0.25": a percentage may be written as a fraction of one (constants only)
  const hadPercent = (x: string) => /%|\\percent/.test(x);
  if (hadPercent(pred) !== hadPercent(gold)) {
    const [pct, other] = hadPercent(pred) ? [p, g] : [g, p];
    const a = constantValue(`(${pct})/100`);
    const b = constantValue(other);
    if (typeof a !== "string" && typeof b !== "string" && compareValues(a, b)) {
      return { result: { ...base, equal: true, reason: "percent" }, certain: true };
    }
  }

  const [pp, gg] = decimalCommas(p, g);
  const [tp, tg] = readLists(parseAnswer(pp), parseAnswer(gg), opts.question);
  // Phase 1: every scalar comparison the structures need, decided cheaply where possible.
  const table = new ScalarTable();
  if (!collect(tp, tg, table)) {
    // shapes that cannot match; certain when both are made of constants (nothing to reinterpret), or
    // an equation faces a value: "a+3z=0" is not the answer 0 (Math-Verify reads its right side)
    // ("y = 2x+3" is read as its value; against "2x - y + 3 = 0" Math-Verify is still asked)
    const oneEquation = pred.includes("=") !== gold.includes("=");
    const certain = (allConstant(tp) && allConstant(tg)) || (oneEquation && equationAgainstValue(tp, tg));
    return { result: { ...base, equal: false, reason: "structure" }, certain };
  }
  // Phase 2: the rest in one worker job.
  const pending = table.pending();
  let reason = table.usedNumbers ? "number" : "string";
  if (pending.length > 0) {
    const res = await (opts.pool ?? sharedSymbolicPool()).run(
      pending.map((x) => x.pair),
      timeoutMs,
    );
    if (!res.ok) return { result: { ...base, equal: false, reason: res.reason }, certain: false };
    pending.forEach((x, k) => {
      x.verdict = res.results[k] ?? false;
    });
    reason = "symbolic";
  }
  const equal = compare(tp, tg, table);
  // answers that differ only in letter case differ in their variables (3r^2 is not 3R^2), which
  // Math-Verify does not see; text answers were compared without case above
  const caseOnly = p.toLowerCase() === g.toLowerCase();
  return {
    result: { ...base, equal, reason: equal ? reason : table.huge ? "too large" : "not equal" },
    certain: table.certain || caseOnly,
  };
}

/**
 * A European decimal comma: "1000,99" or "0,111" against a single number is that number's decimal
 * reading (a list of two can never equal one number, so nothing is lost). "1,000" stays a thousand.
 */
function decimalCommas(p: string, g: string): [string, string] {
  const comma = /^([+-]?\d+),(\d+)$/;
  const single = (x: string) => !x.includes(",");
  const fix = (x: string, other: string) => {
    const m = comma.exec(x);
    if (!m || !single(other)) return x;
    if (m[2]!.length === 3 && m[1] !== "0" && !m[1]!.startsWith("-0")) return x; // thousands
    return `${m[1]}.${m[2]}`;
  };
  return [fix(p, g), fix(g, p)];
}

/**
 * An equation whose left side is a sum or a constant ("a+3z=0", "7=11a+c") against something that is
 * not an equation: never equal. (A left side that only names the value, "|AB|=1", "A:B=1", is left
 * to Math-Verify, which reads the value after "=".)
 */
function equationAgainstValue(x: AnswerNode, y: AnswerNode): boolean {
  const [eq, other] = x.t === "eq" ? [x, y] : [y, x];
  if (eq.t !== "eq" || other.t === "eq") return false;
  const lhs = eq.lhs;
  const sum = splitTopLevel(lhs, "+").length > 1 || splitTopLevel(lhs.replace(/^-/, ""), "-").length > 1;
  return sum || typeof constantValue(lhs) !== "string";
}

function allConstant(n: AnswerNode): boolean {
  if (n.t === "atom") return typeof constantValue(n.s) !== "string";
  if (n.t === "eq") return false;
  return n.items.every(allConstant);
}

// ---------------------------------------------------------------------------------------------

type Verdict = { verdict: boolean | null; pair: SymbolicPair; certain: boolean };

/** Scalar comparisons keyed by (kind, a, b); verdict null until the worker answers. */
class ScalarTable {
  private readonly map = new Map<string, Verdict>();
  usedNumbers = false;
  /** A side was a constant too large to evaluate (10^{10^{10}}, 100000000!). */
  huge = false;

  /** Every comparison was settled by exact values or equal strings: no second opinion can help. */
  get certain(): boolean {
    return [...this.map.values()].every((v) => v.certain);
  }

  key(a: string, b: string, eq: boolean): string {
    return `${eq ? "=" : "~"}\u0001${a}\u0001${b}`;
  }

  add(a: string, b: string, eq: boolean): void {
    const k = this.key(a, b, eq);
    if (this.map.has(k)) return;
    this.map.set(k, decide(a, b, eq, this));
  }

  get(a: string, b: string, eq: boolean): boolean {
    return this.map.get(this.key(a, b, eq))?.verdict ?? false;
  }

  pending(): Verdict[] {
    return [...this.map.values()].filter((v) => v.verdict === null);
  }
}

/** Decides a scalar pair without the worker when possible; null verdict means "ask the worker". */
function decide(a: string, b: string, eq: boolean, table: ScalarTable): Verdict {
  const none = { a: "", b: "", eq };
  if (!eq) {
    if (a === b) return { verdict: true, pair: none, certain: true };
    // text answers ("Evelyn", "even", "B"): case-insensitive, never algebra ("east" is not e·a·s·t)
    if (isText(a) || isText(b))
      return { verdict: a.toLowerCase() === b.toLowerCase(), pair: none, certain: false };
    const ca = constantValue(a);
    const cb = constantValue(b);
    if (typeof ca !== "string" && typeof cb !== "string") {
      table.usedNumbers = true;
      return { verdict: compareValues(ca, cb), pair: none, certain: true };
    }
    // a constant we cannot even hold: 10^{10^{10}} is only equal to itself, written the same way
    if (ca === "huge" || cb === "huge") {
      table.huge = true;
      return { verdict: false, pair: none, certain: true };
    }
  }
  const ea = eq ? equationExpr(a) : latexToExpr(a);
  const eb = eq ? equationExpr(b) : latexToExpr(b);
  if (ea === null || eb === null) return { verdict: false, pair: none, certain: false };
  if (ea === eb) return { verdict: true, pair: none, certain: true };
  return { verdict: null, pair: { a: ea, b: eb, eq }, certain: false };
}

/** Equations travel as "lhs = rhs" in the table; the worker gets lhs - rhs. */
function equationExpr(s: string): string | null {
  const [lhs, rhs] = s.split("\u0002") as [string, string];
  const l = latexToExpr(lhs);
  const r = latexToExpr(rhs);
  return l === null || r === null ? null : `(${l}) - (${r})`;
}

/** A word of three or more letters that is not LaTeX: text, not a product of variables. */
function isText(s: string): boolean {
  return /^[a-zA-Z][a-zA-Z' ]*$/.test(s) && /[a-zA-Z]{3}/.test(s);
}

function eqKey(n: { lhs: string; rhs: string }): string {
  return `${n.lhs}\u0002${n.rhs}`;
}

function unwrap(n: AnswerNode): AnswerNode {
  return n.t === "set" && n.items.length === 1 ? unwrap(n.items[0]!) : n;
}

/** Phase 1: registers every scalar pair compare() may look at; false when the shapes cannot match. */
function collect(x: AnswerNode, y: AnswerNode, table: ScalarTable): boolean {
  x = unwrap(x);
  y = unwrap(y);
  if (x.t === "atom" && y.t === "atom") {
    table.add(x.s, y.s, false);
    return true;
  }
  if (x.t === "eq" && y.t === "eq") {
    table.add(eqKey(x), eqKey(y), true);
    return true;
  }
  if (x.t === "seq" && y.t === "seq") {
    if (x.items.length !== y.items.length || x.items.length > MAX_ITEMS) return false;
    return x.items.every((xi, k) => collect(xi, y.items[k]!, table));
  }
  if (x.t === "set" && y.t === "set") {
    if (x.items.length !== y.items.length || x.items.length > MAX_ITEMS || x.union !== y.union) return false;
    // any item may match any item: register every pair (a pair whose shapes differ just cannot match)
    for (const xi of x.items) for (const yi of y.items) collect(xi, yi, table);
    return true;
  }
  return false;
}

/** Phase 2: the structural comparison, reading scalar verdicts from the table. */
function compare(x: AnswerNode, y: AnswerNode, table: ScalarTable): boolean {
  x = unwrap(x);
  y = unwrap(y);
  if (x.t === "atom" && y.t === "atom") return table.get(x.s, y.s, false);
  if (x.t === "eq" && y.t === "eq") return table.get(eqKey(x), eqKey(y), true);
  if (x.t === "seq" && y.t === "seq") {
    if (x.items.length !== y.items.length || !bracketsMatch(x, y)) return false;
    return x.items.every((xi, k) => compare(xi, y.items[k]!, table));
  }
  if (x.t === "set" && y.t === "set") {
    if (x.items.length !== y.items.length || x.union !== y.union) return false;
    // equality is an equivalence relation, so a greedy matching finds one if any exists
    const used = new Array<boolean>(y.items.length).fill(false);
    return x.items.every((xi) => {
      const k = y.items.findIndex((yi, j) => !used[j] && compare(xi, yi, table));
      if (k < 0) return false;
      used[k] = true;
      return true;
    });
  }
  return false;
}

/**
 * Intervals must agree on open/closed ends; a tuple "(a, b)" and an open interval are written alike,
 * so parentheses match parentheses. Square brackets on both sides of a vector are also accepted.
 */
function bracketsMatch(x: { open: string; close: string }, y: { open: string; close: string }): boolean {
  return x.open === y.open && x.close === y.close;
}
