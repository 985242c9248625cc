// Code problems: MBPP (sanitized) and user JSONL files, read through the shared dataset readers so
// that every error names the file, the line and the field.
//
// MBPP record:  {task_id, prompt, code, test_imports, test_list}   (JSON array)
// User record:  {id, prompt, signature?, tests: ["assert ..."], test_imports?, entry_point?}  (JSONL or JSON)
//
// The reference solution (MBPP `code`) is kept on the problem for harness checks (bench/sandbox.ts)
// only; nothing that builds an observation may read it.
import { z } from "zod";
import { DatasetError, type JsonRecord, parseRecord, readJsonRecords } from "../datasets.ts";

export interface CodeProblem {
  id: string;
  /** The task in words, as the policy sees it. */
  prompt: string;
  /** The function the tests call: told to the policy so its code can be called at all. */
  entryPoint: string;
  /** e.g. "def add(a: int, b: int) -> int", when the data gives one. */
  signature?: string;
  /** Hidden assert statements; the reward is the fraction that pass. */
  tests: string[];
  /** Lines run before the solution, e.g. "import math" (MBPP's test_imports). */
  testImports: string[];
  /** A known-good solution (MBPP `code`). NEVER shown to the policy. */
  reference?: string;
}

const MbppRecord = z.object({
  task_id: z.number().int(),
  prompt: z.string().min(1),
  code: z.string().min(1),
  test_imports: z.array(z.string()),
  test_list: z.array(z.string().min(1)).min(1),
});

const UserRecord = z.object({
  id: z.union([z.string().min(1), z.number().int()]),
  prompt: z.string().min(1),
  signature: z.string().min(1).optional(),
  entry_point: z.string().min(1).optional(),
  tests: z.array(z.string().min(1)).min(1),
  test_imports: z.array(z.string()).optional(),
});

// Names a test may call that are not the function under test.
const PY_BUILTINS = new Set(
  (
    "abs all any ascii bin bool bytearray bytes callable chr complex dict dir divmod enumerate eval " +
    "filter float format frozenset getattr hasattr hash hex id input int isinstance issubclass iter len " +
    "list map max min next object oct ord pow print range repr reversed round set slice sorted str sum " +
    "tuple type zip isclose and or not in is if else lambda assert for while return None True False"
  ).split(" "),
);

/** Functions called in a test, in order of first appearance; method calls (`x.f(`) excluded. */
function calledNames(test: string, keepBuiltins = false): string[] {
  const names: string[] = [];
  // Strip string literals so words inside them do not count.
  const code = test.replace(/'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"/g, '""');
  for (const m of code.matchAll(/(?<![\w.])([A-Za-z_]\w*)\s*\(/g)) {
    const name = m[1]!;
    if ((keepBuiltins || !PY_BUILTINS.has(name)) && !names.includes(name)) names.push(name);
  }
  return names;
}

/**
 * The function the tests call: from the signature if given, else the function called by every test
 * that the reference defines (if any), else the first name called by every test.
 */
export function entryPointOf(tests: string[], opts: { signature?: string; reference?: string } = {}): string {
  if (opts.signature) {
    const m = /^\s*(?:async\s+)?(?:def\s+)?([A-Za-z_]\w*)\s*\(/.exec(opts.signature);
    if (m) return m[1]!;
    throw new Error(`signature "${opts.signature}" does not start with "def name(" or "name("`);
  }
  const perTest = tests.map((t) => calledNames(t));
  const inAll = (perTest[0] ?? []).filter((n) => perTest.every((names) => names.includes(n)));
  if (opts.reference) {
    // A reference may define a function named like a builtin (MBPP has a `sum`): keep builtins here.
    const defined = [...opts.reference.matchAll(/^\s*def\s+([A-Za-z_]\w*)\s*\(/gm)].map((m) => m[1]!);
    const called = tests.map((t) => calledNames(t, true));
    const hit =
      called[0]?.find((n) => defined.includes(n) && called.every((c) => c.includes(n))) ??
      called.flat().find((n) => defined.includes(n));
    if (hit) return hit;
  }
  if (inAll.length > 0) return inAll[0]!;
  throw new Error(`cannot tell which function the tests call: ${JSON.stringify(tests[0] ?? "")}`);
}

function mbppProblem(file: string, r: JsonRecord): CodeProblem {
  const rec = parseRecord(file, r, MbppRecord);
  const entryPoint = wrap(file, r.line, "test_list", () =>
    entryPointOf(rec.test_list, { reference: rec.code }),
  );
  return {
    id: `mbpp-${rec.task_id}`,
    prompt: rec.prompt,
    entryPoint,
    tests: rec.test_list,
    testImports: rec.test_imports,
    reference: rec.code,
  };
}

function userProblem(file: string, r: JsonRecord): CodeProblem {
  const rec = parseRecord(file, r, UserRecord);
  for (const [i, t] of rec.tests.entries()) {
    if (!/^\s*assert\b/.test(t)) {
      throw new DatasetError(
        file,
        r.line,
        `field "tests.${i}": expected an assert statement, got "${t.slice(0, 60)}"`,
      );
    }
  }
  const entryPoint =
    rec.entry_point ??
    wrap(file, r.line, rec.signature ? "signature" : "tests", () =>
      entryPointOf(rec.tests, { signature: rec.signature }),
    );
  return {
    id: String(rec.id),
    prompt: rec.prompt,
    entryPoint,
    ...(rec.signature ? { signature: rec.signature } : {}),
    tests: rec.tests,
    testImports: rec.test_imports ?? [],
  };
}

function wrap<T>(file: string, line: number, field: string, f: () => T): T {
  try {
    return f();
  } catch (e) {
    throw new DatasetError(file, line, `field "${field}": ${(e as Error).message}`);
  }
}

/**
 * Reads code problems from a JSON array or JSONL file: MBPP records (with `task_id` and `test_list`)
 * or user records (`id`, `prompt`, `tests`, ...), told apart per record. Ids must be unique.
 */
export function loadCodeProblems(file: string): CodeProblem[] {
  const records = readJsonRecords(file);
  if (records.length === 0) throw new DatasetError(file, 1, "no problems in the file");
  const seen = new Map<string, number>();
  return records.map((r) => {
    const isMbpp = typeof r.value === "object" && r.value !== null && "task_id" in r.value;
    const p = isMbpp ? mbppProblem(file, r) : userProblem(file, r);
    const first = seen.get(p.id);
    if (first !== undefined)
      throw new DatasetError(file, r.line, `duplicate id "${p.id}" (first on line ${first})`);
    seen.set(p.id, r.line);
    return p;
  });
}

/** The MBPP file of the shared datasets, relative to the datasets folder (see datasetsDir). */
export const MBPP_FILE = "mbpp/sanitized-mbpp.json";
