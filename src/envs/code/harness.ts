// Hidden-test harness: one sandboxed run per solution executes every test separately and reports
// which passed, in a way the solution cannot forge by printing.
//
// Each test i has a random 128-bit token t_i, sent on stdin (read with os.read before any solution
// code runs, so no Python buffer keeps it) and kept only in a local of the harness function. After
// test i passes, the harness writes "t_i" on fd 1 with a saved os.write. A solution that prints fake
// lines, exits early, or replaces sys.stdout gains nothing. What would let it read the tokens (frame
// and gc introspection, tracing, ctypes, /proc/self/mem) is refused by an audit hook, which Python
// never lets code remove. This is defence in depth against reward hacking; containment of the
// program is the sandbox's job.
// A function could also return an object whose __eq__ (or __bool__) always says yes: so every test
// is rewritten (Python's ast) to pass each operand of a comparison, of not/and/or, and the assert's
// whole test through plain(), which accepts builtin scalars and containers only (recursively).
// plain() reaches the test as a function parameter, so no global the solution could overwrite.
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
import types, _ast, collections, operator


def _plain_checkers():
    """plain(x) returns x when nothing in it can lie about equality or truth, else raises TypeError;
    cmp(values, ops) evaluates a comparison chain after checking every operand with plain().

    Types implemented in C (builtins, re.Match, deque, ...) cannot be patched, so they are trusted.
    A class defined in Python (a heap type, e.g. a namedtuple) is trusted only if its comparison,
    truth and length slots are still those of its nearest C base, checked when it is compared."""
    # Every builtin used below is bound now: a solution can rebind names in the builtins module.
    type_, id_, len_, isinstance_, TypeError_ = type, id, len, isinstance, TypeError
    set_, range_, object_, contains = set, range, object, operator.contains
    HEAPTYPE = 1 << 9
    slots = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__")
    iterables = (list, tuple, set, frozenset, collections.deque)
    keys, values = dict.keys, dict.values
    ops = {
        "Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le,
        "Gt": operator.gt, "GtE": operator.ge, "Is": operator.is_, "IsNot": operator.is_not,
        "In": lambda a, b: contains(b, a), "NotIn": lambda a, b: not contains(b, a),
    }

    # Read through type's own descriptors: a metaclass cannot lie about them.
    flags_of = type.__dict__["__flags__"].__get__
    mro_of = type.__dict__["__mro__"].__get__
    dict_of = type.__dict__["__dict__"].__get__

    def lookup(t, name):
        for c in mro_of(t):
            d = dict_of(c)
            if name in d:
                return d[name]
        return None

    # Python-defined classes of the standard library with their own __eq__, as they are now
    # (before any solution code runs), so a patched one is caught.
    counter, counter_slots = collections.Counter, {n: lookup(collections.Counter, n) for n in slots}

    def check_type(t):
        if not flags_of(t) & HEAPTYPE:
            return  # implemented in C: cannot be patched
        if t is counter:
            expected = counter_slots
        else:
            base = object_
            for c in mro_of(t):
                if not flags_of(c) & HEAPTYPE:
                    base = c
                    break
            expected = {n: lookup(base, n) for n in slots}
        for name in slots:
            if lookup(t, name) is not expected[name]:
                raise TypeError_("a test compared a %s, whose %s is its own" % (t.__name__, name))

    def plain(x):
        stack, seen = [x], set_()
        while stack:
            v = stack.pop()
            check_type(type_(v))
            if isinstance_(v, dict) or isinstance_(v, iterables):
                if id_(v) in seen:
                    continue
                seen.add(id_(v))
                if len_(seen) > 200000:
                    break
                if isinstance_(v, dict):
                    stack.extend(keys(v))
                    stack.extend(values(v))
                else:
                    stack.extend(v)
        return x

    def cmp(operands, names):
        for v in operands:
            plain(v)
        result = True
        for i in range_(len_(names)):
            name = names[i]
            result = ops[name](operands[i], operands[i + 1])
            if not plain(result):
                return result
        return result

    return plain, cmp


# The test rewrite uses the C module _ast (importing ast.py would cost every run its import time).
def _call(name, args):
    return _ast.Call(func=_ast.Name(id=name, ctx=_ast.Load()), args=args, keywords=[])


def _rewrite(node):
    """Post-order: in an assert, comparisons become __marft_cmp((operands), (op names)); every
    operand of "not", "and", "or" and the whole test go through __marft_plain(). Both reach the
    test function as parameters, so there is no global for the solution to overwrite."""
    for field in node._fields:
        value = getattr(node, field, None)
        if isinstance(value, list):
            setattr(node, field, [_rewrite(v) if isinstance(v, _ast.AST) else v for v in value])
        elif isinstance(value, _ast.AST):
            setattr(node, field, _rewrite(value))
    if isinstance(node, _ast.Assert):
        node.test = _call("__marft_plain", [node.test])
    elif isinstance(node, _ast.Compare):
        operands = _ast.Tuple(elts=[node.left, *node.comparators], ctx=_ast.Load())
        names = [_ast.Constant(value=type(op).__name__) for op in node.ops]
        return _call("__marft_cmp", [operands, _ast.Tuple(elts=names, ctx=_ast.Load())])
    elif isinstance(node, _ast.UnaryOp) and isinstance(node.op, _ast.Not):
        node.operand = _call("__marft_plain", [node.operand])
    elif isinstance(node, _ast.BoolOp):
        node.values = [_call("__marft_plain", [v]) for v in node.values]
    return node


def _locate(node, loc=(1, 0, 1, 0)):
    """Gives new nodes their parent's source position (what ast.fix_missing_locations does)."""
    if "lineno" in node._attributes:
        if getattr(node, "lineno", None) is None:
            node.lineno, node.col_offset, node.end_lineno, node.end_col_offset = loc
        else:
            loc = (node.lineno, node.col_offset, node.end_lineno or node.lineno,
                   node.end_col_offset or node.col_offset)
    for field in node._fields:
        value = getattr(node, field, None)
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, _ast.AST):
                _locate(child, loc)


def _test_function(test, i, env):
    """The test as "def t(__marft_plain, __marft_cmp): <the test, rewritten>"."""
    name = "test_%d.py" % i
    body = _rewrite(compile(test, name, "exec", _ast.PyCF_ONLY_AST)).body
    params = [_ast.arg(arg="__marft_plain"), _ast.arg(arg="__marft_cmp")]
    args = _ast.arguments(posonlyargs=[], args=params, kwonlyargs=[], kw_defaults=[], defaults=[])
    fn = _ast.FunctionDef(name="__marft_test", args=args, body=body, decorator_list=[], returns=None)
    if "type_params" in _ast.FunctionDef._fields:  # Python 3.12+
        fn.type_params = []
    module = _ast.Module(body=[fn], type_ignores=[])
    _locate(module)
    exec(compile(module, name, "exec"), env)
    return env.pop("__marft_test")


def _harness(solution, imports, tests):
    write, read, exec_, compile_ = _os.write, _os.read, exec, compile
    # Bound before the solution runs: it may rebind names in the builtins module.
    range_, len_, type_, str_, print_, BaseException_ = range, len, type, str, print, BaseException
    raw = b""
    while len(raw) < 33 * len(tests):
        chunk = read(0, 33 * len(tests) - len(raw))
        if not chunk:
            break
        raw += chunk
    tokens = raw.decode().split()
    del raw

    env = {"__name__": "solution", "__builtins__": __builtins__}
    plain, cmp = _plain_checkers()
    # Compiled before any solution code runs; a test that does not compile fails.
    checks = []
    for i, test in enumerate(tests):
        try:
            checks.append(_test_function(test, i, env))
        except SyntaxError as e:
            print("test %d does not compile: %s" % (i, e), file=_sys.stderr)
            checks.append(None)

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
    try:
        exec_(compile_(imports + "\n" + solution, "solution.py", "exec"), env)
    except BaseException as e:
        print("solution failed to load:", type(e).__name__, str(e)[:200], file=_sys.stderr)
        return
    for i in range_(len_(checks)):
        check = checks[i]
        if check is None:
            continue
        try:
            check(plain, cmp)
        except BaseException_ as e:
            print_("test %d failed: %s %s" % (i, type_(e).__name__, str_(e)[:200]), file=_sys.stderr)
            continue
        try:
            _sys.stdout.flush()
        except BaseException_:
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
