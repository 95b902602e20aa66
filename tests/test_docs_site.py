"""The docs site builds with `mkdocs build --strict` (a broken link, a missing page in the nav or a snippet that
does not resolve fails), and its pages are the ones the README links to."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    perf = (site / "performance.html").read_text(encoding="utf-8")
    assert "Server CPU per small request" in perf        # benchmarks/RESULTS.md is included, not copied
    # ... under the page's own title: one H1, so the table of contents lists every benchmark's section
    assert perf.count("<h1") == 1
    sections = len(re.findall(r"^## ", (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8"), re.M))
    assert len(set(re.findall(r'href="#([^"]+)"', perf))) > sections > 20
    config = (site / "reference" / "configuration.html").read_text(encoding="utf-8")
    assert "server.request_timeout_ms" in config
    _works_from_disk(site)


def _works_from_disk(site: Path) -> None:
    """An air-gapped reader opens site/index.html from disk: nothing is loaded from another host (no web fonts,
    scripts or styles from a CDN), and every link between pages names a file, never a folder (which a browser
    shows as a directory listing from file://)."""
    for page in (p for p in site.rglob("*.html") if p.name != "404.html"):   # 404: a server's page
        html = page.read_text(encoding="utf-8")
        loads = re.findall(r'<(?:script|img|iframe)[^>]*\ssrc="(https?:)?//[^"]+"|<link[^>]*href="(?:https?:)?//[^"]+"',
                           html)
        assert not loads, (page, loads)
        for target in re.findall(r'<a[^>]*\shref="([^"#?]+)[^"]*"', html):
            if re.match(r"[a-z]+:", target):
                continue
            resolved = (page.parent / target).resolve()
            assert resolved.is_file(), (page.relative_to(site), target)


def test_readme_links_resolve_and_every_page_is_in_the_nav():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links and all((ROOT / link).is_file() for link in links), links
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == set(re.findall(r":\s+([\w/-]+\.md)\s*$", nav, re.M)), pages


def test_results_hold_one_section_per_benchmark():
    """benchmarks/RESULTS.md is the current results: a section per script (its `## ` title ends with the script's
    name, which write_results replaces it by), each saying how to reproduce it with that script."""
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    scripts = [re.search(r"\(`([\w]+\.py)`\)$", s.splitlines()[0]) for s in sections]
    assert all(scripts), [s.splitlines()[0] for s, m in zip(sections, scripts, strict=True) if m is None]
    names = [m.group(1) for m in scripts if m is not None]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for name, section in zip(names, sections, strict=True):
        assert (ROOT / "benchmarks" / name).is_file(), name
        assert f"benchmarks/{name}" in section, name


def test_a_benchmark_rewrites_its_own_section_and_keeps_the_snippet_markers(tmp_path, capsys):
    """write_results replaces the section titled with the script's name (appends it when missing), keeps a blank
    line before the next section, and neither drops the snippet markers around a section (docs pages include parts of
    RESULTS.md by them) nor lets a rewritten section swallow the next one's opening marker."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _serve import write_results

    out = tmp_path / "RESULTS.md"
    out.write_text("# Results\n\n## A (`a.py`)\n\nold a\n<!-- --8<-- [start:b] -->\n## B (`b.py`)\n\nold b\n\n"
                   "<!-- --8<-- [end:b] -->\n## C (`c.py`)\n\nold c\n", encoding="utf-8")
    write_results(out, ["", "## A (`a.py`)", "", "new a", ""])
    write_results(out, ["", "## B (`b.py`)", "", "new b"])
    write_results(out, ["", "## D (`d.py`)", "", "new d"])
    capsys.readouterr()
    assert out.read_text(encoding="utf-8") == (
        "# Results\n\n## A (`a.py`)\n\nnew a\n\n<!-- --8<-- [start:b] -->\n## B (`b.py`)\n\nnew b\n"
        "<!-- --8<-- [end:b] -->\n\n## C (`c.py`)\n\nold c\n\n## D (`d.py`)\n\nnew d\n")


def test_charts_carry_title_machine_and_data(tmp_path):
    """Each chart on the performance page has its data beside it (docs/charts/<name>.json, which
    benchmarks/charts.py redraws from) with a title and a note naming the script, the model and the machine it was
    measured on; drawn, its axes start at 0."""
    import json

    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    shown = re.findall(r"\]\(charts/(\w+)\.png\)", page)
    assert sorted(shown) == ["batching", "clients", "latency"]
    for name in shown:
        data = json.loads((ROOT / "docs" / "charts" / f"{name}.json").read_text(encoding="utf-8"))
        assert data["title"] and f"benchmarks/{name}.py" in data["note"] and "cores" in data["note"], data["note"]
    pytest.importorskip("matplotlib", reason="the bench extra draws the charts")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from charts import DRAW, draw

    for name in shown:
        data = json.loads((ROOT / "docs" / "charts" / f"{name}.json").read_text(encoding="utf-8"))
        assert draw(name, data, tmp_path).stat().st_size > 10_000
        fig = DRAW[name](data)
        assert fig._suptitle.get_text() == data["title"]
        assert all(ax.get_ylim()[0] == 0 for ax in fig.axes)
