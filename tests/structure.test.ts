// The house rules a reader relies on: no source file over 500 lines (generated code aside), and no
// module imports itself in a circle, neither in the TypeScript framework nor in the Python engine.
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { describe, expect, it } from "vitest";

const ROOT = join(import.meta.dirname, "..");
const GENERATED = new Set(["src/client/openapi.d.ts"]);

function files(dir: string, ext: RegExp): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir)) {
    if (name === "node_modules" || name === "__pycache__" || name.startsWith(".")) continue;
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...files(p, ext));
    else if (ext.test(name)) out.push(p);
  }
  return out;
}

const rel = (p: string) => relative(ROOT, p);
const tsSources = () => [...files(join(ROOT, "src"), /\.(ts|mjs)$/), ...files(join(ROOT, "bench"), /\.ts$/)];
const pySources = () => [
  ...files(join(ROOT, "engine", "marft_engine"), /\.py$/),
  ...files(join(ROOT, "bench"), /\.py$/),
];

/** The first import cycle of a graph (module -> modules it imports), or null. */
function findCycle(graph: Map<string, string[]>): string[] | null {
  const state = new Map<string, "open" | "done">();
  const path: string[] = [];
  const visit = (n: string): string[] | null => {
    if (state.get(n) === "done") return null;
    if (state.get(n) === "open") return [...path.slice(path.indexOf(n)), n];
    state.set(n, "open");
    path.push(n);
    for (const m of graph.get(n) ?? []) {
      const c = visit(m);
      if (c) return c;
    }
    path.pop();
    state.set(n, "done");
    return null;
  };
  for (const n of graph.keys()) {
    const c = visit(n);
    if (c) return c;
  }
  return null;
}

/** Relative imports of each TypeScript module, type-only ones included (a cycle of types is still a knot to read). */
function tsGraph(): Map<string, string[]> {
  const g = new Map<string, string[]>();
  for (const f of tsSources()) {
    const text = readFileSync(f, "utf8");
    const deps = [...text.matchAll(/(?:^|\n)\s*(?:import|export)\b[^;]*?\bfrom\s+"(\.{1,2}\/[^"]+)"/g)].map(
      (m) => rel(resolve(dirname(f), m[1]!)),
    );
    g.set(rel(f), [...new Set(deps)]);
  }
  return g;
}

/** Imports between the engine's own modules (`from .x import`, `from . import x`, `marft_engine.x`). */
function pyGraph(): Map<string, string[]> {
  const pkg = join(ROOT, "engine", "marft_engine");
  const g = new Map<string, string[]>();
  for (const f of files(pkg, /\.py$/)) {
    const text = readFileSync(f, "utf8");
    const deps = new Set<string>();
    for (const m of text.matchAll(/^\s*from\s+(\.+|marft_engine\.?)([\w.]*)\s+import\s+([\w, ()\n]+)/gm)) {
      const mod = m[2]!;
      if (mod) deps.add(`${mod.split(".")[0]}.py`);
      else for (const name of m[3]!.replace(/[()\n]/g, "").split(",")) deps.add(`${name.trim()}.py`);
    }
    const here = relative(pkg, f);
    g.set(
      here,
      [...deps].filter((d) => d !== here && files(pkg, /\.py$/).some((x) => relative(pkg, x) === d)),
    );
  }
  return g;
}

describe("house rules", () => {
  it("no source file is over 500 lines", () => {
    const long = [...tsSources(), ...pySources()]
      .filter((f) => !GENERATED.has(rel(f)))
      .map((f) => [rel(f), readFileSync(f, "utf8").split("\n").length - 1] as const)
      .filter(([, n]) => n > 500);
    expect(long).toEqual([]);
  });

  it("nothing imports in a circle (TypeScript)", () => {
    const g = tsGraph();
    expect(g.size).toBeGreaterThan(50);
    expect(findCycle(g)).toBeNull();
  });

  it("nothing imports in a circle (the Python engine)", () => {
    const g = pyGraph();
    expect(g.size).toBeGreaterThan(5);
    expect(findCycle(g)).toBeNull();
  });

  it("the cycle finder finds a cycle", () => {
    const g = new Map([
      ["a", ["b"]],
      ["b", ["c"]],
      ["c", ["a"]],
      ["d", []],
    ]);
    expect(findCycle(g)).toEqual(["a", "b", "c", "a"]);
    expect(
      findCycle(
        new Map([
          ["a", ["b"]],
          ["b", []],
        ]),
      ),
    ).toBeNull();
  });
});
