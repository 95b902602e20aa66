"""The package's modules import each other without a circle, counting imports made inside functions too (a lazy
import that closes a circle still ties two modules into one that neither can be read or changed without). Imports
under `if TYPE_CHECKING:` are not counted: they never run, they only name types for mypy (families.py types its
parts so)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "rsinfer_cli"


def import_graph() -> dict[str, set[str]]:
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        tree = ast.parse(p.read_text(encoding="utf-8"))
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _type_checking(block.test)
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom):
                base = pkg
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
                for alias in node.names:
                    found = next((c for c in (f"{target}.{alias.name}", target) if c in mods), None)
                    if found is not None and found != m:
                        graph[m].add(found)
            elif isinstance(node, ast.Import):
                graph[m].update(a.name for a in node.names if a.name in mods and a.name != m)
    return graph


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_lazy_imports_count_and_type_checking_ones_do_not(tmp_path, monkeypatch):
    pkg = tmp_path / "rsinfer_cli"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    graph = import_graph()
    assert graph["rsinfer_cli.b"] == {"rsinfer_cli.a"} and graph["rsinfer_cli.a"] == set()
    (pkg / "a.py").write_text("def g():\n    from . import b\n")
    assert cycles(import_graph()) == [["rsinfer_cli.a", "rsinfer_cli.b"]]


def test_no_import_circles_in_the_package():
    graph = import_graph()
    assert len(graph) > 50 and "rsinfer_cli.cli.appspec" in graph["rsinfer_cli.cli.docref"]
    assert cycles(graph) == []
