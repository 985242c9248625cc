"""The package's shape: no module imports in a circle (counting imports inside functions and under
TYPE_CHECKING), no module is over 500 lines, and importing a module does nothing but define things
(the attention override and PEFT's batched LoRA path are installed by explicit calls)."""

from __future__ import annotations

import ast
from pathlib import Path

import marft_engine

PACKAGE = Path(marft_engine.__file__).parent
MODULES = {p.stem: p for p in PACKAGE.glob("*.py")}
MAX_LINES = 500


def imports_of(source: str, modules: set[str]) -> set[str]:
    """Which of the package's `modules` a module's source imports, anywhere in its code."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .x import y / from . import x
                names = [node.module] if node.module else [a.name for a in node.names]
            elif node.level == 0 and node.module and node.module.startswith("marft_engine"):
                rest = node.module.removeprefix("marft_engine").lstrip(".")
                names = [rest] if rest else [a.name for a in node.names]
            else:
                continue
            out |= {n.split(".")[0] for n in names if n.split(".")[0] in modules}
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "marft_engine" and len(parts) > 1 and parts[1] in modules:
                    out.add(parts[1])
    return out


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph (module -> modules it imports), or None."""
    state: dict[str, str] = {}  # visiting | done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = "visiting"
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "visiting":
                return [*path[path.index(n) :], n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def calls_on_import(source: str) -> list[int]:
    """Lines of a module's top-level statements that run something when it is imported: expression
    statements (calls) other than the docstring, and blocks other than `if __name__ == "__main__"`
    and `if TYPE_CHECKING`."""
    out = []
    for i, node in enumerate(ast.parse(source).body):
        if isinstance(node, ast.Expr) and not (i == 0 and isinstance(node.value, ast.Constant)):
            out.append(node.lineno)
        elif isinstance(node, ast.If) and ast.unparse(node.test) not in (
            "__name__ == '__main__'",
            "TYPE_CHECKING",
        ):
            out.append(node.lineno)
        elif isinstance(node, (ast.For, ast.While, ast.With, ast.Try)):
            out.append(node.lineno)
    return out


def test_the_import_graph_and_cycle_finder_by_hand() -> None:
    src = (
        "import os\nfrom torch import nn\nfrom . import a, b\nfrom .c import x\nimport marft_engine.d\n"
        "def f():\n    from marft_engine.e import y\n"
    )
    assert imports_of(src, {"a", "b", "c", "d", "e", "g"}) == {"a", "b", "c", "d", "e"}
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    src = '"""doc"""\nimport x\nA = x.f()\nx.register("k", A)\nif TYPE_CHECKING:\n    import y\nif A:\n    x.g()\n'
    assert calls_on_import(src + 'if __name__ == "__main__":\n    x.main()\n') == [4, 7]


def test_no_module_imports_in_a_circle() -> None:
    graph = {m: imports_of(p.read_text(), set(MODULES)) - {m} for m, p in MODULES.items()}
    assert cycle(graph) is None, cycle(graph)
    assert "sampler" in graph["engine"] and "engine" not in graph["sampler"]  # the graph is real


def test_no_module_is_over_500_lines() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_importing_a_module_only_defines_things() -> None:
    found = {m: lines for m, p in MODULES.items() if (lines := calls_on_import(p.read_text()))}
    assert not found, found
