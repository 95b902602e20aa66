"""Every function of the package is of radon's rank C or better (cyclomatic complexity at most 20): what
`radon cc -n D src/rsinfer_cli` checks (closures too), run by the suite so that `make test` fails on a function that
grew past it."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_rank, cc_visit

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "rsinfer_cli"


def ranked(source: str) -> list[tuple[str, int, str]]:
    """(name, line, rank) of each function, method, closure and class of `source` ranked D or worse (radon's CLI
    leaves closures out; their complexity is not their function's, so they are checked here on their own)."""
    out = []
    todo = list(cc_visit(source))
    while todo:
        b = todo.pop()
        todo += [*getattr(b, "methods", ()), *getattr(b, "closures", ())]
        if cc_rank(b.complexity) >= "D":
            out.append((b.fullname, b.lineno, cc_rank(b.complexity)))
    return out


def test_the_check_finds_a_complex_function():
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(25))
    assert ranked(f"def f(x):\n{branches}    return -1\n") == [("f", 1, "D")]      # complexity 26


def test_no_function_is_ranked_d_or_worse():
    found = [f"{p.relative_to(PACKAGE.parent)}:{line} {name} - {rank}"
             for p in sorted(PACKAGE.rglob("*.py")) if "kserve_pb2" not in p.name
             for name, line, rank in ranked(p.read_text(encoding="utf-8"))]
    assert not found, "radon cc -n D: split these functions\n" + "\n".join(found)
