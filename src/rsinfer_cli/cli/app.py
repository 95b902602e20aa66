"""The `rsinfer` command: the root Typer app and the ONE table from error to message and exit code."""

from __future__ import annotations

import enum
import logging
import os
import sys

import typer

from .. import __version__, families
from ..errors import (
    ConfigError,
    HubError,
    InferenceError,
    InputError,
    ModelLoadError,
    ModelNotFound,
    PoolTimeout,
    QualityGateFailed,
    RsinferError,
    Saturated,
)
from . import batch, bench, download, inspect, openapi, quantize, serve


class ExitCode(enum.IntEnum):
    """Process exit codes (listed in the man page from EXIT_DOCS)."""

    OK = 0
    ERROR = 1
    USAGE = 2
    INPUT = 3
    HUB = 4
    MODEL = 5
    BUSY = 6
    GATE = 7
    INTERRUPTED = 130


EXIT_DOCS = {
    ExitCode.OK: "success",
    ExitCode.ERROR: "an unexpected internal error (a bug: please report it; RSINFER_DEBUG=1 shows the traceback)",
    ExitCode.USAGE: "bad command-line options or config file (the message names the option or key path)",
    ExitCode.INPUT: "bad input data (the message names the file and line, or the input index)",
    ExitCode.HUB: "the Hub or a model folder could not provide the model files",
    ExitCode.MODEL: "a model could not be loaded or run",
    ExitCode.BUSY: "the model's queue was full, or the wait for a session too long",
    ExitCode.GATE: "a quality gate failed: a quantized graph or another execution provider lost more than a "
                   "--min-*/--max-* bar allows (rsinfer quantize, rsinfer bench --compare)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


EXIT_CODES: dict[type[BaseException], ExitCode] = {
    ConfigError: ExitCode.USAGE,
    ModelNotFound: ExitCode.USAGE,
    InputError: ExitCode.INPUT,
    HubError: ExitCode.HUB,
    ModelLoadError: ExitCode.MODEL,
    InferenceError: ExitCode.MODEL,
    Saturated: ExitCode.BUSY,
    QualityGateFailed: ExitCode.GATE,
    PoolTimeout: ExitCode.BUSY,
    RsinferError: ExitCode.ERROR,
}


def exit_code_for(exc: BaseException) -> ExitCode:
    for klass in type(exc).__mro__:
        if klass in EXIT_CODES:
            return EXIT_CODES[klass]
    return ExitCode.ERROR


SUMMARY = ("Serve and run embeddings (dense, sparse, ColBERT), rerankers, classifiers, NLI zero-shot, PII "
           "detection and redaction, and any ONNX graph as tensors, on ONNX Runtime.")

# the kinds from the registry: a family added is a line here, never a stale count
HELP = SUMMARY + "\n\nModel kinds (`kind:` in the config):\n\n" + "\n".join(
    f"- {f.kind}: {f.summary}" for f in families.all_families())

app = typer.Typer(
    name="rsinfer",
    help=HELP,
    no_args_is_help=True,
    add_completion=False,  # static scripts ship in completions/ (no Python start per <TAB>)
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rsinfer {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """The root: its help is HELP, the summary and every registered model kind (exit codes: `man rsinfer`)."""


root.__doc__ = HELP


_COMMANDS: dict[str, tuple[families.Command, str | None]] = {
    "batch": (batch.batch_cmd, batch.batch_cmd.__doc__), "bench": (bench.bench_cmd, bench.bench_cmd.__doc__),
    "download": (download.download_cmd, download.__doc__),
    "inspect": (inspect.inspect_cmd, inspect.__doc__), "serve": (serve.serve_cmd, serve.__doc__),
    "openapi": (openapi.openapi_cmd, openapi.__doc__),
    "quantize": (quantize.quantize_cmd, quantize.quantize_cmd.__doc__)}
for _family in families.all_families():  # each family's own commands (`embed`, `rerank`, `redact`, …)
    for _name, _fn in _family.command_functions():
        _COMMANDS[_name] = (_fn, _fn.__doc__)
for _name, (_fn, _doc) in sorted(_COMMANDS.items()):
    app.command(_name, help=_doc)(_fn)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; Typer reports usage errors itself (exit 2), our typed errors are mapped here."""
    logging.basicConfig(level=os.environ.get("RSINFER_LOG_LEVEL", "WARNING").upper(),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        app(args=argv, prog_name="rsinfer")
    except RsinferError as exc:
        if os.environ.get("RSINFER_DEBUG"):
            raise
        typer.echo(f"rsinfer: error: {exc}", err=True)
        sys.exit(exit_code_for(exc))
    except KeyboardInterrupt:
        typer.echo("rsinfer: interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (`| head`): not an error of ours
        sys.exit(ExitCode.OK)
    except Exception as exc:
        if os.environ.get("RSINFER_DEBUG"):
            raise
        typer.echo(f"rsinfer: internal error: {type(exc).__name__}: {exc} "
                   "(set RSINFER_DEBUG=1 for the traceback)", err=True)
        sys.exit(ExitCode.ERROR)
