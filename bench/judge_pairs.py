"""Extracts the (gold, pred, expected) answer pairs of public math-judge test suites as JSONL.

The suites are read from checkouts (or bare git directories) that the caller brings; nothing of
them is stored in this repository. Usage:

    python bench/judge_pairs.py --math-verify DIR --hendrycks DIR > /tmp/judge-pairs.jsonl

Each output line: {"suite", "test", "where", "gold", "pred", "expected", "opts"}, where opts are
the options the suite's own test passes to its judge (Math-Verify: match_types, precision, strict,
allow_set_relation_comp), so that Math-Verify can be run exactly as its own tests run it.

The test files are parsed with `ast`, never imported or run: only the literal argument lists of
`@pytest.mark.parametrize` (Math-Verify) and the `test_in`/`test_out` assignments of each
`assertTrue`/`assertFalse` test method (hendrycks) are read.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

# Math-Verify's test files whose parametrized cases are (gold, pred, expected) pairs.
MATH_VERIFY_FILES = [
    "tests/test_all.py",
    "tests/test_boxed.py",
    "tests/test_numina_cases.py",
    "tests/test_open_thoughts.py",
    "tests/test_strict.py",
    "tests/test_yujianll.py",
]
HENDRYCKS_FILE = "modeling/math_equivalence_test.py"


def read_source(root: Path, path: str) -> str:
    """A file of a work tree, or of HEAD in a bare git directory (what `fetch` brings)."""
    if (root / path).is_file():
        return (root / path).read_text(encoding="utf8")
    out = subprocess.run(
        ["git", f"--git-dir={root}", "show", f"HEAD:{path}"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


def literal(node: ast.expr) -> Any:
    """A literal; one f-string case (math.sqrt) needs evaluation, with nothing but `math` in scope."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        code = compile(ast.Expression(node), "<case>", "eval")
        # the case list only, with no builtins: one f-string calls math.sqrt
        return eval(code, {"__builtins__": {}, "math": math})


def call_options(fn: ast.FunctionDef) -> dict[str, Any]:
    """The keyword arguments of the judge call in a test body (compare_strings or verify)."""
    opts: dict[str, Any] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "compare_strings",
            "verify",
        ):
            for kw in node.keywords:
                if kw.arg is None:
                    continue
                if isinstance(kw.value, ast.Name):
                    opts[kw.arg] = {"param": kw.value.id}
                else:
                    opts[kw.arg] = ast.literal_eval(kw.value)
            if getattr(node.func, "id", None) == "verify":
                opts.setdefault("match_types", ["latex", "expr"])
                opts["plain_verify"] = True
    return opts


def math_verify_pairs(root: Path) -> list[dict[str, Any]]:
    pairs = []
    for path in MATH_VERIFY_FILES:
        tree = ast.parse(read_source(root, path))
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            base = call_options(fn)
            if not base:
                continue
            for dec in fn.decorator_list:
                if not (
                    isinstance(dec, ast.Call)
                    and ast.unparse(dec.func) == "pytest.mark.parametrize"
                ):
                    continue
                names = [n.strip() for n in ast.literal_eval(dec.args[0]).split(",")]
                assert isinstance(dec.args[1], ast.List)
                for case in dec.args[1].elts:
                    values = dict(zip(names, literal(case), strict=True))
                    expected = values.get("expected", values.get("result"))
                    # an option given as a test parameter takes that case's value
                    opts = {
                        k: (values[v["param"]] if isinstance(v, dict) else v)
                        for k, v in base.items()
                    }
                    opts.setdefault("precision", 6)
                    opts.setdefault("strict", True)
                    opts.setdefault("allow_set_relation_comp", False)
                    pairs.append(
                        {
                            "suite": "math-verify",
                            "test": fn.name,
                            "where": f"{path}:{case.lineno}",
                            "gold": values["gold"],
                            "pred": values["pred"],
                            "expected": bool(expected),
                            "opts": opts,
                        }
                    )
    return pairs


def hendrycks_pairs(root: Path) -> list[dict[str, Any]]:
    tree = ast.parse(read_source(root, HENDRYCKS_FILE))
    pairs = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test"):
            continue
        env: dict[str, str] = {}
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                env[stmt.targets[0].id] = ast.literal_eval(stmt.value)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                check = getattr(stmt.value.func, "attr", "")
                if check not in ("assertTrue", "assertFalse"):
                    continue
                call = stmt.value.args[0]
                assert isinstance(call, ast.Call)
                a, b = (env[arg.id] for arg in call.args if isinstance(arg, ast.Name))
                pairs.append(
                    {
                        "suite": "hendrycks",
                        "test": node.name,
                        "where": f"{HENDRYCKS_FILE}:{stmt.lineno}",
                        # is_equiv is symmetric in intent; test_in plays the prediction
                        "gold": b,
                        "pred": a,
                        "expected": check == "assertTrue",
                        # bare answers, not responses: Math-Verify gets them as extracted answers
                        "opts": {"bare": True},
                    }
                )
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--math-verify",
        type=Path,
        help="checkout or git dir of huggingface/Math-Verify",
    )
    ap.add_argument(
        "--hendrycks", type=Path, help="checkout or git dir of hendrycks/math"
    )
    args = ap.parse_args()
    if not args.math_verify and not args.hendrycks:
        ap.error("give --math-verify and/or --hendrycks")
    pairs = []
    if args.math_verify:
        pairs += math_verify_pairs(args.math_verify)
    if args.hendrycks:
        pairs += hendrycks_pairs(args.hendrycks)
    for p in pairs:
        sys.stdout.write(json.dumps(p, ensure_ascii=False) + "\n")
    counts: dict[str, int] = {}
    for p in pairs:
        counts[p["suite"]] = counts.get(p["suite"], 0) + 1
    print(f"pairs: {counts}", file=sys.stderr)


if __name__ == "__main__":
    main()
