"""Fetch a Hub model into a self-contained folder that `path:` loads with no network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from .. import families
from .common import DTYPE_OPT, FILE_OPT, JSON_OPT, SUBFOLDER_OPT, TOKENIZER_HF_OPT, Dtype, print_json


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class RichProgress:
    """hub.Progress on a rich progress bar (stderr, only on a terminal)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                             TransferSpeedColumn(), TimeRemainingColumn(), console=Console(stderr=True))
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> RichProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.stop()

    def start(self, name: str, total: int | None) -> None:
        if name not in self._tasks:
            self._tasks[name] = self._bar.add_task(name, total=total)

    def advance(self, name: str, n: int) -> None:
        self._bar.advance(self._tasks[name], n)

    def done(self, name: str) -> None:
        task = self._tasks.get(name)
        if task is not None:
            self._bar.update(task, completed=self._bar.tasks[task].total or 0)


def download_cmd(
    repo: str = typer.Argument(..., help="Hugging Face repo id, e.g. Xenova/all-MiniLM-L6-v2."),
    out: Path = typer.Argument(..., help="Folder to write (created; re-running is idempotent)."),
    revision: str = typer.Option("main", "--revision", help="Branch, tag or commit of the repo."),
    file: str = FILE_OPT,
    subfolder: str = SUBFOLDER_OPT,
    tokenizer_hf: str = TOKENIZER_HF_OPT,
    dtype: Dtype = DTYPE_OPT,
    cache_dir: Path = typer.Option(None, "--cache-dir", help="HF cache to download through (default: HF_HOME)."),
    json_out: bool = JSON_OPT,
) -> None:
    from contextlib import nullcontext

    from ..config import hub_cache_dir, normalize_dtype
    from ..hub import ModelSource, download
    from .common import stderr_is_tty

    # a graph alone is a model (kind: tensor): the tokenizer comes along where the repo has one
    spec = ModelSource(hf=repo, revision=revision, file=file, subfolder=subfolder, tokenizer_hf=tokenizer_hf,
                       needs_tokenizer=False,
                       dtype=normalize_dtype(dtype))   # an alias (Dtype) to its canonical name
    cache = cache_dir / "hf" if cache_dir else hub_cache_dir()
    progress = RichProgress() if stderr_is_tty() and not json_out else None
    with progress or nullcontext():
        result = download(spec, out, cache, progress)
    r = result.resolved
    kind = _guess_kind(r)
    if json_out:   # `kind` is what the config stub says: the Dockerfile's MODEL build argument serves it with it
        print_json({"repo": repo, "revision": revision, "commit": r.commit, "out": str(out), "kind": kind,
                    "graph": r.graph_file, "reason": r.graph_reason,
                    "files": [{"path": p, "bytes": n, "written": w} for p, n, w in result.files]})
        return
    typer.echo(f"downloaded {repo}@{revision} into {out}")
    width = max(len(p) for p, _, _ in result.files)
    for p, n, w in result.files:
        typer.echo(f"  {p:<{width}}  {human_size(n):>10}{'' if w else '  (unchanged)'}")
    typer.echo(f"graph: {r.graph_file} ({r.graph_reason})")
    typer.echo("\nadd to your config:\n"
               f"  - name: {out.resolve().name}\n"
               f"    kind: {kind}   # guessed from the files; one of {' | '.join(families.kinds())}\n"
               f"    path: {out}")


def _guess_kind(resolved: Any) -> str:
    return families.guess_kind(families.Folder.read(resolved.aux, resolved.tokenizer_path is not None))[0]
