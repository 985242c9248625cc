// Whether two bare comma lists ("1, -2") are compared in order or as multisets.
//
// A bare list is either a set of answers ("Enter all the solutions, separated by commas": MATH's
// convention, Math-Verify's reading) or a sequence (the values of a, b, c in turn: hendrycks'
// math_equivalence_test reads "10, 4, -2" against "4, 10, -2" as different). The question says
// which; without it, the written order decides: a set of values is conventionally listed in sorted
// order, so two lists that are each sorted (either way) are sets, and a list written in no sorted
// order is read as meaningful. Policy table: docs/MATH-JUDGE.md.
import { constantValue, type Value } from "./exact.ts";
import type { AnswerNode } from "./normalize.ts";

/**
 * An order the question asks the answer to be given in: "in increasing order", "from the greatest to
 * the least", "first ..., then ...", "respectively". Only sentences about the answer count ("form an
 * arithmetic sequence, in that order" describes the problem); "in any order" asks for none.
 */
export function orderPrescribed(question: string): boolean {
  const sentences = question.split(/(?<=[.?!])\s+|\n+/);
  return sentences.some(
    (s) =>
      /\b(?:enter|list|listing|write|writing|express|answer|separat\w*)\b/i.test(s) &&
      !/\bin any order\b/i.test(s) &&
      /\bin (?:\w+ ){0,3}order\b|\bfrom (?:the )?\w+ (?:\w+ )?to (?:the )?\w+|\bfirst\b.*\bthen\b|\brespectively\b/i.test(
        s,
      ),
  );
}

function toNumber(v: Value): number {
  return v.t === "f" ? v.v : Number(v.n) / Number(v.d);
}

/** The real values of a bare list of constants, or null when an item is anything else. */
function realValues(n: AnswerNode): number[] | null {
  if (n.t !== "set" || !n.bare) return null;
  const out: number[] = [];
  for (const item of n.items) {
    if (item.t !== "atom") return null;
    const c = constantValue(item.s);
    if (typeof c === "string") return null;
    out.push(toNumber(c.value));
  }
  return out;
}

function sorted(xs: number[]): boolean {
  const up = xs.every((x, k) => k === 0 || xs[k - 1]! <= x);
  const down = xs.every((x, k) => k === 0 || xs[k - 1]! >= x);
  return up || down;
}

/**
 * True when two bare lists are to be compared in order: the question prescribes an order, or
 * (without a question) both are lists of real constants and one is written in no sorted order.
 * Lists of tuples or expressions stay sets (solutions of a system, roots in closed form).
 */
export function listsInOrder(pred: AnswerNode, gold: AnswerNode, question?: string): boolean {
  if (pred.t !== "set" || !pred.bare || gold.t !== "set" || !gold.bare) return false;
  if (question !== undefined) return orderPrescribed(question);
  const p = realValues(pred);
  const g = realValues(gold);
  return p !== null && g !== null && !(sorted(p) && sorted(g));
}

/** A bare list read as a sequence (no brackets: it only matches another bare list). */
export function asSequence(n: AnswerNode): AnswerNode {
  return n.t === "set" ? { t: "seq", open: "", close: "", items: n.items } : n;
}

/**
 * A list of tuples is a set of solutions: a tuple listed twice is one solution (Math-Verify reads
 * it so). Lists of numbers keep their multiplicity: "1, 1, 2" may be roots counted with it.
 */
export function distinctTuples(n: AnswerNode): AnswerNode {
  if (n.t !== "set" || n.items.length < 2 || !n.items.every((x) => x.t === "seq")) return n;
  const seen = new Set<string>();
  const items = n.items.filter((x) => {
    const k = JSON.stringify(x);
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
  return { ...n, items };
}

/** The two answers' structures as compared: bare lists in order where listsInOrder says so. */
export function readLists(pred: AnswerNode, gold: AnswerNode, question?: string): [AnswerNode, AnswerNode] {
  if (listsInOrder(pred, gold, question)) return [asSequence(pred), asSequence(gold)];
  return [distinctTuples(pred), distinctTuples(gold)];
}
