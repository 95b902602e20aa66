"""The package's modules import each other without a circle and only downward, through the floors of
docs/development.md: errors/jsonio/wire → family declarations → config → hub → engine → pipelines → runtime → the
fronts (server, cli, workers, api, ray, spark). Every import counts: those made inside functions (a lazy import that
closes a circle still ties two modules into one that neither can be read or changed without) and those under
`if TYPE_CHECKING:` (a type named from a floor above is a dependency on it all the same)."""

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
        for node in ast.walk(tree):
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


# the floors, lowest first: a module imports its own floor's and lower floors' modules only (within a floor, any)
FLOORS = (
    ("rsinfer_cli.errors", "rsinfer_cli.jsonio", "rsinfer_cli.wire", "rsinfer_cli.onnxfile"),
    ("rsinfer_cli.families",),
    ("rsinfer_cli.config",),
    ("rsinfer_cli.hub",),
    ("rsinfer_cli.engine",),
    ("rsinfer_cli.pipelines",),
    ("rsinfer_cli.runtime",),
    ("rsinfer_cli.server", "rsinfer_cli.cli", "rsinfer_cli.workers", "rsinfer_cli.api", "rsinfer_cli.ray",
     "rsinfer_cli.spark", "rsinfer_cli.__main__", "rsinfer_cli"),
)


def floor(module: str) -> int:
    """The floor of a module: that of the longest prefix listed (the package itself is the fronts' floor)."""
    best = max(((len(prefix), i) for i, names in enumerate(FLOORS) for prefix in names
                if module == prefix or module.startswith(prefix + ".")), default=None)
    if best is None:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS (tests/test_imports.py)")
    return best[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} (floor {floor(m)}) imports {t} (floor {floor(t)})"
            for m in sorted(graph) for t in sorted(graph[m]) if floor(t) > floor(m)]


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


def test_lazy_and_type_checking_imports_count(tmp_path, monkeypatch):
    pkg = tmp_path / "rsinfer_cli"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    graph = import_graph()
    assert graph["rsinfer_cli.b"] == {"rsinfer_cli.a"} and graph["rsinfer_cli.a"] == {"rsinfer_cli.b"}
    assert cycles(graph) == [["rsinfer_cli.a", "rsinfer_cli.b"]]


def test_the_floor_check_finds_an_upward_import():
    graph = {"rsinfer_cli.families": {"rsinfer_cli.server.schemas"}, "rsinfer_cli.server.schemas": set(),
             "rsinfer_cli.engine.model": {"rsinfer_cli.config.schema"}, "rsinfer_cli.config.schema": set()}
    assert upward(graph) == ["rsinfer_cli.families (floor 1) imports rsinfer_cli.server.schemas (floor 7)"]


def test_every_import_goes_down_the_floors():
    assert upward(import_graph()) == []


def test_no_import_circles_in_the_package():
    graph = import_graph()
    assert len(graph) > 50 and "rsinfer_cli.cli.appspec" in graph["rsinfer_cli.cli.docref"]
    assert cycles(graph) == []


def test_building_a_model_config_imports_no_family_code():
    """A ModelConfig is built without resolving its family's code: no numpy, no pipeline (its options are read with
    `config.own(TheOptions)` by the pipeline that has the class)."""
    import subprocess

    code = ("import sys\nfrom rsinfer_cli.config import ModelConfig\n"
            "m = ModelConfig(name='m', kind='embedding', path='/nowhere')\n"
            "print(sorted(n for n in sys.modules if n == 'numpy' or n.startswith('rsinfer_cli.pipelines')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
