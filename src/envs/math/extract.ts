// Answer extraction from a model's response: the last \boxed{...} (or \fbox{...}), else the last
// "the answer is ...", else (optionally) the last number. Linear-time scans only: responses are untrusted.

const BOX_COMMANDS = ["\\boxed", "\\fbox"];

/**
 * The content of the last `\boxed{...}` / `\fbox{...}` (nested braces handled), or of `\boxed 5`
 * (the argument runs to the next space or `$`). Null when there is none or its braces never close.
 */
export function extractBoxed(text: string): string | null {
  let best = -1;
  let cmdLen = 0;
  for (const cmd of BOX_COMMANDS) {
    let i = text.lastIndexOf(cmd);
    // skip e.g. "\boxedx": the command must end at a non-letter
    while (i >= 0 && /[a-zA-Z]/.test(text[i + cmd.length] ?? ""))
      i = i === 0 ? -1 : text.lastIndexOf(cmd, i - 1);
    if (i > best) {
      best = i;
      cmdLen = cmd.length;
    }
  }
  if (best < 0) return null;
  let j = best + cmdLen;
  while (text[j] === " ") j++;
  if (text[j] !== "{") {
    // \boxed 5: TeX takes the next token; in practice answers run to whitespace or a math delimiter
    const m = /^([^\s${}]+)/.exec(text.slice(j, j + 1000));
    return m ? m[1]!.replace(/[.,;]$/, "") : null;
  }
  const close = matchBrace(text, j);
  return close < 0 ? null : text.slice(j + 1, close).trim();
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

/** The text after the last "the answer is" / "final answer:", up to the end of its sentence. */
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
  const out = rest.trim().replace(/[,;:!]+$/, "");
  return out === "" ? null : out;
}

const NUMBER = /-?\d[\d,]*(?:\.\d+)?|-?\.\d+/g;

/** The last number in the text (thousands separators removed), e.g. GSM8K-style answers. */
export function extractLastNumber(text: string): string | null {
  let last: string | null = null;
  for (const m of text.matchAll(NUMBER)) last = m[0];
  if (last === null) return null;
  return last.replace(/,(?=\d{3}(?:\D|$))/g, "").replace(/,+$/, "");
}

export interface ExtractOptions {
  /** Fall back to the last number in the text (default false: MATH answers are not always numbers). */
  lastNumber?: boolean;
}

/** The answer a response commits to, or null: boxed, else "the answer is", else maybe the last number. */
export function extractAnswer(text: string, opts: ExtractOptions = {}): string | null {
  const boxed = extractBoxed(text);
  if (boxed !== null) return boxed;
  const is = extractAnswerIs(text);
  if (is !== null) return is;
  return opts.lastNumber ? extractLastNumber(text) : null;
}
