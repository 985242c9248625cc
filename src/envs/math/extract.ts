// Answer extraction from a model's response: the last \boxed{...} (or \fbox{...}), else the last
// "the answer is ...", else (optionally) the last number. Linear-time scans only: responses are untrusted.

const BOX = /\\(?:boxed|fbox)(?![a-zA-Z])/g;
/** Boxes looked at, from the end: a response with more than this is not answering in boxes. */
const MAX_BOXES = 50;
/**
 * What may stand between two boxes that together hold one answer: "\boxed{-2} and \boxed{1}",
 * "\boxed{2}, \boxed{3}", "$\boxed{1}$ or $\boxed{2}$". Anything longer ends the group.
 */
const BOX_JOINER =
  /^(?:[\s$,;.]|\\[()[\]]|\\q?quad(?![a-zA-Z])|\\[,;]|\\text\{\s*(?:and|or)\s*\}|\b(?:and|or)\b)*$/;

/** The content of one box starting at `at` (the backslash), and where it ends; null when unclosed. */
function boxAt(text: string, at: number, cmdLen: number): { content: string; end: number } | null {
  let j = at + cmdLen;
  while (text[j] === " ") j++;
  if (text[j] !== "{") {
    // \boxed 5: TeX takes the next token; in practice answers run to whitespace or a math delimiter
    const m = /^([^\s${}]+)/.exec(text.slice(j, j + 1000));
    return m ? { content: m[1]!.replace(/[.,;]$/, ""), end: j + m[1]!.length } : null;
  }
  const close = matchBrace(text, j);
  return close < 0 ? null : { content: text.slice(j + 1, close).trim(), end: close + 1 };
}

/**
 * The content of the last `\boxed{...}` / `\fbox{...}` (nested braces handled), or of `\boxed 5`
 * (the argument runs to the next space or `$`). An answer split over boxes that stand together
 * ("\boxed{-2} and \boxed{1}") is their contents joined by ", ". Null when there is no box or the
 * last one never closes.
 */
export function extractBoxed(text: string): string | null {
  const starts: Array<{ at: number; len: number }> = [];
  for (const m of text.matchAll(BOX)) {
    starts.push({ at: m.index, len: m[0].length });
    if (starts.length > MAX_BOXES) starts.shift();
  }
  const last = starts.pop();
  if (last === undefined) return null;
  const lastBox = boxAt(text, last.at, last.len);
  if (lastBox === null) return null;
  const parts = [lastBox.content];
  let from = last.at;
  for (let k = starts.length - 1; k >= 0; k--) {
    const box = boxAt(text, starts[k]!.at, starts[k]!.len);
    if (box === null || box.end > from || !BOX_JOINER.test(text.slice(box.end, from))) break;
    parts.unshift(box.content);
    from = starts[k]!.at;
  }
  return parts.join(", ");
}

/** Index of the `}` closing the `{` at `open`, or -1. Escaped braces `\{` `\}` do not count. */
export function matchBrace(text: string, open: number): number {
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    const c = text[i];
    if (c === "\\") {
      i++;
      continue;
    }
    if (c === "{") depth++;
    else if (c === "}") {
      depth--;
      if (depth === 0) return i;
    }
  }
  return -1;
}

const ANSWER_IS = /(?:final answer|the answer)\s*(?:is|:)\s*:?\s*/gi;
/** Words that end the answer in "the answer is 5 because ...": the reason is not the answer. */
const ANSWER_ENDS =
  /\s(?:because|since|as|which|so|but|where|when|for|if|given|hence|therefore|thus|and\s+(?:the|this|that|it|we|I)|I\s+hope)\b|,\s+(?:which|so|since|because|as|and\s+(?:the|this|that|it|we)|but)\b/i;

/** The text after the last "the answer is" / "final answer:", up to the end of its clause. */
export function extractAnswerIs(text: string): string | null {
  let last: RegExpExecArray | null = null;
  for (const m of text.matchAll(ANSWER_IS)) last = m as RegExpExecArray;
  if (!last) return null;
  let rest = text.slice(last.index + last[0].length, last.index + last[0].length + 500);
  // The answer may be wrapped in $...$ or \( \); take the math if it comes first, else the line.
  const math = /^\$+([^$]+)\$+|^\\\((.+?)\\\)|^\\\[(.+?)\\\]/s.exec(rest);
  if (math) return (math[1] ?? math[2] ?? math[3] ?? "").trim();
  rest = rest.split("\n")[0]!;
  // end of sentence: a period followed by space/end, but not a decimal point
  const end = /\.(?=\s|$)/.exec(rest);
  if (end) rest = rest.slice(0, end.index);
  const clause = ANSWER_ENDS.exec(rest);
  if (clause) rest = rest.slice(0, clause.index);
  const out = rest
    .trim()
    .replace(/[,;:!]+$/, "")
    .replace(/^\*\*(.*)\*\*$/, "$1")
    .trim();
  return out === "" ? null : out;
}

/** Where the last "final answer is" / "final answer:" starts, or -1. */
function lastIndexOfFinal(text: string): number {
  let at = -1;
  for (const m of text.matchAll(/final answer\s*(?:is|:)/gi)) at = m.index;
  return at;
}

/**
 * The content of the last math span: $$...$$, $...$ (on one line), \[...\] or \(...\).
 * A prose response without a box usually ends on its result in math.
 */
export function extractLastMath(text: string): string | null {
  const SPAN =
    /\$\$([^$]{1,2000}?)\$\$|\$([^$\n]{1,1000}?)\$|\\\[([\s\S]{1,2000}?)\\\]|\\\(([\s\S]{1,1000}?)\\\)/g;
  // spans that stand together as one answer ("$1$ and $2$", "$21,16$ or $11$") are joined
  let group: string[] = [];
  let end = -1;
  for (const m of withoutCode(text).matchAll(SPAN)) {
    const body = (m[1] ?? m[2] ?? m[3] ?? m[4] ?? "").trim();
    if (body === "") continue;
    const between = end < 0 ? "" : text.slice(end, m.index);
    group = end >= 0 && SPAN_JOINER.test(between) ? [...group, body] : [body];
    end = m.index + m[0].length;
  }
  return group.length > 0 ? group.join(", ") : null;
}

const SPAN_JOINER = /^\s*(?:,|and|or|,\s*and|,\s*or)\s*$/;

/** Fenced and inline code removed: a number in a program is not the answer. */
function withoutCode(text: string): string {
  return text.replace(/```[\s\S]*?(?:```|$)/g, " ").replace(/`[^`\n]*`/g, " ");
}

// A number, with thousands groups ("7,425,000", "1 000"), a decimal point or comma ("1000,99"), or a
// fraction ("2/3"); not one that is an exponent or subscript, or glued to a variable (x^2, a_1, 2x).
const NUMBER =
  /(?<![\w^_.,/{])-?(?:\d{1,3}(?:(?:,| )\d{3})+(?![\d,])(?:\.\d+)?|\d+(?:[.,]\d+)?(?:\/\d+)?|\.\d+)(?![\d^_]|[a-z](?![a-z²³]))/g;

/**
 * The last number in the text outside code, e.g. GSM8K-style answers. Thousands separators are
 * removed ("1,234,567" is "1234567"); a decimal comma stays for the grader to read ("2,74").
 */
export function extractLastNumber(text: string): string | null {
  let last: string | null = null;
  for (const m of withoutCode(text).matchAll(NUMBER)) last = m[0];
  if (last === null) return null;
  last = last.replace(/ /g, "");
  return /^-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$/.test(last) ? last.replace(/,/g, "") : last;
}

export interface ExtractOptions {
  /** Fall back to the last number in the text (default false: MATH answers are not always numbers). */
  lastNumber?: boolean;
  /** Fall back to the last math span ($...$, \(...\), \[...\]) before the last number (default false). */
  lastMath?: boolean;
}

/**
 * The answer a response commits to, or null: boxed, else "the answer is", else maybe the last
 * math span, else maybe the last number.
 */
export function extractAnswer(text: string, opts: ExtractOptions = {}): string | null {
  const boxed = extractBoxed(text);
  if (boxed !== null) {
    // "... \boxed{255} ... The final answer is $10,455$": a final statement after the box revises it
    const finalAt = lastIndexOfFinal(text);
    const boxAt = Math.max(text.lastIndexOf("\\boxed"), text.lastIndexOf("\\fbox"));
    if (finalAt > boxAt) return extractAnswerIs(text.slice(finalAt)) ?? boxed;
    return boxed;
  }
  const is = extractAnswerIs(text);
  if (is !== null) return is;
  const math = opts.lastMath ? extractLastMath(text) : null;
  if (math !== null) return math;
  return opts.lastNumber ? extractLastNumber(text) : null;
}
