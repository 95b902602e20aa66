"""The Typer app read as data: each command with its parameters as the parser sees them (typer.main.get_command:
a flag pair is two words, a Literal-typed option has its choices), the root help and the environment variables
rsinfer reads. The generated artefacts - completions and the man page (cli/docgen.py), the docs site's CLI
reference (cli/docref.py) - are all made from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .app import app

ENVIRONMENT = {
    "RSINFER_CONFIG": "config file for commands that take --config",
    "RSINFER_DEBUG": "set to 1 to show tracebacks of errors",
    "RSINFER_LOG_LEVEL": "log level of the one-shot commands (default WARNING)",
    "HF_HOME": "Hugging Face home; the Hub cache is $HF_HOME/hub unless server.hf_cache_dir is set",
    "HF_HUB_CACHE": "the Hub cache folder itself",
    "HF_ENDPOINT": "Hub URL (a mirror)",
    "HF_TOKEN": "token for gated or private repos",
    "HF_HUB_OFFLINE": "set to 1 to use the Hub cache only, with no network",
}


@dataclass(frozen=True)
class Param:
    """One command parameter as the parser sees it (click's view of the Typer app, through typer.main.get_command):
    a boolean flag pair is `opts` ("--normalize") and `secondary` ("--no-normalize"), never one
    "--normalize/--no-normalize" word; an option typed as a Literal has its `choices`."""

    kind: str                 # option | argument
    name: str
    opts: tuple[str, ...]
    help: str
    default: Any
    is_flag: bool
    is_path: bool
    required: bool
    metavar: str
    secondary: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()

    @property
    def words(self) -> tuple[str, ...]:
        """Every word that names this option on the command line."""
        return self.opts + self.secondary


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    params: tuple[Param, ...]


def blocks(text: str) -> list[tuple[str, str]]:
    """A help text as ("text", one line of prose) and ("code", lines) blocks: paragraphs indented by two spaces are
    commands (the Examples), each kept as its own line; adjacent ones form one block."""
    out: list[tuple[str, str]] = []
    for para in (p for p in text.split("\n\n") if p.strip()):
        lines = para.strip("\n").splitlines()
        if all(line.startswith("  ") for line in lines):
            code = "\n".join(line[2:] for line in lines)
            if out and out[-1][0] == "code":
                out[-1] = ("code", out[-1][1] + "\n" + code)
            else:
                out.append(("code", code))
        else:
            out.append(("text", " ".join(para.split())))
    return out


def _default(value: Any) -> Any:
    """A default worth printing: click's (None, None) for an unset two-value option is no default."""
    if isinstance(value, (tuple, list)) and all(v is None for v in value):
        return None
    return value


def _param(p: Any) -> Param:
    is_path = p.type.name == "path"
    choices = tuple(str(c) for c in getattr(p.type, "choices", ()) or ())
    metavar = p.metavar or ("PATH" if is_path else p.name.upper())
    if p.param_type_name == "argument":
        return Param("argument", p.name, (), getattr(p, "help", None) or "", _default(p.default), False, is_path,
                     p.required, metavar, choices=choices)
    return Param("option", p.name, tuple(p.opts), p.help or "", _default(p.default), bool(p.is_flag), is_path,
                 p.required, metavar, tuple(p.secondary_opts), choices)


def commands() -> list[Command]:
    import typer.main

    parsed = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    cmds = []
    for c in app.registered_commands:
        name = str(c.name or getattr(c.callback, "__name__", ""))
        params = tuple(_param(p) for p in parsed[name].params if p.name != "help")
        cmds.append(Command(name, c.help or (getattr(c.callback, "__doc__", "") or ""), params))
    return sorted(cmds, key=lambda c: c.name)


def root_help() -> str:
    cb = app.registered_callback
    return (cb.callback.__doc__ if cb and cb.callback else "") or ""
