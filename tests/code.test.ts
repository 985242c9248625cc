// Code tasks: MBPP / user data, the hidden-test harness, CodeEnv teams, checkEnv.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { type CodeProblem, entryPointOf, loadCodeProblems } from "../src/envs/code/data.ts";
import {
  CodeEnv,
  createCodeSuite,
  defaultMbppFile,
  extractCode,
  runTests,
  testerAsserts,
} from "../src/envs/code/env.ts";
import { passedTests, testProgram } from "../src/envs/code/harness.ts";
import { SandboxPool } from "../src/envs/code/sandbox.ts";
import { CodeTaskSchema, codeSuite } from "../src/envs/code/task.ts";
import { parseOptions } from "../src/fields.ts";
import { checkEnv } from "../src/flexmg/check.ts";
import type { AgentSpec } from "../src/flexmg/types.ts";

const mbpp = loadCodeProblems(defaultMbppFile());
const byId = (id: string) => mbpp.find((p) => p.id === id)!;
const pool = new SandboxPool({ concurrency: 2 });
const limits = { timeoutMs: 5000, memoryMb: 256 };
const dir = mkdtempSync(join(tmpdir(), "marft-code-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const fence = (code: string) => "Here it is:\n```python\n" + code + "\n```\nDone.";

const CODER: AgentSpec = { id: "coder", role: "coder", systemPrompt: "You write Python." };
const REVIEWER: AgentSpec = { id: "reviewer", role: "reviewer", systemPrompt: "You review code." };
const TESTER: AgentSpec = { id: "tester", role: "tester", systemPrompt: "You write tests." };

describe("code data", () => {
  it("loads MBPP sanitized: 427 problems, unique ids, the entry point defined by the reference", () => {
    expect(mbpp).toHaveLength(427);
    expect(new Set(mbpp.map((p) => p.id)).size).toBe(427);
    const p2 = byId("mbpp-2");
    expect(p2.entryPoint).toBe("similar_elements");
    expect(p2.tests).toHaveLength(3);
    for (const p of mbpp) expect(p.reference).toMatch(new RegExp(`def\\s+${p.entryPoint}\\s*\\(`));
    // A function named like a builtin (MBPP 126 defines `sum`) is found through the reference.
    expect(byId("mbpp-126").entryPoint).toBe("sum");
    expect(byId("mbpp-4").testImports).toEqual([]);
  });

  it("derives the entry point from asserts or a signature", () => {
    expect(entryPointOf(["assert math.isclose(volume_cone(5,12), 314.15, rel_tol=0.001)"])).toBe(
      "volume_cone",
    );
    expect(entryPointOf(["assert not is_not_prime(2)", "assert is_not_prime(10) == True"])).toBe(
      "is_not_prime",
    );
    expect(entryPointOf(["assert set(f('len(x)')) == set([1])"])).toBe("f");
    expect(entryPointOf(["assert x(1) == 2"], { signature: "def add(a: int, b: int) -> int" })).toBe("add");
    expect(() => entryPointOf(["assert len([1]) == 1"])).toThrow(/cannot tell which function/);
  });

  it("loads user JSONL and names file, line and field in errors", () => {
    const good = join(dir, "good.jsonl");
    writeFileSync(
      good,
      [
        JSON.stringify({
          id: "add",
          prompt: "Add two numbers.",
          signature: "def add(a, b)",
          tests: ["assert add(1, 2) == 3"],
        }),
        "",
        JSON.stringify({
          id: 7,
          prompt: "Square.",
          tests: ["assert sq(3) == 9"],
          test_imports: ["import math"],
        }),
      ].join("\n"),
    );
    const ps = loadCodeProblems(good);
    expect(ps.map((p) => [p.id, p.entryPoint, p.signature])).toEqual([
      ["add", "add", "def add(a, b)"],
      ["7", "sq", undefined],
    ]);
    expect(ps[1]!.testImports).toEqual(["import math"]);

    const cases: Array<[string, RegExp]> = [
      [`{"id": "a", "prompt": "p"}`, /bad\.jsonl:1: missing field "tests"/],
      [
        `{"id": "a", "prompt": "p", "tests": ["print(1)"]}`,
        /bad\.jsonl:1: field "tests\.0": expected an assert statement/,
      ],
      [`{"id": "a", "prompt": "p", "tests": "assert f(1)"}`, /bad\.jsonl:1: field "tests": expected array/],
      [
        `{"id": "a", "prompt": "p", "tests": ["assert f(1)"]}\n{"id": "a", "prompt": "q", "tests": ["assert f(2)"]}`,
        /bad\.jsonl:2: duplicate id "a"/,
      ],
      [
        `\n{"id": "a", "prompt": "p", "tests": ["assert len(x)"]}`,
        /bad\.jsonl:2: field "tests": cannot tell which function/,
      ],
      [`{"id": "a", "prompt": "p", "tests": [}`, /bad\.jsonl:1: invalid JSON/],
    ];
    for (const [text, error] of cases) {
      writeFileSync(join(dir, "bad.jsonl"), text);
      expect(() => loadCodeProblems(join(dir, "bad.jsonl"))).toThrow(error);
    }
  });

  it("never shows the reference solution in any observation, for every MBPP problem and role", async () => {
    const env = new CodeEnv([CODER, REVIEWER, TESTER], { kind: "parallel" }, { pool, visibleTests: 3 });
    for (const p of mbpp) {
      await env.reset(p, 0);
      const seen = env
        .ready()
        .flatMap((a) => env.observe(a).map((m) => m.content))
        .join("\n");
      expect(seen).toContain(p.entryPoint);
      expect(seen).not.toContain(p.reference!.trim());
      // Not even its body lines (the signature line may legitimately match the function name only).
      const body = p.reference!.split("\n").filter((l) => l.trim().length > 25 && !/^\s*def /.test(l));
      for (const line of body) expect(seen).not.toContain(line.trim());
    }
  });
});

describe("solution extraction", () => {
  it("takes the last fenced block, an unclosed final fence, or a bare def", () => {
    expect(extractCode("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```\n")).toBe("y = 2\n");
    expect(extractCode("```py\nfirst\n```\nthen\n```python\ndef f():\n    return 1")).toBe(
      "def f():\n    return 1",
    );
    expect(extractCode("def f(x):\n    return x", "f")).toBe("def f(x):\n    return x");
    expect(extractCode("I do not know.", "f")).toBeNull();
    expect(testerAsserts("```python\nassert f(1) == 1\nx = 2\nassert f(2) == 4\n```")).toEqual([
      "assert f(1) == 1",
      "assert f(2) == 4",
    ]);
  });
});

describe("hidden-test harness", () => {
  it("passes MBPP reference solutions and scores wrong ones by the fraction passed", async () => {
    const p = byId("mbpp-3"); // is_not_prime, 4 tests: 2 expect False, 2 expect True
    const good = await runTests(pool, p.reference!, p, limits);
    expect(good).toMatchObject({ passed: 4, total: 4, status: "ok" });
    const half = await runTests(pool, "def is_not_prime(n):\n    return n == 10", p, limits);
    expect(half.passed).toBe(3);
    const broken = await runTests(pool, "def is_not_prime(n) return", p, limits);
    expect(broken.passed).toBe(0);
    expect(broken.stderr).toContain("SyntaxError");
    const none = await runTests(pool, null, p, limits);
    expect(none).toMatchObject({ passed: 0, status: "no_code" });
  });

  it("passes a spread sample of MBPP reference solutions (the harness is correct on real data)", async () => {
    const sample = mbpp.filter((_, i) => i % 15 === 0); // 29 problems across the file
    const outcomes = await Promise.all(sample.map((p) => runTests(pool, p.reference!, p, limits)));
    const failed = outcomes.flatMap((o, i) =>
      o.passed === o.total ? [] : [`${sample[i]!.id}: ${o.stderr}`],
    );
    expect(failed).toEqual([]);
  });

  it("cannot be fooled by printing, early exit, frame or gc introspection", async () => {
    const p = byId("mbpp-3");
    const attacks = [
      // Print lines that look like results, then leave before any test runs.
      "import os, sys\nfor i in range(4):\n    print(i, 'PASS')\nsys.stdout.flush()\nos._exit(0)",
      // Walk up to the harness frame and read its locals.
      "import sys\nf = sys._getframe(1)\nprint(*f.f_locals.get('tokens', []), sep='\\n')",
      "try:\n    1/0\nexcept Exception as e:\n    fr = e.__traceback__.tb_frame.f_back\n    print(*fr.f_locals['tokens'], sep='\\n')",
      // Search the heap for the token list.
      "import gc\nfor o in gc.get_objects():\n    if isinstance(o, list) and o and all(isinstance(x, str) and len(x) == 32 for x in o):\n        print(*o, sep='\\n')",
      // Read stdin for the tokens.
      "import sys\nprint(sys.stdin.read())",
    ];
    for (const attack of attacks) {
      const r = await runTests(pool, attack + "\ndef is_not_prime(n):\n    return None", p, limits);
      expect(r.passed, attack).toBe(0);
    }
  });

  it("cannot be fooled by results that lie about equality or truth", async () => {
    const p = byId("mbpp-3"); // assert is_not_prime(2) == False, ... (4 tests)
    const liars = [
      "class A:\n    def __eq__(self, other):\n        return True\ndef is_not_prime(n):\n    return A()",
      // A dict subclass, a namedtuple and an int subclass with their own __eq__.
      "class D(dict):\n    def __eq__(self, o):\n        return True\ndef is_not_prime(n):\n    return D()",
      "import collections\nP = collections.namedtuple('P', 'x')\nP.__eq__ = lambda s, o: True\ndef is_not_prime(n):\n    return P(1)",
      "class I(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\ndef is_not_prime(n):\n    return I(0)",
      // Patch a trusted standard-library class, then return it.
      "import collections\ncollections.Counter.__eq__ = lambda s, o: True\ndef is_not_prime(n):\n    return collections.Counter()",
      // Hide the class's own __eq__ behind a metaclass that lies about flags and attributes.
      "class M(type):\n    __flags__ = 0\n    def __getattribute__(c, n):\n        return type.__getattribute__(int, n)\nclass A(metaclass=M):\n    def __eq__(s, o):\n        return True\ndef is_not_prime(n):\n    return A()",
      // Rebind the builtins the checker could have used, then lie.
      "import builtins\nbuiltins.isinstance = lambda *a: False\nbuiltins.next = lambda *a: object\nbuiltins.type = lambda *a: int\nclass A:\n    def __eq__(self, other):\n        return True\ndef is_not_prime(n):\n    return A()",
      // Inside a container.
      "class A:\n    def __eq__(self, other):\n        return True\ndef is_not_prime(n):\n    return [A()]",
    ];
    for (const liar of liars) {
      const r = await runTests(pool, liar, p, limits);
      expect(r.passed, liar).toBe(0);
    }
    // Truthiness: `assert check_str(...)` / `assert not check_str(...)` (MBPP 737, re.Match results).
    const q = byId("mbpp-737");
    const truthy =
      "class T:\n    def __bool__(self):\n        return True\ndef check_str(s):\n    return T()";
    expect((await runTests(pool, truthy, q, limits)).passed).toBe(0);
    // Honest results that are not plain builtins still pass: a namedtuple, a Counter, a re.Match.
    const honest: CodeProblem = {
      id: "honest",
      prompt: "",
      entryPoint: "f",
      tests: [
        "assert f(1) == (1, 2)",
        "assert f(2).x == 2",
        "assert g('ab') == {'a': 1, 'b': 1}",
        "assert h('a1')",
      ],
      testImports: [],
    };
    const code =
      "import collections, re\nP = collections.namedtuple('P', 'x y')\ndef f(x):\n    return P(x, 2)\n" +
      "def g(s):\n    return collections.Counter(s)\ndef h(s):\n    return re.search('[0-9]', s)";
    expect(await runTests(pool, code, honest, limits)).toMatchObject({ passed: 4, total: 4 });
  });

  it("counts tests that passed before a later test hangs", async () => {
    const p: CodeProblem = {
      id: "hang",
      prompt: "",
      entryPoint: "f",
      tests: ["assert f(1) == 1", "assert f(2) == 2", "assert f(0) == 0"],
      testImports: [],
    };
    const r = await runTests(pool, "def f(x):\n    while x == 0:\n        pass\n    return x", p, {
      ...limits,
      timeoutMs: 1500,
    });
    expect(r).toMatchObject({ passed: 2, total: 3, status: "timeout" });
  });

  it("embeds any solution text safely (quotes, backslashes, $ patterns, unicode)", () => {
    const sol = "s = '''$' $& \\\\ \"\"\" \u2028 é 😀'''\ndef f():\n    return s";
    const prog = testProgram(sol, {
      id: "x",
      prompt: "",
      entryPoint: "f",
      tests: ["assert f()"],
      testImports: [],
    });
    expect(prog.code).toContain(JSON.stringify(sol));
    expect(passedTests(`junk\n${prog.tokens[0]}\n`, prog.tokens)).toEqual([true]);
    expect(passedTests(`x${prog.tokens[0]}`, prog.tokens)).toEqual([false]);
  });
});

describe("CodeEnv", () => {
  const p = byId("mbpp-3");

  it("coder alone: the reward is the fraction of hidden tests passed, for every agent", async () => {
    const env = new CodeEnv([CODER], { kind: "sequential" }, { pool, ...limits });
    await env.reset(p, 0);
    expect(env.ready()).toEqual(["coder"]);
    const obs = env.observe("coder");
    expect(obs[0]).toEqual({ role: "system", content: "You write Python." });
    expect(obs[1]!.content).toContain("is_not_prime");
    expect(obs[1]!.content).toContain(p.prompt);
    expect(obs[1]!.content).not.toContain("assert");
    await env.act("coder", fence(p.reference!));
    expect(env.terminated).toBe(true);
    expect(env.truncated).toBe(false);
    expect(env.ready()).toEqual([]);
    // the team reward is the outcome's; no per-action rewards
    expect(env.takeRewards()).toEqual({});
    expect(env.outcome().teamReward).toBe(1);
    expect({ ...env.outcome(), ...env.info() }).toMatchObject({
      correct: true,
      score: 1,
      passed: 4,
      total: 4,
      status: "ok",
      rounds: 1,
    });

    await env.reset(p, 0);
    await env.act("coder", "def is_not_prime(n):\n    return n == 10");
    expect({ ...env.outcome(), ...env.info() }).toMatchObject({
      correct: false,
      score: 0.75,
      roleRewards: { coder: 0 },
    });
  });

  it("coder -> reviewer: REVISE sends the code back once with feedback, then it ends", async () => {
    const env = new CodeEnv([CODER, REVIEWER], { kind: "sequential" }, { pool, ...limits });
    await env.reset(p, 0);
    await env.act("coder", fence("def is_not_prime(n):\n    return False"));
    expect(env.ready()).toEqual(["reviewer"]);
    expect(env.parents("reviewer")).toEqual(["coder"]);
    expect(env.observe("reviewer")[1]!.content).toContain("return False");
    await env.act("reviewer", "REVISE: it never finds divisors.");
    expect(env.terminated).toBe(false);
    expect(env.step()).toBe(1);
    expect(env.takeRewards()).toEqual({});
    const again = env.observe("coder")[1]!.content;
    expect(again).toContain("it never finds divisors.");
    expect(again).toContain("return False");
    await env.act("coder", fence(p.reference!));
    await env.act("reviewer", "REVISE again"); // no round left: ends anyway
    expect(env.terminated).toBe(true);
    // Round 1: REVISE on failing code (right); round 2: REVISE on passing code (wrong).
    expect({ ...env.outcome(), ...env.info() }).toMatchObject({
      correct: true,
      score: 1,
      rounds: 2,
      roleRewards: { coder: 1, reviewer: 0.5 },
    });
    expect(env.takeRewards()).toEqual({});
    expect(env.outcome().teamReward).toBe(1);

    await env.reset(p, 0);
    await env.act("coder", fence("def is_not_prime(n):\n    return False"));
    await env.act("reviewer", "APPROVE");
    expect(env.terminated).toBe(true);
    expect({ ...env.outcome(), ...env.info() }).toMatchObject({
      correct: false,
      score: 0.5,
      rounds: 1,
      roleRewards: { reviewer: 0 },
    });
  });

  it("starts the hidden tests in the coder's act, while the reviewer is still to act", async () => {
    const slow = new SandboxPool({ concurrency: 1 });
    const env = new CodeEnv([CODER, REVIEWER], { kind: "sequential" }, { pool: slow, ...limits });
    await env.reset(p, 0);
    await env.act("coder", fence("import time\ntime.sleep(0.5)\n" + p.reference!));
    expect(env.ready()).toEqual(["reviewer"]);
    expect(slow.active).toBe(1); // running in the background
    await env.act("reviewer", "APPROVE");
    expect(slow.active).toBe(0);
    expect({ ...env.outcome(), ...env.info() }).toMatchObject({ correct: true });
  });

  it("coder -> tester: failing tester asserts go back to the coder", async () => {
    const env = new CodeEnv([CODER, TESTER], { kind: "sequential" }, { pool, ...limits });
    await env.reset(p, 0);
    await env.act("coder", fence("def is_not_prime(n):\n    return False"));
    expect(env.observe("tester")[1]!.content).toContain("assert statements");
    await env.act(
      "tester",
      "```python\nassert is_not_prime(4) == True\nassert is_not_prime(7) == False\n```",
    );
    expect(env.terminated).toBe(false);
    expect(env.observe("coder")[1]!.content).toContain("The tester's tests: 1 of 2 passed");
    await env.act("coder", fence(p.reference!));
    await env.act("tester", "```python\nassert is_not_prime(4) == True\n```");
    expect({ ...env.outcome(), ...env.info() }).toMatchObject({ correct: true, rounds: 2 });
  });

  it("passes checkEnv with random replies and with scripted solutions", async () => {
    const suite = createCodeSuite({ train: mbpp.slice(0, 3), pool, ...limits });
    const team = [CODER, REVIEWER];
    const random = await checkEnv(() => suite.makeEnv(team, { kind: "sequential" }), suite.train, {
      seeds: [0],
    });
    expect(random).toEqual([]);
    const scripted = await checkEnv(() => suite.makeEnv(team, { kind: "sequential" }), suite.train, {
      seeds: [0],
      policy: ({ agent, observation }) => {
        if (agent === "reviewer") return "APPROVE";
        const task = mbpp.find((q) => observation[1]!.content.includes(q.prompt))!;
        return fence(task.reference!);
      },
    });
    expect(scripted).toEqual([]);
    const testerTeam = [CODER, TESTER];
    const tested = await checkEnv(
      () => suite.makeEnv(testerTeam, { kind: "sequential" }),
      suite.train.slice(0, 2),
      {
        seeds: [0],
        policy: ({ agent, observation }) => {
          const task = mbpp.find((q) => observation[1]!.content.includes(q.prompt))!;
          // The tester's assert fails on the first round's wrong code, so the episode takes two rounds.
          if (agent === "tester") return "```python\n" + task.tests[0] + "\n```";
          return observation[1]!.content.includes("Round 1")
            ? fence(task.reference!)
            : fence("def nothing(): pass");
        },
      },
    );
    expect(tested).toEqual([]);
    // Seeded random verdicts and solutions: episodes of one or two rounds, deterministic per seed.
    const mixed = await checkEnv(() => suite.makeEnv(team, { kind: "sequential" }), suite.train.slice(0, 2), {
      seeds: [0, 1],
      policy: ({ agent, observation, rng }) => {
        if (agent === "reviewer") return rng() < 0.5 ? "REVISE: check the edge cases." : "APPROVE";
        const task = mbpp.find((q) => observation[1]!.content.includes(q.prompt))!;
        return rng() < 0.5 ? fence(task.reference!) : "I am not sure.";
      },
    });
    expect(mixed).toEqual([]);
  });

  it("builds a suite from MBPP with a held-out split and limits", () => {
    const suite = createCodeSuite({ evalSplit: 50, limit: 10, evalLimit: 5, pool });
    expect(suite.name).toBe("code");
    expect(suite.train).toHaveLength(10);
    expect(suite.eval).toHaveLength(5);
    expect(suite.eval[0]!.id).toBe(mbpp[377]!.id);
    expect(suite.taskId(suite.train[0]!)).toBe("mbpp-2");
    expect(() => new CodeEnv([CODER], { kind: "dynamic" })).toThrow(/dynamic/);
  });

  it("builds a suite from a run config's task entry, naming a bad field", () => {
    // the config's task section, validated by the code family's own schema
    const fromConfig = (raw: Record<string, unknown>, p?: SandboxPool) =>
      codeSuite(
        parseOptions(CodeTaskSchema, { kind: "code", trainFile: defaultMbppFile(), ...raw }, "task"),
        ".",
        p,
      );
    const suite = fromConfig({ evalSplit: 20, limit: 3, attempts: 2, options: { visibleTests: 1 } }, pool);
    expect(suite.train.map((p) => (p as { id: string }).id)).toEqual(["mbpp-2", "mbpp-3", "mbpp-4"]);
    expect(suite.eval).toHaveLength(20);
    expect(() => fromConfig({ timeoutMs: -5 })).toThrow(/task\.timeoutMs: expected a positive integer/);
    expect(() => fromConfig({ options: { visibleTest: 1 } })).toThrow(/visibleTest/);
    expect(() => fromConfig({ trainFile: join(dir, "nope.jsonl") })).toThrow(/nope\.jsonl: cannot read/);
  });
});
