// Hidden-test harness: one sandboxed run per solution executes every test separately and reports
// which passed, in a way the solution cannot forge by printing.
//
// Each test i has a random 128-bit token t_i, sent on stdin (read with os.read before any solution
// code runs, so no Python buffer keeps it) and kept only in a local of the harness function. After
// test i passes, the harness writes "t_i" on fd 1 with a saved os.write. A solution that prints fake
// lines, exits early, or replaces sys.stdout gains nothing. What would let it read the tokens (frame
// and gc introspection, tracing, ctypes, /proc/self/mem) is refused by an audit hook, which Python
// never lets code remove. This is defence in depth against reward hacking; containment of the
// program is the sandbox's job. Known gap: a function that returns an object whose __eq__ is always
// true passes `assert f(x) == y` tests (the tests are the dataset's, run as written).
import { randomBytes } from "node:crypto";
import type { CodeProblem } from "./data.ts";

export interface TestProgram {
  code: string;
  stdin: string;
  tokens: string[];
}

const HARNESS = String.raw`
import os as _os, sys as _sys
# Imported before the audit hook: "types" reads a traceback's tb_frame when it loads (and "enum",
# "re", typing, ... import it), which the hook would refuse. Loaded once, it is never run again.
import types

def _harness(solution, imports, tests):
    write, read, exec_, compile_ = _os.write, _os.read, exec, compile
    raw = b""
    while len(raw) < 33 * len(tests):
        chunk = read(0, 33 * len(tests) - len(raw))
        if not chunk:
            break
        raw += chunk
    tokens = raw.decode().split()
    del raw

    frame_attrs = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}
    refused = {"sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
               "gc.get_objects", "gc.get_referrers", "gc.get_referents"}

    def audit(event, args):
        if event in refused or event.startswith("ctypes."):
            raise ValueError(event + " is not allowed here")
        if event == "object.__getattr__" and args[1] in frame_attrs:
            raise AttributeError(args[1] + " is not allowed here")
        if event == "open" and isinstance(args[0], str) and args[0].startswith("/proc"):
            raise PermissionError("/proc is not allowed here")

    _sys.addaudithook(audit)
    env = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec_(compile_(imports + "\n" + solution, "solution.py", "exec"), env)
    except BaseException as e:
        print("solution failed to load:", type(e).__name__, str(e)[:200], file=_sys.stderr)
        return
    for i, test in enumerate(tests):
        try:
            exec_(compile_(test, "test_%d.py" % i, "exec"), env)
        except BaseException as e:
            print("test %d failed: %s %s" % (i, type(e).__name__, str(e)[:200]), file=_sys.stderr)
            continue
        try:
            _sys.stdout.flush()
        except BaseException:
            pass
        write(1, ("\n" + tokens[i] + "\n").encode())
`;

/** Python string literal for any text (JSON strings are valid Python literals, escapes included). */
function pyString(s: string): string {
  return JSON.stringify(s);
}

/** The program that runs `solution` against the problem's tests in one sandboxed process. */
export function testProgram(solution: string, problem: CodeProblem): TestProgram {
  const tokens = problem.tests.map(() => randomBytes(16).toString("hex"));
  const args = [
    pyString(solution),
    pyString(problem.testImports.join("\n")),
    `[${problem.tests.map(pyString).join(", ")}]`,
  ];
  const code = `${HARNESS}\n_harness(${args.join(", ")})\n`;
  return { code, stdin: tokens.map((t) => `${t}\n`).join(""), tokens };
}

/** Which tests passed: test i passed when its token appears on a line of its own in stdout. */
export function passedTests(stdout: string, tokens: string[]): boolean[] {
  const lines = new Set(stdout.split("\n").map((l) => l.trim()));
  return tokens.map((t) => lines.has(t));
}
