// LaTeX -> mathjs expression, for the symbolic check in the worker pool (pool.ts): synchronous,
// depth-limited and linear-time on bounded input, like the rest of the normalisation.
import { CLOSE, MAX_DEPTH, MAX_SYMBOLIC_LENGTH, OPEN } from "./normalize.ts";

const FUNCTIONS: Record<string, string> = {
  sin: "sin",
  cos: "cos",
  tan: "tan",
  cot: "cot",
  sec: "sec",
  csc: "csc",
  arcsin: "asin",
  arccos: "acos",
  arctan: "atan",
  sinh: "sinh",
  cosh: "cosh",
  tanh: "tanh",
  ln: "log",
  log: "log",
  exp: "exp",
};
const SYMBOLS: Record<string, string> = {
  pi: " pi ",
  infty: " Infinity ",
  cdot: " * ",
  times: " * ",
  div: " / ",
  ast: " * ",
};
const GREEK =
  /^(?:alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega)$/;

class NotConvertible extends Error {}

/** An explicit "*" when a group follows an operand: mathjs would read "n (2n+1)" as calling n. */
function times(out: string): string {
  return /[\w)]\s*$/.test(out) ? " * " : " ";
}

/**
 * A LaTeX expression in mathjs syntax, or null when it uses something outside the supported subset.
 * Letters become one-letter symbols (so "2ab" is 2·a·b); i is the imaginary unit and e is Euler's number.
 */
export function latexToExpr(s: string): string | null {
  if (s.length > MAX_SYMBOLIC_LENGTH) return null;
  try {
    const out = new Converter(s).expr(0, s.length, 0);
    return out.replace(/\s+/g, " ").trim();
  } catch (e) {
    if (e instanceof NotConvertible) return null;
    throw e;
  }
}

class Converter {
  constructor(private readonly s: string) {}

  /** Converts s[from, to). */
  expr(from: number, to: number, depth: number): string {
    if (depth > MAX_DEPTH) throw new NotConvertible("too deep");
    const s = this.s;
    let out = "";
    let i = from;
    while (i < to) {
      const c = s[i]!;
      if (c === " ") {
        i++;
      } else if (/[0-9.]/.test(c)) {
        const m = /^\d*\.?\d+|^\d+\.?/.exec(s.slice(i, Math.min(to, i + 400)));
        if (!m) throw new NotConvertible("number");
        out += ` ${m[0]} `;
        i += m[0].length;
      } else if (/[a-zA-Z]/.test(c)) {
        // one letter, with an optional subscript: x, x_1, x_{12}
        const sub = /^_(?:\{(\w+)\}|(\w))/.exec(s.slice(i + 1, Math.min(to, i + 40)));
        out += sub ? ` ${c}_${sub[1] ?? sub[2]} ` : ` ${c} `;
        i += 1 + (sub ? sub[0].length : 0);
      } else if (c === "{" || c === "(" || c === "[") {
        const close = this.close(i, to);
        out += `${times(out)}(${this.expr(i + 1, close, depth + 1)})`;
        i = close + 1;
      } else if (c === "|") {
        const close = s.indexOf("|", i + 1);
        if (close < 0 || close >= to) throw new NotConvertible("|");
        out += `${times(out)}abs(${this.expr(i + 1, close, depth + 1)}) `;
        i = close + 1;
      } else if ("+-*/!".includes(c)) {
        out += ` ${c} `;
        i++;
      } else if (c === "^") {
        const [arg, next] = this.arg(i + 1, to, depth);
        out += `^(${arg})`;
        i = next;
      } else if (c === "\\") {
        const m = /^\\([a-zA-Z]+)/.exec(s.slice(i, Math.min(to, i + 40)));
        if (!m) throw new NotConvertible(s.slice(i, i + 2));
        const name = m[1]!;
        i += m[0].length;
        if (name === "frac") {
          const [a, j] = this.arg(i, to, depth);
          const [b, k] = this.arg(j, to, depth);
          out += `${times(out)}((${a})/(${b})) `;
          i = k;
        } else if (name === "sqrt") {
          let n: string | null = null;
          while (s[i] === " ") i++;
          if (s[i] === "[") {
            const close = this.close(i, to);
            n = this.expr(i + 1, close, depth + 1);
            i = close + 1;
          }
          const [a, j] = this.arg(i, to, depth);
          out += times(out) + (n === null ? `sqrt(${a}) ` : `nthRoot(${a}, ${n}) `);
          i = j;
        } else if (name in FUNCTIONS) {
          // \sin^2 x = (sin x)^2; \log_2 8 = log(8, 2); the argument is the next atom or (group)
          let power = "";
          let base = "";
          if (s[i] === "^") {
            const [p, j] = this.arg(i + 1, to, depth);
            power = p;
            i = j;
          }
          if (s[i] === "_") {
            const [b, j] = this.arg(i + 1, to, depth);
            base = b;
            i = j;
          }
          const [a, j] = this.funcArg(i, to, depth);
          i = j;
          const call = base ? `${FUNCTIONS[name]}(${a}, ${base})` : `${FUNCTIONS[name]}(${a})`;
          out += times(out) + (power ? `(${call})^(${power}) ` : `${call} `);
        } else if (name in SYMBOLS) {
          out += SYMBOLS[name];
        } else if (GREEK.test(name)) {
          out += ` greek_${name} `;
        } else {
          throw new NotConvertible(`\\${name}`);
        }
      } else {
        throw new NotConvertible(c);
      }
    }
    return out;
  }

  /** Index of the bracket closing the one at `open` (any of ([{ with any of )]}), before `to`. */
  private close(open: number, to: number): number {
    let depth = 0;
    for (let i = open; i < to; i++) {
      const c = this.s[i]!;
      if (OPEN.includes(c)) depth++;
      else if (CLOSE.includes(c)) {
        depth--;
        if (depth === 0) return i;
      }
    }
    throw new NotConvertible("unbalanced");
  }

  /** A TeX macro argument: a {group}, or one token (a digit, a letter, a command). */
  private arg(i: number, to: number, depth: number): [string, number] {
    while (this.s[i] === " ") i++;
    if (i >= to) throw new NotConvertible("missing argument");
    const c = this.s[i]!;
    if (c === "{") {
      const close = this.close(i, to);
      return [this.expr(i + 1, close, depth + 1), close + 1];
    }
    if (c === "\\") {
      const m = /^\\[a-zA-Z]+/.exec(this.s.slice(i, i + 40));
      if (!m) throw new NotConvertible("argument");
      return [this.expr(i, i + m[0].length, depth + 1), i + m[0].length];
    }
    return [this.expr(i, i + 1, depth + 1), i + 1];
  }

  /** A function's argument: a (group), a {group}, or everything up to the next top-level + - =. */
  private funcArg(i: number, to: number, depth: number): [string, number] {
    while (this.s[i] === " ") i++;
    const c = this.s[i];
    if (c === "(" || c === "{") {
      const close = this.close(i, to);
      return [this.expr(i + 1, close, depth + 1), close + 1];
    }
    let j = i;
    let d = 0;
    for (; j < to; j++) {
      const ch = this.s[j]!;
      if (OPEN.includes(ch)) d++;
      else if (CLOSE.includes(ch)) d--;
      else if (d === 0 && "+-=".includes(ch) && j > i) break;
    }
    if (j === i) throw new NotConvertible("missing function argument");
    return [this.expr(i, j, depth + 1), j];
  }
}
