"""Options shared by the commands that load one model: `NAME --config FILE` or `--path DIR` / `--hf REPO`."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer

from .. import families

# the loading machinery is the public API's (one path): re-exported for the commands and for plug-ins' commands
from ..api.loading import OneShot, guess_source_kind, load_pipeline, model_from_options

__all__ = ["OneShot", "guess_source_kind", "load_pipeline", "model_from_options"]

CONFIG_OPT = typer.Option(None, "--config", "-c", help="YAML config file (also $RSINFER_CONFIG).",
                          envvar="RSINFER_CONFIG", show_envvar=False)
PATH_OPT = typer.Option(None, "--path", help="Model folder (a Hub-repo layout or `rsinfer download` output).")
HF_OPT = typer.Option(None, "--hf", help="Hugging Face repo id.")
REVISION_OPT = typer.Option("main", "--revision", help="Branch, tag or commit (with --hf).")
FILE_OPT = typer.Option(None, "--file", help="Pin the graph file, e.g. onnx/model_fp16.onnx.")
SUBFOLDER_OPT = typer.Option(None, "--subfolder", help="Extra folder to search for the graph and aux files.")
TOKENIZER_HF_OPT = typer.Option(None, "--tokenizer-hf", help="Repo with tokenizer.json when the model's lacks it.")
# An option that takes one of a known set is typed as a Literal: Typer makes it a click Choice, so a wrong value is
# a usage error (exit 2) before any work, --help lists the values and the completions offer exactly these words.
Dtype = Literal["auto", "fp32", "f32", "float32", "fp16", "f16", "half", "float16", "int8", "q8", "quantized"]
Format = Literal["auto", "lines", "jsonl"]
if TYPE_CHECKING:
    Kind = str
else:       # every registered family (a Literal made at run time: mypy sees a str)
    Kind = Literal[families.kinds()]

DTYPE_OPT = typer.Option("auto", "--dtype", help="Graph precision preference: auto, fp32, fp16 or int8 (or "
                         "their aliases: float32, half, q8, ...).")
JSON_OPT = typer.Option(False, "--json", help="Print JSON for programs instead of a table.")
MODEL_OPT = typer.Option(None, "--model", "-m", help="Model name in --config.")
INPUT_OPT = typer.Option(None, "--input", "-i", help="File of lines or JSONL records ('-' = stdin).")
FORMAT_OPT = typer.Option("auto", "--format", help="auto (JSONL when the first line is an object), lines, jsonl.")
FIELD_OPT = typer.Option("text", "--field", help="JSONL field holding the text (dotted path: a.b).")


@dataclass(frozen=True)
class ModelFlags:
    """Which model a one-shot command loads: `--model NAME --config FILE`, or `--path DIR` / `--hf REPO`."""

    model: str | None = None
    config: Path | None = None
    path: Path | None = None
    hf: str | None = None
    revision: str = "main"
    dtype: str = "auto"

    def options(self) -> dict[str, Any]:
        """As load_pipeline's keyword arguments."""
        return {"name": self.model, "config": self.config, "path": self.path, "hf": self.hf,
                "revision": self.revision, "dtype": self.dtype}


MODEL_FLAGS = ModelFlags()   # the default of a `source: ModelFlags` parameter (model_command replaces it)
# the options a `source: ModelFlags` parameter stands for, in the order --help lists them
SOURCE_OPTIONS: tuple[tuple[str, Any, Any], ...] = (
    ("model", str, MODEL_OPT), ("config", Path, CONFIG_OPT), ("path", Path, PATH_OPT), ("hf", str, HF_OPT),
    ("revision", str, REVISION_OPT), ("dtype", Dtype, DTYPE_OPT))


def flag_group(param: str, cls: Callable[..., Any],
               options: Sequence[tuple[str, Any, Any]]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator for commands whose `param` parameter stands for several options: Typer sees `options` ((name,
    type, typer.Option), in --help's order) where the parameter is, and the command gets them as one `cls(...)`.
    One definition of options that several commands share."""

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        hints = typing.get_type_hints(fn)
        params: list[inspect.Parameter] = []
        for p in inspect.signature(fn).parameters.values():
            if p.name == param:
                params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                             annotation=tp) for name, tp, default in options]
            else:
                params.append(p.replace(annotation=hints.get(p.name, p.annotation)))

        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> None:
            given = {name: kwargs.pop(name) for name, _, _ in options if name in kwargs}
            fn(*args, **{param: cls(**given)}, **kwargs)

        command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


# a family command whose `source: ModelFlags` parameter stands for --model/-m, --config, --path, --hf, --revision
# and --dtype: one definition of the options every family's commands share
model_command = flag_group("source", ModelFlags, SOURCE_OPTIONS)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def stderr_is_tty() -> bool:
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


def open_model(kind: str, source: ModelFlags, *, max_rows: int | None = None,
               flags: dict[str, str] | None = None, **overrides: Any) -> Any:
    """The public API's Model for a one-shot command (one replica), of a family that answers `kind`: the commands
    run their texts through its methods, one path with the library's. `overrides`: model keys from flags (`flags`:
    key → the flag that set it, for error messages)."""
    from ..api.loading import CLI_NAMES, Source
    from ..api.model import Model

    src = Source(name=source.model, config=source.config, path=source.path, hf=source.hf, revision=source.revision,
                 dtype=source.dtype, max_rows=max_rows, keys=tuple(overrides.items()))
    return Model(src.load(kind, CLI_NAMES, flags))


def progress_bar(total: int | None, label: str) -> Any:
    """A rich progress bar on stderr (only on a terminal): `total` steps, or a spinner-like bar when unknown."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), disable=not stderr_is_tty(), transient=True)


@contextlib.contextmanager
def phases(total: int) -> Iterator[Callable[[str], None]]:
    """Progress through a few long steps on stderr (a terminal only): a spinner, the step's name, the steps done
    of `total` and the time elapsed; `step(label)` starts the next one."""
    from rich.console import Console
    from rich.progress import MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), disable=not stderr_is_tty(), transient=True)
    with progress:
        task = progress.add_task("", total=total)
        begun = [False]

        def step(label: str) -> None:
            if begun[0]:
                progress.advance(task)
            begun[0] = True
            progress.update(task, description=label, refresh=True)   # drawn now, however short the step

        yield step


# tables (cli/tables.py): Parquet or CSV in and out, by the files' extensions
COLUMN_OPT = typer.Option(None, "--column", help="The text column of a .parquet or .csv --input (default: "
                          "--field's value, else text).")
TABLE_OUTPUT_OPT = typer.Option(None, "--output", "-o", help="With a .parquet or .csv --input: write .parquet, "
                                ".csv or .jsonl (default: JSONL on stdout).")
ERROR_COLUMN_OPT = typer.Option(None, "--error-column", help="Tables: a row the model refuses gets a null answer "
                                "and its message in this column, instead of stopping the run.")


def table_job(method: str, options: dict[str, Any], column: str | None, field: str | None,
              error_column: str | None, **how: Any) -> Any:
    """The api.arrow Job a table command runs: `method` with its options over --column (else --field)."""
    from ..api.arrow import job_of

    if error_column is not None:
        how.update(on_error="column", error_column=error_column)
    return job_of(method, options, column=column or field or "text", **how)
