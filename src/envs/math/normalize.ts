// Turning a LaTeX answer into comparable pieces, all synchronous and linear-time on bounded input:
//   normalizeAnswer: string clean-up (units, \text, \left/\right, \dfrac, degrees, $, %, thousands, "x =")
//   parseAnswer:     structure (tuples, intervals, sets, unions, \pm, equations, matrices)
//   latexToExpr:     a LaTeX expression in mathjs syntax, for the symbolic check (latex-expr.ts)

/** Longest answer (after normalization) that gets more than an exact string comparison. */
export const MAX_SYMBOLIC_LENGTH = 1000;
/** Deepest brace/bracket nesting that latexToExpr follows. */
export const MAX_DEPTH = 40;

const UNIT_WORDS = [
  "square",
  "sq",
  "cubic",
  "units?",
  "cm",
  "mm",
  "km",
  "m",
  "meters?",
  "metres?",
  "centimeters?",
  "kilometers?",
  "inch(?:es)?",
  "in",
  "feet",
  "foot",
  "ft",
  "yards?",
  "miles?",
  "mph",
  "degrees?",
  "radians?",
  "cents?",
  "dollars?",
  "hours?",
  "hrs?",
  "minutes?",
  "mins?",
  "seconds?",
  "secs?",
  "days?",
  "weeks?",
  "months?",
  "years?",
  "kg",
  "g",
  "grams?",
  "pounds?",
  "lbs?",
  "ounces?",
  "oz",
  "liters?",
  "litres?",
  "ml",
  "gallons?",
  "people",
  "students?",
  "ways",
  "points?",
  "percent",
];
// at most two unit words ("square feet"), each after a space: no nested repetition, so no backtracking blow-up
const UNIT = `(?:${UNIT_WORDS.join("|")})(?:\\s*\\^\\s*\\{?[23]\\}?)?`;
const UNIT_TAIL = new RegExp(`^(.*[\\d}])\\s+${UNIT}(?:\\s+${UNIT})?$`, "i");
// \text{...}/\mbox{...} after something that ends in a digit, brace or \pi is a unit: "15\mbox{ cm}^2"
const TEXT_UNIT_TAIL =
  /^(.*(?:\d|\}|\\pi))\s*\\(?:text|mbox|mathrm|textrm|textbf|textnormal|textit|mathbf)\{[^{}]*\}(?:\s*\^\s*\{?[23]\}?)?$/;
const TEXT_COMMANDS =
  /\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname|textnormal|mathit)\{([^{}]*)\}/g;

/** String-level clean-up; two answers with equal normal forms are equal. */
export function normalizeAnswer(raw: string): string {
  let s = raw.trim();
  s = s
    .replace(/\u2212/g, "-")
    .replace(/\u00d7/g, "\\times ")
    .replace(/\u00b7/g, "\\cdot ")
    .replace(/\u03c0/g, "\\pi ")
    .replace(/\u221e/g, "\\infty ")
    .replace(/\u221a/g, "\\sqrt")
    .replace(/\u00b0/g, "");
  // markdown around an answer ("**42**", "`x+1`")
  s = s.replace(/^(\*\*|__|`)(.*)\1$/s, "$2").trim();
  // math delimiters and spacing commands
  s = s.replace(/^\\\[|\\\]$/g, "").replace(/^\\\(|\\\)$/g, "");
  s = s.replace(/\\\$/g, "").replace(/\$/g, "");
  // a thousands separator written with a thin space: "10,\\!080", "11,\\! 111"
  s = s.replace(/(\d),\\!\s*(?=\d{3})/g, "$1,");
  // spacing commands, but not the row break "\\" (matrices)
  s = s.replace(/\\\\|\\[,;:! ]|\\q?quad(?![a-zA-Z])/g, (m) => (m === "\\\\" ? m : " ")).replace(/~/g, " ");
  s = s.replace(/\\[lr]?vert(?![a-zA-Z])|\\[lr]Vert(?![a-zA-Z])/g, "|");
  s = s.replace(/\\[dt]binom(?![a-zA-Z])/g, "\\binom");
  // "x = \\frac13 \\approx 0.33": the exact value is the answer; "\\sqrt{30} \\approx 10.9": the value is
  const approx = splitTopLevel(s, "\\approx");
  if (approx.length > 1)
    s = splitTopLevel(approx[0]!, "=").length > 1 ? approx[0]! : approx[approx.length - 1]!;
  s = s.replace(/\\(?:displaystyle|textstyle)\b/g, "");
  s = s.replace(/(\\[a-zA-Z]+)\s+(?=[{[])/g, "$1"); // "\text {x}" is "\text{x}"
  s = s.replace(/\\[dtc]frac(?![a-zA-Z])/g, "\\frac");
  s = s.replace(/\\(?:left|right)(?![a-zA-Z])\.?/g, "");
  s = s.replace(/\\[bB]igg?[lr]?(?![a-zA-Z])/g, "");
  // degrees and percent: the number is the answer
  s = s.replace(/\^\s*\{?\s*\\circ\s*\}?/g, "").replace(/\\circ(?![a-zA-Z])/g, "");
  s = s.replace(/\\degree(?![a-zA-Z])/g, "");
  s = s.replace(/\\%|%/g, "");
  s = s.replace(/\{,\}/g, ",");
  s = s.replace(/\\(?:le|leq)(?![a-zA-Z])|<=/g, "\\le ").replace(/\\(?:ge|geq)(?![a-zA-Z])|>=/g, "\\ge ");
  s = s.replace(/\\(?:ne|neq)(?![a-zA-Z])|!=/g, "\\ne ");
  s = s.replace(/\\(?:infty|infinity)(?![a-zA-Z])/g, "\\infty ").replace(/\+\s*\\infty/g, "\\infty");
  s = s.trim().replace(/[.\s]+$/, "");
  // "x = 2 \text{ or } x = 3", "2 and 3": a list of answers
  s = s.replace(/\s*\\(?:text|mbox)\{\s*(?:or|and)\s*\}\s*/g, ",").replace(/\s+(?:or|and)\s+/g, ",");
  // units: "15 cm^2", "5.4 \text{ cents}", "\frac{270}7\text{ degrees}"
  for (let k = 0; k < 2; k++) {
    const t = TEXT_UNIT_TAIL.exec(s) ?? UNIT_TAIL.exec(s);
    if (t?.[1] && /\d|\\pi/.test(t[1])) s = t[1].trim();
  }
  // any words after a plain number are a unit too: "18 apples", "42 red marbles"
  const words = /^([+-]?\d[\d,]*(?:\.\d+)?)\s+[a-zA-Z]{3,}(?:\s+[a-zA-Z]+){0,3}$/.exec(s);
  if (words) s = words[1]!;
  s = s.replace(TEXT_COMMANDS, "$1").replace(TEXT_COMMANDS, "$1");
  // "x = 5", "k=2", "x \in [-2, 7]": the value is the answer (only when the left side is one symbol)
  const lhs = /^(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?\s*(?:=|\\in(?![a-zA-Z]))\s*(.+)$/.exec(s);
  if (lhs && !lhs[1]!.includes("=")) s = lhs[1]!;
  const spacedComma = /\d,\s+\d/.test(s);
  // semicolons separate items as commas do: "-12;-11;-10", "(0;-2;6)"
  s = s.replace(/;/g, ",");
  // whitespace: gone, except where it ends a command name ("\cot x")
  s = s
    .replace(/(\\[a-zA-Z]+)\s+(?=[a-zA-Z0-9])/g, "$1\uE000")
    .replace(/\s+/g, "")
    .replace(/\uE000/g, " ");
  // thousands separators, only when the whole answer is one such number: "58,500", "11,111,111,100";
  // not "32, 349" (a comma then a space separates a list) and not "0,111" (a decimal comma)
  if (/^[+-]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$/.test(s) && !spacedComma) s = s.replace(/,/g, "");
  // multiple choice: "(B)" and "B" are the same choice
  const choice = /^\(([A-Ea-e])\)$/.exec(s);
  if (choice) s = choice[1]!.toUpperCase();
  // a number written in a base: 2516_8 -> 2516 (the question fixes the base)
  const base = /^(\d+)_\{?\d+\}?$/.exec(s);
  if (base) s = base[1]!;
  // leading zeros and trailing decimal zeros of plain numbers
  if (/^[+-]?\d*\.\d+$|^[+-]?\d+$/.test(s)) s = canonicalDecimal(s);
  return s;
}

function canonicalDecimal(s: string): string {
  let sign = "";
  let body = s;
  if (body[0] === "+" || body[0] === "-") {
    sign = body[0] === "-" ? "-" : "";
    body = body.slice(1);
  }
  let [int = "", frac = ""] = body.split(".");
  int = int.replace(/^0+(?=\d)/, "");
  if (int === "") int = "0";
  frac = frac.replace(/0+$/, "");
  const out = frac ? `${int}.${frac}` : int;
  return out === "0" ? "0" : sign + out;
}

// ---------------------------------------------------------------------------------------------
// Structure

export type AnswerNode =
  | { t: "atom"; s: string }
  /** lhs = rhs, with both sides kept (compared up to a constant factor) */
  | { t: "eq"; lhs: string; rhs: string }
  /** ordered: a tuple, an interval, a vector or a matrix row; open/close are the brackets */
  | { t: "seq"; open: string; close: string; items: AnswerNode[] }
  /**
   * unordered: a bare list "1, -2" (bare: true; see list-order.ts for when one is read in order), a
   * set \{...\}, the two values of \pm, the pieces of a union
   */
  | { t: "set"; union: boolean; bare?: boolean; items: AnswerNode[] };

const SYMBOL = "(?:[a-zA-Z]|\\\\[a-zA-Z]+)(?:_\\{?\\w+\\}?)?";
const SINGLE_SYMBOL = new RegExp(`^${SYMBOL}$`);
/** What names an answer on the left of "=": a symbol, f(x), a tuple of symbols, a segment AB. */
const LABEL = new RegExp(`^(?:${SYMBOL}(?:\\([^()]*\\))?|\\(${SYMBOL}(?:,${SYMBOL})+\\)|[A-Z]{2,3})$`);

/**
 * An inequality in one variable as the interval it describes: "1<x<2" is (1,2), "x \\le 5" and
 * "5 \\ge x" are (-\\infty,5]. Null for anything else.
 */
function inequality(s: string): AnswerNode | null {
  const OP = /<|>|\\(?:le|ge|lt|gt)(?![a-zA-Z])/g;
  const ops = [...s.matchAll(OP)];
  if (ops.length === 0 || ops.length > 2) return null;
  const parts: string[] = [];
  let from = 0;
  for (const m of ops) {
    parts.push(s.slice(from, m.index).trim());
    from = m.index + m[0].length;
  }
  parts.push(s.slice(from).trim());
  const kinds = ops.map((m) => m[0].trim());
  const less = (k: string) => k === "<" || k === "\\le" || k === "\\lt";
  const strict = (k: string) => k === "<" || k === ">" || k === "\\lt" || k === "\\gt";
  const v = parts.findIndex((p) => SINGLE_SYMBOL.test(p));
  if (v < 0 || parts.some((p) => p === "")) return null;
  let lo = "-\\infty";
  let hi = "\\infty";
  let open = "(";
  let close = ")";
  const bound = (side: "lo" | "hi", value: string, k: string) => {
    if (side === "lo") [lo, open] = [value, strict(k) ? "(" : "["];
    else [hi, close] = [value, strict(k) ? ")" : "]"];
  };
  if (parts.length === 2) {
    const k = kinds[0]!;
    // x < 5 or 5 > x: an upper bound; x > 5 or 5 < x: a lower bound
    const upper = v === 0 ? less(k) : !less(k);
    bound(upper ? "hi" : "lo", parts[1 - v]!, k);
  } else {
    if (v !== 1 || less(kinds[0]!) !== less(kinds[1]!)) return null;
    const [a, b] = less(kinds[0]!) ? [0, 2] : [2, 0];
    bound("lo", parts[a]!, kinds[less(kinds[0]!) ? 0 : 1]!);
    bound("hi", parts[b]!, kinds[less(kinds[0]!) ? 1 : 0]!);
  }
  return { t: "seq", open, close, items: [parseAnswer(lo, 9), parseAnswer(hi, 9)] };
}
export const OPEN = "([{";
export const CLOSE = ")]}";

/** Splits at a separator found at bracket depth 0 (a literal string, e.g. "," or "\\cup"). */
export function splitTopLevel(s: string, sep: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (c === "\\" && (s[i + 1] === "{" || s[i + 1] === "}")) {
      depth += s[i + 1] === "{" ? 1 : -1;
      i++;
      continue;
    }
    if (OPEN.includes(c)) depth++;
    else if (CLOSE.includes(c)) depth--;
    else if (depth === 0 && s.startsWith(sep, i)) {
      // "\cup" must not match the start of a longer command
      if (sep[0] === "\\" && /[a-zA-Z]/.test(s[i + sep.length] ?? "")) continue;
      parts.push(s.slice(start, i));
      start = i + sep.length;
      i += sep.length - 1;
    }
  }
  parts.push(s.slice(start));
  return parts;
}

/** True when s[0] opens a bracket that closes exactly at the last character. */
function wrapsWhole(s: string): boolean {
  if (!OPEN.includes(s[0] ?? "") || !CLOSE.includes(s[s.length - 1] ?? "")) return false;
  let depth = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (OPEN.includes(c)) depth++;
    else if (CLOSE.includes(c)) {
      depth--;
      if (depth === 0 && i < s.length - 1) return false;
    }
  }
  return depth === 0;
}

/** Parses a normalized answer into its structure (depth-limited; deeper input stays an atom). */
export function parseAnswer(s: string, depth = 0): AnswerNode {
  if (depth > 8 || s.length > MAX_SYMBOLIC_LENGTH) return { t: "atom", s };
  const union = splitTopLevel(s, "\\cup");
  if (union.length > 1) return { t: "set", union: true, items: union.map((p) => parseAnswer(p, depth + 1)) };
  const matrix = /^\\begin\{([pbvB]?matrix|array)\}(?:\{[^}]*\})?(.*)\\end\{\1\}$/s.exec(s);
  if (matrix) {
    const rows = matrix[2]!.split("\\\\").filter((r) => r.trim() !== "");
    const cells = rows.map((r) => r.split("&"));
    const items = cells.every((c) => c.length === 1)
      ? cells.map((c) => parseAnswer(c[0]!, depth + 1)) // a column vector reads as a tuple
      : cells.map(
          (c) =>
            ({
              t: "seq",
              open: "[",
              close: "]",
              items: c.map((x) => parseAnswer(x, depth + 1)),
            }) as AnswerNode,
        );
    return { t: "seq", open: "(", close: ")", items };
  }
  if (s.startsWith("\\{") && s.endsWith("\\}")) {
    const inner = s.slice(2, -2);
    return { t: "set", union: false, items: splitTopLevel(inner, ",").map((p) => parseAnswer(p, depth + 1)) };
  }
  if (wrapsWhole(s) && s[0] !== "{") {
    const items = splitTopLevel(s.slice(1, -1), ",");
    if (items.length > 1) {
      return {
        t: "seq",
        open: s[0]!,
        close: s[s.length - 1]!,
        items: items.map((p) => parseAnswer(p, depth + 1)),
      };
    }
  }
  const list = splitTopLevel(s, ",");
  if (list.length > 1)
    return { t: "set", union: false, bare: true, items: list.map((p) => parseAnswer(p, depth + 1)) };
  const pm = /\\(?:pm|mp)(?![a-zA-Z])/.exec(s);
  if (pm && splitTopLevel(s, pm[0]).length === 2) {
    const [a, b] = splitTopLevel(s, pm[0]) as [string, string];
    const items = [`${a}+${b}`, `${a}-${b}`].map((p) => parseAnswer(p, depth + 1));
    return { t: "set", union: false, items };
  }
  const eq = splitTopLevel(s, "=");
  // a chain "x = 2 + 3 = 5": the value after the last "=" is the answer
  if (eq.length > 2) return parseAnswer(eq[eq.length - 1]!, depth + 1);
  if (eq.length === 2) {
    // a labelled answer: "x=2" (an item of "x=2,x=3" too), "f(x)=1", "(p,q)=(3,2)", "AB=4"
    if (LABEL.test(eq[0]!)) return parseAnswer(eq[1]!, depth + 1);
    // an equation: "a + 3z = 0" is not the value 0
    return { t: "eq", lhs: eq[0]!, rhs: eq[1]! };
  }
  return inequality(s) ?? { t: "atom", s };
}
