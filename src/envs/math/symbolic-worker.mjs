// The symbolic half of the math answer checker, in a worker thread so that the pool can terminate it
// when an adversarial answer makes it slow. Plain JavaScript: workers start without the TS loader.
//
// Message in:  { id, pairs: [{ a, b, eq }] }   a, b: mathjs expressions from latexToExpr;
//              eq: compare as equations (a = 0 and b = 0 up to a constant factor)
// Message out: { id, results: boolean[] }  or { id, error }
// Equality is tested numerically: both sides evaluated at a few fixed pseudo-random points.
import { parentPort } from "node:worker_threads";
import { all, create } from "mathjs";

const math = create(all, { number: "number" });
// floating-point evaluation of exact expressions errs around 1e-15; decimals written by a model are
// not rounded approximations of irrationals we want to accept (1.414 is not \sqrt2)
const REL_TOL = 1e-8;
const N_POINTS = 6;

/** Deterministic points: the same pair always gets the same verdict. */
function points(names) {
  let seed = 0x9e3779b9;
  const rand = () => {
    // mulberry32
    seed = (seed + 0x6d2b79f5) | 0;
    let t = seed;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const out = [];
  for (let k = 0; k < N_POINTS; k++) {
    const scope = {};
    // half the points positive, half negative: sqrt(x^2) is not x
    for (const n of names) scope[n] = (k % 2 === 0 ? 1 : -1) * (0.3 + 2.7 * rand());
    out.push(scope);
  }
  return out;
}

/** Free symbols: names that are neither functions called nor constants mathjs knows (pi, e, i). */
function freeSymbols(node, into) {
  node.traverse((n, path) => {
    if (n.isSymbolNode && path !== "fn" && !(n.name in math)) into.add(n.name);
  });
}

function toComplex(v) {
  if (typeof v === "number") return { re: v, im: 0 };
  if (v && typeof v === "object" && typeof v.re === "number" && typeof v.im === "number") return v;
  return null;
}

function close(x, y) {
  // relative, with an absolute floor for values that should cancel to zero (x - x vs 0)
  const d = Math.hypot(x.re - y.re, x.im - y.im);
  return d <= REL_TOL * Math.max(Math.hypot(x.re, x.im), Math.hypot(y.re, y.im)) || d <= 1e-10;
}

function finite(z) {
  return z !== null && Number.isFinite(z.re) && Number.isFinite(z.im);
}

function evalAt(code, scope) {
  try {
    return toComplex(code.evaluate({ ...scope }));
  } catch {
    return null;
  }
}

function comparePair({ a, b, eq }) {
  const na = math.parse(a);
  const nb = math.parse(b);
  const names = new Set();
  freeSymbols(na, names);
  freeSymbols(nb, names);
  const ca = na.compile();
  const cb = nb.compile();
  let compared = 0;
  let ratio = null;
  for (const scope of points([...names])) {
    const x = evalAt(ca, scope);
    const y = evalAt(cb, scope);
    if (!finite(x) && !finite(y)) continue; // outside both domains
    if (!finite(x) || !finite(y)) return false;
    compared++;
    if (!eq) {
      if (!close(x, y)) return false;
      continue;
    }
    // equations: a = k·b for one constant k != 0 (both zero at a point says nothing)
    const yAbs = Math.hypot(y.re, y.im);
    const xAbs = Math.hypot(x.re, x.im);
    if (yAbs < 1e-12 && xAbs < 1e-12) continue;
    if (yAbs < 1e-12 || xAbs < 1e-12) return false;
    const d = y.re * y.re + y.im * y.im;
    const r = { re: (x.re * y.re + x.im * y.im) / d, im: (x.im * y.re - x.re * y.im) / d };
    if (ratio === null) ratio = r;
    else if (!close(ratio, r)) return false;
  }
  // a constant expression is checked at one point; anything with variables needs several
  return names.size === 0 ? compared >= 1 : compared >= 3;
}

parentPort.on("message", (msg) => {
  try {
    const results = msg.pairs.map((p) => {
      try {
        return comparePair(p);
      } catch {
        return false; // a parse error or a stack overflow on one pair does not sink the others
      }
    });
    parentPort.postMessage({ id: msg.id, results });
  } catch (e) {
    parentPort.postMessage({ id: msg.id, error: String(e) });
  }
});
parentPort.postMessage({ ready: true });
