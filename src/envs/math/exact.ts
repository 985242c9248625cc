// Exact values of constant answers: integers, fractions, powers, factorials, binomials in BigInt
// rational arithmetic, so that `2^{31}-1` and `2147483648`, or `100!` and `100!+1`, differ as they
// should. Irrational parts (\sqrt of a non-square, \pi) fall back to doubles. Input is a normalized
// answer (normalizeAnswer); anything outside this grammar is "not a constant" (null), and the
// symbolic check takes it. Every operation is bounded: a value too large to hold is "huge".
//
// The comparison policy (compareValues), which docs/MATH-JUDGE.md states:
//   - two exact values (no decimal point written) are equal only when they are the same rational;
//   - when a side is written with a non-integer decimal (k digits after the point), it must agree with
//     the other to 9 significant digits and to within half a unit of its last written digit;
//   - there is no absolute tolerance: 10^{-13} is not 0.

/** Bits a numerator or denominator may have (about 30,000 decimal digits). */
const MAX_BITS = 100_000;
/** Largest n for n! and for the top of \binom{n}{k}. */
const MAX_FACTORIAL = 5000;
/** Relative agreement a decimal (or an irrational value) needs: 9 significant digits. */
const REL_TOL = 1e-9;
const MAX_DEPTH = 40;

export type Value = { t: "q"; n: bigint; d: bigint } | { t: "f"; v: number };

export interface Constant {
  value: Value;
  /** Most digits after a decimal point in any non-integer decimal written (0: none). */
  places: number;
}

/** Why there is no value: not a constant expression, or a constant too large to evaluate. */
export type NoValue = "not constant" | "huge";

class Stop extends Error {
  constructor(readonly why: NoValue) {
    super(why);
  }
}

function abs(x: bigint): bigint {
  return x < 0n ? -x : x;
}

function gcd(a: bigint, b: bigint): bigint {
  a = abs(a);
  b = abs(b);
  while (b !== 0n) [a, b] = [b, a % b];
  return a;
}

function bits(x: bigint): number {
  return x === 0n ? 0 : abs(x).toString(16).length * 4;
}

function q(n: bigint, d = 1n): Value {
  if (d === 0n) throw new Stop("not constant"); // division by zero: not a value
  if (d < 0n) [n, d] = [-n, -d];
  const g = gcd(n, d);
  if (g > 1n) [n, d] = [n / g, d / g];
  if (bits(n) > MAX_BITS || bits(d) > MAX_BITS) throw new Stop("huge");
  return { t: "q", n, d };
}

function toFloat(x: Value): number {
  if (x.t === "f") return x.v;
  // BigInt -> Number loses nothing that matters at 1e-9; scale very long ones first
  const shift = Math.max(0, Math.max(bits(x.n), bits(x.d)) - 1000);
  const s = BigInt(shift);
  return Number(x.n >> s) / Number(x.d >> s);
}

function f(v: number): Value {
  if (!Number.isFinite(v)) throw new Stop("huge");
  return { t: "f", v };
}

function add(a: Value, b: Value): Value {
  return a.t === "q" && b.t === "q" ? q(a.n * b.d + b.n * a.d, a.d * b.d) : f(toFloat(a) + toFloat(b));
}

function neg(a: Value): Value {
  return a.t === "q" ? { t: "q", n: -a.n, d: a.d } : { t: "f", v: -a.v };
}

function mul(a: Value, b: Value): Value {
  return a.t === "q" && b.t === "q" ? q(a.n * b.n, a.d * b.d) : f(toFloat(a) * toFloat(b));
}

function div(a: Value, b: Value): Value {
  if (b.t === "q") return a.t === "q" ? q(a.n * b.d, a.d * b.n) : f(a.v / toFloat(b));
  if (b.v === 0) throw new Stop("not constant");
  return f(toFloat(a) / b.v);
}

/** The integer k-th root of x when x is a perfect k-th power, else null. */
function exactRoot(x: bigint, k: number): bigint | null {
  if (x < 0n) return k % 2 === 1 ? ((r) => (r === null ? null : -r))(exactRoot(-x, k)) : null;
  if (x < 2n) return x;
  // Newton's method from above, in integers
  let r = 1n << BigInt(Math.ceil(bits(x) / k) + 1);
  const K = BigInt(k);
  for (;;) {
    const next = ((K - 1n) * r + x / r ** (K - 1n)) / K;
    if (next >= r) break;
    r = next;
  }
  return r ** K === x ? r : null;
}

function root(a: Value, k: number): Value {
  if (a.t === "q") {
    const n = exactRoot(a.n, k);
    const d = exactRoot(a.d, k);
    if (n !== null && d !== null) return q(n, d);
  }
  const v = toFloat(a);
  if (v < 0 && k % 2 === 0) throw new Stop("not constant"); // not a real number
  return f(Math.sign(v) * Math.abs(v) ** (1 / k));
}

function pow(a: Value, e: Value): Value {
  if (e.t === "q" && e.d === 1n) {
    const k = e.n;
    if (a.t === "q") {
      if (a.n === 0n && k < 0n) throw new Stop("not constant");
      if (abs(a.n) <= 1n && a.d === 1n)
        return q(a.n === -1n && k % 2n !== 0n ? -1n : a.n === 0n && k !== 0n ? 0n : 1n);
      const size = Math.max(bits(a.n), bits(a.d)) * Number(abs(k));
      if (!Number.isFinite(size) || size > MAX_BITS) throw new Stop("huge");
      return k >= 0n ? q(a.n ** k, a.d ** k) : q(a.d ** -k, a.n ** -k);
    }
    return f(a.v ** Number(k));
  }
  // a rational exponent with a small denominator is a root: 8^{2/3}, 51^{1/2}
  if (e.t === "q" && e.d <= 12n) return root(pow(a, q(e.n)), Number(e.d));
  const v = toFloat(a);
  if (v < 0) throw new Stop("not constant");
  return f(v ** toFloat(e));
}

function toInteger(a: Value, what: string): bigint {
  if (a.t !== "q" || a.d !== 1n || a.n < 0n) throw new Stop("not constant");
  if (a.n > BigInt(MAX_FACTORIAL)) throw new Stop("huge");
  void what;
  return a.n;
}

function factorial(a: Value): Value {
  const n = toInteger(a, "n!");
  let r = 1n;
  for (let k = 2n; k <= n; k++) r *= k;
  return q(r);
}

function binom(a: Value, b: Value): Value {
  const n = toInteger(a, "binom");
  const k = b.t === "q" && b.d === 1n ? b.n : -1n;
  if (k < 0n || k > n) return q(0n);
  const m = k < n - k ? k : n - k;
  let r = 1n;
  for (let i = 1n; i <= m; i++) r = (r * (n - m + i)) / i;
  return q(r);
}

/** Recursive-descent evaluation of a normalized answer; throws Stop when it is not a constant. */
class Evaluator {
  private i = 0;
  places = 0;

  constructor(private readonly s: string) {}

  run(): Value {
    const v = this.expr(0);
    if (this.i !== this.s.length) throw new Stop("not constant");
    return v;
  }

  private peek(str: string): boolean {
    return this.s.startsWith(str, this.i);
  }

  /** A command name at i (without the backslash), or null. */
  private command(): string | null {
    const m = /^\\([a-zA-Z]+)/.exec(this.s.slice(this.i, this.i + 40));
    return m ? m[1]! : null;
  }

  private eat(str: string): boolean {
    if (!this.peek(str)) return false;
    this.i += str.length;
    while (this.s[this.i] === " ") this.i++;
    return true;
  }

  private expr(depth: number): Value {
    if (depth > MAX_DEPTH) throw new Stop("not constant");
    let v = this.term(depth);
    for (;;) {
      if (this.eat("+")) v = add(v, this.term(depth));
      else if (this.eat("-")) v = add(v, neg(this.term(depth)));
      else return v;
    }
  }

  private term(depth: number): Value {
    let v = this.unary(depth);
    for (;;) {
      const c = this.command();
      if (this.eat("*") || (c === "cdot" && this.eat("\\cdot")) || (c === "times" && this.eat("\\times"))) {
        v = mul(v, this.unary(depth));
      } else if (this.eat("/") || (c === "div" && this.eat("\\div"))) {
        v = div(v, this.unary(depth));
      } else if (this.startsPrimary()) {
        v = mul(v, this.power(depth)); // implicit: 2\sqrt{3}, 3\pi, 2(5)
      } else return v;
    }
  }

  private startsPrimary(): boolean {
    const c = this.s[this.i];
    if (c === "(" || c === "{") return true;
    const cmd = this.command();
    return cmd !== null && ["frac", "sqrt", "pi", "binom", "lfloor", "lceil"].includes(cmd);
  }

  private unary(depth: number): Value {
    if (this.eat("-")) return neg(this.unary(depth));
    if (this.eat("+")) return this.unary(depth);
    return this.power(depth);
  }

  private power(depth: number): Value {
    let v = this.postfix(depth);
    if (this.eat("^")) {
      // right-associative, as 2^3^2 is read: the exponent may itself carry a power
      const e = this.s[this.i] === "{" ? this.group(depth) : this.power(depth + 1);
      v = pow(v, e);
      while (this.eat("!")) v = factorial(v);
    }
    return v;
  }

  private postfix(depth: number): Value {
    let v = this.primary(depth);
    while (this.eat("!")) v = factorial(v);
    return v;
  }

  private group(depth: number): Value {
    const open = this.s[this.i];
    const close = open === "{" ? "}" : open === "(" ? ")" : null;
    if (close === null) throw new Stop("not constant");
    this.eat(open!);
    const v = this.expr(depth + 1);
    if (!this.eat(close)) throw new Stop("not constant");
    return v;
  }

  /** A macro argument: {group} or one digit. */
  private arg(depth: number): Value {
    if (this.s[this.i] === "{") return this.group(depth);
    const c = this.s[this.i];
    if (c !== undefined && /\d/.test(c)) {
      this.i++;
      return q(BigInt(c));
    }
    if (this.command() !== null) return this.primary(depth + 1);
    throw new Stop("not constant");
  }

  private primary(depth: number): Value {
    const s = this.s;
    const c = s[this.i];
    if (c === undefined) throw new Stop("not constant");
    if (c === "(" || c === "{") return this.group(depth);
    if (c === "|") {
      this.eat("|");
      const v = this.expr(depth + 1);
      if (!this.eat("|")) throw new Stop("not constant");
      return v.t === "q" ? { t: "q", n: abs(v.n), d: v.d } : { t: "f", v: Math.abs(v.v) };
    }
    const num = /^(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d{1,6}))?/.exec(s.slice(this.i, this.i + 2000));
    if (num) {
      this.i += num[0].length;
      while (s[this.i] === " ") this.i++;
      const [int = "", frac = ""] = num[1]!.split(".");
      const digits = frac.replace(/0+$/, "");
      if (digits.length > 0) this.places = Math.max(this.places, digits.length);
      let v = q(BigInt((int || "0") + digits), 10n ** BigInt(digits.length));
      if (num[2] !== undefined) v = mul(v, pow(q(10n), q(BigInt(num[2]))));
      // a mixed number: 1\frac{4}{5} is 1 + 4/5 (an integer, then a proper fraction of integers)
      const mixed = /^\\frac(?:\{(\d+)\}\{(\d+)\}|(\d)(\d))/.exec(s.slice(this.i, this.i + 60));
      if (mixed && frac === "" && num[2] === undefined) {
        const n = BigInt(mixed[1] ?? mixed[3]!);
        const d = BigInt(mixed[2] ?? mixed[4]!);
        if (n < d) {
          this.i += mixed[0].length;
          return add(v, q(n, d));
        }
      }
      return v;
    }
    const cmd = this.command();
    if (cmd === null) throw new Stop("not constant");
    this.i += cmd.length + 1;
    while (s[this.i] === " ") this.i++;
    switch (cmd) {
      case "frac": {
        const a = this.arg(depth + 1);
        return div(a, this.arg(depth + 1));
      }
      case "binom": {
        const a = this.arg(depth + 1);
        return binom(a, this.arg(depth + 1));
      }
      case "sqrt": {
        let k = 2;
        if (s[this.i] === "[") {
          const close = s.indexOf("]", this.i);
          const n = close < 0 ? null : /^\d{1,2}$/.exec(s.slice(this.i + 1, close));
          if (!n) throw new Stop("not constant");
          k = Number(n[0]);
          this.i = close + 1;
        }
        return root(this.arg(depth + 1), k);
      }
      case "pi":
        return f(Math.PI);
      case "lfloor":
      case "lceil": {
        const v = this.expr(depth + 1);
        if (!this.eat(cmd === "lfloor" ? "\\rfloor" : "\\rceil")) throw new Stop("not constant");
        if (v.t === "f") return q(BigInt(cmd === "lfloor" ? Math.floor(v.v) : Math.ceil(v.v)));
        const fl = v.n / v.d - (v.n < 0n && v.n % v.d !== 0n ? 1n : 0n);
        return q(cmd === "lceil" && fl * v.d !== v.n ? fl + 1n : fl);
      }
      default:
        throw new Stop("not constant");
    }
  }
}

/** The value of a constant answer, or why there is none. Input: a normalized answer. */
export function constantValue(s: string): Constant | NoValue {
  if (s === "" || s.length > 1000) return "not constant";
  // a letter anywhere (outside command names) is a variable or text: not a constant
  if (/(?:^|[^\\a-zA-Z])[a-df-zA-DF-Z]/.test(s.replace(/\\[a-zA-Z]+/g, "\\"))) return "not constant";
  try {
    const ev = new Evaluator(s);
    const value = ev.run();
    return { value, places: ev.places };
  } catch (e) {
    if (e instanceof Stop) return e.why;
    if (e instanceof RangeError) return "huge"; // BigInt or stack limits
    throw e;
  }
}

/** Equal under the policy in this file's header. */
export function compareValues(a: Constant, b: Constant): boolean {
  const places = Math.max(a.places, b.places);
  const x = a.value;
  const y = b.value;
  if (x.t === "q" && y.t === "q") {
    const diff = abs(x.n * y.d - y.n * x.d); // |x - y| = diff / (x.d y.d)
    if (diff === 0n) return true;
    if (places === 0) return false;
    const den = x.d * y.d;
    // half a unit of the last written digit: diff / den <= 5 / 10^(places+1)
    if (diff * 10n ** BigInt(places + 1) > 5n * den) return false;
    // 9 significant digits: diff / den <= 1e-9 max(|x|, |y|)
    const [u, v] = [abs(x.n) * y.d, abs(y.n) * x.d]; // |x| den and |y| den
    return diff * 1_000_000_000n <= u || diff * 1_000_000_000n <= v;
  }
  const u = toFloat(x);
  const v = toFloat(y);
  const d = Math.abs(u - v);
  if (d === 0) return true;
  if (places > 0 && d > 0.5 * 10 ** -places) return false;
  return d <= REL_TOL * Math.max(Math.abs(u), Math.abs(v));
}
