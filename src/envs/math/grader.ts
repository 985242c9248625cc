// Math answer equivalence: would a mathematician accept `pred` for `gold`?
// Cheap checks run synchronously (normal forms, plain numbers); only what is left goes to the symbolic
// worker pool, under a time limit. The checker never throws and never hangs: a failure is `equal: false`.
import {
  type AnswerNode,
  fastEqual,
  fastNumber,
  latexToExpr,
  MAX_SYMBOLIC_LENGTH,
  normalizeAnswer,
  parseAnswer,
} from "./normalize.ts";
import { type SymbolicPair, type SymbolicPool, sharedSymbolicPool } from "./pool.ts";

export interface GradeOptions {
  /**
   * Time limit of the symbolic check in ms (default 2000), counted from when a worker takes the job:
   * waiting for a free worker is bounded by the jobs ahead (each under its own limit), and a worker
   * that cannot start fails its jobs after 30 s. The cheap synchronous checks run on bounded input.
   */
  timeoutMs?: number;
  /** The pool to run symbolic checks in (default: the process-wide one). */
  pool?: SymbolicPool;
}

export interface GradeResult {
  equal: boolean;
  predNormalized: string;
  goldNormalized: string;
  /** How the verdict was reached: "string", "number", "symbolic", "structure", "timeout ...", ... */
  reason?: string;
}

/** Raw inputs longer than this are compared as trimmed strings only (normalizing them is not worth it). */
const MAX_RAW_LENGTH = 4000;
/** At most this many items in one list/tuple/set (n² pairs for unordered comparison). */
const MAX_ITEMS = 24;

export async function gradeAnswer(pred: string, gold: string, opts: GradeOptions = {}): Promise<GradeResult> {
  const timeoutMs = opts.timeoutMs ?? 2000;
  if (pred.length > MAX_RAW_LENGTH || gold.length > MAX_RAW_LENGTH) {
    const equal = pred.trim() === gold.trim();
    return {
      equal,
      predNormalized: pred.slice(0, 200),
      goldNormalized: gold.slice(0, 200),
      reason: equal ? "string" : "too long",
    };
  }
  const p = normalizeAnswer(pred);
  const g = normalizeAnswer(gold);
  const base = { predNormalized: p, goldNormalized: g };
  if (p === g) return { ...base, equal: p !== "", reason: p === "" ? "empty" : "string" };
  if (p === "" || g === "") return { ...base, equal: false, reason: "empty" };
  if (p.length > MAX_SYMBOLIC_LENGTH || g.length > MAX_SYMBOLIC_LENGTH) {
    return { ...base, equal: false, reason: "too long" };
  }

  // "25\%" for "0.25": a percentage may be written as a fraction of one (only plain numbers)
  const hadPercent = (x: string) => /%/.test(x);
  if (hadPercent(pred) !== hadPercent(gold)) {
    const [pct, other] = hadPercent(pred) ? [p, g] : [g, p];
    const a = fastNumber(pct);
    const b = fastNumber(other);
    if (a && b && fastEqual({ kind: "real", v: Number(a.v) / 100 }, b)) {
      return { ...base, equal: true, reason: "percent" };
    }
  }

  const tp = parseAnswer(p);
  const tg = parseAnswer(g);
  // Phase 1: every scalar comparison the structures need, decided cheaply where possible.
  const table = new ScalarTable();
  if (!collect(tp, tg, table)) return { ...base, equal: false, reason: "structure" };
  // Phase 2: the rest in one worker job.
  const pending = table.pending();
  let reason = table.usedNumbers ? "number" : "string";
  if (pending.length > 0) {
    const res = await (opts.pool ?? sharedSymbolicPool()).run(
      pending.map((x) => x.pair),
      timeoutMs,
    );
    if (!res.ok) return { ...base, equal: false, reason: res.reason };
    pending.forEach((x, k) => {
      x.verdict = res.results[k] ?? false;
    });
    reason = "symbolic";
  }
  const equal = compare(tp, tg, table);
  return { ...base, equal, reason: equal ? reason : "not equal" };
}

// ---------------------------------------------------------------------------------------------

type Verdict = { verdict: boolean | null; pair: SymbolicPair };

/** Scalar comparisons keyed by (kind, a, b); verdict null until the worker answers. */
class ScalarTable {
  private readonly map = new Map<string, Verdict>();
  usedNumbers = false;

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
    if (a === b) return { verdict: true, pair: none };
    // text answers ("Evelyn", "even", "B"): case-insensitive, never algebra ("east" is not e·a·s·t)
    if (isText(a) || isText(b)) return { verdict: a.toLowerCase() === b.toLowerCase(), pair: none };
    const fa = fastNumber(a);
    const fb = fastNumber(b);
    if (fa && fb) {
      table.usedNumbers = true;
      return { verdict: fastEqual(fa, fb), pair: none };
    }
  }
  const ea = eq ? equationExpr(a) : latexToExpr(a);
  const eb = eq ? equationExpr(b) : latexToExpr(b);
  if (ea === null || eb === null) return { verdict: false, pair: none };
  if (ea === eb) return { verdict: true, pair: none };
  return { verdict: null, pair: { a: ea, b: eb, eq } };
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
